//! Definitions exported by RabbitMQ 3.x made importable by RabbitMQ 4.x (README "From RabbitMQ
//! 3.x to 4.x"): what a restore changes when the target's `rabbitmq_version` is 4 or later.
//!
//! Measured with `POST /api/definitions` on 4.0.5 and 4.3.6 (3.10.8 takes all of it): any
//! policy key of classic queue mirroring fails the whole import (`HTTP 400 ... are not
//! recognised policy settings`, nothing imported), and so does `queue-master-locator` on 4.3.6
//! (`use of deprecated queue-master-locator argument is not permitted`); a classic queue
//! declared with `x-queue-master-locator` is left out silently by 4.3.6 (`204`, no queue), and
//! one with `x-queue-version: 1` fails the import (`unsupported queue version '1'`). So:
//!
//! - from every policy and operator policy, the keys of [`REMOVED_POLICY_KEYS`] are dropped,
//!   each with a warning, and a policy left without keys is not imported (RabbitMQ refuses an
//!   empty definition);
//! - from every queue, `x-queue-master-locator` and `x-queue-version: 1` are dropped;
//! - with `restore.convert_mirrored_queues: quorum`, each classic queue a mirroring policy
//!   applied to in the backup ([`super::policy`]) is declared a quorum queue, without the
//!   arguments a quorum queue refuses ([`QUORUM_REFUSED_ARGUMENTS`]), as RabbitMQ's guide
//!   "Migrate your RabbitMQ Mirrored Classic Queues to Quorum Queues" advises for 4.0;
//! - a queue the policy it had in the backup no longer reaches on the target (a policy skipped,
//!   or one a quorum queue ignores) is named.
//!
//! Every change is a [`Change`], logged as a warning before anything is written.

use super::policy::{classic_unsupported_keys, effective, ExportQueue, Policy};
use super::select::{array_mut, str_field};
use crate::broker::BrokerVersion;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The policy keys of classic queue mirroring, removed in RabbitMQ 4.0 (its release notes,
/// "Classic Queues is Now a Non-Replicated Queue Type"; the validators of
/// `rabbit_mirror_queue_misc` in 3.13.7); every one is refused by 4.0.5 and 4.3.6 (measured).
pub const MIRRORING_KEYS: [&str; 6] = [
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
];

/// `queue-master-locator`: deprecated in RabbitMQ 4.0 (`queue-leader-locator` replaces it) and
/// denied by default from 4.3 (the `queue_master_locator` deprecated feature; 4.3.6 refuses the
/// policy key and leaves out a queue declared with `x-queue-master-locator`).
pub const MASTER_LOCATOR_KEY: &str = "queue-master-locator";

/// Every policy key a restore into RabbitMQ 4.x drops: [`MIRRORING_KEYS`] and
/// [`MASTER_LOCATOR_KEY`].
pub const REMOVED_POLICY_KEYS: [&str; 7] = [
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
    MASTER_LOCATOR_KEY,
];

/// Arguments of a classic (or stream) queue a quorum queue refuses on RabbitMQ 4.x (`invalid
/// arg ... of queue type rabbit_quorum_queue`): the other types' `queue_arguments` less the
/// quorum queue's (`capabilities/0` of 4.0.5 and 4.3.0; measured on 4.3.6 for the first four).
pub const QUORUM_REFUSED_ARGUMENTS: [&str; 8] = [
    "x-max-priority",
    "x-queue-mode",
    "x-queue-version",
    "x-queue-master-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes",
    "x-initial-cluster-size",
];

/// Policy keys that keep a whole policy off a quorum queue on RabbitMQ 4.x (the quorum queue's
/// `unsupported_policies`, 4.0.5 and 4.3.0, less the keys a migration drops anyway).
const QUORUM_IGNORED_POLICY_KEYS: [&str; 8] = [
    "max-priority",
    "queue-mode",
    "single-active-consumer",
    "max-age",
    "stream-max-segment-size-bytes",
    "initial-cluster-size",
    "selector-fields",
    "selector-field-max-bytes",
];

/// True for a target that needs the migration: RabbitMQ 4.0 or later.
pub fn needed(target: BrokerVersion) -> bool {
    target.major >= 4
}

/// Policy or operator policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Policy,
    OperatorPolicy,
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyKind::Policy => "policy",
            PolicyKind::OperatorPolicy => "operator policy",
        })
    }
}

/// One change a restore into RabbitMQ 4.x makes to the backed-up definitions (names as in the
/// backup, before the mappings). `Display` is the warning logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key dropped from a policy or operator policy.
    DroppedKey {
        kind: PolicyKind,
        vhost: String,
        policy: String,
        key: String,
    },
    /// A policy left without keys: not imported.
    SkippedPolicy {
        kind: PolicyKind,
        vhost: String,
        policy: String,
    },
    /// An argument dropped from a queue; `quorum` when because the queue became a quorum queue.
    DroppedArgument {
        vhost: String,
        queue: String,
        argument: String,
        value: String,
        quorum: bool,
    },
    /// A classic queue a mirroring policy applied to, declared as a quorum queue.
    Converted {
        vhost: String,
        queue: String,
        policy: String,
    },
    /// A mirrored classic queue that stays classic: `why` it cannot be a quorum queue.
    NotConverted {
        vhost: String,
        queue: String,
        policy: String,
        why: &'static str,
    },
    /// The policy that applied to a queue in the backup differs on the target.
    PolicyChanged {
        vhost: String,
        queue: String,
        before: String,
        after: Option<String>,
        why: String,
    },
    /// A non-durable, non-exclusive queue declared durable: the target denies the deprecated
    /// feature `transient_nonexcl_queues` (`super::deprecated`).
    MadeDurable { vhost: String, queue: String },
    /// A mirroring policy whose pattern the `regex` crate cannot evaluate: the queues it
    /// mirrored are not known, and not converted.
    UnreadablePattern {
        vhost: String,
        policy: String,
        pattern: String,
        error: String,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::DroppedKey {
                kind,
                vhost,
                policy,
                key,
            } => {
                let why = if key == MASTER_LOCATOR_KEY {
                    "deprecated since RabbitMQ 4.0 and refused by default since 4.3 (queue-leader-locator replaces it)"
                } else {
                    "RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key"
                };
                write!(
                    f,
                    "{kind} {policy} in vhost {vhost}: key {key} dropped: {why}"
                )
            }
            Change::SkippedPolicy {
                kind,
                vhost,
                policy,
            } => write!(
                f,
                "{kind} {policy} in vhost {vhost}: not imported: no key is left once the keys RabbitMQ 4.x refuses are dropped"
            ),
            Change::DroppedArgument {
                vhost,
                queue,
                argument,
                value,
                quorum,
            } => {
                let why = match (argument.as_str(), quorum) {
                    ("x-overflow", true) => {
                        "quorum queues do not support reject-publish-dlx (the broker would use drop-head)"
                    }
                    (_, true) => "a quorum queue refuses it",
                    ("x-queue-version", false) => {
                        "RabbitMQ 4.0 removed classic queue storage version 1 and 4.3 refuses it"
                    }
                    _ => {
                        "deprecated since RabbitMQ 4.0, and 4.3 leaves out a queue declared with it (x-queue-leader-locator replaces it)"
                    }
                };
                write!(
                    f,
                    "queue {queue} in vhost {vhost}: argument {argument} = {value} dropped: {why}"
                )
            }
            Change::Converted {
                vhost,
                queue,
                policy,
            } => write!(
                f,
                "queue {queue} in vhost {vhost}: declared as a quorum queue (restore.convert_mirrored_queues), policy {policy} mirrored it; a quorum queue delivers messages of a higher priority property first"
            ),
            Change::NotConverted {
                vhost,
                queue,
                policy,
                why,
            } => write!(
                f,
                "queue {queue} in vhost {vhost}: policy {policy} mirrored it, but it stays a classic queue: {why}"
            ),
            Change::PolicyChanged {
                vhost,
                queue,
                before,
                after,
                why,
            } => {
                let after = match after {
                    Some(p) => format!("policy {p} applies on the target instead"),
                    None => "no policy applies on the target".to_string(),
                };
                write!(
                    f,
                    "queue {queue} in vhost {vhost}: policy {before} applied to it in the backup, {after}: {why}"
                )
            }
            Change::MadeDurable { vhost, queue } => write!(
                f,
                "queue {queue} in vhost {vhost}: declared durable: it was transient (non-durable, non-exclusive), and the target denies the deprecated feature transient_nonexcl_queues (it would leave the queue out of the import silently); its messages are restored into it"
            ),
            Change::UnreadablePattern {
                vhost,
                policy,
                pattern,
                error,
            } => write!(
                f,
                "policy {policy} in vhost {vhost}: its pattern {pattern:?} cannot be evaluated here ({error}): the queues it mirrored are not converted"
            ),
        }
    }
}

/// The version of the broker that exported `doc` (`rabbitmq_version`, else `rabbit_version`).
pub(super) fn source_version(doc: &Value) -> Option<BrokerVersion> {
    ["rabbitmq_version", "rabbit_version"]
        .iter()
        .find_map(|k| doc.get(*k).and_then(Value::as_str))
        .and_then(BrokerVersion::parse)
}

/// Classic queues of an export a mirroring policy applied to: (vhost, queue) to the policy's
/// name. Read from the whole export, before `definitions_selection` (which keeps no policy
/// when it names queues). Mirroring policies whose pattern cannot be evaluated come back as
/// [`Change::UnreadablePattern`].
pub(super) fn mirrored_queues(doc: &Value) -> (BTreeMap<(String, String), String>, Vec<Change>) {
    let unsupported = classic_unsupported_keys(source_version(doc));
    let items = |k: &str| doc.get(k).and_then(Value::as_array).map_or(&[][..], |a| a);
    let policies: Vec<Policy> = items("policies")
        .iter()
        .filter_map(Policy::from_policy)
        .collect();
    let unreadable = policies
        .iter()
        .filter(|p| p.mirrors())
        .filter_map(|p| {
            let error = p.pattern.as_ref().err()?;
            Some(Change::UnreadablePattern {
                vhost: p.vhost.to_string(),
                policy: p.name.to_string(),
                pattern: p.pattern_text.to_string(),
                error: error.clone(),
            })
        })
        .collect();
    let mirrored = items("queues")
        .iter()
        .map(ExportQueue::read)
        .filter(|q| q.queue_type == "classic")
        .filter_map(|q| {
            let p = effective(&policies, &q, &unsupported).filter(|p| p.mirrors())?;
            Some((
                (q.vhost.to_string(), q.name.to_string()),
                p.name.to_string(),
            ))
        })
        .collect();
    (mirrored, unreadable)
}

/// Rewrites `doc` (selected, not yet renamed) for a RabbitMQ 4.x target, as the module says;
/// `convert` holds the mirrored queues to declare as quorum queues
/// (`restore.convert_mirrored_queues`, from [`mirrored_queues`]). Returns every change made, in
/// the order: policies, operator policies, queues, policies that no longer reach a queue.
pub(super) fn for_4x(
    doc: &mut Value,
    convert: Option<&BTreeMap<(String, String), String>>,
) -> Vec<Change> {
    let unsupported = classic_unsupported_keys(source_version(doc));
    let policies_before: Vec<Value> = doc
        .get("policies")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut changes = Vec::new();
    if let Some(policies) = array_mut(doc, "policies") {
        policies.retain_mut(|p| strip_policy(p, PolicyKind::Policy, &mut changes));
    }
    if let Some(params) = array_mut(doc, "parameters") {
        params.retain_mut(|p| {
            str_field(p, "component") != "operator_policy"
                || strip_policy(p, PolicyKind::OperatorPolicy, &mut changes)
        });
    }
    let mut converted = BTreeSet::new();
    if let Some(queues) = array_mut(doc, "queues") {
        for q in queues.iter_mut() {
            if migrate_queue(q, convert, &mut changes) {
                converted.insert((
                    str_field(q, "vhost").to_string(),
                    str_field(q, "name").to_string(),
                ));
            }
        }
    }
    // The policy each classic queue of the backup had, against the one it has on the target.
    let before: Vec<Policy> = policies_before
        .iter()
        .filter_map(Policy::from_policy)
        .collect();
    let after_docs = doc.get("policies").and_then(Value::as_array);
    let after: Vec<Policy> = after_docs
        .map_or(&[][..], |a| a)
        .iter()
        .filter_map(Policy::from_policy)
        .collect();
    let quorum_ignores: Vec<&str> = QUORUM_IGNORED_POLICY_KEYS
        .iter()
        .chain(&REMOVED_POLICY_KEYS)
        .copied()
        .collect();
    for q in doc
        .get("queues")
        .and_then(Value::as_array)
        .map_or(&[][..], |a| a)
    {
        let target = ExportQueue::read(q);
        let is_converted = converted.contains(&(target.vhost.to_string(), target.name.to_string()));
        let source = ExportQueue {
            queue_type: if is_converted {
                "classic"
            } else {
                target.queue_type
            },
            ..target.clone()
        };
        if source.queue_type != "classic" {
            continue;
        }
        let Some(was) = effective(&before, &source, &unsupported) else {
            continue;
        };
        let rules = if is_converted {
            &quorum_ignores
        } else {
            &unsupported
        };
        let now = effective(&after, &target, rules);
        if now.is_some_and(|p| p.name == was.name) {
            continue;
        }
        let kept = after.iter().find(|p| p.name == was.name);
        let why = match kept {
            None => format!("{} was not imported", was.name),
            Some(p) if p.apply_to == "classic_queues" => {
                format!("{} applies to classic queues only", p.name)
            }
            Some(p) => match p.definition.and_then(|d| {
                d.keys()
                    .find(|k| QUORUM_IGNORED_POLICY_KEYS.contains(&k.as_str()))
            }) {
                Some(key) => format!(
                    "{} holds {key}, which keeps the whole policy off a quorum queue (queue-mode has no effect on RabbitMQ 4.x: without it the rest of {} applies)",
                    p.name, p.name
                ),
                None => format!("{} no longer applies", p.name),
            },
        };
        changes.push(Change::PolicyChanged {
            vhost: target.vhost.to_string(),
            queue: target.name.to_string(),
            before: was.name.to_string(),
            after: now.map(|p| p.name.to_string()),
            why,
        });
    }
    changes
}

/// Drops [`REMOVED_POLICY_KEYS`] from a policy (its `definition`, or an operator policy's
/// `value.definition`); false when nothing is left (the policy is not imported).
fn strip_policy(p: &mut Value, kind: PolicyKind, changes: &mut Vec<Change>) -> bool {
    let vhost = str_field(p, "vhost").to_string();
    let name = str_field(p, "name").to_string();
    let pointer = match kind {
        PolicyKind::Policy => "/definition",
        PolicyKind::OperatorPolicy => "/value/definition",
    };
    let Some(definition) = p.pointer_mut(pointer).and_then(Value::as_object_mut) else {
        return true;
    };
    let removed: Vec<String> = definition
        .keys()
        .filter(|k| REMOVED_POLICY_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    if removed.is_empty() {
        return true;
    }
    for key in removed {
        definition.remove(&key);
        changes.push(Change::DroppedKey {
            kind,
            vhost: vhost.clone(),
            policy: name.clone(),
            key,
        });
    }
    if definition.is_empty() {
        changes.push(Change::SkippedPolicy {
            kind,
            vhost,
            policy: name,
        });
        return false;
    }
    true
}

/// Drops the arguments 4.x refuses from one queue and, when `convert` names it, makes it a
/// quorum queue; true when it was converted.
fn migrate_queue(
    q: &mut Value,
    convert: Option<&BTreeMap<(String, String), String>>,
    changes: &mut Vec<Change>,
) -> bool {
    let vhost = str_field(q, "vhost").to_string();
    let name = str_field(q, "name").to_string();
    let mirrored_by = convert.and_then(|c| c.get(&(vhost.clone(), name.clone())));
    let flag = |k: &str, default: bool| q.get(k).and_then(Value::as_bool).unwrap_or(default);
    let not_quorum = if flag("auto_delete", false) {
        Some("a quorum queue cannot be auto-delete")
    } else if flag("exclusive", false) {
        Some("a quorum queue cannot be exclusive")
    } else if !flag("durable", true) {
        Some("a quorum queue is always durable, and this one is not (4.x leaves out a non-durable quorum queue)")
    } else {
        None
    };
    let to_quorum = match (mirrored_by, not_quorum) {
        (Some(policy), Some(why)) => {
            changes.push(Change::NotConverted {
                vhost: vhost.clone(),
                queue: name.clone(),
                policy: policy.clone(),
                why,
            });
            false
        }
        (Some(_), None) => true,
        (None, _) => false,
    };
    let mut dropped = Vec::new();
    if let Some(args) = q.get_mut("arguments").and_then(Value::as_object_mut) {
        dropped = drop_arguments(args, to_quorum);
        if to_quorum {
            args.insert("x-queue-type".into(), "quorum".into());
        }
    } else if to_quorum {
        let mut args = Map::new();
        args.insert("x-queue-type".into(), "quorum".into());
        if let Some(obj) = q.as_object_mut() {
            obj.insert("arguments".into(), Value::Object(args));
        }
    }
    if to_quorum {
        if let Some(t) = q.get_mut("type") {
            *t = "quorum".into();
        }
        changes.push(Change::Converted {
            vhost: vhost.clone(),
            queue: name.clone(),
            policy: mirrored_by.cloned().unwrap_or_default(),
        });
    }
    for (argument, value, quorum) in dropped {
        changes.push(Change::DroppedArgument {
            vhost: vhost.clone(),
            queue: name.clone(),
            argument,
            value,
            quorum,
        });
    }
    to_quorum
}

/// Removes from a queue's arguments what RabbitMQ 4.x refuses: `x-queue-master-locator` and
/// `x-queue-version: 1` from any queue, and with `quorum` [`QUORUM_REFUSED_ARGUMENTS`] and
/// `x-overflow: reject-publish-dlx`. Returns (argument, value as JSON, because of `quorum`).
pub(super) fn drop_arguments(
    args: &mut Map<String, Value>,
    quorum: bool,
) -> Vec<(String, String, bool)> {
    let refused = |k: &str, v: &Value| -> Option<bool> {
        if k == "x-queue-master-locator" || (k == "x-queue-version" && v.as_i64() == Some(1)) {
            Some(false)
        } else if quorum
            && (QUORUM_REFUSED_ARGUMENTS.contains(&k)
                || (k == "x-overflow" && v.as_str() == Some("reject-publish-dlx")))
        {
            Some(true)
        } else {
            None
        }
    };
    let drop: Vec<(String, bool)> = args
        .iter()
        .filter_map(|(k, v)| refused(k, v).map(|q| (k.clone(), q)))
        .collect();
    drop.into_iter()
        .filter_map(|(k, q)| args.remove(&k).map(|v| (k, v.to_string(), q)))
        .collect()
}

#[cfg(test)]
mod tests;
