//! The restore job (SPEC.md "What the service does", restore mode, and the `restore` options).
//!
//! ```text
//! manifest ─► definitions (optional) ─► per-queue thread (≤ max_concurrent_queues): fetch segment
//!     to a spool file ─► verify CRC32 ─► decode records ─► time window ─► map names
//!     ─► publish with confirms, a window of produce_batch_size × 10 in flight
//! ```
//!
//! Every publish is `mandatory`, so a message the target cannot route comes back
//! (`basic.return`) and is counted as failed instead of vanishing. Any failed message fails the
//! run (exit 1) after every queue was tried.
//!
//! - this file: definitions, the queue threads, the run's outcome;
//! - `plan`: the plan and its summary, the dry run's checks, created queues, rerun reports;
//! - `segments`: fetching, verifying and decoding a queue's segments, and the time window;
//! - `outgoing`: a decoded record made ready to publish (its properties encoded);
//! - `publish`: publishing with confirms, the rate limit, and the restore checkpoint, over
//!   AMQP 0-9-1 or AMQP 1.0 (`crate::broker::publisher`);
//! - `amqp10`: which records go over AMQP 1.0, and the target that can take them.

mod amqp10;
mod offsets;
mod outgoing;
mod plan;
mod publish;
mod raw_stream;
pub(crate) mod segments;
mod target;

use crate::broker::amqp::ConnectOptions;
use crate::broker::definitions;
use crate::broker::management::ManagementClient;
use crate::broker::nodes::Nodes;
use crate::broker::publisher::amqp091::BasicPublisher;
use crate::broker::{BrokerVersion, QueueType};
use crate::config::RestoreEncryption;
use crate::config::{Config, PublishMode, RestoreOptions, StreamOffsets, TargetConfig};
use crate::error::{Error, Result};
use crate::metrics::{self, Counter};
use crate::repository::checkpoint::Checkpoints;
use crate::repository::encryption::Identities;
use crate::repository::manifest::{Manifest, QueueBackup};
use crate::repository::spool::{spawn_named, SpoolDir};
use crate::repository::storage::Storage;
use crate::run::progress;
use outgoing::Outgoing;
use plan::{
    check_segments_exist, create_missing_queues, mark_converted, report_rerun, restore_key,
};
pub use plan::{plan, QueueRestore, RestoreSummary};
use publish::{settle, Publisher, QueueCheckpoint, RateLimiter};
use raw_stream::StreamTarget;
use segments::decode_segments;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Confirm batches allowed in flight: up to `produce_batch_size` × this many unconfirmed publishes.
const BATCHES_IN_FLIGHT: u64 = 10;
/// Batches in flight between the decoder and the publisher.
const RECORD_BATCHES: usize = 4;

/// Runs a restore as `cfg` says, reading from `storage`.
///
/// Errors: `Storage error: Key not found: <id>/manifest.json` when the backup is absent;
/// segment damage (`Serialization error: CRC32 mismatch ...`); AMQP errors of the target
/// (`NOT_FOUND - no queue ...`); messages the target nacked or could not route.
///
/// Metrics (`crate::metrics`): published, confirmed and failed messages per target queue;
/// every failure in `broker_backup_errors`, a queue's with its target queue and vhost, the
/// job's own with empty labels.
pub fn run(cfg: &Config, storage: Arc<dyn Storage>) -> Result<RestoreSummary> {
    metrics::global().job(|queue_failed| run_job(cfg, storage, queue_failed))
}

/// [`run`]; sets `queue_failed` when the error returned is a queue's (already counted).
fn run_job(
    cfg: &Config,
    storage: Arc<dyn Storage>,
    queue_failed: &mut bool,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let target = cfg.require_target()?;
    let opts = &cfg.restore;
    let backup_id = cfg.backup_id.as_str();
    let manifest = Manifest::read(storage.as_ref(), backup_id)?;
    if manifest.completed_at.is_none() {
        let status = crate::inspect::status(storage.as_ref(), &manifest)?;
        log::warn!("backup {backup_id} is {status} (completed_at is null): restoring the queues it holds so far");
    }
    // An encrypted backup is refused before anything is imported or published when the
    // identity is missing or does not open every file this restore reads (the segments of
    // the time window; every queue is restored), or one of them is stored in clear.
    let keys = RestoreEncryption::identities(opts.encryption.as_ref())?;
    crate::repository::fetch::check_readable(
        &manifest,
        keys.as_ref(),
        manifest
            .queues
            .iter()
            .flat_map(|q| &q.segments)
            .filter(|s| segments::segment_in_window(s, opts)),
        opts.restore_definitions,
    )?;
    let keys = keys.as_ref();
    // Before the target is touched: segments are fetched here.
    let spool = SpoolDir::create(&format!("{backup_id}-restore"))?;
    let mut summary = RestoreSummary {
        backup_id: backup_id.to_string(),
        dry_run: opts.dry_run,
        queues: plan(&manifest, opts),
        ..Default::default()
    };

    let resolved = crate::broker::tls::resolve(
        &target.amqp_url,
        target.management_url.as_ref(),
        target.tls.as_ref(),
        "target.tls",
    )?;
    let mgmt = management(target, resolved.management.as_deref())?;
    if opts.restore_definitions {
        match (&manifest.definitions, &mgmt) {
            (Some(entry), Some(mgmt)) => {
                let mut dopts = opts.clone();
                dopts.definitions_dry_run |= opts.dry_run;
                // The target's definitions saved before the import hold password hashes:
                // they are encrypted to the restorer's own identity, never to the keys
                // manifest.json lists (anyone who can write to the storage can add one).
                // Without an identity (an unencrypted backup) they are stored as before,
                // compressed only.
                let rollback_to = keys.map(Identities::recipients);
                let imported = definitions::import(
                    mgmt,
                    storage.as_ref(),
                    backup_id,
                    entry,
                    &dopts,
                    target_version(mgmt)?,
                    keys,
                    rollback_to.as_ref(),
                )?;
                mark_converted(&mut summary.queues, &imported.converted);
                summary.definitions = Some(imported);
            }
            (None, _) => {
                log::warn!("backup {backup_id} holds no definitions: restore_definitions skipped")
            }
            (_, None) => {
                return Err(Error::Config(
                    "target.management_url is required when restore.restore_definitions is true"
                        .into(),
                ))
            }
        }
    }
    if opts.dry_run {
        check_segments_exist(storage.as_ref(), &manifest)?;
        summary.elapsed = started.elapsed();
        return Ok(summary);
    }
    if opts.create_missing_queues && opts.publish_mode == PublishMode::DirectToQueue {
        let mgmt = mgmt.as_ref().ok_or_else(|| {
            Error::Config(
                "target.management_url is required when restore.create_missing_queues is true"
                    .into(),
            )
        })?;
        create_missing_queues(mgmt, &summary.queues)?;
    }
    let stream_tls = resolved.urls.first().is_some_and(|u| u.tls);
    let first_url = resolved.urls.first().cloned();
    // Whether each target is a stream (the decimal headers a stream refuses and the records a
    // restore publishes over the stream protocol depend on it), and the node of each.
    let nodes = target::look(mgmt.as_ref(), resolved.urls, &mut summary.queues)?;

    if opts.checkpoint_interval_secs != 60 {
        log::warn!("restore.checkpoint_interval_secs is set but has no effect: a restore records each queue's confirmed prefix whenever it moves");
    }
    let checkpoints = match &opts.checkpoint_state {
        Some(path) => Some(Checkpoints::open_file(path)?),
        None => {
            log::info!("no restore.checkpoint_state: if this restore is interrupted, a rerun publishes every message again");
            None
        }
    };
    let limiter = RateLimiter::new(opts.rate_limit_messages_per_sec);
    // Every queue's connection starts from these (its vhost and name set per queue).
    let stream_port = target.stream_port_for(stream_tls);
    let Some(first_url) = first_url else {
        return Err(Error::Config("target.amqp_url names no URL".into()));
    };
    let mut connect = ConnectOptions::new(first_url);
    connect.tls = resolved.broker;
    connect.blocked_timeout = Duration::from_secs(opts.blocked_timeout_secs);
    let jobs: Vec<(usize, &QueueBackup)> = manifest.queues.iter().enumerate().collect();
    let next = AtomicU64::new(0);
    // Per queue, in manifest order: its entry (counts so far) and how its restore ended.
    type Outcome = Option<(QueueRestore, Result<()>)>;
    let results: Mutex<Vec<Outcome>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = opts.max_concurrent_queues.max(1).min(jobs.len().max(1));
    // Record decoding shares the cores among the queues restored at once.
    let decode_workers = segments::decode_workers(workers);
    let display = progress::start(
        &format!("restore {backup_id}"),
        summary.queues.len(),
        summary.queues.iter().map(|q| q.in_backup).sum(),
    );
    std::thread::scope(|s| {
        for _ in 0..workers {
            spawn_named(s, "queue-publisher", || loop {
                let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                let Some((index, backup)) = jobs.get(i) else {
                    break;
                };
                let mut entry = summary.queues[*index].clone();
                let _log =
                    crate::run::logging::queue_scope(&entry.source_vhost, &entry.source_queue);
                let checkpoint = checkpoints.as_ref().map(|cp| QueueCheckpoint {
                    store: cp,
                    key: restore_key(backup_id, &entry),
                });
                let r = match crate::run::signals::stop_reason("restore") {
                    Some(why) => Err(Error::Io(why)),
                    None => restore_queue(
                        &nodes,
                        &connect,
                        stream_port,
                        opts,
                        storage.as_ref(),
                        spool.path(),
                        &limiter,
                        backup,
                        &mut entry,
                        checkpoint.as_ref(),
                        decode_workers,
                        keys,
                    ),
                };
                if let Ok(mut all) = results.lock() {
                    all[*index] = Some((entry, r));
                }
            });
        }
    });
    drop(display);
    let mut first_error = None;
    let mut failed = vec![false; summary.queues.len()];
    for (i, r) in results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .enumerate()
    {
        match r {
            Some((q, Ok(()))) => summary.queues[i] = q,
            Some((q, Err(e))) => {
                summary.queues[i] = q;
                failed[i] = true;
                let q = &summary.queues[i];
                log::error!(
                    vhost = q.source_vhost.as_str(), queue = q.source_queue.as_str(), error_type = e.error_type();
                    "queue {} in vhost {} failed: {e}",
                    q.source_queue,
                    q.source_vhost
                );
                metrics::global().error(&q.target_queue, &q.target_vhost, &e);
                if first_error.is_none() {
                    *queue_failed = true;
                }
                first_error.get_or_insert(e);
            }
            None => {
                first_error
                    .get_or_insert(Error::Io("restore thread ended without a result".into()));
            }
        }
    }
    summary.elapsed = started.elapsed();
    if let Some(e) = first_error {
        let reported = summary.queues.iter().zip(&failed);
        for (q, _) in reported.filter(|(q, failed)| q.published > 0 || **failed) {
            let recorded = checkpoints
                .as_ref()
                .map(|cp| cp.restore_queue(&restore_key(backup_id, q)));
            report_rerun(q, recorded);
        }
        return Err(e);
    }
    let failed = summary.failed();
    if failed > 0 {
        return Err(Error::Amqp(format!(
            "{failed} message(s) were not accepted by the target broker (nacked or unroutable); see the log for the queues"
        )));
    }
    Ok(summary)
}

/// The target's RabbitMQ version (`rabbitmq_version` of `GET /api/overview`), which decides
/// whether the definitions need migrating (`definitions::import`); `None` when the broker does
/// not say or says something else than a version.
///
/// Errors: the management API's.
fn target_version(mgmt: &ManagementClient) -> Result<Option<BrokerVersion>> {
    let version = mgmt.overview()?.broker_version;
    Ok(version.as_deref().and_then(BrokerVersion::parse))
}

fn management(
    target: &TargetConfig,
    tls: Option<&crate::broker::tls::TlsClient>,
) -> Result<Option<ManagementClient>> {
    match (
        &target.management_url,
        &target.management_username,
        &target.management_password,
    ) {
        (Some(url), Some(user), Some(password)) => Ok(Some(ManagementClient::for_nodes(
            url.all(),
            user,
            password.expose(),
            tls,
        )?)),
        _ => Ok(None),
    }
}

/// What becomes of the consumer offsets `backup` holds (`restore.stream_offsets`): a
/// [`offsets::Translation`] when they are to be translated into a stream target.
fn consumer_offsets(
    opts: &RestoreOptions,
    backup: &QueueBackup,
    entry: &QueueRestore,
) -> Option<offsets::Translation> {
    if backup.consumer_offsets.is_empty() || opts.stream_offsets == StreamOffsets::Skip {
        return None;
    }
    if !entry.target_is_stream {
        log::warn!(
            "queue {} in vhost {}: the consumer offsets of stream {} are not restored: the target is not a stream",
            entry.target_queue,
            entry.target_vhost,
            entry.source_queue
        );
        return None;
    }
    Some(offsets::Translation::new(&backup.consumer_offsets))
}

/// Restores one queue of the backup on its own connection.
#[allow(clippy::too_many_arguments)]
fn restore_queue(
    nodes: &Nodes,
    connect: &ConnectOptions,
    stream_port: u16,
    opts: &RestoreOptions,
    storage: &dyn Storage,
    spool: &Path,
    limiter: &RateLimiter,
    backup: &QueueBackup,
    entry: &mut QueueRestore,
    checkpoint: Option<&QueueCheckpoint>,
    decode_workers: usize,
    keys: Option<&Identities>,
) -> Result<()> {
    if let Some(cp) = checkpoint {
        if let Some((done, completed)) = cp.store.restore_queue(&cp.key)? {
            entry.done_earlier = done;
            entry.completed_earlier = completed;
        }
    }
    if entry.completed_earlier {
        log::info!(
            "queue {} in vhost {}: restored completely by an earlier run ({} records); skipped",
            entry.source_queue,
            entry.source_vhost,
            entry.done_earlier
        );
        return Ok(());
    }
    if entry.done_earlier > 0 {
        log::info!(
            "queue {} in vhost {}: an earlier run published and had confirmed {} records; resuming after them",
            entry.source_queue,
            entry.source_vhost,
            entry.done_earlier
        );
    }
    if entry.segments == 0 {
        log::info!(
            "queue {} in vhost {}: nothing to publish",
            entry.source_queue,
            entry.source_vhost
        );
        return Ok(());
    }
    let mut options = connect.clone();
    options.url.vhost = entry.target_vhost.clone();
    options.connection_name = format!(
        "rmq-backup restore {}/{}",
        entry.target_vhost, entry.target_queue
    );
    let conn = nodes.connect(&options, entry.target_node.as_deref())?;
    // Resolved once: the per-message updates are relaxed atomic adds.
    let m = metrics::global().restore_queue(
        &entry.target_queue,
        &entry.target_vhost,
        entry.queue_type.unwrap_or(QueueType::Classic).as_str(),
    );
    let bytes = Counter::default();
    let _row = progress::row(
        format!("{} (vhost {})", entry.target_queue, entry.target_vhost),
        entry.in_backup,
        m.published.clone(),
        bytes.clone(),
    );
    let channel = conn.open_channel()?;
    // Records holding AMQP 1.0 messages go to the same node, vhost, credentials and TLS.
    let mut amqp10_options = crate::broker::amqp10::ConnectOptions::new(
        entry
            .target_node
            .as_deref()
            .and_then(|n| nodes.address_of(n))
            .unwrap_or(&options.url)
            .clone(),
    );
    amqp10_options.url.vhost = entry.target_vhost.clone();
    amqp10_options.tls = options.tls.clone();
    amqp10_options.blocked_timeout = options.blocked_timeout;
    amqp10_options.connection_name = options.connection_name.clone();
    let amqp10 = amqp10::Amqp10Target {
        options: amqp10_options,
        version: amqp10::version_of(conn.server_properties()),
    };
    if opts.publish_mode == PublishMode::DirectToQueue {
        // A missing queue fails here, with the broker's NOT_FOUND, before anything is published.
        channel.queue_declare_passive(&entry.target_queue)?;
    }
    if opts.publisher_confirms {
        channel.confirm_select()?;
    }
    let window = (opts.produce_batch_size as u64).max(1) * BATCHES_IN_FLIGHT;
    let started = Instant::now();
    log::info!(
        "queue {} in vhost {}: restoring {} messages to {} in vhost {}",
        entry.source_queue,
        entry.source_vhost,
        entry.in_backup,
        entry.target_queue,
        entry.target_vhost
    );
    // One thread fetches, verifies and decodes segments; this one publishes. Batches in between
    // keep memory bounded while decoding overlaps the wait for confirms.
    let mut stream_options =
        crate::broker::stream::StreamOptions::from_amqp_url(&options.url, stream_port);
    stream_options.tls = options.tls.clone();
    stream_options.connection_name = options.connection_name.clone();
    let mut translation = consumer_offsets(opts, backup, entry);
    let (tx, rx) = crossbeam_channel::bounded::<Vec<Outgoing>>(RECORD_BATCHES);
    let outside_window = AtomicU64::new(0);
    let outside = &outside_window;
    let skip = entry.done_earlier;
    let (decoded, published) = std::thread::scope(|s| {
        // The sender moves into the decoder: when it ends, the publisher's loop ends.
        let decoder = spawn_named(s, "segment-decoder", move || {
            let _log = crate::run::logging::queue_scope(&backup.vhost, &backup.name);
            decode_segments(
                opts,
                storage,
                spool,
                backup,
                &tx,
                outside,
                skip,
                decode_workers,
                keys,
            )
        });
        let publisher = Publisher {
            channel: &channel,
            opts,
            limiter,
            window,
            m: &m,
            bytes: &bytes,
            checkpoint,
            to_stream: entry.target_is_stream && opts.publish_mode == PublishMode::DirectToQueue,
            amqp10: &amqp10,
        };
        // A stream target takes the records that hold whole AMQP 1.0 messages over the
        // stream protocol (`raw_stream`).
        let mut raw = entry
            .target_is_stream
            .then(|| StreamTarget::new(stream_options.clone(), &entry.target_queue));
        let published = publisher.publish_records(&rx, entry, raw.as_mut(), translation.as_mut());
        if let Some(raw) = raw {
            if let Err(e) = raw.close() {
                log::debug!(
                    "closing the stream connection of {}: {e}",
                    entry.target_queue
                );
            }
        }
        // Unblock the decoder if publishing stopped early.
        drop(rx);
        let decoded = decoder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("segment decoder panicked".into())));
        (decoded, published)
    });
    entry.outside_window = outside_window.load(Ordering::Relaxed);
    published?;
    decoded?;
    if !opts.publisher_confirms {
        // Without confirms, a synchronous round trip guarantees that every basic.return of
        // the publishes before it has arrived.
        channel.basic_qos(0, false)?;
    }
    settle(&mut BasicPublisher::new(&channel), 0, entry, &m)?;
    if let Some(cp) = checkpoint {
        if entry.failed == 0 {
            cp.store
                .restore_progress(&cp.key, entry.done_earlier + entry.published, true)?;
        }
    }
    if let (Some(t), 0) = (translation, entry.failed) {
        let name = format!(
            "queue {} in vhost {}",
            entry.target_queue, entry.target_vhost
        );
        offsets::store(
            t,
            &stream_options,
            &entry.target_queue,
            entry.done_earlier,
            &name,
        )?;
    }
    channel.close()?;
    conn.close()?;
    log::info!(
        "queue {} in vhost {}: {} published, {} confirmed, {} failed, {} outside the time window, {:.1} s",
        entry.target_queue,
        entry.target_vhost,
        entry.published,
        entry.confirmed,
        entry.failed,
        entry.outside_window,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests;
