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
//! would leave it at the limit ([`ReadOutcome::at_limit`]), and its consumer windows start at
//! one message and double (1, 2, 4, ...), so that a stop holds at most about twice what the
//! read had looked at: every message held goes back with one count more. [`Held`] counts what
//! a read took and the highest `x-delivery-count` among it, for the caller to record even
//! when the read fails.
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

mod amqp091;
mod amqp10;
mod give_back;

pub use amqp091::read_queue;

pub use amqp10::GIVE_BACK as AMQP10_GIVE_BACK;

pub(crate) use give_back::return_wait;

use crate::broker::amqp::{Channel, Connection, Delivery, FieldValue};
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
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

/// The error of a read that got no delivery for [`STALL_LIMIT`] since `last_delivery` while
/// `queue` still reported ready messages (`read` of `depth` taken; `over`: how, e.g.
/// " over AMQP 1.0"), `None` while it is within the limit.
fn stalled(
    last_delivery: Instant,
    queue: &str,
    read: u64,
    depth: u64,
    over: &str,
) -> Option<Error> {
    (last_delivery.elapsed() > STALL_LIMIT).then(|| {
        Error::Amqp(format!(
            "no delivery from queue {queue} for {} s ({read} of {depth} messages read{over}); the backup of this queue is incomplete",
            STALL_LIMIT.as_secs()
        ))
    })
}

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
    use crate::broker::amqp::codec::WireValue as W;
    let count = |v: Option<&FieldValue>| match v? {
        FieldValue::I64(n) => u64::try_from(*n).ok(),
        FieldValue::I32(n) => u64::try_from(*n).ok(),
        FieldValue::U32(n) => Some(u64::from(*n)),
        FieldValue::I16(n) => u64::try_from(*n).ok(),
        FieldValue::U16(n) => Some(u64::from(*n)),
        FieldValue::I8(n) => u64::try_from(*n).ok(),
        FieldValue::U8(n) => Some(u64::from(*n)),
        _ => None,
    };
    match &d.wire {
        Some(wire) => match wire.header("x-delivery-count") {
            Some(W::I64(n)) => u64::try_from(n).ok(),
            Some(W::I32(n)) => u64::try_from(n).ok(),
            Some(W::U32(n)) => Some(u64::from(n)),
            Some(W::I16(n)) => u64::try_from(n).ok(),
            Some(W::U16(n)) => Some(u64::from(n)),
            Some(W::I8(n)) => u64::try_from(n).ok(),
            Some(W::U8(n)) => Some(u64::from(n)),
            _ => None,
        },
        None => count(
            d.properties
                .headers
                .as_ref()
                .and_then(|h| h.iter().find(|(k, _)| k == "x-delivery-count"))
                .map(|(_, v)| v),
        ),
    }
    .unwrap_or(0)
}

/// What a read has taken so far (every delivery it holds, given back when it ends): how many
/// messages, and the highest `x-delivery-count` among them (see [`delivery_count`]). The
/// caller keeps it, so that it still knows after a read that failed (a lost connection gives
/// every held message back, counted).
#[derive(Debug, Default)]
pub struct Held {
    messages: std::cell::Cell<u64>,
    max_count: std::cell::Cell<Option<u64>>,
}

impl Held {
    /// Counts delivery `d` as held.
    pub fn note(&self, d: &Delivery) {
        self.messages.set(self.messages.get() + 1);
        let c = delivery_count(d);
        self.max_count
            .set(Some(self.max_count.get().map_or(c, |m| m.max(c))));
    }

    /// Counts a delivery whose failed-delivery count is `count` as held (an AMQP 1.0
    /// delivery's header `delivery-count`).
    pub fn note_count(&self, count: u64) {
        self.messages.set(self.messages.get() + 1);
        self.max_count
            .set(Some(self.max_count.get().map_or(count, |m| m.max(count))));
    }

    /// Messages taken.
    pub fn messages(&self) -> u64 {
        self.messages.get()
    }

    /// The highest `x-delivery-count` among them (`None`: none taken).
    pub fn max_delivery_count(&self) -> Option<u64> {
        self.max_count.get()
    }
}

/// Where a queue is read from: the one interface a job reads a queue through, whatever the
/// protocol (issue 39).
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// AMQP 0-9-1, the queue thread's connection ([`read_queue`]).
    Amqp091(&'a Connection),
    /// AMQP 1.0 on RabbitMQ 4.0+ (`amqp10.rs`).
    Amqp10(&'a crate::broker::amqp10::Connection),
}

/// One message read, as its protocol delivered it (moved once per message: not boxed).
#[allow(clippy::large_enum_variant)]
pub enum Incoming {
    /// A 0-9-1 delivery.
    Amqp091(Delivery),
    /// An AMQP 1.0 delivery, split into the message its publisher sent and the broker's
    /// state (`crate::broker::amqp10::message`); `position` is its place in the read, from 1.
    Amqp10 {
        /// 1 for the first message read, and so on.
        position: u64,
        /// The message and what the broker added.
        split: crate::broker::amqp10::message::Split,
    },
}

/// Reads a queue from `source`: [`read_queue`] for 0-9-1, the AMQP 1.0 reader for AMQP 1.0,
/// with the same arguments, contract and errors; `control` is a 0-9-1 channel for depth
/// checks in both cases.
#[allow(clippy::too_many_arguments)]
pub fn read(
    source: Source,
    control: &Channel,
    queue: &str,
    depth: u64,
    queue_type: QueueType,
    plan: ReadPlan,
    sink: &mut dyn FnMut(Incoming) -> Result<()>,
    held: &Held,
    should_stop: &dyn Fn() -> Option<String>,
) -> Result<ReadOutcome> {
    match source {
        Source::Amqp091(conn) => read_queue(
            conn,
            control,
            queue,
            depth,
            queue_type,
            plan,
            &mut |d| sink(Incoming::Amqp091(d)),
            held,
            should_stop,
        ),
        Source::Amqp10(conn) => amqp10::read_queue(
            conn,
            control,
            queue,
            depth,
            queue_type,
            plan,
            sink,
            held,
            should_stop,
        ),
    }
}
