//! Deliveries on the reader thread: a method, content header and body frames assembled into
//! one `Delivery` (bounded by `MAX_BODY_SIZE`), then handed to its consumer's queue in
//! batches.

use super::*;
use crate::broker::amqp::codec::utf8_short_string_owned;
use crate::broker::amqp::types::{BasicProperties, Delivery, WireProperties};
use crate::error::{Error, Result};
use crossbeam_channel::{SendTimeoutError, TrySendError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Exchange, routing key and flags of a delivery, before its content arrives.
pub(super) struct DeliveryHead {
    pub(super) delivery_tag: u64,
    pub(super) redelivered: bool,
    pub(super) exchange: String,
    pub(super) routing_key: String,
}

pub(super) enum Target {
    Deliver {
        consumer_tag: String,
        head: Result<DeliveryHead>,
    },
    Get {
        head: Result<DeliveryHead>,
        message_count: u32,
    },
    Return(Returned),
    /// Content for a channel that no longer exists: read and dropped.
    Discard,
}

/// A message's properties: decoded, or kept as the broker sent them (the channel's choice,
/// `Channel::keep_wire_properties`). One per message being assembled, moved into its
/// `Delivery`: boxing the larger variant would cost an allocation per decoded delivery.
#[allow(clippy::large_enum_variant)]
pub(super) enum Properties {
    Decoded(BasicProperties),
    Wire(WireProperties),
}

/// A message being assembled from its content header and body frames.
pub(super) struct Assembly {
    pub(super) target: Target,
    /// Keep the properties as bytes (the channel's choice when the message began).
    pub(super) wire: bool,
    pub(super) properties: Option<Result<Properties>>,
    pub(super) body_size: u64,
    pub(super) received: u64,
    pub(super) body: Vec<u8>,
}

pub(super) fn delivery_head(
    delivery_tag: u64,
    redelivered: bool,
    exchange: Vec<u8>,
    routing_key: Vec<u8>,
) -> Result<DeliveryHead> {
    Ok(DeliveryHead {
        delivery_tag,
        redelivered,
        exchange: utf8_short_string_owned(exchange, "exchange name of a delivery")?,
        routing_key: utf8_short_string_owned(routing_key, "routing key of a delivery")?,
    })
}

impl ReaderState {
    /// A message is complete: hand it to its consumer, get waiter or the returned list.
    pub(super) fn complete(&mut self, channel: u16) -> Result<()> {
        let Some(a) = self.assembling.remove(&channel) else {
            return Ok(());
        };
        let properties = a
            .properties
            .unwrap_or_else(|| Ok(Properties::Decoded(BasicProperties::default())));
        let body = a.body;
        let make = |head: Result<DeliveryHead>, properties: Result<Properties>| {
            let h = head?;
            let properties = properties.map_err(|e| {
                Error::Amqp(format!(
                    "message with delivery tag {} (routing key '{}'): {}",
                    h.delivery_tag,
                    h.routing_key,
                    e.message()
                ))
            })?;
            let (properties, wire) = match properties {
                Properties::Decoded(p) => (p, None),
                Properties::Wire(w) => (BasicProperties::default(), Some(w)),
            };
            Ok(Delivery {
                delivery_tag: h.delivery_tag,
                redelivered: h.redelivered,
                exchange: h.exchange,
                routing_key: h.routing_key,
                properties,
                wire,
                body,
            })
        };
        match a.target {
            Target::Deliver { consumer_tag, head } => {
                let Some(chan) = self.shared.channel(channel) else {
                    return Ok(());
                };
                let slot = lock(&chan.state).consumers.get(&consumer_tag).cloned();
                match slot {
                    Some(slot) => self.enqueue(slot, make(head, properties))?,
                    None => log::debug!(
                        "amqp {}: delivery for unknown consumer {consumer_tag} on channel {channel} dropped",
                        self.shared.addr
                    ),
                }
            }
            Target::Get {
                head,
                message_count,
            } => {
                if let Some(chan) = self.shared.channel(channel) {
                    let reply = make(head, properties).map(|delivery| {
                        Reply::Get(Box::new(GetOk {
                            delivery,
                            message_count,
                        }))
                    });
                    let _ = lock(&chan.state).rpc_tx.send(reply);
                }
            }
            Target::Return(r) => {
                if let Some(chan) = self.shared.channel(channel) {
                    lock(&chan.state).returned.push(r);
                    chan.cond.notify_all();
                }
            }
            Target::Discard => {}
        }
        Ok(())
    }

    /// Adds a delivery to its consumer's pending batch; a full batch is handed over.
    pub(super) fn enqueue(&mut self, slot: ConsumerSlot, item: Result<Delivery>) -> Result<()> {
        let i = match self
            .pending
            .iter()
            .position(|(s, _, _)| Arc::ptr_eq(&s.state, &slot.state))
        {
            Some(i) => i,
            None => {
                let batch = Vec::with_capacity(self.shared.batch_max);
                self.pending.push((slot, batch, 0));
                self.pending.len() - 1
            }
        };
        let bytes = item.as_ref().map_or(0, |d| d.body.len());
        let entry = &mut self.pending[i];
        entry.1.push(item);
        entry.2 += bytes;
        if entry.1.len() >= self.shared.batch_max || entry.2 >= BATCH_BYTES_MAX {
            let (slot, batch, _) = self.pending.swap_remove(i);
            self.push(slot, batch)?;
        }
        Ok(())
    }

    /// Hands every pending batch to its consumer.
    pub(super) fn flush_all(&mut self) -> Result<()> {
        while let Some((slot, batch, _)) = self.pending.pop() {
            self.push(slot, batch)?;
        }
        Ok(())
    }

    /// Puts a batch of deliveries in a consumer's bounded queue. While the queue is full the
    /// reader waits here (TCP back-pressure), sending heartbeats, until the consumer takes one,
    /// stops, or the connection closes.
    pub(super) fn push(&mut self, slot: ConsumerSlot, item: Vec<Result<Delivery>>) -> Result<()> {
        let mut item = match slot.tx.try_send(item) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => return Ok(()),
            Err(TrySendError::Full(back)) => back,
        };
        loop {
            if slot.state.stopping.load(Ordering::SeqCst)
                || self.shared.closing.load(Ordering::SeqCst)
            {
                log::trace!(
                    "amqp {}: dropped a delivery for a stopped consumer",
                    self.shared.addr
                );
                break;
            }
            match slot.tx.send_timeout(item, PUSH_TICK) {
                Ok(()) | Err(SendTimeoutError::Disconnected(_)) => break,
                Err(SendTimeoutError::Timeout(back)) => {
                    item = back;
                    if self.shared.dead.load(Ordering::SeqCst) {
                        return Err(self.shared.current_error());
                    }
                    self.shared.heartbeat_if_due()?;
                }
            }
        }
        // We were not reading: the broker's silence meanwhile says nothing.
        self.last_read = Instant::now();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Channel
// ---------------------------------------------------------------------------------------------
