//! Two runs on one backup id (issue "Defects found by test and review", item 5): the first
//! run's storage stalls (its heartbeat and every write hang), a second run takes the backup
//! over once the first's lock is old, and completes it; when the first run's writes finally go
//! through, every one of them is refused. Exactly one run completes, and nothing it listed is
//! missing or altered. In a binary of its own: it sets the lock's timing for the process.

mod common;

use common::hooked_storage::{Access, Hooked};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::repository::storage::{self, Storage};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set once run B has completed: run A's held writes go through.
static RELEASED: AtomicBool = AtomicBool::new(false);
/// Set when run A's write of its definitions export is held.
static DEFINITIONS_HELD: AtomicBool = AtomicBool::new(false);

#[test]
fn of_two_runs_on_one_backup_exactly_one_completes_and_nothing_it_wrote_is_touched() {
    // Heartbeat 100 ms, lease 1 s, takeover 2 s.
    std::env::set_var("RMQ_BACKUP_LOCK_TIMING", "100,1000,2000");
    let vh = TestVhost::new("lock-race");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in ["q1", "q2", "q3"] {
        declare(&ch, q, "classic", FieldTable::new());
        publish_bulk(&ch, q, 2_000, 200);
    }
    let dir = TempDir::new("lock-race");
    let store = dir.path().join("store");
    let id = "contested";
    let cfg = Config::from_yaml_str(&backup_yaml(
        id,
        &vh.name,
        &store,
        "  max_concurrent_queues: 1\n  segment_max_bytes: 65536\n",
    ))
    .unwrap();
    let fs = storage::open_filesystem(&store, None).unwrap();
    // Writes and deletes hang while `stalled` is set (reads go through): a storage that stops
    // answering writes, as with a network partition or throttling with long retries. A's write
    // of its definitions export (right after its first manifest) hangs from the start, so it is
    // always among the writes that go through once B has completed the backup.
    let stalled = Arc::new(AtomicBool::new(false));
    let gate = stalled.clone();
    let a_storage = Hooked::new(fs.clone(), move |access, key| {
        if access != Access::Read && key.contains("/definitions/") {
            DEFINITIONS_HELD.store(true, Ordering::Relaxed);
        }
        while access != Access::Read
            && (gate.load(Ordering::Relaxed) || key.contains("/definitions/"))
            && !RELEASED.load(Ordering::Relaxed)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    });
    let manifest_path = store.join(id).join("manifest.json");

    let (a, b) = std::thread::scope(|s| {
        let a_store: Arc<dyn Storage> = a_storage.clone();
        let cfg_a = cfg.clone();
        let a = s.spawn(move || rmq_backup::backup::run(&cfg_a, a_store));
        // A writes its first manifest, then its storage stops answering writes.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !manifest_path.exists() || !DEFINITIONS_HELD.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "run A never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The broker's definitions change between A's export and B's (an exchange more), so
        // A's export, written late over B's, would no longer be what B's manifest describes.
        let ch = conn.open_channel().unwrap();
        ch.exchange_declare(
            "between-the-runs",
            "fanout",
            true,
            false,
            &FieldTable::new(),
        )
        .unwrap();
        let _ = ch.close();
        stalled.store(true, Ordering::Relaxed);
        // B, on the same storage, answering: it waits until A's lock may be taken over.
        let b = rmq_backup::backup::run(&cfg, fs.clone());
        let b_manifest = std::fs::read(&manifest_path).expect("B's manifest");
        // Now A's writes go through: each must be refused.
        RELEASED.store(true, Ordering::Relaxed);
        stalled.store(false, Ordering::Relaxed);
        let a = a.join().expect("run A");
        assert!(
            std::fs::read(&manifest_path).expect("manifest") == b_manifest,
            "run A changed B's manifest after B completed"
        );
        (a, b)
    });
    let b = b.expect("run B completes the backup");
    assert_eq!(b.messages, 6_000);
    let e = a.expect_err("run A lost the backup").to_string();
    assert!(
        e.starts_with("Storage error: ")
            && (e.contains("was not renewed") || e.contains("another run")),
        "{e}"
    );
    let m = manifest(&store, id);
    assert!(m.completed_at.is_some());
    let url = format!("file://{}", store.display());
    let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    for q in ["q1", "q2", "q3"] {
        assert_eq!(
            seqs(&backed_up(&store, id, q)),
            (0..2_000).collect::<Vec<_>>(),
            "{q}"
        );
        assert_eq!(depth(&conn, q), 2_000, "{q} whole");
    }
}
