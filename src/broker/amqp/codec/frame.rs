//! Frames: the 7-byte head, parsing a frame out of a buffer, writing method, content header,
//! body and heartbeat frames, and a whole `basic.publish` in one buffer.

use super::*;
use crate::error::{Error, Result};

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
pub fn put_content_header_frame<P: PutProperties + ?Sized>(
    buf: &mut Vec<u8>,
    channel: u16,
    body_size: u64,
    properties: &P,
    frame_max: u32,
) -> Result<()> {
    let start = begin_frame(buf, FRAME_HEADER, channel);
    buf.extend_from_slice(&CLASS_BASIC.to_be_bytes());
    buf.extend_from_slice(&0u16.to_be_bytes());
    buf.extend_from_slice(&body_size.to_be_bytes());
    if let Err(e) = properties.put_properties(buf) {
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
pub fn put_publish<P: PutProperties + ?Sized>(
    buf: &mut Vec<u8>,
    channel: u16,
    exchange: &str,
    routing_key: &str,
    mandatory: bool,
    properties: &P,
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
