//! Manifests (`Manifest::from_json`), as read from storage before anything else of a backup,
//! and the checks `Manifest::read` makes on the keys they list (through a memory storage).
//!
//! Invariants beyond "no panic": errors are `Manifest error: Invalid manifest:` (or, from
//! `Manifest::read`, `Manifest error:` naming what lies outside the backup); a parsed manifest
//! writes (`to_json_pretty`) and reads back equal, and writing is then a fixed point; a
//! manifest `read` accepts lists only keys under `{backup_id}/` without `.` or `..`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::repository::manifest::{manifest_key, Manifest};
use rmq_backup::repository::storage::{MemoryStorage, Storage};
use rmq_backup::Error;

fuzz_target!(|data: &[u8]| {
    let m = match Manifest::from_json(data) {
        Ok(m) => m,
        Err(e) => {
            assert!(matches!(e, Error::Manifest(_)), "{e:?}");
            assert!(
                e.to_string()
                    .starts_with("Manifest error: Invalid manifest: "),
                "{e}"
            );
            return;
        }
    };
    let text = m.to_json_pretty().expect("a manifest serialises");
    let back = Manifest::from_json(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(back, m);
    assert_eq!(back.to_json_pretty().unwrap(), text);

    // What a restore, validate or describe does with it: read it from storage, under its id.
    let storage = MemoryStorage::named("fuzz-manifest");
    storage.clear();
    if storage
        .put_bytes(&manifest_key(&m.backup_id), data)
        .is_err()
    {
        return;
    }
    match Manifest::read(storage.as_ref(), &m.backup_id) {
        Ok(read) => {
            assert_eq!(read, m);
            let prefix = format!("{}/", m.backup_id);
            let keys = read
                .queues
                .iter()
                .flat_map(|q| q.segments.iter().map(|s| s.key.clone()))
                .chain(read.definitions.iter().map(|d| d.key.clone()));
            for k in keys {
                assert!(k.starts_with(&prefix), "{k:?} outside {prefix}");
                assert!(!k.split('/').any(|c| c == ".." || c == "."), "{k:?}");
            }
        }
        Err(e) => assert!(matches!(e, Error::Manifest(_) | Error::Storage(_)), "{e:?}"),
    }
});
