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

mod bench_common;

use bench_common::*;
use rmq_backup::amqp::FieldTable;
use rmq_backup::management::ManagementClient;
use std::time::Duration;

const ROUNDS: usize = 5;

fn main() {
    let a = Args::parse();
    let (bin, n, size, text, kind) = (a.bin.clone(), a.n, a.size, a.text, a.kind());
    let compression = std::env::var("BENCH_COMPRESSION").unwrap_or_else(|_| "zstd".into());
    let mgmt = ManagementClient::new(MGMT, "guest", "guest").expect("management");
    let (src, dst, raw) = ("rmqb-bench-src", "rmqb-bench-dst", "rmqb-bench-raw");
    for v in [src, dst, raw] {
        fresh_vhost(&mgmt, v);
    }
    let work = std::env::temp_dir().join(format!("rmqb-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let store = work.join("store");
    let sconn = seed(src, &a);

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
