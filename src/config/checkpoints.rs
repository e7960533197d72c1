//! `offset_storage` (SPEC.md "offset_storage", "Checkpoint databases"): where the checkpoints
//! of resumable runs are kept. Parsing and defaults only.

use schemars::JsonSchema;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `offset_storage.backend`: `sqlite` (default) or `memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OffsetBackend {
    #[default]
    Sqlite,
    Memory,
}

/// `offset_storage`: the checkpoint database of resumable runs (the book's "Resuming a killed
/// run").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OffsetStorageConfig {
    /// Default sqlite.
    pub backend: OffsetBackend,
    /// Local database file; default `./offsets.db`.
    pub db_path: PathBuf,
    /// Remote key the database is synced to, e.g. `{backup_id}/state/offsets.db`.
    pub s3_key: Option<String>,
    /// Seconds between syncs; default 30; >= 1.
    pub sync_interval_secs: u64,
}

impl Default for OffsetStorageConfig {
    fn default() -> Self {
        OffsetStorageConfig {
            backend: OffsetBackend::Sqlite,
            db_path: PathBuf::from("./offsets.db"),
            s3_key: None,
            sync_interval_secs: 30,
        }
    }
}
