//! Quorum queues and their delivery limit: how a backup reads and gives back a quorum queue
//! on the broker's version, and which ones it leaves alone (issue "RabbitMQ 4.x").
//!
//! Every return of a quorum message that the broker counts as a failed delivery raises its
//! `x-delivery-count`; once the count passes the queue's delivery limit the broker drops the
//! message (or dead-letters it). Since RabbitMQ 4.0 every quorum queue has a limit of 20
//! without any argument or policy, so a nightly backup that counted would empty it in three
//! weeks (measured on 4.0.5 and 4.3.6: backup 22 of a 1,000-message queue stored 0). So:
//!
//! | broker | delivery limit | read |
//! |---|---|---|
//! | 4.3+ | any | consumers, given back with `basic.nack(requeue)`: not counted |
//! | 3.x, 4.0-4.2 | none (3.x default, or `-1`) | as `requeue_strategy` says (counted, harmless; recorded) |
//! | 3.x, 4.0-4.2, unknown | finite | left alone (exit 4) |
//! | 3.x, 4.0-4.2, unknown | finite, `read_queues_with_delivery_limit` | read while one more read leaves every message below the limit ([`one_more_read`], from the record of earlier reads: `super::counted`) |
//!
//! (ENVIRONMENT.md, measured: 4.0.5 counts nack, reject and a close alike, and an AMQP 1.0
//! `released` too; 4.3.6 counts reject and a close, not a nack.) An unknown version is the
//! careful case: every return counts, and the default limit is 20. The decision is taken
//! right before a queue's read, on the queue's current arguments and policy and on the
//! oldest version any node of the run showed (the management API's, and each AMQP
//! connection's `server-properties`: this queue's included), and logged once per run
//! ([`Decision::log_once`]).
//!
//! The broker adds `x-delivery-count` (3.x, 4.x) and `x-acquired-count` (4.3) to a quorum
//! queue's deliveries: they say how the message was handled, not what its publisher sent, so
//! they are kept out of the record ([`strip_broker_headers`]) and a restore never publishes
//! them.

use crate::broker::amqp::{BasicProperties, Delivery, FieldTable, FieldValue};
use crate::broker::management::QueueInfo;
use crate::broker::reader::ReadPlan;
use crate::broker::{BrokerVersion, QueueType};
use crate::config::{BackupOptions, RequeueStrategy};
use crate::error::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The broker's version as this run knows it: the management API's at the start, lowered
/// by any AMQP connection whose `server-properties` name an older one (a cluster in the middle
/// of an upgrade: the older nodes decide what a return costs).
#[derive(Debug, Default)]
pub struct SeenVersion(Mutex<Option<BrokerVersion>>);

impl SeenVersion {
    /// Starts from the management API's `rabbitmq_version` (`None`: not reported).
    pub fn new(from_api: Option<&str>) -> SeenVersion {
        SeenVersion(Mutex::new(from_api.and_then(BrokerVersion::parse)))
    }

    /// The version decisions are made on now.
    pub fn get(&self) -> Option<BrokerVersion> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the `version` of a connection's `server-properties` into account.
    pub fn observe(&self, server_properties: &FieldTable) {
        let Some(seen) = server_properties
            .iter()
            .find(|(k, _)| k == "version")
            .and_then(|(_, v)| match v {
                FieldValue::LongString(b) => std::str::from_utf8(b).ok(),
                _ => None,
            })
            .and_then(BrokerVersion::parse)
        else {
            return;
        };
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match *known {
            Some(v) if v <= seen => {}
            Some(v) => {
                log::warn!("a node of the source runs RabbitMQ {seen}, older than the {v} its management API reported: quorum queues are handled as {seen} requires");
                *known = Some(seen);
            }
            None => *known = Some(seen),
        }
    }
}

/// Headers a broker adds to the deliveries of a quorum queue: its count of failed deliveries
/// (3.x and 4.x) and of all acquisitions (4.3).
pub const BROKER_HEADERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// The delivery limit RabbitMQ applies to quorum queues where nothing sets one, on a broker
/// of `version`: 20 since 4.0, none on 3.x; an unknown version is taken as the careful case,
/// 20 (issue 37: "an unknown version is treated as the most careful case").
fn default_limit(version: Option<BrokerVersion>) -> Option<u64> {
    match version {
        Some(v) => v.default_quorum_delivery_limit(),
        None => Some(20),
    }
}

/// The delivery limit in effect for quorum queue `q` on a broker of `version`: the
/// management API's `delivery_limit` where it reports one (4.x: whatever set it), else the
/// lower of the `x-delivery-limit` argument and the effective policy's `delivery-limit`
/// (3.x), else the version's default ([`default_limit`]). `None`: unlimited (`-1` on 4.x, or
/// nothing set on 3.x). RabbitMQ "Quorum Queues", poison message handling.
pub fn effective_delivery_limit(q: &QueueInfo, version: Option<BrokerVersion>) -> Option<u64> {
    if q.queue_type != Some(QueueType::Quorum) {
        return None;
    }
    if let Some(limit) = q.delivery_limit {
        return u64::try_from(limit).ok();
    }
    let set = [
        q.arguments.get("x-delivery-limit"),
        q.effective_policy_definition.get("delivery-limit"),
    ];
    let set: Vec<i64> = set.iter().flatten().filter_map(|v| v.as_i64()).collect();
    if !set.is_empty() {
        // A negative value is no limit (4.x's -1); else the lower one wins.
        return set.iter().filter_map(|l| u64::try_from(*l).ok()).min();
    }
    default_limit(version)
}

/// The lowest delivery limit that a policy or operator policy in `policies` whose pattern
/// matches `queue` sets (`delivery-limit` of 0 or more; a negative one is no limit), `None`
/// when none does.
///
/// The management API shows a queue's effective policy only after its next statistics round
/// (measured on 4.3.6 and 3.10.8: a policy set or removed a moment ago is not seen for about
/// 5 s), so where every return counts the decision also asks the policies themselves and takes
/// the lower limit. Priorities and `apply-to` are not weighed: a limit any matching policy sets
/// counts, which may leave a queue alone that a higher-priority policy frees, never the
/// reverse. A pattern that is not a valid regular expression matches nothing.
pub fn policy_limit(
    queue: &str,
    policies: &[crate::broker::management::PolicyInfo],
) -> Option<u64> {
    policies
        .iter()
        .filter(|p| regex::Regex::new(&p.pattern).is_ok_and(|re| re.is_match(queue)))
        .filter_map(|p| p.definition.get("delivery-limit")?.as_i64())
        .filter_map(|l| u64::try_from(l).ok())
        .min()
}

/// How a quorum queue is backed up on this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Read with consumers and given back with uncounted nacks (4.3+).
    Nack,
    /// Read as `requeue_strategy` says: every return counts, and no limit drops a message.
    Counted,
    /// Read while every message has headroom below `limit` (the opt-in).
    Headroom { limit: u64 },
    /// Left alone: the reason, for the summary and the log.
    Skip(String),
    /// Not known yet: the management API lists the queue without its policies (declared
    /// less than a statistics interval ago); ask again.
    Unknown,
}

/// Where the version is unknown, every return is taken to count.
fn version_text(version: Option<BrokerVersion>) -> String {
    version.map_or_else(
        || "a RabbitMQ of unknown version".to_string(),
        |v| format!("RabbitMQ {v}"),
    )
}

/// The remedies that lose nothing, for a quorum queue every return of which counts
/// (issue 37, item 2): printed with every such queue left alone.
pub fn remedies(version: Option<BrokerVersion>) -> String {
    let default = default_limit(version).map_or(String::new(), |d| {
        format!(", and once the policy is removed every message above the default limit of {d} is dropped at its next return")
    });
    format!(
        "Remedies that lose nothing: RabbitMQ 4.3 or later (its basic.nack does not count); or a policy with a higher \"delivery-limit\" (each nightly read costs each message one count per night it stays). A policy with \"delivery-limit\": -1 lets backups read the queue, but on {} every read still raises each message's x-delivery-count{default}",
        version_text(version)
    )
}

/// What a backup does with quorum queue `q` on a broker of `version` (see the module
/// documentation); `opts.read_queues_with_delivery_limit` is the opt-in. An unknown version
/// is the careful case: every return counts, the default limit is 20.
pub fn decide(q: &QueueInfo, version: Option<BrokerVersion>, opts: &BackupOptions) -> Decision {
    if !q.policy_known {
        return Decision::Unknown;
    }
    if version.is_some_and(BrokerVersion::uncounted_nack) {
        if let Some((kind @ (DelayedRetry::Returned | DelayedRetry::All), min_ms)) =
            delayed_retry(q)
        {
            return Decision::Skip(format!(
                "it is a quorum queue with delayed retries of {} messages (delayed-retry-type {}{}): RabbitMQ 4.3 holds back every message given back with basic.nack (the only give-back that does not count as a failed delivery) from all consumers for delayed-retry-min, so a backup would hide the whole queue from its consumers for that long. Remedies: delayed-retry-type failed (only failed deliveries are delayed) or disabled on this queue while the backup runs",
                if kind == DelayedRetry::All { "all returned" } else { "returned (nacked)" },
                kind.as_str(),
                min_ms.map_or(String::new(), |m| format!(", min {m} ms"))
            ));
        }
        return Decision::Nack;
    }
    let Some(limit) = effective_delivery_limit(q, version) else {
        return Decision::Counted;
    };
    if opts.read_queues_with_delivery_limit {
        return Decision::Headroom { limit };
    }
    Decision::Skip(format!(
        "it is a quorum queue with a delivery limit of {limit}, and on {} every message a backup gives back counts as a failed delivery (x-delivery-count + 1): {limit} backups would drop or dead-letter every message. {}; or backup.read_queues_with_delivery_limit: true (reads while every message stays at least one return below the limit, then leaves the queue alone)",
        version_text(version),
        remedies(version)
    ))
}

/// A quorum queue's delayed-retry type (RabbitMQ 4.3, "Quorum Queues", delayed retry): which
/// returns the broker holds back from every consumer for a while (`delayed-retry-min` ms times
/// the message's delivery count, at most `delayed-retry-max`; measured on 4.3.6 by
/// `rabbit_fifo:should_delay0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedRetry {
    /// None.
    Disabled,
    /// Failed deliveries: `basic.reject`, a closed channel or connection, AMQP 1.0
    /// `modified{delivery-failed}`.
    Failed,
    /// Returns that are no failure: `basic.nack(requeue)`, AMQP 1.0 `released`.
    Returned,
    /// Both.
    All,
}

impl DelayedRetry {
    fn parse(s: &str) -> Option<DelayedRetry> {
        match s {
            "disabled" => Some(DelayedRetry::Disabled),
            "failed" => Some(DelayedRetry::Failed),
            "returned" => Some(DelayedRetry::Returned),
            "all" => Some(DelayedRetry::All),
            _ => None,
        }
    }

    /// The name RabbitMQ gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            DelayedRetry::Disabled => "disabled",
            DelayedRetry::Failed => "failed",
            DelayedRetry::Returned => "returned",
            DelayedRetry::All => "all",
        }
    }
}

/// The delayed-retry type of quorum queue `q` and its minimum delay (ms), from the management
/// API's description (`delayed_retry`: `all (min: 15000ms, max: 60000ms)`), else the
/// effective policy's `delayed-retry-type`/`-min` (a policy wins over an argument), else the
/// `x-delayed-retry-type`/`-min` arguments. `None`: none set (RabbitMQ before 4.3 has none).
pub fn delayed_retry(q: &QueueInfo) -> Option<(DelayedRetry, Option<u64>)> {
    if let Some(d) = &q.delayed_retry {
        let kind = DelayedRetry::parse(d.split_whitespace().next().unwrap_or(""))?;
        let min = d
            .split_once("min: ")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok());
        return Some((kind, min));
    }
    let policy = &q.effective_policy_definition;
    let kind = policy
        .get("delayed-retry-type")
        .or_else(|| q.arguments.get("x-delayed-retry-type"))
        .and_then(|v| v.as_str())
        .and_then(DelayedRetry::parse)?;
    let min = [
        policy.get("delayed-retry-min"),
        q.arguments.get("x-delayed-retry-min"),
    ]
    .iter()
    .flatten()
    .filter_map(|v| v.as_u64())
    .min();
    Some((kind, min))
}

/// Whether one more counted read of a quorum queue whose delivery limit is `limit` leaves
/// every message below the limit, from `prior`, the highest `x-delivery-count` a message of
/// the queue may have from earlier reads (`None`: no record). A read may leave a message at
/// most at `limit - 1` (one more return of any consumer then leaves it at the limit, not
/// past it), so it may take a message at most at `limit - 2`: `Ok` when
/// `prior + 2 <= limit`, else `Err` with the count the read would reach.
pub fn one_more_read(prior: Option<u64>, limit: u64) -> std::result::Result<(), u64> {
    let at = prior.unwrap_or(0);
    if at.saturating_add(2) <= limit {
        Ok(())
    } else {
        Err(at.saturating_add(1))
    }
}

impl Decision {
    /// The reader's plan for this decision with `strategy`.
    pub fn plan(&self, strategy: RequeueStrategy) -> ReadPlan {
        let mut plan = ReadPlan::of(strategy);
        match self {
            Decision::Nack => plan.quorum_nack = true,
            Decision::Headroom { limit } => plan.delivery_limit = Some(*limit),
            Decision::Counted | Decision::Skip(_) | Decision::Unknown => {}
        }
        plan
    }

    /// Logs, once per process for each kind, how quorum queues are given back on this broker.
    pub fn log_once(&self, version: Option<BrokerVersion>, strategy: RequeueStrategy) {
        static NACK: AtomicBool = AtomicBool::new(false);
        static COUNTED: AtomicBool = AtomicBool::new(false);
        let (flag, text) = match self {
            Decision::Nack => (
                &NACK,
                format!(
                    "{}: quorum queues are read with consumers and given back with basic.nack(requeue), which leaves x-delivery-count alone (requeue_strategy {} is not used for them: a reject or a closed channel would count)",
                    version_text(version),
                    strategy_name(strategy)
                ),
            ),
            Decision::Counted | Decision::Headroom { .. } => (
                &COUNTED,
                format!(
                    "{}: every quorum message a backup gives back counts as a failed delivery (x-delivery-count + 1); quorum queues with a finite delivery limit are {}",
                    version_text(version),
                    if matches!(self, Decision::Headroom { .. }) {
                        "read while every message has headroom (backup.read_queues_with_delivery_limit)"
                    } else {
                        "left alone"
                    }
                ),
            ),
            Decision::Skip(_) | Decision::Unknown => return,
        };
        if !flag.swap(true, Ordering::SeqCst) {
            log::info!("{text}");
        }
    }
}

fn strategy_name(s: RequeueStrategy) -> &'static str {
    match s {
        RequeueStrategy::Cancel => "cancel",
        RequeueStrategy::Nack => "nack",
        RequeueStrategy::Reject => "reject",
        RequeueStrategy::Get => "get",
    }
}

/// Removes the headers the broker added to a quorum queue's delivery `d`, as
/// [`strip_broker_headers`] does; properties kept as bytes (`Delivery::wire`) that hold one
/// are decoded first, others stay bytes.
///
/// Errors: `Error::Amqp` when such bytes do not decode (never for bytes a channel kept).
pub fn strip_delivery(d: &mut Delivery) -> Result<()> {
    if let Some(wire) = &d.wire {
        if BROKER_HEADERS.iter().all(|k| wire.header(k).is_none()) {
            return Ok(());
        }
        d.properties = wire.decode()?;
        d.wire = None;
    }
    strip_broker_headers(&mut d.properties);
    Ok(())
}

/// Removes the headers the broker added to a quorum queue's delivery ([`BROKER_HEADERS`]);
/// a table left empty by that goes too (the publisher sent none: a first delivery carries
/// none of them).
pub fn strip_broker_headers(props: &mut BasicProperties) {
    if let Some(h) = props.headers.as_mut() {
        let before = h.len();
        h.retain(|(k, _)| !BROKER_HEADERS.contains(&k.as_str()));
        if h.is_empty() && before > 0 {
            props.headers = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::amqp::FieldValue;
    use serde_json::json;

    fn quorum(args: serde_json::Value, policy: serde_json::Value, api: Option<i64>) -> QueueInfo {
        QueueInfo {
            queue_type: Some(QueueType::Quorum),
            type_name: "quorum".into(),
            arguments: args.as_object().cloned().unwrap_or_default(),
            effective_policy_definition: policy.as_object().cloned().unwrap_or_default(),
            delivery_limit: api,
            policy_known: true,
            ..QueueInfo::default()
        }
    }

    fn v(s: &str) -> Option<BrokerVersion> {
        BrokerVersion::parse(s)
    }

    #[test]
    fn the_effective_limit_comes_from_the_api_then_the_queue_then_the_version() {
        let none = json!({});
        // 4.x reports what is in effect, whatever set it.
        assert_eq!(
            effective_delivery_limit(&quorum(none.clone(), none.clone(), Some(20)), v("4.0.5")),
            Some(20)
        );
        assert_eq!(
            effective_delivery_limit(
                &quorum(
                    json!({"x-delivery-limit": 7}),
                    json!({"delivery-limit": 5}),
                    Some(5)
                ),
                v("4.0.5")
            ),
            Some(5)
        );
        assert_eq!(
            effective_delivery_limit(&quorum(none.clone(), none.clone(), Some(-1)), v("4.3.6")),
            None
        );
        // 3.x: the argument or the policy, the lower one.
        assert_eq!(
            effective_delivery_limit(&quorum(none.clone(), none.clone(), None), v("3.10.8")),
            None
        );
        assert_eq!(
            effective_delivery_limit(
                &quorum(json!({"x-delivery-limit": 7}), none.clone(), None),
                v("3.10.8")
            ),
            Some(7)
        );
        assert_eq!(
            effective_delivery_limit(
                &quorum(
                    json!({"x-delivery-limit": 7}),
                    json!({"delivery-limit": 3}),
                    None
                ),
                v("3.10.8")
            ),
            Some(3)
        );
        assert_eq!(
            effective_delivery_limit(
                &quorum(json!({"x-delivery-limit": 0}), none.clone(), None),
                v("3.10.8")
            ),
            Some(0)
        );
        // 4.x without the API's field: the version's default, unless -1.
        assert_eq!(
            effective_delivery_limit(&quorum(none.clone(), none.clone(), None), v("4.1.0")),
            Some(20)
        );
        assert_eq!(
            effective_delivery_limit(
                &quorum(json!({"x-delivery-limit": -1}), none.clone(), None),
                v("4.1.0")
            ),
            None
        );
        // Unknown version, nothing set: the careful case, 4.x's default.
        assert_eq!(
            effective_delivery_limit(&quorum(none.clone(), none.clone(), None), None),
            Some(20)
        );
        // Not a quorum queue: no limit.
        let mut classic = quorum(json!({"x-delivery-limit": 3}), none, None);
        classic.queue_type = Some(QueueType::Classic);
        assert_eq!(effective_delivery_limit(&classic, v("3.10.8")), None);
    }

    #[test]
    fn the_decision_follows_version_limit_and_opt_in() {
        let opts = BackupOptions::default();
        let opt_in = BackupOptions {
            read_queues_with_delivery_limit: true,
            ..BackupOptions::default()
        };
        let default_4x = quorum(json!({}), json!({}), Some(20));
        assert_eq!(decide(&default_4x, v("4.3.6"), &opts), Decision::Nack);
        assert_eq!(decide(&default_4x, v("5.0.0"), &opts), Decision::Nack);
        let Decision::Skip(why) = decide(&default_4x, v("4.0.5"), &opts) else {
            panic!("4.0 with a limit is skipped");
        };
        assert!(
            why.contains("delivery limit of 20") && why.contains("RabbitMQ 4.0.5"),
            "{why}"
        );
        assert_eq!(
            decide(&default_4x, v("4.2.1"), &opt_in),
            Decision::Headroom { limit: 20 }
        );
        let unlimited = quorum(json!({}), json!({}), Some(-1));
        assert_eq!(decide(&unlimited, v("4.0.5"), &opts), Decision::Counted);
        let plain_3x = quorum(json!({}), json!({}), None);
        assert_eq!(decide(&plain_3x, v("3.10.8"), &opts), Decision::Counted);
        let limited_3x = quorum(json!({}), json!({"delivery-limit": 4}), None);
        assert!(matches!(
            decide(&limited_3x, v("3.10.8"), &opts),
            Decision::Skip(_)
        ));
        assert!(matches!(
            decide(&limited_3x, None, &opts),
            Decision::Skip(_)
        ));
        // Listed before its first statistics: its policy is not known yet, except where the
        // give-back does not count.
        let fresh = QueueInfo {
            policy_known: false,
            ..quorum(json!({}), json!({}), None)
        };
        assert_eq!(decide(&fresh, v("3.10.8"), &opts), Decision::Unknown);
        assert_eq!(decide(&fresh, v("4.0.5"), &opt_in), Decision::Unknown);
        assert_eq!(decide(&fresh, v("4.3.6"), &opts), Decision::Unknown);
        assert_eq!(
            Decision::Nack.plan(RequeueStrategy::Reject),
            ReadPlan {
                strategy: RequeueStrategy::Reject,
                quorum_nack: true,
                delivery_limit: None
            }
        );
        assert_eq!(
            Decision::Headroom { limit: 5 }
                .plan(RequeueStrategy::Cancel)
                .delivery_limit,
            Some(5)
        );
    }

    #[test]
    fn delayed_retries_of_returned_messages_leave_a_4_3_queue_alone() {
        let opts = BackupOptions::default();
        let mut q = quorum(json!({}), json!({}), Some(20));
        assert_eq!(decide(&q, v("4.3.6"), &opts), Decision::Nack);
        for (api, policy, args, expected) in [
            (
                Some("all (min: 15000ms, max: 60000ms)"),
                json!({}),
                json!({}),
                Some((DelayedRetry::All, Some(15000))),
            ),
            (
                Some("failed (min: 20ms, max: 20ms)"),
                json!({}),
                json!({}),
                Some((DelayedRetry::Failed, Some(20))),
            ),
            (
                None,
                json!({"delayed-retry-type": "returned", "delayed-retry-min": 500}),
                json!({"x-delayed-retry-type": "failed", "x-delayed-retry-min": 100}),
                Some((DelayedRetry::Returned, Some(100))),
            ),
            (
                None,
                json!({}),
                json!({"x-delayed-retry-type": "disabled"}),
                Some((DelayedRetry::Disabled, None)),
            ),
            (None, json!({}), json!({}), None),
        ] {
            q.delayed_retry = api.map(str::to_string);
            q.effective_policy_definition = policy.as_object().cloned().unwrap();
            q.arguments = args.as_object().cloned().unwrap();
            assert_eq!(delayed_retry(&q), expected, "{api:?}");
            let d = decide(&q, v("4.3.6"), &opts);
            match expected {
                Some((DelayedRetry::All | DelayedRetry::Returned, _)) => {
                    let Decision::Skip(why) = d else {
                        panic!("{d:?}")
                    };
                    assert!(
                        why.contains("delayed-retry-type") && why.contains("Remedies"),
                        "{why}"
                    );
                }
                _ => assert_eq!(d, Decision::Nack),
            }
        }
    }

    #[test]
    fn an_unknown_version_is_the_careful_case() {
        let opts = BackupOptions::default();
        let plain = quorum(json!({}), json!({}), None);
        let Decision::Skip(why) = decide(&plain, None, &opts) else {
            panic!("every return counts, default limit 20");
        };
        assert!(
            why.contains("delivery limit of 20") && why.contains("unknown version"),
            "{why}"
        );
    }

    #[test]
    fn a_policy_limit_is_the_lowest_a_matching_policy_sets() {
        use crate::broker::management::PolicyInfo;
        let p = |pattern: &str, limit: serde_json::Value| PolicyInfo {
            pattern: pattern.into(),
            definition: [("delivery-limit".to_string(), limit)]
                .into_iter()
                .collect(),
            ..PolicyInfo::default()
        };
        let none: Vec<PolicyInfo> = Vec::new();
        assert_eq!(policy_limit("q", &none), None);
        assert_eq!(policy_limit("orders", &[p("^orders$", 3.into())]), Some(3));
        assert_eq!(policy_limit("orders-2", &[p("^orders$", 3.into())]), None);
        // A negative limit is none; the lowest of the others wins; a bad pattern matches nothing.
        let set = [
            p("^b", (-1).into()),
            p("b-q", 7.into()),
            p(".*", 4.into()),
            p("(", 1.into()),
            PolicyInfo {
                pattern: ".*".into(),
                ..PolicyInfo::default()
            },
        ];
        assert_eq!(policy_limit("b-quorum", &set), Some(4));
        assert_eq!(policy_limit("b-quorum", &set[..1]), None);
        assert_eq!(policy_limit("b-quorum", &[p(".*", "5".into())]), None);
    }

    #[test]
    fn one_more_read_leaves_every_message_below_the_limit() {
        // A read may take a message at most at limit - 2 (it goes back at limit - 1).
        assert_eq!(one_more_read(None, 5), Ok(()));
        assert_eq!(one_more_read(Some(3), 5), Ok(()));
        assert_eq!(one_more_read(Some(4), 5), Err(5));
        assert_eq!(one_more_read(Some(9), 5), Err(10));
        assert_eq!(one_more_read(None, 2), Ok(()));
        assert_eq!(one_more_read(Some(1), 2), Err(2));
        // Limits that leave no room at all.
        assert_eq!(one_more_read(None, 1), Err(1));
        assert_eq!(one_more_read(None, 0), Err(1));
        assert_eq!(one_more_read(Some(u64::MAX - 1), 20), Err(u64::MAX));
        // Nights: a fresh queue under a limit of 5 is read 4 times (counts 1, 2, 3, 4).
        let mut prior = None;
        let mut nights = 0;
        while one_more_read(prior, 5).is_ok() {
            prior = Some(prior.unwrap_or(0) + 1);
            nights += 1;
        }
        assert_eq!((nights, prior), (4, Some(4)));
    }

    #[test]
    fn the_remedies_never_suggest_an_unqualified_unlimited_policy() {
        let r = remedies(v("4.0.5"));
        assert!(r.contains("RabbitMQ 4.3 or later"), "{r}");
        assert!(
            r.contains("\"delivery-limit\": -1") && r.contains("still raises"),
            "the -1 policy comes with its cost: {r}"
        );
        assert!(r.contains("default limit of 20"), "{r}");
        assert!(!remedies(v("3.10.8")).contains("default limit"));
    }

    #[test]
    fn broker_headers_are_not_the_publishers() {
        let mut p = BasicProperties {
            headers: Some(vec![
                ("app".into(), FieldValue::I32(1)),
                ("x-acquired-count".into(), FieldValue::I64(3)),
                ("x-death".into(), FieldValue::Array(vec![])),
                ("x-delivery-count".into(), FieldValue::I64(2)),
            ]),
            ..Default::default()
        };
        strip_broker_headers(&mut p);
        let keys: Vec<_> = p
            .headers
            .as_ref()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["app", "x-death"]);
        let mut only = BasicProperties {
            headers: Some(vec![("x-delivery-count".into(), FieldValue::I64(1))]),
            ..Default::default()
        };
        strip_broker_headers(&mut only);
        assert_eq!(only.headers, None);
        let mut empty = BasicProperties {
            headers: Some(vec![]),
            ..Default::default()
        };
        strip_broker_headers(&mut empty);
        assert_eq!(
            empty.headers,
            Some(vec![]),
            "an empty table the publisher sent stays"
        );
    }
}
