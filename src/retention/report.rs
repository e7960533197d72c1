//! What `forget` did, for people (a table and a summary) and for scripts (`--format json`).

use super::prune::Orphan;
use crate::error::{Error, Result};
use crate::run::units::{format_ms, table};
use serde::Serialize;
use std::fmt::Write as _;

/// The decision about one backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupDecision {
    pub backup_id: String,
    /// `completed`, `interrupted`, `running` or `damaged`.
    pub status: &'static str,
    /// Epoch ms; `None` when the manifest cannot be read.
    pub created_at: Option<i64>,
    /// True when the backup is removed (in a dry run: would be).
    pub remove: bool,
    /// The rules that keep it (`last`, `daily`, `oldest weekly`, `within 30d`), or why it is
    /// removed or left alone.
    pub reasons: Vec<String>,
    /// Objects deleted, once deleted (its run locks included, which forget holds while it
    /// deletes).
    pub deleted_objects: Option<u64>,
}

impl Serialize for BackupDecision {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            backup_id: &'a str,
            status: &'a str,
            created_at: Option<i64>,
            action: &'a str,
            reasons: &'a [String],
            deleted_objects: Option<u64>,
        }
        Out {
            backup_id: &self.backup_id,
            status: self.status,
            created_at: self.created_at,
            action: if self.remove { "remove" } else { "keep" },
            reasons: &self.reasons,
            deleted_objects: self.deleted_objects,
        }
        .serialize(s)
    }
}

/// The outcome of one `forget`.
#[derive(Debug, Clone, Serialize)]
pub struct ForgetReport {
    pub location: String,
    /// The rules, as `keep-last 3, keep-daily 7`.
    pub policy: String,
    pub dry_run: bool,
    /// Every backup found, in backup id order.
    pub backups: Vec<BackupDecision>,
    /// Orphans found by `--prune` (empty without it).
    pub orphans: Vec<Orphan>,
    /// Deletions that failed (each names its key); the command then exits 1.
    pub errors: Vec<String>,
}

impl ForgetReport {
    /// Backups kept and removed.
    pub fn counts(&self) -> (usize, usize) {
        let removed = self.backups.iter().filter(|b| b.remove).count();
        (self.backups.len() - removed, removed)
    }

    /// One line for logs and the backup summary: `3 kept, 2 removed, 4 orphans deleted`.
    pub fn summary(&self) -> String {
        let (kept, removed) = self.counts();
        let verb = if self.dry_run { "to remove" } else { "removed" };
        let mut s = format!("{kept} backup(s) kept, {removed} {verb}");
        let orphans = self.orphans.iter().filter(|o| o.remove).count();
        if orphans > 0 {
            let _ = write!(s, ", {orphans} orphaned object(s) {verb}");
        }
        if !self.errors.is_empty() {
            let _ = write!(s, ", {} error(s)", self.errors.len());
        }
        s
    }

    /// The report as text (a table, the orphans, a summary) or JSON.
    pub fn render(&self, json: bool) -> Result<String> {
        if json {
            let mut s = serde_json::to_string_pretty(self)
                .map_err(|e| Error::Serialization(format!("output: {e}")))?;
            s.push('\n');
            return Ok(s);
        }
        let mut out = format!(
            "Policy: {} in {}{}\n",
            self.policy,
            self.location,
            if self.dry_run {
                " (dry run: nothing deleted)"
            } else {
                ""
            }
        );
        if self.backups.is_empty() {
            out.push_str("No backups.\n");
        } else {
            let rows: Vec<Vec<String>> = self
                .backups
                .iter()
                .map(|b| {
                    vec![
                        b.backup_id.clone(),
                        b.status.to_string(),
                        b.created_at.map_or("-".into(), format_ms),
                        if b.remove { "remove" } else { "keep" }.to_string(),
                        b.reasons.join(", "),
                    ]
                })
                .collect();
            out.push_str(&table(
                &["BACKUP ID", "STATUS", "CREATED (UTC)", "ACTION", "WHY"],
                &rows,
            ));
        }
        for o in &self.orphans {
            let _ = writeln!(
                out,
                "orphan {} ({}): {}, {}",
                o.key,
                o.modified_at.map_or("age unknown".into(), format_ms),
                if o.remove { "remove" } else { "keep" },
                o.reason
            );
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        let _ = writeln!(out, "{}.", self.summary());
        Ok(out)
    }
}
