//! The parts of a sharded backup (`crate::repository::shard`): each worker writes its share of the queues as
//! `{backup_id}/parts/<index>-of-<count>.json`, a manifest with `shard: {index, count}`; the
//! backup's manifest is the parts merged.
//!
//! The merge is in memory and writes nothing: readers (`list`, `describe`, `validate`, `cat`,
//! `restore`, `forget --dry-run`) merge the parts on each read when `manifest.json` is absent,
//! so a reader with read-only credentials works and a dry run changes nothing. Only a backup
//! stores the merged manifest (`crate::backup`, once every part is complete).

use serde::{Deserialize, Serialize};

use super::Manifest;
use crate::error::{Error, Result};
use crate::repository::storage::Storage;

/// Which part of a sharded backup a part's manifest is (its `shard` field). Which queues a
/// part owns, and where its index comes from, is `crate::repository::shard`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based, below `count`.
    pub index: u32,
    /// Workers sharing the backup.
    pub count: u32,
}

impl Shard {
    /// `{backup_id}/parts/<index>-of-<count>.json`.
    pub fn part_key(&self, backup_id: &str) -> String {
        format!(
            "{}{}-of-{}.json",
            parts_prefix(backup_id),
            self.index,
            self.count
        )
    }

    /// `part <index> of <count>`, for messages.
    pub fn label(&self) -> String {
        format!("part {} of {}", self.index, self.count)
    }
}

/// `{backup_id}/parts/`: where the parts of a sharded backup are.
pub fn parts_prefix(backup_id: &str) -> String {
    format!("{backup_id}/parts/")
}

/// The parts of sharded backup `backup_id` merged into one manifest, in memory; `None` when it
/// has no part. Complete (`completed_at` the last part's) only when all `count` parts are
/// complete. Reads the parts; writes nothing.
///
/// Errors: the storage's; `Manifest error: ...` for a part that cannot be parsed, names
/// another backup or part, lists a key outside the backup, or disagrees with the others on
/// `count`.
pub fn merge_parts(storage: &dyn Storage, backup_id: &str) -> Result<Option<Manifest>> {
    let mut keys = storage.list(&parts_prefix(backup_id))?;
    keys.retain(|k| k.ends_with(".json"));
    keys.sort();
    let mut parts = Vec::with_capacity(keys.len());
    for key in &keys {
        let m = Manifest::from_json(&storage.get_bytes(key)?)?;
        m.check_keys(key, backup_id)?;
        let shard = m
            .shard
            .filter(|s| s.part_key(backup_id) == *key)
            .ok_or_else(|| {
                Error::Manifest(format!(
                    "{key} is not the part its name says ({:?})",
                    m.shard
                ))
            })?;
        parts.push((shard, m));
    }
    let Some((first, _)) = parts.first() else {
        return Ok(None);
    };
    let count = first.count;
    if let Some((other, _)) = parts.iter().find(|(s, _)| s.count != count) {
        return Err(Error::Manifest(format!(
            "backup {backup_id} has parts of {count} and of {} workers: remove the parts of the run that is not wanted",
            other.count
        )));
    }
    let complete =
        parts.len() as u32 == count && parts.iter().all(|(_, m)| m.completed_at.is_some());
    let mut merged = parts[0].1.clone();
    merged.shard = None;
    merged.parts = Some(count);
    merged.queues.clear();
    merged.definitions = None;
    for (_, m) in &parts {
        merged.created_at = merged.created_at.min(m.created_at);
        merged.queues.extend(m.queues.iter().cloned());
        if merged.definitions.is_none() {
            merged.definitions = m.definitions.clone();
        }
        // Parts written with other recipients (workers configured apart): every key is listed,
        // and each segment says how it is stored.
        match (&mut merged.encryption, &m.encryption) {
            (Some(all), Some(e)) => {
                for r in &e.recipients {
                    if !all.recipients.contains(r) {
                        all.recipients.push(r.clone());
                    }
                }
            }
            (all @ None, Some(e)) => *all = Some(e.clone()),
            (_, None) => {}
        }
    }
    merged.completed_at = if complete {
        parts.iter().filter_map(|(_, m)| m.completed_at).max()
    } else {
        None
    };
    merged
        .queues
        .sort_by(|a, b| (&a.vhost, &a.name).cmp(&(&b.vhost, &b.name)));
    merged.recompute_totals();
    Ok(Some(merged))
}
