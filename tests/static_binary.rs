//! The static binary (scripts/build-static.sh) backs up and restores a queue on the real
//! broker from an empty root: a chroot holding only the binary, its two configuration files
//! and one writable directory (spool and filesystem storage). No libc, no /etc, no /proc, no
//! resolver files: the broker and the management API are reached by IP address.

mod common;

use common::*;
use rmq_backup::amqp::FieldTable;
use std::path::Path;
use std::process::Command;

fn build_static() -> String {
    let out = Command::new("scripts/build-static.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run scripts/build-static.sh");
    assert!(
        out.status.success(),
        "build-static failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

/// Runs the binary at /rmq-backup inside `root` (chroot; as root, or in a user namespace).
fn in_root(root: &Path, args: &[&str]) -> std::process::Output {
    // Absolute paths: the environment is cleared, PATH included.
    let mut cmd = if is_root() {
        Command::new("/usr/sbin/chroot")
    } else {
        let mut c = Command::new("/usr/bin/unshare");
        c.args(["-r", "/usr/sbin/chroot"]);
        c
    };
    cmd.arg(root)
        .arg("/rmq-backup")
        .args(args)
        .env_clear()
        .env("RMQ_BACKUP_SPOOL_DIR", "/data/spool")
        .output()
        .expect("run the static binary in its root")
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn the_static_binary_backs_up_and_restores_from_an_empty_root() {
    let bin = build_static();
    let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ldd.stdout),
        String::from_utf8_lossy(&ldd.stderr)
    );
    assert!(
        said.contains("not a dynamic executable") || said.contains("statically linked"),
        "ldd: {said}"
    );

    let v = TestVhost::new("static");
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(40, 21, true);
    publish(&ch, "q", &msgs);
    let target = TestVhost::new("static-target");

    let root = TempDir::new("static-root");
    std::fs::copy(&bin, root.path().join("rmq-backup")).expect("copy binary");
    std::fs::create_dir_all(root.path().join("data/spool")).unwrap();
    let store = Path::new("/data/store");
    std::fs::write(
        root.path().join("backup.yaml"),
        backup_yaml("st1", &v.name, store, ""),
    )
    .unwrap();
    let restore = format!(
        "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{}\"\n",
        v.name, target.name
    );
    std::fs::write(
        root.path().join("restore.yaml"),
        restore_yaml("st1", store, &restore),
    )
    .unwrap();
    let entries: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        entries.len(),
        4,
        "the root holds only the binary, two configs and data/: {entries:?}"
    );

    let out = in_root(root.path(), &["--version"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("rmq-backup "),
        "{out:?}"
    );
    let out = in_root(root.path(), &["backup", "--config", "/backup.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = in_root(
        root.path(),
        &[
            "validate",
            "--path",
            "file:///data/store",
            "--backup-id",
            "st1",
            "--deep",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = in_root(root.path(), &["restore", "--config", "/restore.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let restored = peek(&target.connect(), "q", msgs.len());
    assert_same(
        &as_restored(&msgs),
        &restored,
        "restored by the static binary",
    );
    assert_same(
        &msgs,
        &peek(&conn, "q", msgs.len()),
        "source after the static backup",
    );
}
