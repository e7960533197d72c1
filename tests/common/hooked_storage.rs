//! A real storage behind a hook: every operation is first shown to the test's hook, which lets
//! it through (`Ok(())`), holds it (sleeps, waits on a flag) or fails it (its error is what the
//! operation returns), then goes to the real storage. Tests model slow, stalled, read-only and
//! append-only storage with it.

use rmq_backup::repository::storage::{Conditional, ObjectVersion, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What an operation does to the object it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// get, head, list (of a prefix), a local open.
    Read,
    /// put of every kind (plain, new-only, conditional).
    Write,
    /// delete (one key per call, also for a batch).
    Delete,
}

/// The hook: `(access, key or prefix)`.
pub type Hook = Box<dyn Fn(Access, &str) -> rmq_backup::Result<()> + Send + Sync>;

/// `inner` behind `hook`.
pub struct Hooked {
    inner: Arc<dyn Storage>,
    hook: Hook,
}

impl Hooked {
    pub fn new(
        inner: Arc<dyn Storage>,
        hook: impl Fn(Access, &str) -> rmq_backup::Result<()> + Send + Sync + 'static,
    ) -> Arc<Hooked> {
        Arc::new(Hooked {
            inner,
            hook: Box::new(hook),
        })
    }

    fn read(&self, key: &str) -> rmq_backup::Result<()> {
        (self.hook)(Access::Read, key)
    }

    fn write(&self, key: &str) -> rmq_backup::Result<()> {
        (self.hook)(Access::Write, key)
    }
}

impl Storage for Hooked {
    fn put_file(&self, key: &str, path: &Path) -> rmq_backup::Result<()> {
        self.write(key)?;
        self.inner.put_file(key, path)
    }
    fn put_file_owned(&self, key: &str, path: &Path) -> rmq_backup::Result<()> {
        self.write(key)?;
        self.inner.put_file_owned(key, path)
    }
    fn put_bytes(&self, key: &str, data: &[u8]) -> rmq_backup::Result<()> {
        self.write(key)?;
        self.inner.put_bytes(key, data)
    }
    fn get_bytes(&self, key: &str) -> rmq_backup::Result<Vec<u8>> {
        self.read(key)?;
        self.inner.get_bytes(key)
    }
    fn get_to_file(&self, key: &str, path: &Path) -> rmq_backup::Result<u64> {
        self.read(key)?;
        self.inner.get_to_file(key, path)
    }
    fn open_local(&self, key: &str) -> rmq_backup::Result<Option<(std::fs::File, PathBuf)>> {
        self.read(key)?;
        self.inner.open_local(key)
    }
    fn head(&self, key: &str) -> rmq_backup::Result<Option<u64>> {
        self.read(key)?;
        self.inner.head(key)
    }
    fn list(&self, prefix: &str) -> rmq_backup::Result<Vec<String>> {
        self.read(prefix)?;
        self.inner.list(prefix)
    }
    fn list_with_times(&self, prefix: &str) -> rmq_backup::Result<Vec<(String, Option<i64>)>> {
        self.read(prefix)?;
        self.inner.list_with_times(prefix)
    }
    fn delete(&self, key: &str) -> rmq_backup::Result<()> {
        (self.hook)(Access::Delete, key)?;
        self.inner.delete(key)
    }
    fn delete_many(&self, keys: &[String]) -> rmq_backup::Result<()> {
        for k in keys {
            (self.hook)(Access::Delete, k)?;
        }
        self.inner.delete_many(keys)
    }
    fn put_bytes_new(&self, key: &str, data: &[u8]) -> rmq_backup::Result<Conditional> {
        self.write(key)?;
        self.inner.put_bytes_new(key, data)
    }
    fn put_file_new(&self, key: &str, path: &Path) -> rmq_backup::Result<Conditional> {
        self.write(key)?;
        self.inner.put_file_new(key, path)
    }
    fn get_with_version(&self, key: &str) -> rmq_backup::Result<Option<(Vec<u8>, ObjectVersion)>> {
        self.read(key)?;
        self.inner.get_with_version(key)
    }
    fn put_bytes_if(
        &self,
        key: &str,
        data: &[u8],
        version: &ObjectVersion,
    ) -> rmq_backup::Result<Conditional> {
        self.write(key)?;
        self.inner.put_bytes_if(key, data, version)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
    fn retained_until(&self, key: &str) -> rmq_backup::Result<Option<i64>> {
        self.read(key)?;
        self.inner.retained_until(key)
    }
    fn latest_retention(&self, prefix: &str) -> rmq_backup::Result<Option<i64>> {
        self.read(prefix)?;
        self.inner.latest_retention(prefix)
    }
}
