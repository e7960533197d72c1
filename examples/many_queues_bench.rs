//! Many small queues (issue "Clusters and scale-out", item 6): rmq-backup beside a raw
//! single-connection client on the same local broker, in one run.
//!
//! Usage: `many_queues_bench <rmq-backup> [queues=5000] [messages per queue=4] [body bytes=512]`
//! (`scripts/bench.sh many`). `BENCH_ROUNDS` (3) rounds, the two alternating which goes first.
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
//! With `messages per queue` 0 it measures empty queues (the raw client does one get per queue).

#[path = "bench_common/mod.rs"]
mod bench_common;

use bench_common::*;
use rmq_backup::broker::amqp::{BasicProperties, Connection, FieldTable};
use rmq_backup::broker::management::ManagementClient;
use std::time::{Duration, Instant};

const VHOST: &str = "rmqb-bench-many";

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
    let mgmt = ManagementClient::new(MGMT, "guest", "guest", None).expect("management");
    fresh_vhost(&mgmt, VHOST);
    let names: Vec<String> = (0..queues).map(|i| format!("q-{i:05}")).collect();
    println!("seeding {queues} queues x {per_queue} x {size} B ...");
    let conn = connect(VHOST);
    seed(&conn, &names, per_queue, size);
    wait_listed(&mgmt, queues, queues * per_queue);

    let dir = std::env::temp_dir().join(format!("rmqb-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut raw_s = Vec::new();
    let mut tool_s = Vec::new();
    let mut cpu_s = Vec::new();
    let mut rss = Vec::new();
    let mut conns = Vec::new();
    for round in 0..rounds {
        let raw = || raw_read(&conn, &names, per_queue);
        let tool = |i: usize| {
            let cfg = config(&dir, round * 10 + i);
            let before = connections_created(&mgmt);
            let r = run_tool_measured(bin, &["backup", "--config", &cfg], &[]);
            (r, before)
        };
        let (r, before) = if round % 2 == 0 {
            raw_s.push(raw().as_secs_f64());
            tool(0)
        } else {
            let t = tool(1);
            raw_s.push(raw().as_secs_f64());
            t
        };
        tool_s.push(r.wall.as_secs_f64());
        cpu_s.push(r.cpu_secs);
        rss.push(r.peak_kib as f64 / 1024.0);
        // The management API's churn counters lag by its statistics interval.
        std::thread::sleep(Duration::from_secs(6));
        conns.push(connections_created(&mgmt).saturating_sub(before) as f64);
        println!(
            "round {round}: raw {:.2} s, rmq-backup {:.2} s ({:.2} CPU-s, {:.0} MB), rmq-backup time / raw time {:.2}",
            raw_s[round],
            tool_s[round],
            cpu_s[round],
            rss[round],
            tool_s[round] / raw_s[round]
        );
    }
    let ratios: Vec<f64> = tool_s.iter().zip(&raw_s).map(|(t, r)| t / r).collect();
    let (raw_m, tool_m) = (median(raw_s), median(tool_s.clone()));
    println!(
        "{queues} queues x {per_queue} x {size} B: raw single connection {raw_m:.2} s ({:.0} queues/s), rmq-backup {tool_m:.2} s ({:.0} queues/s, {:.2} CPU-s, peak RSS {:.0} MB, ~{:.0} connections opened); rmq-backup time / raw time (median of rounds) {:.2}",
        queues as f64 / raw_m,
        queues as f64 / tool_m,
        median(cpu_s),
        median(rss),
        median(conns),
        median(ratios)
    );
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
        "mode: backup\nbackup_id: bench-{n}\nsource:\n  amqp_url: \"{AMQP}/%2f\"\n  management_url: \"{MGMT}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{VHOST}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n  max_concurrent_queues: 4\n",
        dir.join("store").display()
    );
    let path = dir.join(format!("bench-{n}.yaml"));
    std::fs::write(&path, yaml).expect("config");
    path.display().to_string()
}

/// The broker's count of connections ever created (`/api/overview` churn_rates).
fn connections_created(_mgmt: &ManagementClient) -> u64 {
    let mut answer = ureq::get(&format!("{MGMT}/api/overview?columns=churn_rates"))
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call()
        .expect("overview");
    let v: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().expect("body")).expect("json");
    v["churn_rates"]["connection_created"].as_u64().unwrap_or(0)
}
