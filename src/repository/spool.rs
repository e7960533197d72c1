//! Local spool files and the jobs' threads: segments being compressed before upload, and segments fetched for a
//! restore. They live in a private directory under `$RMQ_BACKUP_SPOOL_DIR` (default: the
//! system temp dir) that is removed when the job ends, so nothing half-written is ever taken
//! for good data: storage only receives finished files.
//!
//! A process killed with SIGKILL (or by the OOM killer) cannot remove its directory, which
//! may hold plaintext: a segment being built, a copy's decrypted `copy-N.seg.plain` (issue 38,
//! item 7). The next job that creates a spool directory in the same place removes those of
//! processes no longer running ([`remove_stale`]), judged as the storage's unfinished writes
//! are (`crate::repository::storage::partials::writer_gone`: the pid in the name is not a
//! running process on this host).

use crate::error::{Error, Result};
use crate::now_ms;
use std::path::{Path, PathBuf};

/// Keeps a file name component to `[A-Za-z0-9_-]`, at most 40 characters (readable spool
/// file names only: [`unique_file`] makes them unique; storage keys are escaped by
/// `manifest::segment_key`).
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}

/// A path in `dir` that no other spool file of this process uses: a process-wide counter
/// followed by the readable `hint` (sanitized), e.g. `17-orders_eu.rbak`.
pub fn unique_file(dir: &Path, hint: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{n}-{}.rbak", sanitize(hint)))
}

/// A private local directory for segments being compressed; removed on drop.
pub struct SpoolDir(PathBuf);

impl SpoolDir {
    /// Creates a fresh spool directory for `job` (a backup id); removed on drop.
    ///
    /// Errors: `Configuration error: the spool directory <base> ... cannot be written: <why>`
    /// (exit 2) when it cannot be created or written.
    ///
    /// Removes the spool directories of processes no longer running first ([`remove_stale`]).
    pub fn create(job: &str) -> Result<SpoolDir> {
        let base = std::env::var_os("RMQ_BACKUP_SPOOL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "rmq-backup-{}-{}-{}",
            sanitize(job),
            std::process::id(),
            now_ms()
        ));
        // Refused at once when segments could not be built there (before the broker is read).
        let probe = dir.join(".probe");
        // Private to this user (0700): segments are plaintext while they are built.
        std::fs::create_dir_all(&base)
            .and_then(|()| {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new().mode(0o700).create(&dir)
            })
            .and_then(|()| std::fs::write(&probe, b"rmq-backup"))
            .and_then(|()| std::fs::remove_file(&probe))
            .map_err(|e| {
                let _ = std::fs::remove_dir(&dir);
                Error::Config(format!(
                    "the spool directory {} (RMQ_BACKUP_SPOOL_DIR, default the system temp directory) cannot be written: {}",
                    base.display(),
                    crate::repository::storage::io_reason(&e)
                ))
            })?;
        remove_stale(&base, &dir);
        Ok(SpoolDir(dir))
    }

    /// A fresh private directory (0700) in `base` named `<hint>-<16 random hex digits>`,
    /// removed on drop: made by `mkdir(2)`, which fails on any name that exists (a symlink
    /// planted there included), so it is this process's own, and no other user can put or
    /// replace a file in it. A taken name is tried again with another.
    ///
    /// Errors: the OS's, when `base` refuses a new directory.
    pub fn private_in(base: &Path, hint: &str) -> std::io::Result<SpoolDir> {
        use std::hash::{BuildHasher, Hasher};
        use std::os::unix::fs::DirBuilderExt;
        let mut last = None;
        for _ in 0..16 {
            // Keyed at random per process (and per instance): not guessable by another user.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(now_ms() as u64);
            h.write_u32(std::process::id());
            let dir = base.join(format!("{}-{:016x}", sanitize(hint), h.finish()));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(SpoolDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
    }

    /// Creates the new file `name` in the directory (0600; `O_CREAT|O_EXCL`, so never an
    /// existing file or a symlink) and returns its path.
    ///
    /// Errors: the OS's.
    pub fn new_file(&self, name: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.0.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SpoolDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pid in a spool directory's name, `rmq-backup-<job>-<pid>-<epoch ms>` ([`SpoolDir::create`]);
/// `None` for any other name.
pub fn spool_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("rmq-backup-")?;
    let (head, ms) = rest.rsplit_once('-')?;
    let (job, pid) = head.rsplit_once('-')?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    (!job.is_empty() && digits(ms) && digits(pid))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Removes the spool directories in `base` left by processes no longer running on this host
/// (their name's pid, [`spool_pid`]; `partials::writer_gone`), owned by the owner of `own` (the
/// caller's new spool directory) and real directories (a symlink is never followed); returns
/// how many. Each one removed is logged; one that cannot be removed (another process removing
/// it too, no permission) is left, at debug level.
pub fn remove_stale(base: &Path, own: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(uid) = std::fs::metadata(own).map(|m| m.uid()) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(spool_pid) else {
            continue;
        };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.file_type().is_dir() && m.uid() == uid);
        if !ours || path == own || !crate::repository::storage::partials::writer_gone(pid) {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                removed += 1;
                log::info!(
                    "removed the spool directory {} of process {pid}, no longer running",
                    path.display()
                );
            }
            Err(e) => log::debug!("spool directory {} left: {e}", path.display()),
        }
    }
    removed
}

/// Spawns a named scoped thread (names show in `top -H`, `perf` and panics). Like
/// `Scope::spawn`, it panics only when the OS cannot create a thread.
pub fn spawn_named<'scope, 'env, F, T>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    name: &str,
    f: F,
) -> std::thread::ScopedJoinHandle<'scope, T>
where
    F: FnOnce() -> T + Send + 'scope,
    T: Send + 'scope,
{
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn_scoped(scope, f)
        .unwrap_or_else(|e| panic!("cannot start thread {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_of_a_spool_directory_is_read_from_its_name() {
        assert_eq!(spool_pid("rmq-backup-copy-123-1795877067028"), Some(123));
        assert_eq!(spool_pid("rmq-backup-a-b_c-7-1"), Some(7));
        for other in [
            "rmq-backup-copy-123",
            "rmq-backup--123-456",
            "rmq-backup-copy-x-456",
            "rmq-backup-copy-123-",
            "other-copy-1-2",
            "rmq-backup-copy-99999999999-1",
        ] {
            assert_eq!(spool_pid(other), None, "{other}");
        }
    }

    #[test]
    fn only_the_directories_of_processes_gone_are_removed() {
        let base = SpoolDir::private_in(&std::env::temp_dir(), "spool-stale").unwrap();
        let own = base
            .path()
            .join(format!("rmq-backup-mine-{}-1", std::process::id()));
        std::fs::create_dir(&own).unwrap();
        // A pid that runs no process here (above any pid_max).
        let gone = (1u32 << 22) + 17;
        assert!(crate::repository::storage::partials::writer_gone(gone));
        let stale = base.path().join(format!("rmq-backup-copy-{gone}-2"));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("copy-0.seg.plain"), b"plaintext").unwrap();
        let alive = base.path().join("rmq-backup-copy-1-3");
        std::fs::create_dir(&alive).unwrap();
        let file = base.path().join(format!("rmq-backup-file-{gone}-4"));
        std::fs::write(&file, b"not a directory").unwrap();
        let link = base.path().join(format!("rmq-backup-link-{gone}-5"));
        std::os::unix::fs::symlink(&alive, &link).unwrap();
        assert_eq!(remove_stale(base.path(), &own), 1);
        assert!(!stale.exists());
        for kept in [&own, &alive, &file, &link] {
            assert!(kept.symlink_metadata().is_ok(), "{}", kept.display());
        }
    }
}
