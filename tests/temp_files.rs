//! Local temporary files of the checkpoint database (issue 31, item 11): a database fetched from
//! storage and a snapshot synced to it are written in a fresh private directory, in files
//! created new, never through a name planted in a shared directory. No broker: the storage is
//! the filesystem backend.
//!
//! The only test of this binary: it points `TMPDIR` (`std::env::temp_dir`) at its own
//! directory, which holds the planted links.

use rmq_backup::config::{OffsetBackend, OffsetStorageConfig};
use rmq_backup::repository::checkpoint::sync;
use rmq_backup::repository::checkpoint::Checkpoints;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

/// Before: every name in the temp directory was `<n>-rmq-backup-offsets-fetch.rbak` (n a
/// process-wide counter from 0), opened with `File::create`, which follows a symlink: the fetch
/// wrote the database through the planted link into the victim file.
#[test]
fn checkpoint_copies_never_follow_a_link_planted_in_a_shared_directory() {
    let root = std::env::temp_dir().join(format!("rmqb-temp-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (tmp, store, db) = (root.join("tmp"), root.join("store"), root.join("db"));
    for d in [&tmp, &store, &db] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::env::set_var("TMPDIR", &tmp);
    assert_eq!(std::env::temp_dir(), tmp);
    let victim = root.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    // Every name the earlier versions used, each a link to the victim.
    let planted: Vec<PathBuf> = (0..64)
        .flat_map(|n| {
            [
                tmp.join(format!("{n}-rmq-backup-offsets-fetch.rbak")),
                tmp.join(format!("{n}-rmq-backup-offsets-snapshot.rbak")),
                db.join(format!("{n}-_offsets-fetch.rbak")),
            ]
        })
        .collect();
    for p in &planted {
        symlink(&victim, p).unwrap();
    }

    let storage = rmq_backup::repository::storage::open_filesystem(&store, None).unwrap();
    let key = "b/state/offsets.db";
    let checkpoints = Checkpoints::open_memory().unwrap();
    sync::push(&checkpoints, storage.as_ref(), key).unwrap();
    assert!(storage.head(key).unwrap().is_some_and(|n| n > 0));
    // Fetched into memory, and into a database file beside the planted links.
    for (backend, db_path) in [
        (OffsetBackend::Memory, db.join("unused.db")),
        (OffsetBackend::Sqlite, db.join("offsets.db")),
    ] {
        let cfg = OffsetStorageConfig {
            backend,
            db_path,
            s3_key: Some(key.to_string()),
            sync_interval_secs: 30,
        };
        sync::open(&cfg, storage.as_ref()).unwrap();
    }
    assert!(db.join("offsets.db").is_file());
    let now = std::fs::read(&victim).unwrap();
    assert!(
        now == b"precious",
        "written through a planted link: the victim now holds {} bytes",
        now.len()
    );
    // Nothing left behind but the planted links (and the fetched database).
    let mut left: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .unwrap()
        .chain(std::fs::read_dir(&db).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    left.retain(|p| !planted.contains(p));
    assert_eq!(left, [db.join("offsets.db")]);
    let _ = std::fs::remove_dir_all(&root);
}
