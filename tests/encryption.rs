//! Encryption at rest (issue 24) end to end, with the real binary, broker and storage: an
//! encrypted backup holds nothing in clear, restores identical with the identity, is read by
//! the `age` tool, refuses a missing or wrong identity and an altered byte before anything is
//! published, and still lists, describes and validates (shallow) without the identity; secrets
//! from `*_file` fields.

mod common;

use common::*;
use rmq_backup::broker::amqp::{BasicProperties, FieldTable, FieldValue};
use std::path::{Path, PathBuf};

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A message whose header, message id and body carry `marker`; the body as the segment
/// JSON writes it (an array of numbers) is what a reader in clear would find.
fn marked(marker: &str) -> (Msg, Vec<u8>) {
    let body = format!("body of {marker}").into_bytes();
    let json_body = format!(
        "[{}]",
        body.iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let msg = Msg {
        props: BasicProperties {
            message_id: Some(marker.to_string()),
            headers: Some(vec![(
                "note".into(),
                FieldValue::LongString(marker.as_bytes().to_vec()),
            )]),
            ..Default::default()
        },
        body,
    };
    (msg, json_body.into_bytes())
}

/// Two fresh identities (an operator key and an escrow key) written as age identity files,
/// and a third that is no recipient.
struct Keys {
    operator: PathBuf,
    escrow: PathBuf,
    stranger: PathBuf,
    operator_public: String,
    escrow_public: String,
    escrow_secret: String,
}

fn keys(dir: &Path) -> Keys {
    let write = |name: &str| {
        let (secret, public) = rmq_backup::repository::encryption::generate();
        let path = dir.join(name);
        std::fs::write(&path, format!("# public key: {public}\n{secret}\n")).unwrap();
        (path, public, secret)
    };
    let (operator, operator_public, _) = write("operator.txt");
    let (escrow, escrow_public, escrow_secret) = write("escrow.txt");
    let (stranger, _, _) = write("stranger.txt");
    Keys {
        operator,
        escrow,
        stranger,
        operator_public,
        escrow_public,
        escrow_secret,
    }
}

/// A restore of `id` from `store` into the existing vhost `target` (queues declared there):
/// definitions left alone, so that what a failed restore published shows in the depths.
fn restore_into(
    dir: &Path,
    store: &Path,
    id: &str,
    source: &str,
    target: &str,
    extra: &str,
) -> String {
    write_config(
        dir,
        &format!("r-{}.yaml", unique_suffix()),
        &restore_yaml(
            id,
            store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: false\n  vhost_mapping:\n    \"{source}\": \"{target}\"\n{extra}"
            ),
        ),
    )
}

#[test]
fn encrypted_filesystem_backup_holds_nothing_in_clear_and_restores_with_the_identity() {
    let vh = TestVhost::new("enc");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let marker = format!("plaintext-marker-{}", unique_suffix());
    let (marked_msg, marked_json_body) = marked(&marker);
    let queues = [("orders", "classic"), ("events/q", "quorum")];
    let mut expected = Vec::new();
    for (i, (name, kind)) in queues.iter().enumerate() {
        declare(&ch, name, kind, FieldTable::new());
        let mut msgs = vec![marked_msg.clone()];
        msgs.extend(diverse_messages(120, 11 + i as u64, i == 0));
        publish(&ch, name, &msgs);
        expected.push(msgs);
    }
    // Password hashes the definitions export holds (every user of the broker).
    let export: serde_json::Value =
        serde_json::from_slice(&management().export_definitions().unwrap()).unwrap();
    let hashes: Vec<String> = export["users"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["password_hash"].as_str())
        .filter(|h| !h.is_empty())
        .map(String::from)
        .collect();
    assert!(!hashes.is_empty(), "the broker has users with passwords");

    let dir = TempDir::new("enc");
    let k = keys(dir.path());
    std::fs::write(
        dir.path().join("recipients.txt"),
        format!("# escrow\n{}\n", k.escrow_public),
    )
    .unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let spool_env = [("RMQ_BACKUP_SPOOL_DIR", spool.to_str().unwrap())];
    let store = dir.path().join("store");
    let id = format!("enc-{}", rmq_backup::now_ms());
    // No compression: what a reader finds in clear is the records' and definitions' JSON.
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            &id,
            &vh.name,
            &store,
            &format!(
                "  compression: none\n  segment_max_bytes: 200000\n  encryption:\n    recipients: [\"{}\"]\n    recipients_file: \"{}\"\n",
                k.operator_public,
                dir.path().join("recipients.txt").display()
            ),
        ),
    );
    let out = run_cli_env(&["backup", "--config", &cfg], &spool_env);
    assert_eq!(out.status.code(), Some(0), "backup: {:?}", text(&out));
    assert!(files_under(&spool).is_empty(), "the spool keeps nothing");

    // The manifest: scheme and public keys, every segment and the definitions stored as age.
    let m = manifest(&store, &id);
    let info = m.encryption.as_ref().expect("manifest encryption");
    assert_eq!(info.scheme, "age");
    assert_eq!(
        info.recipients,
        [k.operator_public.clone(), k.escrow_public.clone()]
    );
    let defs = m.definitions.as_ref().unwrap();
    assert!(
        defs.key.ends_with("/definitions/definitions.json.age"),
        "{}",
        defs.key
    );
    assert_eq!(defs.encryption.as_deref(), Some("age"));
    let segments: Vec<_> = m.queues.iter().flat_map(|q| &q.segments).collect();
    assert!(segments.len() > 2, "{} segments", segments.len());
    for s in &segments {
        assert!(
            s.key.ends_with(".age") && !s.key.ends_with(".zst.age"),
            "{}",
            s.key
        );
        assert_eq!(s.encryption.as_deref(), Some("age"));
        let stored = std::fs::read(store.join(&s.key)).unwrap();
        assert!(stored.starts_with(b"age-encryption.org/v1\n"), "{}", s.key);
        assert_eq!(stored.len() as u64, s.size_bytes);
    }
    let manifest_text = std::fs::read_to_string(store.join(&id).join("manifest.json")).unwrap();
    assert!(!manifest_text.contains("AGE-SECRET-KEY"));

    // Nothing in clear: no marker, no body, no password hash in any stored file but the
    // manifest (which holds none of them either).
    for f in files_under(&store.join(&id)) {
        let bytes = std::fs::read(&f).unwrap();
        for needle in [marker.as_bytes(), &marked_json_body[..]] {
            assert!(!contains(&bytes, needle), "{} holds plaintext", f.display());
        }
        for h in &hashes {
            assert!(
                !contains(&bytes, h.as_bytes()),
                "{} holds a password hash",
                f.display()
            );
        }
    }

    // The age tool decrypts a stored segment into a RBAK file the segment reader accepts
    // (and which does hold the plaintext: the search above was not blind).
    let first = &m
        .queues
        .iter()
        .find(|q| q.name == "orders")
        .unwrap()
        .segments[0];
    let plain = dir.path().join("segment-0001");
    let out = std::process::Command::new("age")
        .args(["--decrypt", "-i"])
        .arg(&k.escrow)
        .arg("-o")
        .arg(&plain)
        .arg(store.join(&first.key))
        .output()
        .expect("the age tool (Debian package age; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "age -d: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reader = rmq_backup::repository::segment::SegmentReader::open(&plain).expect("a RBAK file");
    assert_eq!(reader.header().record_count, first.record_count);
    let records: Vec<Vec<u8>> = reader
        .records()
        .map(|r| match r.unwrap() {
            rmq_backup::repository::segment::RawRecord::Json(json) => json,
            other => panic!("a version 1 record: {other:?}"),
        })
        .collect();
    assert_eq!(records.len() as u64, first.record_count);
    assert!(
        contains(&records[0], marker.as_bytes()),
        "the first record is the marked one"
    );
    let defs_plain = dir.path().join("definitions.json");
    let out = std::process::Command::new("age")
        .args(["-d", "-i"])
        .arg(&k.operator)
        .arg("-o")
        .arg(&defs_plain)
        .arg(store.join(&defs.key))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let defs_text = std::fs::read(&defs_plain).unwrap();
    assert!(
        contains(&defs_text, hashes[0].as_bytes()),
        "decrypted definitions hold the hashes"
    );

    // list, describe and a shallow validate need no identity.
    let url = format!("file://{}", store.display());
    let no_identity = [("RMQ_BACKUP_AGE_IDENTITY", "")];
    for args in [
        vec!["list", "--path", &url],
        vec!["describe", "--path", &url, "--backup-id", &id],
        vec!["validate", "--path", &url, "--backup-id", &id],
    ] {
        let out = run_cli_env(&args, &no_identity);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {:?}", text(&out));
    }
    // A deep validate needs it, and checks out with either recipient's key.
    let out = run_cli_env(
        &["validate", "--path", &url, "--backup-id", &id, "--deep"],
        &no_identity,
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "Encryption error: backup {id} is encrypted (age) and no identity was given"
        )),
        "{stderr}"
    );
    let escrow = k.escrow.to_str().unwrap();
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--deep",
        "--identity-file",
        escrow,
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("is valid (deep check)"), "{stdout}");
    // cat reads through the same reader, the identity from the environment.
    let out = run_cli_env(
        &[
            "cat",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--queue",
            "orders",
            "--limit",
            "1",
        ],
        &[("RMQ_BACKUP_AGE_IDENTITY", k.escrow_secret.as_str())],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains(&marker), "{stdout}");

    // An unencrypted backup reads as before with an identity given, and its manifest has
    // none of the new fields (byte for byte what SPEC.md describes).
    let plain_id = format!("{id}-plain");
    let cfg = write_config(
        dir.path(),
        "plain.yaml",
        &backup_yaml(&plain_id, &vh.name, &store, "  compression: none\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let plain_manifest =
        std::fs::read_to_string(store.join(&plain_id).join("manifest.json")).unwrap();
    assert!(!plain_manifest.contains("encryption"), "{plain_manifest}");
    assert!(!plain_manifest.contains("recipients"), "{plain_manifest}");
    assert!(!plain_manifest.contains(".age"), "{plain_manifest}");
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &plain_id,
        "--deep",
        "--identity-file",
        escrow,
    ]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let out = run_cli_env(
        &[
            "cat",
            "--path",
            &url,
            "--backup-id",
            &plain_id,
            "--queue",
            "orders",
            "--limit",
            "1",
        ],
        &[("RMQ_BACKUP_AGE_IDENTITY", k.escrow_secret.as_str())],
    );
    assert!(text(&out).0.contains(&marker), "{:?}", text(&out));

    // Restore with the operator's identity: identical, definitions imported (the target's
    // own definitions saved first, encrypted too).
    let target = vh.sibling("target");
    let rcfg = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  encryption:\n    identity_file: \"{}\"\n",
                k.operator.display(),
                v = vh.name
            ),
        ),
    );
    let out = run_cli_env(&["restore", "--config", &rcfg], &spool_env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "restore: {stdout}\n{stderr}");
    assert!(
        files_under(&spool).is_empty(),
        "the spool keeps no plaintext"
    );
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
    let rollbacks: Vec<PathBuf> = files_under(&store.join(&id).join("definitions"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("rollback-before-import-"))
        .collect();
    assert_eq!(rollbacks.len(), 1, "{rollbacks:?}");
    assert!(
        rollbacks[0].to_string_lossy().ends_with(".age"),
        "{rollbacks:?}"
    );
    let rb = std::fs::read(&rollbacks[0]).unwrap();
    assert!(rb.starts_with(b"age-encryption.org/v1\n"));
    assert!(hashes.iter().all(|h| !contains(&rb, h.as_bytes())));

    // Refusals, each before anything is published: into a vhost whose queues exist, empty.
    let empty = vh.sibling("target2");
    management().create_vhost(&empty).unwrap();
    management().set_permissions(&empty, "guest").unwrap();
    let econn = connect(&empty);
    let ech = econn.open_channel().unwrap();
    for (name, kind) in &queues {
        declare(&ech, name, kind, FieldTable::new());
    }
    let nothing_published = |what: &str| {
        for (name, _) in &queues {
            assert_eq!(depth(&econn, name), 0, "{what}: {name} got messages");
        }
        assert!(
            files_under(&spool).is_empty(),
            "{what}: the spool keeps files"
        );
    };
    let refused = |extra: &str, env: &[(&str, &str)], want: &str, what: &str| {
        let r = restore_into(dir.path(), &store, &id, &vh.name, &empty, extra);
        let mut env = env.to_vec();
        env.push(spool_env[0]);
        let out = run_cli_env(&["restore", "--config", &r], &env);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {stdout}{stderr}");
        assert!(stderr.contains(want), "{what}: want {want:?} in {stderr}");
        nothing_published(what);
    };
    refused(
        "",
        &no_identity,
        &format!("Encryption error: backup {id} is encrypted (age) and no identity was given"),
        "missing identity",
    );
    let stranger = format!(
        "  encryption:\n    identity_file: \"{}\"\n",
        k.stranger.display()
    );
    refused(
        &stranger,
        &[],
        "Encryption error: none of the identities in restore.encryption.identity_file",
        "wrong identity",
    );
    let with_key = format!(
        "  encryption:\n    identity_file: \"{}\"\n",
        k.operator.display()
    );
    // One byte flipped in the first segment of each queue: the SHA-256 of the stored bytes.
    let firsts: Vec<_> = m.queues.iter().map(|q| q.segments[0].clone()).collect();
    let flip = |s: &rmq_backup::repository::manifest::SegmentMetadata| {
        let p = store.join(&s.key);
        let mut b = std::fs::read(&p).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x01;
        std::fs::write(&p, &b).unwrap();
        rmq_backup::repository::segment::sha256_file(&p).unwrap()
    };
    let altered: Vec<String> = firsts.iter().map(flip).collect();
    refused(
        &with_key,
        &[],
        "Serialization error: SHA-256 mismatch",
        "flipped byte",
    );
    // Someone who can also rewrite the manifest's checksums: age's MAC refuses the segment.
    let mut m2 = m.clone();
    for (q, sha) in m2.queues.iter_mut().zip(&altered) {
        q.segments[0].checksum = sha.clone();
    }
    std::fs::write(
        store.join(&id).join("manifest.json"),
        m2.to_json_pretty().unwrap(),
    )
    .unwrap();
    refused(
        &with_key,
        &[],
        "Encryption error: ",
        "flipped byte under a rewritten checksum",
    );
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--deep",
        "--identity-file",
        escrow,
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "damage found: {stdout}{stderr}");
    assert!(stdout.contains("damaged or was altered"), "{stdout}");
    drop(econn);
    let _ = management().delete_vhost(&target);
}

#[test]
fn encrypted_backup_through_s3_with_secrets_from_files() {
    let vh = TestVhost::new("enc-s3");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(80, 5, false);
    publish(&ch, "q", &msgs);
    let bucket = S3Bucket::new("enc");
    let dir = TempDir::new("enc-s3");
    let k = keys(dir.path());
    // Every secret from a file, as a Kubernetes Secret mounts them.
    let secret = |name: &str, value: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{value}\n")).unwrap();
        p.display().to_string()
    };
    let (access, secret_key) = (secret("access", S3_ADMIN.0), secret("secret", S3_ADMIN.1));
    let (mgmt_pw, amqp_pw) = (secret("mgmt", "guest"), secret("amqp", "guest"));
    let storage = format!(
        "storage:\n  backend: s3\n  bucket: {}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key_file: \"{access}\"\n  secret_key_file: \"{secret_key}\"\n",
        bucket.name()
    );
    let id = format!("enc-s3-{}", rmq_backup::now_ms());
    let fs_block = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let yaml = backup_yaml(
        &id,
        &vh.name,
        &dir.path().join("unused"),
        &format!(
            "  encryption:\n    recipients: [\"{}\"]\n",
            k.operator_public
        ),
    )
    .replace(&fs_block, &storage)
    .replace("guest:guest@", "guest@")
    .replace(
        "  management_password: guest\n",
        &format!(
            "  management_password_file: \"{mgmt_pw}\"\n  amqp_password_file: \"{amqp_pw}\"\n"
        ),
    );
    assert!(
        yaml.contains("amqp_password_file") && yaml.contains("access_key_file"),
        "{yaml}"
    );
    let cfg = write_config(dir.path(), "b.yaml", &yaml);
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "backup: {:?}", text(&out));
    let keys_stored: Vec<String> = bucket
        .0
        .list(String::new(), None)
        .unwrap()
        .into_iter()
        .flat_map(|p| p.contents.into_iter().map(|o| o.key))
        .collect();
    let segs: Vec<&String> = keys_stored
        .iter()
        .filter(|k| k.contains("/queues/"))
        .collect();
    assert!(
        !segs.is_empty() && segs.iter().all(|k| k.ends_with(".zst.age")),
        "{keys_stored:?}"
    );
    assert!(
        keys_stored
            .iter()
            .any(|k| k.ends_with("definitions.json.zst.age")),
        "{keys_stored:?}"
    );

    // Shallow validate without the key, deep with it (from the environment), over the URL.
    let url = format!(
        "s3://{}?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        bucket.name()
    );
    let creds = [
        ("AWS_ACCESS_KEY_ID", S3_ADMIN.0),
        ("AWS_SECRET_ACCESS_KEY", S3_ADMIN.1),
    ];
    let out = run_cli_env(&["validate", "--path", &url, "--backup-id", &id], &creds);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let operator = k.operator.to_str().unwrap();
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--deep",
            "--identity-file",
            operator,
        ],
        &creds,
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Restore with the identity from the environment variable.
    let target = vh.sibling("target");
    let identity_text = std::fs::read_to_string(&k.operator).unwrap();
    let rfs = format!(
        "storage:\n  backend: filesystem\n  path: \"{}\"\n",
        dir.path().join("unused").display()
    );
    let ryaml = restore_yaml(
        &id,
        &dir.path().join("unused"),
        &format!(
            "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n",
            v = vh.name
        ),
    )
    .replace(&rfs, &storage);
    let rcfg = write_config(dir.path(), "r.yaml", &ryaml);
    let out = run_cli_env(
        &["restore", "--config", &rcfg],
        &[("RMQ_BACKUP_AGE_IDENTITY", identity_text.as_str())],
    );
    assert_eq!(out.status.code(), Some(0), "restore: {:?}", text(&out));
    let tconn = connect(&target);
    assert_same_as(
        &as_restored(&msgs),
        &peek(&tconn, "q", msgs.len()),
        Headers::of("classic"),
        "restored from s3",
    );
    drop(tconn);
    let _ = management().delete_vhost(&target);

    // A secret file that is not there: a Configuration error naming the field and the path.
    let missing = dir.path().join("no-such-secret");
    let bad = yaml.replace(&mgmt_pw, missing.to_str().unwrap());
    let cfg = write_config(dir.path(), "bad.yaml", &bad);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "Configuration error: Cannot read source.management_password_file {}: No such file or directory",
            missing.display()
        )),
        "{stderr}"
    );
    // A recipient that is not an age key: a Configuration error, before anything is read.
    let bad = yaml.replace(&k.operator_public, "age1notakey");
    let cfg = write_config(dir.path(), "bad2.yaml", &bad);
    let out = run_cli(&["backup", "--config", &cfg]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("Configuration error: backup.encryption.recipients entry 1 is not an age X25519 recipient"),
        "{stderr}"
    );
    let _ = k.escrow_public;
}

/// An age identity file at `dir/name` holding `secrets`, with file mode `mode`.
fn identity_file(dir: &Path, name: &str, secrets: &[&str], mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("{}\n", secrets.join("\n"))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// The stored manifest of `id` as JSON (compiles whatever fields the manifest type has).
fn manifest_json(store: &Path, id: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(store.join(id).join("manifest.json")).unwrap()).unwrap()
}

fn write_manifest_json(store: &Path, id: &str, m: &serde_json::Value) {
    std::fs::write(
        store.join(id).join("manifest.json"),
        serde_json::to_string_pretty(m).unwrap(),
    )
    .unwrap();
}

/// The segment entries of queue `name` in a manifest read as JSON.
fn segments_of<'a>(m: &'a serde_json::Value, name: &str) -> &'a Vec<serde_json::Value> {
    m["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == name)
        .unwrap_or_else(|| panic!("queue {name} not in {m}"))["segments"]
        .as_array()
        .unwrap()
}

/// A vhost `name` (a sibling of a `TestVhost`, deleted with it) holding empty `queues`.
fn empty_target(name: &str, queues: &[(&str, &str)]) -> rmq_backup::broker::amqp::Connection {
    let _ = management().delete_vhost(name);
    management().create_vhost(name).unwrap();
    management().set_permissions(name, "guest").unwrap();
    let conn = connect(name);
    let ch = conn.open_channel().unwrap();
    for (q, kind) in queues {
        declare(&ch, q, kind, FieldTable::new());
    }
    let _ = ch.close();
    conn
}

/// Issue 31 item 6: parts of a sharded backup written with other recipients each. The merged
/// manifest lists every key, but an identity that opens one part's segments only is refused
/// before anything is published or written, naming the segments it cannot open; an identity
/// file holding both keys restores everything.
#[test]
fn parts_encrypted_to_other_keys_are_refused_at_once_naming_the_segments() {
    let vh = TestVhost::new("enc-parts");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    // One queue in each part; the part-0 queue sorts first (cat reads in name order).
    let pick = |prefix: &str, part: u32| {
        (0..100)
            .map(|i| format!("{prefix}-{i}"))
            .find(|n| rmq_backup::repository::shard::part_of(&vh.name, n, 2) == part)
            .unwrap()
    };
    let (q0, q1) = (pick("a", 0), pick("b", 1));
    let mut expected = Vec::new();
    for (i, name) in [&q0, &q1].into_iter().enumerate() {
        declare(&ch, name, "classic", FieldTable::new());
        let msgs = diverse_messages(40, 70 + i as u64, false);
        publish(&ch, name, &msgs);
        expected.push(msgs);
    }
    let dir = TempDir::new("enc-parts");
    let k = keys(dir.path());
    let store = dir.path().join("store");
    let id = format!("enc-parts-{}", rmq_backup::now_ms());
    // Part 0 encrypts to the operator's key, part 1 to the escrow key.
    for (index, public) in [(0, &k.operator_public), (1, &k.escrow_public)] {
        let cfg = write_config(
            dir.path(),
            &format!("b{index}.yaml"),
            &backup_yaml(
                &id,
                &vh.name,
                &store,
                &format!("  shard:\n    count: 2\n  encryption:\n    recipients: [\"{public}\"]\n"),
            ),
        );
        let index = index.to_string();
        let out = run_cli_env(
            &["backup", "--config", &cfg],
            &[("JOB_COMPLETION_INDEX", index.as_str())],
        );
        assert_eq!(out.status.code(), Some(0), "part {index}: {:?}", text(&out));
    }
    let m = manifest_json(&store, &id);
    assert_eq!(m["parts"], 2, "merged: {m}");
    assert_eq!(
        m["encryption"]["recipients"],
        serde_json::json!([k.operator_public, k.escrow_public]),
        "the merged manifest lists the union"
    );
    let part1_keys: Vec<String> = segments_of(&m, &q1)
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_string())
        .collect();
    assert!(!part1_keys.is_empty());
    for (q, public) in [(&q0, &k.operator_public), (&q1, &k.escrow_public)] {
        for s in segments_of(&m, q) {
            assert_eq!(s["recipients"], serde_json::json!([public]), "{s}");
        }
    }

    let operator_only = identity_file(
        dir.path(),
        "op.txt",
        &[&std::fs::read_to_string(&k.operator).unwrap()],
        0o600,
    );
    let both = identity_file(
        dir.path(),
        "both.txt",
        &[
            &std::fs::read_to_string(&k.operator).unwrap(),
            &k.escrow_secret,
        ],
        0o600,
    );
    let queues = [(q0.as_str(), "classic"), (q1.as_str(), "classic")];
    let target = vh.sibling("target");
    let tconn = empty_target(&target, &queues);
    let no_env = [("RMQ_BACKUP_AGE_IDENTITY", "")];
    let with = |p: &Path| format!("  encryption:\n    identity_file: \"{}\"\n", p.display());

    // The operator's key opens part 0 only: refused before anything is published.
    let r = restore_into(
        dir.path(),
        &store,
        &id,
        &vh.name,
        &target,
        &with(&operator_only),
    );
    let out = run_cli_env(&["restore", "--config", &r], &no_env);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let last = stderr.lines().last().unwrap_or("");
    assert!(last.starts_with("Encryption error: "), "{stderr}");
    assert!(last.contains("cannot open"), "{stderr}");
    for key in &part1_keys {
        assert!(last.contains(key.as_str()), "{key} not named: {stderr}");
    }
    for (q, _) in &queues {
        assert_eq!(depth(&tconn, q), 0, "{q}: published before the refusal");
    }
    // validate --deep and cat check the same before reading anything.
    let url = format!("file://{}", store.display());
    let op = operator_only.to_str().unwrap();
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--deep",
            "--identity-file",
            op,
        ],
        &no_env,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("Encryption error: ")
            && stderr.contains("cannot open")
            && stderr.contains(&part1_keys[0]),
        "{stderr}"
    );
    let out = run_cli_env(
        &[
            "cat",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--identity-file",
            op,
        ],
        &no_env,
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.is_empty(),
        "cat wrote records before the refusal: {stdout}"
    );
    assert!(
        stderr.contains("cannot open") && stderr.contains(&part1_keys[0]),
        "{stderr}"
    );
    // Asking for the part-0 queue alone is fine: only what is read must open.
    let out = run_cli_env(
        &[
            "cat",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--identity-file",
            op,
            "--queue",
            &q0,
        ],
        &no_env,
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(text(&out).0.lines().count(), 40);

    // Both keys: everything restores.
    let r = restore_into(dir.path(), &store, &id, &vh.name, &target, &with(&both));
    let out = run_cli_env(&["restore", "--config", &r], &no_env);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    for ((q, _), msgs) in queues.iter().zip(&expected) {
        assert_same_as(
            &as_restored(msgs),
            &peek(&tconn, q, msgs.len()),
            Headers::of("classic"),
            q,
        );
    }
}

/// Issue 31 item 6: a rerun of an interrupted backup after `backup.encryption.recipients`
/// changed does not reuse the segments the earlier run encrypted to the old key (the manifest
/// would list the new key only): it reads those queues again and says why, and the result
/// opens with the new key alone.
#[test]
fn a_rerun_with_other_recipients_reads_again_the_queues_encrypted_to_the_old_ones() {
    let vh = TestVhost::new("enc-rerun");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(60, 91, false);
    publish(&ch, "q", &msgs);
    let dir = TempDir::new("enc-rerun");
    let k = keys(dir.path());
    let store = dir.path().join("store");
    let id = format!("enc-rerun-{}", rmq_backup::now_ms());
    let db = dir.path().join("offsets.db");
    let cfg = |public: &str| {
        write_config(
            dir.path(),
            &format!("b-{}.yaml", unique_suffix()),
            &backup_yaml(
                &id,
                &vh.name,
                &store,
                &format!(
                    "  encryption:\n    recipients: [\"{public}\"]\noffset_storage:\n  backend: sqlite\n  db_path: \"{}\"\n",
                    db.display()
                ),
            ),
        )
    };
    let out = run_cli(&["backup", "--config", &cfg(&k.operator_public)]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // The run dies after its queues completed, before its final manifest: interrupted.
    let mut m = manifest_json(&store, &id);
    m["completed_at"] = serde_json::Value::Null;
    write_manifest_json(&store, &id, &m);

    // Rerun to the escrow key only.
    let out = run_cli(&["backup", "--config", &cfg(&k.escrow_public)]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "queue q in vhost {}: the earlier run's segments are encrypted to other recipients",
            vh.name
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("segment(s) reused"), "{stderr}");
    let m = manifest_json(&store, &id);
    assert!(m["completed_at"].is_i64(), "{m}");
    assert_eq!(
        m["encryption"]["recipients"],
        serde_json::json!([k.escrow_public])
    );
    let segs = segments_of(&m, "q");
    assert!(!segs.is_empty());
    for s in segs {
        assert_eq!(s["recipients"], serde_json::json!([k.escrow_public]), "{s}");
    }
    // The escrow key alone restores everything; the old key opens nothing any more.
    let escrow = identity_file(dir.path(), "escrow-only.txt", &[&k.escrow_secret], 0o600);
    let target = vh.sibling("target");
    let tconn = empty_target(&target, &[("q", "classic")]);
    let r = restore_into(
        dir.path(),
        &store,
        &id,
        &vh.name,
        &target,
        &format!(
            "  encryption:\n    identity_file: \"{}\"\n",
            escrow.display()
        ),
    );
    let out = run_cli_env(
        &["restore", "--config", &r],
        &[("RMQ_BACKUP_AGE_IDENTITY", "")],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_same_as(
        &as_restored(&msgs),
        &peek(&tconn, "q", msgs.len()),
        Headers::of("classic"),
        "restored",
    );
    let url = format!("file://{}", store.display());
    let out = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        &id,
        "--deep",
        "--identity-file",
        k.operator.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("Encryption error: "), "{stderr}");
}

/// Issue 31 items 7 and 8: the target's definitions saved before an import are encrypted to
/// the restorer's own key, not to whatever keys `manifest.json` (which anyone who can write
/// to the bucket can edit) lists; a segment stored unencrypted inside an encrypted backup is
/// refused before anything is published; an identity file readable by others is warned about.
#[test]
fn the_snapshot_goes_to_the_restorer_and_plain_segments_are_refused() {
    let vh = TestVhost::new("enc-trust");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(30, 17, false);
    publish(&ch, "q", &msgs);
    let dir = TempDir::new("enc-trust");
    let k = keys(dir.path());
    let store = dir.path().join("store");
    let id = format!("enc-trust-{}", rmq_backup::now_ms());
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml(
            &id,
            &vh.name,
            &store,
            &format!(
                "  encryption:\n    recipients: [\"{}\"]\n",
                k.operator_public
            ),
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let plain_id = format!("{id}-plain");
    let cfg = write_config(
        dir.path(),
        "plain.yaml",
        &backup_yaml(&plain_id, &vh.name, &store, ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let original = manifest_json(&store, &id);

    // Someone who can write to the bucket adds their key (the stranger's) to every list.
    let stranger_public = {
        let out = std::process::Command::new("age-keygen")
            .arg("-y")
            .arg(&k.stranger)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let mut m = original.clone();
    m["encryption"]["recipients"]
        .as_array_mut()
        .unwrap()
        .push(stranger_public.clone().into());
    for q in m["queues"].as_array_mut().unwrap() {
        for s in q["segments"].as_array_mut().unwrap() {
            if let Some(r) = s.get_mut("recipients").and_then(|r| r.as_array_mut()) {
                r.push(stranger_public.clone().into());
            }
        }
    }
    write_manifest_json(&store, &id, &m);
    // The restorer's identity file is readable by others: warned about, one line.
    let operator = identity_file(
        dir.path(),
        "operator-0644.txt",
        &[&std::fs::read_to_string(&k.operator).unwrap()],
        0o644,
    );
    let target = vh.sibling("target");
    let r = write_config(
        dir.path(),
        "r.yaml",
        &restore_yaml(
            &id,
            &store,
            &format!(
                "  publish_mode: direct-to-queue\n  restore_definitions: true\n  definitions_selection:\n    vhosts: [\"{v}\"]\n  vhost_mapping:\n    \"{v}\": \"{target}\"\n  encryption:\n    identity_file: \"{}\"\n",
                operator.display(),
                v = vh.name
            ),
        ),
    );
    let out = run_cli_env(
        &["restore", "--config", &r],
        &[("RMQ_BACKUP_AGE_IDENTITY", "")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(operator.to_str().unwrap()) && l.contains("0644"))
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "one warning naming the file and its mode: {stderr}"
    );
    assert!(warned[0].contains("group or others"), "{}", warned[0]);
    let tconn = connect(&target);
    assert_same_as(
        &as_restored(&msgs),
        &peek(&tconn, "q", msgs.len()),
        Headers::of("classic"),
        "restored",
    );
    drop(tconn);
    let rollback = files_under(&store.join(&id).join("definitions"))
        .into_iter()
        .find(|p| p.to_string_lossy().contains("rollback-before-import-"))
        .expect("the target's definitions saved");
    let age_d = |key: &Path| {
        std::process::Command::new("age")
            .args(["-d", "-i"])
            .arg(key)
            .arg(&rollback)
            .output()
            .unwrap()
    };
    let by_stranger = age_d(&k.stranger);
    assert!(
        !by_stranger.status.success(),
        "the key added to manifest.json opens the target's password hashes"
    );
    let by_operator = age_d(&k.operator);
    assert!(by_operator.status.success(), "{:?}", by_operator);

    // A 0600 identity file: no warning.
    let quiet = identity_file(
        dir.path(),
        "operator-0600.txt",
        &[&std::fs::read_to_string(&k.operator).unwrap()],
        0o600,
    );
    let url = format!("file://{}", store.display());
    let out = run_cli_env(
        &[
            "validate",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--deep",
            "--identity-file",
            quiet.to_str().unwrap(),
        ],
        &[("RMQ_BACKUP_AGE_IDENTITY", "")],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stderr.contains("group or others"), "{stderr}");

    // A plain segment put in the encrypted backup, its manifest entry rewritten to match.
    let plain = manifest_json(&store, &plain_id);
    let plain_seg = segments_of(&plain, "q")[0].clone();
    let plain_key = plain_seg["key"]
        .as_str()
        .unwrap()
        .replacen(&plain_id, &id, 1);
    std::fs::copy(
        store.join(plain_seg["key"].as_str().unwrap()),
        store.join(&plain_key),
    )
    .unwrap();
    let mut m = original.clone();
    let mut swapped = plain_seg.clone();
    swapped["key"] = plain_key.clone().into();
    m["queues"][0]["segments"] = serde_json::json!([swapped]);
    write_manifest_json(&store, &id, &m);
    let empty = vh.sibling("target2");
    let econn = empty_target(&empty, &[("q", "classic")]);
    let env = [("RMQ_BACKUP_AGE_IDENTITY", "")];
    let with_key = format!(
        "  encryption:\n    identity_file: \"{}\"\n",
        quiet.display()
    );
    let refused = |want: &str, what: &str| {
        let r = restore_into(dir.path(), &store, &id, &vh.name, &empty, &with_key);
        let out = run_cli_env(&["restore", "--config", &r], &env);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {stdout}{stderr}");
        assert!(stderr.contains(want), "{what}: want {want:?} in {stderr}");
        assert_eq!(depth(&econn, "q"), 0, "{what}: published");
    };
    let want = format!("Encryption error: backup {id} is encrypted, but 1 file(s) it lists are stored unencrypted: {plain_key}");
    refused(&want, "a plain segment listed as plain");
    for args in [
        vec![
            "validate",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--deep",
            "--identity-file",
            quiet.to_str().unwrap(),
        ],
        vec![
            "cat",
            "--path",
            &url,
            "--backup-id",
            &id,
            "--identity-file",
            quiet.to_str().unwrap(),
        ],
    ] {
        let out = run_cli_env(&args, &env);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains(&want), "{args:?}: {stderr}");
        assert!(!stdout.contains("\"body\""), "{args:?}: {stdout}");
    }
    // The same plain file under the encrypted segment's key, listed as age with its
    // checksum and size rewritten: not an age file, refused.
    let enc_seg = segments_of(&original, "q")[0].clone();
    let enc_key = enc_seg["key"].as_str().unwrap().to_string();
    std::fs::copy(store.join(&plain_key), store.join(&enc_key)).unwrap();
    let mut m = original.clone();
    let mut forged = enc_seg.clone();
    forged["checksum"] = plain_seg["checksum"].clone();
    forged["size_bytes"] = plain_seg["size_bytes"].clone();
    m["queues"][0]["segments"] = serde_json::json!([forged]);
    m["total_bytes"] = plain_seg["size_bytes"].clone();
    write_manifest_json(&store, &id, &m);
    refused(
        &format!("Encryption error: {enc_key}: not an age file"),
        "a plain file listed as age",
    );
    drop(econn);
}
