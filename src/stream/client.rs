//! [`StreamConnection`]: a synchronous stream-protocol connection over `std::net::TcpStream`.
//!
//! The handshake (PeerProperties, SaslHandshake, SaslAuthenticate with PLAIN, Tune, Open) runs
//! on the caller's thread; then one reader thread per connection reads frames and hands them
//! on: responses to the waiting request (by correlation id), `Deliver` chunks to their
//! subscription's bounded channel, and answers the broker's heartbeats and `Close`. Only
//! commands the 3.10 broker has are sent (it closes the connection on ExchangeCommandVersions,
//! ENVIRONMENT.md), all at version 1.
//!
//! Every wait is bounded: the connect by `connect_timeout`, each request by `rpc_timeout`, and
//! a broker silent for two heartbeat intervals is a lost connection (`Connection error: ...`).

use super::protocol::{key, response_text, Cursor, FrameBuf, OffsetSpec, RESPONSE_OK};
use crate::amqp::transport::Transport;
use crate::error::{Error, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest frame accepted from the broker, bytes. A chunk can exceed the negotiated frame
/// maximum (the broker sends a chunk whole); this bounds what garbage can make us allocate.
pub const MAX_FRAME: usize = 256 << 20;

/// How to reach and log in to the broker's stream port.
#[derive(Clone)]
pub struct StreamOptions {
    pub host: String,
    /// Stream port (SPEC.md `source.stream_port`, default 5552).
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    pub connect_timeout: Duration,
    pub rpc_timeout: Duration,
    /// Heartbeat asked for, seconds (the broker's proposal wins when it is lower; 0 = none).
    pub heartbeat_secs: u32,
    /// Shown in the management UI.
    pub connection_name: String,
}

impl std::fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOptions")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("vhost", &self.vhost)
            .finish_non_exhaustive()
    }
}

impl StreamOptions {
    /// Options from an AMQP URL's host, credentials and vhost, with the stream `port`.
    pub fn from_amqp_url(url: &crate::amqp::AmqpUrl, port: u16) -> StreamOptions {
        StreamOptions {
            host: url.host.clone(),
            port,
            user: url.user.clone(),
            password: url.password.clone(),
            vhost: url.vhost.clone(),
            connect_timeout: Duration::from_millis(url.connection_timeout_ms.unwrap_or(30_000)),
            rpc_timeout: Duration::from_secs(30),
            heartbeat_secs: 60,
            connection_name: "rmq-backup".into(),
        }
    }
}

/// A frame the reader thread handed on: the bytes after the size (key, version, fields).
type Frame = Vec<u8>;

struct Shared {
    /// Requests waiting for their response, by correlation id.
    pending: Mutex<HashMap<u32, Sender<Frame>>>,
    /// Subscriptions: their chunk channels, by subscription id.
    subscriptions: Mutex<HashMap<u8, Sender<Result<Vec<u8>>>>>,
    /// Publishers: their confirm channels (confirmed publishing ids, or an error), by id.
    publishers: Mutex<HashMap<u8, Sender<Result<Vec<u64>>>>>,
    /// Why the connection ended, once it has.
    closed: Mutex<Option<String>>,
    /// When the last frame was written (heartbeats are sent when idle).
    last_write: Mutex<Instant>,
}

/// One stream-protocol connection. Dropping it closes the socket.
pub struct StreamConnection {
    writer: Mutex<Transport>,
    shared: Arc<Shared>,
    next_correlation: AtomicU32,
    rpc_timeout: Duration,
    endpoint: String,
    reader: Option<std::thread::JoinHandle<()>>,
    socket: Transport,
}

/// A subscription's chunks, in order: the raw chunk bytes of each `Deliver` frame
/// ([`super::chunk::parse_chunk`] reads them).
pub struct Subscription {
    pub id: u8,
    rx: Receiver<Result<Vec<u8>>>,
}

impl Subscription {
    /// The next chunk, or `None` after `timeout` without one.
    ///
    /// Errors: the connection's end or the stream's deletion, as an `Error::Stream` or
    /// `Error::Connection` saying what was lost.
    pub fn next_chunk(&self, timeout: Duration) -> Result<Option<Vec<u8>>> {
        match self.rx.recv_timeout(timeout) {
            Ok(r) => r.map(Some),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(None),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(Error::Connection(
                "stream connection closed while a subscription was reading".into(),
            )),
        }
    }
}

/// A publisher's confirms: the publishing ids the broker confirmed, in the order it sent them.
pub struct Publisher {
    pub id: u8,
    rx: Receiver<Result<Vec<u64>>>,
}

impl Publisher {
    /// Waits until `count` publishes are confirmed, bounded by `timeout`.
    ///
    /// Errors: `Stream protocol error` for a publish the broker refused (its code), or for
    /// confirms missing after `timeout`.
    pub fn wait_confirms(&self, count: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut confirmed = 0;
        while confirmed < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(ids) => confirmed += ids?.len(),
                Err(_) => {
                    return Err(Error::Stream(format!(
                        "publisher {}: {confirmed} of {count} publishes confirmed within {} s",
                        self.id,
                        timeout.as_secs()
                    )))
                }
            }
        }
        Ok(())
    }
}

fn read_frame(io: &mut Transport, buf: &mut Vec<u8>, endpoint: &str) -> Result<Frame> {
    let mut size = [0u8; 4];
    io.read_exact(&mut size).map_err(|e| io_lost(endpoint, e))?;
    let size = u32::from_be_bytes(size) as usize;
    if !(4..=MAX_FRAME).contains(&size) {
        return Err(Error::Stream(format!(
            "{endpoint} sent a frame of {size} bytes (at least 4 and at most {MAX_FRAME} expected)"
        )));
    }
    buf.clear();
    // Grows as bytes arrive: a garbage size cannot allocate more than what was sent.
    let got = Read::by_ref(io)
        .take(size as u64)
        .read_to_end(buf)
        .map_err(|e| io_lost(endpoint, e))?;
    if got != size {
        return Err(Error::Connection(format!(
            "stream connection to {endpoint} closed in the middle of a frame"
        )));
    }
    Ok(std::mem::take(buf))
}

fn io_lost(endpoint: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Connection(format!(
            "stream connection to {endpoint} closed by the broker"
        )),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Connection(
            format!("stream connection to {endpoint}: no answer within the timeout"),
        ),
        _ => Error::Connection(format!("stream connection to {endpoint} lost: {e}")),
    }
}

/// Key, version, and a cursor over the rest of a frame.
fn open_frame(f: &[u8]) -> Result<(u16, Cursor<'_>)> {
    let mut c = Cursor::new(f);
    let k = c.u16()?;
    let _version = c.u16()?;
    Ok((k, c))
}

/// Reads frames during the handshake until the response `want` with correlation `corr`.
fn handshake_response(io: &mut Transport, want: u16, corr: u32, endpoint: &str) -> Result<Frame> {
    let mut buf = Vec::new();
    loop {
        let f = read_frame(io, &mut buf, endpoint)?;
        let (k, mut c) = open_frame(&f)?;
        if k == want | key::RESPONSE && c.u32()? == corr {
            return Ok(f);
        }
        if k == key::CLOSE {
            let _corr = c.u32()?;
            let code = c.u16()?;
            return Err(Error::Connection(format!(
                "{endpoint} closed the stream connection during the handshake: {} ({})",
                c.string()?,
                response_text(code)
            )));
        }
        // Anything else (a heartbeat) is ignored during the handshake.
    }
}

/// The response code of a response frame (after its correlation id).
fn response_code(c: &mut Cursor) -> Result<u16> {
    c.u16()
}

impl StreamConnection {
    /// Connects and logs in: TCP (bounded by `connect_timeout`), then the handshake (each step
    /// bounded by `rpc_timeout`).
    ///
    /// Errors: `Connection error: ...` when the port cannot be reached or the connection drops;
    /// `Authentication error: ...` for refused credentials (the password is never printed);
    /// `Stream protocol error: ...` for a refused vhost or a broker without PLAIN.
    pub fn open(o: &StreamOptions) -> Result<StreamConnection> {
        let endpoint = format!("{}:{}", o.host, o.port);
        let mut io = Transport::connect_tcp(&o.host, o.port, o.connect_timeout).map_err(|e| {
            Error::Connection(format!("cannot reach the stream port {endpoint}: {e}"))
        })?;
        io.set_read_timeout(Some(o.rpc_timeout))
            .and_then(|()| io.set_write_timeout(Some(o.rpc_timeout)))
            .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
        let send =
            |io: &mut Transport, f: Vec<u8>| io.write_all(&f).map_err(|e| io_lost(&endpoint, e));

        let version = env!("CARGO_PKG_VERSION");
        send(
            &mut io,
            FrameBuf::new(key::PEER_PROPERTIES)
                .u32(1)
                .string_map(&[
                    ("product", "rmq-backup"),
                    ("version", version),
                    ("connection_name", &o.connection_name),
                ])?
                .finish(),
        )?;
        let f = handshake_response(&mut io, key::PEER_PROPERTIES, 1, &endpoint)?;
        let (_, mut c) = open_frame(&f)?;
        let _ = c.u32()?;
        expect_ok(response_code(&mut c)?, "peer properties", &endpoint)?;

        send(&mut io, FrameBuf::new(key::SASL_HANDSHAKE).u32(2).finish())?;
        let f = handshake_response(&mut io, key::SASL_HANDSHAKE, 2, &endpoint)?;
        let (_, mut c) = open_frame(&f)?;
        let _ = c.u32()?;
        expect_ok(response_code(&mut c)?, "SASL handshake", &endpoint)?;
        let n = c.count(2)?;
        let mechanisms: Vec<String> = (0..n).map(|_| c.string()).collect::<Result<_>>()?;
        if !mechanisms.iter().any(|m| m == "PLAIN") {
            return Err(Error::Stream(format!(
                "{endpoint} does not offer SASL PLAIN (it offers {})",
                mechanisms.join(", ")
            )));
        }

        let mut plain = Vec::with_capacity(o.user.len() + o.password.len() + 2);
        plain.push(0);
        plain.extend_from_slice(o.user.as_bytes());
        plain.push(0);
        plain.extend_from_slice(o.password.as_bytes());
        send(
            &mut io,
            FrameBuf::new(key::SASL_AUTHENTICATE)
                .u32(3)
                .string("PLAIN")?
                .bytes(&plain)?
                .finish(),
        )?;
        let f = handshake_response(&mut io, key::SASL_AUTHENTICATE, 3, &endpoint)?;
        let (_, mut c) = open_frame(&f)?;
        let _ = c.u32()?;
        match response_code(&mut c)? {
            RESPONSE_OK => {}
            0x08 | 0x0b => {
                return Err(Error::Authentication(format!(
                    "{endpoint} refused the login of user {} on the stream port",
                    o.user
                )))
            }
            code => return Err(stream_refused("SASL authentication", code, &endpoint)),
        }

        // The broker proposes frame max and heartbeat; we answer with ours.
        let mut buf = Vec::new();
        let (frame_max, heartbeat) = loop {
            let f = read_frame(&mut io, &mut buf, &endpoint)?;
            let (k, mut c) = open_frame(&f)?;
            if k == key::TUNE {
                break (c.u32()?, c.u32()?);
            }
        };
        let heartbeat = match (heartbeat, o.heartbeat_secs) {
            (0, h) | (h, 0) => h,
            (a, b) => a.min(b),
        };
        send(
            &mut io,
            FrameBuf::new(key::TUNE | key::RESPONSE)
                .u32(frame_max)
                .u32(heartbeat)
                .finish(),
        )?;

        send(
            &mut io,
            FrameBuf::new(key::OPEN).u32(4).string(&o.vhost)?.finish(),
        )?;
        let f = handshake_response(&mut io, key::OPEN, 4, &endpoint)?;
        let (_, mut c) = open_frame(&f)?;
        let _ = c.u32()?;
        match response_code(&mut c)? {
            RESPONSE_OK => {}
            0x0c => {
                return Err(Error::Authentication(format!(
                    "user {} may not open vhost {} on the stream port {endpoint}",
                    o.user, o.vhost
                )))
            }
            code => {
                return Err(stream_refused(
                    &format!("open vhost {}", o.vhost),
                    code,
                    &endpoint,
                ))
            }
        }
        log::debug!(
            "stream connection to {endpoint} open (vhost {}, frame max {frame_max}, heartbeat {heartbeat} s)",
            o.vhost
        );

        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            subscriptions: Mutex::new(HashMap::new()),
            publishers: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
            last_write: Mutex::new(Instant::now()),
        });
        let reader_io = io
            .try_clone()
            .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
        let socket = io
            .try_clone()
            .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
        // The reader wakes at least every second to send heartbeats when idle.
        let tick = Duration::from_secs(1);
        reader_io
            .set_read_timeout(Some(tick))
            .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
        let writer_for_reader = io
            .try_clone()
            .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
        let reader = {
            let shared = shared.clone();
            let endpoint = endpoint.clone();
            std::thread::Builder::new()
                .name("stream-reader".into())
                .spawn(move || {
                    reader_loop(reader_io, writer_for_reader, shared, endpoint, heartbeat)
                })
                .map_err(|e| Error::Io(format!("cannot start the stream reader thread: {e}")))?
        };
        Ok(StreamConnection {
            writer: Mutex::new(io),
            shared,
            next_correlation: AtomicU32::new(100),
            rpc_timeout: o.rpc_timeout,
            endpoint,
            reader: Some(reader),
            socket,
        })
    }

    /// `host:port` of the connection.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn closed_reason(&self) -> Option<String> {
        self.shared.closed.lock().ok().and_then(|c| c.clone())
    }

    fn write(&self, frame: &[u8]) -> Result<()> {
        if let Some(why) = self.closed_reason() {
            return Err(Error::Connection(why));
        }
        log::trace!(
            "stream {}: sending frame of {} bytes, key {:#06x}",
            self.endpoint,
            frame.len(),
            u16::from_be_bytes([frame[4], frame[5]])
        );
        let mut w = self
            .writer
            .lock()
            .map_err(|_| Error::Connection("stream writer poisoned".into()))?;
        w.write_all(frame).map_err(|e| io_lost(&self.endpoint, e))?;
        if let Ok(mut t) = self.shared.last_write.lock() {
            *t = Instant::now();
        }
        Ok(())
    }

    /// Sends a request built by `build` (given its correlation id) and waits for its response,
    /// bounded by `rpc_timeout`. Returns the response frame's cursor position after the
    /// response code, and the code.
    fn request(
        &self,
        what: &str,
        build: impl FnOnce(u32) -> Result<Vec<u8>>,
    ) -> Result<(u16, Frame)> {
        let corr = self.next_correlation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        if let Ok(mut p) = self.shared.pending.lock() {
            p.insert(corr, tx);
        }
        let sent = build(corr).and_then(|f| self.write(&f));
        let answer = sent.and_then(|()| {
            rx.recv_timeout(self.rpc_timeout)
                .map_err(|_| match self.closed_reason() {
                    Some(why) => Error::Connection(why),
                    None => Error::Connection(format!(
                        "stream {}: no answer to {what} within {} s",
                        self.endpoint,
                        self.rpc_timeout.as_secs()
                    )),
                })
        });
        if let Ok(mut p) = self.shared.pending.lock() {
            p.remove(&corr);
        }
        let f = answer?;
        let code = {
            let (_, mut c) = open_frame(&f)?;
            let _ = c.u32()?;
            c.u16()?
        };
        Ok((code, f))
    }

    /// Subscribes to `stream` from `from` with `credit` chunks of initial credit; chunks then
    /// arrive on the returned [`Subscription`] (at most `credit` + what [`Self::credit`] gives).
    ///
    /// Errors: `Stream protocol error: subscribe to stream X in vhost V: stream does not exist` and the
    /// like, or a lost connection.
    pub fn subscribe(
        &self,
        id: u8,
        stream: &str,
        from: OffsetSpec,
        credit: u16,
    ) -> Result<Subscription> {
        // Room for every chunk the credit allows, plus an error.
        let (tx, rx) = bounded(credit as usize + 2);
        if let Ok(mut s) = self.shared.subscriptions.lock() {
            s.insert(id, tx);
        }
        let (code, _) = self.request("subscribe", |corr| {
            Ok(FrameBuf::new(key::SUBSCRIBE)
                .u32(corr)
                .u8(id)
                .string(stream)?
                .offset_spec(from)
                .u16(credit)
                .u32(0)
                .finish())
        })?;
        if code != RESPONSE_OK {
            if let Ok(mut s) = self.shared.subscriptions.lock() {
                s.remove(&id);
            }
            return Err(stream_refused(
                &format!("subscribe to stream {stream}"),
                code,
                &self.endpoint,
            ));
        }
        Ok(Subscription { id, rx })
    }

    /// Grants `credit` more chunks to subscription `id` (no response unless it fails, which
    /// the reader reports to the subscription).
    pub fn credit(&self, id: u8, credit: u16) -> Result<()> {
        self.write(&FrameBuf::new(key::CREDIT).u8(id).u16(credit).finish())
    }

    /// Ends subscription `id`.
    pub fn unsubscribe(&self, id: u8) -> Result<()> {
        let (code, _) = self.request("unsubscribe", |corr| {
            Ok(FrameBuf::new(key::UNSUBSCRIBE).u32(corr).u8(id).finish())
        })?;
        if let Ok(mut s) = self.shared.subscriptions.lock() {
            s.remove(&id);
        }
        if code != RESPONSE_OK && code != 0x04 {
            return Err(stream_refused("unsubscribe", code, &self.endpoint));
        }
        Ok(())
    }

    /// Declares publisher `id` on `stream` (no deduplication reference).
    pub fn declare_publisher(&self, id: u8, stream: &str) -> Result<Publisher> {
        let (tx, rx) = bounded(1024);
        if let Ok(mut p) = self.shared.publishers.lock() {
            p.insert(id, tx);
        }
        let (code, _) = self.request("declare publisher", |corr| {
            Ok(FrameBuf::new(key::DECLARE_PUBLISHER)
                .u32(corr)
                .u8(id)
                .string("")?
                .string(stream)?
                .finish())
        })?;
        if code != RESPONSE_OK {
            return Err(stream_refused(
                &format!("declare a publisher on stream {stream}"),
                code,
                &self.endpoint,
            ));
        }
        Ok(Publisher { id, rx })
    }

    /// Publishes `messages` (publishing id, AMQP 1.0 encoded message) with publisher `id`;
    /// their confirms arrive on its [`Publisher`].
    pub fn publish(&self, id: u8, messages: &[(u64, &[u8])]) -> Result<()> {
        let mut b = FrameBuf::new(key::PUBLISH)
            .u8(id)
            .u32(messages.len() as u32);
        for (publishing_id, m) in messages {
            b = b.u64(*publishing_id).bytes(m)?;
        }
        self.write(&b.finish())
    }

    /// Whether each of `streams` exists (its metadata response code is OK).
    pub fn streams_exist(&self, streams: &[&str]) -> Result<Vec<(String, bool)>> {
        let (_, f) = self.request("metadata", |corr| {
            let mut b = FrameBuf::new(key::METADATA)
                .u32(corr)
                .u32(streams.len() as u32);
            for s in streams {
                b = b.string(s)?;
            }
            Ok(b.finish())
        })?;
        // Metadata has no response code: brokers, then stream metadata.
        let (_, mut c) = open_frame(&f)?;
        let _corr = c.u32()?;
        let brokers = c.count(8)?;
        for _ in 0..brokers {
            let _reference = c.u16()?;
            let _host = c.string()?;
            let _port = c.u32()?;
        }
        let n = c.count(6)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let name = c.string()?;
            let code = c.u16()?;
            let _leader = c.u16()?;
            let replicas = c.count(2)?;
            for _ in 0..replicas {
                let _ = c.u16()?;
            }
            out.push((name, code == RESPONSE_OK));
        }
        Ok(out)
    }

    /// The offset stored under `reference` for `stream`, `None` when there is none.
    pub fn query_offset(&self, reference: &str, stream: &str) -> Result<Option<u64>> {
        let (code, f) = self.request("query offset", |corr| {
            Ok(FrameBuf::new(key::QUERY_OFFSET)
                .u32(corr)
                .string(reference)?
                .string(stream)?
                .finish())
        })?;
        match code {
            RESPONSE_OK => {
                let (_, mut c) = open_frame(&f)?;
                let _ = c.u32()?;
                let _ = c.u16()?;
                Ok(Some(c.u64()?))
            }
            0x13 => Ok(None),
            code => Err(stream_refused(
                &format!("query offset of stream {stream}"),
                code,
                &self.endpoint,
            )),
        }
    }

    /// Creates `stream` with `arguments` (e.g. `max-length-bytes`); an existing stream is fine.
    pub fn create_stream(&self, stream: &str, arguments: &[(&str, &str)]) -> Result<()> {
        let (code, _) = self.request("create", |corr| {
            Ok(FrameBuf::new(key::CREATE)
                .u32(corr)
                .string(stream)?
                .string_map(arguments)?
                .finish())
        })?;
        match code {
            RESPONSE_OK | 0x05 => Ok(()),
            code => Err(stream_refused(
                &format!("create stream {stream}"),
                code,
                &self.endpoint,
            )),
        }
    }

    /// Deletes `stream` (tests and benchmarks).
    pub fn delete_stream(&self, stream: &str) -> Result<()> {
        let (code, _) = self.request("delete", |corr| {
            Ok(FrameBuf::new(key::DELETE)
                .u32(corr)
                .string(stream)?
                .finish())
        })?;
        match code {
            RESPONSE_OK | 0x02 => Ok(()),
            code => Err(stream_refused(
                &format!("delete stream {stream}"),
                code,
                &self.endpoint,
            )),
        }
    }

    /// Closes the connection: `Close`, its answer (bounded by `rpc_timeout`), then the socket.
    pub fn close(mut self) -> Result<()> {
        let r = if self.closed_reason().is_none() {
            self.request("close", |corr| {
                Ok(FrameBuf::new(key::CLOSE)
                    .u32(corr)
                    .u16(RESPONSE_OK)
                    .string("rmq-backup done")?
                    .finish())
            })
            .map(|_| ())
        } else {
            Ok(())
        };
        self.shutdown();
        r
    }

    fn shutdown(&mut self) {
        if let Ok(mut c) = self.shared.closed.lock() {
            c.get_or_insert_with(|| "stream connection closed by rmq-backup".into());
        }
        self.socket.shutdown();
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl Drop for StreamConnection {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn expect_ok(code: u16, what: &str, endpoint: &str) -> Result<()> {
    if code == RESPONSE_OK {
        Ok(())
    } else {
        Err(stream_refused(what, code, endpoint))
    }
}

fn stream_refused(what: &str, code: u16, endpoint: &str) -> Error {
    Error::Stream(format!(
        "{what} refused by {endpoint}: {} (code {code:#04x})",
        response_text(code)
    ))
}

/// The reader thread: frames in, hand-offs out, heartbeats both ways. Ends when the socket
/// does; the reason is left in `shared.closed` and given to every waiting subscription.
fn reader_loop(
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
    io: &mut Transport,
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

fn dispatch(f: &[u8], shared: &Shared, writer: &mut Transport, endpoint: &str) -> Result<()> {
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
