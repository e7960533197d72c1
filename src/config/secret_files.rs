//! Secrets from files (docs/configuration.md "Secrets"): every secret of the configuration can be given as a
//! path whose file holds it (`*_file` fields), the way Kubernetes mounts a Secret as files.
//! Read once at load, after `${ENV}` interpolation and before validation; the value then
//! takes the place of the field it stands for. One trailing newline (`\n` or `\r\n`) is
//! dropped, as `echo` and `kubectl create secret --from-file` leave one.
//!
//! Errors name the field and the path, never the content: `Configuration error: Cannot read
//! source.management_password_file /run/secrets/pw: No such file or directory`.

use std::path::{Path, PathBuf};

use super::checks::config_err;
use super::{Config, Secret, StorageConfig};
use crate::error::Result;

/// The secret in the file `path`, named `field` (e.g. `source.management_password_file`) in
/// messages.
///
/// Errors: `Configuration error: Cannot read {field} {path}: {why}`; `... is empty`; `... is
/// not valid UTF-8`.
pub(super) fn read_secret_file(path: &Path, field: &str) -> Result<String> {
    if !path.exists() {
        if let Some(placeholder) =
            super::lenient::note(super::lenient::Missing::File(path.into()), field)
        {
            return Ok(placeholder.to_string());
        }
    }
    let bytes = std::fs::read(path).map_err(|e| {
        config_err(format!(
            "Cannot read {field} {}: {}",
            path.display(),
            crate::repository::storage::io_reason(&e)
        ))
    })?;
    let text = String::from_utf8(bytes)
        .map_err(|_| config_err(format!("{field} {} is not valid UTF-8", path.display())))?;
    let value = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(config_err(format!("{field} {} is empty", path.display())));
    }
    Ok(value.to_string())
}

/// Fills `value` (the field `field`) from `file` (the field `{field}_file`), when given.
///
/// Errors: both given; as [`read_secret_file`].
fn fill(value: &mut Option<Secret>, file: &Option<PathBuf>, field: &str) -> Result<()> {
    let Some(path) = file else { return Ok(()) };
    if value.is_some() {
        return Err(config_err(format!(
            "{field} and {field}_file are both set: give the secret once"
        )));
    }
    *value = Some(Secret::new(read_secret_file(
        path,
        &format!("{field}_file"),
    )?));
    Ok(())
}

/// Puts the password of the file `file` (field `{field_prefix}.amqp_password_file`) into
/// every URL of `{field_prefix}.amqp_url`, percent-encoded.
///
/// Errors: a URL without a user name or that holds a password already; as [`read_secret_file`].
fn fill_amqp_password<'a>(
    urls: impl Iterator<Item = &'a mut String>,
    file: &Option<PathBuf>,
    field_prefix: &str,
) -> Result<()> {
    let Some(path) = file else { return Ok(()) };
    let field = format!("{field_prefix}.amqp_password_file");
    let password = read_secret_file(path, &field)?;
    let encoded =
        percent_encoding::utf8_percent_encode(&password, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    for (i, url) in urls.enumerate() {
        let at_url = |what: &str| {
            config_err(format!(
                "{field} is set but {field_prefix}.amqp_url (URL {}) {what}",
                i + 1
            ))
        };
        let start = url
            .find("://")
            .map(|p| p + 3)
            .ok_or_else(|| at_url("is not scheme://user@host/vhost"))?;
        let end = url[start..]
            .find(['/', '?', '#'])
            .map_or(url.len(), |p| start + p);
        let at = url[start..end]
            .rfind('@')
            .map(|p| start + p)
            .ok_or_else(|| at_url("names no user (write amqp://user@host/vhost)"))?;
        if url[start..at].contains(':') {
            return Err(at_url("holds a password already: give it in one place"));
        }
        url.insert_str(at, &format!(":{encoded}"));
    }
    Ok(())
}

impl Config {
    /// Reads the `*_file` secrets into the fields they stand for: `source.` and `target.`
    /// `management_password_file` and `amqp_password_file`; the storage's `access_key_file`,
    /// `secret_key_file` (s3), `account_key_file`, `client_secret_file`, `sas_token_file`
    /// (azure). (`restore.encryption.identity_file` is read by the jobs that decrypt.)
    ///
    /// Errors: as [`read_secret_file`], naming the field and path; a secret given both in
    /// its field and in its file.
    pub fn load_secret_files(&mut self) -> Result<()> {
        if let Some(source) = &mut self.source {
            let mut pw = (!source.management_password.expose().is_empty())
                .then(|| source.management_password.clone());
            fill(
                &mut pw,
                &source.management_password_file,
                "source.management_password",
            )?;
            source.management_password = pw.unwrap_or_default();
            if source.management_password.expose().is_empty() {
                return Err(config_err(
                    "source.management_password (or source.management_password_file) is required",
                ));
            }
            fill_amqp_password(
                source.amqp_url.all_mut(),
                &source.amqp_password_file,
                "source",
            )?;
        }
        if let Some(target) = &mut self.target {
            fill(
                &mut target.management_password,
                &target.management_password_file,
                "target.management_password",
            )?;
            fill_amqp_password(
                target.amqp_url.all_mut(),
                &target.amqp_password_file,
                "target",
            )?;
        }
        match &mut self.storage {
            StorageConfig::S3(s3) => {
                fill(
                    &mut s3.access_key,
                    &s3.access_key_file,
                    "storage.access_key",
                )?;
                fill(
                    &mut s3.secret_key,
                    &s3.secret_key_file,
                    "storage.secret_key",
                )?;
            }
            StorageConfig::Azure(az) => {
                fill(
                    &mut az.account_key,
                    &az.account_key_file,
                    "storage.account_key",
                )?;
                fill(
                    &mut az.client_secret,
                    &az.client_secret_file,
                    "storage.client_secret",
                )?;
                fill(&mut az.sas_token, &az.sas_token_file, "storage.sas_token")?;
            }
            StorageConfig::Filesystem(_) | StorageConfig::Gcs(_) | StorageConfig::Memory => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_go_into_urls_percent_encoded() {
        let dir = std::env::temp_dir().join(format!("rmqb-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "p@ss:w/rd\n").unwrap();
        let mut urls = [
            "amqp://app@rabbit-0:5672/%2f".to_string(),
            "amqps://app@rabbit-1".to_string(),
        ];
        fill_amqp_password(urls.iter_mut(), &Some(file.clone()), "source").unwrap();
        assert_eq!(urls[0], "amqp://app:p%40ss%3Aw%2Frd@rabbit-0:5672/%2f");
        assert_eq!(urls[1], "amqps://app:p%40ss%3Aw%2Frd@rabbit-1");
        let url = crate::broker::amqp::AmqpUrl::parse(&urls[0]).unwrap();
        assert_eq!(url.password, "p@ss:w/rd");

        let mut twice = ["amqp://app:x@h".to_string()];
        let e = fill_amqp_password(twice.iter_mut(), &Some(file.clone()), "source").unwrap_err();
        assert_eq!(e.to_string(), "Configuration error: source.amqp_password_file is set but source.amqp_url (URL 1) holds a password already: give it in one place");
        let e = read_secret_file(&dir.join("absent"), "storage.secret_key_file").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "Configuration error: Cannot read storage.secret_key_file {}: No such file or directory",
                dir.join("absent").display()
            )
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
