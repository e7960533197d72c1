//! The run lock of a backup: `{backup_id}/state/lock.json`, a heartbeat that tells a running
//! backup from an interrupted one, and keeps two runs from writing the same backup.
//!
//! A backup writes its manifest with `completed_at: null` first (SPEC.md "States and
//! transitions"), so without more, a backup that is still being written reads exactly like one
//! that died. While a backup runs, a thread rewrites the lock object every
//! [`HEARTBEAT_INTERVAL`] with the time of the beat (epoch ms, the writer's clock); the run
//! ends by writing `ended_at` into it. The status of a backup whose manifest has no
//! `completed_at` is then:
//! - `running`: the lock exists, has no `ended_at`, its last heartbeat is less than
//!   [`STALE_AFTER_MS`] old (by the reader's clock: hosts should keep their clocks in sync), and,
//!   when the reader runs on the writer's host and in its PID namespace, the writer's process
//!   still exists;
//! - `interrupted`: otherwise (the run ended without completing, or it was killed).
//!
//! The lock is advisory. A run that finds another run's lock live watches it for up to
//! [`TAKEOVER_AFTER`]: a heartbeat that moves means the other run works (this one refuses to
//! start); one that stands still means its writer is gone (killed, or its pod deleted), and this
//! run takes the lock over, so rerunning a killed backup just works. Each heartbeat first reads
//! the lock back: when another run has taken it over, the run that sees it stops. A run never
//! deletes the lock (a backup needs no delete permission on the storage).

use crate::error::{Error, Result};
use crate::now_ms;
use crate::storage::Storage;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Time between two heartbeats of a running backup.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// A lock whose last heartbeat is this old (ms) belongs to a run that is gone.
pub const STALE_AFTER_MS: i64 = 30_000;

/// How long a starting run watches a live-looking lock whose heartbeat does not move before it
/// takes the lock over: two heartbeats and a second of slack.
pub const TAKEOVER_AFTER: Duration = Duration::from_secs(2 * HEARTBEAT_INTERVAL.as_secs() + 1);

/// Storage key of the run lock of `backup_id`.
pub fn lock_key(backup_id: &str) -> String {
    format!("{backup_id}/state/lock.json")
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
        self.ended_at.is_none() && now - self.heartbeat_at < STALE_AFTER_MS && !self.writer_gone()
    }

    /// True when this process can see that the writer's process no longer exists.
    fn writer_gone(&self) -> bool {
        self.host == host_name()
            && self.pid_namespace.is_some()
            && self.pid_namespace == pid_namespace()
            && !process_alive(self.pid)
    }

    /// `host <host> (pid <pid>), last heartbeat <n> s ago`, for messages.
    pub fn describe(&self, now: i64) -> String {
        format!(
            "host {} (pid {}), last heartbeat {} s ago",
            self.host,
            self.pid,
            (now - self.heartbeat_at).max(0) / 1000
        )
    }
}

/// Reads the lock of `backup_id`. `Ok(None)` when there is none, or when it cannot be parsed (a
/// damaged lock proves no live run; it is logged at debug level). Errors: storage failures.
pub fn read(storage: &dyn Storage, backup_id: &str) -> Result<Option<LockInfo>> {
    let key = lock_key(backup_id);
    if storage.head(&key)?.is_none() {
        return Ok(None);
    }
    let bytes = match storage.get_bytes(&key) {
        Ok(b) => b,
        // Gone between head and get: no lock.
        Err(Error::Storage(m)) if m.starts_with("Key not found") => return Ok(None),
        Err(e) => return Err(e),
    };
    match serde_json::from_slice(&bytes) {
        Ok(info) => Ok(Some(info)),
        Err(e) => {
            log::debug!("{key} cannot be parsed ({e}): taken as no lock");
            Ok(None)
        }
    }
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

/// Watches the live-looking lock `seen` of another run for up to [`TAKEOVER_AFTER`]. `Ok(())`
/// when its writer is gone (it ended, or its heartbeat stood still): the lock may be taken.
/// Errors: `Configuration error: backup <id> is being written by another run ...` when the
/// heartbeat moves; storage errors.
fn wait_for_other_run(storage: &dyn Storage, backup_id: &str, seen: LockInfo) -> Result<()> {
    let deadline = std::time::Instant::now() + TAKEOVER_AFTER;
    log::info!(
        "backup {backup_id} has the lock of another run ({}); watching its heartbeat for up to {} s",
        seen.describe(now_ms()),
        TAKEOVER_AFTER.as_secs()
    );
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let now = now_ms();
        match read(storage, backup_id)? {
            None => return Ok(()),
            Some(other) if !other.is_live(now) => return Ok(()),
            Some(other)
                if other.run_id != seen.run_id || other.heartbeat_at != seen.heartbeat_at =>
            {
                return Err(Error::Config(format!(
                    "backup {backup_id} is being written by another run on {}; wait for it to end or choose another backup_id",
                    other.describe(now),
                )));
            }
            Some(_) => {}
        }
    }
    log::warn!(
        "backup {backup_id}: the heartbeat of the run on {} stood still for {} s; taking its lock over",
        seen.describe(now_ms()),
        TAKEOVER_AFTER.as_secs()
    );
    Ok(())
}

/// What the heartbeat thread and the run share.
struct Shared {
    storage: Arc<dyn Storage>,
    backup_id: String,
    info: Mutex<LockInfo>,
    /// Set by [`RunLock`]'s release; the condvar wakes the heartbeat thread at once.
    stop: Mutex<bool>,
    wake: Condvar,
    /// Why the run lost its lock (another run took it over), once it did.
    lost: Mutex<Option<String>>,
    lost_flag: AtomicBool,
}

impl Shared {
    fn write(&self, info: &LockInfo) -> Result<()> {
        let json = serde_json::to_vec_pretty(info)
            .map_err(|e| Error::Serialization(format!("run lock: {e}")))?;
        self.storage.put_bytes(&lock_key(&self.backup_id), &json)
    }

    /// One heartbeat: reads the lock back (another run may have taken it over), then writes
    /// the new beat. Storage failures are logged and retried at the next beat.
    fn beat(&self) {
        let mine = self
            .info
            .lock()
            .map(|i| i.run_id.clone())
            .unwrap_or_default();
        match read(self.storage.as_ref(), &self.backup_id) {
            Ok(Some(other)) if other.run_id != mine => {
                let why = format!(
                    "another run took over backup {} ({}); this run stops",
                    self.backup_id,
                    other.describe(now_ms())
                );
                log::error!("{why}");
                if let Ok(mut lost) = self.lost.lock() {
                    *lost = Some(why);
                }
                self.lost_flag.store(true, Ordering::Relaxed);
                return;
            }
            Ok(_) => {}
            Err(e) => log::warn!("run lock of backup {}: {e}", self.backup_id),
        }
        let info = match self.info.lock() {
            Ok(mut i) => {
                i.heartbeat_at = now_ms();
                i.clone()
            }
            Err(_) => return,
        };
        if let Err(e) = self.write(&info) {
            log::warn!("run lock heartbeat of backup {}: {e}", self.backup_id);
        }
    }
}

/// The lock of a running backup; the heartbeat runs on its own thread until [`RunLock::release`]
/// (or drop), which writes `ended_at`.
pub struct RunLock {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunLock {
    /// Takes the lock of `backup_id` and starts the heartbeat.
    ///
    /// A live-looking lock of another run is watched first (see [`wait_for_other_run`], up to
    /// [`TAKEOVER_AFTER`]).
    ///
    /// Errors: `Configuration error: backup <id> is being written by another run on host ...`
    /// while another run's heartbeat moves (exit 2: wait for it, or choose another backup_id);
    /// storage errors when the lock cannot be written (the storage refuses writes).
    pub fn acquire(storage: Arc<dyn Storage>, backup_id: &str) -> Result<RunLock> {
        if let Some(other) = read(storage.as_ref(), backup_id)? {
            if other.is_live(now_ms()) {
                wait_for_other_run(storage.as_ref(), backup_id, other)?;
            }
        }
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
        let shared = Arc::new(Shared {
            storage,
            backup_id: backup_id.to_string(),
            info: Mutex::new(info.clone()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            lost: Mutex::new(None),
            lost_flag: AtomicBool::new(false),
        });
        shared.write(&info)?;
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("run-lock".into())
            .spawn(move || loop {
                let Ok(stopped) = s.stop.lock() else { return };
                let Ok((stopped, _)) = s.wake.wait_timeout(stopped, HEARTBEAT_INTERVAL) else {
                    return;
                };
                if *stopped {
                    return;
                }
                drop(stopped);
                s.beat();
                if s.lost_flag.load(Ordering::Relaxed) {
                    return;
                }
            })
            .map_err(|e| Error::Io(format!("cannot start the run-lock thread: {e}")))?;
        Ok(RunLock {
            shared,
            thread: Some(thread),
        })
    }

    /// Why this run lost its lock to another run, once it has: the run must stop.
    pub fn lost(&self) -> Option<String> {
        if !self.shared.lost_flag.load(Ordering::Relaxed) {
            return None;
        }
        self.shared.lost.lock().ok().and_then(|l| l.clone())
    }

    /// Stops the heartbeat and writes `ended_at` (unless another run holds the lock now).
    pub fn release(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        if let Ok(mut stopped) = self.shared.stop.lock() {
            *stopped = true;
        }
        self.shared.wake.notify_all();
        let _ = thread.join();
        if self.shared.lost_flag.load(Ordering::Relaxed) {
            return;
        }
        let info = match self.shared.info.lock() {
            Ok(mut i) => {
                let now = now_ms();
                i.heartbeat_at = now;
                i.ended_at = Some(now);
                i.clone()
            }
            Err(_) => return,
        };
        if let Err(e) = self.shared.write(&info) {
            log::warn!(
                "run lock of backup {}: cannot mark the run ended ({e}); it reads as running for {} s more",
                self.shared.backup_id,
                STALE_AFTER_MS / 1000
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
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStorage;

    fn info(heartbeat_at: i64, ended_at: Option<i64>) -> LockInfo {
        LockInfo {
            run_id: "h-1-0".into(),
            host: "h".into(),
            pid: 1,
            pid_namespace: None,
            started_at: 0,
            heartbeat_at,
            ended_at,
        }
    }

    #[test]
    fn liveness_follows_the_heartbeat_the_end_and_the_process() {
        assert!(info(1_000, None).is_live(1_000 + STALE_AFTER_MS - 1));
        assert!(!info(1_000, None).is_live(1_000 + STALE_AFTER_MS));
        assert!(!info(1_000, Some(1_000)).is_live(1_001));
        let here = |pid| LockInfo {
            host: host_name(),
            pid,
            pid_namespace: pid_namespace(),
            ..info(1_000, None)
        };
        assert!(here(std::process::id()).is_live(1_001), "this process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        assert!(!here(gone).is_live(1_001), "a process that exited");
        let elsewhere = LockInfo {
            host: "elsewhere".into(),
            ..here(gone)
        };
        assert!(
            elsewhere.is_live(1_001),
            "another host: only the heartbeat tells"
        );
        assert!(process_alive(std::process::id()) && !process_alive(gone));
    }

    #[test]
    fn a_lock_whose_heartbeat_stands_still_is_taken_over() {
        let storage: Arc<dyn Storage> = MemoryStorage::named(&format!("lock-test-{}", line!()));
        let frozen = info(now_ms(), None);
        storage
            .put_bytes(&lock_key("b"), &serde_json::to_vec(&frozen).unwrap())
            .unwrap();
        let t = std::time::Instant::now();
        let lock = RunLock::acquire(storage.clone(), "b").expect("taken over");
        assert!(t.elapsed() >= TAKEOVER_AFTER, "watched the heartbeat first");
        let now = read(storage.as_ref(), "b").unwrap().unwrap();
        assert_eq!(now.pid, std::process::id());
        lock.release();
    }

    #[test]
    fn a_live_lock_refuses_a_second_run_and_an_ended_one_does_not() {
        let storage: Arc<dyn Storage> = MemoryStorage::named(&format!("lock-test-{}", line!()));
        let first = RunLock::acquire(storage.clone(), "b").expect("first");
        let live = read(storage.as_ref(), "b").unwrap().expect("lock written");
        assert!(live.is_live(now_ms()) && live.ended_at.is_none());
        // The first run's heartbeat moves while the second waits: refused.
        let t = std::time::Instant::now();
        let err = RunLock::acquire(storage.clone(), "b")
            .err()
            .expect("refused");
        assert!(t.elapsed() >= HEARTBEAT_INTERVAL, "waited for a heartbeat");
        assert!(
            err.to_string().starts_with(
                "Configuration error: backup b is being written by another run on host "
            ),
            "{err}"
        );
        first.release();
        let ended = read(storage.as_ref(), "b").unwrap().unwrap();
        assert!(ended.ended_at.is_some() && !ended.is_live(now_ms()));
        RunLock::acquire(storage.clone(), "b")
            .expect("after the end")
            .release();
    }

    #[test]
    fn a_stale_or_damaged_lock_is_no_lock() {
        let storage: Arc<dyn Storage> = MemoryStorage::named(&format!("lock-test-{}", line!()));
        let stale = info(now_ms() - STALE_AFTER_MS - 1, None);
        storage
            .put_bytes(&lock_key("b"), &serde_json::to_vec(&stale).unwrap())
            .unwrap();
        RunLock::acquire(storage.clone(), "b")
            .expect("stale lock")
            .release();
        storage.put_bytes(&lock_key("c"), b"{not json").unwrap();
        assert_eq!(read(storage.as_ref(), "c").unwrap(), None);
        RunLock::acquire(storage.clone(), "c")
            .expect("damaged lock")
            .release();
    }

    #[test]
    fn a_taken_over_lock_is_noticed_and_left_alone() {
        let storage: Arc<dyn Storage> = MemoryStorage::named(&format!("lock-test-{}", line!()));
        let lock = RunLock::acquire(storage.clone(), "b").expect("lock");
        let other = LockInfo {
            run_id: "other-2-5".into(),
            ..info(now_ms(), None)
        };
        storage
            .put_bytes(&lock_key("b"), &serde_json::to_vec(&other).unwrap())
            .unwrap();
        lock.shared.beat();
        assert!(lock
            .lost()
            .unwrap()
            .contains("another run took over backup b"));
        lock.release();
        assert_eq!(
            read(storage.as_ref(), "b").unwrap(),
            Some(other),
            "not overwritten"
        );
    }
}
