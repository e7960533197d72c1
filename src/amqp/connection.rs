//! Connections, channels and consumers of the synchronous AMQP 0-9-1 client.
//!
//! One reader thread per connection reads every frame, assembles deliveries (method, content
//! header, body frames) and dispatches them: RPC replies to the waiting [`Channel`], deliveries
//! to the [`Consumer`]'s bounded queue (when it is full the reader stops reading the socket, which
//! is the TCP back-pressure that keeps memory flat, but it keeps sending heartbeats), publisher
//! confirms and `basic.return`s to the channel's confirm state, `channel.close` /
//! `connection.close` from the broker to every waiter, `connection.blocked` / `unblocked` to
//! publishers. Writes go through one mutex from any thread, each message in one write call.
//!
//! A consumer that is not drained therefore stalls every channel of its connection (that is the
//! back-pressure); give each consumer its own connection, or drain or cancel it
//! ([`Channel::basic_cancel`] stops the reader from waiting on it).
//!
//! Every wait is bounded: RPCs by `rpc_timeout`, the handshake by `connect_timeout` plus
//! `rpc_timeout`, socket writes by `rpc_timeout`, a silent broker by two heartbeat intervals.
//! Errors follow SPEC.md "Errors": `Connection error: Failed to connect to <masked url>: ...`,
//! `Authentication error: AMQP authentication failed for user <user>`, `AMQP error: <broker
//! reply text>` for channel exceptions, `Connection error: connection closed by broker: ...`,
//! `Connection error: connection reset by peer`.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{
    bounded, unbounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender, TrySendError,
};

use super::codec::{
    decode_content_header, frame_kind_name, put_heartbeat, put_method_frame, put_publish,
    utf8_short_string_owned, Method, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
    FRAME_MIN_SIZE, FRAME_OVERHEAD, PROTOCOL_HEADER,
};
use super::transport::{FrameReader, ReadFail, Transport};
use super::types::{BasicProperties, Delivery, FieldTable, FieldValue};
use super::url::AmqpUrl;
use crate::error::{Error, Result};

/// Largest message body accepted from the broker, bytes (RabbitMQ's own hard limit is 512 MiB).
pub const MAX_BODY_SIZE: u64 = 512 * 1024 * 1024;
/// Largest body buffer allocated up front from a content header, bytes; bigger bodies grow as
/// their frames arrive (a lying header cannot make us allocate more than this at once).
const BODY_PREALLOC_MAX: u64 = 64 * 1024 * 1024;
/// Largest frame payload accepted when the negotiated `frame_max` is 0 (no limit), bytes.
const UNLIMITED_FRAME_CAP: usize = 64 * 1024 * 1024;
/// How often a reader blocked on a full consumer queue wakes to send heartbeats.
const PUSH_TICK: Duration = Duration::from_millis(50);
/// Channel-max proposed to the broker.
const CHANNEL_MAX: u16 = 2047;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// How to open a [`Connection`].
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Broker address, credentials and vhost.
    pub url: AmqpUrl,
    /// Heartbeat interval proposed to the broker, seconds (default 30, or the URL's
    /// `heartbeat`). The smaller non-zero value of ours and the broker's is used; heartbeats are
    /// off only when both are 0.
    pub heartbeat_secs: u16,
    /// Bound of the TCP connect (default 10 s, or the URL's `connection_timeout`).
    pub connect_timeout: Duration,
    /// Bound of every RPC (and of the handshake after the TCP connect, and of socket writes);
    /// default 30 s.
    pub rpc_timeout: Duration,
    /// `connection_name` client property shown by the management UI (default `rmq-backup`).
    pub connection_name: String,
    /// Largest frame proposed to the broker, bytes (default 131072; 0 = no limit).
    pub frame_max: u32,
    /// Deliveries buffered per consumer before the reader thread stops reading the socket
    /// (default 256). They are handed over in batches of up to 64 deliveries or 1 MiB of
    /// bodies, so a consumer holds at most about `consumer_buffer + 64` messages, and with
    /// large messages about `consumer_buffer / 64 + 1` MiB, in memory.
    pub consumer_buffer: usize,
}

impl ConnectOptions {
    /// Defaults for `url` (see the field docs).
    pub fn new(url: AmqpUrl) -> Self {
        let heartbeat_secs = url.heartbeat.unwrap_or(30);
        let connect_timeout = Duration::from_millis(url.connection_timeout_ms.unwrap_or(10_000));
        ConnectOptions {
            url,
            heartbeat_secs,
            connect_timeout,
            rpc_timeout: Duration::from_secs(30),
            connection_name: "rmq-backup".to_string(),
            frame_max: 131_072,
            consumer_buffer: 256,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------------

/// Body bytes after which a consumer's batch is handed over even if it holds fewer than
/// `batch_max` deliveries: with large messages, memory is bounded by bytes, not by count
/// (a consumer's queue then holds about `consumer_batches` MiB).
const BATCH_BYTES_MAX: usize = 1 << 20;

/// State of one connection, shared by the handle, its channels and the reader thread.
struct ConnShared {
    /// `host:port`, for messages.
    addr: String,
    rpc_timeout: Duration,
    /// Negotiated frame_max (0 = no limit).
    frame_max: u32,
    channel_max: u16,
    /// Negotiated heartbeat interval (None = off).
    heartbeat: Option<Duration>,
    /// Deliveries handed to a consumer in one batch (one wake-up of the consumer thread).
    batch_max: usize,
    /// Batches a consumer's queue holds (`batch_max * batches` ~ consumer_buffer).
    consumer_batches: usize,
    server_properties: FieldTable,
    started: Instant,
    writer: Mutex<Transport>,
    /// A handle used only to shut the socket down (never locked).
    control: Transport,
    last_write_ms: AtomicU64,
    dead: AtomicBool,
    error: Mutex<Option<Error>>,
    closing: AtomicBool,
    channels: Mutex<HashMap<u16, Arc<ChanShared>>>,
    blocked: Mutex<Option<String>>,
    blocked_cond: Condvar,
}

impl ConnShared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn lost(&self, detail: impl std::fmt::Display) -> Error {
        Error::Connection(format!("connection to {} lost: {detail}", self.addr))
    }

    /// Records the connection's failure (the first one wins) and marks it dead.
    fn fail(&self, err: Error) {
        let mut e = lock(&self.error);
        if e.is_none() {
            *e = Some(err);
        }
        self.dead.store(true, Ordering::SeqCst);
    }

    fn current_error(&self) -> Error {
        lock(&self.error)
            .clone()
            .unwrap_or_else(|| Error::Connection("connection reset by peer".to_string()))
    }

    fn check(&self) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(self.current_error())
        } else {
            Ok(())
        }
    }

    /// Writes bytes (whole frames) in one call. A failed write kills the connection.
    fn write(&self, bytes: &[u8]) -> Result<()> {
        self.check()?;
        let mut w = lock(&self.writer);
        self.check()?;
        match w.write_all(bytes) {
            Ok(()) => {
                self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let err = match e.kind() {
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => self.lost(
                        format_args!("write timed out after {}", secs(self.rpc_timeout)),
                    ),
                    _ => self.lost(e),
                };
                self.fail(err.clone());
                self.control.shutdown();
                Err(err)
            }
        }
    }

    fn send_method(&self, channel: u16, method: &Method, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        put_method_frame(buf, channel, method, self.frame_max)?;
        log::trace!(
            "amqp {} sent {} channel={channel} size={}",
            self.addr,
            method.name(),
            buf.len()
        );
        self.write(buf)
    }

    /// Sends a heartbeat when nothing was written for half the interval. Skipped when another
    /// thread is writing (that write counts).
    fn heartbeat_if_due(&self) -> Result<()> {
        let Some(hb) = self.heartbeat else {
            return Ok(());
        };
        let idle = self
            .now_ms()
            .saturating_sub(self.last_write_ms.load(Ordering::Relaxed));
        if idle < hb.as_millis() as u64 / 2 {
            return Ok(());
        }
        let Ok(mut w) = self.writer.try_lock() else {
            return Ok(());
        };
        let mut frame = Vec::with_capacity(8);
        put_heartbeat(&mut frame);
        log::trace!("amqp {} sent heartbeat", self.addr);
        match w.write_all(&frame) {
            Ok(()) => {
                self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(self.lost(format_args!("heartbeat write failed: {e}"))),
        }
    }

    fn channel(&self, id: u16) -> Option<Arc<ChanShared>> {
        lock(&self.channels).get(&id).cloned()
    }

    fn remove_channel(&self, id: u16) -> Option<Arc<ChanShared>> {
        lock(&self.channels).remove(&id)
    }

    /// Fails every channel and waiter with the connection's error (called once, by the reader
    /// thread as it exits).
    fn fail_all(&self, err: Error) {
        self.fail(err);
        let err = self.current_error();
        let chans: Vec<Arc<ChanShared>> = lock(&self.channels).drain().map(|(_, c)| c).collect();
        for c in chans {
            c.fail(err.clone());
        }
        let _guard = lock(&self.blocked);
        self.blocked_cond.notify_all();
    }

    /// Waits while the broker blocks the connection (`connection.blocked`), at most rpc_timeout.
    fn wait_unblocked(&self) -> Result<()> {
        let mut b = lock(&self.blocked);
        if b.is_none() {
            return Ok(());
        }
        let deadline = Instant::now() + self.rpc_timeout;
        while let Some(reason) = b.as_ref() {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Connection(format!(
                    "connection to {} is blocked by the broker ({reason}); gave up after {}",
                    self.addr,
                    secs(self.rpc_timeout)
                )));
            }
            b = self
                .blocked_cond
                .wait_timeout(b, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

/// A reply to a synchronous request on a channel.
enum Reply {
    Method(Method),
    Get(Box<GetOk>),
}

impl Reply {
    fn name(&self) -> &'static str {
        match self {
            Reply::Method(m) => m.name(),
            Reply::Get(_) => "basic.get-ok",
        }
    }
}

/// A consumer as seen by the reader thread.
#[derive(Clone)]
struct ConsumerSlot {
    tx: Sender<Vec<Result<Delivery>>>,
    state: Arc<ConsumerState>,
}

/// State shared by a [`Consumer`] and the reader thread.
struct ConsumerState {
    /// Set by `basic_cancel`, `Channel::close` and `Drop`: the reader no longer blocks on this
    /// consumer's full queue (deliveries that do not fit are dropped; without no_ack the broker
    /// requeues them when the channel closes).
    stopping: AtomicBool,
    /// Why the consumer ended, once it did.
    error: Mutex<Option<Error>>,
}

impl ConsumerState {
    fn end(&self, err: Error) {
        let mut e = lock(&self.error);
        if e.is_none() {
            *e = Some(err);
        }
    }
}

struct ChanShared {
    id: u16,
    state: Mutex<ChanState>,
    /// Signalled on confirms, returns and channel failure.
    cond: Condvar,
}

struct ChanState {
    /// Why the channel is unusable, once it is.
    closed: Option<Error>,
    rpc_tx: Sender<Result<Reply>>,
    /// The consumer of an outstanding `basic.consume`, registered by the reader on consume-ok
    /// (before any delivery for it can arrive).
    pending_consumer: Option<ConsumerSlot>,
    consumers: HashMap<String, ConsumerSlot>,
    confirm_mode: bool,
    next_seq: u64,
    unconfirmed: VecDeque<u64>,
    nacked: Vec<u64>,
    returned: Vec<Returned>,
}

impl ChanShared {
    fn fail(&self, err: Error) {
        let consumers: Vec<ConsumerSlot> = {
            let mut st = lock(&self.state);
            if st.closed.is_none() {
                st.closed = Some(err.clone());
            }
            let _ = st.rpc_tx.send(Err(err.clone()));
            let mut v: Vec<ConsumerSlot> = st.consumers.drain().map(|(_, c)| c).collect();
            v.extend(st.pending_consumer.take());
            v
        };
        for c in consumers {
            c.state.end(err.clone());
        }
        self.cond.notify_all();
    }

    fn confirm(&self, tag: u64, multiple: bool, nack: bool) {
        let mut st = lock(&self.state);
        if multiple {
            while let Some(&seq) = st.unconfirmed.front() {
                if tag != 0 && seq > tag {
                    break;
                }
                st.unconfirmed.pop_front();
                if nack {
                    st.nacked.push(seq);
                }
            }
        } else if let Ok(i) = st.unconfirmed.binary_search(&tag) {
            st.unconfirmed.remove(i);
            if nack {
                st.nacked.push(tag);
            }
        }
        drop(st);
        self.cond.notify_all();
    }
}

// ---------------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------------

/// Reply to `queue.declare` (AMQP `queue.declare-ok`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDeclareOk {
    pub queue: String,
    /// Messages ready in the queue (not counting unacknowledged ones).
    pub message_count: u32,
    pub consumer_count: u32,
}

/// A message fetched by `basic.get`.
#[derive(Debug, Clone, PartialEq)]
pub struct GetOk {
    pub delivery: Delivery,
    /// Messages left in the queue.
    pub message_count: u32,
}

/// A message the broker returned (`basic.return`, e.g. mandatory and unroutable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Returned {
    pub reply_code: u16,
    pub reply_text: String,
    pub exchange: String,
    pub routing_key: String,
}

/// Publisher-confirm outcome since the previous [`Channel::wait_for_confirms`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfirmStatus {
    /// Publish sequence numbers the broker nacked.
    pub nacked: Vec<u64>,
    /// Messages the broker returned.
    pub returned: Vec<Returned>,
}

/// An open AMQP 0-9-1 connection (Send + Sync). Dropping it closes it best-effort.
pub struct Connection {
    shared: Arc<ConnShared>,
    reader: Option<JoinHandle<()>>,
    close_ok: Receiver<()>,
    masked_url: String,
    closed: bool,
}

/// Handshake failures before the reader thread runs.
enum HsFail {
    Eof,
    Timeout,
    Io(std::io::Error),
    Protocol(Error),
}

fn client_properties(name: &str) -> FieldTable {
    let s = |v: &str| FieldValue::LongString(v.as_bytes().to_vec());
    let capabilities: FieldTable = [
        "publisher_confirms",
        "consumer_cancel_notify",
        "basic.nack",
        "connection.blocked",
        "authentication_failure_close",
        "exchange_exchange_bindings",
    ]
    .iter()
    .map(|c| (c.to_string(), FieldValue::Bool(true)))
    .collect();
    vec![
        ("product".into(), s("rmq-backup")),
        ("version".into(), s(env!("CARGO_PKG_VERSION"))),
        ("platform".into(), s("Rust")),
        ("connection_name".into(), s(name)),
        ("capabilities".into(), FieldValue::Table(capabilities)),
    ]
}

/// Negotiates a tune value: 0 on one side means "no preference", else the smaller one.
fn negotiate<T: Ord + Default + Copy>(ours: T, theirs: T) -> T {
    if ours == T::default() || theirs == T::default() {
        ours.max(theirs)
    } else {
        ours.min(theirs)
    }
}

fn table_str(t: &FieldTable, key: &str) -> String {
    match t.iter().find(|(k, _)| k == key) {
        Some((_, FieldValue::LongString(v))) => String::from_utf8_lossy(v).into_owned(),
        _ => "?".to_string(),
    }
}

/// Reads the next method on channel 0 during the handshake, skipping heartbeats.
fn handshake_method(
    frames: &mut FrameReader,
    deadline: Instant,
) -> std::result::Result<Method, HsFail> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(HsFail::Timeout);
        }
        frames
            .transport()
            .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))
            .map_err(HsFail::Io)?;
        match frames.next_frame() {
            Ok(Some(f)) => {
                log::trace!(
                    "amqp handshake received {} frame channel={} size={}",
                    frame_kind_name(f.kind),
                    f.channel,
                    f.payload.len()
                );
                match f.kind {
                    FRAME_HEARTBEAT => continue,
                    FRAME_METHOD if f.channel == 0 => {
                        return Method::decode(f.payload).map_err(HsFail::Protocol)
                    }
                    _ => {
                        return Err(HsFail::Protocol(Error::Amqp(format!(
                            "unexpected {} frame on channel {} during the handshake",
                            frame_kind_name(f.kind),
                            f.channel
                        ))))
                    }
                }
            }
            Ok(None) => continue,
            Err(ReadFail::Eof) => return Err(HsFail::Eof),
            Err(ReadFail::Io(e)) => return Err(HsFail::Io(e)),
            Err(ReadFail::Protocol(e)) => return Err(HsFail::Protocol(e)),
        }
    }
}

impl Connection {
    /// Opens a connection: TCP connect (bounded by `connect_timeout`), the AMQP handshake
    /// (PLAIN authentication, tune, open vhost; bounded by `connect_timeout + rpc_timeout`),
    /// then starts the reader thread.
    ///
    /// Errors (SPEC.md "Errors"):
    /// - `Error::Config("TLS (amqps) is not supported yet")` for `amqps` URLs;
    /// - `Error::Connection("Failed to connect to <masked url>: <detail>")` when the TCP connect
    ///   fails or times out, or the handshake fails for another reason;
    /// - `Error::Authentication("AMQP authentication failed for user <user>")` when the broker
    ///   refuses the credentials (403 or socket closed after start-ok);
    /// - `Error::Authentication("AMQP authentication failed for user <user>: <reply text>")` when
    ///   the vhost is refused (530/403 on connection.open).
    ///
    /// Metrics (`crate::metrics`): an open connection counts in
    /// `broker_backup_amqp_connections_active` until its reader thread ends; a connection error
    /// marks the broker connection lost for `/health`, a successful open marks it recovered.
    pub fn open(opts: &ConnectOptions) -> Result<Connection> {
        let m = crate::metrics::global();
        match Self::open_inner(opts) {
            Ok(conn) => {
                m.health.connection_ok();
                Ok(conn)
            }
            Err(e) => {
                if matches!(e, Error::Connection(_)) {
                    m.health.connection_lost(e.to_string(), m.progress());
                }
                Err(e)
            }
        }
    }

    fn open_inner(opts: &ConnectOptions) -> Result<Connection> {
        let url = &opts.url;
        let masked = url.masked();
        if url.tls {
            return Err(Error::Config(
                "TLS (amqps) is not supported yet".to_string(),
            ));
        }
        let failed = |detail: &dyn std::fmt::Display| {
            Error::Connection(format!("Failed to connect to {masked}: {detail}"))
        };
        let auth_failed =
            || Error::Authentication(format!("AMQP authentication failed for user {}", url.user));
        let addr = url.host_port();
        let transport = Transport::connect_tcp(&url.host, url.port, opts.connect_timeout)
            .map_err(|e| failed(&e))?;
        let mut writer = transport.try_clone().map_err(|e| failed(&e))?;
        let control = transport.try_clone().map_err(|e| failed(&e))?;
        writer
            .set_write_timeout(Some(opts.rpc_timeout.max(Duration::from_millis(1))))
            .map_err(|e| failed(&e))?;
        let ours_frame_max = if opts.frame_max == 0 {
            0
        } else {
            opts.frame_max.max(FRAME_MIN_SIZE)
        };
        let initial_payload = if ours_frame_max == 0 {
            UNLIMITED_FRAME_CAP
        } else {
            ours_frame_max as usize - FRAME_OVERHEAD
        };
        let mut frames = FrameReader::new(transport, initial_payload);
        let deadline = Instant::now() + opts.connect_timeout + opts.rpc_timeout;
        let mut buf = Vec::with_capacity(1024);

        let hs_err = |f: HsFail, after_auth: bool| -> Error {
            match f {
                HsFail::Eof if after_auth => auth_failed(),
                HsFail::Eof => failed(&"connection closed by the server during the AMQP handshake"),
                HsFail::Timeout => failed(&format_args!(
                    "timed out during the AMQP handshake ({})",
                    secs(opts.connect_timeout + opts.rpc_timeout)
                )),
                HsFail::Io(e) => failed(&e),
                HsFail::Protocol(e) => failed(&e.message()),
            }
        };
        let write = |w: &mut Transport, bytes: &[u8], after_auth: bool| -> Result<()> {
            w.write_all(bytes).map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    if after_auth =>
                {
                    auth_failed()
                }
                _ => failed(&e),
            })
        };
        let send = |w: &mut Transport, buf: &mut Vec<u8>, m: &Method, after_auth: bool| {
            buf.clear();
            put_method_frame(buf, 0, m, 0)?;
            log::trace!("amqp {addr} sent {} channel=0 size={}", m.name(), buf.len());
            write(w, buf, after_auth)
        };

        write(&mut writer, PROTOCOL_HEADER, false)?;
        let server_properties = match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionStart {
                version_major,
                version_minor,
                server_properties,
                mechanisms,
                ..
            }) => {
                if (version_major, version_minor) != (0, 9) {
                    return Err(failed(&format_args!(
                        "server speaks AMQP {version_major}-{version_minor}, not 0-9-1"
                    )));
                }
                let mechs = String::from_utf8_lossy(&mechanisms).into_owned();
                if !mechs.split_whitespace().any(|m| m == "PLAIN") {
                    return Err(failed(&format_args!(
                        "the broker does not offer PLAIN authentication (offers: {mechs})"
                    )));
                }
                server_properties
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.start, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, false)),
        };

        let mut response = Vec::with_capacity(url.user.len() + url.password.len() + 2);
        response.push(0);
        response.extend_from_slice(url.user.as_bytes());
        response.push(0);
        response.extend_from_slice(url.password.as_bytes());
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionStartOk {
                client_properties: client_properties(&opts.connection_name),
                mechanism: "PLAIN".to_string(),
                response: super::codec::Secret(response),
                locale: "en_US".to_string(),
            },
            false,
        )?;

        let (channel_max, frame_max, heartbeat) = match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionTune {
                channel_max,
                frame_max,
                heartbeat,
            }) => (
                negotiate(CHANNEL_MAX, channel_max),
                negotiate(ours_frame_max, frame_max),
                negotiate(opts.heartbeat_secs, heartbeat),
            ),
            Ok(Method::ConnectionClose {
                reply_code,
                reply_text,
                ..
            }) => {
                let _ = send(&mut writer, &mut buf, &Method::ConnectionCloseOk, true);
                log::debug!("amqp {addr} refused login: {reply_code} {reply_text}");
                return Err(if reply_code == 403 {
                    auth_failed()
                } else {
                    failed(&format_args!("connection closed by broker: {reply_text}"))
                });
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.tune, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, true)),
        };
        let frame_max = if frame_max != 0 {
            frame_max.max(FRAME_MIN_SIZE)
        } else {
            0
        };
        let channel_max = if channel_max == 0 {
            u16::MAX
        } else {
            channel_max
        };
        frames.set_max_payload(if frame_max == 0 {
            UNLIMITED_FRAME_CAP
        } else {
            frame_max as usize - FRAME_OVERHEAD
        });
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionTuneOk {
                channel_max,
                frame_max,
                heartbeat,
            },
            true,
        )?;
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionOpen {
                vhost: url.vhost.clone(),
            },
            true,
        )?;
        match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionOpenOk) => {}
            Ok(Method::ConnectionClose {
                reply_code,
                reply_text,
                ..
            }) => {
                let _ = send(&mut writer, &mut buf, &Method::ConnectionCloseOk, true);
                return Err(if reply_code == 530 || reply_code == 403 {
                    Error::Authentication(format!(
                        "AMQP authentication failed for user {}: {reply_text}",
                        url.user
                    ))
                } else {
                    failed(&format_args!("connection closed by broker: {reply_text}"))
                });
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.open-ok, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, true)),
        }

        let heartbeat = (heartbeat > 0).then(|| Duration::from_secs(heartbeat as u64));
        let tick = match heartbeat {
            Some(hb) => (hb / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            None => Duration::from_secs(1),
        };
        frames
            .transport()
            .set_read_timeout(Some(tick))
            .map_err(|e| failed(&e))?;
        let consumer_buffer = opts.consumer_buffer.max(1);
        let batch_max = (consumer_buffer / 4).clamp(1, 64);
        let shared = Arc::new(ConnShared {
            addr: addr.clone(),
            rpc_timeout: opts.rpc_timeout,
            frame_max,
            channel_max,
            heartbeat,
            batch_max,
            consumer_batches: (consumer_buffer / batch_max).max(1),
            server_properties,
            started: Instant::now(),
            writer: Mutex::new(writer),
            control,
            last_write_ms: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            error: Mutex::new(None),
            closing: AtomicBool::new(false),
            channels: Mutex::new(HashMap::new()),
            blocked: Mutex::new(None),
            blocked_cond: Condvar::new(),
        });
        let (close_ok_tx, close_ok_rx) = bounded(1);
        let reader_state = ReaderState {
            shared: shared.clone(),
            assembling: HashMap::new(),
            last_read: Instant::now(),
            close_ok: close_ok_tx,
            buf: Vec::with_capacity(256),
            pending: Vec::new(),
        };
        // Down again when the reader thread ends (ReaderState::run).
        crate::metrics::global().amqp_connections.inc();
        let reader = std::thread::Builder::new()
            .name(format!("amqp-reader {addr}"))
            .spawn(move || reader_state.run(frames))
            .map_err(|e| {
                crate::metrics::global().amqp_connections.dec();
                failed(&format_args!("cannot start the reader thread: {e}"))
            })?;
        log::debug!(
            "AMQP connection to {masked} open (broker {} {}, heartbeat {}s, frame_max {frame_max}, channel_max {channel_max})",
            table_str(&shared.server_properties, "product"),
            table_str(&shared.server_properties, "version"),
            heartbeat.map(|h| h.as_secs()).unwrap_or(0)
        );
        Ok(Connection {
            shared,
            reader: Some(reader),
            close_ok: close_ok_rx,
            masked_url: masked,
            closed: false,
        })
    }

    /// Opens a new channel (lowest free channel number), waiting for `channel.open-ok`.
    pub fn open_channel(&self) -> Result<Channel> {
        let (tx, rx) = unbounded();
        let chan = {
            let mut chans = lock(&self.shared.channels);
            self.shared.check()?;
            let id = (1..=self.shared.channel_max)
                .find(|i| !chans.contains_key(i))
                .ok_or_else(|| {
                    Error::Amqp(format!(
                        "no free channel: all {} channels are open",
                        self.shared.channel_max
                    ))
                })?;
            let chan = Arc::new(ChanShared {
                id,
                state: Mutex::new(ChanState {
                    closed: None,
                    rpc_tx: tx,
                    pending_consumer: None,
                    consumers: HashMap::new(),
                    confirm_mode: false,
                    next_seq: 0,
                    unconfirmed: VecDeque::new(),
                    nacked: Vec::new(),
                    returned: Vec::new(),
                }),
                cond: Condvar::new(),
            });
            chans.insert(id, chan.clone());
            chan
        };
        let ch = Channel {
            conn: self.shared.clone(),
            chan,
            rpc_rx: rx,
            buf: RefCell::new(Vec::with_capacity(4096)),
            closed: Cell::new(false),
        };
        ch.rpc(Method::ChannelOpen, "channel.open-ok", |r| {
            matches!(r, Reply::Method(Method::ChannelOpenOk))
        })?;
        log::trace!("amqp {} channel {} open", self.shared.addr, ch.id());
        Ok(ch)
    }

    /// The broker's `server-properties` from `connection.start` (product, version, capabilities...).
    pub fn server_properties(&self) -> &FieldTable {
        &self.shared.server_properties
    }

    /// The reason given by `connection.blocked` (resource alarm), until `connection.unblocked`.
    pub fn blocked(&self) -> Option<String> {
        lock(&self.shared.blocked).clone()
    }

    /// True until the connection failed or was closed.
    pub fn is_open(&self) -> bool {
        !self.shared.dead.load(Ordering::SeqCst) && !self.closed
    }

    /// The negotiated heartbeat interval (`None` = heartbeats off).
    pub fn heartbeat(&self) -> Option<Duration> {
        self.shared.heartbeat
    }

    /// The negotiated frame_max in bytes (0 = no limit).
    pub fn frame_max(&self) -> u32 {
        self.shared.frame_max
    }

    /// Closes the connection: `connection.close` then waits for `connection.close-ok`, bounded by
    /// rpc_timeout. An error if the connection had already failed (the failure), or on timeout.
    pub fn close(mut self) -> Result<()> {
        let t = self.shared.rpc_timeout;
        self.close_inner(t)
    }

    fn close_inner(&mut self, timeout: Duration) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let shared = self.shared.clone();
        let result = if shared.dead.load(Ordering::SeqCst) {
            Err(shared.current_error())
        } else {
            shared.closing.store(true, Ordering::SeqCst);
            let mut buf = Vec::with_capacity(64);
            let close = Method::ConnectionClose {
                reply_code: 200,
                reply_text: "Goodbye".to_string(),
                class_id: 0,
                method_id: 0,
            };
            match shared.send_method(0, &close, &mut buf) {
                Err(e) => Err(e),
                Ok(()) => match self.close_ok.recv_timeout(timeout) {
                    Ok(()) => Ok(()),
                    Err(RecvTimeoutError::Timeout) => Err(Error::Connection(format!(
                        "timed out after {} waiting for connection.close-ok from {}",
                        secs(timeout),
                        shared.addr
                    ))),
                    // The reader ended first: closed by the broker or lost meanwhile.
                    Err(RecvTimeoutError::Disconnected) => Err(shared.current_error()),
                },
            }
        };
        shared.closing.store(true, Ordering::SeqCst);
        shared.fail(Error::Connection(format!(
            "connection to {} was closed by the client",
            shared.addr
        )));
        shared.control.shutdown();
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
        log::debug!("AMQP connection to {} closed", self.masked_url);
        result
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let t = self.shared.rpc_timeout.min(Duration::from_secs(5));
        if let Err(e) = self.close_inner(t) {
            log::debug!("closing AMQP connection to {}: {e}", self.masked_url);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reader thread
// ---------------------------------------------------------------------------------------------

/// Exchange, routing key and flags of a delivery, before its content arrives.
struct DeliveryHead {
    delivery_tag: u64,
    redelivered: bool,
    exchange: String,
    routing_key: String,
}

enum Target {
    Deliver {
        consumer_tag: String,
        head: Result<DeliveryHead>,
    },
    Get {
        head: Result<DeliveryHead>,
        message_count: u32,
    },
    Return(Returned),
    /// Content for a channel that no longer exists: read and dropped.
    Discard,
}

/// A message being assembled from its content header and body frames.
struct Assembly {
    target: Target,
    properties: Option<Result<BasicProperties>>,
    body_size: u64,
    received: u64,
    body: Vec<u8>,
}

fn delivery_head(
    delivery_tag: u64,
    redelivered: bool,
    exchange: Vec<u8>,
    routing_key: Vec<u8>,
) -> Result<DeliveryHead> {
    Ok(DeliveryHead {
        delivery_tag,
        redelivered,
        exchange: utf8_short_string_owned(exchange, "exchange name of a delivery")?,
        routing_key: utf8_short_string_owned(routing_key, "routing key of a delivery")?,
    })
}

fn protocol_error(shared: &ConnShared, detail: impl std::fmt::Display) -> Error {
    shared.lost(format_args!("protocol error: {detail}"))
}

struct ReaderState {
    shared: Arc<ConnShared>,
    assembling: HashMap<u16, Assembly>,
    last_read: Instant,
    close_ok: Sender<()>,
    buf: Vec<u8>,
    /// Deliveries not handed to their consumer yet, one batch per consumer. Flushed before
    /// the reader waits on the socket, before any other method is handled (so a consumer
    /// sees its deliveries before the error that ends it), and when a batch is full.
    /// Per consumer: the batch being built and its body bytes.
    pending: Vec<(ConsumerSlot, Vec<Result<Delivery>>, usize)>,
}

enum Exit {
    /// connection.close-ok received.
    Closed,
}

impl ReaderState {
    fn run(mut self, mut frames: FrameReader) {
        let result = self.read_loop(&mut frames);
        // Hand over what was received, without waiting.
        for (slot, batch, _) in self.pending.drain(..) {
            let _ = slot.tx.try_send(batch);
        }
        let shared = self.shared.clone();
        let err = match result {
            Ok(Exit::Closed) => Error::Connection(format!(
                "connection to {} was closed by the client",
                shared.addr
            )),
            Err(e) => {
                if shared.closing.load(Ordering::SeqCst) {
                    log::debug!("amqp {} reader ended while closing: {e}", shared.addr);
                } else {
                    log::debug!("amqp {} connection failed: {e}", shared.addr);
                    let m = crate::metrics::global();
                    m.health.connection_lost(e.to_string(), m.progress());
                }
                e
            }
        };
        shared.fail_all(err);
        shared.control.shutdown();
        crate::metrics::global().amqp_connections.dec();
    }

    fn read_loop(&mut self, frames: &mut FrameReader) -> Result<Exit> {
        loop {
            if !self.pending.is_empty() && !frames.has_complete_frame() {
                self.flush_all()?;
            }
            match frames.next_frame() {
                Ok(Some(f)) => {
                    self.last_read = Instant::now();
                    if let Some(exit) = self.handle(f.kind, f.channel, f.payload)? {
                        return Ok(exit);
                    }
                }
                Ok(None) => {}
                Err(ReadFail::Eof) => {
                    return Err(Error::Connection("connection reset by peer".to_string()))
                }
                Err(ReadFail::Io(e)) => return Err(self.shared.lost(e)),
                Err(ReadFail::Protocol(e)) => return Err(self.shared.lost(e.message())),
            }
            self.tick()?;
        }
    }

    /// Heartbeat duties: declare the connection lost after two silent intervals, send ours.
    fn tick(&mut self) -> Result<()> {
        if let Some(hb) = self.shared.heartbeat {
            if self.last_read.elapsed() > hb * 2 {
                return Err(self.shared.lost("missed heartbeats"));
            }
        }
        if self.shared.dead.load(Ordering::SeqCst) {
            return Err(self.shared.current_error());
        }
        self.shared.heartbeat_if_due()
    }

    fn protocol(&self, detail: impl std::fmt::Display) -> Error {
        protocol_error(&self.shared, detail)
    }

    fn send(&mut self, channel: u16, m: &Method) {
        let mut buf = std::mem::take(&mut self.buf);
        if let Err(e) = self.shared.send_method(channel, m, &mut buf) {
            log::debug!("amqp {}: sending {}: {e}", self.shared.addr, m.name());
        }
        self.buf = buf;
    }

    fn handle(&mut self, kind: u8, channel: u16, payload: &[u8]) -> Result<Option<Exit>> {
        match kind {
            FRAME_METHOD => {
                let m = Method::decode(payload).map_err(|e| self.protocol(e.message()))?;
                if !self.pending.is_empty() && !matches!(m, Method::BasicDeliver { .. }) {
                    self.flush_all()?;
                }
                log::trace!(
                    "amqp {} received {} channel={channel} size={}",
                    self.shared.addr,
                    m.name(),
                    payload.len()
                );
                if self.assembling.contains_key(&channel) {
                    return Err(self.protocol(format_args!(
                        "{} on channel {channel} while a message body was expected",
                        m.name()
                    )));
                }
                if channel == 0 {
                    self.connection_method(m)
                } else {
                    self.channel_method(channel, m)?;
                    Ok(None)
                }
            }
            FRAME_HEADER => {
                log::trace!(
                    "amqp {} received content header channel={channel} size={}",
                    self.shared.addr,
                    payload.len()
                );
                let shared = &self.shared;
                let Some(a) = self.assembling.get_mut(&channel) else {
                    return Err(protocol_error(
                        shared,
                        format_args!(
                            "content header on channel {channel} without a content method"
                        ),
                    ));
                };
                if a.properties.is_some() {
                    return Err(protocol_error(
                        shared,
                        format_args!("second content header on channel {channel}"),
                    ));
                }
                let h = decode_content_header(payload)
                    .map_err(|e| protocol_error(shared, e.message()))?;
                if h.body_size > MAX_BODY_SIZE {
                    return Err(protocol_error(
                        shared,
                        format_args!(
                            "message body of {} bytes exceeds the maximum of {MAX_BODY_SIZE}",
                            h.body_size
                        ),
                    ));
                }
                a.body_size = h.body_size;
                if !matches!(a.target, Target::Discard) {
                    a.body = Vec::with_capacity(h.body_size.min(BODY_PREALLOC_MAX) as usize);
                }
                a.properties = Some(h.properties);
                if h.body_size == 0 {
                    self.complete(channel)?;
                }
                Ok(None)
            }
            FRAME_BODY => {
                log::trace!(
                    "amqp {} received body channel={channel} size={}",
                    self.shared.addr,
                    payload.len()
                );
                let shared = &self.shared;
                let Some(a) = self.assembling.get_mut(&channel) else {
                    return Err(protocol_error(
                        shared,
                        format_args!("body frame on channel {channel} without a content method"),
                    ));
                };
                if a.properties.is_none() {
                    return Err(protocol_error(
                        shared,
                        format_args!("body frame on channel {channel} before the content header"),
                    ));
                }
                let len = payload.len() as u64;
                if a.received + len > a.body_size {
                    return Err(protocol_error(
                        shared,
                        format_args!(
                            "body frames on channel {channel} exceed the announced {} bytes",
                            a.body_size
                        ),
                    ));
                }
                a.received += len;
                if !matches!(a.target, Target::Discard) {
                    if a.body.capacity() - a.body.len() < payload.len() {
                        a.body
                            .reserve_exact((a.body_size - a.body.len() as u64) as usize);
                    }
                    a.body.extend_from_slice(payload);
                }
                if a.received == a.body_size {
                    self.complete(channel)?;
                }
                Ok(None)
            }
            FRAME_HEARTBEAT => {
                log::trace!("amqp {} received heartbeat", self.shared.addr);
                Ok(None)
            }
            other => Err(self.protocol(format_args!("unexpected frame type {other}"))),
        }
    }

    fn connection_method(&mut self, m: Method) -> Result<Option<Exit>> {
        match m {
            Method::ConnectionClose {
                reply_code,
                reply_text,
                ..
            } => {
                log::debug!(
                    "amqp {} closed by broker: {reply_code} {reply_text}",
                    self.shared.addr
                );
                self.send(0, &Method::ConnectionCloseOk);
                Err(Error::Connection(format!(
                    "connection closed by broker: {reply_text}"
                )))
            }
            Method::ConnectionCloseOk => {
                let _ = self.close_ok.try_send(());
                Ok(Some(Exit::Closed))
            }
            Method::ConnectionBlocked { reason } => {
                log::debug!("amqp {} blocked by broker: {reason}", self.shared.addr);
                *lock(&self.shared.blocked) = Some(reason);
                Ok(None)
            }
            Method::ConnectionUnblocked => {
                log::debug!("amqp {} unblocked by broker", self.shared.addr);
                *lock(&self.shared.blocked) = None;
                self.shared.blocked_cond.notify_all();
                Ok(None)
            }
            other => {
                log::warn!(
                    "amqp {}: ignoring unexpected {} on channel 0",
                    self.shared.addr,
                    other.name()
                );
                Ok(None)
            }
        }
    }

    fn channel_method(&mut self, channel: u16, m: Method) -> Result<()> {
        let chan = self.shared.channel(channel);
        let begin = |target| Assembly {
            target,
            properties: None,
            body_size: 0,
            received: 0,
            body: Vec::new(),
        };
        let Some(chan) = chan else {
            // A channel we closed or never opened: consume its content, answer a close.
            match m {
                Method::BasicDeliver { .. }
                | Method::BasicGetOk { .. }
                | Method::BasicReturn { .. } => {
                    self.assembling.insert(channel, begin(Target::Discard));
                }
                Method::ChannelClose { .. } => self.send(channel, &Method::ChannelCloseOk),
                other => log::debug!(
                    "amqp {}: ignoring {} on unknown channel {channel}",
                    self.shared.addr,
                    other.name()
                ),
            }
            return Ok(());
        };
        match m {
            Method::BasicDeliver {
                consumer_tag,
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
            } => {
                let head = delivery_head(delivery_tag, redelivered, exchange, routing_key);
                self.assembling
                    .insert(channel, begin(Target::Deliver { consumer_tag, head }));
            }
            Method::BasicGetOk {
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
                message_count,
            } => {
                let head = delivery_head(delivery_tag, redelivered, exchange, routing_key);
                self.assembling.insert(
                    channel,
                    begin(Target::Get {
                        head,
                        message_count,
                    }),
                );
            }
            Method::BasicReturn {
                reply_code,
                reply_text,
                exchange,
                routing_key,
            } => {
                let lossy = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                let r = Returned {
                    reply_code,
                    reply_text: lossy(reply_text),
                    exchange: lossy(exchange),
                    routing_key: lossy(routing_key),
                };
                self.assembling.insert(channel, begin(Target::Return(r)));
            }
            Method::BasicAck {
                delivery_tag,
                multiple,
            } => chan.confirm(delivery_tag, multiple, false),
            Method::BasicNack {
                delivery_tag,
                multiple,
                ..
            } => chan.confirm(delivery_tag, multiple, true),
            Method::ChannelClose {
                reply_code,
                reply_text,
                ..
            } => {
                log::debug!(
                    "amqp {} channel {channel} closed by broker: {reply_code} {reply_text}",
                    self.shared.addr
                );
                self.send(channel, &Method::ChannelCloseOk);
                self.shared.remove_channel(channel);
                chan.fail(Error::Amqp(reply_text));
            }
            Method::ChannelCloseOk => {
                self.shared.remove_channel(channel);
                let _ = lock(&chan.state)
                    .rpc_tx
                    .send(Ok(Reply::Method(Method::ChannelCloseOk)));
                chan.fail(Error::Amqp(format!("channel {channel} is closed")));
            }
            Method::BasicCancel {
                consumer_tag,
                no_wait,
            } => {
                log::debug!(
                    "amqp {} consumer {consumer_tag} cancelled by broker",
                    self.shared.addr
                );
                let slot = lock(&chan.state).consumers.remove(&consumer_tag);
                if let Some(slot) = slot {
                    slot.state.end(Error::Amqp(format!(
                        "consumer {consumer_tag} was cancelled by the broker (the queue was deleted or is unavailable)"
                    )));
                }
                if !no_wait {
                    self.send(channel, &Method::BasicCancelOk { consumer_tag });
                }
            }
            Method::BasicCancelOk { consumer_tag } => {
                let mut st = lock(&chan.state);
                if let Some(slot) = st.consumers.remove(&consumer_tag) {
                    slot.state.end(Error::Amqp(format!(
                        "consumer {consumer_tag} was cancelled"
                    )));
                }
                let _ = st
                    .rpc_tx
                    .send(Ok(Reply::Method(Method::BasicCancelOk { consumer_tag })));
            }
            Method::BasicConsumeOk { consumer_tag } => {
                let mut st = lock(&chan.state);
                if let Some(slot) = st.pending_consumer.take() {
                    st.consumers.insert(consumer_tag.clone(), slot);
                }
                let _ = st
                    .rpc_tx
                    .send(Ok(Reply::Method(Method::BasicConsumeOk { consumer_tag })));
            }
            Method::ChannelFlow { active } => {
                self.send(channel, &Method::ChannelFlowOk { active });
            }
            Method::Unknown {
                class_id,
                method_id,
            } => log::warn!(
                "amqp {}: ignoring unknown method {class_id}.{method_id} on channel {channel}",
                self.shared.addr
            ),
            other => {
                let _ = lock(&chan.state).rpc_tx.send(Ok(Reply::Method(other)));
            }
        }
        Ok(())
    }

    /// A message is complete: hand it to its consumer, get waiter or the returned list.
    fn complete(&mut self, channel: u16) -> Result<()> {
        let Some(a) = self.assembling.remove(&channel) else {
            return Ok(());
        };
        let properties = a
            .properties
            .unwrap_or_else(|| Ok(BasicProperties::default()));
        let body = a.body;
        let make = |head: Result<DeliveryHead>, properties: Result<BasicProperties>| {
            let h = head?;
            let properties = properties.map_err(|e| {
                Error::Amqp(format!(
                    "message with delivery tag {} (routing key '{}'): {}",
                    h.delivery_tag,
                    h.routing_key,
                    e.message()
                ))
            })?;
            Ok(Delivery {
                delivery_tag: h.delivery_tag,
                redelivered: h.redelivered,
                exchange: h.exchange,
                routing_key: h.routing_key,
                properties,
                body,
            })
        };
        match a.target {
            Target::Deliver { consumer_tag, head } => {
                let Some(chan) = self.shared.channel(channel) else {
                    return Ok(());
                };
                let slot = lock(&chan.state).consumers.get(&consumer_tag).cloned();
                match slot {
                    Some(slot) => self.enqueue(slot, make(head, properties))?,
                    None => log::debug!(
                        "amqp {}: delivery for unknown consumer {consumer_tag} on channel {channel} dropped",
                        self.shared.addr
                    ),
                }
            }
            Target::Get {
                head,
                message_count,
            } => {
                if let Some(chan) = self.shared.channel(channel) {
                    let reply = make(head, properties).map(|delivery| {
                        Reply::Get(Box::new(GetOk {
                            delivery,
                            message_count,
                        }))
                    });
                    let _ = lock(&chan.state).rpc_tx.send(reply);
                }
            }
            Target::Return(r) => {
                if let Some(chan) = self.shared.channel(channel) {
                    lock(&chan.state).returned.push(r);
                    chan.cond.notify_all();
                }
            }
            Target::Discard => {}
        }
        Ok(())
    }

    /// Adds a delivery to its consumer's pending batch; a full batch is handed over.
    fn enqueue(&mut self, slot: ConsumerSlot, item: Result<Delivery>) -> Result<()> {
        let i = match self
            .pending
            .iter()
            .position(|(s, _, _)| Arc::ptr_eq(&s.state, &slot.state))
        {
            Some(i) => i,
            None => {
                let batch = Vec::with_capacity(self.shared.batch_max);
                self.pending.push((slot, batch, 0));
                self.pending.len() - 1
            }
        };
        let bytes = item.as_ref().map_or(0, |d| d.body.len());
        let entry = &mut self.pending[i];
        entry.1.push(item);
        entry.2 += bytes;
        if entry.1.len() >= self.shared.batch_max || entry.2 >= BATCH_BYTES_MAX {
            let (slot, batch, _) = self.pending.swap_remove(i);
            self.push(slot, batch)?;
        }
        Ok(())
    }

    /// Hands every pending batch to its consumer.
    fn flush_all(&mut self) -> Result<()> {
        while let Some((slot, batch, _)) = self.pending.pop() {
            self.push(slot, batch)?;
        }
        Ok(())
    }

    /// Puts a batch of deliveries in a consumer's bounded queue. While the queue is full the
    /// reader waits here (TCP back-pressure), sending heartbeats, until the consumer takes one,
    /// stops, or the connection closes.
    fn push(&mut self, slot: ConsumerSlot, item: Vec<Result<Delivery>>) -> Result<()> {
        let mut item = match slot.tx.try_send(item) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => return Ok(()),
            Err(TrySendError::Full(back)) => back,
        };
        loop {
            if slot.state.stopping.load(Ordering::SeqCst)
                || self.shared.closing.load(Ordering::SeqCst)
            {
                log::trace!(
                    "amqp {}: dropped a delivery for a stopped consumer",
                    self.shared.addr
                );
                break;
            }
            match slot.tx.send_timeout(item, PUSH_TICK) {
                Ok(()) | Err(SendTimeoutError::Disconnected(_)) => break,
                Err(SendTimeoutError::Timeout(back)) => {
                    item = back;
                    if self.shared.dead.load(Ordering::SeqCst) {
                        return Err(self.shared.current_error());
                    }
                    self.shared.heartbeat_if_due()?;
                }
            }
        }
        // We were not reading: the broker's silence meanwhile says nothing.
        self.last_read = Instant::now();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Channel
// ---------------------------------------------------------------------------------------------

/// An AMQP channel (Send, not Sync: use it from one thread at a time). Dropping it sends
/// `channel.close` without waiting.
pub struct Channel {
    conn: Arc<ConnShared>,
    chan: Arc<ChanShared>,
    rpc_rx: Receiver<Result<Reply>>,
    buf: RefCell<Vec<u8>>,
    closed: Cell<bool>,
}

impl Channel {
    /// The channel number.
    pub fn id(&self) -> u16 {
        self.chan.id
    }

    fn check_open(&self) -> Result<()> {
        if let Some(e) = &lock(&self.chan.state).closed {
            return Err(e.clone());
        }
        self.conn.check()
    }

    fn send_method(&self, m: &Method) -> Result<()> {
        let mut buf = self.buf.borrow_mut();
        let r = self.conn.send_method(self.chan.id, m, &mut buf);
        if buf.capacity() > 1 << 20 {
            *buf = Vec::with_capacity(4096);
        }
        r
    }

    /// Sends a synchronous method and waits (rpc_timeout) for the reply accepted by `accept`.
    /// After a timeout or an unexpected reply the channel is unusable (a late reply could be
    /// taken for the next one).
    fn rpc(&self, m: Method, expect: &str, accept: impl Fn(&Reply) -> bool) -> Result<Reply> {
        self.check_open()?;
        // Drop anything stale (e.g. the error that closed a channel is also queued there).
        while self.rpc_rx.try_recv().is_ok() {}
        self.send_method(&m)?;
        match self.rpc_rx.recv_timeout(self.conn.rpc_timeout) {
            Ok(Ok(reply)) if accept(&reply) => Ok(reply),
            Ok(Ok(reply)) => {
                let e = Error::Amqp(format!(
                    "unexpected {} on channel {} while waiting for {expect}",
                    reply.name(),
                    self.id()
                ));
                self.mark_broken(e.clone());
                Err(e)
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                let e = Error::Connection(format!(
                    "timed out after {} waiting for {expect} on channel {} of {}",
                    secs(self.conn.rpc_timeout),
                    self.id(),
                    self.conn.addr
                ));
                self.mark_broken(e.clone());
                Err(e)
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.conn.current_error()),
        }
    }

    fn mark_broken(&self, e: Error) {
        let mut st = lock(&self.chan.state);
        if st.closed.is_none() {
            st.closed = Some(e);
        }
        drop(st);
        self.chan.cond.notify_all();
    }

    /// `basic.qos`: at most `prefetch_count` unacknowledged deliveries (0 = no limit; quorum
    /// queues treat 0 as 2000, ENVIRONMENT.md) per consumer, or per channel when `global`.
    pub fn basic_qos(&self, prefetch_count: u16, global: bool) -> Result<()> {
        self.rpc(
            Method::BasicQos {
                prefetch_size: 0,
                prefetch_count,
                global,
            },
            "basic.qos-ok",
            |r| matches!(r, Reply::Method(Method::BasicQosOk)),
        )
        .map(|_| ())
    }

    fn declare(&self, m: Method) -> Result<QueueDeclareOk> {
        match self.rpc(m, "queue.declare-ok", |r| {
            matches!(r, Reply::Method(Method::QueueDeclareOk { .. }))
        })? {
            Reply::Method(Method::QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            }) => Ok(QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            }),
            _ => Err(Error::Amqp("unexpected reply to queue.declare".to_string())),
        }
    }

    /// Passive `queue.declare`: the queue's ready message and consumer counts. A missing queue
    /// closes the channel with `AMQP error: NOT_FOUND - no queue '<name>' in vhost '<vhost>'`.
    pub fn queue_declare_passive(&self, name: &str) -> Result<QueueDeclareOk> {
        self.declare(Method::QueueDeclare {
            queue: name.to_string(),
            passive: true,
            durable: false,
            exclusive: false,
            auto_delete: false,
            no_wait: false,
            arguments: Vec::new(),
        })
    }

    /// `queue.declare` (an empty name lets the broker choose one, returned in the reply).
    pub fn queue_declare(
        &self,
        name: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<QueueDeclareOk> {
        self.declare(Method::QueueDeclare {
            queue: name.to_string(),
            passive: false,
            durable,
            exclusive,
            auto_delete,
            no_wait: false,
            arguments: arguments.clone(),
        })
    }

    /// `queue.delete`; returns the number of messages deleted with it.
    pub fn queue_delete(&self, name: &str) -> Result<u32> {
        match self.rpc(
            Method::QueueDelete {
                queue: name.to_string(),
                if_unused: false,
                if_empty: false,
                no_wait: false,
            },
            "queue.delete-ok",
            |r| matches!(r, Reply::Method(Method::QueueDeleteOk { .. })),
        )? {
            Reply::Method(Method::QueueDeleteOk { message_count }) => Ok(message_count),
            _ => Err(Error::Amqp("unexpected reply to queue.delete".to_string())),
        }
    }

    /// `queue.purge`; returns the number of messages purged.
    pub fn queue_purge(&self, name: &str) -> Result<u32> {
        match self.rpc(
            Method::QueuePurge {
                queue: name.to_string(),
                no_wait: false,
            },
            "queue.purge-ok",
            |r| matches!(r, Reply::Method(Method::QueuePurgeOk { .. })),
        )? {
            Reply::Method(Method::QueuePurgeOk { message_count }) => Ok(message_count),
            _ => Err(Error::Amqp("unexpected reply to queue.purge".to_string())),
        }
    }

    /// `exchange.declare` (not passive, not internal).
    pub fn exchange_declare(
        &self,
        name: &str,
        kind: &str,
        durable: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<()> {
        self.rpc(
            Method::ExchangeDeclare {
                exchange: name.to_string(),
                kind: kind.to_string(),
                passive: false,
                durable,
                auto_delete,
                internal: false,
                no_wait: false,
                arguments: arguments.clone(),
            },
            "exchange.declare-ok",
            |r| matches!(r, Reply::Method(Method::ExchangeDeclareOk)),
        )
        .map(|_| ())
    }

    /// `exchange.delete`.
    pub fn exchange_delete(&self, name: &str) -> Result<()> {
        self.rpc(
            Method::ExchangeDelete {
                exchange: name.to_string(),
                if_unused: false,
                no_wait: false,
            },
            "exchange.delete-ok",
            |r| matches!(r, Reply::Method(Method::ExchangeDeleteOk)),
        )
        .map(|_| ())
    }

    /// `queue.bind`.
    pub fn queue_bind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        self.rpc(
            Method::QueueBind {
                queue: queue.to_string(),
                exchange: exchange.to_string(),
                routing_key: routing_key.to_string(),
                no_wait: false,
                arguments: arguments.clone(),
            },
            "queue.bind-ok",
            |r| matches!(r, Reply::Method(Method::QueueBindOk)),
        )
        .map(|_| ())
    }

    /// `basic.consume`. Deliveries arrive through the returned [`Consumer`]; an empty
    /// `consumer_tag` lets the broker choose one.
    pub fn basic_consume(
        &self,
        queue: &str,
        consumer_tag: &str,
        no_ack: bool,
        exclusive: bool,
        arguments: &FieldTable,
    ) -> Result<Consumer> {
        self.check_open()?;
        let (tx, rx) = bounded(self.conn.consumer_batches);
        let state = Arc::new(ConsumerState {
            stopping: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        lock(&self.chan.state).pending_consumer = Some(ConsumerSlot {
            tx,
            state: state.clone(),
        });
        let reply = self.rpc(
            Method::BasicConsume {
                queue: queue.to_string(),
                consumer_tag: consumer_tag.to_string(),
                no_local: false,
                no_ack,
                exclusive,
                no_wait: false,
                arguments: arguments.clone(),
            },
            "basic.consume-ok",
            |r| matches!(r, Reply::Method(Method::BasicConsumeOk { .. })),
        );
        match reply {
            Ok(Reply::Method(Method::BasicConsumeOk { consumer_tag })) => Ok(Consumer {
                tag: consumer_tag,
                rx,
                local: Mutex::new(VecDeque::new()),
                state,
            }),
            Ok(_) => Err(Error::Amqp("unexpected reply to basic.consume".to_string())),
            Err(e) => {
                lock(&self.chan.state).pending_consumer = None;
                Err(e)
            }
        }
    }

    /// `basic.cancel`, waiting for `basic.cancel-ok`. Deliveries already buffered stay readable
    /// from the [`Consumer`]; after them it reports that it was cancelled. Deliveries still
    /// arriving that do not fit its buffer are dropped (without no_ack the broker requeues them
    /// when the channel closes).
    pub fn basic_cancel(&self, consumer_tag: &str) -> Result<()> {
        if let Some(c) = lock(&self.chan.state).consumers.get(consumer_tag) {
            c.state.stopping.store(true, Ordering::SeqCst);
        }
        self.rpc(
            Method::BasicCancel {
                consumer_tag: consumer_tag.to_string(),
                no_wait: false,
            },
            "basic.cancel-ok",
            |r| matches!(r, Reply::Method(Method::BasicCancelOk { .. })),
        )
        .map(|_| ())
    }

    /// `basic.get`: one message, or `None` when the queue is empty.
    pub fn basic_get(&self, queue: &str, no_ack: bool) -> Result<Option<GetOk>> {
        match self.rpc(
            Method::BasicGet {
                queue: queue.to_string(),
                no_ack,
            },
            "basic.get-ok",
            |r| matches!(r, Reply::Get(_) | Reply::Method(Method::BasicGetEmpty)),
        )? {
            Reply::Get(g) => Ok(Some(*g)),
            _ => Ok(None),
        }
    }

    /// `basic.ack` (no reply).
    pub fn basic_ack(&self, delivery_tag: u64, multiple: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicAck {
            delivery_tag,
            multiple,
        })
    }

    /// `basic.nack` (no reply).
    pub fn basic_nack(&self, delivery_tag: u64, multiple: bool, requeue: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicNack {
            delivery_tag,
            multiple,
            requeue,
        })
    }

    /// `basic.reject` (no reply).
    pub fn basic_reject(&self, delivery_tag: u64, requeue: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicReject {
            delivery_tag,
            requeue,
        })
    }

    /// `confirm.select`: from now on every publish gets a sequence number and a confirm.
    pub fn confirm_select(&self) -> Result<()> {
        self.rpc(
            Method::ConfirmSelect { no_wait: false },
            "confirm.select-ok",
            |r| matches!(r, Reply::Method(Method::ConfirmSelectOk)),
        )?;
        lock(&self.chan.state).confirm_mode = true;
        Ok(())
    }

    /// True once `confirm.select` succeeded on this channel.
    pub fn confirm_mode(&self) -> bool {
        lock(&self.chan.state).confirm_mode
    }

    /// `basic.publish`. Returns the publish sequence number (1-based) in confirm mode, else 0.
    /// The body is split by the negotiated frame_max; method, header and body frames go out in
    /// one write call. While the broker blocks the connection (`connection.blocked`) this
    /// waits, at most rpc_timeout, then fails with `Error::Connection`.
    pub fn basic_publish(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: &BasicProperties,
        body: &[u8],
    ) -> Result<u64> {
        self.check_open()?;
        self.conn.wait_unblocked()?;
        let mut buf = self.buf.borrow_mut();
        buf.clear();
        put_publish(
            &mut buf,
            self.chan.id,
            exchange,
            routing_key,
            mandatory,
            properties,
            body,
            self.conn.frame_max,
        )?;
        let seq = {
            let mut st = lock(&self.chan.state);
            if st.confirm_mode {
                st.next_seq += 1;
                let seq = st.next_seq;
                st.unconfirmed.push_back(seq);
                seq
            } else {
                0
            }
        };
        log::trace!(
            "amqp {} sent basic.publish channel={} exchange='{exchange}' routing_key='{routing_key}' body={} bytes, {} bytes in frames, seq={seq}",
            self.conn.addr,
            self.chan.id,
            body.len(),
            buf.len()
        );
        let r = self.conn.write(&buf);
        if buf.capacity() > 4 << 20 {
            *buf = Vec::with_capacity(4096);
        }
        r.map(|_| seq)
    }

    /// Waits until at most `max_outstanding` published messages are unconfirmed (0 = all
    /// confirmed), at most `timeout`; then `Error::Connection("timed out after ... waiting for
    /// publisher confirms ...")`. Returns the nacked sequence numbers and `basic.return`s
    /// received since the previous call. A channel closed by the broker gives its error.
    pub fn wait_for_confirms(
        &self,
        max_outstanding: u64,
        timeout: Duration,
    ) -> Result<ConfirmStatus> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.chan.state);
        loop {
            if let Some(e) = &st.closed {
                return Err(e.clone());
            }
            let outstanding = st.unconfirmed.len() as u64;
            if outstanding <= max_outstanding {
                return Ok(ConfirmStatus {
                    nacked: std::mem::take(&mut st.nacked),
                    returned: std::mem::take(&mut st.returned),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Connection(format!(
                    "timed out after {} waiting for publisher confirms on channel {} of {}: {outstanding} unconfirmed, waiting for at most {max_outstanding}",
                    secs(timeout),
                    self.chan.id,
                    self.conn.addr
                )));
            }
            st = self
                .chan
                .cond
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Published messages not confirmed yet.
    pub fn outstanding_confirms(&self) -> u64 {
        lock(&self.chan.state).unconfirmed.len() as u64
    }

    /// Closes the channel (`channel.close`, waits for close-ok up to rpc_timeout). Unacked
    /// deliveries go back to their queues. Returns the broker's error if the broker had closed
    /// the channel (e.g. a publish to a missing exchange), so no failure goes unseen.
    pub fn close(self) -> Result<()> {
        self.close_inner()
    }

    fn stop_consumers(&self) {
        let st = lock(&self.chan.state);
        for c in st.consumers.values() {
            c.state.stopping.store(true, Ordering::SeqCst);
        }
    }

    fn close_method() -> Method {
        Method::ChannelClose {
            reply_code: 200,
            reply_text: "Normal shutdown".to_string(),
            class_id: 0,
            method_id: 0,
        }
    }

    /// True while the reader still knows this channel (not closed by the broker, no close-ok).
    fn registered(&self) -> bool {
        self.conn
            .channel(self.chan.id)
            .is_some_and(|c| Arc::ptr_eq(&c, &self.chan))
    }

    fn close_inner(&self) -> Result<()> {
        if self.closed.replace(true) {
            return Ok(());
        }
        let prior = lock(&self.chan.state).closed.clone();
        if !self.registered() || self.conn.dead.load(Ordering::SeqCst) {
            // Closed by the broker (its error) or the connection is gone.
            return match prior {
                Some(e) => Err(e),
                None => self.conn.check(),
            };
        }
        self.stop_consumers();
        if let Some(e) = prior {
            // Unusable after a timeout: still ask the broker to release the channel.
            let _ = self.send_method(&Self::close_method());
            return Err(e);
        }
        self.rpc(Self::close_method(), "channel.close-ok", |r| {
            matches!(r, Reply::Method(Method::ChannelCloseOk))
        })
        .map(|_| ())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.closed.replace(true) || self.conn.dead.load(Ordering::SeqCst) || !self.registered()
        {
            return;
        }
        self.stop_consumers();
        let _ = self.send_method(&Self::close_method());
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------

/// The receiving end of a `basic.consume`. Dropping it stops the reader from waiting on it.
pub struct Consumer {
    tag: String,
    rx: Receiver<Vec<Result<Delivery>>>,
    /// The rest of the last batch received.
    local: Mutex<VecDeque<Result<Delivery>>>,
    state: Arc<ConsumerState>,
}

impl Consumer {
    /// The consumer tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The next delivery; `Ok(None)` when none arrived within `timeout`. Once the consumer is
    /// cancelled, its channel or connection closed, buffered deliveries come first and then the
    /// reason as an error (e.g. the broker's reply text, `Error::Amqp`). A delivery whose
    /// properties cannot be read (a short string not valid UTF-8) is an `Error::Amqp` naming it.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Delivery>> {
        let mut local = lock(&self.local);
        if local.is_empty() {
            match self.rx.recv_timeout(timeout) {
                Ok(batch) => local.extend(batch),
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => return Err(self.ended()),
            }
        }
        local.pop_front().transpose()
    }

    /// Like [`Consumer::recv_timeout`] without waiting.
    pub fn try_recv(&self) -> Result<Option<Delivery>> {
        let mut local = lock(&self.local);
        if local.is_empty() {
            match self.rx.try_recv() {
                Ok(batch) => local.extend(batch),
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(None),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(self.ended()),
            }
        }
        local.pop_front().transpose()
    }

    fn ended(&self) -> Error {
        lock(&self.state.error)
            .clone()
            .unwrap_or_else(|| Error::Amqp(format!("consumer {} has ended", self.tag)))
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Connection>();
    send::<Channel>();
    send::<Consumer>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(30u16, 60), 30);
        assert_eq!(negotiate(0u16, 60), 60);
        assert_eq!(negotiate(30u16, 0), 30);
        assert_eq!(negotiate(0u16, 0), 0);
        assert_eq!(negotiate(131_072u32, 4096), 4096);
    }

    #[test]
    fn options_defaults_follow_url() {
        let o = ConnectOptions::new(
            AmqpUrl::parse("amqp://h/v?heartbeat=7&connection_timeout=1500").unwrap(),
        );
        assert_eq!(o.heartbeat_secs, 7);
        assert_eq!(o.connect_timeout, Duration::from_millis(1500));
        assert_eq!(o.rpc_timeout, Duration::from_secs(30));
        assert_eq!(o.frame_max, 131_072);
        let o = ConnectOptions::new(AmqpUrl::parse("amqp://h").unwrap());
        assert_eq!(o.heartbeat_secs, 30);
        assert_eq!(o.connect_timeout, Duration::from_secs(10));
    }

    #[test]
    fn tls_is_refused_with_config_error() {
        let o = ConnectOptions::new(AmqpUrl::parse("amqps://u:p@127.0.0.1/v").unwrap());
        let e = Connection::open(&o).err().unwrap();
        assert_eq!(e, Error::Config("TLS (amqps) is not supported yet".into()));
    }

    #[test]
    fn confirms_single_multiple_and_nack() {
        let (tx, _rx) = unbounded();
        let c = ChanShared {
            id: 1,
            state: Mutex::new(ChanState {
                closed: None,
                rpc_tx: tx,
                pending_consumer: None,
                consumers: HashMap::new(),
                confirm_mode: true,
                next_seq: 10,
                unconfirmed: (1..=10).collect(),
                nacked: Vec::new(),
                returned: Vec::new(),
            }),
            cond: Condvar::new(),
        };
        c.confirm(3, false, false);
        c.confirm(5, true, false);
        assert_eq!(
            lock(&c.state)
                .unconfirmed
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![6, 7, 8, 9, 10]
        );
        c.confirm(7, false, true);
        c.confirm(8, true, true);
        assert_eq!(lock(&c.state).nacked, vec![7, 6, 8]);
        c.confirm(0, true, false);
        assert!(lock(&c.state).unconfirmed.is_empty());
        // an unknown tag changes nothing
        c.confirm(42, false, true);
        assert_eq!(lock(&c.state).nacked.len(), 3);
    }

    /// A fake broker on a local socket: the reader must turn garbage into an error, not a panic.
    #[test]
    fn garbage_from_server_during_handshake_is_a_connection_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut hdr = [0u8; 8];
            std::io::Read::read_exact(&mut s, &mut hdr).unwrap();
            // a frame header announcing a 4 GiB method frame
            s.write_all(&[1, 0, 0, 0xff, 0xff, 0xff, 0xff]).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let mut o = ConnectOptions::new(
            AmqpUrl::parse(&format!("amqp://u:secret@127.0.0.1:{port}/v")).unwrap(),
        );
        o.rpc_timeout = Duration::from_secs(2);
        let e = Connection::open(&o).err().unwrap();
        let msg = e.to_string();
        assert!(matches!(e, Error::Connection(_)), "{msg}");
        assert!(
            msg.contains("Failed to connect to amqp://u:****@127.0.0.1"),
            "{msg}"
        );
        assert!(msg.contains("exceeds"), "{msg}");
        assert!(!msg.contains("secret"));
        t.join().unwrap();
    }

    #[test]
    fn silent_server_times_out() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (_s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_millis(1500));
        });
        let mut o =
            ConnectOptions::new(AmqpUrl::parse(&format!("amqp://u:p@127.0.0.1:{port}/v")).unwrap());
        o.connect_timeout = Duration::from_millis(300);
        o.rpc_timeout = Duration::from_millis(300);
        let start = Instant::now();
        let e = Connection::open(&o).err().unwrap();
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(
            e.to_string()
                .contains("timed out during the AMQP handshake"),
            "{e}"
        );
        t.join().unwrap();
    }

    /// How far a fake broker goes with the handshake.
    #[derive(Clone, Copy, PartialEq)]
    enum Stage {
        /// Close the socket right after connection.start-ok.
        EofAfterStartOk,
        /// Complete the handshake.
        Open,
    }

    struct FakePeer {
        frames: FrameReader,
        w: Transport,
    }

    impl FakePeer {
        fn next(&mut self) -> Option<(u8, u16, Option<Method>)> {
            loop {
                match self.frames.next_frame() {
                    Ok(Some(f)) => {
                        let m =
                            (f.kind == FRAME_METHOD).then(|| Method::decode(f.payload).unwrap());
                        return Some((f.kind, f.channel, m));
                    }
                    Ok(None) => continue,
                    Err(_) => return None,
                }
            }
        }
        fn method(&mut self) -> Method {
            loop {
                if let (_, _, Some(m)) = self.next().expect("frame") {
                    return m;
                }
            }
        }
        fn send(&mut self, ch: u16, m: Method) {
            let mut b = Vec::new();
            put_method_frame(&mut b, ch, &m, 0).unwrap();
            self.w.write_all(&b).unwrap();
        }
    }

    /// A broker stand-in on a local port; `after` runs once the handshake is done.
    fn fake_broker<T: Send + 'static>(
        stage: Stage,
        heartbeat: u16,
        after: impl FnOnce(FakePeer) -> T + Send + 'static,
    ) -> (u16, std::thread::JoinHandle<Option<T>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut hdr = [0u8; 8];
            std::io::Read::read_exact(&mut &s, &mut hdr).unwrap();
            assert_eq!(&hdr, PROTOCOL_HEADER);
            let t = Transport::Tcp(s);
            t.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut p = FakePeer {
                w: t.try_clone().unwrap(),
                frames: FrameReader::new(t, 1 << 20),
            };
            p.send(
                0,
                Method::ConnectionStart {
                    version_major: 0,
                    version_minor: 9,
                    server_properties: vec![(
                        "product".into(),
                        FieldValue::LongString(b"Fake".to_vec()),
                    )],
                    mechanisms: b"AMQPLAIN PLAIN".to_vec(),
                    locales: b"en_US".to_vec(),
                },
            );
            let Method::ConnectionStartOk {
                client_properties,
                response,
                ..
            } = p.method()
            else {
                panic!("expected start-ok")
            };
            assert_eq!(response.0, b"\0user\0pw");
            assert_eq!(format!("{response:?}"), "****");
            assert_eq!(table_str(&client_properties, "product"), "rmq-backup");
            if stage == Stage::EofAfterStartOk {
                return None;
            }
            p.send(
                0,
                Method::ConnectionTune {
                    channel_max: 0,
                    frame_max: 131072,
                    heartbeat,
                },
            );
            assert!(matches!(p.method(), Method::ConnectionTuneOk { .. }));
            assert!(matches!(p.method(), Method::ConnectionOpen { .. }));
            p.send(0, Method::ConnectionOpenOk);
            Some(after(p))
        });
        (port, t)
    }

    fn fake_opts(port: u16, heartbeat: u16) -> ConnectOptions {
        let mut o = ConnectOptions::new(
            AmqpUrl::parse(&format!("amqp://user:pw@127.0.0.1:{port}/v")).unwrap(),
        );
        o.heartbeat_secs = heartbeat;
        o.rpc_timeout = Duration::from_millis(500);
        o
    }

    fn wait_closed(conn: &Connection, within: Duration) {
        let deadline = Instant::now() + within;
        while conn.is_open() {
            assert!(Instant::now() < deadline, "connection still open");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn socket_closed_after_start_ok_is_authentication_error() {
        let (port, t) = fake_broker(Stage::EofAfterStartOk, 0, |_| ());
        let e = Connection::open(&fake_opts(port, 0)).err().unwrap();
        assert_eq!(
            e,
            Error::Authentication("AMQP authentication failed for user user".into())
        );
        t.join().unwrap();
    }

    #[test]
    fn silent_broker_is_lost_after_missed_heartbeats_and_we_send_ours() {
        let (port, t) = fake_broker(Stage::Open, 1, |mut p| {
            // Read for 3.5 s without ever sending anything; count the client's heartbeats.
            let end = Instant::now() + Duration::from_millis(3500);
            let mut heartbeats = 0;
            while Instant::now() < end {
                match p.frames.next_frame() {
                    Ok(Some(f)) if f.kind == FRAME_HEARTBEAT => heartbeats += 1,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            heartbeats
        });
        let conn = Connection::open(&fake_opts(port, 5)).unwrap();
        assert_eq!(conn.heartbeat(), Some(Duration::from_secs(1)), "min(5, 1)");
        let start = Instant::now();
        wait_closed(&conn, Duration::from_secs(4));
        assert!(start.elapsed() >= Duration::from_secs(2));
        let e = conn.open_channel().err().unwrap();
        assert_eq!(
            e,
            Error::Connection(format!(
                "connection to 127.0.0.1:{port} lost: missed heartbeats"
            ))
        );
        assert_eq!(conn.close().unwrap_err(), e);
        let heartbeats = t.join().unwrap().unwrap();
        assert!(heartbeats >= 2, "client sent {heartbeats} heartbeats");
    }

    #[test]
    fn eof_after_handshake_is_connection_reset() {
        let (port, t) = fake_broker(Stage::Open, 0, drop);
        let conn = Connection::open(&fake_opts(port, 0)).unwrap();
        assert_eq!(conn.heartbeat(), None, "both 0: off");
        wait_closed(&conn, Duration::from_secs(3));
        assert_eq!(
            conn.open_channel().err().unwrap(),
            Error::Connection("connection reset by peer".into())
        );
        t.join().unwrap();
    }

    #[test]
    fn blocked_connection_holds_publishes_until_unblocked() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (port, t) = fake_broker(Stage::Open, 0, move |mut p| {
            assert_eq!(p.method(), Method::ChannelOpen);
            p.send(1, Method::ChannelOpenOk);
            p.send(
                0,
                Method::ConnectionBlocked {
                    reason: "low on memory".into(),
                },
            );
            rx.recv().unwrap(); // the client saw the timeout
            p.send(0, Method::ConnectionUnblocked);
            // the publish: method, header, 3 body frames (10,000 bytes at frame_max 4096)
            let mut kinds = Vec::new();
            while kinds.len() < 5 {
                let (kind, ch, m) = p.next().unwrap();
                assert_eq!(ch, 1);
                if let Some(m) = m {
                    assert_eq!(m.name(), "basic.publish");
                }
                kinds.push(kind);
            }
            p.send(
                0,
                Method::ConnectionClose {
                    reply_code: 320,
                    reply_text: "CONNECTION_FORCED - bye".into(),
                    class_id: 0,
                    method_id: 0,
                },
            );
            assert_eq!(p.method(), Method::ConnectionCloseOk);
            kinds
        });
        let mut o = fake_opts(port, 0);
        o.frame_max = 4096;
        let conn = Connection::open(&o).unwrap();
        assert_eq!(conn.frame_max(), 4096);
        let ch = conn.open_channel().unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while conn.blocked().is_none() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(conn.blocked().as_deref(), Some("low on memory"));
        let start = Instant::now();
        let e = ch
            .basic_publish("", "q", false, &BasicProperties::default(), b"x")
            .unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(450));
        assert_eq!(
            e,
            Error::Connection(format!(
                "connection to 127.0.0.1:{port} is blocked by the broker (low on memory); gave up after 0.5s"
            ))
        );
        tx.send(()).unwrap();
        let body = vec![9u8; 10_000];
        // the publish waits for the unblock, then goes out
        assert_eq!(
            ch.basic_publish("", "q", false, &BasicProperties::default(), &body)
                .unwrap(),
            0
        );
        let kinds = t.join().unwrap().unwrap();
        assert_eq!(
            kinds,
            vec![
                FRAME_METHOD,
                FRAME_HEADER,
                FRAME_BODY,
                FRAME_BODY,
                FRAME_BODY
            ]
        );
        wait_closed(&conn, Duration::from_secs(3));
        let e = ch.basic_qos(1, false).unwrap_err();
        assert_eq!(
            e,
            Error::Connection("connection closed by broker: CONNECTION_FORCED - bye".into())
        );
    }
}
