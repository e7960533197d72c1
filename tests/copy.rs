//! `rmq-backup copy` across the storage emulators (issue 33, item 1): an encrypted sharded
//! backup copied filesystem -> S3 (SeaweedFS) -> Azure (Azurite) -> GCS (fake-gcs-server),
//! the first hop killed in the middle (an upload held back by a proxy) and run again; at each
//! hop `validate --deep` accepts the copy, and the last one restores identical. A copy
//! re-encrypted to another recipient opens with the new identity only.

mod common;

use common::buckets::{AzContainer, GcsBucket, AZ_ACCOUNT, AZ_KEY, GCS_ENDPOINT};
use common::http_proxy::{Fault, HttpProxy};
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn identity(dir: &Path, name: &str, secret: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

fn copy_json(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let mut all = vec!["copy", "--format", "json"];
    all.extend_from_slice(args);
    let out = run_cli_env(&all, env);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "copy {args:?}: {stdout}\n{stderr}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
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

fn status_of(url: &str, id: &str, env: &[(&str, &str)]) -> String {
    let out = run_cli_env(&["list", "--path", url, "--format", "json"], env);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list json");
    v.as_array()
        .and_then(|a| a.iter().find(|b| b["backup_id"] == id))
        .map(|b| b["status"].as_str().unwrap_or_default().to_string())
        .unwrap_or_else(|| "absent".into())
}

#[test]
fn an_encrypted_sharded_backup_travels_through_every_backend() {
    let vh = TestVhost::new("copy");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let mut expected = Vec::new();
    for i in 0..4u64 {
        let name = format!("q{i}");
        declare(&ch, &name, "classic", FieldTable::new());
        let msgs = diverse_messages(50, 90 + i, false);
        publish(&ch, &name, &msgs);
        expected.push((name, msgs));
    }
    let dir = TempDir::new("copy");
    let (secret_a, public_a) = rmq_backup::repository::encryption::generate();
    let (secret_b, public_b) = rmq_backup::repository::encryption::generate();
    let id_a = identity(dir.path(), "a.txt", &secret_a);
    let id_b = identity(dir.path(), "b.txt", &secret_b);
    let store = dir.path().join("store");
    let id = "copied";
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            id,
            &vh.name,
            &store,
            &format!(
                "  segment_max_bytes: 4000\n  shard:\n    count: 2\n  encryption:\n    recipients: [\"{public_a}\"]\n"
            ),
        ),
    );
    for index in ["0", "1"] {
        let out = run_cli_env(
            &["backup", "--config", &cfg],
            &[("JOB_COMPLETION_INDEX", index)],
        );
        assert_eq!(out.status.code(), Some(0), "part {index}: {:?}", text(&out));
    }
    let m = manifest(&store, id);
    assert_eq!(m.parts, Some(2));
    let segments = m.total_segments;
    assert!(segments >= 12, "several batches of segments: {segments}");
    let fs_url = format!("file://{}", store.display());

    // Hop 1: filesystem -> S3, through a proxy that holds the 6th segment upload back; the
    // copy is killed while it waits, then run again.
    let bucket = S3Bucket::new("copy");
    let proxy = HttpProxy::start("127.0.0.1:8333");
    let s3_env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let s3_at = |endpoint: &str| {
        format!(
            "s3://{}/offsite?region=us-east-1&endpoint={endpoint}&path_style=true&allow_http=true",
            bucket.name()
        )
    };
    let s3_url = s3_at(S3_ENDPOINT);
    let seen = Arc::new(AtomicU32::new(0));
    let counter = seen.clone();
    proxy.inject(1, Fault::Delay(Duration::from_secs(600)), move |line| {
        line.starts_with("PUT ")
            && line.contains("/segment-")
            && counter.fetch_add(1, Ordering::SeqCst) == 5
    });
    let (mut child, _lines) = spawn_cli(
        &["copy", "--from", &fs_url, "--to", &s3_at(&proxy.url)],
        &s3_env,
    );
    while proxy.faults() == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before the held upload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The uploads sent before the held one finish (most of them: on a loaded machine one
    // may still be on its way when the kill comes, so the check below asks for one at least).
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        status_of(&s3_url, id, &s3_env),
        "absent",
        "a killed copy has no manifest at the target: no backup there yet"
    );
    let r = copy_json(&["--from", &fs_url, "--to", &s3_url], &s3_env);
    let b = &r["backups"][0];
    assert_eq!(b["status"], "resumed", "{r}");
    assert_eq!(b["segments"], segments, "{r}");
    let in_place = b["segments_in_place"].as_u64().unwrap();
    assert!(
        in_place >= 1,
        "what the killed copy stored is verified, not copied again: {r}"
    );
    assert_eq!(
        b["segments_copied"].as_u64().unwrap() + in_place,
        segments,
        "{r}"
    );
    assert_eq!(validate(&s3_url, id, &id_a, &s3_env).0, Some(0));
    let again = copy_json(&["--from", &fs_url, "--to", &s3_url], &s3_env);
    assert_eq!(again["backups"][0]["status"], "already copied", "{again}");

    // Hop 2: S3 -> Azure.
    let container = AzContainer::new("copy");
    let az_url = format!("azure://127.0.0.1:10000/{AZ_ACCOUNT}/{}", container.1);
    let az_env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY),
    ];
    let r = copy_json(
        &["--from", &s3_url, "--to", &az_url, "--backup-id", id],
        &az_env,
    );
    assert_eq!(r["backups"][0]["status"], "copied", "{r}");
    let (code, out) = validate(&az_url, id, &id_a, &az_env);
    assert_eq!(code, Some(0), "{out}");

    // Hop 3: Azure -> GCS, then a restore from there.
    let gcs = GcsBucket::new("copy");
    let gcs_url = format!("gcs://{}", gcs.0);
    let gcs_env = [
        ("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY),
        ("STORAGE_EMULATOR_HOST", GCS_ENDPOINT),
    ];
    let r = copy_json(&["--from", &az_url, "--to", &gcs_url], &gcs_env);
    assert_eq!(r["backups"][0]["status"], "copied", "{r}");
    let (code, out) = validate(&gcs_url, id, &id_a, &gcs_env);
    assert_eq!(code, Some(0), "{out}");
    let copied =
        rmq_backup::repository::manifest::Manifest::read(gcs.storage().as_ref(), id).unwrap();
    assert_eq!(
        copied.queues, m.queues,
        "the same segments, checksums and recipients"
    );

    let target = vh.sibling("target");
    let fs_block = format!(
        "  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let ryaml = restore_yaml(
        id,
        &dir.path().join("unused"),
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  encryption:\n    identity_file: \"{id_a}\"\n",
            v = vh.name
        ),
    )
    .replace(&fs_block, &format!("  backend: gcs\n  bucket: {}\n", gcs.0));
    let rcfg = write_config(dir.path(), "r.yaml", &ryaml);
    let out = run_cli_env(&["restore", "--config", &rcfg], &gcs_env);
    assert_eq!(out.status.code(), Some(0), "restore: {:?}", text(&out));
    let tconn = connect(&target);
    for (name, msgs) in &expected {
        assert_same_as(
            &as_restored(msgs),
            &peek(&tconn, name, msgs.len()),
            Headers::of("classic"),
            &format!("restored {name}"),
        );
    }
    drop(tconn);
    let _ = management().delete_vhost(&target);

    // A copy re-encrypted to B opens with B's identity only.
    let other = dir.path().join("second-account");
    let other_url = format!("file://{}", other.display());
    let r = copy_json(
        &[
            "--from",
            &gcs_url,
            "--to",
            &other_url,
            "--recipient",
            &public_b,
            "--identity-file",
            &id_a,
        ],
        &gcs_env,
    );
    assert_eq!(
        r["backups"][0]["encryption"],
        serde_json::json!([public_b]),
        "{r}"
    );
    let re = manifest(&other, id);
    assert_eq!(
        re.encryption.as_ref().unwrap().recipients,
        vec![public_b.clone()]
    );
    for s in re.queues.iter().flat_map(|q| &q.segments) {
        assert_eq!(
            s.recipients.as_deref(),
            Some(&[public_b.clone()][..]),
            "{}",
            s.key
        );
    }
    assert_eq!(validate(&other_url, id, &id_b, &[]).0, Some(0));
    let (code, out) = validate(&other_url, id, &id_a, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Encryption error:") && out.contains("wrong identity"),
        "{out}"
    );
}
