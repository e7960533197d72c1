//! The status `list`, `describe` and `validate` give a backup (SPEC.md "States and
//! transitions"): `running` while its writer is alive (the run lock's heartbeat), `interrupted`
//! once it is gone, `completed`; and `damaged` for a manifest that cannot be read, listed beside
//! the others.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::lock::{self, LockInfo, STALE_AFTER_MS};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `list --format json` of `store`: (exit code, the rows).
fn list(store: &Path) -> (Option<i32>, Vec<serde_json::Value>) {
    let url = format!("file://{}", store.display());
    let out = run_cli(&["list", "--path", &url, "--format", "json"]);
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", text(&out)));
    (out.status.code(), rows)
}

fn status_of(store: &Path, id: &str) -> String {
    let (code, rows) = list(store);
    assert_eq!(code, Some(0));
    rows.iter()
        .find(|r| r["backup_id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed: {rows:?}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Polls (at most 60 s) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_backup_reads_running_while_it_runs_and_interrupted_once_killed() {
    // basic.get in a debug build reads a few thousand messages a second (CI saw ~5,000): the
    // run must outlast the status checks and the second run's watch of its heartbeat (up to one
    // heartbeat, 5 s, plus its start) by a wide margin, so the queue holds ~40 s of reading.
    const N: usize = 200_000;
    let vh = TestVhost::new("status");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "slow", "classic", FieldTable::new());
    publish_bulk(&ch, "slow", N, 64);
    let dir = TempDir::new("status");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("live", &vh.name, &store, "  requeue_strategy: get\n"),
    );
    let mut child = Command::new(binary())
        .args(["backup", "--config", &cfg])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let manifest = store.join("live").join("manifest.json");
    wait_for("the first manifest", || manifest.exists());
    assert_eq!(status_of(&store, "live"), "running");
    let url = format!("file://{}", store.display());
    let out = run_cli(&["describe", "--path", &url, "--backup-id", "live"]);
    assert!(
        text(&out)
            .0
            .contains("Status:              running (being written; completed_at is null)"),
        "{:?}",
        text(&out)
    );
    // A second run of the same backup id is refused while the first lives.
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    // It watched the first run's lock (its heartbeat judged by the storage's clock), then
    // refused, with the error as its last line.
    assert!(
        stderr.contains("has the lock of another run") && stderr.contains("watching it for up to "),
        "{stderr}"
    );
    assert!(
        stderr.lines().last().unwrap_or("").starts_with(
            "Configuration error: backup live is being written by another run on host "
        ),
        "{stderr}"
    );

    // Killed: nothing marks the end, but on its own host the writer's process is gone, so it
    // reads as interrupted at once.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(status_of(&store, "live"), "interrupted");
    // Seen from another host only the heartbeat tells: running until it is stale.
    let key = store.join(lock::lock_key("live"));
    let mut info: LockInfo = serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    assert_eq!(info.ended_at, None);
    info.host = "elsewhere".into();
    info.heartbeat_at = rmq_backup::now_ms();
    std::fs::write(&key, serde_json::to_vec(&info).unwrap()).unwrap();
    assert_eq!(status_of(&store, "live"), "running");
    info.heartbeat_at -= STALE_AFTER_MS;
    std::fs::write(&key, serde_json::to_vec(&info).unwrap()).unwrap();
    assert_eq!(status_of(&store, "live"), "interrupted");
    let out = run_cli(&["validate", "--path", &url, "--backup-id", "live"]);
    assert!(
        text(&out)
            .0
            .contains("Note: the backup is interrupted (completed_at is null)."),
        "{:?}",
        text(&out)
    );
    // The broker took back what the killed run held.
    wait_for("the killed run's messages back", || {
        ch.queue_declare_passive("slow").unwrap().message_count as usize == N
    });

    // The rest is about the lock, not the reading: a short queue keeps the complete run short.
    ch.queue_purge("slow").unwrap();
    publish_bulk(&ch, "slow", 1_000, 64);

    // A lock from another host whose heartbeat looks fresh but stands still is watched until
    // it is takeover-old (180 s by default; 4 s here), then taken over: a rerun after a lost
    // pod just works.
    info.heartbeat_at = rmq_backup::now_ms();
    std::fs::write(&key, serde_json::to_vec(&info).unwrap()).unwrap();
    // A run that ends (here: completes) marks its lock ended: completed at once, and the
    // lock says so.
    let t = Instant::now();
    let out = run_cli_env(
        &["-v", "backup", "--config", &cfg],
        &[("RMQ_BACKUP_LOCK_TIMING", "200,2000,4000")],
    );
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "watched the frozen heartbeat"
    );
    assert!(
        text(&out)
            .1
            .contains("is gone or stopped renewing its lock; taking the lock over"),
        "{:?}",
        text(&out)
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(status_of(&store, "live"), "completed");
    let info: LockInfo = serde_json::from_slice(&std::fs::read(&key).unwrap()).unwrap();
    assert!(info.ended_at.is_some());
}

#[test]
fn a_failed_run_reads_interrupted_at_once() {
    let vh = TestVhost::new("status-failed");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &diverse_messages(5, 1, false));
    let dir = TempDir::new("status-failed");
    let store = dir.path().join("store");
    std::fs::create_dir_all(store.join("f")).unwrap();
    std::fs::write(store.join("f").join("queues"), b"in the way").unwrap();
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("f", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert_eq!(status_of(&store, "f"), "interrupted");
}

#[test]
fn list_shows_a_damaged_manifest_beside_the_others_and_exits_3() {
    let vh = TestVhost::new("damaged-list");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &diverse_messages(7, 1, false));
    let dir = TempDir::new("damaged-list");
    let store = dir.path().join("store");
    for id in ["good", "bad"] {
        let cfg = write_config(
            dir.path(),
            &format!("{id}.yaml"),
            &backup_yaml(id, &vh.name, &store, ""),
        );
        assert_eq!(
            run_cli(&["backup", "--config", &cfg]).status.code(),
            Some(0)
        );
    }
    std::fs::write(
        store.join("bad").join("manifest.json"),
        b"{\"backup_id\": tru",
    )
    .unwrap();

    let (code, rows) = list(&store);
    assert_eq!(code, Some(3), "{rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["backup_id"], "good");
    assert_eq!(rows[0]["status"], "completed");
    assert_eq!(rows[0]["total_messages"], 7);
    assert!(rows[0]["error"].is_null());
    assert_eq!(rows[1]["backup_id"], "bad");
    assert_eq!(rows[1]["status"], "damaged");
    assert!(rows[1]["created_at"].is_null());
    let error = rows[1]["error"].as_str().unwrap();
    assert!(error.starts_with("Manifest error: "), "{error}");

    let url = format!("file://{}", store.display());
    let out = run_cli(&["list", "--path", &url]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(3));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[1].starts_with("good ") && lines[1].contains(" completed "),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("bad ") && lines[2].contains(" damaged "),
        "{stdout}"
    );
    assert!(
        lines[3].starts_with("bad: manifest damaged: Manifest error: "),
        "{stdout}"
    );
}
