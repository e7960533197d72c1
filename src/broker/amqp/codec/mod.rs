//! AMQP 0-9-1 wire codec: frames, methods, content headers and field tables (no I/O).
//!
//! Layouts follow the AMQP 0-9-1 specification (`amqp0-9-1.xml`) with RabbitMQ's field-table
//! type codes (<https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3>), listed in
//! [`super::types`]. Every decoder checks lengths against the bytes actually present before
//! it allocates, so truncated or garbage input gives an `Error::Amqp("malformed AMQP data: ...")`,
//! never a panic or a huge allocation. Long strings are kept as raw bytes; short strings
//! (property values, table keys, names) that are not valid UTF-8 are an error
//! (`... is not valid UTF-8 ...`), never a silent loss.

//!
//! Files: this one holds the frame constants and the `Decoder` (field tables included);
//! `table` encodes tables and values, `properties` content headers, `wire` properties kept
//! as the broker sent them, `frame` frames, `method` the `Method` enum, `method_encode` /
//! `method_decode` its arguments.

mod frame;
mod method;
mod method_decode;
mod method_encode;
mod properties;
mod table;
#[cfg(test)]
mod tests;
mod wire;
#[cfg(test)]
mod wire_tests;

use crate::broker::amqp::types::{FieldTable, FieldValue};
use crate::error::{Error, Result};
pub use frame::*;
pub use method::*;
pub use properties::*;
pub use table::*;
pub use wire::{WireArray, WireFields, WireTable, WireValue};

/// The protocol header a client sends first (AMQP 0-9-1, section 4.2.2).
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// Frame type of a method frame.
pub const FRAME_METHOD: u8 = 1;
/// Frame type of a content header frame.
pub const FRAME_HEADER: u8 = 2;
/// Frame type of a content body frame.
pub const FRAME_BODY: u8 = 3;
/// Frame type of a heartbeat frame.
pub const FRAME_HEARTBEAT: u8 = 8;
/// The octet that ends every frame.
pub const FRAME_END: u8 = 0xCE;
/// Bytes of the frame header (type, channel, size).
pub const FRAME_HEADER_SIZE: usize = 7;
/// Bytes a frame adds around its payload (header plus end octet).
pub const FRAME_OVERHEAD: usize = 8;
/// The smallest `frame_max` a peer may negotiate (AMQP 0-9-1 `frame-min-size`), bytes.
pub const FRAME_MIN_SIZE: u32 = 4096;
/// Deepest nesting of tables/arrays accepted or written (guards the stack against garbage).
pub const MAX_NESTING: usize = 128;

/// Class id of the `basic` class, the only content class used.
pub const CLASS_BASIC: u16 = 60;

fn malformed(detail: impl std::fmt::Display) -> Error {
    Error::Amqp(format!("malformed AMQP data: {detail}"))
}

fn not_utf8(what: &str, bytes: &[u8]) -> Error {
    Error::Amqp(format!(
        "{what} is not valid UTF-8: \"{}\"",
        bytes.escape_ascii()
    ))
}

/// Converts short-string bytes to a `String`; not UTF-8 gives `Error::Amqp("<what> is not valid UTF-8: ...")`.
pub fn utf8_short_string(bytes: &[u8], what: &str) -> Result<String> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Err(not_utf8(what, bytes)),
    }
}

/// Like [`utf8_short_string`] but takes ownership of the bytes (no copy when valid).
pub fn utf8_short_string_owned(bytes: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| not_utf8(what, e.as_bytes()))
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

/// A bounds-checked big-endian reader over one frame payload (or any byte slice).
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// A decoder at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Decoder { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True when every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The next `n` bytes; an error (no panic, no allocation) when fewer are left.
    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(malformed(format_args!(
                "truncated {what}: needs {n} bytes, {} left",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// The bytes not read yet, consuming them.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    fn fixed<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    /// One octet.
    pub fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.bytes(1, what)?[0])
    }

    /// A big-endian u16.
    pub fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_be_bytes(self.fixed(what)?))
    }

    /// A big-endian u32.
    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_be_bytes(self.fixed(what)?))
    }

    /// A big-endian u64.
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_be_bytes(self.fixed(what)?))
    }

    /// A short string's raw bytes (1-byte length).
    pub fn short_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u8(what)? as usize;
        self.bytes(n, what)
    }

    /// A short string, which must be valid UTF-8.
    pub fn short_str(&mut self, what: &str) -> Result<String> {
        let b = self.short_bytes(what)?;
        utf8_short_string(b, what)
    }

    /// A long string's raw bytes (4-byte length).
    pub fn long_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let n = self.u32(what)? as usize;
        self.bytes(n, what)
    }

    /// A field table, in wire order.
    pub fn table(&mut self) -> Result<FieldTable> {
        self.table_at(0)
    }

    fn table_at(&mut self, depth: usize) -> Result<FieldTable> {
        if depth > MAX_NESTING {
            return Err(malformed(format_args!(
                "field tables/arrays nested deeper than {MAX_NESTING}"
            )));
        }
        let body = self.long_bytes("field table")?;
        let mut d = Decoder::new(body);
        let mut table = Vec::new();
        while !d.is_empty() {
            let key = d.short_str("field table key")?;
            let value = d.value_at(depth)?;
            table.push((key, value));
        }
        Ok(table)
    }

    fn array_at(&mut self, depth: usize) -> Result<Vec<FieldValue>> {
        if depth > MAX_NESTING {
            return Err(malformed(format_args!(
                "field tables/arrays nested deeper than {MAX_NESTING}"
            )));
        }
        let body = self.long_bytes("field array")?;
        let mut d = Decoder::new(body);
        let mut values = Vec::new();
        while !d.is_empty() {
            values.push(d.value_at(depth)?);
        }
        Ok(values)
    }

    /// One field value with its type code.
    pub fn field_value(&mut self) -> Result<FieldValue> {
        self.value_at(0)
    }

    fn value_at(&mut self, depth: usize) -> Result<FieldValue> {
        let code = self.u8("field value type")?;
        Ok(match code {
            b't' => FieldValue::Bool(self.u8("boolean")? != 0),
            b'b' => FieldValue::I8(self.u8("short-short-int")? as i8),
            b'B' => FieldValue::U8(self.u8("short-short-uint")?),
            b's' => FieldValue::I16(self.u16("short-int")? as i16),
            b'u' => FieldValue::U16(self.u16("short-uint")?),
            b'I' => FieldValue::I32(self.u32("long-int")? as i32),
            b'i' => FieldValue::U32(self.u32("long-uint")?),
            b'l' => FieldValue::I64(self.u64("long-long-int")? as i64),
            b'f' => FieldValue::F32(f32::from_bits(self.u32("float")?)),
            b'd' => FieldValue::F64(f64::from_bits(self.u64("double")?)),
            b'D' => {
                let scale = self.u8("decimal scale")?;
                let value = self.u32("decimal value")?;
                FieldValue::Decimal { scale, value }
            }
            b'S' => FieldValue::LongString(self.long_bytes("long string")?.to_vec()),
            b'A' => FieldValue::Array(self.array_at(depth + 1)?),
            b'T' => FieldValue::Timestamp(self.u64("timestamp")?),
            b'F' => FieldValue::Table(self.table_at(depth + 1)?),
            b'V' => FieldValue::Void,
            b'x' => FieldValue::Bytes(self.long_bytes("byte array")?.to_vec()),
            other => {
                return Err(malformed(format_args!(
                    "unknown field value type code 0x{other:02x} ('{}')",
                    [other].escape_ascii()
                )))
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------
