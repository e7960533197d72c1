//! Shared by the benchmark examples: the messages (generated before any clock starts), seeding,
//! the raw client's read and publish, and running rmq-backup with its peak RSS and CPU.
//!
//! The raw references do only what a raw client must inside their clocks: connections, channels,
//! confirm mode and qos are opened before, every message (body, properties, headers) is built
//! before ([`Messages`]), and the timed part publishes with confirms or reads and gives back.
#![allow(dead_code)]

pub mod amqp10;

use rmq_backup::broker::amqp::{
    AmqpUrl, BasicProperties, Channel, ConnectOptions, Connection, FieldTable, FieldValue,
};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672";
pub const MGMT: &str = "http://127.0.0.1:15672";

/// The broker's AMQP URL without vhost: `BENCH_AMQP`, else [`AMQP`] (RabbitMQ 3.10.8 here;
/// the suite's 4.3.6 is `amqp://guest:guest@127.0.0.1:5692`).
pub fn bench_amqp() -> String {
    std::env::var("BENCH_AMQP").unwrap_or_else(|_| AMQP.to_string())
}

/// The broker's management URL: `BENCH_MGMT`, else [`MGMT`] (4.3.6: `http://127.0.0.1:15692`).
pub fn bench_mgmt() -> String {
    std::env::var("BENCH_MGMT").unwrap_or_else(|_| MGMT.to_string())
}

pub fn connect(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&format!("{}/{vhost}", bench_amqp())).expect("url");
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

/// Message `i`'s body: random bytes (xorshift, `state` carries on; compression works hardest)
/// or JSON-like text (typical payloads), `size` bytes, into `body`.
fn make_body(i: usize, size: usize, text: bool, state: &mut u64, body: &mut Vec<u8>) {
    body.clear();
    if text {
        let doc = format!(
            "{{\"order_id\":{i},\"customer\":\"c-{}\",\"status\":\"created\",\"amount\":{}.{:02},\"items\":[",
            i % 9973,
            i % 5000,
            i % 100
        );
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
        body.resize(size, 0);
        for b in body.iter_mut() {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *b = (*state >> 24) as u8;
        }
    }
}

/// Message `i`'s properties: persistent, a message id and 20 headers.
fn properties(i: usize) -> BasicProperties {
    BasicProperties {
        delivery_mode: Some(2),
        message_id: Some(format!("m-{i}")),
        headers: Some(headers(i)),
        ..Default::default()
    }
}

/// The seed of the random bodies.
const BODY_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// At most this many bytes of messages are generated ahead (bodies plus [`HEADER_BYTES`] each);
/// a longer run cycles through them.
pub const POOL_BYTES: usize = 256 << 20;

/// What one message's properties and 20 headers take in memory, about.
const HEADER_BYTES: usize = 2048;

/// One message of the benchmark: properties (persistent, a message id, 20 headers) and body.
pub struct Message {
    pub properties: BasicProperties,
    pub body: Vec<u8>,
}

/// The benchmark's messages, generated before any clock starts, so that a timed loop only
/// indexes: message `i` is `pool[i % pool.len()]`. The pool holds the first `min(n, POOL_BYTES /
/// (size + HEADER_BYTES))` messages (at least one), so large shapes (1 MiB x 300, 1 KiB x
/// 1,000,000) repeat earlier messages instead of holding them all. Every side of a comparison
/// (seeding, the raw publish, the records of the compression ceiling) takes its messages from
/// the same pool, so rmq-backup and the raw client move the same content.
pub struct Messages {
    pool: Vec<Message>,
    /// Body bytes of each message.
    pub size: usize,
    /// JSON-like text bodies (else random bytes).
    pub text: bool,
}

impl Messages {
    /// Generates the pool for a run of `n` messages of `size` body bytes.
    pub fn generate(n: usize, size: usize, text: bool) -> Messages {
        let count = n.min(POOL_BYTES / (size + HEADER_BYTES)).max(1);
        let mut state = BODY_SEED;
        let pool = (0..count)
            .map(|i| {
                let mut body = Vec::with_capacity(size);
                make_body(i, size, text, &mut state, &mut body);
                Message {
                    properties: properties(i),
                    body,
                }
            })
            .collect();
        Messages { pool, size, text }
    }

    /// Message `i` (cycling through the pool).
    #[inline]
    pub fn get(&self, i: usize) -> &Message {
        &self.pool[i % self.pool.len()]
    }

    /// How many distinct messages the pool holds.
    pub fn distinct(&self) -> usize {
        self.pool.len()
    }
}

/// A channel in confirm mode on `conn`, opened before a publish clock starts.
pub fn publish_channel(conn: &Connection) -> Channel {
    let ch = conn.open_channel().expect("channel");
    ch.confirm_select().expect("confirm");
    ch
}

/// Publisher confirms the raw publisher keeps in flight: a sliding window, each publish
/// waiting only until fewer than this many are unconfirmed (`RAW_CONFIRM_WINDOW` in the
/// environment overrides it, to find the fastest).
pub fn raw_confirm_window() -> u64 {
    std::env::var("RAW_CONFIRM_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|w| *w > 0)
        .unwrap_or(1000)
}

/// The timed part of a raw publish, nothing else: messages `0..n` of `msgs` into `queue` on
/// `ch` (in confirm mode), mandatory, with a sliding window of [`raw_confirm_window`]
/// unconfirmed messages (a publish waits until one of them is confirmed, never for a whole
/// batch), and for all at the end.
pub fn publish_on(ch: &Channel, queue: &str, n: usize, msgs: &Messages) {
    let window = raw_confirm_window();
    for i in 0..n {
        let m = msgs.get(i);
        if ch.outstanding_confirms() >= window {
            ch.wait_for_confirms(window - 1, Duration::from_secs(60))
                .expect("confirms");
        }
        ch.basic_publish("", queue, true, &m.properties, &m.body)
            .expect("publish");
    }
    ch.wait_for_confirms(0, Duration::from_secs(60))
        .expect("confirms");
}

/// Publishes messages `0..n` of `msgs` into `queue` with confirms; the time covers
/// [`publish_on`] only (the channel and confirm mode are set up before).
pub fn publish(conn: &Connection, queue: &str, n: usize, msgs: &Messages) -> Duration {
    let ch = publish_channel(conn);
    let started = Instant::now();
    publish_on(&ch, queue, n, msgs);
    let took = started.elapsed();
    ch.close().expect("close");
    took
}

/// The span of parallel timed parts, each given as (its start, its end): from the first start
/// to the last end.
fn span(parts: &[(Instant, Instant)]) -> Duration {
    let first = parts.iter().map(|p| p.0).min();
    let last = parts.iter().map(|p| p.1).max();
    match (first, last) {
        (Some(a), Some(b)) => b - a,
        _ => Duration::ZERO,
    }
}

/// Publishes messages `0..per_queue` of `msgs` into each of `queues` in `vhost` at once, one
/// connection per queue. The connections and their confirm-mode channels are opened first;
/// the threads then start together (a barrier) and the time is from the first start to the
/// last queue's confirms.
pub fn publish_parallel(
    vhost: &str,
    queues: &[String],
    per_queue: usize,
    msgs: &Messages,
) -> Duration {
    let conns: Vec<Connection> = queues.iter().map(|_| connect(vhost)).collect();
    let channels: Vec<Channel> = conns.iter().map(publish_channel).collect();
    let barrier = Barrier::new(queues.len());
    let parts: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .iter()
            .zip(channels)
            .map(|(q, ch)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    publish_on(&ch, q, per_queue, msgs);
                    let done = Instant::now();
                    ch.close().expect("close");
                    (started, done)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("publish"))
            .collect()
    });
    span(&parts)
}

/// [`raw_read`] of each of `queues` in `vhost` at once, one connection per queue: every
/// connection and channel is opened first, the reads start together (a barrier), and the times
/// are from the first start to the last queue's delivery / the last queue whole again.
pub fn raw_read_parallel(vhost: &str, queues: &[String], per_queue: usize) -> RawRead {
    let conns: Vec<Connection> = queues.iter().map(|_| connect(vhost)).collect();
    let reads = conns
        .iter()
        .zip(queues)
        .map(|(c, q)| prepare_read(c, q, per_queue))
        .collect();
    run_reads(reads)
}

/// Runs prepared reads at once, one thread each, started together (a barrier); the times are
/// from the first start to the last delivery and to the last queue whole again.
pub fn run_reads(reads: Vec<PreparedRead>) -> RawRead {
    let barrier = Barrier::new(reads.len());
    let parts: Vec<(Instant, Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = reads
            .into_iter()
            .map(|r| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    let (delivered, whole) = r.run();
                    (started, delivered, whole)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("raw read"))
            .collect()
    });
    let delivered: Vec<_> = parts.iter().map(|p| (p.0, p.1)).collect();
    let whole: Vec<_> = parts.iter().map(|p| (p.0, p.2)).collect();
    RawRead {
        delivered: span(&delivered),
        whole: span(&whole),
    }
}

/// The queues of the benchmark: `bench` alone, or `bench-0` .. `bench-{n-1}` when `BENCH_QUEUES`
/// asks for several.
pub fn queue_names() -> Vec<String> {
    let n: usize = std::env::var("BENCH_QUEUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    if n == 1 {
        vec!["bench".to_string()]
    } else {
        (0..n).map(|i| format!("bench-{i}")).collect()
    }
}

/// Message `i` of `msgs` as a backup of the benchmark's queue records it (the same body,
/// properties and headers as [`publish`] sends).
pub fn bench_record(i: usize, msgs: &Messages) -> rmq_backup::repository::record::BackupRecord {
    let m = msgs.get(i);
    let d = rmq_backup::broker::amqp::Delivery {
        delivery_tag: i as u64 + 1,
        redelivered: false,
        exchange: String::new(),
        routing_key: "bench".into(),
        properties: m.properties.clone(),
        wire: None,
        body: m.body.clone(),
    };
    rmq_backup::repository::record::BackupRecord::from_delivery(
        d,
        "bench",
        "rmqb-bench-src",
        1_700_000_000_000 + i as i64,
    )
}

/// The JSON of the first of `n` [`bench_record`]s, at most `max_json_bytes` of it: a sample for
/// the compression ceiling.
pub fn sample_records(n: usize, msgs: &Messages, max_json_bytes: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut total = 0;
    for i in 0..n {
        let mut json = Vec::new();
        rmq_backup::repository::record::encode_record(&bench_record(i, msgs), &mut json);
        total += json.len() + 4;
        out.push(json);
        if total >= max_json_bytes {
            break;
        }
    }
    out
}

/// The format's compression ceiling on this machine: msg/s at which zstd at `level` compresses
/// `records` (length-prefixed, as in a segment) on every core at once with nothing else running:
/// the records are cut into one contiguous part per core, each compressed as one stream fed
/// 1 MiB at a time, like a segment writer. Best of 3.
pub fn compression_ceiling(records: &[Vec<u8>], level: i32) -> f64 {
    use std::io::Write;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = records.len().div_ceil(cores);
    let mut best = 0f64;
    for _ in 0..3 {
        let started = Instant::now();
        std::thread::scope(|s| {
            for chunk in records.chunks(part.max(1)) {
                s.spawn(move || {
                    let mut enc =
                        zstd::stream::write::Encoder::new(std::io::sink(), level).expect("zstd");
                    let mut buf = Vec::with_capacity(1 << 20);
                    for r in chunk {
                        buf.extend_from_slice(&(r.len() as u32).to_le_bytes());
                        buf.extend_from_slice(r);
                        if buf.len() >= 1 << 20 {
                            enc.write_all(&buf).expect("compress");
                            buf.clear();
                        }
                    }
                    enc.write_all(&buf).expect("compress");
                    enc.finish().expect("finish");
                });
            }
        });
        best = best.max(rate(records.len(), started.elapsed()));
    }
    best
}

/// The two timings of one raw read (see [`raw_read`]).
pub struct RawRead {
    /// From the first consume to the last delivery.
    pub delivered: Duration,
    /// From the first consume until every message is back in the queue (channels closed, the
    /// ready count is the whole depth again): the same job as a backup's read.
    pub whole: Duration,
}

/// A raw read made ready before its clock starts: one channel per 65,535-message consumer
/// window with its qos set, and a control channel for the depth polls.
pub struct PreparedRead {
    queue: String,
    n: usize,
    windows: Vec<(Channel, usize)>,
    control: Channel,
}

/// Opens the channels of a [`raw_read`] of `n` messages of `queue` on `conn` (see
/// [`PreparedRead`]).
pub fn prepare_read(conn: &Connection, queue: &str, n: usize) -> PreparedRead {
    let mut windows = Vec::new();
    let mut left = n;
    while left > 0 {
        let window = left.min(65_535);
        let ch = conn.open_channel().expect("channel");
        ch.basic_qos(window as u16, false).expect("qos");
        windows.push((ch, window));
        left -= window;
    }
    PreparedRead {
        queue: queue.to_string(),
        n,
        windows,
        control: conn.open_channel().expect("channel"),
    }
}

impl PreparedRead {
    /// The timed part: consumes every window without acks, one
    /// after the other, then gives everything back by closing the channels and polls the
    /// queue's ready count until it is `n` again (like rmq-backup's reader: from 1 ms, doubling
    /// up to 50 ms; at most 60 s). Returns when the last delivery arrived and when the queue
    /// was whole again.
    pub fn run(self) -> (Instant, Instant) {
        self.run_with(|_| {})
    }

    /// [`PreparedRead::run`], handing each delivery's body to `body` as it comes (the store
    /// ceiling of `bench/store_ceiling.rs` writes and hashes them).
    pub fn run_with(self, mut body: impl FnMut(Vec<u8>)) -> (Instant, Instant) {
        for (ch, window) in &self.windows {
            let consumer = ch
                .basic_consume(&self.queue, "bench", false, false, &FieldTable::new())
                .expect("consume");
            for _ in 0..*window {
                let d = consumer
                    .recv_timeout(Duration::from_secs(60))
                    .expect("recv")
                    .expect("delivery");
                body(d.body);
            }
        }
        let delivered = Instant::now();
        for (ch, _) in self.windows {
            ch.close().expect("close");
        }
        let mut pause = Duration::from_millis(1);
        while (self
            .control
            .queue_declare_passive(&self.queue)
            .expect("declare")
            .message_count as usize)
            < self.n
        {
            assert!(
                delivered.elapsed() < Duration::from_secs(60),
                "the raw read's messages did not come back within 60 s"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        let whole = Instant::now();
        self.control.close().expect("close");
        (delivered, whole)
    }
}

/// Reads all `n` messages of `queue` without acks (sequential 65,535-message consumer windows),
/// then gives them back by closing the channels and waits until the queue's ready count is `n`
/// again: the same job as a backup's read, which must leave the queue as it found it. The
/// channels (and their qos) are opened before the clock starts ([`prepare_read`]).
pub fn raw_read(conn: &Connection, queue: &str, n: usize) -> RawRead {
    let prepared = prepare_read(conn, queue, n);
    let started = Instant::now();
    let (delivered, whole) = prepared.run();
    RawRead {
        delivered: delivered - started,
        whole: whole - started,
    }
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

/// User + system CPU seconds of process `pid` so far (fields 14 and 15 of `/proc/<pid>/stat`).
pub fn cpu_secs(pid: u32) -> Option<f64> {
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
    // BENCH_PERF=<file>: the run is recorded by `perf record -g` into <file>.<command>.
    let mut cmd = match std::env::var("BENCH_PERF") {
        Ok(out) if !out.is_empty() => {
            let mut c = Command::new("perf");
            c.args(["record", "-q", "-g", "-o"])
                .arg(format!("{out}.{}", args.first().unwrap_or(&"run")))
                .arg("--")
                .arg(bin);
            c
        }
        _ => Command::new(bin),
    };
    let mut child = cmd
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
pub fn fresh_vhost(mgmt: &rmq_backup::broker::management::ManagementClient, vhost: &str) {
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
            rmq_backup::broker::amqp::FieldValue::LongString(other.as_bytes().to_vec()),
        )],
    }
}

/// Declares the queues of [`queue_names`] ([`queue_type`]) in `vhost`, publishes `a.n`
/// messages of `msgs` into them (`a.n / queues` each), and returns a connection to `vhost`.
pub fn seed(vhost: &str, a: &Args, msgs: &Messages) -> Connection {
    let queues = queue_names();
    println!(
        "seeding {} x {} B {} messages (20 headers) into {} {} queue(s) ...",
        a.n,
        a.size,
        a.kind(),
        queues.len(),
        queue_type()
    );
    let conn = connect(vhost);
    declare_queues(&conn, &queues);
    publish_parallel(vhost, &queues, a.n / queues.len(), msgs);
    conn
}

/// Declares `queues` (durable, `BENCH_QUEUE_TYPE`) on a channel of `conn` of their own.
pub fn declare_queues(conn: &Connection, queues: &[String]) {
    let ch = conn.open_channel().expect("channel");
    for q in queues {
        ch.queue_declare(q, true, false, false, &queue_args())
            .expect("declare");
    }
    ch.close().expect("close");
}
