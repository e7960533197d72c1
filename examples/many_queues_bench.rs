//! Many small queues (issue "Clusters and scale-out", item 6): rmq-backup beside a raw
//! single-connection client on the same local broker, in one run.
//!
//! Usage: `many_queues_bench <rmq-backup> [queues=5000] [messages per queue=4] [body bytes=512]`
//! (`scripts/bench.sh many`). `BENCH_ROUNDS` (3) rounds, the contestants taking turns at going
//! first. `BENCH_COMPARE=<another rmq-backup>` measures a second build in the same rounds (a
//! before/after pair against the same raw reference). The broker: `BENCH_AMQP` (default
//! `amqp://guest:guest@127.0.0.1:5672`, RabbitMQ 3.10.8 here) and `BENCH_MGMT` (default
//! `http://127.0.0.1:15672`); RabbitMQ 4.3.6 of the suite is `BENCH_AMQP=amqp://guest:guest@127.0.0.1:5692
//! BENCH_MGMT=http://127.0.0.1:15692`.
//!
//! - raw: one AMQP connection and one channel, opened before the clock starts; for each queue
//!   `basic.get` until the `message_count` of the get-ok says the queue is empty, then one
//!   `basic.nack(multiple, requeue)` giving everything back; the clock stops when every queue
//!   is whole again (one passive declare each after the nacks, polled until whole; before, only
//!   the last queue was checked, less than rmq-backup does, which waits for each queue).
//! - rmq-backup: `backup` of the vhost to a fresh directory (release binary), its wall time,
//!   CPU seconds and peak RSS, and the AMQP connections it opened (the broker's
//!   `churn_rates.connection_created`).
//!
//! `BENCH_STORE_DIR`: the directory the backups are stored under (default the temporary
//! directory). On a RabbitMQ 4.x node, the queues need as many files open (`check_file_limit`).
//!
//! With `messages per queue` 0 it measures empty queues (the raw client does one get per queue).

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::*;
use rmq_backup::broker::amqp::{AmqpUrl, BasicProperties, ConnectOptions, Connection, FieldTable};
use rmq_backup::broker::management::ManagementClient;
use std::time::{Duration, Instant};

const VHOST: &str = "rmqb-bench-many";

/// The broker's AMQP URL without vhost (`BENCH_AMQP`, else bench_common's).
fn amqp_base() -> String {
    std::env::var("BENCH_AMQP").unwrap_or_else(|_| AMQP.to_string())
}

/// The broker's management URL (`BENCH_MGMT`, else bench_common's).
fn mgmt_base() -> String {
    std::env::var("BENCH_MGMT").unwrap_or_else(|_| MGMT.to_string())
}

/// A connection to `vhost` of the benchmark's broker.
fn connect_to(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&format!("{}/{vhost}", amqp_base())).expect("url");
    Connection::open(&ConnectOptions::new(url)).expect("connect")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .expect("usage: many_queues_bench <rmq-backup> [queues] [per queue] [bytes]");
    let queues: usize = args.get(2).map_or(5000, |v| v.parse().expect("queues"));
    let per_queue: usize = args.get(3).map_or(4, |v| v.parse().expect("per queue"));
    let size: usize = args.get(4).map_or(512, |v| v.parse().expect("bytes"));
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let compare = std::env::var("BENCH_COMPARE")
        .ok()
        .filter(|b| !b.is_empty());
    let mgmt = ManagementClient::new(&mgmt_base(), "guest", "guest", None).expect("management");
    check_file_limit(&mgmt, queues);
    fresh_vhost(&mgmt, VHOST);
    let names: Vec<String> = (0..queues).map(|i| format!("q-{i:05}")).collect();
    println!("seeding {queues} queues x {per_queue} x {size} B ...");
    // A fresh vhost of RabbitMQ 4.x refuses declares for a moment (INTERNAL_ERROR, measured on
    // 4.3.6): the seeding connection is opened again until a declare passes.
    let mut tries = 0;
    let conn = loop {
        let conn = connect_to(VHOST);
        let ch = conn.open_channel().expect("channel");
        match ch.queue_declare(&names[0], true, false, false, &FieldTable::new()) {
            Ok(_) => break conn,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("declare in the fresh vhost: {e}; again in 1 s");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => panic!("declare: {e}"),
        }
    };
    seed(&conn, &names, per_queue, size);
    wait_listed(&mgmt, queues, queues * per_queue);

    // BENCH_STORE_DIR: where the backups are stored (default the temporary directory; e.g.
    // /dev/shm to take the disk's inode allocation and fsyncs out of the comparison).
    let dir = std::env::var_os("BENCH_STORE_DIR")
        .map_or_else(std::env::temp_dir, std::path::PathBuf::from)
        .join(format!("rmqb-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut raw_s = Vec::new();
    let mut tool_s = Vec::new();
    let mut cpu_s = Vec::new();
    let mut rss = Vec::new();
    let mut conns = Vec::new();
    let mut compare_s = Vec::new();
    let mut compare_cpu = Vec::new();
    for round in 0..rounds {
        let mut tool_run = None;
        // 0: raw, 1: rmq-backup, 2: the other build; each round starts one further along.
        let contestants = if compare.is_some() { 3 } else { 2 };
        for turn in 0..contestants {
            match (round + turn) % contestants {
                0 => raw_s.push(raw_read(&conn, &names, per_queue).as_secs_f64()),
                1 => {
                    let cfg = config(&dir, round * 10 + turn);
                    let before = connections_created(&mgmt);
                    tool_run = Some(run_tool_measured(bin, &["backup", "--config", &cfg], &[]));
                    // The management API's churn counters lag by its statistics interval.
                    std::thread::sleep(Duration::from_secs(6));
                    conns.push(connections_created(&mgmt).saturating_sub(before) as f64);
                }
                _ => {
                    let cfg = config(&dir, round * 10 + turn);
                    let other = compare.as_deref().unwrap_or(bin);
                    let r = run_tool_measured(other, &["backup", "--config", &cfg], &[]);
                    compare_s.push(r.wall.as_secs_f64());
                    compare_cpu.push(r.cpu_secs);
                }
            }
        }
        let r = tool_run.expect("rmq-backup ran");
        tool_s.push(r.wall.as_secs_f64());
        cpu_s.push(r.cpu_secs);
        rss.push(r.peak_kib as f64 / 1024.0);
        println!(
            "round {round}: raw {:.2} s, rmq-backup {:.2} s ({:.2} CPU-s, {:.0} MB), rmq-backup time / raw time {:.2}{}",
            raw_s[round],
            tool_s[round],
            cpu_s[round],
            rss[round],
            tool_s[round] / raw_s[round],
            compare_s.get(round).map_or(String::new(), |c| format!(
                "; compared build {c:.2} s ({:.2} CPU-s), its time / raw time {:.2}",
                compare_cpu[round],
                c / raw_s[round]
            ))
        );
    }
    let ratios: Vec<f64> = tool_s.iter().zip(&raw_s).map(|(t, r)| t / r).collect();
    let (raw_m, tool_m) = (median(raw_s.clone()), median(tool_s.clone()));
    println!(
        "{queues} queues x {per_queue} x {size} B: raw single connection {raw_m:.2} s ({:.0} queues/s), rmq-backup {tool_m:.2} s ({:.0} queues/s, {:.2} CPU-s, peak RSS {:.0} MB, ~{:.0} connections opened); rmq-backup time / raw time (median of rounds) {:.2}",
        queues as f64 / raw_m,
        queues as f64 / tool_m,
        median(cpu_s),
        median(rss),
        median(conns),
        median(ratios)
    );
    if !compare_s.is_empty() {
        let ratios: Vec<f64> = compare_s.iter().zip(&raw_s).map(|(t, r)| t / r).collect();
        println!(
            "compared build ({}): {:.2} s, {:.2} CPU-s; its time / raw time (median of rounds) {:.2}",
            compare.as_deref().unwrap_or_default(),
            median(compare_s),
            median(compare_cpu),
            median(ratios)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    // BENCH_KEEP=1 keeps the vhost (to run rmq-backup on it by hand, profiled).
    if std::env::var_os("BENCH_KEEP").is_none() {
        let _ = mgmt.delete_vhost(VHOST);
    }
}

/// Declares `names` and publishes `per_queue` messages of `size` bytes into each, with
/// confirms.
fn seed(conn: &Connection, names: &[String], per_queue: usize, size: usize) {
    let ch = conn.open_channel().expect("channel");
    ch.confirm_select().expect("confirms");
    let body = vec![b'x'; size];
    for q in names {
        ch.queue_declare(q, true, false, false, &FieldTable::new())
            .expect("declare");
        for _ in 0..per_queue {
            ch.basic_publish("", q, true, &BasicProperties::default(), &body)
                .expect("publish");
        }
        if ch.outstanding_confirms() > 5000 {
            ch.wait_for_confirms(0, Duration::from_secs(60))
                .expect("confirms");
        }
    }
    ch.wait_for_confirms(0, Duration::from_secs(60))
        .expect("confirms");
    ch.close().expect("close");
}

/// Waits until the management API lists `queues` queues holding `messages` in all.
fn wait_listed(mgmt: &ManagementClient, queues: usize, messages: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = mgmt.list_queues().expect("list");
        let held: u64 = listed
            .iter()
            .filter(|q| q.vhost == VHOST)
            .map(|q| q.messages)
            .sum();
        let n = listed.iter().filter(|q| q.vhost == VHOST).count();
        if n == queues && held as usize == messages {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "listed {n} queues, {held} messages"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The raw reference (see the module documentation); returns its time.
fn raw_read(conn: &Connection, names: &[String], per_queue: usize) -> Duration {
    let ch = conn.open_channel().expect("channel");
    let started = Instant::now();
    for q in names {
        let mut last = None;
        while let Some(get) = ch.basic_get(q, false).expect("get") {
            last = Some(get.delivery.delivery_tag);
            if get.message_count == 0 {
                break;
            }
        }
        if let Some(tag) = last {
            ch.basic_nack(tag, true, true).expect("nack");
        }
    }
    // Every queue whole again (as rmq-backup waits for each queue), each polled like
    // rmq-backup's reader polls until its messages are back: from 1 ms, doubling up to 50 ms.
    // The nacks went first, so most answer whole at the first look.
    for q in names.iter().filter(|_| per_queue > 0) {
        let mut pause = Duration::from_millis(1);
        while (ch.queue_declare_passive(q).expect("declare").message_count as usize) < per_queue {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "queue {q} never whole again"
            );
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
    let took = started.elapsed();
    ch.close().expect("close");
    took
}

/// A backup config of the benchmark vhost into `dir`, backup id `bench-<n>`.
fn config(dir: &std::path::Path, n: usize) -> String {
    let yaml = format!(
        "mode: backup\nbackup_id: bench-{n}\nsource:\n  amqp_url: \"{}/%2f\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{VHOST}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n  max_concurrent_queues: 4\n",
        amqp_base(),
        mgmt_base(),
        dir.join("store").display()
    );
    let path = dir.join(format!("bench-{n}.yaml"));
    std::fs::write(&path, yaml).expect("config");
    path.display().to_string()
}

/// File descriptors a RabbitMQ 4.x node needs beside one per queue (its sockets, its
/// message stores, the management API's connections): room measured on 4.3.6, whose
/// `fd_used` was ~250 with no benchmark queues.
const FD_SPARE: u64 = 500;

/// Stops the benchmark before seeding when a RabbitMQ 4.x node's file-descriptor limit is too
/// low for `queues` queues. Measured on 4.3.6 with `fd_total` 1024 (the chroot node started
/// under the default `ulimit -n` of 1024): every classic queue that holds messages keeps a
/// file open, so the declare of about the 970th queue failed with `INTERNAL_ERROR` (the log:
/// `{badmatch,{error,emfile}}` in `rabbit_classic_queue_index_v2`). Raising the limit of the
/// running node (`prlimit`) does not help: the Erlang VM sizes its poll set at start, and
/// every socket past fd 1023 then fails (`fd=5209 is larger than the largest allowed
/// fd=1023`), so the node stops accepting AMQP and HTTP connections. RabbitMQ 3.10.8 closes
/// queue files under pressure (its file handle cache) and needs no more than its 1024.
fn check_file_limit(mgmt: &ManagementClient, queues: usize) {
    let version = mgmt
        .overview()
        .expect("overview")
        .broker_version
        .unwrap_or_default();
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_none_or(|m| m < 4) {
        return;
    }
    let mut answer = ureq::get(&format!("{}/api/nodes?columns=name,fd_total", mgmt_base()))
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call()
        .expect("nodes");
    let nodes: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().expect("body")).expect("json");
    for node in nodes.as_array().into_iter().flatten() {
        let total = node["fd_total"].as_u64().unwrap_or(u64::MAX);
        let needed = queues as u64 + FD_SPARE;
        assert!(
            total >= needed,
            "node {} of RabbitMQ {version} may open {total} files, and {queues} queues need about {needed} \
             (4.x keeps a file open per classic queue; past its limit declares fail with INTERNAL_ERROR): \
             restart the node under a higher `ulimit -n` (raising a running node's limit does not work)",
            node["name"].as_str().unwrap_or("?")
        );
    }
}

/// The broker's count of connections ever created (`/api/overview` churn_rates).
fn connections_created(_mgmt: &ManagementClient) -> u64 {
    let mut answer = ureq::get(&format!("{}/api/overview?columns=churn_rates", mgmt_base()))
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call()
        .expect("overview");
    let v: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().expect("body")).expect("json");
    v["churn_rates"]["connection_created"].as_u64().unwrap_or(0)
}
