//! Validation of a whole [`Config`]: which sections a mode needs, checks that span sections
//! (a restore's management access), and the features this version parses but does not
//! implement yet.

use super::backup::validate_backup_options;
use super::checks::{check_non_empty, check_positive, check_scheme, config_err};
use super::restore::validate_restore_options;
use super::source::validate_source;
use super::target::validate_target;
use super::{Config, Mode, PublishMode};
use crate::error::Result;

impl Config {
    /// Validates the whole configuration; the first problem found is returned as
    /// `Error::Config` naming the field. Sections present are checked whatever the mode;
    /// mode-specific requirements (source for backup, target and its management access for
    /// restore) only for that mode. Ends with [`Config::check_supported`]. Logs a warning for
    /// options that have no effect.
    pub fn validate(&self) -> Result<()> {
        match self.mode {
            Mode::Backup => {
                self.require_source()?;
            }
            Mode::Restore => {
                self.require_target()?;
            }
        }
        self.validate_backup_id()?;
        if let Some(source) = &self.source {
            validate_source(source)?;
        }
        if let Some(target) = &self.target {
            validate_target(target)?;
        }
        self.storage.validate()?;
        validate_backup_options(&self.backup)?;
        validate_restore_options(&self.restore)?;
        if self.mode == Mode::Restore {
            self.validate_restore_needs()?;
        }
        if let Some(off) = &self.offset_storage {
            if off.db_path.as_os_str().is_empty() {
                return Err(config_err("offset_storage.db_path must not be empty"));
            }
            check_positive(off.sync_interval_secs, "offset_storage.sync_interval_secs")?;
            // The database is rewritten every sync: with an object lock it must live where
            // nothing is locked (`crate::repository::storage::object_lock`).
            let unlocked = |k: &str| k.split('/').nth(1) == Some("state");
            if let (Some(_), Some(key)) = (self.storage.object_lock(), &off.s3_key) {
                if !unlocked(key) {
                    return Err(config_err(format!(
                        "offset_storage.s3_key {key:?} would be locked by storage.object_lock, yet every sync rewrites it: put it under {{backup_id}}/state/ (e.g. {}/state/offsets.db)",
                        self.backup_id
                    )));
                }
            }
        }
        if let Some(r) = &self.retention {
            if self.mode != Mode::Backup {
                return Err(config_err(
                    "retention applies after a backup: remove it from a restore configuration (forget --path applies a policy at any time)",
                ));
            }
            r.options()?;
        }
        if let Some(m) = &self.metrics {
            check_non_empty(&m.bind_address, "metrics.bind_address")?;
            if !m.path.starts_with('/') {
                return Err(config_err("metrics.path must start with /"));
            }
            if ["/", "/health", "/healthz"].contains(&m.path.as_str()) {
                return Err(config_err(format!(
                    "metrics.path must not be {}, which the server uses itself",
                    m.path
                )));
            }
            check_export(m)?;
        }
        self.check_supported()
    }

    fn validate_backup_id(&self) -> Result<()> {
        let id = &self.backup_id;
        if id.is_empty() {
            return Err(config_err("backup_id must not be empty"));
        }
        if id.contains('/') || id.contains('\\') {
            return Err(config_err(format!(
                "backup_id {id:?} must not contain / or \\ (it is one storage path component)"
            )));
        }
        if id == "." || id == ".." {
            return Err(config_err(format!("backup_id must not be {id:?}")));
        }
        if id == crate::repository::delivery_counts::STATE_PREFIX {
            return Err(config_err(format!(
                "backup_id must not be {id:?}: the repository keeps its own state under that name"
            )));
        }
        if id.chars().any(char::is_control) {
            return Err(config_err(format!(
                "backup_id {id:?} must not contain control characters"
            )));
        }
        Ok(())
    }

    /// Restore-mode requirements on the target's management access.
    fn validate_restore_needs(&self) -> Result<()> {
        let r = &self.restore;
        let target = self.require_target()?;
        if target.management_url.is_none() {
            if r.restore_definitions {
                return Err(config_err(
                    "target.management_url is required when restore.restore_definitions is true",
                ));
            }
            if r.create_missing_queues {
                return Err(config_err(
                    "target.management_url is required when restore.create_missing_queues is true",
                ));
            }
        }
        if r.create_missing_queues && r.publish_mode == PublishMode::Exchange {
            log::warn!(
                "restore.create_missing_queues applies to publish_mode direct-to-queue; with publish_mode exchange it has no effect"
            );
        }
        if !r.restore_definitions && (r.definitions_dry_run || !r.definitions_selection.is_empty())
        {
            log::warn!(
                "restore.definitions_dry_run and restore.definitions_selection have no effect when restore.restore_definitions is false"
            );
        }
        if r.publish_mode == PublishMode::DirectToQueue && !r.exchange_mapping.is_empty() {
            log::warn!("restore.exchange_mapping has no effect with publish_mode direct-to-queue");
        }
        Ok(())
    }

    /// Features this version parses but does not implement yet: each fails with
    /// `Error::Config("... is not supported yet")`. Later work deletes lines from here.
    pub fn check_supported(&self) -> Result<()> {
        if self.mode == Mode::Backup
            && !self.backup.stop_at_current_depth
            && !self.backup.stream_enabled
        {
            return Err(config_err(
                "backup.stop_at_current_depth: false (a continuous backup) follows streams with the stream protocol: set backup.stream_enabled: true",
            ));
        }
        Ok(())
    }
}

/// The end-of-run export of `metrics` (`textfile`, `pushgateway_*`).
fn check_export(m: &super::MetricsConfig) -> Result<()> {
    if let Some(t) = &m.textfile {
        if t.as_os_str().is_empty() || t.file_name().is_none() {
            return Err(config_err("metrics.textfile must name a file"));
        }
    }
    if let Some(url) = &m.pushgateway_url {
        check_scheme(url, "metrics.pushgateway_url", &["http://", "https://"])?;
        if url.contains(['?', '#']) {
            return Err(config_err(
                "metrics.pushgateway_url must not have a query or fragment",
            ));
        }
    }
    check_non_empty(&m.pushgateway_job, "metrics.pushgateway_job")?;
    for (name, value) in &m.pushgateway_grouping {
        let valid = name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        if !valid || name.is_empty() || name.starts_with("__") {
            return Err(config_err(format!(
                "metrics.pushgateway_grouping label {name:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)"
            )));
        }
        if name == "job" || name == "mode" {
            return Err(config_err(format!(
                "metrics.pushgateway_grouping must not set {name}: rmq-backup sets it (pushgateway_job, and backup or restore)"
            )));
        }
        check_non_empty(value, &format!("metrics.pushgateway_grouping.{name}"))?;
    }
    Ok(())
}
