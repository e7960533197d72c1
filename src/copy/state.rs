//! What a copy stored so far at the target, kept under `{backup_id}/state/`: the only keys
//! that object lock never locks (`crate::repository::storage::object_lock`) and that a
//! retention policy lets a run replace. So the target's `manifest.json` is written once, last,
//! and a rerun still finds what an interrupted run stored (issue 38, item 4):
//!
//! - `{backup_id}/state/copy-progress.json`: the segments stored and verified, rewritten after
//!   each batch of [`super::BATCH`] segments;
//! - `{backup_id}/state/copy-pending.json`: what an encrypting copy is about to store, written
//!   before each upload of a segment or of the definitions export. Every age encryption gives
//!   other bytes: without this record a rerun could not tell an upload of its own that the
//!   progress does not list yet, and would write new bytes over it.
//!
//! Both are removed once the manifest is written. An earlier version of `copy` wrote its
//! progress as an interrupted `manifest.json`; a rerun reads that too.

use crate::error::{Error, Result};
use crate::repository::encryption::Recipients;
use crate::repository::manifest::{self, DefinitionsBackup, Manifest, SegmentMetadata};
use crate::repository::storage::Storage;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Mutex;

/// `{backup_id}/state/copy-progress.json`.
pub fn progress_key(backup_id: &str) -> String {
    format!("{backup_id}/state/copy-progress.json")
}

/// `{backup_id}/state/copy-pending.json`.
pub fn pending_key(backup_id: &str) -> String {
    format!("{backup_id}/state/copy-pending.json")
}

/// The content of either state object.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    /// Segments as the copy's manifest lists them (a key may appear more than once: runs to
    /// other recipients).
    #[serde(default)]
    segments: Vec<SegmentMetadata>,
    /// The definitions export as stored at the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    definitions: Vec<StoredDefinitions>,
}

/// The definitions export as a copy stored it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDefinitions {
    /// The copy's manifest entry (`checksum`: the SHA-256 of the stored bytes).
    #[serde(flatten)]
    pub entry: DefinitionsBackup,
    /// The recipients the copy encrypted it to; absent when it stored the source's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<Vec<String>>,
}

/// What earlier runs of a copy recorded at the target.
#[derive(Debug, Default)]
pub struct Known {
    /// Every record of a segment, by its key at the target.
    pub segments: HashMap<String, Vec<SegmentMetadata>>,
    /// Every record of the definitions export.
    pub definitions: Vec<StoredDefinitions>,
    /// The pending records as read: kept in the pending object until the progress lists them.
    pending: Record,
    /// An earlier run left a record (progress, pending, or an interrupted manifest).
    pub resumed: bool,
    /// `manifest.json` at the target is an earlier version's interrupted manifest, which the
    /// completed one replaces.
    pub interim_manifest: bool,
}

impl Known {
    /// Reads the records of backup `id` at `to`; `interim`: the target's interrupted
    /// `manifest.json`, if it has one.
    ///
    /// Errors: the storage's; `Manifest error: {key}: ...` for a record that does not parse.
    pub fn read(to: &dyn Storage, id: &str, interim: Option<&Manifest>) -> Result<Known> {
        let mut known = Known::default();
        let mut add = |r: Record| {
            for s in r.segments {
                known.segments.entry(s.key.clone()).or_default().push(s);
            }
            known.definitions.extend(r.definitions);
        };
        let mut pending = Record::default();
        for key in [progress_key(id), pending_key(id)] {
            if let Some(r) = read_record(to, &key)? {
                if key == pending_key(id) {
                    pending = r.clone();
                }
                add(r);
                known.resumed = true;
            }
        }
        known.pending = pending;
        if let Some(m) = interim {
            add(Record {
                segments: m.queues.iter().flat_map(|q| q.segments.clone()).collect(),
                definitions: Vec::new(),
            });
            known.resumed = true;
            known.interim_manifest = true;
        }
        Ok(known)
    }
}

fn read_record(to: &dyn Storage, key: &str) -> Result<Option<Record>> {
    match to.get_bytes(key) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::Manifest(format!("{key}: not a copy's record: {e}"))),
        Err(Error::Storage(e)) if e.starts_with("Key not found") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `recorded` (public keys a record lists) names exactly `recipients`.
pub fn same_recipients(recipients: &Recipients, recorded: Option<&[String]>) -> bool {
    recorded.is_some_and(|r| recipients.same_as(r))
}

/// Segment keys in the order first recorded, and their records.
type Done = (Vec<String>, HashMap<String, Vec<SegmentMetadata>>);

/// The state objects of one copy while it runs.
pub struct Journal<'a> {
    to: &'a dyn Storage,
    id: String,
    /// Segments stored: earlier runs' records of keys this run has not reached, then this
    /// run's, by key.
    done: Mutex<Done>,
    /// Written before uploads: earlier runs' pending records, then this run's.
    pending: Mutex<Record>,
}

impl<'a> Journal<'a> {
    /// The journal of backup `id` at `to`, starting from what earlier runs recorded.
    pub fn new(to: &'a dyn Storage, id: &str, known: &Known) -> Journal<'a> {
        let mut keys: Vec<String> = known.segments.keys().cloned().collect();
        keys.sort();
        Journal {
            to,
            id: id.to_string(),
            done: Mutex::new((keys, known.segments.clone())),
            pending: Mutex::new(known.pending.clone()),
        }
    }

    /// Records, before it is uploaded, a segment this run encrypted (its new size and
    /// SHA-256).
    ///
    /// Errors: the storage's.
    pub fn segment_pending(&self, meta: &SegmentMetadata) -> Result<()> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.segments.push(meta.clone());
        self.write(&pending_key(&self.id), &p)
    }

    /// Records, before it is uploaded, the definitions export this run encrypted.
    ///
    /// Errors: the storage's.
    pub fn definitions_pending(&self, d: &StoredDefinitions) -> Result<()> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.definitions.push(d.clone());
        self.write(&pending_key(&self.id), &p)
    }

    /// Records `segments` as stored (this run's records replace earlier ones of their keys)
    /// and writes the progress.
    ///
    /// Errors: the storage's.
    pub fn stored(&self, segments: &[SegmentMetadata]) -> Result<()> {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let (order, by_key) = &mut *done;
        for s in segments {
            if by_key.insert(s.key.clone(), vec![s.clone()]).is_none() {
                order.push(s.key.clone());
            }
        }
        let record = Record {
            segments: order
                .iter()
                .flat_map(|k| by_key.get(k).into_iter().flatten().cloned())
                .collect(),
            definitions: Vec::new(),
        };
        self.write(&progress_key(&self.id), &record)?;
        // What the progress lists now needs no pending record.
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.segments
            .retain(|s| !by_key.get(&s.key).is_some_and(|d| d.contains(s)));
        Ok(())
    }

    fn write(&self, key: &str, r: &Record) -> Result<()> {
        let json =
            serde_json::to_vec(r).map_err(|e| Error::Serialization(format!("{key}: {e}")))?;
        self.to.put_bytes(key, &json)
    }

    /// Removes the state objects once the manifest is written. A storage that refuses the
    /// deletes (append-only credentials) keeps them: one warning
    /// (`crate::repository::storage::append_only`).
    pub fn finish(self) {
        for key in [progress_key(&self.id), pending_key(&self.id)] {
            match self.to.delete(&key) {
                Ok(()) => {}
                Err(Error::Storage(e)) if e.starts_with("Key not found") => {}
                Err(e) => {
                    crate::repository::storage::append_only::skip_delete("copy progress", &key, &e)
                }
            }
        }
    }
}

/// The target's `manifest.json` of backup `id`, if it has one (completed, or an earlier
/// version's interrupted copy).
///
/// Errors: the storage's; `Manifest error:` when it does not parse.
pub fn target_manifest(to: &dyn Storage, id: &str) -> Result<Option<Manifest>> {
    match to.get_bytes(&manifest::manifest_key(id)) {
        Ok(b) => Ok(Some(Manifest::from_json(&b)?)),
        Err(Error::Storage(e)) if e.starts_with("Key not found") => Ok(None),
        Err(e) => Err(e),
    }
}
