//! Publishing one queue's records to the target: names mapped by publish mode, every publish
//! `mandatory`, publisher confirms with a bounded window, the rate limit shared by all queues,
//! and the restore checkpoint of the confirmed prefix (`restore.checkpoint_state`), recorded
//! whenever it moves, so a rerun publishes again at most one window of a queue (issue 38).
//! Records go over AMQP 0-9-1 or, when they hold AMQP 1.0 messages, AMQP 1.0, through the one
//! interface of `crate::broker::publisher` (issue 39).

use super::amqp10::Amqp10Target;
use super::offsets::Translation;
use super::outgoing::Outgoing;
use super::raw_stream::StreamTarget;
use super::QueueRestore;
use crate::broker::amqp::Channel;
use crate::broker::publisher::amqp091::BasicPublisher;
use crate::broker::publisher::amqp10::Amqp10Publisher;
use crate::broker::publisher::{Payload, Publisher as Publish, Target};
use crate::config::{PublishMode, RestoreOptions};
use crate::error::{Error, Result};
use crate::metrics::{Counter, RestoreQueueMetrics};
use crate::repository::checkpoint::{Checkpoints, RestoreKey};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Refuses a record a stream cannot store: a `decimal` header (top level; RabbitMQ drops
/// tables and arrays from stream messages, and converting a decimal closes the channel).
///
/// Errors: `AMQP error: ... message N (message_id M) ... header H is a decimal ...`.
fn refuse_for_stream(record: &Outgoing, entry: &QueueRestore) -> Result<()> {
    let Some((key, message_id)) = &record.decimal else {
        return Ok(());
    };
    Err(Error::Amqp(format!(
        "message {} of queue {} in vhost {} (message_id {}): header {key} is a decimal, which RabbitMQ cannot store in stream {} in vhost {} (its conversion closes the channel); the {} messages before it were published, nothing after it",
        entry.done_earlier + entry.published + 1,
        entry.source_queue,
        entry.source_vhost,
        message_id.as_deref().unwrap_or("none"),
        entry.target_queue,
        entry.target_vhost,
        entry.published
    )))
}

/// Longest wait for the broker to confirm a window of publishes.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(120);

/// A queue's place in the restore checkpoint database (`restore.checkpoint_state`).
pub(super) struct QueueCheckpoint<'a> {
    pub(super) store: &'a Checkpoints,
    pub(super) key: RestoreKey,
}

/// What publishing one queue needs besides the records.
pub(super) struct Publisher<'a> {
    pub(super) channel: &'a Channel,
    pub(super) opts: &'a RestoreOptions,
    pub(super) limiter: &'a RateLimiter,
    /// Unconfirmed publishes allowed in flight.
    pub(super) window: u64,
    pub(super) m: &'a RestoreQueueMetrics,
    /// Body bytes published (the progress display).
    pub(super) bytes: &'a Counter,
    pub(super) checkpoint: Option<&'a QueueCheckpoint<'a>>,
    /// The target is a stream: a `decimal` header is refused (ENVIRONMENT.md: RabbitMQ's
    /// conversion of it into a stream message closes the channel).
    pub(super) to_stream: bool,
    /// How to reach the target over AMQP 1.0, for records that hold AMQP 1.0 messages.
    pub(super) amqp10: &'a Amqp10Target,
}

/// A queue's publishers: AMQP 0-9-1 on the queue's channel, and AMQP 1.0, opened at the first
/// record that holds an AMQP 1.0 message (`super::amqp10`). The one that took the last publish
/// is the current one; the other has every publish settled.
struct Publishers<'a> {
    basic: BasicPublisher<'a>,
    amqp10: Option<Amqp10Publisher>,
    on_amqp10: bool,
}

impl Publishers<'_> {
    fn current(&mut self) -> &mut dyn Publish {
        match (self.on_amqp10, self.amqp10.as_mut()) {
            (true, Some(p)) => p,
            _ => &mut self.basic,
        }
    }
}

impl Publisher<'_> {
    /// Publishes the decoded records as they arrive, keeping at most `window` unconfirmed,
    /// and counts each publish. With a checkpoint and publisher confirms, it records the
    /// confirmed prefix (the records before the oldest unconfirmed publish) when it moved: at
    /// every wait for confirms (the window full), after every batch, and whenever the records
    /// published past the recorded prefix reach `window` (waiting for confirms if they must):
    /// a rerun after a kill publishes again at most `window` records of the queue (issue 38:
    /// recorded every `checkpoint_interval_secs`, a killed restore of three queues published
    /// 9,855 messages twice). Never after a record of the queue failed: a rerun
    /// must publish that one again. Stops at SIGTERM/SIGINT after the confirms of what it
    /// published, checkpointed.
    ///
    /// Records that hold an AMQP 1.0 message (`super::amqp10`) go over AMQP 1.0, the others
    /// over AMQP 0-9-1, both through `crate::broker::publisher`'s one interface, with the same
    /// window, rate limit and checkpoint; at each change of protocol every publish of the
    /// other is settled first, so the order holds. Records that hold a whole AMQP 1.0 stream
    /// message (`raw_stream::is_raw`) go to `raw`, the target stream over the stream
    /// protocol, when the target is a stream: every publish before them confirmed first.
    /// `offsets` sees each record's source offset in publish order (stream consumer offsets,
    /// `super::offsets`). Every AMQP 1.0 publish is settled when this returns.
    pub(super) fn publish_records(
        &self,
        rx: &crossbeam_channel::Receiver<Vec<Outgoing>>,
        entry: &mut QueueRestore,
        raw: Option<&mut StreamTarget>,
        offsets: Option<&mut Translation>,
    ) -> Result<()> {
        let mut ps = Publishers {
            basic: BasicPublisher::new(self.channel),
            amqp10: None,
            on_amqp10: false,
        };
        let published = self.publish_all(rx, entry, raw, offsets, &mut ps);
        if let Some(mut p) = ps.amqp10.take() {
            let settled = match published {
                Ok(()) if ps.on_amqp10 => settle(&mut p, 0, entry, self.m).map(|_| ()),
                _ => Ok(()),
            };
            if let Err(e) = p.close() {
                log::debug!(
                    "closing the AMQP 1.0 connection of {}: {e}",
                    entry.target_queue
                );
            }
            settled?;
        }
        published
    }

    fn publish_all(
        &self,
        rx: &crossbeam_channel::Receiver<Vec<Outgoing>>,
        entry: &mut QueueRestore,
        mut raw: Option<&mut StreamTarget>,
        mut offsets: Option<&mut Translation>,
        ps: &mut Publishers<'_>,
    ) -> Result<()> {
        let (opts, m) = (self.opts, self.m);
        let mut recorded = entry.done_earlier;
        let mut pending_raw: Vec<Outgoing> = Vec::new();
        let mut blocked_logged = false;
        let mut raw_over_091 = false;
        for batch in rx.iter() {
            for record in batch {
                if let Some(t) = offsets.as_deref_mut() {
                    t.observe(record.delivery_tag);
                }
                if record.raw {
                    if raw.is_some() {
                        pending_raw.push(record);
                        continue;
                    }
                    if !raw_over_091 {
                        raw_over_091 = true;
                        log::warn!(
                            "queue {} in vhost {}: records hold whole AMQP 1.0 stream messages, which AMQP 0-9-1 cannot express; they are published with those bytes as the body and the header {} (restore into a stream to get the messages back as they were)",
                            entry.target_queue,
                            entry.target_vhost,
                            crate::broker::stream::amqp10::RAW_BODY_HEADER
                        );
                    }
                }
                if let Some(target) = raw.as_deref_mut() {
                    self.flush_raw(&mut pending_raw, target, entry, ps.current())?;
                }
                if self.to_stream && !record.amqp10 {
                    refuse_for_stream(&record, entry)?;
                }
                let Outgoing {
                    exchange,
                    routing_key,
                    properties,
                    body,
                    amqp10,
                    ..
                } = record;
                let properties = properties?;
                let payload = if amqp10 {
                    Payload::Amqp10(&body)
                } else {
                    Payload::Basic {
                        properties: &properties,
                        body: &body,
                    }
                };
                if amqp10 != ps.on_amqp10 {
                    // The other protocol's publishes settled first: the order holds.
                    let unsettled = settle(ps.current(), 0, entry, m)?;
                    self.record_confirmed(entry, unsettled, &mut recorded)?;
                    if amqp10 && ps.amqp10.is_none() {
                        ps.amqp10 = Some(self.amqp10.open(
                            &entry.target_queue,
                            &entry.target_vhost,
                            entry.done_earlier + entry.published,
                        )?);
                    }
                    ps.on_amqp10 = amqp10;
                }
                let (exchange, routing_key) =
                    target_of(&exchange, &routing_key, opts, &entry.target_queue);
                let p = ps.current();
                self.limiter.acquire();
                if !blocked_logged {
                    if let Some(reason) = p.blocked() {
                        blocked_logged = true;
                        log::warn!(
                            "queue {} in vhost {}: target blocked by a resource alarm ({reason}); publishing waits up to {} s (restore.blocked_timeout_secs)",
                            entry.target_queue,
                            entry.target_vhost,
                            p.blocked_timeout().as_secs()
                        );
                    }
                }
                p.publish(
                    Target {
                        exchange,
                        routing_key,
                    },
                    payload,
                )?;
                entry.published += 1;
                m.published.inc();
                self.bytes.add(payload.len() as u64);
                if p.outstanding() >= self.window {
                    let unsettled = settle(p, self.window / 2, entry, m)?;
                    self.record_confirmed(entry, unsettled, &mut recorded)?;
                } else if self.recording(entry)
                    && entry.done_earlier + entry.published - recorded >= self.window
                {
                    // Confirmed, but not recorded yet: record it, or wait for enough
                    // confirms, so a window is all a rerun may publish again.
                    let unsettled = settle(p, u64::MAX, entry, m)?;
                    self.record_confirmed(entry, unsettled, &mut recorded)?;
                    if entry.done_earlier + entry.published - recorded >= self.window {
                        let unsettled = settle(p, self.window / 2, entry, m)?;
                        self.record_confirmed(entry, unsettled, &mut recorded)?;
                    }
                } else if !p.confirms() && entry.published.is_multiple_of(self.window) {
                    settle(p, 0, entry, m)?; // collects the returns so far
                }
            }
            if let Some(target) = raw.as_deref_mut() {
                self.flush_raw(&mut pending_raw, target, entry, ps.current())?;
            }
            // Counts the confirms so far without waiting: the metrics stay current.
            let unsettled = settle(ps.current(), u64::MAX, entry, m)?;
            self.record_confirmed(entry, unsettled, &mut recorded)?;
            if let Some(why) = crate::run::signals::stop_reason("restore") {
                settle(ps.current(), 0, entry, m)?;
                self.record_confirmed(entry, 0, &mut recorded)?;
                return Err(Error::Io(why));
            }
        }
        Ok(())
    }

    /// Publishes the records in `pending` (whole AMQP 1.0 stream messages) to the target
    /// stream, after every publish of `current` before them is confirmed; each is confirmed
    /// when this returns.
    fn flush_raw(
        &self,
        pending: &mut Vec<Outgoing>,
        target: &mut StreamTarget,
        entry: &mut QueueRestore,
        current: &mut dyn Publish,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        settle(current, 0, entry, self.m)?;
        for _ in pending.iter() {
            self.limiter.acquire();
        }
        let bodies: Vec<&[u8]> = pending.iter().map(|r| r.body.as_slice()).collect();
        target.publish(&bodies)?;
        let n = pending.len() as u64;
        entry.published += n;
        self.m.published.add(n);
        self.bytes.add(bodies.iter().map(|b| b.len() as u64).sum());
        pending.clear();
        // Confirmed already: counted as such by the next settle.
        settle(current, u64::MAX, entry, self.m).map(|_| ())
    }

    /// Whether the confirmed prefix is recorded: with a checkpoint and publisher confirms,
    /// until a record of the queue failed (a rerun must publish that one again).
    fn recording(&self, entry: &QueueRestore) -> bool {
        self.checkpoint.is_some() && self.opts.publisher_confirms && entry.failed == 0
    }

    /// Records the confirmed prefix of the queue: every record but the last `unsettled`
    /// publishes ([`settle`]'s answer, taken with the nacks and returns already counted in
    /// `entry`), when it moved past `recorded` (then updated); nothing unless
    /// [`Self::recording`].
    ///
    /// Errors: the checkpoint database's (`Checkpoint error: ...`).
    fn record_confirmed(
        &self,
        entry: &QueueRestore,
        unsettled: u64,
        recorded: &mut u64,
    ) -> Result<()> {
        let Some(cp) = self.checkpoint.filter(|_| self.recording(entry)) else {
            return Ok(());
        };
        let done = entry.done_earlier + entry.published.saturating_sub(unsettled);
        if done <= *recorded {
            return Ok(());
        }
        cp.store.restore_progress(&cp.key, done, false)?;
        *recorded = done;
        log::trace!(
            "queue {} in vhost {}: checkpoint at {done} records",
            entry.target_queue,
            entry.target_vhost
        );
        Ok(())
    }
}

/// Where a record published to `exchange` with `routing_key` goes: (exchange, routing key)
/// by `publish_mode` and the mappings.
fn target_of<'a>(
    exchange: &'a str,
    routing_key: &'a str,
    opts: &'a RestoreOptions,
    target_queue: &'a str,
) -> (&'a str, &'a str) {
    match opts.publish_mode {
        PublishMode::DirectToQueue => ("", target_queue),
        // Nothing to route by (stream records, SPEC.md "Segment file"): the target queue.
        PublishMode::Exchange if exchange.is_empty() && routing_key.is_empty() => {
            ("", target_queue)
        }
        // The default exchange routes by queue name: follow the queue mapping.
        PublishMode::Exchange if exchange.is_empty() => (
            "",
            opts.queue_mapping
                .get(routing_key)
                .map_or(routing_key, String::as_str),
        ),
        PublishMode::Exchange => (
            opts.exchange_mapping
                .get(exchange)
                .map_or(exchange, String::as_str),
            routing_key,
        ),
    }
}

/// Waits until at most `max_outstanding` publishes of `p` are unconfirmed and counts the
/// outcome: nacks, returns and AMQP 1.0 outcomes other than `accepted` are failures, every
/// other settled publish is confirmed (in `entry` and in the metrics `m`). Returns the
/// publishes from the oldest unconfirmed one on ([`crate::broker::publisher::Settled`]; 0
/// without confirms): the records before them are the confirmed prefix. Any other publisher
/// of the queue has every publish settled (`Publishers`).
pub(super) fn settle(
    p: &mut dyn Publish,
    max_outstanding: u64,
    entry: &mut QueueRestore,
    m: &RestoreQueueMetrics,
) -> Result<u64> {
    let (failed_before, confirmed_before) = (entry.failed, entry.confirmed);
    let confirm_mode = p.confirms();
    // A target under a resource alarm confirms nothing until it clears.
    let status = p.settle(max_outstanding, CONFIRM_TIMEOUT + p.blocked_timeout())?;
    for r in &status.refused {
        log::error!("{r}");
    }
    if status.nacked > 0 {
        log::error!(
            "{} message(s) nacked by the target broker for queue {}",
            status.nacked,
            entry.target_queue
        );
    }
    entry.failed += status.failed();
    if confirm_mode {
        let settled = entry.published - p.outstanding();
        entry.confirmed = settled.saturating_sub(entry.failed);
    }
    m.failed.add(entry.failed - failed_before);
    m.confirmed
        .add(entry.confirmed.saturating_sub(confirmed_before));
    Ok(if confirm_mode { status.unsettled } else { 0 })
}

/// Spaces publishes to at most `rate` per second over all queues (0 = unlimited).
pub(super) struct RateLimiter {
    rate: u64,
    started: Instant,
    pub(super) issued: AtomicU64,
}

impl RateLimiter {
    pub(super) fn new(rate: u64) -> Self {
        RateLimiter {
            rate,
            started: Instant::now(),
            issued: AtomicU64::new(0),
        }
    }

    pub(super) fn acquire(&self) {
        if self.rate == 0 {
            return;
        }
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let due = Duration::from_nanos(n.saturating_mul(1_000_000_000) / self.rate);
        let now = self.started.elapsed();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}
