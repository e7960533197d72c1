//! A restore killed with SIGKILL and run again publishes again at most one publisher-confirm
//! window per queue (issue 38, item 8): the checkpoint records each queue's confirmed prefix
//! as it moves (`src/restore/publish.rs`). Before, it was recorded every
//! `restore.checkpoint_interval_secs` (60 by default): a restore of three queues killed after
//! 5 s and rerun delivered every message, in order, but 9,855 of them twice.
//!
//! Against the broker under test (`RMQ_TEST_BROKER`, RabbitMQ 4.3.6 by default), the real
//! binary, killed at several points of three queues restored at once.

mod common;

use common::*;
use rmq_backup::broker::amqp::{Connection, FieldTable};
use rmq_backup::repository::checkpoint::{Checkpoints, RestoreKey};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

const QUEUES: [&str; 3] = ["k-a", "k-b", "k-c"];
const PER_QUEUE: usize = 20_000;
/// `produce_batch_size` of the restores: the window is ten times as many publishes
/// (`src/restore/mod.rs`).
const BATCH: u64 = 100;
const WINDOW: u64 = BATCH * 10;

/// `queue`'s depth once it holds still (the broker may still be taking in what a killed
/// client sent): the same count three times, 500 ms apart, within 60 s.
fn settled_depth(conn: &Connection, queue: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u32::MAX, 0);
    loop {
        let d = depth(conn, queue);
        last = if d == last.0 { (d, last.1 + 1) } else { (d, 0) };
        if last.1 == 2 {
            return u64::from(d);
        }
        assert!(Instant::now() < deadline, "queue {queue} never held still");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_killed_restore_publishes_again_at_most_one_window_per_queue() {
    let vh = TestVhost::new("kill-window");
    let conn = vh.connect();
    for q in QUEUES {
        let ch = conn.open_channel().unwrap();
        declare(&ch, q, "classic", FieldTable::new());
        publish_bulk(&ch, q, PER_QUEUE, 100);
        let _ = ch.close();
    }
    let dir = TempDir::new("kill-window");
    let store = dir.path().join("store");
    let id = "kw";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(id, &vh.name, &store, "  segment_max_bytes: 262144\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let tconn = connect(&target);
    let state = dir.path().join("restore.db");
    let restore = |name: &str, extra: &str| {
        write_config(
            dir.path(),
            name,
            &restore_yaml(
                id,
                &store,
                &format!(
                    "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  max_concurrent_queues: 3\n  produce_batch_size: {BATCH}\n  checkpoint_state: \"{}\"\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n{extra}",
                    state.display(),
                    v = vh.name
                ),
            ),
        )
    };
    let key = |queue: &str| RestoreKey {
        backup_id: id.into(),
        source_vhost: vh.name.clone(),
        source_queue: queue.into(),
        target_vhost: target.clone(),
        target_queue: queue.into(),
    };

    // Per queue, the records each run published, as [from, to) ranges of the source's order.
    let mut runs: Vec<Vec<(u64, u64)>> = vec![Vec::new(); QUEUES.len()];
    let mut held = [0u64; 3];
    let mut recorded = [0u64; 3];
    // Killed after: 2 s under a rate limit (confirms keep up: the window never fills), then
    // 1.5 s and 1 s at full speed (the window fills and waits).
    let kills = [
        (2000, "  rate_limit_messages_per_sec: 6000\n"),
        (1500, ""),
        (1000, ""),
    ];
    for (n, (after_ms, extra)) in kills.iter().enumerate() {
        let cfg = restore(&format!("r{n}.yaml"), extra);
        let (mut child, lines) = spawn_cli(&["restore", "--config", &cfg], &[]);
        wait_line(&lines, ": restoring");
        std::thread::sleep(Duration::from_millis(*after_ms));
        child.kill().unwrap();
        // A run that ended before its kill (a fast machine, the last run's few records) must
        // have ended well; what it published is counted below all the same.
        let status = child.wait().unwrap();
        assert!(
            status.signal() == Some(9) || status.code() == Some(0),
            "run {n} neither killed nor completed: {status:?}"
        );
        let cp = Checkpoints::open_file(&state).unwrap();
        let mut all_completed = true;
        for (i, q) in QUEUES.iter().enumerate() {
            let now_held = settled_depth(&tconn, q);
            let published = now_held - held[i];
            let (now_recorded, completed) = cp
                .restore_queue(&key(q))
                .unwrap()
                .map_or((0, false), |(done, completed)| (done, completed));
            let reached = recorded[i] + published;
            let again = reached - now_recorded;
            println!(
                "run {n} killed after {after_ms} ms: queue {q}: {published} published (records {}..{reached}), checkpoint at {now_recorded}{}: {again} to publish again",
                recorded[i],
                if completed { " (completed)" } else { "" }
            );
            assert!(
                now_recorded <= reached,
                "queue {q}: the checkpoint ({now_recorded}) is past what reached the broker ({reached})"
            );
            assert!(
                again <= WINDOW,
                "queue {q}: run {n} killed with {again} records published but not recorded, more than the window of {WINDOW}"
            );
            runs[i].push((recorded[i], reached));
            held[i] = now_held;
            recorded[i] = now_recorded;
            all_completed &= completed;
        }
        drop(cp);
        // A run that restored everything before its kill leaves the next ones nothing to do
        // (in the suite a full-speed run once finished its 3 x 16,000 records within 1.5 s).
        if all_completed {
            break;
        }
    }
    let cfg = restore("last.yaml", "");
    let out = run_cli(&["restore", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Every message arrived, in order; the duplicates are exactly the records each killed run
    // published past its checkpoint.
    for (i, q) in QUEUES.iter().enumerate() {
        runs[i].push((recorded[i], PER_QUEUE as u64));
        let expected: Vec<i64> = runs[i]
            .iter()
            .flat_map(|&(from, to)| from as i64..to as i64)
            .collect();
        let n = settled_depth(&tconn, q) as usize;
        let got = seqs(&peek(&tconn, q, n));
        assert_eq!(got.len(), expected.len(), "queue {q}: {:?}", runs[i]);
        if let Some(at) = (0..got.len()).find(|&j| got[j] != expected[j]) {
            let near = |v: &[i64]| v[at.saturating_sub(3)..(at + 4).min(v.len())].to_vec();
            panic!(
                "queue {q}: out of order or missing from position {at}: got {:?}, expected {:?}",
                near(&got),
                near(&expected)
            );
        }
    }
}
