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
//! - `queue`: one queue's connection, read and record batches;
//! - `segments`: encoding, compression into segments, rotation, and the uploaders.

mod queue;
mod resume;
mod segments;
mod select;
mod stream;
mod stream_amqp;

use crate::checkpoint::{self, Checkpoints};
use crate::config::{BackupOptions, Config, SourceConfig};
use crate::definitions;
use crate::error::{Error, Result};
use crate::lock::RunLock;
use crate::management::{ManagementClient, QueueInfo};
use crate::manifest::{self, Manifest, QueueBackup};
use crate::metrics;
use crate::now_ms;
use crate::progress;
use crate::segment::Compression;
use crate::spool::{spawn_named, SpoolDir};
use crate::storage::Storage;
use crossbeam_channel::bounded;
use queue::backup_queue;
use segments::{uploader, Upload};
use select::select_queues;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    refuse_to_overwrite(storage.as_ref(), backup_id)?;
    if let Some(n) = opts.prefetch_count {
        log::warn!(
            "backup.prefetch_count is {n} but is not used: a one-shot backup must hold a queue's whole depth unacknowledged, so each consumer's prefetch is sized to the messages it must hold (up to 65,535, more consumers beyond)"
        );
    }

    let (amqp_url, tls) = crate::tls::resolve(
        &source.amqp_url,
        Some(&source.management_url),
        source.tls.as_ref(),
        "source.tls",
    )?;
    let mgmt = ManagementClient::new(
        &source.management_url,
        &source.management_username,
        source.management_password.expose(),
        tls.as_deref(),
    )?;
    let mut manifest = Manifest::new(backup_id, now_ms());
    let overview = mgmt.overview()?;
    manifest.source_cluster = overview.cluster_name;
    manifest.broker_version = overview.broker_version;
    check_memory_headroom(&mgmt)?;
    // The lock's heartbeat tells a running backup from an interrupted one, and keeps a second
    // run off this backup id while this one lives.
    let lock = RunLock::acquire(storage.clone(), backup_id)?;
    // Again under the lock: a run this one waited for may have completed the backup meanwhile.
    let interrupted_before = refuse_to_overwrite(storage.as_ref(), backup_id)?;
    if interrupted_before {
        log::warn!(
            "backup {backup_id} in {} was interrupted earlier; it is written again from the start",
            storage.location()
        );
    }
    // A manifest with completed_at null first: a run that dies from here on reads as
    // interrupted, and never leaves an older manifest in front of new segments.
    write_manifest(storage.as_ref(), &manifest)?;
    let (checkpoints, syncer) = match &cfg.offset_storage {
        Some(os) => {
            let (cp, syncer) =
                checkpoint::sync::start(os, storage.clone(), opts.sync_interval_secs)?;
            (Some(cp), syncer)
        }
        None => {
            if interrupted_before {
                log::warn!("no offset_storage configured: every queue is read again from the start (the broker still holds them all), and the segments of the earlier run are replaced");
            }
            (None, None)
        }
    };

    let (queues, skipped) = select_queues(&mgmt, source)?;
    log::info!(
        "backup {backup_id}: {} queue(s) selected, {} skipped",
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
    if opts.include_definitions {
        manifest.definitions = Some(definitions::export(
            &mgmt,
            storage.as_ref(),
            backup_id,
            compression,
            opts.compression_level,
        )?);
    }

    let spool = SpoolDir::create(backup_id)?;
    let display = progress::start(
        &format!("backup {backup_id}"),
        queues.len(),
        queues.iter().map(|q| q.messages).sum(),
    );
    let ctx = QueueContext {
        source,
        amqp_url,
        tls,
        opts,
        backup_id,
        compression,
        spool: spool.path(),
        stop: AtomicBool::new(false),
        lock: &lock,
        storage: storage.as_ref(),
        checkpoints: checkpoints.as_deref(),
        rerun: interrupted_before,
    };
    let results = run_queues(&ctx, storage.clone(), &queues);
    drop(display);

    let mut first_error: Option<Error> = None;
    let mut failures = 0usize;
    let mut deleted = Vec::new();
    for (info, result) in queues.iter().zip(results) {
        match result {
            Ok(Some(q)) => manifest.queues.push(q),
            Ok(None) => deleted.push(format!("queue {} in vhost {}", info.name, info.vhost)),
            Err(e) => {
                failures += 1;
                log::error!("queue {} in vhost {} failed: {e}", info.name, info.vhost);
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
        // The other run owns the manifest now: leave it alone.
        *queue_failed = first_error.is_some();
        return Err(first_error.unwrap_or(Error::Config(why)));
    }
    // The last sync of the checkpoint database before the manifest: a backup whose checkpoint
    // could not be stored is not called complete.
    let sync_failed = syncer.and_then(|s| s.finish().err());
    if first_error.is_none() && sync_failed.is_none() {
        manifest.completed_at = Some(now_ms());
    }
    write_manifest(storage.as_ref(), &manifest)?;
    if interrupted_before && manifest.completed_at.is_some() {
        resume::remove_unlisted_segments(storage.as_ref(), &manifest);
    }
    lock.release();

    if let Some(e) = first_error {
        log::error!(
            "backup {backup_id} is incomplete: {failures} of {} queue(s) failed; its manifest has completed_at null",
            queues.len()
        );
        *queue_failed = true;
        return Err(e);
    }
    if let Some(e) = sync_failed {
        log::error!("backup {backup_id} is incomplete: the checkpoint database could not be synced; its manifest has completed_at null");
        return Err(e);
    }
    Ok(BackupSummary {
        backup_id: backup_id.to_string(),
        queues: manifest.queues.len(),
        messages: manifest.total_messages,
        bytes: manifest.total_bytes,
        segments: manifest.total_segments,
        skipped,
        deleted,
        elapsed: started.elapsed(),
    })
}

fn write_manifest(storage: &dyn Storage, manifest: &Manifest) -> Result<()> {
    storage.put_bytes(
        &manifest::manifest_key(&manifest.backup_id),
        manifest.to_json_pretty()?.as_bytes(),
    )
}

/// A completed backup is never overwritten: its segments are the only copy of the messages.
/// Returns true when an interrupted backup with this id exists (it is written again).
fn refuse_to_overwrite(storage: &dyn Storage, backup_id: &str) -> Result<bool> {
    let key = manifest::manifest_key(backup_id);
    if storage.head(&key)?.is_none() {
        return Ok(false);
    }
    let existing = Manifest::from_json(&storage.get_bytes(&key)?)?;
    if existing.completed_at.is_some() {
        return Err(Error::Config(format!(
            "backup {backup_id} already exists and is complete in {}; choose another backup_id",
            storage.location()
        )));
    }
    Ok(true)
}

/// A broker under a memory alarm blocks publishers; reading it now would only add pressure.
fn check_memory_headroom(mgmt: &ManagementClient) -> Result<()> {
    for node in mgmt.nodes_memory()? {
        if node.mem_alarm {
            return Err(Error::Amqp(format!(
                "broker node {} has a memory alarm ({} of {} bytes used); backup not started, every message left in place",
                node.name, node.mem_used, node.mem_limit
            )));
        }
        if node.mem_limit > 0 && node.mem_used > node.mem_limit / 10 * 8 {
            log::warn!(
                "broker node {} uses {} of its {} bytes memory limit",
                node.name,
                node.mem_used,
                node.mem_limit
            );
        }
    }
    Ok(())
}

/// What every queue thread shares.
pub(super) struct QueueContext<'a> {
    source: &'a SourceConfig,
    /// `source.amqp_url` with `source.tls` applied (`crate::tls::resolve`).
    amqp_url: crate::amqp::AmqpUrl,
    /// The source's TLS settings, when it uses TLS.
    tls: Option<Arc<crate::tls::TlsClient>>,
    opts: &'a BackupOptions,
    backup_id: &'a str,
    compression: Compression,
    spool: &'a Path,
    /// Set when the run must stop (a queue saw the broker block its connection).
    stop: AtomicBool,
    /// The run's lock: when another run takes it over, this one stops.
    lock: &'a RunLock,
    /// Where segments go (and, on a rerun, where the earlier run's are found).
    storage: &'a dyn Storage,
    /// The `offset_storage` checkpoint database, when configured.
    checkpoints: Option<&'a Checkpoints>,
    /// True when an interrupted run of this backup id came before this one.
    rerun: bool,
}

impl QueueContext<'_> {
    /// The source's URL (TLS applied) with `vhost`.
    fn url_of(&self, vhost: &str) -> crate::amqp::AmqpUrl {
        let mut url = self.amqp_url.clone();
        url.vhost = vhost.to_string();
        url
    }

    /// Connection options for `vhost` on the source (TLS as configured), shown in the
    /// management UI as `connection_name`.
    fn connect_options(&self, vhost: &str, connection_name: String) -> crate::amqp::ConnectOptions {
        let mut options = crate::amqp::ConnectOptions::new(self.url_of(vhost));
        options.connection_name = connection_name;
        options.tls = self.tls.clone();
        options
    }

    /// Stream-protocol options for `vhost` on the source: its stream port (5551 by default
    /// with TLS) and TLS as configured.
    fn stream_options(&self, vhost: &str, connection_name: String) -> crate::stream::StreamOptions {
        let url = self.url_of(vhost);
        let port = self.source.stream_port_for(url.tls);
        let mut options = crate::stream::StreamOptions::from_amqp_url(&url, port);
        options.connection_name = connection_name;
        options.tls = self.tls.clone();
        options
    }
}

/// Backs up `queues` with at most `max_concurrent_queues` threads, and uploader threads for the
/// finished segments. Results are in the order of `queues`.
fn run_queues(
    ctx: &QueueContext,
    storage: Arc<dyn Storage>,
    queues: &[QueueInfo],
) -> Vec<Result<Option<QueueBackup>>> {
    // A continuous backup follows every stream at once (a stream waiting for a free thread
    // would never start).
    let limit = if ctx.opts.stop_at_current_depth {
        ctx.opts.max_concurrent_queues.max(1)
    } else {
        queues.len()
    };
    let workers = limit.min(queues.len()).max(1);
    let (upload_tx, upload_rx) = bounded::<Upload>(workers * 2);
    let next = AtomicU64::new(0);
    let results: Mutex<Vec<Option<Result<Option<QueueBackup>>>>> =
        Mutex::new((0..queues.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers.min(4) {
            let rx = upload_rx.clone();
            let storage = storage.clone();
            spawn_named(s, "segment-upload", move || {
                uploader(rx, storage.as_ref(), ctx.checkpoints, ctx.backup_id)
            });
        }
        drop(upload_rx);
        for _ in 0..workers {
            let upload_tx = upload_tx.clone();
            let next = &next;
            let results = &results;
            spawn_named(s, "queue-reader", move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                let Some(q) = queues.get(i) else { break };
                let r = match crate::signals::stop_reason("backup") {
                    Some(why) => Err(Error::Io(why)),
                    None if q.queue_type == Some(crate::broker::QueueType::Stream) => {
                        if ctx.opts.stream_enabled {
                            stream::backup_stream(ctx, q, &upload_tx)
                        } else {
                            stream_amqp::backup_stream_amqp(ctx, q, &upload_tx)
                        }
                    }
                    None => backup_queue(ctx, q, &upload_tx),
                };
                if let Ok(mut all) = results.lock() {
                    all[i] = Some(r);
                }
            });
        }
        drop(upload_tx);
    });
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Io("queue thread ended without a result".into()))))
        .collect()
}
