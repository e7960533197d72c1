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
//! The live counts of `queue.declare-ok` lead ([`Live`]): while no consumer is on the queue and
//! its ready count covers every message the broker counted at the start (the listing's, or the
//! management API's when it was asked), nothing is missing and the read starts at once, however
//! stale the statistics. Only a count that is short makes the run ask the management API who
//! holds what, and wait, following the live count, until the messages are back.
//!
//! Every connection rmq-backup opens has a name starting `rmq-backup <backup_id> `
//! (`super::conns`) and every consumer a tag starting `rmq-backup-<pid>-`
//! (`crate::broker::reader`), which is how the management API's consumer list tells one from the other
//! (the tag also when the API does not list a killed run's connection any more, or not yet).
//! The API's counts lag the broker by up to its statistics interval, so a count is taken as the
//! larger of what the API says is unacknowledged and what it counts in all beyond the broker's
//! live ready count. A queue declared less than a statistics interval ago has no counts at
//! all: when an earlier run of this backup may still hold messages (`super::earlier_run`),
//! its read waits until they are there, and closes that run's connections while it waits.
//! (A quorum queue of 5,000 messages, declared, read by a run and that run stopped, all within
//! 5 s: its rerun saw 0 ready, no consumer, and no statistics, and backed up 0 of 5,000.)
//!
//! **A retry** (`super::retry`) reads a queue whose earlier attempt held messages when its
//! connection was lost: a ready count below what that attempt (or the listing) saw is not
//! accepted without waiting for the broker to return them, and, after a node was lost, a quorum
//! queue answering 0 ready and 0 consumers without statistics is "not known yet", not "empty".
//! Messages that do not come back fail the queue; it never completes short ([`Floor`]).
//!
//! **Brokers without message statistics** (RabbitMQ 4.x with
//! `management_agent.disable_metrics_collector = true`: the API lists no counts, no consumers
//! and no connections): the live counts alone decide. Consumers on the queue are given a
//! moment to go (a killed run's), then what they may hold is reported as left out, its count
//! unknown; after an earlier run, the ready count must stay the same for a moment before the
//! read starts.

use super::context::QueueContext;
use crate::broker::amqp::Channel;
use crate::broker::management::{ConsumerInfo, QueueInfo};
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// How often the counts are read again while waiting.
const POLL: Duration = Duration::from_millis(250);

/// The management API's statistics lag the broker by up to its statistics interval (5 s by
/// default): a wait for returned messages allows that much on top of the broker's own time.
const STATISTICS_LAG: Duration = Duration::from_secs(10);

/// How long live consumers the management API does not list yet are given to appear there
/// (or, without statistics, to go) before they are taken as another application's.
const UNLISTED_GRACE: Duration = Duration::from_secs(6);

/// Without statistics, after an earlier run: how long the ready count must stay the same
/// before the read starts (returns of a run just gone show up within it).
const STEADY: Duration = Duration::from_secs(2);

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

/// A count the queue is known to have held that a read must not start below without the
/// broker's word (see the module documentation): on a retry, the larger of the listing's
/// count and the failed attempt's depth at start. 0: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floor(pub u64);

/// Who holds a queue's unacknowledged messages, from the management API's consumer list.
#[derive(Debug, Default)]
struct Holders<'a> {
    /// Consumers of rmq-backup (an earlier run of this backup, or another backup): they give
    /// every message back.
    backups: Vec<&'a ConsumerInfo>,
    /// Consumers of other applications that hold messages (acknowledgement mode).
    foreign: Vec<&'a ConsumerInfo>,
}

/// True for a consumer of rmq-backup: its connection's name (`rmq-backup <backup_id> ...`)
/// or, when the API does not know the connection's name (a killed run's connection not
/// listed), its tag (`rmq-backup-<pid>-<n>`).
fn is_backup(c: &ConsumerInfo) -> bool {
    match c.connection_name.as_deref() {
        Some(name) => name.starts_with("rmq-backup "),
        None => c.consumer_tag.starts_with("rmq-backup-"),
    }
}

fn holders(consumers: &[ConsumerInfo]) -> Holders<'_> {
    let mut h = Holders::default();
    for c in consumers.iter().filter(|c| c.ack_required) {
        if is_backup(c) {
            h.backups.push(c);
        } else {
            h.foreign.push(c);
        }
    }
    h
}

/// Consumers for messages (`billing (consumer tag ctag-1), ...`): each by its connection's
/// name, else the broker's name of the connection, else its tag alone.
fn describe(consumers: &[&ConsumerInfo]) -> String {
    consumers
        .iter()
        .map(|c| {
            let name = c
                .connection_name
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(&c.connection);
            if name.is_empty() {
                format!("consumer tag {}", c.consumer_tag)
            } else {
                format!("{name} (consumer tag {})", c.consumer_tag)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The broker's live view of a queue: `queue.declare-ok`.
#[derive(Debug, Clone, Copy)]
struct Live {
    ready: u64,
    consumers: u32,
}

/// Looks at the messages `q` holds unacknowledged before its read starts; waits while the
/// broker is giving back those of a run that is gone (see the module documentation).
/// `floor`: on a retry, what the queue held before ([`Floor`]).
///
/// Errors: the passive declare's (`NOT_FOUND - no queue ...`), the management API's,
/// `Error::Io` when the run is asked to stop while it waits, and `Error::Connection` when a
/// retry's [`Floor`] is not met within the wait (the messages a lost connection held did not
/// come back: the queue is not backed up short).
pub(super) fn settle(
    ctx: &QueueContext,
    control: &Channel,
    q: &QueueInfo,
    floor: Floor,
) -> Result<AtStart> {
    let started = Instant::now();
    let statistics = ctx.read.statistics;
    // What the broker counted at the start: every one of them must be ready, or accounted for.
    let mut counted = floor.0.max(if q.statistics { q.messages } else { 0 });
    // Messages unacknowledged at the start: the listing's, or the most found missing since.
    let mut unacknowledged = q.unacknowledged;
    let mut waiting: Option<&'static str> = None;
    let (mut steady_ready, mut steady_since) = (u64::MAX, Instant::now());
    let mut first_ready: Option<u64> = None;
    loop {
        let ok = control.queue_declare_passive(&q.name)?;
        let live = Live {
            ready: u64::from(ok.message_count),
            consumers: ok.consumer_count,
        };
        // What came back while this run waited was unacknowledged at its start too.
        let came_back = live
            .ready
            .saturating_sub(*first_ready.get_or_insert(live.ready));
        unacknowledged = unacknowledged.max(came_back);
        if live.ready != steady_ready {
            (steady_ready, steady_since) = (live.ready, Instant::now());
        }
        // The common case costs no request: no consumer now, every counted message ready,
        // and no earlier run whose messages statistics would not show.
        if waiting.is_none()
            && live.consumers == 0
            && live.ready >= counted
            && !(ctx.read.earlier_run.seen() && !(statistics && q.statistics))
        {
            return Ok(AtStart {
                unacknowledged,
                left_out: None,
                ready: live.ready,
            });
        }
        let elapsed = started.elapsed();
        let verdict = if statistics {
            let api = ctx.read.mgmt.queue_holders(&q.vhost, &q.name)?;
            if api.statistics {
                counted = counted.max(api.messages);
                unacknowledged = unacknowledged.max(api.unacknowledged);
            }
            judge_with_statistics(
                &api,
                live,
                counted,
                floor,
                elapsed,
                ctx.read.earlier_run.seen(),
            )
        } else {
            judge_without_statistics(
                live,
                counted,
                floor,
                elapsed,
                ctx.read.earlier_run.seen(),
                steady_since.elapsed(),
            )
        };
        unacknowledged = unacknowledged.max(counted.saturating_sub(live.ready));
        match verdict {
            Verdict::Start => {
                if waiting.is_some() {
                    log::info!(
                        "queue {} in vhost {}: {} message(s) ready after waiting {:.1} s; reading",
                        q.name,
                        q.vhost,
                        live.ready,
                        elapsed.as_secs_f64()
                    );
                }
                return Ok(AtStart {
                    unacknowledged,
                    left_out: None,
                    ready: live.ready,
                });
            }
            Verdict::LeftOut(count, why) => {
                log::warn!("queue {} in vhost {}: {why}", q.name, q.vhost);
                return Ok(AtStart {
                    unacknowledged: unacknowledged.max(count),
                    left_out: Some((count, why)),
                    ready: live.ready,
                });
            }
            Verdict::Fail(why) => {
                return Err(Error::Connection(format!(
                    "queue {} in vhost {}: {why}",
                    q.name, q.vhost
                )))
            }
            Verdict::Wait(kind, why) => {
                if waiting != Some(kind) {
                    log::info!(
                        "queue {} in vhost {}: {why}; waiting up to {} s for the broker",
                        q.name,
                        q.vhost,
                        wait_limit(counted).as_secs()
                    );
                    waiting = Some(kind);
                }
            }
        }
        ctx.read.earlier_run.close_listed(ctx.read.mgmt);
        if let Some(why) = ctx
            .read
            .lock
            .lost()
            .or_else(|| crate::run::signals::stop_reason("backup"))
        {
            return Err(Error::Io(why));
        }
        std::thread::sleep(POLL);
    }
}

/// How long `counted` messages may take to come back, statistics lag included.
fn wait_limit(counted: u64) -> Duration {
    crate::broker::reader::return_wait(counted) + STATISTICS_LAG
}

/// What to do after one look at the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Start,
    /// What is waited for (logged once per kind) and why, in words.
    Wait(&'static str, String),
    LeftOut(u64, String),
    Fail(String),
}

/// The verdict when the wait for `missing` messages is over.
fn not_back(missing: u64, ready: u64, floor: Floor, limit: Duration) -> Verdict {
    if floor.0 > ready {
        return Verdict::Fail(format!(
            "{} message(s) were in the queue when the attempt before this retry started, {ready} are ready after waiting {} s: the messages its lost connection held did not come back, and the queue is not backed up short",
            floor.0,
            limit.as_secs()
        ));
    }
    Verdict::LeftOut(
        missing,
        format!(
            "{missing} message(s) unacknowledged at start were not returned to the queue within {} s ({ready} ready): they are not in this backup",
            limit.as_secs()
        ),
    )
}

/// One look with the management API's statistics: `api`, the broker's `live` counts,
/// `counted` (what the queue held at the start), the retry's `floor`, the time waited so far,
/// and whether an earlier run of this backup may hold messages.
fn judge_with_statistics(
    api: &crate::broker::management::QueueHolders,
    live: Live,
    counted: u64,
    floor: Floor,
    elapsed: Duration,
    earlier_run: bool,
) -> Verdict {
    let limit = wait_limit(counted);
    let unacked = api
        .unacknowledged
        .max(api.messages.saturating_sub(live.ready));
    let h = holders(&api.consumers);
    let unlisted = live.consumers as usize > api.consumers.len();
    if live.consumers == 0 {
        if !api.statistics {
            // Nothing to check the live count against: what was counted before (a retry's
            // floor, or the listing's count of a queue whose statistics are gone since: its
            // leader moved), or an earlier run whose messages the statistics of a queue
            // declared a moment ago would count, makes the read wait (bounded).
            if counted > live.ready {
                if elapsed > limit {
                    return not_back(counted - live.ready, live.ready, floor, limit);
                }
                return Verdict::Wait(
                    "floor",
                    format!(
                        "{counted} message(s) were counted in the queue before, {} are ready now and the management API has no statistics for it (yet)",
                        live.ready
                    ),
                );
            }
            if earlier_run && elapsed < STATISTICS_LAG {
                return Verdict::Wait(
                    "no-statistics",
                    "no message statistics yet for the queue (declared a moment ago) while an earlier run of this backup may hold its messages".to_string(),
                );
            }
            return Verdict::Start;
        }
        if live.ready >= counted {
            return Verdict::Start;
        }
        // The API confirms that the queue holds no more than is ready (it shrank: consumed
        // by another application): start, unless a retry's floor says otherwise.
        if unacked == 0 && floor.0 <= live.ready {
            return Verdict::Start;
        }
        if elapsed > limit {
            return not_back(counted.saturating_sub(live.ready), live.ready, floor, limit);
        }
        let holder = if earlier_run {
            "a backup run that is gone or giving them back (an earlier run of this backup)"
        } else {
            "no live consumer (a connection closed a moment ago)"
        };
        return Verdict::Wait(
            "returning",
            format!(
                "{} message(s) counted at start are not ready yet, held by {holder}",
                counted - live.ready
            ),
        );
    }
    if unlisted && elapsed < UNLISTED_GRACE {
        return Verdict::Wait(
            "unlisted",
            format!(
                "{} consumer(s) on the queue, not all listed by the management API yet",
                live.consumers
            ),
        );
    }
    if !h.backups.is_empty() {
        if elapsed > limit {
            return not_back(
                unacked.max(counted.saturating_sub(live.ready)),
                live.ready,
                floor,
                limit,
            );
        }
        let count = if unacked > 0 {
            format!("{unacked} message(s)")
        } else {
            "messages (not counted by the management API yet)".to_string()
        };
        return Verdict::Wait(
            "backup",
            format!(
                "{count} unacknowledged at start, held by a backup run that is gone or giving them back ({})",
                describe(&h.backups)
            ),
        );
    }
    if unacked == 0 && live.ready >= floor.0 {
        // Consumers of other applications that hold nothing.
        return Verdict::Start;
    }
    let who = if h.foreign.is_empty() {
        format!(
            "{} consumer(s) the management API does not list",
            live.consumers
        )
    } else {
        describe(&h.foreign)
    };
    let count = if api.unacknowledged > 0 {
        api.unacknowledged
    } else {
        unacked
    };
    Verdict::LeftOut(
        count,
        format!(
            "{count} message(s) unacknowledged by a live consumer of another application when the backup started ({who}): a backup cannot take them without taking them from it"
        ),
    )
}

/// One look on a broker without message statistics: the live counts alone (see the module
/// documentation); `steady` is how long the ready count has stayed the same.
fn judge_without_statistics(
    live: Live,
    counted: u64,
    floor: Floor,
    elapsed: Duration,
    earlier_run: bool,
    steady: Duration,
) -> Verdict {
    let limit = wait_limit(counted);
    if live.consumers > 0 {
        if elapsed < UNLISTED_GRACE {
            return Verdict::Wait(
                "consumers",
                format!(
                    "{} consumer(s) on the queue, and the broker's message statistics are off: waiting for a run that is gone to give back what it holds",
                    live.consumers
                ),
            );
        }
        if floor.0 > live.ready {
            return not_back(floor.0 - live.ready, live.ready, floor, limit);
        }
        let missing = counted.saturating_sub(live.ready);
        return Verdict::LeftOut(
            missing,
            format!(
                "{} consumer(s) on the queue when the backup started, and the broker's message statistics are off (management_agent.disable_metrics_collector), so what they hold unacknowledged cannot be counted: it is not in this backup",
                live.consumers
            ),
        );
    }
    if live.ready >= counted && (!earlier_run || steady >= STEADY) {
        return Verdict::Start;
    }
    if elapsed > limit {
        return not_back(counted.saturating_sub(live.ready), live.ready, floor, limit);
    }
    if live.ready >= counted {
        return Verdict::Wait("settle", "an earlier run of this backup may still be giving messages back, and the broker's message statistics are off: waiting for the ready count to settle".to_string());
    }
    Verdict::Wait(
        "floor",
        format!(
            "{} message(s) were in the queue before the connection was lost, {} are ready now",
            counted, live.ready
        ),
    )
}

#[cfg(test)]
mod tests;
