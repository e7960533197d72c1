//! Quorum queues and their delivery limit on every broker version (issue 30): nightly backups
//! never cost a quorum queue its messages.
//!
//! - 4.3: every message goes back by `basic.nack(requeue)`, which does not count as a failed
//!   delivery: 30 backups leave the queue whole, with no `x-delivery-count`.
//! - 4.0-4.2 (a limit of 20 by default) and 3.x (a limit from an argument or a policy): every
//!   return counts, so a queue with a finite limit is left alone (exit 4, named, with its limit
//!   and the broker's version) unless `backup.read_queues_with_delivery_limit` is set; with it,
//!   a read stops at the first message its return would leave at the limit.

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};
use rmq_backup::repository::manifest::Manifest;
use std::time::Duration;

/// Sets policy `name` on `vhost` with `definition` for the queues matching `pattern`.
fn set_policy(vhost: &str, name: &str, pattern: &str, definition: &str) {
    let url = format!(
        "{}/api/policies/{}/{name}",
        management_url(),
        rmq_backup::broker::management::encode_segment(vhost)
    );
    ureq::put(&url)
        .header("authorization", MANAGEMENT_AUTH)
        .header("content-type", "application/json")
        .send(format!(
            r#"{{"pattern":"{pattern}","definition":{definition},"apply-to":"queues"}}"#
        ))
        .expect("set policy");
    // Policies apply asynchronously.
    std::thread::sleep(Duration::from_millis(500));
}

/// The delivery counts the broker reports on the first `n` messages of `queue` (absent: 0),
/// read without changing them on 4.3 (`peek` gives back by nack there).
fn delivery_counts(conn: &rmq_backup::broker::amqp::Connection, queue: &str, n: usize) -> Vec<i64> {
    peek(conn, queue, n)
        .iter()
        .map(|d| {
            d.properties
                .headers
                .as_ref()
                .and_then(|h| h.iter().find(|(k, _)| k == "x-delivery-count"))
                .map(|(_, v)| match v {
                    FieldValue::I64(n) => *n,
                    FieldValue::I32(n) => i64::from(*n),
                    other => panic!("x-delivery-count {other:?}"),
                })
                .unwrap_or(0)
        })
        .collect()
}

fn backup(vh: &TestVhost, dir: &TempDir, id: &str, extra: &str) -> (Option<i32>, String, Manifest) {
    let cfg = write_config(
        dir.path(),
        &format!("{id}.yaml"),
        &backup_yaml(id, &vh.name, &dir.path().join("store"), extra).replace(
            "  include_definitions: true\n",
            "  include_definitions: false\n",
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    let m = manifest(&dir.path().join("store"), id);
    (out.status.code(), format!("{stdout}\n{stderr}"), m)
}

#[test]
fn nightly_backups_never_cost_a_quorum_queue_its_messages() {
    let b = broker();
    let vh = TestVhost::new("nightly-quorum");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    // Declared as an application would: no x-delivery-limit (`declare` would add -1 on 4.0).
    let quorum: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )];
    ch.queue_declare("orders", true, false, false, &quorum)
        .unwrap();
    publish_bulk(&ch, "orders", 1000, 64);
    if !b.default_delivery_limit() {
        // 3.x has no limit by default: the one most people set.
        set_policy(&vh.name, "poison", "^orders$", r#"{"delivery-limit":20}"#);
    }
    let dir = TempDir::new("nightly-quorum");
    let nights = if b.uncounted_nack() { 30 } else { 25 };
    for night in 1..=nights {
        let id = format!("night-{night}");
        let (code, out, m) = backup(&vh, &dir, &id, "");
        let stored = m
            .queues
            .iter()
            .find(|q| q.name == "orders")
            .map(|q| q.message_count);
        if b.uncounted_nack() {
            assert_eq!(code, Some(0), "night {night}: {out}");
            assert_eq!(stored, Some(1000), "night {night}: messages stored");
        } else {
            assert_eq!(code, Some(4), "night {night}: {out}");
            assert_eq!(stored, None, "night {night}: the queue is left alone");
            assert!(
                out.contains("queue orders in vhost") && out.contains("delivery limit of 20"),
                "night {night}: the queue is named with its limit: {out}"
            );
            assert!(
                out.contains(&format!("RabbitMQ {}", b.version.0)),
                "night {night}: the broker's version is named: {out}"
            );
        }
        assert_eq!(
            depth(&conn, "orders"),
            1000,
            "night {night}: depth after the backup"
        );
    }
    let counts = delivery_counts(&conn, "orders", 1000);
    assert!(
        counts.iter().all(|c| *c == 0),
        "no message's x-delivery-count was raised: {:?}",
        counts
            .iter()
            .filter(|c| **c > 0)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        seqs(&peek(&conn, "orders", 1000)),
        (0..1000).collect::<Vec<_>>(),
        "the queue keeps its order"
    );
}

/// Gives every message of `queue` back once by closing the channel that holds them: a
/// failed delivery on every version.
fn return_all_counted(conn: &rmq_backup::broker::amqp::Connection, queue: &str, n: usize) {
    let ch = conn.open_channel().unwrap();
    ch.basic_qos(n as u16, false).unwrap();
    let consumer = ch
        .basic_consume(queue, "raise-count", false, false, &FieldTable::new())
        .unwrap();
    for _ in 0..n {
        consumer
            .recv_timeout(Duration::from_secs(30))
            .unwrap()
            .expect("a delivery");
    }
    ch.close().unwrap();
    let control = conn.open_channel().unwrap();
    wait_ready(&control, queue, n as u32);
}

#[test]
fn with_the_opt_in_a_read_stops_before_a_message_reaches_its_limit() {
    let b = broker();
    if b.uncounted_nack() {
        eprintln!(
            "RabbitMQ {}: a backup's give-back does not count; the nightly test covers it",
            b.name
        );
        return;
    }
    let vh = TestVhost::new("headroom");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let limit: FieldTable = vec![("x-delivery-limit".into(), FieldValue::I64(3))];
    declare(&ch, "near", "quorum", limit);
    publish_bulk(&ch, "near", 10, 32);
    return_all_counted(&conn, "near", 10);
    let dir = TempDir::new("headroom");
    let opt_in = "  read_queues_with_delivery_limit: true\n";

    // Every message at 1 of 3: one more return leaves it at 2, below the limit.
    let (code, out, m) = backup(&vh, &dir, "headroom-1", opt_in);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        m.queues
            .iter()
            .find(|q| q.name == "near")
            .map(|q| q.message_count),
        Some(10)
    );
    assert!(m.completed_at.is_some());

    // Now at 2 of 3: a return would leave each at the limit. The read stops at the first.
    let (code, out, m) = backup(&vh, &dir, "headroom-2", opt_in);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        m.queues.iter().all(|q| q.name != "near"),
        "the queue is left out"
    );
    assert!(
        out.contains("queue near in vhost")
            && out.contains("delivery limit of 3")
            && out.contains("x-delivery-count 2"),
        "the queue is named as skipped, with the count it met: {out}"
    );
    assert!(
        !dir.path().join("store/headroom-2/queues").exists()
            || walk(&dir.path().join("store/headroom-2/queues")).is_empty(),
        "the stopped read's segments are removed"
    );

    // Without the opt-in it is left alone, untouched.
    let (code, out, _) = backup(&vh, &dir, "headroom-3", "");
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("delivery limit of 3"), "{out}");

    // Nothing was dropped: every message is there, in order, at most at the limit. (Read
    // with acknowledgements: any return would now drop them.)
    assert_eq!(depth(&conn, "near"), 10);
    let got: Vec<_> = (0..10)
        .map(|_| {
            ch.basic_get("near", true)
                .unwrap()
                .expect("a message")
                .delivery
        })
        .collect();
    assert_eq!(seqs(&got), (0..10).collect::<Vec<_>>());
    let counts: Vec<u64> = got
        .iter()
        .map(rmq_backup::broker::reader::delivery_count)
        .collect();
    assert!(
        counts.iter().all(|c| *c == 3),
        "one count per read that held it: {counts:?}"
    );
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
