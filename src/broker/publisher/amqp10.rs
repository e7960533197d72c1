//! [`Amqp10Publisher`]: the AMQP 1.0 [`Publisher`] (RabbitMQ 4.x): one connection and one
//! session of the in-tree client (`crate::broker::amqp10`), one sending link per address,
//! every message sent unsettled. The broker settles each with its outcome: `accepted` once the
//! message is in every queue it was routed to (a publisher confirm), `released` when no queue
//! took it (RabbitMQ's answer to an unroutable message), `rejected` with an error (a queue at
//! its limit with `reject-publish`, a message it refused), `modified`; each but `accepted` is
//! a failure, reported with the broker's condition and description.
//!
//! Delivery ids are numbered by the session, one after another (part 2, 2.7.5), and this
//! publisher is its session's only sender, so the publishes are kept in order by delivery id
//! whatever link they went on: the settled prefix ends at the oldest unsettled one.

use super::{Payload, Publisher, Settled, Target};
use crate::broker::amqp10::{
    exchange_address, queue_address, ConnectOptions, Connection, Outcome, SendOutcome, Sender,
    Session,
};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Sending links kept open at once; past this many addresses every publish is settled and the
/// links detached (an exchange-mode restore of many routing keys).
const MAX_LINKS: usize = 64;

/// The AMQP 1.0 target address of `target`: `/queues/{routing key}` for the default exchange
/// (`""` or `amq.default`, which RabbitMQ refuses as an exchange address), else
/// `/exchanges/{exchange}/{routing key}`.
///
/// Errors: `Error::Amqp` for the default exchange with an empty routing key (no queue has an
/// empty name).
pub fn address_of(target: Target<'_>) -> Result<String> {
    if target.exchange.is_empty() || target.exchange == "amq.default" {
        queue_address(target.routing_key)
    } else {
        exchange_address(target.exchange, target.routing_key)
    }
}

/// One publish not settled, or settled while an older one is not.
struct Pending {
    link: usize,
    settled: bool,
}

/// Publishes AMQP 1.0 messages on a connection of its own (module documentation).
pub struct Amqp10Publisher {
    // Dropped in this order: links, session, connection.
    links: Vec<(String, Sender)>,
    session: Option<Session>,
    conn: Option<Connection>,
    /// The publishes from the oldest unsettled one on, in delivery-id order.
    pending: VecDeque<Pending>,
    /// The delivery id of `pending[0]`.
    front_id: u32,
    outstanding: u64,
    refused: Vec<String>,
    blocked_timeout: Duration,
}

impl Amqp10Publisher {
    /// Opens a connection with `options` (its URL gives host, credentials and vhost; its TLS
    /// settings and `blocked_timeout` apply) and a session.
    ///
    /// Errors: the connection's (`Connection error`, `Authentication error`) or the session's.
    pub fn open(options: &ConnectOptions) -> Result<Amqp10Publisher> {
        let conn = Connection::open(options)?;
        let session = conn.session()?;
        Ok(Amqp10Publisher {
            links: Vec::new(),
            session: Some(session),
            conn: Some(conn),
            pending: VecDeque::new(),
            front_id: 0,
            outstanding: 0,
            refused: Vec::new(),
            blocked_timeout: options.blocked_timeout,
        })
    }

    /// The link to `address`, attached when there is none yet.
    fn link(&mut self, address: &str) -> Result<usize> {
        if let Some(i) = self.links.iter().position(|(a, _)| a == address) {
            return Ok(i);
        }
        if self.links.len() >= MAX_LINKS {
            self.settle(0, self.blocked_timeout + Duration::from_secs(120))
                // Kept for the caller's next settle.
                .map(|s| self.refused.extend(s.refused))?;
            for (_, sender) in self.links.drain(..) {
                sender.detach()?;
            }
        }
        let session = self
            .session
            .as_ref()
            .ok_or_else(|| Error::Amqp("the AMQP 1.0 publisher is closed".to_string()))?;
        let sender = session.sender(address)?;
        self.links.push((address.to_string(), sender));
        Ok(self.links.len() - 1)
    }

    /// Marks the outcomes of link `link` in `pending`.
    fn mark(&mut self, link: usize, outcomes: Vec<SendOutcome>) -> Result<()> {
        for o in outcomes {
            let index = o.delivery_id.wrapping_sub(self.front_id) as usize;
            let Some(p) = self.pending.get_mut(index).filter(|p| !p.settled) else {
                return Err(Error::Amqp(format!(
                    "the broker settled delivery {} on {}, which is not waiting for an outcome",
                    o.delivery_id, self.links[link].0
                )));
            };
            p.settled = true;
            self.outstanding -= 1;
            let address = &self.links[link].0;
            let reason = match o.outcome {
                Outcome::Accepted => continue,
                Outcome::Released => {
                    format!("message released by the target (no queue took it) at {address}")
                }
                Outcome::Rejected(Some(e)) => {
                    format!("message rejected by the target at {address}: {e}")
                }
                Outcome::Rejected(None) => format!("message rejected by the target at {address}"),
                Outcome::Modified {
                    delivery_failed,
                    undeliverable_here,
                    ..
                } => format!(
                    "message modified by the target at {address} (delivery-failed {delivery_failed}, undeliverable-here {undeliverable_here})"
                ),
            };
            self.refused.push(reason);
        }
        while self.pending.front().is_some_and(|p| p.settled) {
            self.pending.pop_front();
            self.front_id = self.front_id.wrapping_add(1);
        }
        Ok(())
    }

    /// Takes the outcomes every link has received.
    fn collect(&mut self) -> Result<()> {
        for i in 0..self.links.len() {
            let got = self.links[i].1.take_outcomes();
            self.mark(i, got)?;
        }
        Ok(())
    }

    /// Detaches the links, ends the session and closes the connection.
    ///
    /// Errors: the connection's failure, or a time-out of the broker's close.
    pub fn close(mut self) -> Result<()> {
        self.links.clear();
        if let Some(s) = self.session.take() {
            if let Err(e) = s.end() {
                log::debug!("ending the AMQP 1.0 publishing session: {e}");
            }
        }
        match self.conn.take() {
            Some(c) => c.close(),
            None => Ok(()),
        }
    }
}

impl Publisher for Amqp10Publisher {
    fn protocol(&self) -> &'static str {
        "AMQP 1.0"
    }

    fn publish(&mut self, target: Target<'_>, payload: Payload<'_>) -> Result<()> {
        let Payload::Amqp10(message) = payload else {
            return Err(Error::Amqp(
                "an AMQP 0-9-1 message cannot be published over AMQP 1.0".to_string(),
            ));
        };
        let address = address_of(target)?;
        let link = self.link(&address)?;
        let id = self.links[link].1.send(message)?;
        if self.pending.is_empty() {
            self.front_id = id;
        }
        if id.wrapping_sub(self.front_id) as usize != self.pending.len() {
            return Err(Error::Amqp(format!(
                "delivery id {id} on {address} is out of order (expected {})",
                self.front_id.wrapping_add(self.pending.len() as u32)
            )));
        }
        self.pending.push_back(Pending {
            link,
            settled: false,
        });
        self.outstanding += 1;
        Ok(())
    }

    fn outstanding(&self) -> u64 {
        self.outstanding
    }

    fn confirms(&self) -> bool {
        true
    }

    fn settle(&mut self, max_outstanding: u64, timeout: Duration) -> Result<Settled> {
        let deadline = Instant::now() + timeout;
        self.collect()?;
        while self.outstanding > max_outstanding {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Connection(format!(
                    "timed out after {} s waiting for the broker to settle AMQP 1.0 messages: {} unsettled, waiting for at most {max_outstanding}",
                    timeout.as_secs(),
                    self.outstanding
                )));
            }
            // The oldest unsettled publish's link; the others are taken after it.
            let link = self
                .pending
                .iter()
                .find(|p| !p.settled)
                .map_or(0, |p| p.link);
            let slice = (deadline - now).min(Duration::from_millis(200));
            let got = self.links[link].1.wait_outcomes(slice)?;
            self.mark(link, got)?;
            self.collect()?;
        }
        Ok(Settled {
            nacked: 0,
            refused: std::mem::take(&mut self.refused),
            unsettled: self.pending.len() as u64,
        })
    }

    fn blocked_timeout(&self) -> Duration {
        self.blocked_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_default_exchange_rule() {
        let t = |exchange, routing_key| Target {
            exchange,
            routing_key,
        };
        assert_eq!(address_of(t("", "q 1")).unwrap(), "/queues/q%201");
        assert_eq!(address_of(t("amq.default", "q")).unwrap(), "/queues/q");
        assert_eq!(
            address_of(t("ex/1", "a.b")).unwrap(),
            "/exchanges/ex%2F1/a.b"
        );
        assert_eq!(address_of(t("ex", "")).unwrap(), "/exchanges/ex/");
        assert!(address_of(t("", "")).is_err());
    }
}
