//! rmq-backup: back up the queues and topology of a RabbitMQ broker (AMQP 0-9-1) to storage
//! and restore them byte for byte.
//!
//! Data flows one way: broker -> records -> segments -> storage, and back
//! (see DESIGN.md "Shape"). One module per concept:
//! - [`config`], [`selection`]: the YAML schema of SPEC.md and the queue selection rules;
//! - [`amqp`]: the synchronous AMQP 0-9-1 client; [`management`]: the management HTTP API;
//! - [`reader`]: reading a queue without losing it (the requeue strategies);
//! - [`record`], [`segment`], [`manifest`]: the backup format; [`storage`]: where it is kept;
//! - [`checkpoint`]: the checkpoint databases of resumable runs; [`lock`]: a running backup's
//!   heartbeat;
//! - [`backup`], [`restore`], [`definitions`], [`inspect`]: the jobs; [`signals`]: graceful stop;
//!   [`cli`]: the command line;
//! - [`metrics`]: the metrics, health and their HTTP server; [`progress`]: progress on a
//!   terminal; [`units`]: numbers for people.
//!
//! ARCHITECTURE.md is the map.

pub mod amqp;
pub mod backup;
pub mod broker;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod copy;
pub mod definitions;
pub mod encryption;
pub mod error;
pub mod fetch;
pub mod inspect;
pub mod lock;
pub mod logging;
pub mod management;
pub mod manifest;
pub mod metrics;
pub mod nodes;
pub mod progress;
pub mod reader;
pub mod record;
pub mod restore;
pub mod retention;
pub mod segment;
pub mod selection;
pub mod shard;
pub mod signals;
pub mod spool;
pub mod storage;
pub mod stream;
pub mod tls;
pub mod units;

pub use error::{Error, Result};

/// The current time in epoch milliseconds (the unit of every timestamp in SPEC.md).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Makes ring the process-wide rustls crypto provider; idempotent, call before any TLS
/// connection. Both ring (through ureq) and aws-lc-rs (through attohttpc's rustls feature,
/// see Cargo.toml) are compiled in, and with two providers rustls cannot choose one itself: the
/// first TLS handshake would panic (ENVIRONMENT.md "Crates").
pub fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error means another provider was installed first, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
