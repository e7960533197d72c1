//! The hot path of the record format (DESIGN.md decision 5): [`encode_record`] writes exactly
//! the bytes `serde_json::to_vec(&record)` writes, but writes the body's number array itself
//! from a lookup table; [`decode_record`] parses the body array itself and leaves the small rest
//! to serde_json. The derived serde implementations in the parent module define the format.

use serde::Serialize;

use super::{BackupHeaderValue, BackupProperties, BackupRecord};
use crate::error::{Error, Result};

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
