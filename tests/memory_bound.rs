//! Memory is bounded by bytes, not by queue depth: a queue of 1 MiB bodies backed up to a
//! storage that takes a while per segment holds a few segments' worth, never the queue (the
//! issue "Performance"; ARCHITECTURE.md invariants). In a binary of its own: it reads this
//! process's peak RSS.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::config::Config;
use rmq_backup::repository::storage::{self, Conditional, ObjectVersion, Storage};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A filesystem storage that sleeps before each segment it stores: reading goes faster than
/// storing, as with a slow network.
struct SlowStorage(Arc<dyn Storage>);

impl SlowStorage {
    fn pause(key: &str) {
        if key.contains("/queues/") {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Storage for SlowStorage {
    fn put_file(&self, key: &str, path: &Path) -> rmq_backup::Result<()> {
        SlowStorage::pause(key);
        self.0.put_file(key, path)
    }
    fn put_file_owned(&self, key: &str, path: &Path) -> rmq_backup::Result<()> {
        SlowStorage::pause(key);
        self.0.put_file_owned(key, path)
    }
    fn put_bytes(&self, key: &str, data: &[u8]) -> rmq_backup::Result<()> {
        SlowStorage::pause(key);
        self.0.put_bytes(key, data)
    }
    fn get_bytes(&self, key: &str) -> rmq_backup::Result<Vec<u8>> {
        self.0.get_bytes(key)
    }
    fn get_to_file(&self, key: &str, path: &Path) -> rmq_backup::Result<u64> {
        self.0.get_to_file(key, path)
    }
    fn head(&self, key: &str) -> rmq_backup::Result<Option<u64>> {
        self.0.head(key)
    }
    fn list(&self, prefix: &str) -> rmq_backup::Result<Vec<String>> {
        self.0.list(prefix)
    }
    fn delete(&self, key: &str) -> rmq_backup::Result<()> {
        self.0.delete(key)
    }
    fn put_bytes_new(&self, key: &str, data: &[u8]) -> rmq_backup::Result<Conditional> {
        self.0.put_bytes_new(key, data)
    }
    fn put_file_new(&self, key: &str, path: &Path) -> rmq_backup::Result<Conditional> {
        SlowStorage::pause(key);
        self.0.put_file_new(key, path)
    }
    fn get_with_version(&self, key: &str) -> rmq_backup::Result<Option<(Vec<u8>, ObjectVersion)>> {
        self.0.get_with_version(key)
    }
    fn put_bytes_if(
        &self,
        key: &str,
        data: &[u8],
        version: &ObjectVersion,
    ) -> rmq_backup::Result<Conditional> {
        self.0.put_bytes_if(key, data, version)
    }
    fn location(&self) -> String {
        self.0.location()
    }
}

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
    let slow: Arc<dyn Storage> =
        Arc::new(SlowStorage(storage::open_filesystem(&store, None).unwrap()));
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
