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
//! protocol error, storage failures, which the storage retries itself), the broker's failed
//! conversion of a message to the protocol of the read ([`failed_conversion`]: the same
//! message fails the same way, and each attempt returns what it held with one more delivery
//! count), and every stop the run asked for (a signal, a lost run lock, a memory alarm on the
//! source, a broker that blocked a connection).

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

/// The protocol a message could not be converted to when `e` is the broker's failed
/// conversion, as RabbitMQ 4.x reports it (docs/amqp-1-0.md, "Reader disconnected"; measured
/// on 4.3.6 and 4.0.5): a 0-9-1 read's connection closed with a bare `INTERNAL_ERROR` (541,
/// `mc_amqpl:to_091` has no clause for an AMQP 1.0 message's `char` or `uuid`
/// application-property, nor, before 4.3, for its decimals), an AMQP 1.0 read's with
/// `amqp:internal-error` "Session error: function_clause" (`mc_amqpl:from_091` has none for a
/// 0-9-1 message's decimal header).
pub(super) fn failed_conversion(e: &Error) -> Option<&'static str> {
    let Error::Connection(m) = e else {
        return None;
    };
    if m.ends_with("closed by broker: INTERNAL_ERROR") {
        Some("AMQP 0-9-1")
    } else if m.contains("amqp:internal-error: Session error: function_clause") {
        Some("AMQP 1.0")
    } else {
        None
    }
}

/// The error of a read of `q` that ended on the broker's failed conversion (`e`, to
/// `protocol`): what happened, what it cost, what to do. Only the first line of the
/// broker's reason is kept (an AMQP 1.0 close carries the Erlang stack trace).
fn conversion_error(q: &QueueInfo, protocol: &str, e: &Error) -> Error {
    let reason = e.to_string();
    let reason = reason.lines().next().unwrap_or_default();
    let remedy = if protocol == "AMQP 0-9-1" {
        "RabbitMQ 4.x does so when it cannot convert a message published over AMQP 1.0 to AMQP 0-9-1 (an application-property of type char or uuid; before 4.3 also decimal32, decimal64, decimal128): name the queue in backup.amqp10_queues to read it over AMQP 1.0"
    } else {
        "RabbitMQ 4.x does so when it cannot convert a message published over AMQP 0-9-1 to AMQP 1.0 (a header of type decimal): the queue holds messages of both protocols; read over AMQP 0-9-1 (out of backup.amqp10_queues), its AMQP 1.0 messages keep only what the book's table \"AMQP 1.0 published, read over each protocol\" says"
    };
    let cost = if q.queue_type == Some(crate::broker::QueueType::Quorum) {
        "every message the read held went back with one more delivery count"
    } else {
        "every message the read held went back"
    };
    Error::Connection(format!(
        "queue {} in vhost {}: the broker closed the connection of its {protocol} read ({}); {remedy}. Not read again in this run: {cost}, and every attempt would meet the same message",
        q.name,
        q.vhost,
        reason.strip_prefix("Connection error: ").unwrap_or(reason)
    ))
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
            Err(e) => match failed_conversion(&e) {
                Some(protocol) => return Err(conversion_error(q, protocol, &e)),
                None if lost_connection(&e) && n < retries && stopping(ctx).is_none() => e,
                None => return Err(e),
            },
            ok => return ok,
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
    fn failed_conversions_are_told_apart_from_other_losses() {
        let amqp10 = Error::Connection(
            "connection to 127.0.0.1:5692 closed by the broker: amqp:internal-error: Session error: function_clause\n[{mc_amqpl,from_091,[decimal,{2,125}],...}]".into(),
        );
        let amqp091 = Error::Connection("connection closed by broker: INTERNAL_ERROR".into());
        assert_eq!(failed_conversion(&amqp091), Some("AMQP 0-9-1"));
        assert_eq!(failed_conversion(&amqp10), Some("AMQP 1.0"));
        for e in [
            Error::Connection("connection closed by broker: CONNECTION_FORCED - Closed via management plugin".into()),
            Error::Connection("connection closed by broker: INTERNAL_ERROR - transient_nonexcl_queues is deprecated".into()),
            Error::Connection("connection to h:5692 closed by the broker: amqp:internal-error: Connection forced".into()),
            Error::Amqp("INTERNAL_ERROR".into()),
        ] {
            assert_eq!(failed_conversion(&e), None, "{e}");
        }
        let q = QueueInfo {
            name: "q1".into(),
            vhost: "v1".into(),
            queue_type: Some(crate::broker::QueueType::Quorum),
            ..QueueInfo::default()
        };
        let e = conversion_error(&q, "AMQP 1.0", &amqp10).to_string();
        assert!(
            e.starts_with("Connection error: queue q1 in vhost v1: the broker closed the connection of its AMQP 1.0 read (connection to 127.0.0.1:5692 closed by the broker: amqp:internal-error: Session error: function_clause); RabbitMQ 4.x does so when it cannot convert a message published over AMQP 0-9-1"),
            "{e}"
        );
        assert!(
            !e.contains("mc_amqpl") && e.contains("one more delivery count"),
            "{e}"
        );
        let e = conversion_error(&q, "AMQP 0-9-1", &amqp091).to_string();
        assert!(e.contains("(connection closed by broker: INTERNAL_ERROR); RabbitMQ 4.x does so when it cannot convert a message published over AMQP 1.0 to AMQP 0-9-1") && e.contains("name the queue in backup.amqp10_queues"), "{e}");
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
