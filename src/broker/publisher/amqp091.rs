//! [`BasicPublisher`]: the AMQP 0-9-1 [`Publisher`]: `basic.publish` with `mandatory` set on
//! a channel (in confirm mode when the caller selected it), so that a message the target
//! cannot route comes back (`basic.return`) and is counted as failed instead of vanishing.

use super::{Payload, Publisher, Settled, Target};
use crate::broker::amqp::Channel;
use crate::error::{Error, Result};
use std::time::Duration;

/// Publishes on a borrowed channel; confirms are the channel's (`Channel::confirm_select`).
pub struct BasicPublisher<'a> {
    channel: &'a Channel,
}

impl<'a> BasicPublisher<'a> {
    /// A publisher on `channel`.
    pub fn new(channel: &'a Channel) -> Self {
        BasicPublisher { channel }
    }
}

impl Publisher for BasicPublisher<'_> {
    fn protocol(&self) -> &'static str {
        "AMQP 0-9-1"
    }

    fn publish(&mut self, target: Target<'_>, payload: Payload<'_>) -> Result<()> {
        let Payload::Basic { properties, body } = payload else {
            return Err(Error::Amqp(
                "an AMQP 1.0 message cannot be published over AMQP 0-9-1".to_string(),
            ));
        };
        self.channel
            .basic_publish(target.exchange, target.routing_key, true, properties, body)
            .map(|_| ())
    }

    fn outstanding(&self) -> u64 {
        self.channel.outstanding_confirms()
    }

    fn confirms(&self) -> bool {
        self.channel.confirm_mode()
    }

    fn settle(&mut self, max_outstanding: u64, timeout: Duration) -> Result<Settled> {
        let status = self.channel.wait_for_confirms(max_outstanding, timeout)?;
        let refused = status
            .returned
            .iter()
            .map(|r| {
                format!(
                    "message returned by the target: {} {} (exchange '{}', routing key '{}')",
                    r.reply_code, r.reply_text, r.exchange, r.routing_key
                )
            })
            .collect();
        Ok(Settled {
            nacked: status.nacked.len() as u64,
            refused,
            unsettled: if self.confirms() { status.unsettled } else { 0 },
        })
    }

    fn blocked(&self) -> Option<String> {
        self.channel.connection_blocked()
    }

    fn blocked_timeout(&self) -> Duration {
        self.channel.blocked_timeout()
    }
}
