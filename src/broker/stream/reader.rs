//! The reader thread of a stream connection: frames in, hand-offs out (responses to their
//! request by correlation id, chunks to their subscription, confirms to their publisher),
//! heartbeats both ways, the broker's `Close` answered.

use super::protocol::{key, open_frame, response_text, FrameBuf, RESPONSE_OK};
use crate::broker::amqp::transport::Transport;
use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest frame accepted from the broker, bytes. A chunk can exceed the negotiated frame
/// maximum (the broker sends a chunk whole); this bounds what garbage can make us allocate.
pub const MAX_FRAME: usize = 256 << 20;

/// A frame the reader thread handed on: the bytes after the size (key, version, fields).
pub(super) type Frame = Vec<u8>;

/// What the connection and its reader thread share.
pub(super) struct Shared {
    /// Requests waiting for their response, by correlation id.
    pub(super) pending: Mutex<HashMap<u32, Sender<Frame>>>,
    /// Subscriptions: their chunk channels, by subscription id.
    pub(super) subscriptions: Mutex<HashMap<u8, Sender<Result<Vec<u8>>>>>,
    /// Publishers: their confirm channels (confirmed publishing ids, or an error), by id.
    pub(super) publishers: Mutex<HashMap<u8, Sender<Result<Vec<u64>>>>>,
    /// Why the connection ended, once it has.
    pub(super) closed: Mutex<Option<String>>,
    /// When the last frame was written (heartbeats are sent when idle).
    pub(super) last_write: Mutex<Instant>,
}

/// The reader thread: frames in, hand-offs out, heartbeats both ways. Ends when the socket
/// does; the reason is left in `shared.closed` and given to every waiting subscription.
pub(super) fn reader_loop(
    mut io: Transport,
    mut writer: Transport,
    shared: Arc<Shared>,
    endpoint: String,
    heartbeat_secs: u32,
) {
    let heartbeat = Duration::from_secs(heartbeat_secs as u64);
    let mut last_read = Instant::now();
    let mut buf = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    let reason = loop {
        if shared.closed.lock().map(|c| c.is_some()).unwrap_or(true) {
            break None;
        }
        match read_some(&mut io, &mut partial, &mut buf) {
            Ok(Some(frame)) => {
                last_read = Instant::now();
                if let Err(e) = dispatch(&frame, &shared, &mut writer, &endpoint) {
                    break Some(e.to_string());
                }
            }
            Ok(None) => {
                if heartbeat_secs > 0 {
                    if last_read.elapsed() > heartbeat * 2 {
                        break Some(format!(
                            "stream connection to {endpoint} lost: no frame for {} s (heartbeat {heartbeat_secs} s)",
                            last_read.elapsed().as_secs()
                        ));
                    }
                    let idle = shared
                        .last_write
                        .lock()
                        .map(|t| t.elapsed())
                        .unwrap_or_default();
                    if idle >= heartbeat / 2 {
                        let _ = writer.write_all(&FrameBuf::new(key::HEARTBEAT).finish());
                        if let Ok(mut t) = shared.last_write.lock() {
                            *t = Instant::now();
                        }
                    }
                }
            }
            Err(e) => break Some(e.to_string()),
        }
    };
    let why = {
        let mut c = match shared.closed.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if c.is_none() {
            *c = reason.map(|r| r.trim_start_matches("Connection error: ").to_string());
        }
        c.clone()
            .unwrap_or_else(|| "stream connection closed".into())
    };
    if let Ok(mut subs) = shared.subscriptions.lock() {
        for (_, tx) in subs.drain() {
            let _ = tx.try_send(Err(Error::Connection(why.clone())));
        }
    }
    if let Ok(mut p) = shared.pending.lock() {
        p.clear();
    }
    if let Ok(mut p) = shared.publishers.lock() {
        for (_, tx) in p.drain() {
            let _ = tx.try_send(Err(Error::Connection(why.clone())));
        }
    }
}

/// Reads what the socket has into `partial` and returns a whole frame when one is there;
/// `None` on a read timeout (nothing lost: the partial frame stays in `partial`).
fn read_some(
    io: &mut impl Read,
    partial: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> Result<Option<Frame>> {
    loop {
        if partial.len() >= 4 {
            let size =
                u32::from_be_bytes([partial[0], partial[1], partial[2], partial[3]]) as usize;
            if !(4..=MAX_FRAME).contains(&size) {
                return Err(Error::Stream(format!(
                    "received a frame of {size} bytes (at least 4 and at most {MAX_FRAME} expected)"
                )));
            }
            if partial.len() >= 4 + size {
                let frame = partial[4..4 + size].to_vec();
                partial.drain(..4 + size);
                return Ok(Some(frame));
            }
        }
        buf.resize(256 * 1024, 0);
        match io.read(buf) {
            Ok(0) => {
                return Err(Error::Connection(
                    "stream connection closed by the broker".into(),
                ))
            }
            Ok(n) => partial.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::Connection(format!("stream connection lost: {e}"))),
        }
    }
}

fn dispatch(f: &[u8], shared: &Shared, writer: &mut impl Write, endpoint: &str) -> Result<()> {
    let (k, mut c) = open_frame(f)?;
    log::trace!(
        "stream {endpoint}: received frame of {} bytes, key {k:#06x}",
        f.len()
    );
    match k {
        key::DELIVER => {
            let id = c.u8()?;
            let chunk = c.rest().to_vec();
            let tx = shared
                .subscriptions
                .lock()
                .ok()
                .and_then(|s| s.get(&id).cloned());
            if let Some(tx) = tx {
                // Credit bounds what the broker sends; a full channel means the broker sent
                // more than it was given.
                if tx.try_send(Ok(chunk)).is_err() {
                    return Err(Error::Stream(format!(
                        "{endpoint} delivered more chunks to subscription {id} than its credit"
                    )));
                }
            }
        }
        key::PUBLISH_CONFIRM | key::PUBLISH_ERROR => {
            let id = c.u8()?;
            let n = c.count(8)?;
            let result = if k == key::PUBLISH_CONFIRM {
                (0..n).map(|_| c.u64()).collect::<Result<Vec<u64>>>()
            } else {
                let (pid, code) = (c.u64()?, c.u16()?);
                Err(Error::Stream(format!(
                    "publish {pid} of publisher {id} refused by {endpoint}: {} ({n} refused in this frame)",
                    response_text(code)
                )))
            };
            if let Some(tx) = shared
                .publishers
                .lock()
                .ok()
                .and_then(|p| p.get(&id).cloned())
            {
                let _ = tx.try_send(result);
            }
        }
        key::HEARTBEAT => {}
        key::CLOSE => {
            let corr = c.u32()?;
            let code = c.u16()?;
            let reason = c.string()?;
            let _ = writer.write_all(
                &FrameBuf::new(key::CLOSE | key::RESPONSE)
                    .u32(corr)
                    .u16(RESPONSE_OK)
                    .finish(),
            );
            let why = format!(
                "{endpoint} closed the stream connection: {reason} ({})",
                response_text(code)
            );
            if let Ok(mut cl) = shared.closed.lock() {
                cl.get_or_insert(why);
            }
        }
        key::METADATA_UPDATE => {
            let code = c.u16()?;
            let stream = c.string()?;
            log::warn!(
                "stream {stream} on {endpoint}: {} (metadata update)",
                response_text(code)
            );
            // Every subscription of this connection learns it (one stream per subscription
            // in rmq-backup, and the broker ends those on this stream).
            if let Ok(subs) = shared.subscriptions.lock() {
                for tx in subs.values() {
                    let _ = tx.try_send(Err(Error::Stream(format!(
                        "stream {stream} on {endpoint}: {}",
                        response_text(code)
                    ))));
                }
            }
        }
        k if k == key::CREDIT | key::RESPONSE => {
            let code = c.u16()?;
            let id = c.u8()?;
            if let Some(tx) = shared
                .subscriptions
                .lock()
                .ok()
                .and_then(|s| s.get(&id).cloned())
            {
                let _ = tx.try_send(Err(Error::Stream(format!(
                    "credit for subscription {id} refused by {endpoint}: {}",
                    response_text(code)
                ))));
            }
        }
        k if k & key::RESPONSE != 0 => {
            let corr = c.u32()?;
            if let Some(tx) = shared.pending.lock().ok().and_then(|mut p| p.remove(&corr)) {
                let _ = tx.try_send(f.to_vec());
            }
        }
        other => log::debug!("stream {endpoint}: frame with key {other:#06x} ignored"),
    }
    Ok(())
}

/// Reads `bytes` as the reader thread reads a broker's bytes (size-prefixed frames, one after
/// another) and dispatches every frame as it does, to a connection with subscription 0 (credit
/// 4), publisher 0 and requests waiting under correlation ids 0 to 15; what it would write back
/// goes nowhere. Returns the frames read (the bytes after each size) and the error that ended
/// the reading: at the end of `bytes`, `Connection error: stream connection closed by the
/// broker`.
///
/// The reader thread's own code on a byte slice, for the fuzz targets of `fuzz/`; not an API.
#[doc(hidden)]
pub fn decode_received(mut bytes: &[u8]) -> (Vec<Vec<u8>>, Error) {
    let (sub_tx, _sub_rx) = crossbeam_channel::bounded(4 + 2);
    let (pub_tx, _pub_rx) = crossbeam_channel::bounded(1024);
    let mut pending = HashMap::new();
    let mut waiting = Vec::new();
    for corr in 0..16 {
        let (tx, rx) = crossbeam_channel::bounded(1);
        pending.insert(corr, tx);
        waiting.push(rx);
    }
    let shared = Shared {
        pending: Mutex::new(pending),
        subscriptions: Mutex::new(HashMap::from([(0, sub_tx)])),
        publishers: Mutex::new(HashMap::from([(0, pub_tx)])),
        closed: Mutex::new(None),
        last_write: Mutex::new(Instant::now()),
    };
    // The reader thread's 256 KiB read buffer, kept from one call to the next as the thread
    // keeps it from one read to the next.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut buf = BUF.take();
    let (mut partial, mut frames) = (Vec::new(), Vec::new());
    let end = loop {
        match read_some(&mut bytes, &mut partial, &mut buf) {
            Ok(Some(frame)) => {
                let dispatched = dispatch(&frame, &shared, &mut std::io::sink(), "fuzz");
                frames.push(frame);
                if let Err(e) = dispatched {
                    break e;
                }
            }
            // A byte slice never times out; were it to, that would end the reading too.
            Ok(None) => break Error::Connection("stream connection timed out".into()),
            Err(e) => break e,
        }
    };
    BUF.set(buf);
    (frames, end)
}
