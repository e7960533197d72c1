//! Retention: `rmq-backup forget` and the configuration's `retention:` section (issue 23,
//! item 1). Which backups a policy keeps ([`policy`], restic's rules), the deletion of the
//! others, and `--prune` of orphaned objects ([`prune`]); [`report`] renders the outcome.
//!
//! What is never removed, whatever the policy:
//! - a backup whose run lock (or a part's, `crate::repository::shard`) is held by a run that may be alive:
//!   not ended and written within the lock's takeover time by the storage's own clock
//!   (`crate::repository::lock::Judge::busy`), checked when the backups are evaluated; a backup being
//!   deleted is under forget's own hold of those locks (taken as a run takes them, deleted while
//!   still held), so no run starts on it meanwhile, nor loses its lock to the delete;
//! - an `interrupted` backup created after the newest completed one (a rerun may resume it);
//!   older interrupted ones only with `prune_interrupted`;
//! - a backup whose manifest cannot be read (`damaged`): what it holds is unknown;
//! - a backup any of whose objects the storage still retains (`storage.object_lock`): every
//!   object's date is read before the first delete, so no backup loses its manifest to a
//!   delete and then keeps data the storage refuses to delete.
//!
//! The policy applies to completed backups only (interrupted ones take no `keep_last` place).
//!
//! Delete order: a backup's manifest goes first (for a sharded backup, one part, then the
//! merged manifest, so that no reader merges the parts back into a complete manifest), then
//! every other object under `{backup_id}/` in batches. A backup half deleted by a failure is
//! therefore never listed as completed: it is gone, or it reads as interrupted, or as an orphan
//! prefix that `--prune` removes.

pub mod command;
pub mod policy;
pub mod prune;
pub mod report;

pub use crate::config::RetentionConfig;
pub use policy::{Count, Policy, Reason, Within};
pub use report::{BackupDecision, ForgetReport};

use crate::error::{Error, Result};
use crate::now_ms;
use crate::repository::lock::{Judge, LockInfo, LockName, RunLock, Timing};
use crate::repository::manifest::{manifest_key, Manifest};
use crate::repository::storage::Storage;
use std::sync::Arc;

/// Default age an orphaned object must reach before `--prune` deletes it: 24 hours, far longer
/// than any upload of a live run takes to be listed in its manifest.
pub const DEFAULT_PRUNE_GRACE: Within = Within {
    years: 0,
    months: 0,
    days: 0,
    hours: 24,
};

/// What one `forget` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The `--keep-*` rules; must not be empty ([`Policy::is_empty`]).
    pub policy: Policy,
    /// Decide and report only; delete nothing.
    pub dry_run: bool,
    /// Also remove interrupted backups created before the newest completed one.
    pub prune_interrupted: bool,
    /// Also delete orphaned objects ([`prune`]) older than `prune_grace`.
    pub prune: bool,
    /// Minimum age of an orphan that `prune` deletes.
    pub prune_grace: Within,
}

/// Applies the `retention:` of the backup configuration `cfg` after a successful backup
/// (`None` when it has none): logs what it kept and removed, counts
/// `broker_backup_retention_runs`, and returns the line for the backup's summary
/// (`Retention: ...`). A failure is logged and reported in that line, never returned: the
/// backup itself succeeded and keeps its exit code (docs/retention.md "Retention (forget)"). Never
/// deletes the configuration's checkpoint database (`offset_storage.s3_key` and that key's
/// siblings, [`prune::protects`]), neither by `--prune` nor with a backup.
pub fn after_backup_of(cfg: &crate::config::Config, storage: &Arc<dyn Storage>) -> Option<String> {
    let retention = cfg.retention.as_ref()?;
    Some(after_backup_keeping(
        retention,
        storage,
        &checkpoint_keys(cfg),
    ))
}

/// The storage keys a configuration's checkpoint database is synced to
/// (`offset_storage.s3_key`, `crate::repository::checkpoint::sync`): what `forget` never deletes.
pub fn checkpoint_keys(cfg: &crate::config::Config) -> Vec<String> {
    cfg.offset_storage
        .iter()
        .filter_map(|o| o.s3_key.clone())
        .collect()
}

fn after_backup_keeping(
    cfg: &RetentionConfig,
    storage: &Arc<dyn Storage>,
    protected: &[String],
) -> String {
    let outcome = cfg
        .options()
        .and_then(|opts| forget_keeping(storage, &opts, protected));
    let counter = |o: &str| crate::metrics::global().retention_runs.with([o]).inc();
    match outcome {
        Ok(report) if report.errors.is_empty() => {
            counter("succeeded");
            log::info!("retention ({}): {}", report.policy, report.summary());
            format!("Retention ({}): {}.", report.policy, report.summary())
        }
        Ok(report) => {
            counter("failed");
            for e in &report.errors {
                log::error!("retention: {e}");
            }
            format!(
                "Retention ({}) failed in part: {}; {}.",
                report.policy,
                report.summary(),
                report.errors.join("; ")
            )
        }
        Err(e) => {
            counter("failed");
            log::error!("retention after the backup failed: {e}");
            format!("Retention failed (the backup itself completed): {e}")
        }
    }
}

/// A backup as `forget` found it.
struct Found {
    id: String,
    manifest: std::result::Result<Manifest, String>,
    /// Set when a run may still write it: the lock's description.
    busy: Option<String>,
}

/// The run locks stored under `{backup_id}/state/` (the backup's and its parts').
fn locks_of(storage: &dyn Storage, backup_id: &str) -> Result<Vec<LockName>> {
    let prefix = format!("{backup_id}/state/");
    Ok(storage
        .list(&prefix)?
        .into_iter()
        .filter(|k| {
            k.strip_prefix(&prefix)
                .is_some_and(|n| n.starts_with("lock") && n.ends_with(".json") && !n.contains('/'))
        })
        .map(|key| LockName {
            label: format!("backup {backup_id} ({key})"),
            key,
        })
        .collect())
}

/// `Some(description)` when a run that may be alive holds a lock of `backup_id`: the lock may
/// not be taken over yet, its age told by the storage's clock ([`Judge::busy`]; the timing of
/// [`Timing::from_env`], the reader's clock `crate::now_ms`). Errors: the storage's.
pub fn busy(storage: &dyn Storage, backup_id: &str) -> Result<Option<String>> {
    let clock = now_ms;
    busy_judged(
        &Judge::new(storage, Timing::from_env(), &clock),
        storage,
        backup_id,
    )
}

/// [`busy`] with `judge` (one per `forget`: the storage's clock is measured once).
pub fn busy_judged(
    judge: &Judge,
    storage: &dyn Storage,
    backup_id: &str,
) -> Result<Option<String>> {
    for name in locks_of(storage, backup_id)? {
        if let Some((info, age)) = judge.busy(&name)? {
            return Ok(Some(lock_description(&info, age)));
        }
    }
    Ok(None)
}

fn lock_description(info: &LockInfo, age: Option<i64>) -> String {
    format!("running: locked by {}", info.describe_age(age))
}

/// Runs `forget` on `storage`: evaluates every backup, deletes those the policy removes (unless
/// `dry_run`), then prunes orphans when asked. A failure to delete one backup is recorded in
/// the report (`errors`) and the others go on.
///
/// Errors: `Configuration error: ...` for an empty policy; storage failures listing or reading
/// (before anything is deleted).
pub fn forget(storage: &Arc<dyn Storage>, opts: &Options) -> Result<ForgetReport> {
    forget_keeping(storage, opts, &[])
}

/// [`forget`] that never deletes a key of `protected` nor a sibling of one
/// ([`prune::protects`]: a configured checkpoint database), neither as an orphan nor with a
/// backup it removes.
///
/// Errors: as [`forget`].
pub fn forget_keeping(
    storage: &Arc<dyn Storage>,
    opts: &Options,
    protected: &[String],
) -> Result<ForgetReport> {
    let shared = storage;
    let storage: &dyn Storage = shared.as_ref();
    if opts.policy.is_empty() {
        return Err(Error::Config(
            "forget needs at least one of --keep-last, --keep-daily, --keep-weekly, --keep-monthly (above 0) or --keep-within: without one every backup would be removed".into(),
        ));
    }
    let clock = now_ms;
    let judge = Judge::new(storage, Timing::from_env(), &clock);
    let mut found = Vec::new();
    for id in storage.list_backup_ids()? {
        let manifest = match Manifest::read(storage, &id) {
            Ok(m) => Ok(m),
            // Listed a moment ago, gone now.
            Err(Error::Storage(m)) if m.starts_with("Key not found") => continue,
            Err(e) => Err(e.to_string()),
        };
        let busy = busy_judged(&judge, storage, &id)?;
        found.push(Found { id, manifest, busy });
    }
    let mut decisions = decide(&found, opts);
    let mut errors = Vec::new();
    for d in decisions.iter_mut() {
        if !d.remove {
            continue;
        }
        if let Some(why) = retained(storage, &d.backup_id)? {
            log::info!("forget: backup {} kept: {why}", d.backup_id);
            d.remove = false;
            d.reasons = vec![why];
        }
    }
    if !opts.dry_run {
        for (d, f) in decisions.iter_mut().zip(&found) {
            if !d.remove {
                continue;
            }
            let parts = f.manifest.as_ref().ok().and_then(|m| m.parts);
            match remove_locked(shared, &d.backup_id, parts, protected) {
                // A run started on it since it was evaluated.
                Ok(Err(why)) => {
                    d.remove = false;
                    d.reasons = vec![why];
                }
                Ok(Ok(n)) => {
                    d.deleted_objects = Some(n);
                    log::info!(
                        "forget: backup {} removed ({n} objects): {}",
                        d.backup_id,
                        d.reasons.join("; ")
                    );
                }
                Err(e) => {
                    log::error!("forget: backup {}: {e}", d.backup_id);
                    errors.push(e.to_string());
                }
            }
        }
    }
    let orphans = if opts.prune {
        prune::prune(storage, opts, protected, &mut errors)?
    } else {
        Vec::new()
    };
    Ok(ForgetReport {
        location: storage.location(),
        policy: opts.policy.describe(),
        dry_run: opts.dry_run,
        backups: decisions,
        orphans,
        errors,
    })
}

/// `Some("locked until <time>: ...")` while the storage retains any object of backup
/// `backup_id` (`storage.object_lock`, or a bucket's default retention), `<time>` the latest
/// date among them ([`Storage::latest_retention`] of `{backup_id}/`). Every object is asked,
/// before anything is deleted: a manifest is not locked on GCS (it is rewritten), a backup may
/// have no segment at all (definitions only, empty queues), its queues are written in
/// parallel and over several runs (a rerun may lock for less time than the run before), so no
/// one object stands for the others (issue 38: deciding from the last segment in manifest
/// order deleted the manifest of a backup whose locked definitions GCS then refused to
/// delete). Such a backup is kept whole, not an error; a later `forget` removes it once the
/// date has passed.
///
/// Errors: the storage's.
fn retained(storage: &dyn Storage, backup_id: &str) -> Result<Option<String>> {
    let until = storage.latest_retention(&format!("{backup_id}/"))?;
    Ok(until.filter(|t| *t > now_ms()).map(|t| {
        format!(
            "{}: the storage refuses to delete it before then; a later forget removes it",
            crate::repository::storage::object_lock::locked_until(t)
        )
    }))
}

/// The decision for each backup found (same order): the policy on completed backups, the
/// rules of the module doc for the others.
fn decide(found: &[Found], opts: &Options) -> Vec<BackupDecision> {
    let completed: Vec<(usize, i64)> = found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| match &f.manifest {
            Ok(m) if m.completed_at.is_some() && f.busy.is_none() => Some((i, m.created_at)),
            _ => None,
        })
        .collect();
    let created: Vec<i64> = completed.iter().map(|(_, t)| *t).collect();
    let kept = opts.policy.apply(&created);
    let newest_completed = created.iter().copied().max();
    let mut out: Vec<BackupDecision> = found
        .iter()
        .map(|f| {
            let (status, created_at) = match &f.manifest {
                Ok(m) if f.busy.is_some() => ("running", Some(m.created_at)),
                Ok(m) if m.completed_at.is_some() => ("completed", Some(m.created_at)),
                Ok(m) => ("interrupted", Some(m.created_at)),
                Err(_) => ("damaged", None),
            };
            let (remove, reasons) = match (&f.manifest, &f.busy) {
                (_, Some(why)) => (false, vec![why.clone()]),
                (Err(e), None) => (false, vec![format!("manifest damaged, not evaluated: {e}")]),
                (Ok(m), None) if m.completed_at.is_some() => (false, vec![]),
                (Ok(m), None) => interrupted(m.created_at, newest_completed, opts),
            };
            BackupDecision {
                backup_id: f.id.clone(),
                status,
                created_at,
                remove,
                reasons,
                deleted_objects: None,
            }
        })
        .collect();
    for ((i, _), reasons) in completed.iter().zip(kept) {
        let d = &mut out[*i];
        if reasons.is_empty() {
            d.remove = true;
            d.reasons = vec![format!("not kept by {}", opts.policy.describe())];
        } else {
            d.reasons = reasons.iter().map(ToString::to_string).collect();
        }
    }
    out
}

/// Remove or keep an interrupted backup created at `created`, and why.
fn interrupted(created: i64, newest_completed: Option<i64>, opts: &Options) -> (bool, Vec<String>) {
    match newest_completed {
        Some(newest) if created < newest => {
            if opts.prune_interrupted {
                (
                    true,
                    vec![
                        "interrupted, older than the newest completed backup (--prune-interrupted)"
                            .into(),
                    ],
                )
            } else {
                (
                    false,
                    vec!["interrupted, older than the newest completed backup (removed only with --prune-interrupted)".into()],
                )
            }
        }
        _ => (
            false,
            vec!["interrupted, newer than every completed backup (a rerun may resume it)".into()],
        ),
    }
}

/// Removes backup `backup_id` under its own run locks: takes them as a run would (the
/// backup's, or each part's of a sharded backup), so that no run starts writing it while it is
/// deleted; deletes it ([`delete_backup`], the locks and `protected` keys spared); then deletes
/// each lock while still holding it ([`RunLock::delete`]): never released first, so a run that
/// starts meanwhile waits for the lock, finds it gone and creates its own, and loses neither
/// its lock nor its data (issue 31: a lock released, then deleted, was deleted under a run
/// that had taken it in between). `Ok(Err(why))` when a run holds a lock (the backup is left
/// alone).
///
/// Errors: the storage's; a failure leaves the locks released (ended), and what is left of
/// the backup reads as interrupted or as orphans for `--prune`.
fn remove_locked(
    storage: &Arc<dyn Storage>,
    backup_id: &str,
    parts: Option<u32>,
    protected: &[String],
) -> Result<std::result::Result<u64, String>> {
    if let Some(why) = busy(storage.as_ref(), backup_id)? {
        return Ok(Err(why));
    }
    let names: Vec<LockName> = match parts {
        Some(n) => (0..n).map(|i| LockName::part(backup_id, i, n)).collect(),
        None => vec![LockName::backup(backup_id)],
    };
    let mut held = Vec::new();
    for name in &names {
        match RunLock::acquire_named(storage.clone(), name.clone(), Timing::from_env()) {
            Ok(lock) => held.push(lock),
            // Another run holds it (the locks taken so far are released on return).
            Err(Error::Config(why)) => return Ok(Err(format!("running: {why}"))),
            Err(e) => return Err(e),
        }
    }
    let mut keep: Vec<String> = names.iter().map(|n| n.key.clone()).collect();
    keep.extend_from_slice(protected);
    held.iter().try_for_each(RunLock::check)?;
    let deleted = delete_backup(storage.as_ref(), backup_id, parts, &keep)?;
    let locks = held.len() as u64;
    for lock in held {
        lock.delete()?;
    }
    Ok(Ok(deleted + locks))
}

/// Deletes backup `backup_id` in the order of the module doc, except the keys in `spare` and
/// their siblings ([`prune::protects`]); returns the objects deleted.
///
/// Errors: `Storage error: Failed to delete <key>: ...` (the storage's), naming the key.
pub fn delete_backup(
    storage: &dyn Storage,
    backup_id: &str,
    parts: Option<u32>,
    spare: &[String],
) -> Result<u64> {
    let mut deleted = 0u64;
    let mut first = Vec::new();
    if parts.is_some() {
        let mut part_keys = storage.list(&crate::repository::shard::parts_prefix(backup_id))?;
        part_keys.retain(|k| k.ends_with(".json"));
        if let Some(k) = part_keys.into_iter().next() {
            first.push(k);
        }
    }
    first.push(manifest_key(backup_id));
    for key in &first {
        storage.delete(key)?;
        deleted += 1;
    }
    let mut rest = storage.list(&format!("{backup_id}/"))?;
    rest.retain(|k| !prune::protects(spare, k));
    storage.delete_many(&rest)?;
    Ok(deleted + rest.len() as u64)
}

#[cfg(test)]
mod tests;
