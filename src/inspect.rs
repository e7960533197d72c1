//! The inspection commands `list`, `describe` and `validate [--deep]` (SPEC.md "Command-line
//! surface", "Integrity verification order on read"). Each returns text for people (a table) or
//! JSON for scripts; `validate` returns a report whose `problems` decide exit code 3.

use crate::error::{Error, Result};
use crate::manifest::{self, Manifest};
use crate::now_ms;
use crate::record::decode_record;
use crate::segment::{sha256_file, SegmentReader};
use crate::spool::SpoolDir;
use crate::storage::Storage;
use crate::units::human_bytes;
use serde::Serialize;
use std::fmt::Write as _;

/// Output format of the inspection commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// One JSON document for scripts.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown format {other}: expected table or json")),
        }
    }
}

/// One backup found by `list`.
#[derive(Debug, Clone, Serialize)]
pub struct BackupListing {
    pub backup_id: String,
    /// `completed`, `running`, `interrupted` ([`status`]) or `damaged` (the manifest cannot be
    /// read; `error` says why).
    pub status: &'static str,
    /// Epoch ms; null when damaged.
    pub created_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub queues: usize,
    pub total_messages: u64,
    pub total_bytes: u64,
    pub total_segments: u64,
    /// Why the manifest cannot be read (with its SPEC.md category prefix), else null.
    pub error: Option<String>,
}

/// What `list` found: every backup, oldest first, damaged ones last.
#[derive(Debug, Clone)]
pub struct BackupList {
    pub location: String,
    pub backups: Vec<BackupListing>,
}

impl BackupList {
    /// True when a manifest could not be read (the command then exits with
    /// [`crate::cli::EXIT_DAMAGED`] after listing every backup).
    pub fn any_damaged(&self) -> bool {
        self.backups.iter().any(|b| b.error.is_some())
    }

    /// The list as a table (damaged manifests with their reason below it) or as JSON.
    pub fn render(&self, format: Format) -> Result<String> {
        if format == Format::Json {
            return to_json(&self.backups);
        }
        if self.backups.is_empty() {
            return Ok(format!("No backups in {}\n", self.location));
        }
        let table: Vec<Vec<String>> = self
            .backups
            .iter()
            .map(|r| {
                vec![
                    r.backup_id.clone(),
                    r.status.to_string(),
                    r.created_at.map_or("-".into(), format_ms),
                    r.queues.to_string(),
                    r.total_messages.to_string(),
                    r.total_segments.to_string(),
                    human_bytes(r.total_bytes),
                ]
            })
            .collect();
        let mut out = render(
            &[
                "BACKUP ID",
                "STATUS",
                "CREATED (UTC)",
                "QUEUES",
                "MESSAGES",
                "SEGMENTS",
                "SIZE",
            ],
            &table,
        );
        for b in &self.backups {
            if let Some(e) = &b.error {
                let _ = writeln!(out, "{}: manifest damaged: {e}", b.backup_id);
            }
        }
        Ok(out)
    }
}

fn read_manifest(storage: &dyn Storage, backup_id: &str) -> Result<Manifest> {
    Manifest::from_json(&storage.get_bytes(&manifest::manifest_key(backup_id))?)
}

/// The state of a backup (SPEC.md "States and transitions"): `completed` when its manifest has
/// `completed_at`; otherwise `running` while the run lock of the backup is live (see
/// [`crate::lock`]: a heartbeat less than 30 s old), else `interrupted`.
///
/// Errors: storage failures reading the lock.
pub fn status(storage: &dyn Storage, m: &Manifest) -> Result<&'static str> {
    if m.completed_at.is_some() {
        return Ok("completed");
    }
    let live = crate::lock::read(storage, &m.backup_id)?.is_some_and(|l| l.is_live(now_ms()));
    Ok(if live { "running" } else { "interrupted" })
}

/// `list`: every backup in the storage, oldest first. A manifest that cannot be parsed is
/// listed as `damaged` with the reason, after the others.
///
/// Errors: storage failures (listing, reading); a damaged manifest is not an error.
pub fn list(storage: &dyn Storage) -> Result<BackupList> {
    let mut rows = Vec::new();
    for id in storage.list_backup_ids()? {
        let mut row = BackupListing {
            backup_id: id.clone(),
            status: "damaged",
            created_at: None,
            completed_at: None,
            queues: 0,
            total_messages: 0,
            total_bytes: 0,
            total_segments: 0,
            error: None,
        };
        match read_manifest(storage, &id) {
            Ok(m) => {
                row.status = status(storage, &m)?;
                row.created_at = Some(m.created_at);
                row.completed_at = m.completed_at;
                row.queues = m.queues.len();
                row.total_messages = m.total_messages;
                row.total_bytes = m.total_bytes;
                row.total_segments = m.total_segments;
            }
            // Listed a moment ago, gone now: not a backup any more.
            Err(Error::Storage(m)) if m.starts_with("Key not found") => {
                log::debug!("backup {id}: manifest gone since it was listed");
                continue;
            }
            Err(e) if is_damage(&e) => {
                report_problem(&manifest::manifest_key(&id), &e);
                row.error = Some(e.to_string());
            }
            Err(e) => return Err(e),
        }
        rows.push(row);
    }
    rows.sort_by(|a, b| {
        (a.created_at.is_none(), a.created_at, &a.backup_id).cmp(&(
            b.created_at.is_none(),
            b.created_at,
            &b.backup_id,
        ))
    });
    Ok(BackupList {
        location: storage.location(),
        backups: rows,
    })
}

/// `describe`: the manifest of one backup, queue by queue.
pub fn describe(storage: &dyn Storage, backup_id: &str, format: Format) -> Result<String> {
    let m = read_manifest(storage, backup_id)?;
    if format == Format::Json {
        return to_json(&m);
    }
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "{k:<20} {v}");
    };
    line(&mut out, "Backup ID:", m.backup_id.clone());
    line(
        &mut out,
        "Status:",
        match status(storage, &m)? {
            "running" => "running (being written; completed_at is null)",
            "interrupted" => "interrupted (completed_at is null)",
            other => other,
        }
        .into(),
    );
    line(&mut out, "Created (UTC):", format_ms(m.created_at));
    line(
        &mut out,
        "Completed (UTC):",
        m.completed_at.map_or("-".into(), format_ms),
    );
    line(
        &mut out,
        "Source cluster:",
        m.source_cluster.clone().unwrap_or_else(|| "-".into()),
    );
    line(
        &mut out,
        "Broker version:",
        m.broker_version.clone().unwrap_or_else(|| "-".into()),
    );
    line(&mut out, "Tool version:", m.backup_tool_version.clone());
    line(
        &mut out,
        "Definitions:",
        m.definitions.as_ref().map_or("not included".into(), |d| {
            format!(
                "{} ({} vhosts, {} queues, {} exchanges, {} users, {})",
                d.key,
                d.vhost_count,
                d.queue_count,
                d.exchange_count,
                d.user_count,
                human_bytes(d.size_bytes)
            )
        }),
    );
    line(
        &mut out,
        "Totals:",
        format!(
            "{} queues, {} messages, {} segments, {}",
            m.queues.len(),
            m.total_messages,
            m.total_segments,
            human_bytes(m.total_bytes)
        ),
    );
    out.push('\n');
    let rows: Vec<Vec<String>> = m
        .queues
        .iter()
        .map(|q| {
            vec![
                q.vhost.clone(),
                q.name.clone(),
                q.queue_type.to_string(),
                q.message_count.to_string(),
                q.segments.len().to_string(),
                human_bytes(q.segments.iter().map(|s| s.size_bytes).sum()),
                q.first_message_timestamp.map_or("-".into(), format_ms),
                q.last_message_timestamp.map_or("-".into(), format_ms),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "VHOST",
            "QUEUE",
            "TYPE",
            "MESSAGES",
            "SEGMENTS",
            "SIZE",
            "FIRST (UTC)",
            "LAST (UTC)",
        ],
        &rows,
    ));
    Ok(out)
}

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
        if self.is_valid() {
            let _ = writeln!(
                out,
                "Backup {} is valid ({depth} check): {} segments{}",
                self.backup_id,
                self.segments_checked,
                if self.deep {
                    format!(", {} records verified", self.records_checked)
                } else {
                    String::new()
                }
            );
        } else {
            let _ = writeln!(
                out,
                "Backup {} is DAMAGED ({depth} check): {} problem(s) in {} segments",
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
    let m = read_manifest(storage, backup_id)?;
    let mut report = ValidationReport {
        backup_id: backup_id.to_string(),
        deep,
        completed: m.completed_at.is_some(),
        status: status(storage, &m)?,
        segments_checked: 0,
        records_checked: 0,
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
        match check_definitions(storage, d, deep) {
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
    let segments: Vec<&manifest::SegmentMetadata> =
        m.queues.iter().flat_map(|q| &q.segments).collect();
    let mut checked = check_segments(storage, &segments, spool.as_ref().map(|d| d.path()));
    // Storage that cannot be read is no proof of damage: the run fails (exit 1).
    if let Some(i) = checked
        .iter()
        .position(|r| matches!(r, Some(Err(e)) if !is_damage(e)))
    {
        if let Some(Err(e)) = checked.swap_remove(i) {
            return Err(e);
        }
    }
    for (s, checked) in segments.iter().zip(checked) {
        report.segments_checked += 1;
        match checked {
            Some(Ok(records)) => report.records_checked += records,
            Some(Err(e)) => problems.push(problem(&s.key, e)),
            None => problems.push(problem(
                &s.key,
                Error::Io("a validation thread stopped before checking it".into()),
            )),
        }
    }
    report.problems = problems;
    Ok(report)
}

/// True for errors that show a damaged or missing object; false for failures to reach the
/// storage (network, permissions), which say nothing about the backup.
fn is_damage(e: &Error) -> bool {
    match e {
        Error::Storage(m) => m.starts_with("Key not found") || m.starts_with("size is"),
        Error::Serialization(_) | Error::Compression(_) | Error::Manifest(_) => true,
        _ => false,
    }
}

fn report_problem(key: &str, e: &Error) {
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

/// Checks `segments` (deep when a spool directory is given) on one thread per core
/// (`std::thread::available_parallelism`), fetching, decompressing and decoding them side by
/// side; the results are in the order of `segments`. After a failure to reach the storage the
/// remaining segments are not fetched (`None`: the run fails with that error).
fn check_segments(
    storage: &dyn Storage,
    segments: &[&manifest::SegmentMetadata],
    spool: Option<&std::path::Path>,
) -> Vec<Option<Result<u64>>> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(segments.len().max(1));
    let next = AtomicUsize::new(0);
    let unreachable = AtomicBool::new(false);
    let results: Vec<std::sync::Mutex<Option<Result<u64>>>> = segments
        .iter()
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    std::thread::scope(|scope| {
        for worker in 0..threads {
            let (next, unreachable, results) = (&next, &unreachable, &results);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(s) = segments.get(i) else { break };
                if unreachable.load(Ordering::Relaxed) {
                    continue;
                }
                let r = match spool {
                    Some(dir) => {
                        check_segment_deep(storage, s, &dir.join(format!("validate-{worker}.rbak")))
                    }
                    None => check_segment_exists(storage, s).map(|()| 0),
                };
                if matches!(&r, Err(e) if !is_damage(e)) {
                    unreachable.store(true, Ordering::Relaxed);
                }
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|slot| slot.into_inner().ok().flatten())
        .collect()
}

/// Fetches one segment and checks CRC32, SHA-256, record count and every record; returns the
/// number of records.
fn check_segment_deep(
    storage: &dyn Storage,
    s: &manifest::SegmentMetadata,
    path: &std::path::Path,
) -> Result<u64> {
    let result = (|| {
        storage.get_to_file(&s.key, path)?;
        let reader = SegmentReader::open(path)?;
        let sha = sha256_file(path)?;
        if sha != s.checksum {
            return Err(Error::Serialization(format!(
                "SHA-256 mismatch: expected {}, got {sha}",
                s.checksum
            )));
        }
        let mut n = 0u64;
        for json in reader.records() {
            decode_record(&json?)?;
            n += 1;
        }
        if n != s.record_count {
            return Err(Error::Serialization(format!(
                "Expected {} records but found {n} (the manifest's count)",
                s.record_count
            )));
        }
        Ok(n)
    })();
    let _ = std::fs::remove_file(path);
    result
}

fn check_definitions(
    storage: &dyn Storage,
    d: &manifest::DefinitionsBackup,
    deep: bool,
) -> Result<()> {
    if !deep {
        return match storage.head(&d.key)? {
            None => Err(Error::Storage(format!("Key not found: {}", d.key))),
            Some(_) => Ok(()),
        };
    }
    let compression = crate::segment::Compression::from_key(&d.key);
    let raw = crate::definitions::decompress(&storage.get_bytes(&d.key)?, compression)?;
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

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(v)
        .map_err(|e| Error::Serialization(format!("output: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// Renders rows under headers with columns padded to their widest cell.
fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                l.push_str(cell);
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// Epoch milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00");
        assert_eq!(format_ms(1_795_000_000_000), "2026-11-18 11:06:40");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29 00:00:00");
    }

    #[test]
    fn renders_aligned_table() {
        let t = render(&["A", "LONG HEADER"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    LONG HEADER\nxyz  1\n");
    }
}
