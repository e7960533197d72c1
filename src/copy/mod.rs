//! `rmq-backup copy`: completed backups copied from one storage to another (restic's `copy`,
//! for a second site or account), every segment verified on the way.
//!
//! Per backup, in this order (the manifest is the truth, ARCHITECTURE.md "Invariants"):
//!
//! 1. The source manifest is read (a sharded backup's parts merged when `manifest.json` is
//!    not written yet); a backup that is not completed is not copied.
//! 2. Each segment is fetched to the spool and checked against the source manifest (SHA-256
//!    of the stored bytes; for a plain RBAK file, or an encrypted one with an identity, its
//!    CRC32 too), then stored at the target: the same bytes, or with `--recipient` the
//!    plaintext (decrypted with `--identity-file` when the source is encrypted) encrypted to
//!    the new recipients, which the copy's manifest records with the new sizes and checksums.
//!    After every batch of [`BATCH`] segments the progress is written under
//!    `{backup_id}/state/` ([`state`]), never into `manifest.json`.
//! 3. The definitions export (checked against its SHA-256 when the manifest records one),
//!    then `manifest.json`, written once, last (create-only).
//!
//! Each object outside `state/` is written once (issue 38, item 4: a target that keeps its
//! objects, with object lock or a retention policy, refuses a second write): created only
//! where no object is, and an encrypted one recorded in `state/` before its upload, so a
//! rerun recognises it by size and SHA-256 instead of encrypting it again.
//!
//! A rerun after an interruption leaves each object that is already at the target and is
//! what this run stores: the source's bytes (size and SHA-256 of the source manifest), or,
//! with `--recipient`, an object an earlier run recorded as encrypted to exactly these
//! recipients. Anything else is copied again and replaces what is there; an object stored
//! otherwise by an earlier run (other recipients: a key rotated between the runs) is replaced
//! first, so that on a target that refuses the replacement the copy stops before writing
//! anything, with an error that says how to finish it (issue 38, item 2). A completed backup
//! at the target is left alone.
//!
//! What is copied is the backup as a reader sees it: a sharded backup becomes one merged
//! `manifest.json` (`parts` kept); its part manifests and run locks are not copied.

pub mod command;
mod report;
mod segment;
pub mod state;

pub use report::{BackupCopy, CopyReport};

use crate::error::{Error, Result};
use crate::repository::encryption::{self, Identities, Recipients};
use crate::repository::manifest::{
    self, DefinitionsBackup, Manifest, QueueBackup, SegmentMetadata,
};
use crate::repository::spool::SpoolDir;
use crate::repository::storage::{Conditional, Storage};
use segment::{stores, suffixed, target_key, Earlier, Outcome};
use state::{Journal, Known, StoredDefinitions};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Segments copied side by side between two writes of the copy's progress
/// ([`state::progress_key`]).
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
    let earlier = state::target_manifest(to, id)?;
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
    }
    let known = Known::read(to, id, earlier.as_ref())?;
    if known.resumed {
        row.status = "resumed";
    }
    let journal = Journal::new(to, id, &known);
    let mut out = m.clone();
    out.completed_at = None;
    out.shard = None;
    if let Some(r) = &opts.recipients {
        out.encryption = Some(r.info());
    }
    row.encryption = out.encryption.as_ref().map(|e| e.recipients.clone());
    let run = Run {
        from,
        to,
        opts,
        spool,
        progress,
        known: &known,
        journal: &journal,
        early: Mutex::new(HashMap::new()),
    };
    run.replace_first(m)?;
    let mut copied: Vec<QueueBackup> = Vec::new();
    for q in &m.queues {
        let mut entry = q.clone();
        entry.segments.clear();
        for batch in q.segments.chunks(BATCH) {
            if let Some(why) = crate::run::signals::stop_reason("copy") {
                return Err(Error::Io(why));
            }
            let done = run.copy_segments(batch)?;
            let metas: Vec<SegmentMetadata> = done.iter().map(|(meta, _)| meta.clone()).collect();
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
            journal.stored(&metas)?;
        }
        copied.push(entry);
    }
    if let Some(d) = &m.definitions {
        out.definitions = Some(run.copy_definitions(d)?);
    }
    if row.segments_in_place > 0 {
        // What an earlier run stored, found without its record (a same-bytes copy killed
        // before its first progress).
        row.status = "resumed";
    }
    out.queues = copied;
    out.completed_at = m.completed_at;
    out.recompute_totals();
    // Written once, last: the copy is a backup at the target from here on.
    let key = manifest::manifest_key(id);
    let json = out.to_json_pretty()?;
    if known.interim_manifest {
        to.put_bytes(&key, json.as_bytes())?;
    } else if to.put_bytes_new(&key, json.as_bytes())? == Conditional::Refused {
        return Err(Error::Storage(format!(
            "{key} was written at the target while this copy ran (another copy of backup {id}?): this copy does not replace it"
        )));
    }
    journal.finish();
    log::info!(
        "copy: backup {id}: {} segments ({} copied, {} already there), {} copied",
        row.segments,
        row.segments_copied,
        row.segments_in_place,
        crate::run::units::human_bytes(row.bytes_copied)
    );
    Ok(())
}

/// One backup's copy: what its segments and definitions need.
struct Run<'a> {
    from: &'a dyn Storage,
    to: &'a dyn Storage,
    opts: &'a CopyOptions,
    spool: &'a Path,
    progress: &'a Progress,
    known: &'a Known,
    journal: &'a Journal<'a>,
    /// Segments copied by [`Run::replace_first`], by source key.
    early: Mutex<HashMap<String, (SegmentMetadata, Outcome)>>,
}

impl Run<'_> {
    /// The records of earlier runs under the target key of the source segment `s`.
    fn known(&self, s: &SegmentMetadata) -> &[SegmentMetadata] {
        let key = target_key(
            &s.key,
            s.encryption.is_some(),
            self.opts.recipients.is_some(),
        );
        self.known.segments.get(&key).map_or(&[], |v| &v[..])
    }

    /// When an earlier run stored an object otherwise than this run stores it (other
    /// recipients, or with and without `--recipient`), that object is replaced first, before
    /// anything new is written: a storage that keeps its objects refuses it, and the copy
    /// stops with nothing of this run's in the way of finishing it as it was started.
    ///
    /// Errors: those of the copy of that object.
    fn replace_first(&self, m: &Manifest) -> Result<()> {
        let other = m.queues.iter().flat_map(|q| &q.segments).find(|s| {
            let known = self.known(s);
            !known.is_empty() && !known.iter().any(|k| stores(self.opts, s, k))
        });
        if let Some(s) = other {
            let path = self.spool.join("copy-first.seg");
            let r = self.copy_one(s, &path)?;
            self.early
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(s.key.clone(), r);
            return Ok(());
        }
        if let Some(d) = &m.definitions {
            let stores_it = |k: &StoredDefinitions| match &self.opts.recipients {
                None => k.recipients.is_none(),
                Some(r) => state::same_recipients(r, k.recipients.as_deref()),
            };
            if !self.known.definitions.is_empty() && !self.known.definitions.iter().any(stores_it) {
                self.copy_definitions(d)?;
            }
        }
        Ok(())
    }

    /// Copies `s` through the spool file `path` (and the files beside it, removed after).
    fn copy_one(&self, s: &SegmentMetadata, path: &Path) -> Result<(SegmentMetadata, Outcome)> {
        let r = segment::copy_segment(
            self.from,
            self.to,
            s,
            self.known(s),
            self.opts,
            path,
            self.journal,
        )
        .map_err(|e| with_key(e, &s.key));
        for suffix in ["", ".plain", ".sealed"] {
            let _ = std::fs::remove_file(suffixed(path, suffix));
        }
        r
    }

    /// Copies `batch` side by side on rayon's pool; the results are in the batch's order.
    /// The first error ends the batch (and the backup's copy).
    fn copy_segments(&self, batch: &[SegmentMetadata]) -> Result<Vec<(SegmentMetadata, Outcome)>> {
        use rayon::prelude::*;
        batch
            .par_iter()
            .map(|s| {
                let early = self
                    .early
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&s.key);
                let r = match early {
                    Some(done) => Ok(done),
                    None => {
                        let worker = rayon::current_thread_index().unwrap_or(0);
                        self.copy_one(s, &self.spool.join(format!("copy-{worker}.seg")))
                    }
                };
                self.progress
                    .bytes
                    .fetch_add(s.size_bytes, Ordering::Relaxed);
                self.progress.segments.fetch_add(1, Ordering::Relaxed);
                r
            })
            .collect()
    }

    /// Copies the definitions export (re-encrypted with `recipients`): its stored bytes are
    /// checked against the manifest's SHA-256 (when it records one; with or without an
    /// identity), and, when they can be read, that they decompress to the size the manifest
    /// records. Left alone when the target holds what this run stores; an encrypted one is
    /// recorded in the journal before its upload. The copy's entry records the SHA-256 of what
    /// it stores.
    fn copy_definitions(&self, d: &DefinitionsBackup) -> Result<DefinitionsBackup> {
        use crate::broker::definitions::{check_stored, decode_stored, sha256_hex};
        let (from, to, opts) = (self.from, self.to, self.opts);
        let encrypted = d.encryption.is_some();
        let stored = from.get_bytes(&d.key)?;
        check_stored(d, &stored)?;
        if !encrypted || opts.identities.is_some() {
            let raw = decode_stored(d, &stored, opts.identities.as_ref())?;
            if raw.len() as u64 != d.size_bytes {
                return Err(Error::Manifest(format!(
                    "{}: definitions are {} bytes but the manifest says {}",
                    d.key,
                    raw.len(),
                    d.size_bytes
                )));
            }
        }
        let key = target_key(&d.key, encrypted, opts.recipients.is_some());
        // What the target holds under the key: this run's object, or another.
        let there = match to.head(&key)? {
            None => None,
            Some(_) => Some(sha256_hex(&to.get_bytes(&key)?)),
        };
        let source_sha = sha256_hex(&stored);
        let Some(recipients) = &opts.recipients else {
            let entry = DefinitionsBackup {
                checksum: Some(source_sha.clone()),
                ..d.clone()
            };
            let earlier = match there {
                None => None,
                Some(sha) if sha == source_sha => return Ok(entry),
                Some(sha) => Some(self.earlier_definitions(&sha)),
            };
            segment::store_bytes(to, &key, &stored, earlier)?;
            return Ok(entry);
        };
        let mut earlier = None;
        if let Some(sha) = there {
            let mine = self.known.definitions.iter().find(|k| {
                k.entry.checksum.as_deref() == Some(sha.as_str())
                    && state::same_recipients(recipients, k.recipients.as_deref())
            });
            if let Some(k) = mine {
                return Ok(k.entry.clone());
            }
            earlier = Some(self.earlier_definitions(&sha));
        }
        let compressed = match (&d.encryption, &opts.identities) {
            (None, _) => stored,
            (Some(_), Some(keys)) => keys.decrypt_bytes(&stored, &d.key)?,
            (Some(_), None) => return Err(encryption::missing_identity(&d.key)),
        };
        let sealed = recipients.encrypt_bytes(&compressed)?;
        let entry = DefinitionsBackup {
            key: key.clone(),
            encryption: Some(encryption::SCHEME.to_string()),
            checksum: Some(sha256_hex(&sealed)),
            ..d.clone()
        };
        self.journal.definitions_pending(&StoredDefinitions {
            entry: entry.clone(),
            recipients: Some(recipients.public_keys()),
        })?;
        segment::store_bytes(to, &key, &sealed, earlier)?;
        Ok(entry)
    }

    /// What the records say of the definitions export stored with SHA-256 `sha`.
    fn earlier_definitions(&self, sha: &str) -> Earlier {
        Earlier(
            self.known
                .definitions
                .iter()
                .find(|k| k.entry.checksum.as_deref() == Some(sha))
                .map(|k| segment::Record {
                    recipients: k.recipients.clone(),
                }),
        )
    }
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

#[cfg(test)]
mod tests;
