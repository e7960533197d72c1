//! The AMQP 1.0 type system (OASIS AMQP 1.0, part 1 "Types"): [`Value`], its decoder
//! [`decode_value`] and its encoder [`encode_value`], shared by the stream client
//! (`crate::broker::stream::amqp10`, the messages a stream holds) and the AMQP 1.0 client
//! (`crate::broker::amqp10`, performatives and messages).
//!
//! [`decode_value`] reads every fixed and variable width type, lists, maps, arrays and
//! described values, bounded in depth, never trusting a length beyond the input, and at a
//! memory cost proportional to the input: an array's descriptor is held once, and no input
//! decodes to more values than it has bytes.

use crate::error::{Error, Result};

mod encode;
pub use encode::encode_value;

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
    /// An array: its elements' descriptor (held once, not per element), and the elements.
    Array(Option<Box<Value>>, Vec<Value>),
    Described(Box<Value>, Box<Value>),
}

/// Nesting deeper than this is refused (garbage must not exhaust the stack).
const MAX_DEPTH: usize = 64;

pub(crate) fn err(msg: impl Into<String>) -> Error {
    Error::Serialization(format!("Invalid AMQP 1.0 message: {}", msg.into()))
}

pub(crate) struct Input<'a> {
    b: &'a [u8],
    /// The position of the next byte to read.
    pub(crate) p: usize,
    /// Values that may still be decoded: one per byte of the whole input, so that zero-width
    /// array elements (nulls, `true`, empty lists) cannot make a few bytes into millions of
    /// values. Shared by a compound's elements through [`Input::inner`].
    values_left: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Input<'a> {
        Input {
            b,
            p: 0,
            values_left: b.len(),
        }
    }

    /// An input over `body` that spends this one's value budget (given back by
    /// [`Input::outer`]).
    fn inner(&mut self, body: &'a [u8]) -> Input<'a> {
        let values_left = std::mem::take(&mut self.values_left);
        Input {
            b: body,
            p: 0,
            values_left,
        }
    }

    fn outer(&mut self, inner: Input<'a>) {
        self.values_left = inner.values_left;
    }

    /// Counts one decoded value against the budget.
    fn spend(&mut self) -> Result<()> {
        self.values_left = self
            .values_left
            .checked_sub(1)
            .ok_or_else(|| err("more values than bytes (an array of zero-width elements)"))?;
        Ok(())
    }

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
    pub(crate) fn u8(&mut self) -> Result<u8> {
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
/// in a symbol, nesting deeper than 64, or more values than bytes.
pub fn decode_value(b: &[u8]) -> Result<(Value, usize)> {
    let mut input = Input::new(b);
    let v = value(&mut input, 0)?;
    Ok((v, input.p))
}

pub(crate) fn value(i: &mut Input, depth: usize) -> Result<Value> {
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
/// body (the bytes after the count) and the element count.
fn compound<'a>(i: &mut Input<'a>, wide: bool) -> Result<(&'a [u8], usize)> {
    let size = if wide {
        i.u32()? as usize
    } else {
        i.u8()? as usize
    };
    let body = i.take(size)?;
    let width = if wide { 4 } else { 1 };
    if body.len() < width {
        return Err(err(format!(
            "a compound of {size} bytes has no room for its count"
        )));
    }
    let count = if wide {
        u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize
    } else {
        body[0] as usize
    };
    let body = &body[width..];
    // Each element takes at least one byte, except zero-width array elements, which the
    // value budget bounds: a count beyond that is garbage.
    if count > body.len() {
        return Err(err(format!(
            "{count} elements announced in {} bytes",
            body.len()
        )));
    }
    Ok((body, count))
}

fn with_code(i: &mut Input, code: u8, depth: usize) -> Result<Value> {
    if depth >= MAX_DEPTH {
        return Err(err("values nested too deep"));
    }
    i.spend()?;
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
            let (body, count) = compound(i, code & 0x10 != 0)?;
            let mut inner = i.inner(body);
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(value(&mut inner, depth + 1)?);
            }
            i.outer(inner);
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
            let (body, count) = compound(i, code == 0xf0)?;
            let mut inner = i.inner(body);
            let mut element = inner.u8()?;
            let mut descriptor = None;
            if element == 0x00 {
                descriptor = Some(Box::new(value(&mut inner, depth + 1)?));
                element = inner.u8()?;
            }
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(with_code(&mut inner, element, depth + 1)?);
            }
            i.outer(inner);
            Value::Array(descriptor, items)
        }
        other => return Err(err(format!("unknown format code {other:#04x}"))),
    })
}

/// Steps over one value without decoding it (no allocation): a compound by its size, a
/// described value by its descriptor and value.
pub(crate) fn skip_value(i: &mut Input, depth: usize) -> Result<()> {
    if depth >= MAX_DEPTH {
        return Err(err("values nested too deep"));
    }
    let code = i.u8()?;
    let fixed = match code {
        0x00 => {
            skip_value(i, depth + 1)?;
            return skip_value(i, depth + 1);
        }
        0x40..=0x45 => 0,
        0x50..=0x56 => 1,
        0x60 | 0x61 => 2,
        0x70..=0x74 => 4,
        0x80..=0x84 => 8,
        0x94 | 0x98 => 16,
        0xa0 | 0xa1 | 0xa3 => i.u8()? as usize,
        0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => i.u32()? as usize,
        0xc0 | 0xc1 | 0xe0 => i.u8()? as usize,
        other => return Err(err(format!("unknown format code {other:#04x}"))),
    };
    i.take(fixed)?;
    Ok(())
}

pub(crate) fn type_name(v: &Value) -> &'static str {
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
        Value::Array(..) => "array",
        Value::Described(..) => "described value",
    }
}
