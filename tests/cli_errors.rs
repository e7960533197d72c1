//! Bad input gets a clear error with its SPEC.md prefix and the right exit code, never a panic,
//! and never shows a password.

mod common;

use common::*;
use std::process::Command;

fn run_yaml(dir: &TempDir, cmd: &str, yaml: &str) -> (Option<i32>, String, String) {
    let p = write_config(dir.path(), &format!("{}.yaml", rmq_backup::now_ms()), yaml);
    let out = run_cli(&[cmd, "--config", &p]);
    let (o, e) = text(&out);
    (out.status.code(), o, e)
}

#[test]
fn usage_and_configuration_errors_exit_2() {
    let dir = TempDir::new("cli");
    let out = run_cli(&[]);
    assert_eq!(out.status.code(), Some(2));
    let out = run_cli(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let (help, _) = text(&out);
    for cmd in ["backup", "restore", "list", "describe", "validate"] {
        assert!(help.contains(cmd), "{help}");
    }
    assert_eq!(run_cli(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        run_cli(&["backup", "--config", "/nonexistent/x.yaml"])
            .status
            .code(),
        Some(2)
    );

    let (code, _, err) = run_yaml(
        &dir,
        "backup",
        "mode: backup\nbackup_id: x\nstorage:\n  backend: memory\n",
    );
    assert_eq!(code, Some(2));
    assert_eq!(
        err.trim(),
        "Configuration error: Source configuration required for backup"
    );

    let (code, _, err) = run_yaml(
        &dir,
        "backup",
        "mode: Backup\nbackup_id: x\nstorage:\n  backend: memory\n",
    );
    assert_eq!(code, Some(2), "bad YAML is bad configuration: {err}");
    // A mistake in a value of a file that is YAML is a configuration error like any other
    // (issue 40); text that is not YAML stays a serialization error.
    assert!(
        err.starts_with("Configuration error:") && err.contains("line"),
        "{err}"
    );
    let (code, _, err) = run_yaml(&dir, "backup", "mode: \"backup\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("Serialization error:"), "{err}");

    let (code, _, err) = run_yaml(&dir, "restore", "mode: backup\nbackup_id: x\nstorage:\n  backend: memory\nsource:\n  amqp_url: amqp://a\n  management_url: http://a\n  management_username: u\n  management_password: p\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("Configuration error:"), "{err}");

    let (code, _, err) = run_yaml(
        &dir,
        "backup",
        "mode: backup\nbackup_id: x\nsource:\n  amqp_url: amqp://a\n  management_url: http://a\n  management_username: u\n  management_password: p\nstorage:\n  backend: memory\nbackup:\n  stop_at_current_depth: false\n",
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("stop_at_current_depth: false")
            && err.contains("set backup.stream_enabled: true"),
        "{err}"
    );

    assert_eq!(
        text(&run_cli(&["list", "--path", "ftp://x"])).1.trim(),
        "Configuration error: Unknown storage scheme: ftp"
    );
    let out = run_cli(&["list", "--path", "not a url"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out)
        .1
        .starts_with("Configuration error: Invalid storage URL: "));
}

#[test]
fn broker_errors_name_the_cause_and_hide_the_password() {
    let dir = TempDir::new("cli-broker");
    let store = dir.path().join("store");
    let secret = "Sup3rS3cretPw";
    // Unreachable broker (nothing listens on port 1).
    let yaml = format!(
        "mode: restore\nbackup_id: x\ntarget:\n  amqp_url: amqp://guest:{secret}@127.0.0.1:1/%2f\nstorage:\n  backend: filesystem\n  path: {}\nrestore:\n  restore_definitions: false\n",
        store.display()
    );
    // Restore needs a backup: make one that has a queue.
    let vh = TestVhost::new("clierr");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", Default::default());
    publish(&ch, "q", &diverse_messages(3, 1, false));
    let b = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("x", &vh.name, &store, ""),
    );
    assert_eq!(run_cli(&["backup", "--config", &b]).status.code(), Some(0));
    // A second backup with the same id is refused: a complete backup is never overwritten.
    let out = run_cli(&["backup", "--config", &b]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out)
            .1
            .starts_with("Configuration error: backup x already exists"),
        "{:?}",
        text(&out)
    );

    let (code, out, err) = run_yaml(&dir, "restore", &yaml);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("Connection error: Failed to connect to amqp://guest:****@127.0.0.1:1/"),
        "{err}"
    );
    assert!(!err.contains(secret) && !out.contains(secret));

    // Wrong password.
    let yaml = yaml.replace(
        "127.0.0.1:1/",
        &format!("127.0.0.1:{}/", broker().amqp_port),
    );
    let (code, out, err) = run_yaml(&dir, "restore", &yaml);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("Authentication error: AMQP authentication failed for user guest"),
        "{err}"
    );
    assert!(!err.contains(secret) && !out.contains(secret));

    // Wrong management password on backup.
    let bad = std::fs::read_to_string(&b).unwrap().replace(
        "management_password: guest",
        &format!("management_password: {secret}"),
    );
    let (code, out, err) = run_yaml(
        &dir,
        "backup",
        &bad.replace("backup_id: \"x\"", "backup_id: y"),
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("Management API error: HTTP 401 for GET /api/"),
        "{err}"
    );
    assert!(!err.contains(secret) && !out.contains(secret));

    // Missing backup on restore.
    let yaml = format!(
        "mode: restore\nbackup_id: missing\ntarget:\n  amqp_url: {}\nstorage:\n  backend: filesystem\n  path: {}\nrestore:\n  restore_definitions: false\n",
        amqp_url("/"),
        store.display()
    );
    let (code, _, err) = run_yaml(&dir, "restore", &yaml);
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim(),
        "Storage error: Key not found: missing/manifest.json"
    );
}

/// A user whose password is unique, so any trace of it in the output is a leak.
fn secret_user(vhost: &str) -> (String, String) {
    let user = format!(
        "rmqb-secret-{}-{}",
        std::process::id(),
        rmq_backup::now_ms()
    );
    let password = format!("Pw-{}-unique-Secret", rmq_backup::now_ms());
    let url = format!("{}/api/users/{user}", management_url());
    let auth = "Basic Z3Vlc3Q6Z3Vlc3Q="; // guest:guest
    ureq::put(&url)
        .header("authorization", auth)
        .header("content-type", "application/json")
        .send(format!(r#"{{"password":"{password}","tags":"administrator"}}"#).as_bytes())
        .expect("create user");
    let enc: String = vhost.bytes().map(|b| format!("%{b:02X}")).collect();
    ureq::put(&format!(
        "{}/api/permissions/{enc}/{user}",
        management_url()
    ))
    .header("authorization", auth)
    .header("content-type", "application/json")
    .send(r#"{"configure":".*","write":".*","read":".*"}"#.as_bytes())
    .expect("permissions");
    (user, password)
}

#[test]
fn trace_output_never_shows_a_password() {
    let vh = TestVhost::new("trace");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", Default::default());
    // The broker refuses a user_id property that is not the publishing user's.
    let msgs: Vec<Msg> = diverse_messages(20, 3, false)
        .into_iter()
        .map(|mut m| {
            m.props.user_id = None;
            m
        })
        .collect();
    publish(&ch, "q", &msgs);
    let (user, password) = secret_user(&vh.name);
    let dir = TempDir::new("trace");
    let store = dir.path().join("store");
    let enc: String = vh.name.bytes().map(|b| format!("%{b:02X}")).collect();
    let amqp = format!(
        "amqp://{user}:{password}@127.0.0.1:{}/{enc}",
        broker().amqp_port
    );
    let backup = format!(
        "mode: backup\nbackup_id: t\nsource:\n  amqp_url: \"{amqp}\"\n  management_url: \"{}\"\n  management_username: {user}\n  management_password: ${{RMQB_TRACE_TEST_PASSWORD}}\n  queues:\n    vhosts: [\"{}\"]\nstorage:\n  backend: filesystem\n  path: \"{}\"\nmetrics:\n  bind_address: 127.0.0.1\n  port: 0\n",
        management_url(),
        vh.name,
        store.display()
    );
    let restore = format!(
        "mode: restore\nbackup_id: t\ntarget:\n  amqp_url: \"{amqp}\"\n  management_url: \"{}\"\n  management_username: {user}\n  management_password: \"{password}\"\nstorage:\n  backend: filesystem\n  path: \"{}\"\nrestore:\n  publish_mode: direct-to-queue\n  definitions_dry_run: true\n  queue_mapping:\n    q: q2\n  create_missing_queues: true\n",
        management_url(),
        store.display()
    );
    let b = write_config(dir.path(), "b.yaml", &backup);
    let r = write_config(dir.path(), "r.yaml", &restore);
    for args in [
        vec!["-vv", "backup", "--config", &b],
        vec!["restore", "--config", &r, "-v", "-v"],
    ] {
        let out = Command::new(binary())
            .args(&args)
            .env("RMQB_TRACE_TEST_PASSWORD", &password)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}{stderr}");
        assert!(stderr.contains("TRACE"), "-vv gives trace output: {stderr}");
        assert!(
            stderr.contains("connection.start-ok channel=0"),
            "AMQP frames at trace: {stderr}"
        );
        assert!(
            !stdout.contains(&password) && !stderr.contains(&password),
            "{args:?} leaked the password"
        );
    }
    // What the restore did: definitions only checked (dry run), the mapped queue created and
    // holding every message, the source queue as it was.
    assert_same(
        &as_restored(&msgs),
        &peek(&conn, "q2", 20),
        "restored into q2",
    );
    assert_eq!(depth(&conn, "q2"), 20);
    assert_same(&msgs, &peek(&conn, "q", 20), "source q");
    assert_eq!(depth(&conn, "q"), 20);
    // A failing run at trace level: wrong password in the URL, the real one nowhere.
    let bad = backup.replace(&format!(":{password}@"), ":wrong@");
    let b2 = write_config(
        dir.path(),
        "b2.yaml",
        &bad.replace("backup_id: t", "backup_id: t2"),
    );
    let out = Command::new(binary())
        .args(["backup", "--config", &b2, "-vv"])
        .env("RMQB_TRACE_TEST_PASSWORD", &password)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stdout.contains(&password) && !stderr.contains(&password));
    assert!(!stderr.contains(":wrong@"), "masked: {stderr}");
    let _ = ureq::delete(&format!("{}/api/users/{user}", management_url()))
        .header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        .call();
}

/// Every credential field of a configuration (the AMQP URL's password, the management
/// password, and each storage secret) at trace level, for both jobs: none appears in the
/// output. Each is really used: the storages are the local emulators, which reject the signed
/// requests; the broker rejects the AMQP login and the management API the password.
#[test]
fn trace_output_never_shows_any_credential_field() {
    let dir = TempDir::new("secrets");
    let secret = |field: &str| format!("{field}-S3cr3t-{}", std::process::id());
    // A real backup to restore from, so that a restore reaches the broker's login.
    let vh = TestVhost::new("secrets");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(
        &ch,
        "q",
        "classic",
        rmq_backup::broker::amqp::FieldTable::new(),
    );
    publish(&ch, "q", &diverse_messages(3, 1, false));
    let store = dir.path().join("store");
    let ok = write_config(
        dir.path(),
        "ok.yaml",
        &backup_yaml("restore", &vh.name, &store, ""),
    );
    assert_eq!(run_cli(&["backup", "--config", &ok]).status.code(), Some(0));
    let storages = [
        (
            "s3",
            format!(
                "  backend: s3\n  bucket: b\n  region: us-east-1\n  endpoint: http://127.0.0.1:8333\n  path_style: true\n  allow_http: true\n  access_key: {}\n  secret_key: {}\n",
                secret("access_key"),
                secret("secret_key")
            ),
        ),
        (
            "azure",
            format!(
                "  backend: azure\n  account_name: devstoreaccount1\n  container_name: c\n  endpoint: http://127.0.0.1:10000/devstoreaccount1\n  account_key: {}\n  client_id: id\n  tenant_id: t\n  client_secret: {}\n  sas_token: {}\n",
                base64_secret(&secret("account_key")),
                secret("client_secret"),
                secret("sas_token")
            ),
        ),
        (
            "filesystem",
            format!("  backend: filesystem\n  path: {}\n", store.display()),
        ),
    ];
    let amqp = amqp_url(&vh.name).replace(
        "guest:guest@",
        &format!("guest:{}@", secret("amqp_password")),
    );
    for (backend, storage) in &storages {
        for mode in ["backup", "restore"] {
            let side = if mode == "backup" {
                format!(
                    "source:\n  amqp_url: \"{amqp}\"\n  management_url: {}\n  management_username: guest\n  management_password: {}\n",
                    management_url(),
                    secret("management_password")
                )
            } else {
                format!(
                    "target:\n  amqp_url: \"{amqp}\"\n  management_url: {}\n  management_username: guest\n  management_password: {}\nrestore:\n  restore_definitions: false\n",
                    management_url(),
                    secret("management_password")
                )
            };
            let yaml = format!(
                "mode: {mode}\nbackup_id: {mode}\n{side}storage:\n{storage}metrics:\n  bind_address: 127.0.0.1\n  port: 0\n"
            );
            let p = write_config(dir.path(), &format!("{mode}.yaml"), &yaml);
            let out = run_cli(&["-vv", mode, "--config", &p]);
            let (stdout, stderr) = text(&out);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{backend} {mode}: {stdout}{stderr}"
            );
            // Where each run is refused: the storage's signature, the management API's
            // password (backup), the broker's login (restore).
            let error_line = stderr
                .lines()
                .find(|l| !l.starts_with("20") && l.contains("error: "))
                .unwrap_or("");
            let want = match (*backend, mode) {
                ("s3", "backup") => {
                    "Storage error: Failed to get backup/manifest.json: 403 Forbidden"
                }
                ("s3", _) => "Storage error: Failed to get restore/manifest.json: 403 Forbidden",
                ("azure", _) => "Storage error: ",
                ("filesystem", "backup") => "Management API error: HTTP 401 for GET /api/overview",
                _ => "Authentication error: ",
            };
            assert!(
                error_line.starts_with(want),
                "{backend} {mode}: {error_line}\n{stderr}"
            );
            for field in [
                "amqp_password",
                "management_password",
                "access_key",
                "secret_key",
                "account_key",
                "client_secret",
                "sas_token",
            ] {
                assert!(
                    !stdout.contains(&secret(field)) && !stderr.contains(&secret(field)),
                    "{mode} leaked {field}: {stderr}"
                );
            }
            assert!(
                !stderr.contains(&base64_secret(&secret("account_key"))),
                "{mode} leaked the account key: {stderr}"
            );
        }
    }
}

/// An Azure account key is base64: the secret text encoded so the key parses.
fn base64_secret(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

#[test]
fn a_reader_that_closes_stdout_early_ends_no_command_with_a_panic() {
    for args in [&["config", "schema"][..], &["--help"][..]] {
        let mut child = std::process::Command::new(binary())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // The pipe's read end closed before the command writes, as `| head -c 0` would.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
