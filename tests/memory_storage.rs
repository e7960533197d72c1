//! Backup and restore through `memory` storage, in one process (the memory backend lives as
//! long as the process), with the library API.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::{backup, inspect, repository::storage, restore};

#[test]
fn backup_and_restore_through_memory_storage() {
    let vh = TestVhost::new("memory");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "mem q", "quorum", FieldTable::new());
    let msgs = diverse_messages(80, 21, false);
    publish(&ch, "mem q", &msgs);

    let yaml = format!(
        "mode: backup\nbackup_id: mem-1\nsource:\n  amqp_url: \"{}\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{}\"]\n    types: [quorum]\nstorage:\n  backend: memory\nbackup:\n  segment_max_bytes: 20000\n  compression: zstd\n  compression_level: 19\n",
        amqp_url(&vh.name),
        management_url(),
        vh.name
    );
    let cfg = Config::from_yaml_str(&yaml).unwrap();
    let store = storage::open_config(&cfg.storage).unwrap();
    let summary = backup::run(&cfg, store.clone()).unwrap();
    assert_eq!(summary.messages, 80);
    assert!(
        summary.segments > 1,
        "segment_max_bytes 20000 rotates: {} segment(s)",
        summary.segments
    );
    assert_eq!(depth(&conn, "mem q"), 80);

    let listing = inspect::list(store.as_ref())
        .unwrap()
        .render(inspect::Format::Table)
        .unwrap();
    assert!(listing.contains("mem-1"), "{listing}");
    let report = inspect::validate(store.as_ref(), "mem-1", true).unwrap();
    assert!(report.is_valid(), "{:?}", report.problems);
    assert_eq!(report.records_checked, 80);

    let target = vh.sibling("target");
    let ryaml = format!(
        "mode: restore\nbackup_id: mem-1\ntarget:\n  amqp_url: \"{}\"\n  management_url: \"{}\"\n  management_username: guest\n  management_password: guest\nstorage:\n  backend: memory\nrestore:\n  publish_mode: direct-to-queue\n  definitions_selection:\n    queues: [\"mem q\"]\n  vhost_mapping:\n    \"{}\": \"{target}\"\n  rate_limit_messages_per_sec: 400\n",
        amqp_url("/"),
        management_url(),
        vh.name
    );
    let rcfg = Config::from_yaml_str(&ryaml).unwrap();
    // The definitions selection names queues only: the target vhost must exist already.
    management().create_vhost(&target).unwrap();
    management().set_permissions(&target, "guest").unwrap();
    let s = restore::run(&rcfg, storage::open_config(&rcfg.storage).unwrap()).unwrap();
    assert_eq!((s.published(), s.confirmed(), s.failed()), (80, 80, 0));
    let tconn = connect(&target);
    assert_same_as(
        &as_restored(&in_broker_order(&msgs, "quorum")),
        &peek(&tconn, "mem q", 80),
        Headers::Sorted,
        "restored from memory storage",
    );
    assert_eq!(
        management()
            .get_queue(&target, "mem q")
            .unwrap()
            .queue_type
            .map(|t| t.as_str()),
        Some("quorum")
    );
}
