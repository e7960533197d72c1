//! What `copy` did: one row per backup, as a table for people or JSON for scripts.

use crate::error::Result;
use crate::inspect::Format;
use crate::run::units::{human_bytes, table};
use serde::Serialize;
use std::fmt::Write as _;

/// One backup's copy.
#[derive(Debug, Clone, Serialize)]
pub struct BackupCopy {
    pub backup_id: String,
    /// `copied`, `resumed` (an interrupted copy finished), `already copied` (completed at the
    /// target before this run: left alone), `not completed` (the source backup is
    /// interrupted or running: not copied) or `failed` (`error` says why).
    pub status: &'static str,
    /// Segments of the backup.
    pub segments: u64,
    /// Segments stored by this run.
    pub segments_copied: u64,
    /// Segments found at the target, verified (size and SHA-256), and not copied again.
    pub segments_in_place: u64,
    /// Bytes stored by this run (the new sizes of re-encrypted segments).
    pub bytes_copied: u64,
    /// The recipients the copy is encrypted to; null when it is not encrypted.
    pub encryption: Option<Vec<String>>,
    /// Why the copy failed, with its category prefix; null otherwise.
    pub error: Option<String>,
}

impl BackupCopy {
    pub(super) fn new(id: &str, status: &'static str) -> BackupCopy {
        BackupCopy {
            backup_id: id.to_string(),
            status,
            segments: 0,
            segments_copied: 0,
            segments_in_place: 0,
            bytes_copied: 0,
            encryption: None,
            error: None,
        }
    }
}

/// What a `copy` run did.
#[derive(Debug, Clone, Serialize)]
pub struct CopyReport {
    /// The source storage (no credentials).
    pub from: String,
    /// The target storage.
    pub to: String,
    pub backups: Vec<BackupCopy>,
}

impl CopyReport {
    /// True when a backup's copy failed (exit code 1).
    pub fn failed(&self) -> bool {
        self.backups.iter().any(|b| b.status == "failed")
    }

    /// The report as a table or JSON.
    ///
    /// Errors: `Serialization error:` when JSON cannot be written.
    pub fn render(&self, format: Format) -> Result<String> {
        if format == Format::Json {
            return serde_json::to_string_pretty(self)
                .map(|s| s + "\n")
                .map_err(|e| crate::error::Error::Serialization(format!("copy report: {e}")));
        }
        let rows: Vec<Vec<String>> = self
            .backups
            .iter()
            .map(|b| {
                vec![
                    b.backup_id.clone(),
                    b.status.to_string(),
                    b.segments.to_string(),
                    b.segments_copied.to_string(),
                    b.segments_in_place.to_string(),
                    human_bytes(b.bytes_copied),
                    match &b.encryption {
                        None => "-".into(),
                        Some(r) => format!("age ({} recipient(s))", r.len()),
                    },
                ]
            })
            .collect();
        let mut out = format!("Copy from {} to {}\n", self.from, self.to);
        if rows.is_empty() {
            out.push_str("No backups to copy\n");
            return Ok(out);
        }
        out.push_str(&table(
            &[
                "BACKUP ID",
                "STATUS",
                "SEGMENTS",
                "COPIED",
                "ALREADY THERE",
                "BYTES COPIED",
                "ENCRYPTION",
            ],
            &rows,
        ));
        for b in &self.backups {
            if let Some(e) = &b.error {
                let _ = writeln!(out, "{}: {e}", b.backup_id);
            }
        }
        Ok(out)
    }
}
