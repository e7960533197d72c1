//! Broker-level names shared by the jobs: the queue type, a queue's identity, and the
//! broker's version with the behaviours that depend on it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Type of a queue, lowercase in YAML and JSON (`classic`, `quorum`, `stream`), as in the
/// manifest's `queue_type` and `source.queues.types`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Classic,
    Quorum,
    Stream,
}

impl QueueType {
    /// The lowercase name (`classic`, `quorum`, `stream`).
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }

    /// Parses the management API's `type` field; unknown types (plugins) give `None`.
    pub fn from_api(s: &str) -> Option<QueueType> {
        match s {
            "classic" => Some(QueueType::Classic),
            "quorum" => Some(QueueType::Quorum),
            "stream" => Some(QueueType::Stream),
            _ => None,
        }
    }
}

impl fmt::Display for QueueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A RabbitMQ version (`4.3.6`, `3.10.8`, `4.1.0-rc.1`): what the broker calls itself in the
/// management API's `/api/overview` (`rabbitmq_version`) and in the AMQP `server-properties`
/// (`version`). Behaviours that matter to a backup differ by version (ENVIRONMENT.md, "RabbitMQ
/// 4.x"); the jobs decide from the version they find, never by assumption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl BrokerVersion {
    /// Parses `major.minor[.patch]` followed by anything (`-rc.1`, `+build`); `None` when
    /// the string does not start so.
    pub fn parse(s: &str) -> Option<BrokerVersion> {
        let mut parts = s.trim().split('.');
        let num = |p: Option<&str>| -> Option<u32> {
            let p = p?;
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        };
        let major = num(parts.next())?;
        let minor = num(parts.next())?;
        let patch = num(parts.next()).unwrap_or(0);
        Some(BrokerVersion {
            major,
            minor,
            patch,
        })
    }

    /// The delivery limit a quorum queue has when no argument or policy sets one: 20 since
    /// RabbitMQ 4.0 (its "Quorum Queues" guide, poison message handling; measured on 4.0.5 and
    /// 4.3.6), none before.
    pub fn default_quorum_delivery_limit(self) -> Option<u64> {
        (self.major >= 4).then_some(20)
    }

    /// True where `basic.nack(requeue=true)` gives a quorum queue's message back without
    /// counting it as a failed delivery (its `x-delivery-count` stays, only `x-acquired-count`
    /// grows): RabbitMQ 4.3 and later. Before, every return counts: nack, reject, a closed
    /// channel or connection (measured on 3.10.8, 4.0.5 and 4.3.6, ENVIRONMENT.md).
    pub fn uncounted_nack(self) -> bool {
        (self.major, self.minor) >= (4, 3)
    }

    /// True where the stream protocol has `StreamStats` (key 0x001c): RabbitMQ 3.11 and later
    /// (PROTOCOL.adoc; 3.10.8 does not know the command).
    pub fn has_stream_stats(self) -> bool {
        (self.major, self.minor) >= (3, 11)
    }
}

impl fmt::Display for BrokerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_stats_from_3_11() {
        let has = |s| BrokerVersion::parse(s).unwrap().has_stream_stats();
        assert!(!has("3.10.8") && !has("3.9.29"));
        assert!(has("3.11.0") && has("3.13.7") && has("4.0.5") && has("4.3.6"));
    }

    #[test]
    fn versions_parse_as_the_broker_writes_them() {
        let v = |s| BrokerVersion::parse(s);
        assert_eq!(
            v("4.3.6"),
            Some(BrokerVersion {
                major: 4,
                minor: 3,
                patch: 6
            })
        );
        assert_eq!(v("3.10.8").map(|v| v.to_string()), Some("3.10.8".into()));
        assert_eq!(v("4.1.0-rc.1").map(|v| v.to_string()), Some("4.1.0".into()));
        assert_eq!(v("4.2").map(|v| v.to_string()), Some("4.2.0".into()));
        assert_eq!(
            v(" 4.0.5+1.g123 ").map(|v| v.to_string()),
            Some("4.0.5".into())
        );
        for bad in ["", "4", "x.y", "four.three", ".3.6"] {
            assert_eq!(v(bad), None, "{bad:?}");
        }
        assert!(v("3.10.8") < v("4.0.5") && v("4.0.5") < v("4.3.6") && v("4.10.0") > v("4.9.9"));
    }

    #[test]
    fn the_give_back_follows_the_version() {
        let v = |s| BrokerVersion::parse(s).unwrap();
        assert_eq!(v("3.10.8").default_quorum_delivery_limit(), None);
        assert_eq!(v("4.0.5").default_quorum_delivery_limit(), Some(20));
        assert_eq!(v("4.3.6").default_quorum_delivery_limit(), Some(20));
        assert!(!v("3.13.7").uncounted_nack());
        assert!(!v("4.0.5").uncounted_nack());
        assert!(!v("4.2.9").uncounted_nack());
        assert!(v("4.3.0").uncounted_nack());
        assert!(v("5.0.0").uncounted_nack());
    }
}
