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
//! bench <path to rmq-backup> [messages=100000] [body bytes=1024]
//! ```

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

fn publish(conn: &Connection, queue: &str, n: usize, size: usize) -> Duration {
    let ch = conn.open_channel().expect("channel");
    ch.confirm_select().expect("confirm");
    let body: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let started = Instant::now();
    for i in 0..n {
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "target/release/rmq-backup".into());
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let size: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let mgmt = ManagementClient::new(MGMT, "guest", "guest").expect("management");
    let (src, dst, raw) = ("rmqb-bench-src", "rmqb-bench-dst", "rmqb-bench-raw");
    for v in [src, dst, raw] {
        let _ = mgmt.delete_vhost(v);
        mgmt.create_vhost(v).expect("vhost");
        mgmt.set_permissions(v, "guest").expect("permissions");
    }
    let work = std::env::temp_dir().join(format!("rmqb-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");

    println!("seeding {n} x {size} B messages (20 headers) into a classic queue ...");
    let sconn = connect(src);
    let ch = sconn.open_channel().expect("channel");
    ch.queue_declare("bench", true, false, false, &FieldTable::new())
        .expect("declare");
    ch.close().expect("close");
    publish(&sconn, "bench", n, size);

    println!("raw read (own client, no acks, 65,535-message windows) ...");
    let raw_read_t = raw_read(&sconn, "bench", n);
    drop(sconn);
    std::thread::sleep(Duration::from_secs(2));

    let backup_cfg = work.join("backup.yaml");
    std::fs::write(
        &backup_cfg,
        format!(
            "mode: backup\nbackup_id: bench\nsource:\n  amqp_url: \"{AMQP}/{src}\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{src}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  compression: zstd\n  compression_level: 3\n  include_definitions: false\n",
            work.join("store").display()
        ),
    )
    .expect("config");
    println!("rmq-backup backup ...");
    let (backup_t, backup_rss) =
        run_tool(&bin, &["backup", "--config", backup_cfg.to_str().unwrap()]);

    println!("raw publish with confirms (own client, window 1000) ...");
    let rconn = connect(raw);
    let ch = rconn.open_channel().expect("channel");
    ch.queue_declare("bench", true, false, false, &FieldTable::new())
        .expect("declare");
    ch.close().expect("close");
    let raw_pub_t = publish(&rconn, "bench", n, size);
    drop(rconn);
    let _ = mgmt.delete_vhost(raw);

    let restore_cfg = work.join("restore.yaml");
    std::fs::write(
        &restore_cfg,
        format!(
            "mode: restore\nbackup_id: bench\ntarget:\n  amqp_url: \"{AMQP}/%2f\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{src}\": \"{dst}\"\n",
            work.join("store").display()
        ),
    )
    .expect("config");
    println!("rmq-backup restore ...");
    let (restore_t, restore_rss) = run_tool(
        &bin,
        &["restore", "--config", restore_cfg.to_str().unwrap()],
    );

    println!();
    println!("{n} x {size} B, classic queue, filesystem, zstd-3");
    println!("{:<34} {:>10} {:>8}", "operation", "msg/s", "ratio");
    println!("{:<34} {:>10.0}", "raw read (no acks)", rate(n, raw_read_t));
    println!(
        "{:<34} {:>10.0} {:>8.2}   peak RSS {} KiB",
        "rmq-backup backup",
        rate(n, backup_t),
        raw_read_t.as_secs_f64() / backup_t.as_secs_f64(),
        backup_rss
    );
    println!(
        "{:<34} {:>10.0}",
        "raw publish with confirms",
        rate(n, raw_pub_t)
    );
    println!(
        "{:<34} {:>10.0} {:>8.2}   peak RSS {} KiB",
        "rmq-backup restore",
        rate(n, restore_t),
        raw_pub_t.as_secs_f64() / restore_t.as_secs_f64(),
        restore_rss
    );
    println!("(rmq-backup times are whole-process wall times, start-up and manifest included)");

    for v in [src, dst] {
        let _ = mgmt.delete_vhost(v);
    }
    let _ = std::fs::remove_dir_all(&work);
}
