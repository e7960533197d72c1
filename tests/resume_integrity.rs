//! What a rerun may trust (issue "Defects found by test and review", items 3 and 6): a
//! checkpoint database that lists segments 1, 2, 3 and 5 of a stream without 4 (its uploads
//! finished out of order when the run was killed) resumes after segment 3, never after 5; a
//! database left by an older backup with the same id, whose manifest is gone, is not this
//! backup's; new segments always number after the highest stored. `validate` reports holes.

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Kills the child when dropped: a failing test leaves no backup running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Segment sequences of `queue` the checkpoint database lists.
fn recorded(db: &Path, queue: &str) -> Vec<i64> {
    let conn = rusqlite::Connection::open(db).expect("open the database");
    let mut stmt = conn
        .prepare("SELECT sequence FROM backup_segments WHERE queue = ?1 ORDER BY sequence")
        .expect("query");
    let rows = stmt
        .query_map([queue], |r| r.get::<_, i64>(0))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    rows
}

#[test]
fn a_stream_resumes_after_the_unbroken_prefix_of_its_recorded_segments() {
    let v = TestVhost::new("resume-hole");
    let conn = v.connect();
    let ch = conn.open_channel().expect("channel");
    let args: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"stream".to_vec()),
    )];
    ch.queue_declare("events", true, false, false, &args)
        .expect("declare");
    publish_bulk(&ch, "events", 3_000, 200);
    ch.close().expect("close");

    let dir = TempDir::new("resume-hole");
    let db = dir.path().join("offsets.db");
    let id = "follow";
    let extra = format!(
        "  stream_enabled: true\n  stop_at_current_depth: false\n  segment_max_bytes: 32768\noffset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n",
        db.display()
    );
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &v.name, dir.path(), &extra),
    );
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    let mut child = KillOnDrop(child);
    wait_line(&lines, "continuously from offset 0 until stopped");
    let deadline = Instant::now() + Duration::from_secs(60);
    while recorded(&db, "events").len() < 6 {
        assert!(Instant::now() < deadline, "six segments never recorded");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.0.kill().expect("kill");
    assert_eq!(child.0.wait().unwrap().signal(), Some(9));
    // Uploads finished out of order: segment 4 stored (or not) but not recorded, 5 recorded.
    let db_conn = rusqlite::Connection::open(&db).unwrap();
    db_conn
        .execute("DELETE FROM backup_segments WHERE sequence = 4", [])
        .unwrap();
    drop(db_conn);
    assert_eq!(recorded(&db, "events")[..4], [1, 2, 3, 5]);

    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    let mut child = KillOnDrop(child);
    let resumed = wait_line(&lines, "reading resumes at offset");
    // Let it catch up with the stream's end, then end it normally.
    std::thread::sleep(Duration::from_secs(3));
    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM ends it normally: {resumed}"
    );
    drop(lines);

    let got = backed_up(dir.path(), id, "events");
    assert_eq!(
        seqs(&got),
        (0..3_000).collect::<Vec<_>>(),
        "every message once, in order"
    );
    let out = run_cli(&[
        "validate",
        "--path",
        &dir.url(),
        "--backup-id",
        id,
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}

/// A filesystem backup `id` of `queue` in `vhost` with `offset_storage` at `db`.
fn run_backup(dir: &Path, store: &Path, db: &Path, id: &str, vhost: &str) -> (String, String) {
    let extra = format!(
        "offset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n",
        db.display()
    );
    let cfg = write_config(dir, "b.yaml", &backup_yaml(id, vhost, store, &extra));
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    (stdout, stderr)
}

#[test]
fn a_new_backup_with_an_old_id_trusts_no_stale_checkpoint_and_overwrites_no_segment() {
    let v = TestVhost::new("stale-cp");
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish_bulk(&ch, "orders", 100, 64);
    let dir = TempDir::new("stale-cp");
    let store = dir.path().join("store");
    let db = dir.path().join("offsets.db");
    let id = "nightly";
    run_backup(dir.path(), &store, &db, id, &v.name);
    let seg_dir = store.join(id).join("queues").join(&v.name).join("orders");
    let first = seg_dir.join("segment-0001.zst");
    let old_bytes = std::fs::read(&first).expect("segment 1 of the first backup");

    // A retention job removes the manifest first (the segments would go next), and the
    // queue changes; the next night's backup reuses the id.
    std::fs::remove_file(store.join(id).join("manifest.json")).unwrap();
    publish_bulk(&ch, "orders", 50, 64);
    let (_, stderr) = run_backup(dir.path(), &store, &db, id, &v.name);
    assert!(
        !stderr.contains("completed by an earlier run"),
        "the old backup's checkpoint was trusted: {stderr}"
    );
    let m = manifest(&store, id);
    let q = &m.queues[0];
    assert_eq!(q.message_count, 150, "the queue as it is now");
    let keys: Vec<&str> = q.segments.iter().map(|s| s.key.as_str()).collect();
    assert!(
        keys.iter().all(|k| !k.ends_with("segment-0001.zst")),
        "new segments number after the highest stored: {keys:?}"
    );
    // Segment 1 of the old backup was never overwritten: it is gone (unlisted, removed once
    // the new backup completed) or still the old bytes.
    if let Ok(now) = std::fs::read(&first) {
        assert!(now == old_bytes, "segment-0001 was overwritten");
    }
    let got = backed_up(&store, id, "orders");
    assert_eq!(got.len(), 150);
    let out = run_cli(&[
        "validate",
        "--path",
        &format!("file://{}", store.display()),
        "--backup-id",
        id,
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}
