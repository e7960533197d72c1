//! End to end against the real broker: seed queues with a diverse message set, back up with the
//! real binary, prove the source is unchanged, validate, restore to a fresh vhost, and compare
//! message by message.

mod common;

use common::*;
use rmq_backup::broker::amqp::{FieldTable, FieldValue};

#[test]
fn diverse_queues_round_trip_through_filesystem() {
    let vh = TestVhost::new("diverse");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let queues = [
        ("plain classic", "classic"),
        ("quorum/ünïcødé", "quorum"),
        ("with.dots and spaces", "classic"),
    ];
    let mut expected = Vec::new();
    for (i, (name, kind)) in queues.iter().enumerate() {
        declare(&ch, name, kind, FieldTable::new());
        let msgs = diverse_messages(120, 7 + i as u64, i == 0);
        publish(&ch, name, &msgs);
        expected.push(msgs);
    }
    // A priority queue: the broker's order is the one to keep.
    declare(
        &ch,
        "prio",
        "classic",
        vec![("x-max-priority".into(), FieldValue::U8(9))],
    );
    publish(&ch, "prio", &diverse_messages(60, 99, false));
    let prio_order = peek(&conn, "prio", 60);
    declare(&ch, "empty", "classic", FieldTable::new());
    declare(&ch, "skip-me", "classic", FieldTable::new());
    publish(&ch, "skip-me", &diverse_messages(5, 1, false));

    let dir = TempDir::new("diverse");
    let id = format!("diverse-{}", rmq_backup::now_ms());
    let cfg = write_config(
        dir.path(),
        "backup.yaml",
        &backup_yaml(
            &id,
            &vh.name,
            &dir.path().join("store"),
            "  segment_max_bytes: 200000\n",
        )
        .replace("    vhosts:", "    exclude: [\"skip-*\"]\n    vhosts:"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "backup failed: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("Backup {id} completed")),
        "{stdout}"
    );

    // The broker kept every message, in order.
    for ((name, kind), msgs) in queues.iter().zip(&expected) {
        assert_eq!(
            depth(&conn, name) as usize,
            msgs.len(),
            "{name}: depth after backup"
        );
        assert_same_as(
            &in_broker_order(msgs, kind),
            &peek(&conn, name, msgs.len()),
            Headers::of(kind),
            &format!("source {name} after backup"),
        );
    }
    assert_eq!(depth(&conn, "prio"), 60);

    let m = manifest(&dir.path().join("store"), &id);
    assert!(m.completed_at.is_some());
    let names: Vec<&str> = m.queues.iter().map(|q| q.name.as_str()).collect();
    assert!(
        !names.contains(&"skip-me"),
        "excluded queue was backed up: {names:?}"
    );
    assert!(names.contains(&"empty"));
    assert_eq!(m.total_messages, 3 * 120 + 60);
    let plain = m.queues.iter().find(|q| q.name == "plain classic").unwrap();
    assert!(
        plain.segments.len() > 1,
        "segment_max_bytes 200000 should rotate: {}",
        plain.segments.len()
    );
    assert_eq!(
        m.queues
            .iter()
            .find(|q| q.name == "quorum/ünïcødé")
            .unwrap()
            .queue_type
            .as_str(),
        "quorum"
    );
    assert!(m.definitions.is_some());

    let store_url = format!("file://{}", dir.path().join("store").display());
    let out = run_cli(&[
        "validate",
        "--path",
        &store_url,
        "--backup-id",
        &id,
        "--deep",
    ]);
    assert_eq!(out.status.code(), Some(0), "validate: {:?}", text(&out));

    // Restore into a fresh vhost created by the definitions import.
    let target = vh.sibling("target");
    let rcfg = write_config(
        dir.path(),
        "restore.yaml",
        &restore_yaml(
            &id,
            &dir.path().join("store"),
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "restore failed: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!(
            ": 5 queues, {n} messages published, {n} confirmed, 0 failed, 0 outside the time window,",
            n = 3 * 120 + 60
        )),
        "{stdout}"
    );

    // No record carries a header the broker added on delivery (the source was read again
    // and again, its quorum messages returned), and no restored message either: on 4.x a
    // freshly published message is delivered without any (3.x adds x-delivery-count: 0).
    let broker_headers = |d: &rmq_backup::broker::amqp::Delivery| -> Vec<String> {
        d.properties
            .headers
            .iter()
            .flatten()
            .filter(|(k, _)| BROKER_HEADERS.contains(&k.as_str()))
            .map(|(k, _)| k.clone())
            .collect()
    };
    for (name, _) in &queues {
        for d in backed_up(&dir.path().join("store"), &id, name) {
            assert_eq!(broker_headers(&d), Vec::<String>::new(), "{name}: a record");
        }
    }
    let tconn = connect(&target);
    for ((name, kind), msgs) in queues.iter().zip(&expected) {
        let got = peek(&tconn, name, msgs.len());
        if broker().is_4x() {
            for d in &got {
                assert_eq!(broker_headers(d), Vec::<String>::new(), "restored {name}");
            }
        }
        assert_same_as(
            &as_restored(&in_broker_order(msgs, kind)),
            &got,
            Headers::of(kind),
            &format!("restored {name}"),
        );
        assert_eq!(
            depth(&tconn, name) as usize,
            msgs.len(),
            "{name}: nothing extra restored"
        );
    }
    let restored_prio = peek(&tconn, "prio", 60);
    for (i, (a, b)) in prio_order.iter().zip(&restored_prio).enumerate() {
        assert_eq!(a.body, b.body, "prio message {i}");
        assert_eq!(
            comparable(&restored_props(&a.properties), Headers::InOrder),
            comparable(&b.properties, Headers::InOrder),
            "prio message {i}"
        );
    }
    assert_eq!(depth(&tconn, "empty"), 0);
    drop(tconn);
    let _ = management().delete_vhost(&target);
}

#[test]
fn exchange_mode_with_mappings_and_lz4() {
    let vh = TestVhost::new("exchange");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.exchange_declare("orders", "topic", true, false, &FieldTable::new())
        .unwrap();
    declare(&ch, "eu", "classic", FieldTable::new());
    ch.queue_bind("eu", "orders", "eu.#", &FieldTable::new())
        .unwrap();
    let msgs = diverse_messages(90, 3, false);
    publish_via(&ch, "orders", "eu.created", &msgs);

    let dir = TempDir::new("exchange");
    let store = dir.path().join("store");
    let id = format!("exchange-{}", rmq_backup::now_ms());
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            &id,
            &vh.name,
            &store,
            "  compression: lz4\n  requeue_strategy: reject\n",
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let m = manifest(&store, &id);
    assert!(
        m.queues[0].segments[0].key.ends_with(".lz4"),
        "{}",
        m.queues[0].segments[0].key
    );
    assert_same(
        &msgs,
        &peek(&conn, "eu", 90),
        "source after reject-strategy backup",
    );

    // Restore through the exchange, queue renamed by the mapping in the definitions.
    let target = vh.sibling("mapped");
    let rcfg = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "  publish_mode: exchange\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  queue_mapping:\n    eu: eu-restored\n  produce_batch_size: 7\n",
                v = vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&target);
    let got = peek(&tconn, "eu-restored", 90);
    assert_same(&as_restored(&msgs), &got, "restored via exchange");
    assert!(got
        .iter()
        .all(|d| d.exchange == "orders" && d.routing_key == "eu.created"));
    drop(tconn);
    let _ = management().delete_vhost(&target);
}

#[test]
fn restore_time_window_dry_run_and_missing_queue() {
    let vh = TestVhost::new("window");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "quorum", FieldTable::new());
    let msgs = diverse_messages(30, 5, false);
    publish(&ch, "q", &msgs);
    let dir = TempDir::new("window");
    let store = dir.path().join("store");
    let id = format!("window-{}", rmq_backup::now_ms());
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(&id, &vh.name, &store, "  compression: none\n"),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );
    let m = manifest(&store, &id);
    let last = m.queues[0].last_message_timestamp.unwrap();

    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let base = format!(
        "  publish_mode: direct-to-queue\n  restore_definitions: false\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
        v = vh.name
    );

    // Queue absent and not created: the broker's NOT_FOUND, nothing published.
    let r = write_config(dir.path(), "r1.yaml", &restore_yaml(&id, &store, &base));
    let out = run_cli(&["restore", "--config", &r]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("AMQP error: NOT_FOUND - no queue 'q' in vhost"),
        "{stderr}"
    );

    // Dry run: a plan, nothing published, no queue created.
    let r = write_config(
        dir.path(),
        "r2.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!("{base}  dry_run: true\n  create_missing_queues: true\n"),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("Dry run") && stdout.contains("30 messages in backup"),
        "{stdout}"
    );
    assert!(
        management().get_queue(&target, "q").is_err(),
        "dry run created a queue"
    );

    // A window that ends before the backup: nothing restored; created as a quorum queue.
    let r = write_config(
        dir.path(),
        "r3.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "{base}  create_missing_queues: true\n  time_window_end: {}\n",
                m.created_at - 1
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&target);
    assert_eq!(depth(&tconn, "q"), 0);
    let info = management().get_queue(&target, "q").unwrap();
    assert_eq!(info.queue_type.map(|t| t.as_str()), Some("quorum"));

    // A window that holds everything.
    let r = write_config(
        dir.path(),
        "r4.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "{base}  time_window_start: {}\n  time_window_end: {last}\n",
                m.created_at
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_same(
        &as_restored(&in_broker_order(&msgs, "quorum")),
        &peek(&tconn, "q", 30),
        "restored in window",
    );
    drop(tconn);
}

#[test]
fn a_failed_queue_leaves_an_interrupted_manifest_and_every_message_in_place() {
    let vh = TestVhost::new("interrupted");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "quorum", FieldTable::new());
    let msgs = diverse_messages(50, 8, false);
    publish(&ch, "q", &msgs);
    declare(&ch, "events", "stream", FieldTable::new());

    let dir = TempDir::new("interrupted");
    let store = dir.path().join("store");
    // A file where the queue segments' directory must go: every segment write fails.
    std::fs::create_dir_all(store.join("int")).unwrap();
    std::fs::write(store.join("int").join("queues"), b"in the way").unwrap();
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("int", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr
            .lines()
            .last()
            .unwrap_or("")
            .starts_with("Storage error: Failed to write int/queues/"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("skipped queue events"),
        "streams are read, not skipped: {stderr}"
    );
    let m = manifest(&store, "int");
    assert_eq!(
        m.completed_at, None,
        "a failed run must read as interrupted"
    );
    // Only the empty stream (nothing to write) made it; the quorum queue failed.
    assert_eq!(
        m.queues
            .iter()
            .map(|q| (q.name.as_str(), q.message_count))
            .collect::<Vec<_>>(),
        [("events", 0)]
    );
    assert_same_as(
        &in_broker_order(&msgs, "quorum"),
        &peek(&conn, "q", 50),
        Headers::Sorted,
        "source after a failed backup",
    );

    let url = format!("file://{}", store.display());
    let out = run_cli(&["list", "--path", &url, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["status"], "interrupted", "{rows}");
}

#[test]
fn auto_delete_queue_survives_its_backup() {
    let vh = TestVhost::new("autodelete");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("transient", false, false, true, &FieldTable::new())
        .unwrap();
    let msgs = diverse_messages(25, 6, false);
    publish(&ch, "transient", &msgs);
    let dir = TempDir::new("autodelete");
    let store = dir.path().join("store");
    // The default strategy (cancel) would delete the queue when its consumer goes.
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("ad", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(manifest(&store, "ad").queues[0].message_count, 25);
    assert_eq!(
        depth(&conn, "transient"),
        25,
        "the auto-delete queue is still there, whole"
    );
    let ch2 = conn.open_channel().unwrap();
    let got = ch2
        .basic_get("transient", false)
        .unwrap()
        .expect("a message");
    assert_eq!(got.delivery.body, msgs[0].body);
}

#[test]
fn unroutable_messages_fail_the_restore_even_without_confirms() {
    let vh = TestVhost::new("unroutable");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.exchange_declare("events", "direct", true, false, &FieldTable::new())
        .unwrap();
    declare(&ch, "sink", "classic", FieldTable::new());
    ch.queue_bind("sink", "events", "k", &FieldTable::new())
        .unwrap();
    publish_via(&ch, "events", "k", &diverse_messages(12, 9, false));
    let dir = TempDir::new("unroutable");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("u", &vh.name, &store, ""),
    );
    assert_eq!(
        run_cli(&["backup", "--config", &cfg]).status.code(),
        Some(0)
    );

    // The target has the exchange but no binding: every message comes back.
    let target = vh.sibling("target");
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let tconn = connect(&target);
    tconn
        .open_channel()
        .unwrap()
        .exchange_declare("events", "direct", true, false, &FieldTable::new())
        .unwrap();
    for confirms in [false, true] {
        let r = write_config(
            dir.path(),
            &format!("r-{confirms}.yaml"),
            &restore_yaml(
                "u",
                &store,
                &format!(
                    "  publish_mode: exchange\n  restore_definitions: false\n  publisher_confirms: {confirms}\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                    vh.name
                ),
            ),
        );
        let out = run_cli(&["restore", "--config", &r]);
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "confirms {confirms}: {stdout}{stderr}"
        );
        assert!(
            stderr.contains("AMQP error: 12 message(s) were not accepted by the target broker"),
            "confirms {confirms}: {stderr}"
        );
        assert!(stderr.contains("312 NO_ROUTE"), "{stderr}");
    }
}
