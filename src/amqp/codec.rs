//! AMQP 0-9-1 wire codec: frames, methods, content headers and field tables (no I/O).
//!
//! Layouts follow the AMQP 0-9-1 specification (`amqp0-9-1.xml`) with RabbitMQ's field-table
//! type codes (<https://www.rabbitmq.com/amqp-0-9-1-errata.html#section_3>), listed in
//! [`super::types`]. Every decoder checks lengths against the bytes actually present before
//! it allocates, so truncated or garbage input gives an `Error::Amqp("malformed AMQP data: ...")`,
//! never a panic or a huge allocation. Long strings are kept as raw bytes; short strings
//! (property values, table keys, names) that are not valid UTF-8 are an error
//! (`... is not valid UTF-8 ...`), never a silent loss.

use super::types::{BasicProperties, FieldTable, FieldValue};
use crate::error::{Error, Result};

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

fn patch_len(buf: &mut [u8], start: usize, what: &str) -> Result<()> {
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

fn nesting_error() -> Error {
    Error::Amqp(format!(
        "field tables/arrays nested deeper than {MAX_NESTING}"
    ))
}

fn put_table_at(buf: &mut Vec<u8>, table: &FieldTable, depth: usize) -> Result<()> {
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

fn put_array_at(buf: &mut Vec<u8>, values: &[FieldValue], depth: usize) -> Result<()> {
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

fn put_value_at(buf: &mut Vec<u8>, value: &FieldValue, depth: usize) -> Result<()> {
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
fn bits(flags: &[bool]) -> u8 {
    flags
        .iter()
        .enumerate()
        .fold(0u8, |acc, (i, &f)| acc | ((f as u8) << i))
}

fn bit(octet: u8, i: u8) -> bool {
    octet & (1 << i) != 0
}

// ---------------------------------------------------------------------------------------------
// Content header (basic class properties)
// ---------------------------------------------------------------------------------------------

const FLAG_CONTENT_TYPE: u16 = 1 << 15;
const FLAG_CONTENT_ENCODING: u16 = 1 << 14;
const FLAG_HEADERS: u16 = 1 << 13;
const FLAG_DELIVERY_MODE: u16 = 1 << 12;
const FLAG_PRIORITY: u16 = 1 << 11;
const FLAG_CORRELATION_ID: u16 = 1 << 10;
const FLAG_REPLY_TO: u16 = 1 << 9;
const FLAG_EXPIRATION: u16 = 1 << 8;
const FLAG_MESSAGE_ID: u16 = 1 << 7;
const FLAG_TIMESTAMP: u16 = 1 << 6;
const FLAG_TYPE: u16 = 1 << 5;
const FLAG_USER_ID: u16 = 1 << 4;
const FLAG_APP_ID: u16 = 1 << 3;
const FLAG_CLUSTER_ID: u16 = 1 << 2;

/// The property-flags word of `p` (bit 15 = content-type ... bit 2 = cluster-id).
pub fn property_flags(p: &BasicProperties) -> u16 {
    let mut f = 0;
    let mut set = |present: bool, flag: u16| {
        if present {
            f |= flag
        }
    };
    set(p.content_type.is_some(), FLAG_CONTENT_TYPE);
    set(p.content_encoding.is_some(), FLAG_CONTENT_ENCODING);
    set(p.headers.is_some(), FLAG_HEADERS);
    set(p.delivery_mode.is_some(), FLAG_DELIVERY_MODE);
    set(p.priority.is_some(), FLAG_PRIORITY);
    set(p.correlation_id.is_some(), FLAG_CORRELATION_ID);
    set(p.reply_to.is_some(), FLAG_REPLY_TO);
    set(p.expiration.is_some(), FLAG_EXPIRATION);
    set(p.message_id.is_some(), FLAG_MESSAGE_ID);
    set(p.timestamp.is_some(), FLAG_TIMESTAMP);
    set(p.kind.is_some(), FLAG_TYPE);
    set(p.user_id.is_some(), FLAG_USER_ID);
    set(p.app_id.is_some(), FLAG_APP_ID);
    set(p.cluster_id.is_some(), FLAG_CLUSTER_ID);
    f
}

/// Appends the property flags and the present property values of `p`.
pub fn put_properties(buf: &mut Vec<u8>, p: &BasicProperties) -> Result<()> {
    buf.extend_from_slice(&property_flags(p).to_be_bytes());
    fn s(buf: &mut Vec<u8>, v: &Option<String>, what: &str) -> Result<()> {
        match v {
            Some(v) => put_short_str(buf, v, what),
            None => Ok(()),
        }
    }
    s(buf, &p.content_type, "content_type property")?;
    s(buf, &p.content_encoding, "content_encoding property")?;
    if let Some(h) = &p.headers {
        put_table(buf, h)?;
    }
    if let Some(v) = p.delivery_mode {
        buf.push(v);
    }
    if let Some(v) = p.priority {
        buf.push(v);
    }
    s(buf, &p.correlation_id, "correlation_id property")?;
    s(buf, &p.reply_to, "reply_to property")?;
    s(buf, &p.expiration, "expiration property")?;
    s(buf, &p.message_id, "message_id property")?;
    if let Some(v) = p.timestamp {
        buf.extend_from_slice(&v.to_be_bytes());
    }
    s(buf, &p.kind, "type property")?;
    s(buf, &p.user_id, "user_id property")?;
    s(buf, &p.app_id, "app_id property")?;
    s(buf, &p.cluster_id, "cluster_id property")?;
    Ok(())
}

/// Reads property flags and values (the part of a content header after body-size).
pub fn decode_properties(d: &mut Decoder<'_>) -> Result<BasicProperties> {
    let flags = d.u16("property flags")?;
    // Continuation words (bit 0): the basic class defines only 14 properties, so any further
    // flag word must be empty.
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
    let has = |flag: u16| flags & flag != 0;
    let mut p = BasicProperties::default();
    if has(FLAG_CONTENT_TYPE) {
        p.content_type = Some(d.short_str("content_type property")?);
    }
    if has(FLAG_CONTENT_ENCODING) {
        p.content_encoding = Some(d.short_str("content_encoding property")?);
    }
    if has(FLAG_HEADERS) {
        p.headers = Some(d.table()?);
    }
    if has(FLAG_DELIVERY_MODE) {
        p.delivery_mode = Some(d.u8("delivery_mode property")?);
    }
    if has(FLAG_PRIORITY) {
        p.priority = Some(d.u8("priority property")?);
    }
    if has(FLAG_CORRELATION_ID) {
        p.correlation_id = Some(d.short_str("correlation_id property")?);
    }
    if has(FLAG_REPLY_TO) {
        p.reply_to = Some(d.short_str("reply_to property")?);
    }
    if has(FLAG_EXPIRATION) {
        p.expiration = Some(d.short_str("expiration property")?);
    }
    if has(FLAG_MESSAGE_ID) {
        p.message_id = Some(d.short_str("message_id property")?);
    }
    if has(FLAG_TIMESTAMP) {
        p.timestamp = Some(d.u64("timestamp property")?);
    }
    if has(FLAG_TYPE) {
        p.kind = Some(d.short_str("type property")?);
    }
    if has(FLAG_USER_ID) {
        p.user_id = Some(d.short_str("user_id property")?);
    }
    if has(FLAG_APP_ID) {
        p.app_id = Some(d.short_str("app_id property")?);
    }
    if has(FLAG_CLUSTER_ID) {
        p.cluster_id = Some(d.short_str("cluster_id property")?);
    }
    Ok(p)
}

/// A decoded content header frame payload.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentHeader {
    pub class_id: u16,
    /// Total body size in bytes, split over the following body frames.
    pub body_size: u64,
    /// The properties, or the reason they could not be read (e.g. a value not valid UTF-8).
    /// Kept apart from the frame structure so that one bad message does not end the connection.
    pub properties: Result<BasicProperties>,
}

/// Decodes a content header frame payload: class-id, weight, body-size, then the properties.
/// An error in the fixed 12-byte prefix is returned as the outer error.
pub fn decode_content_header(payload: &[u8]) -> Result<ContentHeader> {
    let mut d = Decoder::new(payload);
    let class_id = d.u16("content header class")?;
    let _weight = d.u16("content header weight")?;
    let body_size = d.u64("content body size")?;
    let properties = decode_properties(&mut d);
    Ok(ContentHeader {
        class_id,
        body_size,
        properties,
    })
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------

/// The 7-byte header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// Frame type (`FRAME_METHOD`, `FRAME_HEADER`, `FRAME_BODY`, `FRAME_HEARTBEAT`).
    pub kind: u8,
    pub channel: u16,
    /// Payload size in bytes (without header and end octet).
    pub size: u32,
}

impl FrameHead {
    /// Reads a frame header from the first 7 bytes of `buf`; `None` when fewer are present.
    pub fn parse(buf: &[u8]) -> Option<FrameHead> {
        if buf.len() < FRAME_HEADER_SIZE {
            return None;
        }
        Some(FrameHead {
            kind: buf[0],
            channel: u16::from_be_bytes([buf[1], buf[2]]),
            size: u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]),
        })
    }

    /// Total bytes of the frame on the wire.
    pub fn total_len(&self) -> usize {
        self.size as usize + FRAME_OVERHEAD
    }
}

/// A frame borrowed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub kind: u8,
    pub channel: u16,
    pub payload: &'a [u8],
}

/// Human name of a frame type, for logs.
pub fn frame_kind_name(kind: u8) -> &'static str {
    match kind {
        FRAME_METHOD => "method",
        FRAME_HEADER => "header",
        FRAME_BODY => "body",
        FRAME_HEARTBEAT => "heartbeat",
        _ => "unknown",
    }
}

/// Parses one frame at the start of `buf`. `Ok(None)` when the frame is not complete yet;
/// `Ok(Some((frame, consumed)))` otherwise. A payload larger than `max_payload` bytes, an
/// unknown frame type or a wrong end octet is an error.
pub fn parse_frame(buf: &[u8], max_payload: usize) -> Result<Option<(Frame<'_>, usize)>> {
    let Some(head) = FrameHead::parse(buf) else {
        return Ok(None);
    };
    check_frame_head(&head, max_payload)?;
    let total = head.total_len();
    if buf.len() < total {
        return Ok(None);
    }
    if buf[total - 1] != FRAME_END {
        return Err(malformed(format_args!(
            "frame end octet is 0x{:02x}, expected 0xce",
            buf[total - 1]
        )));
    }
    Ok(Some((
        Frame {
            kind: head.kind,
            channel: head.channel,
            payload: &buf[FRAME_HEADER_SIZE..total - 1],
        },
        total,
    )))
}

/// Checks a frame header before its payload is read: known type, payload within `max_payload`.
pub fn check_frame_head(head: &FrameHead, max_payload: usize) -> Result<()> {
    if !matches!(
        head.kind,
        FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
    ) {
        return Err(malformed(format_args!("unknown frame type {}", head.kind)));
    }
    if head.size as usize > max_payload {
        return Err(malformed(format_args!(
            "frame payload of {} bytes exceeds the negotiated maximum of {max_payload}",
            head.size
        )));
    }
    Ok(())
}

/// Starts a frame in `buf`; returns the frame's start index for [`end_frame`].
pub fn begin_frame(buf: &mut Vec<u8>, kind: u8, channel: u16) -> usize {
    let start = buf.len();
    buf.push(kind);
    buf.extend_from_slice(&channel.to_be_bytes());
    buf.extend_from_slice(&[0; 4]);
    start
}

/// Finishes the frame begun at `start`: writes its size and the end octet. A payload larger than
/// `frame_max - 8` bytes (`frame_max` 0 = no limit) is an `Error::Amqp`.
pub fn end_frame(buf: &mut Vec<u8>, start: usize, frame_max: u32) -> Result<()> {
    let size = buf.len() - start - FRAME_HEADER_SIZE;
    if frame_max != 0 && size + FRAME_OVERHEAD > frame_max as usize {
        let kind = buf[start];
        buf.truncate(start);
        return Err(Error::Amqp(format!(
            "{} frame of {} bytes exceeds the negotiated frame_max of {frame_max} bytes",
            frame_kind_name(kind),
            size + FRAME_OVERHEAD
        )));
    }
    let size32 = u32::try_from(size)
        .map_err(|_| Error::Amqp(format!("frame payload of {size} bytes is too long")))?;
    buf[start + 3..start + 7].copy_from_slice(&size32.to_be_bytes());
    buf.push(FRAME_END);
    Ok(())
}

/// Appends a heartbeat frame.
pub fn put_heartbeat(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Appends one method frame.
pub fn put_method_frame(
    buf: &mut Vec<u8>,
    channel: u16,
    method: &Method,
    frame_max: u32,
) -> Result<()> {
    let start = begin_frame(buf, FRAME_METHOD, channel);
    if let Err(e) = method.encode(buf) {
        buf.truncate(start);
        return Err(e);
    }
    end_frame(buf, start, frame_max)
}

/// Appends a content header frame (class `basic`, weight 0).
pub fn put_content_header_frame(
    buf: &mut Vec<u8>,
    channel: u16,
    body_size: u64,
    properties: &BasicProperties,
    frame_max: u32,
) -> Result<()> {
    let start = begin_frame(buf, FRAME_HEADER, channel);
    buf.extend_from_slice(&CLASS_BASIC.to_be_bytes());
    buf.extend_from_slice(&0u16.to_be_bytes());
    buf.extend_from_slice(&body_size.to_be_bytes());
    if let Err(e) = put_properties(buf, properties) {
        buf.truncate(start);
        return Err(e);
    }
    end_frame(buf, start, frame_max)
}

/// Appends body frames carrying `body`, each at most `frame_max` bytes on the wire
/// (`frame_max` 0, "no limit", uses 131072-byte frames). An empty body gives no frame.
pub fn put_body_frames(buf: &mut Vec<u8>, channel: u16, body: &[u8], frame_max: u32) {
    let frame_max = if frame_max == 0 { 131_072 } else { frame_max };
    let chunk = (frame_max as usize).saturating_sub(FRAME_OVERHEAD).max(1);
    buf.reserve(body.len() + body.len().div_ceil(chunk) * FRAME_OVERHEAD);
    for part in body.chunks(chunk) {
        buf.push(FRAME_BODY);
        buf.extend_from_slice(&channel.to_be_bytes());
        buf.extend_from_slice(&(part.len() as u32).to_be_bytes());
        buf.extend_from_slice(part);
        buf.push(FRAME_END);
    }
}

/// Appends the frames of one `basic.publish`: method, content header and body frames. The
/// returned buffer is meant to be written with a single write call.
#[allow(clippy::too_many_arguments)]
pub fn put_publish(
    buf: &mut Vec<u8>,
    channel: u16,
    exchange: &str,
    routing_key: &str,
    mandatory: bool,
    properties: &BasicProperties,
    body: &[u8],
    frame_max: u32,
) -> Result<()> {
    let start = buf.len();
    let r = (|| {
        let f = begin_frame(buf, FRAME_METHOD, channel);
        buf.extend_from_slice(&CLASS_BASIC.to_be_bytes());
        buf.extend_from_slice(&40u16.to_be_bytes());
        buf.extend_from_slice(&0u16.to_be_bytes());
        put_short_str(buf, exchange, "exchange name")?;
        put_short_str(buf, routing_key, "routing key")?;
        buf.push(bits(&[mandatory, false]));
        end_frame(buf, f, frame_max)?;
        put_content_header_frame(buf, channel, body.len() as u64, properties, frame_max)
    })();
    if let Err(e) = r {
        buf.truncate(start);
        return Err(e);
    }
    put_body_frames(buf, channel, body, frame_max);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Methods
// ---------------------------------------------------------------------------------------------

/// Bytes that must never be printed (the SASL response of connection.start-ok holds the
/// password): `Debug` shows `****`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}

/// The AMQP 0-9-1 methods this client sends or receives, with their arguments (reserved
/// arguments are written as zero/empty and skipped when read).
///
/// The exchange and routing key of `basic.deliver`, `basic.get-ok` and `basic.return` are kept
/// as raw bytes: a routing key that is not UTF-8 then fails that one message, not the connection.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Method {
    ConnectionStart {
        version_major: u8,
        version_minor: u8,
        server_properties: FieldTable,
        mechanisms: Vec<u8>,
        locales: Vec<u8>,
    },
    ConnectionStartOk {
        client_properties: FieldTable,
        mechanism: String,
        /// The SASL response: it holds the password, and its Debug prints `****`.
        response: Secret,
        locale: String,
    },
    ConnectionSecure {
        challenge: Vec<u8>,
    },
    ConnectionSecureOk {
        response: Vec<u8>,
    },
    ConnectionTune {
        channel_max: u16,
        frame_max: u32,
        heartbeat: u16,
    },
    ConnectionTuneOk {
        channel_max: u16,
        frame_max: u32,
        heartbeat: u16,
    },
    ConnectionOpen {
        vhost: String,
    },
    ConnectionOpenOk,
    ConnectionClose {
        reply_code: u16,
        reply_text: String,
        class_id: u16,
        method_id: u16,
    },
    ConnectionCloseOk,
    ConnectionBlocked {
        reason: String,
    },
    ConnectionUnblocked,
    ChannelOpen,
    ChannelOpenOk,
    ChannelFlow {
        active: bool,
    },
    ChannelFlowOk {
        active: bool,
    },
    ChannelClose {
        reply_code: u16,
        reply_text: String,
        class_id: u16,
        method_id: u16,
    },
    ChannelCloseOk,
    ExchangeDeclare {
        exchange: String,
        kind: String,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    ExchangeDeclareOk,
    ExchangeDelete {
        exchange: String,
        if_unused: bool,
        no_wait: bool,
    },
    ExchangeDeleteOk,
    ExchangeBind {
        destination: String,
        source: String,
        routing_key: String,
        no_wait: bool,
        arguments: FieldTable,
    },
    ExchangeBindOk,
    QueueDeclare {
        queue: String,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    QueueDeclareOk {
        queue: String,
        message_count: u32,
        consumer_count: u32,
    },
    QueueBind {
        queue: String,
        exchange: String,
        routing_key: String,
        no_wait: bool,
        arguments: FieldTable,
    },
    QueueBindOk,
    QueuePurge {
        queue: String,
        no_wait: bool,
    },
    QueuePurgeOk {
        message_count: u32,
    },
    QueueDelete {
        queue: String,
        if_unused: bool,
        if_empty: bool,
        no_wait: bool,
    },
    QueueDeleteOk {
        message_count: u32,
    },
    QueueUnbind {
        queue: String,
        exchange: String,
        routing_key: String,
        arguments: FieldTable,
    },
    QueueUnbindOk,
    BasicQos {
        prefetch_size: u32,
        prefetch_count: u16,
        global: bool,
    },
    BasicQosOk,
    BasicConsume {
        queue: String,
        consumer_tag: String,
        no_local: bool,
        no_ack: bool,
        exclusive: bool,
        no_wait: bool,
        arguments: FieldTable,
    },
    BasicConsumeOk {
        consumer_tag: String,
    },
    BasicCancel {
        consumer_tag: String,
        no_wait: bool,
    },
    BasicCancelOk {
        consumer_tag: String,
    },
    BasicPublish {
        exchange: String,
        routing_key: String,
        mandatory: bool,
        immediate: bool,
    },
    BasicReturn {
        reply_code: u16,
        reply_text: Vec<u8>,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
    },
    BasicDeliver {
        consumer_tag: String,
        delivery_tag: u64,
        redelivered: bool,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
    },
    BasicGet {
        queue: String,
        no_ack: bool,
    },
    BasicGetOk {
        delivery_tag: u64,
        redelivered: bool,
        exchange: Vec<u8>,
        routing_key: Vec<u8>,
        message_count: u32,
    },
    BasicGetEmpty,
    BasicAck {
        delivery_tag: u64,
        multiple: bool,
    },
    BasicReject {
        delivery_tag: u64,
        requeue: bool,
    },
    BasicRecover {
        requeue: bool,
    },
    BasicRecoverOk,
    BasicNack {
        delivery_tag: u64,
        multiple: bool,
        requeue: bool,
    },
    ConfirmSelect {
        no_wait: bool,
    },
    ConfirmSelectOk,
    /// A method this client does not know; logged and ignored.
    Unknown {
        class_id: u16,
        method_id: u16,
    },
}

impl Method {
    /// (class-id, method-id) of the method.
    pub fn ids(&self) -> (u16, u16) {
        use Method::*;
        match self {
            ConnectionStart { .. } => (10, 10),
            ConnectionStartOk { .. } => (10, 11),
            ConnectionSecure { .. } => (10, 20),
            ConnectionSecureOk { .. } => (10, 21),
            ConnectionTune { .. } => (10, 30),
            ConnectionTuneOk { .. } => (10, 31),
            ConnectionOpen { .. } => (10, 40),
            ConnectionOpenOk => (10, 41),
            ConnectionClose { .. } => (10, 50),
            ConnectionCloseOk => (10, 51),
            ConnectionBlocked { .. } => (10, 60),
            ConnectionUnblocked => (10, 61),
            ChannelOpen => (20, 10),
            ChannelOpenOk => (20, 11),
            ChannelFlow { .. } => (20, 20),
            ChannelFlowOk { .. } => (20, 21),
            ChannelClose { .. } => (20, 40),
            ChannelCloseOk => (20, 41),
            ExchangeDeclare { .. } => (40, 10),
            ExchangeDeclareOk => (40, 11),
            ExchangeDelete { .. } => (40, 20),
            ExchangeDeleteOk => (40, 21),
            ExchangeBind { .. } => (40, 30),
            ExchangeBindOk => (40, 31),
            QueueDeclare { .. } => (50, 10),
            QueueDeclareOk { .. } => (50, 11),
            QueueBind { .. } => (50, 20),
            QueueBindOk => (50, 21),
            QueuePurge { .. } => (50, 30),
            QueuePurgeOk { .. } => (50, 31),
            QueueDelete { .. } => (50, 40),
            QueueDeleteOk { .. } => (50, 41),
            QueueUnbind { .. } => (50, 50),
            QueueUnbindOk => (50, 51),
            BasicQos { .. } => (60, 10),
            BasicQosOk => (60, 11),
            BasicConsume { .. } => (60, 20),
            BasicConsumeOk { .. } => (60, 21),
            BasicCancel { .. } => (60, 30),
            BasicCancelOk { .. } => (60, 31),
            BasicPublish { .. } => (60, 40),
            BasicReturn { .. } => (60, 50),
            BasicDeliver { .. } => (60, 60),
            BasicGet { .. } => (60, 70),
            BasicGetOk { .. } => (60, 71),
            BasicGetEmpty => (60, 72),
            BasicAck { .. } => (60, 80),
            BasicReject { .. } => (60, 90),
            BasicRecover { .. } => (60, 110),
            BasicRecoverOk => (60, 111),
            BasicNack { .. } => (60, 120),
            ConfirmSelect { .. } => (85, 10),
            ConfirmSelectOk => (85, 11),
            Unknown {
                class_id,
                method_id,
            } => (*class_id, *method_id),
        }
    }

    /// The method's name as in the specification (`basic.deliver`), for logs and errors.
    pub fn name(&self) -> &'static str {
        method_name(self.ids())
    }

    /// True for methods followed by a content header and body (publish, return, deliver, get-ok).
    pub fn has_content(&self) -> bool {
        matches!(
            self,
            Method::BasicPublish { .. }
                | Method::BasicReturn { .. }
                | Method::BasicDeliver { .. }
                | Method::BasicGetOk { .. }
        )
    }

    /// Appends the method payload (class-id, method-id, arguments) to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) -> Result<()> {
        use Method::*;
        let (class_id, method_id) = self.ids();
        buf.extend_from_slice(&class_id.to_be_bytes());
        buf.extend_from_slice(&method_id.to_be_bytes());
        let u16_ = |buf: &mut Vec<u8>, v: u16| buf.extend_from_slice(&v.to_be_bytes());
        let u32_ = |buf: &mut Vec<u8>, v: u32| buf.extend_from_slice(&v.to_be_bytes());
        let u64_ = |buf: &mut Vec<u8>, v: u64| buf.extend_from_slice(&v.to_be_bytes());
        match self {
            ConnectionStart {
                version_major,
                version_minor,
                server_properties,
                mechanisms,
                locales,
            } => {
                buf.push(*version_major);
                buf.push(*version_minor);
                put_table(buf, server_properties)?;
                put_long_bytes(buf, mechanisms, "mechanisms")?;
                put_long_bytes(buf, locales, "locales")?;
            }
            ConnectionStartOk {
                client_properties,
                mechanism,
                response,
                locale,
            } => {
                put_table(buf, client_properties)?;
                put_short_str(buf, mechanism, "mechanism")?;
                put_long_bytes(buf, &response.0, "response")?;
                put_short_str(buf, locale, "locale")?;
            }
            ConnectionSecure { challenge } => put_long_bytes(buf, challenge, "challenge")?,
            ConnectionSecureOk { response } => put_long_bytes(buf, response, "response")?,
            ConnectionTune {
                channel_max,
                frame_max,
                heartbeat,
            }
            | ConnectionTuneOk {
                channel_max,
                frame_max,
                heartbeat,
            } => {
                u16_(buf, *channel_max);
                u32_(buf, *frame_max);
                u16_(buf, *heartbeat);
            }
            ConnectionOpen { vhost } => {
                put_short_str(buf, vhost, "vhost")?;
                buf.push(0); // reserved-1 (capabilities), empty short string
                buf.push(0); // reserved-2 (insist)
            }
            ConnectionOpenOk => buf.push(0),
            ConnectionClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            }
            | ChannelClose {
                reply_code,
                reply_text,
                class_id,
                method_id,
            } => {
                u16_(buf, *reply_code);
                put_short_str(buf, reply_text, "reply text")?;
                u16_(buf, *class_id);
                u16_(buf, *method_id);
            }
            ConnectionCloseOk | ConnectionUnblocked | ChannelCloseOk | ExchangeDeclareOk
            | ExchangeDeleteOk | ExchangeBindOk | QueueBindOk | QueueUnbindOk | BasicQosOk
            | BasicRecoverOk | ConfirmSelectOk => {}
            ConnectionBlocked { reason } => put_short_str(buf, reason, "reason")?,
            ChannelOpen => buf.push(0),
            ChannelOpenOk => u32_(buf, 0),
            ChannelFlow { active } | ChannelFlowOk { active } => buf.push(*active as u8),
            ExchangeDeclare {
                exchange,
                kind,
                passive,
                durable,
                auto_delete,
                internal,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, kind, "exchange type")?;
                buf.push(bits(&[
                    *passive,
                    *durable,
                    *auto_delete,
                    *internal,
                    *no_wait,
                ]));
                put_table(buf, arguments)?;
            }
            ExchangeDelete {
                exchange,
                if_unused,
                no_wait,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                buf.push(bits(&[*if_unused, *no_wait]));
            }
            ExchangeBind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, destination, "exchange name")?;
                put_short_str(buf, source, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*no_wait]));
                put_table(buf, arguments)?;
            }
            QueueDeclare {
                queue,
                passive,
                durable,
                exclusive,
                auto_delete,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[
                    *passive,
                    *durable,
                    *exclusive,
                    *auto_delete,
                    *no_wait,
                ]));
                put_table(buf, arguments)?;
            }
            QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            } => {
                put_short_str(buf, queue, "queue name")?;
                u32_(buf, *message_count);
                u32_(buf, *consumer_count);
            }
            QueueBind {
                queue,
                exchange,
                routing_key,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*no_wait]));
                put_table(buf, arguments)?;
            }
            QueuePurge { queue, no_wait } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*no_wait]));
            }
            QueuePurgeOk { message_count } | QueueDeleteOk { message_count } => {
                u32_(buf, *message_count)
            }
            QueueDelete {
                queue,
                if_unused,
                if_empty,
                no_wait,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*if_unused, *if_empty, *no_wait]));
            }
            QueueUnbind {
                queue,
                exchange,
                routing_key,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                put_table(buf, arguments)?;
            }
            BasicQos {
                prefetch_size,
                prefetch_count,
                global,
            } => {
                u32_(buf, *prefetch_size);
                u16_(buf, *prefetch_count);
                buf.push(bits(&[*global]));
            }
            BasicConsume {
                queue,
                consumer_tag,
                no_local,
                no_ack,
                exclusive,
                no_wait,
                arguments,
            } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                put_short_str(buf, consumer_tag, "consumer tag")?;
                buf.push(bits(&[*no_local, *no_ack, *exclusive, *no_wait]));
                put_table(buf, arguments)?;
            }
            BasicConsumeOk { consumer_tag } | BasicCancelOk { consumer_tag } => {
                put_short_str(buf, consumer_tag, "consumer tag")?
            }
            BasicCancel {
                consumer_tag,
                no_wait,
            } => {
                put_short_str(buf, consumer_tag, "consumer tag")?;
                buf.push(bits(&[*no_wait]));
            }
            BasicPublish {
                exchange,
                routing_key,
                mandatory,
                immediate,
            } => {
                u16_(buf, 0);
                put_short_str(buf, exchange, "exchange name")?;
                put_short_str(buf, routing_key, "routing key")?;
                buf.push(bits(&[*mandatory, *immediate]));
            }
            BasicReturn {
                reply_code,
                reply_text,
                exchange,
                routing_key,
            } => {
                u16_(buf, *reply_code);
                put_short_bytes(buf, reply_text, "reply text")?;
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
            }
            BasicDeliver {
                consumer_tag,
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
            } => {
                put_short_str(buf, consumer_tag, "consumer tag")?;
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*redelivered]));
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
            }
            BasicGet { queue, no_ack } => {
                u16_(buf, 0);
                put_short_str(buf, queue, "queue name")?;
                buf.push(bits(&[*no_ack]));
            }
            BasicGetOk {
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
                message_count,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*redelivered]));
                put_short_bytes(buf, exchange, "exchange name")?;
                put_short_bytes(buf, routing_key, "routing key")?;
                u32_(buf, *message_count);
            }
            BasicGetEmpty => buf.push(0),
            BasicAck {
                delivery_tag,
                multiple,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*multiple]));
            }
            BasicReject {
                delivery_tag,
                requeue,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*requeue]));
            }
            BasicRecover { requeue } => buf.push(bits(&[*requeue])),
            BasicNack {
                delivery_tag,
                multiple,
                requeue,
            } => {
                u64_(buf, *delivery_tag);
                buf.push(bits(&[*multiple, *requeue]));
            }
            ConfirmSelect { no_wait } => buf.push(bits(&[*no_wait])),
            Unknown { .. } => {
                return Err(Error::Amqp(format!(
                    "cannot encode unknown method {class_id}.{method_id}"
                )))
            }
        }
        Ok(())
    }

    /// Decodes a method frame payload. Unknown (class, method) pairs give [`Method::Unknown`];
    /// truncated arguments give an error. Bytes after the last argument are ignored.
    pub fn decode(payload: &[u8]) -> Result<Method> {
        use Method::*;
        let mut d = Decoder::new(payload);
        let class_id = d.u16("method class id")?;
        let method_id = d.u16("method id")?;
        let d = &mut d;
        let m = match (class_id, method_id) {
            (10, 10) => ConnectionStart {
                version_major: d.u8("version-major")?,
                version_minor: d.u8("version-minor")?,
                server_properties: d.table()?,
                mechanisms: d.long_bytes("mechanisms")?.to_vec(),
                locales: d.long_bytes("locales")?.to_vec(),
            },
            (10, 11) => ConnectionStartOk {
                client_properties: d.table()?,
                mechanism: d.short_str("mechanism")?,
                response: Secret(d.long_bytes("response")?.to_vec()),
                locale: d.short_str("locale")?,
            },
            (10, 20) => ConnectionSecure {
                challenge: d.long_bytes("challenge")?.to_vec(),
            },
            (10, 21) => ConnectionSecureOk {
                response: d.long_bytes("response")?.to_vec(),
            },
            (10, 30) => ConnectionTune {
                channel_max: d.u16("channel-max")?,
                frame_max: d.u32("frame-max")?,
                heartbeat: d.u16("heartbeat")?,
            },
            (10, 31) => ConnectionTuneOk {
                channel_max: d.u16("channel-max")?,
                frame_max: d.u32("frame-max")?,
                heartbeat: d.u16("heartbeat")?,
            },
            (10, 40) => {
                let vhost = d.short_str("vhost")?;
                d.short_bytes("reserved")?;
                d.u8("reserved")?;
                ConnectionOpen { vhost }
            }
            (10, 41) => ConnectionOpenOk,
            (10, 50) => ConnectionClose {
                reply_code: d.u16("reply code")?,
                reply_text: lossy(d.short_bytes("reply text")?),
                class_id: d.u16("class id")?,
                method_id: d.u16("method id")?,
            },
            (10, 51) => ConnectionCloseOk,
            (10, 60) => ConnectionBlocked {
                reason: lossy(d.short_bytes("reason")?),
            },
            (10, 61) => ConnectionUnblocked,
            (20, 10) => ChannelOpen,
            (20, 11) => ChannelOpenOk,
            (20, 20) => ChannelFlow {
                active: bit(d.u8("active")?, 0),
            },
            (20, 21) => ChannelFlowOk {
                active: bit(d.u8("active")?, 0),
            },
            (20, 40) => ChannelClose {
                reply_code: d.u16("reply code")?,
                reply_text: lossy(d.short_bytes("reply text")?),
                class_id: d.u16("class id")?,
                method_id: d.u16("method id")?,
            },
            (20, 41) => ChannelCloseOk,
            (40, 10) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let kind = d.short_str("exchange type")?;
                let b = d.u8("flags")?;
                ExchangeDeclare {
                    exchange,
                    kind,
                    passive: bit(b, 0),
                    durable: bit(b, 1),
                    auto_delete: bit(b, 2),
                    internal: bit(b, 3),
                    no_wait: bit(b, 4),
                    arguments: d.table()?,
                }
            }
            (40, 11) => ExchangeDeclareOk,
            (40, 20) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let b = d.u8("flags")?;
                ExchangeDelete {
                    exchange,
                    if_unused: bit(b, 0),
                    no_wait: bit(b, 1),
                }
            }
            (40, 21) => ExchangeDeleteOk,
            (40, 30) => {
                d.u16("reserved")?;
                ExchangeBind {
                    destination: d.short_str("exchange name")?,
                    source: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    no_wait: bit(d.u8("flags")?, 0),
                    arguments: d.table()?,
                }
            }
            (40, 31) => ExchangeBindOk,
            (50, 10) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let b = d.u8("flags")?;
                QueueDeclare {
                    queue,
                    passive: bit(b, 0),
                    durable: bit(b, 1),
                    exclusive: bit(b, 2),
                    auto_delete: bit(b, 3),
                    no_wait: bit(b, 4),
                    arguments: d.table()?,
                }
            }
            (50, 11) => QueueDeclareOk {
                queue: d.short_str("queue name")?,
                message_count: d.u32("message count")?,
                consumer_count: d.u32("consumer count")?,
            },
            (50, 20) => {
                d.u16("reserved")?;
                QueueBind {
                    queue: d.short_str("queue name")?,
                    exchange: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    no_wait: bit(d.u8("flags")?, 0),
                    arguments: d.table()?,
                }
            }
            (50, 21) => QueueBindOk,
            (50, 30) => {
                d.u16("reserved")?;
                QueuePurge {
                    queue: d.short_str("queue name")?,
                    no_wait: bit(d.u8("flags")?, 0),
                }
            }
            (50, 31) => QueuePurgeOk {
                message_count: d.u32("message count")?,
            },
            (50, 40) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let b = d.u8("flags")?;
                QueueDelete {
                    queue,
                    if_unused: bit(b, 0),
                    if_empty: bit(b, 1),
                    no_wait: bit(b, 2),
                }
            }
            (50, 41) => QueueDeleteOk {
                message_count: d.u32("message count")?,
            },
            (50, 50) => {
                d.u16("reserved")?;
                QueueUnbind {
                    queue: d.short_str("queue name")?,
                    exchange: d.short_str("exchange name")?,
                    routing_key: d.short_str("routing key")?,
                    arguments: d.table()?,
                }
            }
            (50, 51) => QueueUnbindOk,
            (60, 10) => BasicQos {
                prefetch_size: d.u32("prefetch size")?,
                prefetch_count: d.u16("prefetch count")?,
                global: bit(d.u8("flags")?, 0),
            },
            (60, 11) => BasicQosOk,
            (60, 20) => {
                d.u16("reserved")?;
                let queue = d.short_str("queue name")?;
                let consumer_tag = d.short_str("consumer tag")?;
                let b = d.u8("flags")?;
                BasicConsume {
                    queue,
                    consumer_tag,
                    no_local: bit(b, 0),
                    no_ack: bit(b, 1),
                    exclusive: bit(b, 2),
                    no_wait: bit(b, 3),
                    arguments: d.table()?,
                }
            }
            (60, 21) => BasicConsumeOk {
                consumer_tag: d.short_str("consumer tag")?,
            },
            (60, 30) => BasicCancel {
                consumer_tag: d.short_str("consumer tag")?,
                no_wait: bit(d.u8("flags")?, 0),
            },
            (60, 31) => BasicCancelOk {
                consumer_tag: d.short_str("consumer tag")?,
            },
            (60, 40) => {
                d.u16("reserved")?;
                let exchange = d.short_str("exchange name")?;
                let routing_key = d.short_str("routing key")?;
                let b = d.u8("flags")?;
                BasicPublish {
                    exchange,
                    routing_key,
                    mandatory: bit(b, 0),
                    immediate: bit(b, 1),
                }
            }
            (60, 50) => BasicReturn {
                reply_code: d.u16("reply code")?,
                reply_text: d.short_bytes("reply text")?.to_vec(),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
            },
            (60, 60) => BasicDeliver {
                consumer_tag: d.short_str("consumer tag")?,
                delivery_tag: d.u64("delivery tag")?,
                redelivered: bit(d.u8("flags")?, 0),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
            },
            (60, 70) => {
                d.u16("reserved")?;
                BasicGet {
                    queue: d.short_str("queue name")?,
                    no_ack: bit(d.u8("flags")?, 0),
                }
            }
            (60, 71) => BasicGetOk {
                delivery_tag: d.u64("delivery tag")?,
                redelivered: bit(d.u8("flags")?, 0),
                exchange: d.short_bytes("exchange name")?.to_vec(),
                routing_key: d.short_bytes("routing key")?.to_vec(),
                message_count: d.u32("message count")?,
            },
            (60, 72) => BasicGetEmpty,
            (60, 80) => BasicAck {
                delivery_tag: d.u64("delivery tag")?,
                multiple: bit(d.u8("flags")?, 0),
            },
            (60, 90) => BasicReject {
                delivery_tag: d.u64("delivery tag")?,
                requeue: bit(d.u8("flags")?, 0),
            },
            (60, 110) => BasicRecover {
                requeue: bit(d.u8("flags")?, 0),
            },
            (60, 111) => BasicRecoverOk,
            (60, 120) => {
                let delivery_tag = d.u64("delivery tag")?;
                let b = d.u8("flags")?;
                BasicNack {
                    delivery_tag,
                    multiple: bit(b, 0),
                    requeue: bit(b, 1),
                }
            }
            (85, 10) => ConfirmSelect {
                no_wait: bit(d.u8("flags")?, 0),
            },
            (85, 11) => ConfirmSelectOk,
            _ => Unknown {
                class_id,
                method_id,
            },
        };
        Ok(m)
    }
}

/// Texts written by the broker for people (reply texts, blocked reasons): invalid UTF-8 is
/// replaced rather than failing, since no message data is involved.
fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The specification name of a method, from its (class-id, method-id).
pub fn method_name(ids: (u16, u16)) -> &'static str {
    match ids {
        (10, 10) => "connection.start",
        (10, 11) => "connection.start-ok",
        (10, 20) => "connection.secure",
        (10, 21) => "connection.secure-ok",
        (10, 30) => "connection.tune",
        (10, 31) => "connection.tune-ok",
        (10, 40) => "connection.open",
        (10, 41) => "connection.open-ok",
        (10, 50) => "connection.close",
        (10, 51) => "connection.close-ok",
        (10, 60) => "connection.blocked",
        (10, 61) => "connection.unblocked",
        (20, 10) => "channel.open",
        (20, 11) => "channel.open-ok",
        (20, 20) => "channel.flow",
        (20, 21) => "channel.flow-ok",
        (20, 40) => "channel.close",
        (20, 41) => "channel.close-ok",
        (40, 10) => "exchange.declare",
        (40, 11) => "exchange.declare-ok",
        (40, 20) => "exchange.delete",
        (40, 21) => "exchange.delete-ok",
        (40, 30) => "exchange.bind",
        (40, 31) => "exchange.bind-ok",
        (50, 10) => "queue.declare",
        (50, 11) => "queue.declare-ok",
        (50, 20) => "queue.bind",
        (50, 21) => "queue.bind-ok",
        (50, 30) => "queue.purge",
        (50, 31) => "queue.purge-ok",
        (50, 40) => "queue.delete",
        (50, 41) => "queue.delete-ok",
        (50, 50) => "queue.unbind",
        (50, 51) => "queue.unbind-ok",
        (60, 10) => "basic.qos",
        (60, 11) => "basic.qos-ok",
        (60, 20) => "basic.consume",
        (60, 21) => "basic.consume-ok",
        (60, 30) => "basic.cancel",
        (60, 31) => "basic.cancel-ok",
        (60, 40) => "basic.publish",
        (60, 50) => "basic.return",
        (60, 60) => "basic.deliver",
        (60, 70) => "basic.get",
        (60, 71) => "basic.get-ok",
        (60, 72) => "basic.get-empty",
        (60, 80) => "basic.ack",
        (60, 90) => "basic.reject",
        (60, 110) => "basic.recover",
        (60, 111) => "basic.recover-ok",
        (60, 120) => "basic.nack",
        (85, 10) => "confirm.select",
        (85, 11) => "confirm.select-ok",
        _ => "unknown method",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes one value, decodes it, encodes again: identical bytes and the expected code.
    fn roundtrip_value(v: &FieldValue, code: u8) {
        let mut a = Vec::new();
        put_field_value(&mut a, v).unwrap();
        assert_eq!(a[0], code, "type code of {v:?}");
        let mut d = Decoder::new(&a);
        let back = d.field_value().unwrap();
        assert!(d.is_empty(), "decoder left bytes for {v:?}");
        let mut b = Vec::new();
        put_field_value(&mut b, &back).unwrap();
        assert_eq!(a, b, "re-encoded bytes of {v:?}");
        // NaN != NaN: compare bytes above, values here only when comparable.
        if !matches!(back, FieldValue::F32(x) if x.is_nan())
            && !matches!(back, FieldValue::F64(x) if x.is_nan())
        {
            assert_eq!(&back, v);
        }
    }

    fn every_value() -> Vec<(FieldValue, u8)> {
        vec![
            (FieldValue::Bool(true), b't'),
            (FieldValue::Bool(false), b't'),
            (FieldValue::I8(-128), b'b'),
            (FieldValue::U8(255), b'B'),
            (FieldValue::I16(-32768), b's'),
            (FieldValue::U16(65535), b'u'),
            (FieldValue::I32(i32::MIN), b'I'),
            (FieldValue::U32(u32::MAX), b'i'),
            (FieldValue::I64(i64::MIN), b'l'),
            (FieldValue::F32(1.5), b'f'),
            (FieldValue::F32(f32::NAN), b'f'),
            (FieldValue::F64(-2.25e300), b'd'),
            (FieldValue::F64(f64::from_bits(0x7ff8_dead_beef_0001)), b'd'),
            (
                FieldValue::Decimal {
                    scale: 2,
                    value: 12345,
                },
                b'D',
            ),
            (FieldValue::LongString(b"hello".to_vec()), b'S'),
            (FieldValue::LongString(vec![0xff, 0xfe, 0x00, 0xc3]), b'S'),
            (FieldValue::LongString(Vec::new()), b'S'),
            (
                FieldValue::Array(vec![
                    FieldValue::I32(1),
                    FieldValue::LongString(b"a".to_vec()),
                    FieldValue::Void,
                ]),
                b'A',
            ),
            (FieldValue::Array(Vec::new()), b'A'),
            (FieldValue::Timestamp(1_700_000_000), b'T'),
            (
                FieldValue::Table(vec![("k".into(), FieldValue::U8(1))]),
                b'F',
            ),
            (FieldValue::Table(Vec::new()), b'F'),
            (FieldValue::Void, b'V'),
            (FieldValue::Bytes(vec![0, 1, 2, 0xff]), b'x'),
        ]
    }

    #[test]
    fn every_type_code_round_trips() {
        for (v, code) in every_value() {
            roundtrip_value(&v, code);
        }
    }

    #[test]
    fn exact_wire_bytes() {
        let mut b = Vec::new();
        put_field_value(&mut b, &FieldValue::I16(-2)).unwrap();
        assert_eq!(b, [b's', 0xff, 0xfe]);
        b.clear();
        put_field_value(
            &mut b,
            &FieldValue::Decimal {
                scale: 3,
                value: 0x01020304,
            },
        )
        .unwrap();
        assert_eq!(b, [b'D', 3, 1, 2, 3, 4]);
        b.clear();
        put_table(&mut b, &vec![("ab".into(), FieldValue::Bool(true))]).unwrap();
        assert_eq!(b, [0, 0, 0, 5, 2, b'a', b'b', b't', 1]);
    }

    #[test]
    fn nested_tables_and_arrays_round_trip() {
        let inner: FieldTable = every_value()
            .into_iter()
            .enumerate()
            .map(|(i, (v, _))| (format!("k{i}"), v))
            .collect();
        let table: FieldTable = vec![
            ("table".into(), FieldValue::Table(inner.clone())),
            (
                "array".into(),
                FieldValue::Array(vec![
                    FieldValue::Table(inner.clone()),
                    FieldValue::Array(vec![FieldValue::Array(vec![FieldValue::I64(7)])]),
                ]),
            ),
            ("empty".into(), FieldValue::Table(Vec::new())),
            ("ünïcödé key".into(), FieldValue::Void),
        ];
        let mut a = Vec::new();
        put_table(&mut a, &table).unwrap();
        let back = Decoder::new(&a).table().unwrap();
        let mut b = Vec::new();
        put_table(&mut b, &back).unwrap();
        assert_eq!(a, b);
        assert_eq!(back.len(), 4);
        assert_eq!(back[0].0, "table");
        assert_eq!(back[3].0, "ünïcödé key");
    }

    #[test]
    fn empty_table() {
        let mut a = Vec::new();
        put_table(&mut a, &Vec::new()).unwrap();
        assert_eq!(a, [0, 0, 0, 0]);
        assert_eq!(Decoder::new(&a).table().unwrap(), Vec::new());
    }

    #[test]
    fn non_utf8_key_is_an_error() {
        let bytes = [0, 0, 0, 4, 2, 0xff, 0xfe, b'V'];
        let err = Decoder::new(&bytes).table().unwrap_err();
        assert!(
            matches!(&err, Error::Amqp(m) if m.contains("not valid UTF-8")),
            "{err}"
        );
    }

    #[test]
    fn unknown_type_code_is_an_error() {
        let bytes = [0, 0, 0, 3, 1, b'k', b'Z'];
        let err = Decoder::new(&bytes).table().unwrap_err();
        assert!(err
            .to_string()
            .contains("unknown field value type code 0x5a"));
    }

    #[test]
    fn short_string_too_long_is_an_error() {
        let key = "k".repeat(256);
        let mut b = Vec::new();
        let err = put_table(&mut b, &vec![(key, FieldValue::Void)]).unwrap_err();
        assert!(err.to_string().contains("at most 255"), "{err}");
    }

    fn all_properties() -> BasicProperties {
        BasicProperties {
            content_type: Some("application/json".into()),
            content_encoding: Some("gzip".into()),
            headers: Some(vec![
                ("x-int".into(), FieldValue::I32(5)),
                ("x-bin".into(), FieldValue::LongString(vec![0x80, 0x81])),
            ]),
            delivery_mode: Some(2),
            priority: Some(9),
            correlation_id: Some("corr".into()),
            reply_to: Some("reply".into()),
            expiration: Some("60000".into()),
            message_id: Some("id-1".into()),
            timestamp: Some(1_700_000_000),
            kind: Some("type".into()),
            user_id: Some("guest".into()),
            app_id: Some("app".into()),
            cluster_id: Some("cluster".into()),
        }
    }

    #[test]
    fn properties_all_and_none() {
        for p in [all_properties(), BasicProperties::default()] {
            let mut a = Vec::new();
            put_properties(&mut a, &p).unwrap();
            let back = decode_properties(&mut Decoder::new(&a)).unwrap();
            assert_eq!(back, p);
            let mut b = Vec::new();
            put_properties(&mut b, &back).unwrap();
            assert_eq!(a, b);
        }
        let mut a = Vec::new();
        put_properties(&mut a, &all_properties()).unwrap();
        assert_eq!(&a[..2], &[0xff, 0xfc], "all 14 flags");
        a.clear();
        put_properties(&mut a, &BasicProperties::default()).unwrap();
        assert_eq!(a, [0, 0]);
    }

    #[test]
    fn each_property_flag_alone() {
        let full = all_properties();
        let singles: Vec<(u16, BasicProperties)> = vec![
            (
                15,
                BasicProperties {
                    content_type: full.content_type.clone(),
                    ..Default::default()
                },
            ),
            (
                13,
                BasicProperties {
                    headers: full.headers.clone(),
                    ..Default::default()
                },
            ),
            (
                12,
                BasicProperties {
                    delivery_mode: Some(1),
                    ..Default::default()
                },
            ),
            (
                6,
                BasicProperties {
                    timestamp: Some(5),
                    ..Default::default()
                },
            ),
            (
                5,
                BasicProperties {
                    kind: Some("t".into()),
                    ..Default::default()
                },
            ),
            (
                2,
                BasicProperties {
                    cluster_id: Some("c".into()),
                    ..Default::default()
                },
            ),
        ];
        for (bitno, p) in singles {
            assert_eq!(property_flags(&p), 1 << bitno);
            let mut a = Vec::new();
            put_properties(&mut a, &p).unwrap();
            assert_eq!(decode_properties(&mut Decoder::new(&a)).unwrap(), p);
        }
    }

    #[test]
    fn non_utf8_property_is_an_error() {
        // content_type flag, short string with invalid UTF-8.
        let bytes = [0x80, 0x00, 2, 0xc3, 0x28];
        let err = decode_properties(&mut Decoder::new(&bytes)).unwrap_err();
        assert!(
            matches!(&err, Error::Amqp(m) if m.contains("content_type property is not valid UTF-8")),
            "{err}"
        );
    }

    #[test]
    fn unknown_property_flags_are_an_error() {
        assert!(decode_properties(&mut Decoder::new(&[0x00, 0x02])).is_err());
        assert!(decode_properties(&mut Decoder::new(&[0x00, 0x01, 0x80, 0x00])).is_err());
        // continuation word with no flags is accepted
        assert_eq!(
            decode_properties(&mut Decoder::new(&[0x00, 0x01, 0x00, 0x00])).unwrap(),
            BasicProperties::default()
        );
    }

    #[test]
    fn truncated_input_errors_without_panic() {
        let table: FieldTable = every_value()
            .into_iter()
            .enumerate()
            .map(|(i, (v, _))| (format!("k{i}"), v))
            .collect();
        let mut p = all_properties();
        p.headers = Some(table);
        let mut a = Vec::new();
        put_properties(&mut a, &p).unwrap();
        for n in 0..a.len() {
            assert!(
                decode_properties(&mut Decoder::new(&a[..n])).is_err(),
                "prefix of {n} bytes decoded"
            );
        }
        // method frames too
        let mut m = Vec::new();
        Method::BasicDeliver {
            consumer_tag: "ctag".into(),
            delivery_tag: 9,
            redelivered: true,
            exchange: b"ex".to_vec(),
            routing_key: b"rk".to_vec(),
        }
        .encode(&mut m)
        .unwrap();
        for n in 0..m.len() {
            assert!(Method::decode(&m[..n]).is_err(), "prefix of {n} bytes");
        }
    }

    #[test]
    fn garbage_lengths_do_not_allocate() {
        // A table claiming 4 GiB, a long string claiming 4 GiB, a body size of 2^63.
        assert!(Decoder::new(&[0xff, 0xff, 0xff, 0xff, 0]).table().is_err());
        let s = [0, 0, 0, 9, 1, b'k', b'S', 0xff, 0xff, 0xff, 0xf0];
        assert!(Decoder::new(&s).table().is_err());
        let x = [b'x', 0xff, 0xff, 0xff, 0xff];
        assert!(Decoder::new(&x).field_value().is_err());
        // A frame header announcing a 4 GiB payload is rejected before any payload is read.
        let f = [FRAME_BODY, 0, 1, 0xff, 0xff, 0xff, 0xff];
        assert!(parse_frame(&f, 131_072).is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // 10,000 nested arrays: 'A' + length + ...
        let depth = 10_000usize;
        let mut bytes = Vec::new();
        for i in 0..depth {
            bytes.push(b'A');
            let remaining = (depth - i - 1) * 5;
            bytes.extend_from_slice(&(remaining as u32).to_be_bytes());
        }
        let err = Decoder::new(&bytes).field_value().unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
    }

    #[test]
    fn random_garbage_never_panics() {
        // Deterministic xorshift; decode random buffers as tables, properties, methods, frames.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = Decoder::new(&buf).table();
            let _ = Decoder::new(&buf).field_value();
            let _ = decode_properties(&mut Decoder::new(&buf));
            let _ = Method::decode(&buf);
            let _ = decode_content_header(&buf);
            let _ = parse_frame(&buf, 4096);
        }
    }

    #[test]
    fn frames_and_publish_split_across_body_frames() {
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let props = all_properties();
        let mut buf = Vec::new();
        put_publish(&mut buf, 7, "ex", "rk", true, &props, &body, 4096).unwrap();
        let mut rest = &buf[..];
        let mut frames = Vec::new();
        while !rest.is_empty() {
            let (f, n) = parse_frame(rest, 4096 - FRAME_OVERHEAD).unwrap().unwrap();
            assert_eq!(f.channel, 7);
            assert!(n <= 4096);
            frames.push((f.kind, f.payload.to_vec()));
            rest = &rest[n..];
        }
        // method + header + ceil(10000 / 4088) = 3 body frames
        assert_eq!(frames.len(), 5);
        assert_eq!(frames[0].0, FRAME_METHOD);
        assert_eq!(
            Method::decode(&frames[0].1).unwrap(),
            Method::BasicPublish {
                exchange: "ex".into(),
                routing_key: "rk".into(),
                mandatory: true,
                immediate: false
            }
        );
        assert_eq!(frames[1].0, FRAME_HEADER);
        let h = decode_content_header(&frames[1].1).unwrap();
        assert_eq!(h.class_id, CLASS_BASIC);
        assert_eq!(h.body_size, 10_000);
        assert_eq!(h.properties.unwrap(), props);
        let joined: Vec<u8> = frames[2..]
            .iter()
            .inspect(|f| assert_eq!(f.0, FRAME_BODY))
            .flat_map(|f| f.1.clone())
            .collect();
        assert_eq!(joined, body);

        // empty body: no body frame
        buf.clear();
        put_publish(
            &mut buf,
            1,
            "",
            "q",
            false,
            &BasicProperties::default(),
            &[],
            4096,
        )
        .unwrap();
        let (_, n1) = parse_frame(&buf, 4096).unwrap().unwrap();
        let (h, n2) = parse_frame(&buf[n1..], 4096).unwrap().unwrap();
        assert_eq!(h.kind, FRAME_HEADER);
        assert_eq!(n1 + n2, buf.len());
    }

    #[test]
    fn partial_and_bad_frames() {
        let mut buf = Vec::new();
        put_method_frame(&mut buf, 3, &Method::BasicQosOk, 4096).unwrap();
        for n in 0..buf.len() {
            assert!(parse_frame(&buf[..n], 4096).unwrap().is_none());
        }
        let last = buf.len() - 1;
        buf[last] = 0;
        assert!(parse_frame(&buf, 4096).is_err());
        let bad_type = [9u8, 0, 0, 0, 0, 0, 0, FRAME_END];
        assert!(parse_frame(&bad_type, 4096).is_err());
    }

    #[test]
    fn oversized_method_frame_is_an_error() {
        let big: FieldTable = (0..500)
            .map(|i| (format!("key-{i}"), FieldValue::LongString(vec![b'x'; 20])))
            .collect();
        let m = Method::QueueDeclare {
            queue: "q".into(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            no_wait: false,
            arguments: big,
        };
        let mut buf = vec![1, 2, 3];
        let err = put_method_frame(&mut buf, 1, &m, 4096).unwrap_err();
        assert!(err.to_string().contains("frame_max"), "{err}");
        assert_eq!(buf, [1, 2, 3], "buffer restored");
    }

    #[test]
    fn methods_round_trip() {
        let t: FieldTable = vec![(
            "x-queue-type".into(),
            FieldValue::LongString(b"quorum".to_vec()),
        )];
        let methods = vec![
            Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: t.clone(),
                mechanisms: b"PLAIN AMQPLAIN".to_vec(),
                locales: b"en_US".to_vec(),
            },
            Method::ConnectionStartOk {
                client_properties: t.clone(),
                mechanism: "PLAIN".into(),
                response: Secret(b"\0u\0p".to_vec()),
                locale: "en_US".into(),
            },
            Method::ConnectionTune {
                channel_max: 2047,
                frame_max: 131072,
                heartbeat: 60,
            },
            Method::ConnectionTuneOk {
                channel_max: 2047,
                frame_max: 131072,
                heartbeat: 30,
            },
            Method::ConnectionOpen { vhost: "/".into() },
            Method::ConnectionOpenOk,
            Method::ConnectionClose {
                reply_code: 320,
                reply_text: "CONNECTION_FORCED".into(),
                class_id: 0,
                method_id: 0,
            },
            Method::ConnectionCloseOk,
            Method::ConnectionBlocked {
                reason: "low on memory".into(),
            },
            Method::ConnectionUnblocked,
            Method::ChannelOpen,
            Method::ChannelOpenOk,
            Method::ChannelFlow { active: true },
            Method::ChannelFlowOk { active: false },
            Method::ChannelClose {
                reply_code: 404,
                reply_text: "NOT_FOUND - no queue 'q' in vhost 'v'".into(),
                class_id: 50,
                method_id: 10,
            },
            Method::ChannelCloseOk,
            Method::ExchangeDeclare {
                exchange: "e".into(),
                kind: "topic".into(),
                passive: false,
                durable: true,
                auto_delete: false,
                internal: true,
                no_wait: false,
                arguments: t.clone(),
            },
            Method::ExchangeDeclareOk,
            Method::ExchangeDelete {
                exchange: "e".into(),
                if_unused: true,
                no_wait: false,
            },
            Method::ExchangeBind {
                destination: "d".into(),
                source: "s".into(),
                routing_key: "#".into(),
                no_wait: false,
                arguments: t.clone(),
            },
            Method::QueueDeclare {
                queue: "q".into(),
                passive: true,
                durable: true,
                exclusive: false,
                auto_delete: true,
                no_wait: false,
                arguments: t.clone(),
            },
            Method::QueueDeclareOk {
                queue: "q".into(),
                message_count: 10,
                consumer_count: 1,
            },
            Method::QueueBind {
                queue: "q".into(),
                exchange: "e".into(),
                routing_key: "k".into(),
                no_wait: false,
                arguments: t.clone(),
            },
            Method::QueuePurge {
                queue: "q".into(),
                no_wait: false,
            },
            Method::QueuePurgeOk { message_count: 3 },
            Method::QueueDelete {
                queue: "q".into(),
                if_unused: false,
                if_empty: true,
                no_wait: false,
            },
            Method::QueueDeleteOk { message_count: 4 },
            Method::QueueUnbind {
                queue: "q".into(),
                exchange: "e".into(),
                routing_key: "k".into(),
                arguments: t.clone(),
            },
            Method::BasicQos {
                prefetch_size: 0,
                prefetch_count: 100,
                global: true,
            },
            Method::BasicConsume {
                queue: "q".into(),
                consumer_tag: "c".into(),
                no_local: false,
                no_ack: true,
                exclusive: true,
                no_wait: false,
                arguments: t.clone(),
            },
            Method::BasicConsumeOk {
                consumer_tag: "c".into(),
            },
            Method::BasicCancel {
                consumer_tag: "c".into(),
                no_wait: true,
            },
            Method::BasicCancelOk {
                consumer_tag: "c".into(),
            },
            Method::BasicReturn {
                reply_code: 312,
                reply_text: b"NO_ROUTE".to_vec(),
                exchange: b"e".to_vec(),
                routing_key: vec![0xff],
            },
            Method::BasicDeliver {
                consumer_tag: "c".into(),
                delivery_tag: u64::MAX,
                redelivered: true,
                exchange: Vec::new(),
                routing_key: b"q".to_vec(),
            },
            Method::BasicGet {
                queue: "q".into(),
                no_ack: true,
            },
            Method::BasicGetOk {
                delivery_tag: 1,
                redelivered: false,
                exchange: Vec::new(),
                routing_key: b"q".to_vec(),
                message_count: 99,
            },
            Method::BasicGetEmpty,
            Method::BasicAck {
                delivery_tag: 5,
                multiple: true,
            },
            Method::BasicReject {
                delivery_tag: 5,
                requeue: true,
            },
            Method::BasicRecover { requeue: true },
            Method::BasicNack {
                delivery_tag: 6,
                multiple: true,
                requeue: true,
            },
            Method::ConfirmSelect { no_wait: false },
            Method::ConfirmSelectOk,
        ];
        for m in methods {
            let mut a = Vec::new();
            m.encode(&mut a).unwrap();
            let back = Method::decode(&a).unwrap();
            assert_eq!(back, m, "{}", m.name());
            let mut b = Vec::new();
            back.encode(&mut b).unwrap();
            assert_eq!(a, b, "{}", m.name());
            assert_ne!(m.name(), "unknown method");
        }
        assert_eq!(
            Method::decode(&[0, 99, 0, 1]).unwrap(),
            Method::Unknown {
                class_id: 99,
                method_id: 1
            }
        );
    }

    #[test]
    fn nack_bits() {
        let mut a = Vec::new();
        Method::BasicNack {
            delivery_tag: 1,
            multiple: false,
            requeue: true,
        }
        .encode(&mut a)
        .unwrap();
        assert_eq!(*a.last().unwrap(), 0b10);
    }
}
