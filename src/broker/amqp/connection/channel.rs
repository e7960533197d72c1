//! A channel: synchronous methods (declare, bind, qos, delete, purge), and its close.

use super::*;
use crate::broker::amqp::codec::Method;
use crate::broker::amqp::types::FieldTable;
use crate::error::{Error, Result};
use crossbeam_channel::RecvTimeoutError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Channel {
    /// The reason the broker gave for blocking this channel's connection (`connection.blocked`:
    /// a resource alarm), until it unblocks it.
    pub fn connection_blocked(&self) -> Option<String> {
        lock(&self.conn.blocked).clone()
    }

    /// How long a publish waits while the connection is blocked
    /// ([`super::ConnectOptions::blocked_timeout`]).
    pub fn blocked_timeout(&self) -> Duration {
        self.conn.blocked_timeout
    }

    /// The channel number.
    pub fn id(&self) -> u16 {
        self.chan.id
    }

    /// True until the channel or its connection was closed or failed.
    pub fn is_open(&self) -> bool {
        self.check_open().is_ok()
    }

    pub(super) fn check_open(&self) -> Result<()> {
        if let Some(e) = &lock(&self.chan.state).closed {
            return Err(e.clone());
        }
        self.conn.check()
    }

    pub(super) fn send_method(&self, m: &Method) -> Result<()> {
        let mut buf = self.buf.borrow_mut();
        let r = self.conn.send_method(self.chan.id, m, &mut buf);
        if buf.capacity() > 1 << 20 {
            *buf = Vec::with_capacity(4096);
        }
        r
    }

    /// Sends a synchronous method and waits (rpc_timeout) for the reply accepted by `accept`.
    /// After a timeout or an unexpected reply the channel is unusable (a late reply could be
    /// taken for the next one).
    pub(super) fn rpc(
        &self,
        m: Method,
        expect: &str,
        accept: impl Fn(&Reply) -> bool,
    ) -> Result<Reply> {
        self.check_open()?;
        // Drop anything stale (e.g. the error that closed a channel is also queued there).
        while self.rpc_rx.try_recv().is_ok() {}
        self.send_method(&m)?;
        match self.rpc_rx.recv_timeout(self.conn.rpc_timeout) {
            Ok(Ok(reply)) if accept(&reply) => Ok(reply),
            Ok(Ok(reply)) => {
                let e = Error::Amqp(format!(
                    "unexpected {} on channel {} while waiting for {expect}",
                    reply.name(),
                    self.id()
                ));
                self.mark_broken(e.clone());
                Err(e)
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                let e = Error::Connection(format!(
                    "timed out after {} waiting for {expect} on channel {} of {}",
                    secs(self.conn.rpc_timeout),
                    self.id(),
                    self.conn.addr
                ));
                self.mark_broken(e.clone());
                Err(e)
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.conn.current_error()),
        }
    }

    pub(super) fn mark_broken(&self, e: Error) {
        let mut st = lock(&self.chan.state);
        if st.closed.is_none() {
            st.closed = Some(e);
        }
        drop(st);
        self.chan.cond.notify_all();
    }

    /// `on`: from now on, messages delivered on this channel keep their properties as the
    /// broker sent them (`Delivery::wire`, checked, not decoded; `Delivery::properties`
    /// empty), so a reader that writes records from them (a backup) allocates nothing per
    /// property or header; `off` (the default): decoded. A message whose content
    /// has begun arriving is not affected.
    pub fn keep_wire_properties(&self, on: bool) {
        self.chan
            .wire_properties
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// `basic.qos`: at most `prefetch_count` unacknowledged deliveries (0 = no limit; quorum
    /// queues treat 0 as 2000, ENVIRONMENT.md) per consumer, or per channel when `global`.
    pub fn basic_qos(&self, prefetch_count: u16, global: bool) -> Result<()> {
        self.rpc(
            Method::BasicQos {
                prefetch_size: 0,
                prefetch_count,
                global,
            },
            "basic.qos-ok",
            |r| matches!(r, Reply::Method(Method::BasicQosOk)),
        )
        .map(|_| ())
    }

    pub(super) fn declare(&self, m: Method) -> Result<QueueDeclareOk> {
        match self.rpc(m, "queue.declare-ok", |r| {
            matches!(r, Reply::Method(Method::QueueDeclareOk { .. }))
        })? {
            Reply::Method(Method::QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            }) => Ok(QueueDeclareOk {
                queue,
                message_count,
                consumer_count,
            }),
            _ => Err(Error::Amqp("unexpected reply to queue.declare".to_string())),
        }
    }

    /// Passive `queue.declare`: the queue's ready message and consumer counts. A missing queue
    /// closes the channel with `AMQP error: NOT_FOUND - no queue '<name>' in vhost '<vhost>'`.
    pub fn queue_declare_passive(&self, name: &str) -> Result<QueueDeclareOk> {
        self.declare(Method::QueueDeclare {
            queue: name.to_string(),
            passive: true,
            durable: false,
            exclusive: false,
            auto_delete: false,
            no_wait: false,
            arguments: Vec::new(),
        })
    }

    /// `queue.declare` (an empty name lets the broker choose one, returned in the reply).
    pub fn queue_declare(
        &self,
        name: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<QueueDeclareOk> {
        self.declare(Method::QueueDeclare {
            queue: name.to_string(),
            passive: false,
            durable,
            exclusive,
            auto_delete,
            no_wait: false,
            arguments: arguments.clone(),
        })
    }

    /// `queue.delete`; returns the number of messages deleted with it.
    pub fn queue_delete(&self, name: &str) -> Result<u32> {
        match self.rpc(
            Method::QueueDelete {
                queue: name.to_string(),
                if_unused: false,
                if_empty: false,
                no_wait: false,
            },
            "queue.delete-ok",
            |r| matches!(r, Reply::Method(Method::QueueDeleteOk { .. })),
        )? {
            Reply::Method(Method::QueueDeleteOk { message_count }) => Ok(message_count),
            _ => Err(Error::Amqp("unexpected reply to queue.delete".to_string())),
        }
    }

    /// `queue.purge`; returns the number of messages purged.
    pub fn queue_purge(&self, name: &str) -> Result<u32> {
        match self.rpc(
            Method::QueuePurge {
                queue: name.to_string(),
                no_wait: false,
            },
            "queue.purge-ok",
            |r| matches!(r, Reply::Method(Method::QueuePurgeOk { .. })),
        )? {
            Reply::Method(Method::QueuePurgeOk { message_count }) => Ok(message_count),
            _ => Err(Error::Amqp("unexpected reply to queue.purge".to_string())),
        }
    }

    /// `exchange.declare` (not passive, not internal).
    pub fn exchange_declare(
        &self,
        name: &str,
        kind: &str,
        durable: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<()> {
        self.rpc(
            Method::ExchangeDeclare {
                exchange: name.to_string(),
                kind: kind.to_string(),
                passive: false,
                durable,
                auto_delete,
                internal: false,
                no_wait: false,
                arguments: arguments.clone(),
            },
            "exchange.declare-ok",
            |r| matches!(r, Reply::Method(Method::ExchangeDeclareOk)),
        )
        .map(|_| ())
    }

    /// `exchange.delete`.
    pub fn exchange_delete(&self, name: &str) -> Result<()> {
        self.rpc(
            Method::ExchangeDelete {
                exchange: name.to_string(),
                if_unused: false,
                no_wait: false,
            },
            "exchange.delete-ok",
            |r| matches!(r, Reply::Method(Method::ExchangeDeleteOk)),
        )
        .map(|_| ())
    }

    /// `queue.bind`.
    pub fn queue_bind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &FieldTable,
    ) -> Result<()> {
        self.rpc(
            Method::QueueBind {
                queue: queue.to_string(),
                exchange: exchange.to_string(),
                routing_key: routing_key.to_string(),
                no_wait: false,
                arguments: arguments.clone(),
            },
            "queue.bind-ok",
            |r| matches!(r, Reply::Method(Method::QueueBindOk)),
        )
        .map(|_| ())
    }
}

impl Channel {
    /// Closes the channel (`channel.close`, waits for close-ok up to rpc_timeout). Unacked
    /// deliveries go back to their queues. Returns the broker's error if the broker had closed
    /// the channel (e.g. a publish to a missing exchange), so no failure goes unseen.
    pub fn close(self) -> Result<()> {
        self.close_inner()
    }

    pub(super) fn stop_consumers(&self) {
        let st = lock(&self.chan.state);
        for c in st.consumers.values() {
            c.state.stopping.store(true, Ordering::SeqCst);
        }
    }

    pub(super) fn close_method() -> Method {
        Method::ChannelClose {
            reply_code: 200,
            reply_text: "Normal shutdown".to_string(),
            class_id: 0,
            method_id: 0,
        }
    }

    /// True while the reader still knows this channel (not closed by the broker, no close-ok).
    pub(super) fn registered(&self) -> bool {
        self.conn
            .channel(self.chan.id)
            .is_some_and(|c| Arc::ptr_eq(&c, &self.chan))
    }

    pub(super) fn close_inner(&self) -> Result<()> {
        if self.closed.replace(true) {
            return Ok(());
        }
        let prior = lock(&self.chan.state).closed.clone();
        if !self.registered() || self.conn.dead.load(Ordering::SeqCst) {
            // Closed by the broker (its error) or the connection is gone.
            return match prior {
                Some(e) => Err(e),
                None => self.conn.check(),
            };
        }
        self.stop_consumers();
        if let Some(e) = prior {
            // Unusable after a timeout: still ask the broker to release the channel.
            let _ = self.send_method(&Self::close_method());
            return Err(e);
        }
        self.rpc(Self::close_method(), "channel.close-ok", |r| {
            matches!(r, Reply::Method(Method::ChannelCloseOk))
        })
        .map(|_| ())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.closed.replace(true) || self.conn.dead.load(Ordering::SeqCst) || !self.registered()
        {
            return;
        }
        self.stop_consumers();
        let _ = self.send_method(&Self::close_method());
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------
