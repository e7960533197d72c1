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

use crate::config::{LockMode, ObjectLockConfig};

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
    /// but `{backup_id}/state/...`.
    pub fn applies_to(&self, key: &str) -> bool {
        let key = key.strip_prefix(&self.prefix).unwrap_or(key);
        key.split('/').nth(1) != Some("state")
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
        }
        let l = ObjectLock::new(&cfg, None);
        let until = crate::run::units::parse_time(&l.until_rfc3339()).unwrap();
        assert_eq!(until, l.until_ms());
        assert!(until > crate::now_ms() + 86_399_000);
    }
}
