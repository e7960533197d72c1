//! RabbitMQ 4.x AMQP 1.0 addresses, version 2 (RabbitMQ's `rabbitmq_amqp_address` and
//! `rabbit_amqp_session`): `/queues/:queue` for a source or a target, `/exchanges/:exchange`
//! and `/exchanges/:exchange/:routing-key` for a target. Every name is percent-encoded as
//! Erlang's `uri_string:quote/1` does it: every byte of its UTF-8 encoding except the RFC 3986
//! unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`, so a `/` in a name cannot be
//! read as a separator.

use crate::error::{Error, Result};

/// `name` percent-encoded (see the module documentation).
pub fn quote(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `/queues/<queue>`: the address of a queue, to receive from it or to send to it (through
/// the default exchange).
///
/// Errors: `Error::Amqp` for an empty name (RabbitMQ refuses `/queues/`).
pub fn queue_address(queue: &str) -> Result<String> {
    if queue.is_empty() {
        return Err(Error::Amqp(
            "a queue with an empty name has no AMQP 1.0 address".to_string(),
        ));
    }
    Ok(format!("/queues/{}", quote(queue)))
}

/// `/exchanges/<exchange>/<routing key>`: the address to publish to `exchange` with
/// `routing_key` (an empty key gives `/exchanges/<exchange>/`, the empty routing key).
///
/// Errors: `Error::Amqp` for the default exchange (`""` or `amq.default`), which RabbitMQ
/// refuses as an exchange address: publish to [`queue_address`] instead.
pub fn exchange_address(exchange: &str, routing_key: &str) -> Result<String> {
    if exchange.is_empty() || exchange == "amq.default" {
        return Err(Error::Amqp(
            "the default exchange has no AMQP 1.0 address: send to /queues/<name>".to_string(),
        ));
    }
    Ok(format!(
        "/exchanges/{}/{}",
        quote(exchange),
        quote(routing_key)
    ))
}
