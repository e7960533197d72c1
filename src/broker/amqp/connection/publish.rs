//! Publishing: basic.publish in one write, publisher confirms (select, wait with a
//! timeout, outstanding count), nacks and returns.

use super::*;
use crate::broker::amqp::codec::{put_publish, Method, PutProperties};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

impl Channel {
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
    /// one write call. `properties`: a [`crate::broker::amqp::BasicProperties`], or an
    /// [`crate::broker::amqp::codec::EncodedProperties`] encoded earlier. While the broker blocks the
    /// connection (`connection.blocked`) this waits, at most rpc_timeout, then fails with
    /// `Error::Connection`.
    pub fn basic_publish<P: PutProperties + ?Sized>(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: &P,
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
    /// received since the previous call, and the unsettled tail ([`ConfirmStatus::unsettled`]),
    /// taken together under the channel's lock. A channel closed by the broker gives its error.
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
                    unsettled: st.unconfirmed.front().map_or(0, |&f| st.next_seq + 1 - f),
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
}
