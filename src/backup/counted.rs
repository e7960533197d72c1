//! A quorum queue whose every return counts as a failed delivery (RabbitMQ 3.x and 4.0-4.2,
//! or a version not known): what the repository's record of earlier reads says
//! (`crate::repository::delivery_counts`) decides before the read takes anything; the record
//! is written before the read takes its first message (counting the return to come) and
//! again once every message is back (counting what the read saw). Issue 37;
//! docs/reading-queues.md "Quorum queues and their delivery limit".
//!
//! With a finite delivery limit (`backup.read_queues_with_delivery_limit`) a queue is read
//! only while one more read leaves every message at most at `limit - 1`
//! ([`quorum::one_more_read`]); then it is left alone, without taking a single message, until
//! it has been seen empty at a backup's start (every message that earlier reads counted is
//! gone) or its limit allows more. Without a limit (3.x's default, `-1` on 4.x) nothing is
//! dropped, but the record is kept all the same: a limit set later is judged on it, and a
//! `-1` policy whose removal would now drop messages is warned about.

use super::context::QueueContext;
use super::quorum;
use super::unacked::AtStart;
use crate::broker::management::QueueInfo;
use crate::broker::reader::Held;
use crate::error::Result;
use crate::now_ms;
use crate::repository::delivery_counts::{self, CountRecord, Stored};
use crate::repository::storage::ObjectVersion;

/// What [`before_read`] decided.
pub(super) enum Before<'a> {
    /// Read; call [`Pending::after`] once the read is over, whatever its result.
    Read(Pending<'a>),
    /// Leave the queue alone, for this reason.
    Skip(String),
}

/// A counted read about to start, its record written ahead.
pub(super) struct Pending<'a> {
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    limit: Option<u64>,
    /// The highest count earlier reads may have left (`None`: no record).
    prior: Option<u64>,
    /// The version of the record written ahead; `None`: none written (an empty queue, or a
    /// queue without a limit whose record could not be written: nothing can be dropped).
    version: Option<ObjectVersion>,
}

fn cluster<'c>(ctx: &'c QueueContext) -> &'c str {
    ctx.read.cluster.as_deref().unwrap_or("unknown-cluster")
}

fn record(ctx: &QueueContext, q: &QueueInfo, limit: Option<u64>) -> CountRecord {
    CountRecord {
        cluster: cluster(ctx).to_string(),
        vhost: q.vhost.clone(),
        queue: q.name.clone(),
        max_delivery_count: None,
        reading: false,
        delivery_limit: limit,
        broker_version: ctx.read.broker_version.get().map(|v| v.to_string()),
        backup_id: ctx.store.backup_id.to_string(),
        updated_at: now_ms(),
        messages: 0,
    }
}

/// Before a counted read of quorum queue `q` (`limit`: its delivery limit, `None` for none)
/// that starts with `at_start`: loads the queue's record and decides; writes the record
/// ahead (`reading: true`, one count more than earlier reads left) unless the queue is empty.
///
/// Errors: the storage's, for a queue with a limit (it is not read without its record); for
/// a queue without one they are warned about and the read goes on.
pub(super) fn before_read<'a>(
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    limit: Option<u64>,
    at_start: &AtStart,
) -> Result<Before<'a>> {
    let storage = ctx.store.storage;
    let stored = match delivery_counts::load(storage, cluster(ctx), &q.vhost, &q.name) {
        Ok(s) => s,
        Err(e) if limit.is_none() => {
            log::warn!("queue {} in vhost {}: the record of its delivery counts cannot be read ({e}); read all the same (it has no delivery limit)", q.name, q.vhost);
            return Ok(Before::Read(Pending::none(ctx, q, limit)));
        }
        Err(e) => return Err(e),
    };
    let prior = stored.as_ref().and_then(|s| s.record.max_delivery_count);
    let version = stored.as_ref().map(|s| s.version.clone());
    if at_start.ready == 0 {
        if at_start.unacknowledged == 0 && prior.is_some_and(|p| p > 0) {
            // Empty: every message earlier reads counted is gone.
            let mut r = record(ctx, q, limit);
            r.max_delivery_count = Some(0);
            if let Err(e) = delivery_counts::save(storage, &r, version.as_ref()) {
                log::warn!(
                    "queue {} in vhost {}: empty, but its record could not be reset: {e}",
                    q.name,
                    q.vhost
                );
            } else {
                log::info!("queue {} in vhost {} is empty: the delivery counts earlier backups left in it are gone with its messages", q.name, q.vhost);
            }
        }
        return Ok(Before::Read(Pending::none(ctx, q, limit)));
    }
    if let Some(limit) = limit {
        if let Err(would_be) = quorum::one_more_read(prior, limit) {
            return Ok(Before::Skip(left_alone(
                ctx,
                q,
                stored.as_ref(),
                limit,
                would_be,
            )));
        }
    }
    let mut ahead = record(ctx, q, limit);
    ahead.reading = true;
    ahead.max_delivery_count = prior.map(|p| p + 1);
    match delivery_counts::save(storage, &ahead, version.as_ref()) {
        Ok(v) => Ok(Before::Read(Pending {
            ctx,
            q,
            limit,
            prior,
            version: Some(v),
        })),
        Err(e) if limit.is_none() => {
            log::warn!("queue {} in vhost {}: the record of its delivery counts cannot be written ({e}); read all the same (it has no delivery limit)", q.name, q.vhost);
            Ok(Before::Read(Pending::none(ctx, q, limit)))
        }
        Err(e) => Err(e),
    }
}

/// The reason a queue is left alone because of what earlier reads left in it.
fn left_alone(
    ctx: &QueueContext,
    q: &QueueInfo,
    stored: Option<&Stored>,
    limit: u64,
    would_be: u64,
) -> String {
    let version = ctx.read.broker_version.get();
    let at = would_be - 1;
    let by = stored.map_or_else(String::new, |s| {
        format!(
            " (recorded by backup {} at {}{})",
            s.record.backup_id,
            crate::run::units::rfc3339_ms(s.record.updated_at),
            if s.record.reading {
                ", a read that did not finish: its connection's close counted too"
            } else {
                ""
            }
        )
    });
    format!(
        "it is a quorum queue with a delivery limit of {limit}, and on {} every message a backup gives back counts as a failed delivery: earlier backups left its messages at up to x-delivery-count {at}{by}, and one more read would leave them at {would_be}, where any further return drops or dead-letters them. Not read (not even one message) until the queue has been seen empty at a backup's start, or its limit is raised; the record is {}. {}",
        version.map_or_else(|| "a RabbitMQ of unknown version".to_string(), |v| format!("RabbitMQ {v}")),
        delivery_counts::key(cluster(ctx), &q.vhost, &q.name),
        quorum::remedies(version)
    )
}

impl<'a> Pending<'a> {
    /// A read without a record to keep.
    fn none(ctx: &'a QueueContext<'a>, q: &'a QueueInfo, limit: Option<u64>) -> Pending<'a> {
        Pending {
            ctx,
            q,
            limit,
            prior: None,
            version: None,
        }
    }

    /// Once the read is over (succeeded, stopped or failed: every message it `held` went
    /// back, counted), records the highest count it may have left: one more than the highest
    /// it saw, or what earlier reads left if that is higher. Returns that count (`None`:
    /// nothing recorded).
    ///
    /// Errors: the storage's (the record written ahead stays, and already counts this read).
    pub(super) fn after(self, held: &Held) -> Result<Option<u64>> {
        let Some(version) = self.version else {
            return Ok(None);
        };
        let (ctx, q) = (self.ctx, self.q);
        let seen = held.max_delivery_count().map(|c| c + 1);
        let max = match (self.prior, seen) {
            (Some(p), Some(s)) => Some(p.max(s)),
            (p, s) => p.or(s),
        };
        let mut r = record(ctx, q, self.limit);
        r.max_delivery_count = max;
        r.messages = held.messages();
        delivery_counts::save(ctx.store.storage, &r, Some(&version))?;
        if let (None, Some(max), Some(default)) = (
            self.limit,
            max,
            ctx.read
                .broker_version
                .get()
                .and_then(|v| v.default_quorum_delivery_limit()),
        ) {
            if max > default {
                log::warn!(
                    "queue {} in vhost {}: its messages are at up to x-delivery-count {max} under a \"delivery-limit\": -1 (every backup's read counts on this version): removing that policy would drop or dead-letter every message above the default limit of {default} at its next return",
                    q.name,
                    q.vhost
                );
            }
        }
        Ok(max)
    }
}
