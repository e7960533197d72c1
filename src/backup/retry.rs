//! A queue's read started again after its connection was lost: closed by an operator
//! (`CONNECTION_FORCED`) or by the broker, a broker restart, a network stall the heartbeat
//! caught, the management API down. The broker has every message of a lost connection back,
//! so each attempt reads the queue (or stream) from its head into new segments, numbered after
//! every segment of the earlier attempts (those are not listed, and are removed once the
//! backup completes). At most `backup.connection_retries` retries, waiting
//! `backup.connection_retry_backoff_ms`, doubling, at most [`MAX_BACKOFF`], between them;
//! counted in `broker_backup_queue_retries`.
//!
//! Not retried: what a new connection would meet again (a missing queue, refused access, a
//! protocol error, storage failures, which the storage retries itself), and every stop the run
//! asked for (a signal, a lost run lock, a memory alarm on the source, a broker that blocked
//! a connection).

use super::context::QueueContext;
use crate::broker::management::QueueInfo;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// True for the errors of a lost connection (see the module documentation).
pub(super) fn lost_connection(e: &Error) -> bool {
    match e {
        Error::Connection(_) => true,
        Error::Management(m) => m.starts_with("error sending request") || m.starts_with("HTTP 5"),
        Error::Amqp(m) | Error::Stream(m) => {
            m.contains("CONNECTION_FORCED") || m.contains("connection closed")
        }
        _ => false,
    }
}

/// Why the run stops, when it does: a retry would only be stopped again.
fn stopping(ctx: &QueueContext) -> Option<String> {
    ctx.read
        .lock
        .lost()
        .or_else(|| crate::run::signals::stop_reason("backup"))
        .or_else(|| ctx.read.stop.reason())
}

/// The wait before retry `n` (1, 2, ...): `base`, doubling, at most [`MAX_BACKOFF`].
pub(super) fn backoff(base: Duration, n: u32) -> Duration {
    base.saturating_mul(1u32 << (n - 1).min(16))
        .min(MAX_BACKOFF)
}

/// Runs `attempt` for `q` until it succeeds, fails with an error that is no lost connection,
/// the run stops, or the retries are used up; returns its last result.
pub(super) fn with_retries<T>(
    ctx: &QueueContext,
    q: &QueueInfo,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    let retries = ctx.read.opts.connection_retries;
    let base = Duration::from_millis(ctx.read.opts.connection_retry_backoff_ms);
    let mut n = 0u32;
    loop {
        let result = attempt();
        let e = match result {
            Err(e) if lost_connection(&e) && n < retries && stopping(ctx).is_none() => e,
            other => return other,
        };
        n += 1;
        let wait = backoff(base, n);
        log::warn!(
            "queue {} in vhost {}: {e}; reading it again from its head in {:.1} s (retry {n} of {retries})",
            q.name,
            q.vhost,
            wait.as_secs_f64()
        );
        let kind = q.queue_type.map_or(q.type_name.as_str(), |t| t.as_str());
        crate::metrics::global()
            .queue_retries
            .with([&q.name, &q.vhost, kind])
            .inc();
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if let Some(why) = stopping(ctx) {
                return Err(Error::Io(why));
            }
            std::thread::sleep(Duration::from_millis(100).min(wait));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_connections_are_retried_and_nothing_else() {
        for e in [
            Error::Connection("connection reset by peer".into()),
            Error::Connection("connection to h:5672 lost: missed heartbeats".into()),
            Error::Amqp("CONNECTION_FORCED - Closed via management plugin".into()),
            Error::Management("error sending request for url http://h:15672/api/queues".into()),
            Error::Management("HTTP 503 for GET /api/queues/v/q".into()),
            Error::Stream("stream connection closed by the broker".into()),
        ] {
            assert!(lost_connection(&e), "{e}");
        }
        for e in [
            Error::Amqp("NOT_FOUND - no queue 'q' in vhost 'v'".into()),
            Error::Amqp(
                "ACCESS_REFUSED - queue 'q' in vhost 'v' owned by another connection".into(),
            ),
            Error::Management("HTTP 401 for GET /api/queues".into()),
            Error::Storage("Failed to write k: 403 Forbidden".into()),
            Error::Serialization("CRC32 mismatch".into()),
            Error::Authentication("AMQP authentication failed for user u".into()),
        ] {
            assert!(!lost_connection(&e), "{e}");
        }
    }

    #[test]
    fn the_wait_doubles_up_to_its_limit() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(1), 1), s(1));
        assert_eq!(backoff(s(1), 2), s(2));
        assert_eq!(backoff(s(1), 5), s(16));
        assert_eq!(backoff(s(1), 6), MAX_BACKOFF);
        assert_eq!(backoff(s(1), 40), MAX_BACKOFF);
    }
}
