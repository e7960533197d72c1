//! `rmq-backup forget` and the configuration's `retention:` (issue 23, item 1) on the
//! filesystem and on S3 (SeaweedFS): backups made by the real binary from the real broker, whose
//! manifests' `created_at` are then rewritten to span days, weeks and months, checked against
//! restic's documented policy semantics (newest first; the newest backup of each of the last N
//! days / ISO weeks / months that have backups, the oldest too while a rule has counts left;
//! keep-within relative to the newest backup; the union kept).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::storage::Storage;
use rmq_backup::run::units::days_from_civil;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Epoch ms of a UTC date and hour.
fn at(y: i64, m: u32, d: u32, h: i64) -> i64 {
    days_from_civil(y, m, d) * 86_400_000 + h * 3_600_000
}

/// Where the backups of one test go: its storage block for configurations, its URL for the
/// commands, the environment they need, and the storage itself for rewriting manifests.
struct Store {
    yaml_block: String,
    url: String,
    env: Vec<(&'static str, &'static str)>,
    storage: Arc<dyn Storage>,
}

fn fs_store(dir: &TempDir) -> Store {
    let path = dir.path().join("store");
    Store {
        yaml_block: format!(
            "storage:\n  backend: filesystem\n  path: \"{}\"\n",
            path.display()
        ),
        url: format!("file://{}", path.display()),
        env: vec![],
        storage: rmq_backup::repository::storage::open_filesystem(&path, None).expect("open"),
    }
}

fn s3_store(bucket: &S3Bucket) -> Store {
    let yaml_block = format!(
        "storage:\n  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  prefix: nightly\n  access_key: {}\n  secret_key: {}\n",
        bucket.name(),
        S3_ADMIN.0,
        S3_ADMIN.1
    );
    let cfg = rmq_backup::config::Config::from_yaml_str(&format!(
        "mode: restore\nbackup_id: x\ntarget:\n  amqp_url: \"{}\"\n{yaml_block}restore:\n  restore_definitions: false\n",
        amqp_url("/")
    ))
    .expect("config");
    Store {
        url: format!(
            "s3://{}/nightly?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
            bucket.name()
        ),
        yaml_block,
        env: vec![
            ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
            ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
        ],
        storage: rmq_backup::repository::storage::open_config(&cfg.storage).expect("open s3"),
    }
}

/// A vhost with one small classic queue.
fn seeded(tag: &str) -> TestVhost {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().expect("channel");
    declare(&ch, "orders", "classic", FieldTable::new());
    publish_bulk(&ch, "orders", 5, 64);
    vh
}

/// The backup configuration of `id` into `store`, with `extra` appended (a retention section).
fn config(vh: &TestVhost, dir: &TempDir, store: &Store, id: &str, extra: &str) -> String {
    let unused = dir.path().join("unused");
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        unused.display()
    );
    let yaml = backup_yaml(id, &vh.name, &unused, "").replace(&fs_block, &store.yaml_block);
    write_config(dir.path(), &format!("{id}.yaml"), &format!("{yaml}{extra}"))
}

/// Backs up `vh` once per id with the real binary.
fn backups(vh: &TestVhost, dir: &TempDir, store: &Store, ids: &[&str]) {
    for id in ids {
        let cfg = config(vh, dir, store, id, "");
        let out = run_cli_env(&["backup", "--config", &cfg], &store.env);
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "backup {id}: {stdout}\n{stderr}"
        );
    }
}

/// Rewrites backup `id`'s manifest: `created_at`, and `completed_at` a minute later, or null
/// (an interrupted backup).
fn set_created(store: &Store, id: &str, created: i64, completed: bool) {
    let key = format!("{id}/manifest.json");
    let mut m = rmq_backup::repository::manifest::Manifest::from_json(
        &store.storage.get_bytes(&key).expect("manifest"),
    )
    .expect("parse");
    m.created_at = created;
    m.completed_at = completed.then_some(created + 60_000);
    store
        .storage
        .put_bytes(&key, m.to_json_pretty().expect("json").as_bytes())
        .expect("rewrite manifest");
}

/// Runs `forget --format json` with `args`; returns the exit code and the parsed report.
fn forget(store: &Store, args: &[&str]) -> (i32, serde_json::Value) {
    let mut all = vec!["forget", "--path", &store.url, "--format", "json"];
    all.extend_from_slice(args);
    let out = run_cli_env(&all, &store.env);
    let (stdout, stderr) = text(&out);
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("forget {args:?}: not JSON ({e}): {stdout}\n{stderr}"));
    (out.status.code().unwrap_or(-1), v)
}

/// The ids the report keeps.
fn kept(v: &serde_json::Value) -> BTreeSet<String> {
    v["backups"]
        .as_array()
        .expect("backups")
        .iter()
        .filter(|b| b["action"] == "keep")
        .map(|b| b["backup_id"].as_str().unwrap().to_string())
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn reasons(v: &serde_json::Value, id: &str) -> Vec<String> {
    v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backup_id"] == id)
        .unwrap_or_else(|| panic!("{id} in {v}"))["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// Every restic rule on eight backups spread over three months, then a real removal.
#[test]
fn policies_follow_restic_on_the_filesystem() {
    let vh = seeded("forget-fs");
    let dir = TempDir::new("forget-fs");
    let store = fs_store(&dir);
    let ids = ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"];
    backups(&vh, &dir, &store, &ids);
    let times = [
        at(2025, 11, 10, 10), // b1: November
        at(2025, 12, 20, 10), // b2: December, ISO week 2025-W51
        at(2025, 12, 29, 9),  // b3: a Monday: December, but ISO week 2026-W01
        at(2026, 1, 2, 8),    // b4: 2026-W01
        at(2026, 1, 5, 8),    // b5: Monday of 2026-W02
        at(2026, 1, 5, 12),   // b6: the same day, later
        at(2026, 1, 6, 7),    // b7
        at(2026, 1, 6, 20),   // b8: the newest
    ];
    for (id, t) in ids.iter().zip(times) {
        set_created(&store, id, t, true);
    }
    let dry = |args: &[&str]| {
        let mut a = args.to_vec();
        a.push("--dry-run");
        let (code, v) = forget(&store, &a);
        assert_eq!(code, 0, "{args:?}: {v}");
        assert_eq!(v["dry_run"], true);
        kept(&v)
    };
    assert_eq!(dry(&["--keep-last", "3"]), set(&["b6", "b7", "b8"]));
    // The newest of each of the last three days with backups (Jan 3 and 4 have none).
    assert_eq!(dry(&["--keep-daily", "3"]), set(&["b4", "b6", "b8"]));
    // ISO weeks: Dec 29 belongs to 2026-W01 with Jan 2.
    assert_eq!(dry(&["--keep-weekly", "2"]), set(&["b4", "b8"]));
    assert_eq!(dry(&["--keep-weekly", "3"]), set(&["b2", "b4", "b8"]));
    assert_eq!(dry(&["--keep-monthly", "2"]), set(&["b3", "b8"]));
    // More months asked than there are: every month's newest, and the oldest backup.
    assert_eq!(dry(&["--keep-monthly", "5"]), set(&["b1", "b3", "b8"]));
    // Strictly newer than the newest minus one day (Jan 5, 20:00).
    assert_eq!(dry(&["--keep-within", "1d"]), set(&["b7", "b8"]));
    // One calendar month back from Jan 6, 20:00: Dec 6, 20:00.
    assert_eq!(
        dry(&["--keep-within", "1m"]),
        set(&["b2", "b3", "b4", "b5", "b6", "b7", "b8"])
    );
    // The union, with every reason.
    let (_, v) = forget(
        &store,
        &[
            "--keep-last",
            "1",
            "--keep-monthly",
            "2",
            "--keep-within",
            "1d",
            "--dry-run",
        ],
    );
    assert_eq!(kept(&v), set(&["b3", "b7", "b8"]));
    assert_eq!(reasons(&v, "b8"), ["last", "monthly", "within 1d"]);
    assert_eq!(
        reasons(&v, "b2"),
        ["not kept by keep-last 1, keep-monthly 2, keep-within 1d"]
    );
    assert_eq!(
        store.storage.list_backup_ids().expect("ids").len(),
        8,
        "a dry run deletes nothing"
    );
    // No rule: refused, nothing removed.
    let out = run_cli(&["forget", "--path", &store.url]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out)
        .1
        .contains("Configuration error: forget needs at least one of"));

    // Real: daily 3 and monthly 3 keep b8, b6, b4 and b8, b3, b1.
    let out = run_cli(&[
        "forget",
        "--path",
        &store.url,
        "--keep-daily",
        "3",
        "--keep-monthly",
        "3",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("5 backup(s) kept, 3 removed."), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("b2 ") && l.contains("remove")),
        "{stdout}"
    );
    assert_eq!(
        store.storage.list_backup_ids().expect("ids"),
        ["b1", "b3", "b4", "b6", "b8"]
    );
    for gone in ["b2", "b5", "b7"] {
        assert!(
            store
                .storage
                .list(&format!("{gone}/"))
                .expect("list")
                .is_empty(),
            "{gone}: every object deleted"
        );
    }
    // What is left is whole.
    let out = run_cli(&[
        "validate",
        "--path",
        &store.url,
        "--backup-id",
        "b4",
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).0);
}

/// Interrupted backups: newer than the newest completed one kept; older only with
/// --prune-interrupted. A backup whose run lock is live is never removed, not even with it.
#[test]
fn running_and_interrupted_backups() {
    let vh = seeded("forget-states");
    let dir = TempDir::new("forget-states");
    let store = fs_store(&dir);
    let ids = ["old-done", "old-int", "locked", "done", "new-int"];
    backups(&vh, &dir, &store, &ids);
    set_created(&store, "old-done", at(2026, 1, 1, 0), true);
    set_created(&store, "old-int", at(2026, 1, 2, 0), false);
    set_created(&store, "locked", at(2026, 1, 2, 12), true);
    set_created(&store, "done", at(2026, 1, 3, 0), true);
    set_created(&store, "new-int", at(2026, 1, 4, 0), false);
    // The lock a running backup holds (the same heartbeat), taken here.
    let lock = rmq_backup::repository::lock::RunLock::acquire(store.storage.clone(), "locked")
        .expect("lock");
    let (code, v) = forget(&store, &["--keep-last", "1"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(kept(&v), set(&["done", "locked", "new-int", "old-int"]));
    assert!(
        reasons(&v, "locked")[0].starts_with("running: locked by host"),
        "{v}"
    );
    assert!(
        reasons(&v, "old-int")[0].contains("--prune-interrupted"),
        "{v}"
    );
    assert!(
        reasons(&v, "new-int")[0].contains("newer than every completed backup"),
        "{v}"
    );
    let (code, v) = forget(&store, &["--keep-last", "1", "--prune-interrupted"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(kept(&v), set(&["done", "locked", "new-int"]));
    assert_eq!(
        store.storage.list_backup_ids().expect("ids"),
        ["done", "locked", "new-int"]
    );
    // Once the run has ended, the policy applies to it.
    lock.release();
    let (_, v) = forget(&store, &["--keep-last", "1"]);
    assert_eq!(kept(&v), set(&["done", "new-int"]));
}

/// Sets the modification time of a file `days` days back.
fn age(path: &std::path::Path, days: u32) {
    let out = std::process::Command::new("touch")
        .args(["-d", &format!("{days} days ago")])
        .arg(path)
        .output()
        .expect("touch");
    assert!(out.status.success());
}

/// --prune: objects no manifest lists, under a backup's prefix or a prefix whose manifest is
/// gone, are deleted once older than the grace; fresh ones and keys outside the layout stay.
#[test]
fn prune_removes_old_orphans_on_the_filesystem() {
    let vh = seeded("forget-prune");
    let dir = TempDir::new("forget-prune");
    let store = fs_store(&dir);
    backups(&vh, &dir, &store, &["live", "dead"]);
    let root = dir.path().join("store");
    // "dead" loses its manifest (a half-deleted backup); "live" gains an unlisted segment.
    std::fs::remove_file(root.join("dead/manifest.json")).expect("rm");
    let stray = "live/queues/rmqb-stray/q/segment-0001.zst";
    store.storage.put_bytes(stray, b"stray").expect("put");
    let fresh = "fresh/queues/v/q/segment-0001.zst";
    store.storage.put_bytes(fresh, b"fresh").expect("put");
    store
        .storage
        .put_bytes("notes/README", b"not ours")
        .expect("put");
    for k in store.storage.list("").expect("list") {
        if !k.starts_with("fresh/") {
            age(&root.join(&k), 3);
        }
    }
    let dead_keys = store.storage.list("dead/").expect("list");
    assert!(!dead_keys.is_empty());
    let (code, v) = forget(&store, &["--keep-last", "5", "--prune", "--dry-run"]);
    assert_eq!(code, 0, "{v}");
    let orphans = v["orphans"].as_array().expect("orphans");
    let removed: BTreeSet<&str> = orphans
        .iter()
        .filter(|o| o["remove"] == true)
        .map(|o| o["key"].as_str().unwrap())
        .collect();
    let mut want: BTreeSet<&str> = dead_keys.iter().map(String::as_str).collect();
    want.insert(stray);
    assert_eq!(removed, want);
    let fresh_entry = orphans
        .iter()
        .find(|o| o["key"] == fresh)
        .expect("fresh listed");
    assert_eq!(fresh_entry["remove"], false);
    assert_eq!(fresh_entry["reason"], "younger than 24h");
    assert!(
        store.storage.head(stray).expect("head").is_some(),
        "dry run"
    );
    let (code, _) = forget(&store, &["--keep-last", "5", "--prune"]);
    assert_eq!(code, 0);
    assert!(store.storage.list("dead/").expect("list").is_empty());
    assert_eq!(store.storage.head(stray).expect("head"), None);
    assert!(store.storage.head(fresh).expect("head").is_some());
    assert!(store.storage.head("notes/README").expect("head").is_some());
    let out = run_cli(&[
        "validate",
        "--path",
        &store.url,
        "--backup-id",
        "live",
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).0);
    // A grace of 0h takes the fresh one too.
    let (_, v) = forget(
        &store,
        &["--keep-last", "5", "--prune", "--prune-grace", "0h"],
    );
    assert_eq!(v["orphans"][0]["key"], fresh, "{v}");
    assert_eq!(store.storage.head(fresh).expect("head"), None);
}

/// On S3 (batch deletes): several backups a day, keep-daily, and prune.
#[test]
fn keep_daily_and_prune_on_s3() {
    let vh = seeded("forget-s3");
    let dir = TempDir::new("forget-s3");
    let bucket = S3Bucket::new("forget");
    let store = s3_store(&bucket);
    let ids = ["mon-a", "mon-b", "tue-a", "tue-b"];
    backups(&vh, &dir, &store, &ids);
    set_created(&store, "mon-a", at(2026, 2, 2, 1), true);
    set_created(&store, "mon-b", at(2026, 2, 2, 23), true);
    set_created(&store, "tue-a", at(2026, 2, 3, 1), true);
    set_created(&store, "tue-b", at(2026, 2, 3, 2), true);
    store
        .storage
        .put_bytes("gone/queues/v/q/segment-0001.zst", b"orphan")
        .expect("put");
    let (code, v) = forget(&store, &["--keep-daily", "1", "--prune"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(kept(&v), set(&["tue-b"]));
    assert_eq!(v["orphans"][0]["reason"], "younger than 24h", "{v}");
    assert_eq!(store.storage.list_backup_ids().expect("ids"), ["tue-b"]);
    for id in ["mon-a", "mon-b", "tue-a"] {
        assert!(
            store
                .storage
                .list(&format!("{id}/"))
                .expect("list")
                .is_empty(),
            "{id}"
        );
    }
    let (code, v) = forget(
        &store,
        &["--keep-daily", "1", "--prune", "--prune-grace", "0h"],
    );
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["orphans"][0]["remove"], true, "{v}");
    assert!(store.storage.list("gone/").expect("list").is_empty());
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &store.url,
            "--backup-id",
            "tue-b",
            "--deep",
        ],
        &store.env,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).0);
}

/// `retention:` in the backup configuration runs after a successful backup; a section without a
/// rule is refused when the configuration is loaded.
#[test]
fn retention_after_a_backup() {
    let vh = seeded("forget-cfg");
    let dir = TempDir::new("forget-cfg");
    let store = fs_store(&dir);
    backups(&vh, &dir, &store, &["r1", "r2"]);
    let cfg = config(&vh, &dir, &store, "r3", "retention:\n  keep_last: 2\n");
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Retention (keep-last 2): 2 backup(s) kept, 1 removed."),
        "{stdout}"
    );
    assert!(
        stderr.contains("forget: backup r1 removed (")
            && stderr.contains("not kept by keep-last 2"),
        "{stderr}"
    );
    assert_eq!(store.storage.list_backup_ids().expect("ids"), ["r2", "r3"]);
    let bad = config(&vh, &dir, &store, "r4", "retention:\n  keep_daily: 0\n");
    let out = run_cli(&["backup", "--config", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out)
            .1
            .contains("Configuration error: retention: no keep_last"),
        "{}",
        text(&out).1
    );
}

/// A sharded backup (two parts, each under its own part lock) is one backup to forget: its
/// parts, merged manifest, part locks and segments all go; a sharded backup with a part missing
/// is interrupted.
#[test]
fn a_sharded_backup_is_removed_whole() {
    let vh = seeded("forget-shards");
    let conn = vh.connect();
    let ch = conn.open_channel().expect("channel");
    for q in ["a", "b", "c", "d"] {
        declare(&ch, q, "classic", FieldTable::new());
        publish_bulk(&ch, q, 3, 32);
    }
    let dir = TempDir::new("forget-shards");
    let store = fs_store(&dir);
    let shard = |id: &str, index: &str| {
        let cfg = config(&vh, &dir, &store, id, "");
        let yaml = std::fs::read_to_string(&cfg).expect("read");
        let yaml = yaml.replace(
            "  include_definitions: true\n",
            "  include_definitions: true\n  shard:\n    count: 2\n",
        );
        std::fs::write(&cfg, yaml).expect("write");
        let out = run_cli_env(
            &["backup", "--config", &cfg],
            &[("JOB_COMPLETION_INDEX", index)],
        );
        assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    };
    shard("sharded", "0");
    shard("sharded", "1");
    shard("half", "0");
    backups(&vh, &dir, &store, &["plain"]);
    set_created(&store, "sharded", at(2026, 1, 1, 0), true);
    set_created(&store, "plain", at(2026, 1, 2, 0), true);
    // The half backup has only its part 0 (no merged manifest): older than "plain".
    let part = "half/parts/0-of-2.json";
    let mut m = rmq_backup::repository::manifest::Manifest::from_json(
        &store.storage.get_bytes(part).unwrap(),
    )
    .expect("part");
    m.created_at = at(2025, 12, 31, 0);
    store
        .storage
        .put_bytes(part, m.to_json_pretty().unwrap().as_bytes())
        .unwrap();
    let parts = store.storage.list("sharded/parts/").expect("parts");
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(store
        .storage
        .list("sharded/state/")
        .expect("locks")
        .iter()
        .any(|k| k.contains("lock-part-1-of-2")));
    let (code, v) = forget(&store, &["--keep-last", "1", "--prune-interrupted"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(kept(&v), set(&["plain"]), "{v}");
    let half = v["backups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backup_id"] == "half")
        .expect("half listed");
    assert_eq!(half["status"], "interrupted");
    for id in ["sharded", "half"] {
        assert!(
            store
                .storage
                .list(&format!("{id}/"))
                .expect("list")
                .is_empty(),
            "{id}: every object deleted"
        );
    }
    assert_eq!(store.storage.list_backup_ids().expect("ids"), ["plain"]);
}

/// A completed backup `id` created at `created`, written here (a manifest and nothing else).
fn fabricated(store: &Store, id: &str, created: i64) {
    let mut m = rmq_backup::repository::manifest::Manifest::new(id, created);
    m.completed_at = Some(created + 60_000);
    store
        .storage
        .put_bytes(
            &format!("{id}/manifest.json"),
            m.to_json_pretty().expect("json").as_bytes(),
        )
        .expect("manifest");
}

/// Issue 31, item 3: a duration past 10,000 years is a configuration error (exit 2), on the
/// command line and in a configuration's `retention:`; before, `--keep-within 1000000000y`
/// wrapped and removed every backup, the newest included.
#[test]
fn durations_past_ten_thousand_years_are_refused() {
    let dir = TempDir::new("forget-far");
    let store = fs_store(&dir);
    fabricated(&store, "older", at(2026, 1, 1, 0));
    fabricated(&store, "newest", at(2026, 1, 2, 0));
    let (code, v) = forget(&store, &["--keep-within", "10000y", "--dry-run"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(kept(&v), set(&["older", "newest"]), "{v}");
    for args in [
        ["--keep-within", "1000000000y"],
        ["--keep-within", "10001y"],
        ["--keep-within", "87658201h"],
        ["--prune-grace", "1000000000y"],
    ] {
        let mut all = vec!["forget", "--path", &store.url, "--keep-last", "1"];
        all.extend_from_slice(&args);
        all.push("--dry-run");
        let out = run_cli(&all);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(
            stderr.starts_with("Configuration error: ") && stderr.contains("10,000 years"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        store.storage.list_backup_ids().expect("ids"),
        ["newest", "older"]
    );
    for (field, value) in [("keep_within", "1000000000y"), ("prune_grace", "10001y")] {
        let unused = dir.path().join("unused");
        let yaml = format!(
            "{}retention:\n  keep_last: 1\n  {field}: {value}\n",
            backup_yaml("far", "/", &unused, "")
        );
        let cfg = write_config(dir.path(), "far.yaml", &yaml);
        let out = run_cli(&["backup", "--config", &cfg]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{field}: {stdout}\n{stderr}");
        assert!(
            stderr.starts_with("Configuration error: ") && stderr.contains("10,000 years"),
            "{field}: {stderr}"
        );
    }
}

/// Issue 31, item 4: `--prune` keeps a checkpoint database where README puts it
/// (`offset_storage.s3_key: nightly/state/offsets.db`, under a prefix with no manifest), synced
/// there by a real backup, and removes a real orphan (a backup whose manifest is gone).
#[test]
fn prune_keeps_the_checkpoint_database() {
    let vh = seeded("forget-ckpt");
    let dir = TempDir::new("forget-ckpt");
    let store = fs_store(&dir);
    let db = dir.path().join("offsets.db");
    let offsets = format!(
        "offset_storage:\n  db_path: \"{}\"\n  s3_key: nightly/state/offsets.db\n  sync_interval_secs: 1\n",
        db.display()
    );
    for id in ["nightly-1", "nightly-2"] {
        let cfg = config(&vh, &dir, &store, id, &offsets);
        let out = run_cli_env(&["backup", "--config", &cfg], &store.env);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{id}: {stdout}\n{stderr}");
    }
    let root = dir.path().join("store");
    // "nightly-1" loses its manifest: what is left of it is a real orphan.
    std::fs::remove_file(root.join("nightly-1/manifest.json")).expect("rm");
    let checkpoint: Vec<String> = store.storage.list("nightly/").expect("list");
    assert_eq!(checkpoint, ["nightly/state/offsets.db"], "what sync wrote");
    let orphans = store.storage.list("nightly-1/").expect("list");
    assert!(
        orphans.iter().any(|k| k.contains("/queues/")),
        "{orphans:?}"
    );
    for k in store.storage.list("").expect("list") {
        age(&root.join(&k), 3);
    }
    let (code, v) = forget(
        &store,
        &["--keep-last", "5", "--prune", "--prune-grace", "0h"],
    );
    assert_eq!(code, 0, "{v}");
    assert!(
        store.storage.list("nightly-1/").expect("list").is_empty(),
        "the orphan is removed: {v}"
    );
    assert_eq!(
        store.storage.list("nightly/").expect("list"),
        checkpoint,
        "the checkpoint database is kept: {v}"
    );
    assert!(
        !v["orphans"]
            .as_array()
            .expect("orphans")
            .iter()
            .any(|o| o["key"] == "nightly/state/offsets.db"),
        "not even listed as an orphan: {v}"
    );
}

/// Issue 31, item 11: a filesystem put killed midway leaves `<name>.partial-<pid>-<n>`, which no
/// listing shows. A backup run removes those of its backup whose writer is gone, never a running
/// writer's; `forget --prune` reports and removes them like any other orphan. Before: nothing
/// ever removed them (the dead writer's file was still there after the backup).
#[test]
fn unfinished_writes_of_a_dead_process_are_removed_by_a_rerun_and_by_prune() {
    let vh = seeded("forget-partials");
    let dir = TempDir::new("forget-partials");
    let store = fs_store(&dir);
    let root = dir.path().join("store");
    // A writer that is gone (exited and reaped) and one still running.
    let mut gone = std::process::Command::new("true").spawn().expect("true");
    let dead = gone.id();
    gone.wait().expect("wait");
    let mut running = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    let live = running.id();
    let plant = |name: &str| {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).expect("mkdir");
        std::fs::write(&path, b"half").expect("plant");
        path
    };
    let dead_before = plant(&format!("p/queues/v/q/segment-0009.zst.partial-{dead}-0"));
    let live_one = plant(&format!("p/queues/v/q/segment-0007.zst.partial-{live}-0"));
    let cfg = config(&vh, &dir, &store, "p", "");
    let out = run_cli_env(&["backup", "--config", &cfg], &store.env);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(!dead_before.exists(), "the dead writer's leftover stayed");
    assert!(live_one.exists(), "a running writer's file was removed");

    // Left after the backup: prune sees it (a backup's shape), not a checkpoint's.
    let dead_after = format!("p/queues/v/q/segment-0008.zst.partial-{dead}-1");
    let checkpoint = format!("p/state/offsets.db.partial-{dead}-2");
    for name in [&dead_after, &checkpoint] {
        age(&plant(name), 3);
    }
    age(&live_one, 3);
    let (code, v) = forget(&store, &["--keep-last", "5", "--prune", "--dry-run"]);
    assert_eq!(code, 0, "{v}");
    let orphans: Vec<(&str, bool)> = v["orphans"]
        .as_array()
        .expect("orphans")
        .iter()
        .map(|o| (o["key"].as_str().unwrap(), o["remove"] == true))
        .collect();
    assert_eq!(orphans, [(dead_after.as_str(), true)], "{v}");
    assert!(root.join(&dead_after).exists(), "dry run");
    let (code, _) = forget(&store, &["--keep-last", "5", "--prune"]);
    assert_eq!(code, 0);
    assert!(!root.join(&dead_after).exists());
    assert!(root.join(&checkpoint).exists());
    assert!(live_one.exists());
    let _ = running.kill();
    let _ = running.wait();
}
