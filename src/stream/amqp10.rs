//! AMQP 1.0 messages as streams store them (OASIS AMQP 1.0, part 1 "Types" and part 3
//! "Messaging"), decoded into [`BackupRecord`]s.
//!
//! [`decode_value`] reads the AMQP 1.0 type system (every fixed and variable width type,
//! lists, maps, arrays, described values), bounded in depth and never trusting a length beyond
//! the input. [`decode_message`] reads the sections of a message; [`to_record`] maps it the
//! way RabbitMQ maps a stream message for an AMQP 0-9-1 consumer (rabbit_msg_record
//! `to_amqp091`, 3.10), so a backup made over the stream protocol restores the message that a
//! 0-9-1 reader of the stream sees:
//! - body: the `data` sections, concatenated; an `amqp-value` holding a binary or string
//!   gives its bytes; other `amqp-value` and `amqp-sequence` bodies cannot be carried (error);
//! - properties: message-id, user-id, reply-to, correlation-id, content-type,
//!   content-encoding, creation-time (ms -> s); `x-basic-type` and `x-basic-app-id`
//!   application properties become type and app_id; `x-basic-priority`,
//!   `x-basic-delivery-mode` and `x-basic-expiration` message annotations become priority,
//!   delivery mode and expiration; `x-exchange` and `x-routing-key` annotations the exchange
//!   and routing key;
//! - headers: the other application properties, in order, each with the 0-9-1 type RabbitMQ
//!   gives it (string -> `LongString`, long -> `LongLongInt`, int -> `LongInt`, ...,
//!   timestamp ms -> `Timestamp` s, binary -> `Bytes`, null -> `Void`);
//! - not carried: the header section (durable, ttl, delivery count), delivery annotations,
//!   other message annotations, to, subject, absolute-expiry-time, group-id, group-sequence,
//!   reply-to-group-id, footer (README "Streams").

use crate::error::{Error, Result};
use crate::record::{BackupHeaderValue, BackupProperties, BackupRecord};

mod encode;
pub use encode::{encode_message, encode_value};

/// An AMQP 1.0 value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Ubyte(u8),
    Byte(i8),
    Ushort(u16),
    Short(i16),
    Uint(u32),
    Int(i32),
    Ulong(u64),
    Long(i64),
    Float(f32),
    Double(f64),
    /// decimal32, decimal64 or decimal128: the IEEE 754 bytes, not interpreted.
    Decimal(Vec<u8>),
    Char(u32),
    /// Epoch milliseconds.
    Timestamp(i64),
    Uuid([u8; 16]),
    Binary(Vec<u8>),
    String(String),
    /// A `string` whose bytes are not valid UTF-8 (RabbitMQ stores a 0-9-1 long string as an
    /// AMQP 1.0 string without checking them); kept byte for byte.
    InvalidString(Vec<u8>),
    Symbol(String),
    List(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Array(Vec<Value>),
    Described(Box<Value>, Box<Value>),
}

/// Nesting deeper than this is refused (garbage must not exhaust the stack).
const MAX_DEPTH: usize = 64;

fn err(msg: impl Into<String>) -> Error {
    Error::Serialization(format!("Invalid AMQP 1.0 message: {}", msg.into()))
}

struct Input<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .p
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                err(format!(
                    "{n} bytes expected at byte {}, the message ends at {}",
                    self.p,
                    self.b.len()
                ))
            })?;
        let s = &self.b[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_be_bytes(self.arr()?))
    }
}

/// Decodes one value at the start of `b`; returns it and the bytes it took.
///
/// Errors: `Error::Serialization` for an unknown format code, a truncated value, invalid UTF-8
/// in a string, or nesting deeper than 64.
pub fn decode_value(b: &[u8]) -> Result<(Value, usize)> {
    let mut input = Input { b, p: 0 };
    let v = value(&mut input, 0)?;
    Ok((v, input.p))
}

fn value(i: &mut Input, depth: usize) -> Result<Value> {
    let code = i.u8()?;
    if code == 0x00 {
        if depth >= MAX_DEPTH {
            return Err(err("values nested too deep"));
        }
        let descriptor = value(i, depth + 1)?;
        let v = value(i, depth + 1)?;
        return Ok(Value::Described(Box::new(descriptor), Box::new(v)));
    }
    with_code(i, code, depth)
}

/// The size and count of a list, map or array (one byte each, or four when `wide`): its
/// body as an input of its own, and the element count.
fn compound<'a>(i: &mut Input<'a>, wide: bool) -> Result<(Input<'a>, usize)> {
    let size = if wide {
        i.u32()? as usize
    } else {
        i.u8()? as usize
    };
    let body = i.take(size)?;
    let mut inner = Input { b: body, p: 0 };
    let count = if wide {
        inner.u32()? as usize
    } else {
        inner.u8()? as usize
    };
    // Each element takes at least one byte: a count beyond that is garbage.
    if count > body.len() {
        return Err(err(format!(
            "{count} elements announced in {} bytes",
            body.len()
        )));
    }
    Ok((inner, count))
}

fn with_code(i: &mut Input, code: u8, depth: usize) -> Result<Value> {
    if depth >= MAX_DEPTH {
        return Err(err("values nested too deep"));
    }
    let utf8 =
        |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| err("a symbol is not valid UTF-8"));
    let string = |b: &[u8]| match String::from_utf8(b.to_vec()) {
        Ok(s) => Value::String(s),
        Err(e) => Value::InvalidString(e.into_bytes()),
    };
    Ok(match code {
        0x40 => Value::Null,
        0x41 => Value::Bool(true),
        0x42 => Value::Bool(false),
        0x56 => Value::Bool(i.u8()? != 0),
        0x50 => Value::Ubyte(i.u8()?),
        0x51 => Value::Byte(i.u8()? as i8),
        0x60 => Value::Ushort(u16::from_be_bytes(i.arr()?)),
        0x61 => Value::Short(i16::from_be_bytes(i.arr()?)),
        0x70 => Value::Uint(i.u32()?),
        0x52 => Value::Uint(i.u8()? as u32),
        0x43 => Value::Uint(0),
        0x80 => Value::Ulong(u64::from_be_bytes(i.arr()?)),
        0x53 => Value::Ulong(i.u8()? as u64),
        0x44 => Value::Ulong(0),
        0x71 => Value::Int(i32::from_be_bytes(i.arr()?)),
        0x54 => Value::Int(i.u8()? as i8 as i32),
        0x81 => Value::Long(i64::from_be_bytes(i.arr()?)),
        0x55 => Value::Long(i.u8()? as i8 as i64),
        0x72 => Value::Float(f32::from_be_bytes(i.arr()?)),
        0x82 => Value::Double(f64::from_be_bytes(i.arr()?)),
        0x74 => Value::Decimal(i.take(4)?.to_vec()),
        0x84 => Value::Decimal(i.take(8)?.to_vec()),
        0x94 => Value::Decimal(i.take(16)?.to_vec()),
        0x73 => Value::Char(i.u32()?),
        0x83 => Value::Timestamp(i64::from_be_bytes(i.arr()?)),
        0x98 => Value::Uuid(i.arr()?),
        0xa0 => {
            let n = i.u8()? as usize;
            Value::Binary(i.take(n)?.to_vec())
        }
        0xb0 => {
            let n = i.u32()? as usize;
            Value::Binary(i.take(n)?.to_vec())
        }
        0xa1 => {
            let n = i.u8()? as usize;
            string(i.take(n)?)
        }
        0xb1 => {
            let n = i.u32()? as usize;
            string(i.take(n)?)
        }
        0xa3 => {
            let n = i.u8()? as usize;
            Value::Symbol(utf8(i.take(n)?)?)
        }
        0xb3 => {
            let n = i.u32()? as usize;
            Value::Symbol(utf8(i.take(n)?)?)
        }
        0x45 => Value::List(Vec::new()),
        0xc0 | 0xd0 | 0xc1 | 0xd1 => {
            let (mut inner, count) = compound(i, code & 0x10 != 0)?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(value(&mut inner, depth + 1)?);
            }
            if code & 0x01 == 0 {
                Value::List(items)
            } else {
                if count % 2 != 0 {
                    return Err(err("a map with an odd number of elements"));
                }
                let mut pairs = Vec::with_capacity(count / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Value::Map(pairs)
            }
        }
        0xe0 | 0xf0 => {
            let (mut inner, count) = compound(i, code == 0xf0)?;
            let mut element = inner.u8()?;
            let mut descriptor = None;
            if element == 0x00 {
                descriptor = Some(value(&mut inner, depth + 1)?);
                element = inner.u8()?;
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                let v = with_code(&mut inner, element, depth + 1)?;
                items.push(match &descriptor {
                    Some(d) => Value::Described(Box::new(d.clone()), Box::new(v)),
                    None => v,
                });
            }
            Value::Array(items)
        }
        other => return Err(err(format!("unknown format code {other:#04x}"))),
    })
}

/// The sections of a message that a record can carry (see the module documentation).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message {
    /// properties section: the 13 fields, absent ones as `Null`.
    pub properties: Vec<Value>,
    /// message-annotations, in order.
    pub message_annotations: Vec<(Value, Value)>,
    /// application-properties, in order.
    pub application_properties: Vec<(Value, Value)>,
    /// The body: `data` sections concatenated, or an `amqp-value` binary/string.
    pub body: Vec<u8>,
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

/// Decodes the sections of one AMQP 1.0 message.
///
/// Errors: `Error::Serialization` for bytes that are not a sequence of described sections, and
/// for bodies a record cannot carry (`amqp-sequence`, an `amqp-value` that is not binary or
/// string).
pub fn decode_message(b: &[u8]) -> Result<Message> {
    let mut m = Message::default();
    let mut p = 0;
    while p < b.len() {
        let (v, n) = decode_value(&b[p..])?;
        p += n;
        let Value::Described(d, v) = v else {
            return Err(err("a section is not a described value"));
        };
        match (section_code(&d), *v) {
            (Some(0x73), Value::List(fields)) => m.properties = fields,
            (Some(0x72), Value::Map(pairs)) => m.message_annotations = pairs,
            (Some(0x74), Value::Map(pairs)) => m.application_properties = pairs,
            (Some(0x75), Value::Binary(data)) => m.body.extend_from_slice(&data),
            (Some(0x77), Value::Binary(data)) => m.body = data,
            (Some(0x77), Value::String(s)) => m.body = s.into_bytes(),
            (Some(0x77), Value::InvalidString(b)) => m.body = b,
            (Some(0x76), _) => {
                return Err(err(
                    "an amqp-sequence body cannot be carried by a backup record",
                ))
            }
            (Some(0x77), other) => {
                return Err(err(format!(
                    "an amqp-value body of {} cannot be carried by a backup record",
                    type_name(&other)
                )))
            }
            // header, delivery annotations, footer, and unknown sections: not carried.
            _ => {}
        }
    }
    Ok(m)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Ubyte(_) => "ubyte",
        Value::Byte(_) => "byte",
        Value::Ushort(_) => "ushort",
        Value::Short(_) => "short",
        Value::Uint(_) => "uint",
        Value::Int(_) => "int",
        Value::Ulong(_) => "ulong",
        Value::Long(_) => "long",
        Value::Float(_) => "float",
        Value::Double(_) => "double",
        Value::Decimal(_) => "decimal",
        Value::Char(_) => "char",
        Value::Timestamp(_) => "timestamp",
        Value::Uuid(_) => "uuid",
        Value::Binary(_) => "binary",
        Value::String(_) | Value::InvalidString(_) => "string",
        Value::Symbol(_) => "symbol",
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Array(_) => "array",
        Value::Described(..) => "described value",
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) | Value::Symbol(s) => Some(s.clone()),
        Value::Binary(b) | Value::InvalidString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Ulong(n) => Some(n.to_string()),
        Value::Uuid(u) => Some(format_uuid(u)),
        _ => None,
    }
}

fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn small(v: &Value) -> Option<u8> {
    match v {
        Value::Ubyte(n) => Some(*n),
        Value::Uint(n) => u8::try_from(*n).ok(),
        Value::Ulong(n) => u8::try_from(*n).ok(),
        Value::Int(n) => u8::try_from(*n).ok(),
        Value::Long(n) => u8::try_from(*n).ok(),
        _ => None,
    }
}

/// An application property as the 0-9-1 header RabbitMQ makes of it (`to_091`).
fn header_value(v: &Value) -> Result<BackupHeaderValue> {
    Ok(match v {
        Value::String(s) | Value::Symbol(s) => BackupHeaderValue::LongString(s.clone()),
        Value::InvalidString(b) => BackupHeaderValue::LongStringBytes(b.clone()),
        Value::Long(n) => BackupHeaderValue::LongLongInt(*n),
        Value::Ulong(n) => BackupHeaderValue::LongLongInt(
            i64::try_from(*n)
                .map_err(|_| err(format!("the ulong {n} does not fit a 0-9-1 header")))?,
        ),
        Value::Int(n) => BackupHeaderValue::LongInt(*n),
        Value::Uint(n) => BackupHeaderValue::LongUInt(*n),
        Value::Short(n) => BackupHeaderValue::ShortInt(*n),
        Value::Ushort(n) => BackupHeaderValue::ShortUInt(*n),
        Value::Byte(n) => BackupHeaderValue::ShortShortInt(*n),
        Value::Ubyte(n) => BackupHeaderValue::ShortShortUInt(*n),
        Value::Double(f) => BackupHeaderValue::Double(*f),
        Value::Float(f) => BackupHeaderValue::Float(*f),
        Value::Bool(b) => BackupHeaderValue::Bool(*b),
        Value::Timestamp(ms) => BackupHeaderValue::Timestamp(ms.div_euclid(1000).max(0) as u64),
        Value::Binary(b) => BackupHeaderValue::Bytes(b.clone()),
        Value::Null => BackupHeaderValue::Void,
        Value::Char(c) => BackupHeaderValue::LongInt(*c as i32),
        Value::Uuid(u) => BackupHeaderValue::LongString(format_uuid(u)),
        other => {
            return Err(err(format!(
                "an application property of type {} cannot be a 0-9-1 header",
                type_name(other)
            )))
        }
    })
}

/// Where a stream message was read: the record's source and offset.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub stream: &'a str,
    pub vhost: &'a str,
    /// The message's offset in the stream; the record's `delivery_tag` is offset + 1.
    pub offset: u64,
    /// backed_up_at, epoch ms.
    pub backed_up_at: i64,
}

/// Maps a decoded message to a record (see the module documentation for the mapping).
///
/// Errors: `Error::Serialization` naming the offset when an application property has no 0-9-1
/// form (a list, map, array, decimal or described value, or a ulong beyond i64).
pub fn to_record(m: Message, at: Origin) -> Result<BackupRecord> {
    let prop = |i: usize| m.properties.get(i).filter(|v| **v != Value::Null);
    let mut properties = BackupProperties {
        message_id: prop(0).and_then(text),
        user_id: prop(1).and_then(text),
        reply_to: prop(4).and_then(text),
        correlation_id: prop(5).and_then(text),
        content_type: prop(6).and_then(text),
        content_encoding: prop(7).and_then(text),
        timestamp: prop(9).and_then(|v| match v {
            Value::Timestamp(ms) => Some(ms.div_euclid(1000)),
            _ => None,
        }),
        ..Default::default()
    };
    let (mut exchange, mut routing_key) = (String::new(), String::new());
    for (k, v) in &m.message_annotations {
        let Some(key) = text(k) else { continue };
        match key.as_str() {
            "x-basic-priority" => properties.priority = small(v),
            "x-basic-delivery-mode" => properties.delivery_mode = small(v),
            "x-basic-expiration" => properties.expiration = text(v),
            "x-exchange" => exchange = text(v).unwrap_or_default(),
            "x-routing-key" => routing_key = text(v).unwrap_or_default(),
            _ => {}
        }
    }
    let mut headers = Vec::with_capacity(m.application_properties.len());
    for (k, v) in &m.application_properties {
        let Some(key) = text(k) else { continue };
        match key.as_str() {
            "x-basic-type" => properties.type_field = text(v),
            "x-basic-app-id" => properties.app_id = text(v),
            _ if key.len() <= 255 => {
                let value = header_value(v).map_err(|e| {
                    Error::Serialization(format!(
                        "stream {} in vhost {}, offset {}: header {key}: {}",
                        at.stream,
                        at.vhost,
                        at.offset,
                        e.message()
                    ))
                })?;
                headers.push((key, value));
            }
            // 0-9-1 header names are short strings: RabbitMQ drops longer keys too.
            _ => {}
        }
    }
    Ok(BackupRecord {
        body: m.body,
        properties,
        headers,
        exchange,
        routing_key,
        delivery_tag: at.offset + 1,
        redelivered: false,
        backed_up_at: at.backed_up_at,
        source_queue: at.stream.to_string(),
        source_vhost: at.vhost.to_string(),
    })
}

#[cfg(test)]
mod tests;
