//! The backup checkpoint database of `offset_storage` (SPEC.md): opened from `db_path` (or
//! memory), fetched from `s3_key` when the local file is missing (a job on a fresh pod resumes),
//! and copied to `s3_key` every `sync_interval_secs` and at the end.
//!
//! A sync uploads a `VACUUM INTO` snapshot with one put of the storage, so the key never holds a
//! half-written database (object stores replace an object whole; the filesystem backend writes
//! a temporary file and renames it). Each sync counts in `broker_backup_checkpoint_syncs`, each
//! failed one in `broker_backup_checkpoint_sync_failures`.
//!
//! Local copies (a fetched database, a snapshot) are made in a fresh private directory
//! (`SpoolDir::private_in`: 0700, an unguessable name, created by `mkdir(2)`), in files created
//! new: a name planted in a shared directory such as `/tmp` (a symlink to a file of the
//! user running the tool) is never followed nor written (issue 31, item 11).

use super::Checkpoints;
use crate::config::{OffsetBackend, OffsetStorageConfig};
use crate::error::{Error, Result};
use crate::metrics;
use crate::repository::spool::SpoolDir;
use crate::repository::storage::Storage;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Opens the checkpoint database `cfg` describes. When the local database does not exist (or
/// the backend is memory) and `s3_key` names an object in `storage`, that copy is fetched first.
///
/// Errors: as [`Checkpoints::open_file`]; storage errors of the fetch.
pub fn open(cfg: &OffsetStorageConfig, storage: &dyn Storage) -> Result<Checkpoints> {
    let remote = match &cfg.s3_key {
        Some(key) => storage.head(key)?.map(|_| key.as_str()),
        None => None,
    };
    match (cfg.backend, remote) {
        (OffsetBackend::Sqlite, Some(key)) if !cfg.db_path.exists() => {
            // Fetched beside its final name, then renamed: a half-fetched file is never opened.
            let dir = cfg
                .db_path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !dir.is_dir() {
                return Err(Error::Checkpoint(format!(
                    "unable to open database file: {} (its directory does not exist)",
                    cfg.db_path.display()
                )));
            }
            // In a private directory there, so that the rename stays on one filesystem.
            let private = private_dir(dir, ".rmq-backup-fetch")?;
            let tmp = new_file(&private, "offsets.db")?;
            storage.get_to_file(key, &tmp)?;
            std::fs::rename(&tmp, &cfg.db_path).map_err(|e| {
                Error::Checkpoint(format!(
                    "unable to open database file: {} ({e})",
                    cfg.db_path.display()
                ))
            })?;
            log::info!(
                "checkpoint database {} fetched from {key} in {}",
                cfg.db_path.display(),
                storage.location()
            );
            Checkpoints::open_file(&cfg.db_path)
        }
        (OffsetBackend::Sqlite, _) => Checkpoints::open_file(&cfg.db_path),
        (OffsetBackend::Memory, Some(key)) => {
            let private = private_dir(&std::env::temp_dir(), "rmq-backup-offsets")?;
            let tmp = new_file(&private, "fetched.db")?;
            let fetched = storage
                .get_to_file(key, &tmp)
                .and_then(|_| Checkpoints::open_memory_from(&tmp));
            drop(private);
            log::info!(
                "checkpoint database fetched into memory from {key} in {}",
                storage.location()
            );
            fetched
        }
        (OffsetBackend::Memory, None) => Checkpoints::open_memory(),
    }
}

/// A fresh private directory in `base` ([`SpoolDir::private_in`]), removed on drop.
///
/// Errors: `Checkpoint error: cannot create a private directory in <base>: <reason>`.
fn private_dir(base: &Path, hint: &str) -> Result<SpoolDir> {
    SpoolDir::private_in(base, hint).map_err(|e| {
        Error::Checkpoint(format!(
            "cannot create a private directory in {}: {}",
            base.display(),
            crate::repository::storage::io_reason(&e)
        ))
    })
}

/// A new file `name` in `dir` ([`SpoolDir::new_file`]).
///
/// Errors: `Checkpoint error: cannot create <path>: <reason>`.
fn new_file(dir: &SpoolDir, name: &str) -> Result<std::path::PathBuf> {
    dir.new_file(name).map_err(|e| {
        Error::Checkpoint(format!(
            "cannot create {}: {}",
            dir.path().join(name).display(),
            crate::repository::storage::io_reason(&e)
        ))
    })
}

/// Opens the database of `cfg` ([`open`]) and, with an `s3_key`, starts its [`Syncer`]. SPEC.md
/// has the sync interval twice (`offset_storage.sync_interval_secs` and
/// `backup.sync_interval_secs`, both default 30): the shorter one is used, `backup_sync_secs`
/// being the latter.
pub fn start(
    cfg: &OffsetStorageConfig,
    storage: Arc<dyn Storage>,
    backup_sync_secs: u64,
) -> Result<(Arc<Checkpoints>, Option<Syncer>)> {
    let checkpoints = Arc::new(open(cfg, storage.as_ref())?);
    let syncer = match &cfg.s3_key {
        Some(key) => Some(Syncer::start(
            checkpoints.clone(),
            storage,
            key.clone(),
            Duration::from_secs(cfg.sync_interval_secs.min(backup_sync_secs).max(1)),
        )?),
        None => None,
    };
    Ok((checkpoints, syncer))
}

/// Uploads a snapshot of `checkpoints` to `key` in `storage`, and counts it (a failure in
/// `broker_backup_checkpoint_sync_failures`).
pub fn push(checkpoints: &Checkpoints, storage: &dyn Storage, key: &str) -> Result<()> {
    let result = private_dir(&std::env::temp_dir(), "rmq-backup-offsets").and_then(|private| {
        // VACUUM INTO creates the file, in a directory no one else can write to.
        let tmp = private.path().join("snapshot.db");
        checkpoints
            .snapshot_to(&tmp)
            .and_then(|_| storage.put_file(key, &tmp))
    });
    if result.is_err() {
        metrics::global().checkpoint_sync_failures.inc();
    }
    result?;
    metrics::global().checkpoint_syncs.inc();
    log::debug!(
        "checkpoint database {} synced to {key}",
        checkpoints.label()
    );
    Ok(())
}

/// Syncs a checkpoint database to the storage every interval on a thread of its own, and once
/// more when finished. A failed periodic sync is logged and tried again at the next interval.
pub struct Syncer {
    shared: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    checkpoints: Arc<Checkpoints>,
    storage: Arc<dyn Storage>,
    key: String,
}

impl Syncer {
    /// Starts syncing `checkpoints` to `key` every `interval`.
    pub fn start(
        checkpoints: Arc<Checkpoints>,
        storage: Arc<dyn Storage>,
        key: String,
        interval: Duration,
    ) -> Result<Syncer> {
        let shared = Arc::new((Mutex::new(false), Condvar::new()));
        let (s, c, st, k) = (
            shared.clone(),
            checkpoints.clone(),
            storage.clone(),
            key.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("checkpoint-sync".into())
            .spawn(move || loop {
                let (lock, wake) = &*s;
                let Ok(stopped) = lock.lock() else { return };
                let Ok((stopped, _)) = wake.wait_timeout(stopped, interval) else {
                    return;
                };
                if *stopped {
                    return;
                }
                drop(stopped);
                if let Err(e) = push(&c, st.as_ref(), &k) {
                    log::warn!("checkpoint sync to {k} failed, tried again in {interval:?}: {e}");
                }
            })
            .map_err(|e| Error::Io(format!("cannot start the checkpoint-sync thread: {e}")))?;
        Ok(Syncer {
            shared,
            thread: Some(thread),
            checkpoints,
            storage,
            key,
        })
    }

    /// Stops the thread and syncs a last time. Errors: that last sync's.
    pub fn finish(mut self) -> Result<()> {
        self.stop();
        push(&self.checkpoints, self.storage.as_ref(), &self.key)
    }

    fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            if let Ok(mut stopped) = self.shared.0.lock() {
                *stopped = true;
            }
            self.shared.1.notify_all();
            let _ = t.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}
