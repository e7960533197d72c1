//! `rmq-backup copy`: completed backups copied from one storage to another (restic's `copy`,
//! for a second site or account), every segment verified on the way.
//!
//! Per backup, in this order (the manifest is the truth, ARCHITECTURE.md "Invariants"):
//!
//! 1. The source manifest is read (a sharded backup's parts merged when `manifest.json` is
//!    not written yet); a backup that is not completed is not copied.
//! 2. At the target, a manifest with `completed_at: null` is written first (the backup reads
//!    as `interrupted` there until the copy ends), then rewritten after every batch of
//!    [`BATCH`] segments with the segments stored so far.
//! 3. Each segment is fetched to the spool and checked against the source manifest (SHA-256
//!    of the stored bytes; for a plain RBAK file, or an encrypted one with an identity, its
//!    CRC32 too), then stored at the target: the same bytes, or with `--recipient` the
//!    plaintext (decrypted with `--identity-file` when the source is encrypted) encrypted to
//!    the new recipients, which the copy's manifest records with the new sizes and checksums.
//! 4. The definitions export, then `manifest.json` with `completed_at` set, last.
//!
//! A rerun after an interruption skips each segment that is already at the target and checks
//! out: its size and SHA-256 (fetched and hashed) match what the source manifest says (a
//! same-bytes copy) or what the target's interrupted manifest recorded (a re-encrypted one);
//! anything else is copied again. A completed backup at the target is left alone.
//!
//! What is copied is the backup as a reader sees it: a sharded backup becomes one merged
//! `manifest.json` (`parts` kept); its part manifests and run locks are not copied.

pub mod command;
mod report;

pub use report::{BackupCopy, CopyReport};

use crate::error::{Error, Result};
use crate::repository::encryption::{self, Identities, Recipients};
use crate::repository::manifest::{self, Manifest, QueueBackup, SegmentMetadata};
use crate::repository::segment::{sha256_file, SegmentReader};
use crate::repository::spool::SpoolDir;
use crate::repository::storage::Storage;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Segments copied side by side between two writes of the target's interrupted manifest.
pub const BATCH: usize = 16;

/// What `copy` copies and how.
#[derive(Default)]
pub struct CopyOptions {
    /// The backups to copy; all completed backups of the source when empty.
    pub backup_ids: Vec<String>,
    /// Encrypt the copy to these recipients (re-encrypting an encrypted backup).
    pub recipients: Option<Recipients>,
    /// Decrypt an encrypted source (needed with `recipients`; optional otherwise, when it
    /// adds the CRC32 check of each decrypted segment).
    pub identities: Option<Identities>,
}

/// Byte and segment counters of a run, read by the progress bar.
#[derive(Debug, Default)]
pub struct Progress {
    /// Stored bytes of the source segments of the backups to copy (known once their
    /// manifests are read).
    pub total: AtomicU64,
    /// Stored bytes of the source segments handled (copied or found in place).
    pub bytes: AtomicU64,
    /// Segments handled.
    pub segments: AtomicU64,
}

/// Copies the backups `opts` names (or every completed one) from `from` to `to`.
///
/// A backup that fails (a damaged segment, a storage error) is reported with its error and
/// the others are still copied; the report's `failed()` decides exit code 1.
///
/// Errors: listing the source; a named backup that is not there (`Storage error: Key not
/// found: ...`); `Encryption error:` before anything is copied when `recipients` re-encrypt
/// an encrypted backup that the identities cannot open.
pub fn copy(
    from: &dyn Storage,
    to: &dyn Storage,
    opts: &CopyOptions,
    progress: &Progress,
) -> Result<CopyReport> {
    let ids = if opts.backup_ids.is_empty() {
        from.list_backup_ids()?
    } else {
        opts.backup_ids.clone()
    };
    let mut manifests = Vec::new();
    for id in &ids {
        let m = match Manifest::read(from, id) {
            Ok(m) => m,
            // A listed prefix without a readable manifest is not a backup to copy.
            Err(e) if opts.backup_ids.is_empty() => {
                log::warn!("copy: {id} not copied: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        if opts.recipients.is_some() || opts.identities.is_some() {
            let segs = m.queues.iter().flat_map(|q| &q.segments);
            if opts.recipients.is_some() || is_encrypted(&m) {
                crate::repository::fetch::check_readable(&m, opts.identities.as_ref(), segs, true)?;
            }
        }
        manifests.push(m);
    }
    let total: u64 = manifests
        .iter()
        .filter(|m| m.completed_at.is_some())
        .flat_map(|m| m.queues.iter().flat_map(|q| &q.segments))
        .map(|s| s.size_bytes)
        .sum();
    progress.total.store(total, Ordering::Relaxed);
    let spool = SpoolDir::create("copy")?;
    let mut report = CopyReport {
        from: from.location(),
        to: to.location(),
        backups: Vec::new(),
    };
    for m in manifests {
        let id = m.backup_id.clone();
        if crate::run::signals::requested().is_some() {
            break;
        }
        if m.completed_at.is_none() {
            log::warn!("copy: backup {id} is not completed (interrupted or running): not copied");
            report.backups.push(BackupCopy::new(&id, "not completed"));
            continue;
        }
        let mut row = BackupCopy::new(&id, "copied");
        match copy_backup(from, to, &m, opts, spool.path(), progress, &mut row) {
            Ok(()) => {}
            Err(e) => {
                crate::run::logging::report_error(&e);
                row.status = "failed";
                row.error = Some(e.to_string());
            }
        }
        report.backups.push(row);
    }
    Ok(report)
}

fn is_encrypted(m: &Manifest) -> bool {
    m.encryption.is_some()
        || m.queues
            .iter()
            .flat_map(|q| &q.segments)
            .any(|s| s.encryption.is_some())
}

/// The target's manifest of `id`, if it has one (completed or an interrupted copy).
fn target_manifest(to: &dyn Storage, id: &str) -> Result<Option<Manifest>> {
    match to.get_bytes(&manifest::manifest_key(id)) {
        Ok(b) => Ok(Some(Manifest::from_json(&b)?)),
        Err(Error::Storage(e)) if e.starts_with("Key not found") => Ok(None),
        Err(e) => Err(e),
    }
}

/// The key a source object gets at the target: `.age` added when a plain object is
/// encrypted by the copy.
fn target_key(key: &str, source_encrypted: bool, encrypting: bool) -> String {
    if encrypting && !source_encrypted {
        format!("{key}{}", encryption::EXTENSION)
    } else {
        key.to_string()
    }
}

fn copy_backup(
    from: &dyn Storage,
    to: &dyn Storage,
    m: &Manifest,
    opts: &CopyOptions,
    spool: &Path,
    progress: &Progress,
    row: &mut BackupCopy,
) -> Result<()> {
    let id = &m.backup_id;
    let earlier = target_manifest(to, id)?;
    if let Some(t) = &earlier {
        if t.completed_at.is_some() {
            row.status = "already copied";
            row.segments = t.total_segments;
            row.encryption = t.encryption.as_ref().map(|e| e.recipients.clone());
            let done: u64 = m
                .queues
                .iter()
                .flat_map(|q| &q.segments)
                .map(|s| s.size_bytes)
                .sum();
            progress.bytes.fetch_add(done, Ordering::Relaxed);
            progress
                .segments
                .fetch_add(m.total_segments, Ordering::Relaxed);
            return Ok(());
        }
        row.status = "resumed";
    }
    // What an interrupted copy recorded at the target, by key.
    let recorded: HashMap<String, SegmentMetadata> = earlier
        .iter()
        .flat_map(|t| t.queues.iter().flat_map(|q| q.segments.iter().cloned()))
        .map(|s| (s.key.clone(), s))
        .collect();
    let mut out = m.clone();
    out.completed_at = None;
    out.shard = None;
    if let Some(r) = &opts.recipients {
        out.encryption = Some(r.info());
    }
    row.encryption = out.encryption.as_ref().map(|e| e.recipients.clone());
    let mut copied: Vec<QueueBackup> = Vec::new();
    let write_interim = |queues: &[QueueBackup]| -> Result<()> {
        let mut interim = out.clone();
        interim.queues = queues.to_vec();
        interim.definitions = None;
        interim.recompute_totals();
        to.put_bytes(
            &manifest::manifest_key(id),
            interim.to_json_pretty()?.as_bytes(),
        )
    };
    write_interim(&copied)?;
    for q in &m.queues {
        let mut entry = q.clone();
        entry.segments.clear();
        for batch in q.segments.chunks(BATCH) {
            if let Some(why) = crate::run::signals::stop_reason("copy") {
                return Err(Error::Io(why));
            }
            let done = copy_segments(from, to, batch, &recorded, opts, spool, progress)?;
            for (meta, how) in done {
                match how {
                    Outcome::Copied(bytes) => {
                        row.segments_copied += 1;
                        row.bytes_copied += bytes;
                    }
                    Outcome::InPlace => row.segments_in_place += 1,
                }
                entry.segments.push(meta);
            }
            row.segments += batch.len() as u64;
            // The queue so far: its count is what its copied segments hold.
            let mut partial = entry.clone();
            partial.message_count = partial.segments.iter().map(|s| s.record_count).sum();
            let mut queues = copied.clone();
            queues.push(partial);
            write_interim(&queues)?;
        }
        copied.push(entry);
    }
    if let Some(d) = &m.definitions {
        out.definitions = Some(copy_definitions(from, to, d, opts)?);
    }
    out.queues = copied;
    out.completed_at = m.completed_at;
    out.recompute_totals();
    to.put_bytes(
        &manifest::manifest_key(id),
        out.to_json_pretty()?.as_bytes(),
    )?;
    log::info!(
        "copy: backup {id}: {} segments ({} copied, {} already there), {} copied",
        row.segments,
        row.segments_copied,
        row.segments_in_place,
        crate::run::units::human_bytes(row.bytes_copied)
    );
    Ok(())
}

/// How a segment got to the target.
enum Outcome {
    /// Stored now; the bytes stored.
    Copied(u64),
    /// Already there and verified.
    InPlace,
}

/// Copies `batch` side by side on rayon's pool; the results are in the batch's order. The
/// first error ends the batch (and the backup's copy).
fn copy_segments(
    from: &dyn Storage,
    to: &dyn Storage,
    batch: &[SegmentMetadata],
    recorded: &HashMap<String, SegmentMetadata>,
    opts: &CopyOptions,
    spool: &Path,
    progress: &Progress,
) -> Result<Vec<(SegmentMetadata, Outcome)>> {
    use rayon::prelude::*;
    batch
        .par_iter()
        .map(|s| {
            let worker = rayon::current_thread_index().unwrap_or(0);
            let path = spool.join(format!("copy-{worker}.seg"));
            let r =
                copy_segment(from, to, s, recorded, opts, &path).map_err(|e| with_key(e, &s.key));
            for suffix in ["", ".plain", ".sealed"] {
                let mut p = path.as_os_str().to_owned();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
            progress.bytes.fetch_add(s.size_bytes, Ordering::Relaxed);
            progress.segments.fetch_add(1, Ordering::Relaxed);
            r
        })
        .collect()
}

/// `e` with the segment's key in its message (the checks' messages do not name it).
fn with_key(e: Error, key: &str) -> Error {
    let msg = e.to_string();
    if msg.contains(key) {
        return e;
    }
    let rest = msg.split_once(": ").map_or(msg.as_str(), |(_, r)| r);
    let text = format!("{key}: {rest}");
    match e {
        Error::Serialization(_) => Error::Serialization(text),
        Error::Encryption(_) => Error::Encryption(text),
        Error::Io(_) => Error::Io(text),
        Error::Storage(_) => Error::Storage(text),
        other => other,
    }
}

/// Whether the target holds `key` with `size` bytes whose SHA-256 is `checksum` (fetched
/// to `path` and hashed).
fn in_place(to: &dyn Storage, key: &str, size: u64, checksum: &str, path: &Path) -> Result<bool> {
    if to.head(key)? != Some(size) {
        return Ok(false);
    }
    to.get_to_file(key, path)?;
    let same = sha256_file(path)? == checksum;
    let _ = std::fs::remove_file(path);
    Ok(same)
}

fn copy_segment(
    from: &dyn Storage,
    to: &dyn Storage,
    s: &SegmentMetadata,
    recorded: &HashMap<String, SegmentMetadata>,
    opts: &CopyOptions,
    path: &Path,
) -> Result<(SegmentMetadata, Outcome)> {
    let encrypted = s.encryption.is_some();
    let key = target_key(&s.key, encrypted, opts.recipients.is_some());
    match &opts.recipients {
        None => {
            if in_place(to, &key, s.size_bytes, &s.checksum, path)? {
                return Ok((s.clone(), Outcome::InPlace));
            }
        }
        Some(_) => {
            if let Some(r) = recorded.get(&key) {
                if in_place(to, &key, r.size_bytes, &r.checksum, path)? {
                    return Ok((r.clone(), Outcome::InPlace));
                }
            }
        }
    }
    from.get_to_file(&s.key, path)?;
    let sha = sha256_file(path)?;
    if sha != s.checksum {
        return Err(Error::Serialization(format!(
            "SHA-256 mismatch: expected {}, got {sha}",
            s.checksum
        )));
    }
    // The plaintext RBAK file, CRC32 checked, when it can be had.
    let plain = match (encrypted, &opts.identities) {
        (false, _) => {
            SegmentReader::open(path)?;
            Some(path.to_path_buf())
        }
        (true, Some(keys)) => {
            let plain = suffixed(path, ".plain");
            keys.decrypt_file(path, &plain, &s.key)?;
            SegmentReader::open(&plain)?;
            Some(plain)
        }
        (true, None) => None,
    };
    let Some(recipients) = &opts.recipients else {
        to.put_file(&key, path)?;
        return Ok((s.clone(), Outcome::Copied(s.size_bytes)));
    };
    let plain = plain.ok_or_else(|| encryption::missing_identity(&s.key))?;
    let sealed = suffixed(path, ".sealed");
    let _ = std::fs::remove_file(&sealed);
    let (size, checksum) = recipients.encrypt_file(&plain, &sealed)?;
    to.put_file(&key, &sealed)?;
    let meta = SegmentMetadata {
        key,
        size_bytes: size,
        checksum,
        encryption: Some(encryption::SCHEME.to_string()),
        recipients: Some(recipients.public_keys()),
        ..s.clone()
    };
    Ok((meta, Outcome::Copied(size)))
}

fn suffixed(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Copies the definitions export (re-encrypted with `recipients`); checks that it
/// decompresses to the size the manifest records when it can be read.
fn copy_definitions(
    from: &dyn Storage,
    to: &dyn Storage,
    d: &manifest::DefinitionsBackup,
    opts: &CopyOptions,
) -> Result<manifest::DefinitionsBackup> {
    let encrypted = d.encryption.is_some();
    let stored = from.get_bytes(&d.key)?;
    let readable = !encrypted || opts.identities.is_some();
    if readable {
        let raw = crate::broker::definitions::read_stored(from, d, opts.identities.as_ref())?;
        if raw.len() as u64 != d.size_bytes {
            return Err(Error::Manifest(format!(
                "{}: definitions are {} bytes but the manifest says {}",
                d.key,
                raw.len(),
                d.size_bytes
            )));
        }
    }
    let Some(recipients) = &opts.recipients else {
        to.put_bytes(&d.key, &stored)?;
        return Ok(d.clone());
    };
    let compressed = match (&d.encryption, &opts.identities) {
        (None, _) => stored,
        (Some(_), Some(keys)) => keys.decrypt_bytes(&stored, &d.key)?,
        (Some(_), None) => return Err(encryption::missing_identity(&d.key)),
    };
    let key = target_key(&d.key, encrypted, true);
    to.put_bytes(&key, &recipients.encrypt_bytes(&compressed)?)?;
    Ok(manifest::DefinitionsBackup {
        key,
        encryption: Some(encryption::SCHEME.to_string()),
        ..d.clone()
    })
}

#[cfg(test)]
mod tests;
