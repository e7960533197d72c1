//! `backup --dry-run` on a real vhost: the queues that would be read with their depth and
//! bytes from the management API, the selected ones that would be skipped and why, the storage
//! prefix; exit 0, and nothing written (the storage directory is not even created).

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};
use std::time::{Duration, Instant};

/// Waits (at most 60 s) until the management API reports `n` messages in `queue`.
fn wait_stats(vhost: &str, queue: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let q = management().get_queue(vhost, queue).expect("queue");
        if q.messages == n && q.message_bytes > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "stats of {queue}: {q:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn dry_run_shows_queues_and_skipped_ones_and_writes_nothing() {
    let vh = TestVhost::new("dryrun");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    declare(&ch, "events", "quorum", FieldTable::new());
    declare(&ch, "ticks", "stream", FieldTable::new());
    declare(
        &ch,
        "limited",
        "quorum",
        vec![("x-delivery-limit".into(), FieldValue::I32(5))],
    );
    // Exclusive to this connection, which stays open during the dry run.
    ch.queue_declare("mine", false, true, false, &FieldTable::new())
        .expect("exclusive queue");
    publish_bulk(&ch, "orders", 50, 1000);
    publish_bulk(&ch, "events", 7, 100);
    wait_stats(&vh.name, "orders", 50);
    wait_stats(&vh.name, "events", 7);

    let dir = TempDir::new("dryrun");
    let store = dir.path().join("store");
    let id = "planned";
    let cfg = write_config(dir.path(), "b.yaml", &backup_yaml(id, &vh.name, &store, ""));

    let out = run_cli(&["backup", "--config", &cfg, "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("Dry run of backup planned"), "{stdout}");
    assert!(
        stdout.contains(&format!("Storage: file://{}/planned/", store.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("orders") && stdout.contains("events"),
        "{stdout}"
    );
    // Where a backup's give-back counts (before RabbitMQ 4.3), the delivery-limited quorum
    // queue would be left alone; on 4.3 it is read.
    let limited_skipped = !broker().uncounted_nack();
    let skips = if limited_skipped { 2 } else { 1 };
    assert!(
        stdout.contains(&format!("Would skip {skips} selected queue(s)")),
        "{stdout}"
    );
    assert!(
        stdout.contains("it is exclusive to another connection"),
        "{stdout}"
    );
    assert_eq!(
        stdout.contains("delivery limit of 5"),
        limited_skipped,
        "{stdout}"
    );
    assert!(!store.exists(), "the dry run created {}", store.display());

    let out = run_cli(&["backup", "--config", &cfg, "--dry-run", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON plan");
    assert_eq!(v["backup_id"], id);
    assert_eq!(v["definitions"], true);
    assert_eq!(v["compression"], "zstd");
    let queues = v["queues"].as_array().unwrap();
    let names: Vec<&str> = queues.iter().map(|q| q["name"].as_str().unwrap()).collect();
    if limited_skipped {
        assert_eq!(names, ["events", "orders", "ticks"]);
    } else {
        assert_eq!(names, ["events", "limited", "orders", "ticks"]);
    }
    let named = |n: &str| &queues[names.iter().position(|x| *x == n).unwrap()];
    assert_eq!(named("ticks")["queue_type"], "stream");
    let orders = named("orders");
    assert_eq!(orders["vhost"], vh.name.as_str());
    assert_eq!(orders["queue_type"], "classic");
    assert_eq!(orders["messages"], 50);
    assert_eq!(orders["message_bytes"], 50_000);
    assert!(orders["estimated_stored_bytes"].as_u64().unwrap() > 50_000);
    assert_eq!(named("events")["queue_type"], "quorum");
    assert_eq!(v["total_messages"], 57);
    let mut skipped: Vec<&str> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    skipped.sort();
    if limited_skipped {
        assert_eq!(skipped, ["limited", "mine"]);
    } else {
        assert_eq!(skipped, ["mine"]);
    }
    assert!(!store.exists());
    // The queues are untouched.
    assert_eq!(depth(&conn, "orders"), 50);

    // A configuration error is still exit 2, before anything.
    let bad = write_config(dir.path(), "bad.yaml", "mode: backup\n");
    let out = run_cli(&["backup", "--config", &bad, "--dry-run"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    drop(conn);
}
