//! Filesystem storage backend (SPEC.md `storage.backend: filesystem`): each key is a file below the
//! base directory, '/'-separated key components becoming directories.
//!
//! Writes are atomic: data goes to `<name>.partial-<pid>-<n>` in the target directory, is fsynced,
//! then renamed over the final name (and the directory fsynced). Leftover `.partial-` files of a
//! crashed writer are never listed or read; a backup removes those of its backup whose writer is
//! gone, and `forget --prune` those under any backup (`super::partials`). A create-only write (`put_*_new`) links the finished
//! file to its name instead (`link(2)` fails when the name exists); a conditional replace
//! (`put_bytes_if`) compares and renames while it holds an exclusive `flock(2)` on the
//! directory (local filesystems; NFS's locks are the server's, docs/storage-backends.md "Storage"). Errors name the key and the OS's reason:
//! `Storage error: Failed to write <key>: Permission denied`, `Failed to read <key>: ...`,
//! `Key not found: <key>`.

use super::conditional::digest_version;
use super::{
    io_reason, is_partial_name, validate_key, validate_prefix, Conditional, ObjectVersion, Storage,
};
use crate::error::{Error, Result};
use std::fs::{self, File};
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counter making temporary names unique within the process.
static PARTIAL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Storage in a local directory.
#[derive(Debug, Clone)]
pub struct FilesystemStorage {
    /// Absolute base directory.
    base: PathBuf,
}

impl FilesystemStorage {
    /// Opens the directory `base`, creating it (and its parents) when missing. A relative path is
    /// made absolute against the current directory. Errors:
    /// `Storage error: Failed to create <base>: <reason>`, or `... is not a directory`.
    pub fn new(base: &Path) -> Result<FilesystemStorage> {
        let base = std::path::absolute(base).map_err(|e| {
            Error::Storage(format!(
                "Failed to create {}: {}",
                base.display(),
                io_reason(&e)
            ))
        })?;
        fs::create_dir_all(&base).map_err(|e| {
            Error::Storage(format!(
                "Failed to create {}: {}",
                base.display(),
                io_reason(&e)
            ))
        })?;
        if !base.is_dir() {
            return Err(Error::Storage(format!(
                "Failed to create {}: Not a directory",
                base.display()
            )));
        }
        Ok(FilesystemStorage { base })
    }

    /// The absolute base directory.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Local path of a validated key.
    fn path_of(&self, key: &str) -> PathBuf {
        let mut p = self.base.clone();
        p.extend(key.split('/'));
        p
    }

    /// `Failed to write <key>: <reason>` (SPEC.md); a full disk also names the directory, so
    /// that the operator knows which filesystem to free.
    fn write_error(&self, key: &str, e: &io::Error) -> Error {
        if e.raw_os_error() == Some(28) {
            return Error::Storage(format!(
                "Failed to write {key}: No space left on device ({})",
                self.base.display()
            ));
        }
        Error::Storage(format!("Failed to write {key}: {}", io_reason(e)))
    }

    fn read_error(key: &str, e: &io::Error) -> Error {
        if is_missing(e) {
            Error::Storage(format!("Key not found: {key}"))
        } else {
            Error::Storage(format!("Failed to read {key}: {}", io_reason(e)))
        }
    }

    /// Writes `key` atomically with the bytes produced by `fill`, which copies into the open
    /// temporary file. `fill` errors of kind `Other` tagged by the caller are returned unchanged.
    fn write_atomic(
        &self,
        key: &str,
        fill: &mut dyn FnMut(&mut File) -> std::result::Result<(), FillError>,
    ) -> Result<()> {
        self.write_atomic_as(key, Publish::Replace, fill)
            .map(|_| ())
    }

    /// [`FilesystemStorage::write_atomic`], publishing the finished file as `publish` says;
    /// returns false when a create-only write found the name taken (nothing written).
    fn write_atomic_as(
        &self,
        key: &str,
        publish: Publish,
        fill: &mut dyn FnMut(&mut File) -> std::result::Result<(), FillError>,
    ) -> Result<bool> {
        validate_key(key)?;
        let target = self.path_of(key);
        let dir = target.parent().unwrap_or(&self.base).to_path_buf();
        let name = key.rsplit('/').next().unwrap_or(key);
        let tmp = dir.join(format!(
            "{name}.partial-{}-{}",
            std::process::id(),
            PARTIAL_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        // Create the directory; retry once when a concurrent delete removed an empty parent
        // between creating it and creating the file.
        let mut file = None;
        for attempt in 0..2 {
            fs::create_dir_all(&dir).map_err(|e| self.write_error(key, &e))?;
            match File::create(&tmp) {
                Ok(f) => {
                    file = Some(f);
                    break;
                }
                Err(e) if e.kind() == ErrorKind::NotFound && attempt == 0 => continue,
                Err(e) => return Err(self.write_error(key, &e)),
            }
        }
        let Some(mut file) = file else {
            return Err(Error::Storage(format!(
                "Failed to write {key}: No such file or directory"
            )));
        };
        let result = (|| {
            fill(&mut file)?;
            file.sync_all().map_err(FillError::Write)?;
            drop(file);
            match publish {
                Publish::Replace => fs::rename(&tmp, &target).map_err(FillError::Write)?,
                Publish::CreateOnly => {
                    let linked = fs::hard_link(&tmp, &target);
                    let _ = fs::remove_file(&tmp);
                    match linked {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
                        Err(e) => return Err(FillError::Write(e)),
                    }
                }
            }
            Ok(true)
        })();
        match result {
            Ok(written) => {
                // Make the rename durable; failure here does not undo the write.
                if let Ok(d) = File::open(&dir) {
                    let _ = d.sync_all();
                }
                Ok(written)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(match e {
                    FillError::Write(e) => self.write_error(key, &e),
                    FillError::Other(e) => e,
                })
            }
        }
    }

    /// Opens the object file of `key` for reading, or gives `Key not found`.
    fn open_object(&self, key: &str) -> Result<File> {
        validate_key(key)?;
        let path = self.path_of(key);
        let file = File::open(&path).map_err(|e| Self::read_error(key, &e))?;
        let meta = file.metadata().map_err(|e| Self::read_error(key, &e))?;
        if !meta.is_file() {
            return Err(Error::Storage(format!("Key not found: {key}")));
        }
        Ok(file)
    }

    /// Collects keys below `dir` (whose key form is `dir_key`, empty for the base) that start with
    /// `prefix`, recursing only into directories that can hold such keys.
    fn walk(&self, dir: &Path, dir_key: &str, prefix: &str, out: &mut Vec<String>) -> Result<()> {
        let list_error = |e: &io::Error| {
            Error::Storage(format!(
                "Failed to list {}: {}",
                if dir_key.is_empty() { "/" } else { dir_key },
                io_reason(e)
            ))
        };
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(list_error(&e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| list_error(&e))?;
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str() else {
                log::warn!(
                    "ignoring non-UTF-8 file name {:?} in {}",
                    file_name,
                    dir.display()
                );
                continue;
            };
            let key = if dir_key.is_empty() {
                name.to_string()
            } else {
                format!("{dir_key}/{name}")
            };
            let mut file_type = entry.file_type().map_err(|e| list_error(&e))?;
            if file_type.is_symlink() {
                match fs::metadata(entry.path()) {
                    Ok(m) if m.is_file() => file_type = m.file_type(),
                    // Symlinked directories are not followed (no loops); dangling links skipped.
                    _ => continue,
                }
            }
            if file_type.is_dir() {
                let key_dir = format!("{key}/");
                // Recurse only when keys below could match the prefix.
                if key_dir.starts_with(prefix) || prefix.starts_with(&key_dir) {
                    self.walk(&entry.path(), &key, prefix, out)?;
                }
            } else if file_type.is_file()
                && key.starts_with(prefix)
                && !is_partial_name(name)
                && validate_key(&key).is_ok()
            {
                out.push(key);
            }
        }
        Ok(())
    }

    /// Removes empty directories from `dir` up to (not including) the base; best effort.
    fn prune_empty_dirs(&self, mut dir: &Path) {
        while dir != self.base && dir.starts_with(&self.base) {
            if fs::remove_dir(dir).is_err() {
                break;
            }
            match dir.parent() {
                Some(p) => dir = p,
                None => break,
            }
        }
    }
}

/// How a finished temporary file takes its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publish {
    /// `rename(2)`: replaces what the name held.
    Replace,
    /// `link(2)`: only when the name is free.
    CreateOnly,
}

/// An exclusive `flock(2)` on a directory (`File::lock`), released when dropped.
struct DirLock {
    _locked: File,
}

impl DirLock {
    fn take(s: &FilesystemStorage, dir: &Path, key: &str) -> Result<DirLock> {
        fs::create_dir_all(dir).map_err(|e| s.write_error(key, &e))?;
        let f = File::open(dir).map_err(|e| s.write_error(key, &e))?;
        f.lock().map_err(|e| s.write_error(key, &e))?;
        Ok(DirLock { _locked: f })
    }
}

/// Error of a copy into the temporary file: a write failure (reported as `Failed to write <key>`)
/// or an error already in its final form (e.g. the source file cannot be read).
enum FillError {
    Write(io::Error),
    Other(Error),
}

/// True for errors meaning "no such object": missing file or a path component that is a file.
fn is_missing(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// Copies `src` into `dst` in 1 MiB chunks, separating read errors from write errors.
fn copy_stream(
    src: &mut dyn io::Read,
    dst: &mut dyn Write,
    on_read_error: &dyn Fn(io::Error) -> Error,
) -> std::result::Result<u64, FillError> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(FillError::Other(on_read_error(e))),
        };
        dst.write_all(&buf[..n]).map_err(FillError::Write)?;
        total += n as u64;
    }
}

impl Storage for FilesystemStorage {
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        let mut src = File::open(path).map_err(|e| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        })?;
        let read_error = |e: io::Error| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        };
        self.write_atomic(key, &mut |f| {
            copy_stream(&mut src, f, &read_error).map(|_| ())
        })
    }

    /// Moves the file into place when it is on the same filesystem (fsync, then one atomic
    /// rename, then the directory fsync), which spares a copy of every segment; across
    /// filesystems it copies like `put_file`.
    fn put_file_owned(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        let target = self.path_of(key);
        let dir = target.parent().unwrap_or(&self.base).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| self.write_error(key, &e))?;
        let synced = File::open(path).and_then(|f| f.sync_all());
        if synced.is_ok() && fs::rename(path, &target).is_ok() {
            if let Ok(d) = File::open(&dir) {
                let _ = d.sync_all();
            }
            return Ok(());
        }
        self.put_file(key, path)
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        self.write_atomic(key, &mut |f| f.write_all(data).map_err(FillError::Write))
    }

    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        let written = self.write_atomic_as(key, Publish::CreateOnly, &mut |f| {
            f.write_all(data).map_err(FillError::Write)
        })?;
        Ok(if written {
            Conditional::Written(digest_version(data))
        } else {
            Conditional::Refused
        })
    }

    /// Links the file to its name when it is on the same filesystem (no copy), else copies it
    /// into a temporary file first; `link(2)` refuses a name that exists.
    fn put_file_new(&self, key: &str, path: &Path) -> Result<Conditional> {
        validate_key(key)?;
        let target = self.path_of(key);
        let dir = target.parent().unwrap_or(&self.base).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| self.write_error(key, &e))?;
        let version = ObjectVersion(format!(
            "{}",
            fs::metadata(path).map(|m| m.len()).unwrap_or(0)
        ));
        if File::open(path).and_then(|f| f.sync_all()).is_ok() {
            match fs::hard_link(path, &target) {
                Ok(()) => {
                    let _ = fs::remove_file(path);
                    if let Ok(d) = File::open(&dir) {
                        let _ = d.sync_all();
                    }
                    return Ok(Conditional::Written(version));
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(Conditional::Refused),
                // Another filesystem: copy.
                Err(_) => {}
            }
        }
        let mut src = File::open(path).map_err(|e| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        })?;
        let read_error = |e: io::Error| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        };
        let written = self.write_atomic_as(key, Publish::CreateOnly, &mut |f| {
            copy_stream(&mut src, f, &read_error).map(|_| ())
        })?;
        Ok(if written {
            Conditional::Written(version)
        } else {
            Conditional::Refused
        })
    }

    fn get_with_version(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        match self.get_bytes(key) {
            Ok(data) => {
                let v = digest_version(&data);
                Ok(Some((data, v)))
            }
            Err(Error::Storage(m)) if m.starts_with("Key not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn put_bytes_if(&self, key: &str, data: &[u8], version: &ObjectVersion) -> Result<Conditional> {
        validate_key(key)?;
        let target = self.path_of(key);
        let dir = target.parent().unwrap_or(&self.base).to_path_buf();
        let _lock = DirLock::take(self, &dir, key)?;
        match self.get_with_version(key)? {
            Some((_, current)) if current == *version => {
                self.put_bytes(key, data)?;
                Ok(Conditional::Written(digest_version(data)))
            }
            _ => Ok(Conditional::Refused),
        }
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        let mut file = self.open_object(key)?;
        let mut data = Vec::new();
        io::Read::read_to_end(&mut file, &mut data).map_err(|e| Self::read_error(key, &e))?;
        Ok(data)
    }

    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        let mut src = self.open_object(key)?;
        let mut dst = File::create(path).map_err(|e| {
            Error::Io(format!(
                "Failed to write {}: {}",
                path.display(),
                io_reason(&e)
            ))
        })?;
        let read_error = |e: io::Error| Self::read_error(key, &e);
        let n = copy_stream(&mut src, &mut dst, &read_error).map_err(|e| match e {
            FillError::Write(e) => Error::Io(format!(
                "Failed to write {}: {}",
                path.display(),
                io_reason(&e)
            )),
            FillError::Other(e) => e,
        })?;
        dst.flush().map_err(|e| {
            Error::Io(format!(
                "Failed to write {}: {}",
                path.display(),
                io_reason(&e)
            ))
        })?;
        Ok(n)
    }

    fn open_local(&self, key: &str) -> Result<Option<(File, PathBuf)>> {
        Ok(Some((self.open_object(key)?, self.path_of(key))))
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        match fs::metadata(self.path_of(key)) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(Self::read_error(key, &e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        // Start at the deepest directory the prefix names fully.
        let (start_key, start_dir) = match prefix.rfind('/') {
            Some(i) => (&prefix[..i], self.path_of(&prefix[..i])),
            None => ("", self.base.clone()),
        };
        let mut out = Vec::new();
        self.walk(&start_dir, start_key, prefix, &mut out)?;
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let path = self.path_of(key);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => return Ok(()),
            Err(e) if is_missing(&e) => return Ok(()),
            _ => {}
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => {
                return Err(Error::Storage(format!(
                    "Failed to delete {key}: {}",
                    io_reason(&e)
                )))
            }
        }
        if let Some(parent) = path.parent() {
            self.prune_empty_dirs(parent);
        }
        Ok(())
    }

    fn location(&self) -> String {
        format!("file://{}", self.base.display())
    }

    fn stale_partials(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        super::partials::find_in(&self.base, prefix)
    }

    fn remove_stale_partial(&self, name: &str) -> Result<()> {
        super::partials::remove_in(&self.base, name)
    }

    fn list_with_times(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        let keys = self.list(prefix)?;
        Ok(keys
            .into_iter()
            .map(|k| {
                let modified = fs::metadata(self.path_of(&k))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as i64);
                (k, modified)
            })
            .collect())
    }

    fn list_backup_ids(&self) -> Result<Vec<String>> {
        let entries = match fs::read_dir(&self.base) {
            Ok(entries) => entries,
            Err(e) => {
                return Err(Error::Storage(format!(
                    "Failed to list /: {}",
                    io_reason(&e)
                )))
            }
        };
        let mut ids = Vec::new();
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if validate_key(&name).is_err() {
                continue;
            }
            let path = entry.path();
            // A backup, or a sharded one whose parts are not merged yet (`crate::repository::shard`).
            let part = || {
                fs::read_dir(path.join("parts")).is_ok_and(|mut parts| {
                    parts.any(|p| {
                        p.is_ok_and(|p| p.file_name().to_string_lossy().ends_with(".json"))
                    })
                })
            };
            if path.join(super::MANIFEST_FILE).is_file() || part() {
                ids.push(name);
            }
        }
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::storage::conformance::{self, TempDir};

    #[test]
    fn conforms() {
        let dir = TempDir::new("fs");
        let s = FilesystemStorage::new(&dir.0.join("created/on/open")).expect("open");
        assert!(dir.0.join("created/on/open").is_dir());
        conformance::run(&s);
        assert_eq!(
            s.location(),
            format!("file://{}", dir.0.join("created/on/open").display())
        );
    }

    #[test]
    fn partial_leftovers_are_invisible() {
        let dir = TempDir::new("fs-partial");
        let s = FilesystemStorage::new(&dir.0).expect("open");
        s.put_bytes("b1/manifest.json", b"{}").expect("put");
        fs::write(dir.0.join("b1/manifest.json.partial-99-1"), b"half").expect("leftover");
        fs::create_dir_all(dir.0.join("b2")).expect("mkdir");
        fs::write(dir.0.join("b2/segment-0001.partial-1-2"), b"half").expect("leftover");
        assert_eq!(s.list("").expect("list"), ["b1/manifest.json"]);
        assert_eq!(s.list("b2/").expect("list"), Vec::<String>::new());
        assert_eq!(
            s.get_bytes("b2/segment-0001").expect_err("absent"),
            Error::Storage("Key not found: b2/segment-0001".into())
        );
        // After a put nothing but the final file remains in the directory.
        s.put_bytes("b2/segment-0001", b"whole").expect("put");
        let mut names: Vec<String> = fs::read_dir(dir.0.join("b2"))
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        // The final file and the old leftover only: the put's own temporary file is gone.
        assert_eq!(names, ["segment-0001", "segment-0001.partial-1-2"]);
        assert_eq!(s.list_backup_ids().expect("ids"), ["b1"]);
    }

    #[test]
    fn owned_files_are_moved_into_place() {
        let dir = TempDir::new("fs-owned");
        let s = FilesystemStorage::new(&dir.0.join("store")).expect("open");
        let spool = dir.0.join("spool.rbak");
        fs::write(&spool, b"segment bytes").expect("spool");
        s.put_file_owned("b/queues/v/q/segment-0001", &spool)
            .expect("put");
        assert_eq!(
            s.get_bytes("b/queues/v/q/segment-0001").expect("get"),
            b"segment bytes"
        );
        assert!(!spool.exists(), "same filesystem: moved, not copied");
        // Overwrite, and a missing source file is an error that names it.
        fs::write(&spool, b"second").expect("spool");
        s.put_file_owned("b/queues/v/q/segment-0001", &spool)
            .expect("put");
        assert_eq!(
            s.get_bytes("b/queues/v/q/segment-0001").expect("get"),
            b"second"
        );
        let err = s
            .put_file_owned("b/x", &dir.0.join("nope"))
            .expect_err("missing source");
        assert!(
            err.to_string().starts_with("IO error: Failed to read "),
            "{err}"
        );
        assert!(s.put_file_owned("../escape", &spool).is_err());
    }

    #[test]
    fn delete_prunes_empty_directories() {
        let dir = TempDir::new("fs-prune");
        let s = FilesystemStorage::new(&dir.0).expect("open");
        s.put_bytes("b/queues/v/q/segment-0001", b"x").expect("put");
        s.put_bytes("b/manifest.json", b"x").expect("put");
        s.delete("b/queues/v/q/segment-0001").expect("delete");
        assert!(!dir.0.join("b/queues").exists());
        assert!(dir.0.join("b/manifest.json").is_file());
        s.delete("b/manifest.json").expect("delete");
        assert!(!dir.0.join("b").exists());
        assert!(dir.0.is_dir(), "the base directory stays");
    }

    #[test]
    fn write_errors_name_the_key() {
        let dir = TempDir::new("fs-denied");
        let s = FilesystemStorage::new(&dir.0).expect("open");
        // A key below an existing object: its directory cannot be created.
        s.put_bytes("file", b"x").expect("put");
        let err = s.put_bytes("file/below", b"x").expect_err("below a file");
        let msg = err.to_string();
        assert!(
            msg.starts_with("Storage error: Failed to write file/below: "),
            "{msg}"
        );
        assert!(!msg.contains("os error"), "{msg}");

        // Read-only directory: denied unless we run with CAP_DAC_OVERRIDE (root).
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.0.join("ro");
        fs::create_dir_all(&ro).expect("mkdir");
        let s = FilesystemStorage::new(&ro).expect("open");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o500)).expect("chmod");
        let probe = File::create(ro.join("probe"));
        let root_bypasses = probe.is_ok();
        let _ = fs::remove_file(ro.join("probe"));
        let result = s.put_bytes("b1/manifest.json", b"{}");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o700)).expect("chmod back");
        if root_bypasses {
            assert!(result.is_ok());
        } else {
            assert_eq!(
                result.expect_err("denied").to_string(),
                "Storage error: Failed to write b1/manifest.json: Permission denied"
            );
        }
        // The message shape for EACCES, whatever user runs the tests.
        assert_eq!(
            s.write_error("k/x", &io::Error::from_raw_os_error(13)),
            Error::Storage("Failed to write k/x: Permission denied".into())
        );
        // A full disk names the directory too.
        assert_eq!(
            s.write_error("k/x", &io::Error::from_raw_os_error(28)),
            Error::Storage(format!(
                "Failed to write k/x: No space left on device ({})",
                s.base().display()
            ))
        );
    }

    #[test]
    fn base_that_is_a_file_is_refused() {
        let dir = TempDir::new("fs-base-file");
        let f = dir.0.join("plain");
        fs::write(&f, b"x").expect("write");
        let err = FilesystemStorage::new(&f).expect_err("file as base");
        assert!(
            err.to_string().starts_with(&format!(
                "Storage error: Failed to create {}: ",
                f.display()
            )),
            "{err}"
        );
    }
}
