//! `forget --prune`: orphaned objects, deleted once older than the grace period.
//!
//! An orphan is an object in a backup's layout (`{id}/queues/...`, `{id}/definitions/...`,
//! `{id}/parts/...`, `{id}/state/...`, `{id}/manifest.json`; other keys are not the tool's and
//! are never touched) that no manifest lists:
//! - under a completed backup: a segment under `queues/` or a definitions file that its
//!   manifest does not list (left by a failed upload or an earlier attempt). Its `parts/`,
//!   `state/` and the restore's `definitions/rollback-before-import-*` snapshots are kept;
//! - under a prefix without a manifest or parts (a run killed before its first manifest, a
//!   backup half deleted): every object of the layout.
//!
//! Never touched: a prefix whose run lock is busy (`super::busy`), an interrupted backup (a
//! rerun resumes from what it stored), a backup whose manifest cannot be read, and any object
//! younger than the grace period or whose age the storage does not report (the memory
//! backend): a fresh upload of a live run is never taken.

use super::{busy, Options};
use crate::error::Result;
use crate::manifest::Manifest;
use crate::now_ms;
use crate::storage::Storage;
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

const LAYOUT: [&str; 4] = ["queues", "definitions", "parts", "state"];

/// Finds the orphans of `storage` and deletes those older than `opts.prune_grace` (unless a
/// dry run). Delete failures are added to `errors` naming the key.
///
/// Errors: storage failures listing or reading.
pub fn prune(
    storage: &dyn Storage,
    opts: &Options,
    errors: &mut Vec<String>,
) -> Result<Vec<Orphan>> {
    let now = now_ms();
    let cutoff = opts.prune_grace.before(now);
    let grace = opts.prune_grace.to_string();
    let ids: BTreeSet<String> = storage.list_backup_ids()?.into_iter().collect();
    let mut groups: BTreeMap<String, Vec<(String, Option<i64>)>> = BTreeMap::new();
    for (key, t) in storage.list_with_times("")? {
        let Some((id, rest)) = key.split_once('/') else {
            continue;
        };
        let top = rest.split('/').next().unwrap_or("");
        let in_layout =
            rest == crate::storage::MANIFEST_FILE || (LAYOUT.contains(&top) && rest.contains('/'));
        if in_layout {
            groups.entry(id.to_string()).or_default().push((key, t));
        }
    }
    let mut out = Vec::new();
    for (id, keys) in groups {
        if let Some(why) = busy(storage, &id)? {
            log::debug!("prune: {id}/ skipped: {why}");
            continue;
        }
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
            let queues = format!("{id}/queues/");
            let defs = format!("{id}/definitions/");
            keys.into_iter()
                .filter(|(k, _)| {
                    let orphan_segment = k.starts_with(&queues);
                    let orphan_defs = k
                        .strip_prefix(&defs)
                        .is_some_and(|n| !n.starts_with("rollback-before-import-"));
                    (orphan_segment || orphan_defs) && !listed.contains(k.as_str())
                })
                .collect()
        } else {
            keys
        };
        let mut doomed = Vec::new();
        for (key, modified_at) in candidates {
            let (remove, reason) = match modified_at {
                None => (
                    false,
                    "age unknown (the storage reports no time)".to_string(),
                ),
                // No cutoff: the grace reaches before every representable time.
                Some(t) if cutoff.is_none_or(|c| t > c) => (false, format!("younger than {grace}")),
                Some(_) => (true, format!("older than {grace}")),
            };
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
