//! Restore behaviours of SPEC.md ("restore" options, "Publish modes", "Storage layout",
//! "Errors"), each against the real broker: where mappings send each message, the rollback
//! snapshot, dry runs, damaged and missing segments, a publisher nack, and the `error_type` of
//! real failures.

mod common;

use common::*;
use rmq_backup::broker::amqp::{BasicProperties, Connection, FieldTable, FieldValue};
use rmq_backup::config::Config;
use rmq_backup::metrics;
use std::path::Path;

/// `n` messages with header `n` = `from`..`from + n` and a body naming it.
fn numbered(from: i64, n: i64) -> Vec<Msg> {
    (from..from + n)
        .map(|i| Msg {
            props: BasicProperties {
                headers: Some(vec![("n".into(), FieldValue::I64(i))]),
                ..Default::default()
            },
            body: format!("message {i}").into_bytes(),
        })
        .collect()
}

/// The `n` headers of every message in `queue`, in order (nothing taken away).
fn numbers(conn: &Connection, queue: &str) -> Vec<i64> {
    let n = depth(conn, queue) as usize;
    peek(conn, queue, n)
        .iter()
        .map(
            |d| match d.properties.headers.as_ref().and_then(|h| h.first()) {
                Some((k, FieldValue::I64(i))) if k == "n" => *i,
                other => panic!("{queue}: {other:?}"),
            },
        )
        .collect()
}

/// A fresh empty target vhost (deleted with `vh`).
fn target(vh: &TestVhost, suffix: &str) -> (String, Connection) {
    let t = vh.sibling(suffix);
    management().create_vhost(&t).unwrap();
    management().set_permissions(&t, "guest").unwrap();
    let conn = connect(&t);
    (t, conn)
}

/// `exchange orders (direct)`, queue `eu` bound with `eu`, queue `us` bound with `us`; 10
/// messages through the exchange to eu, 7 to us, and 3 to us through the default exchange.
fn seed_routed(vh: &TestVhost) -> Connection {
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.exchange_declare("orders", "direct", true, false, &FieldTable::new())
        .unwrap();
    for q in ["eu", "us"] {
        declare(&ch, q, "classic", FieldTable::new());
        ch.queue_bind(q, "orders", q, &FieldTable::new()).unwrap();
    }
    publish_via(&ch, "orders", "eu", &numbered(0, 10));
    publish_via(&ch, "orders", "us", &numbered(100, 7));
    publish_via(&ch, "", "us", &numbered(200, 3));
    conn
}

fn backup(vh: &TestVhost, store: &Path, id: &str, extra: &str) {
    let dir = store.parent().unwrap();
    let cfg = write_config(
        dir,
        &format!("{id}.yaml"),
        &backup_yaml(id, &vh.name, store, extra),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}

fn restore(dir: &Path, store: &Path, id: &str, name: &str, body: &str) -> std::process::Output {
    let cfg = write_config(dir, name, &restore_yaml(id, store, body));
    run_cli(&["restore", "--config", &cfg])
}

#[test]
fn mappings_decide_where_each_message_lands_in_both_publish_modes() {
    let vh = TestVhost::new("spec-mapping");
    let _src = seed_routed(&vh);
    let dir = TempDir::new("spec-mapping");
    let store = dir.path().join("store");
    backup(&vh, &store, "m", "");
    let us_all: Vec<i64> = (100..107).chain(200..203).collect();

    // exchange mode: orders -> orders2, and the default exchange's routing key follows the
    // queue mapping us -> us-new.
    let (t1, c1) = target(&vh, "target");
    let ch = c1.open_channel().unwrap();
    ch.exchange_declare("orders2", "direct", true, false, &FieldTable::new())
        .unwrap();
    for (q, key) in [("eu", "eu"), ("us-new", "us")] {
        declare(&ch, q, "classic", FieldTable::new());
        ch.queue_bind(q, "orders2", key, &FieldTable::new())
            .unwrap();
    }
    let out = restore(
        dir.path(),
        &store,
        "m",
        "r1.yaml",
        &format!(
            "  publish_mode: exchange\n  restore_definitions: false\n  vhost_mapping:\n    \"{v}\": \"{t1}\"\n  exchange_mapping:\n    orders: orders2\n  queue_mapping:\n    us: us-new\n",
            v = vh.name
        ),
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(numbers(&c1, "eu"), (0..10).collect::<Vec<_>>());
    assert_eq!(numbers(&c1, "us-new"), us_all);
    assert!(
        peek(&c1, "us-new", 10)
            .iter()
            .take(7)
            .all(|d| d.exchange == "orders2" && d.routing_key == "us"),
        "published to the mapped exchange with the original routing key"
    );

    // direct-to-queue: every record of a queue to its (mapped) name; exchange_mapping has no
    // part in it.
    let (t2, c2) = target(&vh, "target2");
    let out = restore(
        dir.path(),
        &store,
        "m",
        "r2.yaml",
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{v}\": \"{t2}\"\n  queue_mapping:\n    us: us-new\n",
            v = vh.name
        ),
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(numbers(&c2, "eu"), (0..10).collect::<Vec<_>>());
    assert_eq!(numbers(&c2, "us-new"), us_all);
    assert!(
        management().get_queue(&t2, "us").is_err(),
        "no queue under the unmapped name"
    );
    assert!(peek(&c2, "eu", 10)
        .iter()
        .all(|d| d.exchange.is_empty() && d.routing_key == "eu"));
}

#[test]
fn a_definitions_import_saves_the_targets_definitions_first_and_dry_runs_change_nothing() {
    let vh = TestVhost::new("spec-defs");
    let _src = seed_routed(&vh);
    let dir = TempDir::new("spec-defs");
    let store = dir.path().join("store");
    backup(&vh, &store, "d", "");
    let defs_dir = store.join("d").join("definitions");
    let rollbacks = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&defs_dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rollback-before-import-"))
            .collect();
        v.sort();
        v
    };
    let t = vh.sibling("target");
    let base = format!(
        "  publish_mode: direct-to-queue\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{t}\"\n",
        v = vh.name
    );

    // dry_run: nothing imported, nothing published, no snapshot.
    let out = restore(
        dir.path(),
        &store,
        "d",
        "dry.yaml",
        &format!("{base}  dry_run: true\n  create_missing_queues: true\n"),
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Dry run of restore d: nothing was published."),
        "{stdout}"
    );
    assert!(
        management().get_queue(&t, "eu").is_err(),
        "no vhost or queue created"
    );
    assert!(rollbacks().is_empty());

    // definitions_dry_run: the definitions are checked, not imported (no exchange, no
    // snapshot); the messages are published to the queues created for them.
    management().create_vhost(&t).unwrap();
    management().set_permissions(&t, "guest").unwrap();
    let out = restore(
        dir.path(),
        &store,
        "d",
        "defs-dry.yaml",
        &format!("{base}  definitions_dry_run: true\n  create_missing_queues: true\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let tconn = connect(&t);
    assert!(
        !exchange_exists(&t, "orders"),
        "the exchange must not be imported"
    );
    assert_eq!(depth(&tconn, "eu"), 10);
    assert!(rollbacks().is_empty());
    drop(tconn);
    management().delete_vhost(&t).unwrap();

    // A real import: the target's own definitions are saved first.
    let before = rmq_backup::now_ms();
    let out = restore(dir.path(), &store, "d", "import.yaml", &base);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let after = rmq_backup::now_ms();
    let saved = rollbacks();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let ms: i64 = saved[0]
        .trim_start_matches("rollback-before-import-")
        .trim_end_matches(".zst")
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", saved[0]));
    assert!(
        (before..=after).contains(&ms),
        "{ms} not in {before}..{after}"
    );
    let snapshot: serde_json::Value = serde_json::from_slice(
        &zstd::decode_all(&std::fs::read(defs_dir.join(&saved[0])).unwrap()[..]).unwrap(),
    )
    .unwrap();
    let vhosts: Vec<&str> = snapshot["vhosts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(vhosts.contains(&vh.name.as_str()), "{vhosts:?}");
    assert!(
        !vhosts.contains(&t.as_str()),
        "the snapshot is from before the import: {vhosts:?}"
    );
    assert!(exchange_exists(&t, "orders"), "imported now");
}

/// True when `GET /api/exchanges/{vhost}/{name}` finds the exchange.
fn exchange_exists(vhost: &str, name: &str) -> bool {
    let url = format!(
        "{}/api/exchanges/{}/{name}",
        management_url(),
        rmq_backup::broker::management::encode_segment(vhost)
    );
    match ureq::get(&url)
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call()
    {
        Ok(_) => true,
        Err(ureq::Error::StatusCode(404)) => false,
        Err(e) => panic!("{url}: {e}"),
    }
}

/// The value of one series of `broker_backup_errors` in this process (0 when absent).
fn errors(queue: &str, vhost: &str, error_type: &str) -> u64 {
    let series = format!(
        "broker_backup_errors{{queue=\"{queue}\",vhost=\"{vhost}\",error_type=\"{error_type}\"}} "
    );
    metrics::global()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_damaged_or_missing_segment_fails_its_queue_and_publishes_nothing_from_it() {
    let vh = TestVhost::new("spec-damage");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for q in ["a", "b"] {
        declare(&ch, q, "classic", FieldTable::new());
        publish(&ch, q, &numbered(0, 300));
    }
    let dir = TempDir::new("spec-damage");
    let store = dir.path().join("store");
    backup(&vh, &store, "x", "  segment_max_bytes: 8000\n");
    let m = manifest(&store, "x");
    let a = m.queues.iter().find(|q| q.name == "a").unwrap();
    assert!(a.segments.len() >= 3, "{}", a.segments.len());
    let first = a.segments[0].record_count as i64;
    let second = &a.segments[1];

    let run = |t: &str| -> rmq_backup::Error {
        let yaml = restore_yaml(
            "x",
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  max_concurrent_queues: 1\n  vhost_mapping:\n    \"{v}\": \"{t}\"\n",
                v = vh.name
            ),
        );
        let cfg = Config::from_yaml_str(&yaml).unwrap();
        let storage = rmq_backup::repository::storage::open_config(&cfg.storage).unwrap();
        rmq_backup::restore::run(&cfg, storage).expect_err("must fail")
    };

    // One byte flipped in the second segment of a: its CRC32 fails before any of its records
    // is published; the first segment went out, queue b whole.
    let path = store.join(&second.key);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let (t1, c1) = target(&vh, "target");
    let before = errors("a", &t1, "serialization");
    let e = run(&t1);
    assert!(
        e.to_string()
            .starts_with("Serialization error: CRC32 mismatch")
            && e.to_string()
                .ends_with(&format!("(segment {})", second.key)),
        "{e}"
    );
    assert_eq!(e.exit_code(), 1);
    assert_eq!(errors("a", &t1, "serialization"), before + 1);
    assert_eq!(numbers(&c1, "a"), (0..first).collect::<Vec<_>>());
    assert_eq!(numbers(&c1, "b"), (0..300).collect::<Vec<_>>());

    // The segment gone: a storage error naming it, the same queues published.
    std::fs::remove_file(&path).unwrap();
    let (t2, c2) = target(&vh, "target2");
    let before = errors("a", &t2, "storage");
    let e = run(&t2);
    assert_eq!(
        e.to_string(),
        format!("Storage error: Key not found: {}", second.key)
    );
    assert_eq!(errors("a", &t2, "storage"), before + 1);
    assert_eq!(numbers(&c2, "a"), (0..first).collect::<Vec<_>>());
    assert_eq!(numbers(&c2, "b"), (0..300).collect::<Vec<_>>());
    // And through the command line: exit 1.
    let (t3, _c3) = target(&vh, "mapped");
    let out = restore(
        dir.path(),
        &store,
        "x",
        "cli.yaml",
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{v}\": \"{t3}\"\n",
            v = vh.name
        ),
    );
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
}

#[test]
fn a_publisher_nack_fails_the_restore_and_names_the_queue() {
    let vh = TestVhost::new("spec-nack");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish(&ch, "q", &numbered(0, 20));
    let dir = TempDir::new("spec-nack");
    let store = dir.path().join("store");
    backup(&vh, &store, "n", "");
    // The target queue takes 5 messages and refuses the rest (reject-publish: a nack).
    let (t, tconn) = target(&vh, "target");
    let tch = tconn.open_channel().unwrap();
    declare(
        &tch,
        "q",
        "classic",
        vec![
            (
                "x-overflow".into(),
                FieldValue::LongString(b"reject-publish".to_vec()),
            ),
            ("x-max-length".into(), FieldValue::I32(5)),
        ],
    );
    let out = restore(
        dir.path(),
        &store,
        "n",
        "r.yaml",
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: false\n  vhost_mapping:\n    \"{v}\": \"{t}\"\n",
            v = vh.name
        ),
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    // The nacks may arrive over several waits for confirms: each logs its count, naming the
    // queue.
    let nacked: u64 = stderr
        .lines()
        .filter_map(|l| {
            l.split("ERROR ")
                .nth(1)?
                .strip_suffix(" message(s) nacked by the target broker for queue q")?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(nacked, 15, "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some("AMQP error: 15 message(s) were not accepted by the target broker (nacked or unroutable); see the log for the queues"),
        "{stderr}"
    );
    assert_eq!(numbers(&tconn, "q"), (0..5).collect::<Vec<_>>());
}
