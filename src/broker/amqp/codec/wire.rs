//! A message's properties kept as the broker sent them: the basic-class property flags and
//! property list of a content header frame (AMQP 0-9-1 section 4.2.6.1, the bytes after
//! class-id, weight and body-size), checked by the rules of [`decode_properties`] without
//! building a value, so that a reader that keeps them pays no allocation per property or
//! header (segment format version 3 stores them as they are: docs/segment-format.md).

use super::*;
use crate::broker::amqp::types::{BasicProperties, FieldValue, WireProperties};
use crate::error::Result;

// Checked on creation: `decode` gives what `decode_properties` gives for the same bytes, and
// never fails on them.
impl WireProperties {
    /// Checks `bytes`: the flag words (no flag the basic class does not define), each present
    /// property (short strings valid UTF-8, at most 255 bytes by their length octet), the
    /// header table (keys valid UTF-8, every value's type code known, nesting at most
    /// [`MAX_NESTING`]), and nothing after the last property.
    ///
    /// Errors: `Error::Amqp`, as [`decode_properties`] (`malformed AMQP data: ...`, `... is not
    /// valid UTF-8 ...`), or `malformed AMQP data: N bytes after the last property`.
    pub fn new(bytes: Vec<u8>) -> Result<WireProperties> {
        let mut d = Decoder::new(&bytes);
        let flags = flag_words(&mut d)?;
        let has = |flag: u16| flags & flag != 0;
        let short = |d: &mut Decoder<'_>, what: &str| -> Result<()> {
            let b = d.short_bytes(what)?;
            std::str::from_utf8(b).map_err(|_| not_utf8(what, b))?;
            Ok(())
        };
        if has(FLAG_CONTENT_TYPE) {
            short(&mut d, "content_type property")?;
        }
        if has(FLAG_CONTENT_ENCODING) {
            short(&mut d, "content_encoding property")?;
        }
        if has(FLAG_HEADERS) {
            skip_table(&mut d, 0)?;
        }
        if has(FLAG_DELIVERY_MODE) {
            d.u8("delivery_mode property")?;
        }
        if has(FLAG_PRIORITY) {
            d.u8("priority property")?;
        }
        for (flag, what) in [
            (FLAG_CORRELATION_ID, "correlation_id property"),
            (FLAG_REPLY_TO, "reply_to property"),
            (FLAG_EXPIRATION, "expiration property"),
            (FLAG_MESSAGE_ID, "message_id property"),
        ] {
            if has(flag) {
                short(&mut d, what)?;
            }
        }
        if has(FLAG_TIMESTAMP) {
            d.u64("timestamp property")?;
        }
        for (flag, what) in [
            (FLAG_TYPE, "type property"),
            (FLAG_USER_ID, "user_id property"),
            (FLAG_APP_ID, "app_id property"),
            (FLAG_CLUSTER_ID, "cluster_id property"),
        ] {
            if has(flag) {
                short(&mut d, what)?;
            }
        }
        if !d.is_empty() {
            return Err(malformed(format_args!(
                "{} bytes after the last property",
                d.remaining()
            )));
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
        d.u16("content header class")?;
        d.u16("content header weight")?;
        let body_size = d.u64("content body size")?;
        Ok((body_size, WireProperties::new(d.rest().to_vec())))
    }

    /// The properties encoded by [`put_properties`] (what a publisher would send for `p`).
    ///
    /// Errors: as [`put_properties`] (a short string over 255 bytes).
    pub fn encode(p: &BasicProperties) -> Result<WireProperties> {
        let mut buf = Vec::new();
        put_properties(&mut buf, p)?;
        Ok(WireProperties(buf))
    }

    /// The bytes: flag words, then the present properties.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The properties as values ([`decode_properties`] of the bytes).
    ///
    /// Errors: none for bytes [`WireProperties::new`] accepted; `Error::Amqp` as
    /// [`decode_properties`] otherwise.
    pub fn decode(&self) -> Result<BasicProperties> {
        decode_properties(&mut Decoder::new(&self.0))
    }

    /// The value of the header `key` in the top-level header table (the first entry of that
    /// name), decoded; `None` when there is no header table or no such key.
    pub fn header(&self, key: &str) -> Option<FieldValue> {
        let mut d = Decoder::new(&self.0);
        let flags = flag_words(&mut d).ok()?;
        if flags & FLAG_HEADERS == 0 {
            return None;
        }
        for flag in [FLAG_CONTENT_TYPE, FLAG_CONTENT_ENCODING] {
            if flags & flag != 0 {
                d.short_bytes("").ok()?;
            }
        }
        let mut t = Decoder::new(d.long_bytes("").ok()?);
        while !t.is_empty() {
            let k = t.short_bytes("").ok()?;
            if k == key.as_bytes() {
                return t.field_value().ok();
            }
            skip_value(&mut t, 0).ok()?;
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

fn nested(depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(malformed(format_args!(
            "field tables/arrays nested deeper than {MAX_NESTING}"
        )));
    }
    Ok(())
}

/// Walks a field table (long length, then key and value pairs) as `Decoder::table` reads it.
fn skip_table(d: &mut Decoder<'_>, depth: usize) -> Result<()> {
    nested(depth)?;
    let mut t = Decoder::new(d.long_bytes("field table")?);
    while !t.is_empty() {
        let key = t.short_bytes("field table key")?;
        std::str::from_utf8(key).map_err(|_| not_utf8("field table key", key))?;
        skip_value(&mut t, depth)?;
    }
    Ok(())
}

/// Walks one field value (type code, then its bytes) as `Decoder::field_value` reads it.
fn skip_value(d: &mut Decoder<'_>, depth: usize) -> Result<()> {
    let code = d.u8("field value type")?;
    let fixed = match code {
        b't' | b'b' | b'B' => 1,
        b's' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'l' | b'd' | b'T' => 8,
        b'D' => 5,
        b'V' => 0,
        b'S' => {
            d.long_bytes("long string")?;
            return Ok(());
        }
        b'x' => {
            d.long_bytes("byte array")?;
            return Ok(());
        }
        b'F' => return skip_table(d, depth + 1),
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
    d.bytes(fixed, "field value")?;
    Ok(())
}
