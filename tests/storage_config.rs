//! Issue 40: every command that opens a storage takes it from the same configuration file a
//! backup uses (`--config`; `copy --from-config/--to-config`), with the credentials only in
//! that file: no `AWS_*` variable in the processes' environment, no key on a command line.
//! Against SeaweedFS (S3) and the test broker; also `restore --dry-run` as a flag.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::path::Path;
use std::process::{Command, Output};

/// The binary with `args` and no storage credentials in its environment.
fn cli(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env_remove("RMQ_BACKUP_AGE_IDENTITY")
        .output()
        .expect("run rmq-backup")
}

fn ok(out: &Output, what: &str) -> String {
    let (stdout, stderr) = text(out);
    assert_eq!(out.status.code(), Some(0), "{what}: {stdout}{stderr}");
    stdout
}

/// `yaml` (a filesystem configuration) with an S3 storage section instead: the access key in
/// the file, the secret key in a file the file names.
fn on_s3(yaml: &str, store: &Path, bucket: &str, secret_file: &Path, prefix: &str) -> String {
    let s3 = format!(
        "  backend: s3\n  bucket: {bucket}\n  prefix: {prefix}\n  region: us-east-1\n  endpoint: \"{S3_ENDPOINT}\"\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key_file: \"{}\"\n",
        S3_ADMIN.0,
        secret_file.display()
    );
    let out = yaml.replace(
        &format!("  backend: filesystem\n  path: \"{}\"\n", store.display()),
        &s3,
    );
    assert!(out.contains("backend: s3"), "{out}");
    out
}

#[test]
fn storage_commands_take_the_storage_and_its_credentials_from_the_configuration() {
    let vh = TestVhost::new("storecfg");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "orders", "classic", FieldTable::new());
    publish(&ch, "orders", &diverse_messages(5, 40, false));
    drop(ch);
    drop(conn);

    let dir = TempDir::new("storecfg");
    let store = dir.path().join("unused");
    let secret = dir.path().join("s3-secret");
    std::fs::write(&secret, format!("{}\n", S3_ADMIN.1)).unwrap();
    let a = S3Bucket::new("cfga");
    let b = S3Bucket::new("cfgb");
    let id = "cfg-1";
    let backup = backup_yaml(id, &vh.name, &store, "");
    let backup = format!(
        "{}retention:\n  keep_last: 1\n",
        on_s3(&backup, &store, a.name(), &secret, "prod")
    );
    let a_cfg = write_config(dir.path(), "a.yaml", &backup);
    let b_yaml = on_s3(
        &restore_yaml(
            id,
            &store,
            &format!(
                "  vhost_mapping: {{\"{}\": \"{}\"}}",
                vh.name,
                vh.sibling("target")
            ),
        ),
        &store,
        b.name(),
        &secret,
        "copy",
    );
    let b_cfg = write_config(dir.path(), "b.yaml", &b_yaml);

    ok(&cli(&["backup", "--config", &a_cfg]), "backup");

    // The same storage by URL fails without credentials in the environment: what follows
    // comes from the file.
    let url = format!(
        "s3://{}/prod?region=us-east-1&endpoint={S3_ENDPOINT}&path_style=true&allow_http=true",
        a.name()
    );
    let out = cli(&["list", "--path", &url]);
    assert_ne!(out.status.code(), Some(0), "{:?}", text(&out));

    let list = ok(&cli(&["list", "--config", &a_cfg]), "list");
    assert!(list.contains(id) && list.contains("completed"), "{list}");
    let describe = ok(&cli(&["describe", "--config", &a_cfg]), "describe");
    assert!(
        describe.contains("orders"),
        "the file's backup_id: {describe}"
    );
    let validate = ok(
        &cli(&["validate", "--config", &a_cfg, "--deep"]),
        "validate",
    );
    assert!(validate.contains("is valid"), "{validate}");
    let cat = ok(
        &cli(&["cat", "--config", &a_cfg, "--queue", "orders"]),
        "cat",
    );
    assert_eq!(cat.lines().count(), 5, "{cat}");

    // copy: both storages from files; then the copy is listed, validated and forgotten there.
    ok(
        &cli(&["copy", "--from-config", &a_cfg, "--to-config", &b_cfg]),
        "copy",
    );
    let list = ok(&cli(&["list", "--config", &b_cfg]), "list the copy");
    assert!(list.contains(id) && list.contains("completed"), "{list}");
    ok(
        &cli(&["validate", "--config", &b_cfg, "--backup-id", id, "--deep"]),
        "validate the copy",
    );
    // forget: the command line's rules, or the file's retention section.
    let forget = ok(
        &cli(&[
            "forget",
            "--config",
            &b_cfg,
            "--keep-last",
            "1",
            "--dry-run",
        ]),
        "forget",
    );
    assert!(forget.contains("keep"), "{forget}");
    let forget = ok(
        &cli(&["forget", "--config", &a_cfg, "--dry-run"]),
        "forget by retention:",
    );
    assert!(
        forget.contains("keep-last 1") || forget.contains("last"),
        "{forget}"
    );

    // restore --dry-run: a flag, as backup --dry-run.
    let dry = ok(
        &cli(&["restore", "--config", &b_cfg, "--dry-run"]),
        "restore --dry-run",
    );
    assert!(dry.contains("Dry run of restore"), "{dry}");
    assert!(dry.contains("orders"), "{dry}");

    // Mistakes: both or neither of --path and --config; a storage secret the file needs from an
    // unset variable, named with its key (the other sections' variables do not matter).
    let out = cli(&["list", "--path", &url, "--config", &a_cfg]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        text(&out)
            .1
            .starts_with("Configuration error: --path and --config"),
        "{:?}",
        text(&out)
    );
    let out = cli(&["describe"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    let unset = backup
        .replace(
            &format!("  access_key: {}\n", S3_ADMIN.0),
            "  access_key: \"${RMQB_TEST_UNSET_KEY}\"\n",
        )
        .replace(
            "management_password: guest",
            "management_password: \"${RMQB_TEST_UNSET_PW}\"",
        );
    let unset_cfg = write_config(dir.path(), "unset.yaml", &unset);
    let out = cli(&["list", "--config", &unset_cfg]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("Configuration error: Environment variable RMQB_TEST_UNSET_KEY referenced in storage.access_key"),
        "{stderr}"
    );
    assert!(!stderr.contains(S3_ADMIN.1), "{stderr}");
}
