//! Memory is bounded by bytes, not by queue depth: a queue of 1 MiB bodies backed up to a
//! storage that takes a while per segment holds a few segments' worth, never the queue (the
//! issue "Performance"; ARCHITECTURE.md invariants). In a binary of its own: it reads this
//! process's peak RSS.

mod common;

use common::hooked_storage::{Access, Hooked};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::repository::storage::{self, Storage};
use std::sync::Arc;
use std::time::Duration;

/// This process's peak resident set, in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[test]
fn a_slow_storage_slows_reading_instead_of_growing_memory() {
    const N: usize = 120;
    const MIB: usize = 1 << 20;
    let vh = TestVhost::new("membound");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "big", "classic", FieldTable::new());
    publish_bulk(&ch, "big", N, MIB);
    let dir = TempDir::new("membound");
    let store = dir.path().join("store");
    let cfg = Config::from_yaml_str(&backup_yaml(
        "m",
        &vh.name,
        &store,
        "  segment_max_bytes: 16777216\n  compression: lz4\n",
    ))
    .unwrap();
    // Sleeps before each segment it stores: reading goes faster than storing, as with a slow
    // network.
    let slow: Arc<dyn Storage> = Hooked::new(
        storage::open_filesystem(&store, None).unwrap(),
        |access, key| {
            if access == Access::Write && key.contains("/queues/") {
                std::thread::sleep(Duration::from_millis(300));
            }
            Ok(())
        },
    );
    let before = peak_rss_kib();
    let summary = rmq_backup::backup::run(&cfg, slow).expect("backup");
    let grown = peak_rss_kib().saturating_sub(before);
    // 120 MiB of bodies (about 430 MiB of record JSON) went through; what was held at once is
    // a few segments' worth: the consumer's batches, the queue thread's batches, the
    // compressors. The slow storage made the reader wait, not the process grow.
    println!(
        "{N} x 1 MiB through a slow storage: peak RSS grew by {} MiB",
        grown / 1024
    );
    assert_eq!(summary.messages, N as u64);
    assert!(summary.segments >= 10, "{} segments", summary.segments);
    assert!(
        grown < 96 * 1024,
        "peak RSS grew by {} MiB for {N} MiB of bodies",
        grown / 1024
    );
    assert_eq!(depth(&conn, "big") as usize, N);
}
