//! `backup.encryption` and `restore.encryption` (docs/encryption.md "Encryption at rest"): the public keys
//! a backup encrypts to, and the identity a restore decrypts with. Parsing, and reading the
//! key files they name; the encryption itself is `crate::repository::encryption`.

use schemars::JsonSchema;
use std::path::PathBuf;

use serde::Deserialize;

use super::checks::config_err;
use crate::error::Result;
use crate::repository::encryption::{Identities, Recipients};

/// `backup.encryption`: encrypt every segment and the definitions export with age to these
/// X25519 recipients (several allowed: an operator key and an escrow key). At least one key,
/// from `recipients`, `recipients_file` or both.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackupEncryption {
    /// Public keys, `age1...`.
    #[serde(default)]
    pub recipients: Vec<String>,
    /// A file of public keys, one `age1...` per line (`#` comments allowed), as `age -R`
    /// reads.
    #[serde(default)]
    pub recipients_file: Option<PathBuf>,
}

impl BackupEncryption {
    /// The recipients: `recipients`, then the keys of `recipients_file`.
    ///
    /// Errors: `Configuration error: Cannot read backup.encryption.recipients_file {path}:
    /// {why}`; a key that is not `age1...`; no key at all.
    pub fn recipients(&self) -> Result<Recipients> {
        let file_text = match &self.recipients_file {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                config_err(format!(
                    "Cannot read backup.encryption.recipients_file {}: {}",
                    path.display(),
                    crate::repository::storage::io_reason(&e)
                ))
            })?),
            None => None,
        };
        let from_file = file_text.as_deref().map(Recipients::file_lines);
        let field = match (&self.recipients_file, self.recipients.is_empty()) {
            (Some(path), true) => format!("backup.encryption.recipients_file {}", path.display()),
            (Some(path), false) => format!(
                "backup.encryption.recipients (with recipients_file {})",
                path.display()
            ),
            (None, _) => "backup.encryption.recipients".to_string(),
        };
        Recipients::parse(
            self.recipients
                .iter()
                .map(String::as_str)
                .chain(from_file.into_iter().flatten()),
            &field,
        )
    }
}

/// `restore.encryption`: where a restore finds the identity (private key) of an encrypted
/// backup. Unset: the environment variable `RMQ_BACKUP_AGE_IDENTITY`, if set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreEncryption {
    /// An age identity file (`AGE-SECRET-KEY-1...` lines, as `age-keygen` writes).
    #[serde(default)]
    pub identity_file: Option<PathBuf>,
}

impl RestoreEncryption {
    /// The identities of a restore: `identity_file` of `section` (`None`: not configured),
    /// else `RMQ_BACKUP_AGE_IDENTITY`, else none.
    ///
    /// Errors: as `crate::repository::encryption::Identities::load` (`Configuration error:`).
    pub fn identities(section: Option<&RestoreEncryption>) -> Result<Option<Identities>> {
        Identities::load(
            section.and_then(|s| s.identity_file.as_deref()),
            "restore.encryption.identity_file",
        )
    }
}
