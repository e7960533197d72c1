//! The inspection commands `list`, `describe`, `validate [--deep]` and `cat` (`cat.rs`) (SPEC.md "Command-line
//! surface", "Integrity verification order on read"). Each returns text for people (a table) or
//! JSON for scripts; `validate` returns a report whose `problems` decide exit code 3.

use crate::error::{Error, Result};
use crate::now_ms;
use crate::repository::manifest::{self, Manifest};
use crate::repository::storage::Storage;
use crate::run::units::{format_ms, human_bytes, table as render};
use serde::Serialize;
use std::fmt::Write as _;

pub mod cat;
pub mod cat_amqp10;
mod cat_json;
pub mod subset;
mod validate;
pub use subset::Subset;
use validate::{is_damage, report_problem};
pub use validate::{validate, validate_subset, validate_with_keys, Problem, ValidationReport};

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
    Manifest::read(storage, backup_id)
}

/// The state of a backup (SPEC.md "States and transitions"): `completed` when its manifest has
/// `completed_at`; otherwise `running` while the run lock of the backup (or of one of its
/// parts, `crate::repository::shard`) is live (see
/// [`crate::repository::lock`]: a heartbeat less than [`crate::repository::lock::STALE_AFTER_MS`] old, from a run that has
/// not ended and whose process is not known to be gone), else `interrupted`.
///
/// Errors: storage failures reading the lock.
pub fn status(storage: &dyn Storage, m: &Manifest) -> Result<&'static str> {
    if m.completed_at.is_some() {
        return Ok("completed");
    }
    let names = match m.parts {
        // A sharded backup runs while any of its parts does.
        Some(count) => (0..count)
            .map(|i| crate::repository::lock::LockName::part(&m.backup_id, i, count))
            .collect(),
        None => vec![crate::repository::lock::LockName::backup(&m.backup_id)],
    };
    for name in &names {
        if crate::repository::lock::read_named(storage, name)?.is_some_and(|l| l.is_live(now_ms()))
        {
            return Ok("running");
        }
    }
    Ok("interrupted")
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

/// The segment format versions of a backup's segments (docs/segment-format.md), as the
/// manifest records them: `version 1`, `version 2`, or each version with its segment count
/// when they differ (`version 1 (3 segments), version 2 (5 segments)`); `-` without segments.
fn segment_versions(m: &crate::repository::manifest::Manifest) -> String {
    let mut counts = std::collections::BTreeMap::<u8, u64>::new();
    for s in m.queues.iter().flat_map(|q| &q.segments) {
        *counts.entry(s.version()).or_default() += 1;
    }
    match counts.len() {
        0 => "-".into(),
        1 => counts.keys().map(|v| format!("version {v}")).collect(),
        _ => counts
            .iter()
            .map(|(v, n)| format!("version {v} ({n} segments)"))
            .collect::<Vec<_>>()
            .join(", "),
    }
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
    if let Some(parts) = m.parts {
        line(
            &mut out,
            "Written in:",
            format!("{parts} parts (backup.shard; {}/parts/)", m.backup_id),
        );
    }
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
    if let Some(e) = &m.encryption {
        line(
            &mut out,
            "Encryption:",
            format!("{} to {}", e.scheme, e.recipients.join(", ")),
        );
    }
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
    line(&mut out, "Segment format:", segment_versions(&m));
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
                unacked_at_start(q),
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
            "UNACKED AT START",
        ],
        &rows,
    ));
    Ok(out)
}

/// The messages a queue held unacknowledged when its read started, and how many of them the
/// backup left out (`500 (500 left out)`); `-` when not recorded (streams, older backups).
fn unacked_at_start(q: &crate::repository::manifest::QueueBackup) -> String {
    match (q.messages_unacknowledged_at_start, q.messages_left_out) {
        (None, None) => "-".into(),
        (n, None) => n.unwrap_or(0).to_string(),
        (n, Some(left)) => format!("{} ({left} left out)", n.unwrap_or(left)),
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(v)
        .map_err(|e| Error::Serialization(format!("output: {e}")))?;
    s.push('\n');
    Ok(s)
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
