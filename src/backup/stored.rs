//! What storage held under `{backup_id}/queues/` when a run started ([`Earlier`]): a queue read
//! again numbers its segments after the highest one already there, so no segment is ever
//! overwritten (`super::resume`).

use crate::broker::management::QueueInfo;
use crate::error::Result;
use crate::repository::manifest;
use crate::repository::storage::Storage;
use std::collections::HashMap;

/// What storage holds under `{backup_id}/queues/` when a run starts: segments of an earlier
/// run of this backup, or of an older backup with the same id.
#[derive(Debug, Default)]
pub(super) struct Earlier {
    /// The highest segment number under each queue's prefix: stored when the run started, or
    /// assigned by an attempt of this run since ([`Earlier::assigned`]).
    highest: std::sync::Mutex<HashMap<String, u64>>,
    /// How many keys there were.
    pub(super) keys: usize,
}

impl Earlier {
    /// Lists `{backup_id}/queues/` once. Errors: the storage's.
    pub(super) fn list(storage: &dyn Storage, backup_id: &str) -> Result<Earlier> {
        let keys = storage.list(&format!("{backup_id}/queues/"))?;
        let mut highest: HashMap<String, u64> = HashMap::new();
        for key in &keys {
            let Some((prefix, name)) = key.rsplit_once('/') else {
                continue;
            };
            if let Some(n) = segment_number(name) {
                let h = highest.entry(format!("{prefix}/")).or_default();
                *h = (*h).max(n);
            }
        }
        Ok(Earlier {
            highest: std::sync::Mutex::new(highest),
            keys: keys.len(),
        })
    }

    /// The highest segment number stored for `q` when the run started or assigned since (0
    /// when none).
    pub(super) fn highest(&self, backup_id: &str, q: &QueueInfo) -> u64 {
        let prefix = manifest::queue_prefix(backup_id, &q.vhost, &q.name);
        self.highest
            .lock()
            .map(|h| h.get(&prefix).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Segment `sequence` of `q` was assigned by this run: a later attempt numbers after it.
    pub(super) fn assigned(&self, backup_id: &str, q: &QueueInfo, sequence: u64) {
        let prefix = manifest::queue_prefix(backup_id, &q.vhost, &q.name);
        if let Ok(mut h) = self.highest.lock() {
            let e = h.entry(prefix).or_default();
            *e = (*e).max(sequence);
        }
    }
}

/// The number of a segment file name (`segment-0012.zst` -> 12).
fn segment_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("segment-")?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_numbers_come_from_file_names() {
        assert_eq!(segment_number("segment-0001.zst"), Some(1));
        assert_eq!(segment_number("segment-12345.lz4"), Some(12345));
        assert_eq!(segment_number("segment-0007"), Some(7));
        assert_eq!(segment_number("other-0001.zst"), None);
        assert_eq!(segment_number("segment-.zst"), None);
    }
}
