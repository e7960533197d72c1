//! The static binary (scripts/build-static.sh) backs up and restores a queue on the real
//! broker from an empty root: a chroot holding only the binary, its two configuration files
//! and one writable directory (spool and filesystem storage). No libc, no /etc, no /proc, no
//! resolver files: the broker and the management API are reached by IP address. Over TLS the
//! root holds the CA file and `/etc/hosts` too.

mod common;
mod tls_support;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::path::Path;
use std::process::Command;

/// The static binary's path, built once per test process (the tests here share it, and two
/// concurrent `rustup target add` runs would race).
fn build_static() -> String {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| script_output_path("build-static.sh"))
        .clone()
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

/// The same over TLS: the root holds the binary, two configs, the CA file and `/etc/hosts`
/// (the broker's certificate names `localhost`, and a static binary has no other way to
/// resolve it); no /etc/ssl, no libc. Backup and restore on the rmqtls node of
/// scripts/setup-rabbitmq-tls.sh (AMQP over TLS, management over https).
#[test]
fn the_static_binary_speaks_tls_from_an_empty_root() {
    let bin = build_static();
    let node = &tls_support::TLS_NODE;
    let v = tls_support::TlsVhost::new(node, "static");
    let conn = node.plain(&v.name);
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    let msgs = diverse_messages(40, 22, true);
    publish(&ch, "q", &msgs);

    let root = TempDir::new("static-tls-root");
    std::fs::copy(&bin, root.path().join("rmq-backup")).expect("copy binary");
    std::fs::copy(tls_support::file("ca.pem"), root.path().join("ca.pem")).expect("copy CA");
    std::fs::create_dir_all(root.path().join("data/spool")).unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    let tls = "  tls:\n    ca_cert: /ca.pem\n";
    let backup = format!(
        "mode: backup\nbackup_id: st-tls\nsource:\n  amqp_url: \"amqps://guest:guest@localhost:{}/{}\"\n  management_url: \"https://localhost:{}\"\n  management_username: guest\n  management_password: guest\n{tls}  queues:\n    vhosts: [\"{}\"]\nstorage:\n  backend: filesystem\n  path: /data/store\n",
        node.amqps, v.name, node.https, v.name
    );
    std::fs::write(root.path().join("backup.yaml"), backup).unwrap();
    let restore = format!(
        "mode: restore\nbackup_id: st-tls\ntarget:\n  amqp_url: \"amqps://guest:guest@localhost:{}/\"\n  management_url: \"https://localhost:{}\"\n  management_username: guest\n  management_password: guest\n{tls}storage:\n  backend: filesystem\n  path: /data/store\nrestore:\n  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{}\"\n",
        node.amqps, node.https, v.name, v.target()
    );
    std::fs::write(root.path().join("restore.yaml"), restore).unwrap();
    let m = node.management();
    m.create_vhost(&v.target()).expect("target vhost");
    m.set_permissions(&v.target(), "guest")
        .expect("permissions");

    for args in [
        &["backup", "--config", "/backup.yaml"][..],
        &["restore", "--config", "/restore.yaml"][..],
    ] {
        let out = in_root(root.path(), args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_same(
        &as_restored(&msgs),
        &peek(&node.plain(&v.target()), "q", msgs.len()),
        "restored over TLS by the static binary",
    );
}
