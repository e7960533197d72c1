//! [`Connection`]: its options, the state it shares with its reader thread and its sessions
//! (`ConnShared`: the writer, the failure, heartbeats), and the `close` exchange (part 2,
//! 2.4.3). Opening it is `handshake`'s.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver as ChanReceiver, RecvTimeoutError};

use super::codec::Value;
use super::frame::*;
use super::performative::{AmqpError, Performative};
use super::session::SessionShared;
use super::{lock, secs};
use crate::broker::amqp::transport::Transport;
use crate::broker::amqp::url::AmqpUrl;
use crate::broker::tls::TlsClient;
use crate::error::{Error, Result};

/// Channel-max proposed to the broker.
pub(crate) const CHANNEL_MAX: u16 = 255;

/// How to open a [`Connection`].
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Broker address, credentials and vhost (`amqp://` or `amqps://`).
    pub url: AmqpUrl,
    /// Bound of the TCP connect (default 10 s, or the URL's `connection_timeout`).
    pub connect_timeout: Duration,
    /// Bound of every exchange with the broker (the handshake after the TCP connect, begin,
    /// attach, detach, drain, end, close) and of each socket write; default 30 s.
    pub rpc_timeout: Duration,
    /// How long a send waits for link credit or session window from the broker (which
    /// withholds them during a resource alarm) before it fails; default 30 s.
    pub blocked_timeout: Duration,
    /// The idle-time-out we announce (part 2, 2.4.5), default 30 s (or the URL's
    /// `heartbeat`; zero: none): the broker sends an empty frame when it has been silent that
    /// long, and a broker silent for three times as long is a lost connection (RabbitMQ sends
    /// its empty frame once a whole interval passed without a write, checked once per
    /// interval: up to two intervals of silence are normal).
    pub idle_time_out: Duration,
    /// The `connection_name` connection property the management UI shows (default
    /// `rmq-backup`).
    pub connection_name: String,
    /// Largest frame we accept, bytes (default 131072, at least 512).
    pub max_frame_size: u32,
    /// Deliveries buffered per receiver before the reader thread stops reading the socket
    /// (default 256; handed over in batches of up to 64 deliveries or 1 MiB).
    pub receiver_buffer: usize,
    /// TLS settings for an `amqps` URL; `None` with `amqps` means the system CA store.
    pub tls: Option<Arc<TlsClient>>,
}

impl ConnectOptions {
    /// Defaults for `url` (see the field docs).
    pub fn new(url: AmqpUrl) -> Self {
        let idle = Duration::from_secs(url.heartbeat.unwrap_or(30) as u64);
        let connect_timeout = Duration::from_millis(url.connection_timeout_ms.unwrap_or(10_000));
        ConnectOptions {
            url,
            connect_timeout,
            rpc_timeout: Duration::from_secs(30),
            blocked_timeout: Duration::from_secs(30),
            idle_time_out: idle,
            connection_name: "rmq-backup".to_string(),
            max_frame_size: 131_072,
            receiver_buffer: 256,
            tls: None,
        }
    }
}

/// The state of one connection, shared by the handle, its sessions and links, and the
/// reader thread.
pub(crate) struct ConnShared {
    /// `host:port`, for messages.
    pub(crate) addr: String,
    pub(crate) rpc_timeout: Duration,
    pub(crate) blocked_timeout: Duration,
    /// Largest frame we may send, bytes (the broker's max-frame-size, capped by ours).
    pub(crate) peer_max_frame: usize,
    /// Send an empty frame after this long without writing (half the broker's idle-time-out).
    pub(crate) heartbeat_every: Option<Duration>,
    /// A broker silent this long is lost (three times our idle-time-out).
    pub(crate) silence_limit: Option<Duration>,
    pub(crate) channel_max: u16,
    pub(crate) receiver_buffer: usize,
    pub(crate) started: Instant,
    pub(crate) writer: Mutex<Transport>,
    /// A handle used only to shut the socket down (never locked).
    pub(crate) control: Transport,
    pub(crate) last_write_ms: AtomicU64,
    pub(crate) dead: AtomicBool,
    pub(crate) closing: AtomicBool,
    pub(crate) error: Mutex<Option<Error>>,
    /// Sessions by our channel number.
    pub(crate) sessions: Mutex<HashMap<u16, Arc<SessionShared>>>,
    /// The channel a new session tries first: channels are taken in turn, not the lowest
    /// free one: RabbitMQ 4.0.5 was seen to leave unanswered a begin on the channel of a
    /// session it had just ended (refusing a link).
    pub(crate) next_channel: std::sync::atomic::AtomicU16,
}

impl ConnShared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A lost connection, with what was lost.
    pub(crate) fn lost(&self, detail: impl std::fmt::Display) -> Error {
        Error::Connection(format!("connection to {} lost: {detail}", self.addr))
    }

    /// Records the connection's failure (the first one wins) and marks it dead.
    pub(crate) fn fail(&self, err: Error) {
        let mut e = lock(&self.error);
        if e.is_none() {
            *e = Some(err);
        }
        self.dead.store(true, Ordering::SeqCst);
    }

    /// Why the connection is unusable.
    pub(crate) fn current_error(&self) -> Error {
        lock(&self.error)
            .clone()
            .unwrap_or_else(|| self.lost("connection reset by peer"))
    }

    /// `Ok` while the connection is usable, its failure otherwise.
    pub(crate) fn check(&self) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(self.current_error())
        } else {
            Ok(())
        }
    }

    /// Writes whole frames in one call. The writer lock is taken before `held` (the lock under
    /// which the frames were made) is released, so frames reach the socket in the order their
    /// counters were taken. A failed write kills the connection.
    pub(crate) fn write_after<T>(
        &self,
        held: Option<MutexGuard<'_, T>>,
        bytes: &[u8],
    ) -> Result<()> {
        self.check()?;
        let mut w = lock(&self.writer);
        drop(held);
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

    /// Writes one performative on `channel`.
    pub(crate) fn send(&self, channel: u16, p: &Performative) -> Result<()> {
        let mut buf = Vec::with_capacity(128);
        put_frame(&mut buf, TYPE_AMQP, channel, |b| p.encode(b));
        log::trace!("amqp10 {} sent {} channel={channel}", self.addr, p.name());
        self.write_after::<()>(None, &buf)
    }

    /// Sends an empty frame when nothing was written for the heartbeat interval. Skipped when
    /// another thread is writing (that write counts).
    pub(crate) fn heartbeat_if_due(&self) -> Result<()> {
        let Some(every) = self.heartbeat_every else {
            return Ok(());
        };
        let idle = self
            .now_ms()
            .saturating_sub(self.last_write_ms.load(Ordering::Relaxed));
        if idle < every.as_millis() as u64 {
            return Ok(());
        }
        let Ok(mut w) = self.writer.try_lock() else {
            return Ok(());
        };
        let mut frame = Vec::with_capacity(8);
        put_empty_frame(&mut frame);
        match w.write_all(&frame) {
            Ok(()) => {
                self.last_write_ms.store(self.now_ms(), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(self.lost(format_args!("heartbeat write failed: {e}"))),
        }
    }

    /// Fails the connection and every session and link with `err` (called once, by the
    /// reader thread as it ends).
    pub(crate) fn fail_all(&self, err: Error) {
        self.fail(err);
        let err = self.current_error();
        let sessions: Vec<Arc<SessionShared>> =
            lock(&self.sessions).drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.fail(err.clone());
        }
    }
}

/// An open AMQP 1.0 connection (Send + Sync). Dropping it closes it best-effort.
pub struct Connection {
    pub(crate) shared: Arc<ConnShared>,
    pub(crate) reader: Option<JoinHandle<()>>,
    pub(crate) close_rx: ChanReceiver<Option<AmqpError>>,
    pub(crate) masked_url: String,
    pub(crate) closed: bool,
    pub(crate) server_properties: Vec<(Value, Value)>,
    pub(crate) container_id: String,
}

impl Connection {
    /// The broker's connection properties from its `open` (RabbitMQ: `product`, `version`,
    /// `platform`, `cluster_name`...), symbol keys as sent.
    pub fn server_properties(&self) -> &[(Value, Value)] {
        &self.server_properties
    }

    /// The string value of the server property `key` (e.g. `version`: the broker's version).
    pub fn server_property(&self, key: &str) -> Option<&str> {
        self.server_properties
            .iter()
            .find_map(|(k, v)| match (k, v) {
                (Value::Symbol(k) | Value::String(k), Value::String(v) | Value::Symbol(v))
                    if k == key =>
                {
                    Some(v.as_str())
                }
                _ => None,
            })
    }

    /// The broker's container id (RabbitMQ: its cluster name).
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The largest frame we send, bytes (the broker's max-frame-size).
    pub fn max_frame_size(&self) -> usize {
        self.shared.peer_max_frame
    }

    /// True until the connection failed or was closed.
    pub fn is_open(&self) -> bool {
        !self.shared.dead.load(Ordering::SeqCst) && !self.closed
    }

    /// Closes the connection: `close`, then waits for the broker's `close` (bounded by
    /// rpc_timeout). Errors: the connection's failure if it had failed, or a time-out.
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
            match shared.send(0, &Performative::Close(None)) {
                Err(e) => Err(e),
                Ok(()) => match self.close_rx.recv_timeout(timeout) {
                    Ok(None) => Ok(()),
                    Ok(Some(e)) => Err(Error::Connection(format!(
                        "connection to {} closed by the broker: {e}",
                        shared.addr
                    ))),
                    Err(RecvTimeoutError::Timeout) => Err(Error::Connection(format!(
                        "timed out after {} waiting for the broker's close on {}",
                        secs(timeout),
                        shared.addr
                    ))),
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
        log::debug!("AMQP 1.0 connection to {} closed", self.masked_url);
        result
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let t = self.shared.rpc_timeout.min(Duration::from_secs(5));
        if let Err(e) = self.close_inner(t) {
            log::debug!("closing AMQP 1.0 connection to {}: {e}", self.masked_url);
        }
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Connection>();
    send_sync::<super::Session>();
    send_sync::<super::Sender>();
    send::<super::Receiver>();
}
