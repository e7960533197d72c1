//! The AMQP 1.0 encoding of [`Value`]s (part 1 "Types"). Every value takes its widest
//! constructor (`str32`, `list32`, ...) except the fixed-width types; [`super::decode_value`]
//! reads it back unchanged.

use super::Value;

fn sized(out: &mut Vec<u8>, code: u8, bytes: &[u8]) {
    out.push(code);
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn compound(out: &mut Vec<u8>, code: u8, count: usize, items: &[u8]) {
    out.push(code);
    out.extend_from_slice(&((items.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&(count as u32).to_be_bytes());
    out.extend_from_slice(items);
}

/// Appends the encoding of `v` to `out`.
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(0x40),
        Value::Bool(b) => out.push(if *b { 0x41 } else { 0x42 }),
        Value::Ubyte(n) => out.extend_from_slice(&[0x50, *n]),
        Value::Byte(n) => out.extend_from_slice(&[0x51, *n as u8]),
        Value::Ushort(n) => {
            out.push(0x60);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Short(n) => {
            out.push(0x61);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Uint(n) => {
            out.push(0x70);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Int(n) => {
            out.push(0x71);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Ulong(n) => {
            out.push(0x80);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Long(n) => {
            out.push(0x81);
            out.extend_from_slice(&n.to_be_bytes());
        }
        Value::Float(f) => {
            out.push(0x72);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::Double(f) => {
            out.push(0x82);
            out.extend_from_slice(&f.to_be_bytes());
        }
        Value::Decimal(b) => {
            out.push(match b.len() {
                4 => 0x74,
                8 => 0x84,
                _ => 0x94,
            });
            let mut fixed = b.clone();
            fixed.resize(
                if b.len() <= 4 {
                    4
                } else if b.len() <= 8 {
                    8
                } else {
                    16
                },
                0,
            );
            out.extend_from_slice(&fixed);
        }
        Value::Char(c) => {
            out.push(0x73);
            out.extend_from_slice(&c.to_be_bytes());
        }
        Value::Timestamp(ms) => {
            out.push(0x83);
            out.extend_from_slice(&ms.to_be_bytes());
        }
        Value::Uuid(u) => {
            out.push(0x98);
            out.extend_from_slice(u);
        }
        Value::Binary(b) => sized(out, 0xb0, b),
        Value::String(s) => sized(out, 0xb1, s.as_bytes()),
        Value::InvalidString(b) => sized(out, 0xb1, b),
        Value::Symbol(s) => sized(out, 0xb3, s.as_bytes()),
        Value::List(items) => {
            let mut body = Vec::new();
            for i in items {
                encode_value(i, &mut body);
            }
            compound(out, 0xd0, items.len(), &body);
        }
        Value::Map(pairs) => {
            let mut body = Vec::new();
            for (k, v) in pairs {
                encode_value(k, &mut body);
                encode_value(v, &mut body);
            }
            compound(out, 0xd1, pairs.len() * 2, &body);
        }
        // An array keeps one constructor: the first element's (empty: null), after the
        // descriptor when it has one. Booleans take `boolean` (0x56, one byte each): `true`
        // and `false` are two constructors without a value, and an array has only one.
        Value::Array(descriptor, items) => {
            let element = |v: &Value, one: &mut Vec<u8>| match v {
                Value::Bool(b) => one.extend_from_slice(&[0x56, u8::from(*b)]),
                v => encode_value(v, one),
            };
            let mut first = Vec::new();
            element(items.first().unwrap_or(&Value::Null), &mut first);
            let mut body = Vec::new();
            if let Some(d) = descriptor {
                body.push(0x00);
                encode_value(d, &mut body);
            }
            body.push(first[0]);
            for i in items {
                let mut one = Vec::new();
                element(i, &mut one);
                body.extend_from_slice(&one[1..]);
            }
            compound(out, 0xf0, items.len(), &body);
        }
        Value::Described(d, v) => {
            out.push(0x00);
            encode_value(d, out);
            encode_value(v, out);
        }
    }
}
