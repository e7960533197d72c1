//! The local disk (issue "Faults", promise 4), on real size-limited filesystems (tmpfs, mounted
//! by the test as root; the tests say so and pass when they cannot mount): a spool directory or
//! a filesystem backend that fills up fails the backup with `Storage error: ... No space left
//! on device` naming the path, the spool is cleaned, nothing is listed complete, the source is
//! whole; a spool directory that cannot be written is refused before the broker is touched.

mod common;

use common::*;
use rmq_backup::broker::amqp::FieldTable;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `size` (`10m`) mounted on a fresh directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (with the reason printed) where this process cannot mount.
    fn mount(tag: &str, options: &str) -> Option<Tmpfs> {
        let dir = std::env::temp_dir().join(format!(
            "rmqb-tmpfs-{tag}-{}-{}",
            std::process::id(),
            rmq_backup::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs here (needs root): {other:?}");
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A vhost with queue `q` of `n` messages of `size` random bytes.
fn seeded(tag: &str, n: usize, size: usize) -> (TestVhost, rmq_backup::broker::amqp::Connection) {
    let vh = TestVhost::new(tag);
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    declare(&ch, "q", "classic", FieldTable::new());
    publish_bulk(&ch, "q", n, size);
    (vh, conn)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_full_spool_disk_fails_the_backup_clearly_and_leaves_it_clean() {
    let Some(spool) = Tmpfs::mount("spool", "size=8m") else {
        return;
    };
    // Six 1 MiB random bodies, uncompressed: the segment (their JSON) needs ~22 MB.
    let (vh, conn) = seeded("disk-spool", 6, 1 << 20);
    let dir = TempDir::new("disk-spool");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("full", &vh.name, &store, "  compression: none\n"),
    );
    let spool_dir = spool.path().display().to_string();
    let out = run_cli_env(
        &["backup", "--config", &cfg],
        &[("RMQ_BACKUP_SPOOL_DIR", spool_dir.as_str())],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("Storage error: Failed to write {spool_dir}/"))
            && last.contains("No space left on device"),
        "{last}"
    );
    assert!(
        entries(spool.path()).is_empty(),
        "spool cleaned: {:?}",
        entries(spool.path())
    );
    let m = manifest(&store, "full");
    assert!(m.completed_at.is_none());
    assert!(m.queues.is_empty() || m.queues.iter().all(|q| q.segments.is_empty()));
    assert_eq!(depth(&conn, "q"), 6, "the source is whole");
}

#[test]
fn a_full_filesystem_backend_fails_the_backup_clearly() {
    let Some(disk) = Tmpfs::mount("store", "size=4m") else {
        return;
    };
    let (vh, conn) = seeded("disk-store", 6, 1 << 20);
    let dir = TempDir::new("disk-store");
    let store = disk.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("full", &vh.name, &store, "  compression: none\n"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Storage error: Failed to write full/queues/")
            && last.ends_with(&format!("No space left on device ({})", store.display())),
        "{last}"
    );
    let m = manifest(&store, "full");
    assert!(m.completed_at.is_none(), "not complete");
    let url = format!("file://{}", store.display());
    let out = run_cli(&["list", "--path", &url]);
    assert!(text(&out).0.contains("interrupted"), "{:?}", text(&out));
    // No half-written segment is left under a key: only finished files get a name.
    let keys: Vec<String> = entries(&store.join("full").join("queues").join(&vh.name).join("q"))
        .into_iter()
        .filter(|k| !k.contains(".partial-"))
        .collect();
    assert!(keys.is_empty(), "{keys:?}");
    assert_eq!(depth(&conn, "q"), 6, "the source is whole");
}

#[test]
fn a_spool_directory_that_cannot_be_written_is_refused_before_the_broker_is_touched() {
    let Some(ro) = Tmpfs::mount("ro", "size=1m,ro") else {
        return;
    };
    let (vh, conn) = seeded("disk-ro", 10, 100);
    let dir = TempDir::new("disk-ro");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("ro", &vh.name, &dir.path().join("store"), ""),
    );
    let spool_dir = ro.path().display().to_string();
    let out = run_cli_env(
        &["backup", "--config", &cfg],
        &[("RMQ_BACKUP_SPOOL_DIR", spool_dir.as_str())],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert_eq!(
        stderr.trim(),
        format!(
            "Configuration error: the spool directory {spool_dir} (RMQ_BACKUP_SPOOL_DIR, default the system temp directory) cannot be written: Read-only file system"
        )
    );
    assert!(
        !dir.path().join("store").join("ro").exists(),
        "nothing written"
    );
    assert_eq!(depth(&conn, "q"), 10);
}
