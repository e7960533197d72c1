//! Reading a queue without losing it: the four `requeue_strategy` values of SPEC.md
//! "Requeue strategies" and DESIGN.md decision 7, and the give-back each broker version
//! needs.
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
//! rejects (see [`give_back::give_back_in_order`]).
//!
//! **Quorum queues and their delivery count** ([`ReadPlan`], decided by the job from the
//! broker's version). A closed channel and a reject count as failed deliveries on every
//! version, and so does a nack before RabbitMQ 4.3: each raises the message's
//! `x-delivery-count`, and past the queue's delivery limit (20 by default since 4.0) the broker
//! drops or dead-letters it. With [`ReadPlan::quorum_nack`] (4.3+) every consumer is cancelled
//! and each window given back with one `basic.nack(multiple, requeue)` before its channel
//! closes, which leaves the count alone. With [`ReadPlan::delivery_limit`] (a limit the
//! broker counts every return against) the read stops at the first message whose return
//! would leave it at the limit ([`ReadOutcome::at_limit`]).
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

mod give_back;

pub(crate) use give_back::return_wait;

use crate::broker::amqp::{Channel, Connection, Consumer, Delivery, FieldTable, FieldValue};
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use give_back::{give_back_in_order, nack_all, ready, wait_until_ready, GiveBack};
use std::time::{Duration, Instant};

/// Largest prefetch one consumer can have: the AMQP `prefetch-count` field is a u16.
pub const MAX_WINDOW: u64 = 65_535;

/// Classic queues at most this deep are read with `basic.get` on the control channel (see
/// [`read_queue`]). Small enough that the broker's requeue of a nack is immediate (it is slow
/// for many thousands: see [`give_back::give_back_in_order`]).
pub const SMALL_QUEUE: u64 = 64;

/// How long to wait for a delivery before asking the broker whether the queue still holds
/// messages for us (ms).
const POLL_MS: u64 = 2_000;

/// How long the queue may stay silent while it reports ready messages before the read fails.
const STALL_LIMIT: Duration = Duration::from_secs(120);

/// How a queue is read and given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPlan {
    /// `backup.requeue_strategy`.
    pub strategy: RequeueStrategy,
    /// Quorum queues only: read with consumers, and give every message back with
    /// `basic.nack(requeue)` once the consumers are cancelled, never by a reject or a closed
    /// channel (RabbitMQ 4.3+, where such a nack is not a failed delivery).
    pub quorum_nack: bool,
    /// Quorum queues only: the delivery limit every return is counted against (RabbitMQ
    /// before 4.3). The read stops at the first message delivered with an `x-delivery-count`
    /// of `limit - 1` or more: given back, it would be left at the limit, where any further
    /// return drops or dead-letters it.
    pub delivery_limit: Option<u64>,
}

impl ReadPlan {
    /// The plan of `strategy` alone: returns as the strategy says, no limit.
    pub fn of(strategy: RequeueStrategy) -> ReadPlan {
        ReadPlan {
            strategy,
            quorum_nack: false,
            delivery_limit: None,
        }
    }
}

/// What one read of a queue saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Messages the queue held (ready) when the read started.
    pub depth_at_start: u64,
    /// Messages handed to the sink.
    pub read: u64,
    /// With [`ReadPlan::delivery_limit`]: the read stopped at a message delivered with this
    /// `x-delivery-count` (the message was given back, not handed to the sink).
    pub at_limit: Option<u64>,
}

/// The `x-delivery-count` header of a delivery (a quorum queue's count of failed deliveries,
/// absent before the first: 0).
pub fn delivery_count(d: &Delivery) -> u64 {
    let Some(headers) = d.properties.headers.as_ref() else {
        return 0;
    };
    headers
        .iter()
        .find(|(k, _)| k == "x-delivery-count")
        .and_then(|(_, v)| match v {
            FieldValue::I64(n) => u64::try_from(*n).ok(),
            FieldValue::I32(n) => u64::try_from(*n).ok(),
            FieldValue::U32(n) => Some(u64::from(*n)),
            FieldValue::I16(n) => u64::try_from(*n).ok(),
            FieldValue::U16(n) => Some(u64::from(*n)),
            FieldValue::I8(n) => u64::try_from(*n).ok(),
            FieldValue::U8(n) => Some(u64::from(*n)),
            _ => None,
        })
        .unwrap_or(0)
}

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
    plan: ReadPlan,
    sink: &mut dyn FnMut(Delivery) -> Result<()>,
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
