//! What TLS costs: backup and restore of the same queue on the rmqtls node of
//! `scripts/setup-rabbitmq-tls.sh`, once over its plain AMQP port (5674) and once over TLS
//! (amqps 5671), alternating, in the same run. The management API is https in both.
//!
//! Usage: `tls_bench <rmq-backup binary> [messages] [body bytes]` (`scripts/bench.sh tls`;
//! `bench_common::Args`).
//! Prints msg/s, CPU seconds per 100,000 messages and the TLS/plain ratios.

mod bench_common;

use bench_common::{
    fresh_vhost, median, publish, rate, raw_read, run_tool_measured, Args, Messages, ToolRun,
};
use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection};
use rmq_backup::broker::management::ManagementClient;
use rmq_backup::broker::tls::TlsClient;
use rmq_backup::config::TlsConfig;
use std::path::PathBuf;
use std::sync::Arc;

const VHOST: &str = "rmqb-tls-bench";

fn main() {
    rmq_backup::install_tls_provider();
    let Args { bin, n, size, .. } = Args::parse();
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let dir = PathBuf::from(
        std::env::var("RMQ_BACKUP_TLS_DIR").unwrap_or_else(|_| "/tmp/rmq-backup-tls".into()),
    );
    let ca = dir.join("ca.pem");
    let tls = Arc::new(
        TlsClient::load(
            Some(&TlsConfig {
                ca_cert: Some(ca.clone()),
                ..Default::default()
            }),
            "tls",
        )
        .expect("TLS settings (run scripts/setup-rabbitmq-tls.sh)"),
    );
    let mgmt = ManagementClient::new("https://localhost:15671", "guest", "guest", Some(&tls))
        .expect("management");
    let target = format!("{VHOST}-target");
    for v in [VHOST, target.as_str()] {
        fresh_vhost(&mgmt, v);
    }
    let plain = |vhost: &str| {
        let url = AmqpUrl::parse(&format!("amqp://guest:guest@127.0.0.1:5674/{vhost}")).unwrap();
        Connection::open(&ConnectOptions::new(url)).expect("plain connection")
    };
    let over_tls = |vhost: &str| {
        let url = AmqpUrl::parse(&format!("amqps://guest:guest@localhost:5671/{vhost}")).unwrap();
        let mut o = ConnectOptions::new(url);
        o.tls = Some(tls.clone());
        Connection::open(&o).expect("TLS connection")
    };
    let conn = plain(VHOST);
    conn.open_channel()
        .expect("channel")
        .queue_declare("q", true, false, false, &Vec::new())
        .expect("declare");
    publish(&conn, "q", n, &Messages::generate(n, size, true));
    eprintln!("published {n} x {size} B to q on rmqtls");

    let work = std::env::temp_dir().join(format!("rmqb-tls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    let mut results: Vec<(&str, Vec<ToolRun>, Vec<ToolRun>)> = vec![
        ("plain", Vec::new(), Vec::new()),
        ("tls", Vec::new(), Vec::new()),
    ];
    // The raw client (the project's AMQP client reading without the tool) over each transport,
    // timed until the queue is whole again: what the broker can deliver over it.
    let mut raw: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, (mode, backups, restores)) in results.iter_mut().enumerate() {
            let c = if i == 0 {
                plain(VHOST)
            } else {
                over_tls(VHOST)
            };
            let r = raw_read(&c, "q", n);
            raw[i].push(rate(n, r.whole));
            drop(c);
            let url = match *mode {
                "plain" => "amqp://guest:guest@127.0.0.1:5674",
                _ => "amqps://guest:guest@localhost:5671",
            };
            let id = format!("{mode}-{round}");
            let tls_block = format!("  tls:\n    ca_cert: \"{}\"\n", ca.display());
            let backup = format!(
                "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: \"{url}/\"\n  management_url: \"https://localhost:15671\"\n  management_username: guest\n  management_password: guest\n{tls_block}  queues:\n    vhosts: [\"{VHOST}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n",
                work.display()
            );
            let restore = format!(
                "mode: restore\nbackup_id: {id}\ntarget:\n  amqp_url: \"{url}/\"\n  management_url: \"https://localhost:15671\"\n  management_username: guest\n  management_password: guest\n{tls_block}storage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{VHOST}\": \"{target}\"\n",
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
            restores.push(run_tool_measured(
                &bin,
                &["restore", "--config", rcfg.to_str().unwrap()],
                &[],
            ));
            mgmt.delete_queue(&target, "q").expect("empty the target");
        }
    }
    let msg_rate = |r: &ToolRun| rate(n, r.wall);
    let cpu = |r: &ToolRun| r.cpu_secs * 100_000.0 / n as f64;
    println!("{n} x {size} B text, classic, zstd-3, {rounds} rounds (medians)");
    println!("raw read: the raw client's read to the queue whole again (every message read and given back)");
    println!("mode    raw read msg/s  backup msg/s  backup/raw read  CPU-s/100k  restore msg/s  CPU-s/100k");
    let mut rows = Vec::new();
    for (i, (mode, b, r)) in results.iter().enumerate() {
        let raw_read = median(raw[i].clone());
        print!("{mode:<7} {raw_read:>14.0}");
        let row = (
            median(b.iter().map(msg_rate).collect()),
            median(b.iter().map(cpu).collect()),
            median(r.iter().map(msg_rate).collect()),
            median(r.iter().map(cpu).collect()),
        );
        println!(
            "  {:>12.0}  {:>15.2}  {:>10.2}  {:>13.0}  {:>10.2}",
            row.0,
            row.0 / raw_read,
            row.1,
            row.2,
            row.3
        );
        rows.push(row);
    }
    println!(
        "tls/plain: raw read {:.2}, backup {:.2} (CPU {:.2}), restore {:.2} (CPU {:.2}); backup/raw read over TLS {:.2}",
        median(raw[1].clone()) / median(raw[0].clone()),
        rows[1].0 / rows[0].0,
        rows[1].1 / rows[0].1,
        rows[1].2 / rows[0].2,
        rows[1].3 / rows[0].3,
        rows[1].0 / median(raw[1].clone())
    );
    let _ = std::fs::remove_dir_all(&work);
    for v in [VHOST, target.as_str()] {
        let _ = mgmt.delete_vhost(v);
    }
}
