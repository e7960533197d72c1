//! Wire-level AMQP 0-9-1 value types shared by the client and the record conversions.
//!
//! Field values follow RabbitMQ's field-table type codes (the "0-9-1 errata" flavour that
//! RabbitMQ implements, see <https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3>),
//! one variant per type code so that a value read from the wire is written back with the
//! same code:
//!
//! | code | variant | | code | variant |
//! |---|---|---|---|---|
//! | `t` | `Bool` | | `l` | `I64` |
//! | `b` | `I8` | | `f` | `F32` |
//! | `B` | `U8` | | `d` | `F64` |
//! | `s` | `I16` | | `D` | `Decimal` |
//! | `u` | `U16` | | `S` | `LongString` (raw bytes, not necessarily UTF-8) |
//! | `I` | `I32` | | `A` | `Array` |
//! | `i` | `U32` | | `T` | `Timestamp` (seconds) |
//! | `F` | `Table` | | `V` | `Void` |
//! | `x` | `Bytes` | | | |

/// One field value with its exact AMQP type.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
    F64(f64),
    /// `value` / 10^`scale`.
    Decimal {
        scale: u8,
        value: u32,
    },
    /// Long string: raw bytes as on the wire (may be invalid UTF-8).
    LongString(Vec<u8>),
    Array(Vec<FieldValue>),
    /// AMQP timestamp: seconds since the epoch.
    Timestamp(u64),
    Table(FieldTable),
    Void,
    /// Byte array (`x`).
    Bytes(Vec<u8>),
}

/// A field table in wire order. Keys are short strings (UTF-8, at most 255 bytes).
pub type FieldTable = Vec<(String, FieldValue)>;

/// The 14 basic-class content properties (AMQP 0-9-1 `basic` class), each optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BasicProperties {
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    pub headers: Option<FieldTable>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<String>,
    pub reply_to: Option<String>,
    pub expiration: Option<String>,
    pub message_id: Option<String>,
    /// Seconds since the epoch.
    pub timestamp: Option<u64>,
    /// The AMQP `type` property.
    pub kind: Option<String>,
    pub user_id: Option<String>,
    pub app_id: Option<String>,
    pub cluster_id: Option<String>,
}

/// A message received by `basic.deliver` (consume) or `basic.get-ok` (get).
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Channel-scoped delivery tag, used to ack/nack/reject.
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub exchange: String,
    pub routing_key: String,
    /// The properties, decoded; empty when `wire` holds them.
    pub properties: BasicProperties,
    /// The properties as the broker sent them, when the channel keeps them so
    /// (`Channel::keep_wire_properties`); then `properties` is empty.
    pub wire: Option<WireProperties>,
    pub body: Vec<u8>,
}

/// A message's basic-class property flags and property list exactly as the broker sent them
/// in its content header frame (AMQP 0-9-1 section 4.2.6.1), checked to decode
/// (`crate::broker::amqp::codec` implements it: `new`, `decode`, `header`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireProperties(pub(in crate::broker::amqp) Vec<u8>);
