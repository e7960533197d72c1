//! `forget --prune`: orphaned objects, deleted once older than the grace period.
//!
//! Only what has the shape of a backup's own object is ever pruned ([`Shape`], SPEC.md
//! "Storage layout", `crate::repository::manifest`, `crate::repository::shard`, `crate::repository::lock`): `{id}/manifest.json`,
//! segments `{id}/queues/{vhost}/{queue}/segment-<n>[.zst|.lz4][.age]`, the definitions
//! `{id}/definitions/definitions.json[.zst|.lz4][.age]` and the restore's
//! `{id}/definitions/rollback-before-import-*`, parts `{id}/parts/<i>-of-<n>.json`, run locks
//! `{id}/state/lock.json` and `{id}/state/lock-part-<i>-of-<n>.json`. Anything else (a
//! checkpoint database such as `{id}/state/offsets.db` or README's
//! `nightly/state/offsets.db`, files of other tools) is never touched, and neither is a key the
//! caller protects (the configuration's `offset_storage.s3_key`, [`protects`]).
//!
//! A prefix `{id}/` is a backup's when it holds a manifest, a part, a run lock or a segment;
//! other prefixes are never looked at. Its orphans:
//! - under a completed backup: a segment or a definitions file that its manifest does not list
//!   (left by a failed upload or an earlier attempt). Its parts, locks and rollback snapshots
//!   are kept;
//! - under a backup prefix without a manifest or parts (a run killed before its first manifest,
//!   a backup half deleted): every object of a backup's shape.
//!
//! - under any backup prefix: an unfinished write whose writer is gone (the filesystem
//!   backend's `<name>.partial-<pid>-<n>` of a process not running on this host,
//!   `crate::repository::storage::partials`) that was to become one of the objects above.
//!
//! Never touched: a prefix whose run lock is busy (`super::busy`), an interrupted backup (a
//! rerun resumes from what it stored), a backup whose manifest cannot be read, and any object
//! younger than the grace period or whose age the storage does not report (the memory
//! backend): a fresh upload of a live run is never taken.

use super::{busy_judged, Options};
use crate::error::Result;
use crate::now_ms;
use crate::repository::lock::{Judge, Timing};
use crate::repository::manifest::Manifest;
use crate::repository::storage::Storage;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One orphaned object and what `--prune` did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub key: String,
    /// Last modified, epoch ms; null when the storage does not say.
    pub modified_at: Option<i64>,
    /// True when deleted (or, in a dry run, when it would be).
    pub remove: bool,
    /// Why: `older than 24h`, `younger than 24h`, `age unknown`.
    pub reason: String,
}

/// What an object below `{id}/` is, by the shape of the rest of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `manifest.json`.
    Manifest,
    /// `queues/{vhost}/{queue}/segment-<digits>[.zst|.lz4][.age]`.
    Segment,
    /// `definitions/definitions.json[.zst|.lz4][.age]`.
    Definitions,
    /// `definitions/rollback-before-import-<digits>[.zst|.lz4][.age]` (a restore's snapshot).
    Rollback,
    /// `parts/<i>-of-<n>.json`.
    Part,
    /// `state/lock.json` or `state/lock-part-<i>-of-<n>.json`.
    Lock,
    /// Anything else: not the tool's backup data (a checkpoint database, another tool's file).
    Other,
}

/// True when `s` is one or more ASCII digits.
fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `s` without a segment's or definitions file's extension (`.zst`, `.lz4`, then `.age`).
fn without_ext(s: &str) -> &str {
    let s = s.strip_suffix(".age").unwrap_or(s);
    s.strip_suffix(".zst")
        .or_else(|| s.strip_suffix(".lz4"))
        .unwrap_or(s)
}

/// `<i>-of-<n>`.
fn part_numbers(s: &str) -> bool {
    s.split_once("-of-")
        .is_some_and(|(i, n)| digits(i) && digits(n))
}

impl Shape {
    /// The shape of `rest`, a key below `{id}/`.
    pub fn of(rest: &str) -> Shape {
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["manifest.json"] => Shape::Manifest,
            ["queues", vhost, queue, name] if !vhost.is_empty() && !queue.is_empty() => {
                match without_ext(name).strip_prefix("segment-") {
                    Some(n) if digits(n) => Shape::Segment,
                    _ => Shape::Other,
                }
            }
            ["definitions", name] => match without_ext(name) {
                "definitions.json" => Shape::Definitions,
                n if n
                    .strip_prefix("rollback-before-import-")
                    .is_some_and(digits) =>
                {
                    Shape::Rollback
                }
                _ => Shape::Other,
            },
            ["parts", name] if name.strip_suffix(".json").is_some_and(part_numbers) => Shape::Part,
            ["state", "lock.json"] => Shape::Lock,
            ["state", name]
                if name
                    .strip_prefix("lock-part-")
                    .and_then(|n| n.strip_suffix(".json"))
                    .is_some_and(part_numbers) =>
            {
                Shape::Lock
            }
            _ => Shape::Other,
        }
    }

    /// True for the objects that make a prefix a backup's: manifest, part, run lock, segment.
    fn marks_a_backup(self) -> bool {
        matches!(
            self,
            Shape::Manifest | Shape::Part | Shape::Lock | Shape::Segment
        )
    }
}

/// True when `key` is one of the `protected` keys (a configured checkpoint database) or a
/// sibling of one (`<key>.<anything>`, `<key>-<anything>`: an upload's temporary name, a SQLite
/// `-wal` or `-journal` copy). Such keys are never pruned nor deleted with a backup.
pub fn protects(protected: &[String], key: &str) -> bool {
    protected.iter().any(|p| {
        key.strip_prefix(p.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('-'))
    })
}

/// Whether an orphan last modified at `modified_at` goes, and why, with the grace period
/// reaching back to `cutoff` (`grace` its text).
fn by_age(modified_at: Option<i64>, cutoff: Option<i64>, grace: &str) -> (bool, String) {
    match modified_at {
        None => (
            false,
            "age unknown (the storage reports no time)".to_string(),
        ),
        Some(t) if cutoff.is_none_or(|c| t > c) => (false, format!("younger than {grace}")),
        Some(_) => (true, format!("older than {grace}")),
    }
}

/// The unfinished writes under `{id}/` whose writer is gone (`crate::repository::storage::partials`) that
/// were to become one of the backup's own objects ([`Shape`]) and no key [`protects`] keeps:
/// orphans like any other, removed once older than the grace period (unless a dry run).
/// Removal failures are added to `errors`.
///
/// Errors: storage failures listing.
fn stale_partials(
    storage: &dyn Storage,
    opts: &Options,
    id: &str,
    protected: &[String],
    errors: &mut Vec<String>,
) -> Result<Vec<Orphan>> {
    let cutoff = opts.prune_grace.before(now_ms());
    let grace = opts.prune_grace.to_string();
    let mut out = Vec::new();
    for (name, modified_at) in storage.stale_partials(&format!("{id}/"))? {
        let Some(rest) = crate::repository::storage::partials::final_name(&name)
            .and_then(|f| f.strip_prefix(id))
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        if Shape::of(rest) == Shape::Other || protects(protected, &name) {
            continue;
        }
        let (remove, reason) = by_age(modified_at, cutoff, &grace);
        let reason = format!("unfinished write of a process no longer running, {reason}");
        if remove && !opts.dry_run {
            if let Err(e) = storage.remove_stale_partial(&name) {
                log::error!("prune: {id}/: {e}");
                errors.push(e.to_string());
            }
        }
        out.push(Orphan {
            key: name,
            modified_at,
            remove,
            reason,
        });
    }
    Ok(out)
}

/// Finds the orphans of `storage` and deletes those older than `opts.prune_grace` (unless a
/// dry run), never a key [`protects`] keeps. Delete failures are added to `errors` naming the
/// key.
///
/// Errors: storage failures listing or reading.
pub fn prune(
    storage: &dyn Storage,
    opts: &Options,
    protected: &[String],
    errors: &mut Vec<String>,
) -> Result<Vec<Orphan>> {
    let now = now_ms();
    // `None`: the grace reaches before every representable time, so nothing is old enough.
    let cutoff = opts.prune_grace.before(now);
    let grace = opts.prune_grace.to_string();
    let ids: BTreeSet<String> = storage.list_backup_ids()?.into_iter().collect();
    let mut groups: BTreeMap<String, Vec<(String, Shape, Option<i64>)>> = BTreeMap::new();
    for (key, t) in storage.list_with_times("")? {
        let Some((id, rest)) = key.split_once('/') else {
            continue;
        };
        let shape = Shape::of(rest);
        if shape != Shape::Other && !protects(protected, &key) {
            groups
                .entry(id.to_string())
                .or_default()
                .push((key, shape, t));
        }
    }
    groups.retain(|_, keys| keys.iter().any(|(_, s, _)| s.marks_a_backup()));
    let clock = now_ms;
    let judge = Judge::new(storage, Timing::from_env(), &clock);
    let mut out = Vec::new();
    for (id, keys) in groups {
        if let Some(why) = busy_judged(&judge, storage, &id)? {
            log::debug!("prune: {id}/ skipped: {why}");
            continue;
        }
        out.extend(stale_partials(storage, opts, &id, protected, errors)?);
        let candidates: Vec<(String, Option<i64>)> = if ids.contains(&id) {
            let m = match Manifest::read(storage, &id) {
                Ok(m) if m.completed_at.is_some() => m,
                Ok(_) => continue,
                Err(e) => {
                    log::debug!("prune: {id}/ skipped, its manifest cannot be read: {e}");
                    continue;
                }
            };
            let listed: BTreeSet<&str> = m
                .queues
                .iter()
                .flat_map(|q| q.segments.iter().map(|s| s.key.as_str()))
                .chain(m.definitions.as_ref().map(|d| d.key.as_str()))
                .collect();
            keys.into_iter()
                .filter(|(k, shape, _)| {
                    matches!(shape, Shape::Segment | Shape::Definitions)
                        && !listed.contains(k.as_str())
                })
                .map(|(k, _, t)| (k, t))
                .collect()
        } else {
            keys.into_iter().map(|(k, _, t)| (k, t)).collect()
        };
        let mut doomed = Vec::new();
        for (key, modified_at) in candidates {
            let (remove, reason) = by_age(modified_at, cutoff, &grace);
            if remove {
                doomed.push(key.clone());
            }
            out.push(Orphan {
                key,
                modified_at,
                remove,
                reason,
            });
        }
        if !opts.dry_run && !doomed.is_empty() {
            match storage.delete_many(&doomed) {
                Ok(()) => log::info!(
                    "prune: {} orphaned object(s) under {id}/ deleted",
                    doomed.len()
                ),
                Err(e) => {
                    log::error!("prune: {id}/: {e}");
                    errors.push(e.to_string());
                }
            }
        }
    }
    Ok(out)
}
