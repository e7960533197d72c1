//! One object of a copy: what the target already holds under its key, the checks of the
//! source's bytes, and the write, which never replaces an object unless it must (issue 38,
//! items 2 and 4).

use super::state::{same_recipients, Journal};
use super::CopyOptions;
use crate::error::{Error, Result};
use crate::repository::encryption;
use crate::repository::manifest::SegmentMetadata;
use crate::repository::segment::{sha256_file, SegmentReader};
use crate::repository::storage::{Conditional, Storage};
use std::path::{Path, PathBuf};

/// How a segment got to the target.
pub enum Outcome {
    /// Stored now; the bytes stored.
    Copied(u64),
    /// Already there and verified.
    InPlace,
}

/// What the target holds under a key.
enum There {
    Absent,
    /// One of the objects expected there (by size and SHA-256).
    Is(SegmentMetadata),
    /// Something else.
    Other,
}

/// An object under the key a write is for, which the write replaces: one an earlier run of
/// this copy recorded (its record), or one no record describes (`None`).
#[derive(Debug, Clone)]
pub struct Earlier(pub Option<Record>);

/// What a record says of an object an earlier run stored.
#[derive(Debug, Clone)]
pub struct Record {
    /// The recipients it was encrypted to by the copy (None: the source's bytes).
    pub recipients: Option<Vec<String>>,
}

/// The key a source object gets at the target: `.age` added when a plain object is
/// encrypted by the copy.
pub fn target_key(key: &str, source_encrypted: bool, encrypting: bool) -> String {
    if encrypting && !source_encrypted {
        format!("{key}{}", encryption::EXTENSION)
    } else {
        key.to_string()
    }
}

/// Whether `record`, a segment's entry at the target, is what this run stores for the source
/// segment `s`: the source's bytes (no `--recipient`), or an encryption to exactly the run's
/// recipients.
pub fn stores(opts: &CopyOptions, s: &SegmentMetadata, record: &SegmentMetadata) -> bool {
    match &opts.recipients {
        None => record.checksum == s.checksum && record.size_bytes == s.size_bytes,
        Some(r) => {
            record.encryption.as_deref() == Some(encryption::SCHEME)
                && same_recipients(r, record.recipients.as_deref())
        }
    }
}

/// The record of `earlier`, an object at the target, for the message of a refused
/// replacement: `None` for the source's own bytes.
fn record_of(s: &SegmentMetadata, earlier: &SegmentMetadata) -> Record {
    Record {
        recipients: if earlier.checksum == s.checksum {
            None
        } else {
            earlier.recipients.clone()
        },
    }
}

/// What `to` holds under `key`, compared with `expected` (records of objects that may be
/// there): fetched to `path` and hashed only when its size is one of theirs.
fn look(to: &dyn Storage, key: &str, expected: &[SegmentMetadata], path: &Path) -> Result<There> {
    let Some(size) = to.head(key)? else {
        return Ok(There::Absent);
    };
    if !expected.iter().any(|e| e.size_bytes == size) {
        return Ok(There::Other);
    }
    to.get_to_file(key, path)?;
    let sha = sha256_file(path);
    let _ = std::fs::remove_file(path);
    let sha = sha?;
    Ok(expected
        .iter()
        .find(|e| e.size_bytes == size && e.checksum == sha)
        .map_or(There::Other, |e| There::Is(e.clone())))
}

/// Copies one segment `s` of the source: left alone when the target holds what this run
/// stores ([`stores`]); else fetched to `path`, checked against the source manifest (SHA-256
/// and CRC32 in one pass over the spool file, which only this process writes), re-encrypted
/// with `--recipient` (recorded in `journal` before the upload), and stored ([`store_file`]).
/// `known`: what earlier runs recorded under its key at the target.
pub fn copy_segment(
    from: &dyn Storage,
    to: &dyn Storage,
    s: &SegmentMetadata,
    known: &[SegmentMetadata],
    opts: &CopyOptions,
    path: &Path,
    journal: &Journal,
) -> Result<(SegmentMetadata, Outcome)> {
    let encrypted = s.encryption.is_some();
    let key = target_key(&s.key, encrypted, opts.recipients.is_some());
    let mut expected = known.to_vec();
    if opts.recipients.is_none() {
        expected.push(s.clone());
    }
    let earlier = match look(to, &key, &expected, path)? {
        There::Absent => None,
        There::Is(e) if stores(opts, s, &e) => {
            let meta = if opts.recipients.is_none() {
                s.clone()
            } else {
                e
            };
            return Ok((meta, Outcome::InPlace));
        }
        There::Is(e) => Some(Earlier(Some(record_of(s, &e)))),
        There::Other => Some(Earlier(None)),
    };
    from.get_to_file(&s.key, path)?;
    // The plaintext RBAK file, CRC32 checked, when it can be had.
    let plain = match (encrypted, &opts.identities) {
        (false, _) => {
            let file = std::fs::File::open(path)
                .map_err(|e| crate::repository::segment::io_err("Failed to open", path, e))?;
            SegmentReader::verify(file, path, Some(&s.checksum))?;
            Some(path.to_path_buf())
        }
        (true, keys) => {
            let sha = sha256_file(path)?;
            if sha != s.checksum {
                return Err(Error::Serialization(format!(
                    "SHA-256 mismatch: expected {}, got {sha}",
                    s.checksum
                )));
            }
            match keys {
                Some(keys) => {
                    let plain = suffixed(path, ".plain");
                    keys.decrypt_file(path, &plain, &s.key)?;
                    SegmentReader::open(&plain)?;
                    Some(plain)
                }
                None => None,
            }
        }
    };
    let Some(recipients) = &opts.recipients else {
        store_file(to, &key, path, earlier)?;
        return Ok((s.clone(), Outcome::Copied(s.size_bytes)));
    };
    let plain = plain.ok_or_else(|| encryption::missing_identity(&s.key))?;
    let sealed = suffixed(path, ".sealed");
    let _ = std::fs::remove_file(&sealed);
    let (size, checksum) = recipients.encrypt_file(&plain, &sealed)?;
    let meta = SegmentMetadata {
        key: key.clone(),
        size_bytes: size,
        checksum,
        encryption: Some(encryption::SCHEME.to_string()),
        recipients: Some(recipients.public_keys()),
        ..s.clone()
    };
    journal.segment_pending(&meta)?;
    store_file(to, &key, &sealed, earlier)?;
    Ok((meta, Outcome::Copied(size)))
}

/// `path` with `suffix` appended.
pub fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Stores the file `path` under `key`: created only where no object is (`put_file_new`),
/// else replacing `earlier` (see [`replaced`]).
///
/// Errors: the storage's; a refused replacement as [`replaced`] says.
pub fn store_file(
    to: &dyn Storage,
    key: &str,
    path: &Path,
    earlier: Option<Earlier>,
) -> Result<()> {
    let earlier = match earlier {
        None => match to.put_file_new(key, path)? {
            Conditional::Written(_) => return Ok(()),
            // Stored meanwhile (or by a run that recorded nothing): replaced, as below.
            Conditional::Refused => Earlier(None),
        },
        Some(e) => e,
    };
    log::info!("copy: {key}: replacing the object an earlier run stored there");
    to.put_file(key, path)
        .map_err(|e| replaced(key, &e, &earlier))
}

/// [`store_file`] for bytes held in memory (the definitions export).
///
/// Errors: as [`store_file`].
pub fn store_bytes(
    to: &dyn Storage,
    key: &str,
    data: &[u8],
    earlier: Option<Earlier>,
) -> Result<()> {
    let earlier = match earlier {
        None => match to.put_bytes_new(key, data)? {
            Conditional::Written(_) => return Ok(()),
            Conditional::Refused => Earlier(None),
        },
        Some(e) => e,
    };
    log::info!("copy: {key}: replacing the object an earlier run stored there");
    to.put_bytes(key, data)
        .map_err(|e| replaced(key, &e, &earlier))
}

/// The error of a replacement that failed: a storage that keeps its objects (object lock, a
/// retention policy) refuses it, and then the copy can be finished only as it was started.
///
/// `Storage error: {key}: the target holds {what} under this key and it could not be
/// replaced ({e}). Where the storage keeps its objects (object lock, a retention policy), ...`
fn replaced(key: &str, e: &Error, earlier: &Earlier) -> Error {
    let cause = e.to_string();
    let cause = cause.split_once(": ").map_or(cause.as_str(), |(_, r)| r);
    let Earlier(record) = earlier;
    let (what, how) = match record {
        Some(Record {
            recipients: Some(r),
        }) => (
            format!(
                "a copy an earlier run of this copy encrypted to {}",
                r.join(", ")
            ),
            format!(
                "finish the copy as it was started (run it again with {}), then copy it from there to a storage or prefix of its own to encrypt it to other recipients",
                r.iter()
                    .map(|k| format!("--recipient {k}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
        Some(Record { recipients: None }) => (
            "the source's bytes, stored by an earlier run of this copy without --recipient"
                .to_string(),
            "finish the copy as it was started (run it again without --recipient), then copy it from there to a storage or prefix of its own to encrypt it".to_string(),
        ),
        None => (
            "an object that is not the one this copy stores".to_string(),
            "copy the backup to a storage or prefix of its own".to_string(),
        ),
    };
    Error::Storage(format!(
        "{key}: the target holds {what} under this key and it could not be replaced ({cause}). Where the storage keeps its objects (object lock, a retention policy): {how}"
    ))
}
