//! The in-tree RabbitMQ stream-protocol client (synchronous, over `std::net::TcpStream`) and
//! the decoding of what streams hold.
//!
//! - `protocol.rs`: command keys, response codes, frame fields (PROTOCOL.adoc).
//! - `client.rs`: [`StreamConnection`]: subscriptions with credit, publishers, metadata,
//!   offsets; `handshake.rs` logs in (PLAIN, tune, open); `reader.rs` is the connection's
//!   reader thread (dispatch, heartbeats, the broker's close).
//! - `offsets.rs`: where a stream ends (the header of its last chunk).
//! - `chunk.rs`: osiris chunks as `Deliver` carries them (CRC32 checked, sub-entry batches).
//! - `amqp10.rs`: AMQP 1.0 messages (the entries of a stream) into `BackupRecord`s.

pub mod amqp10;
pub mod chunk;
pub mod client;
mod handshake;
#[cfg(test)]
mod hostile_tests;
pub mod offsets;
pub mod protocol;
mod reader;

pub use client::{Publisher, StreamConnection, StreamOptions, Subscription};
pub use protocol::OffsetSpec;
#[doc(hidden)]
pub use reader::decode_received;
