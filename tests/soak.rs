//! The soak (issue "Faults", `scripts/soak.sh`; not part of the suite: `#[ignore]`, and it
//! kills and stops nodes of the test cluster, so it runs alone): backups and restores of the
//! three-node test cluster for `SOAK_SECS` (default 1800) while other clients publish and
//! consume, with a fault injected at a random moment of each backup, then every invariant
//! checked.
//!
//! - Load: a publisher and an acking consumer on quorum queue `live` (at most 5,000 messages),
//!   a publisher on stream `events` (retention ~2 MB), each reconnecting through any node
//!   after a fault.
//! - Fixed queues `fixed-c` (classic, on rmqc2) and `fixed-q` (quorum) of [`FIXED`] numbered
//!   messages that nothing else touches: the source must stay whole and in order.
//! - Each round backs up the vhost (queues and the stream over the stream protocol) with one
//!   fault, chosen at random, at a random moment: none, a backup connection closed by an
//!   operator, `stop_app`/`start_app` of rmqc2 or rmqc3, rmqc3 killed and started again, a
//!   memory alarm on rmqc1 for 3 s, or the backup SIGKILLed. After the fault is healed the
//!   same command is run again until it completes (exit 0, or 4 when `live`'s consumer held
//!   messages at its start), at most 4 times.
//! - Checked every round: the completed backup passes `validate --deep`; the fixed queues are
//!   whole and in order in it and on the source; no connection named `rmq-backup ...` is left
//!   on the broker. Every third round the backup is restored into a new vhost and each
//!   restored queue compared with what the backup holds, message by message.
//! - A continuous stream backup (`stop_at_current_depth: false`) follows `events` for the whole
//!   soak; its RSS, threads and open files are sampled every 10 s and must stay flat; so must
//!   each backup run's peak RSS, threads and open files. At the end it is stopped with
//!   SIGTERM and validated.
//!
//! Prints a report: rounds, faults, reruns, outcomes, and the resource series.

mod common;

use common::cluster::{self, ClusterVhost, NodeBack};
use common::*;
use rmq_backup::broker::amqp::{BasicProperties, Connection, FieldTable, FieldValue};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Messages in each fixed queue.
const FIXED: usize = 5_000;
const FAULTS: [&str; 7] = [
    "none",
    "close-connection",
    "stop-app-2",
    "stop-app-3",
    "kill-node-3",
    "memory-alarm",
    "sigkill",
];

/// A process's resources, sampled from /proc.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_kb: u64,
    threads: u64,
    fds: u64,
}

impl Usage {
    fn of(pid: u32) -> Option<Usage> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
                .unwrap_or(0)
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(Usage {
            rss_kb: field("VmRSS:"),
            threads: field("Threads:"),
            fds,
        })
    }

    fn max(self, o: Usage) -> Usage {
        Usage {
            rss_kb: self.rss_kb.max(o.rss_kb),
            threads: self.threads.max(o.threads),
            fds: self.fds.max(o.fds),
        }
    }
}

/// A small xorshift generator (no dependency), seeded from the clock unless `SOAK_SEED`.
struct Dice(u64);

impl Dice {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn connect_any(vhost: &str) -> Option<Connection> {
    (1..=3u8).find_map(|n| {
        let url =
            rmq_backup::broker::amqp::AmqpUrl::parse(&cluster::amqp_url(n, vhost, "heartbeat=5"))
                .ok()?;
        Connection::open(&rmq_backup::broker::amqp::ConnectOptions::new(url)).ok()
    })
}

/// Publishes to `queue` (about `per_sec` messages a second) until `stop`, reconnecting after
/// any failure; counts what the broker confirmed.
fn publisher(vhost: String, queue: &'static str, per_sec: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut confirmed = 0u64;
    let mut seq = 0i64;
    while !stop.load(Ordering::SeqCst) {
        let Some(conn) = connect_any(&vhost) else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        let ch = match conn
            .open_channel()
            .and_then(|ch| ch.confirm_select().map(|_| ch))
        {
            Ok(ch) => ch,
            Err(_) => continue,
        };
        let result = (|| -> rmq_backup::Result<()> {
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..per_sec / 10 {
                    let props = BasicProperties {
                        headers: Some(vec![("seq".into(), FieldValue::I64(seq))]),
                        delivery_mode: Some(2),
                        ..Default::default()
                    };
                    ch.basic_publish("", queue, true, &props, format!("{queue} {seq}").as_bytes())?;
                    seq += 1;
                }
                let s = ch.wait_for_confirms(0, Duration::from_secs(30))?;
                confirmed += per_sec / 10 - (s.nacked.len() + s.returned.len()) as u64;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })();
        if result.is_err() {
            std::thread::sleep(Duration::from_millis(500));
        }
        let _ = conn.close();
    }
    confirmed
}

/// Consumes `queue` with acks (prefetch 50) until `stop`, reconnecting after any failure.
fn consumer(vhost: String, queue: &'static str, stop: Arc<AtomicBool>) -> u64 {
    let mut acked = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let Some(conn) = connect_any(&vhost) else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        let result = (|| -> rmq_backup::Result<()> {
            let ch = conn.open_channel()?;
            ch.basic_qos(50, false)?;
            let c = ch.basic_consume(queue, "soak-consumer", false, false, &FieldTable::new())?;
            while !stop.load(Ordering::SeqCst) {
                if let Some(d) = c.recv_timeout(Duration::from_millis(200))? {
                    ch.basic_ack(d.delivery_tag, false)?;
                    acked += 1;
                    // A slow consumer: the queue keeps a backlog for the backups.
                    std::thread::sleep(Duration::from_millis(8));
                }
            }
            Ok(())
        })();
        if result.is_err() {
            std::thread::sleep(Duration::from_millis(500));
        }
        let _ = conn.close();
    }
    acked
}

fn config(dir: &std::path::Path, id: &str, vhost: &str, extra_backup: &str) -> String {
    let list = |v: Vec<String>| {
        v.iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let amqp = list(
        (1..=3)
            .map(|n| cluster::amqp_url(n, vhost, "heartbeat=5"))
            .collect(),
    );
    let mgmt = list((1..=3).map(cluster::management_url).collect());
    let yaml = format!(
        "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: [{amqp}]\n  management_url: [{mgmt}]\n  management_username: guest\n  management_password: guest\n  stream_port: 5711\n  queues:\n    vhosts: [\"{vhost}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n  stream_enabled: true\n  connection_retries: 5\n  connection_retry_backoff_ms: 500\n{extra_backup}",
        dir.join("store").display()
    );
    write_config(dir, &format!("{id}.yaml"), &yaml)
}

/// Runs `args`, sampling its resources every 20 ms; returns its exit code and the maxima.
fn run_sampled(args: &[&str], kill_after: Option<Duration>) -> (Option<i32>, Usage, String) {
    let mut child = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rmq-backup");
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut s);
        s
    });
    let started = Instant::now();
    let mut peak = Usage::default();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if let Some(u) = Usage::of(child.id()) {
            peak = peak.max(u);
        }
        if kill_after.is_some_and(|k| started.elapsed() >= k) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), peak, log.join().unwrap())
}

/// Injects `fault` now; returns what heals it.
fn inject(fault: &str, backup_id: &str) -> Box<dyn FnOnce() + Send> {
    match fault {
        "close-connection" => {
            let prefix = format!("rmq-backup {backup_id} ");
            let deadline = Instant::now() + Duration::from_secs(8);
            while Instant::now() < deadline {
                if let Some((name, _)) = connections()
                    .into_iter()
                    .find(|(_, g)| g.starts_with(&prefix))
                {
                    let url = format!(
                        "{}/api/connections/{}",
                        cluster::management_url(1),
                        rmq_backup::broker::management::encode_segment(&name)
                    );
                    let _ = ureq::delete(&url)
                        .header("authorization", MANAGEMENT_AUTH)
                        .header("x-reason", "soak: closed by an operator")
                        .call();
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Box::new(|| {})
        }
        "stop-app-2" | "stop-app-3" => {
            let n = if fault.ends_with('2') { 2 } else { 3 };
            cluster::ctl(n, &["stop_app"]);
            Box::new(move || {
                std::thread::sleep(Duration::from_secs(3));
                cluster::ctl(n, &["start_app"]);
                cluster::wait_node(n);
            })
        }
        "kill-node-3" => {
            cluster::kill_node(3);
            Box::new(|| {
                std::thread::sleep(Duration::from_secs(2));
                cluster::start_nodes();
            })
        }
        "memory-alarm" => {
            cluster::watermark("0.0000001");
            Box::new(|| {
                std::thread::sleep(Duration::from_secs(3));
                cluster::watermark("0.4");
            })
        }
        _ => Box::new(|| {}),
    }
}

/// The cluster's connections: (name, the name the client gave it).
fn connections() -> Vec<(String, String)> {
    let Ok(mut r) = ureq::get(&format!("{}/api/connections", cluster::management_url(1)))
        .header("authorization", MANAGEMENT_AUTH)
        .call()
    else {
        return Vec::new();
    };
    let list: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default())
            .unwrap_or_default();
    list.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| {
                    Some((
                        c["name"].as_str()?.to_string(),
                        c["client_properties"]["connection_name"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Connections on the cluster named `rmq-backup ...` (the management API lists a closed one
/// for up to its statistics interval: asks for 15 s).
fn leaked_connections() -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<String> = connections()
            .into_iter()
            .map(|(_, given)| given)
            .filter(|g| g.starts_with("rmq-backup ") && !g.starts_with("rmq-backup follow "))
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `name` on the source holds the fixed messages, whole and in order.
fn fixed_whole(conn: &Connection, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while (depth(conn, name) as usize) < FIXED {
        if Instant::now() > deadline {
            return Err(format!("{name}: {} of {FIXED} ready", depth(conn, name)));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let seen = seqs(&peek(conn, name, FIXED));
    if seen != (0..FIXED as i64).collect::<Vec<_>>() {
        return Err(format!("{name}: out of order on the source"));
    }
    Ok(())
}

/// Restores backup `id` into a new vhost and compares each queue with the backup.
fn restore_and_compare(dir: &std::path::Path, id: &str, vhost: &str) -> Result<(), String> {
    let target = format!("{vhost}-restored-{id}");
    let m = cluster::management(1);
    m.create_vhost(&target).map_err(|e| e.to_string())?;
    m.set_permissions(&target, "guest")
        .map_err(|e| e.to_string())?;
    let yaml = format!(
        "mode: restore\nbackup_id: {id}\ntarget:\n  amqp_url: \"{}\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  restore_definitions: false\n  publish_mode: direct-to-queue\n  create_missing_queues: true\n  vhost_mapping: {{\"{vhost}\": \"{target}\"}}\n",
        cluster::amqp_url(1, "/", ""),
        cluster::management_url(1),
        dir.join("store").display()
    );
    let cfg = write_config(dir, &format!("restore-{id}.yaml"), &yaml);
    let out = run_cli(&["restore", "--config", &cfg]);
    let result = (|| {
        if out.status.code() != Some(0) {
            return Err(format!("restore of {id}: {:?}", text(&out)));
        }
        let conn = cluster::connect(1, &target);
        let store = dir.join("store");
        for q in manifest(&store, id).queues {
            let held = backed_up(&store, id, &q.name);
            let bodies = |ds: &[rmq_backup::broker::amqp::Delivery]| -> Vec<Vec<u8>> {
                ds.iter().map(|d| d.body.clone()).collect()
            };
            let restored = if q.name == "events" {
                read_stream_091(&conn, &q.name, held.len())
            } else {
                peek(&conn, &q.name, held.len())
            };
            if bodies(&restored) != bodies(&held) {
                return Err(format!("{}: restored differs from backup {id}", q.name));
            }
        }
        let _ = conn.close();
        Ok(())
    })();
    let _ = m.delete_vhost(&target);
    result
}

fn flat(what: &str, series: &[u64], slack: f64, extra: u64) -> Result<(), String> {
    if series.len() < 6 {
        return Ok(());
    }
    let mut head: Vec<u64> = series[..3].to_vec();
    let mut tail: Vec<u64> = series[series.len() - 3..].to_vec();
    head.sort_unstable();
    tail.sort_unstable();
    let (first, last) = (head[1], tail[1]);
    if last as f64 > first as f64 * slack + extra as f64 {
        return Err(format!(
            "{what} grew: median {first} at the start, {last} at the end ({series:?})"
        ));
    }
    Ok(())
}

#[test]
#[ignore = "the soak: scripts/soak.sh (30 minutes, kills nodes of the test cluster)"]
fn soak() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800);
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("soak: {secs} s, SOAK_SEED={seed}");
    let mut dice = Dice(seed);
    let _back = [NodeBack(2), NodeBack(3)];
    let _alarm = cluster::ClearAlarm;
    let vh = ClusterVhost::new("soak");
    let dir = TempDir::new("soak");
    {
        let conn = cluster::connect(2, &vh.name);
        let ch = conn.open_channel().unwrap();
        declare(&ch, "fixed-c", "classic", FieldTable::new());
        publish_bulk_persistent(&ch, "fixed-c", FIXED, 200);
        let _ = conn.close();
        let conn = cluster::connect(1, &vh.name);
        let ch = conn.open_channel().unwrap();
        declare(&ch, "fixed-q", "quorum", FieldTable::new());
        publish_bulk_persistent(&ch, "fixed-q", FIXED, 200);
        // Bounded, so that every round backs up about as much (RSS is compared across rounds):
        // `live` keeps its newest 5,000 messages, `events` about its newest 2 MB.
        declare(
            &ch,
            "live",
            "quorum",
            vec![("x-max-length".into(), FieldValue::I64(5_000))],
        );
        let retention = vec![
            ("x-max-length-bytes".into(), FieldValue::I64(2_000_000)),
            (
                "x-stream-max-segment-size-bytes".into(),
                FieldValue::I64(500_000),
            ),
        ];
        declare(&ch, "events", "stream", retention);
        let _ = conn.close();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = [
        std::thread::spawn({
            let (v, s) = (vh.name.clone(), stop.clone());
            move || publisher(v, "live", 150, s)
        }),
        std::thread::spawn({
            let (v, s) = (vh.name.clone(), stop.clone());
            move || consumer(v, "live", s)
        }),
        std::thread::spawn({
            let (v, s) = (vh.name.clone(), stop.clone());
            move || publisher(v, "events", 100, s)
        }),
    ];

    // The continuous stream backup, followed for the whole soak.
    let follow_cfg = config(
        dir.path(),
        "follow",
        &vh.name,
        "  stop_at_current_depth: false\n",
    );
    let yaml = std::fs::read_to_string(&follow_cfg)
        .unwrap()
        .replace("  queues:\n", "  queues:\n    include: [\"events\"]\n");
    std::fs::write(&follow_cfg, yaml).unwrap();
    let spawn_follow = || -> Child {
        Command::new(binary())
            .args(["backup", "--config", &follow_cfg])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the follower")
    };
    let mut follower = spawn_follow();
    let mut follower_restarts = 0u32;
    let mut follower_usage: Vec<Usage> = Vec::new();
    let mut last_sample = Instant::now();

    let started = Instant::now();
    let mut failures: Vec<String> = Vec::new();
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut runs: Vec<Usage> = Vec::new();
    let mut reruns = 0u32;
    let mut restored = 0u32;
    let mut round = 0u32;
    let check_conn = cluster::connect(1, &vh.name);
    while started.elapsed() < Duration::from_secs(secs) {
        round += 1;
        let id = format!("soak-{round}");
        let cfg = config(dir.path(), &id, &vh.name, "");
        let fault = FAULTS[dice.next(FAULTS.len() as u64) as usize];
        *faults.entry(fault).or_default() += 1;
        let delay = Duration::from_millis(200 + dice.next(2500));
        // The first run, with the fault at `delay`.
        let (code, usage, log) = std::thread::scope(|s| {
            let heal = s.spawn(|| {
                if fault == "sigkill" || fault == "none" {
                    return None;
                }
                std::thread::sleep(delay);
                Some(inject(fault, &id))
            });
            let kill = (fault == "sigkill").then_some(delay);
            let r = run_sampled(&["backup", "--config", &cfg], kill);
            if let Some(heal) = heal.join().unwrap() {
                heal();
            }
            r
        });
        runs.push(usage);
        let mut outcome = format!("{fault}: first run {code:?}");
        let mut code = code;
        let mut tries = 0;
        while !matches!(code, Some(0) | Some(4)) && tries < 4 {
            tries += 1;
            reruns += 1;
            let (c, u, l) = run_sampled(&["backup", "--config", &cfg], None);
            runs.push(u);
            code = c;
            if !matches!(c, Some(0) | Some(4)) {
                std::thread::sleep(Duration::from_secs(2));
                println!(
                    "round {round} rerun {tries}: exit {c:?}: {}",
                    l.lines().last().unwrap_or("")
                );
            }
        }
        outcome.push_str(&format!(", completed after {tries} rerun(s)"));
        *outcomes.entry(outcome).or_default() += 1;
        if !matches!(code, Some(0) | Some(4)) {
            failures.push(format!(
                "round {round} ({fault}): never completed; last log: {log}"
            ));
            continue;
        }
        let store = dir.path().join("store");
        let v = run_cli(&[
            "validate",
            "--path",
            &format!("file://{}", store.display()),
            "--backup-id",
            &id,
            "--deep",
        ]);
        if v.status.code() != Some(0) {
            failures.push(format!("round {round}: validate --deep: {:?}", text(&v)));
        }
        for name in ["fixed-c", "fixed-q"] {
            if seqs(&backed_up(&store, &id, name)) != (0..FIXED as i64).collect::<Vec<_>>() {
                failures.push(format!(
                    "round {round} ({fault}): {name} not whole in order in the backup"
                ));
            }
            if let Err(e) = fixed_whole(&check_conn, name) {
                failures.push(format!("round {round} ({fault}): {e}"));
            }
        }
        let leaked = leaked_connections();
        if !leaked.is_empty() {
            failures.push(format!(
                "round {round} ({fault}): connections left: {leaked:?}"
            ));
        }
        if round.is_multiple_of(3) {
            restored += 1;
            if let Err(e) = restore_and_compare(dir.path(), &id, &vh.name) {
                failures.push(format!("round {round}: {e}"));
            }
        }
        if last_sample.elapsed() >= Duration::from_secs(10) {
            last_sample = Instant::now();
            match follower.try_wait().expect("wait") {
                Some(s) => {
                    follower_restarts += 1;
                    println!("round {round}: the follower exited ({s}); started again");
                    follower = spawn_follow();
                }
                None => follower_usage.extend(Usage::of(follower.id())),
            }
        }
        println!(
            "round {round} [{:>4} s]: {fault} at {} ms -> {code:?} after {tries} rerun(s); peak rss {} KiB, {} threads, {} fds",
            started.elapsed().as_secs(),
            delay.as_millis(),
            usage.rss_kb,
            usage.threads,
            usage.fds
        );
    }
    stop.store(true, Ordering::SeqCst);
    let [published, acked, stream_published] = load.map(|t| t.join().unwrap());
    // The follower ends on SIGTERM and its backup must validate.
    sigterm(follower.id());
    let end = follower.wait().expect("follower");
    let v = run_cli(&[
        "validate",
        "--path",
        &format!("file://{}", dir.path().join("store").display()),
        "--backup-id",
        "follow",
        "--deep",
    ]);
    if v.status.code() != Some(0) {
        failures.push(format!("follower: validate --deep: {:?}", text(&v)));
    }
    for name in ["fixed-c", "fixed-q"] {
        if let Err(e) = fixed_whole(&check_conn, name) {
            failures.push(format!("at the end: {e}"));
        }
    }
    let rss: Vec<u64> = runs.iter().map(|u| u.rss_kb).collect();
    let threads: Vec<u64> = runs.iter().map(|u| u.threads).collect();
    let fds: Vec<u64> = runs.iter().map(|u| u.fds).collect();
    let f_rss: Vec<u64> = follower_usage.iter().map(|u| u.rss_kb).collect();
    let f_threads: Vec<u64> = follower_usage.iter().map(|u| u.threads).collect();
    let f_fds: Vec<u64> = follower_usage.iter().map(|u| u.fds).collect();
    for r in [
        flat("backup peak RSS (KiB)", &rss, 1.5, 20_000),
        flat("backup threads", &threads, 1.0, 4),
        flat("backup open files", &fds, 1.0, 8),
        flat("follower RSS (KiB)", &f_rss, 1.3, 10_000),
        flat("follower threads", &f_threads, 1.0, 2),
        flat("follower open files", &f_fds, 1.0, 4),
    ] {
        if let Err(e) = r {
            failures.push(e);
        }
    }
    println!(
        "\n=== soak report ({} s, seed {seed}) ===",
        started.elapsed().as_secs()
    );
    println!("rounds {round}, reruns {reruns}, restores compared {restored}");
    println!("faults: {faults:?}");
    for (o, n) in &outcomes {
        println!("  {n:>3} x {o}");
    }
    println!("load: live published {published} acked {acked}, stream published {stream_published}");
    println!(
        "follower: exit {end}, restarts {follower_restarts}, samples {}",
        follower_usage.len()
    );
    println!("  rss KiB {f_rss:?}\n  threads {f_threads:?}\n  fds {f_fds:?}");
    println!("backup runs: peak rss KiB {rss:?}\n  threads {threads:?}\n  fds {fds:?}");
    println!("failures: {}", failures.len());
    for f in &failures {
        println!("  - {f}");
    }
    assert!(
        failures.is_empty(),
        "{} invariant(s) broken",
        failures.len()
    );
}

fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}
