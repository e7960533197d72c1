//! One queue's backup: a channel on its queue thread's connection (`super::conns`), the read (`crate::broker::reader`), and the batches of
//! records handed to the queue's segment builder (`super::segments`). Once the read is over
//! (every message back in the queue), the queue thread goes on to its next queue while its
//! last segments are stored: [`Storing::finish`] completes the queue once they are.

use super::conns::ThreadConnection;
use super::counted::{self, Before, Pending};
use super::quorum::{self, Decision};
use super::resume;
use super::segments::{build_segments, Batches, Stored, Upload};
use super::unacked::{self, AtStart, Floor};
use super::{LeftOut, QueueContext, SkippedQueue};
use crate::broker::management::{PolicyKind, QueueInfo};
use crate::broker::reader;
use crate::broker::{BrokerVersion, QueueType};
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use crate::metrics;
use crate::now_ms;
use crate::repository::manifest::QueueBackup;
use crate::repository::record::BackupRecord;
use crate::repository::spool::spawn_named;
use crate::run::progress;
use crossbeam_channel::{bounded, Sender};
use std::time::Instant;

/// Batches in flight between a queue thread and its segment builder.
const BATCH_CHANNEL: usize = 4;

/// What a queue thread hands on: a queue backed up earlier (a rerun's), one whose read is
/// over and whose segments are being stored, or one whose read stopped at its delivery limit
/// (`super::quorum`), left alone.
pub(super) enum Outcome<'a> {
    Done(QueueBackup),
    Storing(Storing<'a>),
    Skipped(SkippedQueue),
}

/// A queue read to its depth at start, its last segments perhaps still on their way to
/// storage.
pub(super) struct Storing<'a> {
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    kind: QueueType,
    at_start: AtStart,
    segments: Stored<'a>,
    /// Messages whose `x-delivery-count` this run raised (the manifest's
    /// `delivery_counts_raised`).
    counted: u64,
}

/// What the attempts of this run at one queue leave for the next attempt.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    /// What an earlier attempt saw in the queue: a read does not start below it without the
    /// broker's word (`unacked::Floor`).
    pub(super) floor: Floor,
    /// Messages that lost connections gave back where the give-back is not otherwise
    /// counted (RabbitMQ 4.3+: a closed connection's return counts, a nack does not), and the
    /// highest `x-delivery-count` among them before that return.
    pub(super) counted: u64,
    pub(super) max_count: Option<u64>,
}

/// Backs up one queue on the queue thread's connection `conns`. `Ok(None)`: the queue was
/// deleted after it was listed. `attempts`: what earlier attempts of this run left (updated
/// for the next one).
pub(super) fn backup_queue<'a>(
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    uploads: &Sender<Upload>,
    conns: &mut ThreadConnection,
    attempts: &mut Attempts,
) -> Result<Option<Outcome<'a>>> {
    let kind = q.queue_type.unwrap_or(QueueType::Classic);
    if !ctx.read.opts.stop_at_current_depth {
        log::warn!(
            "queue {} in vhost {} ({}): a continuous backup follows streams only; this queue is backed up once, to its depth at the start (holding its messages longer would take them from its own consumers)",
            q.name,
            q.vhost,
            kind.as_str()
        );
    }
    if let Some(done) = resume::completed_earlier(ctx, q, kind)? {
        return Ok(Some(Outcome::Done(done)));
    }
    let after = resume::start_queue(ctx, q)?;
    let mut strategy = ctx.read.opts.requeue_strategy;
    if q.auto_delete && matches!(strategy, RequeueStrategy::Cancel | RequeueStrategy::Reject) {
        // Cancelling the last consumer of an auto-delete queue deletes it, messages and all;
        // basic.get registers no consumer.
        log::info!(
            "queue {} in vhost {} is auto-delete: read with basic.get instead of a consumer",
            q.name,
            q.vhost
        );
        strategy = RequeueStrategy::Get;
    }
    if kind == QueueType::Quorum && matches!(strategy, RequeueStrategy::Get | RequeueStrategy::Nack)
    {
        // Measured on 3.10.8: when a connection holding basic.get deliveries of a quorum queue
        // is lost, the broker requeues them in an arbitrary order (a consumer's come back in
        // order). A backup must not reorder the queue when its connection drops.
        log::info!(
            "queue {} in vhost {} is a quorum queue: read with consumers (requeue_strategy cancel) instead of basic.get, which RabbitMQ requeues in an arbitrary order when a connection is lost",
            q.name,
            q.vhost
        );
        strategy = RequeueStrategy::Cancel;
    }
    // Connected first: the node it lands on is known (its version counts) before the
    // decision, and the decision before the first message is taken.
    let (conn, control) = conns.get(ctx, &q.vhost, q.node.as_deref())?;
    // A queue of backup.amqp10_queues on 4.0+: read over AMQP 1.0 (closed when it is done).
    let amqp10 = super::conns::amqp10_connection(ctx, q)?;
    let source = match &amqp10 {
        Some(c) => reader::Source::Amqp10(c),
        None => reader::Source::Amqp091(conn),
    };
    let (decision, limit, fresh) = match kind {
        QueueType::Quorum => match quorum_decision(ctx, q) {
            Err(e) if is_gone(&e) => return Ok(gone(q)),
            Ok((d, limit, now)) => (d, limit, Some(now)),
            Err(e) => return Err(e),
        },
        _ => (Decision::Counted, None, None),
    };
    if kind == QueueType::Quorum {
        decision.log_once(ctx.read.broker_version.get(), strategy);
    }
    if let Decision::Skip(why) = &decision {
        return Ok(Some(Outcome::Skipped(skipped(q, kind, why.clone()))));
    }
    let mut plan = decision.plan(strategy);
    if decision == Decision::Nack && attempts.counted > 0 {
        // A lost connection gave messages back counted (4.3+): from now on, as where every
        // return counts, no message near its limit is taken again.
        if let Some(limit) = limit {
            if let Err(at) = quorum::one_more_read(attempts.max_count.map(|c| c + 1), limit) {
                return Ok(Some(Outcome::Skipped(skipped(q, kind, format!(
                    "it is a quorum queue with a delivery limit of {limit}: this run's lost connection gave {} message(s) back counted (a closed connection's return counts on every version), leaving them at up to x-delivery-count {}; one more such loss would leave them at {at}, so it is not read again",
                    attempts.counted, at - 1
                )))));
            }
            plan.delivery_limit = Some(limit);
        }
    }
    // A quorum queue's messages waiting for a delayed retry (4.3) are waited for, or left out.
    let (now, delayed) = match fresh {
        Some(now) => {
            let (now, delayed) = super::delayed::wait(ctx, now)?;
            (Some(now), delayed)
        }
        None => (None, None),
    };
    let mut at_start =
        match unacked::settle(ctx, control, now.as_ref().unwrap_or(q), attempts.floor) {
            Err(e) if is_gone(&e) => return Ok(gone(q)),
            other => other?,
        };
    if let Some((n, why)) = delayed {
        at_start.left_out = Some(match at_start.left_out.take() {
            Some((m, other)) => (m + n, format!("{why}; {other}")),
            None => (n, why),
        });
    }
    // Where every return counts: what earlier reads left decides, and is recorded first.
    let pending = match (kind, &decision) {
        (QueueType::Quorum, Decision::Counted | Decision::Headroom { .. }) => {
            let limit = match decision {
                Decision::Headroom { limit } => Some(limit),
                _ => None,
            };
            match counted::before_read(ctx, q, limit, &at_start)? {
                Before::Read(p) => Some(p),
                Before::Skip(why) => return Ok(Some(Outcome::Skipped(skipped(q, kind, why)))),
            }
        }
        _ => None,
    };
    attempts.floor.0 = attempts.floor.0.max(at_start.ready);
    // An empty queue is a debug line: thousands of them would bury the rest.
    let level = if at_start.ready == 0 {
        log::Level::Debug
    } else {
        log::Level::Info
    };
    log::log!(level, "queue {} in vhost {}: backing up", q.name, q.vhost);
    // Resolved once: the per-message updates below are relaxed atomic adds.
    let m = metrics::global().backup_queue(&q.name, &q.vhost, kind.as_str());
    let _row = progress::row(
        format!("{} (vhost {})", q.name, q.vhost),
        q.messages,
        m.messages_read.clone(),
        m.bytes_read.clone(),
    );

    let started = Instant::now();
    let held = reader::Held::default();
    let read_into =
        |tx: &Sender<Vec<BackupRecord>>, spill: Option<&dyn Fn()>| -> Result<reader::ReadOutcome> {
            read_records(
                ctx,
                q,
                kind,
                (source, conn),
                control,
                at_start.ready,
                plan,
                (tx, spill),
                &m,
                &held,
            )
        };
    let (read, built) = if at_start.ready == 0 {
        // Nothing to read: no builder, no channel (thousands of empty queues cost a thread
        // each before).
        log::debug!("queue {}: 0 messages at start", q.name);
        (
            Ok(reader::ReadOutcome {
                depth_at_start: 0,
                read: 0,
                at_limit: None,
            }),
            Ok(Stored::none(ctx, q)),
        )
    } else {
        // A small queue ([`inline`]) starts its builder thread only if its read fills the
        // batch channel: most are read whole, then built on this thread (no thread, no
        // hand-off), and memory stays bounded by the channel as in any other read.
        let (batch_tx, batch_rx) = bounded::<Vec<BackupRecord>>(BATCH_CHANNEL);
        let batch_rx = std::cell::Cell::new(Some(batch_rx));
        let m = &m;
        std::thread::scope(|s| {
            let builder = std::cell::RefCell::new(None);
            let start = || {
                if let Some(rx) = batch_rx.take() {
                    *builder.borrow_mut() = Some(spawn_named(s, "segment-builder", move || {
                        build_segments(ctx, q, m, rx, uploads, after)
                    }));
                }
            };
            let small = inline(kind, at_start.ready);
            if !small {
                start();
            }
            let read = read_into(&batch_tx, small.then_some(&start as &dyn Fn()));
            drop(batch_tx);
            let built = match (builder.into_inner(), batch_rx.take()) {
                (Some(b), _) => b
                    .join()
                    .unwrap_or_else(|_| Err(Error::Io("segment builder panicked".into()))),
                (None, Some(rx)) => build_segments(ctx, q, m, rx, uploads, after),
                (None, None) => Err(Error::Io("segment builder never started".into())),
            };
            (read, built)
        })
    };
    let counted = count_returns(q, &decision, pending, &held, read.as_ref().err(), attempts)?;
    // A builder failure (storage, encoding) is the cause when the reader saw only a closed channel.
    let segments = match (read, built) {
        (Err(e), Ok(segments)) if segments.is_empty() && is_gone(&e) => return Ok(gone(q)),
        (Err(e), Ok(_)) => return Err(e),
        (_, Err(e)) => return Err(e),
        (Ok(outcome), Ok(segments)) if outcome.at_limit.is_some() => {
            segments.discard();
            let why = stopped_at_limit(ctx, &outcome, plan.delivery_limit, &held);
            return Ok(Some(Outcome::Skipped(skipped(q, kind, why))));
        }
        (Ok(outcome), Ok(segments)) => {
            log::log!(
                level,
                "queue {} in vhost {}: {} messages in {} segment(s), {:.1} s",
                q.name,
                q.vhost,
                outcome.read,
                segments.len(),
                started.elapsed().as_secs_f64()
            );
            segments
        }
    };
    Ok(Some(Outcome::Storing(Storing {
        ctx,
        q,
        kind,
        at_start,
        segments,
        counted,
    })))
}

/// The queue `q` deleted after it was listed: nothing left to back up.
fn gone<T>(q: &QueueInfo) -> Option<T> {
    log::warn!(
        "queue {} in vhost {} was deleted after it was listed: skipped",
        q.name,
        q.vhost
    );
    None
}

/// Once a read of `q` is over (`failed`: its error), counts what it gave back counted: where
/// every return counts (`pending`, written ahead), the record of what it left; on 4.3+, the
/// messages a lost connection returned (`attempts`, for the next attempt). Returns the
/// messages whose `x-delivery-count` this run has raised so far.
///
/// Errors: the record's storage, for a queue with a delivery limit (its record written ahead
/// stays, and already counts this read).
fn count_returns(
    q: &QueueInfo,
    decision: &Decision,
    pending: Option<Pending>,
    held: &reader::Held,
    failed: Option<&Error>,
    attempts: &mut Attempts,
) -> Result<u64> {
    if let Some(pending) = pending {
        let limited = matches!(decision, Decision::Headroom { .. });
        match pending.after(held) {
            Ok(_) => {}
            Err(e) if !limited => log::warn!(
                "queue {} in vhost {}: the record of its delivery counts was not updated: {e}",
                q.name,
                q.vhost
            ),
            Err(e) => return Err(e),
        }
        return Ok(attempts.counted + held.messages());
    }
    if *decision == Decision::Nack
        && held.messages() > 0
        && failed.is_some_and(super::retry::lost_connection)
    {
        attempts.counted += held.messages();
        attempts.max_count = attempts.max_count.max(held.max_delivery_count());
        log::warn!(
            "queue {} in vhost {}: the connection was lost while the read held {} message(s): a closed connection's return counts as a failed delivery on every version, so each of them is at one more x-delivery-count (the retry takes no message whose next count would reach its delivery limit)",
            q.name,
            q.vhost,
            held.messages()
        );
    }
    Ok(attempts.counted)
}

/// Why a read that stopped at a message near its delivery limit left the queue alone.
fn stopped_at_limit(
    ctx: &QueueContext,
    outcome: &reader::ReadOutcome,
    limit: Option<u64>,
    held: &reader::Held,
) -> String {
    let limit = limit.unwrap_or_default();
    let count = outcome.at_limit.unwrap_or_default();
    let version = ctx.read.broker_version.get();
    format!(
        "it is a quorum queue with a delivery limit of {limit}, and message {} was delivered with x-delivery-count {count} (more than earlier backups left: another consumer returned it): a backup may leave a message at most at {}, so the read stopped; the {} message(s) it held went back with one count more each (now at up to x-delivery-count {}), and it is not read again until it has been seen empty at a backup's start or its limit is raised. {}",
        outcome.read + 1,
        limit.saturating_sub(1),
        held.messages(),
        held.max_delivery_count().unwrap_or(count) + 1,
        quorum::remedies(version)
    )
}

impl Storing<'_> {
    /// Waits until the queue's segments are stored, records the queue complete in the
    /// checkpoint database, and returns its manifest entry (with its messages left out, if
    /// any, counted in the metrics and the run's summary).
    ///
    /// Errors: a segment's upload error ([`Stored::wait`]); the checkpoint database's.
    pub(super) fn finish(self) -> Result<QueueBackup> {
        let Storing {
            ctx,
            q,
            kind,
            at_start,
            segments,
            counted,
        } = self;
        let segments = segments.wait()?;
        if let Some(cp) = ctx.store.checkpoints {
            cp.complete_backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name)?;
        }
        let mut backup = QueueBackup::from_segments(&q.vhost, &q.name, kind, segments);
        backup.messages_unacknowledged_at_start = Some(at_start.unacknowledged);
        backup.delivery_counts_raised = (counted > 0).then_some(counted);
        if let Some((messages, reason)) = at_start.left_out {
            backup.messages_left_out = Some(messages);
            metrics::global()
                .messages_left_out
                .with([&q.name, &q.vhost, kind.as_str()])
                .add(messages);
            if let Ok(mut all) = ctx.read.left_out.lock() {
                all.push(LeftOut {
                    vhost: q.vhost.clone(),
                    name: q.name.clone(),
                    queue_type: kind.as_str().to_string(),
                    messages,
                    reason,
                });
            }
        }
        Ok(backup)
    }
}

/// True when a queue of `kind` holding `depth` messages at its start is read before its
/// builder thread is started, which happens only if the read fills the batch channel
/// (`BATCH_CHANNEL` batches of at most 1 MiB of body each and the message that passes it):
/// a classic queue of at most [`reader::SMALL_QUEUE`] messages, read with `basic.get`. The
/// listing's `message_bytes` no longer decides (issue 41: the listing without statistics
/// does not have it); memory is bounded by the channel, as for every other read.
fn inline(kind: QueueType, depth: u64) -> bool {
    kind == QueueType::Classic && depth <= reader::SMALL_QUEUE
}

/// Reads queue `q` as `plan` says (its depth at start `depth`), handing the records to `tx`
/// in batches counted in `m` (`spill`: called before a batch would wait for a full `tx`, to
/// start its builder); stops when the run must (its lock lost, a signal, an alarm, a
/// blocked connection).
#[allow(clippy::too_many_arguments)]
fn read_records(
    ctx: &QueueContext,
    q: &QueueInfo,
    kind: QueueType,
    (source, conn): (reader::Source, &crate::broker::amqp::Connection),
    control: &crate::broker::amqp::Channel,
    depth: u64,
    plan: reader::ReadPlan,
    (tx, spill): (&Sender<Vec<BackupRecord>>, Option<&dyn Fn()>),
    m: &metrics::BackupQueueMetrics,
    held: &reader::Held,
) -> Result<reader::ReadOutcome> {
    let mut batches = Batches::new(tx, m).spill_with(spill);
    let mut sink = |incoming: reader::Incoming| -> Result<()> {
        let record = match incoming {
            reader::Incoming::Amqp091(mut d) => {
                if kind == QueueType::Quorum {
                    quorum::strip_delivery(&mut d)?;
                }
                BackupRecord::from_delivery(d, &q.name, &q.vhost, now_ms())
            }
            reader::Incoming::Amqp10 { position, split } => {
                BackupRecord::from_amqp10(split, position, &q.name, &q.vhost, now_ms())
            }
        };
        batches.push(record)
    };
    let should_stop = || {
        if let Some(why) = ctx.read.lock.lost() {
            return Some(why);
        }
        if let Some(why) = crate::run::signals::stop_reason("backup") {
            return Some(why);
        }
        if let Some(why) = ctx.read.stop.reason() {
            return Some(why);
        }
        conn.blocked().map(|reason| {
            let why = format!(
                "broker blocked the connection of queue {} ({reason}); backup stopped, every message left in place",
                q.name
            );
            ctx.read.stop.set(why.clone());
            why
        })
    };
    let read = reader::read(
        source,
        control,
        &q.name,
        depth,
        kind,
        plan,
        &mut sink,
        held,
        &should_stop,
    );
    if read.is_ok() {
        let _ = batches.flush();
    }
    read
}

/// How long a quorum queue listed without its policies may take to show them.
const POLICY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// [`quorum::decide`] for `q` on fresh facts: the version the run has seen (this queue's
/// connection included) and the queue as the management API shows it now, its arguments and
/// effective policy (the listing may be hours old on a large broker), asked again every
/// 500 ms, at most [`POLICY_WAIT`], while it shows the queue without its policies (a limit
/// still unknown then leaves the queue alone). Returns the decision, the queue's delivery
/// limit (`None`: none) and the queue as the API showed it.
///
/// Errors: the management API's (`HTTP 404 ...` when the queue is gone).
fn quorum_decision(
    ctx: &QueueContext,
    q: &QueueInfo,
) -> Result<(Decision, Option<u64>, QueueInfo)> {
    let version = ctx.read.broker_version.get();
    let started = Instant::now();
    loop {
        let mut now = ctx.read.mgmt.get_queue(&q.vhost, &q.name)?;
        if !version.is_some_and(BrokerVersion::uncounted_nack) && now.policy_known {
            // Every return counts: a policy changed within the API's statistics round decides
            // too (quorum::policy_limit).
            let vhosts = [q.vhost.clone()];
            let mut policies = ctx.read.mgmt.list_policies(PolicyKind::User, &vhosts)?;
            policies.extend(ctx.read.mgmt.list_policies(PolicyKind::Operator, &vhosts)?);
            if let Some(p) = quorum::policy_limit(&q.name, &policies) {
                let shown = quorum::effective_delivery_limit(&now, version);
                let limit = shown.map_or(p, |s| s.min(p));
                now.delivery_limit = Some(i64::try_from(limit).unwrap_or(i64::MAX));
            }
        }
        let d = quorum::decide(&now, version, ctx.read.opts);
        if d != Decision::Unknown {
            let limit = quorum::effective_delivery_limit(&now, version);
            return Ok((d, limit, now));
        }
        if started.elapsed() > POLICY_WAIT {
            let why = format!(
                "its policies are not known: the management API did not report them for this quorum queue within {} s, and they decide what a backup's give-back costs (a delivery limit, a delayed retry)",
                POLICY_WAIT.as_secs()
            );
            return Ok((Decision::Skip(why), None, now));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// The skipped queue `q` of type `kind`, logged as a warning.
fn skipped(q: &QueueInfo, kind: QueueType, reason: String) -> SkippedQueue {
    let s = SkippedQueue {
        vhost: q.vhost.clone(),
        name: q.name.clone(),
        queue_type: kind.as_str().to_string(),
        reason,
    };
    log::warn!("skipped {s}");
    s
}

/// True for the errors of a queue deleted after it was listed: the broker's `NOT_FOUND` on a
/// declare or consume, the management API's 404.
fn is_gone(e: &Error) -> bool {
    match e {
        Error::Amqp(m) => m.starts_with("NOT_FOUND - no queue"),
        Error::Management(m) => m.starts_with("HTTP 404 for GET /api/queues/"),
        _ => false,
    }
}
