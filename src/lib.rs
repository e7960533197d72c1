//! rmq-backup: back up the queues and topology of a RabbitMQ broker (AMQP 0-9-1) to storage
//! and restore them byte for byte.
//!
//! Data flows one way: broker -> records -> segments -> storage, and back
//! (see DESIGN.md "Shape"). The source is laid out in two halves with the jobs between them:
//! - [`broker`]: the broker side: the AMQP 0-9-1 client, the stream protocol, the management
//!   API, TLS, the broker's version and nodes, queue selection, definitions, and the reader
//!   that reads a queue without taking a message away;
//! - [`repository`]: the repository side: records, segments, encryption, the spool, storage
//!   backends, the manifest and a sharded backup's parts, the run lock, fetching segments back,
//!   checkpoint databases;
//! - the jobs between them: [`backup`], [`restore`], [`copy`], [`inspect`] (list, describe,
//!   validate, cat), [`retention`] (forget);
//! - around them: [`config`] (the YAML file), [`metrics`] (metrics, health, their HTTP server),
//!   [`run`] (logging, progress, signals, units), [`cli`] (the command line), [`error`].
//!
//! ARCHITECTURE.md is the map.

/// Prints a line of a command's results to stdout (`println!` without its panic): a reader
/// that closed stdout early (`rmq-backup config schema | head`) loses the rest of the output,
/// and the command still ends with its own exit code.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => {
        $crate::run::write_stdout(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// [`out!`] without the line end (`print!` without its panic).
#[macro_export]
macro_rules! out_raw {
    ($($t:tt)*) => {
        $crate::run::write_stdout(format_args!($($t)*))
    };
}

pub mod backup;
pub mod broker;
pub mod cli;
pub mod config;
pub mod copy;
pub mod error;
pub mod inspect;
pub mod metrics;
pub mod repository;
pub mod restore;
pub mod retention;
pub mod run;

pub use error::{Error, Result};

/// The current time in epoch milliseconds (the unit of every timestamp in SPEC.md).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The cores this process may use (`std::thread::available_parallelism`, at least 1), read
/// once: on Linux each call reads the cgroup's CPU quota files and `sched_getaffinity`, and
/// asked once per segment it was ~6% of a backup's CPU for 5,000 small queues (perf,
/// 2026-11-29).
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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
