//! The run lock of a backup: `{backup_id}/state/lock.json`, a heartbeat that tells a running
//! backup from an interrupted one, and keeps two runs from writing the same backup.
//!
//! A backup writes its manifest with `completed_at: null` first (SPEC.md "States and
//! transitions"), so without more, a backup that is still being written reads exactly like one
//! that died. While a backup runs, a thread rewrites the lock object every
//! [`Timing::heartbeat`] with the time of the beat (epoch ms, the writer's clock); the run ends
//! by writing `ended_at` into it.
//!
//! Every write of the lock is conditional (`crate::repository::storage::conditional`): the first run
//! creates it only when it does not exist, and each heartbeat replaces only the version the run
//! wrote last. Two runs can therefore never both believe they hold it: a run whose write is
//! refused has lost the lock, and stops. A run that cannot renew its lock within
//! [`Timing::lease`] (a storage that stalls) stops its own writes too ([`RunLock::check`]),
//! before any other run may take the lock over: that happens only once the lock's last write is
//! [`Timing::takeover`] old, well beyond the retry budget of one storage request, or at once
//! when the lock's run has ended, or when the reader runs on the writer's host and PID namespace
//! and the writer's process is gone (a killed run retried at once by cron or a shell loop).
//! The age of a lock's last write is told by the storage's own time, never by comparing the
//! writer's clock with the reader's ([`age`]: a reader whose clock runs fast takes no live
//! lock).
//!
//! The status of a backup whose manifest has no `completed_at`: `running` while the lock is
//! live ([`LockInfo::is_live`]: not ended, renewed within the lease, writer not known gone),
//! else `interrupted`. A run never deletes the lock (a backup needs no delete permission; a
//! run that judges another's lock tries to delete its clock probe, [`age`], and leaves it when
//! refused); `forget` deletes a lock it holds ([`RunLock::delete`]).

mod age;

use age::{refused, wait_for_other_run};
pub use age::{Clock, Judge, Look, StorageClock};

use crate::error::{Error, Result};
use crate::now_ms;
use crate::repository::storage::{Conditional, ObjectVersion, Storage};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The lock's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Time between two heartbeats.
    pub heartbeat: Duration,
    /// A holder that has not renewed its lock for this long stops its writes; a lock whose
    /// heartbeat is this old reads as not running.
    pub lease: Duration,
    /// Another run takes a lock over once its heartbeat is this old (more than the lease and
    /// than the retry budget of one storage request: 5 attempts of at most 30 s each).
    pub takeover: Duration,
}

impl Timing {
    /// Heartbeat 5 s, lease 60 s, takeover after 180 s.
    pub const DEFAULT: Timing = Timing {
        heartbeat: Duration::from_secs(5),
        lease: Duration::from_secs(60),
        takeover: Duration::from_secs(180),
    };

    /// [`Timing::DEFAULT`], or for tests `RMQ_BACKUP_LOCK_TIMING=<heartbeat ms>,<lease ms>,<takeover ms>`.
    pub fn from_env() -> Timing {
        let Ok(v) = std::env::var("RMQ_BACKUP_LOCK_TIMING") else {
            return Timing::DEFAULT;
        };
        let ms: Vec<u64> = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
        match ms.as_slice() {
            [h, l, t] if h < l && l < t => Timing {
                heartbeat: Duration::from_millis(*h),
                lease: Duration::from_millis(*l),
                takeover: Duration::from_millis(*t),
            },
            _ => {
                log::warn!("RMQ_BACKUP_LOCK_TIMING={v:?} is not <heartbeat ms>,<lease ms>,<takeover ms> in increasing order: ignored");
                Timing::DEFAULT
            }
        }
    }
}

/// A lock whose last heartbeat is this old (ms) reads as not running ([`Timing::DEFAULT`]'s
/// lease).
pub const STALE_AFTER_MS: i64 = 60_000;

/// Storage key of the run lock of `backup_id`.
pub fn lock_key(backup_id: &str) -> String {
    format!("{backup_id}/state/lock.json")
}

/// What a run lock locks: its storage key, and how messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockName {
    /// `{backup_id}/state/lock.json`, or a part's lock of a sharded backup.
    pub key: String,
    /// `backup <id>`, or `backup <id> (part <i> of <n>)`.
    pub label: String,
}

impl LockName {
    /// The lock of backup `backup_id` ([`lock_key`]).
    pub fn backup(backup_id: &str) -> LockName {
        LockName {
            key: lock_key(backup_id),
            label: format!("backup {backup_id}"),
        }
    }

    /// The lock of part `index` of `count` of a sharded backup (`crate::repository::shard`):
    /// `{backup_id}/state/lock-part-<index>-of-<count>.json`.
    pub fn part(backup_id: &str, index: u32, count: u32) -> LockName {
        LockName {
            key: format!("{backup_id}/state/lock-part-{index}-of-{count}.json"),
            label: format!("backup {backup_id} (part {index} of {count})"),
        }
    }
}

/// The content of `{backup_id}/state/lock.json`. Times are epoch ms of the writer's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// Unique id of the run: `<host>-<pid>-<started_at>`.
    pub run_id: String,
    /// Host name of the writer (`/proc/sys/kernel/hostname`, else `$HOSTNAME`).
    pub host: String,
    /// Process id of the writer.
    pub pid: u32,
    /// The writer's PID namespace (`pid:[4026531836]`, from `/proc/self/ns/pid`): a pid is only
    /// looked up by readers in the same namespace on the same host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_namespace: Option<String>,
    pub started_at: i64,
    /// Time of the last heartbeat.
    pub heartbeat_at: i64,
    /// Set when the run ended (completed or failed); a killed run never sets it.
    pub ended_at: Option<i64>,
}

impl LockInfo {
    /// True while the run that wrote this lock may be alive: not ended, a heartbeat less than
    /// [`STALE_AFTER_MS`] before `now` (epoch ms), and not a writer known to be gone (same host
    /// and PID namespace as this process, and no such process, or a zombie).
    pub fn is_live(&self, now: i64) -> bool {
        self.ended_at.is_none()
            && now.saturating_sub(self.heartbeat_at) < STALE_AFTER_MS
            && !self.writer_gone()
    }

    /// True when this process can see that the writer's process no longer exists.
    fn writer_gone(&self) -> bool {
        self.host == host_name()
            && self.pid_namespace.is_some()
            && self.pid_namespace == pid_namespace()
            && !process_alive(self.pid)
    }

    /// `host <host> (pid <pid>), last heartbeat <n> s ago`, for messages: the age by the
    /// reader's clock `now` (see [`LockInfo::describe_age`] for the storage's).
    pub fn describe(&self, now: i64) -> String {
        self.describe_age(Some(now.saturating_sub(self.heartbeat_at)))
    }

    /// `host <host> (pid <pid>), last heartbeat <n> s ago` with the age (ms) of its last write
    /// ([`Judge::age`]); without `, last ...` when the age is unknown.
    pub fn describe_age(&self, age_ms: Option<i64>) -> String {
        let mut s = format!("host {} (pid {})", self.host, self.pid);
        if let Some(a) = age_ms {
            s.push_str(&format!(", last heartbeat {} s ago", a.max(0) / 1000));
        }
        s
    }
}

/// Reads the lock of `backup_id`. `Ok(None)` when there is none, or when it cannot be parsed (a
/// damaged lock proves no live run; it is logged at debug level). Errors: storage failures.
pub fn read(storage: &dyn Storage, backup_id: &str) -> Result<Option<LockInfo>> {
    read_named(storage, &LockName::backup(backup_id))
}

/// [`read`] for the lock `name`.
pub fn read_named(storage: &dyn Storage, name: &LockName) -> Result<Option<LockInfo>> {
    Ok(read_versioned(storage, name)?.and_then(|(info, _)| info))
}

/// The lock `name` as stored, parsed when it parses, and its version.
fn read_versioned(
    storage: &dyn Storage,
    name: &LockName,
) -> Result<Option<(Option<LockInfo>, ObjectVersion)>> {
    let key = &name.key;
    let Some((bytes, version)) = storage.get_with_version(key)? else {
        return Ok(None);
    };
    let info = serde_json::from_slice(&bytes)
        .map_err(|e| log::debug!("{key} cannot be parsed ({e}): taken as no lock"))
        .ok();
    Ok(Some((info, version)))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// True when process `pid` exists in this PID namespace and is not a zombie
/// (`/proc/<pid>/stat`, state field).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')' (comm may hold spaces and parens).
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// What the heartbeat thread and the run share.
struct Shared {
    storage: Arc<dyn Storage>,
    name: LockName,
    timing: Timing,
    held: Mutex<Held>,
    /// Set by [`RunLock`]'s release; the condvar wakes the heartbeat thread at once.
    stop: Mutex<bool>,
    wake: Condvar,
    /// Why the run lost its lock (another run took it over), once it did.
    lost: Mutex<Option<String>>,
    lost_flag: AtomicBool,
}

/// The lock as this run last wrote it.
struct Held {
    info: LockInfo,
    version: ObjectVersion,
    /// When a write of it last succeeded.
    renewed: Instant,
}

impl Shared {
    fn json(info: &LockInfo) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(info).map_err(|e| Error::Serialization(format!("run lock: {e}")))
    }

    fn lose(&self, why: String) {
        log::error!("{why}");
        if let Ok(mut lost) = self.lost.lock() {
            lost.get_or_insert(why);
        }
        self.lost_flag.store(true, Ordering::Relaxed);
    }

    /// Writes `update`d info over the version this run holds. A refused write means another
    /// run holds the lock now, unless what is stored is this run's own (a retried request whose
    /// first attempt landed). Storage failures are logged and retried at the next beat.
    fn renew(&self, update: impl FnOnce(&mut LockInfo)) -> bool {
        let key = &self.name.key;
        let (info, version) = match self.held.lock() {
            Ok(mut h) => {
                update(&mut h.info);
                (h.info.clone(), h.version.clone())
            }
            Err(_) => return false,
        };
        let written =
            Self::json(&info).and_then(|json| self.storage.put_bytes_if(key, &json, &version));
        let new_version = match written {
            Ok(Conditional::Written(v)) => v,
            Ok(Conditional::Refused) => match read_versioned(self.storage.as_ref(), &self.name) {
                Ok(Some((Some(stored), v))) if stored.run_id == info.run_id => v,
                Ok(other) => {
                    let by = match other {
                        Some((Some(o), _)) => o.describe(now_ms()),
                        _ => "a lock that is gone or damaged".to_string(),
                    };
                    self.lose(format!(
                        "another run took over {} ({by}); this run stops",
                        self.name.label
                    ));
                    return false;
                }
                Err(e) => {
                    log::warn!("run lock of {}: {e}", self.name.label);
                    return false;
                }
            },
            Err(e) => {
                log::warn!("run lock heartbeat of {}: {e}", self.name.label);
                return false;
            }
        };
        if let Ok(mut h) = self.held.lock() {
            h.version = new_version;
            h.renewed = Instant::now();
        }
        true
    }

    /// Why this run must stop writing, if it must: it lost the lock, or has not renewed it
    /// within the lease.
    fn stop_reason(&self) -> Option<String> {
        if self.lost_flag.load(Ordering::Relaxed) {
            return self.lost.lock().ok().and_then(|l| l.clone());
        }
        let renewed = self.held.lock().ok()?.renewed;
        (renewed.elapsed() > self.timing.lease).then(|| {
            format!(
                "the run lock of {} was not renewed for {} s (the storage does not answer): this run stops before another may take the backup over",
                self.name.label,
                renewed.elapsed().as_secs()
            )
        })
    }
}

/// The heartbeat thread's loop: renews the lock every `timing.heartbeat` until stopped or the
/// lock is lost. The stop flag is checked before every wait (`wait_timeout_while`), so a stop
/// asked while a renewal is in flight ends the thread as soon as that renewal returns, not a
/// heartbeat later.
fn heartbeat(s: &Shared) {
    loop {
        let Ok(stopped) = s.stop.lock() else { return };
        let Ok((stopped, _)) = s
            .wake
            .wait_timeout_while(stopped, s.timing.heartbeat, |stopped| !*stopped)
        else {
            return;
        };
        if *stopped {
            return;
        }
        drop(stopped);
        s.renew(|i| i.heartbeat_at = now_ms());
        if s.lost_flag.load(Ordering::Relaxed) {
            return;
        }
    }
}

/// The longest [`RunLock::release`] (or drop) waits for the heartbeat thread to end: the
/// lease, at most 10 s. A renewal stuck in a storage that does not answer can take longer (its
/// own timeouts and retries); the thread is then left to end on its own and `ended_at` is not
/// written (the lock then reads as running until its lease runs out).
fn stop_wait(timing: &Timing) -> Duration {
    timing.lease.min(Duration::from_secs(10))
}

/// The lock of a running backup; the heartbeat runs on its own thread until [`RunLock::release`]
/// (or drop, on every exit path of the run), which stops it within [`stop_wait`] and writes
/// `ended_at`.
pub struct RunLock {
    shared: Arc<Shared>,
    /// This run's `run_id`.
    run_id: String,
    /// The lock of an earlier run that had not ended, which this one replaced (took over).
    replaced: Option<LockInfo>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Disconnected once the heartbeat thread has ended.
    exited: crossbeam_channel::Receiver<()>,
}

impl RunLock {
    /// Takes the lock of `backup_id` (timing from [`Timing::from_env`]) and starts the
    /// heartbeat: created when absent; else, once the other run's lock may be taken (see
    /// [`wait_for_other_run`]), replaced at the version seen. Both writes are conditional, so
    /// of two runs starting at once one gets the lock.
    ///
    /// Errors: `Configuration error: backup <id> is being written by another run on host ...`
    /// while another run's heartbeat moves, or when another run took the lock first (exit 2:
    /// wait for it, or choose another backup_id); storage errors when the lock cannot be
    /// written (the storage refuses writes, or does not support conditional writes).
    pub fn acquire(storage: Arc<dyn Storage>, backup_id: &str) -> Result<RunLock> {
        Self::acquire_named(storage, LockName::backup(backup_id), Timing::from_env())
    }

    /// [`RunLock::acquire`] with the given timing.
    pub fn acquire_with(
        storage: Arc<dyn Storage>,
        backup_id: &str,
        timing: Timing,
    ) -> Result<RunLock> {
        Self::acquire_named(storage, LockName::backup(backup_id), timing)
    }

    /// [`RunLock::acquire`] of the lock `name` (a part's of a sharded backup), with `timing`.
    pub fn acquire_named(
        storage: Arc<dyn Storage>,
        name: LockName,
        timing: Timing,
    ) -> Result<RunLock> {
        let now = now_ms();
        let host = host_name();
        let pid = std::process::id();
        let info = LockInfo {
            run_id: format!("{host}-{pid}-{now}"),
            host,
            pid,
            pid_namespace: pid_namespace(),
            started_at: now,
            heartbeat_at: now,
            ended_at: None,
        };
        let key = name.key.clone();
        let json = Shared::json(&info)?;
        let run_id = info.run_id.clone();
        let mut version = None;
        let mut replaced = None;
        let clock = now_ms;
        let judge = Judge::new(storage.as_ref(), timing, &clock);
        // Each pass either takes the lock or sees another run take it: a few at most.
        for _ in 0..5 {
            if let Conditional::Written(v) = storage.put_bytes_new(&key, &json)? {
                version = Some(v);
                break;
            }
            let Some(mut look) = judge.look(&name)? else {
                continue;
            };
            if !judge.may_be_taken(&name, &look, judge.now())? {
                match wait_for_other_run(&judge, &name, look)? {
                    Some(takeable) => look = takeable,
                    None => continue,
                }
            }
            // Conditional on the version judged: refused when its run renewed it since.
            match storage.put_bytes_if(&key, &json, &look.version)? {
                Conditional::Written(v) => {
                    version = Some(v);
                    replaced = look.info.filter(|o| o.ended_at.is_none());
                    break;
                }
                Conditional::Refused => continue,
            }
        }
        let Some(version) = version else {
            return Err(match judge.look(&name)? {
                Some(look) => {
                    let age = judge.age(&name, &look, judge.now())?;
                    refused(&name, look.info.as_ref(), age)
                }
                None => Error::Storage(format!("{key}: the run lock could not be taken")),
            });
        };
        let shared = Arc::new(Shared {
            storage,
            name,
            timing,
            held: Mutex::new(Held {
                info,
                version,
                renewed: Instant::now(),
            }),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            lost: Mutex::new(None),
            lost_flag: AtomicBool::new(false),
        });
        let s = shared.clone();
        let (exited_tx, exited) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("run-lock".into())
            .spawn(move || {
                // Dropped when the thread ends, however it ends: `stop` waits for that.
                let _exited = exited_tx;
                heartbeat(&s);
            })
            .map_err(|e| Error::Io(format!("cannot start the run-lock thread: {e}")))?;
        Ok(RunLock {
            shared,
            run_id,
            replaced,
            thread: Some(thread),
            exited,
        })
    }

    /// This run's id (`<host>-<pid>-<started_at>`, [`LockInfo::run_id`]).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The lock of an earlier run that had not ended (killed, stalled, or gone silent) which
    /// this run took over; `None` when the lock was free or its last run ended.
    pub fn replaced(&self) -> Option<&LockInfo> {
        self.replaced.as_ref()
    }

    /// Why this run must stop, once it must: another run took the lock over, or the lock has
    /// not been renewed within the lease.
    pub fn lost(&self) -> Option<String> {
        self.shared.stop_reason()
    }

    /// Before a write that only the lock's holder may make (a segment, the manifest, a
    /// delete): `Ok(())` while this run holds its lock. Errors: `Storage error: ...` with
    /// [`RunLock::lost`]'s reason.
    pub fn check(&self) -> Result<()> {
        match self.lost() {
            None => Ok(()),
            Some(why) => Err(Error::Storage(why)),
        }
    }

    /// Stops the heartbeat and writes `ended_at` (unless another run holds the lock now).
    pub fn release(mut self) {
        self.stop();
    }

    /// Deletes the lock while this run still holds it (`forget`, once the backup it holds is
    /// deleted): stops the heartbeat without writing `ended_at`, checks that the run still
    /// holds the lock ([`RunLock::check`]) and that the stored lock is the version it wrote
    /// last, then deletes it. Until the delete the lock reads as held and live, so a run that
    /// starts meanwhile waits for it (and then finds no lock and creates its own) or is
    /// refused: there is no moment at which another run holds a lock that this delete removes
    /// (a takeover needs the lock unrenewed for [`Timing::takeover`], and the check asks for a
    /// renewal within the lease).
    ///
    /// Errors: `Storage error: ...` when the run no longer holds the lock, its heartbeat did
    /// not stop in time (a renewal stuck in the storage), or the storage fails; the lock is then
    /// left for its lease to run out (or for the run that holds it).
    pub fn delete(mut self) -> Result<()> {
        let label = self.shared.name.label.clone();
        if !self.stop_heartbeat() {
            return Err(Error::Storage(format!(
                "run lock of {label}: the heartbeat did not stop (a renewal is stuck in the storage); the lock is left in place"
            )));
        }
        self.check()?;
        let key = &self.shared.name.key;
        let held = self.shared.held.lock().ok().map(|h| h.version.clone());
        match self.shared.storage.get_with_version(key)? {
            Some((_, stored)) if Some(&stored) == held.as_ref() => self.shared.storage.delete(key),
            _ => Err(Error::Storage(format!(
                "run lock of {label}: another run holds it now; it is left in place"
            ))),
        }
    }

    /// Stops the heartbeat thread, waiting at most [`stop_wait`]: true when it ended (false when
    /// a renewal is stuck in the storage, or it was stopped before).
    fn stop_heartbeat(&mut self) -> bool {
        let Some(thread) = self.thread.take() else {
            return false;
        };
        if let Ok(mut stopped) = self.shared.stop.lock() {
            *stopped = true;
        }
        self.shared.wake.notify_all();
        let wait = stop_wait(&self.shared.timing);
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) = self.exited.recv_timeout(wait) {
            // A renewal is stuck in the storage: writing `ended_at` now would race it.
            log::warn!(
                "run lock of {}: the heartbeat did not stop within {} ms (a lock renewal is stuck in the storage); the lock reads as running for up to {} s more",
                self.shared.name.label,
                wait.as_millis(),
                self.shared.timing.lease.as_secs()
            );
            return false;
        }
        let _ = thread.join();
        true
    }

    fn stop(&mut self) {
        if !self.stop_heartbeat() || self.shared.lost_flag.load(Ordering::Relaxed) {
            return;
        }
        let now = now_ms();
        if !self.shared.renew(|i| {
            i.heartbeat_at = now;
            i.ended_at = Some(now);
        }) && !self.shared.lost_flag.load(Ordering::Relaxed)
        {
            log::warn!(
                "run lock of {}: cannot mark the run ended; it reads as running for {} s more",
                self.shared.name.label,
                self.shared.timing.lease.as_secs()
            );
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
