//! Which queues a backup reads: the management API's list, filtered by `source.queues`
//! (`crate::broker::selection`), minus the selected queues a backup would harm (exclusive queues,
//! quorum queues whose delivery limit every give-back counts against on this broker:
//! `super::quorum`, types it cannot read), which are skipped and named.

use super::listing::{self, Listing};
use super::quorum::{self, Decision};
use super::SkippedQueue;
use crate::broker::management::{ManagementClient, QueueInfo};
use crate::broker::selection;
use crate::broker::{BrokerVersion, QueueType};
use crate::config::{BackupOptions, SourceConfig};
use crate::error::Result;

/// Lists the broker's queues and applies `source.queues`. Returns the queues to back up (sorted
/// by vhost, name) and the selected queues that are skipped, with the reason (each logged as a
/// warning). `version`: the broker's, which decides what a quorum queue's give-back costs;
/// `how`: the listing to use (`super::listing`).
pub(super) fn select_queues(
    mgmt: &ManagementClient,
    source: &SourceConfig,
    opts: &BackupOptions,
    version: Option<BrokerVersion>,
    how: Listing,
) -> Result<(Vec<QueueInfo>, Vec<SkippedQueue>)> {
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for q in listing::list(mgmt, source, version, how)? {
        let reason = match q.queue_type {
            Some(kind)
                if !selection::selected(
                    source.queues.as_ref(),
                    &q.vhost,
                    &q.name,
                    kind,
                    q.messages,
                ) =>
            {
                log::debug!("queue {} in vhost {} not selected", q.name, q.vhost);
                continue;
            }
            // A type rmq-backup does not know: selected only when no `types` filter is set.
            None if !selection::selected_any_type(
                source.queues.as_ref(),
                &q.vhost,
                &q.name,
                q.messages,
            ) =>
            {
                log::debug!(
                    "queue {} in vhost {} (type {}) not selected",
                    q.name,
                    q.vhost,
                    q.type_name
                );
                continue;
            }
            None => Some(format!(
                "its type {} is not one rmq-backup can read",
                q.type_name
            )),
            // Streams are read with the stream protocol or through AMQP 0-9-1
            // (`backup.stream_enabled`), never skipped.
            Some(QueueType::Stream) => None,
            Some(_) if q.exclusive => Some("it is exclusive to another connection".to_string()),
            Some(QueueType::Quorum) => match quorum::decide(&q, version, opts) {
                Decision::Skip(why) => Some(why),
                _ => None,
            },
            Some(QueueType::Classic) => None,
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
