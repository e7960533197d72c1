//! Encoding of field tables and field values (RabbitMQ's type codes; decoding is in
//! `Decoder`), short and long strings, and bit packing.

use super::*;
use crate::broker::amqp::types::{FieldTable, FieldValue};
use crate::error::{Error, Result};

/// Appends a short string; more than 255 bytes is an `Error::Amqp`.
pub fn put_short_str(buf: &mut Vec<u8>, s: &str, what: &str) -> Result<()> {
    put_short_bytes(buf, s.as_bytes(), what)
}

/// Appends short-string bytes; more than 255 bytes is an `Error::Amqp`.
pub fn put_short_bytes(buf: &mut Vec<u8>, s: &[u8], what: &str) -> Result<()> {
    let len = u8::try_from(s.len()).map_err(|_| {
        Error::Amqp(format!(
            "{what} is {} bytes long; an AMQP short string holds at most 255",
            s.len()
        ))
    })?;
    buf.push(len);
    buf.extend_from_slice(s);
    Ok(())
}

/// Appends a long string (raw bytes); more than 4 GiB - 1 is an `Error::Amqp`.
pub fn put_long_bytes(buf: &mut Vec<u8>, s: &[u8], what: &str) -> Result<()> {
    let len = u32::try_from(s.len()).map_err(|_| {
        Error::Amqp(format!(
            "{what} is {} bytes long; too long for AMQP",
            s.len()
        ))
    })?;
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(s);
    Ok(())
}

pub(super) fn patch_len(buf: &mut [u8], start: usize, what: &str) -> Result<()> {
    let len = buf.len() - start - 4;
    let len = u32::try_from(len)
        .map_err(|_| Error::Amqp(format!("{what} is {len} bytes long; too long for AMQP")))?;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// Appends a field table (length-prefixed), keys in the given order.
pub fn put_table(buf: &mut Vec<u8>, table: &FieldTable) -> Result<()> {
    put_table_at(buf, table, 0)
}

pub(super) fn nesting_error() -> Error {
    Error::Amqp(format!(
        "field tables/arrays nested deeper than {MAX_NESTING}"
    ))
}

pub(super) fn put_table_at(buf: &mut Vec<u8>, table: &FieldTable, depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(nesting_error());
    }
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    for (key, value) in table {
        put_short_str(buf, key, "field table key")?;
        put_value_at(buf, value, depth)?;
    }
    patch_len(buf, start, "field table")
}

pub(super) fn put_array_at(buf: &mut Vec<u8>, values: &[FieldValue], depth: usize) -> Result<()> {
    if depth > MAX_NESTING {
        return Err(nesting_error());
    }
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]);
    for value in values {
        put_value_at(buf, value, depth)?;
    }
    patch_len(buf, start, "field array")
}

/// Appends one field value with its type code.
pub fn put_field_value(buf: &mut Vec<u8>, value: &FieldValue) -> Result<()> {
    put_value_at(buf, value, 0)
}

pub(super) fn put_value_at(buf: &mut Vec<u8>, value: &FieldValue, depth: usize) -> Result<()> {
    match value {
        FieldValue::Bool(v) => buf.extend_from_slice(&[b't', *v as u8]),
        FieldValue::I8(v) => buf.extend_from_slice(&[b'b', *v as u8]),
        FieldValue::U8(v) => buf.extend_from_slice(&[b'B', *v]),
        FieldValue::I16(v) => {
            buf.push(b's');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::U16(v) => {
            buf.push(b'u');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::I32(v) => {
            buf.push(b'I');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::U32(v) => {
            buf.push(b'i');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::I64(v) => {
            buf.push(b'l');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::F32(v) => {
            buf.push(b'f');
            buf.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        FieldValue::F64(v) => {
            buf.push(b'd');
            buf.extend_from_slice(&v.to_bits().to_be_bytes());
        }
        FieldValue::Decimal { scale, value } => {
            buf.push(b'D');
            buf.push(*scale);
            buf.extend_from_slice(&value.to_be_bytes());
        }
        FieldValue::LongString(v) => {
            buf.push(b'S');
            put_long_bytes(buf, v, "long string")?;
        }
        FieldValue::Array(v) => {
            buf.push(b'A');
            put_array_at(buf, v, depth + 1)?;
        }
        FieldValue::Timestamp(v) => {
            buf.push(b'T');
            buf.extend_from_slice(&v.to_be_bytes());
        }
        FieldValue::Table(v) => {
            buf.push(b'F');
            put_table_at(buf, v, depth + 1)?;
        }
        FieldValue::Void => buf.push(b'V'),
        FieldValue::Bytes(v) => {
            buf.push(b'x');
            put_long_bytes(buf, v, "byte array")?;
        }
    }
    Ok(())
}

/// Packs up to 8 consecutive bit arguments into one octet (first argument in the lowest bit).
pub(super) fn bits(flags: &[bool]) -> u8 {
    flags
        .iter()
        .enumerate()
        .fold(0u8, |acc, (i, &f)| acc | ((f as u8) << i))
}

pub(super) fn bit(octet: u8, i: u8) -> bool {
    octet & (1 << i) != 0
}

// ---------------------------------------------------------------------------------------------
// Content header (basic class properties)
// ---------------------------------------------------------------------------------------------
