//! A broker whose management API keeps no message statistics (issue 30, item 4): RabbitMQ
//! 4.3.6 with `management_agent.disable_metrics_collector = true` (the `4.3-no-metrics` node of
//! scripts/setup-rabbitmq-4x.sh), where `/api/queues` lists no counts, `/api/consumers` answers
//! 400 and `/api/connections` lists nothing. A backup decides from the live counts of
//! `queue.declare-ok`, says what it cannot count, and a restore works as anywhere else.
//!
//! Every test here runs against that node, whatever RMQ_TEST_BROKER says.

mod common;

use common::*;
use rmq_backup::broker::amqp::{Connection, FieldTable};
use std::time::Duration;

/// Points the helpers of `common` at the node without statistics (every test of this file
/// does the same, so the tests may run side by side).
fn no_statistics_broker() {
    std::env::set_var("RMQ_TEST_BROKER", "4.3-no-metrics");
    let overview: serde_json::Value = ureq::get(&format!("{}/api/overview", management_url()))
        .header("authorization", MANAGEMENT_AUTH)
        .call()
        .expect("overview")
        .body_mut()
        .read_json()
        .expect("overview JSON");
    assert_eq!(
        overview["disable_stats"].as_bool(),
        Some(true),
        "the 4.3-no-metrics node keeps statistics: {overview}"
    );
}

const N: usize = 2_000;

fn seeded(tag: &str) -> (TestVhost, Connection) {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for (name, kind) in [("orders", "classic"), ("payments", "quorum")] {
        declare(&ch, name, kind, FieldTable::new());
        publish_bulk(&ch, name, N, 256);
    }
    let _ = ch.close();
    (vh, conn)
}

#[test]
fn a_backup_and_restore_work_without_message_statistics() {
    no_statistics_broker();
    let (vh, conn) = seeded("nostats-roundtrip");
    let dir = TempDir::new("nostats-roundtrip");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("nostats", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("keeps no message statistics"),
        "the run says how it decides: {stderr}"
    );
    let m = manifest(&store, "nostats");
    assert!(m.completed_at.is_some());
    for name in ["orders", "payments"] {
        let q = m.queues.iter().find(|q| q.name == name).unwrap();
        assert_eq!(q.message_count, N as u64, "{name}\n{stderr}");
        assert_eq!(
            depth(&conn, name) as usize,
            N,
            "{name} whole after the backup"
        );
    }

    // Restore into a vhost of its own, definitions included.
    let target = vh.sibling("target");
    let restore = format!(
        "  restore_definitions: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
        vh.name
    );
    let rcfg = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml("nostats", &store, &restore),
    );
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let restored = connect(&target);
    for name in ["orders", "payments"] {
        assert_eq!(
            seqs(&peek(&restored, name, N)),
            (0..N as i64).collect::<Vec<_>>(),
            "{name} restored whole and in order"
        );
    }
}

#[test]
fn consumers_a_backup_cannot_count_are_named_and_it_exits_4() {
    no_statistics_broker();
    let (vh, conn) = seeded("nostats-consumer");
    // Another application's consumer holding 500 of orders' messages.
    let mut options = rmq_backup::broker::amqp::ConnectOptions::new(
        rmq_backup::broker::amqp::AmqpUrl::parse(&amqp_url(&vh.name)).unwrap(),
    );
    options.connection_name = "billing-service".into();
    let foreign = Connection::open(&options).expect("foreign connection");
    let fch = foreign.open_channel().unwrap();
    fch.basic_qos(500, false).unwrap();
    let c = fch
        .basic_consume("orders", "billing", false, false, &FieldTable::new())
        .unwrap();
    for _ in 0..500 {
        c.recv_timeout(Duration::from_secs(30))
            .unwrap()
            .expect("a delivery");
    }
    let dir = TempDir::new("nostats-consumer");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("held", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains(&format!("queue orders in vhost {}", vh.name)))
        .unwrap_or_else(|| panic!("orders not named:\n{stdout}"));
    assert!(
        line.contains("statistics are off") && line.contains("1 consumer(s)"),
        "{line}"
    );
    let m = manifest(&store, "held");
    let orders = m.queues.iter().find(|q| q.name == "orders").unwrap();
    assert_eq!(orders.message_count, (N - 500) as u64, "the ready messages");
    let payments = m.queues.iter().find(|q| q.name == "payments").unwrap();
    assert_eq!(payments.message_count, N as u64);
    assert_eq!(payments.messages_left_out, None);
    drop(c);
    let _ = fch.close();
    let _ = foreign.close();
    assert_eq!(depth(&conn, "orders") as usize, N, "the source whole");
}
