//! The state a connection's reader thread shares with the connection, its channels and
//! their consumers: replies to synchronous methods, consumer queues, confirms, the close
//! reason.

use super::*;
use crate::broker::amqp::codec::{put_heartbeat, put_method_frame, Method};
use crate::error::{Error, Result};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl ConnShared {
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub(super) fn lost(&self, detail: impl std::fmt::Display) -> Error {
        Error::Connection(format!("connection to {} lost: {detail}", self.addr))
    }

    /// Records the connection's failure (the first one wins) and marks it dead.
    pub(super) fn fail(&self, err: Error) {
        let mut e = lock(&self.error);
        if e.is_none() {
            *e = Some(err);
        }
        self.dead.store(true, Ordering::SeqCst);
    }

    pub(super) fn current_error(&self) -> Error {
        lock(&self.error)
            .clone()
            .unwrap_or_else(|| Error::Connection("connection reset by peer".to_string()))
    }

    pub(super) fn check(&self) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(self.current_error())
        } else {
            Ok(())
        }
    }

    /// Writes bytes (whole frames) in one call. A failed write kills the connection.
    pub(super) fn write(&self, bytes: &[u8]) -> Result<()> {
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

    pub(super) fn send_method(
        &self,
        channel: u16,
        method: &Method,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
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
    pub(super) fn heartbeat_if_due(&self) -> Result<()> {
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

    pub(super) fn channel(&self, id: u16) -> Option<Arc<ChanShared>> {
        lock(&self.channels).get(&id).cloned()
    }

    pub(super) fn remove_channel(&self, id: u16) -> Option<Arc<ChanShared>> {
        lock(&self.channels).remove(&id)
    }

    /// Fails every channel and waiter with the connection's error (called once, by the reader
    /// thread as it exits).
    pub(super) fn fail_all(&self, err: Error) {
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
    pub(super) fn wait_unblocked(&self) -> Result<()> {
        let mut b = lock(&self.blocked);
        if b.is_none() {
            return Ok(());
        }
        let deadline = Instant::now() + self.blocked_timeout;
        while let Some(reason) = b.as_ref() {
            self.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Connection(format!(
                    "connection to {} is blocked by the broker ({reason}); gave up after {}",
                    self.addr,
                    secs(self.blocked_timeout)
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

impl Reply {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Reply::Method(m) => m.name(),
            Reply::Get(_) => "basic.get-ok",
        }
    }
}

impl ConsumerState {
    pub(super) fn end(&self, err: Error) {
        let mut e = lock(&self.error);
        if e.is_none() {
            *e = Some(err);
        }
    }
}

impl ChanShared {
    pub(super) fn fail(&self, err: Error) {
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

    pub(super) fn confirm(&self, tag: u64, multiple: bool, nack: bool) {
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
