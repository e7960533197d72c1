//! AMQP 1.0 frames (OASIS AMQP 1.0, part 2 "Transport", 2.3 "Framing"): the protocol headers,
//! the 8-byte frame header, and [`FrameReader`], which reads whole frames from a socket through
//! a buffer of its own.
//!
//! A frame is `SIZE` (4 bytes, the whole frame, header included), `DOFF` (1 byte, the header's
//! size in 4-byte words, at least 2), `TYPE` (0 AMQP, 1 SASL) and 2 type-specific bytes (the
//! channel of an AMQP frame), then the extended header (skipped) and the body: a performative,
//! and for a `transfer` the payload after it. A frame with no body is an empty frame, the
//! heartbeat of 2.4.5. A read timeout in the middle of a frame loses nothing: the partial frame
//! stays buffered (the reader thread reads with short timeouts to keep heartbeats going).

use std::io::{self, Read};

use crate::broker::amqp::transport::ReadFail;
use crate::error::Error;

/// The protocol header of the SASL layer (part 5, 5.3.1): `AMQP` 3 1 0 0.
pub const SASL_PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x03\x01\x00\x00";
/// The protocol header of AMQP 1.0 itself (part 2, 2.2): `AMQP` 0 1 0 0.
pub const AMQP_PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x01\x00\x00";
/// Frame type of an AMQP frame.
pub const TYPE_AMQP: u8 = 0;
/// Frame type of a SASL frame.
pub const TYPE_SASL: u8 = 1;
/// Bytes of the fixed frame header.
pub const FRAME_HEADER_SIZE: usize = 8;
/// The smallest max-frame-size a peer may announce (part 2, 2.7.1 `MIN-MAX-FRAME-SIZE`), bytes.
pub const MIN_MAX_FRAME_SIZE: u32 = 512;
/// Smallest read buffer, bytes.
const MIN_READ_BUFFER: usize = 128 * 1024;

fn malformed(detail: impl std::fmt::Display) -> Error {
    Error::Amqp(format!("malformed AMQP 1.0 frame: {detail}"))
}

/// The fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHead {
    /// The whole frame's size, header included, bytes.
    pub size: u32,
    /// The header's size in 4-byte words (2 without an extended header).
    pub doff: u8,
    /// [`TYPE_AMQP`] or [`TYPE_SASL`].
    pub kind: u8,
    /// The channel (AMQP frames; 0 for SASL frames).
    pub channel: u16,
}

impl FrameHead {
    /// The header at the start of `b`, or `None` when fewer than 8 bytes are there.
    pub fn parse(b: &[u8]) -> Option<FrameHead> {
        let h: &[u8; 8] = b.get(..FRAME_HEADER_SIZE)?.try_into().ok()?;
        Some(FrameHead {
            size: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            doff: h[4],
            kind: h[5],
            channel: u16::from_be_bytes([h[6], h[7]]),
        })
    }

    /// Checks the header against the frame size we accept (`max_frame`, bytes).
    ///
    /// Errors: `Error::Amqp("malformed AMQP 1.0 frame: ...")` for a size below 8 or above
    /// `max_frame`, a data offset below 2 or beyond the frame, or a frame type other than 0
    /// or 1.
    pub fn check(&self, max_frame: usize) -> Result<(), Error> {
        let size = self.size as usize;
        if size < FRAME_HEADER_SIZE {
            return Err(malformed(format_args!("frame size {size} is below 8")));
        }
        if size > max_frame {
            return Err(malformed(format_args!(
                "frame of {size} bytes is larger than the max-frame-size of {max_frame}"
            )));
        }
        let doff = self.doff as usize * 4;
        if doff < FRAME_HEADER_SIZE || doff > size {
            return Err(malformed(format_args!(
                "data offset {} (words) in a frame of {size} bytes",
                self.doff
            )));
        }
        if self.kind != TYPE_AMQP && self.kind != TYPE_SASL {
            return Err(malformed(format_args!("unknown frame type {}", self.kind)));
        }
        Ok(())
    }
}

/// One frame read: its type, channel and body (after the extended header; empty for an
/// empty frame).
#[derive(Debug)]
pub struct Frame<'a> {
    /// [`TYPE_AMQP`] or [`TYPE_SASL`].
    pub kind: u8,
    /// The channel.
    pub channel: u16,
    /// The performative and, for a transfer, the payload after it.
    pub body: &'a [u8],
}

/// Appends one frame to `out`: the header, then what `body` writes (a performative and its
/// payload), the size filled in afterwards.
pub fn put_frame(out: &mut Vec<u8>, kind: u8, channel: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, 2, kind]);
    out.extend_from_slice(&channel.to_be_bytes());
    body(out);
    let size = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

/// Appends an empty frame (a heartbeat, part 2, 2.4.5) to `out`.
pub fn put_empty_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, 8, 2, TYPE_AMQP, 0, 0]);
}

/// Reads protocol headers and whole frames from a byte stream through an internal buffer.
pub struct FrameReader<R> {
    io: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_frame: usize,
}

impl<R: Read> FrameReader<R> {
    /// A reader accepting frames of at most `max_frame` bytes (header included).
    pub fn new(io: R, max_frame: usize) -> Self {
        let size = (2 * max_frame).clamp(MIN_READ_BUFFER, 1 << 20);
        FrameReader {
            io,
            buf: vec![0; size],
            start: 0,
            end: 0,
            max_frame,
        }
    }

    /// Changes the largest frame accepted, bytes.
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// The byte stream, e.g. to set timeouts.
    pub fn get_ref(&self) -> &R {
        &self.io
    }

    /// True when a whole frame is buffered, i.e. [`FrameReader::next_frame`] will not read.
    pub fn has_complete_frame(&self) -> bool {
        match FrameHead::parse(&self.buf[self.start..self.end]) {
            Some(h) => self.end - self.start >= h.size as usize && h.size >= 8,
            None => false,
        }
    }

    /// The next 8 bytes, a protocol header (part 2, 2.2); `Ok(None)` when the read timed out
    /// first (what arrived stays buffered).
    pub fn protocol_header(&mut self) -> Result<Option<[u8; 8]>, ReadFail> {
        loop {
            if self.end - self.start >= 8 {
                let mut out = [0u8; 8];
                out.copy_from_slice(&self.buf[self.start..self.start + 8]);
                self.consume(8);
                return Ok(Some(out));
            }
            if !self.fill(8)? {
                return Ok(None);
            }
        }
    }

    /// The next frame; `Ok(None)` when the read timed out first (a partial frame stays
    /// buffered).
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, ReadFail> {
        loop {
            let mut need = FRAME_HEADER_SIZE;
            if let Some(head) = FrameHead::parse(&self.buf[self.start..self.end]) {
                head.check(self.max_frame).map_err(|e| {
                    if crate::broker::tls::looks_like_tls(&self.buf[self.start..self.end]) {
                        ReadFail::Protocol(Error::Amqp(
                            "the server answered with TLS: this is a TLS port (use amqps://)"
                                .to_string(),
                        ))
                    } else {
                        ReadFail::Protocol(e)
                    }
                })?;
                let total = head.size as usize;
                if self.end - self.start >= total {
                    let s = self.start;
                    self.consume(total);
                    return Ok(Some(Frame {
                        kind: head.kind,
                        channel: head.channel,
                        body: &self.buf[s + head.doff as usize * 4..s + total],
                    }));
                }
                need = total;
            }
            if !self.fill(need)? {
                return Ok(None);
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads once, with room for `need` bytes after `start`. False on a read timeout.
    fn fill(&mut self, need: usize) -> Result<bool, ReadFail> {
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        let room = self.buf.len() - self.end;
        if self.start > 0 && (self.buf.len() - self.start < need || room < 16 * 1024) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.io.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(ReadFail::Eof),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof => return Err(ReadFail::Eof),
                    _ => return Err(ReadFail::Io(e)),
                },
            }
        }
    }
}
