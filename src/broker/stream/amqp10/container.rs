//! The record of a stream message on RabbitMQ 3.13 and later, whose message containers
//! (`mc_amqpl`) convert between AMQP 0-9-1 and AMQP 1.0 (measured on 4.0.5 and 4.3.6; source
//! `deps/rabbit/src/mc_amqpl.erl`, `convert_to(mc_amqp, ...)` and `convert_from(mc_amqp, ...)`).
//!
//! A message published over 0-9-1 is stored as:
//! - a header section `[durable, priority, ttl, first-acquirer, delivery-count]`: durable is
//!   `delivery_mode == 2` (false for a message published without a delivery mode, as for
//!   mode 1), priority a ubyte, ttl the `expiration` as a uint of milliseconds; first-acquirer
//!   (true) and delivery-count (0) are the broker's delivery state, written on every store;
//! - message annotations: the stream's `x-exchange` and `x-routing-key`, `x-basic-type` (the
//!   0-9-1 `type`), every `x-` header (tables and arrays too, as maps with symbol keys and
//!   lists) and `CC` as `x-cc`;
//! - properties: message-id and correlation-id (a string, or a uuid for `urn:uuid:...`),
//!   user-id (binary), reply-to (4.2 and later: the address `/queues/<name, percent-encoded>`),
//!   content-type and content-encoding (symbols), creation-time (ms), group-id (the 0-9-1
//!   `app_id`);
//! - application properties: the other headers but tables and arrays (which the broker drops),
//!   a long string that is not UTF-8 without NUL (or is over 4,096 bytes) as binary;
//! - one `data` section.
//!
//! A message without a header section (a stream-protocol publisher's) is durable before 4.2
//! and transient since (`mc_amqp:get_property(durable, ...)`), as a 0-9-1 consumer is given it.
//!
//! The record holds what a 0-9-1 consumer of the stream is given back, except that durable
//! false is `delivery_mode` absent (what 0-9-1 publishers send for a transient message; a 4.x
//! consumer is given 1, the broker cannot tell the two apart) and that a binary application
//! property a 0-9-1 long string could not have become is kept as a byte array (`x`) rather than
//! given as the long string a consumer sees: published back over 0-9-1, the record is stored
//! as the same sections again. A message with anything else (a property or annotation this
//! conversion does not write, a value it would give back with another type, an `x-` key in the
//! application properties ...) is stored whole (`super::record`). The header's first-acquirer
//! and delivery-count are not content and are not kept.

use super::field::{describe, short_string, symbol, whole_seconds, Mapped};
use super::{type_name, Message, Value};
use crate::repository::record::{BackupHeaderValue, BackupProperties};

/// The broker's limit for a long string it stores as an AMQP 1.0 string
/// (`mc_util:is_utf8_no_null_limited`, `?UTF8_SCAN_LIMIT`).
const UTF8_SCAN_LIMIT: usize = 4096;

/// True when the broker stores the 0-9-1 long string `b` as an AMQP 1.0 string (else binary).
fn stored_as_string(b: &[u8]) -> bool {
    b.len() <= UTF8_SCAN_LIMIT && !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

/// The header fields as 0-9-1 properties: delivery mode, priority, expiration.
fn header(fields: &[Value], p: &mut BackupProperties) -> Mapped<()> {
    if fields.len() > 5 {
        return Err(format!("a header section of {} fields", fields.len()));
    }
    for (i, v) in fields.iter().enumerate() {
        match (i, v) {
            (_, Value::Null) => {}
            (0, Value::Bool(true)) => p.delivery_mode = Some(2),
            (0, Value::Bool(false)) => {}
            (1, Value::Ubyte(n)) => p.priority = Some(*n),
            (2, Value::Uint(ms)) => p.expiration = Some(ms.to_string()),
            // first-acquirer and delivery-count: the broker's delivery state.
            (3, Value::Bool(_)) | (4, Value::Uint(_)) => {}
            (i, other) => {
                const NAMES: [&str; 5] = [
                    "durable",
                    "priority",
                    "ttl",
                    "first-acquirer",
                    "delivery-count",
                ];
                return Err(format!("header {} is a {}", NAMES[i], type_name(other)));
            }
        }
    }
    Ok(())
}

/// A message-id or correlation-id as the 0-9-1 string a consumer is given, when the broker
/// makes the same value of that string again.
fn message_id(v: &Value, what: &str) -> Mapped<String> {
    match v {
        Value::Uuid(u) => {
            let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
            Ok(format!(
                "urn:uuid:{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        Value::String(s) if s.starts_with("urn:uuid:") => Err(format!(
            "{what} is a string the broker would store as a uuid"
        )),
        other => short_string(other, what),
    }
}

/// Percent-decoding of `s`, when every `%` starts two hex digits.
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// `uri_string:quote/1` of Erlang/OTP: every byte but the unreserved ones
/// (`A-Z a-z 0-9 - . _ ~`) as `%XX`, upper-case hex.
fn percent_encode(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The reply-to a consumer is given: with `queue_addresses` (4.2 and later) the name in an
/// address `/queues/<name>` the broker writes again the same; any other as it is.
fn reply_to(v: &Value, queue_addresses: bool) -> Mapped<String> {
    let s = short_string(v, "reply-to")?;
    match s.strip_prefix("/queues/") {
        Some(quoted) if queue_addresses => {
            let name = percent_decode(quoted)
                .filter(|n| percent_encode(n) == quoted)
                .and_then(|n| String::from_utf8(n).ok())
                .filter(|n| n.len() <= 255);
            name.ok_or_else(|| {
                format!("reply-to {s} is not the address the broker writes for a queue name")
            })
        }
        _ => Ok(s),
    }
}

/// The properties section.
fn properties(fields: &[Value], p: &mut BackupProperties, queue_addresses: bool) -> Mapped<()> {
    if fields.len() > 13 {
        return Err(format!("a properties list of {} fields", fields.len()));
    }
    for (i, v) in fields.iter().enumerate() {
        if *v == Value::Null {
            continue;
        }
        match i {
            0 => p.message_id = Some(message_id(v, "message-id")?),
            1 => match v {
                Value::Binary(b) if b.len() <= 255 && !b.contains(&0) => {
                    p.user_id = Some(
                        String::from_utf8(b.clone())
                            .map_err(|_| "user-id is not valid UTF-8".to_string())?,
                    )
                }
                other => return Err(format!("user-id is a {}", describe(other))),
            },
            4 => p.reply_to = Some(reply_to(v, queue_addresses)?),
            5 => p.correlation_id = Some(message_id(v, "correlation-id")?),
            6 => p.content_type = Some(symbol(v, "content-type")?),
            7 => p.content_encoding = Some(symbol(v, "content-encoding")?),
            9 => match v {
                Value::Timestamp(ms) => p.timestamp = Some(whole_seconds(*ms, "creation-time")?),
                other => return Err(format!("creation-time is a {}", type_name(other))),
            },
            10 => p.app_id = Some(short_string(v, "group-id")?),
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
    Ok(())
}

/// The 0-9-1 header value a consumer is given for `v` (`mc_amqpl:to_091`), when the broker
/// stores that header as `v` again (`from_091`). Lists and maps (`nested`: in message
/// annotations only) become arrays and tables.
fn header_value(v: &Value, nested: bool) -> Mapped<BackupHeaderValue> {
    Ok(match v {
        Value::String(s) if stored_as_string(s.as_bytes()) => {
            BackupHeaderValue::LongString(s.clone())
        }
        Value::Binary(b) if stored_as_string(b) => BackupHeaderValue::Bytes(b.clone()),
        Value::Binary(b) => match String::from_utf8(b.clone()) {
            Ok(s) => BackupHeaderValue::LongString(s),
            Err(e) => BackupHeaderValue::LongStringBytes(e.into_bytes()),
        },
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
            BackupHeaderValue::Timestamp(whole_seconds(*ms, "a timestamp")? as u64)
        }
        Value::Null => BackupHeaderValue::Void,
        Value::List(items) if nested => BackupHeaderValue::Array(
            items
                .iter()
                .map(|i| header_value(i, true))
                .collect::<Mapped<_>>()?,
        ),
        Value::Map(pairs) if nested => BackupHeaderValue::Table(
            pairs
                .iter()
                .map(|(k, v)| match k {
                    Value::Symbol(k) if k.len() <= 255 => Ok((k.clone(), header_value(v, true)?)),
                    other => Err(format!("a table key is a {}", describe(other))),
                })
                .collect::<Mapped<_>>()?,
        ),
        Value::String(s) => {
            return Err(format!(
                "a string of {} bytes the broker would store back as binary (NUL, or over {UTF8_SCAN_LIMIT} bytes)",
                s.len()
            ))
        }
        other => {
            return Err(format!(
                "a {} has no 0-9-1 header the broker stores back as it",
                type_name(other)
            ))
        }
    })
}

/// The record's properties and headers of `m` (module documentation); `Err(why)` when the
/// broker would not store them back the same. `since_4_2`: the broker is RabbitMQ 4.2 or
/// later, which writes a reply-to as `/queues/<name>` and takes a message without a header
/// section for transient (before 4.2, `mc_amqp:get_property(durable, ...)` took it for
/// durable: a 0-9-1 consumer of 4.0.5 is given delivery mode 2, one of 4.3.6 none).
pub(super) fn map(
    m: &Message,
    since_4_2: bool,
) -> Mapped<(BackupProperties, Vec<(String, BackupHeaderValue)>)> {
    let queue_addresses = since_4_2;
    let mut p = BackupProperties::default();
    let mut headers: Vec<(String, BackupHeaderValue)> = Vec::new();
    match &m.header {
        Some(fields) => header(fields, &mut p)?,
        None if !since_4_2 => p.delivery_mode = Some(2),
        None => {}
    }
    properties(&m.properties, &mut p, queue_addresses)?;
    let mut seen: Vec<&str> = Vec::new();
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
        if seen.contains(&key) {
            return Err(format!("message annotation {key} appears twice"));
        }
        seen.push(key);
        match key {
            // The stream's own: the target writes them again on restore.
            "x-exchange" | "x-routing-key" => {}
            "x-basic-type" => p.type_field = Some(short_string(v, key)?),
            "x-cc" => match v {
                Value::List(items) => headers.push((
                    "CC".to_string(),
                    header_value(&Value::List(items.clone()), true)
                        .map_err(|e| format!("message annotation x-cc: {e}"))?,
                )),
                other => return Err(format!("message annotation x-cc is a {}", type_name(other))),
            },
            // What a consumer is given under another name, or not at all.
            k if k.starts_with("x-basic-")
                || matches!(
                    k,
                    "x-death" | "x-opt-deaths" | "x-opt-rabbitmq-received-time"
                )
                || k.len() > 255 =>
            {
                return Err(format!("message annotation {k}"))
            }
            k if k.starts_with("x-") => headers.push((
                k.to_string(),
                header_value(v, true).map_err(|e| format!("message annotation {k}: {e}"))?,
            )),
            other => return Err(format!("message annotation {other}")),
        }
    }
    for (k, v) in &m.application_properties {
        let key = match k {
            Value::String(s) if s.len() <= 255 && !s.starts_with("x-") => s.clone(),
            Value::String(s) if s.starts_with("x-") => {
                return Err(format!(
                "application property {s} (the broker stores an x- header as a message annotation)"
            ))
            }
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
        let value = header_value(v, false).map_err(|e| format!("header {key}: {e}"))?;
        headers.push((key, value));
    }
    Ok((p, headers))
}
