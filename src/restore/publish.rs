//! Publishing one queue's records to the target: names mapped by publish mode, every publish
//! `mandatory`, publisher confirms with a bounded window, the rate limit shared by all queues,
//! and the restore checkpoint of the confirmed prefix (`restore.checkpoint_state`).

use super::offsets::Translation;
use super::outgoing::Outgoing;
use super::raw_stream::StreamTarget;
use super::QueueRestore;
use crate::broker::amqp::Channel;
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
    /// `restore.checkpoint_interval_secs`.
    pub(super) interval: Duration,
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
}

impl Publisher<'_> {
    /// Publishes the decoded records as they arrive, keeping at most `window` unconfirmed,
    /// and counts each publish. With a checkpoint and publisher confirms, every
    /// `checkpoint_interval_secs` it waits for every confirm and records the published prefix
    /// (never while any record of the queue failed: a rerun must publish that one again).
    /// Stops at SIGTERM/SIGINT after the confirms of what it published, checkpointed.
    ///
    /// Records that hold a whole AMQP 1.0 message (`raw_stream::is_raw`) go to `raw`, the
    /// target stream over the stream protocol, when the target is a stream: every publish
    /// before them confirmed first, so the order holds. `offsets` sees each record's source
    /// offset in publish order (stream consumer offsets, `super::offsets`).
    pub(super) fn publish_records(
        &self,
        rx: &crossbeam_channel::Receiver<Vec<Outgoing>>,
        entry: &mut QueueRestore,
        mut raw: Option<&mut StreamTarget>,
        mut offsets: Option<&mut Translation>,
    ) -> Result<()> {
        let (channel, opts, m) = (self.channel, self.opts, self.m);
        let mut last_checkpoint = Instant::now();
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
                    self.flush_raw(&mut pending_raw, target, entry)?;
                }
                if self.to_stream {
                    refuse_for_stream(&record, entry)?;
                }
                let Outgoing {
                    exchange,
                    routing_key,
                    properties,
                    body,
                    ..
                } = record;
                let properties = properties?;
                let (exchange, routing_key) =
                    target_of(&exchange, &routing_key, opts, &entry.target_queue);
                self.limiter.acquire();
                if !blocked_logged {
                    if let Some(reason) = channel.connection_blocked() {
                        blocked_logged = true;
                        log::warn!(
                            "queue {} in vhost {}: target blocked by a resource alarm ({reason}); publishing waits up to {} s (restore.blocked_timeout_secs)",
                            entry.target_queue,
                            entry.target_vhost,
                            channel.blocked_timeout().as_secs()
                        );
                    }
                }
                channel.basic_publish(exchange, routing_key, true, &properties, &body)?;
                entry.published += 1;
                m.published.inc();
                self.bytes.add(body.len() as u64);
                if channel.outstanding_confirms() >= self.window {
                    settle(channel, self.window / 2, entry, m)?;
                } else if !opts.publisher_confirms && entry.published.is_multiple_of(self.window) {
                    settle(channel, 0, entry, m)?; // collects the returns so far
                }
            }
            if let Some(target) = raw.as_deref_mut() {
                self.flush_raw(&mut pending_raw, target, entry)?;
            }
            // Counts the confirms so far without waiting: the metrics stay current.
            settle(channel, u64::MAX, entry, m)?;
            if let Some(why) = crate::run::signals::stop_reason("restore") {
                settle(channel, 0, entry, m)?;
                self.save_checkpoint(entry)?;
                return Err(Error::Io(why));
            }
            if self
                .checkpoint
                .is_some_and(|cp| last_checkpoint.elapsed() >= cp.interval)
            {
                settle(channel, 0, entry, m)?;
                self.save_checkpoint(entry)?;
                last_checkpoint = Instant::now();
            }
        }
        Ok(())
    }

    /// Publishes the records in `pending` (whole AMQP 1.0 messages) to the target stream,
    /// after every publish before them is confirmed; each is confirmed when this returns.
    fn flush_raw(
        &self,
        pending: &mut Vec<Outgoing>,
        target: &mut StreamTarget,
        entry: &mut QueueRestore,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        settle(self.channel, 0, entry, self.m)?;
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
        settle(self.channel, u64::MAX, entry, self.m)
    }

    /// Records the published prefix of the queue, when every publish so far is confirmed.
    fn save_checkpoint(&self, entry: &QueueRestore) -> Result<()> {
        let Some(cp) = self.checkpoint else {
            return Ok(());
        };
        if !self.opts.publisher_confirms || entry.failed > 0 {
            return Ok(());
        }
        let done = entry.done_earlier + entry.published;
        cp.store.restore_progress(&cp.key, done, false)?;
        log::debug!(
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

/// Waits until at most `max_outstanding` publishes are unconfirmed and counts the outcome:
/// nacks and returns are failures, every other settled publish is confirmed (in `entry` and in
/// the metrics `m`).
pub(super) fn settle(
    channel: &Channel,
    max_outstanding: u64,
    entry: &mut QueueRestore,
    m: &RestoreQueueMetrics,
) -> Result<()> {
    let (failed_before, confirmed_before) = (entry.failed, entry.confirmed);
    let confirm_mode = channel.confirm_mode();
    // A target under a resource alarm confirms nothing until it clears.
    let status =
        channel.wait_for_confirms(max_outstanding, CONFIRM_TIMEOUT + channel.blocked_timeout())?;
    for r in &status.returned {
        log::error!(
            "message returned by the target: {} {} (exchange '{}', routing key '{}')",
            r.reply_code,
            r.reply_text,
            r.exchange,
            r.routing_key
        );
    }
    let nacked = status.nacked.len() as u64;
    if nacked > 0 {
        log::error!(
            "{nacked} message(s) nacked by the target broker for queue {}",
            entry.target_queue
        );
    }
    entry.failed += nacked + status.returned.len() as u64;
    if confirm_mode {
        let settled = entry.published - channel.outstanding_confirms();
        entry.confirmed = settled.saturating_sub(entry.failed);
    }
    m.failed.add(entry.failed - failed_before);
    m.confirmed
        .add(entry.confirmed.saturating_sub(confirmed_before));
    Ok(())
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
