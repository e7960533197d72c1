//! The YAML configuration of rmq-backup: schema, defaults, `${ENV_VAR}` interpolation and
//! validation (SPEC.md "Configuration", "Errors", "Limits"). One file per section of the
//! configuration (`source`, `target`, `storage`, `backup`, `restore`, `offset_storage`,
//! `metrics`), plus [`interpolate`] for `${ENV}` references and [`validate`] for the checks that
//! span sections. This module reads and checks the file; it never connects to anything.
//!
//! Loading runs three steps, in order:
//! 1. parse the YAML into [`Config`] (unknown fields are rejected; enum values are lowercase);
//!    a parse or type error is [`Error::Serialization`] with serde's text, which names the field
//!    path and, where known, `at line N column M`;
//! 2. replace `${NAME}` references in the fields listed at [`Config::interpolate_env`];
//! 3. [`Config::validate`]: value ranges, required sections, then [`Config::check_supported`]
//!    for features this version parses but does not implement yet.
//!
//! Secrets (passwords, keys, tokens) are held in [`Secret`], whose `Debug` prints `****`; the
//! `Debug` of [`SourceConfig`] and [`TargetConfig`] masks the password of `amqp_url`. No error
//! message built here contains a configured value that may hold a secret.

mod backup;
pub mod check;
mod checkpoints;
mod checks;
mod encryption;
mod interpolate;
pub mod lenient;
mod metrics;
pub mod object_lock;
mod restore;
mod retention;
pub mod schema;
mod secret_files;
mod source;
mod storage;
mod target;
mod urls;
mod validate;

pub use backup::{BackupOptions, CompressionKind, RequeueStrategy, ShardConfig};
pub use checkpoints::{OffsetBackend, OffsetStorageConfig};
pub use encryption::{BackupEncryption, RestoreEncryption};
pub use metrics::MetricsConfig;
pub use object_lock::{LockMode, ObjectLockConfig, RetainFor};
pub use restore::{
    ConvertMirroredQueues, DefinitionsSelection, PublishMode, RestoreOptions, StreamOffsets,
};
pub use retention::RetentionConfig;
pub use source::{QueueSelection, SourceConfig, TlsConfig};
pub use storage::{AzureStorage, FilesystemStorage, GcsStorage, S3Storage, StorageConfig};
pub use target::TargetConfig;
pub use urls::Urls;

use schemars::JsonSchema;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{mask_url, Error, Result};
use checks::config_err;

/// A secret string (password, key, token). `Debug` prints `****`; read the value with
/// [`Secret::expose`]. In YAML it is a plain string.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret value. Never log or format it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("****")
    }
}

/// The job to run: top-level field `mode`, `backup` or `restore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Backup,
    Restore,
}

impl Mode {
    /// The lowercase name (`backup`, `restore`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Backup => "backup",
            Mode::Restore => "restore",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole configuration file (the book's "Configuration reference").
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `backup` or `restore`; decides which sections are required.
    pub mode: Mode,
    /// Unique id of the backup; the top-level directory or prefix `{backup_id}/` in storage.
    /// Validated as one path component (non-empty, no `/` or `\`, not `.`/`..`, no control chars).
    pub backup_id: String,
    /// Source broker; required in backup mode.
    #[serde(default)]
    pub source: Option<SourceConfig>,
    /// Target broker; required in restore mode.
    #[serde(default)]
    pub target: Option<TargetConfig>,
    /// Storage backend.
    pub storage: StorageConfig,
    /// Backup options; every field has a default.
    #[serde(default)]
    pub backup: BackupOptions,
    /// Restore options; every field has a default.
    #[serde(default)]
    pub restore: RestoreOptions,
    /// The checkpoint database of resumable runs (docs/resuming.md "Resuming a killed run"); absent
    /// means none: a rerun reads every queue again.
    #[serde(default)]
    pub offset_storage: Option<OffsetStorageConfig>,
    /// Metrics server; absent means none (`metrics: {}` serves on 0.0.0.0:8080).
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// Retention applied after a successful backup (mode backup only); absent means none.
    #[serde(default)]
    pub retention: Option<RetentionConfig>,
}

/// A URL for `Debug`: the password masked; a URL that still shows an `@` after masking (no
/// `scheme://`) is hidden completely.
fn redact_url(url: &str) -> String {
    let masked = mask_url(url);
    if masked == url && url.contains('@') && url.contains(':') && !url.contains("://") {
        "****".to_string()
    } else {
        masked
    }
}

impl Config {
    /// Reads, parses, interpolates and validates the configuration file at `path`.
    ///
    /// Errors: `Error::Config("Cannot read config file {path}: {io error}")`; then as
    /// [`Config::from_yaml_str`].
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| config_err(format!("Cannot read config file {}: {e}", path.display())))?;
        Config::from_yaml_str(&text)
    }

    /// Parses YAML text, replaces `${ENV_VAR}` references ([`Config::interpolate_env`]) and
    /// validates ([`Config::validate`]).
    ///
    /// Errors: `Error::Serialization` with serde's message (field path and `at line N column M`
    /// where known) for YAML syntax, type, unknown-field and enum-case errors;
    /// `Error::Config` for interpolation and validation failures.
    pub fn from_yaml_str(text: &str) -> Result<Config> {
        let mut config: Config =
            serde_norway::from_str(text).map_err(|e| Error::Serialization(e.to_string()))?;
        config.interpolate_env()?;
        config.load_secret_files()?;
        config.validate()?;
        Ok(config)
    }

    /// The source section, or `Error::Config("Source configuration required for backup")`
    /// (a missing section).
    pub fn require_source(&self) -> Result<&SourceConfig> {
        self.source
            .as_ref()
            .ok_or_else(|| config_err("Source configuration required for backup"))
    }

    /// The target section, or `Error::Config("Target configuration required for restore")`.
    pub fn require_target(&self) -> Result<&TargetConfig> {
        self.target
            .as_ref()
            .ok_or_else(|| config_err("Target configuration required for restore"))
    }
}

#[cfg(test)]
mod tests;
