//! The reader thread of a connection: reads every frame, answers heartbeats, and
//! dispatches connection and channel methods (replies, closes, flow, confirms, returns).

use super::*;
use crate::broker::amqp::codec::{
    decode_content_header, Method, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
};
use crate::broker::amqp::transport::{FrameReader, ReadFail};
use crate::broker::amqp::types::{Delivery, WireProperties};
use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Deliveries handed over from one read below which the reader waits [`COALESCE_WAIT`]
/// before reading again, when their bodies are also under [`COALESCE_BELOW_BYTES`]. Measured
/// on 2 cores, 100,000 x 1 KiB from a classic queue: the broker's frames arrived 1-2
/// deliveries per read, 121,000 context switches per backup (each read a sleep and a wake of
/// this thread and of the consumer's).
const COALESCE_BELOW: usize = 16;
/// Body bytes from one read at or above which the reader reads again at once: large bodies
/// fill the read buffer (128 KiB) with one or two deliveries, and waiting after each read
/// capped 64 KiB deliveries at ~4,500 a second (against 15,000-17,000 without).
const COALESCE_BELOW_BYTES: usize = 16 * 1024;
/// How long the reader lets deliveries gather after a small batch (at most this much added to
/// the wait for a delivery; the socket's receive buffer holds what arrives meanwhile).
const COALESCE_WAIT: std::time::Duration = std::time::Duration::from_micros(500);

pub(super) fn protocol_error(shared: &ConnShared, detail: impl std::fmt::Display) -> Error {
    shared.lost(format_args!("protocol error: {detail}"))
}

pub(super) struct ReaderState {
    pub(super) shared: Arc<ConnShared>,
    pub(super) assembling: HashMap<u16, Assembly>,
    pub(super) last_read: Instant,
    pub(super) close_ok: Sender<()>,
    pub(super) buf: Vec<u8>,
    /// Deliveries not handed to their consumer yet, one batch per consumer. Flushed before
    /// the reader waits on the socket, before any other method is handled (so a consumer
    /// sees its deliveries before the error that ends it), and when a batch is full.
    /// Per consumer: the batch being built and its body bytes.
    pub(super) pending: Vec<(ConsumerSlot, Vec<Result<Delivery>>, usize)>,
}

pub(super) enum Exit {
    /// connection.close-ok received.
    Closed,
}

impl ReaderState {
    pub(super) fn run(mut self, mut frames: FrameReader) {
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

    pub(super) fn read_loop(&mut self, frames: &mut FrameReader) -> Result<Exit> {
        loop {
            if !self.pending.is_empty() && !frames.has_complete_frame() {
                let (handed, bytes) = self
                    .pending
                    .iter()
                    .fold((0, 0), |(n, b), (_, batch, bytes)| {
                        (n + batch.len(), b + bytes)
                    });
                self.flush_all()?;
                if handed < COALESCE_BELOW && bytes < COALESCE_BELOW_BYTES {
                    // Deliveries come in dribbles: let more arrive before the next read.
                    std::thread::sleep(COALESCE_WAIT);
                }
            }
            // A frame already in the buffer came with an earlier socket read, which set
            // `last_read` and ran the heartbeat duties: the clock is read once per socket read,
            // not per frame (three clock reads per frame were 2.5% of a 1 KiB backup's CPU).
            let buffered = frames.has_complete_frame();
            match frames.next_frame() {
                Ok(Some(f)) => {
                    if !buffered {
                        self.last_read = Instant::now();
                    }
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
            if !buffered {
                self.tick()?;
            }
        }
    }

    /// Heartbeat duties: declare the connection lost after two silent intervals, send ours.
    pub(super) fn tick(&mut self) -> Result<()> {
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

    pub(super) fn protocol(&self, detail: impl std::fmt::Display) -> Error {
        protocol_error(&self.shared, detail)
    }

    pub(super) fn send(&mut self, channel: u16, m: &Method) {
        let mut buf = std::mem::take(&mut self.buf);
        if let Err(e) = self.shared.send_method(channel, m, &mut buf) {
            log::debug!("amqp {}: sending {}: {e}", self.shared.addr, m.name());
        }
        self.buf = buf;
    }

    pub(super) fn handle(
        &mut self,
        kind: u8,
        channel: u16,
        payload: &[u8],
    ) -> Result<Option<Exit>> {
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
                let (body_size, properties) = if a.wire {
                    let (size, wire) = WireProperties::of_content_header(payload)
                        .map_err(|e| protocol_error(shared, e.message()))?;
                    (size, wire.map(Properties::Wire))
                } else {
                    let h = decode_content_header(payload)
                        .map_err(|e| protocol_error(shared, e.message()))?;
                    (h.body_size, h.properties.map(Properties::Decoded))
                };
                if body_size > MAX_BODY_SIZE {
                    return Err(protocol_error(
                        shared,
                        format_args!(
                            "message body of {} bytes exceeds the maximum of {MAX_BODY_SIZE}",
                            body_size
                        ),
                    ));
                }
                a.body_size = body_size;
                if !matches!(a.target, Target::Discard) {
                    a.body = Vec::with_capacity(body_size.min(BODY_PREALLOC_MAX) as usize);
                }
                a.properties = Some(properties);
                if body_size == 0 {
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

    pub(super) fn connection_method(&mut self, m: Method) -> Result<Option<Exit>> {
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

    pub(super) fn channel_method(&mut self, channel: u16, m: Method) -> Result<()> {
        let chan = self.shared.channel(channel);
        let wire = chan
            .as_ref()
            .is_some_and(|c| c.wire_properties.load(Ordering::Relaxed));
        let begin = |target| Assembly {
            target,
            wire,
            properties: None,
            body_size: 0,
            received: 0,
            body: Vec::new(),
        };
        let Some(chan) = chan else {
            if channel
                > self
                    .shared
                    .highest_channel
                    .load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(protocol_error(
                    &self.shared,
                    format_args!(
                        "the broker sent {} on channel {channel}, which was never opened",
                        m.name()
                    ),
                ));
            }
            // A channel we closed: late content is consumed and dropped, a close answered.
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
                chan.fail(Error::Amqp(crate::broker::permissions::explain_amqp(
                    reply_text,
                )));
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
}
