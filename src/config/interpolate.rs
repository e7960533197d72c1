//! `${ENV_VAR}` interpolation (SPEC.md "What the service does" 6): which fields take it, and
//! the replacement itself. A value is never quoted in an error: it may be a secret.

use super::checks::config_err;
use super::{Config, Secret, StorageConfig};
use crate::error::Result;

/// Replaces every `${NAME}` in `value` by the environment variable `NAME`; `$${` gives a literal
/// `${`. `field` names the configuration field for messages. The value itself never appears in
/// an error (it may be a secret).
///
/// Errors (all `Error::Config`): `Environment variable {NAME} referenced in {field} is not set`,
/// `... is not valid UTF-8`, an unterminated `${`, an invalid variable name.
pub(super) fn interpolate(value: &str, field: &str) -> Result<String> {
    if !value.contains('$') {
        return Ok(value.to_string());
    }
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').ok_or_else(|| {
                config_err(format!(
                    "Unterminated ${{ in {field} (write $${{ for a literal ${{)"
                ))
            })?;
            let name = &after[..end];
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(config_err(format!(
                    "Invalid environment variable reference in {field}: names are letters, digits and _ (write $${{ for a literal ${{)"
                )));
            }
            match std::env::var(name) {
                Ok(v) => out.push_str(&v),
                Err(std::env::VarError::NotPresent) => {
                    if let Some(placeholder) =
                        super::lenient::note(super::lenient::Missing::Variable(name.into()), field)
                    {
                        out.push_str(placeholder);
                        rest = &after[end + 1..];
                        continue;
                    }
                    return Err(config_err(format!(
                        "Environment variable {name} referenced in {field} is not set"
                    )));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(config_err(format!(
                        "Environment variable {name} referenced in {field} is not valid UTF-8"
                    )))
                }
            }
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn interpolate_in_place(value: &mut String, field: &str) -> Result<()> {
    *value = interpolate(value, field)?;
    Ok(())
}

fn interpolate_secret(value: &mut Option<Secret>, field: &str) -> Result<()> {
    if let Some(s) = value {
        interpolate_in_place(&mut s.0, field)?;
    }
    Ok(())
}

impl Config {
    /// Replaces `${NAME}` by the environment variable `NAME` (`$${` is a literal `${`) in
    /// `source.amqp_url`, `source.management_password`, `target.amqp_url`,
    /// `target.management_password` (SPEC.md "What the service does" 6), and in the storage
    /// secrets: s3 `access_key`/`secret_key`, azure `account_key`/`client_secret`/`sas_token`;
    /// and in `metrics.pushgateway_url` (its basic-auth password).
    ///
    /// Errors: `Error::Config("Environment variable {NAME} referenced in {field} is not set")`,
    /// or a malformed reference.
    pub fn interpolate_env(&mut self) -> Result<()> {
        // A dated or per-job backup id (`nightly-${BACKUP_DATE}`), checked after this.
        interpolate_in_place(&mut self.backup_id, "backup_id")?;
        if let Some(source) = &mut self.source {
            for url in source.amqp_url.all_mut() {
                interpolate_in_place(url, "source.amqp_url")?;
            }
            interpolate_in_place(
                &mut source.management_password.0,
                "source.management_password",
            )?;
        }
        if let Some(target) = &mut self.target {
            for url in target.amqp_url.all_mut() {
                interpolate_in_place(url, "target.amqp_url")?;
            }
            interpolate_secret(
                &mut target.management_password,
                "target.management_password",
            )?;
        }
        if let Some(url) = self
            .metrics
            .as_mut()
            .and_then(|m| m.pushgateway_url.as_mut())
        {
            interpolate_in_place(url, "metrics.pushgateway_url")?;
        }
        match &mut self.storage {
            StorageConfig::S3(s3) => {
                interpolate_secret(&mut s3.access_key, "storage.access_key")?;
                interpolate_secret(&mut s3.secret_key, "storage.secret_key")?;
            }
            StorageConfig::Azure(az) => {
                interpolate_secret(&mut az.account_key, "storage.account_key")?;
                interpolate_secret(&mut az.client_secret, "storage.client_secret")?;
                interpolate_secret(&mut az.sas_token, "storage.sas_token")?;
            }
            StorageConfig::Filesystem(_) | StorageConfig::Gcs(_) | StorageConfig::Memory => {}
        }
        Ok(())
    }
}
