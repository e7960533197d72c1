//! The plan of a restore and its summary: which queue of the backup goes where, what the time
//! window keeps, the dry run's checks, the queues created on the target, and what a rerun will
//! do after a failure.

use super::segments::segment_in_window;
use crate::broker::definitions::ImportSummary;
use crate::broker::management::ManagementClient;
use crate::broker::QueueType;
use crate::config::RestoreOptions;
use crate::error::{Error, Result};
use crate::repository::checkpoint::RestoreKey;
use crate::repository::manifest::Manifest;
use crate::repository::storage::Storage;
use std::time::Duration;

/// What a restore did (or, in a dry run, would do).
#[derive(Debug, Clone, Default)]
pub struct RestoreSummary {
    pub backup_id: String,
    pub dry_run: bool,
    pub queues: Vec<QueueRestore>,
    pub definitions: Option<ImportSummary>,
    pub elapsed: Duration,
}

impl RestoreSummary {
    /// Messages published, over all queues.
    pub fn published(&self) -> u64 {
        self.queues.iter().map(|q| q.published).sum()
    }
    /// Messages confirmed by the target, over all queues.
    pub fn confirmed(&self) -> u64 {
        self.queues.iter().map(|q| q.confirmed).sum()
    }
    /// Messages nacked or returned by the target, over all queues.
    pub fn failed(&self) -> u64 {
        self.queues.iter().map(|q| q.failed).sum()
    }
}

/// One queue of the plan and, after the run, what happened to it.
#[derive(Debug, Clone, Default)]
pub struct QueueRestore {
    pub source_vhost: String,
    pub source_queue: String,
    pub target_vhost: String,
    pub target_queue: String,
    pub queue_type: Option<QueueType>,
    /// A classic queue in the backup that the definitions import declares as a quorum queue
    /// (`restore.convert_mirrored_queues`); `queue_type` is then `Quorum`.
    pub converted_to_quorum: bool,
    /// The target is a stream (publish_mode `direct-to-queue`): headers a stream cannot
    /// store are refused before they are published.
    pub target_is_stream: bool,
    /// The node that hosts the target queue (management API), published through when it has
    /// a node-local address (`crate::broker::nodes`).
    pub target_node: Option<String>,
    /// Messages in the backup for this queue.
    pub in_backup: u64,
    /// Segments whose time range meets the window.
    pub segments: usize,
    pub published: u64,
    pub confirmed: u64,
    pub failed: u64,
    /// Records left out by `time_window_start` / `time_window_end`.
    pub outside_window: u64,
    /// Records an earlier run of this restore published and the broker confirmed
    /// (`restore.checkpoint_state`): skipped by this run.
    pub done_earlier: u64,
    /// True when an earlier run completed this queue (nothing is published again).
    pub completed_earlier: bool,
}

/// The checkpoint key of queue `q` of a restore of `backup_id`.
pub(super) fn restore_key(backup_id: &str, q: &QueueRestore) -> RestoreKey {
    RestoreKey {
        backup_id: backup_id.to_string(),
        source_vhost: q.source_vhost.clone(),
        source_queue: q.source_queue.clone(),
        target_vhost: q.target_vhost.clone(),
        target_queue: q.target_queue.clone(),
    }
}

/// After a failed restore: what a rerun will do with queue `q`, which published messages, by
/// what the checkpoint database (`recorded`, when `restore.checkpoint_state` is set) holds.
pub(super) fn report_rerun(q: &QueueRestore, recorded: Option<Result<Option<(u64, bool)>>>) {
    let name = format!("queue {} in vhost {}", q.target_queue, q.target_vhost);
    let published = q.published;
    if published == 0 {
        let from = match recorded {
            Some(Ok(Some((done, false)))) if done > 0 => {
                format!("resumes after the first {done} record(s) the checkpoint holds")
            }
            Some(_) => "restores it from its start".to_string(),
            None => "restores it from its start (no restore.checkpoint_state)".to_string(),
        };
        log::error!("{name}: nothing was published before the restore failed; a rerun {from}");
        return;
    }
    match recorded {
        Some(Ok(Some((_, true)))) => log::info!(
            "{name}: restored completely ({published} message(s) published by this run, {} confirmed); a rerun with the same restore.checkpoint_state skips it",
            q.confirmed
        ),
        Some(Ok(Some((done, false)))) => {
            let again = (q.done_earlier + published).saturating_sub(done);
            log::error!(
                "{name}: {published} message(s) were published before the restore failed; the checkpoint holds the first {done} record(s) of the queue, so a rerun with the same restore.checkpoint_state resumes after them and publishes the {again} after them again"
            )
        }
        Some(Ok(None)) => log::error!(
            "{name}: {published} message(s) were published before the restore failed and none was checkpointed yet; a rerun publishes them again"
        ),
        Some(Err(e)) => log::error!(
            "{name}: {published} message(s) were published before the restore failed; the checkpoint database cannot say what a rerun skips ({e})"
        ),
        None => log::error!(
            "{name}: {published} message(s) were published before the restore failed; without restore.checkpoint_state a rerun publishes them again"
        ),
    }
}

/// Maps each queue of the manifest to its target and counts what the time window keeps.
pub fn plan(manifest: &Manifest, opts: &RestoreOptions) -> Vec<QueueRestore> {
    manifest
        .queues
        .iter()
        .map(|q| QueueRestore {
            source_vhost: q.vhost.clone(),
            source_queue: q.name.clone(),
            target_vhost: opts
                .vhost_mapping
                .get(&q.vhost)
                .cloned()
                .unwrap_or_else(|| q.vhost.clone()),
            target_queue: opts
                .queue_mapping
                .get(&q.name)
                .cloned()
                .unwrap_or_else(|| q.name.clone()),
            queue_type: Some(q.queue_type),
            in_backup: q.message_count,
            segments: q
                .segments
                .iter()
                .filter(|s| segment_in_window(s, opts))
                .count(),
            ..Default::default()
        })
        .collect()
}

/// Marks the queues of the plan that the definitions import converted to quorum queues
/// (`converted`: (vhost, queue) as named in the backup): they are published to, and created by
/// `create_missing_queues`, as quorum queues.
pub(super) fn mark_converted(plan: &mut [QueueRestore], converted: &[(String, String)]) {
    for q in plan.iter_mut().filter(|q| {
        converted
            .iter()
            .any(|(v, n)| *v == q.source_vhost && *n == q.source_queue)
    }) {
        q.queue_type = Some(QueueType::Quorum);
        q.converted_to_quorum = true;
    }
}

/// Dry run: every segment the manifest lists must be in storage with its recorded size.
pub(super) fn check_segments_exist(storage: &dyn Storage, manifest: &Manifest) -> Result<()> {
    for q in &manifest.queues {
        for s in &q.segments {
            match storage.head(&s.key)? {
                None => return Err(Error::Storage(format!("Key not found: {}", s.key))),
                Some(size) if size != s.size_bytes => {
                    return Err(Error::Storage(format!(
                        "segment {} is {size} bytes but the manifest says {}",
                        s.key, s.size_bytes
                    )))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// Declares the target queues that do not exist yet, with the arguments of SPEC.md
/// ("Created queue arguments when create_missing_queues applies"); a queue converted to a
/// quorum queue ([`mark_converted`]) is declared a quorum queue.
pub(super) fn create_missing_queues(mgmt: &ManagementClient, plan: &[QueueRestore]) -> Result<()> {
    for q in plan {
        match mgmt.get_queue(&q.target_vhost, &q.target_queue) {
            Ok(_) => continue,
            Err(Error::Management(m)) if m.starts_with("HTTP 404") => {}
            Err(e) => return Err(e),
        }
        let mut args = serde_json::Map::new();
        match q.queue_type {
            Some(QueueType::Quorum) => {
                args.insert("x-queue-type".into(), "quorum".into());
            }
            Some(QueueType::Stream) => {
                args.insert("x-queue-type".into(), "stream".into());
            }
            _ => {}
        }
        mgmt.declare_queue(&q.target_vhost, &q.target_queue, true, &args)?;
        log::info!(
            "queue {} created in vhost {}",
            q.target_queue,
            q.target_vhost
        );
    }
    Ok(())
}
