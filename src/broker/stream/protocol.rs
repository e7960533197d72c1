//! The RabbitMQ stream protocol's wire format: command keys, response codes, and the
//! big-endian primitives of its frames (rabbitmq-server `deps/rabbitmq_stream/docs/PROTOCOL.adoc`,
//! the version the 3.10 broker speaks: every command at version 1, no ExchangeCommandVersions).
//!
//! A frame is `size: u32` (bytes after the size) then `key: u16` (the top bit set on responses),
//! `version: u16` and the command's fields. [`Cursor`] reads fields and fails with
//! `Error::Stream` on any truncation, never panics; [`FrameBuf`] writes a frame and fills in
//! its size.

use crate::error::{Error, Result};

/// Command keys (PROTOCOL.adoc "Commands").
pub mod key {
    pub const DECLARE_PUBLISHER: u16 = 0x0001;
    pub const PUBLISH: u16 = 0x0002;
    pub const PUBLISH_CONFIRM: u16 = 0x0003;
    pub const PUBLISH_ERROR: u16 = 0x0004;
    pub const DELETE_PUBLISHER: u16 = 0x0006;
    pub const SUBSCRIBE: u16 = 0x0007;
    pub const DELIVER: u16 = 0x0008;
    pub const CREDIT: u16 = 0x0009;
    pub const STORE_OFFSET: u16 = 0x000a;
    pub const QUERY_OFFSET: u16 = 0x000b;
    pub const UNSUBSCRIBE: u16 = 0x000c;
    pub const CREATE: u16 = 0x000d;
    pub const DELETE: u16 = 0x000e;
    pub const METADATA: u16 = 0x000f;
    pub const METADATA_UPDATE: u16 = 0x0010;
    pub const PEER_PROPERTIES: u16 = 0x0011;
    pub const SASL_HANDSHAKE: u16 = 0x0012;
    pub const SASL_AUTHENTICATE: u16 = 0x0013;
    pub const TUNE: u16 = 0x0014;
    pub const OPEN: u16 = 0x0015;
    pub const CLOSE: u16 = 0x0016;
    pub const HEARTBEAT: u16 = 0x0017;
    /// RabbitMQ 3.11 and later (PROTOCOL.adoc "StreamStats").
    pub const STREAM_STATS: u16 = 0x001c;
    /// The top bit of a key marks a response.
    pub const RESPONSE: u16 = 0x8000;
}

/// Response code OK.
pub const RESPONSE_OK: u16 = 0x01;

/// What a response code means (PROTOCOL.adoc "Response Codes").
pub fn response_text(code: u16) -> &'static str {
    match code {
        0x01 => "ok",
        0x02 => "stream does not exist",
        0x03 => "subscription id already exists",
        0x04 => "subscription id does not exist",
        0x05 => "stream already exists",
        0x06 => "stream not available",
        0x07 => "SASL mechanism not supported",
        0x08 => "authentication failure",
        0x09 => "SASL error",
        0x0a => "SASL challenge",
        0x0b => "SASL authentication failure loopback",
        0x0c => "virtual host access failure",
        0x0d => "unknown frame",
        0x0e => "frame too large",
        0x0f => "internal error",
        0x10 => "access refused",
        0x11 => "precondition failed",
        0x12 => "publisher does not exist",
        0x13 => "no offset",
        _ => "unknown response code",
    }
}

/// Where a subscription starts (PROTOCOL.adoc "Subscribe", OffsetSpecification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The first offset still in the stream.
    First,
    /// The last chunk of the stream (its first offset).
    Last,
    /// Only what is written after the subscription.
    Next,
    /// This offset (or the first one still present when it was truncated away).
    Offset(u64),
    /// The first chunk written at or after this time, epoch ms.
    Timestamp(i64),
}

/// A frame being written: [`FrameBuf::new`] reserves the size, [`FrameBuf::finish`] fills it in.
pub struct FrameBuf {
    buf: Vec<u8>,
}

impl FrameBuf {
    /// Starts a frame of command `key`, version 1.
    pub fn new(key: u16) -> FrameBuf {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&key.to_be_bytes());
        buf.extend_from_slice(&1u16.to_be_bytes());
        FrameBuf { buf }
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.buf.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A `string`: i16 length then the bytes. Longer than 32,767 bytes is an error.
    pub fn string(mut self, s: &str) -> Result<Self> {
        let len = i16::try_from(s.len()).map_err(|_| {
            Error::Stream(format!(
                "string of {} bytes is too long for a stream frame",
                s.len()
            ))
        })?;
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        Ok(self)
    }
    /// `bytes`: i32 length then the bytes.
    pub fn bytes(mut self, b: &[u8]) -> Result<Self> {
        let len = i32::try_from(b.len()).map_err(|_| {
            Error::Stream(format!("{} bytes are too long for a stream frame", b.len()))
        })?;
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(b);
        Ok(self)
    }
    /// Bytes as they are, without a length (a sub-entry batch of a publish).
    pub fn raw(mut self, b: &[u8]) -> Self {
        self.buf.extend_from_slice(b);
        self
    }
    /// A `[Key Value]` map of strings (peer properties, subscription properties, arguments).
    pub fn string_map(mut self, map: &[(&str, &str)]) -> Result<Self> {
        self = self.u32(map.len() as u32);
        for (k, v) in map {
            self = self.string(k)?.string(v)?;
        }
        Ok(self)
    }
    /// An offset specification: type (u16) and, where it has one, the value.
    pub fn offset_spec(self, spec: OffsetSpec) -> Self {
        match spec {
            OffsetSpec::First => self.u16(1),
            OffsetSpec::Last => self.u16(2),
            OffsetSpec::Next => self.u16(3),
            OffsetSpec::Offset(o) => self.u16(4).u64(o),
            OffsetSpec::Timestamp(t) => self.u16(5).i64(t),
        }
    }
    /// The whole frame, its size filled in.
    pub fn finish(mut self) -> Vec<u8> {
        let size = (self.buf.len() - 4) as u32;
        self.buf[..4].copy_from_slice(&size.to_be_bytes());
        self.buf
    }
}

/// Reads the fields of one frame (after its size). Every read checks the bounds.
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                Error::Stream(format!(
                    "truncated frame: {n} more bytes expected at byte {} of {}",
                    self.pos,
                    self.data.len()
                ))
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    /// A `string` (i16 length; -1 is null, read as empty).
    pub fn string(&mut self) -> Result<String> {
        let len = self.u16()? as i16;
        if len < 0 {
            return Ok(String::new());
        }
        Ok(String::from_utf8_lossy(self.take(len as usize)?).into_owned())
    }
    /// `bytes` (i32 length; -1 is null, read as empty).
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let len = self.u32()? as i32;
        if len < 0 {
            return Ok(&[]);
        }
        self.take(len as usize)
    }
    /// An array's element count, checked against what is left (each element takes at least
    /// `min_element` bytes), so garbage cannot ask for a huge allocation.
    pub fn count(&mut self, min_element: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_element.max(1)) > self.remaining() {
            return Err(Error::Stream(format!(
                "frame announces {n} elements but holds only {} more bytes",
                self.remaining()
            )));
        }
        Ok(n)
    }
    /// A `[Key Value]` map of strings.
    pub fn string_map(&mut self) -> Result<Vec<(String, String)>> {
        let n = self.count(4)?;
        (0..n)
            .map(|_| Ok((self.string()?, self.string()?)))
            .collect()
    }
    /// The bytes not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.data[self.pos..];
        self.pos = self.data.len();
        s
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
}

/// Key, version, and a cursor over the rest of a frame.
pub(super) fn open_frame(f: &[u8]) -> Result<(u16, Cursor<'_>)> {
    let mut c = Cursor::new(f);
    let k = c.u16()?;
    let _version = c.u16()?;
    Ok((k, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_has_its_size_key_and_version() {
        let f = FrameBuf::new(key::OPEN)
            .u32(7)
            .string("/")
            .unwrap()
            .finish();
        assert_eq!(f, [0, 0, 0, 11, 0, 0x15, 0, 1, 0, 0, 0, 7, 0, 1, b'/']);
    }

    #[test]
    fn offset_specifications_are_encoded_as_the_protocol_says() {
        let f = |s| FrameBuf::new(0).offset_spec(s).finish()[8..].to_vec();
        assert_eq!(f(OffsetSpec::First), [0, 1]);
        assert_eq!(f(OffsetSpec::Last), [0, 2]);
        assert_eq!(f(OffsetSpec::Next), [0, 3]);
        assert_eq!(f(OffsetSpec::Offset(5)), [0, 4, 0, 0, 0, 0, 0, 0, 0, 5]);
        assert_eq!(
            f(OffsetSpec::Timestamp(-1)),
            [0, 5, 255, 255, 255, 255, 255, 255, 255, 255]
        );
    }

    #[test]
    fn a_cursor_reads_fields_and_refuses_truncation() {
        let data = [0, 1, 0, 0, 0, 2, 0, 2, b'h', b'i', 0xff, 0xff];
        let mut c = Cursor::new(&data);
        assert_eq!(c.u16().unwrap(), 1);
        assert_eq!(c.u32().unwrap(), 2);
        assert_eq!(c.string().unwrap(), "hi");
        assert_eq!(c.string().unwrap(), "", "-1 is a null string");
        let e = c.u8().unwrap_err().to_string();
        assert!(
            e.starts_with("Stream protocol error: truncated frame"),
            "{e}"
        );
        // A huge announced string or array is refused without allocating.
        let mut c = Cursor::new(&[0x7f, 0xff, 1]);
        assert!(c.string().is_err());
        let mut c = Cursor::new(&[0xff, 0xff, 0xff, 0xf0, 1, 2]);
        assert!(c.count(1).is_err());
        let mut c = Cursor::new(&[0x7f, 0xff, 0xff, 0xff]);
        assert!(c.bytes().is_err());
    }

    #[test]
    fn response_codes_have_names() {
        assert_eq!(response_text(0x02), "stream does not exist");
        assert_eq!(response_text(0x08), "authentication failure");
        assert_eq!(response_text(0xfff), "unknown response code");
    }
}
