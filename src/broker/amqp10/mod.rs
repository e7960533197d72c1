//! AMQP 1.0 (OASIS AMQP 1.0): the type system's codec (`codec`), shared with the stream
//! client's message decoding (`crate::broker::stream::amqp10`), and an in-tree synchronous
//! AMQP 1.0 client for RabbitMQ 4.x: read a queue without taking its messages, publish
//! messages back with their outcomes.
//!
//! The client (part 2 "Transport", part 5 "Security"): one [`Connection`] over plain TCP or
//! TLS (`crate::broker::amqp::transport::Transport`), SASL PLAIN, `open` with the hostname
//! `vhost:NAME` (RabbitMQ's choice of vhost); [`Session`]s (`begin`/`end`, session flow
//! control); [`Receiver`] and [`Sender`] links (`attach`/`detach`, link credit, `transfer`s
//! split by the peer's max-frame-size and reassembled, `disposition`s). One reader thread per
//! connection reads every frame: it answers heartbeats (empty frames, both ways), hands a
//! receiver's deliveries to its bounded queue (when that queue is full the reader stops
//! reading the socket: TCP back-pressure, heartbeats still sent), a sender's outcomes to the
//! sender, and the broker's `close`/`end`/`detach` errors to everyone waiting. Writes go
//! through one mutex, from any thread.
//!
//! Every wait is bounded: the handshake by `connect_timeout + rpc_timeout`, each exchange
//! (begin, attach, detach, drain, end, close) by `rpc_timeout`, a send waiting for credit by
//! `blocked_timeout`, a silent broker by three times our idle-time-out. Errors:
//! `Connection error: Failed to connect to <masked url>: ...`, `Authentication error: AMQP
//! authentication failed for user <user>`, `Connection error: connection to <host:port> closed
//! by the broker: <condition>: <description>`, `Connection error: connection to <host:port>
//! lost: ...`, `AMQP error: ...` for a refused link, a link detached or a session ended by the
//! broker (with the broker's condition and description).
//!
//! Addresses are RabbitMQ 4.x's "v2" addresses ([`queue_address`], [`exchange_address`]).
//!
//! RabbitMQ as met by the tests (`tests/amqp10_client.rs`, 4.3.6 and 4.0.5): link credit is
//! a read window (nothing beyond it is sent; one receiver held 70,000 unsettled quorum
//! messages); a delivery's header and message annotations are the broker's (delivery counts,
//! `x-exchange`, `x-routing-key`), the bare message is byte for byte what was published;
//! quorum queues deliver messages of priority above 4 first; a refused link is an attach
//! with a null terminus and a detach on 4.3.6, an ended session on 4.0.5; an operator's
//! close is `amqp:internal-error` "Connection forced".
//!
//! Files: `frame` (protocol headers, frames, the frame reader), `performative` (the
//! performatives, delivery states, errors; `fields` reads their fields), `sasl`,
//! `connection` (options, the connection, its close), `handshake` (opening it), `reader`
//! (the reader thread), `session` (sessions and the state the reader shares), `receiver`,
//! `sender`, `address`.

pub mod address;
pub mod codec;
pub mod connection;
mod fields;
pub mod frame;
mod handshake;
pub mod message;
pub mod performative;
mod reader;
pub mod receiver;
pub mod sasl;
pub mod sender;
pub mod session;
#[cfg(test)]
mod tests;

pub use address::{exchange_address, queue_address};
pub use connection::{ConnectOptions, Connection};
pub use performative::{AmqpError, Outcome};
pub use receiver::{Delivery, Receiver};
pub use sender::{SendOutcome, Sender};
pub use session::Session;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}
