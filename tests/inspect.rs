//! `list`, `describe` and `validate [--deep]` through the real binary, on a real backup, and
//! every kind of segment damage detected with SPEC.md's message and exit code 3.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::manifest::Manifest;
use std::path::{Path, PathBuf};

/// Backs up one small queue and returns (temp dir, store dir, backup id).
fn small_backup(tag: &str) -> (TestVhost, TempDir, PathBuf, String) {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q one", "classic", FieldTable::new());
    publish(&ch, "q one", &diverse_messages(40, 2, false));
    let dir = TempDir::new(tag);
    let store = dir.path().join("store");
    let id = format!("{tag}-backup");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(&id, &vh.name, &store, "  segment_max_bytes: 30000\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    (vh, dir, store, id)
}

fn segments(store: &Path, id: &str) -> Vec<PathBuf> {
    let m =
        Manifest::from_json(&std::fs::read(store.join(id).join("manifest.json")).unwrap()).unwrap();
    m.queues
        .iter()
        .flat_map(|q| &q.segments)
        .map(|s| store.join(&s.key))
        .collect()
}

/// Rewrites the footer CRC so that only the intended damage remains.
fn fix_crc(bytes: &mut [u8]) {
    let n = bytes.len();
    let crc = crc32fast::hash(&bytes[..n - 8]);
    bytes[n - 8..n - 4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn list_describe_validate_and_every_damage() {
    let (_vh, _dir, store, id) = small_backup("inspect");
    let url = format!("file://{}", store.display());

    let out = run_cli(&["list", "--path", &url]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("BACKUP ID") && stdout.contains(&id) && stdout.contains("completed"),
        "{stdout}"
    );
    let out = run_cli(&["list", "--path", &url, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list json");
    assert_eq!(v[0]["backup_id"], id.as_str());
    assert_eq!(v[0]["total_messages"], 40);

    let out = run_cli(&["describe", "--path", &url, "--backup-id", &id]);
    let (stdout, _) = text(&out);
    assert!(
        stdout.contains("q one") && stdout.contains("classic") && stdout.contains("40"),
        "{stdout}"
    );
    let out = run_cli(&[
        "describe",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--format=json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("describe json");
    assert_eq!(v["queues"][0]["name"], "q one");
    assert!(v["broker_version"].is_string());

    let out = run_cli(&["validate", "--path", &url, "--backup-id", &id, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert!(text(&out).0.contains("is valid"));

    let segs = segments(&store, &id);
    assert!(segs.len() >= 3, "need several segments, got {}", segs.len());
    let original: Vec<Vec<u8>> = segs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let restore_all = || {
        for (p, b) in segs.iter().zip(&original) {
            std::fs::write(p, b).unwrap();
        }
    };

    let manifest_path = store.join(&id).join("manifest.json");
    let manifest_bytes = std::fs::read(&manifest_path).unwrap();
    type Damage = fn(&mut Vec<u8>);
    // (case, damage, whether the manifest's SHA-256 is rewritten to match so that the damage
    // behind it shows, expected message)
    let cases: Vec<(&str, Damage, bool, &str)> = vec![
        (
            "bad magic",
            |b| b[..4].copy_from_slice(b"XXXX"),
            false,
            "Serialization error: Invalid segment magic bytes",
        ),
        (
            "crc",
            |b| {
                let i = b.len() / 2;
                b[i] ^= 0x55
            },
            false,
            "Serialization error: CRC32 mismatch: expected ",
        ),
        (
            "version",
            |b| {
                b[4] = 4;
                fix_crc(b)
            },
            false,
            "Serialization error: Unsupported segment version: 4",
        ),
        (
            "sha",
            |b| {
                let n = b.len();
                b[n - 9] ^= 0x01;
                fix_crc(b)
            },
            false,
            "Serialization error: SHA-256 mismatch: expected ",
        ),
        (
            "count",
            |b| {
                b[8] = b[8].wrapping_add(1);
                fix_crc(b)
            },
            true,
            "Serialization error: Expected ",
        ),
        (
            "truncated",
            |b| b.truncate(20),
            false,
            "Serialization error:",
        ),
    ];
    for (name, damage, rewrite_sha, expected) in cases {
        let mut bytes = original[1].clone();
        damage(&mut bytes);
        std::fs::write(&segs[1], &bytes).unwrap();
        if rewrite_sha {
            let new_sha = rmq_backup::repository::segment::sha256_file(&segs[1]).unwrap();
            let mut m = Manifest::from_json(&manifest_bytes).unwrap();
            for s in m.queues.iter_mut().flat_map(|q| q.segments.iter_mut()) {
                if store.join(&s.key) == segs[1] {
                    s.checksum = new_sha.clone();
                }
            }
            std::fs::write(&manifest_path, m.to_json_pretty().unwrap()).unwrap();
        }
        let out = run_cli(&["validate", "--path", &url, "--backup-id", &id, "--deep"]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(3), "{name}: {stdout}{stderr}");
        assert!(
            stdout.contains(expected),
            "{name}: expected {expected:?} in\n{stdout}"
        );
        assert!(stdout.contains("DAMAGED"), "{name}: {stdout}");
        restore_all();
        std::fs::write(&manifest_path, &manifest_bytes).unwrap();
    }

    // A missing segment: a shallow validate sees it too.
    std::fs::remove_file(&segs[0]).unwrap();
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("validate json");
    assert!(
        v["problems"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("Storage error: Key not found: "),
        "{v}"
    );
    restore_all();

    // Every damaged segment is reported, not just the first.
    for p in &segs {
        let mut b = std::fs::read(p).unwrap();
        b[..4].copy_from_slice(b"NOPE");
        std::fs::write(p, &b).unwrap();
    }
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--deep",
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["problems"].as_array().unwrap().len(), segs.len());
    restore_all();

    // An absent backup.
    let out = run_cli(&["validate", "--path", &url, "--backup-id", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out).1.trim(),
        "Storage error: Key not found: nope/manifest.json"
    );
}

/// Issue "Defects found by test and review": a manifest whose segment key points into another
/// backup's prefix is refused before anything is fetched or published, by validate and restore.
#[test]
fn a_manifest_key_into_another_backup_is_refused() {
    let (vh, dir, store, id) = small_backup("foreign-key");
    // A second backup beside it, whose segment the first manifest is made to list.
    let cfg = write_config(
        dir.path(),
        "b2.yaml",
        &backup_yaml("other", &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let other = segments(&store, "other");
    let foreign = other[0].strip_prefix(&store).unwrap().display().to_string();
    let path = store.join(&id).join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["queues"][0]["segments"][0]["key"] = serde_json::Value::String(foreign.clone());
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();

    let url = format!("file://{}", store.display());
    let out = run_cli(&["validate", "--path", &url, "--backup-id", &id, "--deep"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "Manifest error: {id}/manifest.json lists {foreign:?}, which lies outside backup {id}: refused before anything is read"
        )
    );
    let target = vh.sibling("target");
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  vhost_mapping:\n    \"{}\": \"{target}\"\n",
                vh.name
            ),
        ),
    );
    let out = run_cli(&["restore", "--config", &r]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("lies outside backup"), "{stderr}");
    // Nothing was imported or published: the target vhost does not exist.
    assert!(management().get_queue(&target, "q one").is_err());
}
