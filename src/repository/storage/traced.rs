//! [`Traced`]: every storage operation logged at trace level (`-vv`).

use super::{Conditional, ObjectVersion, Storage};
use crate::error::Result;
use std::path::Path;
use std::sync::Arc;

/// Logs every storage operation at trace level (`-vv`, SPEC.md: "storage operations"): the
/// operation, the key, bytes moved, milliseconds taken and the outcome. It prints keys and the
/// location only, never a credential. [`open_config`] and [`url::open_url`] return storages
/// wrapped in it.
pub struct Traced {
    inner: Arc<dyn Storage>,
}

impl Traced {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Storage>) -> Arc<dyn Storage> {
        log::debug!("storage: {}", inner.location());
        Arc::new(Traced { inner })
    }

    fn traced<T>(
        &self,
        op: &str,
        key: &str,
        size: impl Fn(&T) -> Option<u64>,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if !log::log_enabled!(log::Level::Trace) {
            return f();
        }
        let started = std::time::Instant::now();
        let outcome = f();
        let ms = started.elapsed().as_millis();
        match &outcome {
            Ok(v) => match size(v) {
                Some(n) => log::trace!("storage: {op} {key}: ok, {n} bytes, {ms} ms"),
                None => log::trace!("storage: {op} {key}: ok, {ms} ms"),
            },
            Err(e) => log::trace!("storage: {op} {key}: failed after {ms} ms: {e}"),
        }
        outcome
    }
}

impl Storage for Traced {
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        let len = std::fs::metadata(path).map(|m| m.len()).ok();
        self.traced("put", key, |_| len, || self.inner.put_file(key, path))
    }

    fn put_file_owned(&self, key: &str, path: &Path) -> Result<()> {
        let len = std::fs::metadata(path).map(|m| m.len()).ok();
        self.traced("put", key, |_| len, || self.inner.put_file_owned(key, path))
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        let len = Some(data.len() as u64);
        self.traced("put", key, |_| len, || self.inner.put_bytes(key, data))
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        self.traced(
            "get",
            key,
            |v: &Vec<u8>| Some(v.len() as u64),
            || self.inner.get_bytes(key),
        )
    }

    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        self.traced(
            "get",
            key,
            |n| Some(*n),
            || self.inner.get_to_file(key, path),
        )
    }

    fn open_local(&self, key: &str) -> Result<Option<(std::fs::File, std::path::PathBuf)>> {
        self.traced(
            "open",
            key,
            |f: &Option<(std::fs::File, std::path::PathBuf)>| {
                f.as_ref()
                    .and_then(|(f, _)| f.metadata().ok())
                    .map(|m| m.len())
            },
            || self.inner.open_local(key),
        )
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        self.traced("head", key, |n| *n, || self.inner.head(key))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let shown = if prefix.is_empty() { "/" } else { prefix };
        let keys = self.traced("list", shown, |_| None, || self.inner.list(prefix))?;
        log::trace!("storage: list {shown}: {} keys", keys.len());
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.traced("delete", key, |_| None, || self.inner.delete(key))
    }

    fn delete_many(&self, keys: &[String]) -> Result<()> {
        let shown = format!(
            "{} keys from {}",
            keys.len(),
            keys.first().map_or("", |k| k)
        );
        self.traced("delete", &shown, |_| None, || self.inner.delete_many(keys))
    }

    fn list_with_times(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        let shown = if prefix.is_empty() { "/" } else { prefix };
        self.traced(
            "list (with times)",
            shown,
            |_| None,
            || self.inner.list_with_times(prefix),
        )
    }

    fn stale_partials(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        let shown = if prefix.is_empty() { "/" } else { prefix };
        self.traced(
            "list (unfinished writes)",
            shown,
            |_| None,
            || self.inner.stale_partials(prefix),
        )
    }

    fn remove_stale_partial(&self, name: &str) -> Result<()> {
        self.traced(
            "delete (unfinished write)",
            name,
            |_| None,
            || self.inner.remove_stale_partial(name),
        )
    }

    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        self.traced(
            "put (create only)",
            key,
            |c: &Conditional| matches!(c, Conditional::Written(_)).then_some(data.len() as u64),
            || self.inner.put_bytes_new(key, data),
        )
    }

    fn put_file_new(&self, key: &str, path: &Path) -> Result<Conditional> {
        let len = std::fs::metadata(path).map(|m| m.len()).ok();
        self.traced(
            "put (create only)",
            key,
            |c: &Conditional| len.filter(|_| matches!(c, Conditional::Written(_))),
            || self.inner.put_file_new(key, path),
        )
    }

    fn get_with_version(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        self.traced(
            "get (versioned)",
            key,
            |v: &Option<(Vec<u8>, ObjectVersion)>| v.as_ref().map(|(d, _)| d.len() as u64),
            || self.inner.get_with_version(key),
        )
    }

    fn put_bytes_if(&self, key: &str, data: &[u8], version: &ObjectVersion) -> Result<Conditional> {
        self.traced(
            "put (if version)",
            key,
            |c: &Conditional| matches!(c, Conditional::Written(_)).then_some(data.len() as u64),
            || self.inner.put_bytes_if(key, data, version),
        )
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn retained_until(&self, key: &str) -> Result<Option<i64>> {
        self.traced(
            "retention of",
            key,
            |_| None,
            || self.inner.retained_until(key),
        )
    }

    fn latest_retention(&self, prefix: &str) -> Result<Option<i64>> {
        self.traced(
            "latest retention under",
            prefix,
            |_| None,
            || self.inner.latest_retention(prefix),
        )
    }

    fn list_backup_ids(&self) -> Result<Vec<String>> {
        self.traced(
            "list backup ids in",
            "/",
            |_| None,
            || self.inner.list_backup_ids(),
        )
    }
}
