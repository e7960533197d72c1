//! `validate [--deep]` (SPEC.md "Command-line interface"): the manifest agrees with itself,
//! every object it lists exists with its size, and with `--deep` every segment checks out
//! (CRC32, SHA-256, records), one thread per core.
//!
//! Gaps are damage too: a queue's segments are numbered without a hole (they come from one
//! run; a stream's may skip the numbers of a killed run's unrecorded segments), and with
//! `--deep` a stream's records carry rising offsets and each segment follows the one before
//! (`manifest::stream_segment_follows`: offsets no message takes are not damage).

use super::subset::Subset;
use super::{read_manifest, render, status, to_json, Format};
use crate::error::{Error, Result};
use crate::repository::encryption::Identities;
use crate::repository::fetch::{fetch_segment, Check, FetchedSegment};
use crate::repository::manifest;
use crate::repository::spool::SpoolDir;
use crate::repository::storage::Storage;
use serde::Serialize;
use std::fmt::Write as _;

/// One damaged or missing object found by `validate`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// Storage key of the object (or the manifest's key for manifest inconsistencies).
    pub key: String,
    /// The error, with its SPEC.md category prefix.
    pub error: String,
}

/// What `validate` checked and found.
#[derive(Debug, Clone, Serialize)]
pub struct ValidationReport {
    pub backup_id: String,
    pub deep: bool,
    pub completed: bool,
    /// `completed`, `running` or `interrupted` ([`status`]).
    pub status: &'static str,
    pub segments_checked: u64,
    pub records_checked: u64,
    /// `--read-data-subset` as given (`2/7`, `10%`, `500 MiB`); null for a full check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_data_subset: Option<String>,
    /// Segments fetched and read (every one with `--deep` and no subset; 0 when shallow).
    pub segments_read: u64,
    /// Stored bytes of the segments read.
    pub bytes_read: u64,
    /// With `--read-data-subset`: the keys of the segments read, in manifest order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub segments_read_keys: Vec<String>,
    pub problems: Vec<Problem>,
}

impl ValidationReport {
    /// True when nothing is damaged or missing.
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report as a table or JSON.
    pub fn render(&self, format: Format) -> Result<String> {
        if format == Format::Json {
            return to_json(self);
        }
        let mut out = String::new();
        let depth = if self.deep { "deep" } else { "shallow" };
        let depth = match &self.read_data_subset {
            Some(s) => format!("{depth} check of subset {s}"),
            None => format!("{depth} check"),
        };
        if self.is_valid() {
            let _ = writeln!(
                out,
                "Backup {} is valid ({depth}): {} segments{}",
                self.backup_id,
                self.segments_checked,
                if self.deep && self.read_data_subset.is_some() {
                    format!(
                        ", {} of them read ({}), {} records verified",
                        self.segments_read,
                        crate::run::units::human_bytes(self.bytes_read),
                        self.records_checked
                    )
                } else if self.deep {
                    format!(", {} records verified", self.records_checked)
                } else {
                    String::new()
                }
            );
        } else {
            let _ = writeln!(
                out,
                "Backup {} is DAMAGED ({depth}): {} problem(s) in {} segments",
                self.backup_id,
                self.problems.len(),
                self.segments_checked
            );
            let rows: Vec<Vec<String>> = self
                .problems
                .iter()
                .map(|p| vec![p.key.clone(), p.error.clone()])
                .collect();
            out.push_str(&render(&["KEY", "PROBLEM"], &rows));
        }
        if !self.completed {
            let _ = writeln!(
                out,
                "Note: the backup is {} (completed_at is null).",
                self.status
            );
        }
        Ok(out)
    }
}

/// `validate`: the manifest parses and agrees with itself; every segment and the definitions
/// file exist with their recorded sizes. With `deep`, each segment is also fetched and checked
/// in SPEC.md's order: CRC32 of header + payload, then SHA-256 of the whole file against the
/// manifest, then every record decoded and counted.
///
/// Errors: only when the manifest cannot be read (`Storage error: Key not found: ...`,
/// `Manifest error: ...`); damage is reported in `problems`.
pub fn validate(storage: &dyn Storage, backup_id: &str, deep: bool) -> Result<ValidationReport> {
    validate_with_keys(storage, backup_id, deep, None)
}

/// [`validate`] with the identities that decrypt an encrypted backup's segments and
/// definitions (`--identity-file`, `RMQ_BACKUP_AGE_IDENTITY`). A shallow check needs none:
/// the manifest's sizes are the stored (encrypted) objects'.
///
/// Errors: as [`validate`]; with `deep`, `Encryption error:` before anything is fetched when
/// the backup is encrypted and `keys` are missing, do not open every segment and the
/// definitions, or one of them is stored in clear (`crate::repository::fetch::check_readable`). A stored
/// segment that does not decrypt with a right key, or is no age file, is damage (a problem),
/// not an error.
pub fn validate_with_keys(
    storage: &dyn Storage,
    backup_id: &str,
    deep: bool,
    keys: Option<&Identities>,
) -> Result<ValidationReport> {
    validate_subset(storage, backup_id, deep, keys, None)
}

/// [`validate_with_keys`] that reads only `subset` of the segments when `deep`
/// (`--read-data-subset`, [`Subset`]); the others are checked shallowly. The definitions are
/// read whole either way. Counts what it read and what failed in the
/// `broker_backup_validate_*` metrics.
///
/// Errors: as [`validate_with_keys`]; the identity is checked against the selected segments
/// only; `I/O error:` when a random subset cannot be drawn.
pub fn validate_subset(
    storage: &dyn Storage,
    backup_id: &str,
    deep: bool,
    keys: Option<&Identities>,
    subset: Option<&Subset>,
) -> Result<ValidationReport> {
    let m = read_manifest(storage, backup_id)?;
    let all: Vec<&manifest::SegmentMetadata> = m.queues.iter().flat_map(|q| &q.segments).collect();
    let read: Vec<bool> = match (deep, subset) {
        (false, _) => vec![false; all.len()],
        (true, None) => vec![true; all.len()],
        (true, Some(s)) => {
            let sizes: Vec<(&str, u64)> =
                all.iter().map(|s| (s.key.as_str(), s.size_bytes)).collect();
            s.select(&sizes)?
        }
    };
    if deep {
        // The segments read and the definitions: the identity opens each, none is in clear.
        crate::repository::fetch::check_readable(
            &m,
            keys,
            all.iter().zip(&read).filter(|(_, r)| **r).map(|(s, _)| *s),
            true,
        )?;
    }
    let mut report = ValidationReport {
        backup_id: backup_id.to_string(),
        deep,
        completed: m.completed_at.is_some(),
        status: status(storage, &m)?,
        segments_checked: 0,
        records_checked: 0,
        read_data_subset: subset.filter(|_| deep).map(|s| s.to_string()),
        segments_read: 0,
        bytes_read: 0,
        segments_read_keys: Vec::new(),
        problems: Vec::new(),
    };
    let manifest_key = manifest::manifest_key(backup_id);
    let problem = |key: &str, e: Error| {
        report_problem(key, &e);
        Problem {
            key: key.to_string(),
            error: e.to_string(),
        }
    };
    let mut problems = Vec::new();
    let sum_messages: u64 = m.queues.iter().map(|q| q.message_count).sum();
    let sum_segments: u64 = m.queues.iter().map(|q| q.segments.len() as u64).sum();
    let sum_bytes: u64 = m
        .queues
        .iter()
        .flat_map(|q| &q.segments)
        .map(|s| s.size_bytes)
        .sum();
    if (sum_messages, sum_segments, sum_bytes)
        != (m.total_messages, m.total_segments, m.total_bytes)
    {
        problems.push(problem(
            &manifest_key,
            Error::Manifest(format!(
                "totals disagree with the queues: {} messages, {} segments, {} bytes listed; {sum_messages}, {sum_segments}, {sum_bytes} found",
                m.total_messages, m.total_segments, m.total_bytes
            )),
        ));
    }
    if let Some(d) = &m.definitions {
        match check_definitions(storage, d, deep, keys) {
            Err(e) if !is_damage(&e) => return Err(e),
            Err(e) => problems.push(problem(&d.key, e)),
            Ok(()) => {}
        }
    }
    let spool = if deep {
        Some(SpoolDir::create(&format!("{backup_id}-validate"))?)
    } else {
        None
    };
    for q in &m.queues {
        let listed: u64 = q.segments.iter().map(|s| s.record_count).sum();
        if listed != q.message_count {
            problems.push(problem(
                &manifest_key,
                Error::Manifest(format!(
                    "queue {} in vhost {} lists {} messages but its segments hold {listed}",
                    q.name, q.vhost, q.message_count
                )),
            ));
        }
    }
    for q in &m.queues {
        if let Some(gap) = sequence_gap(q) {
            problems.push(problem(&manifest_key, gap));
        }
    }
    let metrics = crate::metrics::global();
    for (s, _) in all.iter().zip(&read).filter(|(_, r)| **r) {
        report.segments_read += 1;
        report.bytes_read += s.size_bytes;
        if subset.is_some() {
            report.segments_read_keys.push(s.key.clone());
        }
    }
    let mut checked = check_segments(storage, &all, &read, spool.as_ref().map(|d| d.path()), keys);
    // Storage that cannot be read is no proof of damage: the run fails (exit 1).
    if let Some(i) = checked
        .iter()
        .position(|r| matches!(r, Some(Err(e)) if !is_damage(e)))
    {
        if let Some(Err(e)) = checked.swap_remove(i) {
            return Err(e);
        }
    }
    metrics.validate_segments_read.add(report.segments_read);
    metrics.validate_bytes_read.add(report.bytes_read);
    metrics
        .validate_segments_failed
        .add(checked.iter().filter(|r| matches!(r, Some(Err(_)))).count() as u64);
    let mut checked = checked.into_iter();
    let mut was_read = read.iter().copied();
    for q in &m.queues {
        let stream = q.queue_type == crate::broker::QueueType::Stream;
        // The segment before: its number, the tag of its last record (a stream's offset), key.
        let mut last_tag: Option<(u64, u64, &str)> = None;
        for s in &q.segments {
            report.segments_checked += 1;
            let was_read = was_read.next().unwrap_or(false);
            match checked.next().flatten() {
                Some(Ok(c)) => {
                    report.records_checked += c.records;
                    if !was_read {
                        // A shallow check of a segment outside the subset: the next one
                        // read has no segment before it to follow.
                        last_tag = None;
                    }
                    if !stream || !was_read {
                        continue;
                    }
                    if let Some(e) = c.gap {
                        problems.push(problem(&s.key, e));
                    }
                    if let (Some((seq, last, key)), Some((first, _))) = (last_tag, c.tags) {
                        if !manifest::stream_segment_follows((seq, last), (s.sequence, first)) {
                            problems.push(problem(
                                &s.key,
                                Error::Serialization(format!(
                                    "stream {} in vhost {}: offsets after {last} (the last of {key}) are missing: this segment starts at {first}",
                                    q.name, q.vhost
                                )),
                            ));
                        }
                    }
                    if let Some((_, last)) = c.tags {
                        last_tag = Some((s.sequence, last, &s.key));
                    }
                }
                Some(Err(e)) => problems.push(problem(&s.key, e)),
                None => problems.push(problem(
                    &s.key,
                    Error::Io("a validation thread stopped before checking it".into()),
                )),
            }
        }
    }
    report.problems = problems;
    Ok(report)
}

/// A queue whose segment numbers go backwards, or (for a queue, not a stream) skip one.
fn sequence_gap(q: &manifest::QueueBackup) -> Option<Error> {
    let stream = q.queue_type == crate::broker::QueueType::Stream;
    q.segments.windows(2).find_map(|w| {
        let (a, b) = (w[0].sequence, w[1].sequence);
        let bad = b <= a || (!stream && b != a + 1);
        bad.then(|| {
            Error::Manifest(format!(
                "queue {} in vhost {}: segment {b} follows segment {a}{}",
                q.name,
                q.vhost,
                if b > a + 1 {
                    format!(": segments {}..{} are missing", a + 1, b - 1)
                } else {
                    String::new()
                }
            ))
        })
    })
}

/// What a deep check of one segment found.
struct SegmentCheck {
    records: u64,
    /// Delivery tags of its first and last records (a stream's offsets).
    tags: Option<(u64, u64)>,
    /// Records whose tags do not rise (meaningful for streams).
    gap: Option<Error>,
}

/// True for errors that show a damaged or missing object; false for failures to reach the
/// storage (network, permissions), which say nothing about the backup.
pub(super) fn is_damage(e: &Error) -> bool {
    match e {
        Error::Storage(m) => m.starts_with("Key not found") || m.starts_with("size is"),
        Error::Serialization(_) | Error::Compression(_) | Error::Manifest(_) => true,
        // Checked before: the identity is one of the recipients, so a file that does not
        // decrypt was altered.
        Error::Encryption(m) => {
            m.contains("damaged or was altered") || m.contains("was replaced or altered")
        }
        _ => false,
    }
}

pub(super) fn report_problem(key: &str, e: &Error) {
    log::warn!("{key}: {e}");
}

fn check_segment_exists(storage: &dyn Storage, s: &manifest::SegmentMetadata) -> Result<()> {
    match storage.head(&s.key)? {
        None => Err(Error::Storage(format!("Key not found: {}", s.key))),
        Some(size) if size != s.size_bytes => Err(Error::Storage(format!(
            "size is {size} bytes but the manifest says {}",
            s.size_bytes
        ))),
        Some(_) => Ok(()),
    }
}

/// Checks `segments` (deep when a spool directory is given) on rayon's pool (one thread per
/// core, shared by the whole process: DESIGN.md "a rayon pool for CPU work"), fetching,
/// decompressing and decoding them side by side; the results are in the order of `segments`.
/// After a failure to reach the storage the remaining segments are not fetched (`None`: the
/// run fails with that error).
fn check_segments(
    storage: &dyn Storage,
    segments: &[&manifest::SegmentMetadata],
    read: &[bool],
    spool: Option<&std::path::Path>,
    keys: Option<&Identities>,
) -> Vec<Option<Result<SegmentCheck>>> {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    let unreachable = AtomicBool::new(false);
    segments
        .par_iter()
        .zip(read)
        .map(|(s, read)| {
            if unreachable.load(Ordering::Relaxed) {
                return None;
            }
            let r = match spool.filter(|_| *read) {
                Some(dir) => {
                    // One spool file per pool thread: each checks one segment at a time.
                    let worker = rayon::current_thread_index().unwrap_or(0);
                    check_segment_deep(
                        storage,
                        s,
                        &dir.join(format!("validate-{worker}.rbak")),
                        keys,
                    )
                }
                None => check_segment_exists(storage, s).map(|()| SegmentCheck {
                    records: 0,
                    tags: None,
                    gap: None,
                }),
            };
            if matches!(&r, Err(e) if !is_damage(e)) {
                unreachable.store(true, Ordering::Relaxed);
            }
            Some(r)
        })
        .collect()
}

/// Fetches one segment and checks CRC32, SHA-256, record count and every record, the
/// checksums in the pass that decodes the records ([`Check::AsRead`]).
fn check_segment_deep(
    storage: &dyn Storage,
    s: &manifest::SegmentMetadata,
    path: &std::path::Path,
    keys: Option<&Identities>,
) -> Result<SegmentCheck> {
    (|| {
        // `_files`: removed when this segment is checked.
        let FetchedSegment {
            reader,
            files: _files,
        } = fetch_segment(storage, path, s, keys, Check::AsRead)?;
        let mut c = SegmentCheck {
            records: 0,
            tags: None,
            gap: None,
        };
        let mut records = reader.records();
        while let Some(json) = records.next() {
            // A record that does not decode is reported as the damage of its segment when
            // the segment's checksums fail (the rest of the file is read for them).
            let record = match json?.into_record() {
                Ok(record) => record,
                Err(e) => return Err(records.fail(e)),
            };
            // An AMQP 1.0 record's body must decode as the sections of a message.
            if record.message_format.is_some() {
                if let Err(e) = crate::broker::amqp10::message::sections(&record.body) {
                    return Err(records.fail(Error::Serialization(format!(
                        "record {} (an amqp-1.0 message): {e}",
                        c.records + 1
                    ))));
                }
            }
            let tag = record.delivery_tag;
            c.records += 1;
            c.tags = Some(match c.tags {
                None => (tag, tag),
                Some((first, last)) => {
                    // A stream's offsets may skip what no message takes; never go back.
                    if c.gap.is_none() && tag <= last {
                        c.gap = Some(Error::Serialization(format!(
                            "record {} has offset {tag} after offset {last}: offsets repeat or go back",
                            c.records
                        )));
                    }
                    (first, tag)
                }
            });
        }
        if c.records != s.record_count {
            return Err(Error::Serialization(format!(
                "Expected {} records but found {} (the manifest's count)",
                s.record_count, c.records
            )));
        }
        Ok(c)
    })()
}

fn check_definitions(
    storage: &dyn Storage,
    d: &manifest::DefinitionsBackup,
    deep: bool,
    keys: Option<&Identities>,
) -> Result<()> {
    if !deep {
        return match storage.head(&d.key)? {
            None => Err(Error::Storage(format!("Key not found: {}", d.key))),
            Some(_) => Ok(()),
        };
    }
    let raw = crate::broker::definitions::read_stored(storage, d, keys)?;
    serde_json::from_slice::<serde_json::Value>(&raw)
        .map_err(|e| Error::Serialization(format!("definitions file is not JSON: {e}")))?;
    if raw.len() as u64 != d.size_bytes {
        return Err(Error::Manifest(format!(
            "definitions are {} bytes but the manifest says {}",
            raw.len(),
            d.size_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::QueueType;

    fn queue(kind: QueueType, sequences: &[u64]) -> manifest::QueueBackup {
        let segments = sequences
            .iter()
            .map(|&sequence| {
                manifest::SegmentMetadata::example(
                    format!("b/queues/v/q/segment-{sequence:04}.zst"),
                    sequence,
                    1,
                )
            })
            .collect();
        manifest::QueueBackup::from_segments("v", "q", kind, segments)
    }

    #[test]
    fn holes_in_segment_numbers_are_found() {
        assert!(sequence_gap(&queue(QueueType::Classic, &[1, 2, 3])).is_none());
        assert!(sequence_gap(&queue(QueueType::Quorum, &[4, 5])).is_none());
        let e = sequence_gap(&queue(QueueType::Classic, &[1, 2, 5])).unwrap();
        assert_eq!(
            e.to_string(),
            "Manifest error: queue q in vhost v: segment 5 follows segment 2: segments 3..4 are missing"
        );
        // A stream may skip the numbers of a killed run's segments; never go back.
        assert!(sequence_gap(&queue(QueueType::Stream, &[1, 2, 5])).is_none());
        let e = sequence_gap(&queue(QueueType::Stream, &[1, 3, 3])).unwrap();
        assert!(
            e.to_string().ends_with("segment 3 follows segment 3"),
            "{e}"
        );
    }
}
