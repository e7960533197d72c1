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

/// Deletes policy `name` of `vhost` (absent: nothing).
fn delete_policy(vhost: &str, name: &str) {
    let url = format!(
        "{}/api/policies/{}/{name}",
        management_url(),
        rmq_backup::broker::management::encode_segment(vhost)
    );
    let _ = ureq::delete(&url)
        .header("authorization", MANAGEMENT_AUTH)
        .call();
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

/// A quorum queue `orders` of `messages` messages with a dead-letter exchange whose queue
/// `dead` catches anything the broker drops, and a delivery limit of `limit` set by a policy
/// (`None`: the broker's default, 20 on 4.x).
fn quorum_with_dlx(vh: &TestVhost, limit: Option<u64>, messages: usize) {
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.exchange_declare("dlx", "fanout", true, false, &FieldTable::new())
        .unwrap();
    ch.queue_declare("dead", true, false, false, &FieldTable::new())
        .unwrap();
    ch.queue_bind("dead", "dlx", "", &FieldTable::new())
        .unwrap();
    let quorum: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )];
    ch.queue_declare("orders", true, false, false, &quorum)
        .unwrap();
    let definition = match limit {
        Some(l) => format!(r#"{{"delivery-limit":{l},"dead-letter-exchange":"dlx"}}"#),
        None => r#"{"dead-letter-exchange":"dlx"}"#.to_string(),
    };
    set_policy(&vh.name, "poison", "^orders$", &definition);
    publish_bulk(&ch, "orders", messages, 64);
}

/// Forty nightly backups with `backup.read_queues_with_delivery_limit` of a quorum queue
/// whose delivery limit is `limit` (`None`: the broker's default): the queue's depth never
/// falls, nothing is dead-lettered, and each night says what it backed up. Every return
/// counts on 3.x and 4.0-4.2: the queue is read while one more read leaves every message at
/// most at `limit - 1`, then left alone (exit 4) without taking a single message again.
fn forty_nights(limit: Option<u64>) {
    let b = broker();
    let vh = TestVhost::new("forty-nights");
    const MESSAGES: usize = 300;
    quorum_with_dlx(&vh, limit, MESSAGES);
    let conn = vh.connect();
    let dir = TempDir::new("forty-nights");
    let opt_in = "  read_queues_with_delivery_limit: true\n";
    let effective = limit.unwrap_or(20);
    // Nights that read: while the highest count a read leaves is at most limit - 1.
    let reading_nights = if b.uncounted_nack() {
        40
    } else {
        effective - 1
    };
    for night in 1..=40u64 {
        let id = format!("night-{night}");
        let (code, out, m) = backup(&vh, &dir, &id, opt_in);
        let stored = m
            .queues
            .iter()
            .find(|q| q.name == "orders")
            .map(|q| q.message_count);
        if night <= reading_nights {
            assert_eq!(code, Some(0), "night {night}: {out}");
            assert_eq!(stored, Some(MESSAGES as u64), "night {night}: {out}");
        } else {
            assert_eq!(code, Some(4), "night {night}: {out}");
            assert_eq!(
                stored, None,
                "night {night}: the queue is left alone: {out}"
            );
            assert!(
                out.contains("queue orders in vhost")
                    && out.contains(&format!("delivery limit of {effective}"))
                    && out.contains(&format!("x-delivery-count {}", effective - 1)),
                "night {night}: the queue is named with its limit and the count it is at: {out}"
            );
        }
        assert_eq!(
            depth(&conn, "orders"),
            MESSAGES as u32,
            "night {night}: depth after the backup: {out}"
        );
        assert_eq!(
            depth(&conn, "dead"),
            0,
            "night {night}: dead-lettered: {out}"
        );
    }
    let (order, counts) = drain(&conn, "orders", MESSAGES);
    assert_eq!(order, (0..MESSAGES as i64).collect::<Vec<_>>(), "order");
    let expected = if b.uncounted_nack() { 0 } else { effective - 1 };
    assert!(
        counts.iter().all(|c| *c == expected),
        "every message at {expected} (one count per night read, none after): {:?}",
        counts.iter().take(10).collect::<Vec<_>>()
    );
}

#[test]
fn forty_nights_with_the_opt_in_and_a_limit_of_5() {
    forty_nights(Some(5));
}

#[test]
fn forty_nights_with_the_opt_in_and_the_default_limit() {
    if !broker().default_delivery_limit() {
        eprintln!("RabbitMQ {}: no default delivery limit", broker().name);
        return;
    }
    forty_nights(None);
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
    let limit: FieldTable = vec![("x-delivery-limit".into(), FieldValue::I64(4))];
    declare(&ch, "near", "quorum", limit);
    publish_bulk(&ch, "near", 10, 32);
    let dir = TempDir::new("headroom");
    let opt_in = "  read_queues_with_delivery_limit: true\n";

    // The tool's first read: every message from 0 to 1.
    let (code, out, _) = backup(&vh, &dir, "headroom-1", opt_in);
    assert_eq!(code, Some(0), "{out}");
    // The application returns every message twice: now at 3 of 4, which the tool's record
    // does not know. The next read meets the first such message, stops there, and leaves
    // the queue alone from then on.
    return_all_counted(&conn, "near", 10);
    return_all_counted(&conn, "near", 10);
    let (code, out, m) = backup(&vh, &dir, "headroom-2", opt_in);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        m.queues.iter().all(|q| q.name != "near"),
        "the queue is left out"
    );
    assert!(
        out.contains("queue near in vhost")
            && out.contains("delivery limit of 4")
            && out.contains("x-delivery-count 3"),
        "the queue is named as skipped, with the count it met: {out}"
    );
    assert!(
        !dir.path().join("store/headroom-2/queues").exists()
            || walk(&dir.path().join("store/headroom-2/queues")).is_empty(),
        "the stopped read's segments are removed"
    );
    // The stop took one message: it is at the limit now, the others where they were.
    for night in 3..6 {
        let (code, out, _) = backup(&vh, &dir, &format!("headroom-{night}"), opt_in);
        assert_eq!(code, Some(4), "{out}");
        assert!(out.contains("delivery limit of 4"), "{out}");
    }
    // Without the opt-in it is left alone, untouched.
    let (code, out, _) = backup(&vh, &dir, "headroom-9", "");
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("delivery limit of 4"), "{out}");

    // Nothing was dropped. The message the read stopped at went back behind the others: the
    // application's returns had put them all in the quorum queue's returned messages, which
    // the broker serves in the order they came back.
    assert_eq!(depth(&conn, "near"), 10);
    let (order, counts) = drain(&conn, "near", 10);
    assert_eq!(order, [(1..10).collect::<Vec<_>>(), vec![0]].concat());
    assert_eq!(
        counts,
        [vec![3; 9], vec![4]].concat(),
        "only the message the read stopped at got one count more"
    );
}

/// The record of what earlier reads left in `queue` (`rmq-backup-state/delivery-counts/...`),
/// as JSON.
fn count_record(dir: &TempDir, vh: &TestVhost, queue: &str) -> serde_json::Value {
    let base = dir.path().join("store/rmq-backup-state/delivery-counts");
    let file = walk(&base)
        .into_iter()
        .find(|p| {
            p.ends_with(format!("{}/{queue}.json", vh.name))
                || p.to_string_lossy()
                    .ends_with(&format!("/{}/{queue}.json", vh.name))
        })
        .unwrap_or_else(|| panic!("no record of {queue} under {}", base.display()));
    serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
}

#[test]
fn a_killed_read_is_counted_before_it_takes_a_message() {
    let b = broker();
    if b.uncounted_nack() {
        eprintln!("RabbitMQ {}: a backup's give-back does not count", b.name);
        return;
    }
    let vh = TestVhost::new("killed-read");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let limit: FieldTable = vec![("x-delivery-limit".into(), FieldValue::I64(3))];
    declare(&ch, "orders", "quorum", limit);
    const N: usize = 30_000;
    publish_bulk(&ch, "orders", N, 64);
    let dir = TempDir::new("killed-read");
    let opt_in = "  read_queues_with_delivery_limit: true\n";
    let (code, out, _) = backup(&vh, &dir, "night-1", opt_in);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count_record(&dir, &vh, "orders")["max_delivery_count"], 1);

    // Night 2 is killed while it reads: the broker returns what its connection held, counted.
    let cfg = write_config(
        dir.path(),
        "night-2.yaml",
        &backup_yaml("night-2", &vh.name, &dir.path().join("store"), opt_in),
    );
    let (mut child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, "queue orders: 30000 messages at start");
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let r = count_record(&dir, &vh, "orders");
    assert_eq!(
        r["reading"], true,
        "written before the read took anything: {r}"
    );
    assert_eq!(r["max_delivery_count"], 2, "{r}");
    assert_eq!(depth(&conn, "orders"), N as u32);

    // Night 3 knows: one more read would leave messages at the limit. Not one is taken.
    let (code, out, m) = backup(&vh, &dir, "night-3", opt_in);
    assert_eq!(code, Some(4), "{out}");
    assert!(m.queues.is_empty(), "{out}");
    assert!(
        out.contains("x-delivery-count 2") && out.contains("a read that did not finish"),
        "{out}"
    );
    let (order, counts) = drain(&conn, "orders", N);
    // The killed read's messages went back behind the others: after night 1 every message was
    // among the quorum queue's returned messages, which the broker serves in the order they
    // came back (docs/reading-queues.md, "A run that dies").
    let held = order[0] as usize;
    assert_eq!(
        order[..N - held],
        (held as i64..N as i64).collect::<Vec<_>>(),
        "the messages night 2 did not take, in order, first"
    );
    let mut behind = order[N - held..].to_vec();
    behind.sort_unstable();
    assert_eq!(
        behind,
        (0..held as i64).collect::<Vec<_>>(),
        "then the ones it held (each of its windows given back by the broker on its own)"
    );
    assert!(
        counts.iter().all(|c| *c == 1 || *c == 2),
        "1 after night 1, 2 for what night 2 held, never 3: {:?}",
        counts.iter().max()
    );
    assert_eq!(
        counts.iter().filter(|c| **c == 2).count(),
        held,
        "exactly the messages night 2 held are at 2"
    );
}

#[test]
fn a_policy_set_after_the_listing_decides_the_read() {
    let b = broker();
    if b.uncounted_nack() {
        eprintln!("RabbitMQ {}: a backup's give-back does not count", b.name);
        return;
    }
    let vh = TestVhost::new("fresh-policy");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "a-first", "classic", FieldTable::new());
    publish_bulk(&ch, "a-first", 100_000, 16);
    let quorum: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )];
    ch.queue_declare("b-quorum", true, false, false, &quorum)
        .unwrap();
    publish_bulk(&ch, "b-quorum", 10, 16);
    // No limit when the run lists the queues (3.x: no policy is no limit)...
    if b.default_delivery_limit() {
        set_policy(
            &vh.name,
            "unlimited",
            "^b-quorum$",
            r#"{"delivery-limit":-1}"#,
        );
    }
    // The listing must know the queue's policies (a queue's first statistics), else the run
    // would ask again at its read anyway.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !management()
        .get_queue(&vh.name, "b-quorum")
        .is_ok_and(|q| q.policy_known)
    {
        assert!(std::time::Instant::now() < deadline, "no statistics");
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = TempDir::new("fresh-policy");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            "fresh",
            &vh.name,
            &dir.path().join("store"),
            "  max_concurrent_queues: 1\n",
        ),
    );
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, "queue a-first: 100000 messages at start");
    // ...and a limit of 3 by the time its read comes.
    set_policy(&vh.name, "limited", "^b-quorum$", r#"{"delivery-limit":3}"#);
    delete_policy(&vh.name, "unlimited");
    let out = child.wait_with_output().unwrap();
    let log = rest_of(&lines).join("\n");
    assert_eq!(out.status.code(), Some(4), "{log}");
    assert!(
        log.contains("skipped queue b-quorum") && log.contains("delivery limit of 3"),
        "decided on the policy in force at its read: {log}"
    );
    let counts: Vec<u64> = peek(&conn, "b-quorum", 10)
        .iter()
        .map(rmq_backup::broker::reader::delivery_count)
        .collect();
    assert!(
        counts.iter().all(|c| *c <= 1),
        "not read by the backup (the peek's own return may count): {counts:?}"
    );
}

#[test]
fn an_unlimited_policy_is_read_and_its_cost_named() {
    let b = broker();
    if b.uncounted_nack() || !b.default_delivery_limit() {
        eprintln!(
            "RabbitMQ {}: no default limit that a -1 policy lifts",
            b.name
        );
        return;
    }
    let vh = TestVhost::new("minus-one");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    // `declare` gives quorum queues x-delivery-limit -1 on this broker.
    declare(&ch, "parked", "quorum", FieldTable::new());
    publish_bulk(&ch, "parked", 20, 16);
    for _ in 0..20 {
        return_all_counted(&conn, "parked", 20);
    }
    let dir = TempDir::new("minus-one");
    let (code, out, m) = backup(&vh, &dir, "minus-one", "");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(m.queues[0].message_count, 20);
    assert_eq!(m.queues[0].delivery_counts_raised, Some(20), "{out}");
    assert!(
        out.contains("x-delivery-count 21")
            && out.contains("removing that policy would drop or dead-letter every message above the default limit of 20"),
        "the cost of the -1 is named: {out}"
    );
    assert_eq!(depth(&conn, "parked"), 20);
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
