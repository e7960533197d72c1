//! The container image of `packaging/Dockerfile` (built by scripts/build-image.sh): its
//! entrypoint, user and CA bundle, `--version`, and a real backup run in a container against
//! the local broker (host network) into a mounted directory, validated by the host's binary.
//!
//! Where no container engine works (no docker daemon, no podman), each test prints why and
//! returns. scripts/test.sh installs podman and runc. The image is rebuilt only when the
//! static binary changed (scripts/build-image.sh keeps an image labelled with the binary's
//! SHA-256).

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The engine, the image and the options a `run` needs on this machine.
struct Engine {
    cmd: String,
    image: String,
    run_opts: Vec<String>,
}

/// Builds the image once per test process; None (the reason printed) without an engine.
fn engine() -> Option<&'static Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    let e = ENGINE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("scripts/build-image.sh"))
            .current_dir(root)
            .output()
            .expect("run scripts/build-image.sh");
        let (stdout, stderr) = text(&out);
        if out.status.code() == Some(3) {
            eprintln!("SKIPPED: {}", stderr.trim());
            return None;
        }
        assert!(out.status.success(), "scripts/build-image.sh:\n{stderr}");
        let last = stdout.lines().last().unwrap_or_default();
        let (cmd, image) = last.split_once(' ').expect("<engine> <image>");
        let mut engine = Engine {
            cmd: cmd.into(),
            image: image.into(),
            run_opts: Vec::new(),
        };
        engine.run_opts = run_options(&engine);
        Some(engine)
    });
    e.as_ref()
}

/// The options `run` needs here: none where the engine's defaults work. Where they do not
/// (a sandbox without CAP_SYS_RESOURCE cannot raise the default file and process limits
/// podman asks for, and crun refuses a hybrid cgroup v1/v2 host), lower limits and runc.
fn run_options(e: &Engine) -> Vec<String> {
    let mut candidates: Vec<Vec<String>> = vec![Vec::new()];
    let limits = [
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ];
    let mut lowered: Vec<String> = limits.iter().map(|s| s.to_string()).collect();
    candidates.push(lowered.clone());
    if e.cmd == "podman" && Path::new("/usr/sbin/runc").exists() {
        lowered.splice(0..0, ["--runtime".to_string(), "runc".to_string()]);
        candidates.push(lowered);
    }
    let mut seen = Vec::new();
    for opts in candidates {
        let out = Command::new(&e.cmd)
            .arg("run")
            .args(["--rm", "--network", "host"])
            .args(&opts)
            .arg(&e.image)
            .arg("--version")
            .output()
            .expect("run the engine");
        if out.status.success() {
            if !opts.is_empty() {
                eprintln!(
                    "{} run needs {opts:?} here; defaults failed: {}",
                    e.cmd,
                    seen.join(" / ")
                );
            }
            return opts;
        }
        seen.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    panic!("the image does not run with any options: {seen:?}");
}

fn run(e: &Engine, extra: &[&str], args: &[&str]) -> Output {
    Command::new(&e.cmd)
        .arg("run")
        .args(["--rm", "--network", "host"])
        .args(&e.run_opts)
        .args(extra)
        .arg(&e.image)
        .args(args)
        .output()
        .expect("run the engine")
}

fn inspect(e: &Engine, format: &str) -> String {
    let out = Command::new(&e.cmd)
        .args(["image", "inspect", "--format", format, &e.image])
        .output()
        .expect("inspect the image");
    assert!(out.status.success(), "{:?}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_image_runs_the_static_binary_as_a_non_root_user() {
    let Some(e) = engine() else { return };
    assert_eq!(
        inspect(e, "{{json .Config.Entrypoint}}"),
        r#"["rmq-backup"]"#
    );
    assert_eq!(inspect(e, "{{.Config.User}}"), "65532:65532");
    let env = inspect(e, "{{json .Config.Env}}");
    assert!(
        env.contains("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"),
        "{env}"
    );
    let out = run(e, &[], &["--version"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "rmq-backup {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{stdout}"
    );
}

#[test]
fn a_backup_runs_in_a_container_and_the_host_validates_it() {
    let Some(e) = engine() else { return };
    let v = TestVhost::new("image");
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(50, 23, false);
    publish(&ch, "q", &msgs);

    let dir = TempDir::new("image");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    // The container's user (65532) writes the backup.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o777)).unwrap();
    let yaml = backup_yaml("in-a-container", &v.name, Path::new("/backup"), "");
    let cfg = write_config(dir.path(), "backup.yaml", &yaml);
    let out = run(
        e,
        &[
            "-v",
            &format!("{}:/backup", store.display()),
            "-v",
            &format!("{cfg}:/config/backup.yaml:ro"),
        ],
        &["backup", "--config", "/config/backup.yaml"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let m = manifest(&store, "in-a-container");
    assert!(m.completed_at.is_some(), "completed: {stdout}");
    let q = m.queues.iter().find(|q| q.name == "q").expect("queue q");
    assert_eq!(q.message_count, 50);

    let url = format!("file://{}", store.display());
    let check = run_cli(&[
        "validate",
        "--path",
        &url,
        "--backup-id",
        "in-a-container",
        "--deep",
    ]);
    let (o, err) = text(&check);
    assert!(check.status.success(), "{o}{err}");
    let saved = backed_up(&store, "in-a-container", "q");
    assert_eq!(
        saved.iter().map(|d| &d.body).collect::<Vec<_>>(),
        msgs.iter().map(|m| &m.body).collect::<Vec<_>>(),
        "the bodies, in order"
    );
    // The backup took nothing.
    assert_eq!(depth(&conn, "q"), 50);
}
