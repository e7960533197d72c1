//! Backup records: one captured message as stored in a segment (SPEC.md "Segment file (RBAK
//! format)", BackupRecord / BackupProperties / BackupHeaderValue), its conversions to and from
//! the AMQP wire types of [`crate::amqp::types`], and the fast JSON codec of the hot path
//! (DESIGN.md decision 5).
//!
//! The JSON shape is exactly SPEC.md's:
//!
//! ```json
//! {"body":[104,105],"properties":{"content_type":null,...,"cluster_id":null},
//!  "headers":[["x-count",{"LongInt":3}],["flag","Void"]],"exchange":"ex","routing_key":"rk",
//!  "delivery_tag":1,"redelivered":false,"backed_up_at":1700000000000,
//!  "source_queue":"q","source_vhost":"/"}
//! ```
//!
//! [`encode_record`] writes bytes identical to `serde_json::to_vec(&record)` but writes the body
//! array itself from a lookup table; [`decode_record`] parses the body array itself and lets
//! `serde_json` parse the small rest. The derived serde implementations on the types below
//! define the format; the codec only makes it faster, and is tested byte for byte against them.
//!
//! Choices this module makes and documents:
//! - **Headers absent vs empty.** SPEC.md stores `headers` as an array, never null, so a message
//!   published with an empty header table and one published with no table give the same record.
//!   [`BackupRecord::to_amqp`] restores both as *no* header table (`headers: None`).
//! - **Non-finite floats.** JSON has no NaN or infinity (serde_json would write `null` and then
//!   fail to read it back). `Float`/`Double` values that are not finite are written as the strings
//!   `"NaN"`, `"Infinity"` and `"-Infinity"`; reading accepts those, numbers, and `null` (as NaN, so
//!   that records written by other tools still load). A NaN's payload bits are not kept.
//! - **Float precision.** Reading a `Double` back bit-exactly needs serde_json's
//!   `float_roundtrip` feature (without it serde_json's float parser can be off by one ULP).
//! - **Nesting.** serde_json refuses JSON nested deeper than 128 levels. Header values with up to
//!   41 tables/arrays inside each other always read back; deeper ones are written but fail to
//!   read.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use crate::amqp::types::{BasicProperties, Delivery, FieldTable, FieldValue};
use crate::error::{Error, Result};

/// Header table of a record: `[key, value]` pairs in wire order (SPEC.md BackupRecord `headers`).
pub type HeaderTable = Vec<(String, BackupHeaderValue)>;

/// One backed-up message (SPEC.md "Segment file (RBAK format)", BackupRecord).
///
/// Field order is the JSON key order. `body` is the raw message body; it is written as a JSON
/// array of byte values, or `null` when it is empty (an empty array is also accepted on read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupRecord {
    /// Message body bytes (empty for a zero-length body, written as `null`).
    #[serde(serialize_with = "ser_body", deserialize_with = "de_body")]
    pub body: Vec<u8>,
    /// The basic-class content properties other than headers.
    pub properties: BackupProperties,
    /// Message headers in wire order, each value keeping its AMQP type.
    pub headers: HeaderTable,
    /// Exchange the message was published to; empty for the default exchange and for streams.
    pub exchange: String,
    /// Routing key; empty for stream messages.
    pub routing_key: String,
    /// Broker delivery tag (the stream offset for stream queues).
    pub delivery_tag: u64,
    /// The broker's redelivered flag.
    pub redelivered: bool,
    /// When the tool captured the record, epoch milliseconds.
    pub backed_up_at: i64,
    /// Queue the record was read from.
    pub source_queue: String,
    /// Vhost of that queue.
    pub source_vhost: String,
}

/// The AMQP basic properties of a record, headers excepted (SPEC.md BackupProperties).
/// Every key is always written, `null` when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupProperties {
    /// MIME content type.
    pub content_type: Option<String>,
    /// Content encoding.
    pub content_encoding: Option<String>,
    /// 1 non-persistent, 2 persistent.
    pub delivery_mode: Option<u8>,
    /// Priority, 0 to 255.
    pub priority: Option<u8>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// Reply-to address.
    pub reply_to: Option<String>,
    /// Per-message TTL in milliseconds, as a string.
    pub expiration: Option<String>,
    /// Application message id.
    pub message_id: Option<String>,
    /// AMQP timestamp, seconds since the epoch. Stored as i64; the wire's u64 is converted
    /// bit for bit (`as`), so every u64 survives the round trip.
    pub timestamp: Option<i64>,
    /// The AMQP `type` property.
    pub type_field: Option<String>,
    /// Publishing user.
    pub user_id: Option<String>,
    /// Publishing application.
    pub app_id: Option<String>,
    /// Deprecated cluster id.
    pub cluster_id: Option<String>,
}

/// A header value with its AMQP type (SPEC.md BackupHeaderValue; DESIGN.md decision 3).
///
/// JSON: a single-key object naming the variant (`{"LongInt":3}`,
/// `{"Decimal":{"scale":2,"value":314}}`, `{"Table":[["k",{"Bool":true}]]}`), except `Void`,
/// which is the bare string `"Void"`. Values read from the wire keep their type code (the
/// `From<FieldValue>` impl); every variant converts back to a wire value
/// ([`BackupHeaderValue::to_field_value`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BackupHeaderValue {
    /// `S`, valid UTF-8.
    LongString(String),
    /// `S` whose bytes are not valid UTF-8.
    LongStringBytes(Vec<u8>),
    /// Short string (written by other tools; RabbitMQ tables have no short-string type, it is
    /// restored as a long string).
    ShortString(String),
    /// 64-bit signed integer (other tools); restored as `l`.
    Long(i64),
    /// 16-bit signed integer (other tools); restored as `s`.
    Short(i16),
    /// `b`, signed 8-bit.
    ShortShortInt(i8),
    /// `B`, unsigned 8-bit.
    ShortShortUInt(u8),
    /// `s`, signed 16-bit.
    ShortInt(i16),
    /// `u`, unsigned 16-bit.
    ShortUInt(u16),
    /// `I`, signed 32-bit.
    LongInt(i32),
    /// `i`, unsigned 32-bit.
    LongUInt(u32),
    /// `l`, signed 64-bit.
    LongLongInt(i64),
    /// `t`.
    Bool(bool),
    /// `x`, byte array.
    Bytes(Vec<u8>),
    /// `T`, seconds since the epoch.
    Timestamp(u64),
    /// `f`. Non-finite values are written as strings (see the module documentation).
    Float(#[serde(with = "f32_json")] f32),
    /// `d`. Non-finite values are written as strings (see the module documentation).
    Double(#[serde(with = "f64_json")] f64),
    /// `D`: `value` / 10^`scale`.
    Decimal {
        /// Number of decimal digits after the point.
        scale: u8,
        /// Unscaled value.
        value: u32,
    },
    /// `V`, no value.
    Void,
    /// `F`, nested table in wire order.
    Table(Vec<(String, BackupHeaderValue)>),
    /// `A`, array of values.
    Array(Vec<BackupHeaderValue>),
}

impl BackupRecord {
    /// Builds a record from a delivery, moving its body (no copy) and converting its
    /// properties and headers, each header keeping its AMQP type code. `backed_up_at` is epoch
    /// milliseconds.
    pub fn from_delivery(
        d: Delivery,
        source_queue: &str,
        source_vhost: &str,
        backed_up_at: i64,
    ) -> BackupRecord {
        let Delivery {
            delivery_tag,
            redelivered,
            exchange,
            routing_key,
            properties,
            body,
        } = d;
        let (properties, headers) = split_properties(properties);
        BackupRecord {
            body,
            properties,
            headers,
            exchange,
            routing_key,
            delivery_tag,
            redelivered,
            backed_up_at,
            source_queue: source_queue.to_string(),
            source_vhost: source_vhost.to_string(),
        }
    }

    /// The AMQP properties to publish this record with. `headers` is `None` when the record has
    /// no headers (see the module documentation on absent vs empty tables); otherwise every
    /// header is converted with [`BackupHeaderValue::to_field_value`], order kept.
    pub fn to_amqp(&self) -> BasicProperties {
        let p = &self.properties;
        BasicProperties {
            content_type: p.content_type.clone(),
            content_encoding: p.content_encoding.clone(),
            headers: if self.headers.is_empty() {
                None
            } else {
                Some(
                    self.headers
                        .iter()
                        .map(|(k, v)| (k.clone(), v.to_field_value()))
                        .collect(),
                )
            },
            delivery_mode: p.delivery_mode,
            priority: p.priority,
            correlation_id: p.correlation_id.clone(),
            reply_to: p.reply_to.clone(),
            expiration: p.expiration.clone(),
            message_id: p.message_id.clone(),
            timestamp: p.timestamp.map(|t| t as u64),
            kind: p.type_field.clone(),
            user_id: p.user_id.clone(),
            app_id: p.app_id.clone(),
            cluster_id: p.cluster_id.clone(),
        }
    }

    /// Consumes the record into the AMQP properties (as [`BackupRecord::to_amqp`]) and the
    /// body, without copying the body or any string.
    pub fn into_amqp(self) -> (BasicProperties, Vec<u8>) {
        let p = self.properties;
        let props = BasicProperties {
            content_type: p.content_type,
            content_encoding: p.content_encoding,
            headers: if self.headers.is_empty() {
                None
            } else {
                Some(
                    self.headers
                        .into_iter()
                        .map(|(k, v)| (k, v.into_field_value()))
                        .collect(),
                )
            },
            delivery_mode: p.delivery_mode,
            priority: p.priority,
            correlation_id: p.correlation_id,
            reply_to: p.reply_to,
            expiration: p.expiration,
            message_id: p.message_id,
            timestamp: p.timestamp.map(|t| t as u64),
            kind: p.type_field,
            user_id: p.user_id,
            app_id: p.app_id,
            cluster_id: p.cluster_id,
        };
        (props, self.body)
    }

    /// The message body (empty for a zero-length body).
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Consumes the record, returning the body without copying it.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// Splits wire properties into record properties and the header table.
fn split_properties(p: BasicProperties) -> (BackupProperties, HeaderTable) {
    let headers = p
        .headers
        .map(|t| {
            t.into_iter()
                .map(|(k, v)| (k, BackupHeaderValue::from(v)))
                .collect()
        })
        .unwrap_or_default();
    let props = BackupProperties {
        content_type: p.content_type,
        content_encoding: p.content_encoding,
        delivery_mode: p.delivery_mode,
        priority: p.priority,
        correlation_id: p.correlation_id,
        reply_to: p.reply_to,
        expiration: p.expiration,
        message_id: p.message_id,
        timestamp: p.timestamp.map(|t| t as i64),
        type_field: p.kind,
        user_id: p.user_id,
        app_id: p.app_id,
        cluster_id: p.cluster_id,
    };
    (props, headers)
}

impl From<FieldValue> for BackupHeaderValue {
    /// Wire to record, keeping the wire type: `t` Bool, `b` ShortShortInt, `B` ShortShortUInt,
    /// `s` ShortInt, `u` ShortUInt, `I` LongInt, `i` LongUInt, `l` LongLongInt, `f` Float,
    /// `d` Double, `D` Decimal, `S` LongString (LongStringBytes when not UTF-8), `A` Array,
    /// `T` Timestamp, `F` Table, `V` Void, `x` Bytes.
    fn from(v: FieldValue) -> Self {
        match v {
            FieldValue::Bool(b) => BackupHeaderValue::Bool(b),
            FieldValue::I8(n) => BackupHeaderValue::ShortShortInt(n),
            FieldValue::U8(n) => BackupHeaderValue::ShortShortUInt(n),
            FieldValue::I16(n) => BackupHeaderValue::ShortInt(n),
            FieldValue::U16(n) => BackupHeaderValue::ShortUInt(n),
            FieldValue::I32(n) => BackupHeaderValue::LongInt(n),
            FieldValue::U32(n) => BackupHeaderValue::LongUInt(n),
            FieldValue::I64(n) => BackupHeaderValue::LongLongInt(n),
            FieldValue::F32(f) => BackupHeaderValue::Float(f),
            FieldValue::F64(f) => BackupHeaderValue::Double(f),
            FieldValue::Decimal { scale, value } => BackupHeaderValue::Decimal { scale, value },
            FieldValue::LongString(bytes) => match String::from_utf8(bytes) {
                Ok(s) => BackupHeaderValue::LongString(s),
                Err(e) => BackupHeaderValue::LongStringBytes(e.into_bytes()),
            },
            FieldValue::Array(a) => {
                BackupHeaderValue::Array(a.into_iter().map(BackupHeaderValue::from).collect())
            }
            FieldValue::Timestamp(t) => BackupHeaderValue::Timestamp(t),
            FieldValue::Table(t) => BackupHeaderValue::Table(
                t.into_iter()
                    .map(|(k, v)| (k, BackupHeaderValue::from(v)))
                    .collect(),
            ),
            FieldValue::Void => BackupHeaderValue::Void,
            FieldValue::Bytes(b) => BackupHeaderValue::Bytes(b),
        }
    }
}

impl From<BackupHeaderValue> for FieldValue {
    /// Record to wire, as [`BackupHeaderValue::to_field_value`] but without copying.
    fn from(v: BackupHeaderValue) -> Self {
        v.into_field_value()
    }
}

impl BackupHeaderValue {
    /// The wire value to publish: every variant maps back to the type code it was read from;
    /// the variants only other tools write map to the closest RabbitMQ type: `ShortString` to
    /// `S` (RabbitMQ tables have no short-string code), `Long` to `l`, `Short` to `s`.
    pub fn to_field_value(&self) -> FieldValue {
        match self {
            BackupHeaderValue::LongString(s) | BackupHeaderValue::ShortString(s) => {
                FieldValue::LongString(s.as_bytes().to_vec())
            }
            BackupHeaderValue::LongStringBytes(b) => FieldValue::LongString(b.clone()),
            BackupHeaderValue::Long(n) | BackupHeaderValue::LongLongInt(n) => FieldValue::I64(*n),
            BackupHeaderValue::Short(n) | BackupHeaderValue::ShortInt(n) => FieldValue::I16(*n),
            BackupHeaderValue::ShortShortInt(n) => FieldValue::I8(*n),
            BackupHeaderValue::ShortShortUInt(n) => FieldValue::U8(*n),
            BackupHeaderValue::ShortUInt(n) => FieldValue::U16(*n),
            BackupHeaderValue::LongInt(n) => FieldValue::I32(*n),
            BackupHeaderValue::LongUInt(n) => FieldValue::U32(*n),
            BackupHeaderValue::Bool(b) => FieldValue::Bool(*b),
            BackupHeaderValue::Bytes(b) => FieldValue::Bytes(b.clone()),
            BackupHeaderValue::Timestamp(t) => FieldValue::Timestamp(*t),
            BackupHeaderValue::Float(f) => FieldValue::F32(*f),
            BackupHeaderValue::Double(f) => FieldValue::F64(*f),
            BackupHeaderValue::Decimal { scale, value } => FieldValue::Decimal {
                scale: *scale,
                value: *value,
            },
            BackupHeaderValue::Void => FieldValue::Void,
            BackupHeaderValue::Table(t) => FieldValue::Table(
                t.iter()
                    .map(|(k, v)| (k.clone(), v.to_field_value()))
                    .collect::<FieldTable>(),
            ),
            BackupHeaderValue::Array(a) => {
                FieldValue::Array(a.iter().map(BackupHeaderValue::to_field_value).collect())
            }
        }
    }

    /// As [`BackupHeaderValue::to_field_value`], consuming the value (no copies).
    pub fn into_field_value(self) -> FieldValue {
        match self {
            BackupHeaderValue::LongString(s) | BackupHeaderValue::ShortString(s) => {
                FieldValue::LongString(s.into_bytes())
            }
            BackupHeaderValue::LongStringBytes(b) => FieldValue::LongString(b),
            BackupHeaderValue::Bytes(b) => FieldValue::Bytes(b),
            BackupHeaderValue::Table(t) => FieldValue::Table(
                t.into_iter()
                    .map(|(k, v)| (k, v.into_field_value()))
                    .collect::<FieldTable>(),
            ),
            BackupHeaderValue::Array(a) => FieldValue::Array(
                a.into_iter()
                    .map(BackupHeaderValue::into_field_value)
                    .collect(),
            ),
            other => other.to_field_value(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// serde helpers
// ---------------------------------------------------------------------------------------------

#[allow(clippy::ptr_arg)] // signature imposed by serialize_with on a Vec<u8> field
fn ser_body<S: Serializer>(body: &Vec<u8>, s: S) -> std::result::Result<S::Ok, S::Error> {
    if body.is_empty() {
        s.serialize_none()
    } else {
        s.collect_seq(body.iter())
    }
}

fn de_body<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u8>, D::Error> {
    Ok(Option::<Vec<u8>>::deserialize(d)?.unwrap_or_default())
}

fn non_finite_name(v: f64) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

/// Accepts a JSON number, `"NaN"`, `"Infinity"`, `"-Infinity"` or `null` (NaN).
struct FloatVisitor;

impl<'de> Visitor<'de> for FloatVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"Infinity\", \"-Infinity\" or null")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<f64, E> {
        Ok(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
    fn visit_unit<E: de::Error>(self) -> std::result::Result<f64, E> {
        Ok(f64::NAN)
    }
    fn visit_none<E: de::Error>(self) -> std::result::Result<f64, E> {
        Ok(f64::NAN)
    }
}

mod f32_json {
    use super::{non_finite_name, FloatVisitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else {
            s.serialize_str(non_finite_name(f64::from(*v)))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        // The f32 text is its shortest decimal form; the correctly rounded f64 of it narrows
        // back to the same f32.
        d.deserialize_any(FloatVisitor).map(|v| v as f32)
    }
}

mod f64_json {
    use super::{non_finite_name, FloatVisitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_str(non_finite_name(*v))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        d.deserialize_any(FloatVisitor)
    }
}

// ---------------------------------------------------------------------------------------------
// The hot path: encode
// ---------------------------------------------------------------------------------------------

/// Everything of a record after `body`, borrowed, serialised by serde_json exactly as the
/// derived `Serialize` of [`BackupRecord`] would (same types, same order).
#[derive(Serialize)]
struct RecordTail<'a> {
    properties: &'a BackupProperties,
    headers: &'a [(String, BackupHeaderValue)],
    exchange: &'a str,
    routing_key: &'a str,
    delivery_tag: u64,
    redelivered: bool,
    backed_up_at: i64,
    source_queue: &'a str,
    source_vhost: &'a str,
}

/// Decimal text of each byte value followed by a comma, packed little-endian in a u32
/// (`"7,"` is `[b'7', b',', 0, 0]`), and its length in bytes.
static BYTE_TEXT: [(u32, u32); 256] = build_byte_text();

const fn build_byte_text() -> [(u32, u32); 256] {
    let mut t = [(0u32, 0u32); 256];
    let mut i = 0;
    while i < 256 {
        let mut bytes = [0u8; 4];
        let len;
        if i < 10 {
            bytes[0] = b'0' + i as u8;
            bytes[1] = b',';
            len = 2;
        } else if i < 100 {
            bytes[0] = b'0' + (i / 10) as u8;
            bytes[1] = b'0' + (i % 10) as u8;
            bytes[2] = b',';
            len = 3;
        } else {
            bytes[0] = b'0' + (i / 100) as u8;
            bytes[1] = b'0' + ((i / 10) % 10) as u8;
            bytes[2] = b'0' + (i % 10) as u8;
            bytes[3] = b',';
            len = 4;
        }
        t[i] = (u32::from_le_bytes(bytes), len);
        i += 1;
    }
    t
}

/// Appends the JSON of a body: `null` when empty, else `[b0,b1,...]`.
fn write_body(body: &[u8], out: &mut Vec<u8>) {
    if body.is_empty() {
        out.extend_from_slice(b"null");
        return;
    }
    let start = out.len();
    // '[' plus at most 4 bytes ("255,") per body byte; the last ',' becomes ']'.
    out.resize(start + 1 + body.len() * 4, 0);
    let buf = &mut out[start..];
    buf[0] = b'[';
    let mut pos = 1;
    for &b in body {
        let (text, len) = BYTE_TEXT[b as usize];
        buf[pos..pos + 4].copy_from_slice(&text.to_le_bytes());
        pos += len as usize;
    }
    buf[pos - 1] = b']';
    out.truncate(start + pos);
}

/// Appends the JSON of `rec` to `out` (the caller clears `out` if it wants only this record).
///
/// The bytes are identical to `serde_json::to_vec(rec)` (compact, SPEC.md key order); the body
/// array is written from a lookup table, the rest by serde_json. Runs at several hundred MB/s
/// of body on one core (see `examples/codec_bench.rs`).
pub fn encode_record(rec: &BackupRecord, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"body\":");
    write_body(&rec.body, out);
    let mark = out.len();
    let tail = RecordTail {
        properties: &rec.properties,
        headers: &rec.headers,
        exchange: &rec.exchange,
        routing_key: &rec.routing_key,
        delivery_tag: rec.delivery_tag,
        redelivered: rec.redelivered,
        backed_up_at: rec.backed_up_at,
        source_queue: &rec.source_queue,
        source_vhost: &rec.source_vhost,
    };
    // Writing to a Vec cannot fail and none of these types has a fallible Serialize, so this
    // error is unreachable; it is logged rather than unwrapped all the same.
    match serde_json::to_writer(&mut *out, &tail) {
        // The tail is a JSON object: its '{' becomes the ',' after the body.
        Ok(()) => {
            if let Some(b) = out.get_mut(mark) {
                *b = b',';
            }
        }
        Err(e) => log::error!("record encoding failed unexpectedly: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The hot path: decode
// ---------------------------------------------------------------------------------------------

/// Parses one record's JSON (as written by [`encode_record`] or any serde_json output of the same
/// shape: any whitespace, any key order).
///
/// The top-level `body` array is parsed here; the rest of the object, with the body replaced by
/// `null`, is parsed by serde_json. Anything unusual (escaped keys, duplicate `body`, invalid
/// numbers) falls back to plain `serde_json::from_slice`, so the accepted language and the
/// result are exactly serde_json's.
///
/// Errors: `Error::Serialization` with serde_json's message when the JSON is not a valid record.
pub fn decode_record(json: &[u8]) -> Result<BackupRecord> {
    if let Some((body, vstart, vend)) = locate_body(json) {
        let mut rest = Vec::with_capacity(json.len() - (vend - vstart) + 4);
        rest.extend_from_slice(&json[..vstart]);
        rest.extend_from_slice(b"null");
        rest.extend_from_slice(&json[vend..]);
        if let Ok(mut rec) = serde_json::from_slice::<BackupRecord>(&rest) {
            rec.body = body;
            return Ok(rec);
        }
    }
    serde_json::from_slice::<BackupRecord>(json)
        .map_err(|e| Error::Serialization(format!("Invalid backup record: {e}")))
}

#[inline]
fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\n' | b'\r' | b'\t')
}

#[inline]
fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && is_ws(s[i]) {
        i += 1;
    }
    i
}

/// Walks the top-level object and parses its `body` member. Returns the body and the span of its
/// value, or `None` when the fast path does not apply (the caller then uses serde_json alone).
fn locate_body(s: &[u8]) -> Option<(Vec<u8>, usize, usize)> {
    let mut i = skip_ws(s, 0);
    if *s.get(i)? != b'{' {
        return None;
    }
    i = skip_ws(s, i + 1);
    let mut found: Option<(Vec<u8>, usize, usize)> = None;
    loop {
        // Key: a string without escapes (anything else goes to serde_json).
        if *s.get(i)? != b'"' {
            return None;
        }
        let ks = i + 1;
        let mut ke = ks;
        loop {
            let c = *s.get(ke)?;
            if c == b'"' {
                break;
            }
            if c == b'\\' || c < 0x20 {
                return None;
            }
            ke += 1;
        }
        i = skip_ws(s, ke + 1);
        if *s.get(i)? != b':' {
            return None;
        }
        i = skip_ws(s, i + 1);
        if &s[ks..ke] == b"body" {
            if found.is_some() {
                return None; // duplicate key: serde_json reports it
            }
            let vstart = i;
            let (body, vend) = parse_body_value(s, i)?;
            found = Some((body, vstart, vend));
            i = vend;
        } else {
            i = skip_value(s, i)?;
        }
        i = skip_ws(s, i);
        match *s.get(i)? {
            b',' => i = skip_ws(s, i + 1),
            b'}' => {
                i += 1;
                break;
            }
            _ => return None,
        }
    }
    if skip_ws(s, i) != s.len() {
        return None;
    }
    found
}

/// Skips one JSON value starting at `i` (no whitespace before it). Validation is left to
/// serde_json; this only has to find the value's end correctly for well-formed input.
fn skip_value(s: &[u8], mut i: usize) -> Option<usize> {
    match *s.get(i)? {
        b'"' => skip_string(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match *s.get(i)? {
                    b'"' => {
                        i = skip_string(s, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let start = i;
            while i < s.len() && !matches!(s[i], b',' | b'}' | b']') && !is_ws(s[i]) {
                i += 1;
            }
            (i > start).then_some(i)
        }
    }
}

/// Skips the string starting at `s[i] == '"'`, returning the index after its closing quote.
fn skip_string(s: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match *s.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Index of the first `c` in `s` at or after `from`, 8 bytes at a time.
fn find_byte(s: &[u8], from: usize, c: u8) -> Option<usize> {
    let pattern = LO * u64::from(c);
    let mut i = from;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut arr = [0u8; 8];
        arr.copy_from_slice(chunk);
        let t = u64::from_le_bytes(arr) ^ pattern;
        // High bit exactly at the bytes equal to `c` (no carries between bytes).
        let eq = !(((t & !HI) + !HI) | t) & HI;
        if eq != 0 {
            return Some(i + (eq.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s.get(i..)?.iter().position(|&b| b == c).map(|k| i + k)
}

/// One element of a compact body array at `i`: a number 0..=255 in strict JSON syntax followed
/// by a separator byte. Returns the value, the separator's index and the separator, or `None`
/// when the bytes are not such an element (or fewer than 4 bytes remain).
#[inline(always)]
fn compact_element(s: &[u8], i: usize) -> Option<(u8, usize, u8)> {
    let w = s.get(i..i + 4)?;
    let d0 = w[0].wrapping_sub(b'0') as u32;
    let d1 = w[1].wrapping_sub(b'0') as u32;
    let d2 = w[2].wrapping_sub(b'0') as u32;
    // Digit count and value without branches: random bodies make the count unpredictable,
    // and a mispredicted branch per byte costs more than the arithmetic.
    let two = (d1 <= 9) as u32;
    let three = two & (d2 <= 9) as u32;
    let v2 = d0 * 10 + d1;
    let v3 = v2 * 10 + d2;
    let mut v = d0 ^ ((d0 ^ v2) & two.wrapping_neg());
    v ^= (v ^ v3) & three.wrapping_neg();
    let len = (1 + two + three) as usize;
    if (d0 > 9) | ((d0 == 0) & (two == 1)) | (v > 255) {
        return None;
    }
    Some((v as u8, i + len, w[len & 3]))
}

/// Parses a compact body array (`[1,22,255]`, no whitespace) whose first element starts at `a`.
/// Returns the bytes and the index after `]`, or `None` when the array is not in this form
/// (the general parser then decides).
///
/// Parsing one number depends on the previous number's length, a serial chain of a few cycles
/// per byte; the array is therefore split at a comma near its middle and both halves are parsed
/// in the same loop, two independent chains.
fn parse_compact(s: &[u8], a: usize) -> Option<(Vec<u8>, usize)> {
    let end = find_byte(s, a, b']')?;
    // Chain A: [a, split] where s[split] is a comma; chain B: (split, end].
    let split = if end - a >= 64 {
        find_byte(&s[..end], a + (end - a) / 2, b',')
    } else {
        None
    };
    let (mut ia, a_end, mut ib) = match split {
        Some(m) => (a, m, m + 1),
        None => (a, a, a), // chain A empty
    };
    // Every element takes at least two characters (a digit and a separator), which bounds each
    // chain's count; both write into one buffer, B after A's bound, then B is moved down.
    let cap_a = if split.is_some() {
        let chars_a = a_end + 1 - a;
        chars_a / 2 + 1
    } else {
        0
    };
    let cap_b = (end + 1 - ib) / 2 + 1;
    let mut buf = vec![0u8; cap_a + cap_b];
    let (da, db) = buf.split_at_mut(cap_a);
    let (mut ka, mut kb) = (0usize, 0usize);
    let mut b_done = false;
    // Both chains, interleaved.
    while ia < a_end && !b_done {
        let (va, sa, ca) = compact_element(s, ia)?;
        let (vb, sb, cb) = compact_element(s, ib)?;
        if ca != b',' || sa > a_end {
            return None;
        }
        *da.get_mut(ka)? = va;
        ka += 1;
        ia = sa + 1;
        *db.get_mut(kb)? = vb;
        kb += 1;
        ib = sb + 1;
        if cb != b',' {
            if cb != b']' || sb != end {
                return None;
            }
            b_done = true;
        }
    }
    while ia < a_end {
        let (va, sa, ca) = compact_element(s, ia)?;
        if ca != b',' || sa > a_end {
            return None;
        }
        *da.get_mut(ka)? = va;
        ka += 1;
        ia = sa + 1;
    }
    while !b_done {
        let (vb, sb, cb) = compact_element(s, ib)?;
        *db.get_mut(kb)? = vb;
        kb += 1;
        ib = sb + 1;
        if cb != b',' {
            if cb != b']' || sb != end {
                return None;
            }
            b_done = true;
        }
    }
    if ia != a_end + usize::from(split.is_some()) {
        return None;
    }
    buf.copy_within(cap_a..cap_a + kb, ka);
    buf.truncate(ka + kb);
    buf.shrink_to_fit();
    Some((buf, end + 1))
}

/// Parses the body value at `i`: `null`, or an array of JSON integers 0..=255 (strict JSON
/// number syntax: no leading zeros, signs, fractions or exponents, which serde_json would reject
/// for a u8 as well; any JSON whitespace). Returns the bytes and the index after the value.
fn parse_body_value(s: &[u8], i: usize) -> Option<(Vec<u8>, usize)> {
    if s[i..].starts_with(b"null") {
        return Some((Vec::new(), i + 4));
    }
    if *s.get(i)? != b'[' {
        return None;
    }
    if let Some(done) = parse_compact(s, i + 1) {
        return Some(done);
    }
    // General form: whitespace anywhere, one character at a time.
    let mut i = skip_ws(s, i + 1);
    let mut out = Vec::new();
    if *s.get(i)? == b']' {
        return Some((out, i + 1));
    }
    loop {
        let d0 = s.get(i)?.wrapping_sub(b'0') as u32;
        if d0 > 9 {
            return None;
        }
        let mut val = d0;
        let mut len = 1;
        while let Some(c) = s.get(i + len) {
            let d = c.wrapping_sub(b'0') as u32;
            if d > 9 {
                break;
            }
            if d0 == 0 || len == 3 {
                return None;
            }
            val = val * 10 + d;
            len += 1;
        }
        if val > 255 {
            return None;
        }
        out.push(val as u8);
        i = skip_ws(s, i + len);
        match *s.get(i)? {
            b',' => i = skip_ws(s, i + 1),
            b']' => return Some((out, i + 1)),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: small deterministic PRNG for generated cases.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, pct: u64) -> bool {
            self.below(100) < pct
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
        fn string(&mut self) -> String {
            const POOL: &[char] = &[
                'a',
                'Z',
                '0',
                ' ',
                '"',
                '\\',
                '/',
                '\u{0}',
                '\u{1}',
                '\u{8}',
                '\u{c}',
                '\n',
                '\r',
                '\t',
                '\u{1f}',
                '\u{7f}',
                '\u{80}',
                '\u{9f}',
                'é',
                'ß',
                '中',
                '文',
                '🎉',
                '\u{2028}',
                '\u{2029}',
                '\u{feff}',
                '\u{ffff}',
                '\u{10ffff}',
                '<',
                '>',
                '&',
                '\'',
                '%',
                '.',
                '{',
                '}',
                '[',
                ']',
                ',',
                ':',
            ];
            let len = match self.below(10) {
                0 => 0,
                1..=7 => self.below(12) as usize,
                _ => self.below(300) as usize,
            };
            (0..len)
                .map(|_| POOL[self.below(POOL.len() as u64) as usize])
                .collect()
        }
        fn opt_string(&mut self) -> Option<String> {
            if self.chance(40) {
                None
            } else {
                Some(self.string())
            }
        }
        fn f64_finite(&mut self) -> f64 {
            loop {
                let f = f64::from_bits(self.next());
                if f.is_finite() {
                    return f;
                }
            }
        }
        fn f32_finite(&mut self) -> f32 {
            loop {
                let f = f32::from_bits(self.next() as u32);
                if f.is_finite() {
                    return f;
                }
            }
        }
        fn header_value(&mut self, depth: u32) -> BackupHeaderValue {
            let kinds = if depth >= 3 { 19 } else { 21 };
            match self.below(kinds) {
                0 => BackupHeaderValue::LongString(self.string()),
                1 => {
                    let n = 1 + self.below(20) as usize;
                    let mut b = self.bytes(n);
                    b[0] = 0xff; // never valid UTF-8
                    BackupHeaderValue::LongStringBytes(b)
                }
                2 => BackupHeaderValue::ShortString(self.string()),
                3 => BackupHeaderValue::Long(self.next() as i64),
                4 => BackupHeaderValue::Short(self.next() as i16),
                5 => BackupHeaderValue::ShortShortInt(self.next() as i8),
                6 => BackupHeaderValue::ShortShortUInt(self.next() as u8),
                7 => BackupHeaderValue::ShortInt(self.next() as i16),
                8 => BackupHeaderValue::ShortUInt(self.next() as u16),
                9 => BackupHeaderValue::LongInt(self.next() as i32),
                10 => BackupHeaderValue::LongUInt(self.next() as u32),
                11 => BackupHeaderValue::LongLongInt(self.next() as i64),
                12 => BackupHeaderValue::Bool(self.chance(50)),
                13 => {
                    let n = self.below(40) as usize;
                    BackupHeaderValue::Bytes(self.bytes(n))
                }
                14 => BackupHeaderValue::Timestamp(self.next()),
                15 => BackupHeaderValue::Float(self.f32_finite()),
                16 => BackupHeaderValue::Double(self.f64_finite()),
                17 => BackupHeaderValue::Decimal {
                    scale: self.next() as u8,
                    value: self.next() as u32,
                },
                18 => BackupHeaderValue::Void,
                19 => BackupHeaderValue::Table(self.table(depth + 1)),
                _ => {
                    let n = self.below(5) as usize;
                    BackupHeaderValue::Array((0..n).map(|_| self.header_value(depth + 1)).collect())
                }
            }
        }
        fn table(&mut self, depth: u32) -> HeaderTable {
            let n = self.below(if depth == 0 { 25 } else { 5 }) as usize;
            (0..n)
                .map(|_| (self.string(), self.header_value(depth)))
                .collect()
        }
        fn record(&mut self) -> BackupRecord {
            let body_len = match self.below(10) {
                0 => 0,
                1 => 1,
                2..=7 => self.below(300) as usize,
                8 => self.below(5000) as usize,
                _ => 65536,
            };
            BackupRecord {
                body: self.bytes(body_len),
                properties: BackupProperties {
                    content_type: self.opt_string(),
                    content_encoding: self.opt_string(),
                    delivery_mode: self.chance(50).then(|| self.next() as u8),
                    priority: self.chance(50).then(|| self.next() as u8),
                    correlation_id: self.opt_string(),
                    reply_to: self.opt_string(),
                    expiration: self.opt_string(),
                    message_id: self.opt_string(),
                    timestamp: self.chance(50).then(|| self.next() as i64),
                    type_field: self.opt_string(),
                    user_id: self.opt_string(),
                    app_id: self.opt_string(),
                    cluster_id: self.opt_string(),
                },
                headers: self.table(0),
                exchange: self.string(),
                routing_key: self.string(),
                delivery_tag: self.next(),
                redelivered: self.chance(50),
                backed_up_at: self.next() as i64,
                source_queue: self.string(),
                source_vhost: self.string(),
            }
        }
    }

    fn encode(rec: &BackupRecord) -> Vec<u8> {
        let mut out = Vec::new();
        encode_record(rec, &mut out);
        out
    }

    fn sample_record() -> BackupRecord {
        BackupRecord {
            body: b"hi".to_vec(),
            properties: BackupProperties {
                content_type: Some("text/plain".into()),
                delivery_mode: Some(2),
                timestamp: Some(1_700_000_000),
                type_field: Some("t".into()),
                ..Default::default()
            },
            headers: vec![
                ("x-count".into(), BackupHeaderValue::LongInt(3)),
                ("flag".into(), BackupHeaderValue::Void),
                (
                    "d".into(),
                    BackupHeaderValue::Decimal {
                        scale: 2,
                        value: 314,
                    },
                ),
            ],
            exchange: "ex".into(),
            routing_key: "rk".into(),
            delivery_tag: 1,
            redelivered: false,
            backed_up_at: 1_700_000_000_000,
            source_queue: "q".into(),
            source_vhost: "/".into(),
        }
    }

    #[test]
    fn json_shape_is_exactly_spec() {
        let json = String::from_utf8(encode(&sample_record())).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"body":[104,105],"properties":{"content_type":"text/plain","#,
                r#""content_encoding":null,"delivery_mode":2,"priority":null,"#,
                r#""correlation_id":null,"reply_to":null,"expiration":null,"message_id":null,"#,
                r#""timestamp":1700000000,"type_field":"t","user_id":null,"app_id":null,"#,
                r#""cluster_id":null},"headers":[["x-count",{"LongInt":3}],["flag","Void"],"#,
                r#"["d",{"Decimal":{"scale":2,"value":314}}]],"exchange":"ex","routing_key":"rk","#,
                r#""delivery_tag":1,"redelivered":false,"backed_up_at":1700000000000,"#,
                r#""source_queue":"q","source_vhost":"/"}"#
            )
        );
        let mut empty = sample_record();
        empty.body.clear();
        let json = String::from_utf8(encode(&empty)).unwrap();
        assert!(json.starts_with(r#"{"body":null,"properties":"#), "{json}");
        assert_eq!(decode_record(json.as_bytes()).unwrap(), empty);
    }

    #[test]
    fn every_variant_json_form() {
        let cases: Vec<(BackupHeaderValue, &str)> = vec![
            (
                BackupHeaderValue::LongString("a".into()),
                r#"{"LongString":"a"}"#,
            ),
            (
                BackupHeaderValue::LongStringBytes(vec![255, 0]),
                r#"{"LongStringBytes":[255,0]}"#,
            ),
            (
                BackupHeaderValue::ShortString("s".into()),
                r#"{"ShortString":"s"}"#,
            ),
            (BackupHeaderValue::Long(-1), r#"{"Long":-1}"#),
            (BackupHeaderValue::Short(-2), r#"{"Short":-2}"#),
            (
                BackupHeaderValue::ShortShortInt(-3),
                r#"{"ShortShortInt":-3}"#,
            ),
            (
                BackupHeaderValue::ShortShortUInt(250),
                r#"{"ShortShortUInt":250}"#,
            ),
            (BackupHeaderValue::ShortInt(-4), r#"{"ShortInt":-4}"#),
            (
                BackupHeaderValue::ShortUInt(65535),
                r#"{"ShortUInt":65535}"#,
            ),
            (BackupHeaderValue::LongInt(-5), r#"{"LongInt":-5}"#),
            (
                BackupHeaderValue::LongUInt(4294967295),
                r#"{"LongUInt":4294967295}"#,
            ),
            (
                BackupHeaderValue::LongLongInt(i64::MIN),
                r#"{"LongLongInt":-9223372036854775808}"#,
            ),
            (BackupHeaderValue::Bool(true), r#"{"Bool":true}"#),
            (BackupHeaderValue::Bytes(vec![]), r#"{"Bytes":[]}"#),
            (
                BackupHeaderValue::Timestamp(u64::MAX),
                r#"{"Timestamp":18446744073709551615}"#,
            ),
            (BackupHeaderValue::Float(1.5), r#"{"Float":1.5}"#),
            (BackupHeaderValue::Double(-0.25), r#"{"Double":-0.25}"#),
            (
                BackupHeaderValue::Decimal { scale: 1, value: 7 },
                r#"{"Decimal":{"scale":1,"value":7}}"#,
            ),
            (BackupHeaderValue::Void, r#""Void""#),
            (
                BackupHeaderValue::Table(vec![("k".into(), BackupHeaderValue::Void)]),
                r#"{"Table":[["k","Void"]]}"#,
            ),
            (
                BackupHeaderValue::Array(vec![BackupHeaderValue::Bool(false)]),
                r#"{"Array":[{"Bool":false}]}"#,
            ),
        ];
        for (v, expected) in cases {
            assert_eq!(serde_json::to_string(&v).unwrap(), expected);
            let back: BackupHeaderValue = serde_json::from_str(expected).unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn non_finite_floats_round_trip() {
        for (f, text) in [
            (f64::NAN, r#"{"Double":"NaN"}"#),
            (f64::INFINITY, r#"{"Double":"Infinity"}"#),
            (f64::NEG_INFINITY, r#"{"Double":"-Infinity"}"#),
        ] {
            let v = BackupHeaderValue::Double(f);
            assert_eq!(serde_json::to_string(&v).unwrap(), text);
            let BackupHeaderValue::Double(back) = serde_json::from_str(text).unwrap() else {
                panic!("wrong variant");
            };
            assert_eq!(back.is_nan(), f.is_nan());
            if !f.is_nan() {
                assert_eq!(back, f);
            }
            let v32 = BackupHeaderValue::Float(f as f32);
            let t32 = serde_json::to_string(&v32).unwrap();
            let BackupHeaderValue::Float(b32) = serde_json::from_str(&t32).unwrap() else {
                panic!("wrong variant");
            };
            assert_eq!(b32.is_nan(), f.is_nan());
            if !f.is_nan() {
                assert_eq!(b32, f as f32);
            }
        }
        // Written by a tool that let serde_json turn NaN into null.
        let v: BackupHeaderValue = serde_json::from_str(r#"{"Double":null}"#).unwrap();
        assert!(matches!(v, BackupHeaderValue::Double(f) if f.is_nan()));
        let v: BackupHeaderValue = serde_json::from_str(r#"{"Float":3}"#).unwrap();
        assert_eq!(v, BackupHeaderValue::Float(3.0));
        assert!(serde_json::from_str::<BackupHeaderValue>(r#"{"Double":"nan"}"#).is_err());
    }

    #[test]
    fn floats_are_bit_exact() {
        let mut rng = Rng(7);
        for _ in 0..20_000 {
            let d = rng.f64_finite();
            let f = rng.f32_finite();
            let vals = vec![
                ("d".to_string(), BackupHeaderValue::Double(d)),
                ("f".to_string(), BackupHeaderValue::Float(f)),
            ];
            let text = serde_json::to_vec(&vals).unwrap();
            let back: HeaderTable = serde_json::from_slice(&text).unwrap();
            match (&back[0].1, &back[1].1) {
                (BackupHeaderValue::Double(d2), BackupHeaderValue::Float(f2)) => {
                    assert_eq!(
                        d2.to_bits(),
                        d.to_bits(),
                        "double {d:e}: needs serde_json's float_roundtrip feature"
                    );
                    assert_eq!(f2.to_bits(), f.to_bits(), "float {f:e}");
                }
                other => panic!("wrong variants {other:?}"),
            }
        }
    }

    #[test]
    fn encode_is_identical_to_serde_json_and_decodes_back() {
        let mut rng = Rng(0xC0DEC);
        let mut buf = Vec::new();
        for n in 0..1500 {
            let rec = rng.record();
            buf.clear();
            encode_record(&rec, &mut buf);
            let reference = serde_json::to_vec(&rec).unwrap();
            assert!(buf == reference, "record {n} differs from serde_json");
            let back = decode_record(&buf).unwrap();
            assert_eq!(back, rec, "record {n}");
            // The generic derived path agrees too.
            assert_eq!(serde_json::from_slice::<BackupRecord>(&buf).unwrap(), rec);
        }
    }

    #[test]
    fn encode_appends_to_existing_buffer() {
        let rec = sample_record();
        let mut out = b"prefix".to_vec();
        encode_record(&rec, &mut out);
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(&out[6..], &serde_json::to_vec(&rec).unwrap()[..]);
    }

    #[test]
    fn every_byte_value_encodes_and_decodes() {
        let mut rec = sample_record();
        rec.body = (0..=255u8).chain((0..=255u8).rev()).collect();
        let json = encode(&rec);
        assert_eq!(json, serde_json::to_vec(&rec).unwrap());
        assert_eq!(decode_record(&json).unwrap(), rec);
        // Bodies whose last numbers fall in the slow tail path.
        for len in 1..8 {
            for v in [0u8, 9, 10, 99, 100, 255] {
                rec.body = vec![v; len];
                let json = encode(&rec);
                assert_eq!(decode_record(&json).unwrap(), rec);
            }
        }
    }

    /// Moves `"body":...` from the front of compact output to the end.
    fn body_last(json: &[u8]) -> Vec<u8> {
        let s = std::str::from_utf8(json).unwrap();
        let after = s.find(",\"properties\"").unwrap();
        let body = &s[1..after];
        format!("{{{},{}}}", &s[after + 1..s.len() - 1], body).into_bytes()
    }

    #[test]
    fn decode_accepts_other_layouts() {
        let mut rng = Rng(42);
        for n in 0..300 {
            let rec = rng.record();
            let compact = serde_json::to_vec(&rec).unwrap();
            let pretty = serde_json::to_vec_pretty(&rec).unwrap();
            assert_eq!(decode_record(&pretty).unwrap(), rec, "pretty {n}");
            // serde_json::Value sorts keys: body comes second.
            let value: serde_json::Value = serde_json::from_slice(&compact).unwrap();
            let sorted = serde_json::to_vec(&value).unwrap();
            assert_eq!(decode_record(&sorted).unwrap(), rec, "sorted {n}");
            let last = body_last(&compact);
            assert_eq!(decode_record(&last).unwrap(), rec, "body last {n}");
        }
        let spaced = b" \n{ \"body\" :\t[ 1 ,2,\r\n 255 ] , \"properties\":{},\"headers\":[],\"exchange\":\"\",\"routing_key\":\"\",\"delivery_tag\":0,\"redelivered\":true,\"backed_up_at\":-5,\"source_queue\":\"q\",\"source_vhost\":\"v\"}\n ";
        let rec = decode_record(spaced).unwrap();
        assert_eq!(rec.body, vec![1, 2, 255]);
        assert_eq!(rec.properties, BackupProperties::default());
        assert_eq!(rec.backed_up_at, -5);
        let empty_array = b"{\"body\":[],\"properties\":{},\"headers\":[],\"exchange\":\"\",\"routing_key\":\"\",\"delivery_tag\":0,\"redelivered\":true,\"backed_up_at\":0,\"source_queue\":\"q\",\"source_vhost\":\"v\"}";
        assert!(decode_record(empty_array).unwrap().body.is_empty());
    }

    #[test]
    fn decode_rejects_what_serde_json_rejects() {
        let base = serde_json::to_string(&sample_record()).unwrap();
        let bodies = [
            "[256]",
            "[01]",
            "[-0]",
            "[-1]",
            "[1.0]",
            "[1e2]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[1",
            "[1000]",
            "[2550]",
            "[ 7 ]",
            "[0,0,0]",
            "nul",
            "true",
            "\"ab\"",
            "[1]x",
            "{}",
            "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,300]",
            "[00]",
            "[0]",
        ];
        for body in bodies {
            let json = base.replacen("[104,105]", body, 1);
            let ours = decode_record(json.as_bytes());
            let reference = serde_json::from_str::<BackupRecord>(&json);
            assert_eq!(
                ours.is_ok(),
                reference.is_ok(),
                "body {body}: ours {ours:?} vs serde_json {reference:?}"
            );
            if let (Ok(a), Ok(b)) = (&ours, &reference) {
                assert_eq!(a, b);
            }
            if let Err(e) = ours {
                assert!(matches!(e, Error::Serialization(_)), "{e:?}");
                assert!(e
                    .to_string()
                    .starts_with("Serialization error: Invalid backup record: "));
            }
        }
        let dup = base.replacen("\"properties\"", "\"body\":[1],\"properties\"", 1);
        assert!(decode_record(dup.as_bytes()).is_err());
        for bad in [
            "",
            "{",
            "[]",
            "null",
            "{\"body\":null}",
            &base[..base.len() - 1],
        ] {
            assert!(decode_record(bad.as_bytes()).is_err(), "{bad}");
        }
        let trailing = format!("{base} x");
        assert!(decode_record(trailing.as_bytes()).is_err());
        // A key spelled with an escape still works through the fallback.
        let escaped = base.replacen("\"body\"", "\"b\\u006fdy\"", 1);
        assert_eq!(decode_record(escaped.as_bytes()).unwrap(), sample_record());
    }

    /// Differential test: mutate the body text of valid records (digits, separators, signs,
    /// whitespace, brackets) and check that decode_record accepts exactly what serde_json
    /// accepts, with the same result. Long bodies exercise both halves of the split parser.
    #[test]
    fn mutated_bodies_agree_with_serde_json() {
        const ALPHABET: &[u8] = b"0123456789012345678901234567890123456789,,,,,, \n\t]-.e[\"x";
        let mut rng = Rng(0xF022);
        let mut accepted = 0;
        for n in 0..4000 {
            let mut rec = sample_record();
            let len = match n % 4 {
                0 => rng.below(8) as usize,
                1 => 20 + rng.below(40) as usize,
                _ => 100 + rng.below(400) as usize,
            };
            rec.body = rng.bytes(len);
            let mut json = encode(&rec);
            let body_end = json.iter().position(|&c| c == b']').unwrap_or(12);
            let mutations = 1 + rng.below(3);
            for _ in 0..mutations {
                let pos = 8 + rng.below((body_end - 8 + 2) as u64) as usize;
                let c = ALPHABET[rng.below(ALPHABET.len() as u64) as usize];
                match rng.below(3) {
                    0 => json[pos] = c,
                    1 => json.insert(pos, c),
                    _ => {
                        json.remove(pos);
                    }
                }
            }
            let ours = decode_record(&json);
            let reference = serde_json::from_slice::<BackupRecord>(&json);
            match (&ours, &reference) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "case {n}: {}", String::from_utf8_lossy(&json));
                    accepted += 1;
                }
                (Err(_), Err(_)) => {}
                _ => panic!(
                    "case {n}: ours {:?} vs serde_json {:?} for {}",
                    ours.is_ok(),
                    reference.is_ok(),
                    String::from_utf8_lossy(&json)
                ),
            }
        }
        assert!(
            accepted > 200,
            "mutations should leave some valid records: {accepted}"
        );
    }

    #[test]
    fn long_bodies_with_whitespace_or_errors_in_either_half() {
        let mut rec = sample_record();
        rec.body = (0..400u32).map(|i| (i * 37 % 256) as u8).collect();
        let compact = String::from_utf8(encode(&rec)).unwrap();
        let items: Vec<String> = rec.body.iter().map(|b| b.to_string()).collect();
        for at in [0usize, 1, 150, 199, 200, 201, 350, 399] {
            // Whitespace at one place in the array: valid, general path.
            let mut spaced = items.clone();
            spaced[at] = format!(" {}\n", spaced[at]);
            let json = compact.replacen(&items.join(","), &spaced.join(","), 1);
            assert_eq!(
                decode_record(json.as_bytes()).unwrap(),
                rec,
                "space at {at}"
            );
            // Invalid numbers at one place: rejected, as serde_json does.
            for bad in ["256", "01", "-1", "1.5", "", "1e1", "999", "2555"] {
                let mut broken = items.clone();
                broken[at] = bad.to_string();
                let json = compact.replacen(&items.join(","), &broken.join(","), 1);
                assert!(decode_record(json.as_bytes()).is_err(), "{bad} at {at}");
                assert!(serde_json::from_str::<BackupRecord>(&json).is_err());
            }
        }
    }

    fn delivery_with(headers: Option<FieldTable>, body: Vec<u8>) -> Delivery {
        Delivery {
            delivery_tag: 9,
            redelivered: true,
            exchange: "amq.topic".into(),
            routing_key: "a.b".into(),
            properties: BasicProperties {
                content_type: Some("application/json".into()),
                content_encoding: Some("gzip".into()),
                headers,
                delivery_mode: Some(2),
                priority: Some(7),
                correlation_id: Some("c".into()),
                reply_to: Some("r".into()),
                expiration: Some("60000".into()),
                message_id: Some("m".into()),
                timestamp: Some(u64::MAX - 1),
                kind: Some("k".into()),
                user_id: Some("guest".into()),
                app_id: Some("app".into()),
                cluster_id: Some("cl".into()),
            },
            body,
        }
    }

    fn all_wire_values() -> FieldTable {
        vec![
            ("t".into(), FieldValue::Bool(true)),
            ("b".into(), FieldValue::I8(-8)),
            ("B".into(), FieldValue::U8(200)),
            ("s".into(), FieldValue::I16(-16)),
            ("u".into(), FieldValue::U16(60000)),
            ("I".into(), FieldValue::I32(-32)),
            ("i".into(), FieldValue::U32(4_000_000_000)),
            ("l".into(), FieldValue::I64(-64)),
            ("f".into(), FieldValue::F32(1.25)),
            ("d".into(), FieldValue::F64(-2.5e300)),
            (
                "D".into(),
                FieldValue::Decimal {
                    scale: 3,
                    value: 12345,
                },
            ),
            ("S".into(), FieldValue::LongString(b"caf\xc3\xa9".to_vec())),
            ("S-bin".into(), FieldValue::LongString(vec![0xff, 0xfe, 0])),
            (
                "A".into(),
                FieldValue::Array(vec![FieldValue::Void, FieldValue::I32(1)]),
            ),
            ("T".into(), FieldValue::Timestamp(1_700_000_000)),
            (
                "F".into(),
                FieldValue::Table(vec![(
                    "inner".into(),
                    FieldValue::Table(vec![("x".into(), FieldValue::Bytes(vec![1, 2]))]),
                )]),
            ),
            ("V".into(), FieldValue::Void),
            ("x".into(), FieldValue::Bytes(vec![0, 255])),
        ]
    }

    #[test]
    fn wire_to_record_keeps_types_and_back() {
        let table = all_wire_values();
        let body = vec![1u8, 2, 3];
        let body_ptr = body.as_ptr();
        let d = delivery_with(Some(table.clone()), body);
        let original_props = d.properties.clone();
        let rec = BackupRecord::from_delivery(d, "q1", "/", 123);
        assert_eq!(rec.body.as_ptr(), body_ptr, "body moved, not copied");
        assert_eq!(rec.body(), &[1, 2, 3]);
        assert_eq!(rec.source_queue, "q1");
        assert_eq!(rec.source_vhost, "/");
        assert_eq!(rec.backed_up_at, 123);
        assert_eq!(rec.delivery_tag, 9);
        assert!(rec.redelivered);
        assert_eq!(rec.exchange, "amq.topic");
        assert_eq!(rec.routing_key, "a.b");
        assert_eq!(rec.properties.type_field.as_deref(), Some("k"));
        assert_eq!(rec.properties.timestamp, Some((u64::MAX - 1) as i64));
        let kinds: Vec<&str> = rec
            .headers
            .iter()
            .map(|(_, v)| match v {
                BackupHeaderValue::Bool(_) => "Bool",
                BackupHeaderValue::ShortShortInt(_) => "ShortShortInt",
                BackupHeaderValue::ShortShortUInt(_) => "ShortShortUInt",
                BackupHeaderValue::ShortInt(_) => "ShortInt",
                BackupHeaderValue::ShortUInt(_) => "ShortUInt",
                BackupHeaderValue::LongInt(_) => "LongInt",
                BackupHeaderValue::LongUInt(_) => "LongUInt",
                BackupHeaderValue::LongLongInt(_) => "LongLongInt",
                BackupHeaderValue::Float(_) => "Float",
                BackupHeaderValue::Double(_) => "Double",
                BackupHeaderValue::Decimal { .. } => "Decimal",
                BackupHeaderValue::LongString(_) => "LongString",
                BackupHeaderValue::LongStringBytes(_) => "LongStringBytes",
                BackupHeaderValue::Array(_) => "Array",
                BackupHeaderValue::Timestamp(_) => "Timestamp",
                BackupHeaderValue::Table(_) => "Table",
                BackupHeaderValue::Void => "Void",
                BackupHeaderValue::Bytes(_) => "Bytes",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "Bool",
                "ShortShortInt",
                "ShortShortUInt",
                "ShortInt",
                "ShortUInt",
                "LongInt",
                "LongUInt",
                "LongLongInt",
                "Float",
                "Double",
                "Decimal",
                "LongString",
                "LongStringBytes",
                "Array",
                "Timestamp",
                "Table",
                "Void",
                "Bytes"
            ]
        );
        assert_eq!(
            rec.headers[11].1,
            BackupHeaderValue::LongString("café".into())
        );
        // Back to the wire: identical properties, through JSON too.
        assert_eq!(rec.to_amqp(), original_props);
        let decoded = decode_record(&encode(&rec)).unwrap();
        assert_eq!(decoded.to_amqp(), original_props);
        let (props, body) = decoded.into_amqp();
        assert_eq!(props, original_props);
        assert_eq!(body, vec![1, 2, 3]);
    }

    #[test]
    fn other_tool_variants_map_to_wire() {
        let cases = [
            (
                BackupHeaderValue::ShortString("s".into()),
                FieldValue::LongString(b"s".to_vec()),
            ),
            (BackupHeaderValue::Long(5), FieldValue::I64(5)),
            (BackupHeaderValue::Short(-5), FieldValue::I16(-5)),
        ];
        for (v, wire) in cases {
            assert_eq!(v.to_field_value(), wire);
            assert_eq!(FieldValue::from(v), wire);
        }
    }

    #[test]
    fn absent_and_empty_headers_restore_as_absent() {
        for headers in [None, Some(Vec::new())] {
            let d = delivery_with(headers, Vec::new());
            let rec = BackupRecord::from_delivery(d, "q", "v", 0);
            assert!(rec.headers.is_empty());
            assert!(rec.body.is_empty());
            assert_eq!(rec.to_amqp().headers, None);
        }
        let p = BasicProperties {
            headers: Some(vec![("a".into(), FieldValue::Void)]),
            ..Default::default()
        };
        let d = Delivery {
            delivery_tag: 1,
            redelivered: false,
            exchange: String::new(),
            routing_key: String::new(),
            properties: p.clone(),
            body: vec![],
        };
        let rec = BackupRecord::from_delivery(d, "q", "v", 0);
        let json = encode(&rec);
        assert!(json.starts_with(b"{\"body\":null,"));
        assert_eq!(decode_record(&json).unwrap().to_amqp(), p);
    }
}
