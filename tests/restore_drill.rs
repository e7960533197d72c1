//! Issue 40: the restore drill of the book (docs/restore-drill.md), `scripts/restore-drill.sh`,
//! passes against the suite's broker (RabbitMQ 4.3.6 unless `RMQ_TEST_BROKER` says otherwise)
//! in vhosts of its own, and says FAIL, exit 1, when it cannot do its job.

mod common;

use common::*;
use std::process::Command;

fn drill(vhost: &str, password: &str) -> (Option<i32>, String) {
    let b = broker();
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/restore-drill.sh"
    ))
    .env("RMQ_BACKUP_BIN", binary())
    .env("RMQ_DRILL_AMQP_PORT", b.amqp_port.to_string())
    .env("RMQ_DRILL_MANAGEMENT_PORT", b.management_port.to_string())
    .env("RMQ_DRILL_STREAM_PORT", b.stream_port.to_string())
    .env("RMQ_DRILL_USER", "guest")
    .env("RMQ_DRILL_PASSWORD", password)
    .env("RMQ_DRILL_VHOST", vhost)
    .env_remove("RMQ_DRILL_KEEP")
    .env_remove("RUST_LOG")
    .output()
    .expect("run scripts/restore-drill.sh");
    let (stdout, stderr) = text(&out);
    (out.status.code(), format!("{stdout}{stderr}"))
}

#[test]
fn the_restore_drill_passes() {
    let vhost = format!("rmqb-test-drill-{}", unique_suffix());
    let (code, out) = drill(&vhost, "guest");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.trim_end().ends_with("DRILL PASS"), "{out}");
    assert!(out.contains("consumer offset billing"), "{out}");
    // The drill removes its vhost.
    assert!(management().delete_vhost(&vhost).is_ok());
}

#[test]
fn the_restore_drill_says_fail_when_it_cannot_do_its_job() {
    let vhost = format!("rmqb-test-drill-{}", unique_suffix());
    let (code, out) = drill(&vhost, "not-the-password");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("DRILL FAIL: management API PUT"), "{out}");
    assert!(!out.contains("not-the-password"), "{out}");
}
