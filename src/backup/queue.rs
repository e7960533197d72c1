//! One queue's backup: a channel on its queue thread's connection (`super::conns`), the read (`crate::broker::reader`), and the batches of
//! records handed to the queue's segment builder (`super::segments`). Once the read is over
//! (every message back in the queue), the queue thread goes on to its next queue while its
//! last segments are stored: [`Storing::finish`] completes the queue once they are.

use super::conns::ThreadConnection;
use super::quorum::{self, Decision};
use super::resume;
use super::segments::{build_segments, Batches, Stored, Upload};
use super::unacked::{self, AtStart, Floor};
use super::{LeftOut, QueueContext, SkippedQueue};
use crate::broker::management::QueueInfo;
use crate::broker::reader;
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use crate::metrics;
use crate::now_ms;
use crate::repository::manifest::QueueBackup;
use crate::repository::record::BackupRecord;
use crate::repository::spool::spawn_named;
use crate::run::progress;
use crossbeam_channel::{bounded, unbounded, Sender};
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
}

/// Backs up one queue on the queue thread's connection `conns`. `Ok(None)`: the queue was
/// deleted after it was listed. `floor`: what an earlier attempt of this run saw in the queue
/// (its read does not start below it without the broker's word, `unacked::Floor`); raised to
/// this attempt's depth at start for the next one.
pub(super) fn backup_queue<'a>(
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    uploads: &Sender<Upload>,
    conns: &mut ThreadConnection,
    floor: &mut Floor,
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
    let decision = match kind {
        QueueType::Quorum => quorum_decision(ctx, q)?,
        _ => Decision::Counted,
    };
    if kind == QueueType::Quorum {
        decision.log_once(ctx.read.broker_version.get(), strategy);
    }
    if let Decision::Skip(why) = &decision {
        // Decided at the selection with the version then known; a node seen since is older.
        return Ok(Some(Outcome::Skipped(skipped(q, kind, why.clone()))));
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
    let (conn, control) = conns.get(ctx, &q.vhost, q.node.as_deref())?;
    let at_start = match unacked::settle(ctx, control, q, *floor) {
        Err(e) if is_gone(&e) => {
            log::warn!(
                "queue {} in vhost {} was deleted after it was listed: skipped",
                q.name,
                q.vhost
            );
            return Ok(None);
        }
        other => other?,
    };
    floor.0 = floor.0.max(at_start.ready);
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
    let plan = decision.plan(strategy);
    let read_into = |tx: &Sender<Vec<BackupRecord>>| -> Result<reader::ReadOutcome> {
        read_records(ctx, q, kind, conn, control, at_start.ready, plan, tx, &m)
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
    } else if inline(q, kind, at_start.ready) {
        // A small queue whose bytes the listing knows to be few: read whole, then built on
        // this thread.
        let (batch_tx, batch_rx) = unbounded::<Vec<BackupRecord>>();
        let read = read_into(&batch_tx);
        drop(batch_tx);
        (read, build_segments(ctx, q, &m, batch_rx, uploads, after))
    } else {
        let (batch_tx, batch_rx) = bounded::<Vec<BackupRecord>>(BATCH_CHANNEL);
        std::thread::scope(|s| {
            let builder = spawn_named(s, "segment-builder", || {
                build_segments(ctx, q, &m, batch_rx, uploads, after)
            });
            let read = read_into(&batch_tx);
            drop(batch_tx);
            let built = builder
                .join()
                .unwrap_or_else(|_| Err(Error::Io("segment builder panicked".into())));
            (read, built)
        })
    };
    // A builder failure (storage, encoding) is the cause when the reader saw only a closed channel.
    let segments = match (read, built) {
        (Err(e), Ok(segments)) if segments.is_empty() && is_gone(&e) => {
            log::warn!(
                "queue {} in vhost {} was deleted after it was listed: skipped",
                q.name,
                q.vhost
            );
            return Ok(None);
        }
        (Err(e), Ok(_)) => return Err(e),
        (_, Err(e)) => return Err(e),
        (Ok(outcome), Ok(segments)) if outcome.at_limit.is_some() => {
            let count = outcome.at_limit.unwrap_or_default();
            segments.discard();
            let limit = plan.delivery_limit.unwrap_or_default();
            return Ok(Some(Outcome::Skipped(skipped(
                q,
                kind,
                format!(
                    "it is a quorum queue with a delivery limit of {limit}, and message {} was delivered with x-delivery-count {count}: given back once more it would be at the limit, so the read stopped and every message went back ({} counts one more failed delivery each on {}); the next read would drop or dead-letter it. Remedies: RabbitMQ 4.3 or later, or a policy with \"delivery-limit\": -1 on this queue while the backup runs",
                    outcome.read + 1,
                    outcome.read + 1,
                    ctx.read.broker_version.get().map_or_else(|| "this broker".to_string(), |v| format!("RabbitMQ {v}"))
                ),
            ))));
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
    })))
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
        } = self;
        let segments = segments.wait()?;
        if let Some(cp) = ctx.store.checkpoints {
            cp.complete_backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name)?;
        }
        let mut backup = QueueBackup::from_segments(&q.vhost, &q.name, kind, segments);
        backup.messages_unacknowledged_at_start = Some(at_start.unacknowledged);
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

/// Body bytes below which a small queue is read whole before its segment is built on the
/// queue thread (no builder thread): the listing's `message_bytes`, ready and unacknowledged.
const INLINE_BYTES: u64 = 4 << 20;

/// True when `q` is read whole, then built on its queue thread: a classic queue of at most
/// [`reader::SMALL_QUEUE`] messages whose statistics count at most [`INLINE_BYTES`] of body
/// (read with `basic.get`, so its records are few and small; memory stays bounded by bytes).
fn inline(q: &QueueInfo, kind: QueueType, depth: u64) -> bool {
    kind == QueueType::Classic
        && depth <= reader::SMALL_QUEUE
        && q.statistics
        && q.message_bytes <= INLINE_BYTES
}

/// Reads queue `q` as `plan` says (its depth at start `depth`), handing the records to `tx`
/// in batches counted in `m`; stops when the run must (its lock lost, a signal, an alarm, a
/// blocked connection).
#[allow(clippy::too_many_arguments)]
fn read_records(
    ctx: &QueueContext,
    q: &QueueInfo,
    kind: QueueType,
    conn: &crate::broker::amqp::Connection,
    control: &crate::broker::amqp::Channel,
    depth: u64,
    plan: reader::ReadPlan,
    tx: &Sender<Vec<BackupRecord>>,
    m: &metrics::BackupQueueMetrics,
) -> Result<reader::ReadOutcome> {
    let mut batches = Batches::new(tx, m);
    let mut sink = |mut d: crate::broker::amqp::Delivery| -> Result<()> {
        if kind == QueueType::Quorum {
            quorum::strip_broker_headers(&mut d.properties);
        }
        batches.push(BackupRecord::from_delivery(d, &q.name, &q.vhost, now_ms()))
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
    let read = reader::read_queue(
        conn,
        control,
        &q.name,
        depth,
        kind,
        plan,
        &mut sink,
        &should_stop,
    );
    if read.is_ok() {
        let _ = batches.flush();
    }
    read
}

/// How long a quorum queue listed without its policies may take to show them.
const POLICY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// [`quorum::decide`] for `q`, asking the management API again (every 500 ms, at most
/// [`POLICY_WAIT`]) while it lists the queue without its policies; a limit still unknown
/// then leaves the queue alone.
///
/// Errors: the management API's.
fn quorum_decision(ctx: &QueueContext, q: &QueueInfo) -> Result<Decision> {
    let started = Instant::now();
    let mut current = std::borrow::Cow::Borrowed(q);
    loop {
        let d = quorum::decide(&current, ctx.read.broker_version.get(), ctx.read.opts);
        if d != Decision::Unknown {
            return Ok(d);
        }
        if started.elapsed() > POLICY_WAIT {
            return Ok(Decision::Skip(format!(
                "its delivery limit is not known: the management API did not report the policies of this quorum queue within {} s, and every return counts on this broker",
                POLICY_WAIT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        current = std::borrow::Cow::Owned(ctx.read.mgmt.get_queue(&q.vhost, &q.name)?);
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
