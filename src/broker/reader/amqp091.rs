//! Reading a queue over AMQP 0-9-1 (the module documentation of `super` says how each
//! `requeue_strategy` reads and gives back, and why): [`read_queue`], its consumer windows,
//! and the small classic queues read with `basic.get`. Every channel it reads on keeps each
//! delivery's properties as the broker sent them (`Delivery::wire`, not decoded): a backup
//! writes its records from those bytes in every segment version (`record/write.rs`,
//! `record/binary.rs`).

use super::give_back::{give_back_in_order, nack_all, ready, wait_until_ready, GiveBack};
use super::{
    delivery_count, stalled, Held, ReadOutcome, ReadPlan, MAX_WINDOW, POLL_MS, SMALL_QUEUE,
};
use crate::broker::amqp::{Channel, Connection, Consumer, Delivery, FieldTable};
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Reads the first `depth` messages of `queue` (its ready count a moment ago) on `conn` as
/// `plan` says, handing each delivery to `sink` in queue order, then gives every message back
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
/// `held` counts every delivery the read takes (the caller's, so that it outlives a failed
/// read). `should_stop` is polled between deliveries; when it returns `Some(reason)` the read stops
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
    plan: ReadPlan,
    sink: &mut dyn FnMut(Delivery) -> Result<()>,
    held: &Held,
    should_stop: &dyn Fn() -> Option<String>,
) -> Result<ReadOutcome> {
    let small = queue_type == QueueType::Classic && depth <= SMALL_QUEUE;
    let strategy = plan.strategy;
    if small {
        // A debug line: thousands of small queues would bury the rest.
        log::debug!("queue {queue}: {depth} messages at start, read with basic.get");
    } else if plan.quorum_nack {
        log::info!("queue {queue}: {depth} messages at start, read with consumers, given back with basic.nack");
    } else {
        log::info!("queue {queue}: {depth} messages at start, read with strategy {strategy:?}");
    }
    let mut outcome = ReadOutcome {
        depth_at_start: depth,
        read: 0,
        at_limit: None,
    };
    if depth == 0 {
        return Ok(outcome);
    }
    let quorum = queue_type == QueueType::Quorum;
    let read = QueueRead {
        conn,
        control,
        queue,
        queue_type,
        depth,
        strategy,
        quorum_nack: plan.quorum_nack && quorum,
        delivery_limit: plan.delivery_limit.filter(|_| quorum),
        held,
        should_stop,
    };
    let result = match strategy {
        _ if small => read.small(sink, &mut outcome),
        _ if read.quorum_nack || read.delivery_limit.is_some() => {
            read.by_consume(sink, &mut outcome)
        }
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
    /// [`ReadPlan::quorum_nack`], for a quorum queue.
    quorum_nack: bool,
    /// [`ReadPlan::delivery_limit`], for a quorum queue.
    delivery_limit: Option<u64>,
    held: &'a Held,
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
                    let mut size = (depth - outcome.read).min(MAX_WINDOW);
                    if self.delivery_limit.is_some() {
                        // 1, 2, 4, ...: a stop holds at most about twice what was looked at.
                        size = size.min(windows.last().map_or(1, |w| w.size.saturating_mul(2)));
                    }
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
                        self.held.note(&delivery);
                        if strategy == RequeueStrategy::Reject {
                            window.tags.push(delivery.delivery_tag);
                        }
                        if let Some(limit) = self.delivery_limit {
                            let count = delivery_count(&delivery);
                            if count + 1 >= limit {
                                log::warn!(
                                    "queue {queue}: message {} delivered with x-delivery-count {count} (delivery limit {limit}): read stopped, every message given back",
                                    outcome.read + 1
                                );
                                outcome.at_limit = Some(count);
                                break;
                            }
                        }
                        outcome.read += 1;
                        sink(delivery)?;
                    }
                    None => {
                        if queue_drained(control, queue, windows.len() as u32, outcome, depth)? {
                            break;
                        }
                        if let Some(e) = stalled(last_delivery, queue, outcome.read, depth, "") {
                            return Err(e);
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
        for window in windows.iter_mut().rev() {
            if let Err(e) = window.channel.basic_cancel(window.consumer.tag()) {
                give_back = give_back.and(Err(e));
            }
            // A read that stopped early: what the broker delivered before the cancel is held
            // too, and counted (it goes back with the rest).
            while let Ok(Some(d)) = window.consumer.try_recv() {
                window.held += 1;
                self.held.note(&d);
                if strategy == RequeueStrategy::Reject {
                    window.tags.push(d.delivery_tag);
                }
            }
        }
        let ready_before = ready(control, queue);
        let mut returned = 0u64;
        let count = windows.len();
        for (i, window) in windows.into_iter().enumerate() {
            returned += window.held;
            let more = i + 1 < count && self.queue_type == QueueType::Quorum;
            let r = (|| -> Result<()> {
                if self.quorum_nack {
                    // Closed only once the nack is applied: a close would count.
                    if let Ok(before) = &ready_before {
                        nack_all(&window.channel, control, queue, before + returned)?;
                    } else {
                        window.channel.basic_nack(0, true, true)?;
                    }
                } else if strategy == RequeueStrategy::Reject {
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
                if let (true, false, Ok(before)) = (more, self.quorum_nack, &ready_before) {
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
    channel.keep_wire_properties(true);
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
        control.keep_wire_properties(true);
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
                self.held.note(&get.delivery);
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
        channel.keep_wire_properties(true);
        let mut tags: Vec<u64> = Vec::new();
        let read = (|| -> Result<()> {
            while outcome.read < depth {
                if let Some(reason) = (self.should_stop)() {
                    return Err(Error::Connection(reason));
                }
                match channel.basic_get(queue, false)? {
                    Some(get) => {
                        tags.push(get.delivery.delivery_tag);
                        self.held.note(&get.delivery);
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
