//! What a backup run finds in storage and what it writes there besides segments: the manifest
//! of an interrupted earlier run (a completed backup is never written again), whether the
//! checkpoint database belongs to that backup, and the manifest writes themselves, each
//! conditional on the version this run wrote last (`crate::repository::storage::conditional`), so that a
//! run that lost the backup to another can never write over that run's manifest.

use super::BackupSummary;
use crate::error::{Error, Result};
use crate::repository::checkpoint::Checkpoints;
use crate::repository::lock::{LockName, RunLock};
use crate::repository::manifest::{self, Manifest};
use crate::repository::shard::Shard;
use crate::repository::storage::{Conditional, ObjectVersion, Storage};
use std::time::Instant;

/// What this run writes: a whole backup, or one part of a sharded one (`crate::repository::shard`).
pub(super) struct Target {
    pub(super) backup_id: String,
    pub(super) shard: Option<Shard>,
}

impl Target {
    /// Its manifest's key: `{backup_id}/manifest.json`, or the part's.
    pub(super) fn manifest_key(&self) -> String {
        match &self.shard {
            Some(s) => s.part_key(&self.backup_id),
            None => manifest::manifest_key(&self.backup_id),
        }
    }

    /// Its run lock.
    pub(super) fn lock_name(&self) -> LockName {
        match &self.shard {
            Some(s) => LockName::part(&self.backup_id, s.index, s.count),
            None => LockName::backup(&self.backup_id),
        }
    }

    /// `backup <id>` or `backup <id> (part <i> of <n>)`, for messages.
    pub(super) fn label(&self) -> String {
        self.lock_name().label
    }

    /// The id its state is kept under in the checkpoint database: parts of one backup may
    /// share a database and must not forget each other's state.
    pub(super) fn checkpoint_id(&self) -> String {
        match &self.shard {
            Some(s) => format!("{}#part-{}-of-{}", self.backup_id, s.index, s.count),
            None => self.backup_id.clone(),
        }
    }

    /// How the names of its connections start (`rmq-backup <id> ` or
    /// `rmq-backup <id> (part <i> of <n>) `): an earlier run of this backup (or part) is told
    /// by it from every other connection (`super::earlier_run`).
    pub(super) fn connection_prefix(&self) -> String {
        match &self.shard {
            Some(s) => format!("rmq-backup {} ({}) ", self.backup_id, s.label()),
            None => format!("rmq-backup {} ", self.backup_id),
        }
    }

    /// True for the run that exports the definitions: the whole backup's, or part 0's.
    pub(super) fn exports_definitions(&self) -> bool {
        self.shard.is_none_or(|s| s.index == 0)
    }
}

/// The manifest of an interrupted backup (or part) with this id, and its stored version.
pub(super) struct Interrupted {
    pub(super) manifest: Manifest,
    pub(super) version: ObjectVersion,
}

/// What a run finds where it writes its manifest.
pub(super) enum Found {
    /// Nothing: a first run.
    Nothing,
    /// An interrupted run's manifest: it is written again.
    Interrupted(Box<Interrupted>),
    /// A part of a sharded backup that is complete already (a rerun of its index, or the
    /// whole backup complete): nothing to do but merge.
    PartComplete,
}

/// A completed backup is never overwritten: its segments are the only copy of the messages.
/// Returns what is stored where `target` writes its manifest: nothing, the manifest of an
/// interrupted run (written again), or, for a part of a sharded backup, that the part (or the
/// whole backup) is complete already.
///
/// Errors: `Configuration error: backup <id> already exists and is complete in <location>;
/// choose another backup_id`; the manifest's (`Manifest::check_keys`) and the storage's.
pub(super) fn refuse_to_overwrite(storage: &dyn Storage, target: &Target) -> Result<Found> {
    let backup_id = &target.backup_id;
    if target.shard.is_some() {
        let whole = manifest::manifest_key(backup_id);
        if let Some((bytes, _)) = storage.get_with_version(&whole)? {
            let m = Manifest::from_json(&bytes)?;
            if m.completed_at.is_some() && m.parts.is_some() {
                return Ok(Found::PartComplete);
            }
            return Err(Error::Config(format!(
                "backup {backup_id} in {} was not written in parts; choose another backup_id",
                storage.location()
            )));
        }
    }
    let key = target.manifest_key();
    let Some((bytes, version)) = storage.get_with_version(&key)? else {
        return Ok(Found::Nothing);
    };
    let existing = Manifest::from_json(&bytes)?;
    existing.check_keys(&key, backup_id)?;
    if existing.completed_at.is_some() {
        if target.shard.is_some() {
            return Ok(Found::PartComplete);
        }
        return Err(Error::Config(format!(
            "backup {backup_id} already exists and is complete in {}; choose another backup_id",
            storage.location()
        )));
    }
    Ok(Found::Interrupted(Box::new(Interrupted {
        manifest: existing,
        version,
    })))
}

/// Writes the manifest of this run, each time over the version it wrote (or found) last.
pub(super) struct ManifestWriter {
    key: String,
    version: Option<ObjectVersion>,
}

impl ManifestWriter {
    /// A writer of `target`'s manifest that replaces the interrupted manifest `found` (its
    /// version), or creates the manifest when there was none.
    pub(super) fn new(target: &Target, found: Option<&Interrupted>) -> ManifestWriter {
        ManifestWriter {
            key: target.manifest_key(),
            version: found.map(|i| i.version.clone()),
        }
    }

    /// The key it writes.
    pub(super) fn key(&self) -> &str {
        &self.key
    }

    /// Writes `m` while this run holds its lock and the stored manifest is the one it wrote.
    ///
    /// Errors: the lock's ([`RunLock::check`]); `Storage error: <key> was written by another
    /// run meanwhile ...`; the storage's.
    pub(super) fn write(
        &mut self,
        storage: &dyn Storage,
        lock: &RunLock,
        m: &Manifest,
    ) -> Result<()> {
        lock.check()?;
        let key = &self.key;
        let json = m.to_json_pretty()?;
        let written = match &self.version {
            None => storage.put_bytes_new(key, json.as_bytes())?,
            Some(v) => storage.put_bytes_if(key, json.as_bytes(), v)?,
        };
        match written {
            Conditional::Written(v) => {
                self.version = Some(v);
                Ok(())
            }
            Conditional::Refused => Err(Error::Storage(format!(
                "{key} was written by another run meanwhile: this run stops and leaves it alone"
            ))),
        }
    }
}

/// The checkpoint database holds what an earlier run did for the backup created at
/// `manifest.created_at`, when `interrupted` (an interrupted manifest was found): only then is
/// it used, and only when it says it was written for that very backup. Otherwise (a first
/// run, another backup of the same id that was deleted since, a database of schema version 1)
/// what it holds for this backup id is forgotten. Errors: the database's.
pub(super) fn trust_checkpoints(
    cp: &Checkpoints,
    target: &Target,
    manifest: &Manifest,
    interrupted: bool,
) -> Result<()> {
    let id = &target.checkpoint_id();
    let recorded = cp.backup_created_at(id)?;
    if interrupted && recorded == Some(manifest.created_at) {
        return Ok(());
    }
    if let Some(t) = recorded.filter(|_| interrupted) {
        log::warn!(
            "checkpoint database {}: its state of backup {id} belongs to a backup created at {}, not to the interrupted one created at {}: forgotten, every queue is read again",
            cp.label(),
            crate::run::units::format_ms(t),
            crate::run::units::format_ms(manifest.created_at)
        );
    } else if interrupted {
        log::warn!(
            "checkpoint database {}: it does not say which backup {id} its state belongs to: forgotten, every queue is read again",
            cp.label()
        );
    }
    cp.begin_backup(id, manifest.created_at)
}

/// A part of a sharded backup found complete: nothing to back up; the parts are merged when
/// they are all complete (`crate::repository::shard`).
pub(super) fn part_complete(
    storage: &dyn Storage,
    target: &Target,
    started: Instant,
) -> Result<BackupSummary> {
    log::info!("{} is complete already: nothing to do", target.label());
    merge_parts(storage, target);
    Ok(BackupSummary {
        backup_id: target.backup_id.clone(),
        queues: 0,
        messages: 0,
        bytes: 0,
        segments: 0,
        skipped: Vec::new(),
        left_out: Vec::new(),
        deleted: Vec::new(),
        elapsed: started.elapsed(),
    })
}

/// Merges the parts of a sharded backup and, when every one is complete, writes the merge to
/// `{backup_id}/manifest.json` unless that exists (create-only; only a backup writes it:
/// readers merge in memory, `crate::repository::manifest::merge_parts`); says how far the backup is. A
/// failure is only a warning: readers merge the parts on each read.
pub(super) fn merge_parts(storage: &dyn Storage, target: &Target) {
    let id = &target.backup_id;
    match manifest::merge_parts(storage, id) {
        Ok(Some(m)) if m.completed_at.is_some() => {
            let key = manifest::manifest_key(id);
            match m
                .to_json_pretty()
                .and_then(|json| storage.put_bytes_new(&key, json.as_bytes()))
            {
                Ok(Conditional::Written(_)) => log::info!(
                    "backup {id}: all {} parts complete; {key} written",
                    m.parts.unwrap_or(0)
                ),
                Ok(Conditional::Refused) => {}
                Err(e) => log::warn!(
                    "backup {id}: {key} not written ({e}); readers merge the parts on each read"
                ),
            }
        }
        Ok(Some(m)) => log::info!(
            "backup {id}: {} is complete; the backup is complete once every one of its {} parts is",
            target.label(),
            m.parts.unwrap_or(0)
        ),
        Ok(None) => {}
        Err(e) => log::warn!("backup {id}: its parts cannot be merged yet: {e}"),
    }
}
