//! One interface for publishing messages back into a broker, whatever protocol they were
//! published with at the source (issue 39): a [`Publisher`] takes a message for a [`Target`]
//! (exchange and routing key, as a restore's `publish_mode` and mappings decided), keeps a
//! window of unsettled publishes, and reports what the broker settled and the settled prefix
//! (every publish before the oldest one still unsettled), which a restore records as its
//! checkpoint.
//!
//! - [`amqp091::BasicPublisher`]: AMQP 0-9-1 `basic.publish` on a channel, `mandatory`, with
//!   publisher confirms (a nack or a `basic.return` is a failure);
//! - [`amqp10::Amqp10Publisher`]: AMQP 1.0 transfers, unsettled, on links to RabbitMQ 4.x's v2
//!   addresses (`/queues/{queue}` for the default exchange, `/exchanges/{exchange}/{key}`
//!   else), one link per address; `accepted` is a confirm, `released`, `rejected` and
//!   `modified` are failures with the broker's condition and description.
//!
//! A caller that switches from one publisher to another settles the first completely before
//! (`settle(0, ..)`), so the order of the messages holds across protocols.

pub mod amqp091;
pub mod amqp10;

use crate::broker::amqp::codec::EncodedProperties;
use crate::error::Result;
use std::time::Duration;

/// Where a message goes: the exchange (`""`: the default exchange, which routes by queue name)
/// and the routing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
}

/// A message as each protocol sends it.
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    /// AMQP 0-9-1: the content header's properties (encoded) and the body.
    Basic {
        properties: &'a EncodedProperties,
        body: &'a [u8],
    },
    /// AMQP 1.0: the message's encoded sections (message format 0), one transfer's payload.
    Amqp10(&'a [u8]),
}

impl Payload<'_> {
    /// The bytes counted as the message's size: the body (0-9-1) or the whole message (1.0).
    pub fn len(&self) -> usize {
        match self {
            Payload::Basic { body, .. } => body.len(),
            Payload::Amqp10(m) => m.len(),
        }
    }

    /// True for a payload of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the broker settled since the previous [`Publisher::settle`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Publishes the broker nacked (AMQP 0-9-1).
    pub nacked: u64,
    /// Publishes the broker refused otherwise, one line each saying why: a `basic.return`
    /// with its reply code and text, or an AMQP 1.0 outcome other than `accepted` with the
    /// broker's condition and description.
    pub refused: Vec<String>,
    /// Publishes from the oldest one still unsettled to the newest (0 when every publish is
    /// settled, and always without confirms): the publishes before them are the settled
    /// prefix, their failures reported with this answer or an earlier one.
    pub unsettled: u64,
}

impl Settled {
    /// Publishes that failed: nacked or refused.
    pub fn failed(&self) -> u64 {
        self.nacked + self.refused.len() as u64
    }
}

/// A publisher of one protocol on one connection to the target (module documentation).
pub trait Publisher {
    /// The protocol's name for messages: `AMQP 0-9-1` or `AMQP 1.0`.
    fn protocol(&self) -> &'static str;

    /// Publishes `payload` to `target`, not waiting for its confirm.
    ///
    /// Errors: a payload of the other protocol (`Error::Amqp`), the connection's or the
    /// channel's or link's failure, a refused link (a missing queue or exchange), a time-out
    /// waiting for credit (a resource alarm).
    fn publish(&mut self, target: Target<'_>, payload: Payload<'_>) -> Result<()>;

    /// Publishes not settled by the broker yet.
    fn outstanding(&self) -> u64;

    /// True when the broker confirms each publish (0-9-1 with `confirm.select`; AMQP 1.0
    /// always).
    fn confirms(&self) -> bool;

    /// Waits (at most `timeout`) until at most `max_outstanding` publishes are unsettled and
    /// reports what was settled since the previous call.
    ///
    /// Errors: a time-out (`Error::Connection`), the connection's or channel's failure.
    fn settle(&mut self, max_outstanding: u64, timeout: Duration) -> Result<Settled>;

    /// Why the broker blocks this publisher now (a resource alarm), when it says so.
    fn blocked(&self) -> Option<String> {
        None
    }

    /// How long a publish waits while the broker blocks it.
    fn blocked_timeout(&self) -> Duration;
}
