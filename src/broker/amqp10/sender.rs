//! [`Sender`]: a link on which we send messages (part 2, 2.6; RabbitMQ: a publisher to an
//! exchange or a queue). Attached with `snd-settle-mode` unsettled and `rcv-settle-mode`
//! first: the broker settles each delivery with its outcome (`accepted` once the message is
//! safely in every queue it was routed to, `rejected` with an error, `released` when no queue
//! took it), delivered back asynchronously so that a caller keeps a window of unsettled
//! sends, as with publisher confirms in AMQP 0-9-1. A message is given as its encoded bytes
//! and split into transfers (2.7.5) by the broker's max-frame-size; each waits for link
//! credit (2.6.7) and session window (2.5.6).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{put_frame, FRAME_HEADER_SIZE, TYPE_AMQP};
use super::performative::{Attach, Outcome, Performative, Transfer};
use super::session::{Link, Session, SessionHandle, SessionState};
use super::{lock, secs};
use crate::error::{Error, Result};

/// The broker's outcome of one sent delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct SendOutcome {
    /// The delivery id [`Sender::send`] returned.
    pub delivery_id: u32,
    /// `Accepted`; `Rejected` with the broker's error; `Released` (e.g. no queue took it);
    /// `Modified`.
    pub outcome: Outcome,
}

/// A sending link (Send + Sync; one message is sent at a time per session). Dropping it
/// detaches it without waiting.
pub struct Sender {
    session: Arc<SessionHandle>,
    handle: u32,
    address: String,
    detached: bool,
}

impl Session {
    /// Attaches a sender to `address` (e.g. [`super::exchange_address`] or
    /// [`super::queue_address`]); the broker gives credit after it attaches.
    ///
    /// Errors: `Error::Amqp("cannot attach a sender to <address>: amqp:not-found: ...")` when
    /// the broker refuses (a missing exchange or queue), a time-out, or the session's
    /// failure.
    pub fn sender(&self, address: &str) -> Result<Sender> {
        let h = &self.handle;
        let name = super::session::link_name("sender");
        let link = Link::new(name.clone(), address.to_string(), false);
        let attach = Attach {
            name,
            role_receiver: false,
            snd_settle_mode: 0,
            rcv_settle_mode: 0,
            source: Some(None),
            target: Some(Some(address.to_string())),
            initial_delivery_count: Some(0),
            ..Attach::default()
        };
        let handle = h.shared.attach(&h.conn, link, attach)?;
        Ok(Sender {
            session: h.clone(),
            handle,
            address: address.to_string(),
            detached: false,
        })
    }
}

impl Sender {
    /// The target address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The link credit the broker gives now.
    pub fn credit(&self) -> u32 {
        let st = lock(&self.session.shared.state);
        st.links.get(&self.handle).map_or(0, |l| l.credit)
    }

    /// Deliveries sent and not settled by the broker yet.
    pub fn unsettled(&self) -> usize {
        let st = lock(&self.session.shared.state);
        st.links.get(&self.handle).map_or(0, |l| l.unsettled)
    }

    fn waiting(&self, what: &str) -> Error {
        let conn = &self.session.conn;
        Error::Connection(format!(
            "the broker gave no {what} for {} to the sender to {} on {} (a resource alarm?)",
            secs(conn.blocked_timeout),
            self.address,
            conn.addr
        ))
    }

    /// Sends one message, `message` being its encoded sections (message format 0), unsettled;
    /// waits for link credit and session window, each bounded by `blocked_timeout`. Returns
    /// its delivery id; its outcome comes later ([`Sender::take_outcomes`],
    /// [`Sender::wait_outcomes`], [`Sender::wait_settled`]).
    ///
    /// Errors: a time-out waiting for credit (`Error::Connection`), or the link's, session's
    /// or connection's failure. A message cut off between its transfers fails the link.
    pub fn send(&self, message: &[u8]) -> Result<u32> {
        let s = &self.session.shared;
        let conn = &self.session.conn;
        let _one = lock(&s.send_lock);
        let st = lock(&s.state);
        let deadline = Instant::now() + conn.blocked_timeout;
        let mut st = s.wait(
            conn,
            st,
            deadline,
            |st| Ok(st.check_link(self.handle)?.credit > 0 && st.remote_incoming_window > 0),
            || self.waiting("link credit or session window"),
        )?;
        let id = st.next_delivery_id;
        st.next_delivery_id = id.wrapping_add(1);
        st.out_unsettled.insert(id, self.handle);
        if let Some(l) = st.links.get_mut(&self.handle) {
            l.credit -= 1;
            l.delivery_count = l.delivery_count.wrapping_add(1);
            l.unsettled += 1;
        }
        let first = Transfer {
            handle: self.handle,
            delivery_id: Some(id),
            delivery_tag: Some(id.to_be_bytes().to_vec()),
            message_format: Some(0),
            settled: Some(false),
            more: true,
            ..Transfer::default()
        };
        let later = Transfer {
            handle: self.handle,
            more: true,
            ..Transfer::default()
        };
        let mut buf = Vec::with_capacity(message.len().min(conn.peer_max_frame) + 64);
        let mut offset = 0;
        loop {
            let mut t = if offset == 0 {
                first.clone()
            } else {
                later.clone()
            };
            // `more` is one byte either way: measure with it set.
            let mut perf = Vec::with_capacity(48);
            Performative::Transfer(t.clone()).encode(&mut perf);
            let room = conn
                .peer_max_frame
                .saturating_sub(FRAME_HEADER_SIZE + perf.len())
                .max(1);
            let end = (offset + room).min(message.len());
            t.more = end < message.len();
            buf.clear();
            put_frame(&mut buf, TYPE_AMQP, s.channel, |b| {
                Performative::Transfer(t.clone()).encode(b);
                b.extend_from_slice(&message[offset..end]);
            });
            st.next_outgoing_id = st.next_outgoing_id.wrapping_add(1);
            st.remote_incoming_window = st.remote_incoming_window.saturating_sub(1);
            conn.write_after(Some(st), &buf)?;
            offset = end;
            if offset >= message.len() {
                return Ok(id);
            }
            let guard = lock(&s.state);
            let deadline = Instant::now() + conn.blocked_timeout;
            st = match s.wait(
                conn,
                guard,
                deadline,
                |st| {
                    st.check_link(self.handle)?;
                    Ok(st.remote_incoming_window > 0)
                },
                || self.waiting("session window"),
            ) {
                Ok(st) => st,
                Err(e) => {
                    let mut st = lock(&s.state);
                    if let Some(l) = st.links.get_mut(&self.handle) {
                        l.fail(Error::Amqp(format!(
                            "a message to {} was cut off after {offset} of {} bytes: {e}",
                            self.address,
                            message.len()
                        )));
                    }
                    return Err(e);
                }
            };
        }
    }

    fn take(&self, st: &mut SessionState) -> Vec<SendOutcome> {
        st.links
            .get_mut(&self.handle)
            .map(|l| std::mem::take(&mut l.outcomes))
            .unwrap_or_default()
    }

    /// The outcomes that came since the last call, in the order the broker sent them; does
    /// not wait.
    pub fn take_outcomes(&self) -> Vec<SendOutcome> {
        self.take(&mut lock(&self.session.shared.state))
    }

    /// Waits (at most `timeout`) until at least one outcome came, and returns those that
    /// came (empty after the time-out).
    ///
    /// Errors: the link's, session's or connection's failure (outcomes that came before it
    /// are returned first, by an earlier call).
    pub fn wait_outcomes(&self, timeout: Duration) -> Result<Vec<SendOutcome>> {
        let s = &self.session.shared;
        let deadline = Instant::now() + timeout;
        let mut st = lock(&s.state);
        loop {
            let got = self.take(&mut st);
            if !got.is_empty() {
                return Ok(got);
            }
            st.check_link(self.handle)?;
            self.session.conn.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let slice = (deadline - now).min(Duration::from_millis(200));
            st = s
                .cond
                .wait_timeout(st, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits until at most `max_unsettled` deliveries are unsettled (0: all settled),
    /// bounded by `timeout`, and returns the outcomes that came.
    ///
    /// Errors: a time-out (`Error::Connection`, naming how many are still unsettled), or the
    /// link's, session's or connection's failure.
    pub fn wait_settled(
        &self,
        max_unsettled: usize,
        timeout: Duration,
    ) -> Result<Vec<SendOutcome>> {
        let s = &self.session.shared;
        let conn = &self.session.conn;
        let st = lock(&s.state);
        let deadline = Instant::now() + timeout;
        let mut st = s.wait(
            conn,
            st,
            deadline,
            |st| Ok(st.check_link(self.handle)?.unsettled <= max_unsettled),
            || {
                Error::Connection(format!(
                    "timed out after {} waiting for the broker to settle messages sent to {} on {}",
                    secs(timeout),
                    self.address,
                    conn.addr
                ))
            },
        )?;
        Ok(self.take(&mut st))
    }

    /// Detaches the link (closed) and waits for the broker's detach (bounded by
    /// rpc_timeout). Outcomes not taken are lost.
    ///
    /// Errors: a time-out, or the session's or connection's failure.
    pub fn detach(mut self) -> Result<()> {
        self.detached = true;
        self.session.shared.detach(&self.session.conn, self.handle)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        let s = &self.session.shared;
        let mut st = lock(&s.state);
        let Some(l) = st.links.get_mut(&self.handle) else {
            return;
        };
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
            log::trace!("amqp10: detaching the sender to {}: {e}", self.address);
        }
    }
}
