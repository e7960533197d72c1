//! A restore into a target under a resource alarm (issue "Faults", promise 2), on the test
//! cluster (scripts/setup-rabbitmq-cluster.sh: an alarm there blocks no other test): the
//! restore says once that the target blocked it, waits while the alarm lasts (an alarm that
//! clears costs nothing but time), fails clearly after `restore.blocked_timeout_secs`, and a
//! rerun with `checkpoint_state` then delivers every message, in order.

mod common;

use common::cluster::{self, watermark, ClearAlarm};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cluster's alarm is the cluster's: one test at a time.
static CLUSTER: Mutex<()> = Mutex::new(());

const N: usize = 5_000;

/// A backup of `N` messages in queue `q` (main broker), and a fresh vhost on the cluster.
fn backed_up_queue(tag: &str) -> (TestVhost, TempDir, String) {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", N, 512);
    let dir = TempDir::new(tag);
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("alarm", &vh.name, &dir.path().join("store"), ""),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let target = format!("{}-cluster", vh.name);
    let m = cluster::management(1);
    m.create_vhost(&target).unwrap();
    m.set_permissions(&target, "guest").unwrap();
    (vh, dir, target)
}

fn restore_config(dir: &TempDir, source_vhost: &str, target: &str, extra: &str) -> String {
    let yaml = format!(
        "mode: restore\nbackup_id: alarm\ntarget:\n  amqp_url: \"amqp://guest:guest@127.0.0.1:5701/%2f\"\n  management_url: \"http://127.0.0.1:15701\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{source_vhost}\": \"{target}\"\n{extra}",
        dir.path().join("store").display()
    );
    write_config(dir.path(), "r.yaml", &yaml)
}

fn restored_in_order(target: &str) {
    let conn = cluster::connect(1, target);
    assert_eq!(depth(&conn, "q") as usize, N);
    assert_eq!(
        seqs(&peek(&conn, "q", N)),
        (0..N as i64).collect::<Vec<_>>()
    );
}

#[test]
fn an_alarm_that_clears_costs_the_restore_only_time() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (vh, dir, target) = backed_up_queue("alarm-clears");
    let cfg = restore_config(&dir, &vh.name, &target, "");
    let _clear = ClearAlarm;
    watermark("0.0000001");
    let (child, lines) = spawn_cli(&["restore", "--config", &cfg], &[]);
    let blocked = wait_line(&lines, "target blocked by a resource alarm");
    assert!(
        blocked.contains("restore.blocked_timeout_secs"),
        "{blocked}"
    );
    std::thread::sleep(Duration::from_secs(3));
    watermark("0.4");
    let out = child.wait_with_output().unwrap();
    let log: Vec<String> = rest_of(&lines);
    assert_eq!(out.status.code(), Some(0), "{}", log.join("\n"));
    assert!(
        !log.iter()
            .any(|l| l.contains("target blocked by a resource alarm")),
        "said once"
    );
    restored_in_order(&target);
    cluster::management(1).delete_vhost(&target).unwrap();
}

#[test]
fn an_alarm_that_lasts_fails_the_restore_clearly_and_a_rerun_delivers_everything() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let (vh, dir, target) = backed_up_queue("alarm-lasts");
    let state = dir.path().join("restore.db");
    let extra = format!(
        "  blocked_timeout_secs: 3\n  checkpoint_state: \"{}\"\n  checkpoint_interval_secs: 1\n",
        state.display()
    );
    let cfg = restore_config(&dir, &vh.name, &target, &extra);
    let clear = ClearAlarm;
    watermark("0.0000001");
    let started = Instant::now();
    let out = run_cli(&["restore", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Connection error: ") && last.contains("blocked by the broker"),
        "{last}"
    );
    assert!(
        stderr.contains(&format!("queue q in vhost {target}")),
        "{stderr}"
    );
    // It says how far it got: what the broker took before blocking was published, never
    // confirmed, and is published again by a rerun (at least once, never skipped).
    let said = stderr
        .lines()
        .find(|l| {
            l.contains(&format!("queue q in vhost {target}: "))
                && l.contains("published before the restore failed")
        })
        .map(str::to_string);
    drop(clear);
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let conn = cluster::connect(1, &target);
    let n = depth(&conn, "q") as usize;
    let got = seqs(&peek(&conn, "q", n));
    // Every message, in order, after the first run's unconfirmed prefix (if the broker
    // stored it once the alarm cleared).
    let extra = n - N;
    assert_eq!(
        got[..extra],
        (0..extra as i64).collect::<Vec<_>>()[..],
        "{said:?}"
    );
    assert_eq!(got[extra..], (0..N as i64).collect::<Vec<_>>()[..]);
    if extra > 0 {
        let said = said.expect("the first run said what it had published");
        assert!(said.contains("a rerun publishes them again"), "{said}");
    }
    cluster::management(1).delete_vhost(&target).unwrap();
}
