//! Leftovers of unfinished writes (issue 31, item 11). The filesystem backend writes each object
//! to `<name>.partial-<pid>-<n>` beside its final name and renames it when whole
//! (`super::filesystem`); a writer killed in between leaves that file behind. No listing or read
//! ever sees it ([`super::is_partial_name`]), so nothing else would remove it: a backup run
//! removes the ones under its backup whose writer is gone ([`remove_stale`]), and
//! `forget --prune` reports and removes them as orphans (`crate::retention::prune`).
//!
//! "Gone" is judged on this host: the pid in the name is not a running process here
//! (`/proc/<pid>` absent). The process asking counts as running (its own writes may be in
//! flight); a system without `/proc` counts every writer as running, so nothing is removed there.

use super::{io_reason, validate_key, validate_prefix, Storage};
use crate::error::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// The writer's pid of a leftover's file name `<name>.partial-<pid>-<n>`; `None` for any other
/// name.
pub fn writer_pid(name: &str) -> Option<u32> {
    if !super::is_partial_name(name) {
        return None;
    }
    let tail = &name[name.rfind(".partial-")? + ".partial-".len()..];
    tail.split_once('-')?.0.parse().ok()
}

/// The final name a leftover was being written to (`a/b.partial-1-2` gives `a/b`); `None` for
/// a name that is not a leftover's.
pub fn final_name(name: &str) -> Option<&str> {
    writer_pid(name)?;
    name.rfind(".partial-").map(|pos| &name[..pos])
}

/// True when process `pid` is not running on this host (see the module documentation).
pub fn writer_gone(pid: u32) -> bool {
    if pid == std::process::id() || !Path::new("/proc/self").exists() {
        return false;
    }
    !Path::new("/proc").join(pid.to_string()).exists()
}

/// True when `name` is a leftover whose writer is gone.
pub fn is_stale(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    writer_pid(base).is_some_and(writer_gone)
}

/// Removes the leftovers under `prefix` whose writer is gone ([`Storage::stale_partials`]);
/// returns how many. For a run that holds `prefix` (its backup's run lock), before it writes
/// there.
///
/// Errors: the storage's, listing or removing (`Storage error: Failed to delete <name>: ...`).
pub fn remove_stale(storage: &dyn Storage, prefix: &str) -> Result<usize> {
    let stale = storage.stale_partials(prefix)?;
    for (name, _) in &stale {
        storage.remove_stale_partial(name)?;
    }
    if !stale.is_empty() {
        log::info!(
            "{} unfinished write(s) of a process no longer running removed under {prefix} in {}",
            stale.len(),
            storage.location()
        );
    }
    Ok(stale.len())
}

/// The filesystem backend's [`Storage::stale_partials`]: the leftovers below directory `base`
/// whose name relative to it starts with `prefix` and whose writer is gone. Symlinks are not
/// followed.
///
/// Errors: `Storage error: Invalid storage key: <prefix>`; `Storage error: Failed to list
/// <dir>: <reason>`.
pub(super) fn find_in(base: &Path, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
    validate_prefix(prefix)?;
    let start = match prefix.rfind('/') {
        Some(i) => &prefix[..i],
        None => "",
    };
    let mut out = Vec::new();
    walk(&under(base, start), start, prefix, &mut out)?;
    out.sort();
    Ok(out)
}

/// The filesystem backend's [`Storage::remove_stale_partial`] below directory `base`.
///
/// Errors: `Storage error: Invalid storage key: <name>` for a name that is not a leftover
/// under a valid key; `Storage error: Failed to delete <name>: <reason>`.
pub(super) fn remove_in(base: &Path, name: &str) -> Result<()> {
    let final_key = final_name(name).ok_or_else(|| super::invalid_key(name))?;
    validate_key(final_key)?;
    if !is_stale(name) {
        return Ok(());
    }
    match fs::remove_file(under(base, name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Storage(format!(
            "Failed to delete {name}: {}",
            io_reason(&e)
        ))),
    }
}

/// `base` joined with the '/'-separated `name`.
fn under(base: &Path, name: &str) -> PathBuf {
    let mut p = base.to_path_buf();
    p.extend(name.split('/').filter(|c| !c.is_empty()));
    p
}

fn walk(
    dir: &Path,
    dir_key: &str,
    prefix: &str,
    out: &mut Vec<(String, Option<i64>)>,
) -> Result<()> {
    let list_error = |e: &std::io::Error| {
        Error::Storage(format!(
            "Failed to list {}: {}",
            if dir_key.is_empty() { "/" } else { dir_key },
            io_reason(e)
        ))
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound) => return Ok(()),
        Err(e) => return Err(list_error(&e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| list_error(&e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let key = if dir_key.is_empty() {
            name.clone()
        } else {
            format!("{dir_key}/{name}")
        };
        let file_type = entry.file_type().map_err(|e| list_error(&e))?;
        if file_type.is_dir() {
            let key_dir = format!("{key}/");
            if key_dir.starts_with(prefix) || prefix.starts_with(&key_dir) {
                walk(&entry.path(), &key, prefix, out)?;
            }
        } else if file_type.is_file() && key.starts_with(prefix) && is_stale(&name) {
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64);
            out.push((key, modified));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_of_a_leftover_is_read_from_its_name() {
        assert_eq!(writer_pid("segment-0001.zst.partial-123-4"), Some(123));
        assert_eq!(writer_pid("segment-0001.zst"), None);
        assert_eq!(writer_pid("x.partial-abc-1"), None);
        assert_eq!(
            final_name("b/q/segment-1.partial-9-0"),
            Some("b/q/segment-1")
        );
        assert_eq!(final_name("b/q/segment-1"), None);
        // This process is running; a pid past the kernel's limit is not.
        assert!(!writer_gone(std::process::id()));
        assert!(writer_gone(u32::MAX));
        assert!(is_stale(&format!("a/m.json.partial-{}-1", u32::MAX)));
        assert!(!is_stale(&format!(
            "a/m.json.partial-{}-1",
            std::process::id()
        )));
    }
}
