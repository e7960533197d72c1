//! Resumable backups and restores (issue "Resumable backups and restores"; SPEC.md
//! "offset_storage", "States and transitions"): a run killed with SIGKILL is finished by
//! running the same command again, and SIGTERM stops a run gracefully.

mod common;

use common::*;
use rmq_backup::broker::amqp::{Connection, FieldTable, FieldValue};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BODY: usize = 100;
/// Polls (at most 60 s) until `queue` holds `n` ready messages again.
fn wait_depth(conn: &Connection, queue: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = depth(conn, queue);
        if d == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue {queue}: {d} ready, {n} expected"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bodies `publish_bulk(_, _, n, BODY)` published, in order.
fn bulk_bodies(n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(n as u64);
    (0..n)
        .map(|i| {
            let mut body = rng.bytes(BODY);
            body[..8].copy_from_slice(&(i as u64).to_be_bytes());
            body
        })
        .collect()
}

/// Asserts that `queue` holds exactly the `n` messages `publish_bulk` wrote, in order, each
/// once (its `seq` header and body).
fn assert_bulk(conn: &Connection, queue: &str, n: usize, what: &str) {
    assert_eq!(depth(conn, queue) as usize, n, "{what}: depth of {queue}");
    let got = peek(conn, queue, n);
    for (i, (d, body)) in got.iter().zip(bulk_bodies(n)).enumerate() {
        let seq = d
            .properties
            .headers
            .as_ref()
            .and_then(|h| h.iter().find(|(k, _)| k == "seq"))
            .map(|(_, v)| v.clone());
        assert_eq!(
            seq,
            Some(FieldValue::I64(i as i64)),
            "{what}: {queue} message {i}"
        );
        assert!(d.body == body, "{what}: {queue} body of message {i}");
    }
}

fn manifest_json(store: &Path, id: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(store.join(id).join("manifest.json")).unwrap()).unwrap()
}

/// Segment files of `queue` in the filesystem store.
fn segment_files(store: &Path, id: &str, vhost: &str, queue: &str) -> Vec<String> {
    let dir = store.join(id).join("queues").join(vhost).join(queue);
    // A SIGKILL during a write leaves its `<name>.partial-<pid>-<n>` file, which the storage
    // never lists or reads (src/repository/storage/filesystem.rs); only finished files are segments.
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.contains(".partial-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

const QUEUES: [(&str, &str, usize); 3] = [
    ("a-classic", "classic", 40_000),
    ("b-quorum", "quorum", 30_000),
    ("c-classic", "classic", 30_000),
];

fn seed(vh: &TestVhost) -> Connection {
    let conn = vh.connect();
    for (name, kind, n) in QUEUES {
        let ch = conn.open_channel().unwrap();
        declare(&ch, name, kind, FieldTable::new());
        publish_bulk(&ch, name, n, BODY);
        let _ = ch.close();
    }
    conn
}

#[test]
fn a_backup_killed_with_sigkill_is_finished_by_running_it_again() {
    let vh = TestVhost::new("resume-kill");
    let conn = seed(&vh);
    let dir = TempDir::new("resume-kill");
    let store = dir.path().join("store");
    let id = "nightly";
    let db = dir.path().join("offsets.db");
    let extra = format!(
        "  max_concurrent_queues: 1\n  segment_max_bytes: 262144\noffset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n  s3_key: {id}/state/offsets.db\n",
        db.display()
    );
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, &extra),
    );
    let (mut child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(
        &lines,
        &format!("queue a-classic in vhost {}: 40000 messages in", vh.name),
    );
    wait_line(
        &lines,
        &format!("queue b-quorum in vhost {}: backing up", vh.name),
    );
    // Some of b-quorum's segments are stored, not all.
    let b_dir = store
        .join(id)
        .join("queues")
        .join(&vh.name)
        .join("b-quorum");
    let deadline = Instant::now() + Duration::from_secs(60);
    while segment_files(&store, id, &vh.name, "b-quorum").len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no segment of b-quorum in {b_dir:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "killed mid-run, not finished");
    let killed_run_segments = segment_files(&store, id, &vh.name, "b-quorum");
    assert_eq!(
        manifest_json(&store, id)["completed_at"],
        serde_json::Value::Null
    );
    // The broker takes back what the killed run held.
    for (name, _, n) in QUEUES {
        wait_depth(&conn, name, n as u32);
    }

    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let a_segments = segment_files(&store, id, &vh.name, "a-classic").len();
    assert!(
        stderr.contains(&format!(
            "queue a-classic in vhost {}: completed by an earlier run; {a_segments} verified segment(s) reused",
            vh.name
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "queue b-quorum in vhost {}: not completed by the earlier run",
            vh.name
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains(&format!("queue a-classic in vhost {}: backing up", vh.name)),
        "a-classic was read again: {stderr}"
    );
    // The final manifest lists each queue once, whole; the killed run's partial segments of
    // b-quorum are gone, and the new ones were numbered after them.
    let m = manifest_json(&store, id);
    assert!(m["completed_at"].is_i64(), "{m}");
    let queues = m["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 3);
    for ((name, _, n), q) in QUEUES.iter().zip(queues) {
        assert_eq!(q["name"], *name);
        assert_eq!(q["message_count"], *n as u64);
    }
    let listed: Vec<String> = queues[1]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["key"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(segment_files(&store, id, &vh.name, "b-quorum"), listed);
    assert!(
        listed.iter().all(|s| !killed_run_segments.contains(s)),
        "a segment of the killed run was overwritten or kept: {killed_run_segments:?} / {listed:?}"
    );
    let url = format!("file://{}", store.display());
    let out = run_cli(&["validate", "--path", &url, "--backup-id", id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // The checkpoint database was synced to its key too.
    assert!(store.join(id).join("state").join("offsets.db").is_file());

    // The source is untouched: every message, in order.
    for (name, _, n) in QUEUES {
        assert_bulk(&conn, name, n, "source after the rerun");
    }
    // A restore of the result equals the source, message for message, no duplicates.
    let target = vh.sibling("target");
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&target);
    for (name, _, n) in QUEUES {
        assert_bulk(&tconn, name, n, "restored");
    }
}

#[test]
fn a_fresh_machine_resumes_from_the_database_synced_to_s3() {
    let vh = TestVhost::new("resume-s3");
    let conn = vh.connect();
    // basic.get reads about 1,800 msg/s in a debug build here (RabbitMQ 4.3.6 and 3.10.8;
    // earlier measured at up to 10,000): b lasts 4-22 s, past the kill 2.5 s after a
    // completes (a run that finished first fails the kill's assertion below). With 100,000
    // the rerun alone took 54 s.
    let sizes = [("a", 3_000usize), ("b", 40_000)];
    for (name, n) in sizes {
        let ch = conn.open_channel().unwrap();
        declare(&ch, name, "classic", FieldTable::new());
        publish_bulk(&ch, name, n, BODY);
        let _ = ch.close();
    }
    let bucket = S3Bucket::new("resume");
    let dir = TempDir::new("resume-s3");
    let id = "pod";
    let db = dir.path().join("offsets.db");
    let unused = dir.path().join("unused");
    let yaml = backup_yaml(
        id,
        &vh.name,
        &unused,
        &format!(
            "  max_concurrent_queues: 1\n  requeue_strategy: get\n  segment_max_bytes: 65536\noffset_storage:\n  db_path: \"{}\"\n  s3_key: {id}/state/offsets.db\n  sync_interval_secs: 1\n",
            db.display()
        ),
    )
    .replace(
        &format!("  backend: filesystem\n  path: \"{}\"\n", unused.display()),
        &format!(
            "  backend: s3\n  bucket: {}\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key: {}\n",
            bucket.name(), S3_ADMIN.0, S3_ADMIN.1
        ),
    );
    assert!(yaml.contains("backend: s3"), "{yaml}");
    let cfg = write_config(dir.path(), "b.yaml", &yaml);
    let (mut child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(
        &lines,
        &format!("queue a in vhost {}: 3000 messages in", vh.name),
    );
    // The queue's completion reaches the key with the next sync (every second).
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    assert_eq!(
        child.wait().unwrap().signal(),
        Some(9),
        "killed mid-run, not finished"
    );
    // A fresh pod: no local database.
    std::fs::remove_file(&db).unwrap();
    let _ = std::fs::remove_file(db.with_extension("db-wal"));
    let _ = std::fs::remove_file(db.with_extension("db-shm"));
    wait_depth(&conn, "b", sizes[1].1 as u32);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "checkpoint database {} fetched from {id}/state/offsets.db",
            db.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "queue a in vhost {}: completed by an earlier run",
            vh.name
        )),
        "{stderr}"
    );
    for (name, n) in sizes {
        assert_bulk(&conn, name, n, "source");
    }
}

#[test]
fn sigterm_stops_a_backup_within_seconds_and_leaves_it_interrupted() {
    let vh = TestVhost::new("sigterm");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "slow", "classic", FieldTable::new());
    const N: usize = 50_000;
    publish_bulk(&ch, "slow", N, BODY);
    let dir = TempDir::new("sigterm");
    let store = dir.path().join("store");
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("t", &vh.name, &store, "  requeue_strategy: get\n"),
    );
    let spool_env = spool.display().to_string();
    let (mut child, lines) = spawn_cli(
        &["backup", "--config", &cfg],
        &[("RMQ_BACKUP_SPOOL_DIR", &spool_env)],
    );
    wait_line(&lines, "50000 messages at start, read with strategy Get");
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    assert!(took < Duration::from_secs(5), "SIGTERM took {took:?}");
    assert_eq!(status.code(), Some(143), "{status:?}");
    wait_line(&lines, "interrupted by SIGTERM: backup stopped");
    // Source untouched, backup interrupted, nothing left in the spool.
    wait_depth(&conn, "slow", N as u32);
    let url = format!("file://{}", store.display());
    let out = run_cli(&["list", "--path", &url, "--format", "json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["status"], "interrupted", "{rows}");
    let left: Vec<_> = std::fs::read_dir(&spool).unwrap().collect();
    assert!(left.is_empty(), "spool left behind: {left:?}");
}

#[test]
fn bad_checkpoint_paths_are_clear_errors_and_change_nothing() {
    let vh = TestVhost::new("cp-bad");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", 10, BODY);
    let dir = TempDir::new("cp-bad");
    let store = dir.path().join("store");
    let corrupt = dir.path().join("corrupt.db");
    std::fs::write(&corrupt, vec![0x42; 4096]).unwrap();
    let cases = [
        (
            dir.path().to_path_buf(),
            2,
            format!(
                "Checkpoint error: unable to open database file: {} (it is a directory)",
                dir.path().display()
            ),
        ),
        (
            dir.path().join("missing/offsets.db"),
            2,
            format!(
                "Checkpoint error: unable to open database file: {} (its directory does not exist)",
                dir.path().join("missing/offsets.db").display()
            ),
        ),
        (
            corrupt.clone(),
            1,
            format!(
                "Checkpoint error: database {} is not a checkpoint database or is corrupt",
                corrupt.display()
            ),
        ),
    ];
    for (i, (db, code, message)) in cases.iter().enumerate() {
        let cfg = write_config(
            dir.path(),
            &format!("b{i}.yaml"),
            &backup_yaml(
                &format!("b{i}"),
                &vh.name,
                &store,
                &format!("offset_storage:\n  db_path: \"{}\"\n", db.display()),
            ),
        );
        let out = run_cli(&["backup", "--config", &cfg]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(*code), "{stdout}{stderr}");
        assert!(
            stderr
                .lines()
                .last()
                .unwrap_or("")
                .starts_with(message.as_str()),
            "{stderr}"
        );
        assert_eq!(depth(&conn, "q"), 10);
    }
}

/// The `seq` headers of every message in `queue`, in order.
fn queue_seqs(conn: &Connection, queue: &str) -> Vec<i64> {
    let n = depth(conn, queue) as usize;
    seqs(&peek(conn, queue, n))
}

#[test]
fn a_restore_killed_with_sigkill_resumes_after_its_last_checkpoint() {
    let vh = TestVhost::new("resume-restore");
    let conn = vh.connect();
    const SMALL: usize = 500;
    const BIG: usize = 30_000;
    for (name, n) in [("a-small", SMALL), ("b-big", BIG)] {
        let ch = conn.open_channel().unwrap();
        declare(&ch, name, "classic", FieldTable::new());
        publish_bulk(&ch, name, n, BODY);
        let _ = ch.close();
    }
    let dir = TempDir::new("resume-restore");
    let store = dir.path().join("store");
    let id = "r";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, "  segment_max_bytes: 262144\n"),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let state = dir.path().join("restore.db");
    let restore = |extra: &str| {
        restore_yaml(
            id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  max_concurrent_queues: 1\n  checkpoint_state: \"{}\"\n  checkpoint_interval_secs: 1\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{extra}",
                state.display(),
                v = vh.name
            ),
        )
    };
    // 4,000 msg/s: b-big takes about 7 s; killed after about 3 s of it.
    let r1 = write_config(
        dir.path(),
        "r1.yaml",
        &restore("  rate_limit_messages_per_sec: 4000\n"),
    );
    let (mut child, lines) = spawn_cli(&["restore", "--config", &r1], &[]);
    wait_line(
        &lines,
        &format!("queue b-big in vhost {}: restoring", vh.name),
    );
    std::thread::sleep(Duration::from_secs(3));
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(9), "killed mid-run");

    // What the killed run published, and what its checkpoint says.
    let tconn = connect(&target);
    let first_run = queue_seqs(&tconn, "b-big");
    let cp = rmq_backup::repository::checkpoint::Checkpoints::open_file(&state).unwrap();
    let key = |queue: &str| rmq_backup::repository::checkpoint::RestoreKey {
        backup_id: id.into(),
        source_vhost: vh.name.clone(),
        source_queue: queue.into(),
        target_vhost: target.clone(),
        target_queue: queue.into(),
    };
    assert_eq!(
        cp.restore_queue(&key("a-small")).unwrap(),
        Some((SMALL as u64, true))
    );
    let (checkpointed, completed) = cp
        .restore_queue(&key("b-big"))
        .unwrap()
        .expect("a checkpoint");
    drop(cp);
    assert!(!completed);
    assert!(
        checkpointed > 0 && (checkpointed as usize) <= first_run.len() && first_run.len() < BIG,
        "checkpoint {checkpointed}, published {}",
        first_run.len()
    );

    let r2 = write_config(dir.path(), "r2.yaml", &restore(""));
    let out = run_cli(&["restore", "--config", &r2]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "queue a-small in vhost {}: restored completely by an earlier run ({SMALL} records); skipped",
            vh.name
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "queue b-big in vhost {}: an earlier run published and had confirmed {checkpointed} records; resuming after them",
            vh.name
        )),
        "{stderr}"
    );
    // Every message arrived, in order; the duplicates are exactly the records the killed run
    // published after its last checkpoint.
    assert_eq!(
        queue_seqs(&tconn, "a-small"),
        (0..SMALL as i64).collect::<Vec<_>>()
    );
    let all = queue_seqs(&tconn, "b-big");
    let duplicates = first_run.len() - checkpointed as usize;
    println!(
        "restore killed after {} of {BIG} published, checkpoint at {checkpointed}: {duplicates} duplicate(s) on rerun",
        first_run.len()
    );
    let expected: Vec<i64> = (0..first_run.len() as i64)
        .chain(checkpointed as i64..BIG as i64)
        .collect();
    assert_eq!(
        all.len(),
        expected.len(),
        "{duplicates} duplicates expected"
    );
    if let Some(at) = (0..all.len()).find(|&i| all[i] != expected[i]) {
        let near = |v: &[i64]| v[at.saturating_sub(3)..(at + 4).min(v.len())].to_vec();
        panic!(
            "messages out of order or missing from position {at}: got {:?}, expected {:?}",
            near(&all),
            near(&expected)
        );
    }
}

/// An `s3_key` the storage refuses to write: the run fails with the storage's error, the
/// backup is not called complete, nothing on the broker changes. As `nobody` (setpriv) when the
/// tests run as root, who could write anywhere.
#[test]
fn an_s3_key_the_storage_refuses_fails_the_run_and_leaves_it_incomplete() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let vh = TestVhost::new("cp-denied");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", 20, BODY);
    let dir = TempDir::new("cp-denied");
    let store = dir.path().join("store");
    let work = dir.path().join("work");
    for d in [&store, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    // Everything writable by nobody but the directory of the key.
    std::fs::create_dir_all(store.join("ro")).unwrap();
    let is_root = running_as_root();
    if is_root {
        for d in [&store, &work] {
            chown(d, Some(65534), Some(65534)).unwrap();
        }
    }
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(store.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "d",
            &vh.name,
            &store,
            &format!(
                "offset_storage:\n  db_path: \"{}\"\n  s3_key: ro/offsets.db\n",
                work.join("offsets.db").display()
            ),
        ),
    );
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bin = binary();
    let bin = bin.as_str();
    let mut cmd = if is_root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin,
        ]);
        c
    } else {
        Command::new(bin)
    };
    let out = cmd
        .args(["backup", "--config", &cfg])
        .env("RMQ_BACKUP_SPOOL_DIR", &work)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some("Storage error: Failed to write ro/offsets.db: Permission denied"),
        "{stderr}"
    );
    assert_eq!(
        manifest_json(&store, "d")["completed_at"],
        serde_json::Value::Null
    );
    assert_eq!(depth(&conn, "q"), 20);
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

#[test]
fn sigterm_stops_a_restore_after_its_confirms_and_a_rerun_adds_no_duplicate() {
    const N: usize = 3_000;
    let vh = TestVhost::new("restore-term");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", N, BODY);
    let dir = TempDir::new("restore-term");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("t", &vh.name, &store, ""),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let state = dir.path().join("restore.db");
    let restore = |extra: &str| {
        restore_yaml(
            "t",
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  checkpoint_state: \"{}\"\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{extra}",
                state.display(),
                v = vh.name
            ),
        )
    };
    let r1 = write_config(
        dir.path(),
        "r1.yaml",
        &restore("  rate_limit_messages_per_sec: 1000\n"),
    );
    let (mut child, lines) = spawn_cli(&["restore", "--config", &r1], &[]);
    wait_line(&lines, &format!("queue q in vhost {}: restoring", vh.name));
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(status.code(), Some(143));
    let tconn = connect(&target);
    let first = queue_seqs(&tconn, "q");
    assert!(
        !first.is_empty() && first.len() < N,
        "{} published",
        first.len()
    );

    // The stop waited for the confirms and checkpointed everything it published: the rerun
    // publishes the rest, nothing twice.
    let r2 = write_config(dir.path(), "r2.yaml", &restore(""));
    let out = run_cli(&["restore", "--config", &r2]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(queue_seqs(&tconn, "q"), (0..N as i64).collect::<Vec<_>>());
}

/// A `db_path` in a directory the user may not write: `unable to open database file`, exit 2,
/// nothing on the broker changed. As `nobody` when the tests run as root.
#[test]
fn an_unwritable_db_path_is_a_clear_error() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let vh = TestVhost::new("cp-unwritable");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", 10, BODY);
    let dir = TempDir::new("cp-unwritable");
    let store = dir.path().join("store");
    let work = dir.path().join("work");
    let locked = dir.path().join("locked");
    for d in [&store, &work, &locked] {
        std::fs::create_dir_all(d).unwrap();
    }
    let is_root = running_as_root();
    if is_root {
        for d in [&store, &work] {
            chown(d, Some(65534), Some(65534)).unwrap();
        }
    }
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    let db = locked.join("offsets.db");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "u",
            &vh.name,
            &store,
            &format!("offset_storage:\n  db_path: \"{}\"\n", db.display()),
        ),
    );
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bin = binary();
    let bin = bin.as_str();
    let mut cmd = if is_root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin,
        ]);
        c
    } else {
        Command::new(bin)
    };
    let out = cmd
        .args(["backup", "--config", &cfg])
        .env("RMQ_BACKUP_SPOOL_DIR", &work)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.lines().last().unwrap_or("").starts_with(&format!(
            "Checkpoint error: unable to open database file: {}",
            db.display()
        )),
        "{stderr}"
    );
    assert!(!db.exists());
    assert_eq!(depth(&conn, "q"), 10);
}
