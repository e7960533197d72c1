//! `storage.object_lock` as the object-store backends apply it: which keys get a retention
//! date, and that date.
//!
//! Every object a backup writes is locked (segments, definitions, manifests and their parts)
//! except the ones a run rewrites or removes while it works: the run locks, the clock probe
//! and the checkpoint database, all under `{backup_id}/state/` (`crate::repository::lock`,
//! `crate::repository::manifest::offsets_db_key`). A manifest is written twice (interrupted first, then
//! completed): on S3 and Azure each write is a new version, the earlier one kept until its own
//! date; GCS refuses to replace a retained object, so there the interrupted manifest is left
//! unlocked (see the backends).
//!
//! The date is computed by this machine's clock at each write: `now + retain_for`.

use super::Storage;
use crate::config::{LockMode, ObjectLockConfig};
use crate::error::{Error, Result};

/// The retention a backend sets on the objects it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLock {
    /// Governance or compliance.
    pub mode: LockMode,
    /// Seconds from a write to its retention date.
    pub retain_for_secs: u64,
    /// `storage.prefix` with its trailing `/` (the backend sees prefixed keys), or empty.
    prefix: String,
}

impl ObjectLock {
    /// The lock of `cfg` for a storage whose keys start with `prefix` (`storage.prefix`).
    pub fn new(cfg: &ObjectLockConfig, prefix: Option<&str>) -> ObjectLock {
        let prefix = prefix
            .map(|p| p.trim_matches('/'))
            .filter(|p| !p.is_empty())
            .map(|p| format!("{p}/"))
            .unwrap_or_default();
        ObjectLock {
            mode: cfg.mode,
            retain_for_secs: cfg.retain_for.0,
            prefix,
        }
    }

    /// Whether the object at `key` (as the backend sees it, prefix included) is locked: all
    /// but `{backup_id}/state/...` and the repository's own state
    /// (`crate::repository::delivery_counts::STATE_PREFIX`), which runs rewrite.
    pub fn applies_to(&self, key: &str) -> bool {
        let key = key.strip_prefix(&self.prefix).unwrap_or(key);
        let mut parts = key.split('/');
        parts.next() != Some(crate::repository::delivery_counts::STATE_PREFIX)
            && parts.next() != Some("state")
    }

    /// The retention date of an object written now, epoch ms (whole seconds).
    pub fn until_ms(&self) -> i64 {
        let now = crate::now_ms().div_euclid(1000);
        (now + self.retain_for_secs as i64 + 1) * 1000
    }

    /// [`Self::until_ms`] as RFC 3339 UTC (`2026-12-27T02:33:01Z`), as S3 and GCS take it.
    pub fn until_rfc3339(&self) -> String {
        let ms = self.until_ms();
        format!(
            "{}Z",
            crate::run::units::format_ms(ms).replacen(' ', "T", 1)
        )
    }
}

/// `locked until <time>`: how `forget` and the errors name a retention date.
pub fn locked_until(ms: i64) -> String {
    format!("locked until {}", crate::run::units::rfc3339_ms(ms))
}

/// How many retention dates [`latest_retention`] asks for at once (HEAD requests on S3 and
/// Azure): enough to hide a round trip's latency, few enough for any endpoint.
const RETENTION_QUERIES: usize = 8;

/// The latest [`Storage::retained_until`] of `keys` in `storage`, epoch ms (`None` when no key
/// has one), asked [`RETENTION_QUERIES`] at a time. Every key is asked: a backup's objects
/// are written in parallel and over several runs, so no one object stands for the others.
///
/// Errors: the first failure of the storage's, naming its key.
pub fn latest_retention<S: Storage + ?Sized>(storage: &S, keys: &[String]) -> Result<Option<i64>> {
    if keys.is_empty() {
        return Ok(None);
    }
    let chunk = keys.len().div_ceil(RETENTION_QUERIES);
    std::thread::scope(|scope| {
        let failed = |why: String| {
            Error::Storage(format!(
                "Failed to read the retention of {}: {why}",
                keys[0]
            ))
        };
        let workers = keys
            .chunks(chunk)
            .map(|part| {
                std::thread::Builder::new()
                    .name("retention-query".into())
                    .spawn_scoped(scope, move || {
                        part.iter().try_fold(None, |latest: Option<i64>, k| {
                            Ok(latest.max(storage.retained_until(k)?))
                        })
                    })
                    .map_err(|e| failed(format!("cannot start a thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut latest = None;
        for w in workers {
            let got: Result<Option<i64>> = w
                .join()
                .map_err(|_| failed("a worker thread panicked".into()))?;
            latest = latest.max(got?);
        }
        Ok(latest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RetainFor;

    #[test]
    fn state_keys_are_never_locked() {
        let cfg = ObjectLockConfig {
            mode: LockMode::Governance,
            retain_for: RetainFor(86_400),
        };
        for (prefix, k) in [(None, ""), (Some("team/prod/"), "team/prod/")] {
            let l = ObjectLock::new(&cfg, prefix);
            assert!(l.applies_to(&format!("{k}b1/manifest.json")));
            assert!(l.applies_to(&format!("{k}b1/queues/v/state/segment-0001.zst")));
            assert!(l.applies_to(&format!("{k}b1/parts/part-0-of-2.json")));
            assert!(!l.applies_to(&format!("{k}b1/state/lock.json")));
            assert!(!l.applies_to(&format!("{k}b1/state/offsets.db")));
            assert!(!l.applies_to(&format!("{k}b1/state/storage-clock-probe")));
            assert!(!l.applies_to(&format!("{k}rmq-backup-state/delivery-counts/c/v/q.json")));
        }
        let l = ObjectLock::new(&cfg, None);
        let until = crate::run::units::parse_time(&l.until_rfc3339()).unwrap();
        assert_eq!(until, l.until_ms());
        assert!(until > crate::now_ms() + 86_399_000);
    }
}
