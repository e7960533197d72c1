//! Backup records: one captured message as stored in a segment (SPEC.md "Segment file (RBAK
//! format)", BackupRecord / BackupProperties / BackupHeaderValue), its conversions to and from
//! the AMQP wire types of [`crate::broker::amqp::types`], and the fast JSON codec of the hot path
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
//! array itself from a lookup table and the other fields without serde (`write.rs`); [`decode_record`] parses the body array itself, and the
//! rest itself when it is in that compact form (else `serde_json` parses it). The derived serde implementations on the types below
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

mod binary;
mod body;
mod codec;
mod json;
mod meta;
mod tail;
#[cfg(test)]
mod tests;
mod write;

pub use codec::{check_version_1, decode_record, encode_record};
pub use meta::{decode_meta, encode_meta, encode_meta_v3};

use serde::{Deserialize, Serialize};

use json::{de_body, f32_json, f64_json, ser_body};

use crate::broker::amqp::types::{
    BasicProperties, Delivery, FieldTable, FieldValue, WireProperties,
};

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
    /// What `body` holds when it is not a 0-9-1 message body (segment format version 2 only;
    /// docs/segment-format.md "Record kinds"): absent (`None`, the key not written) for every
    /// 0-9-1 record, so those encode to the same bytes as before the key existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_format: Option<MessageFormat>,
    /// The properties and headers as the broker sent them (an AMQP 0-9-1 content header's
    /// property flags and list), as a backup's 0-9-1 reader keeps them: `properties` and
    /// `headers` are then empty. The encoders write from these bytes (version 3 stores them
    /// as they are, [`encode_meta_v3`]; versions 1 and 2 write the JSON of the decoded
    /// record from them). Not a JSON field:
    /// every record read from a segment has `None`.
    #[serde(skip)]
    pub wire: Option<WireProperties>,
}

/// The kind of message a record's `body` holds, where it is not a 0-9-1 body (the JSON key
/// `message_format`, written last and only in segment format version 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageFormat {
    /// JSON `"amqp-1.0"`: `body` is an AMQP 1.0 message as its publisher sent it, the bare
    /// message's sections (properties .. footer) byte for byte, with a header section only
    /// when the publisher set one (without the broker's `delivery-count` and
    /// `first-acquirer`); the broker's delivery and routing annotations are not kept (the
    /// routing ones are the record's `exchange` / `routing_key`). `properties` and `headers`
    /// stay empty.
    #[serde(rename = "amqp-1.0")]
    Amqp10,
}

impl MessageFormat {
    /// The JSON spelling (`"amqp-1.0"`).
    pub fn as_str(self) -> &'static str {
        match self {
            MessageFormat::Amqp10 => "amqp-1.0",
        }
    }
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
            wire,
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
            message_format: None,
            wire,
        }
    }

    /// Tests: the record with its properties and headers decoded from [`BackupRecord::wire`]
    /// (as [`BackupRecord::from_delivery`] would have made them), the record every encoding
    /// must write the same as; the record as it is when it has no such bytes.
    #[cfg(test)]
    pub fn decode_wire(mut self) -> crate::error::Result<BackupRecord> {
        if let Some(w) = self.wire.take() {
            (self.properties, self.headers) = split_properties(w.decode()?);
        }
        Ok(self)
    }

    /// Builds an AMQP 1.0 record (`message_format` `amqp-1.0`) from a delivery split by
    /// `crate::broker::amqp10::message::split`: `body` the message its publisher sent, the
    /// routing annotations as `exchange` / `routing_key`, `delivery_tag` the read position
    /// (`position`, from 1), `redelivered` when the broker does not say this is the message's
    /// first acquirer; `properties` and `headers` empty. `backed_up_at` is epoch milliseconds.
    pub fn from_amqp10(
        split: crate::broker::amqp10::message::Split,
        position: u64,
        source_queue: &str,
        source_vhost: &str,
        backed_up_at: i64,
    ) -> BackupRecord {
        BackupRecord {
            body: split.message,
            properties: BackupProperties::default(),
            headers: Vec::new(),
            exchange: split.exchange,
            routing_key: split.routing_key,
            delivery_tag: position,
            redelivered: !split.first_acquirer,
            backed_up_at,
            source_queue: source_queue.to_string(),
            source_vhost: source_vhost.to_string(),
            message_format: Some(MessageFormat::Amqp10),
            wire: None,
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
