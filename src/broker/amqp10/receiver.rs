//! [`Receiver`]: a link on which the broker sends (part 2, 2.6; RabbitMQ: a consumer of a
//! queue). Attached with `snd-settle-mode` unsettled and `rcv-settle-mode` first: the broker
//! keeps every delivery until the receiver settles it with a [`Receiver::disposition`]
//! (accepted: gone; released or modified: back in the queue). Link credit (2.6.7) is the read
//! window: the broker sends at most that many deliveries until more credit is given, as
//! `prefetch` does in AMQP 0-9-1.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver as ChanReceiver, RecvTimeoutError};

use super::performative::{Attach, DeliveryState, Disposition, Outcome, Performative};
use super::session::{Link, Session, SessionHandle};
use super::{lock, secs};
use crate::error::{Error, Result};

/// Deliveries handed to a receiver in one batch at most.
pub(crate) const BATCH_MAX: usize = 64;

/// One message as the broker transferred it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The delivery id (session-scoped serial number): what [`Receiver::disposition`] names.
    pub delivery_id: u32,
    /// The delivery tag the broker chose.
    pub delivery_tag: Vec<u8>,
    /// The message format (0: an AMQP 1.0 message).
    pub message_format: u32,
    /// The broker settled it already (not with `snd-settle-mode` unsettled).
    pub settled: bool,
    /// The message exactly as transferred: the concatenated payloads of its transfers
    /// (header, annotations, bare message, footer), byte for byte.
    pub bytes: Vec<u8>,
}

/// A receiving link (Send, not Sync). Dropping it detaches it without waiting; the broker
/// then returns what it was not settled.
pub struct Receiver {
    session: Arc<SessionHandle>,
    handle: u32,
    address: String,
    rx: ChanReceiver<Vec<Delivery>>,
    local: VecDeque<Delivery>,
    detached: bool,
}

impl Session {
    /// Attaches a receiver to `address` (e.g. [`super::queue_address`]) and gives it `credit`
    /// (0: none yet; see [`Receiver::add_credit`]).
    ///
    /// Errors: `Error::Amqp("cannot attach a receiver from <address>: amqp:not-found: ...")`
    /// when the broker refuses (a missing queue), a time-out, or the session's failure.
    pub fn receiver(&self, address: &str, credit: u32) -> Result<Receiver> {
        let h = &self.handle;
        let conn = &h.conn;
        let buffer = conn.receiver_buffer;
        let batches = (buffer / BATCH_MAX.min(buffer)).max(1);
        let (tx, rx) = bounded(batches);
        let name = super::session::link_name("receiver");
        let mut link = Link::new(name.clone(), address.to_string(), true);
        link.tx = Some(tx);
        let attach = Attach {
            name,
            role_receiver: true,
            snd_settle_mode: 0,
            rcv_settle_mode: 0,
            source: Some(Some(address.to_string())),
            target: Some(None),
            ..Attach::default()
        };
        let handle = h.shared.attach(conn, link, attach)?;
        let r = Receiver {
            session: h.clone(),
            handle,
            address: address.to_string(),
            rx,
            local: VecDeque::new(),
            detached: false,
        };
        if credit > 0 {
            r.set_credit(credit)?;
        }
        Ok(r)
    }
}

impl Receiver {
    /// The source address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The next delivery, in the order the broker sent them; `Ok(None)` after `timeout`
    /// without one.
    ///
    /// Errors: the link's end (detached by the broker: `Error::Amqp` with its condition and
    /// description), the session's or the connection's failure; deliveries that arrived
    /// before the end are handed out first.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Delivery>> {
        if let Some(d) = self.local.pop_front() {
            return Ok(Some(d));
        }
        match self.rx.recv_timeout(timeout) {
            Ok(batch) => {
                self.local.extend(batch);
                Ok(self.local.pop_front())
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(self.failure()),
        }
    }

    fn failure(&self) -> Error {
        let st = lock(&self.session.shared.state);
        match st.check_link(self.handle) {
            Err(e) => e,
            Ok(_) => self.session.conn.check().err().unwrap_or_else(|| {
                Error::Amqp(format!("the receiver from {} ended", self.address))
            }),
        }
    }

    /// The credit left: deliveries the broker may still send before it waits for more.
    pub fn credit(&self) -> u32 {
        let st = lock(&self.session.shared.state);
        st.links.get(&self.handle).map_or(0, |l| l.credit)
    }

    /// Sets the link credit to `credit` (a `flow`, 2.7.4): the broker may send that many more
    /// deliveries. 0 stops the link (deliveries already on the way still arrive).
    ///
    /// Errors: the link's, session's or connection's failure.
    pub fn set_credit(&self, credit: u32) -> Result<()> {
        self.flow(|_| credit, false)
    }

    /// Adds `n` to the link credit.
    ///
    /// Errors: the link's, session's or connection's failure.
    pub fn add_credit(&self, n: u32) -> Result<()> {
        self.flow(|c| c.saturating_add(n), false)
    }

    fn flow(&self, credit: impl FnOnce(u32) -> u32, drain: bool) -> Result<()> {
        let s = &self.session.shared;
        let conn = &self.session.conn;
        let mut st = lock(&s.state);
        st.check_link(self.handle)?;
        let flow = {
            let Some(l) = st.links.get_mut(&self.handle) else {
                return Err(Error::Amqp("the link is detached".into()));
            };
            l.credit = credit(l.credit);
            l.draining = drain;
            st.link_flow(self.handle, drain)
        };
        s.send_locked(conn, st, &Performative::Flow(flow))
    }

    /// Drains the link (a flow with `drain`, 2.6.7): the broker sends what it can within the
    /// credit left, then gives the rest up; waits for its answer (bounded by rpc_timeout).
    /// Afterwards the credit is 0 and the deliveries sent before the answer are in this
    /// receiver's queue.
    ///
    /// Errors: a time-out, or the link's, session's or connection's failure.
    pub fn drain(&self) -> Result<()> {
        self.flow(|c| c, true)?;
        let s = &self.session.shared;
        let conn = &self.session.conn;
        let deadline = Instant::now() + conn.rpc_timeout;
        let st = lock(&s.state);
        s.wait(
            conn,
            st,
            deadline,
            |st| Ok(!st.check_link(self.handle)?.draining),
            || {
                Error::Connection(format!(
                    "timed out after {} waiting for the broker to drain the receiver from {} on {}",
                    secs(conn.rpc_timeout),
                    self.address,
                    conn.addr
                ))
            },
        )
        .map(drop)
    }

    /// Settles deliveries `first..=last` (delivery ids, serial numbers) with `outcome` (a
    /// `disposition`, 2.7.6, settled): `Accepted` removes them from the queue; `Released`
    /// and `Modified` give them back; `Rejected` dead-letters or drops them. Nothing is
    /// waited for (settled dispositions have no answer). The ids must be this session's
    /// unsettled deliveries.
    ///
    /// Errors: the link's, session's or connection's failure.
    pub fn disposition(&self, first: u32, last: u32, outcome: Outcome) -> Result<()> {
        let s = &self.session.shared;
        let st = lock(&s.state);
        st.check_link(self.handle)?;
        let d = Disposition {
            role_receiver: true,
            first,
            last: (last != first).then_some(last),
            settled: true,
            state: Some(DeliveryState::Outcome(outcome)),
        };
        s.send_locked(&self.session.conn, st, &Performative::Disposition(d))
    }

    /// Detaches the link (closed) and waits for the broker's detach (bounded by
    /// rpc_timeout). Deliveries not settled go back to the queue.
    ///
    /// Errors: a time-out, or the session's or connection's failure.
    pub fn detach(mut self) -> Result<()> {
        self.detached = true;
        self.session.shared.detach(&self.session.conn, self.handle)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        let s = &self.session.shared;
        let mut st = lock(&s.state);
        let Some(l) = st.links.get_mut(&self.handle) else {
            return;
        };
        l.stopping.store(true, Ordering::SeqCst);
        l.detaching = true;
        if l.failed.is_some() || l.detach.is_some() || st.failed.is_some() {
            st.links.remove(&self.handle);
            return;
        }
        let detach = Performative::Detach {
            handle: self.handle,
            closed: true,
            error: None,
        };
        if let Err(e) = s.send_locked(&self.session.conn, st, &detach) {
            log::trace!("amqp10: detaching the receiver from {}: {e}", self.address);
        }
    }
}
