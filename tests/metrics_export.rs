//! The metrics of a run after the process exits (docs/metrics.md "Metrics that outlive a run"): real
//! backups of the local broker write `metrics.textfile` and push to a real Pushgateway
//! (Debian's `prometheus-pushgateway`, started here on a free port); a failed backup records
//! exit code 1 and keeps the last success in both; a failed checkpoint sync is counted.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A vhost with one classic queue holding a few messages.
fn vhost_with_queue(prefix: &str) -> TestVhost {
    let vh = TestVhost::new(prefix);
    let conn = vh.connect();
    let ch = conn.open_channel().expect("channel");
    declare(&ch, "orders", "classic", Default::default());
    publish_bulk(&ch, "orders", 5, 100);
    wait_ready(&ch, "orders", 5);
    vh
}

/// A backup configuration writing to `store` with `metrics` (indented under `metrics:`).
fn config(dir: &Path, id: &str, vhost: &str, store: &Path, metrics: &str) -> String {
    let yaml =
        backup_yaml(id, vhost, store, "") + &format!("metrics:\n  enabled: false\n{metrics}");
    write_config(dir, &format!("{id}.yaml"), &yaml)
}

/// The value of the sample of `name` whose labels include every one of `labels`.
fn value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

fn now_secs() -> f64 {
    rmq_backup::now_ms() as f64 / 1000.0
}

#[test]
fn textfile_holds_the_outcome_and_a_failed_run_keeps_the_last_success() {
    let vh = vhost_with_queue("mexport-tf");
    let dir = TempDir::new("mexport-tf");
    let prom = dir.path().join("rmq-backup.prom");
    let metrics = format!("  textfile: {}\n", prom.display());
    let store = dir.path().join("store");
    let before = now_secs();
    let cfg = config(dir.path(), "tf-ok", &vh.name, &store, &metrics);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let first = std::fs::read_to_string(&prom).expect("textfile written");
    let mode = ["mode=\"backup\""];
    assert_eq!(
        value(&first, "broker_backup_last_run_exit_code", &mode),
        Some(0.0)
    );
    let success = value(
        &first,
        "broker_backup_last_success_timestamp_seconds",
        &mode,
    )
    .expect("last success");
    let ended = value(&first, "broker_backup_last_run_timestamp_seconds", &mode).expect("ended");
    assert_eq!(success, ended);
    assert!(
        success >= before.floor() && success <= now_secs() + 1.0,
        "{first}"
    );
    assert!(value(&first, "broker_backup_last_run_duration_seconds", &mode).is_some());
    assert_eq!(
        value(&first, "broker_backup_messages_read", &["queue=\"orders\""]),
        Some(5.0),
        "every metric of the run is in the file: {first}"
    );
    assert!(first.contains("# TYPE broker_backup_checkpoint_sync_failures counter\n"));
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").all(|e| !e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")),
        "no temporary file left"
    );

    // A storage path below a regular file cannot be created: the backup fails (exit 1).
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").expect("file");
    let cfg = config(
        dir.path(),
        "tf-fail",
        &vh.name,
        &blocker.join("store"),
        &metrics,
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let second = std::fs::read_to_string(&prom).expect("textfile rewritten");
    assert_eq!(
        value(&second, "broker_backup_last_run_exit_code", &mode),
        Some(1.0),
        "{second}"
    );
    assert_eq!(
        value(
            &second,
            "broker_backup_last_success_timestamp_seconds",
            &mode
        ),
        Some(success),
        "the failed run keeps the last success: {second}"
    );
    assert!(value(&second, "broker_backup_last_run_timestamp_seconds", &mode).unwrap() >= ended);
    assert!(stderr.contains("Storage error:"), "{stderr}");
    println!("textfile after the failed run:\n{second}");

    // A restore sharing the file records its own outcome and keeps the backup's.
    let target = vh.sibling("target");
    management().create_vhost(&target).expect("target vhost");
    management()
        .set_permissions(&target, "guest")
        .expect("permissions");
    let restore = restore_yaml(
        "tf-ok",
        &store,
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
            vh.name
        ),
    ) + &format!("metrics:\n  enabled: false\n{metrics}");
    let cfg = write_config(dir.path(), "restore.yaml", &restore);
    let out = run_cli(&["restore", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let third = std::fs::read_to_string(&prom).expect("textfile rewritten");
    let restore_mode = ["mode=\"restore\""];
    assert_eq!(
        value(&third, "broker_backup_last_run_exit_code", &restore_mode),
        Some(0.0),
        "{third}"
    );
    assert!(value(
        &third,
        "broker_backup_last_success_timestamp_seconds",
        &restore_mode
    )
    .is_some());
    assert_eq!(
        value(&third, "broker_backup_last_run_exit_code", &mode),
        Some(1.0),
        "the backup's outcome stays: {third}"
    );
    assert_eq!(
        value(
            &third,
            "broker_backup_last_success_timestamp_seconds",
            &mode
        ),
        Some(success),
        "{third}"
    );
    assert_eq!(
        value(
            &third,
            "broker_restore_messages_published",
            &["queue=\"orders\""]
        ),
        Some(5.0),
        "{third}"
    );
}

/// A Pushgateway of this test: the child process, killed on drop.
struct Pushgateway {
    child: Child,
    addr: String,
}

impl Pushgateway {
    /// Starts `prometheus-pushgateway` on a free port; None (with the reason printed) when
    /// the binary is not installed.
    fn start() -> Option<Pushgateway> {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = match Command::new("prometheus-pushgateway")
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                println!("SKIPPED: prometheus-pushgateway cannot be started ({e}); scripts/test.sh installs it (apt-get install prometheus-pushgateway)");
                return None;
            }
        };
        let pgw = Pushgateway { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(&pgw.addr, "/-/ready").is_none_or(|(status, _)| status != 200) {
            assert!(Instant::now() < deadline, "the Pushgateway did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(pgw)
    }

    fn metrics(&self) -> String {
        let (status, body) = get(&self.addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        body
    }
}

impl Drop for Pushgateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET: status and body.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((
        head.split_whitespace().nth(1)?.parse().ok()?,
        body.to_string(),
    ))
}

#[test]
fn pushgateway_gets_the_outcome_and_a_failed_run_keeps_the_last_success() {
    let Some(pgw) = Pushgateway::start() else {
        return;
    };
    let vh = vhost_with_queue("mexport-pg");
    let dir = TempDir::new("mexport-pg");
    let job = format!("rmqb-test-{}", unique_suffix());
    // Basic auth in the URL (the Pushgateway here checks none): it must never be logged.
    let metrics = format!(
        "  pushgateway_url: \"http://pusher:pgw-s3cret@{}/\"\n  pushgateway_job: {job}\n  pushgateway_grouping:\n    instance: prod-eu\n",
        pgw.addr
    );
    let store = dir.path().join("store");
    let cfg = config(dir.path(), "pg-ok", &vh.name, &store, &metrics);
    let out = run_cli(&["-v", "backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stderr.contains("pgw-s3cret"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "metrics: pushed to the Pushgateway at http://pusher:****@{}/",
            pgw.addr
        )),
        "{stderr}"
    );
    let job_label = format!("job=\"{job}\"");
    let group = [
        job_label.as_str(),
        "instance=\"prod-eu\"",
        "mode=\"backup\"",
    ];
    let first = pgw.metrics();
    assert_eq!(
        value(&first, "broker_backup_last_run_exit_code", &group),
        Some(0.0),
        "{first}"
    );
    let success = value(
        &first,
        "broker_backup_last_success_timestamp_seconds",
        &group,
    )
    .expect("last success pushed");
    assert!(success > 1.7e9, "{success}");
    let mut orders = group.to_vec();
    orders.push("queue=\"orders\"");
    assert_eq!(
        value(&first, "broker_backup_messages_read", &orders),
        Some(5.0),
        "{first}"
    );

    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").expect("file");
    let cfg = config(
        dir.path(),
        "pg-fail",
        &vh.name,
        &blocker.join("store"),
        &metrics,
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let second = pgw.metrics();
    assert_eq!(
        value(&second, "broker_backup_last_run_exit_code", &group),
        Some(1.0),
        "{second}"
    );
    assert_eq!(
        value(
            &second,
            "broker_backup_last_success_timestamp_seconds",
            &group
        ),
        Some(success),
        "POST keeps the last success of the group: {second}"
    );
    for line in second.lines().filter(|l| l.contains(&job_label)) {
        println!("{line}");
    }
}

#[test]
fn an_unreachable_pushgateway_is_a_warning_not_a_failure() {
    let vh = vhost_with_queue("mexport-down");
    let dir = TempDir::new("mexport-down");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let metrics = format!("  pushgateway_url: \"http://u:down-s3cret@127.0.0.1:{port}\"\n");
    let cfg = config(
        dir.path(),
        "down",
        &vh.name,
        &dir.path().join("store"),
        &metrics,
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "metrics not pushed to the Pushgateway at http://u:****@127.0.0.1:{port}: Connection error: POST http://127.0.0.1:{port}/metrics/job/rmq-backup/mode/backup:"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("down-s3cret"), "{stderr}");
    println!("{stderr}");
}

#[test]
fn a_failed_checkpoint_sync_is_counted_in_the_textfile() {
    let vh = vhost_with_queue("mexport-sync");
    let dir = TempDir::new("mexport-sync");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).expect("store");
    // The sync's key lies below a regular file: every upload of the database fails.
    std::fs::write(store.join("blocked"), b"x").expect("file");
    let prom = dir.path().join("rmq-backup.prom");
    let yaml = backup_yaml("sync", &vh.name, &store, "")
        + &format!(
            "offset_storage:\n  db_path: {}\n  s3_key: blocked/offsets.db\nmetrics:\n  enabled: false\n  textfile: {}\n",
            dir.path().join("offsets.db").display(),
            prom.display()
        );
    let cfg = write_config(dir.path(), "sync.yaml", &yaml);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("the checkpoint database could not be synced"),
        "{stderr}"
    );
    let file = std::fs::read_to_string(&prom).expect("textfile written");
    assert!(
        value(&file, "broker_backup_checkpoint_sync_failures", &[]).unwrap_or(0.0) >= 1.0,
        "{file}"
    );
    assert_eq!(
        value(
            &file,
            "broker_backup_last_run_exit_code",
            &["mode=\"backup\""]
        ),
        out.status.code().map(f64::from),
        "{file}"
    );
}
