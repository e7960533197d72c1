//! Reading a queue without losing it: the four `requeue_strategy` values of SPEC.md
//! "Requeue strategies" and DESIGN.md decision 7.
//!
//! Every strategy reads the depth present at start *without acknowledging anything*, so the
//! broker keeps every message, and gives them all back when the read is over:
//!
//! | strategy | read | give back (quorum queues) |
//! |---|---|---|
//! | `cancel` | `basic.consume` windows | `basic.cancel`, then channel close requeues |
//! | `nack` | `basic.get` | `basic.nack(requeue)` per message, in delivery order |
//! | `reject` | `basic.consume` windows | `basic.reject(requeue)` per message, in delivery order |
//! | `get` | `basic.get` | `basic.nack(multiple, requeue)` |
//!
//! On classic queues every strategy gives back by closing the channel, which requeues each
//! message at its place in seconds, where the broker takes minutes to apply many nacks or
//! rejects (see [`give_back_in_order`]).
//!
//! The give-back happens after the whole depth is held, never message by message while
//! reading: a requeued message goes back to the head of the queue and would be read again.
//! The broker applies returns asynchronously (a closed channel's deliveries come back after
//! close-ok), so a read ends only when the queue's ready count shows every message back, or
//! when it stops growing (another consumer): a run that starts right after sees the whole
//! queue.
//!
//! Consumer windows: without acks the broker stops delivering once `prefetch_count` messages
//! are unacked, and a quorum queue treats prefetch 0 as 2000, so each consumer's prefetch is
//! sized to the messages it must hold, at most 65,535 (the field is a u16). A deeper queue
//! gets more consumers, each on its own channel, each opened only after the previous one holds
//! its full window: that keeps the delivery order (ENVIRONMENT.md, broker behaviours).

use crate::amqp::{Channel, Connection, Consumer, Delivery, FieldTable};
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Largest prefetch one consumer can have: the AMQP `prefetch-count` field is a u16.
pub const MAX_WINDOW: u64 = 65_535;

/// How long to wait for a delivery before asking the broker whether the queue still holds
/// messages for us (ms).
const POLL_MS: u64 = 2_000;

/// How long the queue may stay silent while it reports ready messages before the read fails.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// What one read of a queue saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Messages the queue held (ready) when the read started.
    pub depth_at_start: u64,
    /// Messages handed to the sink.
    pub read: u64,
}

/// Reads the first `depth` messages of `queue` (its ready count a moment ago) on `conn` with
/// `strategy`, handing each delivery to `sink` in queue order, then gives every message back
/// to the broker. `control` is a channel of `conn` for passive declares (depth checks); it may
/// serve queue after queue (a broker error on it, such as `NOT_FOUND`, closes it).
///
/// A classic queue of at most [`SMALL_QUEUE`] messages is read with `basic.get` on `control`
/// whatever the strategy, and given back with one `basic.nack(multiple, requeue)`: the same end
/// state (every message requeued in place, `redelivered` set) without a channel opened and
/// closed for it, which costs the broker more than the read (issue "Clusters and scale-out":
/// thousands of small queues).
///
/// `sink` may fail (storage, encoding): the read stops and the messages are still given back.
/// `should_stop` is polled between deliveries; when it returns `Some(reason)` the read stops
/// with `Error::Connection(reason)`, messages given back.
///
/// Errors: AMQP errors of the broker (`NOT_FOUND - no queue ...`, `ACCESS_REFUSED ...`), a lost
/// connection, or a queue that stays silent for 120 s while reporting ready messages.
#[allow(clippy::too_many_arguments)]
pub fn read_queue(
    conn: &Connection,
    control: &Channel,
    queue: &str,
    depth: u64,
    queue_type: QueueType,
    strategy: RequeueStrategy,
    sink: &mut dyn FnMut(Delivery) -> Result<()>,
    should_stop: &dyn Fn() -> Option<String>,
) -> Result<ReadOutcome> {
    let small = queue_type == QueueType::Classic && depth <= SMALL_QUEUE;
    if small {
        log::info!("queue {queue}: {depth} messages at start, read with basic.get");
    } else {
        log::info!("queue {queue}: {depth} messages at start, read with strategy {strategy:?}");
    }
    let mut outcome = ReadOutcome {
        depth_at_start: depth,
        read: 0,
    };
    if depth == 0 {
        return Ok(outcome);
    }
    let read = QueueRead {
        conn,
        control,
        queue,
        queue_type,
        depth,
        strategy,
        should_stop,
    };
    let result = match strategy {
        _ if small => read.small(sink, &mut outcome),
        RequeueStrategy::Cancel | RequeueStrategy::Reject => read.by_consume(sink, &mut outcome),
        RequeueStrategy::Nack | RequeueStrategy::Get => read.by_get(sink, &mut outcome),
    };
    result?;
    Ok(outcome)
}

/// One read of one queue: what every strategy needs.
struct QueueRead<'a> {
    conn: &'a Connection,
    /// A channel of its own for passive declares (depth checks).
    control: &'a Channel,
    queue: &'a str,
    queue_type: QueueType,
    /// Ready messages at start: the read stops there.
    depth: u64,
    strategy: RequeueStrategy,
    should_stop: &'a dyn Fn() -> Option<String>,
}

/// One consumer with its own channel and the delivery tags it holds.
struct Window {
    channel: Channel,
    consumer: Consumer,
    size: u64,
    /// Deliveries this consumer holds.
    held: u64,
    /// Their delivery tags, kept only when each must be rejected one by one.
    tags: Vec<u64>,
}

impl QueueRead<'_> {
    /// `cancel` and `reject`: consumer windows, then cancel (and reject each delivery).
    fn by_consume(
        &self,
        sink: &mut dyn FnMut(Delivery) -> Result<()>,
        outcome: &mut ReadOutcome,
    ) -> Result<()> {
        let Self {
            conn,
            control,
            queue,
            depth,
            strategy,
            ..
        } = *self;
        let mut windows: Vec<Window> = Vec::new();
        let read = (|| -> Result<()> {
            let mut last_delivery = Instant::now();
            while outcome.read < depth {
                if let Some(reason) = (self.should_stop)() {
                    return Err(Error::Connection(reason));
                }
                let need_new = windows.last().is_none_or(|w| w.held >= w.size);
                if need_new {
                    let size = (depth - outcome.read).min(MAX_WINDOW);
                    windows.push(open_window(conn, queue, size, windows.len())?);
                }
                let Some(window) = windows.last_mut() else {
                    // Cannot happen: a window was just opened.
                    return Err(Error::Amqp(format!("queue {queue}: no consumer window")));
                };
                match window
                    .consumer
                    .recv_timeout(Duration::from_millis(POLL_MS))?
                {
                    Some(delivery) => {
                        last_delivery = Instant::now();
                        window.held += 1;
                        if strategy == RequeueStrategy::Reject {
                            window.tags.push(delivery.delivery_tag);
                        }
                        outcome.read += 1;
                        sink(delivery)?;
                    }
                    None => {
                        if queue_drained(control, queue, windows.len() as u32, outcome, depth)? {
                            break;
                        }
                        if last_delivery.elapsed() > STALL_LIMIT {
                            return Err(Error::Amqp(format!(
                                "no delivery from queue {queue} for {} s ({} of {depth} messages read); the backup of this queue is incomplete",
                                STALL_LIMIT.as_secs(),
                                outcome.read
                            )));
                        }
                    }
                }
            }
            Ok(())
        })();
        // Give everything back. First every consumer is cancelled (newest first), so that no
        // consumer of ours receives what the others return; then each window's deliveries go
        // back, oldest first; on a quorum queue each window is seen back in the queue before
        // the next goes (returns are applied asynchronously, in order only one batch at a
        // time). Classic queues put requeued messages back in their places.
        let given_back_at = Instant::now();
        log::debug!(
            "queue {queue}: {} messages read on {} consumer(s); giving them back",
            outcome.read,
            windows.len()
        );
        let mut give_back: Result<()> = Ok(());
        for window in windows.iter().rev() {
            if let Err(e) = window.channel.basic_cancel(window.consumer.tag()) {
                give_back = give_back.and(Err(e));
            }
        }
        let ready_before = ready(control, queue);
        let mut returned = 0u64;
        let count = windows.len();
        for (i, window) in windows.into_iter().enumerate() {
            returned += window.held;
            let more = i + 1 < count && self.queue_type == QueueType::Quorum;
            let r = (|| -> Result<()> {
                if strategy == RequeueStrategy::Reject {
                    give_back_in_order(
                        &window.channel,
                        control,
                        queue,
                        self.queue_type,
                        &window.tags,
                        GiveBack::RejectEach,
                    )?;
                }
                window.channel.close()?;
                if let (true, Ok(before)) = (more, &ready_before) {
                    wait_until_ready(control, queue, before + returned)?;
                }
                Ok(())
            })();
            if give_back.is_ok() {
                give_back = r;
            }
        }
        if let (Ok(()), Ok(before)) = (&give_back, ready_before) {
            give_back = wait_until_ready(control, queue, before + returned).map(drop);
        }
        log::debug!(
            "queue {queue}: messages given back in {} ms",
            given_back_at.elapsed().as_millis()
        );
        read?;
        give_back
    }
}

fn open_window(conn: &Connection, queue: &str, size: u64, index: usize) -> Result<Window> {
    let channel = conn.open_channel()?;
    // `size` is at most MAX_WINDOW, so it fits the u16 prefetch field.
    let prefetch = u16::try_from(size).unwrap_or(u16::MAX);
    channel.basic_qos(prefetch, false)?;
    let tag = format!("rmq-backup-{}-{index}", std::process::id());
    let consumer = channel.basic_consume(queue, &tag, false, false, &FieldTable::new())?;
    log::debug!("queue {queue}: consumer {tag} opened with prefetch {prefetch}");
    Ok(Window {
        channel,
        consumer,
        size,
        held: 0,
        tags: Vec::new(),
    })
}

/// True when the queue has no ready message left for us *and* another consumer exists (it
/// took the rest while we read): the read then ends with what it holds. With no other
/// consumer, messages not yet delivered are on their way to ours (a consumer's window is the
/// whole remaining depth), so the read goes on waiting.
fn queue_drained(
    control: &Channel,
    queue: &str,
    our_consumers: u32,
    outcome: &ReadOutcome,
    depth: u64,
) -> Result<bool> {
    let ok = control.queue_declare_passive(queue)?;
    if ok.message_count == 0 && ok.consumer_count > our_consumers {
        log::warn!(
            "queue {queue} held {depth} messages at start but only {} were left to read: another consumer took the rest",
            outcome.read
        );
        return Ok(true);
    }
    Ok(false)
}

impl QueueRead<'_> {
    /// A small classic queue (see [`read_queue`]): `basic.get` on the control channel, then
    /// one `basic.nack(last, multiple, requeue)`, then a passive declare that sees them back
    /// (the broker applies the nack before it answers the declare sent after it on the same
    /// channel).
    fn small(
        &self,
        sink: &mut dyn FnMut(Delivery) -> Result<()>,
        outcome: &mut ReadOutcome,
    ) -> Result<()> {
        let Self {
            control,
            queue,
            depth,
            ..
        } = *self;
        // The last delivery tag and the ready count its get-ok reported.
        let mut last: Option<(u64, u32)> = None;
        let read = (|| -> Result<()> {
            while outcome.read < depth {
                if let Some(reason) = (self.should_stop)() {
                    return Err(Error::Connection(reason));
                }
                let Some(get) = control.basic_get(queue, false)? else {
                    log::warn!(
                        "queue {queue} held {depth} messages at start but only {} were left to read: another consumer took the rest",
                        outcome.read
                    );
                    break;
                };
                last = Some((get.delivery.delivery_tag, get.message_count));
                outcome.read += 1;
                sink(get.delivery)?;
            }
            Ok(())
        })();
        let give_back = match last {
            Some((tag, ready_after)) => control
                .basic_nack(tag, true, true)
                .and_then(|()| {
                    wait_until_ready(control, queue, u64::from(ready_after) + outcome.read)
                })
                .map(drop),
            None => Ok(()),
        };
        read?;
        give_back
    }

    /// `nack` and `get`: `basic.get` each message, then nack them all.
    fn by_get(
        &self,
        sink: &mut dyn FnMut(Delivery) -> Result<()>,
        outcome: &mut ReadOutcome,
    ) -> Result<()> {
        let Self {
            conn,
            control,
            queue,
            depth,
            strategy,
            ..
        } = *self;
        let channel = conn.open_channel()?;
        let mut tags: Vec<u64> = Vec::new();
        let read = (|| -> Result<()> {
            while outcome.read < depth {
                if let Some(reason) = (self.should_stop)() {
                    return Err(Error::Connection(reason));
                }
                match channel.basic_get(queue, false)? {
                    Some(get) => {
                        tags.push(get.delivery.delivery_tag);
                        outcome.read += 1;
                        sink(get.delivery)?;
                    }
                    None => {
                        log::warn!(
                        "queue {queue} held {depth} messages at start but only {} were left to read: another consumer took the rest",
                        outcome.read
                    );
                        break;
                    }
                }
            }
            Ok(())
        })();
        let give_back = (|| -> Result<()> {
            let how = match strategy {
                RequeueStrategy::Get => GiveBack::NackMultiple,
                _ => GiveBack::NackEach,
            };
            let before = ready(control, queue)?;
            give_back_in_order(&channel, control, queue, self.queue_type, &tags, how)?;
            channel.close()?;
            wait_until_ready(control, queue, before + tags.len() as u64).map(drop)
        })();
        read?;
        give_back
    }
}

/// How held deliveries are handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GiveBack {
    /// `basic.nack(tag, multiple=false, requeue=true)` per delivery.
    NackEach,
    /// `basic.reject(tag, requeue=true)` per delivery.
    RejectEach,
    /// `basic.nack(last tag, multiple=true, requeue=true)`.
    NackMultiple,
}

/// Classic queues at most this deep are read with `basic.get` on the control channel (see
/// [`read_queue`]). Small enough that the broker's requeue of a nack is immediate (it is slow
/// for many thousands: see [`give_back_in_order`]).
pub const SMALL_QUEUE: u64 = 64;

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
fn give_back_in_order(
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

/// Ready messages in `queue` now (passive declare).
fn ready(control: &Channel, queue: &str) -> Result<u64> {
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
fn wait_until_ready(control: &Channel, queue: &str, at_least: u64) -> Result<bool> {
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
