//! A backup while the broker itself fails (issue "Faults", promise 1), on the test cluster
//! (scripts/setup-rabbitmq-cluster.sh; other tests run beside these on the main broker): the
//! broker application restarted (`rabbitmqctl stop_app` / `start_app`), a node killed
//! (SIGKILL), a memory alarm raised mid-read. The run reconnects when the broker comes back
//! within its retries, or ends in bounded time with a clear error and an interrupted backup
//! that the same command finishes; the source keeps every message, in order.

mod common;

use common::cluster::{self, ClearAlarm, ClusterVhost, NodeBack};
use common::*;
use rmq_backup::broker::amqp::{Connection, FieldTable};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time stops a node or raises an alarm.
static CLUSTER: Mutex<()> = Mutex::new(());

const N: usize = 50_000;

/// A vhost on the cluster with queue `q` of `kind` holding `N` numbered persistent messages,
/// declared through rmqc1 (a classic queue lives there).
fn seeded(tag: &str, kind: &str) -> ClusterVhost {
    let vh = ClusterVhost::new(tag);
    let conn = cluster::connect(1, &vh.name);
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", kind, FieldTable::new());
    publish_bulk_persistent(&ch, "q", N, 64);
    let _ = conn.close();
    vh
}

/// A backup config reading `vhost` from rmqc1.
fn config(dir: &TempDir, id: &str, vhost: &str, extra: &str) -> String {
    let yaml = backup_yaml(id, vhost, &dir.path().join("store"), extra)
        .replace(
            &amqp_url(vhost),
            &cluster::amqp_url(1, vhost, "heartbeat=2"),
        )
        .replace(&management_url(), &cluster::management_url(1));
    assert!(yaml.contains("127.0.0.1:5701"), "{yaml}");
    write_config(dir.path(), "b.yaml", &yaml)
}

/// Queue `q` of `vhost` on node `n` holds the `N` messages again, in order.
fn source_whole(n: u8, vhost: &str) {
    let conn: Connection = cluster::connect(n, vhost);
    let deadline = Instant::now() + Duration::from_secs(60);
    while (depth(&conn, "q") as usize) < N {
        assert!(
            Instant::now() < deadline,
            "the source never got its messages back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(depth(&conn, "q") as usize, N);
    assert_eq!(
        seqs(&peek(&conn, "q", N)),
        (0..N as i64).collect::<Vec<_>>()
    );
}

/// The backup `id` in `dir` completed with queue `q`'s `N` messages, once each, in order.
fn completed(dir: &TempDir, id: &str) {
    let store = dir.path().join("store");
    let m = manifest(&store, id);
    assert!(m.completed_at.is_some());
    assert_eq!(m.queues[0].message_count, N as u64);
    assert_eq!(
        seqs(&backed_up(&store, id, "q")),
        (0..N as i64).collect::<Vec<_>>()
    );
}

#[test]
fn a_broker_application_restarted_mid_backup_is_waited_for_and_the_backup_completes() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let vh = seeded("fault-restart", "classic");
    let dir = TempDir::new("fault-restart");
    // 1 + 2 + 4 + 8 + 16 + 30 s of retries: time enough for the application to start again.
    let cfg = config(
        &dir,
        "restart",
        &vh.name,
        "  requeue_strategy: get\n  connection_retries: 6\n  connection_retry_backoff_ms: 1000\n",
    );
    let back = NodeBack(1);
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, "queue q: 50000 messages at start");
    cluster::ctl(1, &["stop_app"]);
    let lost = wait_line(&lines, "reading it again from its head");
    assert!(lost.contains("queue q in vhost"), "{lost}");
    cluster::ctl(1, &["start_app"]);
    let out = child.wait_with_output().unwrap();
    let log: Vec<String> = rest_of(&lines);
    assert_eq!(out.status.code(), Some(0), "{}", log.join("\n"));
    drop(back);
    completed(&dir, "restart");
    source_whole(1, &vh.name);
}

#[test]
fn a_node_killed_mid_backup_ends_the_run_clearly_and_a_rerun_finishes() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    // A quorum queue: its replicas on rmqc2 and rmqc3 keep it while rmqc1 is gone.
    let vh = seeded("fault-kill", "quorum");
    let dir = TempDir::new("fault-kill");
    let cfg = config(
        &dir,
        "kill",
        &vh.name,
        "  connection_retries: 1\n  connection_retry_backoff_ms: 500\n",
    );
    let back = NodeBack(1);
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, "queue q: 50000 messages at start");
    cluster::kill_node(1);
    let killed = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "ended {:?} after the kill",
        killed.elapsed()
    );
    let log: Vec<String> = rest_of(&lines);
    assert_eq!(out.status.code(), Some(1), "{}", log.join("\n"));
    // The run ends on what it lost: the node's AMQP connection, or (when the retry's check of
    // the queue's depth asks the management API first, which ran on the same node) the API.
    let last = log.last().cloned().unwrap_or_default();
    assert!(
        last.starts_with("Connection error: ")
            || (last.starts_with("Management API error: ") && last.contains(":15701/")),
        "{last}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("reading it again from its head")),
        "{}",
        log.join("\n")
    );
    let m = manifest(&dir.path().join("store"), "kill");
    assert!(m.completed_at.is_none(), "interrupted");
    // The queue's other replicas gave the lost consumer's messages back.
    source_whole(2, &vh.name);

    drop(back);
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    completed(&dir, "kill");
    source_whole(1, &vh.name);
}

#[test]
fn a_memory_alarm_mid_backup_stops_it_with_every_message_in_place() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let vh = seeded("fault-alarm", "classic");
    let dir = TempDir::new("fault-alarm");
    let cfg = config(&dir, "alarm", &vh.name, "  requeue_strategy: get\n");
    let clear = ClearAlarm;
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, "queue q: 50000 messages at start");
    cluster::watermark("0.0000001");
    let raised = Instant::now();
    let out = child.wait_with_output().unwrap();
    let log: Vec<String> = rest_of(&lines);
    assert_eq!(out.status.code(), Some(1), "{}", log.join("\n"));
    assert!(
        raised.elapsed() < Duration::from_secs(30),
        "ended {:?} after the alarm",
        raised.elapsed()
    );
    let last = log.last().cloned().unwrap_or_default();
    assert!(
        last.contains("memory alarm"),
        "last: {last}\n{}",
        log.join("\n")
    );
    assert!(
        manifest(&dir.path().join("store"), "alarm")
            .completed_at
            .is_none(),
        "interrupted"
    );
    source_whole(1, &vh.name);
    // While the alarm lasts a backup does not start; once it clears, the same command
    // finishes the backup.
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("memory alarm"), "{:?}", text(&out));
    drop(clear);
    // The management API reports a node's alarm with its statistics, seconds late.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster::management(1)
        .nodes_memory()
        .unwrap()
        .iter()
        .any(|n| n.mem_alarm)
    {
        assert!(Instant::now() < deadline, "the alarm did not clear");
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    completed(&dir, "alarm");
    source_whole(1, &vh.name);
}
