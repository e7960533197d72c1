//! Where a storage command's storage comes from: `--path URL` (credentials from the
//! environment), or `--config FILE`, the storage section of the same backup or restore
//! configuration a run uses, with its credentials (`${ENV}`, `*_file`), prefix and, for the
//! commands that decrypt, `restore.encryption.identity_file`. So an operator never types S3
//! keys on a command line. `list`, `describe`, `validate`, `cat` and `forget` take `--config`;
//! `copy` takes `--from-config` and `--to-config`.

use super::{self as storage, Storage};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::repository::encryption::Identities;
use std::path::Path;
use std::sync::Arc;

/// A command's storage, opened, and the configuration it came from (if any).
pub struct Opened {
    /// The storage.
    pub storage: Arc<dyn Storage>,
    /// The configuration of `--config`.
    pub config: Option<Config>,
}

/// Opens the storage of `url` (the option `url_flag`, `--path`) or of the configuration file
/// `config` (the option `config_flag`, `--config`): exactly one of them.
///
/// Errors: `Configuration error:` when both or neither is given, for a bad URL, or for a
/// configuration that does not load (its storage section needing a variable or file that is
/// not set here: the other sections may lack theirs); the storage's own when it cannot be
/// opened.
pub fn open(
    url: Option<&str>,
    config: Option<&Path>,
    url_flag: &str,
    config_flag: &str,
) -> Result<Opened> {
    match (url, config) {
        (Some(url), None) => Ok(Opened {
            storage: storage::open_url(&storage::parse_storage_url(url)?)?,
            config: None,
        }),
        (None, Some(path)) => {
            let cfg = crate::config::check::load_for_storage(path)?;
            Ok(Opened {
                storage: storage::open_config(&cfg.storage)?,
                config: Some(cfg),
            })
        }
        (Some(_), Some(_)) => Err(Error::Config(format!(
            "{url_flag} and {config_flag} both name a storage: give one"
        ))),
        (None, None) => Err(Error::Config(format!(
            "no storage: give {url_flag} <storage URL> or {config_flag} <configuration file>"
        ))),
    }
}

impl Opened {
    /// The backup id a command works on: `given` (`--backup-id`), else the configuration's
    /// `backup_id`.
    ///
    /// Errors: `Configuration error:` without either, or when the configuration's id needs an
    /// environment variable that is not set here.
    pub fn backup_id(&self, given: Option<String>) -> Result<String> {
        if let Some(id) = given {
            return Ok(id);
        }
        let cfg = self.config.as_ref().ok_or_else(|| {
            Error::Config("--backup-id is required (or --config, whose backup_id is used)".into())
        })?;
        if cfg.backup_id.contains(crate::config::lenient::PLACEHOLDER) {
            return Err(Error::Config(
                "backup_id of the --config file needs an environment variable that is not set here: give --backup-id".into(),
            ));
        }
        Ok(cfg.backup_id.clone())
    }

    /// The identities that decrypt: `file` (`--identity-file`), else the configuration's
    /// `restore.encryption.identity_file`, else `RMQ_BACKUP_AGE_IDENTITY`.
    ///
    /// Errors: as [`Identities::load`].
    pub fn identities(&self, file: Option<&Path>) -> Result<Option<Identities>> {
        if file.is_some() {
            return Identities::load(file, "--identity-file");
        }
        let from_config = self
            .config
            .as_ref()
            .and_then(|c| c.restore.encryption.as_ref())
            .and_then(|e| e.identity_file.as_deref());
        Identities::load(
            from_config,
            if from_config.is_some() {
                "restore.encryption.identity_file"
            } else {
                "--identity-file"
            },
        )
    }
}
