//! Consuming: basic.consume / cancel / get and acknowledgements, and the `Consumer` that
//! receives deliveries with a timeout.

use super::*;
use crate::broker::amqp::codec::Method;
use crate::broker::amqp::types::{Delivery, FieldTable};
use crate::error::{Error, Result};
use crossbeam_channel::{bounded, RecvTimeoutError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Channel {
    /// `basic.consume`. Deliveries arrive through the returned [`Consumer`]; an empty
    /// `consumer_tag` lets the broker choose one.
    pub fn basic_consume(
        &self,
        queue: &str,
        consumer_tag: &str,
        no_ack: bool,
        exclusive: bool,
        arguments: &FieldTable,
    ) -> Result<Consumer> {
        self.check_open()?;
        let (tx, rx) = bounded(self.conn.consumer_batches);
        let state = Arc::new(ConsumerState {
            stopping: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        lock(&self.chan.state).pending_consumer = Some(ConsumerSlot {
            tx,
            state: state.clone(),
        });
        let reply = self.rpc(
            Method::BasicConsume {
                queue: queue.to_string(),
                consumer_tag: consumer_tag.to_string(),
                no_local: false,
                no_ack,
                exclusive,
                no_wait: false,
                arguments: arguments.clone(),
            },
            "basic.consume-ok",
            |r| matches!(r, Reply::Method(Method::BasicConsumeOk { .. })),
        );
        match reply {
            Ok(Reply::Method(Method::BasicConsumeOk { consumer_tag })) => Ok(Consumer {
                tag: consumer_tag,
                rx,
                local: Mutex::new(VecDeque::new()),
                state,
            }),
            Ok(_) => Err(Error::Amqp("unexpected reply to basic.consume".to_string())),
            Err(e) => {
                lock(&self.chan.state).pending_consumer = None;
                Err(e)
            }
        }
    }

    /// `basic.cancel`, waiting for `basic.cancel-ok`. Deliveries already buffered stay readable
    /// from the [`Consumer`]; after them it reports that it was cancelled. Deliveries still
    /// arriving that do not fit its buffer are dropped (without no_ack the broker requeues them
    /// when the channel closes).
    pub fn basic_cancel(&self, consumer_tag: &str) -> Result<()> {
        if let Some(c) = lock(&self.chan.state).consumers.get(consumer_tag) {
            c.state.stopping.store(true, Ordering::SeqCst);
        }
        self.rpc(
            Method::BasicCancel {
                consumer_tag: consumer_tag.to_string(),
                no_wait: false,
            },
            "basic.cancel-ok",
            |r| matches!(r, Reply::Method(Method::BasicCancelOk { .. })),
        )
        .map(|_| ())
    }

    /// `basic.get`: one message, or `None` when the queue is empty.
    pub fn basic_get(&self, queue: &str, no_ack: bool) -> Result<Option<GetOk>> {
        match self.rpc(
            Method::BasicGet {
                queue: queue.to_string(),
                no_ack,
            },
            "basic.get-ok",
            |r| matches!(r, Reply::Get(_) | Reply::Method(Method::BasicGetEmpty)),
        )? {
            Reply::Get(g) => Ok(Some(*g)),
            _ => Ok(None),
        }
    }

    /// `basic.ack` (no reply).
    pub fn basic_ack(&self, delivery_tag: u64, multiple: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicAck {
            delivery_tag,
            multiple,
        })
    }

    /// `basic.nack` (no reply).
    pub fn basic_nack(&self, delivery_tag: u64, multiple: bool, requeue: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicNack {
            delivery_tag,
            multiple,
            requeue,
        })
    }

    /// `basic.reject` (no reply).
    pub fn basic_reject(&self, delivery_tag: u64, requeue: bool) -> Result<()> {
        self.check_open()?;
        self.send_method(&Method::BasicReject {
            delivery_tag,
            requeue,
        })
    }
}

impl Consumer {
    /// The consumer tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The next delivery; `Ok(None)` when none arrived within `timeout`. Once the consumer is
    /// cancelled, its channel or connection closed, buffered deliveries come first and then the
    /// reason as an error (e.g. the broker's reply text, `Error::Amqp`). A delivery whose
    /// properties cannot be read (a short string not valid UTF-8) is an `Error::Amqp` naming it.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Delivery>> {
        let mut local = lock(&self.local);
        if local.is_empty() {
            match self.rx.recv_timeout(timeout) {
                Ok(batch) => local.extend(batch),
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => return Err(self.ended()),
            }
        }
        local.pop_front().transpose()
    }

    /// Like [`Consumer::recv_timeout`] without waiting.
    pub fn try_recv(&self) -> Result<Option<Delivery>> {
        let mut local = lock(&self.local);
        if local.is_empty() {
            match self.rx.try_recv() {
                Ok(batch) => local.extend(batch),
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(None),
                Err(crossbeam_channel::TryRecvError::Disconnected) => return Err(self.ended()),
            }
        }
        local.pop_front().transpose()
    }

    pub(super) fn ended(&self) -> Error {
        lock(&self.state.error)
            .clone()
            .unwrap_or_else(|| Error::Amqp(format!("consumer {} has ended", self.tag)))
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
    }
}
