//! The restore's time window cutting through a segment, and its rate limit over several
//! queues (SPEC.md "restore": `time_window_start`, `time_window_end`,
//! `rate_limit_messages_per_sec`).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::manifest::Manifest;
use rmq_backup::repository::segment::SegmentReader;
use std::time::{Duration, Instant};

#[test]
fn a_time_window_that_cuts_through_a_segment_restores_exactly_the_records_inside() {
    const N: usize = 400;
    let vh = TestVhost::new("window-cut");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", N, 64);
    let dir = TempDir::new("window-cut");
    let store = dir.path().join("store");
    // basic.get, one message per round trip: the records' backed_up_at spread over many ms.
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("w", &vh.name, &store, "  requeue_strategy: get\n"),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let m = Manifest::from_json(&std::fs::read(store.join("w/manifest.json")).unwrap()).unwrap();
    let segment = &m.queues[0].segments;
    assert_eq!(segment.len(), 1, "one segment");
    let times: Vec<i64> = SegmentReader::open(&store.join(&segment[0].key))
        .unwrap()
        .records()
        .map(|r| r.unwrap().into_record().unwrap().backed_up_at)
        .collect();
    let (start, end) = (times[N / 4], times[3 * N / 4]);
    assert!(
        times[0] < start && end < times[N - 1],
        "the window must cut the segment: {}..{} within {}..{}",
        start,
        end,
        times[0],
        times[N - 1]
    );
    let inside: Vec<i64> = (0..N as i64)
        .filter(|&i| (start..=end).contains(&times[i as usize]))
        .collect();
    let outside = N - inside.len();

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            "w",
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  time_window_start: {start}\n  time_window_end: {end}\n",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let n = inside.len();
    assert!(
        stdout.contains(&format!(
            ": 1 queues, {n} messages published, {n} confirmed, 0 failed, {outside} outside the time window,"
        )),
        "{stdout}"
    );
    let tconn = connect(&target);
    assert_eq!(depth(&tconn, "q") as usize, n);
    let got: Vec<i64> = peek(&tconn, "q", n)
        .iter()
        .map(|d| header_i64(d, "seq"))
        .collect();
    assert_eq!(
        got, inside,
        "exactly the records inside the window, in order"
    );
}

#[test]
fn the_rate_limit_holds_over_several_queues() {
    const PER_QUEUE: usize = 200;
    const QUEUES: usize = 3;
    const RATE: u64 = 300;
    let vh = TestVhost::new("rate");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in 0..QUEUES {
        declare(&ch, &format!("q{q}"), "classic", FieldTable::new());
        publish_bulk(&ch, &format!("q{q}"), PER_QUEUE, 32);
    }
    let dir = TempDir::new("rate");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("rate", &vh.name, &store, ""),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            "rate",
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  max_concurrent_queues: {QUEUES}\n  rate_limit_messages_per_sec: {RATE}\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
                v = vh.name
            ),
        ),
    );
    let started = Instant::now();
    let out = run_cli(&["restore", "--config", &r]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // 600 publishes at 300/s: the last is due (600 - 1) / 300 s after the first. A lower
    // bound only: a slow machine may take longer, never shorter.
    let total = (PER_QUEUE * QUEUES) as u64;
    let floor = Duration::from_millis((total - 1) * 1000 / RATE);
    println!("{total} messages at {RATE}/s over {QUEUES} queues took {took:?} (floor {floor:?})");
    assert!(
        took >= floor,
        "{total} messages at {RATE}/s took only {took:?}"
    );
    let tconn = connect(&target);
    for q in 0..QUEUES {
        assert_eq!(depth(&tconn, &format!("q{q}")) as usize, PER_QUEUE);
    }
}
