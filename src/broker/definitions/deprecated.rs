//! Deprecated features a RabbitMQ 4.x target may deny, and what a restore does about the
//! definitions that use them (issue 37, item 5).
//!
//! An operator can deny a deprecated feature (`deprecated_features.permit.<name> = false` in
//! rabbitmq.conf; `GET /api/deprecated-features` says which are denied). Measured on 4.3.6 with
//! `transient_nonexcl_queues` and `global_qos` denied:
//!
//! - a non-durable, non-exclusive queue in a definitions import is left out **silently**
//!   (`HTTP 204`, every other object imported, nothing in the log), and declaring one over AMQP
//!   closes the connection (`541 INTERNAL_ERROR ... transient_nonexcl_queues is deprecated`).
//!   A backup of RabbitMQ 3.x holds such queues (3.x had no such rule), with their messages: a
//!   restore into such a target declares each of them durable ([`make_durable`]), each a
//!   [`Change::MadeDurable`] warned about, so that no queue and none of its messages is lost;
//! - `basic.qos` with `global = true` is accepted and applied per consumer: the tool's own
//!   connections always ask for a per-consumer prefetch (`global = false`), so nothing changes
//!   for them.
//!
//! Debian's RabbitMQ 4.3.6 permits `transient_nonexcl_queues` by default (a Debian patch);
//! RabbitMQ's own 4.3 packages deny it by default.

use super::migrate::Change;
use super::select::{array_mut, str_field};
use serde_json::Value;

/// The deprecated feature of transient (non-durable), non-exclusive queues.
pub const TRANSIENT_NONEXCL_QUEUES: &str = "transient_nonexcl_queues";

/// Declares every non-durable, non-exclusive queue of `doc` durable; returns one
/// [`Change::MadeDurable`] per queue (names as in `doc`).
pub fn make_durable(doc: &mut Value) -> Vec<Change> {
    let mut changes = Vec::new();
    if let Some(queues) = array_mut(doc, "queues") {
        for q in queues.iter_mut() {
            let durable = q.get("durable").and_then(Value::as_bool).unwrap_or(true);
            let exclusive = q.get("exclusive").and_then(Value::as_bool).unwrap_or(false);
            if durable || exclusive {
                continue;
            }
            if let Some(obj) = q.as_object_mut() {
                obj.insert("durable".into(), Value::Bool(true));
            }
            changes.push(Change::MadeDurable {
                vhost: str_field(q, "vhost").to_string(),
                queue: str_field(q, "name").to_string(),
            });
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_transient_non_exclusive_queues_become_durable() {
        let mut doc = json!({"queues": [
            {"name": "t", "vhost": "v", "durable": false, "auto_delete": false, "arguments": {}},
            {"name": "d", "vhost": "v", "durable": true, "auto_delete": false, "arguments": {}},
            {"name": "x", "vhost": "v", "durable": false, "exclusive": true, "arguments": {}},
            {"name": "a", "vhost": "w", "durable": false, "auto_delete": true, "arguments": {}}
        ]});
        let changes = make_durable(&mut doc);
        let durable: Vec<bool> = doc["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["durable"].as_bool().unwrap())
            .collect();
        assert_eq!(durable, [true, true, false, true]);
        assert_eq!(
            changes,
            [
                Change::MadeDurable {
                    vhost: "v".into(),
                    queue: "t".into()
                },
                Change::MadeDurable {
                    vhost: "w".into(),
                    queue: "a".into()
                }
            ]
        );
        assert!(changes[0].to_string().contains("declared durable"));
        assert!(make_durable(&mut json!({})).is_empty());
    }
}
