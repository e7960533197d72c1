//! Shared by the benchmark examples (`bench`, `storage_bench`): seeding, the raw client's read
//! and publish, and running rmq-backup with its peak RSS.
#![allow(dead_code)]

use rmq_backup::amqp::{
    AmqpUrl, BasicProperties, ConnectOptions, Connection, FieldTable, FieldValue,
};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672";
pub const MGMT: &str = "http://127.0.0.1:15672";

pub fn connect(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&format!("{AMQP}/{vhost}")).expect("url");
    Connection::open(&ConnectOptions::new(url)).expect("connect")
}

pub fn headers(i: usize) -> FieldTable {
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

pub fn publish(conn: &Connection, queue: &str, n: usize, size: usize, text: bool) -> Duration {
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

/// The two timings of one raw read (see [`raw_read`]).
pub struct RawRead {
    /// From the first consume to the last delivery.
    pub delivered: Duration,
    /// From the first consume until every message is back in the queue (channels closed, the
    /// ready count is the whole depth again): the same job as a backup's read.
    pub whole: Duration,
}

/// Reads all `n` messages of `queue` without acks (sequential 65,535-message consumer windows),
/// then gives them back by closing the channels and waits until the queue's ready count is `n`
/// again, so that the next measurement starts on a settled queue.
pub fn raw_read(conn: &Connection, queue: &str, n: usize) -> RawRead {
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
    let delivered = started.elapsed();
    for ch in channels {
        ch.close().expect("close");
    }
    // Polled like rmq-backup's reader polls: from 1 ms, doubling up to 50 ms; at most 60 s.
    let control = conn.open_channel().expect("channel");
    let mut pause = Duration::from_millis(1);
    while (control
        .queue_declare_passive(queue)
        .expect("declare")
        .message_count as usize)
        < n
    {
        assert!(
            started.elapsed() < delivered + Duration::from_secs(60),
            "the raw read's messages did not come back within 60 s"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    let whole = started.elapsed();
    control.close().expect("close");
    RawRead { delivered, whole }
}

/// What one run of rmq-backup took.
pub struct ToolRun {
    pub wall: Duration,
    /// Peak RSS in KiB (VmHWM, polled every 20 ms).
    pub peak_kib: u64,
    /// CPU seconds, user + system (`/proc/<pid>/stat`, polled every 20 ms: the last 20 ms may
    /// be missing).
    pub cpu_secs: f64,
}

/// Runs rmq-backup, returning its wall time and peak RSS in KiB (VmHWM polled every 20 ms).
pub fn run_tool(bin: &str, args: &[&str]) -> (Duration, u64) {
    let r = run_tool_measured(bin, args, &[]);
    (r.wall, r.peak_kib)
}

/// [`run_tool`] with extra environment variables.
pub fn run_tool_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (Duration, u64) {
    let r = run_tool_measured(bin, args, env);
    (r.wall, r.peak_kib)
}

/// User + system CPU seconds of process `pid` so far (fields 14 and 15 of `/proc/<pid>/stat`).
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    // Clock ticks: 100 per second on Linux (USER_HZ).
    Some((utime + stime) / 100.0)
}

/// Runs rmq-backup and measures it (wall time, peak RSS, CPU seconds).
pub fn run_tool_measured(bin: &str, args: &[&str], env: &[(&str, &str)]) -> ToolRun {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rmq-backup");
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let mut cpu = 0f64;
    loop {
        if let Some(c) = cpu_secs(child.id()) {
            cpu = c;
        }
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
            return ToolRun {
                wall: took,
                peak_kib: peak,
                cpu_secs: cpu,
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The command line of the benchmarks: `<path to rmq-backup> [messages=100000]
/// [body bytes=1024] [random|text]`.
pub struct Args {
    pub bin: String,
    pub n: usize,
    pub size: usize,
    pub text: bool,
}

impl Args {
    pub fn parse() -> Args {
        let args: Vec<String> = std::env::args().collect();
        Args {
            bin: args
                .get(1)
                .cloned()
                .unwrap_or_else(|| "target/release/rmq-backup".into()),
            n: args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000),
            size: args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024),
            text: args.get(4).map(String::as_str) == Some("text"),
        }
    }

    /// `JSON-like text` or `random`.
    pub fn kind(&self) -> &'static str {
        if self.text {
            "JSON-like text"
        } else {
            "random"
        }
    }
}

/// Deletes `vhost` if present and creates it afresh with permissions for guest.
pub fn fresh_vhost(mgmt: &rmq_backup::management::ManagementClient, vhost: &str) {
    let _ = mgmt.delete_vhost(vhost);
    mgmt.create_vhost(vhost).expect("vhost");
    mgmt.set_permissions(vhost, "guest").expect("permissions");
}

/// The queue type of the benchmark: `BENCH_QUEUE_TYPE` (`classic`, the default, or `quorum`).
pub fn queue_type() -> String {
    std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".into())
}

/// The arguments that declare a queue of [`queue_type`].
pub fn queue_args() -> FieldTable {
    match queue_type().as_str() {
        "classic" => FieldTable::new(),
        other => vec![(
            "x-queue-type".into(),
            rmq_backup::amqp::FieldValue::LongString(other.as_bytes().to_vec()),
        )],
    }
}

/// Declares the queue `bench` ([`queue_type`]) in `vhost`, publishes `a.n` messages into it,
/// and returns the connection.
pub fn seed(vhost: &str, a: &Args) -> Connection {
    println!(
        "seeding {} x {} B {} messages (20 headers) into a {} queue ...",
        a.n,
        a.size,
        a.kind(),
        queue_type()
    );
    let conn = connect(vhost);
    let ch = conn.open_channel().expect("channel");
    ch.queue_declare("bench", true, false, false, &queue_args())
        .expect("declare");
    ch.close().expect("close");
    publish(&conn, "bench", a.n, a.size, a.text);
    conn
}
