//! The backup job (SPEC.md "What the service does", backup mode).
//!
//! ```text
//! management API ─► selection ─► one thread + one AMQP connection per queue (≤ max_concurrent_queues)
//!     deliveries ─► BackupRecord ─► bounded channel ─► segment builder (encode; streaming compression
//!     into a local spool file) ─► uploader threads (blocking put) ─► manifest, written last
//! ```
//!
//! Memory is bounded by configuration, never by queue depth: a queue thread holds at most one
//! batch, the channel a few more, and a segment is compressed into a spool file, not memory.
//! The manifest is written last; `completed_at` is null when any queue failed.
//!
//! - this file: the job (run lock, manifest, definitions, the queue threads, the summary);
//! - `select`: which queues are read, and which selected ones are skipped and why;
//! - `dry_run`: `backup --dry-run`, the plan of a backup from the selection alone;
//! - `queue`: one queue's connection, read and record batches;
//! - `segments`: encoding, compression into segments, rotation, and the uploaders.

mod alarm;
mod conns;
mod context;
mod counted;
mod delayed;
pub mod dry_run;
mod earlier_run;
mod incompressible;
mod listing;
mod queue;
mod quorum;
mod resume;
mod retry;
mod run_state;
mod segments;
mod select;
mod stored;
mod stream;
mod stream_amqp;
mod unacked;

use crate::broker::definitions;
use crate::broker::management::{ManagementClient, QueueInfo};
use crate::broker::nodes::Nodes;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::metrics;
use crate::now_ms;
use crate::repository::checkpoint;
use crate::repository::encryption::Recipients;
use crate::repository::lock::RunLock;
use crate::repository::manifest::{Manifest, QueueBackup};
use crate::repository::segment::Compression;
use crate::repository::shard::Shard;
use crate::repository::spool::{spawn_named, SpoolDir};
use crate::repository::storage::Storage;
use crate::run::progress;
use context::{QueueContext, ReadContext, StoreContext};
use crossbeam_channel::bounded;
use queue::{backup_queue, Outcome, Storing};
use run_state::{
    merge_parts, part_complete, refuse_to_overwrite, trust_checkpoints, Found, ManifestWriter,
    Target,
};
use segments::{uploader, Upload};
use select::select_queues;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A selected queue that the backup left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedQueue {
    pub vhost: String,
    pub name: String,
    /// The management API's type name (`classic`, `quorum`, `stream`, or a plugin's).
    pub queue_type: String,
    pub reason: String,
}

impl std::fmt::Display for SkippedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "queue {} in vhost {} ({}): {}",
            self.name, self.vhost, self.queue_type, self.reason
        )
    }
}

/// Messages of a queue that the backup does not hold although the queue had them at the start:
/// unacknowledged by a live consumer of another application (`unacked`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    pub vhost: String,
    pub name: String,
    /// The management API's type name (`classic`, `quorum`).
    pub queue_type: String,
    /// Messages left out.
    pub messages: u64,
    pub reason: String,
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "queue {} in vhost {} ({}): {} message(s) left out: {}",
            self.name, self.vhost, self.queue_type, self.messages, self.reason
        )
    }
}

/// How a queue thread's work on one queue ended, when it did not fail.
enum Finished {
    /// Backed up: its manifest entry.
    Backup(QueueBackup),
    /// Deleted on the broker after it was listed.
    Deleted,
    /// Left alone (its read stopped at its delivery limit).
    Skipped(SkippedQueue),
}

/// What a backup run did, for the final summary.
#[derive(Debug, Clone, Default)]
pub struct BackupSummary {
    pub backup_id: String,
    pub queues: usize,
    pub messages: u64,
    /// Compressed bytes written (segments).
    pub bytes: u64,
    pub segments: u64,
    /// Selected queues not backed up (exclusive, quorum with a delivery limit, streams, unknown
    /// types): the backup is complete for every other queue, and the command exits with
    /// [`crate::cli::EXIT_SKIPPED`] so that cron and Kubernetes notice.
    pub skipped: Vec<SkippedQueue>,
    /// Queues backed up without some of their messages (see [`LeftOut`]): the command exits
    /// with [`crate::cli::EXIT_SKIPPED`] too.
    pub left_out: Vec<LeftOut>,
    /// Queues deleted on the broker after they were listed (`"queue <q> in vhost <v>"`): nothing
    /// is left of them to back up, so they do not change the exit code.
    pub deleted: Vec<String>,
    pub elapsed: Duration,
}

/// Runs a backup as `cfg` says, writing to `storage`.
///
/// Errors: the first failure (management API, AMQP, storage, ...). When queues fail the
/// manifest is still written, with `completed_at: null`, so the run reads as interrupted.
/// Every failure is counted in `broker_backup_errors` (`crate::metrics`): a queue's with its
/// queue and vhost, the job's own with empty labels.
pub fn run(cfg: &Config, storage: Arc<dyn Storage>) -> Result<BackupSummary> {
    metrics::global().job(|queue_failed| run_job(cfg, storage, queue_failed))
}

/// [`run`]; sets `queue_failed` when the error returned is a queue's (already counted).
fn run_job(
    cfg: &Config,
    storage: Arc<dyn Storage>,
    queue_failed: &mut bool,
) -> Result<BackupSummary> {
    let started = Instant::now();
    let source = cfg.require_source()?;
    let opts = &cfg.backup;
    let backup_id = cfg.backup_id.as_str();
    let target = Target {
        backup_id: backup_id.to_string(),
        shard: opts.shard.as_ref().map(Shard::from_config).transpose()?,
    };
    if let Found::PartComplete = refuse_to_overwrite(storage.as_ref(), &target)? {
        return part_complete(storage.as_ref(), &target, started);
    }
    // Before the broker is touched: segments are built here.
    let spool = SpoolDir::create(backup_id)?;
    if let Some(n) = opts.prefetch_count {
        log::warn!(
            "backup.prefetch_count is {n} but is not used: a one-shot backup must hold a queue's whole depth unacknowledged, so each consumer's prefetch is sized to the messages it must hold (up to 65,535, more consumers beyond)"
        );
    }

    if opts.checkpoint_interval_secs.is_some() {
        log::warn!(
            "backup.checkpoint_interval_secs is set but has no effect: a backup records its progress at every stored segment (segment_max_bytes and segment_max_interval_ms bound what a killed run reads again)"
        );
    }
    let resolved = crate::broker::tls::resolve(
        &source.amqp_url,
        Some(&source.management_url),
        source.tls.as_ref(),
        "source.tls",
    )?;
    let mgmt = ManagementClient::for_nodes(
        source.management_url.all(),
        &source.management_username,
        source.management_password.expose(),
        resolved.management.as_deref(),
    )?;
    let recipients = opts
        .encryption
        .as_ref()
        .map(|e| e.recipients())
        .transpose()?;
    let mut manifest = Manifest::new(backup_id, now_ms());
    manifest.shard = target.shard;
    manifest.encryption = recipients.as_ref().map(Recipients::info);
    let overview = mgmt.overview()?;
    let nodes = if source.node_local_reads {
        Nodes::with_locality(resolved.urls, &overview.listeners, &source.node_addresses)?
    } else {
        Nodes::new(resolved.urls)
    };
    let broker_version = quorum::SeenVersion::new(overview.broker_version.as_deref());
    let statistics = !overview.disable_stats;
    if !statistics {
        log::warn!("the source's management API keeps no message statistics (management_agent.disable_metrics_collector): the live counts of the queues decide when a read starts, and what other consumers hold cannot be counted");
    }
    manifest.source_cluster = overview.cluster_name.clone();
    manifest.broker_version = overview.broker_version;
    alarm::check_headroom(&mgmt)?;
    // The lock's heartbeat tells a running backup from an interrupted one, and keeps a second
    // run off this backup id while this one lives.
    let lock = RunLock::acquire_named(
        storage.clone(),
        target.lock_name(),
        crate::repository::lock::Timing::from_env(),
    )?;
    // Again under the lock: a run this one waited for may have completed the backup meanwhile.
    let interrupted = match refuse_to_overwrite(storage.as_ref(), &target)? {
        Found::PartComplete => {
            lock.release();
            return part_complete(storage.as_ref(), &target, started);
        }
        Found::Interrupted(i) => Some(*i),
        Found::Nothing => None,
    };
    if let Some(earlier) = &interrupted {
        log::warn!(
            "{} in {} was interrupted earlier; it is written again from the start",
            target.label(),
            storage.location()
        );
        // Still the backup created then: its checkpoint database is trusted for it alone.
        manifest.created_at = earlier.manifest.created_at;
    }
    // Unfinished writes a killed run left (filesystem storage): under the lock, before this run
    // writes. A sharded backup's parts write at once, perhaps on other hosts, whose processes
    // this host cannot see: theirs are left to `forget --prune`.
    if target.shard.is_none() {
        if let Err(e) = crate::repository::storage::partials::remove_stale(
            storage.as_ref(),
            &format!("{backup_id}/"),
        ) {
            log::warn!("unfinished writes of an earlier run are left under {backup_id}/ (harmless; forget --prune removes them): {e}");
        }
    }
    let earlier = stored::Earlier::list(storage.as_ref(), backup_id)?;
    // A manifest with completed_at null first: a run that dies from here on reads as
    // interrupted, and never leaves an older manifest in front of new segments.
    let mut manifest_writer = ManifestWriter::new(&target, interrupted.as_ref());
    manifest_writer.write(storage.as_ref(), &lock, &manifest)?;
    let (checkpoints, syncer) = match &cfg.offset_storage {
        Some(os) => {
            // Each part keeps its own copy in storage: parts run at once.
            let mut os = os.clone();
            if let (Some(key), Some(shard)) = (&mut os.s3_key, &target.shard) {
                *key = format!("{key}.part-{}-of-{}", shard.index, shard.count);
            }
            let (cp, syncer) =
                checkpoint::sync::start(&os, storage.clone(), opts.sync_interval_secs)?;
            trust_checkpoints(&cp, &target, &manifest, interrupted.is_some())?;
            (Some(cp), syncer)
        }
        None => {
            if interrupted.is_some() {
                log::warn!("no offset_storage configured: every queue is read again from the start (the broker still holds them all), and the segments of the earlier run are replaced");
            }
            (None, None)
        }
    };

    // Listed before the connections of an earlier run are closed: the listing still counts
    // what that run holds unacknowledged (the manifest's messages_unacknowledged_at_start).
    let (mut queues, mut skipped) = select_queues(
        &mgmt,
        source,
        opts,
        broker_version.get(),
        // A broker without statistics keeps the full listing, whose missing counts its
        // handling (`unacked`) was made and tested on.
        if statistics {
            listing::Listing::Live
        } else {
            listing::Listing::Full
        },
    )?;
    let earlier_run =
        earlier_run::EarlierRun::find(target.connection_prefix(), interrupted.is_some(), &lock);
    if let Some(shard) = &target.shard {
        let all = queues.len();
        queues.retain(|q| shard.owns(&q.vhost, &q.name));
        skipped.retain(|q| shard.owns(&q.vhost, &q.name));
        log::info!(
            "{}: {} of the {all} selected queue(s) are this part's",
            target.label(),
            queues.len()
        );
    }
    log::info!(
        "{}: {} queue(s) selected, {} skipped",
        target.label(),
        queues.len(),
        skipped.len()
    );
    for q in &skipped {
        metrics::global()
            .queues_skipped
            .with([&q.name, &q.vhost, &q.queue_type])
            .inc();
    }
    let compression = Compression::from(opts.compression);
    if opts.include_definitions && target.exports_definitions() {
        lock.check()?;
        manifest.definitions = Some(definitions::export(
            &mgmt,
            storage.as_ref(),
            backup_id,
            compression,
            opts.compression_level,
            recipients.as_ref(),
        )?);
    }

    let display = progress::start(
        &format!("backup {backup_id}"),
        queues.len(),
        queues.iter().map(|q| q.messages).sum(),
    );
    let ctx = QueueContext {
        read: ReadContext {
            source,
            nodes,
            tls: resolved.broker,
            opts,
            earlier_run,
            broker_version,
            cluster: overview.cluster_name,
            statistics,
            mgmt: &mgmt,
            left_out: Mutex::new(Vec::new()),
            stop: alarm::Stop::default(),
            lock: &lock,
        },
        store: StoreContext {
            opts,
            backup_id,
            checkpoint_id: target.checkpoint_id(),
            compression,
            encrypt: recipients.as_ref(),
            spool: spool.path(),
            storage: storage.as_ref(),
            checkpoints: checkpoints.as_deref(),
            earlier,
            retried: Mutex::new(std::collections::HashSet::new()),
        },
    };
    let results = run_queues(&ctx, storage.clone(), &queues);
    drop(display);
    let ctx_earlier_keys = ctx.store.earlier.keys;
    let retried = ctx
        .store
        .retried
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let left_out = ctx
        .read
        .left_out
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());

    let mut first_error: Option<Error> = None;
    let mut failures = 0usize;
    let mut deleted = Vec::new();
    for (info, result) in queues.iter().zip(results) {
        match result {
            Ok(Finished::Backup(q)) => manifest.queues.push(q),
            Ok(Finished::Deleted) => {
                deleted.push(format!("queue {} in vhost {}", info.name, info.vhost))
            }
            Ok(Finished::Skipped(q)) => {
                metrics::global()
                    .queues_skipped
                    .with([&q.name, &q.vhost, &q.queue_type])
                    .inc();
                skipped.push(q);
            }
            Err(e) => {
                failures += 1;
                log::error!(
                    vhost = info.vhost.as_str(), queue = info.name.as_str(), error_type = e.error_type();
                    "queue {} in vhost {} failed: {e}", info.name, info.vhost
                );
                metrics::global().error(&info.name, &info.vhost, &e);
                first_error.get_or_insert(e);
            }
        }
    }
    manifest
        .queues
        .sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    manifest.recompute_totals();
    if let Some(why) = lock.lost() {
        // The other run owns the manifest now: leave it alone. The lock is why the queues
        // stopped.
        *queue_failed = first_error.is_some();
        return Err(Error::Storage(why));
    }
    // The last sync of the checkpoint database before the manifest: a backup whose checkpoint
    // could not be stored is not called complete.
    let sync_failed = syncer.and_then(|s| s.finish().err());
    if first_error.is_none() && sync_failed.is_none() {
        manifest.completed_at = Some(now_ms());
    }
    manifest_writer.write(storage.as_ref(), &lock, &manifest)?;
    if manifest.completed_at.is_some() && (ctx_earlier_keys > 0 || !retried.is_empty()) {
        // Segments of an earlier run (any queue), or of this run's abandoned attempts.
        let only = (ctx_earlier_keys == 0).then_some(&retried);
        resume::remove_unlisted_segments(
            storage.as_ref(),
            manifest_writer.key(),
            &manifest,
            &lock,
            only,
        );
    }
    lock.release();
    if target.shard.is_some() && manifest.completed_at.is_some() {
        merge_parts(storage.as_ref(), &target);
    }

    if let Some(e) = first_error {
        log::error!(
            "{} is incomplete: {failures} of {} queue(s) failed; its manifest has completed_at null",
            target.label(),
            queues.len()
        );
        *queue_failed = true;
        return Err(e);
    }
    if let Some(e) = sync_failed {
        log::error!(
            "{} is incomplete: the checkpoint database could not be synced; its manifest has completed_at null",
            target.label()
        );
        return Err(e);
    }
    Ok(BackupSummary {
        backup_id: backup_id.to_string(),
        queues: manifest.queues.len(),
        messages: manifest.total_messages,
        bytes: manifest.total_bytes,
        segments: manifest.total_segments,
        skipped,
        left_out,
        deleted,
        elapsed: started.elapsed(),
    })
}

/// Backs up `queues` with at most `max_concurrent_queues` threads, uploader threads for the
/// finished segments, and one thread that completes each queue once its segments are stored
/// (`queue::Storing`), while its queue thread reads the next. Results are in the order of
/// `queues`.
fn run_queues(
    ctx: &QueueContext,
    storage: Arc<dyn Storage>,
    queues: &[QueueInfo],
) -> Vec<Result<Finished>> {
    // A continuous backup follows every stream at once (a stream waiting for a free thread
    // would never start).
    let limit = if ctx.read.opts.stop_at_current_depth {
        ctx.read.opts.max_concurrent_queues.max(1)
    } else {
        queues.len()
    };
    let workers = limit.min(queues.len()).max(1);
    let (upload_tx, upload_rx) = bounded::<Upload>(workers * 2);
    let (storing_tx, storing_rx) = bounded::<(usize, Storing)>(STORING);
    let next = AtomicU64::new(0);
    // Queue threads still reading; the alarm watch ends with the last.
    let running = &AtomicUsize::new(workers);
    let results: Mutex<Vec<Option<Result<Finished>>>> =
        Mutex::new((0..queues.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers.min(4) {
            let rx = upload_rx.clone();
            let storage = storage.clone();
            spawn_named(s, "segment-upload", move || {
                uploader(rx, storage.as_ref(), ctx.read.lock, ctx.store.encrypt)
            });
        }
        drop(upload_rx);
        let results = &results;
        spawn_named(s, "queue-finish", move || {
            for (i, storing) in storing_rx {
                let r = storing.finish().map(Finished::Backup);
                if let Ok(mut all) = results.lock() {
                    all[i] = Some(r);
                }
            }
        });
        spawn_named(s, "alarm-watch", move || {
            alarm::watch(ctx.read.mgmt, &ctx.read.stop, &|| {
                running.load(Ordering::SeqCst) == 0
            })
        });
        for thread in 0..workers {
            let upload_tx = upload_tx.clone();
            let storing_tx = storing_tx.clone();
            let next = &next;
            spawn_named(s, "queue-reader", move || {
                read_queues(ctx, queues, next, results, &upload_tx, &storing_tx, thread);
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
        drop(upload_tx);
        drop(storing_tx);
    });
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Io("queue thread ended without a result".into()))))
        .collect()
}

/// Queues read and not yet complete (their segments on their way to storage) that the queue
/// threads may hand on before they wait: the upload channel bounds the spool files; this
/// bounds the bookkeeping.
const STORING: usize = 256;

/// Queue thread `thread` of [`run_queues`]: backs up the next queue not taken yet, until none
/// is left, its result stored at the queue's index (or handed to `storing` until its segments
/// are stored); classic and quorum queues on one reused connection (`conns`).
fn read_queues<'a>(
    ctx: &'a QueueContext<'a>,
    queues: &'a [QueueInfo],
    next: &AtomicU64,
    results: &Mutex<Vec<Option<Result<Finished>>>>,
    upload_tx: &crossbeam_channel::Sender<Upload>,
    storing: &crossbeam_channel::Sender<(usize, Storing<'a>)>,
    thread: usize,
) {
    let mut conns = conns::ThreadConnection::new(thread);
    loop {
        let i = next.fetch_add(1, Ordering::SeqCst) as usize;
        let Some(q) = queues.get(i) else { break };
        let _log = crate::run::logging::queue_scope(&q.vhost, &q.name);
        // A retry does not start below what the listing or an earlier attempt counted.
        let listed = if q.statistics { q.messages } else { 0 };
        let (mut state, mut attempts) = (queue::Attempts::default(), 0u32);
        let r = match crate::run::signals::stop_reason("backup") {
            Some(why) => Err(Error::Io(why)),
            None if ctx.read.stop.reason().is_some() => Err(Error::Connection(
                ctx.read.stop.reason().unwrap_or_default(),
            )),
            None => retry::with_retries(ctx, q, || {
                attempts += 1;
                if q.queue_type != Some(crate::broker::QueueType::Stream) {
                    if attempts > 1 {
                        state.floor.0 = state.floor.0.max(listed);
                    }
                    let r = backup_queue(ctx, q, upload_tx, &mut conns, &mut state);
                    if r.is_err() {
                        conns.discard();
                    }
                    r
                } else if ctx.read.opts.stream_enabled {
                    stream::backup_stream(ctx, q, upload_tx).map(|b| b.map(Outcome::Done))
                } else {
                    stream_amqp::backup_stream_amqp(ctx, q, upload_tx).map(|b| b.map(Outcome::Done))
                }
            }),
        };
        if attempts > 1 {
            // Its failed attempts may have stored segments no manifest lists.
            if let Ok(mut retried) = ctx.store.retried.lock() {
                retried.insert((q.vhost.clone(), q.name.clone()));
            }
        }
        let r = match r {
            Ok(Some(Outcome::Storing(storing_queue))) => match storing.send((i, storing_queue)) {
                Ok(()) => continue,
                Err(_) => Err(Error::Io("queue finishing thread stopped".into())),
            },
            Ok(Some(Outcome::Done(b))) => Ok(Finished::Backup(b)),
            Ok(Some(Outcome::Skipped(s))) => Ok(Finished::Skipped(s)),
            Ok(None) => Ok(Finished::Deleted),
            Err(e) => Err(e),
        };
        if let Ok(mut all) = results.lock() {
            all[i] = Some(r);
        }
    }
}
