//! The metrics HTTP server of SPEC.md "Endpoints / Metrics HTTP server", scraped while a real
//! backup and a real restore run against the local broker: names, types, label sets, values
//! against what was backed up, content types, /health, /healthz, /, 404; and a taken port.

mod common;

use common::*;
use rmq_backup::repository::manifest::Manifest;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One HTTP answer: status, content type, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

/// A plain HTTP/1.0 GET (the server closes the connection after answering).
fn get(addr: &str, path: &str) -> Option<Answer> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    Some(Answer {
        status,
        content_type,
        body: body.to_string(),
    })
}

/// The running binary, its stderr lines as they come, and the metrics address it logged.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
    addr: String,
}

fn spawn(args: &[&str]) -> Running {
    let mut child = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rmq-backup");
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut r = Running {
        child,
        lines: rx,
        stderr: Vec::new(),
        addr: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.addr.is_empty() {
        let line = r
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no metrics address logged: {:?}", r.stderr));
        if let Some(rest) = line.split("metrics: serving on http://").nth(1) {
            r.addr = rest.split('/').next().unwrap_or_default().to_string();
        }
        r.stderr.push(line);
    }
    r
}

impl Running {
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    fn finish(mut self) -> (Option<i32>, String, String) {
        let status = self.child.wait().expect("wait");
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        self.stderr.extend(self.lines.iter());
        (status.code(), out, self.stderr.join("\n"))
    }
}

/// The value of the sample `name{labels}` (or `name` without labels) in an exposition.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn labels(queue: &str, vhost: &str, kind: &str) -> String {
    format!("{{queue=\"{queue}\",vhost=\"{vhost}\",queue_type=\"{kind}\"}}")
}

/// Every metric of SPEC.md with its HELP and TYPE lines, and every sample line in a known
/// family with the label set of that family.
fn check_exposition(text: &str) {
    let families = [
        ("broker_backup_messages_read", "counter", "queue_type"),
        ("broker_backup_bytes_read", "counter", "queue_type"),
        ("broker_backup_segments_written", "counter", "queue_type"),
        ("broker_backup_segments_bytes", "counter", "queue_type"),
        ("broker_backup_checkpoint_syncs", "counter", ""),
        ("broker_backup_checkpoint_sync_failures", "counter", ""),
        ("broker_backup_errors", "counter", "error_type"),
        ("broker_restore_messages_published", "counter", "queue_type"),
        ("broker_restore_messages_confirmed", "counter", "queue_type"),
        ("broker_restore_messages_failed", "counter", "queue_type"),
        ("broker_backup_amqp_connections_active", "gauge", ""),
        ("broker_backup_stream_connections_active", "gauge", ""),
        // validate --deep (--read-data-subset): registered in every process, 0 outside it.
        ("broker_backup_validate_segments_read", "counter", ""),
        ("broker_backup_validate_bytes_read", "counter", ""),
        ("broker_backup_validate_segments_failed", "counter", ""),
    ];
    for (name, kind, third) in families {
        assert!(
            text.contains(&format!("\n# HELP {name} "))
                || text.starts_with(&format!("# HELP {name} ")),
            "{name}"
        );
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = l.rsplit_once(' ').expect("sample line");
            assert!(value.parse::<f64>().is_ok(), "{l}");
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            if n != name {
                continue;
            }
            if third.is_empty() {
                assert!(rest.is_empty(), "{l}: no labels");
            } else {
                let keys: Vec<&str> = rest
                    .trim_end_matches('}')
                    .split("\",")
                    .map(|kv| kv.split('=').next().unwrap_or(""))
                    .collect();
                assert_eq!(keys, ["queue", "vhost", third], "{l}");
            }
        }
    }
    let names: Vec<&str> = families.iter().map(|f| f.0).collect();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let n = l.split(['{', ' ']).next().unwrap_or("");
        assert!(names.contains(&n), "unknown metric {n}");
    }
}

fn check_other_endpoints(addr: &str) {
    for path in ["/health", "/healthz"] {
        let a = get(addr, path).expect(path);
        assert_eq!(a.status, 200, "{path}: {a:?}");
        assert_eq!(a.content_type, "application/json");
        assert_eq!(a.body, r#"{"status":"ok"}"#);
    }
    let a = get(addr, "/").expect("/");
    assert_eq!(a.status, 200);
    assert!(a.content_type.starts_with("text/html"), "{a:?}");
    for link in ["href=\"/metrics\"", "href=\"/health\"", "href=\"/healthz\""] {
        assert!(a.body.contains(link), "{}", a.body);
    }
    let a = get(addr, "/nope").expect("/nope");
    assert_eq!(a.status, 404);
    assert!(a.content_type.starts_with("text/plain"), "{a:?}");
}

fn metrics_yaml() -> &'static str {
    "metrics:\n  bind_address: 127.0.0.1\n  port: 0\n"
}

#[test]
fn backup_metrics_while_it_runs() {
    let vh = TestVhost::new("metrics-backup");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "a-small", "classic", Default::default());
    declare(&ch, "b-big", "classic", Default::default());
    let small = diverse_messages(60, 7, false);
    publish(&ch, "a-small", &small);
    // basic.get takes one round trip to the broker per message, in a debug or a release
    // build alike: 20,000 of them last seconds, so scrapes see the big queue mid-way.
    let big = 20_000;
    publish_bulk(&ch, "b-big", big, 256);
    let dir = TempDir::new("metrics-backup");
    let store = dir.path().join("store");
    let yaml = format!(
        "{}{}",
        backup_yaml(
            "m1",
            &vh.name,
            &store,
            "  max_concurrent_queues: 1\n  segment_max_bytes: 400000\n  requeue_strategy: get\n"
        ),
        metrics_yaml()
    );
    let cfg = write_config(dir.path(), "b.yaml", &yaml);
    let mut run = spawn(&["backup", "--config", &cfg]);
    let addr = run.addr.clone();

    let small_labels = labels("a-small", &vh.name, "classic");
    let big_labels = labels("b-big", &vh.name, "classic");
    let mut scrapes = Vec::new();
    let mut checked_endpoints = false;
    let mut max_connections = 0;
    while run.running() {
        // A scrape racing the end of the run may find the server gone or stopping.
        if let Some(a) = get(&addr, "/metrics").filter(|a| a.status == 200) {
            assert_eq!(a.content_type, "text/plain; version=0.0.4");
            check_exposition(&a.body);
            max_connections = max_connections
                .max(sample(&a.body, "broker_backup_amqp_connections_active").unwrap_or(0));
            let big_read = sample(&a.body, &format!("broker_backup_messages_read{big_labels}"));
            // Well before the end: a request still queued when the server stops gets no answer.
            if big_read.is_some_and(|n| n > 0 && n < big as u64 / 2) && !checked_endpoints {
                check_other_endpoints(&addr);
                checked_endpoints = true;
            }
            scrapes.push(a.body);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, out, err) = run.finish();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        checked_endpoints,
        "no scrape while the big queue was read: {err}"
    );
    assert_eq!(
        max_connections, 1,
        "one AMQP connection per queue, one queue at a time"
    );

    // The big queue grows monotonically while it is read.
    let reads: Vec<u64> = scrapes
        .iter()
        .filter_map(|s| sample(s, &format!("broker_backup_messages_read{big_labels}")))
        .collect();
    assert!(reads.windows(2).all(|w| w[0] <= w[1]), "{reads:?}");
    // Once the small queue is done, its counters equal its part of the manifest.
    let m = Manifest::from_json(&std::fs::read(store.join("m1/manifest.json")).unwrap()).unwrap();
    let q = m.queues.iter().find(|q| q.name == "a-small").unwrap();
    let last = scrapes
        .iter()
        .rev()
        .find(|s| sample(s, &format!("broker_backup_messages_read{big_labels}")).is_some())
        .expect("a scrape during the big queue");
    let body_bytes: usize = small.iter().map(|m| m.body.len()).sum();
    let seg_bytes: u64 = q.segments.iter().map(|s| s.size_bytes).sum();
    for (metric, want) in [
        ("broker_backup_messages_read", 60),
        ("broker_backup_bytes_read", body_bytes as u64),
        ("broker_backup_segments_written", q.segments.len() as u64),
        ("broker_backup_segments_bytes", seg_bytes),
    ] {
        assert_eq!(
            sample(last, &format!("{metric}{small_labels}")),
            Some(want),
            "{metric}: {last}"
        );
    }
    let b = m.queues.iter().find(|q| q.name == "b-big").unwrap();
    assert_eq!(b.message_count, big as u64);
    assert!(
        b.segments.len() > 1,
        "several segments: {}",
        b.segments.len()
    );
    assert!(
        !last.contains("broker_backup_errors{"),
        "no errors in a good run: {last}"
    );
    // The broker may take a while to make 20,000 returned messages ready again.
    let deadline = Instant::now() + Duration::from_secs(120);
    while depth(&conn, "b-big") < big as u32 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(depth(&conn, "b-big"), big as u32, "the backup took nothing");
}

#[test]
fn restore_metrics_while_it_runs() {
    let vh = TestVhost::new("metrics-restore");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "a-small", "quorum", Default::default());
    declare(&ch, "b-big", "classic", Default::default());
    publish_bulk(&ch, "a-small", 50, 100);
    publish_bulk(&ch, "b-big", 1500, 100);
    let dir = TempDir::new("metrics-restore");
    let store = dir.path().join("store");
    let b = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("r1", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &b]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    let target = vh.sibling("target");
    let v = &vh.name;
    let restore = format!(
        "{}{}",
        restore_yaml(
            "r1",
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  max_concurrent_queues: 1\n  rate_limit_messages_per_sec: 500\n  produce_batch_size: 20\n"
            )
        ),
        metrics_yaml()
    );
    let r = write_config(dir.path(), "r.yaml", &restore);
    let mut run = spawn(&["restore", "--config", &r]);
    let addr = run.addr.clone();
    let small_labels = labels("a-small", &target, "quorum");
    let big_labels = labels("b-big", &target, "classic");
    let mut mid = None;
    let mut confirmed_mid = 0;
    let mut checked_endpoints = false;
    while run.running() {
        if let Some(a) = get(&addr, "/metrics").filter(|a| a.status == 200) {
            assert_eq!(a.content_type, "text/plain; version=0.0.4");
            check_exposition(&a.body);
            let published = sample(
                &a.body,
                &format!("broker_restore_messages_published{big_labels}"),
            );
            if published.is_some_and(|n| (1..1400).contains(&n)) {
                if !checked_endpoints && published.is_some_and(|n| n < 1000) {
                    // Well before the end: a request still queued when the server stops gets
                    // no answer.
                    check_other_endpoints(&addr);
                    checked_endpoints = true;
                }
                confirmed_mid = confirmed_mid.max(
                    sample(
                        &a.body,
                        &format!("broker_restore_messages_confirmed{big_labels}"),
                    )
                    .unwrap_or(0),
                );
                mid = Some(a.body);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, out, err) = run.finish();
    assert_eq!(code, Some(0), "{out}{err}");
    let mid = mid.unwrap_or_else(|| panic!("no scrape during the restore: {err}"));
    assert!(checked_endpoints, "endpoints checked while the restore ran");
    for (metric, want) in [
        ("broker_restore_messages_published", 50),
        ("broker_restore_messages_confirmed", 50),
        ("broker_restore_messages_failed", 0),
    ] {
        assert_eq!(
            sample(&mid, &format!("{metric}{small_labels}")),
            Some(want),
            "{metric}: {mid}"
        );
    }
    let published = sample(
        &mid,
        &format!("broker_restore_messages_published{big_labels}"),
    )
    .unwrap();
    let confirmed = sample(
        &mid,
        &format!("broker_restore_messages_confirmed{big_labels}"),
    )
    .unwrap();
    assert!(confirmed <= published && published < 1500, "{mid}");
    assert!(
        confirmed_mid > 0,
        "confirms are counted while the restore runs"
    );
    assert_eq!(
        sample(&mid, "broker_backup_amqp_connections_active"),
        Some(1),
        "{mid}"
    );
    assert!(
        out.contains("1550 messages published, 1550 confirmed, 0 failed"),
        "{out}"
    );
    let tconn = connect(&target);
    assert_eq!(depth(&tconn, "b-big"), 1500);
}

#[test]
fn a_taken_metrics_port_fails_before_the_broker_is_touched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = TempDir::new("metrics-port");
    let store = dir.path().join("store");
    let yaml = format!(
        "{}metrics:\n  bind_address: 127.0.0.1\n  port: {port}\n",
        backup_yaml("p1", "no-such-vhost", &store, "")
    );
    let cfg = write_config(dir.path(), "b.yaml", &yaml);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{o}{e}");
    assert!(
        e.starts_with(&format!(
            "IO error: metrics server cannot listen on 127.0.0.1:{port} (metrics.bind_address and metrics.port): "
        )),
        "{e}"
    );
    assert!(!store.exists(), "nothing was written before the failure");
    drop(taken);
}
