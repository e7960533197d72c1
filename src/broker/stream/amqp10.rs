//! AMQP 1.0 messages as streams store them (OASIS AMQP 1.0, part 1 "Types" and part 3
//! "Messaging"), decoded into [`BackupRecord`](crate::repository::record::BackupRecord)s.
//!
//! [`decode_value`] reads the AMQP 1.0 type system (every fixed and variable width type,
//! lists, maps, arrays, described values), bounded in depth, never trusting a length beyond
//! the input, and at a memory cost proportional to the input: an array's descriptor is held
//! once, and no input decodes to more values than it has bytes. [`decode_message`] reads the
//! sections a record can carry and steps over the others without decoding them.
//! [`record::to_record`] (re-exported here) makes the record: a message that RabbitMQ's own
//! conversion of an AMQP 0-9-1 message could have produced is mapped the way the broker maps
//! it for a 0-9-1 reader (`rabbit_msg_record` before 3.13, message containers since: the
//! broker's version decides, [`Conversion`]), so that a restore publishes it back unchanged;
//! any other message (an `amqp-value` or `amqp-sequence` body, several `data`
//! sections, a `subject`, a symbol-typed header, bytes that do not decode...) is stored as
//! its encoded bytes, whole, with the header [`RAW_BODY_HEADER`] (docs/streams.md "Streams").

use crate::broker::amqp10::codec::{err, skip_value, type_name, value, Input};
use crate::error::Result;

mod container;
mod encode;
mod field;
mod record;
pub use crate::broker::amqp10::codec::{decode_value, encode_value, Value};
pub use encode::encode_message;
pub use record::{to_record, Conversion, Origin, RAW_BODY_HEADER, RAW_BODY_VALUE};

/// The sections of a message that a record can carry (see the module documentation).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// header section (AMQP 1.0 part 3, 3.2.1: durable, priority, ttl, first-acquirer,
    /// delivery-count), when the message has one: its fields, absent ones as `Null`.
    /// RabbitMQ 3.13 and later write one into every message published over AMQP 0-9-1.
    pub header: Option<Vec<Value>>,
    /// properties section: the 13 fields, absent ones as `Null`.
    pub properties: Vec<Value>,
    /// message-annotations, in order.
    pub message_annotations: Vec<(Value, Value)>,
    /// application-properties, in order.
    pub application_properties: Vec<(Value, Value)>,
    /// The body: the `data` section's bytes.
    pub body: Vec<u8>,
    /// Why a record cannot carry this message whole (a section it has no place for, a second
    /// `data` section, no `data` section), when that is so: it is then stored as its bytes.
    pub not_carried: Option<String>,
}

/// Section codes (AMQP 1.0 part 3, 3.2).
fn section_code(descriptor: &Value) -> Option<u64> {
    match descriptor {
        Value::Ulong(c) => Some(*c),
        Value::Symbol(s) => Some(match s.as_str() {
            "amqp:header:list" => 0x70,
            "amqp:delivery-annotations:map" => 0x71,
            "amqp:message-annotations:map" => 0x72,
            "amqp:properties:list" => 0x73,
            "amqp:application-properties:map" => 0x74,
            "amqp:data:binary" => 0x75,
            "amqp:amqp-sequence:list" => 0x76,
            "amqp:amqp-value:*" => 0x77,
            "amqp:footer:map" => 0x78,
            _ => return None,
        }),
        _ => None,
    }
}

fn section_name(code: Option<u64>) -> &'static str {
    match code {
        Some(0x70) => "a header section",
        Some(0x71) => "delivery annotations",
        Some(0x72) => "a second message-annotations section",
        Some(0x73) => "a second properties section",
        Some(0x74) => "a second application-properties section",
        Some(0x75) => "a second data section",
        Some(0x76) => "an amqp-sequence body",
        Some(0x77) => "an amqp-value body",
        Some(0x78) => "a footer",
        _ => "a section of an unknown type",
    }
}

/// Decodes the sections of one AMQP 1.0 message that a record can carry (header, properties,
/// message annotations, application properties, one `data` section) and steps over the others
/// without decoding them, noting in [`Message::not_carried`] that they are there.
///
/// Errors: `Error::Serialization` for bytes that are not a sequence of described sections
/// (see [`decode_value`]).
pub fn decode_message(b: &[u8]) -> Result<Message> {
    let mut m = Message::default();
    let mut i = Input::new(b);
    let mut seen: Vec<u64> = Vec::new();
    let note = |m: &mut Message, why: &str| {
        m.not_carried.get_or_insert_with(|| why.to_string());
    };
    while i.p < b.len() {
        if i.u8()? != 0x00 {
            return Err(err("a section is not a described value"));
        }
        let code = section_code(&value(&mut i, 1)?);
        let repeated = code.is_some_and(|c| seen.contains(&c));
        if let Some(c) = code {
            seen.push(c);
        }
        match code.filter(|_| !repeated) {
            Some(0x70 | 0x72..=0x75) => {
                let v = value(&mut i, 1)?;
                match (code, v) {
                    (Some(0x70), Value::List(fields)) => m.header = Some(fields),
                    (Some(0x73), Value::List(fields)) => m.properties = fields,
                    (Some(0x72), Value::Map(pairs)) => m.message_annotations = pairs,
                    (Some(0x74), Value::Map(pairs)) => m.application_properties = pairs,
                    (Some(0x75), Value::Binary(data)) => m.body = data,
                    (_, other) => note(&mut m, &format!("a section holds a {}", type_name(&other))),
                }
            }
            _ => {
                skip_value(&mut i, 1)?;
                note(&mut m, section_name(code));
            }
        }
    }
    if !seen.contains(&0x75) {
        note(&mut m, "no data section");
    }
    Ok(m)
}

#[cfg(test)]
mod container_tests;
#[cfg(test)]
mod tests;
