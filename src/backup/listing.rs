//! How a backup lists the source's queues (issue 41, item 2: many queues). The management
//! API's full listing (`ManagementClient::list_queues_in`) costs the broker the most per queue;
//! its listing without statistics (`ManagementClient::list_queues_live`) about half, and holds
//! most of what a backup decides on. What each field of `QueueInfo` decides, and where the live
//! listing has it (measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6):
//!
//! | field | decides | live listing |
//! |---|---|---|
//! | vhost, name, type, arguments, exclusive, auto_delete | selection, skips, read strategy | yes |
//! | messages, unacknowledged, statistics | `min_messages`, where a read starts (`unacked`) | classic and quorum (live counts); not streams |
//! | node / leader | the node a read connects to | classic and quorum; not streams |
//! | policy, effective policy definition, delivery limit | a quorum queue's give-back before 4.3 (`quorum`), the drop-head warning | the user policy's name; the definition and limit of quorum queues on 4.3 only; operator policies never |
//! | message_bytes | `--dry-run`'s bytes | no (a backup no longer needs it: `queue::inline`) |
//!
//! So a backup lists live, then completes only what the live listing leaves short: streams are
//! asked one by one (`GET /api/queues/{vhost}/{name}`: exactly what the full listing says of
//! them); a queue that names a user policy takes that policy's definition from
//! `GET /api/policies` (one request); a queue that names none has none, which is all a quorum
//! queue's delivery limit needs beside its arguments and the version's default (before 4.3,
//! where the live listing has no `delivery_limit`). An operator policy that sets a length
//! limit, an overflow behaviour or a delivery limit, which the live listing cannot show, sends
//! the backup back to the full listing, as do more streams and changed policies to ask one by
//! one than [`ONE_BY_ONE_MIN`] and [`ONE_BY_ONE_SHARE`] allow, and a broker without message
//! statistics (whose handling was made and tested on the full listing's missing counts).
//! `--dry-run` keeps the full listing: it reports bytes.

use crate::broker::management::{ManagementClient, PolicyKind, QueueInfo};
use crate::broker::{selection, BrokerVersion, QueueType};
use crate::config::SourceConfig;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::time::Instant;

/// Which listing a backup uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listing {
    /// The full listing: every field, the most work for the broker.
    Full,
    /// The listing without statistics, completed where it falls short (module documentation).
    Live,
}

/// Keys of an operator policy the live listing cannot show and a decision reads: the
/// drop-head warning's (`select::drops_head`) and a quorum queue's delivery limit
/// (`super::quorum`).
const OPERATOR_KEYS: [&str; 4] = [
    "max-length",
    "max-length-bytes",
    "overflow",
    "delivery-limit",
];

/// Queues asked one by one, at most: `max(ONE_BY_ONE_MIN, listed / ONE_BY_ONE_SHARE)`; more
/// than that and the full listing costs less. Measured on RabbitMQ 3.10.8 with 5,000 queues
/// (docs/performance.md, a loaded machine): a `GET /api/queues/{vhost}/{name}` took 2.5-9 ms,
/// the full listing 0.47-1.3 ms per queue, so one asked costs about 5-20 listed.
const ONE_BY_ONE_MIN: usize = 50;
/// See [`ONE_BY_ONE_MIN`].
const ONE_BY_ONE_SHARE: usize = 15;

/// The queues of `source.queues.vhosts` (every vhost when empty) with what a backup decides
/// on, listed as `listing` says; `version`: the broker's (what a quorum queue's give-back
/// costs decides whether its policy is needed).
///
/// Errors: the management API's.
pub(super) fn list(
    mgmt: &ManagementClient,
    source: &SourceConfig,
    version: Option<BrokerVersion>,
    listing: Listing,
) -> Result<Vec<QueueInfo>> {
    let vhosts = source.queues.as_ref().map_or(&[][..], |s| &s.vhosts[..]);
    if listing == Listing::Full {
        return mgmt.list_queues_in(vhosts);
    }
    let started = Instant::now();
    let mut queues = mgmt.list_queues_live(vhosts)?;
    let live_took = started.elapsed();
    // Only queues the selection may take are completed: by name, vhost and type (a stream's
    // depth is not in the live listing, so `min_messages` waits for its details).
    let candidate = |q: &QueueInfo| match q.queue_type {
        Some(kind) => {
            selection::selected(source.queues.as_ref(), &q.vhost, &q.name, kind, u64::MAX)
        }
        None => selection::selected_any_type(source.queues.as_ref(), &q.vhost, &q.name, u64::MAX),
    };
    let counted_nack = !version.is_some_and(BrokerVersion::uncounted_nack);
    let mut one_by_one: Vec<usize> = Vec::new();
    let mut by_policy: Vec<usize> = Vec::new();
    for (i, q) in queues.iter_mut().enumerate().filter(|(_, q)| candidate(q)) {
        let quorum_limit = q.queue_type == Some(QueueType::Quorum) && counted_nack;
        if q.queue_type == Some(QueueType::Stream) {
            one_by_one.push(i);
        } else if q.policy.is_some() && !q.policy_known {
            by_policy.push(i);
        } else if quorum_limit && !q.policy_known {
            // No user policy, and no operator policy that sets a limit (checked below): its
            // arguments and the version's default decide, as the full listing would say.
            q.effective_policy_definition.clear();
            q.policy_known = true;
        }
    }
    let full = |why: &str| -> Result<Vec<QueueInfo>> {
        log::debug!("queues listed with the management API's full listing: {why}");
        mgmt.list_queues_in(vhosts)
    };
    match length_operator_policy(mgmt, vhosts) {
        Ok(None) => {}
        Ok(Some(name)) => {
            return full(&format!(
                "operator policy {name} sets a length or delivery limit, which the listing without statistics does not show"
            ))
        }
        Err(e) => {
            return full(&format!(
                "the operator policies could not be read ({e})"
            ))
        }
    }
    if !by_policy.is_empty() {
        match mgmt.list_policies(PolicyKind::User, vhosts) {
            Ok(policies) => {
                let defs: HashMap<(&str, &str), _> = policies
                    .iter()
                    .map(|p| ((p.vhost.as_str(), p.name.as_str()), &p.definition))
                    .collect();
                for &i in &by_policy {
                    let q = &mut queues[i];
                    let key = (q.vhost.as_str(), q.policy.as_deref().unwrap_or_default());
                    match defs.get(&key) {
                        Some(def) => {
                            q.effective_policy_definition = (*def).clone();
                            q.policy_known = true;
                        }
                        // Changed since the listing: asked again.
                        None => one_by_one.push(i),
                    }
                }
            }
            Err(e) => {
                log::debug!("the policies could not be read ({e}): the queues that name one are asked one by one");
                one_by_one.extend(&by_policy);
            }
        }
    }
    let max = ONE_BY_ONE_MIN.max(queues.len() / ONE_BY_ONE_SHARE);
    if one_by_one.len() > max {
        return full(&format!(
            "{} queue(s) to ask one by one (streams, changed policies), more than {max}",
            one_by_one.len()
        ));
    }
    let mut gone = Vec::new();
    for &i in &one_by_one {
        let q = &queues[i];
        match mgmt.get_queue(&q.vhost, &q.name) {
            Ok(now) => queues[i] = now,
            Err(Error::Management(m)) if m.starts_with("HTTP 404 for GET /api/queues/") => {
                gone.push(i)
            }
            Err(e) => return Err(e),
        }
    }
    // Deleted since the live listing: not listed, as the full listing would not list them.
    gone.sort_unstable();
    for i in gone.into_iter().rev() {
        queues.remove(i);
    }
    log::debug!(
        "{} queue(s) listed without statistics in {:.2} s ({:.2} s in all: {} asked one by one, {} policy definition(s) from the policies)",
        queues.len(),
        live_took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        one_by_one.len(),
        by_policy.len()
    );
    Ok(queues)
}

/// The name of an operator policy of `vhosts` (every vhost when empty) that sets one of
/// [`OPERATOR_KEYS`], if any: the live listing does not say which queues an operator policy
/// applies to.
///
/// Errors: the management API's.
fn length_operator_policy(mgmt: &ManagementClient, vhosts: &[String]) -> Result<Option<String>> {
    Ok(mgmt
        .list_policies(PolicyKind::Operator, vhosts)?
        .into_iter()
        .find(|p| OPERATOR_KEYS.iter().any(|k| p.definition.contains_key(*k)))
        .map(|p| format!("{} (vhost {})", p.name, p.vhost)))
}
