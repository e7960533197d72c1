//! Stream backup throughput: `rmq-backup backup` of a stream over the stream protocol beside a
//! raw stream-protocol read of the same stream (the project's own client: subscribe at first,
//! credit 4, every chunk's CRC32 checked and its messages counted), in the same run.
//!
//! ```text
//! stream_bench <path to rmq-backup> [messages=100000] [body bytes=1024] [random|text]
//! ```
//! (or `scripts/bench.sh stream`). `BENCH_ROUNDS` rounds (default 3), raw and rmq-backup
//! alternating; medians are printed.

mod bench_common;

use bench_common::*;
use rmq_backup::broker::management::ManagementClient;
use rmq_backup::broker::stream::chunk::parse_chunk;
use rmq_backup::broker::stream::{OffsetSpec, StreamConnection, StreamOptions};
use std::time::{Duration, Instant};

/// The raw stream read: the connection is opened before the clock; the timed part subscribes,
/// reads and checks every chunk until `n` messages were counted.
fn raw_stream_read(vhost: &str, stream: &str, n: usize) -> Duration {
    let url = rmq_backup::broker::amqp::AmqpUrl::parse(&format!("{AMQP}/{vhost}")).expect("url");
    let conn = StreamConnection::open(&StreamOptions::from_amqp_url(&url, 5552))
        .expect("stream connection");
    let started = Instant::now();
    let sub = conn
        .subscribe(1, stream, OffsetSpec::First, 4)
        .expect("subscribe");
    let mut read = 0usize;
    while read < n {
        let chunk = sub
            .next_chunk(Duration::from_secs(30))
            .expect("chunk")
            .expect("a chunk within 30 s");
        conn.credit(1, 1).expect("credit");
        read += parse_chunk(&chunk).expect("chunk").messages().count();
    }
    let took = started.elapsed();
    conn.close().expect("close");
    took
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    let a = Args::parse();
    let (bin, n, size, text) = (a.bin.clone(), a.n, a.size, a.text);
    let mgmt = ManagementClient::new(MGMT, "guest", "guest", None).expect("management");
    let vhost = "rmqb-bench-stream";
    fresh_vhost(&mgmt, vhost);
    let conn = connect(vhost);
    let ch = conn.open_channel().expect("channel");
    let args = vec![(
        "x-queue-type".to_string(),
        rmq_backup::broker::amqp::FieldValue::LongString(b"stream".to_vec()),
    )];
    ch.queue_declare("bench", true, false, false, &args)
        .expect("declare");
    ch.close().expect("close");
    println!(
        "seeding {n} x {size} B {} messages (20 headers) into a stream ...",
        a.kind()
    );
    publish(&conn, "bench", n, &Messages::generate(n, size, text));
    drop(conn);
    std::thread::sleep(Duration::from_secs(2));

    let work = std::env::temp_dir().join(format!("rmqb-stream-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let (mut raws, mut backups, mut cpu, mut rss) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for round in 0..rounds {
        let raw = rate(n, raw_stream_read(vhost, "bench", n));
        raws.push(raw);
        println!(
            "round {}: raw stream-protocol read: {raw:.0} msg/s",
            round + 1
        );
        let cfg = work.join(format!("backup-{round}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "mode: backup\nbackup_id: sbench-{round}\nsource:\n  amqp_url: \"{AMQP}/{vhost}\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{vhost}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  stream_enabled: true\n  include_definitions: false\n",
                work.join("store").display()
            ),
        )
        .expect("config");
        let run = run_tool_measured(&bin, &["backup", "--config", cfg.to_str().unwrap()], &[]);
        backups.push(rate(n, run.wall));
        cpu.push(run.cpu_secs * 100_000.0 / n as f64);
        rss = rss.max(run.peak_kib);
        println!(
            "round {}: rmq-backup backup (stream protocol): {:.0} msg/s",
            round + 1,
            backups[round]
        );
    }
    let ratio = median(backups.iter().zip(&raws).map(|(b, r)| b / r).collect());
    println!();
    println!(
        "{n} x {size} B {} bodies in one stream, filesystem, zstd-3; medians of {rounds} rounds",
        a.kind()
    );
    println!(
        "raw stream-protocol read      {:>8.0} msg/s",
        median(raws.clone())
    );
    println!(
        "rmq-backup backup             {:>8.0} msg/s  backup/raw read {ratio:.2}  {:.2} CPU-s/100k  peak RSS {} KiB",
        median(backups.clone()),
        median(cpu),
        rss
    );
    let _ = mgmt.delete_vhost(vhost);
    let _ = std::fs::remove_dir_all(&work);
}
