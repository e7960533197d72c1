//! The cluster shape (issue "Clusters and scale-out"): a backup of the three-node test cluster
//! (`scripts/setup-rabbitmq-cluster.sh`) beside raw references, in one run, with the bytes that
//! crossed between nodes.
//!
//! Usage: `cluster_bench <rmq-backup> [messages per queue=10000] [body bytes=1024]`
//! (`scripts/bench.sh cluster`). Six classic queues, two declared through each node (so living
//! there). Each shape runs `BENCH_ROUNDS` (2) times; medians are printed:
//!
//! - raw local: six threads, each one connection to its queue's node, opened (with its
//!   channels and qos) before the clock; they start together, each consumes its queue without
//!   acks and gives it back (`bench_common::run_reads`), timed to the last queue whole again;
//! - raw through rmqc1: the same, every connection to rmqc1;
//! - rmq-backup, one worker, `node_local_reads` true, then false (`max_concurrent_queues: 6`);
//! - rmq-backup, three workers (`backup.shard`, three processes at once, two queues each).
//!
//! Bytes between nodes: the sum of every node's `cluster_links` `send_bytes` (`/api/nodes`),
//! before and after each run, read once the management API's statistics have caught up (6 s).

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::*;
use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection, FieldTable};
use rmq_backup::broker::management::ManagementClient;
use std::time::{Duration, Instant};

const VHOST: &str = "rmqb-bench-cluster";

fn amqp(n: u8) -> String {
    format!("amqp://guest:guest@127.0.0.1:570{n}/{VHOST}")
}

fn mgmt_url(n: u8) -> String {
    format!("http://127.0.0.1:1570{n}")
}

fn node_conn(n: u8) -> Connection {
    Connection::open(&ConnectOptions::new(AmqpUrl::parse(&amqp(n)).unwrap())).expect("connect")
}

/// Bytes every node has sent to the others so far.
fn inter_node_bytes() -> u64 {
    std::thread::sleep(Duration::from_secs(6));
    let mut r = ureq::get(&format!("{}/api/nodes", mgmt_url(1)))
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call()
        .expect("nodes");
    let nodes: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    nodes
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["cluster_links"].as_array().cloned().unwrap_or_default())
        .filter(|l| l["name"].as_str().is_some_and(|s| s.starts_with("rmqc")))
        .map(|l| l["send_bytes"].as_u64().unwrap_or(0))
        .sum()
}

fn config(dir: &std::path::Path, id: &str, local: bool, shard: Option<u32>) -> String {
    let urls = (1..=3)
        .map(|n| format!("\"{}\"", amqp(n)))
        .collect::<Vec<_>>();
    let mgmt = (1..=3)
        .map(|n| format!("\"{}\"", mgmt_url(n)))
        .collect::<Vec<_>>();
    let (concurrent, shard_yaml) = match shard {
        Some(i) => (2, format!("  shard: {{index: {i}, count: 3}}\n")),
        None => (6, String::new()),
    };
    let yaml = format!(
        "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: [{}]\n  management_url: [{}]\n  management_username: guest\n  management_password: guest\n  node_local_reads: {local}\n  queues:\n    vhosts: [\"{VHOST}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n  max_concurrent_queues: {concurrent}\n{shard_yaml}",
        urls.join(", "),
        mgmt.join(", "),
        dir.join("store").display()
    );
    // One file per worker (the three shard workers run at once).
    let path = dir.join(match shard {
        Some(i) => format!("{id}-shard-{i}.yaml"),
        None => format!("{id}.yaml"),
    });
    std::fs::write(&path, yaml).expect("config");
    path.display().to_string()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .expect("usage: cluster_bench <rmq-backup> [per queue] [bytes]");
    let per_queue: usize = args
        .get(2)
        .map_or(10_000, |v| v.parse().expect("per queue"));
    let size: usize = args.get(3).map_or(1024, |v| v.parse().expect("bytes"));
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mgmt = ManagementClient::new(&mgmt_url(1), "guest", "guest", None).expect("management");
    fresh_vhost(&mgmt, VHOST);
    let queues: Vec<(String, u8)> = (1..=3u8)
        .flat_map(|n| (0..2).map(move |i| (format!("on-{n}-{i}"), n)))
        .collect();
    println!("seeding 6 queues x {per_queue} x {size} B on the test cluster ...");
    let msgs = Messages::generate(per_queue, size, true);
    for (q, n) in &queues {
        let conn = node_conn(*n);
        let ch = conn.open_channel().expect("channel");
        ch.queue_declare(q, true, false, false, &FieldTable::new())
            .expect("declare");
        publish(&conn, q, per_queue, &msgs);
        let _ = conn.close();
    }
    let total = queues.len() * per_queue;
    let dir = std::env::temp_dir().join(format!("rmqb-cluster-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");

    let raw = |through: Option<u8>| -> Duration {
        let conns: Vec<Connection> = queues
            .iter()
            .map(|(_, n)| node_conn(through.unwrap_or(*n)))
            .collect();
        let reads = queues
            .iter()
            .zip(&conns)
            .map(|((q, _), conn)| prepare_read(conn, q, per_queue))
            .collect();
        run_reads(reads).whole
    };
    let mut results: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut record = |name: &'static str, secs: f64, bytes: u64| {
        match results.iter_mut().find(|r| r.0 == name) {
            Some(r) => {
                r.1.push(secs);
                r.2.push(bytes as f64);
            }
            None => results.push((name, vec![secs], vec![bytes as f64])),
        }
        println!(
            "  {name}: {secs:.2} s, {:.1} MB between nodes",
            bytes as f64 / 1e6
        );
    };
    for round in 0..rounds {
        println!("round {round}");
        let b = inter_node_bytes();
        let t = raw(None);
        record(
            "raw, each queue through its node",
            t.as_secs_f64(),
            inter_node_bytes() - b,
        );
        let b = inter_node_bytes();
        let t = raw(Some(1));
        record(
            "raw, every queue through rmqc1",
            t.as_secs_f64(),
            inter_node_bytes() - b,
        );
        for (name, local) in [
            ("rmq-backup, 1 worker, node-local", true),
            ("rmq-backup, 1 worker, through the first URL", false),
        ] {
            let cfg = config(&dir, &format!("b{round}-{local}"), local, None);
            let b = inter_node_bytes();
            let r = run_tool_measured(bin, &["backup", "--config", &cfg], &[]);
            record(name, r.wall.as_secs_f64(), inter_node_bytes() - b);
        }
        let id = format!("s{round}");
        let cfgs: Vec<String> = (0..3).map(|i| config(&dir, &id, true, Some(i))).collect();
        let b = inter_node_bytes();
        let started = Instant::now();
        std::thread::scope(|s| {
            for cfg in &cfgs {
                s.spawn(move || run_tool_measured(bin, &["backup", "--config", cfg], &[]));
            }
        });
        record(
            "rmq-backup, 3 workers (shards), node-local",
            started.elapsed().as_secs_f64(),
            inter_node_bytes() - b,
        );
    }
    let raw_local = median(results[0].1.clone());
    println!("\n6 queues x {per_queue} x {size} B ({total} messages), medians of {rounds}:");
    println!("| shape | time | msg/s | time / time of raw, each queue through its node | MB between nodes |");
    println!("|---|---|---|---|---|");
    for (name, secs, bytes) in &results {
        let t = median(secs.clone());
        println!(
            "| {name} | {t:.2} s | {:.0} | {:.2} | {:.1} |",
            total as f64 / t,
            t / raw_local,
            median(bytes.clone()) / 1e6
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = mgmt.delete_vhost(VHOST);
}
