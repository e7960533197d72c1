//! What users install: the Debian package (scripts/build-deb.sh) installs the static binary,
//! the example configuration and systemd units that `systemd-analyze verify` accepts; the
//! example configurations of the package and of the Kubernetes CronJob load as valid
//! configurations.

mod common;

use common::script_output_path;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A configuration with its `${...}` variables set, as `Config` loads it.
fn load(yaml: &str) -> rmq_backup::config::Config {
    for (k, v) in [
        ("RABBITMQ_PASSWORD", "secret"),
        ("BACKUP_DATE", "20261125"),
        ("BACKUP_JOB", "rmq-backup-29001234"),
        ("AWS_ACCESS_KEY_ID", "AKIA"),
        ("AWS_SECRET_ACCESS_KEY", "key"),
    ] {
        // Tests of this file only read these variables.
        unsafe { std::env::set_var(k, v) };
    }
    // The Kubernetes manifests read their secrets from a Secret mounted at /secrets: here the
    // same files in a directory of the test's own.
    let secrets = std::env::temp_dir().join(format!("rmq-backup-packaging-{}", std::process::id()));
    std::fs::create_dir_all(&secrets).unwrap();
    for (file, value) in [
        ("rabbitmq-password", "secret\n"),
        ("aws-access-key-id", "AKIA\n"),
        ("aws-secret-access-key", "key\n"),
    ] {
        std::fs::write(secrets.join(file), value).unwrap();
    }
    let yaml = yaml.replace("/secrets/", &format!("{}/", secrets.display()));
    let c = rmq_backup::config::Config::from_yaml_str(&yaml).expect("a valid configuration");
    if yaml.contains("_file:") {
        // Secrets come from files, never from the environment.
        assert!(
            !yaml.contains("${RABBITMQ_PASSWORD}") && !yaml.contains("${AWS_"),
            "{yaml}"
        );
    }
    c
}

#[test]
fn the_example_configurations_are_valid() {
    let c = load(&std::fs::read_to_string(root().join("packaging/backup.yaml")).unwrap());
    assert_eq!(c.backup_id, "nightly-20261125");
    let k8s = std::fs::read_to_string(root().join("packaging/k8s/cronjob.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = k8s
        .split("\n---\n")
        .map(|d| serde_norway::from_str(d).expect("YAML"))
        .collect();
    let config = docs[0]["data"]["backup.yaml"]
        .as_str()
        .expect("backup.yaml in the ConfigMap");
    let c = load(config);
    assert_eq!(c.backup_id, "rmq-backup-29001234");
    let port = c.metrics.as_ref().expect("metrics").port;
    let container = &docs[1]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], port);
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["path"], "/healthz", "{probe}");
    }
}

#[test]
fn the_indexed_job_runs_one_part_per_completion() {
    let k8s = std::fs::read_to_string(root().join("packaging/k8s/indexed-job.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = k8s
        .split("\n---\n")
        .map(|d| serde_norway::from_str(d).expect("YAML"))
        .collect();
    let c = load(
        docs[0]["data"]["backup.yaml"]
            .as_str()
            .expect("backup.yaml"),
    );
    let shard = c.backup.shard.as_ref().expect("backup.shard");
    assert_eq!(
        shard.index, None,
        "the index comes from JOB_COMPLETION_INDEX"
    );
    assert_eq!(c.source.as_ref().unwrap().amqp_url.all().len(), 3);
    let job = &docs[1]["spec"]["jobTemplate"]["spec"];
    assert_eq!(job["completionMode"], "Indexed");
    assert_eq!(job["completions"], shard.count);
    assert_eq!(job["parallelism"], shard.count);
    let spec = &job["template"]["spec"];
    assert!(spec["affinity"]["podAntiAffinity"].is_object());
    let env = spec["containers"][0]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "BACKUP_JOB"));
}

#[test]
fn the_debian_package_installs_and_its_units_verify() {
    let deb = script_output_path("build-deb.sh");
    let (ok, listing) = run("dpkg-deb", &["-c", &deb]);
    assert!(ok, "{listing}");
    for f in [
        "./usr/bin/rmq-backup",
        "./etc/rmq-backup/backup.yaml",
        "./lib/systemd/system/rmq-backup.service",
        "./lib/systemd/system/rmq-backup.timer",
        "./usr/share/doc/rmq-backup/README.md",
        "./usr/share/bash-completion/completions/rmq-backup",
        "./usr/share/zsh/vendor-completions/_rmq-backup",
        "./usr/share/fish/vendor_completions.d/rmq-backup.fish",
        "./usr/share/man/man1/rmq-backup.1.gz",
    ] {
        assert!(listing.contains(f), "{f} in\n{listing}");
    }
    let (ok, out) = run("dpkg", &["-i", &deb]);
    assert!(ok, "dpkg -i: {out}");
    let checks = || {
        let (ok, version) = run("/usr/bin/rmq-backup", &["--version"]);
        assert!(ok && version.starts_with("rmq-backup "), "{version}");
        let (ok, user) = run("getent", &["passwd", "rmq-backup"]);
        assert!(ok, "the system user: {user}");
        let (ok, out) = run(
            "systemd-analyze",
            &[
                "verify",
                "/lib/systemd/system/rmq-backup.service",
                "/lib/systemd/system/rmq-backup.timer",
            ],
        );
        assert!(ok, "systemd-analyze verify: {out}");
        assert!(
            !out.contains("rmq-backup"),
            "warnings about the units: {out}"
        );
        // The completions and the man page are what the installed binary makes from its own
        // command definitions (tests/completions.rs checks every flag is in them).
        for (file, args) in [
            (
                "/usr/share/bash-completion/completions/rmq-backup",
                ["completions", "bash"],
            ),
            (
                "/usr/share/zsh/vendor-completions/_rmq-backup",
                ["completions", "zsh"],
            ),
            (
                "/usr/share/fish/vendor_completions.d/rmq-backup.fish",
                ["completions", "fish"],
            ),
        ] {
            let installed = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
            let (ok, generated) = run("/usr/bin/rmq-backup", &args);
            assert!(
                ok && installed == generated,
                "{file} differs from rmq-backup {args:?}"
            );
            assert!(installed.contains("read-data-subset"), "{file}");
        }
        let (ok, page) = run("zcat", &["/usr/share/man/man1/rmq-backup.1.gz"]);
        assert!(ok && page.starts_with(".TH RMQ\\-BACKUP 1"), "{page}");
        assert!(
            page.contains("\\-\\-from\\-config"),
            "the man page lists copy --from-config"
        );
    };
    let result = std::panic::catch_unwind(checks);
    let (ok, out) = run("dpkg", &["--purge", "rmq-backup"]);
    assert!(ok, "dpkg --purge: {out}");
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
