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
//! 2b. with bodies of 16 KiB or more (or `BENCH_STORE_CEILING=1`), the store ceiling
//!    (`bench/store_ceiling.rs`): the raw read again, each body written to a file in the same
//!    storage directory and SHA-256'd, to the queue whole again and the file synced: the least
//!    a verified backup must do;
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
//! `BENCH_COMPARE_BIN=<another rmq-backup>`: each round also backs up the same queue and
//! restores the same backup with that binary, right after the first one, and the CPU seconds
//! of both are printed side by side (an
//! A/B of a change on the same machine in the same minutes; this machine's speed moves 10-50%
//! between hours).
//!
//! Each measurement runs `BENCH_ROUNDS` times (default 5), raw and rmq-backup alternating;
//! medians are printed, and the median of the per-round ratios. On this 2-core machine the
//! broker's read speed is bimodal from one run to the next (~17k or ~40k msg/s for 1 KiB classic
//! messages, depending on where the kernel puts the threads), so single rounds say little.

mod bench_common;
#[path = "../bench/store_ceiling.rs"]
mod store_ceiling;

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

/// The reference tool's backup CPU seconds per 100,000 messages of 1 KiB (issue 41, measured
/// on RabbitMQ 3.10.8), printed when the tool is not built here (it takes ~45 minutes).
const ISSUE_REFERENCE_CPU: f64 = 4.8;

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5)
        .max(1);
    let a = Args::parse();
    let (bin, n, size, text, kind) = (a.bin.clone(), a.n, a.size, a.text, a.kind());
    let compression = std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "zstd".into());
    // Segment format version of the backups (`BENCH_SEGMENT_VERSION`, default 1; at least 2
    // under BENCH_PROTOCOL=amqp10, version 1 cannot hold AMQP 1.0 records).
    let segment_version: u8 = std::env::var("BENCH_SEGMENT_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1u8)
        .max(if bench_common::amqp10::amqp10_mode() {
            2
        } else {
            1
        });
    // zstd level (`BENCH_LEVEL`, default 3).
    let level: i32 = std::env::var("BENCH_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // The broker: BENCH_AMQP / BENCH_MGMT (default RabbitMQ 3.10.8 on 5672 / 15672).
    let (amqp, mgmt_url) = (bench_amqp(), bench_mgmt());
    let mgmt = ManagementClient::new(&mgmt_url, "guest", "guest", None).expect("management");
    let broker_version = mgmt
        .overview()
        .ok()
        .and_then(|o| o.broker_version)
        .unwrap_or_else(|| "?".into());
    println!("RabbitMQ {broker_version} ({amqp})");
    // BENCH_PROTOCOL=amqp10: seed, raw references, backup and restore over AMQP 1.0 (RabbitMQ
    // 4.0+, where rmq-backup reads `backup.amqp10_queues` over AMQP 1.0).
    let amqp10 = bench_common::amqp10::amqp10_mode();
    let protocol = if amqp10 { "amqp10" } else { "amqp091" };
    if amqp10 && bench_common::amqp10::major(&broker_version) < 4 {
        println!("skipped: BENCH_PROTOCOL=amqp10 needs RabbitMQ 4.0 or later (rmq-backup reads queues over AMQP 1.0 from 4.0 on), this broker is {broker_version}");
        return;
    }
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
    let enc = amqp10.then(|| bench_common::amqp10::Encoded::new(&msgs));
    let sconn = match &enc {
        Some(enc) => bench_common::amqp10::seed10(src, &a, enc),
        None => seed(src, &a, &msgs),
    };

    // Raw read and backup alternate, `rounds` times each, on the same queue.
    let (mut raw_reads, mut raw_wholes, mut backups, mut backup_rss) =
        (Vec::new(), Vec::new(), Vec::new(), 0);
    let (mut backup_cpu, mut restore_cpu) = (Vec::new(), Vec::new());
    // The store ceiling: large bodies by default (its cost beside the raw read is in them).
    let store_ceiling = match std::env::var("BENCH_STORE_CEILING").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => size >= 16 * 1024,
    };
    let mut stores = Vec::new();
    // The reference tool (bench/reference, rabbitmq-backup-core 0.2.0), when built:
    // BENCH_REFERENCE_BIN (scripts/bench.sh sets it when its binary exists).
    let reference_bin = std::env::var("BENCH_REFERENCE_BIN")
        .ok()
        .filter(|b| std::path::Path::new(b).exists());
    let mut reference_cpu = Vec::new();
    let compare_bin = std::env::var("BENCH_COMPARE_BIN")
        .ok()
        .filter(|b| !b.is_empty());
    let mut compare_backup_cpu = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(1));
        let raw = if amqp10 {
            assert_eq!(queues.len(), 1, "BENCH_PROTOCOL=amqp10 reads one queue");
            bench_common::amqp10::raw_read10(src, &sconn, "bench", n)
        } else if queues.len() == 1 {
            raw_read(&sconn, "bench", n)
        } else {
            raw_read_parallel(src, &queues, per_queue)
        };
        raw_reads.push(rate(n, raw.delivered));
        raw_wholes.push(rate(n, raw.whole));
        println!(
            "round {}: raw read (own client, no acks, {}): {:.0} msg/s to the last delivery, {:.0} msg/s to the queue whole again",
            round + 1,
            if amqp10 {
                "one AMQP 1.0 link with credit for every message"
            } else {
                "65,535-message windows"
            },
            raw_reads[round],
            raw_wholes[round]
        );
        if store_ceiling && queues.len() == 1 && !amqp10 {
            std::thread::sleep(Duration::from_secs(1));
            std::fs::create_dir_all(&store).expect("store dir");
            let file = store.join(format!("store-ceiling-{round}"));
            let r = store_ceiling::store_read(&sconn, "bench", n, &file);
            stores.push(rate(n, r.whole));
            println!(
                "round {}: store ceiling (the raw read, each body written to a file in the storage directory and SHA-256'd, fsync): {:.0} msg/s to the queue whole again and the file synced",
                round + 1,
                stores[round]
            );
        }
        std::thread::sleep(Duration::from_secs(1));
        let cfg = work.join(format!("backup-{round}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "mode: backup\nbackup_id: bench-{round}\nsource:\n  amqp_url: \"{amqp}/{src}\"\n  management_url: \"{mgmt_url}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{src}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  compression: {compression}\n  compression_level: {level}\n  include_definitions: false\n  max_concurrent_queues: {concurrency}\n  segment_version: {segment_version}\n{}",
                store.display(),
                if amqp10 { "  amqp10_queues: [\"*\"]\n" } else { "" }
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
        if let Some(other) = &compare_bin {
            // The same backup by the other binary, right after (its own backup id).
            std::thread::sleep(Duration::from_secs(1));
            let text = std::fs::read_to_string(&cfg).expect("config");
            let ccfg = work.join(format!("compare-{round}.yaml"));
            std::fs::write(
                &ccfg,
                text.replace(&format!("bench-{round}\n"), &format!("compare-{round}\n")),
            )
            .expect("config");
            let run =
                run_tool_measured(other, &["backup", "--config", ccfg.to_str().unwrap()], &[]);
            compare_backup_cpu.push(run.cpu_secs * 100_000.0 / n as f64);
        }
        if let Some(reference) = reference_bin.as_ref().filter(|_| !amqp10) {
            // The same configuration without this tool's own key (segment_version), a backup
            // id of its own.
            std::thread::sleep(Duration::from_secs(1));
            let text = std::fs::read_to_string(&cfg).expect("config");
            let text = text
                .replace(&format!("bench-{round}\n"), &format!("reference-{round}\n"))
                .replace(&format!("  segment_version: {segment_version}\n"), "");
            let rcfg = work.join(format!("reference-{round}.yaml"));
            std::fs::write(&rcfg, text).expect("config");
            let args = ["backup", rcfg.to_str().unwrap()];
            match std::panic::catch_unwind(|| run_tool_measured(reference, &args, &[])) {
                Ok(run) => reference_cpu.push(run.cpu_secs * 100_000.0 / n as f64),
                Err(_) => println!("round {}: the reference tool failed", round + 1),
            }
        }
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
            "mode: restore\nbackup_id: bench-0\ntarget:\n  amqp_url: \"{amqp}/%2f\"\n  management_url: \"{mgmt_url}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  max_concurrent_queues: {concurrency}\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{src}\": \"{dst}\"\n",
            store.display()
        ),
    )
    .expect("config");
    let (mut raw_pubs, mut restores, mut restore_rss) = (Vec::new(), Vec::new(), 0);
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
        let took = match &enc {
            Some(enc) => bench_common::amqp10::publish_parallel10(raw, &queues, per_queue, enc),
            None => publish_parallel(raw, &queues, per_queue, &msgs),
        };
        raw_pubs.push(rate(n, took));
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
        "{n} x {size} B {kind} bodies, {} {} queue(s) (max_concurrent_queues {concurrency}), filesystem, {compression}-{level}, over {protocol}; medians of {rounds} rounds",
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
    if !stores.is_empty() {
        row(
            "store ceiling (raw read + write + SHA-256)",
            &stores,
            None,
            "",
        );
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
    if !stores.is_empty() {
        row("  backup / store ceiling", &backups, Some(&stores), "");
    }
    // The reference tool's backup CPU: measured in this run when built, else the issue's
    // figure (issue 41: 100,000 x 1 KiB on RabbitMQ 3.10.8, 4.8 CPU-s).
    let (reference, measured) = if reference_cpu.is_empty() {
        (ISSUE_REFERENCE_CPU, false)
    } else {
        (median(reference_cpu.clone()), true)
    };
    if measured || size == 1024 {
        println!(
            "reference tool (rabbitmq-backup-core 0.2.0) backup CPU-s/100k: {reference:.2} ({}); rmq-backup backup CPU / reference: {:.2}",
            if measured { "measured in this run" } else { "not built: issue 41's figure, 100,000 x 1 KiB on RabbitMQ 3.10.8" },
            median(backup_cpu.clone()) / reference
        );
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
            "backup CPU seconds per 100,000 messages, round by round: {bin} {} (median {:.2}); {other} {} (median {:.2})",
            list(&backup_cpu),
            median(backup_cpu.clone()),
            list(&compare_backup_cpu),
            median(compare_backup_cpu.clone())
        );
        println!(
            "restore CPU seconds per 100,000 messages, round by round: {bin} {} (median {:.2}); {other} {} (median {:.2})",
            list(&restore_cpu),
            median(restore_cpu.clone()),
            list(&compare_cpu),
            median(compare_cpu.clone())
        );
    }
    // One line for scripts/bench.sh matrix.
    let json = serde_json::json!({
        "messages": n,
        "protocol": protocol,
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
        "store_ceiling_msg_s": (!stores.is_empty()).then(|| median(stores.clone()).round()),
        "backup_ratio_to_store_ceiling": (!stores.is_empty()).then(|| median(backups.iter().zip(&stores).map(|(r, b)| r / b).collect())),
        "broker": broker_version,
        "backup_msg_s": median(backups.clone()).round(),
        "backup_ratio": median(backups.iter().zip(&raw_wholes).map(|(r, b)| r / b).collect()),
        "backup_cpu_s_per_100k": median(backup_cpu.clone()),
        "reference_cpu_s_per_100k": (measured || size == 1024).then_some(reference),
        "reference_measured": measured,
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
