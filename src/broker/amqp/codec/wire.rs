//! A message's properties kept as the broker sent them: the basic-class property flags and
//! property list of a content header frame (AMQP 0-9-1 section 4.2.6.1, the bytes after
//! class-id, weight and body-size), checked by the rules of [`decode_properties`] without
//! building a value, and read through a borrowed view ([`WireFields`], [`WireTable`],
//! [`WireValue`]) that allocates nothing: a reader that stores them pays no allocation per
//! property or header (segment format version 3 stores the bytes as they are, versions 1
//! and 2 write the record's JSON from the view: docs/segment-format.md).

use super::*;
use crate::broker::amqp::types::{BasicProperties, WireProperties};
use crate::error::Result;

/// The properties of checked bytes, borrowed: each short string as `&str`, the header table
/// as a [`WireTable`]. Shaped as [`BasicProperties`].
#[derive(Debug, Clone, Default)]
pub struct WireFields<'a> {
    pub content_type: Option<&'a str>,
    pub content_encoding: Option<&'a str>,
    pub headers: Option<WireTable<'a>>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<&'a str>,
    pub reply_to: Option<&'a str>,
    pub expiration: Option<&'a str>,
    pub message_id: Option<&'a str>,
    /// Seconds since the epoch.
    pub timestamp: Option<u64>,
    /// The AMQP `type` property.
    pub kind: Option<&'a str>,
    pub user_id: Option<&'a str>,
    pub app_id: Option<&'a str>,
    pub cluster_id: Option<&'a str>,
}

/// A field table's entries, borrowed, in wire order: `(key, value)` each, or the error that
/// ends them (`Error::Amqp` as `Decoder::table`).
#[derive(Debug, Clone)]
pub struct WireTable<'a> {
    d: Decoder<'a>,
    depth: usize,
}

/// A field array's values, borrowed, in wire order.
#[derive(Debug, Clone)]
pub struct WireArray<'a> {
    d: Decoder<'a>,
    depth: usize,
}

/// One field value, borrowed, with its exact AMQP type (the variants of [`FieldValue`]).
#[derive(Debug, Clone)]
pub enum WireValue<'a> {
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
    Decimal {
        scale: u8,
        value: u32,
    },
    /// Raw bytes as on the wire (may be invalid UTF-8).
    LongString(&'a [u8]),
    Array(WireArray<'a>),
    Timestamp(u64),
    Table(WireTable<'a>),
    Void,
    Bytes(&'a [u8]),
}

fn nested(depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(malformed(format_args!(
            "field tables/arrays nested deeper than {MAX_NESTING}"
        )));
    }
    Ok(())
}

fn short<'a>(d: &mut Decoder<'a>, what: &str) -> Result<&'a str> {
    let b = d.short_bytes(what)?;
    std::str::from_utf8(b).map_err(|_| not_utf8(what, b))
}

impl<'a> WireTable<'a> {
    /// The table at the decoder (its u32 length, then its entries), at nesting `depth`.
    fn read(d: &mut Decoder<'a>, depth: usize) -> Result<WireTable<'a>> {
        nested(depth)?;
        Ok(WireTable {
            d: Decoder::new(d.long_bytes("field table")?),
            depth,
        })
    }
}

impl<'a> Iterator for WireTable<'a> {
    type Item = Result<(&'a str, WireValue<'a>)>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.d.is_empty() {
            return None;
        }
        let entry = short(&mut self.d, "field table key")
            .and_then(|k| Ok((k, WireValue::read(&mut self.d, self.depth)?)));
        if entry.is_err() {
            // An error ends the table.
            self.d = Decoder::new(&[]);
        }
        Some(entry)
    }
}

impl<'a> Iterator for WireArray<'a> {
    type Item = Result<WireValue<'a>>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.d.is_empty() {
            return None;
        }
        let value = WireValue::read(&mut self.d, self.depth);
        if value.is_err() {
            self.d = Decoder::new(&[]);
        }
        Some(value)
    }
}

impl<'a> WireValue<'a> {
    /// One value (type octet, then its bytes) as `Decoder::field_value` reads it, in a table
    /// or array at nesting `depth`.
    #[inline]
    fn read(d: &mut Decoder<'a>, depth: usize) -> Result<WireValue<'a>> {
        let code = d.u8("field value type")?;
        Ok(match code {
            b't' => WireValue::Bool(d.u8("boolean")? != 0),
            b'b' => WireValue::I8(d.u8("short-short-int")? as i8),
            b'B' => WireValue::U8(d.u8("short-short-uint")?),
            b's' => WireValue::I16(d.u16("short-int")? as i16),
            b'u' => WireValue::U16(d.u16("short-uint")?),
            b'I' => WireValue::I32(d.u32("long-int")? as i32),
            b'i' => WireValue::U32(d.u32("long-uint")?),
            b'l' => WireValue::I64(d.u64("long-long-int")? as i64),
            b'f' => WireValue::F32(f32::from_bits(d.u32("float")?)),
            b'd' => WireValue::F64(f64::from_bits(d.u64("double")?)),
            b'D' => WireValue::Decimal {
                scale: d.u8("decimal scale")?,
                value: d.u32("decimal value")?,
            },
            b'S' => WireValue::LongString(d.long_bytes("long string")?),
            b'A' => {
                nested(depth + 1)?;
                WireValue::Array(WireArray {
                    d: Decoder::new(d.long_bytes("field array")?),
                    depth: depth + 1,
                })
            }
            b'T' => WireValue::Timestamp(d.u64("timestamp")?),
            b'F' => WireValue::Table(WireTable::read(d, depth + 1)?),
            b'V' => WireValue::Void,
            b'x' => WireValue::Bytes(d.long_bytes("byte array")?),
            other => {
                return Err(malformed(format_args!(
                    "unknown field value type code 0x{other:02x} ('{}')",
                    [other].escape_ascii()
                )))
            }
        })
    }
}

/// Walks a field table's entries (keys valid UTF-8, every value whole) at nesting `depth`,
/// as `Decoder::table` reads them: the check of [`WireProperties::new`], with a plain loop
/// rather than [`WireTable`]'s iterator items (measured with perf: walking the iterator
/// cost about 2.5 times as much).
fn skip_entries(mut d: Decoder<'_>, depth: usize) -> Result<()> {
    while !d.is_empty() {
        short(&mut d, "field table key")?;
        skip_value(&mut d, depth)?;
    }
    Ok(())
}

/// Walks one field value (type octet, then its bytes, nested values included) as
/// `Decoder::field_value` reads it: by the sizes of the types, not through
/// [`WireValue::read`], which builds each value (measured with perf on a version 3 backup of
/// 100,000 x 1 KiB with 20 headers: this walk about 4% of the samples, the same walk through
/// `WireValue::read` 8.5%).
fn skip_value(d: &mut Decoder<'_>, depth: usize) -> Result<()> {
    let code = d.u8("field value type")?;
    let fixed = match code {
        b't' | b'b' | b'B' => 1,
        b's' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'l' | b'd' | b'T' => 8,
        b'D' => 5,
        b'V' => 0,
        b'S' => return d.long_bytes("long string").map(drop),
        b'x' => return d.long_bytes("byte array").map(drop),
        b'F' => {
            nested(depth + 1)?;
            return skip_entries(Decoder::new(d.long_bytes("field table")?), depth + 1);
        }
        b'A' => {
            nested(depth + 1)?;
            let mut a = Decoder::new(d.long_bytes("field array")?);
            while !a.is_empty() {
                skip_value(&mut a, depth + 1)?;
            }
            return Ok(());
        }
        other => {
            return Err(malformed(format_args!(
                "unknown field value type code 0x{other:02x} ('{}')",
                [other].escape_ascii()
            )))
        }
    };
    d.bytes(fixed, "field value").map(drop)
}

/// The properties in `bytes` (flag words, then each present property), borrowed; the header
/// table not walked yet. Errors: as [`decode_properties`], and bytes after the last property.
fn fields(bytes: &[u8]) -> Result<WireFields<'_>> {
    let mut d = Decoder::new(bytes);
    let flags = flag_words(&mut d)?;
    let has = |flag: u16| flags & flag != 0;
    let mut f = WireFields::default();
    fn s<'a>(d: &mut Decoder<'a>, present: bool, what: &str) -> Result<Option<&'a str>> {
        Ok(if present { Some(short(d, what)?) } else { None })
    }
    f.content_type = s(&mut d, has(FLAG_CONTENT_TYPE), "content_type property")?;
    f.content_encoding = s(
        &mut d,
        has(FLAG_CONTENT_ENCODING),
        "content_encoding property",
    )?;
    if has(FLAG_HEADERS) {
        f.headers = Some(WireTable::read(&mut d, 0)?);
    }
    if has(FLAG_DELIVERY_MODE) {
        f.delivery_mode = Some(d.u8("delivery_mode property")?);
    }
    if has(FLAG_PRIORITY) {
        f.priority = Some(d.u8("priority property")?);
    }
    f.correlation_id = s(&mut d, has(FLAG_CORRELATION_ID), "correlation_id property")?;
    f.reply_to = s(&mut d, has(FLAG_REPLY_TO), "reply_to property")?;
    f.expiration = s(&mut d, has(FLAG_EXPIRATION), "expiration property")?;
    f.message_id = s(&mut d, has(FLAG_MESSAGE_ID), "message_id property")?;
    if has(FLAG_TIMESTAMP) {
        f.timestamp = Some(d.u64("timestamp property")?);
    }
    f.kind = s(&mut d, has(FLAG_TYPE), "type property")?;
    f.user_id = s(&mut d, has(FLAG_USER_ID), "user_id property")?;
    f.app_id = s(&mut d, has(FLAG_APP_ID), "app_id property")?;
    f.cluster_id = s(&mut d, has(FLAG_CLUSTER_ID), "cluster_id property")?;
    if !d.is_empty() {
        return Err(malformed(format_args!(
            "{} bytes after the last property",
            d.remaining()
        )));
    }
    Ok(f)
}

// Checked on creation: `fields` and `decode` succeed on the bytes and agree with
// `decode_properties`.
impl WireProperties {
    /// Checks `bytes`: the flag words (no flag the basic class does not define), each present
    /// property (short strings valid UTF-8, at most 255 bytes by their length octet), the
    /// header table whole (keys valid UTF-8, every value's type code known, nesting at most
    /// [`MAX_NESTING`]), and nothing after the last property.
    ///
    /// Errors: `Error::Amqp`, as [`decode_properties`] (`malformed AMQP data: ...`, `... is not
    /// valid UTF-8 ...`), or `malformed AMQP data: N bytes after the last property`.
    pub fn new(bytes: Vec<u8>) -> Result<WireProperties> {
        if let Some(t) = fields(&bytes)?.headers {
            skip_entries(t.d, t.depth)?;
        }
        Ok(WireProperties(bytes))
    }

    /// The properties of a content header frame's payload (class-id, weight, body-size, then
    /// the flags and properties), checked as [`WireProperties::new`] does; with the body size.
    ///
    /// Errors: as [`decode_content_header`] for the 12-byte prefix (the outer error); the
    /// inner one as [`WireProperties::new`].
    pub fn of_content_header(payload: &[u8]) -> Result<(u64, Result<WireProperties>)> {
        let mut d = Decoder::new(payload);
        let (_, body_size) = content_header_prefix(&mut d)?;
        Ok((body_size, WireProperties::new(d.rest().to_vec())))
    }

    /// Tests: the properties encoded by [`put_properties`] (what a publisher would send for
    /// `p`), as a channel would keep them.
    ///
    /// Errors: as [`put_properties`] (a short string over 255 bytes).
    #[cfg(test)]
    pub fn encode(p: &BasicProperties) -> Result<WireProperties> {
        let mut buf = Vec::new();
        put_properties(&mut buf, p)?;
        Ok(WireProperties(buf))
    }

    /// The bytes: flag words, then the present properties.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The properties, borrowed (nothing allocated).
    ///
    /// Errors: none for checked bytes (every `WireProperties` is); `Error::Amqp` otherwise.
    pub fn fields(&self) -> Result<WireFields<'_>> {
        fields(&self.0)
    }

    /// The properties as values ([`decode_properties`] of the bytes).
    ///
    /// Errors: none for checked bytes; `Error::Amqp` as [`decode_properties`] otherwise.
    pub fn decode(&self) -> Result<BasicProperties> {
        decode_properties(&mut Decoder::new(&self.0))
    }

    /// The value of the header `key` in the top-level header table (the first entry of that
    /// name), borrowed; `None` when there is no header table or no such key.
    pub fn header(&self, key: &str) -> Option<WireValue<'_>> {
        let mut d = self.fields().ok()?.headers?.d;
        while !d.is_empty() {
            // Keys compared as bytes: they were checked to be UTF-8 when the bytes were kept.
            if d.short_bytes("").ok()? == key.as_bytes() {
                return WireValue::read(&mut d, 0).ok();
            }
            skip_value(&mut d, 0).ok()?;
        }
        None
    }
}

/// The first property-flags word, after checking any continuation words (the basic class
/// defines 14 properties: a continuation word must be empty) and the reserved bit 1.
pub(super) fn flag_words(d: &mut Decoder<'_>) -> Result<u16> {
    let flags = d.u16("property flags")?;
    let mut more = flags & 1 != 0;
    while more {
        let w = d.u16("property flags")?;
        if w & !1 != 0 {
            return Err(malformed(format_args!(
                "unknown basic property flags 0x{w:04x}"
            )));
        }
        more = w & 1 != 0;
    }
    if flags & 0b10 != 0 {
        return Err(malformed(format_args!(
            "unknown basic property flags 0x{flags:04x}"
        )));
    }
    Ok(flags)
}
