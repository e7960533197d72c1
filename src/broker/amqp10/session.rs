//! Sessions (part 2, 2.5: `begin`/`end`, session flow control 2.5.6) and the state a session
//! shares with the reader thread: its windows and counters, its links (2.6) by handle, the
//! unsettled deliveries it sent. Links attach and detach through here (2.6.3, 2.6.5).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender as ChanSender;

use super::connection::{ConnShared, Connection};
use super::frame::{put_frame, TYPE_AMQP};
use super::performative::{AmqpError, Attach, Begin, Flow, Performative};
use super::receiver::Delivery;
use super::sender::SendOutcome;
use super::{lock, secs};
use crate::error::{Error, Result};

/// Transfers we accept before the window is widened again (at half of it). The receivers'
/// bounded queues, not this window, bound memory: the reader widens it as it reads.
pub(crate) const INCOMING_WINDOW: u32 = 2048;
/// Highest link handle we use.
const HANDLE_MAX: u32 = 1023;

/// A link name unique in this process: `rmq-backup-<role>-<pid>-<n>` (RabbitMQ matches a
/// link's attach to ours by its name).
pub(crate) fn link_name(role: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("rmq-backup-{role}-{}-{n}", std::process::id())
}

/// A delivery whose transfers are still arriving.
pub(crate) struct Assembly {
    pub(crate) delivery_id: u32,
    pub(crate) delivery_tag: Vec<u8>,
    pub(crate) message_format: u32,
    pub(crate) settled: bool,
    pub(crate) bytes: Vec<u8>,
}

/// One link of a session, as the link's handle and the reader thread see it.
pub(crate) struct Link {
    pub(crate) name: String,
    /// The address of the terminus at the broker (the source of a receiver, the target of a
    /// sender), for messages.
    pub(crate) address: String,
    /// Our role: receiver (true) or sender.
    pub(crate) receiver: bool,
    /// The broker's handle, once its attach came.
    pub(crate) remote_handle: Option<u32>,
    /// The broker's attach, once it came.
    pub(crate) attach: Option<Attach>,
    /// The broker's detach (with its error), once it came.
    pub(crate) detach: Option<Option<AmqpError>>,
    /// We sent a detach.
    pub(crate) detaching: bool,
    /// Why the link is unusable.
    pub(crate) failed: Option<Error>,
    /// The link's delivery count (2.6.7).
    pub(crate) delivery_count: u32,
    /// The link's credit: deliveries the receiver still accepts.
    pub(crate) credit: u32,
    /// A drain was asked for and its answer has not come yet.
    pub(crate) draining: bool,
    /// Receiver: where complete deliveries go (dropped when the link fails, so that the
    /// receiver sees the end after the deliveries before it).
    pub(crate) tx: Option<ChanSender<Vec<Delivery>>>,
    /// Receiver: set when its handle stopped reading; the reader no longer waits on it.
    pub(crate) stopping: Arc<AtomicBool>,
    /// Receiver: the delivery being reassembled.
    pub(crate) assembly: Option<Assembly>,
    /// Sender: outcomes not taken yet, in the order they came.
    pub(crate) outcomes: Vec<SendOutcome>,
    /// Sender: deliveries sent and not settled by the broker.
    pub(crate) unsettled: usize,
}

impl Link {
    pub(crate) fn new(name: String, address: String, receiver: bool) -> Link {
        Link {
            name,
            address,
            receiver,
            remote_handle: None,
            attach: None,
            detach: None,
            detaching: false,
            failed: None,
            delivery_count: 0,
            credit: 0,
            draining: false,
            tx: None,
            stopping: Arc::new(AtomicBool::new(false)),
            assembly: None,
            outcomes: Vec::new(),
            unsettled: 0,
        }
    }

    /// Marks the link failed (the first reason wins) and ends its delivery queue.
    pub(crate) fn fail(&mut self, err: Error) {
        if self.failed.is_none() {
            self.failed = Some(err);
        }
        self.tx = None;
        self.assembly = None;
    }

    /// What the link is, for messages: `receiver from /queues/q`.
    pub(crate) fn describe(&self) -> String {
        if self.receiver {
            format!("receiver from {}", self.address)
        } else {
            format!("sender to {}", self.address)
        }
    }
}

/// A session's state, under [`SessionShared::state`].
pub(crate) struct SessionState {
    /// The broker's begin came.
    pub(crate) begun: bool,
    /// We sent an end.
    pub(crate) ending: bool,
    /// The broker's end came.
    pub(crate) ended: bool,
    /// Why the session is unusable.
    pub(crate) failed: Option<Error>,
    pub(crate) next_outgoing_id: u32,
    /// Transfers the broker accepts from us now.
    pub(crate) remote_incoming_window: u32,
    pub(crate) next_incoming_id: u32,
    pub(crate) incoming_window: u32,
    /// Delivery id of our next sent delivery.
    pub(crate) next_delivery_id: u32,
    pub(crate) handle_max: u32,
    /// Links by our handle.
    pub(crate) links: HashMap<u32, Link>,
    /// Our handle by the broker's.
    pub(crate) by_remote: HashMap<u32, u32>,
    /// Our sent, unsettled deliveries: the handle of the link of each delivery id.
    pub(crate) out_unsettled: HashMap<u32, u32>,
}

impl SessionState {
    /// The session fields of a flow (2.7.4).
    pub(crate) fn flow(&self) -> Flow {
        Flow {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: self.incoming_window,
            next_outgoing_id: self.next_outgoing_id,
            outgoing_window: u32::MAX,
            ..Flow::default()
        }
    }

    /// A flow about link `handle`: the session fields and the link's count and credit.
    pub(crate) fn link_flow(&self, handle: u32, drain: bool) -> Flow {
        let mut f = self.flow();
        f.handle = Some(handle);
        if let Some(l) = self.links.get(&handle) {
            f.delivery_count = Some(l.delivery_count);
            f.link_credit = Some(l.credit);
        }
        f.drain = drain;
        f
    }

    /// `Ok` while link `handle` and this session are usable.
    pub(crate) fn check_link(&self, handle: u32) -> Result<&Link> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.links.get(&handle) {
            Some(l) => match &l.failed {
                Some(e) => Err(e.clone()),
                None => Ok(l),
            },
            None => Err(Error::Amqp("the link is detached".to_string())),
        }
    }
}

/// What a session shares with the reader thread and its links.
pub(crate) struct SessionShared {
    /// Our channel.
    pub(crate) channel: u16,
    pub(crate) state: Mutex<SessionState>,
    /// Signalled on every change a waiter may wait for.
    pub(crate) cond: Condvar,
    /// Held by a sender for the whole of one message's transfers.
    pub(crate) send_lock: Mutex<()>,
}

impl SessionShared {
    /// Fails the session and every link of it with `err`.
    pub(crate) fn fail(&self, err: Error) {
        let mut st = lock(&self.state);
        if st.failed.is_none() {
            st.failed = Some(err.clone());
        }
        for l in st.links.values_mut() {
            l.fail(err.clone());
        }
        drop(st);
        self.cond.notify_all();
    }

    /// Waits on the session's condition until `done` says so or `deadline` passes; `Err`
    /// from `done` ends the wait. Returns the guard, or `Err(timed_out())` at the deadline.
    pub(crate) fn wait<'a>(
        &self,
        conn: &ConnShared,
        mut st: MutexGuard<'a, SessionState>,
        deadline: Instant,
        mut done: impl FnMut(&SessionState) -> Result<bool>,
        timed_out: impl FnOnce() -> Error,
    ) -> Result<MutexGuard<'a, SessionState>> {
        loop {
            conn.check()?;
            if done(&st)? {
                return Ok(st);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timed_out());
            }
            // Short slices: a dead connection is noticed even without a signal.
            let slice = (deadline - now).min(Duration::from_millis(200));
            st = self
                .cond
                .wait_timeout(st, slice)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Encodes `p` on this session's channel under the state lock and writes it.
    pub(crate) fn send_locked(
        &self,
        conn: &ConnShared,
        st: MutexGuard<'_, SessionState>,
        p: &Performative,
    ) -> Result<()> {
        let mut buf = Vec::with_capacity(128);
        put_frame(&mut buf, TYPE_AMQP, self.channel, |b| p.encode(b));
        log::trace!(
            "amqp10 {} sent {} channel={}",
            conn.addr,
            p.name(),
            self.channel
        );
        conn.write_after(Some(st), &buf)
    }

    /// Attaches a link: sends `attach` (its handle filled in), waits for the broker's attach
    /// (bounded by rpc_timeout). A broker that refuses answers with a null terminus and a
    /// detach: its error is returned. Returns our handle.
    ///
    /// Errors: `Error::Amqp("cannot attach a <receiver from|sender to> <address>: <condition>:
    /// <description>")`, a time-out, or the session's or connection's failure.
    pub(crate) fn attach(&self, conn: &ConnShared, link: Link, mut a: Attach) -> Result<u32> {
        let what = link.describe();
        let mut st = lock(&self.state);
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let max = st.handle_max.min(HANDLE_MAX);
        let handle = (0..=max)
            .find(|h| !st.links.contains_key(h))
            .ok_or_else(|| Error::Amqp(format!("no free link handle: all {max} are in use")))?;
        st.links.insert(handle, link);
        a.handle = handle;
        self.send_locked(conn, st, &Performative::Attach(a))?;
        let deadline = Instant::now() + conn.rpc_timeout;
        let timed_out = || {
            Error::Connection(format!(
                "timed out after {} waiting for the broker to attach the {what} on {}",
                secs(conn.rpc_timeout),
                conn.addr
            ))
        };
        // The broker answers with its attach; one that refuses answers with a null terminus
        // and then a detach with the reason (2.6.3), which may come before we look.
        let refused = |st: &SessionState| {
            st.links.get(&handle).is_none_or(|l| {
                l.detach.is_some()
                    || l.attach.as_ref().is_some_and(|a| {
                        if a.role_receiver {
                            a.target.is_none()
                        } else {
                            a.source.is_none()
                        }
                    })
            })
        };
        let st = lock(&self.state);
        let waited = self.wait(
            conn,
            st,
            deadline,
            |st| {
                if let Some(e) = &st.failed {
                    return Err(e.clone());
                }
                Ok(st
                    .links
                    .get(&handle)
                    .is_none_or(|l| l.attach.is_some() || l.detach.is_some()))
            },
            timed_out,
        );
        let mut st = match waited {
            Ok(st) => st,
            Err(e) => {
                lock(&self.state).links.remove(&handle);
                // RabbitMQ 4.0 refuses a link by ending its session.
                return Err(match e {
                    Error::Amqp(m) => Error::Amqp(format!("cannot attach a {what}: {m}")),
                    e => e,
                });
            }
        };
        if refused(&st) {
            let deadline = Instant::now() + conn.rpc_timeout;
            st = self.wait(
                conn,
                st,
                deadline,
                |st| Ok(st.links.get(&handle).is_none_or(|l| l.detach.is_some())),
                || Error::Amqp(format!("the broker refused to attach the {what}")),
            )?;
            let l = st.links.remove(&handle);
            return Err(match l.and_then(|l| l.detach).flatten() {
                Some(e) => Error::Amqp(format!("cannot attach a {what}: {e}")),
                None => Error::Amqp(format!("the broker refused to attach the {what}")),
            });
        }
        Ok(handle)
    }

    /// Detaches link `handle` (closed) and waits for the broker's detach, bounded by
    /// rpc_timeout. The link is gone afterwards whatever happens.
    pub(crate) fn detach(&self, conn: &ConnShared, handle: u32) -> Result<()> {
        let mut st = lock(&self.state);
        let (what, already) = match st.links.get_mut(&handle) {
            None => return Ok(()),
            Some(l) => {
                l.detaching = true;
                l.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
                (l.describe(), l.detach.is_some() || l.failed.is_some())
            }
        };
        let result = if already || st.failed.is_some() {
            // Released before the link is removed below (the same lock).
            drop(st);
            Ok(())
        } else {
            let detach = Performative::Detach {
                handle,
                closed: true,
                error: None,
            };
            self.send_locked(conn, st, &detach).and_then(|()| {
                let deadline = Instant::now() + conn.rpc_timeout;
                let st = lock(&self.state);
                self.wait(
                    conn,
                    st,
                    deadline,
                    |st| {
                        Ok(st
                            .links
                            .get(&handle)
                            .is_none_or(|l| l.detach.is_some() || l.failed.is_some()))
                    },
                    || {
                        Error::Connection(format!(
                            "timed out after {} waiting for the broker to detach the {what} on {}",
                            secs(conn.rpc_timeout),
                            conn.addr
                        ))
                    },
                )
                .map(drop)
            })
        };
        let mut st = lock(&self.state);
        if let Some(l) = st.links.remove(&handle) {
            if let Some(r) = l.remote_handle {
                st.by_remote.remove(&r);
            }
        }
        st.out_unsettled.retain(|_, h| *h != handle);
        result
    }
}

/// The handle of a session, shared by the [`Session`] and its links: the last one dropped
/// ends the session.
pub(crate) struct SessionHandle {
    pub(crate) conn: Arc<ConnShared>,
    pub(crate) shared: Arc<SessionShared>,
}

impl SessionHandle {
    fn end(&self, wait: bool) -> Result<()> {
        let conn = &self.conn;
        let mut st = lock(&self.shared.state);
        if st.ending || st.ended || st.failed.is_some() {
            return match (&st.failed, st.ended) {
                (Some(e), false) => Err(e.clone()),
                _ => Ok(()),
            };
        }
        st.ending = true;
        self.shared
            .send_locked(conn, st, &Performative::End(None))?;
        if !wait {
            return Ok(());
        }
        let deadline = Instant::now() + conn.rpc_timeout;
        let st = lock(&self.shared.state);
        self.shared
            .wait(
                conn,
                st,
                deadline,
                |st| Ok(st.ended || st.failed.is_some()),
                || {
                    Error::Connection(format!(
                        "timed out after {} waiting for the broker to end a session on {}",
                        secs(conn.rpc_timeout),
                        conn.addr
                    ))
                },
            )
            .map(drop)
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        if let Err(e) = self.end(false) {
            log::trace!("amqp10 {}: ending a session: {e}", self.conn.addr);
        }
    }
}

/// An AMQP 1.0 session (part 2, 2.5), Send + Sync: the links it makes share it, and the
/// session ends when the last of it and its links is dropped (or at [`Session::end`]).
pub struct Session {
    pub(crate) handle: Arc<SessionHandle>,
}

impl Connection {
    /// Begins a session on the lowest free channel and waits for the broker's begin (bounded
    /// by rpc_timeout).
    ///
    /// Errors: `Error::Amqp` when every channel is in use; a time-out or the connection's
    /// failure as `Error::Connection`.
    pub fn session(&self) -> Result<Session> {
        let conn = &self.shared;
        let shared = {
            let mut sessions = lock(&conn.sessions);
            conn.check()?;
            let slots = conn.channel_max as u32 + 1;
            let from = conn.next_channel.load(std::sync::atomic::Ordering::Relaxed) as u32;
            let channel = (0..slots)
                .map(|i| ((from + i) % slots) as u16)
                .find(|c| !sessions.contains_key(c))
                .ok_or_else(|| {
                    Error::Amqp(format!(
                        "no free channel: all {} are in use",
                        conn.channel_max
                    ))
                })?;
            conn.next_channel.store(
                ((channel as u32 + 1) % slots) as u16,
                std::sync::atomic::Ordering::Relaxed,
            );
            let s = Arc::new(SessionShared {
                channel,
                state: Mutex::new(SessionState {
                    begun: false,
                    ending: false,
                    ended: false,
                    failed: None,
                    next_outgoing_id: 0,
                    remote_incoming_window: 0,
                    next_incoming_id: 0,
                    incoming_window: INCOMING_WINDOW,
                    next_delivery_id: 0,
                    handle_max: HANDLE_MAX,
                    links: HashMap::new(),
                    by_remote: HashMap::new(),
                    out_unsettled: HashMap::new(),
                }),
                cond: Condvar::new(),
                send_lock: Mutex::new(()),
            });
            sessions.insert(channel, s.clone());
            s
        };
        let handle = Arc::new(SessionHandle {
            conn: conn.clone(),
            shared: shared.clone(),
        });
        let begin = Performative::Begin(Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: INCOMING_WINDOW,
            outgoing_window: u32::MAX,
            handle_max: HANDLE_MAX,
        });
        let st = lock(&shared.state);
        shared.send_locked(conn, st, &begin)?;
        let deadline = Instant::now() + conn.rpc_timeout;
        let st = lock(&shared.state);
        shared
            .wait(
                conn,
                st,
                deadline,
                |st| match &st.failed {
                    Some(e) => Err(e.clone()),
                    None => Ok(st.begun),
                },
                || {
                    Error::Connection(format!(
                        "timed out after {} waiting for the broker to begin a session on {}",
                        secs(conn.rpc_timeout),
                        conn.addr
                    ))
                },
            )
            .map(drop)?;
        Ok(Session { handle })
    }
}

impl Session {
    /// Ends the session: `end`, then waits for the broker's (bounded by rpc_timeout). Its
    /// links fail afterwards. Errors: the session's failure, or a time-out.
    pub fn end(self) -> Result<()> {
        self.handle.end(true)
    }
}
