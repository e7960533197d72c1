//! Sharded backups (issue "Clusters and scale-out", item 5): one backup id written by `count`
//! workers at once (a Kubernetes Indexed Job: `packaging/k8s/indexed-job.yaml`), each taking a
//! deterministic share of the selected queues, none waiting for another:
//!
//! - worker `index` backs up the queues whose vhost and name hash to it ([`Shard::owns`]:
//!   FNV-1a 64 of `vhost`, a 0 byte and `name`, modulo `count`), the same share whatever each
//!   worker lists, in whatever order;
//! - it writes its part of the manifest, `{backup_id}/parts/<index>-of-<count>.json` (a
//!   manifest of its queues with `shard: {index, count}`), under its own run lock
//!   (`crate::repository::lock::LockName::part`); worker 0 alone exports the definitions;
//! - the backup is `completed` exactly when every part is: the worker that completes the last
//!   part writes `{backup_id}/manifest.json`, the parts merged (create-only,
//!   `crate::backup`). A reader (`Manifest::read`: `list`, `describe`, `validate`, `cat`,
//!   `restore`, `forget`) that finds no `manifest.json` merges the parts in memory
//!   (`crate::repository::manifest::merge_parts`) and writes nothing: complete when every part is (a worker
//!   killed between its part and the merge), else with `completed_at: null`;
//! - a rerun of one index finishes its own part, and merges when it completes the last one.
//!
//! The part's identity in a manifest ([`Shard`], its key, the merge) is the manifest's; this
//! module says which part a worker is and which queues it owns.

use crate::config::ShardConfig;
use crate::error::{Error, Result};
pub use crate::repository::manifest::{parts_prefix, Shard};

/// The environment variable a Kubernetes Indexed Job sets to each pod's index.
pub const INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

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
