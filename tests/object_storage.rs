//! End to end through the object-storage emulators of `scripts/setup-storage.sh` (issue #3):
//! back up a test vhost with the real binary, `list` and `validate --deep` the backup through its
//! storage URL, restore it to a fresh vhost, and compare message by message. Credentials reach
//! the URL commands through the standard environment variables, never the URL.

mod common;

use common::buckets::*;
use common::*;
use rmq_backup::broker::amqp::FieldTable;
use rmq_backup::repository::storage::Storage;
use std::sync::atomic::{AtomicU32, Ordering};

/// An S3 bucket on SeaweedFS for one test, emptied and deleted on drop.
struct Backend<'a> {
    storage_yaml: String,
    url: String,
    env: Vec<(&'a str, &'a str)>,
}

/// Seeds two queues (classic with a 1 MiB body among them, quorum), backs them up to `backend`,
/// lists and validates the backup through its URL, restores to a fresh vhost, and compares.
fn round_trip(tag: &str, backend: &Backend) {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().expect("channel");
    let queues = [("orders classic", "classic"), ("events/quorum", "quorum")];
    let mut expected = Vec::new();
    for (i, (name, kind)) in queues.iter().enumerate() {
        declare(&ch, name, kind, FieldTable::new());
        let msgs = diverse_messages(150, 40 + i as u64, i == 0);
        publish(&ch, name, &msgs);
        expected.push(msgs);
    }

    let dir = TempDir::new(tag);
    let id = format!("{tag}-{}", rmq_backup::now_ms());
    let storage_block = format!("storage:\n{}", backend.storage_yaml);
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let yaml = backup_yaml(
        &id,
        &vh.name,
        &dir.path().join("unused"),
        "  segment_max_bytes: 300000\n",
    );
    assert!(yaml.contains(&fs_block));
    let cfg = write_config(
        dir.path(),
        "backup.yaml",
        &yaml.replace(&fs_block, &storage_block),
    );
    let out = run_cli_env(&["backup", "--config", &cfg], &backend.env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "backup: {stdout}\n{stderr}");
    assert!(
        !dir.path().join("unused").exists(),
        "wrote to the filesystem"
    );

    // The broker kept every message, in order.
    for ((name, _), msgs) in queues.iter().zip(&expected) {
        assert_eq!(depth(&conn, name) as usize, msgs.len(), "{name}");
    }

    let out = run_cli_env(
        &["list", "--path", &backend.url, "--format", "json"],
        &backend.env,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "list: {stdout}\n{stderr}");
    assert!(stdout.contains(&id), "list shows the backup: {stdout}");

    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &backend.url,
            "--backup-id",
            &id,
            "--deep",
        ],
        &backend.env,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "validate: {stdout}\n{stderr}");

    let target = vh.sibling("target");
    let ryaml = restore_yaml(
        &id,
        &dir.path().join("unused"),
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
            v = vh.name
        ),
    );
    assert!(ryaml.contains(&fs_block));
    let rcfg = write_config(
        dir.path(),
        "restore.yaml",
        &ryaml.replace(&fs_block, &storage_block),
    );
    let out = run_cli_env(&["restore", "--config", &rcfg], &backend.env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "restore: {stdout}\n{stderr}");

    let tconn = connect(&target);
    for ((name, kind), msgs) in queues.iter().zip(&expected) {
        assert_same_as(
            &as_restored(&in_broker_order(msgs, kind)),
            &peek(&tconn, name, msgs.len()),
            Headers::of(kind),
            &format!("restored {name}"),
        );
        assert_eq!(depth(&tconn, name) as usize, msgs.len(), "{name}");
    }
    drop(tconn);
    let _ = management().delete_vhost(&target);
}

#[test]
fn s3_round_trip_through_seaweedfs() {
    let bucket = S3Bucket::new("e2e");
    let backend = Backend {
        storage_yaml: format!(
            "  backend: s3\n  bucket: {b}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  prefix: team/prod\n  access_key: \"${{RMQB_TEST_S3_KEY}}\"\n  secret_key: \"${{RMQB_TEST_S3_SECRET}}\"\n",
            b = bucket.name()
        ),
        url: format!(
            "s3://{}/team/prod?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
            bucket.name()
        ),
        env: vec![
            ("RMQB_TEST_S3_KEY", S3_ADMIN.0),
            ("RMQB_TEST_S3_SECRET", S3_ADMIN.1),
            ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
            ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
        ],
    };
    round_trip("s3", &backend);
    // Everything lives under the prefix.
    let keys: Vec<String> = bucket
        .0
        .list(String::new(), None)
        .expect("list")
        .into_iter()
        .flat_map(|p| p.contents.into_iter().map(|o| o.key))
        .collect();
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("team/prod/")), "{keys:?}");
}

#[test]
fn s3_errors_name_the_cause_without_secrets() {
    let bucket = S3Bucket::new("errs");
    let dir = TempDir::new("s3-errors");
    let base = |b: &str, key: &str, secret: &str| {
        format!(
            "mode: restore\nbackup_id: nothing-here\ntarget:\n  amqp_url: \"{amqp}\"\nstorage:\n  backend: s3\n  bucket: {b}\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {key}\n  secret_key: {secret}\nrestore:\n  restore_definitions: false\n",
            amqp = amqp_url("/"),
        )
    };
    // A backup that is not there.
    let cfg = write_config(
        dir.path(),
        "missing.yaml",
        &base(bucket.name(), S3_ADMIN.0, S3_ADMIN.1),
    );
    let out = run_cli(&["restore", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Key not found: nothing-here/manifest.json"),
        "{stderr}"
    );
    // A wrong secret: the write of a backup is denied; the secret never shows.
    let vh = TestVhost::new("s3-denied");
    let yaml = backup_yaml("denied", &vh.name, &dir.path().join("unused"), "");
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let s3_block = |key: &str, secret: &str| {
        format!(
            "storage:\n  backend: s3\n  bucket: {}\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {key}\n  secret_key: {secret}\n",
            bucket.name(),
        )
    };
    let cfg = write_config(
        dir.path(),
        "denied.yaml",
        &yaml.replace(&fs_block, &s3_block(S3_ADMIN.0, "not-the-secret-4711")),
    );
    let out = run_cli(&["-vv", "backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to get denied/manifest.json: 403 Forbidden"),
        "{stderr}"
    );
    assert!(!stdout.contains("not-the-secret-4711") && !stderr.contains("not-the-secret-4711"));
    // A read-only identity: the first write is denied.
    let cfg = write_config(
        dir.path(),
        "readonly.yaml",
        &yaml.replace(
            &fs_block,
            &s3_block("rmqbackup-readonly", "rmqbackup-readonly-secret"),
        ),
    );
    let out = run_cli(&["-vv", "backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to put denied/state/lock.json: 403 Forbidden"),
        "{stderr}"
    );
    assert!(!stderr.contains("rmqbackup-readonly-secret"), "{stderr}");
    // A bucket that does not exist.
    let cfg = write_config(
        dir.path(),
        "nobucket.yaml",
        &yaml.replace(
            &fs_block,
            &s3_block(S3_ADMIN.0, S3_ADMIN.1).replace(bucket.name(), "rmqb-no-such-bucket"),
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to get denied/manifest.json: NoSuchBucket"),
        "{stderr}"
    );
    // An endpoint where nothing listens.
    let out = run_cli_env(
        &[
            "list",
            "--path",
            "s3://b?endpoint=http://127.0.0.1:1&path_style=true&allow_http=true",
        ],
        &[("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "y")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to create S3 backend: endpoint connection error"),
        "{stderr}"
    );
}

/// A self-hosted store behind a private CA: trusted through SSL_CERT_FILE, refused without it.
#[test]
fn s3_over_tls_trusts_a_private_ca_from_ssl_cert_file() {
    let bucket = S3Bucket::new("tls");
    let ca_path = std::env::temp_dir().join("rmq-backup-storage/tls/ca.pem");
    assert!(
        ca_path.is_file(),
        "scripts/setup-storage.sh makes {}",
        ca_path.display()
    );
    let ca = ca_path.to_str().expect("UTF-8 temp dir");
    let url = format!(
        "s3://{}?endpoint=https://127.0.0.1:8334&path_style=true",
        bucket.name()
    );
    let creds = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let mut env = creds.to_vec();
    env.push(("SSL_CERT_FILE", ca));
    let out = run_cli_env(&["list", "--path", &url, "--format", "json"], &env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "[]", "an empty bucket lists no backups");

    let mut env = creds.to_vec();
    env.push(("SSL_CERT_FILE", "/dev/null"));
    let out = run_cli_env(&["list", "--path", &url], &env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to create S3 backend: endpoint connection error"),
        "{stderr}"
    );
}

/// Azurite's well-known development account (public, documented by Microsoft).
#[test]
fn azure_round_trip_through_azurite() {
    let c = AzContainer::new("e2e");
    let backend = Backend {
        storage_yaml: format!(
            "  backend: azure\n  account_name: {AZ_ACCOUNT}\n  container_name: {}\n  endpoint: \"{AZ_ENDPOINT}\"\n  account_key: \"${{RMQB_TEST_AZ_KEY}}\"\n  prefix: team/prod\n",
            c.1
        ),
        url: format!("azure://127.0.0.1:10000/{AZ_ACCOUNT}/{}/team/prod", c.1),
        env: vec![
            ("RMQB_TEST_AZ_KEY", AZ_KEY),
            ("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY),
        ],
    };
    round_trip("azure", &backend);
    let keys = c.0.list("").expect("list");
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("team/prod/")), "{keys:?}");
}

#[test]
fn azure_errors_name_the_cause_without_secrets() {
    let dir = TempDir::new("az-errors");
    let vh = TestVhost::new("az-errors");
    let yaml = backup_yaml("denied", &vh.name, &dir.path().join("unused"), "");
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let az_block = |container: &str, cred: &str| {
        format!(
            "storage:\n  backend: azure\n  account_name: {AZ_ACCOUNT}\n  container_name: {container}\n  endpoint: \"{AZ_ENDPOINT}\"\n{cred}"
        )
    };
    // A container that does not exist.
    let cfg = write_config(
        dir.path(),
        "nocontainer.yaml",
        &yaml.replace(
            &fs_block,
            &az_block(
                "rmqb-no-such-container",
                &format!("  account_key: \"{AZ_KEY}\"\n"),
            ),
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to get denied/manifest.json: ContainerNotFound"),
        "{stderr}"
    );
    // A wrong key: denied, and the key never shows, even at -vv.
    let c = AzContainer::new("denied");
    let wrong = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk=";
    let cfg = write_config(
        dir.path(),
        "denied.yaml",
        &yaml.replace(
            &fs_block,
            &az_block(&c.1, &format!("  account_key: \"{wrong}\"\n")),
        ),
    );
    let out = run_cli(&["-vv", "backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("403 Forbidden"), "{stderr}");
    assert!(
        !stdout.contains(wrong) && !stderr.contains(wrong),
        "{stderr}"
    );
    // A backup that is not there, through the URL.
    let out = run_cli_env(
        &[
            "describe",
            "--path",
            &format!("azure://127.0.0.1:10000/{AZ_ACCOUNT}/{}", c.1),
            "--backup-id",
            "nothing-here",
        ],
        &[("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY)],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Key not found: nothing-here/manifest.json"),
        "{stderr}"
    );
    // A SAS token travels in every request URL: at -vv and with RUST_LOG=trace it never shows.
    let sas = "sv=2021-08-06&ss=b&srt=sco&sp=rl&se=2099-01-01T00:00:00Z&sig=SECRETSIG4711";
    for (flag, rust_log) in [("-vv", ""), ("-v", "trace")] {
        let out = run_cli_env(
            &[
                flag,
                "list",
                "--path",
                &format!("azure://127.0.0.1:10000/{AZ_ACCOUNT}/{}", c.1),
            ],
            &[("AZURE_STORAGE_SAS_TOKEN", sas), ("RUST_LOG", rust_log)],
        );
        let (stdout, stderr) = text(&out);
        assert!(stderr.contains("TRACE"), "trace logging is on: {stderr}");
        assert!(
            !stdout.contains("SECRETSIG4711") && !stderr.contains("SECRETSIG4711"),
            "{stderr}"
        );
    }
    // An endpoint where nothing listens.
    let out = run_cli_env(
        &[
            "list",
            "--path",
            &format!("azure://127.0.0.1:1/{AZ_ACCOUNT}/c"),
        ],
        &[("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY)],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to create Azure backend: endpoint connection error"),
        "{stderr}"
    );
    assert!(!stderr.contains(AZ_KEY));
}

#[test]
fn gcs_round_trip_through_fake_gcs_server() {
    let b = GcsBucket::new("e2e");
    let backend = Backend {
        storage_yaml: format!("  backend: gcs\n  bucket: {}\n  prefix: team/prod\n", b.0),
        url: format!("gs://{}/team/prod", b.0),
        env: vec![("STORAGE_EMULATOR_HOST", GCS_ENDPOINT)],
    };
    round_trip("gcs", &backend);
    let keys = b.storage().list("").expect("list");
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with("team/prod/")), "{keys:?}");
}

#[test]
fn gcs_errors_name_the_cause() {
    let dir = TempDir::new("gcs-errors");
    let vh = TestVhost::new("gcs-errors");
    let yaml = backup_yaml("nobucket", &vh.name, &dir.path().join("unused"), "");
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let cfg = write_config(
        dir.path(),
        "nobucket.yaml",
        &yaml.replace(
            &fs_block,
            "storage:\n  backend: gcs\n  bucket: rmqb-no-such-bucket\n",
        ),
    );
    let emulator = [("STORAGE_EMULATOR_HOST", GCS_ENDPOINT)];
    let out = run_cli_env(&["backup", "--config", &cfg], &emulator);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to put nobucket/state/lock.json: NoSuchBucket"),
        "{stderr}"
    );
    let b = GcsBucket::new("missing");
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &format!("gcs://{}", b.0),
            "--backup-id",
            "nothing-here",
        ],
        &emulator,
    );
    let (stdout, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Key not found: nothing-here/manifest.json"),
        "{stderr}"
    );
    let out = run_cli_env(
        &["list", "--path", "gcs://any-bucket"],
        &[("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to create GCS backend: endpoint connection error"),
        "{stderr}"
    );
}

/// No keys in the configuration or the environment: the S3 credentials come from the chain,
/// here the ECS/EKS container endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI`), played by a local
/// listener that hands out the SeaweedFS admin key with a session token.
#[test]
fn s3_credentials_fall_back_to_the_container_endpoint() {
    use std::io::{BufRead, BufReader, Write};
    let bucket = S3Bucket::new("ecs");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let served = std::sync::Arc::new(AtomicU32::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                line.clear();
            }
            let body = format!(
                r#"{{"AccessKeyId":"{}","SecretAccessKey":"{}","Token":"session-token-x","Expiration":"2099-01-01T00:00:00Z"}}"#,
                S3_ADMIN.0, S3_ADMIN.1
            );
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    let url = format!(
        "s3://{}?endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        bucket.name()
    );
    let creds_uri = format!("http://127.0.0.1:{port}/creds");
    let out = run_cli_env(
        &["list", "--path", &url, "--format", "json"],
        &[("AWS_CONTAINER_CREDENTIALS_FULL_URI", &creds_uri)],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        served.load(Ordering::Relaxed) >= 1,
        "credentials were fetched"
    );
    // The request went out signed with them: SeaweedFS knows the key but refuses the session
    // token (it has no STS), so the answer is its 403, not "no credentials".
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to list /: 403 Forbidden"),
        "{stderr}"
    );
    assert!(!stderr.contains("session-token-x") && !stderr.contains(S3_ADMIN.1));
    // Without any source of credentials the error says so.
    let out = run_cli_env(
        &["list", "--path", &url],
        &[(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://127.0.0.1:1/creds",
        )],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Storage error: Failed to create S3 backend: no credentials"),
        "{stderr}"
    );
}
