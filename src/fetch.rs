//! Reading what a backup stored: the one place where a stored segment is opened for reading
//! (restore, `cat`, `validate --deep`, the resume of a stream backup), so that every reader
//! checks and decrypts the same way.
//!
//! A segment is fetched to a spool file and checked against the manifest before any record
//! of it is used: a plain segment by its CRC32 (`SegmentReader::open`) and SHA-256; an
//! encrypted one (`SegmentMetadata::encryption`, README "Encryption at rest") first by the
//! SHA-256 of the stored age file, then decrypted whole into a second spool file (age
//! authenticates every 64 KiB chunk and the header, so a wrong key or an altered byte fails
//! here), then by its CRC32. The spool files are removed when the [`FetchedSegment`] is
//! dropped, and on every error.

use crate::encryption::{self, Identities};
use crate::error::{Error, Result};
use crate::manifest::{Manifest, SegmentMetadata};
use crate::segment::{sha256_file, SegmentReader};
use crate::storage::Storage;
use std::path::{Path, PathBuf};

/// A fetched, verified segment, ready to iterate. Keep `files` alive while reading: its
/// spool files go when it is dropped.
pub struct FetchedSegment {
    /// The verified segment.
    pub reader: SegmentReader,
    /// Its spool files (the stored file, and the plaintext of an encrypted one).
    pub files: SpoolFiles,
}

/// Spool files removed on drop.
pub struct SpoolFiles(Vec<PathBuf>);

impl Drop for SpoolFiles {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Checks, before anything of `manifest`'s backup is read, that `keys` can read it: an
/// encrypted backup needs identities, one of which is among the recipients the manifest
/// lists. An unencrypted backup needs none (and ignores any given).
///
/// Errors: `Encryption error: backup {id} is encrypted (age) and no identity was given: ...`;
/// `Encryption error: none of the identities in {source} ... is a recipient of backup {id}
/// ...: wrong identity`; an unknown scheme.
pub fn check_readable(manifest: &Manifest, keys: Option<&Identities>) -> Result<()> {
    let id = &manifest.backup_id;
    let encrypted_parts = manifest
        .queues
        .iter()
        .flat_map(|q| &q.segments)
        .any(|s| s.encryption.is_some())
        || manifest
            .definitions
            .as_ref()
            .is_some_and(|d| d.encryption.is_some());
    if manifest.encryption.is_none() && !encrypted_parts {
        return Ok(());
    }
    let keys = keys.ok_or_else(|| encryption::missing_identity(&format!("backup {id}")))?;
    match &manifest.encryption {
        Some(info) => keys.check_recipient_of(info, id),
        None => Ok(()),
    }
}

/// Fetches `segment` to the spool file `path` and verifies it (see the module's doc);
/// `keys` decrypt an encrypted segment. An encrypted segment's plaintext is written beside
/// `path` (`<path>.plain`).
///
/// Errors (messages without the key; the caller names the segment): the storage's;
/// `Serialization error:` for a RBAK file that does not check out (magic, CRC32, ...) and
/// `SHA-256 mismatch: expected {manifest}, got {file}`; `Encryption error: {key} ...` for an
/// encrypted segment without `keys`, with the wrong ones, or altered (a MAC that fails);
/// `Error::Io` for spool files.
pub fn fetch_segment(
    storage: &dyn Storage,
    path: &Path,
    segment: &SegmentMetadata,
    keys: Option<&Identities>,
) -> Result<FetchedSegment> {
    let mut files = SpoolFiles(vec![path.to_path_buf()]);
    storage.get_to_file(&segment.key, path)?;
    let check_sha = || -> Result<()> {
        let sha = sha256_file(path)?;
        if sha != segment.checksum {
            return Err(Error::Serialization(format!(
                "SHA-256 mismatch: expected {}, got {sha}",
                segment.checksum
            )));
        }
        Ok(())
    };
    let reader = match segment.encryption.as_deref() {
        None => {
            let reader = SegmentReader::open(path)?;
            check_sha()?;
            reader
        }
        Some(encryption::SCHEME) => {
            // The stored bytes first: a shallow validate proves the same without the key.
            check_sha()?;
            let keys = keys.ok_or_else(|| encryption::missing_identity(&segment.key))?;
            let mut plain = path.as_os_str().to_owned();
            plain.push(".plain");
            let plain = PathBuf::from(plain);
            files.0.push(plain.clone());
            keys.decrypt_file(path, &plain, &segment.key)?;
            // Only the plaintext is read from here on.
            let _ = std::fs::remove_file(path);
            SegmentReader::open(&plain)?
        }
        Some(other) => {
            return Err(Error::Encryption(format!(
                "{} is stored with encryption {other:?}, which this version does not read",
                segment.key
            )))
        }
    };
    Ok(FetchedSegment { reader, files })
}
