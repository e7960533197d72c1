//! The AMQP 1.0 encoding of a [`Message`]'s sections: what a stream-protocol publisher sends
//! (each value by `crate::broker::amqp10::codec::encode_value`).

use super::{encode_value, Message, Value};

fn section(out: &mut Vec<u8>, code: u64, v: &Value) {
    encode_value(
        &Value::Described(Box::new(Value::Ulong(code)), Box::new(v.clone())),
        out,
    );
}

/// The sections of `m`: header (when it has one), message annotations, properties,
/// application properties (each when not empty) and the body as one `data` section.
pub fn encode_message(m: &Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(m.body.len() + 256);
    if let Some(header) = &m.header {
        section(&mut out, 0x70, &Value::List(header.clone()));
    }
    if !m.message_annotations.is_empty() {
        section(&mut out, 0x72, &Value::Map(m.message_annotations.clone()));
    }
    if !m.properties.is_empty() {
        section(&mut out, 0x73, &Value::List(m.properties.clone()));
    }
    if !m.application_properties.is_empty() {
        section(
            &mut out,
            0x74,
            &Value::Map(m.application_properties.clone()),
        );
    }
    section(&mut out, 0x75, &Value::Binary(m.body.clone()));
    out
}
