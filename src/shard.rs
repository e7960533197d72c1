//! Sharded backups (issue "Clusters and scale-out", item 5): one backup id written by `count`
//! workers at once (a Kubernetes Indexed Job: `packaging/k8s/indexed-job.yaml`), each taking a
//! deterministic share of the selected queues, none waiting for another:
//!
//! - worker `index` backs up the queues whose vhost and name hash to it ([`Shard::owns`]:
//!   FNV-1a 64 of `vhost`, a 0 byte and `name`, modulo `count`), the same share whatever each
//!   worker lists, in whatever order;
//! - it writes its part of the manifest, `{backup_id}/parts/<index>-of-<count>.json` (a
//!   manifest of its queues with `shard: {index, count}`), under its own run lock
//!   (`crate::lock::LockName::part`); worker 0 alone exports the definitions;
//! - the backup is `completed` exactly when every part is: the worker that completes the last
//!   part writes `{backup_id}/manifest.json`, the parts merged (create-only), and so does a
//!   reader (`Manifest::read`: `list`, `describe`, `validate`, `restore`) that finds every part
//!   complete but no `manifest.json` (a worker killed between its part and the merge). Before
//!   that, readers see the parts present merged, with `completed_at: null`;
//! - a rerun of one index finishes its own part, and merges when it completes the last one.

use serde::{Deserialize, Serialize};

use crate::config::ShardConfig;
use crate::error::{Error, Result};
use crate::manifest::{manifest_key, Manifest};
use crate::storage::{Conditional, Storage};

/// The environment variable a Kubernetes Indexed Job sets to each pod's index.
pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

/// One worker's part of a sharded backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based, below `count`.
    pub index: u32,
    /// Workers sharing the backup.
    pub count: u32,
}

impl Shard {
    /// `backup.shard`, its `index` from [`INDEX_ENV`] when the configuration leaves it out.
    ///
    /// Errors: `Configuration error: ...` when neither gives an index, or it is not a number
    /// below `count`.
    pub fn from_config(cfg: &ShardConfig) -> Result<Shard> {
        let index = match cfg.index {
            Some(i) => i,
            None => {
                let v = std::env::var(INDEX_ENV).map_err(|_| {
                    Error::Config(format!(
                        "backup.shard.index is not set and neither is {INDEX_ENV}: say which part of the {} this run writes",
                        cfg.count
                    ))
                })?;
                v.trim()
                    .parse()
                    .map_err(|_| Error::Config(format!("{INDEX_ENV}={v:?} is not a part number")))?
            }
        };
        if index >= cfg.count {
            return Err(Error::Config(format!(
                "part {index} is not below backup.shard.count {}",
                cfg.count
            )));
        }
        Ok(Shard {
            index,
            count: cfg.count,
        })
    }

    /// True when this part backs up queue `name` of `vhost`.
    pub fn owns(&self, vhost: &str, name: &str) -> bool {
        part_of(vhost, name, self.count) == self.index
    }

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

/// The part of `count` that backs up queue `name` of `vhost` (FNV-1a 64).
pub fn part_of(vhost: &str, name: &str, count: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in vhost.bytes().chain([0]).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(count.max(1))) as u32
}

/// `{backup_id}/parts/`: where the parts of a sharded backup are.
pub fn parts_prefix(backup_id: &str) -> String {
    format!("{backup_id}/parts/")
}

/// The parts of sharded backup `backup_id` merged into one manifest, `None` when it has no
/// part. Complete (`completed_at` the last part's) only when all `count` parts are complete;
/// then it is also written to `{backup_id}/manifest.json` unless that exists (create-only; a
/// storage that refuses the write only costs the next reader the merge again).
///
/// Errors: the storage's; `Manifest error: ...` for a part that cannot be parsed, names
/// another backup or part, lists a key outside the backup, or disagrees with the others on
/// `count`.
pub fn assemble(storage: &dyn Storage, backup_id: &str) -> Result<Option<Manifest>> {
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
    if complete {
        let key = manifest_key(backup_id);
        match merged
            .to_json_pretty()
            .and_then(|json| storage.put_bytes_new(&key, json.as_bytes()))
        {
            Ok(Conditional::Written(_)) => {
                log::info!("backup {backup_id}: all {count} parts complete; {key} written")
            }
            Ok(Conditional::Refused) => {}
            Err(e) => log::debug!("{key} not written ({e}); the parts are merged on each read"),
        }
    }
    Ok(Some(merged))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_has_exactly_one_part_and_the_parts_share_the_queues() {
        for count in [1u32, 2, 3, 7] {
            let mut per_part = vec![0usize; count as usize];
            for i in 0..3000 {
                let (v, q) = (format!("v{}", i % 5), format!("queue-{i}"));
                let owners: Vec<u32> = (0..count)
                    .filter(|&index| Shard { index, count }.owns(&v, &q))
                    .collect();
                assert_eq!(owners.len(), 1, "{v}/{q} of {count}");
                per_part[owners[0] as usize] += 1;
            }
            let even = 3000 / count as usize;
            assert!(
                per_part.iter().all(|&n| n > even * 8 / 10),
                "{count}: {per_part:?}"
            );
        }
        // Stable across versions: the part of a queue is part of the storage format.
        assert_eq!(part_of("/", "orders", 3), part_of("/", "orders", 3));
        assert_ne!(part_of("a", "bc", 1000), part_of("ab", "c", 1000));
    }

    #[test]
    fn the_index_comes_from_the_config_or_the_job() {
        let with = |index| ShardConfig { index, count: 3 };
        assert_eq!(Shard::from_config(&with(Some(2))).unwrap().index, 2);
        assert!(Shard::from_config(&with(Some(3)))
            .unwrap_err()
            .to_string()
            .contains("not below backup.shard.count 3"));
        assert_eq!(
            Shard { index: 1, count: 3 }.part_key("b"),
            "b/parts/1-of-3.json"
        );
    }
}
