//! Issue 38, items 2-4: what a copy rerun, a definitions export and a storage that keeps its
//! objects do to `copy`, `validate --deep` and `restore`, on real backups of the test broker.
//!
//! - A copy killed half way (an upload held back by a proxy before SeaweedFS) and run again
//!   with another `--recipient` is readable with the new identity only (item 2).
//! - A definitions export altered or cut short in storage is refused by `copy` (even without an
//!   identity), `validate --deep` and `restore` (item 3).
//! - A copy into a storage that refuses to replace an object (fake-gcs-server behind
//!   `hooked_storage`, refusing a write over an existing key outside `{backup_id}/state/` as a
//!   GCS bucket retention policy does: `403 ... is subject to bucket's retention policy ... cannot
//!   be deleted or overwritten`) writes each object once, across an interrupted run and its
//!   rerun; a rerun to other recipients there stops with an error that says how to finish
//!   (item 4).

mod common;

use common::buckets::GcsBucket;
use common::hooked_storage::{Access, Hooked};
use common::http_proxy::{Fault, HttpProxy};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::copy::{copy, CopyOptions, Progress};
use rmq_backup::repository::encryption::{generate, Identities, Recipients};
use rmq_backup::repository::storage::Storage;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn identity(dir: &Path, name: &str, secret: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// A backup `id` of queues `q0` and `q1` (50 messages each, segments of 4000 bytes) into
/// `store`, with `extra` in its `backup:` section.
fn backup_two_queues(vh: &TestVhost, dir: &Path, store: &Path, id: &str, extra: &str) {
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    for i in 0..2u64 {
        let name = format!("q{i}");
        declare(&ch, &name, "classic", FieldTable::new());
        publish(&ch, &name, &diverse_messages(50, 40 + i, false));
    }
    let cfg = write_config(
        dir,
        &format!("{id}.yaml"),
        &backup_yaml(
            id,
            &vh.name,
            store,
            &format!("  segment_max_bytes: 4000\n{extra}"),
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "backup: {:?}", text(&out));
}

fn validate(url: &str, id: &str, identity: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            url,
            "--backup-id",
            id,
            "--deep",
            "--identity-file",
            identity,
        ],
        env,
    );
    let (stdout, stderr) = text(&out);
    (out.status.code(), format!("{stdout}{stderr}"))
}

#[test]
fn a_copy_rerun_with_another_recipient_is_readable_with_the_new_identity() {
    let vh = TestVhost::new("copy-rekey");
    let dir = TempDir::new("copy-rekey");
    let store = dir.path().join("store");
    let id = "rekeyed";
    backup_two_queues(&vh, dir.path(), &store, id, "");
    let (secret_a, public_a) = generate();
    let (secret_b, public_b) = generate();
    let id_a = identity(dir.path(), "a.txt", &secret_a);
    let id_b = identity(dir.path(), "b.txt", &secret_b);
    let fs_url = format!("file://{}", store.display());

    // A copy encrypted to A, killed while the first segment of q1 is held back: q0's segments
    // are stored and recorded.
    let bucket = S3Bucket::new("copy-rekey");
    let proxy = HttpProxy::start("127.0.0.1:8333");
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let s3_at = |endpoint: &str| {
        format!(
            "s3://{}/offsite?region=us-east-1&endpoint={endpoint}&path_style=true&allow_http=true",
            bucket.name()
        )
    };
    proxy.inject(1, Fault::Delay(Duration::from_secs(600)), |line| {
        line.starts_with("PUT ") && line.contains("/q1/segment-")
    });
    let (mut child, _lines) = spawn_cli(
        &[
            "copy",
            "--from",
            &fs_url,
            "--to",
            &s3_at(&proxy.url),
            "--recipient",
            &public_a,
        ],
        &env,
    );
    while proxy.faults() == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before the held upload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // Run again with B (the key was rotated): the copy opens with B, every segment too.
    let s3_url = s3_at(common::S3_ENDPOINT);
    let out = run_cli_env(
        &[
            "copy",
            "--from",
            &fs_url,
            "--to",
            &s3_url,
            "--recipient",
            &public_b,
            "--format",
            "json",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "rerun: {:?}", text(&out));
    let (code, report) = validate(&s3_url, id, &id_b, &env);
    assert_eq!(code, Some(0), "the copy opens with B: {report}");
    let (code, report) = validate(&s3_url, id, &id_a, &env);
    assert_eq!(code, Some(1), "nothing of it opens with A: {report}");
}

/// Decrypts, decompresses, changes and seals again the definitions export at `path` (anyone
/// may: the recipients are public), keeping its size.
fn alter_export(path: &Path, secret: &str, public: &str) {
    use rmq_backup::broker::definitions::{compress, decompress};
    use rmq_backup::repository::segment::Compression;
    let keys = Identities::parse(secret, "a.txt").unwrap();
    let sealed = std::fs::read(path).unwrap();
    let raw = decompress(
        &keys.decrypt_bytes(&sealed, "definitions").unwrap(),
        Compression::Zstd,
    )
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.contains("\"q1\""), "{text}");
    let altered = text.replace("\"q1\"", "\"qX\"");
    let compressed = compress(altered.as_bytes(), Compression::Zstd, 3).unwrap();
    let to = Recipients::parse([public], "r").unwrap();
    std::fs::write(path, to.encrypt_bytes(&compressed).unwrap()).unwrap();
}

#[test]
fn an_altered_definitions_export_is_refused_by_copy_validate_and_restore() {
    let vh = TestVhost::new("defs-sum");
    let dir = TempDir::new("defs-sum");
    let store = dir.path().join("store");
    let id = "defs";
    let (secret_a, public_a) = generate();
    let id_a = identity(dir.path(), "a.txt", &secret_a);
    backup_two_queues(
        &vh,
        dir.path(),
        &store,
        id,
        &format!("  encryption:\n    recipients: [\"{public_a}\"]\n"),
    );
    let m = manifest(&store, id);
    let d = m.definitions.clone().expect("definitions exported");
    let export = store.join(&d.key);
    let original = std::fs::read(&export).unwrap();
    alter_export(&export, &secret_a, &public_a);
    let fs_url = format!("file://{}", store.display());

    // A copy without the identity cannot decrypt the export: its checksum still tells.
    let copy_to = |name: &str| {
        let to = format!("file://{}", dir.path().join(name).display());
        let out = run_cli(&["copy", "--from", &fs_url, "--to", &to, "--format", "json"]);
        let (stdout, stderr) = text(&out);
        (out.status.code(), format!("{stdout}{stderr}"))
    };
    let (code, out) = copy_to("altered-copy");
    assert_eq!(code, Some(1), "an altered export is not copied: {out}");
    assert!(
        out.contains("SHA-256 mismatch") && out.contains("definitions.json"),
        "{out}"
    );
    let (code, out) = validate(&fs_url, id, &id_a, &[]);
    assert_eq!(code, Some(3), "validate --deep finds it: {out}");
    assert!(out.contains("SHA-256 mismatch"), "{out}");

    // A restore refuses the export before it imports anything.
    let target = vh.sibling("target");
    let ryaml = restore_yaml(
        id,
        &store,
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  encryption:\n    identity_file: \"{id_a}\"\n",
            v = vh.name
        ),
    );
    let rcfg = write_config(dir.path(), "r.yaml", &ryaml);
    let out = run_cli(&["restore", "--config", &rcfg]);
    let (stdout, stderr) = text(&out);
    let _ = management().delete_vhost(&target);
    assert_ne!(out.status.code(), Some(0), "restore: {stdout}{stderr}");
    assert!(stderr.contains("SHA-256 mismatch"), "{stdout}{stderr}");

    // Cut short: refused as well.
    std::fs::write(&export, &original[..original.len() / 2]).unwrap();
    let (code, out) = copy_to("truncated-copy");
    assert_eq!(code, Some(1), "a truncated export is not copied: {out}");
    assert!(out.contains("SHA-256 mismatch"), "{out}");

    // The export as written: copied, and the copy records its checksum.
    std::fs::write(&export, &original).unwrap();
    let (code, out) = copy_to("good-copy");
    assert_eq!(code, Some(0), "{out}");
    let copied = manifest(&dir.path().join("good-copy"), id);
    assert_eq!(copied.definitions.as_ref().unwrap().checksum, d.checksum);
    assert!(d.checksum.is_some());
}

/// Writes to `gcs` refused the way a GCS bucket retention policy refuses them: a write over
/// an object that exists, outside `{backup_id}/state/`. Counts the writes let through per
/// key; `interrupt`, when set, fails the first upload of a segment of `q1` (and clears
/// itself), as a copy killed in the middle of its second queue.
struct Retained {
    storage: Arc<Hooked>,
    written: Arc<Mutex<HashMap<String, u32>>>,
    refused: Arc<AtomicU32>,
    interrupt: Arc<AtomicBool>,
}

fn retained(gcs: &GcsBucket) -> Retained {
    let inner = gcs.storage();
    let written = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let refused = Arc::new(AtomicU32::new(0));
    let interrupt = Arc::new(AtomicBool::new(false));
    let (w, r, i, probe) = (
        written.clone(),
        refused.clone(),
        interrupt.clone(),
        inner.clone(),
    );
    let storage = Hooked::new(inner, move |access, key| {
        if access != Access::Write {
            return Ok(());
        }
        if key.contains("/q1/segment-") && i.swap(false, Ordering::SeqCst) {
            return Err(rmq_backup::Error::Io("interrupted (test)".into()));
        }
        let state = key.split('/').nth(1) == Some("state");
        if !state && probe.head(key)?.is_some() {
            r.fetch_add(1, Ordering::SeqCst);
            return Err(rmq_backup::Error::Storage(format!(
                "Failed to upload {key}: HTTP 403: Object '{key}' is subject to bucket's retention policy or object retention and cannot be deleted or overwritten"
            )));
        }
        *w.lock().unwrap().entry(key.to_string()).or_default() += 1;
        Ok(())
    });
    Retained {
        storage,
        written,
        refused,
        interrupt,
    }
}

#[test]
fn a_copy_into_storage_that_keeps_its_objects_writes_each_one_once() {
    let vh = TestVhost::new("copy-locked");
    let dir = TempDir::new("copy-locked");
    let store = dir.path().join("store");
    let id = "locked";
    backup_two_queues(&vh, dir.path(), &store, id, "");
    let from = rmq_backup::repository::storage::filesystem::FilesystemStorage::new(&store)
        .expect("filesystem storage");
    let (secret_a, public_a) = generate();
    let (_, public_b) = generate();
    let to_a = || Recipients::parse([public_a.as_str()], "--recipient").unwrap();
    let opts = |r: Recipients| CopyOptions {
        recipients: Some(r),
        ..CopyOptions::default()
    };

    // Interrupted in q1, then run again with the same recipient: completes, each object
    // outside state/ written once, none refused.
    let gcs = GcsBucket::new("copy-locked");
    let t = retained(&gcs);
    t.interrupt.store(true, Ordering::SeqCst);
    let r = copy(
        &from,
        t.storage.as_ref(),
        &opts(to_a()),
        &Progress::default(),
    )
    .unwrap();
    assert!(r.failed(), "the first run is interrupted: {:?}", r.backups);
    let r = copy(
        &from,
        t.storage.as_ref(),
        &opts(to_a()),
        &Progress::default(),
    )
    .unwrap();
    assert!(!r.failed(), "{:?}", r.backups);
    assert_eq!(t.refused.load(Ordering::SeqCst), 0, "no object replaced");
    let written = t.written.lock().unwrap().clone();
    let twice: Vec<_> = written
        .iter()
        .filter(|(k, n)| **n > 1 && k.split('/').nth(1) != Some("state"))
        .collect();
    assert!(twice.is_empty(), "written more than once: {twice:?}");
    assert_eq!(written.get(&format!("{id}/manifest.json")), Some(&1));
    let keys = Identities::parse(&secret_a, "a.txt").unwrap();
    let v =
        rmq_backup::inspect::validate_with_keys(t.storage.as_ref(), id, true, Some(&keys)).unwrap();
    assert!(v.is_valid(), "{:?}", v.problems);

    // Interrupted with A, run again with B: the storage keeps what A's run stored, so the
    // rerun stops and says how to finish; finishing with A works.
    let gcs = GcsBucket::new("copy-locked-b");
    let t = retained(&gcs);
    t.interrupt.store(true, Ordering::SeqCst);
    let r = copy(
        &from,
        t.storage.as_ref(),
        &opts(to_a()),
        &Progress::default(),
    )
    .unwrap();
    assert!(r.failed());
    let to_b = Recipients::parse([public_b.as_str()], "--recipient").unwrap();
    let outside_state = |w: &HashMap<String, u32>| {
        let mut v: Vec<(String, u32)> = w
            .iter()
            .filter(|(k, _)| k.split('/').nth(1) != Some("state"))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        v.sort();
        v
    };
    let before = outside_state(&t.written.lock().unwrap());
    let r = copy(&from, t.storage.as_ref(), &opts(to_b), &Progress::default()).unwrap();
    assert_eq!(
        outside_state(&t.written.lock().unwrap()),
        before,
        "the rerun to B stored nothing that would be in the way"
    );
    assert!(r.failed(), "{:?}", r.backups);
    let e = r.backups[0].error.clone().unwrap();
    assert!(
        e.starts_with("Storage error: ") && e.contains(&format!("--recipient {public_a}")),
        "{e}"
    );
    eprintln!("the rerun to B: {e}");
    assert!(
        t.storage
            .head(&format!("{id}/manifest.json"))
            .unwrap()
            .is_none(),
        "no manifest until the copy completes"
    );
    let r = copy(
        &from,
        t.storage.as_ref(),
        &opts(to_a()),
        &Progress::default(),
    )
    .unwrap();
    assert!(!r.failed(), "{:?}", r.backups);
    let v =
        rmq_backup::inspect::validate_with_keys(t.storage.as_ref(), id, true, Some(&keys)).unwrap();
    assert!(v.is_valid(), "{:?}", v.problems);
}
