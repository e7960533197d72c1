//! Throughput benchmark: rmq-backup against a raw client (the project's own AMQP client) on the
//! same broker, in the same run. Run it with `scripts/bench.sh` (release build).
//!
//! 1. seed a classic queue with N messages of S bytes and 20 headers;
//! 2. raw read: consume all N without acks (sequential 65,535 windows), then give them back;
//! 3. `rmq-backup backup` of that queue to the filesystem (zstd-3);
//! 4. raw publish with confirms (window 1000) of N messages of S bytes into an empty queue;
//! 5. `rmq-backup restore` of the backup into an empty queue (direct-to-queue, confirms);
//!
//! and prints messages/s, the ratios, and each rmq-backup run's peak RSS (VmHWM).
//!
//! ```text
//! bench <path to rmq-backup> [messages=100000] [body bytes=1024] [random|text]
//! ```
//!
//! Each measurement runs five times, raw and rmq-backup alternating; medians are printed.

use rmq_backup::amqp::{
    AmqpUrl, BasicProperties, ConnectOptions, Connection, FieldTable, FieldValue,
};
use rmq_backup::management::ManagementClient;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672";
const MGMT: &str = "http://127.0.0.1:15672";

fn connect(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&format!("{AMQP}/{vhost}")).expect("url");
    Connection::open(&ConnectOptions::new(url)).expect("connect")
}

fn headers(i: usize) -> FieldTable {
    (0..20)
        .map(|h| {
            let v = match h % 4 {
                0 => FieldValue::LongString(format!("value-{h}-{i}").into_bytes()),
                1 => FieldValue::I64((i * h) as i64),
                2 => FieldValue::Bool(h % 3 == 0),
                _ => FieldValue::I32(h as i32),
            };
            (format!("header-{h}"), v)
        })
        .collect()
}

fn publish(conn: &Connection, queue: &str, n: usize, size: usize, text: bool) -> Duration {
    let ch = conn.open_channel().expect("channel");
    ch.confirm_select().expect("confirm");
    // Random bodies (xorshift: compression works hardest) or JSON-like text (typical payloads).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut body = vec![0u8; size];
    let started = Instant::now();
    for i in 0..n {
        if text {
            let doc = format!(
                "{{\"order_id\":{i},\"customer\":\"c-{}\",\"status\":\"created\",\"amount\":{}.{:02},\"items\":[",
                i % 9973,
                i % 5000,
                i % 100
            );
            body.clear();
            body.extend_from_slice(doc.as_bytes());
            while body.len() < size {
                body.extend_from_slice(
                    format!(
                        "{{\"sku\":\"SKU-{}\",\"qty\":{}}},",
                        body.len() * 7 % 1000,
                        i % 9
                    )
                    .as_bytes(),
                );
            }
            body.truncate(size);
        } else {
            for b in body.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 24) as u8;
            }
        }
        let props = BasicProperties {
            delivery_mode: Some(2),
            message_id: Some(format!("m-{i}")),
            headers: Some(headers(i)),
            ..Default::default()
        };
        ch.basic_publish("", queue, true, &props, &body)
            .expect("publish");
        if ch.outstanding_confirms() >= 1000 {
            ch.wait_for_confirms(500, Duration::from_secs(60))
                .expect("confirms");
        }
    }
    ch.wait_for_confirms(0, Duration::from_secs(60))
        .expect("confirms");
    let took = started.elapsed();
    ch.close().expect("close");
    took
}

fn raw_read(conn: &Connection, queue: &str, n: usize) -> Duration {
    let started = Instant::now();
    let mut read = 0;
    let mut channels = Vec::new();
    while read < n {
        let window = (n - read).min(65_535);
        let ch = conn.open_channel().expect("channel");
        ch.basic_qos(window as u16, false).expect("qos");
        let consumer = ch
            .basic_consume(queue, "bench", false, false, &FieldTable::new())
            .expect("consume");
        for _ in 0..window {
            consumer
                .recv_timeout(Duration::from_secs(60))
                .expect("recv")
                .expect("delivery");
            read += 1;
        }
        channels.push(ch);
    }
    let took = started.elapsed();
    for ch in channels {
        ch.close().expect("close");
    }
    took
}

/// Runs rmq-backup, returning its wall time and peak RSS in KiB (VmHWM polled every 20 ms).
fn run_tool(bin: &str, args: &[&str]) -> (Duration, u64) {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rmq-backup");
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    loop {
        if let Ok(s) = std::fs::read_to_string(&status_path) {
            if let Some(kb) = s
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
            {
                peak = peak.max(kb);
            }
        }
        if let Some(status) = child.try_wait().expect("wait") {
            let took = started.elapsed();
            let mut out = String::new();
            if let Some(mut o) = child.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut o, &mut out);
            }
            print!("    {out}");
            assert!(status.success(), "rmq-backup {args:?} failed: {status}");
            return (took, peak);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

const ROUNDS: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/rmq-backup".into());
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let size: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let text = args.get(4).map(String::as_str) == Some("text");
    let compression = std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "zstd".into());
    let mgmt = ManagementClient::new(MGMT, "guest", "guest").expect("management");
    let (src, dst, raw) = ("rmqb-bench-src", "rmqb-bench-dst", "rmqb-bench-raw");
    for v in [src, dst, raw] {
        let _ = mgmt.delete_vhost(v);
        mgmt.create_vhost(v).expect("vhost");
        mgmt.set_permissions(v, "guest").expect("permissions");
    }
    let work = std::env::temp_dir().join(format!("rmqb-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let store = work.join("store");
    let kind = if text { "JSON-like text" } else { "random" };

    println!("seeding {n} x {size} B {kind} messages (20 headers) into a classic queue ...");
    let sconn = connect(src);
    let ch = sconn.open_channel().expect("channel");
    ch.queue_declare("bench", true, false, false, &FieldTable::new())
        .expect("declare");
    ch.close().expect("close");
    publish(&sconn, "bench", n, size, text);

    // Raw read and backup alternate, ROUNDS times each, on the same queue.
    let (mut raw_reads, mut backups, mut backup_rss) = (Vec::new(), Vec::new(), 0);
    for round in 0..ROUNDS {
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "round {}: raw read (own client, no acks, 65,535-message windows) ...",
            round + 1
        );
        raw_reads.push(rate(n, raw_read(&sconn, "bench", n)));
        println!("    {:.0} msg/s", raw_reads[round]);
        std::thread::sleep(Duration::from_secs(1));
        let cfg = work.join(format!("backup-{round}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "mode: backup\nbackup_id: bench-{round}\nsource:\n  amqp_url: \"{AMQP}/{src}\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{src}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  compression: {compression}\n  compression_level: 3\n  include_definitions: false\n",
                store.display()
            ),
        )
        .expect("config");
        println!("round {}: rmq-backup backup ...", round + 1);
        let (t, rss) = run_tool(&bin, &["backup", "--config", cfg.to_str().unwrap()]);
        backups.push(rate(n, t));
        println!("    {:.0} msg/s", backups[round]);
        backup_rss = backup_rss.max(rss);
    }
    drop(sconn);

    // Raw publish and restore alternate into empty queues.
    let restore_cfg = work.join("restore.yaml");
    std::fs::write(
        &restore_cfg,
        format!(
            "mode: restore\nbackup_id: bench-0\ntarget:\n  amqp_url: \"{AMQP}/%2f\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{src}\": \"{dst}\"\n",
            store.display()
        ),
    )
    .expect("config");
    let (mut raw_pubs, mut restores, mut restore_rss) = (Vec::new(), Vec::new(), 0);
    for round in 0..ROUNDS {
        let rconn = connect(raw);
        let ch = rconn.open_channel().expect("channel");
        ch.queue_declare("bench", true, false, false, &FieldTable::new())
            .expect("declare");
        ch.close().expect("close");
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "round {}: raw publish with confirms (own client, window 1000) ...",
            round + 1
        );
        raw_pubs.push(rate(n, publish(&rconn, "bench", n, size, text)));
        println!("    {:.0} msg/s", raw_pubs[round]);
        let _ = mgmt.delete_queue(raw, "bench");
        drop(rconn);
        std::thread::sleep(Duration::from_secs(1));
        println!("round {}: rmq-backup restore ...", round + 1);
        let (t, rss) = run_tool(
            &bin,
            &["restore", "--config", restore_cfg.to_str().unwrap()],
        );
        restores.push(rate(n, t));
        println!("    {:.0} msg/s", restores[round]);
        restore_rss = restore_rss.max(rss);
        let _ = mgmt.delete_queue(dst, "bench");
    }

    let (rr, bk, rp, rs) = (
        median(raw_reads),
        median(backups),
        median(raw_pubs),
        median(restores),
    );
    println!();
    println!("{n} x {size} B {kind} bodies, classic queue, filesystem, zstd-3; medians of {ROUNDS} rounds");
    println!("{:<34} {:>10} {:>8}", "operation", "msg/s", "ratio");
    println!("{:<34} {:>10.0}", "raw read (no acks)", rr);
    println!(
        "{:<34} {:>10.0} {:>8.2}   peak RSS {} KiB",
        "rmq-backup backup",
        bk,
        bk / rr,
        backup_rss
    );
    println!("{:<34} {:>10.0}", "raw publish with confirms", rp);
    println!(
        "{:<34} {:>10.0} {:>8.2}   peak RSS {} KiB",
        "rmq-backup restore",
        rs,
        rs / rp,
        restore_rss
    );
    println!("(rmq-backup times are whole-process wall times, start-up and manifest included)");

    for v in [src, dst, raw] {
        let _ = mgmt.delete_vhost(v);
    }
    let _ = std::fs::remove_dir_all(&work);
}
