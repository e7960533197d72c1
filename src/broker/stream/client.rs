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

pub use super::handshake::StreamOptions;
use super::handshake::{handshake, io_lost, stream_refused};
use super::protocol::open_frame;
use super::protocol::{key, FrameBuf, OffsetSpec, RESPONSE_OK};
use super::reader::{reader_loop, Frame, Shared};
use crate::broker::amqp::transport::Transport;
use crate::broker::version::BrokerVersion;
use crate::error::{Error, Result};
use crossbeam_channel::{bounded, Receiver};
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One stream-protocol connection. Dropping it closes the socket.
pub struct StreamConnection {
    writer: Mutex<Transport>,
    shared: Arc<Shared>,
    next_correlation: AtomicU32,
    rpc_timeout: Duration,
    endpoint: String,
    frame_max: u32,
    server_version: String,
    reader: Option<std::thread::JoinHandle<()>>,
    socket: Transport,
}

/// A subscription's chunks, in order: the raw chunk bytes of each `Deliver` frame
/// ([`super::chunk::parse_chunk`] reads them).
pub struct Subscription {
    pub id: u8,
    rx: Receiver<Result<Vec<u8>>>,
    /// The connection's state: why it ended, once it has.
    shared: Arc<Shared>,
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
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                let why = self.shared.closed.lock().ok().and_then(|c| c.clone());
                Err(match why {
                    // The reader's own words: a protocol error keeps its category.
                    Some(w) if w.starts_with("Stream protocol error: ") => {
                        Error::Stream(w.trim_start_matches("Stream protocol error: ").into())
                    }
                    Some(w) => Error::Connection(format!(
                        "stream connection closed while a subscription was reading: {w}"
                    )),
                    None => Error::Connection(
                        "stream connection closed while a subscription was reading".into(),
                    ),
                })
            }
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

impl StreamConnection {
    /// Connects and logs in: TCP (bounded by `connect_timeout`), then the handshake (each step
    /// bounded by `rpc_timeout`).
    ///
    /// Errors: `Connection error: ...` when the port cannot be reached or the connection drops;
    /// `Authentication error: ...` for refused credentials (the password is never printed);
    /// `Stream protocol error: ...` for a refused vhost or a broker without PLAIN.
    pub fn open(o: &StreamOptions) -> Result<StreamConnection> {
        let (io, agreed) = handshake(o)?;
        let endpoint = agreed.endpoint;
        let heartbeat = agreed.heartbeat;

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
            frame_max: agreed.frame_max,
            server_version: agreed.server_version,
            reader: Some(reader),
            socket,
        })
    }

    /// `host:port` of the connection.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The broker's version from the handshake's peer properties (e.g. `4.3.6`; empty when
    /// it sent none).
    pub fn server_version(&self) -> &str {
        &self.server_version
    }

    /// The largest frame the broker accepts, bytes (0 = no limit): what it proposed in Tune.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
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
        Ok(Subscription {
            id,
            rx,
            shared: self.shared.clone(),
        })
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

    /// Publishes one sub-entry batch with publisher `id` (rabbit_stream_utils
    /// `write_messages`): `count` messages of `uncompressed` bytes in all, as `batch` holds
    /// them, compressed with `codec` (0 none, 4 zstd); the broker stores it as it is. One
    /// confirm, for `publishing_id`, arrives on the [`Publisher`].
    pub fn publish_sub_batch(
        &self,
        id: u8,
        publishing_id: u64,
        codec: u8,
        count: u16,
        uncompressed: u32,
        batch: &[u8],
    ) -> Result<()> {
        let size = u32::try_from(batch.len())
            .map_err(|_| Error::Stream(format!("a sub-entry batch of {} bytes", batch.len())))?;
        let frame = FrameBuf::new(key::PUBLISH)
            .u8(id)
            .u32(1)
            .u64(publishing_id)
            .u8(0x80 | ((codec & 0x7) << 4))
            .u16(count)
            .u32(uncompressed)
            .u32(size)
            .raw(batch)
            .finish();
        self.write(&frame)
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
        parse_metadata(&f)
    }

    /// Stores `offset` under `reference` for `stream`, as a consumer tracking its place does
    /// (PROTOCOL.adoc "StoreOffset": no response; a [`Self::query_offset`] after it reads it).
    /// `reference` is at most 256 bytes.
    pub fn store_offset(&self, reference: &str, stream: &str, offset: u64) -> Result<()> {
        let frame = FrameBuf::new(key::STORE_OFFSET)
            .string(reference)?
            .string(stream)?
            .u64(offset)
            .finish();
        self.write(&frame)
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

    /// The id of `stream`'s last committed chunk now (`StreamStats`, PROTOCOL.adoc:
    /// `committed_chunk_id`), `None` when the stream holds no chunk (the broker says -1), or
    /// `Err` when the broker does not say. Only RabbitMQ 3.11 and later know the command
    /// ([`StreamConnection::has_stream_stats`]): not to be sent to an older one.
    ///
    /// Errors: `Stream protocol error: stream stats of stream X: ...` (the broker's code, e.g.
    /// the stream does not exist), a stats map without `committed_chunk_id`, a lost connection.
    pub fn committed_chunk_id(&self, stream: &str) -> Result<Option<u64>> {
        let (code, f) = self.request("stream stats", |corr| {
            Ok(FrameBuf::new(key::STREAM_STATS)
                .u32(corr)
                .string(stream)?
                .finish())
        })?;
        if code != RESPONSE_OK {
            return Err(stream_refused(
                &format!("stream stats of stream {stream}"),
                code,
                &self.endpoint,
            ));
        }
        match parse_stream_stats(&f)?
            .into_iter()
            .find(|(k, _)| k == "committed_chunk_id")
        {
            Some((_, id)) => Ok(u64::try_from(id).ok()),
            None => Err(Error::Stream(format!(
                "stream stats of stream {stream} from {}: no committed_chunk_id",
                self.endpoint
            ))),
        }
    }

    /// Whether the broker knows `StreamStats` (RabbitMQ 3.11 and later, by the version of the
    /// handshake's peer properties; false when it sent none).
    pub fn has_stream_stats(&self) -> bool {
        BrokerVersion::parse(&self.server_version).is_some_and(BrokerVersion::has_stream_stats)
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

/// The statistics of a `StreamStats` response frame (size prefix removed), in wire order:
/// (name, value), e.g. `("committed_chunk_id", -1)` for a stream without a chunk.
///
/// Errors: `Stream protocol error: truncated frame ...` and the like for a malformed frame.
#[doc(hidden)]
pub fn parse_stream_stats(f: &[u8]) -> Result<Vec<(String, i64)>> {
    let (_, mut c) = open_frame(f)?;
    let _corr = c.u32()?;
    let _code = c.u16()?;
    let n = c.count(10)?;
    (0..n).map(|_| Ok((c.string()?, c.u64()? as i64))).collect()
}

/// Reads a metadata response (the bytes after the frame size): each stream's name and whether
/// its response code is OK.
///
/// Errors: `Stream protocol error: truncated frame ...` and the like for a malformed frame.
#[doc(hidden)]
pub fn parse_metadata(f: &[u8]) -> Result<Vec<(String, bool)>> {
    // Metadata has no response code: brokers, then stream metadata.
    let (_, mut c) = open_frame(f)?;
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

impl Drop for StreamConnection {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod stats_tests {
    use super::*;

    fn frame(stats: &[(&str, i64)]) -> Vec<u8> {
        let mut b = FrameBuf::new(key::STREAM_STATS | key::RESPONSE)
            .u32(7)
            .u16(RESPONSE_OK)
            .u32(stats.len() as u32);
        for (k, v) in stats {
            b = b.string(k).unwrap().i64(*v);
        }
        b.finish()[4..].to_vec()
    }

    #[test]
    fn stream_stats_are_read_in_wire_order_and_malformed_ones_refused() {
        let f = frame(&[("first_chunk_id", 0), ("committed_chunk_id", -1)]);
        assert_eq!(
            parse_stream_stats(&f).unwrap(),
            [
                ("first_chunk_id".into(), 0),
                ("committed_chunk_id".into(), -1)
            ]
        );
        assert_eq!(parse_stream_stats(&frame(&[])).unwrap(), []);
        for cut in 0..f.len() {
            let e = parse_stream_stats(&f[..cut]).unwrap_err().to_string();
            assert!(e.starts_with("Stream protocol error: "), "{cut}: {e}");
        }
        // A count the frame cannot hold is refused before anything is allocated.
        let mut huge = frame(&[]);
        let n = huge.len();
        huge[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_stream_stats(&huge).is_err());
    }
}
