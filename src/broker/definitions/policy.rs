//! Which policy of a definitions export applied to a queue, decided as RabbitMQ decides it
//! (`rabbit_policy:match/2` of RabbitMQ 3.x): among the policies of the queue's vhost whose
//! `apply-to` takes queues (`all`, `queues`, and from 3.12 the queue's own type,
//! `classic_queues`), whose definition holds no key the queue type ignores
//! (`rabbit_queue_type:is_policy_applicable/2`) and whose `pattern` (a PCRE regular expression,
//! Erlang's `re:run/3` without the `unicode` option) matches the queue's name, the one with the
//! highest `priority` applies, whole: policies are not merged. Between policies of the same
//! priority RabbitMQ's choice is not defined (its "Policies" guide); here the first in the
//! export wins.

use super::select::str_field;
use crate::broker::BrokerVersion;
use regex::bytes::{Regex, RegexBuilder};
use serde_json::{Map, Value};

/// Keys that make a policy not apply to a classic queue on the source broker: the stream
/// policies (3.9 on), the quorum ones `delivery-limit` and `dead-letter-strategy` (3.10 on),
/// `max-in-memory-length`, `max-in-memory-bytes` and `target-group-size` (3.12 on); from
/// `rabbit_classic_queue:capabilities/0` `unsupported_policies` of 3.9.29, 3.10.8, 3.11.28,
/// 3.12.14 and 3.13.7. An export whose version is unknown is read as a 3.13 one.
pub(super) fn classic_unsupported_keys(source: Option<BrokerVersion>) -> Vec<&'static str> {
    let at_least = |major, minor| source.is_none_or(|v| (v.major, v.minor) >= (major, minor));
    let mut keys = vec![
        "max-age",
        "stream-max-segment-size-bytes",
        "queue-leader-locator",
        "initial-cluster-size",
    ];
    if at_least(3, 10) {
        keys.extend(["delivery-limit", "dead-letter-strategy"]);
    }
    if at_least(3, 12) {
        keys.extend([
            "max-in-memory-length",
            "max-in-memory-bytes",
            "target-group-size",
        ]);
    }
    keys
}

/// One policy of an export (`policies`). Operator policies (`parameters` of component
/// `operator_policy`) cannot mirror (RabbitMQ 3.x refuses `ha-` keys in them) and are not
/// matched here.
#[derive(Debug)]
pub(super) struct Policy<'a> {
    pub vhost: &'a str,
    pub name: &'a str,
    /// `all` when absent, as RabbitMQ stores it.
    pub apply_to: &'a str,
    /// Integer priority; 0 when absent or not a number.
    pub priority: i64,
    pub definition: Option<&'a Map<String, Value>>,
    /// The compiled pattern, or why it cannot be evaluated here (a PCRE feature the `regex`
    /// crate lacks, such as look-around or back-references).
    pub pattern: Result<Regex, String>,
    /// The pattern as written.
    pub pattern_text: &'a str,
}

impl<'a> Policy<'a> {
    /// Reads a `policies` entry; `None` when it is not an object.
    pub fn from_policy(v: &'a Value) -> Option<Policy<'a>> {
        Self::read(v.as_object()?, str_field(v, "vhost"), str_field(v, "name"))
    }

    fn read(fields: &'a Map<String, Value>, vhost: &'a str, name: &'a str) -> Option<Self> {
        let pattern_text = fields.get("pattern").and_then(Value::as_str).unwrap_or("");
        let priority = match fields.get("priority") {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
            Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
            _ => 0,
        };
        Some(Policy {
            vhost,
            name,
            apply_to: fields
                .get("apply-to")
                .and_then(Value::as_str)
                .unwrap_or("all"),
            priority,
            definition: fields.get("definition").and_then(Value::as_object),
            pattern: compile(pattern_text),
            pattern_text,
        })
    }

    /// True when the definition holds a key whose name starts with `ha-`: a classic-mirroring
    /// policy (RabbitMQ 3.x "Classic Queue Mirroring" guide).
    pub fn mirrors(&self) -> bool {
        self.definition
            .is_some_and(|d| d.keys().any(|k| k.starts_with("ha-")))
    }

    /// True when this policy is a candidate for `queue`: same vhost, an `apply-to` that takes
    /// it, no key in `unsupported` (the queue type's), a pattern that matches its name.
    pub fn matches(&self, queue: &ExportQueue, unsupported: &[&str]) -> bool {
        let takes_type = match self.apply_to {
            "all" | "queues" => true,
            "classic_queues" => queue.queue_type == "classic",
            "quorum_queues" => queue.queue_type == "quorum",
            "streams" => queue.queue_type == "stream",
            _ => false,
        };
        self.vhost == queue.vhost
            && takes_type
            && !self
                .definition
                .is_some_and(|d| d.keys().any(|k| unsupported.contains(&k.as_str())))
            && self
                .pattern
                .as_ref()
                .is_ok_and(|re| re.is_match(queue.name.as_bytes()))
    }
}

/// Compiles a policy pattern as Erlang's `re` reads it without `unicode`: bytes, ASCII classes.
fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .unicode(false)
        .build()
        .map_err(|e| {
            e.to_string()
                .lines()
                .last()
                .unwrap_or("")
                .trim()
                .to_string()
        })
}

/// A queue of an export, as the policy match needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExportQueue<'a> {
    pub vhost: &'a str,
    pub name: &'a str,
    /// `classic`, `quorum`, `stream`: the `type` field where the export has one (4.x), else the
    /// `x-queue-type` argument, else `classic` (RabbitMQ 3.x exports say nothing of classic
    /// queues).
    pub queue_type: &'a str,
}

impl<'a> ExportQueue<'a> {
    pub fn read(v: &'a Value) -> ExportQueue<'a> {
        let queue_type = v
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| v.pointer("/arguments/x-queue-type").and_then(Value::as_str))
            .unwrap_or("classic");
        ExportQueue {
            vhost: str_field(v, "vhost"),
            name: str_field(v, "name"),
            queue_type,
        }
    }
}

/// The policy that applies to `queue` among `policies` (highest priority; the first of equal
/// ones), given the keys its type ignores.
pub(super) fn effective<'p, 'a>(
    policies: &'p [Policy<'a>],
    queue: &ExportQueue,
    unsupported: &[&str],
) -> Option<&'p Policy<'a>> {
    policies
        .iter()
        .filter(|p| p.matches(queue, unsupported))
        .fold(None, |best: Option<&Policy>, p| match best {
            Some(b) if b.priority >= p.priority => Some(b),
            _ => Some(p),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(v: &Value) -> Policy<'_> {
        Policy::from_policy(v).unwrap()
    }

    fn queue<'a>(vhost: &'a str, name: &'a str) -> ExportQueue<'a> {
        ExportQueue {
            vhost,
            name,
            queue_type: "classic",
        }
    }

    fn v(s: &str) -> Option<BrokerVersion> {
        BrokerVersion::parse(s)
    }

    #[test]
    fn patterns_match_as_rabbitmq_does() {
        let cases = [
            ("^", "anything", true),
            ("", "anything", true),
            ("^ha\\.", "ha.orders", true),
            ("^ha\\.", "haxorders", false),
            ("^ha\\.", "x.ha.orders", false),
            ("orders", "my-orders-queue", true),
            ("^(orders|billing)$", "billing", true),
            ("^(orders|billing)$", "billing2", false),
            ("^q[0-9]+$", "q17", true),
            ("^q\\d+$", "q1a", false),
            ("^\\w+$", "ünï", false), // ASCII classes, as re without `unicode`
            ("^.{3}$", "ü1", true),   // `.` is one byte: ü is two
            ("(?i)^ORD", "orders", true),
        ];
        for (pattern, name, expected) in cases {
            let p = json!({"vhost": "v", "name": "p", "pattern": pattern, "definition": {"ha-mode": "all"}});
            assert_eq!(
                policy(&p).matches(&queue("v", name), &[]),
                expected,
                "{pattern:?} on {name:?}"
            );
        }
    }

    #[test]
    fn vhost_and_apply_to_decide_too() {
        let p = |apply: &str| json!({"vhost": "v", "name": "p", "pattern": "^", "apply-to": apply, "definition": {"ha-mode": "all"}});
        let classic = queue("v", "q");
        let quorum = ExportQueue {
            queue_type: "quorum",
            ..classic.clone()
        };
        assert!(policy(&p("all")).matches(&classic, &[]));
        assert!(policy(&p("queues")).matches(&classic, &[]));
        assert!(policy(&p("classic_queues")).matches(&classic, &[]));
        assert!(!policy(&p("classic_queues")).matches(&quorum, &[]));
        assert!(policy(&p("quorum_queues")).matches(&quorum, &[]));
        assert!(!policy(&p("exchanges")).matches(&classic, &[]));
        assert!(!policy(&p("streams")).matches(&classic, &[]));
        assert!(!policy(&p("all")).matches(&queue("other", "q"), &[]));
        // No apply-to: all.
        let none = json!({"vhost": "v", "name": "p", "pattern": "^", "definition": {}});
        assert_eq!(policy(&none).apply_to, "all");
        assert!(policy(&none).matches(&classic, &[]));
    }

    #[test]
    fn a_key_the_queue_type_ignores_keeps_the_whole_policy_off_it() {
        let p = json!({"vhost": "v", "name": "p", "pattern": "^", "definition": {"ha-mode": "all", "delivery-limit": 5}});
        let q = queue("v", "q");
        assert!(!policy(&p).matches(&q, &classic_unsupported_keys(v("3.10.8"))));
        assert!(policy(&p).matches(&q, &classic_unsupported_keys(v("3.9.29"))));
        let m = json!({"vhost": "v", "name": "p", "pattern": "^", "definition": {"ha-mode": "all", "max-in-memory-length": 5}});
        assert!(policy(&m).matches(&q, &classic_unsupported_keys(v("3.11.28"))));
        assert!(!policy(&m).matches(&q, &classic_unsupported_keys(v("3.12.14"))));
        assert!(!policy(&m).matches(&q, &classic_unsupported_keys(None)));
    }

    #[test]
    fn highest_priority_wins_and_the_first_of_equals() {
        let docs = [
            json!({"vhost": "v", "name": "low", "pattern": "^", "priority": 0, "definition": {"ha-mode": "all"}}),
            json!({"vhost": "v", "name": "high", "pattern": "^q", "priority": 5, "definition": {"message-ttl": 1}}),
            json!({"vhost": "v", "name": "high-too", "pattern": "^", "priority": "5", "definition": {"ha-mode": "all"}}),
            json!({"vhost": "w", "name": "other-vhost", "pattern": "^", "priority": 9, "definition": {}}),
        ];
        let policies: Vec<Policy> = docs.iter().map(policy).collect();
        let name = |q| effective(&policies, &queue("v", q), &[]).map(|p| p.name);
        assert_eq!(name("q1"), Some("high"));
        assert!(!effective(&policies, &queue("v", "q1"), &[])
            .unwrap()
            .mirrors());
        assert_eq!(name("x1"), Some("high-too"), "priority as a string counts");
        assert_eq!(
            name("q1"),
            Some("high"),
            "a policy of another vhost never applies"
        );
        assert_eq!(
            effective(&policies[..1], &queue("w", "q"), &[]).map(|p| p.name),
            None
        );
    }

    #[test]
    fn a_pattern_regex_cannot_read_matches_nothing_and_says_why() {
        let p = json!({"vhost": "v", "name": "p", "pattern": "^(?!tmp)", "definition": {"ha-mode": "all"}});
        let p = policy(&p);
        assert!(
            p.pattern.as_ref().unwrap_err().contains("look-around"),
            "{:?}",
            p.pattern
        );
        assert!(!p.matches(&queue("v", "q"), &[]));
    }

    #[test]
    fn queue_types_are_read_from_their_fields() {
        let q = json!({"vhost": "v", "name": "q", "arguments": {"x-queue-type": "quorum"}});
        assert_eq!(ExportQueue::read(&q).queue_type, "quorum");
        let q = json!({"vhost": "v", "name": "q", "type": "stream", "arguments": {}});
        assert_eq!(ExportQueue::read(&q).queue_type, "stream");
        let q = json!({"vhost": "v", "name": "q", "arguments": {"x-max-priority": 5}});
        assert_eq!(ExportQueue::read(&q).queue_type, "classic");
    }
}
