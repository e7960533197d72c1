//! Giving held messages back to the broker so that the queue keeps its order, and waiting
//! until the broker shows them back (see the parent module for when each way is used).

use crate::broker::amqp::Channel;
use crate::broker::QueueType;
use crate::error::Result;
use std::time::{Duration, Instant};

/// How held deliveries are handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GiveBack {
    /// `basic.nack(tag, multiple=false, requeue=true)` per delivery.
    NackEach,
    /// `basic.reject(tag, requeue=true)` per delivery.
    RejectEach,
    /// `basic.nack(last tag, multiple=true, requeue=true)`.
    NackMultiple,
}

/// Returns settled together by a quorum queue keep their order only up to this many: the
/// broker (3.10) coalesces requeues that arrive together and applies a larger batch in hash
/// order (measured: 150 individual nacks sent back to back came back shuffled; chunks of 30,
/// each applied before the next was sent, kept the order).
const QUORUM_RETURN_CHUNK: usize = 30;

/// How long the ready count may stay flat while another consumer is on the queue before the
/// wait concludes that consumer takes the returned messages.
const RETURN_STALL: Duration = Duration::from_secs(2);

/// The least time returned messages may take to show up as ready again; the limit grows with
/// their number (see [`return_wait`]).
const RETURN_WAIT: Duration = Duration::from_secs(30);

/// Time allowed per returned message on top of [`RETURN_WAIT`]: the broker requeued a million
/// held messages in about 20 s here (3.10.8), so 100 µs each leaves it five times that.
const RETURN_WAIT_PER_MESSAGE: Duration = Duration::from_micros(100);

/// How long `n` returned messages may take to be ready again.
pub(crate) fn return_wait(n: u64) -> Duration {
    RETURN_WAIT + RETURN_WAIT_PER_MESSAGE * u32::try_from(n).unwrap_or(u32::MAX)
}

/// Hands `tags` (in delivery order) back to the broker so that the queue keeps its order.
///
/// Classic queues: nothing is sent here; the caller's channel close requeues every delivery at
/// its original position. Measured on 3.10.8 with 100,000 held messages: after individual
/// `basic.nack`s or one `basic.nack(multiple)` the broker needed 10 to 14 minutes to make them
/// ready again (about 150 messages/s, the queue looking nearly empty meanwhile), after a channel
/// close under 5 seconds. The end state is the same: every message requeued, in place.
///
/// Quorum queues append returns in the order they are applied, so the returns go in chunks of
/// [`QUORUM_RETURN_CHUNK`], each chunk seen back in the queue's ready count (passive declare on
/// `control`) before the next is sent.
pub(super) fn give_back_in_order(
    channel: &Channel,
    control: &Channel,
    queue: &str,
    queue_type: QueueType,
    tags: &[u64],
    how: GiveBack,
) -> Result<()> {
    let send = |chunk: &[u64]| -> Result<()> {
        match how {
            GiveBack::NackEach => chunk
                .iter()
                .try_for_each(|t| channel.basic_nack(*t, false, true)),
            GiveBack::RejectEach => chunk
                .iter()
                .try_for_each(|t| channel.basic_reject(*t, true)),
            GiveBack::NackMultiple => match chunk.last() {
                Some(last) => channel.basic_nack(*last, true, true),
                None => Ok(()),
            },
        }
    };
    if queue_type != QueueType::Quorum {
        return Ok(());
    }
    let ready_before = ready(control, queue)?;
    let mut returned = 0u64;
    for chunk in tags.chunks(QUORUM_RETURN_CHUNK) {
        send(chunk)?;
        returned += chunk.len() as u64;
        if !wait_until_ready(control, queue, ready_before + returned)? {
            return Ok(());
        }
    }
    Ok(())
}

/// Gives back every delivery `channel` holds with one `basic.nack(0, multiple=true,
/// requeue=true)` (tag 0 with `multiple`: all outstanding, AMQP 0-9-1 `basic.ack`), deliveries
/// still on their way to a cancelled consumer included, then waits until `queue` holds at least
/// `ready_target` ready messages again (see [`wait_until_ready`]).
///
/// For quorum queues on a broker where a nack is not a failed delivery (RabbitMQ 4.3+,
/// `crate::broker::BrokerVersion::uncounted_nack`): unlike a closed channel or a reject, it
/// leaves each message's `x-delivery-count` as it was. Measured on 4.3.6: windows of 65,535
/// given back this way, one after the other, keep the queue's order, back within 0.2 s.
pub(super) fn nack_all(
    channel: &Channel,
    control: &Channel,
    queue: &str,
    ready_target: u64,
) -> Result<bool> {
    channel.basic_nack(0, true, true)?;
    wait_until_ready(control, queue, ready_target)
}

/// Ready messages in `queue` now (passive declare).
pub(super) fn ready(control: &Channel, queue: &str) -> Result<u64> {
    Ok(u64::from(
        control.queue_declare_passive(queue)?.message_count,
    ))
}

/// Waits until `queue` holds at least `at_least` ready messages: requeued messages are back.
///
/// A slow requeue and a competing consumer both leave the count short; the queue's consumer
/// count tells them apart (the backup's own consumers are gone by now). With another consumer
/// on the queue, a count flat for [`RETURN_STALL`] means it takes them: false, with a warning.
/// With none, the broker is still requeueing, and the wait goes on up to [`return_wait`] of
/// the messages expected (a million held messages took the broker longer than 2 s).
pub(super) fn wait_until_ready(control: &Channel, queue: &str, at_least: u64) -> Result<bool> {
    let started = Instant::now();
    let limit = return_wait(at_least);
    let mut pause = Duration::from_millis(1);
    let (mut last, mut last_change) = (0u64, Instant::now());
    loop {
        let ok = control.queue_declare_passive(queue)?;
        let ready = u64::from(ok.message_count);
        if ready >= at_least {
            return Ok(true);
        }
        if ready != last {
            (last, last_change) = (ready, Instant::now());
        }
        let competing = ok.consumer_count > 0 && last_change.elapsed() > RETURN_STALL;
        if competing || started.elapsed() > limit {
            let why = if competing {
                format!(
                    "{} other consumer(s) on the queue may be taking them",
                    ok.consumer_count
                )
            } else {
                format!(
                    "the broker did not requeue them within {} s",
                    limit.as_secs()
                )
            };
            log::warn!(
                "queue {queue}: {ready} messages ready, {at_least} expected once the backup gave them back; {why}, so the order of the queue may change"
            );
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_for_returned_messages_grows_with_their_number() {
        assert_eq!(return_wait(0), RETURN_WAIT);
        assert_eq!(return_wait(100_000), RETURN_WAIT + Duration::from_secs(10));
        assert_eq!(
            return_wait(1_000_000),
            RETURN_WAIT + Duration::from_secs(100)
        );
    }
}
