//! Reading a queue over AMQP 1.0 (issue 39; the book's "Queues read over AMQP 1.0"), under
//! the same contract as the 0-9-1 reader ([`super::ReadPlan`], [`super::ReadOutcome`],
//! [`super::Held`]): one receiver link whose credit is the read window (the whole depth, or
//! windows of 1, 2, 4, ... under a delivery limit the broker counts every return against),
//! every delivery held unsettled until the read is over, then all given back with one
//! settled disposition of [`GIVE_BACK`] over their delivery ids, and the read ends once the
//! queue's ready count shows them back (`give_back::wait_until_ready`). Depth checks go
//! through the 0-9-1 control channel, as for the 0-9-1 reader.

use std::time::{Duration, Instant};

use super::give_back::{ready, wait_until_ready};
use super::{stalled, Held, Incoming, ReadOutcome, ReadPlan, POLL_MS};
use crate::broker::amqp::Channel;
use crate::broker::amqp10::{self, message, Outcome};
use crate::broker::QueueType;
use crate::error::{Error, Result};

/// The outcome every held message goes back with: `released` (part 3, 3.4.4), not counted
/// as a failed delivery by RabbitMQ 4.3 (tests/amqp10_backup.rs reads the delivery counts
/// back with Qpid Proton); on 4.0-4.2 the job's delivery-limit rules apply as for 0-9-1.
pub const GIVE_BACK: Outcome = Outcome::Released;

/// Reads the first `depth` messages of `queue` on `conn` as `plan` says (see the module
/// documentation), handing each to `sink` in queue order as [`Incoming::Amqp10`], then gives
/// them all back. Arguments and errors as [`super::read_queue`]'s; a delivery that does not
/// decode as an AMQP 1.0 message stops the read (`Serialization error: Invalid AMQP 1.0
/// message: ...`), every message given back.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_queue(
    conn: &amqp10::Connection,
    control: &Channel,
    queue: &str,
    depth: u64,
    queue_type: QueueType,
    plan: ReadPlan,
    sink: &mut dyn FnMut(Incoming) -> Result<()>,
    held: &Held,
    should_stop: &dyn Fn() -> Option<String>,
) -> Result<ReadOutcome> {
    let mut outcome = ReadOutcome {
        depth_at_start: depth,
        read: 0,
        at_limit: None,
    };
    log::info!("queue {queue}: {depth} messages at start, read over AMQP 1.0");
    if depth == 0 {
        return Ok(outcome);
    }
    let limit = plan
        .delivery_limit
        .filter(|_| queue_type == QueueType::Quorum);
    let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let mut window = if limit.is_some() { 1 } else { depth };
    let mut granted = window;
    let session = conn.session()?;
    let mut receiver = session.receiver(&amqp10::queue_address(queue)?, to_u32(window))?;
    // Delivery ids held: one link on its own session, so they are consecutive.
    let mut ids: Option<(u32, u32)> = None;
    let mut taken = 0u64;
    let read = (|| -> Result<()> {
        let mut last_delivery = Instant::now();
        while outcome.read < depth {
            if let Some(reason) = should_stop() {
                return Err(Error::Connection(reason));
            }
            if limit.is_some() && taken >= granted && granted < depth {
                // 1, 2, 4, ...: a stop holds at most about twice what was looked at.
                window = window.saturating_mul(2).min(depth - granted);
                receiver.add_credit(to_u32(window))?;
                granted += window;
            }
            match receiver.recv(Duration::from_millis(POLL_MS))? {
                Some(d) => {
                    last_delivery = Instant::now();
                    hold(&mut ids, &mut taken, &d);
                    let split = message::split(&d.bytes)?;
                    held.note_count(split.delivery_count);
                    if let Some(limit) = limit {
                        let count = split.delivery_count;
                        if count + 1 >= limit {
                            log::warn!(
                                "queue {queue}: message {} delivered with delivery-count {count} (delivery limit {limit}): read stopped, every message given back",
                                outcome.read + 1
                            );
                            outcome.at_limit = Some(count);
                            break;
                        }
                    }
                    outcome.read += 1;
                    sink(Incoming::Amqp10 {
                        position: outcome.read,
                        split,
                    })?;
                }
                None => {
                    if ready(control, queue)? == 0 {
                        log::info!(
                            "queue {queue}: nothing more ready after {} of {depth} messages",
                            outcome.read
                        );
                        break;
                    }
                    if let Some(e) =
                        stalled(last_delivery, queue, outcome.read, depth, " over AMQP 1.0")
                    {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    })();
    // Stop the link, and hold what was on its way too (it goes back with the rest).
    let given_back_at = Instant::now();
    let mut back = receiver.drain();
    while let Ok(Some(d)) = receiver.recv(Duration::ZERO) {
        hold(&mut ids, &mut taken, &d);
        if let Ok(s) = message::split(&d.bytes) {
            held.note_count(s.delivery_count);
        }
    }
    let ready_before = ready(control, queue);
    if let Some((first, last)) = ids {
        back = back.and(receiver.disposition(first, last, GIVE_BACK));
    }
    back = back.and(receiver.detach()).and(session.end());
    if let (Ok(()), Ok(before)) = (&back, ready_before) {
        back = wait_until_ready(control, queue, before + taken).map(drop);
    }
    log::debug!(
        "queue {queue}: {taken} messages given back over AMQP 1.0 in {} ms",
        given_back_at.elapsed().as_millis()
    );
    read?;
    back?;
    Ok(outcome)
}

/// Notes delivery `d` as held: its id extends the held range, `taken` counts it.
fn hold(ids: &mut Option<(u32, u32)>, taken: &mut u64, d: &amqp10::Delivery) {
    *ids = Some(ids.map_or((d.delivery_id, d.delivery_id), |(f, _)| (f, d.delivery_id)));
    *taken += 1;
}
