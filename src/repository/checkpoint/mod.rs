//! The checkpoint databases (SPEC.md "offset_storage", "Checkpoint databases", "States and
//! transitions"): what a killed backup or restore has already done, so that running the same
//! command again finishes it.
//!
//! One SQLite database (rusqlite, bundled: the static binary needs no system library) in WAL
//! mode, or an in-memory one (`offset_storage.backend: memory`). Tables (schema version
//! [`SCHEMA_VERSION`] in `meta`):
//! - `backup_runs`: per backup_id, the `created_at` of the backup the rows below belong to: a
//!   rerun trusts them only when its interrupted manifest has the same `created_at` (an older
//!   backup of the same id, since deleted, is not this one);
//! - `backup_queues`: per (backup_id, vhost, queue): the target message count of the run, the
//!   last stored segment sequence, the completed flag, and the stream offset (for streams);
//! - `backup_segments`: per (backup_id, vhost, queue, sequence): the stored segment's metadata
//!   (SPEC.md SegmentMetadata, as JSON) and, for a stream, the offsets of its first and last
//!   records, written in sequence order as the segments are stored;
//! - `restore_queues`: per (backup_id, source vhost/queue, target vhost/queue): the records
//!   processed (published and settled by the broker: a prefix of the queue's records) and the
//!   completed flag.
//!
//! Every write is one transaction. [`sync`] copies a consistent snapshot to the storage
//! (`offset_storage.s3_key`) and fetches it back on a fresh machine. This module stores and
//! answers; deciding what to skip or redo is the jobs' (`crate::backup`, `crate::restore`).

pub mod sync;

use crate::error::{Error, Result};
use crate::repository::manifest::SegmentMetadata;
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Version of the table layout below, kept in `meta.schema_version`. Version 1 (without
/// `backup_runs` and the segment offsets) is upgraded when opened.
pub const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS backup_queues (
    backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
    target_count INTEGER NOT NULL, last_segment INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0, stream_offset INTEGER, updated_at INTEGER NOT NULL,
    PRIMARY KEY (backup_id, vhost, queue));
CREATE TABLE IF NOT EXISTS backup_segments (
    backup_id TEXT NOT NULL, vhost TEXT NOT NULL, queue TEXT NOT NULL,
    sequence INTEGER NOT NULL, metadata TEXT NOT NULL,
    first_offset INTEGER, last_offset INTEGER,
    PRIMARY KEY (backup_id, vhost, queue, sequence));
CREATE TABLE IF NOT EXISTS backup_runs (
    backup_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS restore_queues (
    backup_id TEXT NOT NULL, source_vhost TEXT NOT NULL, source_queue TEXT NOT NULL,
    target_vhost TEXT NOT NULL, target_queue TEXT NOT NULL,
    records_done INTEGER NOT NULL, completed INTEGER NOT NULL, updated_at INTEGER NOT NULL,
    PRIMARY KEY (backup_id, source_vhost, source_queue, target_vhost, target_queue));
";

/// A queue of a backup as the checkpoint database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupQueueState {
    /// Messages the run set out to read (the depth at its start).
    pub target_count: u64,
    /// True once every segment of the queue was stored.
    pub completed: bool,
    /// The stored segments, in sequence order.
    pub segments: Vec<StoredSegment>,
}

/// A stored segment as the checkpoint database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSegment {
    pub metadata: SegmentMetadata,
    /// For a stream: the offsets of the segment's first and last records (`None` for queues,
    /// and in databases of schema version 1).
    pub offsets: Option<(u64, u64)>,
}

/// Which queue of which restore: the backup's queue and where it is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreKey {
    pub backup_id: String,
    pub source_vhost: String,
    pub source_queue: String,
    pub target_vhost: String,
    pub target_queue: String,
}

/// An open checkpoint database. Shared by the job's threads (one connection behind a mutex:
/// checkpoint writes are a few per second).
pub struct Checkpoints {
    conn: Mutex<Connection>,
    /// The file, or `:memory:`, for messages.
    label: String,
}

fn db_err(label: &str, e: rusqlite::Error) -> Error {
    Error::Checkpoint(format!("database {label}: {e}"))
}

/// `Checkpoint error: unable to open database file: <path> (<cause>)`: a configuration
/// problem (exit 2, see `Error::exit_code`).
fn open_err(path: &Path, cause: impl std::fmt::Display) -> Error {
    Error::Checkpoint(format!(
        "unable to open database file: {} ({cause})",
        path.display()
    ))
}

impl Checkpoints {
    /// Opens (creating when missing) the database file at `path` and its tables.
    ///
    /// Errors: `Checkpoint error: unable to open database file: <path> (...)` when the file
    /// cannot be created or opened (a directory, a missing parent, no permission);
    /// `Checkpoint error: database <path> is not a checkpoint database ...` when the file is
    /// corrupt or another kind of file, or has a newer schema.
    pub fn open_file(path: &Path) -> Result<Checkpoints> {
        if path.is_dir() {
            return Err(open_err(path, "it is a directory"));
        }
        match path.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) if !parent.is_dir() => {
                return Err(open_err(path, "its directory does not exist"))
            }
            _ => {}
        }
        let conn = Connection::open(path).map_err(|e| open_err(path, e))?;
        let label = path.display().to_string();
        // WAL: a reader of the snapshot never blocks the writers; NORMAL is durable at each
        // checkpoint of the WAL, which is what a crash-resume needs.
        conn.pragma_update(None, "journal_mode", "WAL")
            .and_then(|_| conn.pragma_update(None, "synchronous", "NORMAL"))
            .map_err(|e| not_a_checkpoint_db(&label, e))?;
        Checkpoints::init(conn, label)
    }

    /// An empty in-memory database (`offset_storage.backend: memory`): lost when the process
    /// ends unless synced to `s3_key`.
    pub fn open_memory() -> Result<Checkpoints> {
        let conn = Connection::open_in_memory().map_err(|e| db_err(":memory:", e))?;
        Checkpoints::init(conn, ":memory:".into())
    }

    /// An in-memory database loaded from the database file at `path`.
    pub fn open_memory_from(path: &Path) -> Result<Checkpoints> {
        let mut conn = Connection::open_in_memory().map_err(|e| db_err(":memory:", e))?;
        conn.restore(
            rusqlite::MAIN_DB,
            path,
            None::<fn(rusqlite::backup::Progress)>,
        )
        .map_err(|e| not_a_checkpoint_db(&path.display().to_string(), e))?;
        Checkpoints::init(conn, ":memory:".into())
    }

    fn init(conn: Connection, label: String) -> Result<Checkpoints> {
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| db_err(&label, e))?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| not_a_checkpoint_db(&label, e))?;
        let version: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| not_a_checkpoint_db(&label, e))?;
        match version.map(|v| v.parse::<i64>()) {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )
                .map_err(|e| db_err(&label, e))?;
            }
            Some(Ok(SCHEMA_VERSION)) => {}
            Some(Ok(1)) => {
                conn.execute_batch(
                    "ALTER TABLE backup_segments ADD COLUMN first_offset INTEGER;
                     ALTER TABLE backup_segments ADD COLUMN last_offset INTEGER;
                     UPDATE meta SET value = '2' WHERE key = 'schema_version';",
                )
                .map_err(|e| db_err(&label, e))?;
            }
            Some(v) => {
                return Err(Error::Checkpoint(format!(
                    "database {label} has schema version {v:?}; this version of rmq-backup reads version {SCHEMA_VERSION}"
                )))
            }
        }
        Ok(Checkpoints {
            conn: Mutex::new(conn),
            label,
        })
    }

    /// The database file, or `:memory:`.
    pub fn label(&self) -> &str {
        &self.label
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, e: rusqlite::Error) -> Error {
        db_err(&self.label, e)
    }

    /// What the database holds of `queue` in `vhost` of backup `backup_id`; `None` when the
    /// queue was never started.
    pub fn backup_queue(
        &self,
        backup_id: &str,
        vhost: &str,
        queue: &str,
    ) -> Result<Option<BackupQueueState>> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT target_count, completed FROM backup_queues
                 WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
                params![backup_id, vhost, queue],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? != 0)),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((target_count, completed)) = row else {
            return Ok(None);
        };
        let mut stmt = conn
            .prepare(
                "SELECT metadata, first_offset, last_offset FROM backup_segments
                 WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3 ORDER BY sequence",
            )
            .map_err(|e| self.err(e))?;
        let segments = stmt
            .query_map(params![backup_id, vhost, queue], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                ))
            })
            .map_err(|e| self.err(e))?
            .map(|row| {
                let (json, first, last) = row.map_err(|e| self.err(e))?;
                let metadata = serde_json::from_str::<SegmentMetadata>(&json).map_err(|e| {
                    Error::Checkpoint(format!(
                        "database {}: segment metadata of queue {queue} in vhost {vhost} cannot be read: {e}",
                        self.label
                    ))
                })?;
                let offsets = match (first, last) {
                    (Some(f), Some(l)) if f >= 0 && l >= f => Some((f as u64, l as u64)),
                    _ => None,
                };
                Ok(StoredSegment { metadata, offsets })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(BackupQueueState {
            target_count: target_count.max(0) as u64,
            completed,
            segments,
        }))
    }

    /// Starts (or starts again) `queue`: not completed, `target_count` messages to read, and
    /// no segments (those of an earlier, killed run are not part of the backup).
    pub fn start_backup_queue(
        &self,
        backup_id: &str,
        vhost: &str,
        queue: &str,
        target_count: u64,
    ) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        tx.execute(
            "DELETE FROM backup_segments WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
            params![backup_id, vhost, queue],
        )
        .map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT OR REPLACE INTO backup_queues
             (backup_id, vhost, queue, target_count, last_segment, completed, updated_at)
             VALUES (?1, ?2, ?3, ?4, 0, 0, ?5)",
            params![
                backup_id,
                vhost,
                queue,
                target_count as i64,
                crate::now_ms()
            ],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    /// Records a stored segment of `queue`, with the offsets of its first and last records
    /// when it is a stream's.
    pub fn backup_segment_stored(
        &self,
        backup_id: &str,
        vhost: &str,
        queue: &str,
        segment: &SegmentMetadata,
        offsets: Option<(u64, u64)>,
    ) -> Result<()> {
        let json = serde_json::to_string(segment)
            .map_err(|e| Error::Serialization(format!("segment metadata: {e}")))?;
        let (first, last) = match offsets {
            Some((f, l)) => (i64::try_from(f).ok(), i64::try_from(l).ok()),
            None => (None, None),
        };
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        tx.execute(
            "INSERT OR REPLACE INTO backup_segments
             (backup_id, vhost, queue, sequence, metadata, first_offset, last_offset)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                backup_id,
                vhost,
                queue,
                segment.sequence as i64,
                json,
                first,
                last
            ],
        )
        .map_err(|e| self.err(e))?;
        tx.execute(
            "UPDATE backup_queues SET last_segment = MAX(last_segment, ?4), updated_at = ?5
             WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
            params![
                backup_id,
                vhost,
                queue,
                segment.sequence as i64,
                crate::now_ms()
            ],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    /// The `created_at` (epoch ms) of the backup whose state the database holds for
    /// `backup_id`, if any ([`Checkpoints::begin_backup`]).
    pub fn backup_created_at(&self, backup_id: &str) -> Result<Option<i64>> {
        self.conn()
            .query_row(
                "SELECT created_at FROM backup_runs WHERE backup_id = ?1",
                params![backup_id],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Starts the state of backup `backup_id` created at `created_at` (epoch ms) afresh: every
    /// queue and segment recorded for that id before is forgotten.
    pub fn begin_backup(&self, backup_id: &str, created_at: i64) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        for table in ["backup_segments", "backup_queues"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE backup_id = ?1"),
                params![backup_id],
            )
            .map_err(|e| self.err(e))?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO backup_runs (backup_id, created_at) VALUES (?1, ?2)",
            params![backup_id, created_at],
        )
        .map_err(|e| self.err(e))?;
        tx.commit().map_err(|e| self.err(e))
    }

    /// Marks `queue` completed: every segment of it is stored.
    pub fn complete_backup_queue(&self, backup_id: &str, vhost: &str, queue: &str) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE backup_queues SET completed = 1, updated_at = ?4
                 WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
                params![backup_id, vhost, queue, crate::now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Records the last offset of a stream backed up by `backup_id` (the stream protocol's
    /// offsets; the log says it too).
    pub fn set_stream_offset(
        &self,
        backup_id: &str,
        vhost: &str,
        stream: &str,
        offset: u64,
    ) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE backup_queues SET stream_offset = ?4, updated_at = ?5
                 WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
                params![backup_id, vhost, stream, offset as i64, crate::now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// The last offset recorded by [`Checkpoints::set_stream_offset`], if any.
    pub fn stream_offset(&self, backup_id: &str, vhost: &str, stream: &str) -> Result<Option<u64>> {
        self.conn()
            .query_row(
                "SELECT stream_offset FROM backup_queues
                 WHERE backup_id = ?1 AND vhost = ?2 AND queue = ?3",
                params![backup_id, vhost, stream],
                |row| row.get::<_, Option<i64>>(0),
            )
            .optional()
            .map(|o| o.flatten().map(|v| v as u64))
            .map_err(|e| self.err(e))
    }

    /// (records processed, completed) of a queue of a restore; `None` when never started.
    pub fn restore_queue(&self, key: &RestoreKey) -> Result<Option<(u64, bool)>> {
        self.conn()
            .query_row(
                "SELECT records_done, completed FROM restore_queues
                 WHERE backup_id = ?1 AND source_vhost = ?2 AND source_queue = ?3
                   AND target_vhost = ?4 AND target_queue = ?5",
                params![
                    key.backup_id,
                    key.source_vhost,
                    key.source_queue,
                    key.target_vhost,
                    key.target_queue
                ],
                |r| Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get::<_, i64>(1)? != 0)),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Records that the first `records_done` records of a restore's queue were processed
    /// (and, with `completed`, that the queue is done).
    pub fn restore_progress(
        &self,
        key: &RestoreKey,
        records_done: u64,
        completed: bool,
    ) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO restore_queues
                 (backup_id, source_vhost, source_queue, target_vhost, target_queue,
                  records_done, completed, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    key.backup_id,
                    key.source_vhost,
                    key.source_queue,
                    key.target_vhost,
                    key.target_queue,
                    records_done as i64,
                    i64::from(completed),
                    crate::now_ms()
                ],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Writes a consistent copy of the whole database to the new file `path`
    /// (`VACUUM INTO`: one transaction, readable on its own, no WAL beside it).
    pub fn snapshot_to(&self, path: &Path) -> Result<()> {
        let _ = std::fs::remove_file(path);
        self.conn()
            .execute("VACUUM INTO ?1", params![path.to_string_lossy()])
            .map(|_| ())
            .map_err(|e| {
                Error::Checkpoint(format!(
                    "snapshot of database {} into {} failed: {e}",
                    self.label,
                    path.display()
                ))
            })
    }
}

fn not_a_checkpoint_db(label: &str, e: rusqlite::Error) -> Error {
    Error::Checkpoint(format!(
        "database {label} is not a checkpoint database or is corrupt ({e}); move it away to start over"
    ))
}

#[cfg(test)]
mod tests;
