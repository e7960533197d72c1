//! RabbitMQ 4.x cannot convert every message to the other protocol (docs/amqp-1-0.md,
//! "Reader disconnected"): an AMQP 1.0 message with a `uuid` or `char` application-property
//! read over AMQP 0-9-1, or a 0-9-1 message with a decimal header read over AMQP 1.0, makes
//! the broker close the reader's connection, and every message the read held goes back with
//! one more delivery count on a quorum queue. A backup that meets it ends that queue's read at
//! once with the remedy (no retry: each would cost the same again, measured on 4.3.6: four
//! attempts raised every held message's count by four), within a bounded time (an AMQP 1.0
//! read whose connection failed used to hang in its detach), the queue whole again; read over
//! the protocol its messages need, the same queue backs up. RabbitMQ 3.x has no AMQP 1.0 core:
//! the tests return early there.

mod common;

use common::proton::proton;
use common::*;
use rmq_backup::broker::amqp::{BasicProperties, FieldTable};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn is_4x() -> bool {
    if broker().version.0 < 4 {
        eprintln!("skipped: RabbitMQ 3.x has no AMQP 1.0 core");
        return false;
    }
    true
}

/// Runs the real binary, killed (and the test failed) when it runs for more than 120 s.
fn run_bounded(args: &[&str]) -> Output {
    let child = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rmq-backup");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("rmq-backup {args:?} still running after 120 s: a hang");
        }
    }
}

/// Waits (up to 60 s) until `queue` has `n` messages ready again.
fn whole_again(vh: &TestVhost, queue: &str, n: u32) {
    let conn = vh.connect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while depth(&conn, queue) != n {
        assert!(
            Instant::now() < deadline,
            "queue {queue} is not whole again"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn backup(vh: &TestVhost, dir: &TempDir, id: &str, extra: &str) -> (Output, String) {
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        &format!("{id}.yaml"),
        &backup_yaml(
            id,
            &vh.name,
            &store,
            &format!("  include_definitions: false\n  connection_retries: 3\n  connection_retry_backoff_ms: 100\n  segment_version: 2\n{extra}"),
        )
        .replace("  include_definitions: true\n", ""),
    );
    let out = run_bounded(&["backup", "--config", &cfg]);
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    (out, log)
}

#[test]
fn an_amqp_1_0_message_0_9_1_cannot_carry_ends_the_read_once_with_the_remedy() {
    if !is_4x() {
        return;
    }
    let vh = TestVhost::new("conv-091");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "mixed", "quorum", FieldTable::new());
    publish_bulk(&ch, "mixed", 3, 32);
    // Proton's second message carries uuid and char application-properties.
    proton(&["publish", &vh.name, "/queues/mixed", "2", "7"]);
    publish_bulk(&ch, "mixed", 3, 32);
    whole_again(&vh, "mixed", 8);
    let dir = TempDir::new("conv-091");

    let (out, log) = backup(&vh, &dir, "over-091", "");
    assert_eq!(out.status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Connection error: queue mixed in vhost ")
            && last.contains("the broker closed the connection of its AMQP 0-9-1 read")
            && last.contains("name the queue in backup.amqp10_queues")
            && last.contains("Not read again in this run"),
        "{log}"
    );
    assert!(
        !log.contains("retry 1 of 3"),
        "a failed conversion was retried:\n{log}"
    );
    whole_again(&vh, "mixed", 8);

    // Read over AMQP 1.0, the same queue backs up whole.
    let (out, log) = backup(&vh, &dir, "over-10", "  amqp10_queues: [\"mixed\"]\n");
    assert_eq!(out.status.code(), Some(0), "{log}");
    let m = manifest(&dir.path().join("store"), "over-10");
    assert_eq!(
        m.queues[0]
            .segments
            .iter()
            .map(|s| s.record_count)
            .sum::<u64>(),
        8
    );
    whole_again(&vh, "mixed", 8);
}

#[test]
fn a_0_9_1_message_amqp_1_0_cannot_carry_ends_the_read_once_with_the_remedy() {
    if !is_4x() {
        return;
    }
    let vh = TestVhost::new("conv-10");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "dec", "quorum", FieldTable::new());
    publish_bulk(&ch, "dec", 2, 32);
    // A decimal header (and every other 0-9-1 type) in the third message.
    let with_decimal = Msg {
        props: BasicProperties {
            headers: Some(every_header_type(3)),
            ..Default::default()
        },
        body: b"decimal".to_vec(),
    };
    publish(&ch, "dec", &[with_decimal]);
    publish_bulk(&ch, "dec", 2, 32);
    whole_again(&vh, "dec", 5);
    let dir = TempDir::new("conv-10");

    let (out, log) = backup(&vh, &dir, "over-10", "  amqp10_queues: [\"dec\"]\n");
    assert_eq!(out.status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Connection error: queue dec in vhost ")
            && last.contains("the broker closed the connection of its AMQP 1.0 read")
            && last.contains("(a header of type decimal)")
            && !last.contains("mc_amqpl"),
        "{log}"
    );
    assert!(
        !log.contains("retry 1 of 3"),
        "a failed conversion was retried:\n{log}"
    );
    whole_again(&vh, "dec", 5);

    // Read over AMQP 0-9-1, the same queue backs up whole.
    let (out, log) = backup(&vh, &dir, "over-091", "");
    assert_eq!(out.status.code(), Some(0), "{log}");
    whole_again(&vh, "dec", 5);
}
