//! How old a run lock's last write is, told by the storage's own time, never by comparing the
//! writer's clock with the reader's (issue 31, item 5: a reader whose clock ran 3 minutes
//! fast took a live run's lock, and `forget --prune-interrupted` then deleted its data).
//!
//! The writer's `heartbeat_at` is its own clock's; a reader's clock may differ by minutes.
//! What both share is the storage: every heartbeat rewrites the lock object, and the storage
//! stamps it with its own last-modified time (filesystem: the file's mtime, set by the kernel
//! or the file server; S3 and Azure: `LastModified`; GCS: `updated`; `Storage::list_with_times`).
//! The reader measures the storage's clock once ([`StorageClock`]: it writes a small probe
//! object beside the lock and reads back its last-modified time, between two readings of its
//! own clock), and the lock's age is then the storage's "now" minus the lock's last-modified,
//! both in the storage's time, taken as the least it can be (probe round trip and a second of
//! last-modified granularity on each side). A writer's or reader's skew no longer counts.
//!
//! A backend that reports no times (the memory backend: one process's objects, whose writers
//! share the reader's clock) falls back on `heartbeat_at` and the reader's clock. Beside the
//! age, a reader that watches a lock (`super::wait_for_other_run`) judges it by successive
//! reads: a lock whose stored version has not changed for [`super::Timing::takeover`] of the
//! reader's own monotonic time has not been renewed, whatever any clock says; and a takeover
//! is itself a conditional write on the version seen, refused if the writer renewed since.

use super::{LockInfo, LockName, Timing};
use crate::error::Error;
use crate::error::Result;
use crate::repository::storage::{ObjectVersion, Storage};
use std::cell::OnceCell;
use std::time::{Duration, Instant};

/// The reader's wall clock, epoch ms: `crate::now_ms`, or a skewed one in tests.
pub type Clock = dyn Fn() -> i64 + Send + Sync;

/// Granularity of a last-modified time: S3 and Azure report whole seconds.
const STAMP_MS: i64 = 1000;

/// The storage's clock as the reader sees it: at reader time `r` (epoch ms), the storage's
/// time is at least `r + offset_min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageClock {
    pub offset_min: i64,
}

impl StorageClock {
    /// Measures the storage's clock with a probe object `key`: reader time `t0`, write, reader
    /// time `t1`, the probe's last-modified `p` (written at storage time in `[p, p + 1 s)`, at a
    /// reader time in `[t0, t1]`), so the storage's time at reader time `r` is at least
    /// `r + p - t1`. The probe is deleted after (a failure to delete is only logged: a run may
    /// have no delete permission; the next probe overwrites it). `None` when the storage
    /// reports no time.
    ///
    /// Errors: the storage's (writing or listing the probe).
    pub fn measure(storage: &dyn Storage, key: &str, clock: &Clock) -> Result<Option<Self>> {
        let t0 = clock();
        storage.put_bytes(key, b"rmq-backup: written to read the storage's clock\n")?;
        let t1 = clock().max(t0);
        let stamp = modified_at(storage, key)?;
        if let Err(e) = storage.delete(key) {
            log::debug!("{key}: {e}");
        }
        Ok(stamp.map(|p| StorageClock {
            offset_min: p.saturating_sub(t1),
        }))
    }

    /// The least age (ms, 0 or more) of an object last modified at `stamp` (storage time, to
    /// the second), at reader time `now`.
    pub fn age(&self, stamp: i64, now: i64) -> i64 {
        now.saturating_add(self.offset_min)
            .saturating_sub(stamp.saturating_add(STAMP_MS))
            .max(0)
    }
}

/// The last-modified time (epoch ms, the storage's clock) of `key`, `None` when the storage
/// reports none or the key is gone.
fn modified_at(storage: &dyn Storage, key: &str) -> Result<Option<i64>> {
    Ok(storage
        .list_with_times(key)?
        .into_iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, t)| t))
}

/// One read of a lock: what it holds (`None` when it cannot be parsed), its version, its
/// last-modified time, and when (the reader's monotonic clock) it was read.
#[derive(Debug, Clone)]
pub struct Look {
    pub info: Option<LockInfo>,
    pub version: ObjectVersion,
    pub modified_at: Option<i64>,
    pub seen: Instant,
}

/// A reader's judgement of run locks in one storage: reads them and tells their age by the
/// storage's clock (measured once, at the first lock that needs it).
pub struct Judge<'a> {
    storage: &'a dyn Storage,
    timing: Timing,
    clock: &'a Clock,
    storage_clock: OnceCell<Option<StorageClock>>,
}

impl<'a> Judge<'a> {
    /// A judge of the locks of `storage` with `timing`, reading the time from `clock`.
    pub fn new(storage: &'a dyn Storage, timing: Timing, clock: &'a Clock) -> Self {
        Judge {
            storage,
            timing,
            clock,
            storage_clock: OnceCell::new(),
        }
    }

    /// The timing locks are judged with.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The reader's clock now (epoch ms).
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// Reads the lock `name`: `None` when there is none. Errors: the storage's.
    pub fn look(&self, name: &LockName) -> Result<Option<Look>> {
        let Some((bytes, version)) = self.storage.get_with_version(&name.key)? else {
            return Ok(None);
        };
        // Read after the content: a renewal in between makes the lock look younger, not older.
        let modified_at = modified_at(self.storage, &name.key)?;
        let info = serde_json::from_slice(&bytes)
            .map_err(|e| log::debug!("{} cannot be parsed ({e}): taken as no lock", name.key))
            .ok();
        Ok(Some(Look {
            info,
            version,
            modified_at,
            seen: Instant::now(),
        }))
    }

    /// The least age (ms) of the lock's last write at reader time `now`: by the storage's clock
    /// when the storage stamps its objects, else (the memory backend) from `heartbeat_at` and
    /// the reader's clock. `None` for a lock that cannot be parsed.
    ///
    /// Errors: the storage's, measuring its clock (the first time).
    pub fn age(&self, name: &LockName, look: &Look, now: i64) -> Result<Option<i64>> {
        let Some(info) = &look.info else {
            return Ok(None);
        };
        let by_storage = match look.modified_at {
            Some(stamp) => self.storage_clock(name)?.map(|c| c.age(stamp, now)),
            None => None,
        };
        Ok(Some(
            by_storage.unwrap_or_else(|| now.saturating_sub(info.heartbeat_at)),
        ))
    }

    fn storage_clock(&self, name: &LockName) -> Result<Option<StorageClock>> {
        if let Some(c) = self.storage_clock.get() {
            return Ok(*c);
        }
        let dir = name.key.rsplit_once('/').map_or("", |(d, _)| d);
        let probe = format!("{dir}/storage-clock-probe");
        let c = StorageClock::measure(self.storage, &probe, self.clock)?;
        Ok(*self.storage_clock.get_or_init(|| c))
    }

    /// True when another run may take the lock seen in `look` over at reader time `now`: it
    /// cannot be parsed (a damaged lock proves no live run), its run ended, its writer is known
    /// to be gone, or its last write is [`Timing::takeover`] old by the storage's clock
    /// ([`Judge::age`]).
    ///
    /// Errors: the storage's, measuring its clock.
    pub fn may_be_taken(&self, name: &LockName, look: &Look, now: i64) -> Result<bool> {
        let Some(info) = &look.info else {
            return Ok(true);
        };
        if info.ended_at.is_some() || info.writer_gone() {
            return Ok(true);
        }
        let age = self.age(name, look, now)?;
        Ok(age.is_some_and(|a| a >= self.timing.takeover.as_millis() as i64))
    }

    /// True when `later` (a read after `first`) shows the lock unchanged (same version) for
    /// [`Timing::takeover`] of the reader's monotonic time: not renewed, whatever any clock
    /// says.
    pub fn unchanged_for_takeover(&self, first: &Look, later: &Look) -> bool {
        first.version == later.version
            && later.seen.duration_since(first.seen) >= self.timing.takeover
    }

    /// `Some((lock, age))` when the lock `name` is busy: held by a run that may still write
    /// ([`Judge::may_be_taken`] is false). Errors: the storage's.
    pub fn busy(&self, name: &LockName) -> Result<Option<(LockInfo, Option<i64>)>> {
        let Some(look) = self.look(name)? else {
            return Ok(None);
        };
        let now = self.now();
        if self.may_be_taken(name, &look, now)? {
            return Ok(None);
        }
        let age = self.age(name, &look, now)?;
        Ok(look.info.map(|i| (i, age)))
    }
}

pub(super) fn refused(name: &LockName, other: Option<&LockInfo>, age: Option<i64>) -> Error {
    let by = other.map_or_else(
        || "a lock that cannot be read".to_string(),
        |o| o.describe_age(age),
    );
    Error::Config(format!(
        "{} is being written by another run on {by}; wait for it to end or choose another backup_id",
        name.label,
    ))
}

/// Watches the lock `first` of another run, which may not be taken yet, by successive reads:
/// `Ok(Some(look))` once it may be taken (its run ended, its writer is gone, its last write is
/// `timing.takeover` old by the storage's clock, or its version stood still for that long of
/// this reader's monotonic time), the caller then replaces the version seen; `Ok(None)` when
/// it is gone. Errors: `Configuration error: backup <id> is being written by another run ...`
/// when it changes (its run renews it); storage errors.
pub(super) fn wait_for_other_run(
    judge: &Judge,
    name: &LockName,
    first: Look,
) -> Result<Option<Look>> {
    let timing = judge.timing();
    let age = judge.age(name, &first, judge.now())?;
    let left = age.map_or(timing.takeover.as_millis() as i64, |a| {
        timing.takeover.as_millis() as i64 - a
    });
    log::info!(
        "{} has the lock of another run ({}); watching it for up to {} s (a lock is taken over once it has not been renewed for {} s)",
        name.label,
        first.info.as_ref().map_or_else(String::new, |i| i.describe_age(age)),
        left.max(0) / 1000 + 1,
        timing.takeover.as_secs()
    );
    let poll = timing.heartbeat.min(Duration::from_secs(1));
    loop {
        std::thread::sleep(poll);
        let Some(look) = judge.look(name)? else {
            return Ok(None);
        };
        let now = judge.now();
        let takeable = judge.may_be_taken(name, &look, now)?;
        if look.version != first.version && !takeable {
            let age = judge.age(name, &look, now)?;
            return Err(refused(name, look.info.as_ref(), age));
        }
        if takeable || judge.unchanged_for_takeover(&first, &look) {
            if look.info.as_ref().is_some_and(|i| i.ended_at.is_none()) {
                log::warn!(
                    "{}: the run on {} is gone or stopped renewing its lock; taking the lock over",
                    name.label,
                    look.info.as_ref().map_or_else(String::new, |i| i
                        .describe_age(judge.age(name, &look, now).ok().flatten()))
                );
            }
            return Ok(Some(look));
        }
    }
}
