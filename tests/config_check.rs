//! `rmq-backup config schema` and `config check` (issue 34, item 3): every example
//! configuration of the repository (examples/, packaging/ and the Kubernetes manifests'
//! ConfigMaps, docs/) is valid by the JSON Schema the binary prints and by `config check`;
//! a bad file exits 2 naming the key's path and line. No broker, no storage.

mod common;

use common::*;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The environment variables the examples reference (`${...}`), set for the check.
const ENV: [(&str, &str); 7] = [
    ("BACKUP_DATE", "2026-11-27"),
    ("BACKUP_JOB", "nightly-1"),
    ("RABBITMQ_PASSWORD", "secret"),
    ("AWS_ACCESS_KEY_ID", "key"),
    ("AWS_SECRET_ACCESS_KEY", "secret"),
    ("RABBITMQ_TARGET_PASSWORD", "secret"),
    ("BACKUP_ID", "nightly-1"),
];

/// Every configuration in the repository, as (where, YAML text): the `.yaml` files under
/// examples/ and docs/ and packaging/backup.yaml whose top level has `mode:`, and each
/// ConfigMap entry of packaging/k8s/*.yaml that holds one.
fn examples() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["examples", "docs", "packaging", "packaging/k8s"] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                files.push(p);
            }
        }
    }
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        let name = p.strip_prefix(root()).unwrap().display().to_string();
        if text.lines().any(|l| l.starts_with("mode:")) {
            out.push((name, text));
            continue;
        }
        // Kubernetes manifests: the configurations held in ConfigMaps.
        for doc in serde_norway::Deserializer::from_str(&text) {
            let Ok(v) = serde_json::Value::deserialize(doc) else {
                continue;
            };
            if v["kind"] != "ConfigMap" {
                continue;
            }
            for (key, data) in v["data"].as_object().into_iter().flatten() {
                if let Some(yaml) = data.as_str().filter(|y| y.contains("mode:")) {
                    out.push((format!("{name} ({key})"), yaml.to_string()));
                }
            }
        }
    }
    out
}

use serde::Deserialize;

#[test]
fn every_example_configuration_is_valid_by_the_schema_and_config_check() {
    let out = run_cli(&["config", "schema"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let all = examples();
    assert!(
        all.len() >= 5,
        "examples found: {:?}",
        all.iter().map(|e| &e.0).collect::<Vec<_>>()
    );
    let dir = TempDir::new("config-check");
    for (i, (name, yaml)) in all.iter().enumerate() {
        let value: serde_json::Value = serde_norway::from_str(yaml).expect("YAML");
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{name} against the schema: {errors:#?}");
        let path = write_config(dir.path(), &format!("{i}.yaml"), yaml);
        let out = run_cli_env(&["config", "check", "--config", &path], &ENV);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{name}: {stdout}{stderr}");
        assert!(stdout.contains("a valid configuration"), "{name}: {stdout}");
    }
}

#[test]
fn a_bad_configuration_is_refused_with_its_path_and_line() {
    let dir = TempDir::new("config-bad");
    let base = "mode: backup\nbackup_id: x\nsource:\n  amqp_url: amqp://a\n  management_url: http://a\n  management_username: u\n  management_password: p\nstorage:\n  backend: filesystem\n  path: /tmp/x\n";
    for (yaml, expected) in [
        (
            format!("{base}backup:\n  shard:\n    count: 0\n"),
            "Configuration error: backup.shard.count must be at least 1 (line 13)",
        ),
        (
            format!("{base}backup:\n  compresion: zstd\n"),
            "backup: unknown field `compresion`",
        ),
        (
            format!("{base}backup:\n  compression_level: 30\n"),
            "(line 12)",
        ),
    ] {
        let path = write_config(dir.path(), "bad.yaml", &yaml);
        let out = run_cli(&["config", "check", "--config", &path]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
        assert!(stderr.contains(expected), "{expected:?} in {stderr}");
        assert!(stderr.contains("line"), "{stderr}");
    }
    // The schema refuses what the loader refuses, for an editor.
    let out = run_cli(&["config", "schema"]);
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let bad: serde_json::Value =
        serde_norway::from_str(&format!("{base}backup:\n  compresion: zstd\n")).unwrap();
    assert!(!validator.is_valid(&bad), "an unknown key is refused");
    let bad: serde_json::Value =
        serde_norway::from_str(&base.replace("backend: filesystem", "backend: tape")).unwrap();
    assert!(!validator.is_valid(&bad), "an unknown backend is refused");
    let missing: serde_json::Value =
        serde_norway::from_str(&base.replace("  path: /tmp/x\n", "")).unwrap();
    assert!(
        !validator.is_valid(&missing),
        "a backend without its required key"
    );
}

/// Issue 40: `config check` on the machine where the file is edited. The packaged file needs
/// a date and a password that only the job's machine sets: they are listed with their keys,
/// and everything else is checked; what a run would find only when it connects (URL syntax,
/// TLS files) is checked too; a type mistake says what was expected in words, as a
/// configuration error.
#[test]
fn config_check_lists_what_the_run_sets_and_checks_the_rest() {
    let packaged = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/backup.yaml");
    let out = std::process::Command::new(binary())
        .args([
            "config",
            "check",
            "--config",
            &packaged.display().to_string(),
        ])
        .env_remove("BACKUP_DATE")
        .env_remove("RABBITMQ_PASSWORD")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("BACKUP_DATE (environment variable): backup_id"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "RABBITMQ_PASSWORD (environment variable): source.amqp_url, source.management_password"
        ),
        "{stdout}"
    );

    let dir = TempDir::new("config-check-deep");
    let base = "mode: backup\nbackup_id: x\nsource:\n  amqp_url: amqp://u:secretpw@h:5672/%2f\n  management_url: http://h:15672\n  management_username: u\n  management_password: p\nstorage:\n  backend: filesystem\n  path: /tmp/x\n";
    for (yaml, expected) in [
        (
            base.replace("h:5672", "h:notaport"),
            "Configuration error: source.amqp_url: Invalid AMQP URL",
        ),
        (
            base.replace("http://h:15672", "http://h:notaport"),
            "Configuration error: source.management_url: invalid URL http://h:notaport",
        ),
        (
            base.replace(
                "  management_password: p\n",
                "  management_password: p\n  tls:\n    ca_cert: /nonexistent/ca.pem\n",
            ),
            "Configuration error: source.tls.ca_cert: cannot read /nonexistent/ca.pem",
        ),
        (
            format!("{base}backup:\n  max_concurrent_queues: many\n"),
            "Configuration error: backup.max_concurrent_queues: invalid type: string \"many\", expected a whole number, 0 or more",
        ),
    ] {
        let path = write_config(dir.path(), "deep.yaml", &yaml);
        let out = run_cli(&["config", "check", "--config", &path]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {stdout}{stderr}");
        assert!(stderr.starts_with(expected), "{expected:?} in {stderr}");
        assert!(!stderr.contains("secretpw"), "{stderr}");
        for rust in ["usize", "u64", "u16", "struct "] {
            assert!(!stderr.contains(rust), "{rust} in {stderr}");
        }
    }
}
