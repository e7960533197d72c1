//! `storage` (SPEC.md "storage"): the backend and its fields, read through one flat mapping so
//! that a field of another backend is rejected with its name. The backends themselves live in
//! `crate::repository::storage`; this file only parses and checks.

use std::path::PathBuf;

use serde::Deserialize;

use super::checks::{check_non_empty, check_scheme, config_err};
use super::object_lock::ObjectLockConfig;
use super::Secret;
use crate::error::Result;

/// `storage`: the backend, chosen by the field `backend` (the book's "Storage backends").
///
/// In YAML this is one mapping with a `backend` key plus that backend's fields. It is read
/// through a flat intermediate struct so that an unknown field is reported with its path and
/// line (`storage: unknown field ... at line N column M`) and a field of another backend is
/// rejected (`storage: field `path` does not apply to backend s3`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawStorage")]
pub enum StorageConfig {
    /// `backend: filesystem`.
    Filesystem(FilesystemStorage),
    /// `backend: s3`: Amazon S3 and S3-compatible stores.
    S3(S3Storage),
    /// `backend: azure`: Azure Blob Storage.
    Azure(AzureStorage),
    /// `backend: gcs`: Google Cloud Storage (JSON API).
    Gcs(GcsStorage),
    /// `backend: memory`: in-memory storage for tests, not persisted.
    Memory,
}

impl StorageConfig {
    /// The `object_lock` of an object store's section; `None` for filesystem and memory.
    pub fn object_lock(&self) -> Option<&ObjectLockConfig> {
        match self {
            StorageConfig::S3(s) => s.object_lock.as_ref(),
            StorageConfig::Azure(a) => a.object_lock.as_ref(),
            StorageConfig::Gcs(g) => g.object_lock.as_ref(),
            StorageConfig::Filesystem(_) | StorageConfig::Memory => None,
        }
    }

    /// The `backend` value: `filesystem`, `s3`, `azure`, `gcs` or `memory`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            StorageConfig::Filesystem(_) => "filesystem",
            StorageConfig::S3(_) => "s3",
            StorageConfig::Azure(_) => "azure",
            StorageConfig::Gcs(_) => "gcs",
            StorageConfig::Memory => "memory",
        }
    }
}

/// `backend: filesystem` fields.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub struct FilesystemStorage {
    /// Base directory; created when missing. Must not be empty.
    pub path: PathBuf,
}

/// `backend: s3` fields.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub struct S3Storage {
    /// Bucket name; must not be empty.
    pub bucket: String,
    /// Region; falls back to the provider's standard environment variable.
    pub region: Option<String>,
    /// Custom endpoint URL (`http://` needs `allow_http`).
    pub endpoint: Option<String>,
    /// Access key id; supports `${ENV_VAR}`; falls back to the standard environment variable.
    pub access_key: Option<Secret>,
    /// Secret access key; supports `${ENV_VAR}`; falls back to the standard environment variable.
    pub secret_key: Option<Secret>,
    /// A file holding the access key id, instead of `access_key` (docs/configuration.md "Secrets").
    pub access_key_file: Option<PathBuf>,
    /// A file holding the secret access key, instead of `secret_key`.
    pub secret_key_file: Option<PathBuf>,
    /// Key prefix prepended to every storage key.
    pub prefix: Option<String>,
    /// Path-style requests, default false.
    #[schemars(extend("default" = false))]
    pub path_style: bool,
    /// Allow `http://` endpoints, default false.
    #[schemars(extend("default" = false))]
    pub allow_http: bool,
    /// Retention set on every object a backup writes (the book's "Protecting backups from
    /// deletion"); unset: none.
    pub object_lock: Option<ObjectLockConfig>,
}

/// `backend: azure` fields.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub struct AzureStorage {
    /// Storage account name; must not be empty.
    pub account_name: String,
    /// Blob container name; must not be empty.
    pub container_name: String,
    /// Account key; supports `${ENV_VAR}`.
    pub account_key: Option<Secret>,
    /// Key prefix.
    pub prefix: Option<String>,
    /// Custom endpoint for sovereign or government clouds.
    pub endpoint: Option<String>,
    /// Workload identity authentication; unset: used when `AZURE_FEDERATED_TOKEN_FILE` is set.
    pub use_workload_identity: Option<bool>,
    /// Service principal client id.
    pub client_id: Option<String>,
    /// Tenant id.
    pub tenant_id: Option<String>,
    /// Service principal client secret; supports `${ENV_VAR}`.
    pub client_secret: Option<Secret>,
    /// Shared access signature token; supports `${ENV_VAR}`.
    pub sas_token: Option<Secret>,
    /// A file holding the account key, instead of `account_key` (docs/configuration.md "Secrets").
    pub account_key_file: Option<PathBuf>,
    /// A file holding the client secret, instead of `client_secret`.
    pub client_secret_file: Option<PathBuf>,
    /// A file holding the SAS token, instead of `sas_token`.
    pub sas_token_file: Option<PathBuf>,
    /// Retention set on every object a backup writes (the book's "Protecting backups from
    /// deletion"); unset: none.
    pub object_lock: Option<ObjectLockConfig>,
}

/// `backend: gcs` fields.
#[derive(Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub struct GcsStorage {
    /// Bucket name; must not be empty.
    pub bucket: String,
    /// Service account JSON key file.
    pub service_account_path: Option<PathBuf>,
    /// Key prefix.
    pub prefix: Option<String>,
    /// Retention set on every object a backup writes (the book's "Protecting backups from
    /// deletion"); unset: none.
    pub object_lock: Option<ObjectLockConfig>,
}

/// The `backend` tag of [`StorageConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StorageBackend {
    Filesystem,
    S3,
    Azure,
    Gcs,
    Memory,
}

/// The `storage` mapping as written: every field of every backend, all optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    backend: StorageBackend,
    #[serde(default)]
    path: Option<PathBuf>,
    #[serde(default)]
    bucket: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    access_key: Option<Secret>,
    #[serde(default)]
    secret_key: Option<Secret>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    path_style: Option<bool>,
    #[serde(default)]
    allow_http: Option<bool>,
    #[serde(default)]
    account_name: Option<String>,
    #[serde(default)]
    container_name: Option<String>,
    #[serde(default)]
    account_key: Option<Secret>,
    #[serde(default)]
    use_workload_identity: Option<bool>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    client_secret: Option<Secret>,
    #[serde(default)]
    sas_token: Option<Secret>,
    #[serde(default)]
    service_account_path: Option<PathBuf>,
    #[serde(default)]
    access_key_file: Option<PathBuf>,
    #[serde(default)]
    secret_key_file: Option<PathBuf>,
    #[serde(default)]
    account_key_file: Option<PathBuf>,
    #[serde(default)]
    client_secret_file: Option<PathBuf>,
    #[serde(default)]
    sas_token_file: Option<PathBuf>,
    #[serde(default)]
    object_lock: Option<ObjectLockConfig>,
}

impl RawStorage {
    /// Names of the fields that are set, besides `backend`.
    fn present_fields(&self) -> Vec<&'static str> {
        let set = [
            ("path", self.path.is_some()),
            ("bucket", self.bucket.is_some()),
            ("region", self.region.is_some()),
            ("endpoint", self.endpoint.is_some()),
            ("access_key", self.access_key.is_some()),
            ("secret_key", self.secret_key.is_some()),
            ("prefix", self.prefix.is_some()),
            ("path_style", self.path_style.is_some()),
            ("allow_http", self.allow_http.is_some()),
            ("account_name", self.account_name.is_some()),
            ("container_name", self.container_name.is_some()),
            ("account_key", self.account_key.is_some()),
            (
                "use_workload_identity",
                self.use_workload_identity.is_some(),
            ),
            ("client_id", self.client_id.is_some()),
            ("tenant_id", self.tenant_id.is_some()),
            ("client_secret", self.client_secret.is_some()),
            ("sas_token", self.sas_token.is_some()),
            ("service_account_path", self.service_account_path.is_some()),
            ("access_key_file", self.access_key_file.is_some()),
            ("secret_key_file", self.secret_key_file.is_some()),
            ("account_key_file", self.account_key_file.is_some()),
            ("client_secret_file", self.client_secret_file.is_some()),
            ("sas_token_file", self.sas_token_file.is_some()),
            ("object_lock", self.object_lock.is_some()),
        ];
        set.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect()
    }
}

fn required<T>(value: Option<T>, field: &str, backend: &str) -> std::result::Result<T, String> {
    value.ok_or_else(|| format!("storage: missing field `{field}` for backend {backend}"))
}

impl TryFrom<RawStorage> for StorageConfig {
    type Error = String;

    fn try_from(raw: RawStorage) -> std::result::Result<StorageConfig, String> {
        let (name, allowed): (&str, &[&str]) = match raw.backend {
            StorageBackend::Filesystem => ("filesystem", &["path"]),
            StorageBackend::S3 => (
                "s3",
                &[
                    "bucket",
                    "region",
                    "endpoint",
                    "access_key",
                    "secret_key",
                    "access_key_file",
                    "secret_key_file",
                    "prefix",
                    "path_style",
                    "allow_http",
                    "object_lock",
                ],
            ),
            StorageBackend::Azure => (
                "azure",
                &[
                    "account_name",
                    "container_name",
                    "account_key",
                    "prefix",
                    "endpoint",
                    "use_workload_identity",
                    "client_id",
                    "tenant_id",
                    "client_secret",
                    "sas_token",
                    "account_key_file",
                    "client_secret_file",
                    "sas_token_file",
                    "object_lock",
                ],
            ),
            StorageBackend::Gcs => (
                "gcs",
                &["bucket", "service_account_path", "prefix", "object_lock"],
            ),
            StorageBackend::Memory => ("memory", &[]),
        };
        if let Some(field) = raw
            .present_fields()
            .into_iter()
            .find(|f| !allowed.contains(f))
        {
            return Err(format!(
                "storage: field `{field}` does not apply to backend {name}"
            ));
        }
        Ok(match raw.backend {
            StorageBackend::Filesystem => StorageConfig::Filesystem(FilesystemStorage {
                path: required(raw.path, "path", name)?,
            }),
            StorageBackend::S3 => StorageConfig::S3(S3Storage {
                bucket: required(raw.bucket, "bucket", name)?,
                region: raw.region,
                endpoint: raw.endpoint,
                access_key: raw.access_key,
                secret_key: raw.secret_key,
                access_key_file: raw.access_key_file,
                secret_key_file: raw.secret_key_file,
                prefix: raw.prefix,
                path_style: raw.path_style.unwrap_or(false),
                allow_http: raw.allow_http.unwrap_or(false),
                object_lock: raw.object_lock,
            }),
            StorageBackend::Azure => StorageConfig::Azure(AzureStorage {
                account_name: required(raw.account_name, "account_name", name)?,
                container_name: required(raw.container_name, "container_name", name)?,
                account_key: raw.account_key,
                prefix: raw.prefix,
                endpoint: raw.endpoint,
                use_workload_identity: raw.use_workload_identity,
                client_id: raw.client_id,
                tenant_id: raw.tenant_id,
                client_secret: raw.client_secret,
                sas_token: raw.sas_token,
                account_key_file: raw.account_key_file,
                client_secret_file: raw.client_secret_file,
                sas_token_file: raw.sas_token_file,
                object_lock: raw.object_lock,
            }),
            StorageBackend::Gcs => StorageConfig::Gcs(GcsStorage {
                bucket: required(raw.bucket, "bucket", name)?,
                service_account_path: raw.service_account_path,
                prefix: raw.prefix,
                object_lock: raw.object_lock,
            }),
            StorageBackend::Memory => StorageConfig::Memory,
        })
    }
}

impl StorageConfig {
    /// Checks the fields of the chosen backend; the first problem is `Error::Config` naming
    /// the field.
    pub(super) fn validate(&self) -> Result<()> {
        match self {
            StorageConfig::Filesystem(fs) => {
                if fs.path.as_os_str().is_empty() {
                    return Err(config_err("storage.path must not be empty"));
                }
            }
            StorageConfig::S3(s3) => {
                check_non_empty(&s3.bucket, "storage.bucket")?;
                if let Some(endpoint) = &s3.endpoint {
                    check_scheme(endpoint, "storage.endpoint", &["http://", "https://"])?;
                    if endpoint.to_ascii_lowercase().starts_with("http://") && !s3.allow_http {
                        return Err(config_err(
                            "storage.allow_http must be true when storage.endpoint uses http://",
                        ));
                    }
                }
                if s3.access_key.is_some() != s3.secret_key.is_some() {
                    return Err(config_err(
                        "storage.access_key and storage.secret_key must be given together",
                    ));
                }
                check_prefix(&s3.prefix)?;
            }
            StorageConfig::Azure(az) => {
                check_non_empty(&az.account_name, "storage.account_name")?;
                check_non_empty(&az.container_name, "storage.container_name")?;
                if let Some(endpoint) = &az.endpoint {
                    check_scheme(endpoint, "storage.endpoint", &["http://", "https://"])?;
                }
                check_prefix(&az.prefix)?;
            }
            StorageConfig::Gcs(gcs) => {
                check_non_empty(&gcs.bucket, "storage.bucket")?;
                if let Some(p) = &gcs.service_account_path {
                    if p.as_os_str().is_empty() {
                        return Err(config_err("storage.service_account_path must not be empty"));
                    }
                }
                check_prefix(&gcs.prefix)?;
            }
            StorageConfig::Memory => {}
        }
        Ok(())
    }
}

/// A storage key prefix: no leading `/`, no `.`/`..` components, no backslash or control chars.
fn check_prefix(prefix: &Option<String>) -> Result<()> {
    if let Some(p) = prefix {
        let bad = p.starts_with('/')
            || p.contains('\\')
            || p.chars().any(char::is_control)
            || p.split('/').any(|c| c == "." || c == "..");
        if bad {
            return Err(config_err(
                "storage.prefix must be a relative key prefix without a leading /, backslashes, control characters or . and .. components",
            ));
        }
    }
    Ok(())
}
