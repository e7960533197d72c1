//! Records that hold AMQP 1.0 messages (`message_format: amqp-1.0`, issue 39: a queue backed
//! up over AMQP 1.0) go back over AMQP 1.0, as their publishers sent them, through
//! `crate::broker::publisher::amqp10`: an AMQP 0-9-1 publish would make the broker convert
//! them (its message containers), which loses `to`, `subject`, the types of ids and
//! application properties, the milliseconds of `creation-time` and more (issue 39's
//! measurements). Only RabbitMQ 4.0 and later take AMQP 1.0 on their AMQP port with the v2
//! addresses; a queue whose records need it on an older target fails at its first such
//! record, before that record is published.

use crate::broker::amqp::{FieldTable, FieldValue};
use crate::broker::amqp10::ConnectOptions;
use crate::broker::publisher::amqp10::Amqp10Publisher;
use crate::broker::BrokerVersion;
use crate::error::{Error, Result};
use crate::repository::record::{BackupRecord, MessageFormat};

/// True when `record` holds an AMQP 1.0 message (its body, published as one transfer).
pub(super) fn is_amqp10(record: &BackupRecord) -> bool {
    record.message_format == Some(MessageFormat::Amqp10)
}

/// The broker's version from the `version` of its AMQP 0-9-1 `server-properties`.
pub(super) fn version_of(server_properties: &FieldTable) -> Option<BrokerVersion> {
    server_properties
        .iter()
        .find(|(k, _)| k == "version")
        .and_then(|(_, v)| match v {
            FieldValue::LongString(b) => std::str::from_utf8(b).ok(),
            _ => None,
        })
        .and_then(BrokerVersion::parse)
}

/// How one queue's restore reaches its target over AMQP 1.0: the same host, port, TLS,
/// credentials and (mapped) vhost as its AMQP 0-9-1 connection.
pub(super) struct Amqp10Target {
    pub(super) options: ConnectOptions,
    /// The target's version (its AMQP 0-9-1 server properties), when it said one.
    pub(super) version: Option<BrokerVersion>,
}

impl Amqp10Target {
    /// Opens the publisher of queue `queue` in vhost `vhost`, of which `published` records
    /// were published before.
    ///
    /// Errors: `AMQP error: queue Q in vhost V: its records are AMQP 1.0 messages ... RabbitMQ
    /// 3.13.7 ...` on a target older than 4.0 (or one that did not say its version); the
    /// connection's errors.
    pub(super) fn open(&self, queue: &str, vhost: &str, published: u64) -> Result<Amqp10Publisher> {
        refuse_older(self.version, queue, vhost, published)?;
        Amqp10Publisher::open(&self.options)
    }
}

/// Refuses a target older than RabbitMQ 4.0 (module documentation).
fn refuse_older(
    version: Option<BrokerVersion>,
    queue: &str,
    vhost: &str,
    published: u64,
) -> Result<()> {
    let found = match version {
        Some(v) if v.major >= 4 => return Ok(()),
        Some(v) => format!("RabbitMQ {v}"),
        None => "a broker that did not say its version".to_string(),
    };
    let before = match published {
        0 => "nothing of this queue was published".to_string(),
        n => format!("the {n} records before the first of them were published, nothing after"),
    };
    Err(Error::Amqp(format!(
        "queue {queue} in vhost {vhost}: its records are AMQP 1.0 messages (backed up over AMQP 1.0), which only RabbitMQ 4.0 and later take back as they were sent; the target is {found}: {before} (restore into RabbitMQ 4.0 or later)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_older_than_4_0_is_refused_naming_queue_and_version() {
        let v = BrokerVersion::parse;
        assert!(refuse_older(v("4.0.5"), "q", "/", 0).is_ok());
        assert!(refuse_older(v("4.3.6"), "q", "/", 0).is_ok());
        let e = refuse_older(v("3.13.7"), "orders", "shop", 0).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("AMQP error: queue orders in vhost shop:"),
            "{text}"
        );
        assert!(text.contains("RabbitMQ 3.13.7"), "{text}");
        assert!(
            text.contains("nothing of this queue was published"),
            "{text}"
        );
        let e = refuse_older(None, "q", "/", 3).unwrap_err().to_string();
        assert!(
            e.contains("did not say its version") && e.contains("the 3 records"),
            "{e}"
        );
    }

    #[test]
    fn the_version_comes_from_the_server_properties() {
        let props: FieldTable = vec![
            (
                "product".into(),
                FieldValue::LongString(b"RabbitMQ".to_vec()),
            ),
            ("version".into(), FieldValue::LongString(b"4.0.5".to_vec())),
        ];
        assert_eq!(version_of(&props), BrokerVersion::parse("4.0.5"));
        assert_eq!(version_of(&Vec::new()), None);
    }
}
