//! Messages a queue holds unacknowledged when its read starts.
//!
//! The depth a read sets out to hold is the ready count of `queue.declare-ok`, which leaves out
//! every message delivered to a consumer (or a `basic.get`) and not settled. Two very different
//! holders exist:
//! - **a run that is gone or giving them back**: an earlier run of a backup killed a moment ago
//!   (the broker has not yet noticed its closed socket, or, for a quorum queue, not yet put
//!   30,000 returns back), a connection closed by its client, a consumer just cancelled. The
//!   broker returns these by itself, so the read waits, bounded and logged, until they are ready;
//! - **a live consumer of another application**: a backup cannot take its messages without
//!   taking them from it. They are named in the summary, the log and
//!   `broker_backup_messages_left_out`, and the run exits 4 (`crate::cli::EXIT_SKIPPED`).
//!
//! Every connection rmq-backup opens has a name starting `rmq-backup <backup_id> `
//! (`super::conns`), which is how the management API's consumer list tells one from the other.
//! The API's counts lag the broker by up to its statistics interval, so a count is taken as the
//! larger of what the API says is unacknowledged and what it counts in all beyond the broker's
//! live ready count. A queue declared less than a statistics interval ago has no counts at
//! all: when an earlier run of this backup may still hold messages (`super::earlier_run`),
//! its read waits until they are there, and closes that run's connections while it waits.
//! (A quorum queue of 5,000 messages, declared, read by a run and that run stopped, all within
//! 5 s: its rerun saw 0 ready, no consumer, and no statistics, and backed up 0 of 5,000.)

use super::QueueContext;
use crate::amqp::Channel;
use crate::error::{Error, Result};
use crate::management::{ConsumerInfo, QueueInfo};
use std::time::{Duration, Instant};

/// How often the counts are read again while waiting.
const POLL: Duration = Duration::from_millis(250);

/// The management API's statistics lag the broker by up to its statistics interval (5 s by
/// default): a wait for returned messages allows that much on top of the broker's own time.
const STATISTICS_LAG: Duration = Duration::from_secs(10);

/// How long live consumers the management API does not list yet are given to appear there
/// before they are taken as another application's.
const UNLISTED_GRACE: Duration = Duration::from_secs(6);

/// What a queue held unacknowledged when its read started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AtStart {
    /// Messages unacknowledged when the read was about to start, before any wait.
    pub unacknowledged: u64,
    /// Messages that this backup leaves out (held by another application's live consumer, or
    /// never returned within the wait), and why.
    pub left_out: Option<(u64, String)>,
    /// Ready messages at the last look, right before the read: its depth.
    pub ready: u64,
}

/// Who holds a queue's unacknowledged messages, from the management API's consumer list.
#[derive(Debug, Default)]
struct Holders<'a> {
    /// Consumers on connections of rmq-backup (an earlier run of this backup, or another
    /// backup): they give every message back.
    backups: Vec<&'a ConsumerInfo>,
    /// Consumers of other applications that hold messages (acknowledgement mode).
    foreign: Vec<&'a ConsumerInfo>,
}

fn holders(consumers: &[ConsumerInfo]) -> Holders<'_> {
    let mut h = Holders::default();
    for c in consumers.iter().filter(|c| c.ack_required) {
        let ours = c
            .connection_name
            .as_deref()
            .is_some_and(|n| n.starts_with("rmq-backup "));
        if ours {
            h.backups.push(c);
        } else {
            h.foreign.push(c);
        }
    }
    h
}

/// Names of consumers' connections, for messages (`billing (tag ctag-1), ...`).
fn describe(consumers: &[&ConsumerInfo]) -> String {
    consumers
        .iter()
        .map(|c| {
            format!(
                "{} (consumer tag {})",
                c.connection_name.as_deref().unwrap_or(&c.connection),
                c.consumer_tag
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Looks at the messages `q` holds unacknowledged before its read starts; waits while the
/// broker is giving back those of a run that is gone (see the module documentation).
///
/// The live counts of `queue.declare-ok` (on `control`, a channel of the queue's connection)
/// lead: a consumer of a killed run stays registered until the broker has processed its closed
/// socket, and its removal and the return of its messages are one step of the queue. The
/// management API names the consumers (and counts what they hold) once its statistics caught
/// up; live consumers it does not list yet are given [`UNLISTED_GRACE`] to appear.
///
/// Errors: the passive declare's (`NOT_FOUND - no queue ...`), the management API's, or
/// `Error::Io` when the run is asked to stop while it waits.
pub(super) fn settle(ctx: &QueueContext, control: &Channel, q: &QueueInfo) -> Result<AtStart> {
    let started = Instant::now();
    let mut at_start: Option<u64> = None;
    let mut first_ready: Option<u64> = None;
    let mut waiting: Option<String> = None;
    loop {
        let ok = control.queue_declare_passive(&q.name)?;
        let (ready, live_consumers) = (u64::from(ok.message_count), ok.consumer_count);
        let ready_before = *first_ready.get_or_insert(ready);
        // The common case costs no request: no consumer now, and the listing's statistics
        // count nothing unacknowledged or beyond what is ready.
        if waiting.is_none()
            && live_consumers == 0
            && q.unacknowledged == 0
            && q.messages <= ready
            && (q.statistics || !ctx.earlier_run.seen())
        {
            return Ok(AtStart {
                ready,
                ..AtStart::default()
            });
        }
        let api = ctx.mgmt.queue_holders(&q.vhost, &q.name)?;
        let unacked = api.unacknowledged.max(api.messages.saturating_sub(ready));
        let first = *at_start.get_or_insert(unacked);
        let h = holders(&api.consumers);
        let unlisted = live_consumers > api.consumers.len() as u32;
        let no_statistics = !api.statistics && ctx.earlier_run.seen();
        let wait_for = if no_statistics && started.elapsed() < STATISTICS_LAG {
            Some("no message statistics yet for the queue (declared a moment ago) while an earlier run of this backup may hold its messages".to_string())
        } else if unlisted && started.elapsed() < UNLISTED_GRACE {
            Some(format!(
                "{live_consumers} consumer(s) on the queue, not all listed by the management API yet"
            ))
        } else if live_consumers > 0 && !h.backups.is_empty() {
            // Whatever the statistics count: they may not count a run's messages yet (a queue
            // declared seconds ago has no statistics at all), and a backup consumer holds what
            // it was delivered until its connection is gone.
            let count = if unacked > 0 {
                format!("{unacked} message(s)")
            } else {
                "messages (not counted by the management API yet)".to_string()
            };
            Some(format!(
                "{count} unacknowledged at start, held by a backup run that is gone or giving them back ({})",
                describe(&h.backups)
            ))
        } else if unacked == 0 {
            None
        } else if !h.backups.is_empty() {
            Some(format!(
                "{unacked} message(s) unacknowledged at start, held by a backup run that is gone or giving them back ({})",
                describe(&h.backups)
            ))
        } else if live_consumers == 0 && ctx.earlier_run.seen() {
            Some(format!(
                "{unacked} message(s) unacknowledged at start, held by a backup run that is gone or giving them back (an earlier run of this backup)"
            ))
        } else if live_consumers == 0 {
            Some(format!(
                "{unacked} message(s) unacknowledged at start, held by no live consumer (a connection closed a moment ago)"
            ))
        } else {
            // Live consumers of another application hold them.
            let count = if api.unacknowledged > 0 {
                api.unacknowledged
            } else {
                unacked
            };
            let who = if h.foreign.is_empty() {
                format!("{live_consumers} consumer(s) the management API does not list")
            } else {
                describe(&h.foreign)
            };
            let why = format!(
                "{count} message(s) unacknowledged by a live consumer of another application when the backup started ({who}): a backup cannot take them without taking them from it"
            );
            log::warn!("queue {} in vhost {}: {why}", q.name, q.vhost);
            return Ok(AtStart {
                unacknowledged: first.max(count),
                left_out: Some((count, why)),
                ready,
            });
        };
        let Some(why) = wait_for else {
            if waiting.is_some() {
                log::info!(
                    "queue {} in vhost {}: {ready} message(s) ready after waiting {:.1} s; reading",
                    q.name,
                    q.vhost,
                    started.elapsed().as_secs_f64()
                );
            }
            // What came back while this run waited was unacknowledged at its start too.
            return Ok(AtStart {
                unacknowledged: first.max(ready.saturating_sub(ready_before)),
                left_out: None,
                ready,
            });
        };
        let limit = crate::reader::return_wait(unacked) + STATISTICS_LAG;
        if waiting.as_deref() != Some(why.as_str()) {
            log::info!(
                "queue {} in vhost {}: {why}; waiting up to {} s for the broker",
                q.name,
                q.vhost,
                limit.as_secs()
            );
            waiting = Some(why.clone());
        }
        if started.elapsed() > limit {
            let why = format!(
                "{unacked} message(s) unacknowledged at start were not returned to the queue within {} s ({ready} ready): they are not in this backup",
                limit.as_secs()
            );
            log::warn!("queue {} in vhost {}: {why}", q.name, q.vhost);
            return Ok(AtStart {
                unacknowledged: first,
                left_out: Some((unacked, why)),
                ready,
            });
        }
        ctx.earlier_run.close_listed(ctx.mgmt);
        if let Some(why) = ctx
            .lock
            .lost()
            .or_else(|| crate::signals::stop_reason("backup"))
        {
            return Err(Error::Io(why));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(tag: &str, name: Option<&str>, ack_required: bool) -> ConsumerInfo {
        ConsumerInfo {
            consumer_tag: tag.into(),
            connection: format!("127.0.0.1:5{tag} -> 127.0.0.1:5672"),
            connection_name: name.map(str::to_string),
            prefetch_count: 500,
            ack_required,
        }
    }

    #[test]
    fn consumers_are_told_apart_by_their_connection_name() {
        let all = [
            consumer("1", Some("rmq-backup nightly v/q"), true),
            consumer("2", Some("rmq-backup other-id v/q"), true),
            consumer("3", Some("billing"), true),
            consumer("4", None, true),
            consumer("5", Some("metrics"), false),
            consumer("6", Some("rmq-backupish"), true),
        ];
        let h = holders(&all);
        let tags =
            |v: &[&ConsumerInfo]| v.iter().map(|c| c.consumer_tag.clone()).collect::<Vec<_>>();
        assert_eq!(tags(&h.backups), ["1", "2"], "any backup run gives back");
        assert_eq!(
            tags(&h.foreign),
            ["3", "4", "6"],
            "auto-ack consumers hold nothing"
        );
        assert_eq!(
            describe(&h.foreign[..2]),
            "billing (consumer tag 3), 127.0.0.1:54 -> 127.0.0.1:5672 (consumer tag 4)"
        );
    }
}
