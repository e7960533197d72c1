//! Which queues a backup reads: the management API's list, filtered by `source.queues`
//! (`crate::selection`), minus the selected queues a backup would harm (exclusive queues,
//! quorum queues with a delivery limit, types it cannot read), which are skipped and named.

use super::SkippedQueue;
use crate::broker::QueueType;
use crate::config::SourceConfig;
use crate::error::Result;
use crate::management::{ManagementClient, QueueInfo};
use crate::selection;

/// Lists the broker's queues and applies `source.queues`. Returns the queues to back up (sorted
/// by vhost, name) and the selected queues that are skipped, with the reason (each logged as a
/// warning).
pub(super) fn select_queues(
    mgmt: &ManagementClient,
    source: &SourceConfig,
) -> Result<(Vec<QueueInfo>, Vec<SkippedQueue>)> {
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for q in mgmt.list_queues()? {
        let reason = match q.queue_type {
            Some(kind) if !selection::selected(source.queues.as_ref(), &q.vhost, &q.name, kind, q.messages) => {
                log::debug!("queue {} in vhost {} not selected", q.name, q.vhost);
                continue;
            }
            // A type rmq-backup does not know: selected only when no `types` filter is set.
            None if !selection::selected_any_type(source.queues.as_ref(), &q.vhost, &q.name, q.messages) => {
                log::debug!("queue {} in vhost {} (type {}) not selected", q.name, q.vhost, q.type_name);
                continue;
            }
            None => Some(format!("its type {} is not one rmq-backup can read", q.type_name)),
            // Streams are read with the stream protocol or through AMQP 0-9-1
            // (`backup.stream_enabled`), never skipped.
            Some(QueueType::Stream) => None,
            Some(_) if q.exclusive => Some("it is exclusive to another connection".to_string()),
            Some(_) => delivery_limit(&q).map(|limit| format!(
                "it is a quorum queue with a delivery limit of {limit}: reading it without acknowledging raises every message's x-delivery-count, so a backup could dead-letter or drop messages"
            )),
        };
        if let Some(reason) = reason {
            let s = SkippedQueue {
                vhost: q.vhost.clone(),
                name: q.name.clone(),
                queue_type: q.type_name.clone(),
                reason,
            };
            log::warn!("skipped {s}");
            skipped.push(s);
            continue;
        }
        if drops_head(&q) {
            log::warn!(
                "queue {} in vhost {} has a length limit with overflow drop-head: messages published while the backup holds the queue can push out the oldest ones when they are given back",
                q.name,
                q.vhost
            );
        }
        chosen.push(q);
    }
    chosen.sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    Ok((chosen, skipped))
}

/// The delivery limit of a quorum queue, from its `x-delivery-limit` argument or its
/// effective policy's `delivery-limit` (RabbitMQ "Quorum Queues", poison message handling).
/// Every requeue raises a quorum message's delivery count (ENVIRONMENT.md), and past the limit
/// the broker dead-letters or drops it, so such queues are not read.
fn delivery_limit(q: &QueueInfo) -> Option<i64> {
    if q.queue_type != Some(QueueType::Quorum) {
        return None;
    }
    q.arguments
        .get("x-delivery-limit")
        .or_else(|| q.effective_policy_definition.get("delivery-limit"))
        .and_then(|v| v.as_i64())
        .filter(|limit| *limit > 0)
}

/// True when the queue has a length limit (`x-max-length[-bytes]` or the policy's
/// `max-length[-bytes]`) and drops the head on overflow (the default). While a backup holds the
/// messages unacknowledged they do not count against the limit (RabbitMQ "Queue Length
/// Limit"), so new publishes can fill it and push the oldest out when they are given back.
fn drops_head(q: &QueueInfo) -> bool {
    let get = |arg: &str, policy: &str| {
        q.arguments
            .get(arg)
            .or_else(|| q.effective_policy_definition.get(policy))
            .cloned()
    };
    let limited = get("x-max-length", "max-length").is_some()
        || get("x-max-length-bytes", "max-length-bytes").is_some();
    let overflow = get("x-overflow", "overflow");
    limited
        && overflow
            .as_ref()
            .and_then(|v| v.as_str())
            .is_none_or(|o| o == "drop-head")
}
