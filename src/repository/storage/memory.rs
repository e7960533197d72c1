//! In-memory storage backend (SPEC.md `storage.backend: memory`, `memory://`): for tests; data is
//! not persisted. Stores are named and kept in a process-wide registry, so two opens of the same
//! name in one process (a backup, then a restore) see the same objects. `memory://` is the store
//! named `default`.

use super::conditional::digest_version;
use super::{validate_key, validate_prefix, Conditional, ObjectVersion, Storage};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Name of the store behind `memory://` and `backend: memory`.
pub const DEFAULT_NAME: &str = "default";

/// Objects by key, in key order; values shared so reads do not hold the lock while copying.
type Objects = BTreeMap<String, Arc<Vec<u8>>>;

/// A named in-memory object store.
#[derive(Debug)]
pub struct MemoryStorage {
    name: String,
    objects: RwLock<Objects>,
}

fn registry() -> &'static Mutex<HashMap<String, Arc<MemoryStorage>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Arc<MemoryStorage>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl MemoryStorage {
    /// The process-wide store called `name`, created empty on first use. Every call with the same
    /// name returns the same store.
    pub fn named(name: &str) -> Arc<MemoryStorage> {
        // A panic while holding the lock cannot leave the map inconsistent: take it anyway.
        let mut map = registry().lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(MemoryStorage {
                    name: name.to_string(),
                    objects: RwLock::new(BTreeMap::new()),
                })
            })
            .clone()
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes every object (the store stays registered).
    pub fn clear(&self) {
        self.write().clear();
    }

    fn read(&self) -> RwLockReadGuard<'_, Objects> {
        self.objects.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Objects> {
        self.objects.write().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: &str) -> Result<Arc<Vec<u8>>> {
        validate_key(key)?;
        self.read()
            .get(key)
            .cloned()
            .ok_or_else(|| Error::Storage(format!("Key not found: {key}")))
    }
}

impl Storage for MemoryStorage {
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        let read_error = |e: std::io::Error| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                super::io_reason(&e)
            ))
        };
        let mut data = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut data))
            .map_err(read_error)?;
        self.write().insert(key.to_string(), Arc::new(data));
        Ok(())
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        validate_key(key)?;
        self.write()
            .insert(key.to_string(), Arc::new(data.to_vec()));
        Ok(())
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        Ok(self.get(key)?.as_ref().clone())
    }

    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        let data = self.get(key)?;
        let write_error = |e: std::io::Error| {
            Error::Io(format!(
                "Failed to write {}: {}",
                path.display(),
                super::io_reason(&e)
            ))
        };
        let mut f = std::fs::File::create(path).map_err(write_error)?;
        f.write_all(&data).map_err(write_error)?;
        Ok(data.len() as u64)
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        Ok(self.read().get(key).map(|d| d.len() as u64))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        Ok(self
            .read()
            .range(prefix.to_string()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(prefix))
            .cloned()
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        self.write().remove(key);
        Ok(())
    }

    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        validate_key(key)?;
        let mut objects = self.write();
        if objects.contains_key(key) {
            return Ok(Conditional::Refused);
        }
        objects.insert(key.to_string(), Arc::new(data.to_vec()));
        Ok(Conditional::Written(digest_version(data)))
    }

    fn put_file_new(&self, key: &str, path: &Path) -> Result<Conditional> {
        validate_key(key)?;
        let mut data = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut data))
            .map_err(|e| {
                Error::Io(format!(
                    "Failed to read {}: {}",
                    path.display(),
                    super::io_reason(&e)
                ))
            })?;
        self.put_bytes_new(key, &data)
    }

    fn get_with_version(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        validate_key(key)?;
        Ok(self
            .read()
            .get(key)
            .map(|d| (d.as_ref().clone(), digest_version(d))))
    }

    fn put_bytes_if(&self, key: &str, data: &[u8], version: &ObjectVersion) -> Result<Conditional> {
        validate_key(key)?;
        let mut objects = self.write();
        match objects.get(key) {
            Some(current) if digest_version(current) == *version => {
                objects.insert(key.to_string(), Arc::new(data.to_vec()));
                Ok(Conditional::Written(digest_version(data)))
            }
            _ => Ok(Conditional::Refused),
        }
    }

    fn location(&self) -> String {
        format!("memory://{}", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::storage::conformance;

    #[test]
    fn conforms() {
        let s = MemoryStorage::named(&format!("conformance-{}", std::process::id()));
        conformance::run(s.as_ref());
        assert_eq!(
            s.location(),
            format!("memory://conformance-{}", std::process::id())
        );
    }

    #[test]
    fn same_name_same_store() {
        let name = format!("shared-{}", std::process::id());
        let a = MemoryStorage::named(&name);
        a.put_bytes("b1/manifest.json", b"{}").expect("put");
        let b = MemoryStorage::named(&name);
        assert_eq!(b.get_bytes("b1/manifest.json").expect("get"), b"{}");
        assert_eq!(b.list_backup_ids().expect("ids"), ["b1"]);
        let other = MemoryStorage::named(&format!("{name}-other"));
        assert_eq!(other.head("b1/manifest.json").expect("head"), None);
        b.clear();
        assert_eq!(a.list("").expect("list"), Vec::<String>::new());
    }
}
