//! A stream message as a [`BackupRecord`]: mapped the way the broker that holds the stream
//! maps it for an AMQP 0-9-1 reader when that loses nothing, else stored whole as its encoded
//! bytes. Which mapping is the broker's [`Conversion`], told by its version.
//!
//! RabbitMQ before 3.13 ([`Conversion::MsgRecord`]) stores a message published over 0-9-1
//! into a stream as AMQP 1.0 sections (`rabbit_msg_record:from_amqp091`), and gives it back to
//! a 0-9-1 reader with `to_amqp091`. A message a record maps is one `from_amqp091` could have
//! written, so that a restore, which publishes over 0-9-1, stores the same sections again:
//! - message annotations `x-basic-priority` and `x-basic-delivery-mode` (ubyte),
//!   `x-basic-expiration` (string), and `x-exchange` / `x-routing-key` (the stream queue's
//!   own, which the target writes again on restore; SPEC.md "Segment file": a stream record's
//!   exchange and routing key are empty);
//! - properties message-id, reply-to, correlation-id (strings), user-id (binary),
//!   content-type and content-encoding (symbols), creation-time (whole seconds), each fitting
//!   a 0-9-1 short string;
//! - application properties with string keys of at most 255 bytes: `x-basic-type`,
//!   `x-basic-app-id` (strings) and headers of the types `from_091` writes (string, long, int,
//!   short, byte and their unsigned forms but ulong, double, float, boolean, binary, timestamp
//!   in whole seconds, null);
//! - exactly one `data` section, the body.
//!
//! RabbitMQ 3.13 and later (message containers, [`Conversion::Container`]) write a header
//! section and map differently: `super::container` says how.
//!
//! Anything else (an `amqp-value` or `amqp-sequence` body, several or no `data` sections,
//! delivery annotations, a footer, `to` or `subject`, a ulong message-id, a symbol or list
//! header, bytes that do not decode ...) would be changed or lost by that mapping: such a
//! message is stored as a record whose body is the message's encoded bytes, whole, with the
//! single header [`RAW_BODY_HEADER`] = [`RAW_BODY_VALUE`] and no properties. A restore into a
//! stream publishes those bytes back over the stream protocol, unchanged.

use super::field::{describe, short_string, symbol, whole_seconds, Mapped};
use super::{decode_message, type_name, Message, Value};
use crate::repository::record::{BackupHeaderValue, BackupProperties, BackupRecord};

/// The header of a record whose body is a whole encoded AMQP 1.0 message.
pub const RAW_BODY_HEADER: &str = "x-rmq-backup-body";
/// Its value (a long string).
pub const RAW_BODY_VALUE: &str = "amqp-1.0-message";

/// How the broker converts a stream's AMQP 1.0 messages for an AMQP 0-9-1 reader, and an
/// AMQP 0-9-1 publish into them: the record mapping follows it (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// RabbitMQ before 3.13: `rabbit_msg_record` (no header section, `x-basic-*`
    /// annotations).
    MsgRecord,
    /// RabbitMQ 3.13 to 4.1: message containers (`mc_amqpl`): a header section, `x-` headers
    /// as message annotations, `app_id` as group-id.
    Container,
    /// RabbitMQ 4.2 and later: as [`Conversion::Container`], and a reply-to stored as the
    /// address `/queues/<name>` (percent-encoded); a message without a header section is
    /// transient (before 4.2: durable).
    ContainerQueueAddresses,
}

impl Conversion {
    /// The conversion of a broker of `version` (the stream protocol's peer property, e.g.
    /// `4.3.6`; `3.10.8`). A version that does not parse is taken for a current broker.
    pub fn of_version(version: &str) -> Conversion {
        let mut parts = version
            .split(['.', '-', '+'])
            .map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) if (major, minor) < (3, 13) => Conversion::MsgRecord,
            (Some(major), Some(minor)) if (major, minor) < (4, 2) => Conversion::Container,
            _ => Conversion::ContainerQueueAddresses,
        }
    }
}

/// Where a stream message was read: the record's source and offset.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// How the broker that holds the stream converts its messages.
    pub conversion: Conversion,
    pub stream: &'a str,
    pub vhost: &'a str,
    /// The message's offset in the stream: the record's `delivery_tag` (SPEC.md "Segment
    /// file").
    pub offset: u64,
    /// backed_up_at, epoch ms.
    pub backed_up_at: i64,
}

/// The record of the stream message `bytes` read at `at`, and, when it is stored as its
/// encoded bytes, why the mapping could not carry it (see the module documentation). Never
/// fails: any bytes can be stored.
pub fn to_record(bytes: &[u8], at: Origin) -> (BackupRecord, Option<String>) {
    let mapped = decode_message(bytes)
        .map_err(|e| e.message().to_string())
        .and_then(|m| match (m.not_carried.clone(), at.conversion) {
            (Some(why), _) => Err(why),
            (None, Conversion::MsgRecord) => map(m, at),
            (None, c) => {
                let (properties, headers) =
                    super::container::map(&m, c == Conversion::ContainerQueueAddresses)?;
                Ok(record(m.body, properties, headers, at))
            }
        });
    match mapped {
        Ok(record) => (record, None),
        Err(why) => (raw(bytes, at), Some(why)),
    }
}

/// The record holding `bytes` whole.
fn raw(bytes: &[u8], at: Origin) -> BackupRecord {
    BackupRecord {
        body: bytes.to_vec(),
        properties: BackupProperties::default(),
        headers: vec![(
            RAW_BODY_HEADER.to_string(),
            BackupHeaderValue::LongString(RAW_BODY_VALUE.to_string()),
        )],
        exchange: String::new(),
        routing_key: String::new(),
        delivery_tag: at.offset,
        redelivered: false,
        backed_up_at: at.backed_up_at,
        source_queue: at.stream.to_string(),
        source_vhost: at.vhost.to_string(),
        message_format: None,
        wire: None,
    }
}

fn ubyte(v: &Value, what: &str) -> Mapped<u8> {
    match v {
        Value::Ubyte(n) => Ok(*n),
        other => Err(format!("{what} is a {}, not a ubyte", type_name(other))),
    }
}

/// An application property as the 0-9-1 header `to_091` makes of it, when `from_091` makes
/// the same property of that header again.
fn header_value(v: &Value) -> Mapped<BackupHeaderValue> {
    Ok(match v {
        Value::String(s) => BackupHeaderValue::LongString(s.clone()),
        Value::InvalidString(b) => BackupHeaderValue::LongStringBytes(b.clone()),
        Value::Long(n) => BackupHeaderValue::LongLongInt(*n),
        Value::Int(n) => BackupHeaderValue::LongInt(*n),
        Value::Uint(n) => BackupHeaderValue::LongUInt(*n),
        Value::Short(n) => BackupHeaderValue::ShortInt(*n),
        Value::Ushort(n) => BackupHeaderValue::ShortUInt(*n),
        Value::Byte(n) => BackupHeaderValue::ShortShortInt(*n),
        Value::Ubyte(n) => BackupHeaderValue::ShortShortUInt(*n),
        Value::Double(f) => BackupHeaderValue::Double(*f),
        Value::Float(f) => BackupHeaderValue::Float(*f),
        Value::Bool(b) => BackupHeaderValue::Bool(*b),
        Value::Timestamp(ms) => {
            BackupHeaderValue::Timestamp(whole_seconds(*ms, "a timestamp header")? as u64)
        }
        Value::Binary(b) => BackupHeaderValue::Bytes(b.clone()),
        Value::Null => BackupHeaderValue::Void,
        other => {
            return Err(format!(
                "an application property of type {} has no 0-9-1 header that gives it back",
                type_name(other)
            ))
        }
    })
}

/// A mapped record.
fn record(
    body: Vec<u8>,
    properties: BackupProperties,
    headers: Vec<(String, BackupHeaderValue)>,
    at: Origin,
) -> BackupRecord {
    BackupRecord {
        body,
        properties,
        headers,
        exchange: String::new(),
        routing_key: String::new(),
        delivery_tag: at.offset,
        redelivered: false,
        backed_up_at: at.backed_up_at,
        source_queue: at.stream.to_string(),
        source_vhost: at.vhost.to_string(),
        message_format: None,
        wire: None,
    }
}

/// The mapping of RabbitMQ before 3.13 (module documentation); `Err(why)` when it would
/// change or lose something.
fn map(m: Message, at: Origin) -> Mapped<BackupRecord> {
    if m.header.is_some() {
        return Err("a header section".to_string());
    }
    let mut properties = BackupProperties::default();
    if m.properties.len() > 13 {
        return Err(format!(
            "a properties list of {} fields",
            m.properties.len()
        ));
    }
    for (i, v) in m.properties.iter().enumerate() {
        if *v == Value::Null {
            continue;
        }
        match i {
            0 => properties.message_id = Some(short_string(v, "message-id")?),
            1 => match v {
                Value::Binary(b) if b.len() <= 255 => {
                    properties.user_id = Some(
                        String::from_utf8(b.clone())
                            .map_err(|_| "user-id is not valid UTF-8".to_string())?,
                    )
                }
                other => return Err(format!("user-id is a {}", describe(other))),
            },
            4 => properties.reply_to = Some(short_string(v, "reply-to")?),
            5 => properties.correlation_id = Some(short_string(v, "correlation-id")?),
            6 => properties.content_type = Some(symbol(v, "content-type")?),
            7 => properties.content_encoding = Some(symbol(v, "content-encoding")?),
            9 => match v {
                Value::Timestamp(ms) => {
                    properties.timestamp = Some(whole_seconds(*ms, "creation-time")?)
                }
                other => return Err(format!("creation-time is a {}", type_name(other))),
            },
            _ => {
                const NAMES: [&str; 13] = [
                    "message-id",
                    "user-id",
                    "to",
                    "subject",
                    "reply-to",
                    "correlation-id",
                    "content-type",
                    "content-encoding",
                    "absolute-expiry-time",
                    "creation-time",
                    "group-id",
                    "group-sequence",
                    "reply-to-group-id",
                ];
                return Err(format!("the {} property is set", NAMES[i]));
            }
        }
    }
    let mut annotations: Vec<&str> = Vec::new();
    for (k, v) in &m.message_annotations {
        let key = match k {
            Value::Symbol(s) => s.as_str(),
            other => {
                return Err(format!(
                    "a message annotation key is a {}",
                    type_name(other)
                ))
            }
        };
        if annotations.contains(&key) {
            return Err(format!("message annotation {key} appears twice"));
        }
        annotations.push(key);
        match key {
            "x-basic-priority" => properties.priority = Some(ubyte(v, key)?),
            "x-basic-delivery-mode" => properties.delivery_mode = Some(ubyte(v, key)?),
            "x-basic-expiration" => properties.expiration = Some(short_string(v, key)?),
            // The stream queue's own: the target writes them again on restore.
            "x-exchange" | "x-routing-key" => {}
            other => return Err(format!("message annotation {other}")),
        }
    }
    let mut headers: Vec<(String, BackupHeaderValue)> =
        Vec::with_capacity(m.application_properties.len());
    for (k, v) in &m.application_properties {
        let key = match k {
            Value::String(s) if s.len() <= 255 => s.clone(),
            other => {
                return Err(format!(
                    "an application property key is a {}",
                    describe(other)
                ))
            }
        };
        if headers.iter().any(|(h, _)| *h == key) {
            return Err(format!("application property {key} appears twice"));
        }
        match key.as_str() {
            "x-basic-type" if properties.type_field.is_none() => {
                properties.type_field = Some(short_string(v, &key)?)
            }
            "x-basic-app-id" if properties.app_id.is_none() => {
                properties.app_id = Some(short_string(v, &key)?)
            }
            _ => {
                let value = header_value(v).map_err(|e| format!("header {key}: {e}"))?;
                headers.push((key, value));
            }
        }
    }
    Ok(record(m.body, properties, headers, at))
}
