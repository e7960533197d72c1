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

//!
//! Files: this one holds the options and the shared types; `handshake` opens a connection,
//! `shared` is the state the reader thread shares, `reader` the reader thread's dispatch,
//! `deliveries` assembles deliveries, `channel` the synchronous channel methods, `consume`
//! consuming and acks, `publish` publishing with confirms.

mod channel;
mod consume;
mod deliveries;
mod handshake;
#[cfg(test)]
mod hostile_tests;
mod publish;
mod reader;
mod shared;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};

use crate::broker::amqp::codec::Method;
use crate::broker::amqp::transport::Transport;
use crate::broker::amqp::types::{Delivery, FieldTable};
use crate::broker::amqp::url::AmqpUrl;
use crate::error::{Error, Result};
use deliveries::*;
use reader::*;

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
    /// How long a publish waits while the broker blocks the connection (`connection.blocked`:
    /// a memory or disk alarm) before it fails; default 30 s.
    pub blocked_timeout: Duration,
    /// `connection_name` client property shown by the management UI (default `rmq-backup`).
    pub connection_name: String,
    /// Largest frame proposed to the broker, bytes (default 131072; 0 = no limit).
    pub frame_max: u32,
    /// Deliveries buffered per consumer before the reader thread stops reading the socket
    /// (default 256). They are handed over in batches of up to 64 deliveries or 1 MiB of
    /// bodies, so a consumer holds at most about `consumer_buffer + 64` messages, and with
    /// large messages about `consumer_buffer / 64 + 1` MiB, in memory.
    pub consumer_buffer: usize,
    /// TLS settings for an `amqps` URL (`source.tls` / `target.tls`, loaded once per run);
    /// `None` with an `amqps` URL means the system CA store and no client certificate.
    pub tls: Option<std::sync::Arc<crate::broker::tls::TlsClient>>,
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
            blocked_timeout: Duration::from_secs(30),
            connection_name: "rmq-backup".to_string(),
            frame_max: 131_072,
            consumer_buffer: 256,
            tls: None,
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
    /// [`ConnectOptions::blocked_timeout`].
    blocked_timeout: Duration,
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
    /// The highest channel number this connection ever opened: a frame on a higher one is a
    /// protocol error of the broker (on a lower one that is closed, a late frame to discard).
    highest_channel: std::sync::atomic::AtomicU16,
    blocked: Mutex<Option<String>>,
    blocked_cond: Condvar,
}

/// A reply to a synchronous request on a channel.
enum Reply {
    Method(Method),
    Get(Box<GetOk>),
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

struct ChanShared {
    id: u16,
    /// Deliveries keep their properties as bytes (`Channel::keep_wire_properties`).
    wire_properties: AtomicBool,
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
    /// Publishes from the oldest one still unconfirmed to the newest, when the status was
    /// taken (0 when every publish is settled): every publish before them is settled, and
    /// the returns and nacks of those came with this status or an earlier one (the broker
    /// sends a `basic.return` before the confirm of the same message). A restore records the
    /// publishes before them as its confirmed prefix.
    pub unsettled: u64,
}

/// An open AMQP 0-9-1 connection (Send + Sync). Dropping it closes it best-effort.
pub struct Connection {
    shared: Arc<ConnShared>,
    reader: Option<JoinHandle<()>>,
    close_ok: Receiver<()>,
    masked_url: String,
    closed: bool,
}

impl Connection {
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
                wire_properties: AtomicBool::new(false),
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
            self.shared.highest_channel.fetch_max(id, Ordering::Relaxed);
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

/// An AMQP channel (Send, not Sync: use it from one thread at a time). Dropping it sends
/// `channel.close` without waiting.
pub struct Channel {
    conn: Arc<ConnShared>,
    chan: Arc<ChanShared>,
    rpc_rx: Receiver<Result<Reply>>,
    buf: RefCell<Vec<u8>>,
    closed: Cell<bool>,
}

/// The receiving end of a `basic.consume`. Dropping it stops the reader from waiting on it.
pub struct Consumer {
    tag: String,
    rx: Receiver<Vec<Result<Delivery>>>,
    /// The rest of the last batch received.
    local: Mutex<VecDeque<Result<Delivery>>>,
    state: Arc<ConsumerState>,
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Connection>();
    send::<Channel>();
    send::<Consumer>();
}
