use super::sync::{open, push};
use super::*;
use crate::config::{OffsetBackend, OffsetStorageConfig};
use crate::repository::storage::memory::MemoryStorage;
use crate::repository::storage::Storage;
use std::path::PathBuf;
use std::sync::Arc;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "rmqb-cp-{tag}-{}-{}",
        std::process::id(),
        crate::now_ms()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn seg(sequence: u64) -> SegmentMetadata {
    SegmentMetadata {
        key: format!("b/queues/v/q/segment-{sequence:04}.zst"),
        sequence,
        record_count: 10,
        size_bytes: 100,
        uncompressed_bytes: 300,
        first_timestamp: Some(1),
        last_timestamp: Some(2),
        checksum: "ab".repeat(32),
        encryption: None,
        recipients: None,
        segment_version: None,
    }
}

#[test]
fn backup_queues_start_store_segments_and_complete() {
    let cp = Checkpoints::open_memory().unwrap();
    assert_eq!(cp.backup_queue("b", "v", "q").unwrap(), None);
    cp.start_backup_queue("b", "v", "q", 20).unwrap();
    cp.backup_segment_stored("b", "v", "q", &seg(2), Some((10, 19)))
        .unwrap();
    cp.backup_segment_stored("b", "v", "q", &seg(1), None)
        .unwrap();
    let state = cp.backup_queue("b", "v", "q").unwrap().unwrap();
    assert_eq!(state.target_count, 20);
    assert!(!state.completed);
    let stored = |s, offsets| StoredSegment {
        metadata: seg(s),
        offsets,
    };
    assert_eq!(
        state.segments,
        vec![stored(1, None), stored(2, Some((10, 19)))],
        "in sequence order"
    );
    cp.complete_backup_queue("b", "v", "q").unwrap();
    assert!(cp.backup_queue("b", "v", "q").unwrap().unwrap().completed);
    // Other backups and queues are apart.
    assert_eq!(cp.backup_queue("other", "v", "q").unwrap(), None);
    // Starting again forgets the segments of the earlier run.
    cp.start_backup_queue("b", "v", "q", 25).unwrap();
    let again = cp.backup_queue("b", "v", "q").unwrap().unwrap();
    assert_eq!((again.target_count, again.completed), (25, false));
    assert!(again.segments.is_empty());
}

#[test]
fn restore_progress_is_kept_per_source_and_target() {
    let cp = Checkpoints::open_memory().unwrap();
    let key = RestoreKey {
        backup_id: "b".into(),
        source_vhost: "v".into(),
        source_queue: "q".into(),
        target_vhost: "t".into(),
        target_queue: "q2".into(),
    };
    assert_eq!(cp.restore_queue(&key).unwrap(), None);
    cp.restore_progress(&key, 500, false).unwrap();
    assert_eq!(cp.restore_queue(&key).unwrap(), Some((500, false)));
    cp.restore_progress(&key, 900, true).unwrap();
    assert_eq!(cp.restore_queue(&key).unwrap(), Some((900, true)));
    let other = RestoreKey {
        target_queue: "q3".into(),
        ..key.clone()
    };
    assert_eq!(cp.restore_queue(&other).unwrap(), None);
}

#[test]
fn a_file_database_survives_reopening() {
    let dir = temp_dir("reopen");
    let path = dir.join("offsets.db");
    {
        let cp = Checkpoints::open_file(&path).unwrap();
        cp.start_backup_queue("b", "v", "q", 3).unwrap();
        cp.complete_backup_queue("b", "v", "q").unwrap();
    }
    let cp = Checkpoints::open_file(&path).unwrap();
    assert!(cp.backup_queue("b", "v", "q").unwrap().unwrap().completed);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_database_paths_and_files_are_clear_errors() {
    let dir = temp_dir("bad");
    let err = Checkpoints::open_file(&dir).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "Checkpoint error: unable to open database file: {} (it is a directory)",
            dir.display()
        )
    );
    assert_eq!(err.exit_code(), 2);
    let missing = dir.join("no/such/dir/offsets.db");
    let err = Checkpoints::open_file(&missing).err().unwrap();
    assert!(err
        .to_string()
        .starts_with("Checkpoint error: unable to open database file: "));
    assert_eq!(err.exit_code(), 2);
    let garbage = dir.join("garbage.db");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let err = Checkpoints::open_file(&garbage).err().unwrap();
    assert!(
        err.to_string().starts_with(&format!(
            "Checkpoint error: database {} is not a checkpoint database or is corrupt",
            garbage.display()
        )),
        "{err}"
    );
    assert_eq!(err.exit_code(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = temp_dir("schema");
    let path = dir.join("offsets.db");
    drop(Checkpoints::open_file(&path).unwrap());
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    let err = Checkpoints::open_file(&path).err().unwrap();
    assert!(err.to_string().contains("has schema version"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_synced_database_is_fetched_on_a_fresh_machine() {
    let storage: Arc<dyn Storage> = MemoryStorage::named(&format!("cp-sync-{}", line!()));
    let dir = temp_dir("sync");
    let cfg = OffsetStorageConfig {
        backend: OffsetBackend::Sqlite,
        db_path: dir.join("offsets.db"),
        s3_key: Some("b/state/offsets.db".into()),
        sync_interval_secs: 30,
    };
    let cp = open(&cfg, storage.as_ref()).unwrap();
    cp.start_backup_queue("b", "v", "q", 7).unwrap();
    cp.backup_segment_stored("b", "v", "q", &seg(1), None)
        .unwrap();
    push(&cp, storage.as_ref(), "b/state/offsets.db").unwrap();
    drop(cp);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    // The local file is gone: fetched from the key.
    let cp = open(&cfg, storage.as_ref()).unwrap();
    let state = cp.backup_queue("b", "v", "q").unwrap().unwrap();
    assert_eq!(
        state.segments,
        vec![StoredSegment {
            metadata: seg(1),
            offsets: None
        }]
    );
    // And into memory.
    let mem = OffsetStorageConfig {
        backend: OffsetBackend::Memory,
        ..cfg.clone()
    };
    let cp = open(&mem, storage.as_ref()).unwrap();
    assert_eq!(
        cp.backup_queue("b", "v", "q")
            .unwrap()
            .unwrap()
            .target_count,
        7
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_state_of_a_backup_is_kept_for_its_creation_time_only() {
    let cp = Checkpoints::open_memory().unwrap();
    assert_eq!(cp.backup_created_at("b").unwrap(), None);
    cp.begin_backup("b", 1_000).unwrap();
    cp.start_backup_queue("b", "v", "q", 5).unwrap();
    cp.backup_segment_stored("b", "v", "q", &seg(1), None)
        .unwrap();
    cp.start_backup_queue("other", "v", "q", 5).unwrap();
    assert_eq!(cp.backup_created_at("b").unwrap(), Some(1_000));
    // Another backup with the same id: everything of the first is forgotten.
    cp.begin_backup("b", 2_000).unwrap();
    assert_eq!(cp.backup_created_at("b").unwrap(), Some(2_000));
    assert_eq!(cp.backup_queue("b", "v", "q").unwrap(), None);
    assert!(cp.backup_queue("other", "v", "q").unwrap().is_some());
}

#[test]
fn a_version_1_database_is_upgraded_and_keeps_its_rows() {
    let dir = temp_dir("v1");
    let path = dir.join("offsets.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             INSERT INTO meta VALUES ('schema_version', '1');
             CREATE TABLE backup_queues (
                backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
                target_count INTEGER NOT NULL, last_segment INTEGER NOT NULL DEFAULT 0,
                completed INTEGER NOT NULL DEFAULT 0, stream_offset INTEGER, updated_at INTEGER NOT NULL,
                PRIMARY KEY (backup_id, vhost, queue));
             CREATE TABLE backup_segments (
                backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
                sequence INTEGER NOT NULL, metadata TEXT NOT NULL,
                PRIMARY KEY (backup_id, vhost, queue, sequence));",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO backup_queues VALUES ('b', 'v', 'q', 3, 1, 1, NULL, 0)",
            [],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO backup_segments VALUES ('b', 'v', 'q', 1, ?1)",
            [serde_json::to_string(&seg(1)).unwrap()],
        )
        .unwrap();
    }
    let cp = Checkpoints::open_file(&path).unwrap();
    let state = cp.backup_queue("b", "v", "q").unwrap().unwrap();
    assert_eq!(state.segments[0].offsets, None);
    assert_eq!(state.segments[0].metadata, seg(1));
    // Not a backup of a known creation time: a rerun does not trust it.
    assert_eq!(cp.backup_created_at("b").unwrap(), None);
    cp.backup_segment_stored("b", "v", "q", &seg(2), Some((5, 9)))
        .unwrap();
    drop(cp);
    let again = Checkpoints::open_file(&path).unwrap();
    assert_eq!(
        again.backup_queue("b", "v", "q").unwrap().unwrap().segments[1].offsets,
        Some((5, 9))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
