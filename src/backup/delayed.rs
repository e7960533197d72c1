//! Messages of a RabbitMQ 4.3 quorum queue that wait for a delayed retry (issue 37, item 6;
//! docs/reading-queues.md "Delayed retries").
//!
//! A quorum queue with `delayed-retry-type` (or a message given back over AMQP 1.0 with
//! `x-opt-delivery-time`) holds some returned messages back for a while. Measured on 4.3.6:
//! while a message waits, no consumer (AMQP 0-9-1 or 1.0) and no `basic.get` is given it,
//! `queue.declare-ok` does not count it, and the management API counts it in `messages` and in
//! `messages_delayed`, with `last_delayed_at` the time the last one is due. A backup that read
//! the queue then would complete without them. So before a quorum queue's read, a backup
//! waits for them when they are due within [`WAIT`], and otherwise reads the rest and reports
//! them left out (exit 4), with their count and when they are due.

use super::context::QueueContext;
use crate::broker::management::QueueInfo;
use crate::error::Result;
use crate::now_ms;
use std::time::{Duration, Instant};

/// The longest a backup waits for delayed messages to come due, from the moment it looks.
pub const WAIT: Duration = Duration::from_secs(120);

/// How long past their due time the management API may still count them (its statistics lag
/// 5-10 s behind the queue, measured on 4.3.6).
const LAG: Duration = Duration::from_secs(30);

/// Waits, if it can, until the delayed messages of `q` (the queue as the management API showed
/// it a moment ago) are ready. Returns the queue as the API shows it then, and the messages
/// still delayed with the reason they are left out of this backup (`None`: none).
///
/// Errors: the management API's.
pub(super) fn wait(ctx: &QueueContext, q: QueueInfo) -> Result<(QueueInfo, Option<(u64, String)>)> {
    if q.messages_delayed == 0 {
        return Ok((q, None));
    }
    let started = Instant::now();
    let due_in = |q: &QueueInfo| {
        q.delayed_until
            .map(|t| Duration::from_millis(u64::try_from(t - now_ms()).unwrap_or(0)))
    };
    let Some(first_due) = due_in(&q).filter(|d| *d <= WAIT) else {
        return Ok(left_out(q));
    };
    log::info!(
        "queue {} in vhost {}: {} message(s) wait for a delayed retry, due in {:.1} s: waiting for them (no consumer is given them before)",
        q.name,
        q.vhost,
        q.messages_delayed,
        first_due.as_secs_f64()
    );
    let deadline = started + first_due + LAG;
    let mut now = q;
    loop {
        std::thread::sleep(
            due_in(&now)
                .unwrap_or_default()
                .clamp(Duration::from_millis(500), Duration::from_secs(5)),
        );
        now = ctx.read.mgmt.get_queue(&now.vhost, &now.name)?;
        if now.messages_delayed == 0 {
            log::info!(
                "queue {} in vhost {}: the delayed messages are ready after {:.1} s; reading",
                now.name,
                now.vhost,
                started.elapsed().as_secs_f64()
            );
            return Ok((now, None));
        }
        if Instant::now() >= deadline || due_in(&now).is_some_and(|d| d > WAIT) {
            return Ok(left_out(now));
        }
    }
}

fn left_out(q: QueueInfo) -> (QueueInfo, Option<(u64, String)>) {
    let due = q.delayed_until.map_or_else(
        || "a time the broker does not report".to_string(),
        crate::run::units::rfc3339_ms,
    );
    let why = format!(
        "{} message(s) wait for a delayed retry until {due} (RabbitMQ 4.3 gives them to no consumer before; a backup waits at most {} s): they are not in this backup",
        q.messages_delayed,
        WAIT.as_secs()
    );
    let n = q.messages_delayed;
    (q, Some((n, why)))
}
