//! The hot path of the record format (DESIGN.md decision 5): [`encode_record`] writes exactly
//! the bytes `serde_json::to_vec(&record)` writes, but writes the body's number array itself
//! (`body.rs`) and the rest too (`write.rs`); [`decode_record`] parses the body array itself,
//! and the rest itself too when it is in the compact form encode_record writes (`tail.rs`),
//! else with serde_json. The derived serde implementations in the parent module define the
//! format.

use super::body::{parse_compact, write_body};
use super::tail::parse_tail;
use super::write::write_fields;
use super::{BackupRecord, MessageFormat};
use crate::error::{Error, Result};

/// How every record encode_record writes begins.
const BODY_FIRST: &[u8] = b"{\"body\":";

// ---------------------------------------------------------------------------------------------
// The hot path: encode
// ---------------------------------------------------------------------------------------------

/// Refuses a record segment format version 1 cannot hold: one with a `message_format` (a
/// version 1 reader ignores unknown keys, so it would take such a body for a 0-9-1 body).
///
/// Errors: `Error::Serialization` naming the queue and the record kind.
pub fn check_version_1(rec: &BackupRecord) -> Result<()> {
    match rec.message_format {
        None => Ok(()),
        Some(f) => Err(Error::Serialization(format!(
            "A {} record (queue '{}' in vhost '{}') cannot be written in segment format version 1; \
             queues read over AMQP 1.0 are written in version 2",
            f.as_str(),
            rec.source_queue,
            rec.source_vhost
        ))),
    }
}

/// Appends the JSON of `rec` to `out` (the caller clears `out` if it wants only this record).
///
/// The bytes are identical to `serde_json::to_vec(rec)` (compact, SPEC.md key order); the body
/// array is written by [`write_body`] (SSSE3 when the CPU has it, else a lookup table), the rest
/// by `write.rs`. Runs at about 2 GB/s of body on one core (see `examples/codec_bench.rs`).
pub fn encode_record(rec: &BackupRecord, out: &mut Vec<u8>) {
    out.extend_from_slice(BODY_FIRST);
    write_body(&rec.body, out);
    write_fields(rec, b',', out);
}

// ---------------------------------------------------------------------------------------------
// The hot path: decode
// ---------------------------------------------------------------------------------------------

/// Parses one record's JSON (as written by [`encode_record`] or any serde_json output of the same
/// shape: any whitespace, any key order).
///
/// The top-level `body` array is parsed here. The rest of the object is parsed by `tail.rs`
/// when it is in the compact form encode_record writes, else by serde_json with the body
/// replaced by `null`. Anything unusual (escaped keys, duplicate `body`, invalid
/// numbers) falls back to plain `serde_json::from_slice`, so the accepted language and the
/// result are exactly serde_json's.
///
/// Errors: `Error::Serialization` with serde_json's message when the JSON is not a valid record,
/// or naming the kind when it holds a `message_format` (version 1 cannot hold one:
/// [`check_version_1`]).
pub fn decode_record(json: &[u8]) -> Result<BackupRecord> {
    let rec = decode_any(json)?;
    if rec.message_format.is_some() {
        return Err(Error::Serialization(format!(
            "Invalid backup record: a version 1 record with message_format {:?} (only segment \
             format version 2 holds it)",
            rec.message_format
                .map(MessageFormat::as_str)
                .unwrap_or_default()
        )));
    }
    Ok(rec)
}

/// [`decode_record`] without its version 1 check.
fn decode_any(json: &[u8]) -> Result<BackupRecord> {
    if let Some((body, vstart, vend)) = locate_body(json) {
        // The compact form encode_record writes: the body first, then the tail parsed here.
        if json.starts_with(BODY_FIRST) && vstart == BODY_FIRST.len() {
            if let Some(mut rec) = parse_tail(&json[vend..]) {
                rec.body = body;
                return Ok(rec);
            }
        }
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

/// Walks the top-level object to its `body` member and parses it. Returns the body and the
/// span of its value, or `None` when the fast path does not apply (the caller then uses
/// serde_json alone). What follows the body is not walked here: the caller parses it (`tail.rs`,
/// or serde_json with this value replaced by null, which reports what is wrong there, a second
/// `body` included).
fn locate_body(s: &[u8]) -> Option<(Vec<u8>, usize, usize)> {
    let mut i = skip_ws(s, 0);
    if *s.get(i)? != b'{' {
        return None;
    }
    i = skip_ws(s, i + 1);
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
            let (body, vend) = parse_body_value(s, i)?;
            return Some((body, i, vend));
        }
        i = skip_ws(s, skip_value(s, i)?);
        if *s.get(i)? != b',' {
            return None; // the object ends (or is broken) without a body
        }
        i = skip_ws(s, i + 1);
    }
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
