//! `forget` on the memory storage with manifests written here (the integration tests in
//! tests/forget.rs use backups made by the tool against the broker).

use super::*;
use crate::repository::storage::memory::MemoryStorage;
use std::sync::Arc;

const DAY: i64 = 86_400_000;

fn store(tag: u32) -> Arc<dyn Storage> {
    let s = MemoryStorage::named(&format!("retention-{}-{tag}", std::process::id()));
    s.clear();
    s
}

/// A backup `id` created at `created` with one segment; completed or not.
fn backup(s: &dyn Storage, id: &str, created: i64, completed: bool) {
    let mut m = Manifest::new(id, created);
    m.completed_at = completed.then_some(created + 1000);
    let seg = format!("{id}/queues/_default/q/segment-0001.zst");
    m.queues.push(crate::repository::manifest::QueueBackup {
        vhost: "/".into(),
        name: "q".into(),
        queue_type: crate::broker::QueueType::Classic,
        segments: vec![crate::repository::manifest::SegmentMetadata {
            checksum: "0".repeat(64),
            ..crate::repository::manifest::SegmentMetadata::example(seg.clone(), 1, 1)
        }],
        message_count: 1,
        first_message_timestamp: None,
        last_message_timestamp: None,
        messages_unacknowledged_at_start: None,
        messages_left_out: None,
        delivery_counts_raised: None,
        consumer_offsets: Default::default(),
    });
    s.put_bytes(&seg, b"x").unwrap();
    s.put_bytes(&manifest_key(id), m.to_json_pretty().unwrap().as_bytes())
        .unwrap();
}

fn opts(policy: Policy) -> Options {
    Options {
        policy,
        dry_run: false,
        prune_interrupted: false,
        prune: false,
        prune_grace: DEFAULT_PRUNE_GRACE,
    }
}

fn last(n: u32) -> Policy {
    Policy {
        keep_last: Some(Count::N(n)),
        ..Policy::default()
    }
}

fn actions(r: &ForgetReport) -> Vec<(String, bool)> {
    r.backups
        .iter()
        .map(|b| (b.backup_id.clone(), b.remove))
        .collect()
}

#[test]
fn an_empty_policy_is_a_configuration_error() {
    let s = store(line!());
    let e = forget(&s, &opts(Policy::default())).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("Configuration error: forget needs"),
        "{e}"
    );
    assert!(RetentionConfig::default().options().is_err());
}

#[test]
fn removed_backups_are_deleted_whole_and_a_dry_run_deletes_nothing() {
    let s = store(line!());
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        backup(s.as_ref(), id, i as i64 * DAY, true);
    }
    s.put_bytes("a/state/offsets.db", b"db").unwrap();
    let mut o = opts(last(1));
    o.dry_run = true;
    let r = forget(&s, &o).unwrap();
    assert_eq!(
        actions(&r),
        [("a".into(), true), ("b".into(), true), ("c".into(), false)]
    );
    assert_eq!(s.list_backup_ids().unwrap(), ["a", "b", "c"]);
    let r = forget(&s, &opts(last(1))).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    // Manifest, segment, offsets.db and the run lock forget held while deleting.
    assert_eq!(r.backups[0].deleted_objects, Some(4));
    assert_eq!(
        s.list("").unwrap(),
        ["c/manifest.json", "c/queues/_default/q/segment-0001.zst"]
    );
    assert_eq!(r.summary(), "1 backup(s) kept, 2 removed");
}

#[test]
fn interrupted_backups_are_kept_unless_older_and_asked() {
    let s = store(line!());
    backup(s.as_ref(), "old-int", 0, false);
    backup(s.as_ref(), "done", DAY, true);
    backup(s.as_ref(), "new-int", 2 * DAY, false);
    let r = forget(&s, &opts(last(5))).unwrap();
    assert!(r.backups.iter().all(|b| !b.remove));
    assert!(
        r.backups[2].reasons[0].contains("--prune-interrupted"),
        "{:?}",
        r.backups
    );
    let mut o = opts(last(5));
    o.prune_interrupted = true;
    let r = forget(&s, &o).unwrap();
    assert_eq!(
        actions(&r),
        [
            ("done".into(), false),
            ("new-int".into(), false),
            ("old-int".into(), true)
        ]
    );
    assert_eq!(s.list_backup_ids().unwrap(), ["done", "new-int"]);
}

#[test]
fn a_busy_lock_keeps_a_backup_and_its_prefix() {
    let s = store(line!());
    backup(s.as_ref(), "a", 0, true);
    backup(s.as_ref(), "b", DAY, true);
    let lock = crate::repository::lock::RunLock::acquire(s.clone(), "a").unwrap();
    let mut o = opts(last(1));
    o.prune = true;
    o.prune_grace = Within::parse("0h").unwrap();
    let r = forget(&s, &o).unwrap();
    assert_eq!(r.backups[0].status, "running");
    assert!(!r.backups[0].remove && r.backups[0].reasons[0].starts_with("running: locked by host"));
    assert!(s.head(&manifest_key("a")).unwrap().is_some());
    lock.release();
    let r = forget(&s, &opts(last(1))).unwrap();
    assert_eq!(actions(&r), [("a".into(), true), ("b".into(), false)]);
}

#[test]
fn a_sharded_backup_loses_a_part_before_its_manifest() {
    let s = store(line!());
    backup(s.as_ref(), "new", 5 * DAY, true);
    // Two complete parts and their merged manifest.
    for i in 0..2u32 {
        let mut m = Manifest::new("sh", DAY);
        m.completed_at = Some(DAY + 5);
        m.shard = Some(crate::repository::manifest::Shard { index: i, count: 2 });
        s.put_bytes(
            &format!("sh/parts/{i}-of-2.json"),
            m.to_json_pretty().unwrap().as_bytes(),
        )
        .unwrap();
    }
    let merged = Manifest::read(s.as_ref(), "sh").unwrap();
    assert_eq!(
        (merged.parts, merged.completed_at.is_some()),
        (Some(2), true)
    );
    assert!(
        s.head("sh/manifest.json").unwrap().is_none(),
        "a reader merges in memory, writes nothing"
    );
    // The merge the last part's backup stores.
    s.put_bytes(
        "sh/manifest.json",
        merged.to_json_pretty().unwrap().as_bytes(),
    )
    .unwrap();
    let parts = Some(2);
    // The first delete alone leaves no complete backup to read.
    s.delete(&s.list("sh/parts/").unwrap()[0]).unwrap();
    s.delete("sh/manifest.json").unwrap();
    assert!(Manifest::read(s.as_ref(), "sh")
        .unwrap()
        .completed_at
        .is_none());
    assert!(
        s.head("sh/manifest.json").unwrap().is_none(),
        "not merged back"
    );
    delete_backup(s.as_ref(), "sh", parts, &[]).unwrap();
    assert_eq!(s.list_backup_ids().unwrap(), ["new"]);
}

#[test]
fn prune_takes_old_orphans_only() {
    let s = store(line!());
    backup(s.as_ref(), "a", 0, true);
    s.put_bytes("a/queues/_default/q/segment-0002.zst", b"orphan")
        .unwrap();
    s.put_bytes("gone/queues/_default/q/segment-0001.zst", b"orphan")
        .unwrap();
    s.put_bytes("notours/file", b"x").unwrap();
    let mut o = opts(last(1));
    o.prune = true;
    // The memory storage reports no times: nothing is old enough.
    let r = forget(&s, &o).unwrap();
    let keys: Vec<&str> = r.orphans.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "a/queues/_default/q/segment-0002.zst",
            "gone/queues/_default/q/segment-0001.zst"
        ]
    );
    assert!(r
        .orphans
        .iter()
        .all(|o| !o.remove && o.reason.starts_with("age unknown")));
    assert!(s
        .head("gone/queues/_default/q/segment-0001.zst")
        .unwrap()
        .is_some());
    // On the filesystem, with times: a grace of 0h takes them, and nothing else.
    let dir = crate::repository::storage::conformance::TempDir::new("prune");
    let fs = crate::repository::storage::open_filesystem(&dir.0, None).unwrap();
    backup(fs.as_ref(), "a", 0, true);
    fs.put_bytes("a/queues/_default/q/segment-0002.zst", b"orphan")
        .unwrap();
    fs.put_bytes("a/definitions/rollback-before-import-1.zst", b"keep")
        .unwrap();
    fs.put_bytes("gone/queues/_default/q/segment-0001.zst", b"orphan")
        .unwrap();
    fs.put_bytes("notours/file", b"x").unwrap();
    let mut young = o;
    young.dry_run = false;
    let r = forget(&fs, &young).unwrap();
    assert!(
        r.orphans
            .iter()
            .all(|o| !o.remove && o.reason == "younger than 24h"),
        "{:?}",
        r.orphans
    );
    o.prune_grace = Within::parse("0h").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let r = forget(&fs, &o).unwrap();
    assert_eq!(
        r.orphans.iter().filter(|o| o.remove).count(),
        2,
        "{:?}",
        r.orphans
    );
    assert_eq!(
        fs.list("").unwrap(),
        [
            "a/definitions/rollback-before-import-1.zst",
            "a/manifest.json",
            "a/queues/_default/q/segment-0001.zst",
            "notours/file"
        ]
    );
}

#[test]
fn the_report_renders_as_text_and_json() {
    let s = store(line!());
    backup(s.as_ref(), "a", 0, true);
    backup(s.as_ref(), "b", DAY, true);
    let mut o = opts(last(1));
    o.dry_run = true;
    let r = forget(&s, &o).unwrap();
    let text = r.render(false).unwrap();
    assert!(
        text.contains("(dry run: nothing deleted)") && text.contains("not kept by keep-last 1"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&r.render(true).unwrap()).unwrap();
    assert_eq!(v["backups"][0]["action"], "remove");
    assert_eq!(v["backups"][1]["reasons"][0], "last");
    assert_eq!(v["dry_run"], true);
}

#[test]
fn prune_leaves_the_prefix_of_a_run_that_holds_its_lock() {
    let dir = crate::repository::storage::conformance::TempDir::new("prune-busy");
    let fs = crate::repository::storage::open_filesystem(&dir.0, None).unwrap();
    backup(fs.as_ref(), "done", 0, true);
    // A run that has taken its lock and stored a segment, before its first manifest.
    let lock = crate::repository::lock::RunLock::acquire(fs.clone(), "starting").unwrap();
    fs.put_bytes("starting/queues/_default/q/segment-0001.zst", b"fresh")
        .unwrap();
    let mut o = opts(last(1));
    o.prune = true;
    o.prune_grace = Within::parse("0h").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let r = forget(&fs, &o).unwrap();
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert_eq!(fs.list("starting/").unwrap().len(), 2);
    lock.release();
    // Once its run has ended (and left no manifest), the prefix is orphaned.
    let r = forget(&fs, &o).unwrap();
    assert_eq!(r.orphans.len(), 2, "{:?}", r.orphans);
    assert!(fs.list("starting/").unwrap().is_empty());
}

#[test]
fn only_objects_of_a_backups_shape_are_pruned() {
    use prune::Shape;
    for (rest, shape) in [
        ("manifest.json", Shape::Manifest),
        ("queues/_default/q/segment-0001.zst", Shape::Segment),
        ("queues/v/q/segment-12345", Shape::Segment),
        ("queues/v/q/segment-0001.lz4.age", Shape::Segment),
        ("definitions/definitions.json.zst.age", Shape::Definitions),
        ("definitions/definitions.json", Shape::Definitions),
        ("definitions/rollback-before-import-17.zst", Shape::Rollback),
        ("parts/0-of-3.json", Shape::Part),
        ("state/lock.json", Shape::Lock),
        ("state/lock-part-1-of-3.json", Shape::Lock),
        ("state/offsets.db", Shape::Other),
        ("state/lock-part-x-of-3.json", Shape::Other),
        ("queues/v/q/offsets.db", Shape::Other),
        ("queues/v/segment-0001.zst", Shape::Other),
        ("queues/v/q/segment-.zst", Shape::Other),
        ("queues/v/q/r/segment-0001.zst", Shape::Other),
        ("parts/x.json", Shape::Other),
        ("definitions/other.json", Shape::Other),
        ("notes.txt", Shape::Other),
    ] {
        assert_eq!(Shape::of(rest), shape, "{rest}");
    }
    let keys = ["nightly/state/offsets.db".to_string()];
    assert!(prune::protects(&keys, "nightly/state/offsets.db"));
    assert!(prune::protects(&keys, "nightly/state/offsets.db-wal"));
    assert!(prune::protects(
        &keys,
        "nightly/state/offsets.db.partial-1-2"
    ));
    assert!(!prune::protects(&keys, "nightly/state/offsets.dbx"));
    assert!(!prune::protects(&keys, "nightly/state/lock.json"));
}

/// Issue 31, item 4: a checkpoint database is never an orphan (README's
/// `nightly/state/offsets.db`, under a prefix with no manifest, nor SPEC.md's
/// `{backup_id}/state/offsets.db` of a half-deleted backup), and a configured one is not
/// deleted with the backup it lies in.
#[test]
fn checkpoint_databases_are_never_pruned() {
    let dir = crate::repository::storage::conformance::TempDir::new("prune-ckpt");
    let fs = crate::repository::storage::open_filesystem(&dir.0, None).unwrap();
    backup(fs.as_ref(), "new", 2 * DAY, true);
    backup(fs.as_ref(), "old", DAY, true);
    fs.put_bytes("nightly/state/offsets.db", b"SQLite").unwrap();
    fs.put_bytes("old/state/offsets.db", b"SQLite").unwrap();
    // Half deleted: its manifest is gone, its segment and checkpoint are left.
    backup(fs.as_ref(), "gone", 0, true);
    fs.delete("gone/manifest.json").unwrap();
    fs.put_bytes("gone/state/offsets.db", b"SQLite").unwrap();
    let mut o = opts(last(1));
    o.prune = true;
    o.prune_grace = Within::parse("0h").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let protected = ["old/state/offsets.db".to_string()];
    let r = forget_keeping(&fs, &o, &protected).unwrap();
    assert_eq!(actions(&r), [("new".into(), false), ("old".into(), true)]);
    let orphans: Vec<&str> = r.orphans.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(orphans, ["gone/queues/_default/q/segment-0001.zst"]);
    assert_eq!(
        fs.list("").unwrap(),
        [
            "gone/state/offsets.db",
            "new/manifest.json",
            "new/queues/_default/q/segment-0001.zst",
            "nightly/state/offsets.db",
            "old/state/offsets.db",
        ]
    );
}

/// A storage that starts another run of the backup (takes its run lock, as `backup` does)
/// just before a run lock is deleted, and gives it until the delete to get the lock.
struct RunStartsAtLockDelete {
    inner: Arc<dyn Storage>,
    started: std::sync::Mutex<Option<std::thread::JoinHandle<crate::repository::lock::RunLock>>>,
}

/// The other run's timing: heartbeat 50 ms, lease 400 ms, takeover 800 ms.
const OTHER_RUN: crate::repository::lock::Timing = crate::repository::lock::Timing {
    heartbeat: std::time::Duration::from_millis(50),
    lease: std::time::Duration::from_millis(400),
    takeover: std::time::Duration::from_millis(800),
};

impl Storage for RunStartsAtLockDelete {
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
        let mut started = self.started.lock().unwrap();
        if k.ends_with("/state/lock.json") && started.is_none() {
            let (storage, id) = (self.inner.clone(), k.split('/').next().unwrap().to_string());
            let (tx, rx) = std::sync::mpsc::channel();
            *started = Some(std::thread::spawn(move || {
                let lock = crate::repository::lock::RunLock::acquire_with(storage, &id, OTHER_RUN)
                    .expect("the other run takes the lock");
                let _ = tx.send(());
                lock
            }));
            // The other run gets the lock at once, or waits for it: either way the delete
            // goes on after this.
            let _ = rx.recv_timeout(std::time::Duration::from_millis(500));
        }
        drop(started);
        self.inner.delete(k)
    }
    fn put_bytes_new(&self, k: &str, d: &[u8]) -> Result<crate::repository::storage::Conditional> {
        self.inner.put_bytes_new(k, d)
    }
    fn put_file_new(
        &self,
        k: &str,
        p: &std::path::Path,
    ) -> Result<crate::repository::storage::Conditional> {
        self.inner.put_file_new(k, p)
    }
    fn get_with_version(
        &self,
        k: &str,
    ) -> Result<Option<(Vec<u8>, crate::repository::storage::ObjectVersion)>> {
        self.inner.get_with_version(k)
    }
    fn put_bytes_if(
        &self,
        k: &str,
        d: &[u8],
        v: &crate::repository::storage::ObjectVersion,
    ) -> Result<crate::repository::storage::Conditional> {
        self.inner.put_bytes_if(k, d, v)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

/// Issue 31, item 5: a run that starts on a backup while `forget` deletes it keeps its lock
/// (before, forget released the lock, the run took it, and forget deleted it under the run).
#[test]
fn a_run_starting_while_forget_deletes_its_backup_keeps_its_lock() {
    let inner = store(line!());
    backup(inner.as_ref(), "a", 0, true);
    backup(inner.as_ref(), "b", DAY, true);
    let hooked = Arc::new(RunStartsAtLockDelete {
        inner: inner.clone(),
        started: std::sync::Mutex::new(None),
    });
    let s: Arc<dyn Storage> = hooked.clone();
    let r = forget(&s, &opts(last(1))).unwrap();
    assert_eq!(actions(&r), [("a".into(), true), ("b".into(), false)]);
    let other = hooked
        .started
        .lock()
        .unwrap()
        .take()
        .expect("a run started during the delete")
        .join()
        .expect("the other run got the lock");
    std::thread::sleep(OTHER_RUN.heartbeat * 4);
    assert_eq!(other.lost(), None, "the other run still holds its lock");
    let stored = crate::repository::lock::read(inner.as_ref(), "a").unwrap();
    assert_eq!(
        stored.map(|l| l.run_id),
        Some(other.run_id().to_string()),
        "its lock is stored"
    );
    other.release();
}
