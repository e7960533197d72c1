//! The reader thread of a connection: reads every frame, answers heartbeats and the broker's
//! `close`/`end`/`detach`, keeps the session windows and link credit (part 2, 2.5.6, 2.6.7),
//! reassembles multi-frame transfers, hands complete deliveries to their receiver's bounded
//! queue in batches, and hands dispositions of sent deliveries to their sender.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{SendTimeoutError, Sender as ChanSender, TrySendError};

use super::connection::ConnShared;
use super::frame::{FrameReader, TYPE_AMQP};
use super::performative::{AmqpError, DeliveryState, Disposition, Flow, Performative, Transfer};
use super::receiver::{Delivery, BATCH_MAX};
use super::sender::SendOutcome;
use super::session::{Assembly, SessionShared, INCOMING_WINDOW};
use super::{lock, secs};
use crate::broker::amqp::transport::{ReadFail, Transport};
use crate::error::{Error, Result};

/// Largest message accepted from the broker, bytes (RabbitMQ's own hard limit is 512 MiB).
pub const MAX_MESSAGE_SIZE: usize = 512 * 1024 * 1024;
/// Message bytes after which a receiver's batch is handed over even if it holds fewer than
/// [`BATCH_MAX`] deliveries.
const BATCH_BYTES_MAX: usize = 1 << 20;
/// How often a reader blocked on a full receiver queue wakes to send heartbeats.
const PUSH_TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// Deliveries not handed to their receiver yet.
struct Pending {
    key: (u16, u32),
    tx: ChanSender<Vec<Delivery>>,
    stopping: Arc<AtomicBool>,
    batch: Vec<Delivery>,
    bytes: usize,
}

/// Why the read loop ended without an error.
enum Exit {
    /// The broker answered our close.
    Closed,
}

/// The reader thread's state.
pub(crate) struct Reader {
    shared: Arc<ConnShared>,
    close_tx: ChanSender<Option<AmqpError>>,
    /// Sessions by the broker's channel.
    remote: HashMap<u16, Arc<SessionShared>>,
    pending: Vec<Pending>,
    last_read: Instant,
}

impl Reader {
    pub(crate) fn new(shared: Arc<ConnShared>, close_tx: ChanSender<Option<AmqpError>>) -> Self {
        Reader {
            shared,
            close_tx,
            remote: HashMap::new(),
            pending: Vec::new(),
            last_read: Instant::now(),
        }
    }

    /// Runs until the connection ends; then fails every session and link with the reason.
    pub(crate) fn run(mut self, mut frames: FrameReader<Transport>) {
        let result = self.read_loop(&mut frames);
        for p in self.pending.drain(..) {
            let _ = p.tx.try_send(p.batch);
        }
        let shared = self.shared.clone();
        let err = match result {
            Ok(Exit::Closed) => Error::Connection(format!(
                "connection to {} was closed by the client",
                shared.addr
            )),
            Err(e) => {
                if shared.closing.load(Ordering::SeqCst) {
                    log::debug!("amqp10 {} reader ended while closing: {e}", shared.addr);
                } else {
                    log::debug!("amqp10 {} connection failed: {e}", shared.addr);
                }
                e
            }
        };
        shared.fail_all(err);
        shared.control.shutdown();
    }

    fn read_loop(&mut self, frames: &mut FrameReader<Transport>) -> Result<Exit> {
        loop {
            if !self.pending.is_empty() && !frames.has_complete_frame() {
                self.flush_all()?;
            }
            match frames.next_frame() {
                Ok(Some(f)) => {
                    self.last_read = Instant::now();
                    if let Some(exit) = self.handle(f.kind, f.channel, f.body)? {
                        return Ok(exit);
                    }
                }
                Ok(None) => {}
                Err(ReadFail::Eof) => return Err(self.shared.lost("the broker closed the socket")),
                Err(ReadFail::Io(e)) => return Err(self.shared.lost(e)),
                Err(ReadFail::Protocol(e)) => {
                    return Err(self.protocol(e.message()));
                }
            }
            self.tick()?;
        }
    }

    /// Heartbeat duties: a broker silent too long is lost; ours are sent when due.
    fn tick(&mut self) -> Result<()> {
        if let Some(limit) = self.shared.silence_limit {
            if self.last_read.elapsed() > limit {
                return Err(self.shared.lost(format_args!(
                    "no frame from the broker for {} (idle-time-out {})",
                    secs(self.last_read.elapsed()),
                    secs(limit / 3)
                )));
            }
        }
        self.shared.check()?;
        self.shared.heartbeat_if_due()
    }

    fn protocol(&self, detail: impl std::fmt::Display) -> Error {
        self.shared.lost(format_args!("protocol error: {detail}"))
    }

    fn session(&self, channel: u16, what: &str) -> Result<Arc<SessionShared>> {
        self.remote.get(&channel).cloned().ok_or_else(|| {
            self.protocol(format_args!(
                "{what} on channel {channel}, which has no session"
            ))
        })
    }

    fn handle(&mut self, kind: u8, channel: u16, body: &[u8]) -> Result<Option<Exit>> {
        if kind != TYPE_AMQP {
            return Err(self.protocol("a SASL frame after the handshake"));
        }
        if body.is_empty() {
            log::trace!("amqp10 {} received an empty frame", self.shared.addr);
            return Ok(None);
        }
        let (p, payload) = Performative::decode(body).map_err(|e| self.protocol(e.message()))?;
        log::trace!(
            "amqp10 {} received {} channel={channel} payload={}",
            self.shared.addr,
            p.name(),
            payload.len()
        );
        if !self.pending.is_empty() && !matches!(p, Performative::Transfer(_)) {
            self.flush_all()?;
        }
        match p {
            Performative::Open(_) => return Err(self.protocol("a second open")),
            Performative::Close(e) => return self.close(e).map(Some),
            Performative::Begin(b) => {
                let Some(ours) = b.remote_channel else {
                    return Err(self.protocol("a begin the client did not ask for"));
                };
                let s = lock(&self.shared.sessions)
                    .get(&ours)
                    .cloned()
                    .ok_or_else(|| {
                        self.protocol(format_args!(
                            "a begin for channel {ours}, which has no session"
                        ))
                    })?;
                let mut st = lock(&s.state);
                st.begun = true;
                st.next_incoming_id = b.next_outgoing_id;
                st.remote_incoming_window = b.incoming_window;
                st.handle_max = st.handle_max.min(b.handle_max);
                drop(st);
                self.remote.insert(channel, s.clone());
                s.cond.notify_all();
            }
            Performative::End(e) => self.end(channel, e)?,
            Performative::Attach(a) => {
                let s = self.session(channel, "attach")?;
                let mut st = lock(&s.state);
                let Some(h) = st
                    .links
                    .iter()
                    .find(|(_, l)| l.name == a.name && l.attach.is_none())
                    .map(|(h, _)| *h)
                else {
                    return Err(self.protocol(format_args!(
                        "an attach of link {:?}, which the client did not ask for",
                        a.name
                    )));
                };
                st.by_remote.insert(a.handle, h);
                if let Some(l) = st.links.get_mut(&h) {
                    l.remote_handle = Some(a.handle);
                    if l.receiver {
                        l.delivery_count = a.initial_delivery_count.unwrap_or(0);
                    }
                    l.attach = Some(a);
                }
                drop(st);
                s.cond.notify_all();
            }
            Performative::Detach {
                handle,
                closed: _,
                error,
            } => self.detach(channel, handle, error)?,
            Performative::Flow(f) => self.flow(channel, f)?,
            Performative::Transfer(t) => self.transfer(channel, t, payload)?,
            Performative::Disposition(d) => self.disposition(channel, d)?,
        }
        Ok(None)
    }

    fn close(&mut self, e: Option<AmqpError>) -> Result<Exit> {
        if self.shared.closing.load(Ordering::SeqCst) {
            let _ = self.close_tx.try_send(e);
            return Ok(Exit::Closed);
        }
        if let Err(err) = self.shared.send(0, &Performative::Close(None)) {
            log::debug!(
                "amqp10 {}: answering the broker's close: {err}",
                self.shared.addr
            );
        }
        Err(Error::Connection(format!(
            "connection to {} closed by the broker: {}",
            self.shared.addr,
            e.map_or("no error given".to_string(), |e| e.to_string())
        )))
    }

    fn end(&mut self, channel: u16, e: Option<AmqpError>) -> Result<()> {
        let s = self.session(channel, "end")?;
        self.remote.remove(&channel);
        lock(&self.shared.sessions).remove(&s.channel);
        let mut st = lock(&s.state);
        st.ended = true;
        let ending = st.ending;
        if !ending {
            s.send_locked(&self.shared, st, &Performative::End(None))?;
        } else {
            drop(st);
        }
        let err = match (e, ending) {
            (Some(e), _) => Error::Amqp(format!("session ended by the broker: {e}")),
            (None, false) => Error::Amqp("session ended by the broker".to_string()),
            (None, true) => Error::Amqp("the session was ended".to_string()),
        };
        s.fail(err);
        Ok(())
    }

    fn detach(&mut self, channel: u16, handle: u32, error: Option<AmqpError>) -> Result<()> {
        let s = self.session(channel, "detach")?;
        let mut st = lock(&s.state);
        let Some(h) = st.by_remote.remove(&handle) else {
            log::debug!(
                "amqp10 {}: detach of unknown handle {handle}",
                self.shared.addr
            );
            return Ok(());
        };
        let Some(l) = st.links.get_mut(&h) else {
            return Ok(());
        };
        if l.detaching {
            st.links.remove(&h);
            st.out_unsettled.retain(|_, lh| *lh != h);
            drop(st);
            s.cond.notify_all();
            return Ok(());
        }
        let why = match &error {
            Some(e) => format!("the {} was detached by the broker: {e}", l.describe()),
            None => format!("the {} was detached by the broker", l.describe()),
        };
        l.detach = Some(error);
        l.fail(Error::Amqp(why));
        let reply = Performative::Detach {
            handle: h,
            closed: true,
            error: None,
        };
        s.send_locked(&self.shared, st, &reply)?;
        s.cond.notify_all();
        Ok(())
    }

    fn flow(&mut self, channel: u16, f: Flow) -> Result<()> {
        let s = self.session(channel, "flow")?;
        let mut st = lock(&s.state);
        let next_in = f.next_incoming_id.unwrap_or(0);
        let window = next_in
            .wrapping_add(f.incoming_window)
            .wrapping_sub(st.next_outgoing_id);
        st.remote_incoming_window = if window > f.incoming_window {
            0
        } else {
            window
        };
        let mut answer = None;
        let link = f.handle.and_then(|rh| st.by_remote.get(&rh).copied());
        if let Some(h) = link {
            if let Some(l) = st.links.get_mut(&h) {
                if l.receiver {
                    if let Some(dc) = f.delivery_count {
                        let advanced = dc.wrapping_sub(l.delivery_count);
                        l.credit = l.credit.saturating_sub(advanced);
                        l.delivery_count = dc;
                    }
                    if l.draining && (f.link_credit == Some(0) || l.credit == 0) {
                        l.draining = false;
                        l.credit = 0;
                    }
                } else {
                    let dc = f.delivery_count.unwrap_or(0);
                    let lc = f.link_credit.unwrap_or(0);
                    let v = dc.wrapping_add(lc).wrapping_sub(l.delivery_count);
                    l.credit = if v > lc { 0 } else { v };
                    if f.drain && l.credit > 0 {
                        // Nothing waits to be sent now: give the credit up (2.6.7).
                        l.delivery_count = l.delivery_count.wrapping_add(l.credit);
                        l.credit = 0;
                        answer = Some(h);
                    }
                }
            }
        }
        if f.echo && answer.is_none() {
            answer = link;
        }
        s.cond.notify_all();
        match (answer, f.echo) {
            (Some(h), _) => {
                let flow = st.link_flow(h, false);
                s.send_locked(&self.shared, st, &Performative::Flow(flow))
            }
            (None, true) => {
                let flow = st.flow();
                s.send_locked(&self.shared, st, &Performative::Flow(flow))
            }
            _ => Ok(()),
        }
    }

    fn transfer(&mut self, channel: u16, t: Transfer, payload: &[u8]) -> Result<()> {
        let s = self.session(channel, "transfer")?;
        let mut st = lock(&s.state);
        st.next_incoming_id = st.next_incoming_id.wrapping_add(1);
        st.incoming_window = st.incoming_window.saturating_sub(1);
        let reopen = st.incoming_window <= INCOMING_WINDOW / 2;
        if reopen {
            st.incoming_window = INCOMING_WINDOW;
        }
        let h = st.by_remote.get(&t.handle).copied();
        let mut done = None;
        if let Some(l) = h.and_then(|h| st.links.get_mut(&h)) {
            if !l.receiver {
                return Err(self.protocol("a transfer on a link where the client sends"));
            }
            let mut a = match l.assembly.take() {
                Some(a) => {
                    if t.delivery_id.is_some_and(|id| id != a.delivery_id) {
                        return Err(self.protocol(format_args!(
                            "delivery {:?} began before delivery {} ended",
                            t.delivery_id, a.delivery_id
                        )));
                    }
                    a
                }
                None => {
                    let (Some(id), Some(tag)) = (t.delivery_id, t.delivery_tag.clone()) else {
                        return Err(self.protocol("a transfer without its delivery id or tag"));
                    };
                    l.delivery_count = l.delivery_count.wrapping_add(1);
                    l.credit = l.credit.saturating_sub(1);
                    Assembly {
                        delivery_id: id,
                        delivery_tag: tag,
                        message_format: t.message_format.unwrap_or(0),
                        settled: t.settled.unwrap_or(false),
                        bytes: Vec::with_capacity(payload.len()),
                    }
                }
            };
            if a.bytes.len() + payload.len() > MAX_MESSAGE_SIZE {
                return Err(self.protocol(format_args!(
                    "a message larger than {MAX_MESSAGE_SIZE} bytes"
                )));
            }
            if !t.aborted {
                a.bytes.extend_from_slice(payload);
                a.settled |= t.settled.unwrap_or(false);
                if t.more {
                    l.assembly = Some(a);
                } else if let Some(tx) = &l.tx {
                    let d = Delivery {
                        delivery_id: a.delivery_id,
                        delivery_tag: a.delivery_tag,
                        message_format: a.message_format,
                        settled: a.settled,
                        bytes: a.bytes,
                    };
                    done = h.map(|h| ((s.channel, h), tx.clone(), l.stopping.clone(), d));
                }
            }
        } else {
            log::trace!("amqp10 {}: transfer on a detached link", self.shared.addr);
        }
        if reopen {
            let flow = st.flow();
            s.send_locked(&self.shared, st, &Performative::Flow(flow))?;
        } else {
            drop(st);
        }
        if let Some((key, tx, stopping, d)) = done {
            let i = match self.pending.iter().position(|p| p.key == key) {
                Some(i) => i,
                None => {
                    self.pending.push(Pending {
                        key,
                        tx,
                        stopping,
                        batch: Vec::new(),
                        bytes: 0,
                    });
                    self.pending.len() - 1
                }
            };
            let p = &mut self.pending[i];
            p.bytes += d.bytes.len();
            p.batch.push(d);
            if p.batch.len() >= BATCH_MAX || p.bytes >= BATCH_BYTES_MAX {
                let p = self.pending.swap_remove(i);
                self.push(p)?;
            }
        }
        Ok(())
    }

    fn disposition(&mut self, channel: u16, d: Disposition) -> Result<()> {
        let s = self.session(channel, "disposition")?;
        let mut st = lock(&s.state);
        let last = d.last.unwrap_or(d.first);
        let outcome = match &d.state {
            Some(DeliveryState::Outcome(o)) => Some(o.clone()),
            _ => None,
        };
        if !d.role_receiver {
            log::warn!(
                "amqp10 {}: the broker changed deliveries {}..={last} it sent (settled: {}, state: {:?})",
                self.shared.addr,
                d.first,
                d.settled,
                d.state
            );
            return Ok(());
        }
        let Some(outcome) =
            outcome.or_else(|| d.settled.then_some(super::performative::Outcome::Released))
        else {
            return Ok(());
        };
        let span = last.wrapping_sub(d.first);
        let mut ids: Vec<u32> = if (span as usize) < st.out_unsettled.len() {
            (0..=span)
                .map(|i| d.first.wrapping_add(i))
                .filter(|id| st.out_unsettled.contains_key(id))
                .collect()
        } else {
            st.out_unsettled
                .keys()
                .copied()
                .filter(|id| id.wrapping_sub(d.first) <= span)
                .collect()
        };
        ids.sort_by_key(|id| id.wrapping_sub(d.first));
        for id in ids {
            if let Some(h) = st.out_unsettled.remove(&id) {
                if let Some(l) = st.links.get_mut(&h) {
                    l.unsettled = l.unsettled.saturating_sub(1);
                    l.outcomes.push(SendOutcome {
                        delivery_id: id,
                        outcome: outcome.clone(),
                    });
                }
            }
        }
        s.cond.notify_all();
        if !d.settled {
            let settle = Disposition {
                role_receiver: false,
                first: d.first,
                last: d.last,
                settled: true,
                state: d.state,
            };
            return s.send_locked(&self.shared, st, &Performative::Disposition(settle));
        }
        Ok(())
    }

    fn flush_all(&mut self) -> Result<()> {
        while let Some(p) = self.pending.pop() {
            self.push(p)?;
        }
        Ok(())
    }

    /// Puts a batch in its receiver's bounded queue. While the queue is full the reader waits
    /// here (TCP back-pressure), sending heartbeats, until the receiver takes one, stops, or
    /// the connection ends.
    fn push(&mut self, p: Pending) -> Result<()> {
        let mut item = match p.tx.try_send(p.batch) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => return Ok(()),
            Err(TrySendError::Full(back)) => back,
        };
        loop {
            if p.stopping.load(Ordering::SeqCst) || self.shared.closing.load(Ordering::SeqCst) {
                break;
            }
            match p.tx.send_timeout(item, PUSH_TICK) {
                Ok(()) | Err(SendTimeoutError::Disconnected(_)) => break,
                Err(SendTimeoutError::Timeout(back)) => {
                    item = back;
                    self.shared.check()?;
                    self.shared.heartbeat_if_due()?;
                }
            }
        }
        // We were not reading: the broker's silence meanwhile says nothing.
        self.last_read = Instant::now();
        Ok(())
    }
}
