//! Throughput benchmark: rmq-backup against a raw client (the project's own AMQP client) on the
//! same broker, in the same run. Run it with `scripts/bench.sh` (release build).
//!
//! 0. generate the messages (bodies, properties, 20 headers) before any clock starts
//!    (`Messages`: all of them, or a pool of at most 256 MiB cycled through); the seed, the raw
//!    publish and the compression ceiling's records all come from it;
//! 1. seed a classic queue (or `BENCH_QUEUE_TYPE`) with N messages of S bytes and 20 headers
//!    (or `BENCH_QUEUES` queues of N / BENCH_QUEUES messages each; `max_concurrent_queues` is
//!    then `BENCH_CONCURRENCY`, default 4, and the raw client reads and publishes every queue
//!    at once, one connection each);
//! 2. raw read: with its channels and qos opened before the clock, consume all N without acks
//!    (sequential 65,535 windows), then give them back by closing the channels and wait until
//!    the queue is whole again. Two times are kept: to the last delivery, and to the queue
//!    whole again (the same job as a backup's read, which must leave the queue as it found it);
//! 3. `rmq-backup backup` of that queue to the filesystem (zstd-3; segment format version
//!    `BENCH_SEGMENT_VERSION`, default 1);
//! 4. raw publish with confirms (a sliding window of 1000, `RAW_CONFIRM_WINDOW`) of the same N messages into an empty queue, its
//!    connections and confirm-mode channels opened before the clock;
//! 5. `rmq-backup restore` of the backup into an empty queue (direct-to-queue, confirms);
//!
//! and prints messages/s, each ratio in its own row (backup / raw read to the queue whole again,
//! backup / raw read to the last delivery, backup / compression ceiling, restore / raw publish),
//! and each rmq-backup run's peak RSS (VmHWM) and CPU seconds. With zstd, the compression
//! ceiling: zstd at the same level compressing the same records on every core with nothing else
//! running (`compression_ceiling`).
//!
//! ```text
//! bench <path to rmq-backup> [messages=100000] [body bytes=1024] [random|text]
//! ```
//!
//! `BENCH_COMPARE_BIN=<another rmq-backup>`: each round also restores the same backup with that
//! binary, right after the first one, and the CPU seconds of both are printed side by side (an
//! A/B of a change on the same machine in the same minutes; this machine's speed moves 10-50%
//! between hours).
//!
//! Each measurement runs `BENCH_ROUNDS` times (default 5), raw and rmq-backup alternating;
//! medians are printed, and the median of the per-round ratios. On this 2-core machine the
//! broker's read speed is bimodal from one run to the next (~17k or ~40k msg/s for 1 KiB classic
//! messages, depending on where the kernel puts the threads), so single rounds say little.

mod bench_common;

use bench_common::*;
use rmq_backup::broker::management::ManagementClient;
use std::time::Duration;

/// Bytes of the files under `dir`, recursively.
fn walk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk_bytes(&e.path()),
                    _ => e.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
        .max(1);
    let a = Args::parse();
    let (bin, n, size, text, kind) = (a.bin.clone(), a.n, a.size, a.text, a.kind());
    let compression = std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "zstd".into());
    // Segment format version of the backups (`BENCH_SEGMENT_VERSION`, default 1).
    let segment_version: u8 = std::env::var("BENCH_SEGMENT_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    // zstd level (`BENCH_LEVEL`, default 3).
    let level: i32 = std::env::var("BENCH_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mgmt = ManagementClient::new(MGMT, "guest", "guest", None).expect("management");
    // Vhosts of this process alone (another bench on the same broker deletes and creates its own).
    let pid = std::process::id();
    let names = [
        format!("rmqb-bench-src-{pid}"),
        format!("rmqb-bench-dst-{pid}"),
        format!("rmqb-bench-raw-{pid}"),
    ];
    let (src, dst, raw) = (names[0].as_str(), names[1].as_str(), names[2].as_str());
    for v in [src, dst, raw] {
        fresh_vhost(&mgmt, v);
    }
    let work = std::env::temp_dir().join(format!("rmqb-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let store = work.join("store");
    let queues = queue_names();
    let per_queue = n / queues.len();
    let n = per_queue * queues.len();
    let concurrency: usize = std::env::var("BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    // Every message (body, properties, 20 headers) before any clock: the raw publish, the seed
    // that rmq-backup backs up and restores, and the ceiling's records all come from this pool.
    let msgs = Messages::generate(n, size, text);
    println!(
        "{} distinct messages generated ahead{}",
        msgs.distinct(),
        if msgs.distinct() < n.max(1) {
            " (cycled: at most 256 MiB are held)"
        } else {
            ""
        }
    );
    // The ceiling first, while nothing else runs (a sample of at most 256 MB of record JSON).
    let ceiling = (compression == "zstd").then(|| {
        let sample = sample_records(n, &msgs, 256 << 20);
        let c = compression_ceiling(&sample, level);
        println!(
            "compression ceiling: zstd-{level} on {} cores compresses these records at {c:.0} msg/s ({} records sampled)",
            std::thread::available_parallelism().map_or(1, |c| c.get()),
            sample.len()
        );
        c
    });
    let sconn = seed(src, &a, &msgs);

    // Raw read and backup alternate, `rounds` times each, on the same queue.
    let (mut raw_reads, mut raw_wholes, mut backups, mut backup_rss) =
        (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut backup_cpu, mut restore_cpu) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(1));
        let raw = if queues.len() == 1 {
            raw_read(&sconn, "bench", n)
        } else {
            raw_read_parallel(src, &queues, per_queue)
        };
        raw_reads.push(rate(n, raw.delivered));
        raw_wholes.push(rate(n, raw.whole));
        println!(
            "round {}: raw read (own client, no acks, 65,535-message windows): {:.0} msg/s to the last delivery, {:.0} msg/s to the queue whole again",
            round + 1,
            raw_reads[round],
            raw_wholes[round]
        );
        std::thread::sleep(Duration::from_secs(1));
        let cfg = work.join(format!("backup-{round}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "mode: backup\nbackup_id: bench-{round}\nsource:\n  amqp_url: \"{AMQP}/{src}\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{src}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  compression: {compression}\n  compression_level: {level}\n  include_definitions: false\n  max_concurrent_queues: {concurrency}\n  segment_version: {segment_version}\n",
                store.display()
            ),
        )
        .expect("config");
        let run = run_tool_measured(&bin, &["backup", "--config", cfg.to_str().unwrap()], &[]);
        let (t, rss) = (run.wall, run.peak_kib);
        backup_cpu.push(run.cpu_secs * 100_000.0 / n as f64);
        backups.push(rate(n, t));
        println!(
            "round {}: rmq-backup backup: {:.0} msg/s",
            round + 1,
            backups[round]
        );
        backup_rss = backup_rss.max(rss);
    }
    drop(sconn);

    // validate --deep of the first backup: MB/s of stored bytes (segments checked in parallel).
    let stored: u64 = walk_bytes(&store.join("bench-0"));
    let run = run_tool_measured(
        &bin,
        &[
            "validate",
            "--path",
            &format!("file://{}", store.display()),
            "--backup-id",
            "bench-0",
            "--deep",
        ],
        &[],
    );
    let validate_mb_s = stored as f64 / run.wall.as_secs_f64() / 1e6;
    println!(
        "validate --deep: {:.1} MB stored in {:.2} s: {validate_mb_s:.0} MB/s, {:.2} CPU-s",
        stored as f64 / 1e6,
        run.wall.as_secs_f64(),
        run.cpu_secs
    );

    // Raw publish and restore alternate into empty queues.
    let restore_cfg = work.join("restore.yaml");
    std::fs::write(
        &restore_cfg,
        format!(
            "mode: restore\nbackup_id: bench-0\ntarget:\n  amqp_url: \"{AMQP}/%2f\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  max_concurrent_queues: {concurrency}\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{src}\": \"{dst}\"\n",
            store.display()
        ),
    )
    .expect("config");
    let (mut raw_pubs, mut restores, mut restore_rss) = (Vec::new(), Vec::new(), 0);
    let compare_bin = std::env::var("BENCH_COMPARE_BIN")
        .ok()
        .filter(|b| !b.is_empty());
    let mut compare_cpu = Vec::new();
    for round in 0..rounds {
        let rconn = connect(raw);
        let ch = rconn.open_channel().expect("channel");
        for q in &queues {
            ch.queue_declare(q, true, false, false, &queue_args())
                .expect("declare");
        }
        ch.close().expect("close");
        std::thread::sleep(Duration::from_secs(1));
        raw_pubs.push(rate(n, publish_parallel(raw, &queues, per_queue, &msgs)));
        println!(
            "round {}: raw publish with confirms (own client, sliding window {}, a connection per queue): {:.0} msg/s",
            round + 1,
            raw_confirm_window(),
            raw_pubs[round]
        );
        for q in &queues {
            let _ = mgmt.delete_queue(raw, q);
        }
        drop(rconn);
        std::thread::sleep(Duration::from_secs(1));
        let run = run_tool_measured(
            &bin,
            &["restore", "--config", restore_cfg.to_str().unwrap()],
            &[],
        );
        let (t, rss) = (run.wall, run.peak_kib);
        restore_cpu.push(run.cpu_secs * 100_000.0 / n as f64);
        restores.push(rate(n, t));
        println!(
            "round {}: rmq-backup restore: {:.0} msg/s",
            round + 1,
            restores[round]
        );
        restore_rss = restore_rss.max(rss);
        for q in &queues {
            let _ = mgmt.delete_queue(dst, q);
        }
        if let Some(other) = &compare_bin {
            std::thread::sleep(Duration::from_secs(1));
            let args = ["restore", "--config", restore_cfg.to_str().unwrap()];
            let run = run_tool_measured(other, &args, &[]);
            compare_cpu.push(run.cpu_secs * 100_000.0 / n as f64);
            for q in &queues {
                let _ = mgmt.delete_queue(dst, q);
            }
        }
    }

    println!();
    println!(
        "{n} x {size} B {kind} bodies, {} {} queue(s) (max_concurrent_queues {concurrency}), filesystem, {compression}-{level}; medians of {rounds} rounds",
        queues.len(),
        queue_type()
    );
    println!(
        "{:<52} {:>8} {:>18} {:>18}",
        "operation (ratio: of rmq-backup's msg/s to the reference's)",
        "msg/s",
        "ratio of medians",
        "median of ratios"
    );
    let row = |name: &str, rates: &[f64], base: Option<&[f64]>, note: &str| {
        let m = median(rates.to_vec());
        match base {
            None => println!("{name:<52} {m:>8.0}   {note}"),
            Some(b) => println!(
                "{name:<52} {m:>8.0} {:>18.2} {:>18.2}   {note}",
                m / median(b.to_vec()),
                median(rates.iter().zip(b).map(|(r, b)| r / b).collect())
            ),
        }
    };
    row("raw read, to the last delivery", &raw_reads, None, "");
    row("raw read, to the queue whole again", &raw_wholes, None, "");
    let ceilings: Option<Vec<f64>> = ceiling.map(|c| vec![c; rounds]);
    if let Some(c) = &ceilings {
        row("compression ceiling (zstd, all cores)", c, None, "");
    }
    let rss = format!(
        "peak RSS {backup_rss} KiB, {:.2} CPU-s/100k",
        median(backup_cpu.clone())
    );
    row("rmq-backup backup", &backups, None, &rss);
    row(
        "  backup / raw read to the queue whole again",
        &backups,
        Some(&raw_wholes),
        "",
    );
    row(
        "  backup / raw read to the last delivery",
        &backups,
        Some(&raw_reads),
        "",
    );
    if let Some(c) = &ceilings {
        row("  backup / compression ceiling", &backups, Some(c), "");
    }
    row("raw publish with confirms", &raw_pubs, None, "");
    let rss = format!(
        "peak RSS {restore_rss} KiB, {:.2} CPU-s/100k",
        median(restore_cpu.clone())
    );
    row("rmq-backup restore", &restores, None, &rss);
    row(
        "  restore / raw publish with confirms",
        &restores,
        Some(&raw_pubs),
        "",
    );
    println!("(rmq-backup times are whole-process wall times: start-up, the give-back of every message and the manifest included; the raw references time only their reads / publishes: messages built and connections, channels, confirm mode and qos opened before the clock)");
    println!(
        "CPU seconds (user + system) per 100,000 messages: backup {:.2}, restore {:.2}",
        median(backup_cpu.clone()),
        median(restore_cpu.clone())
    );
    if let Some(other) = &compare_bin {
        let list = |v: &[f64]| {
            v.iter()
                .map(|c| format!("{c:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "restore CPU seconds per 100,000 messages, round by round: {bin} {}; {other} {}",
            list(&restore_cpu),
            list(&compare_cpu)
        );
    }
    // One line for scripts/bench.sh matrix.
    let json = serde_json::json!({
        "messages": n,
        "body_bytes": size,
        "body": if text { "text" } else { "random" },
        "queue_type": queue_type(),
        "queues": queues.len(),
        "max_concurrent_queues": concurrency,
        "compression_ceiling_msg_s": ceiling.map(f64::round),
        "backup_ratio_to_lower": median(backups.iter().zip(&raw_wholes).map(|(r, b)| r / ceiling.map_or(*b, |c| b.min(c))).collect()),
        "backup_ratio_to_ceiling": ceiling.map(|c| median(backups.iter().map(|r| r / c).collect())),
        "distinct_messages": msgs.distinct(),
        "compression": compression,
        "level": level,
        "segment_version": segment_version,
        "raw_read_whole_msg_s": median(raw_wholes.clone()).round(),
        "backup_msg_s": median(backups.clone()).round(),
        "backup_ratio": median(backups.iter().zip(&raw_wholes).map(|(r, b)| r / b).collect()),
        "backup_cpu_s_per_100k": median(backup_cpu),
        "backup_peak_rss_kib": backup_rss,
        "raw_publish_msg_s": median(raw_pubs.clone()).round(),
        "restore_msg_s": median(restores.clone()).round(),
        "restore_ratio": median(restores.iter().zip(&raw_pubs).map(|(r, b)| r / b).collect()),
        "restore_cpu_s_per_100k": median(restore_cpu),
        "restore_peak_rss_kib": restore_rss,
        "validate_deep_mb_s": validate_mb_s.round(),
    });
    println!("BENCH_JSON {json}");

    for v in [src, dst, raw] {
        let _ = mgmt.delete_vhost(v);
    }
    let _ = std::fs::remove_dir_all(&work);
}
