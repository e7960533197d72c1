//! The run lock: liveness, takeover, conditional writes, and the heartbeat's stop.
use super::*;
use crate::repository::storage::memory::MemoryStorage;

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

/// Fast timing for tests: heartbeat 50 ms, lease 400 ms, takeover 800 ms.
const FAST: Timing = Timing {
    heartbeat: Duration::from_millis(50),
    lease: Duration::from_millis(400),
    takeover: Duration::from_millis(800),
};

fn store(tag: u32) -> Arc<dyn Storage> {
    MemoryStorage::named(&format!("lock-test-{}-{tag}", std::process::id()))
}

#[test]
fn a_lock_whose_heartbeat_stands_still_is_taken_over_once_it_is_old() {
    let storage = store(line!());
    let frozen = LockInfo {
        host: "elsewhere".into(),
        ..info(now_ms(), None)
    };
    storage
        .put_bytes(&lock_key("b"), &serde_json::to_vec(&frozen).unwrap())
        .unwrap();
    let t = std::time::Instant::now();
    let lock = RunLock::acquire_with(storage.clone(), "b", FAST).expect("taken over");
    assert!(
        t.elapsed() >= FAST.takeover - Duration::from_millis(50),
        "{:?}",
        t.elapsed()
    );
    let now = read(storage.as_ref(), "b").unwrap().unwrap();
    assert_eq!(now.pid, std::process::id());
    lock.release();
}

#[test]
fn a_live_lock_refuses_a_second_run_and_an_ended_one_does_not() {
    let storage = store(line!());
    let first = RunLock::acquire_with(storage.clone(), "b", FAST).expect("first");
    let live = read(storage.as_ref(), "b").unwrap().expect("lock written");
    assert!(live.is_live(now_ms()) && live.ended_at.is_none());
    // The first run's heartbeat moves while the second watches: refused.
    let err = RunLock::acquire_with(storage.clone(), "b", FAST)
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .starts_with("Configuration error: backup b is being written by another run on host "),
        "{err}"
    );
    assert!(first.lost().is_none(), "the second run wrote nothing");
    first.release();
    let ended = read(storage.as_ref(), "b").unwrap().unwrap();
    assert!(ended.ended_at.is_some() && !ended.is_live(now_ms()));
    RunLock::acquire_with(storage.clone(), "b", FAST)
        .expect("after the end")
        .release();
}

#[test]
fn of_two_runs_starting_at_once_one_takes_the_lock() {
    let storage = store(line!());
    let won = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (storage, won) = (storage.clone(), &won);
            s.spawn(move || {
                if let Ok(lock) = RunLock::acquire_with(storage, "race", FAST) {
                    won.fetch_add(1, Ordering::Relaxed);
                    // Hold it while the others try.
                    std::thread::sleep(FAST.takeover / 2);
                    std::mem::forget(lock);
                }
            });
        }
    });
    assert_eq!(won.load(Ordering::Relaxed), 1);
}

#[test]
fn a_stale_or_damaged_lock_is_no_lock() {
    let storage = store(line!());
    let stale = LockInfo {
        host: "elsewhere".into(),
        ..info(now_ms() - FAST.takeover.as_millis() as i64 - 1, None)
    };
    storage
        .put_bytes(&lock_key("b"), &serde_json::to_vec(&stale).unwrap())
        .unwrap();
    let t = std::time::Instant::now();
    RunLock::acquire_with(storage.clone(), "b", FAST)
        .expect("stale lock")
        .release();
    assert!(t.elapsed() < FAST.takeover, "taken at once");
    storage.put_bytes(&lock_key("c"), b"{not json").unwrap();
    assert_eq!(read(storage.as_ref(), "c").unwrap(), None);
    RunLock::acquire_with(storage.clone(), "c", FAST)
        .expect("damaged lock")
        .release();
}

#[test]
fn a_taken_over_lock_is_noticed_and_left_alone() {
    let storage = store(line!());
    let lock = RunLock::acquire_with(storage.clone(), "b", FAST).expect("lock");
    let other = LockInfo {
        run_id: "other-2-5".into(),
        ..info(now_ms(), None)
    };
    storage
        .put_bytes(&lock_key("b"), &serde_json::to_vec(&other).unwrap())
        .unwrap();
    lock.shared.renew(|i| i.heartbeat_at = now_ms());
    assert!(lock
        .lost()
        .unwrap()
        .contains("another run took over backup b"));
    assert!(lock
        .check()
        .unwrap_err()
        .to_string()
        .starts_with("Storage error: another run took over backup b"));
    lock.release();
    assert_eq!(
        read(storage.as_ref(), "b").unwrap(),
        Some(other),
        "not overwritten"
    );
}

/// A storage whose conditional replaces hang while `stalled` is set.
struct Stalling {
    inner: Arc<dyn Storage>,
    stalled: AtomicBool,
}

impl Storage for Stalling {
    fn put_file(&self, k: &str, p: &std::path::Path) -> Result<()> {
        self.inner.put_file(k, p)
    }
    fn put_bytes(&self, k: &str, d: &[u8]) -> Result<()> {
        self.inner.put_bytes(k, d)
    }
    fn get_bytes(&self, k: &str) -> Result<Vec<u8>> {
        self.inner.get_bytes(k)
    }
    fn get_to_file(&self, k: &str, p: &std::path::Path) -> Result<u64> {
        self.inner.get_to_file(k, p)
    }
    fn head(&self, k: &str) -> Result<Option<u64>> {
        self.inner.head(k)
    }
    fn list(&self, p: &str) -> Result<Vec<String>> {
        self.inner.list(p)
    }
    fn delete(&self, k: &str) -> Result<()> {
        self.inner.delete(k)
    }
    fn put_bytes_new(&self, k: &str, d: &[u8]) -> Result<Conditional> {
        self.inner.put_bytes_new(k, d)
    }
    fn put_file_new(&self, k: &str, p: &std::path::Path) -> Result<Conditional> {
        self.inner.put_file_new(k, p)
    }
    fn get_with_version(&self, k: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        self.inner.get_with_version(k)
    }
    fn put_bytes_if(&self, k: &str, d: &[u8], v: &ObjectVersion) -> Result<Conditional> {
        while self.stalled.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.inner.put_bytes_if(k, d, v)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

/// Every way a run ends (release, drop on an error path, a lost lock, a renewal stuck in the
/// storage) stops the heartbeat thread within the bounded wait; a generous deadline only
/// catches a hang (no timing is asserted).
#[test]
fn every_exit_path_stops_the_heartbeat() {
    fn ends_within(what: &str, f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{what}: the heartbeat was not stopped"));
    }
    // A heartbeat far longer than the test: a stop that waits for the next beat hangs.
    let slow = Timing {
        heartbeat: Duration::from_secs(3600),
        lease: Duration::from_secs(7200),
        takeover: Duration::from_secs(10800),
    };
    let storage = store(line!());
    let lock = RunLock::acquire_with(storage.clone(), "released", slow).expect("lock");
    ends_within("release", move || lock.release());
    let lock = RunLock::acquire_with(storage.clone(), "dropped", slow).expect("lock");
    ends_within("drop", move || {
        let failing = || -> Result<()> {
            let _held = lock;
            Err(Error::Storage("a queue failed".into()))
        };
        assert!(failing().is_err());
    });
    for id in ["released", "dropped"] {
        let l = read(storage.as_ref(), id).unwrap().unwrap();
        assert!(l.ended_at.is_some(), "{id}: ended_at written");
    }
    // A stop asked while a renewal is in flight: seen when the renewal returns.
    let stalling = Arc::new(Stalling {
        inner: store(line!()),
        stalled: AtomicBool::new(false),
    });
    let storage: Arc<dyn Storage> = stalling.clone();
    let lock = RunLock::acquire_with(storage.clone(), "b", FAST).expect("lock");
    stalling.stalled.store(true, Ordering::Relaxed);
    std::thread::sleep(FAST.heartbeat * 3);
    // The renewal hangs in the storage: release still returns, after the bounded wait.
    ends_within("stuck renewal", move || lock.release());
    stalling.stalled.store(false, Ordering::Relaxed);
    // A lost lock: the thread ended by itself; release returns at once.
    let storage = store(line!());
    let lock = RunLock::acquire_with(storage.clone(), "lost", FAST).expect("lock");
    let other = LockInfo {
        run_id: "other-2-5".into(),
        ..info(now_ms(), None)
    };
    storage
        .put_bytes(&lock_key("lost"), &serde_json::to_vec(&other).unwrap())
        .unwrap();
    while lock.lost().is_none() {
        std::thread::sleep(FAST.heartbeat);
    }
    ends_within("lost", move || lock.release());
    assert_eq!(read(storage.as_ref(), "lost").unwrap(), Some(other));
}

/// A filesystem storage in a temporary directory (it stamps objects with their mtime).
fn fs_store(
    tag: &str,
) -> (
    crate::repository::storage::conformance::TempDir,
    Arc<dyn Storage>,
) {
    let dir = crate::repository::storage::conformance::TempDir::new(tag);
    let fs = crate::repository::storage::open_filesystem(&dir.0, None).unwrap();
    (dir, fs)
}

/// Issue 31, item 5: a lock is judged by the storage's clock, whatever the reader's says. A
/// live writer is busy for a reader whose clock runs 3 (or 10) minutes ahead or behind; a lock
/// last written 10 minutes ago (by the storage's clock) may be taken whatever the reader's
/// clock and the writer's `heartbeat_at` say. Before, `LockInfo::is_busy` compared
/// `heartbeat_at` with the reader's clock: a reader 3 minutes fast took the live lock.
#[test]
fn a_lock_is_judged_by_the_storages_clock_not_the_readers() {
    let (dir, fs) = fs_store("lock-skew");
    let writer = RunLock::acquire_with(fs.clone(), "live", FAST).expect("lock");
    std::thread::sleep(FAST.heartbeat * 2);
    // A run whose host clock ran 10 minutes fast wrote this lock 10 minutes ago, then died.
    let dead = LockInfo {
        host: "elsewhere".into(),
        ..info(now_ms(), None)
    };
    fs.put_bytes(&lock_key("dead"), &serde_json::to_vec(&dead).unwrap())
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(dir.0.join(lock_key("dead")))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    let minute = 60_000;
    for skew in [-10 * minute, -3 * minute, 0, 3 * minute, 10 * minute] {
        let clock = move || now_ms() + skew;
        let judge = Judge::new(fs.as_ref(), Timing::DEFAULT, &clock);
        let busy = judge.busy(&LockName::backup("live")).unwrap();
        assert!(
            busy.is_some(),
            "reader {skew} ms off: a live writer's lock must be busy"
        );
        let age = busy.unwrap().1.expect("age");
        assert!(
            (0..5_000).contains(&age),
            "age {age} ms by the storage's clock"
        );
        assert_eq!(
            judge.busy(&LockName::backup("dead")).unwrap().map(|b| b.1),
            None,
            "reader {skew} ms off: a lock unwritten for 10 minutes may be taken"
        );
    }
    // The probe measuring the storage's clock is gone again.
    assert_eq!(
        fs.list("").unwrap(),
        [lock_key("dead"), lock_key("live")],
        "only the locks are left"
    );
    writer.release();
}

/// The storage's clock, measured with a probe, is a lower bound: an object written now is at
/// most a second and a round trip old, never older.
#[test]
fn the_storage_clock_bounds_an_age_from_below() {
    let (_dir, fs) = fs_store("lock-clock");
    let slow = || now_ms() - 3_600_000;
    let c = StorageClock::measure(fs.as_ref(), "x/state/probe", &slow)
        .unwrap()
        .expect("the filesystem stamps objects");
    assert!((3_598_000..=3_600_000).contains(&c.offset_min), "{c:?}");
    let now = slow();
    assert!(
        c.age(now_ms(), now) <= 0,
        "a write of this instant is not old"
    );
    assert!(c.age(now_ms() - 10_000, now) >= 8_000);
    assert_eq!(fs.list("").unwrap(), Vec::<String>::new(), "probe deleted");
    let mem = store(line!());
    assert_eq!(
        StorageClock::measure(mem.as_ref(), "p", &slow).unwrap(),
        None
    );
}

/// Without times (the memory backend, one process's clock), the heartbeat tells: busy until
/// the takeover age, which is longer than the lease that `is_live` uses.
#[test]
fn busy_is_stricter_than_live() {
    let storage = store(line!());
    let now = 1_000_000;
    let clock = move || now;
    let judge = Judge::new(storage.as_ref(), Timing::DEFAULT, &clock);
    let at = |id: &str, lock: LockInfo| {
        let lock = LockInfo {
            host: "elsewhere".into(),
            ..lock
        };
        storage
            .put_bytes(&lock_key(id), &serde_json::to_vec(&lock).unwrap())
            .unwrap();
        judge.busy(&LockName::backup(id)).unwrap().is_some()
    };
    let between = info(now - STALE_AFTER_MS - 1, None);
    assert!(!between.is_live(now) && at("between", between));
    assert!(!at(
        "old",
        info(now - Timing::DEFAULT.takeover.as_millis() as i64, None)
    ));
    assert!(!at("ended", info(now, Some(now))));
    assert!(!at("hostile", info(i64::MIN, None)), "no overflow");
    assert!(at("future", info(i64::MAX, None)), "no overflow");
}

#[test]
fn a_run_that_cannot_renew_its_lock_stops_before_another_may_take_it() {
    let stalling = Arc::new(Stalling {
        inner: store(line!()),
        stalled: AtomicBool::new(false),
    });
    let storage: Arc<dyn Storage> = stalling.clone();
    let lock = RunLock::acquire_with(storage.clone(), "b", FAST).expect("lock");
    std::thread::sleep(FAST.heartbeat * 3);
    assert!(lock.check().is_ok(), "renewed");
    stalling.stalled.store(true, Ordering::Relaxed);
    std::thread::sleep(FAST.lease + FAST.heartbeat * 2);
    let why = lock.check().unwrap_err().to_string();
    assert!(why.contains("was not renewed for"), "{why}");
    // Another run takes it only later, once the heartbeat is takeover-old.
    let clock = now_ms;
    let judge = Judge::new(storage.as_ref(), FAST, &clock);
    assert!(judge.busy(&LockName::backup("b")).unwrap().is_some());
    stalling.stalled.store(false, Ordering::Relaxed);
    lock.release();
}
