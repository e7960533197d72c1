//! `storage.object_lock` against emulators (docs/protecting-backups.md "Protecting backups from deletion"):
//!
//! - SeaweedFS enforces S3 Object Lock on a bucket created with it (AWS's semantics: a delete
//!   without a version id only adds a delete marker; a delete of a locked version is refused
//!   with AccessDenied, in governance and compliance mode alike without the bypass header).
//!   Every object a backup writes carries the retention, except the run lock and the other
//!   `state/` keys; `forget` keeps the locked backup (`locked until ...`, exit 0) and removes it
//!   on a later run, once the date has passed.
//! - fake-gcs-server 1.54 stores an object's `retention` and returns it, but deletes a retained
//!   object anyway: what can be tested there is that the retention is set, and that `forget`
//!   reads it and keeps the backup.

mod common;

use common::buckets::GcsBucket;
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::time::Duration;

/// A SeaweedFS bucket created with Object Lock enabled. Its objects cannot be removed until
/// their retention ends: the test waits for that, `forget` removes the backups, and the drop
/// removes what is left (delete markers hide the versions; the emulator's data is thrown away
/// with it).
struct LockedBucket(s3::Bucket);

impl LockedBucket {
    /// CreateBucket with `x-amz-bucket-object-lock-enabled: true`, signed here (SigV4):
    /// rust-s3 0.38 sends the header with the value `Enabled`, which SeaweedFS (like AWS)
    /// does not take for true, and creates a bucket without Object Lock.
    fn new(tag: &str) -> LockedBucket {
        use sha2::{Digest, Sha256};
        let name = format!("rmqb-{tag}-{}", unique_suffix());
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let hmac = |k: &[u8], m: &str| {
            ring::hmac::sign(
                &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k),
                m.as_bytes(),
            )
            .as_ref()
            .to_vec()
        };
        let now = rmq_backup::run::units::rfc3339_ms(rmq_backup::now_ms());
        let amz_date = format!("{}Z", &now.replace(['-', ':'], "")[..15]);
        let day = &amz_date[..8];
        let host = S3_ENDPOINT.trim_start_matches("http://");
        let empty = hex(&Sha256::digest(b""));
        let signed = "host;x-amz-bucket-object-lock-enabled;x-amz-content-sha256;x-amz-date";
        let canonical = format!(
            "PUT\n/{name}\n\nhost:{host}\nx-amz-bucket-object-lock-enabled:true\nx-amz-content-sha256:{empty}\nx-amz-date:{amz_date}\n\n{signed}\n{empty}"
        );
        let scope = format!("{day}/us-east-1/s3/aws4_request");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut key = hmac(format!("AWS4{}", S3_ADMIN.1).as_bytes(), day);
        for part in ["us-east-1", "s3", "aws4_request"] {
            key = hmac(&key, part);
        }
        let signature = hex(&hmac(&key, &to_sign));
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            S3_ADMIN.0
        );
        ureq::put(&format!("{S3_ENDPOINT}/{name}"))
            .header("x-amz-bucket-object-lock-enabled", "true")
            .header("x-amz-content-sha256", &empty)
            .header("x-amz-date", &amz_date)
            .header("authorization", &auth)
            .send_empty()
            .unwrap_or_else(|e| panic!("create bucket {name} (scripts/setup-storage.sh): {e}"));
        let creds =
            s3::creds::Credentials::new(Some(S3_ADMIN.0), Some(S3_ADMIN.1), None, None, None)
                .expect("credentials");
        let region = s3::Region::Custom {
            region: "us-east-1".into(),
            endpoint: S3_ENDPOINT.into(),
        };
        let bucket = s3::Bucket::new(&name, region, creds)
            .expect("bucket")
            .with_path_style();
        LockedBucket(*bucket)
    }
}

impl Drop for LockedBucket {
    fn drop(&mut self) {
        if let Ok(pages) = self.0.list(String::new(), None) {
            for o in pages.into_iter().flat_map(|p| p.contents) {
                let _ = self.0.delete_object(&o.key);
            }
        }
        let _ = self.0.delete();
    }
}

fn backup_config(dir: &std::path::Path, id: &str, vhost: &str, storage: &str) -> String {
    let yaml = backup_yaml(
        id,
        vhost,
        std::path::Path::new("/unused"),
        "  segment_max_bytes: 4000\n",
    );
    let start = yaml.find("storage:\n").expect("storage section");
    let end = yaml[start..]
        .find("\nbackup:")
        .map_or(yaml.len(), |i| start + i + 1);
    let yaml = format!("{}storage:\n{storage}{}", &yaml[..start], &yaml[end..]);
    write_config(dir, &format!("{id}.yaml"), &yaml)
}

fn forget(url: &str, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value, String) {
    let out = run_cli_env(
        &[
            "forget",
            "--path",
            url,
            "--keep-last",
            "1",
            "--format",
            "json",
        ],
        env,
    );
    let (stdout, stderr) = text(&out);
    let v = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    (out.status.code(), v, stderr)
}

fn decision<'a>(report: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    report["backups"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["backup_id"] == id))
        .unwrap_or_else(|| panic!("{id} in {report}"))
}

#[test]
fn s3_object_lock_keeps_backups_until_their_date_and_refuses_deletes() {
    let bucket = LockedBucket::new("lock");
    let vh = TestVhost::new("objlock");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(30, 5, false));
    let dir = TempDir::new("objlock");
    let storage = format!(
        "  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  prefix: locked\n  access_key: {}\n  secret_key: {}\n  object_lock:\n    mode: governance\n    retain_for: 15s\n",
        bucket.0.name, S3_ADMIN.0, S3_ADMIN.1
    );
    for id in ["lock-1", "lock-2"] {
        let cfg = backup_config(dir.path(), id, &vh.name, &storage);
        let out = run_cli(&["backup", "--config", &cfg]);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
        std::thread::sleep(Duration::from_millis(1100));
    }
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let url = format!(
        "s3://{}/locked?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        bucket.0.name
    );

    // Every object of the backup is locked, the run lock is not.
    let keys: Vec<String> = bucket
        .0
        .list("locked/lock-1/".into(), None)
        .unwrap()
        .into_iter()
        .flat_map(|p| p.contents.into_iter().map(|o| o.key))
        .collect();
    let segment = keys
        .iter()
        .find(|k| k.contains("/queues/"))
        .expect("a segment")
        .clone();
    for k in &keys {
        let (h, _) = bucket.0.head_object(k).unwrap();
        if k.contains("/state/") {
            assert_eq!(
                h.object_lock_mode, None,
                "{k} is rewritten by runs: not locked"
            );
        } else {
            assert_eq!(h.object_lock_mode.as_deref(), Some("GOVERNANCE"), "{k}");
            assert!(h.object_lock_retain_until_date.is_some(), "{k}");
        }
    }

    // A direct delete of a locked segment (its version) is refused by the storage.
    let (h, _) = bucket.0.head_object(&segment).unwrap();
    let version = h.version_id.expect("a versioned bucket");
    let r = bucket
        .0
        .delete_objects(vec![s3::serde_types::ObjectIdentifier::with_version(
            segment.as_str(),
            version.as_str(),
        )])
        .expect("DeleteObjects answers");
    assert!(
        r.errors.iter().any(|e| e.code == "AccessDenied"),
        "the locked version is not deleted: {:?}",
        r.errors
    );
    assert!(bucket.0.head_object(&segment).is_ok(), "still there");

    // forget keeps the locked backup, exit 0, and says until when.
    let (code, report, stderr) = forget(&url, &env);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    let d = decision(&report, "lock-1");
    assert_eq!(d["action"], "keep", "{report}");
    assert!(
        d["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("locked until "),
        "{report}"
    );
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &url,
            "--backup-id",
            "lock-1",
            "--deep",
        ],
        &env,
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Once the date has passed, a later forget removes it.
    let cfg = rmq_backup::config::Config::from_yaml_str(&format!(
        "mode: restore\nbackup_id: x\ntarget:\n  amqp_url: \"{}\"\nstorage:\n{storage}restore:\n  restore_definitions: false\n",
        amqp_url("/")
    ))
    .expect("config");
    let store = rmq_backup::repository::storage::open_config(&cfg.storage).expect("open s3");
    loop {
        let until = store.retained_until("lock-1/manifest.json").unwrap();
        match until {
            Some(t) if t > rmq_backup::now_ms() => std::thread::sleep(Duration::from_millis(500)),
            _ => break,
        }
    }
    let (code, report, stderr) = forget(&url, &env);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    assert_eq!(decision(&report, "lock-1")["action"], "remove", "{report}");
    let out = run_cli_env(&["list", "--path", &url, "--format", "json"], &env);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["backup_id"].as_str())
        .collect();
    assert_eq!(ids, ["lock-2"]);
}

#[test]
fn gcs_object_retention_is_set_and_read_by_forget() {
    let bucket = GcsBucket::new("lock");
    let vh = TestVhost::new("gcslock");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(20, 6, false));
    let dir = TempDir::new("gcslock");
    let storage = format!(
        "  backend: gcs\n  bucket: {}\n  object_lock:\n    mode: compliance\n    retain_for: 1d\n",
        bucket.0
    );
    let env = [("STORAGE_EMULATOR_HOST", common::buckets::GCS_ENDPOINT)];
    for id in ["glock-1", "glock-2"] {
        let cfg = backup_config(dir.path(), id, &vh.name, &storage);
        let out = run_cli_env(&["backup", "--config", &cfg], &env);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
        std::thread::sleep(Duration::from_millis(1100));
    }
    let store = bucket.storage();
    let m = rmq_backup::repository::manifest::Manifest::read(store.as_ref(), "glock-1").unwrap();
    let seg = &m.queues[0].segments[0].key;
    let until = store.retained_until(seg).unwrap().expect("retention set");
    assert!(until > rmq_backup::now_ms() + 23 * 3_600_000, "{until}");
    assert_eq!(
        store.retained_until("glock-1/manifest.json").unwrap(),
        None,
        "the manifest is rewritten by its run: GCS could not replace a retained one"
    );
    let url = format!("gcs://{}", bucket.0);
    let (code, report, stderr) = forget(&url, &env);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    let d = decision(&report, "glock-1");
    assert_eq!(d["action"], "keep", "{report}");
    assert!(d["reasons"][0]
        .as_str()
        .unwrap()
        .starts_with("locked until "));
}

/// Azurite 3.37 accepts the version-level immutability headers of a put (signed with the
/// rest), but keeps none of them: it returns no `x-ms-immutability-policy-until-date` and
/// deletes the blob. What is tested: a backup with `object_lock` completes there, and reads
/// back as any other.
#[test]
fn azurite_takes_the_immutability_headers_without_enforcing_them() {
    let container = common::buckets::AzContainer::new("lock");
    let vh = TestVhost::new("azlock");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(20, 7, false));
    let dir = TempDir::new("azlock");
    let storage = format!(
        "  backend: azure\n  account_name: {}\n  container_name: {}\n  endpoint: \"{}\"\n  account_key: \"{}\"\n  object_lock:\n    mode: compliance\n    retain_for: 1d\n",
        common::buckets::AZ_ACCOUNT,
        container.1,
        common::buckets::AZ_ENDPOINT,
        common::buckets::AZ_KEY
    );
    let cfg = backup_config(dir.path(), "az-1", &vh.name, &storage);
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    use rmq_backup::repository::storage::Storage;
    let m =
        rmq_backup::repository::manifest::Manifest::read(&container.0, "az-1").expect("manifest");
    let seg = &m.queues[0].segments[0].key;
    assert_eq!(
        container.0.retained_until(seg).unwrap(),
        None,
        "Azurite keeps no policy"
    );
    let report = rmq_backup::inspect::validate(&container.0, "az-1", true).unwrap();
    assert!(report.is_valid(), "{:?}", report.problems);
}

/// A storage that refuses to delete an object while its retention lasts, as GCS does
/// (`403 Forbidden`: an object under retention "cannot be deleted or overwritten until" its
/// date); fake-gcs-server 1.54 stores the retention and deletes the object anyway, so the hook
/// stands for GCS's enforcement.
fn refusing_retained_deletes(
    inner: std::sync::Arc<dyn rmq_backup::repository::storage::Storage>,
) -> std::sync::Arc<common::hooked_storage::Hooked> {
    use common::hooked_storage::{Access, Hooked};
    let store = inner.clone();
    Hooked::new(inner, move |access, key| {
        if access != Access::Delete {
            return Ok(());
        }
        match store.retained_until(key)? {
            Some(t) if t > rmq_backup::now_ms() => Err(rmq_backup::Error::Storage(format!(
                "Failed to delete {key}: 403 Forbidden: Object is subject to object retention and cannot be deleted or overwritten until {}",
                rmq_backup::run::units::rfc3339_ms(t)
            ))),
            _ => Ok(()),
        }
    })
}

fn keep_last_one() -> rmq_backup::retention::Options {
    rmq_backup::retention::Options {
        policy: rmq_backup::retention::Policy {
            keep_last: Some(rmq_backup::retention::Count::N(1)),
            ..Default::default()
        },
        dry_run: false,
        prune_interrupted: false,
        prune: false,
        prune_grace: rmq_backup::retention::DEFAULT_PRUNE_GRACE,
    }
}

/// Issue 38, item 1: on GCS the manifest is not locked, and a backup without segments (its
/// queues empty: definitions only) gave `forget` no date at all. It deleted `manifest.json`,
/// then failed on the locked definitions export, leaving locked data with no index. Now every
/// object's retention is read first, and the backup is kept whole.
#[test]
fn gcs_forget_keeps_a_retained_backup_without_segments_whole() {
    let bucket = GcsBucket::new("lockdefs");
    let vh = TestVhost::new("gcslockdefs");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "empty", "classic", FieldTable::new());
    let dir = TempDir::new("gcslockdefs");
    let storage = format!(
        "  backend: gcs\n  bucket: {}\n  object_lock:\n    mode: compliance\n    retain_for: 1d\n",
        bucket.0
    );
    let env = [("STORAGE_EMULATOR_HOST", common::buckets::GCS_ENDPOINT)];
    for id in ["gdefs-1", "gdefs-2"] {
        let cfg = backup_config(dir.path(), id, &vh.name, &storage);
        let out = run_cli_env(&["backup", "--config", &cfg], &env);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
        std::thread::sleep(Duration::from_millis(1100));
    }
    let raw = bucket.storage();
    let m = rmq_backup::repository::manifest::Manifest::read(raw.as_ref(), "gdefs-1").unwrap();
    assert!(
        m.queues.iter().all(|q| q.segments.is_empty()),
        "no segment: {m:?}"
    );
    let defs = m
        .definitions
        .as_ref()
        .expect("a definitions export")
        .key
        .clone();
    assert!(
        raw.retained_until(&defs).unwrap().is_some(),
        "{defs} locked"
    );

    let gcs: std::sync::Arc<dyn rmq_backup::repository::storage::Storage> =
        refusing_retained_deletes(raw.clone());
    let report = rmq_backup::retention::forget(&gcs, &keep_last_one()).unwrap();
    assert!(
        report.errors.is_empty(),
        "no delete refused: {:?}",
        report.errors
    );
    let d = report
        .backups
        .iter()
        .find(|b| b.backup_id == "gdefs-1")
        .unwrap();
    assert!(!d.remove, "kept: {d:?}");
    assert!(d.reasons[0].starts_with("locked until "), "{d:?}");
    let still = rmq_backup::repository::manifest::Manifest::read(raw.as_ref(), "gdefs-1");
    assert!(still.is_ok(), "the index is still there: {still:?}");
    assert!(raw.head(&defs).unwrap().is_some());
}

/// Issue 38, item 1, on SeaweedFS (which enforces Object Lock): a backup whose manifest was
/// last written under a shorter retention than its segments (a rerun of an interrupted backup
/// with a shorter `retain_for`; here the manifest is written again through a storage
/// configured so) was judged by its manifest alone: once the manifest's date passed, `forget`
/// hid it behind delete markers while its segments were still locked. Now it is kept until
/// its last object's date, then removed.
#[test]
fn s3_forget_keeps_a_backup_until_its_last_object_is_free() {
    let bucket = LockedBucket::new("lockall");
    let vh = TestVhost::new("objlockall");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(30, 8, false));
    let dir = TempDir::new("objlockall");
    let storage_for = |retain: &str| {
        format!(
            "  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  prefix: locked\n  access_key: {}\n  secret_key: {}\n  object_lock:\n    mode: governance\n    retain_for: {retain}\n",
            bucket.0.name, S3_ADMIN.0, S3_ADMIN.1
        )
    };
    let long = storage_for("30s");
    for id in ["all-1", "all-2"] {
        let cfg = backup_config(dir.path(), id, &vh.name, &long);
        let out = run_cli(&["backup", "--config", &cfg]);
        assert_eq!(out.status.code(), Some(0), "{id}: {:?}", text(&out));
        std::thread::sleep(Duration::from_millis(1100));
    }
    let open = |yaml: &str| {
        let cfg = rmq_backup::config::Config::from_yaml_str(&format!(
            "mode: restore\nbackup_id: x\ntarget:\n  amqp_url: \"{}\"\nstorage:\n{yaml}restore:\n  restore_definitions: false\n",
            amqp_url("/")
        ))
        .expect("config");
        rmq_backup::repository::storage::open_config(&cfg.storage).expect("open s3")
    };
    let store = open(&long);
    let manifest = store.get_bytes("all-1/manifest.json").unwrap();
    open(&storage_for("1s"))
        .put_bytes("all-1/manifest.json", &manifest)
        .unwrap();
    let m = rmq_backup::repository::manifest::Manifest::read(store.as_ref(), "all-1").unwrap();
    let segment = m.queues[0].segments[0].key.clone();
    let segment_until = store.retained_until(&segment).unwrap().expect("locked");
    while store
        .retained_until("all-1/manifest.json")
        .unwrap()
        .is_some_and(|t| t > rmq_backup::now_ms())
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        segment_until > rmq_backup::now_ms() + 5_000,
        "the segments stay locked for a while yet"
    );
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let url = format!(
        "s3://{}/locked?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        bucket.0.name
    );
    let (code, report, stderr) = forget(&url, &env);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    let d = decision(&report, "all-1");
    assert_eq!(d["action"], "keep", "{report}");
    let why = d["reasons"][0].as_str().unwrap();
    let until = why
        .strip_prefix("locked until ")
        .and_then(|r| r.split(": ").next())
        .and_then(|t| rmq_backup::run::units::parse_time(t).ok())
        .unwrap_or_else(|| panic!("a date: {report}"));
    assert!(
        until >= segment_until,
        "the date of its latest object: {report}"
    );
    assert!(store.head("all-1/manifest.json").unwrap().is_some());

    // Once its last object is free, a later forget removes it.
    let latest = store.latest_retention("all-1/").unwrap().expect("a date");
    while rmq_backup::now_ms() <= latest {
        std::thread::sleep(Duration::from_millis(500));
    }
    let (code, report, stderr) = forget(&url, &env);
    assert_eq!(code, Some(0), "{report}\n{stderr}");
    assert_eq!(decision(&report, "all-1")["action"], "remove", "{report}");
}
