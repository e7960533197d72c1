//! What encryption at rest costs: backup and restore of the same queue on the local broker,
//! unencrypted and encrypted with age (`backup.encryption`, one X25519 recipient),
//! alternating, in the same run, to the filesystem (zstd-3).
//!
//! Usage: `encryption_bench <rmq-backup binary> [messages] [body bytes] [random|text]`
//! (`scripts/bench.sh encryption`; `bench_common::Args`). `BENCH_ROUNDS` rounds (default 3).
//! Prints msg/s, CPU seconds per 100,000 messages, peak RSS, stored bytes, and the
//! encrypted/plain ratios (medians).

mod bench_common;

use bench_common::{
    connect, fresh_vhost, median, publish, rate, run_tool_measured, Args, Messages, ToolRun, MGMT,
};
use rmq_backup::broker::management::ManagementClient;

const VHOST: &str = "rmqb-enc-bench";

fn main() {
    let a = Args::parse();
    let (bin, n, size, text) = (a.bin.clone(), a.n, a.size, a.text);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mgmt = ManagementClient::new(MGMT, "guest", "guest", None).expect("management");
    let target = format!("{VHOST}-target");
    for v in [VHOST, target.as_str()] {
        fresh_vhost(&mgmt, v);
    }
    let conn = connect(VHOST);
    conn.open_channel()
        .expect("channel")
        .queue_declare("q", true, false, false, &Vec::new())
        .expect("declare");
    publish(&conn, "q", n, &Messages::generate(n, size, text));
    drop(conn);
    println!("published {n} x {size} B {} to q", a.kind());

    let work = std::env::temp_dir().join(format!("rmqb-enc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let (secret, public) = rmq_backup::repository::encryption::generate();
    let identity = work.join("identity.txt");
    std::fs::write(&identity, format!("{secret}\n")).expect("identity");
    let mut results: Vec<(&str, Vec<ToolRun>, Vec<ToolRun>, u64)> = vec![
        ("plain", Vec::new(), Vec::new(), 0),
        ("age", Vec::new(), Vec::new(), 0),
    ];
    for round in 0..rounds {
        for (mode, backups, restores, stored) in results.iter_mut() {
            let id = format!("{mode}-{round}");
            let (enc_backup, enc_restore) = match *mode {
                "age" => (
                    format!("  encryption:\n    recipients: [\"{public}\"]\n"),
                    format!(
                        "  encryption:\n    identity_file: \"{}\"\n",
                        identity.display()
                    ),
                ),
                _ => (String::new(), String::new()),
            };
            let backup = format!(
                "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: \"amqp://guest:guest@127.0.0.1:5672/\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{VHOST}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n{enc_backup}",
                work.display()
            );
            let restore = format!(
                "mode: restore\nbackup_id: {id}\ntarget:\n  amqp_url: \"amqp://guest:guest@127.0.0.1:5672/\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{VHOST}\": \"{target}\"\n{enc_restore}",
                work.display()
            );
            let bcfg = work.join(format!("{id}-backup.yaml"));
            let rcfg = work.join(format!("{id}-restore.yaml"));
            std::fs::write(&bcfg, backup).unwrap();
            std::fs::write(&rcfg, restore).unwrap();
            backups.push(run_tool_measured(
                &bin,
                &["backup", "--config", bcfg.to_str().unwrap()],
                &[],
            ));
            let manifest = std::fs::read(work.join(&id).join("manifest.json")).expect("manifest");
            *stored = rmq_backup::repository::manifest::Manifest::from_json(&manifest)
                .expect("manifest")
                .total_bytes;
            restores.push(run_tool_measured(
                &bin,
                &["restore", "--config", rcfg.to_str().unwrap()],
                &[],
            ));
            mgmt.delete_queue(&target, "q").expect("empty the target");
            let _ = std::fs::remove_dir_all(work.join(&id));
        }
    }
    let msg_rate = |r: &ToolRun| rate(n, r.wall);
    let cpu = |r: &ToolRun| r.cpu_secs * 100_000.0 / n as f64;
    let rss = |r: &ToolRun| r.peak_kib as f64 / 1024.0;
    println!(
        "{n} x {size} B {}, classic, zstd-3, {rounds} rounds (medians)",
        a.kind()
    );
    println!(
        "mode   backup msg/s  CPU-s/100k  RSS MB  stored MB  restore msg/s  CPU-s/100k  RSS MB"
    );
    let mut rows = Vec::new();
    for (mode, b, r, stored) in &results {
        let row = (
            median(b.iter().map(msg_rate).collect()),
            median(b.iter().map(cpu).collect()),
            median(r.iter().map(msg_rate).collect()),
            median(r.iter().map(cpu).collect()),
        );
        println!(
            "{mode:<6} {:>12.0}  {:>10.2}  {:>6.0}  {:>9.1}  {:>13.0}  {:>10.2}  {:>6.0}",
            row.0,
            row.1,
            median(b.iter().map(rss).collect()),
            *stored as f64 / 1e6,
            row.2,
            row.3,
            median(r.iter().map(rss).collect()),
        );
        rows.push(row);
    }
    println!(
        "age/plain: backup {:.3} (CPU {:.3}), restore {:.3} (CPU {:.3})",
        rows[1].0 / rows[0].0,
        rows[1].1 / rows[0].1,
        rows[1].2 / rows[0].2,
        rows[1].3 / rows[0].3,
    );
    let _ = std::fs::remove_dir_all(&work);
    for v in [VHOST, target.as_str()] {
        let _ = mgmt.delete_vhost(v);
    }
}
