//! The YAML configuration of rmq-backup: schema, defaults, `${ENV_VAR}` interpolation and
//! validation (SPEC.md "Configuration", "Errors", "Limits").
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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::broker::QueueType;
use crate::error::{mask_url, Error, Result};

/// Longest AMQP 0-9-1 queue or exchange name, in bytes (names are `shortstr`).
const MAX_AMQP_NAME_BYTES: usize = 255;

/// A secret string (password, key, token). `Debug` prints `****`; read the value with
/// [`Secret::expose`]. In YAML it is a plain string.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
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

/// The job to run: top-level field `mode`, `backup` or `restore` (SPEC.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// The whole configuration file (SPEC.md "Configuration: top level").
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// Checkpoint storage for resumable backups (not supported yet).
    #[serde(default)]
    pub offset_storage: Option<OffsetStorageConfig>,
    /// Metrics server; absent means none (`metrics: {}` serves on 0.0.0.0:8080).
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
}

/// `source`: the broker a backup reads from (SPEC.md "source").
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// `amqp://user:password@host:port/vhost` (vhost `/` written `%2f`); `amqps://` for TLS.
    /// Supports `${ENV_VAR}` interpolation.
    pub amqp_url: String,
    /// Base URL of the management HTTP API, `http://` or `https://`.
    pub management_url: String,
    /// Management API user name.
    pub management_username: String,
    /// Management API password; supports `${ENV_VAR}` interpolation.
    pub management_password: Secret,
    /// Stream protocol port, default 5552; used only when `backup.stream_enabled` is true.
    #[serde(default = "default_stream_port")]
    pub stream_port: u16,
    /// TLS for AMQP and stream connections (not supported yet when enabled).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Queue selection; `None` selects every queue (see `crate::selection`).
    #[serde(default)]
    pub queues: Option<QueueSelection>,
}

fn default_stream_port() -> u16 {
    5552
}

impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceConfig")
            .field("amqp_url", &redact_url(&self.amqp_url))
            .field("management_url", &redact_url(&self.management_url))
            .field("management_username", &self.management_username)
            .field("management_password", &self.management_password)
            .field("stream_port", &self.stream_port)
            .field("tls", &self.tls)
            .field("queues", &self.queues)
            .finish()
    }
}

/// `source.tls` (SPEC.md): TLS for AMQP and stream connections.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Enable TLS, default false.
    pub enabled: bool,
    /// CA certificate PEM file.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate PEM file (mutual TLS); requires `client_key`.
    pub client_cert: Option<PathBuf>,
    /// Client private key PEM file (mutual TLS); requires `client_cert`.
    pub client_key: Option<PathBuf>,
}

/// `source.queues` (SPEC.md): which queues a backup reads. The matching logic is in
/// `crate::selection`. Every field defaults to "no restriction".
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSelection {
    /// Glob patterns (`*`, `?`, case-sensitive) of queue names to include; empty = all.
    pub include: Vec<String>,
    /// Glob patterns of queue names to exclude; applied after include.
    pub exclude: Vec<String>,
    /// Vhosts to include (exact names); empty = all.
    pub vhosts: Vec<String>,
    /// Queue types to include (`classic`, `quorum`, `stream`); empty = all.
    pub types: Vec<QueueType>,
    /// Queues holding fewer messages than this are skipped; default 0.
    pub min_messages: u64,
}

/// `target`: the broker a restore publishes to (SPEC.md "target").
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// AMQP URL of the target broker; supports `${ENV_VAR}` interpolation.
    pub amqp_url: String,
    /// Management API base URL; required when `restore.restore_definitions` or
    /// `restore.create_missing_queues` is true.
    #[serde(default)]
    pub management_url: Option<String>,
    /// Required together with `management_url`.
    #[serde(default)]
    pub management_username: Option<String>,
    /// Required together with `management_url`; supports `${ENV_VAR}` interpolation.
    #[serde(default)]
    pub management_password: Option<Secret>,
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetConfig")
            .field("amqp_url", &redact_url(&self.amqp_url))
            .field(
                "management_url",
                &self.management_url.as_deref().map(redact_url),
            )
            .field("management_username", &self.management_username)
            .field("management_password", &self.management_password)
            .finish()
    }
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

/// `storage`: the backend, chosen by the field `backend` (SPEC.md "storage").
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemStorage {
    /// Base directory; created when missing. Must not be empty.
    pub path: PathBuf,
}

/// `backend: s3` fields (SPEC.md "storage").
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Key prefix prepended to every storage key.
    pub prefix: Option<String>,
    /// Path-style requests, default false.
    pub path_style: bool,
    /// Allow `http://` endpoints, default false.
    pub allow_http: bool,
}

/// `backend: azure` fields (SPEC.md "storage").
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Workload identity authentication; `None` = auto-detect.
    pub use_workload_identity: Option<bool>,
    /// Service principal client id.
    pub client_id: Option<String>,
    /// Tenant id.
    pub tenant_id: Option<String>,
    /// Service principal client secret; supports `${ENV_VAR}`.
    pub client_secret: Option<Secret>,
    /// Shared access signature token; supports `${ENV_VAR}`.
    pub sas_token: Option<Secret>,
}

/// `backend: gcs` fields (SPEC.md "storage").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcsStorage {
    /// Bucket name; must not be empty.
    pub bucket: String,
    /// Service account JSON key file.
    pub service_account_path: Option<PathBuf>,
    /// Key prefix.
    pub prefix: Option<String>,
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
                    "prefix",
                    "path_style",
                    "allow_http",
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
                ],
            ),
            StorageBackend::Gcs => ("gcs", &["bucket", "service_account_path", "prefix"]),
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
                prefix: raw.prefix,
                path_style: raw.path_style.unwrap_or(false),
                allow_http: raw.allow_http.unwrap_or(false),
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
            }),
            StorageBackend::Gcs => StorageConfig::Gcs(GcsStorage {
                bucket: required(raw.bucket, "bucket", name)?,
                service_account_path: raw.service_account_path,
                prefix: raw.prefix,
            }),
            StorageBackend::Memory => StorageConfig::Memory,
        })
    }
}

/// `backup.compression` (SPEC.md): `zstd` (default), `lz4` or `none`. The segment module has
/// its own `Compression`; the caller maps this onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionKind {
    #[default]
    Zstd,
    Lz4,
    None,
}

impl CompressionKind {
    /// The lowercase name (`zstd`, `lz4`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            CompressionKind::Zstd => "zstd",
            CompressionKind::Lz4 => "lz4",
            CompressionKind::None => "none",
        }
    }
}

/// `backup.requeue_strategy` (SPEC.md "Requeue strategies"): how messages read without
/// acknowledgement are handed back to the broker. Default `cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequeueStrategy {
    /// basic.consume, then basic.cancel: the broker requeues every unacked message.
    #[default]
    Cancel,
    /// basic.get + basic.nack(requeue=true) per message.
    Nack,
    /// basic.reject(requeue=true) per message.
    Reject,
    /// basic.get (pull) one at a time, then nack.
    Get,
}

/// `backup` options (SPEC.md "backup"); every field optional with the default shown.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackupOptions {
    /// Maximum uncompressed segment size in bytes before rotation; default 134217728; > 0.
    pub segment_max_bytes: u64,
    /// Maximum milliseconds before segment rotation; default 60000; > 0.
    pub segment_max_interval_ms: u64,
    /// Segment compression; default zstd.
    pub compression: CompressionKind,
    /// zstd level 1..=22, default 3; ignored for lz4 and none.
    pub compression_level: i32,
    /// AMQP QoS prefetch count (SPEC.md default 100; 0 = unlimited). `None` when the file does
    /// not set it. Not used by a one-shot backup of classic and quorum queues, which must hold
    /// a queue's whole depth unacknowledged: each consumer's prefetch is sized to what it must
    /// hold (see `reader`), and the backup warns when the field is set.
    pub prefetch_count: Option<u16>,
    /// Default cancel.
    pub requeue_strategy: RequeueStrategy,
    /// Queues backed up in parallel (one AMQP connection each); default 4; >= 1.
    pub max_concurrent_queues: usize,
    /// Seconds between checkpoint writes; default 5; >= 1.
    pub checkpoint_interval_secs: u64,
    /// Seconds between checkpoint syncs to remote storage; default 30; >= 1.
    pub sync_interval_secs: u64,
    /// Export definitions; default true.
    pub include_definitions: bool,
    /// One-shot backup of the depth present at start; default true (false = continuous, not
    /// supported yet).
    pub stop_at_current_depth: bool,
    /// Native stream protocol for stream queues; default false (true not supported yet).
    pub stream_enabled: bool,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            segment_max_bytes: 134_217_728,
            segment_max_interval_ms: 60_000,
            compression: CompressionKind::Zstd,
            compression_level: 3,
            prefetch_count: None,
            requeue_strategy: RequeueStrategy::Cancel,
            max_concurrent_queues: 4,
            checkpoint_interval_secs: 5,
            sync_interval_secs: 30,
            include_definitions: true,
            stop_at_current_depth: true,
            stream_enabled: false,
        }
    }
}

/// `restore.publish_mode` (SPEC.md "Publish modes"): `exchange` (default) or `direct-to-queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishMode {
    /// Original exchange and routing key; exchange_mapping applies.
    #[default]
    Exchange,
    /// Default exchange with routing key = target queue name.
    DirectToQueue,
}

/// `restore.definitions_selection` (SPEC.md): partial definitions import. All lists empty =
/// import everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefinitionsSelection {
    /// Vhosts to restore.
    pub vhosts: Vec<String>,
    /// Queue names to restore (with the exchanges and bindings they need).
    pub queues: Vec<String>,
    /// Exchange names to restore.
    pub exchanges: Vec<String>,
}

impl DefinitionsSelection {
    /// True when no list has an entry (import everything).
    pub fn is_empty(&self) -> bool {
        self.vhosts.is_empty() && self.queues.is_empty() && self.exchanges.is_empty()
    }
}

/// `restore` options (SPEC.md "restore"); every field optional with the default shown.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestoreOptions {
    /// Epoch ms; only records with backed_up_at >= this are restored.
    pub time_window_start: Option<i64>,
    /// Epoch ms; only records with backed_up_at <= this are restored.
    pub time_window_end: Option<i64>,
    /// Source queue name -> target queue name.
    pub queue_mapping: BTreeMap<String, String>,
    /// Source vhost -> target vhost.
    pub vhost_mapping: BTreeMap<String, String>,
    /// Source exchange -> target exchange (publish_mode exchange).
    pub exchange_mapping: BTreeMap<String, String>,
    /// Default exchange.
    pub publish_mode: PublishMode,
    /// Default true.
    pub publisher_confirms: bool,
    /// Queues restored in parallel; default 4; >= 1.
    pub max_concurrent_queues: usize,
    /// Publish batch size; default 100; >= 1.
    pub produce_batch_size: usize,
    /// Messages per second; default 0 = unlimited.
    pub rate_limit_messages_per_sec: u64,
    /// Restore definitions before messages; default true; needs target management access.
    pub restore_definitions: bool,
    /// Validate definitions without importing; default false.
    pub definitions_dry_run: bool,
    /// Default empty (everything).
    pub definitions_selection: DefinitionsSelection,
    /// Create missing target queues (direct-to-queue); default false; needs target management
    /// access.
    pub create_missing_queues: bool,
    /// Restore checkpoint database path (not supported yet).
    pub checkpoint_state: Option<PathBuf>,
    /// Seconds between restore checkpoint writes; default 60; >= 1.
    pub checkpoint_interval_secs: u64,
    /// Publish nothing, print a summary; default false.
    pub dry_run: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            time_window_start: None,
            time_window_end: None,
            queue_mapping: BTreeMap::new(),
            vhost_mapping: BTreeMap::new(),
            exchange_mapping: BTreeMap::new(),
            publish_mode: PublishMode::Exchange,
            publisher_confirms: true,
            max_concurrent_queues: 4,
            produce_batch_size: 100,
            rate_limit_messages_per_sec: 0,
            restore_definitions: true,
            definitions_dry_run: false,
            definitions_selection: DefinitionsSelection::default(),
            create_missing_queues: false,
            checkpoint_state: None,
            checkpoint_interval_secs: 60,
            dry_run: false,
        }
    }
}

/// `offset_storage.backend`: `sqlite` (default) or `memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OffsetBackend {
    #[default]
    Sqlite,
    Memory,
}

/// `offset_storage` (SPEC.md): checkpoint storage for resumable backups (not supported yet).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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

/// `metrics` (SPEC.md): the metrics HTTP server (`crate::metrics::server`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Default true.
    pub enabled: bool,
    /// TCP port; default 8080.
    pub port: u16,
    /// Default `0.0.0.0`.
    pub bind_address: String,
    /// Metrics path; default `/metrics`; must start with `/` and not be `/`, `/health`,
    /// `/healthz`.
    pub path: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            port: 8080,
            bind_address: "0.0.0.0".to_string(),
            path: "/metrics".to_string(),
        }
    }
}

fn config_err(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

/// Replaces every `${NAME}` in `value` by the environment variable `NAME`; `$${` gives a literal
/// `${`. `field` names the configuration field for messages. The value itself never appears in
/// an error (it may be a secret).
///
/// Errors (all `Error::Config`): `Environment variable {NAME} referenced in {field} is not set`,
/// `... is not valid UTF-8`, an unterminated `${`, an invalid variable name.
fn interpolate(value: &str, field: &str) -> Result<String> {
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
                    return Err(config_err(format!(
                        "Environment variable {name} referenced in {field} is not set"
                    )))
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

/// Checks that a URL starts with one of `schemes` (case-insensitive). The URL is not quoted in
/// the message: it may hold a password.
fn check_scheme(url: &str, field: &str, schemes: &[&str]) -> Result<()> {
    let lower = url.to_ascii_lowercase();
    let ok = schemes
        .iter()
        .any(|s| lower.starts_with(s) && lower.len() > s.len());
    if ok {
        Ok(())
    } else {
        Err(config_err(format!(
            "{field} must start with {}",
            schemes.join(" or ")
        )))
    }
}

fn check_positive(value: u64, field: &str) -> Result<()> {
    if value == 0 {
        Err(config_err(format!("{field} must be greater than 0")))
    } else {
        Ok(())
    }
}

fn check_non_empty(value: &str, field: &str) -> Result<()> {
    if value.trim().is_empty() {
        Err(config_err(format!("{field} must not be empty")))
    } else {
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

fn check_mapping(map: &BTreeMap<String, String>, field: &str, allow_empty: bool) -> Result<()> {
    for (from, to) in map {
        if to.is_empty() && !allow_empty {
            return Err(config_err(format!(
                "{field} maps {from:?} to an empty name"
            )));
        }
        if to.len() > MAX_AMQP_NAME_BYTES {
            return Err(config_err(format!(
                "{field} maps {from:?} to a name longer than {MAX_AMQP_NAME_BYTES} bytes"
            )));
        }
    }
    Ok(())
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
        config.validate()?;
        Ok(config)
    }

    /// Replaces `${NAME}` by the environment variable `NAME` (`$${` is a literal `${`) in
    /// `source.amqp_url`, `source.management_password`, `target.amqp_url`,
    /// `target.management_password` (SPEC.md "What the service does" 6), and in the storage
    /// secrets: s3 `access_key`/`secret_key`, azure `account_key`/`client_secret`/`sas_token`.
    ///
    /// Errors: `Error::Config("Environment variable {NAME} referenced in {field} is not set")`,
    /// or a malformed reference.
    pub fn interpolate_env(&mut self) -> Result<()> {
        if let Some(source) = &mut self.source {
            interpolate_in_place(&mut source.amqp_url, "source.amqp_url")?;
            interpolate_in_place(
                &mut source.management_password.0,
                "source.management_password",
            )?;
        }
        if let Some(target) = &mut self.target {
            interpolate_in_place(&mut target.amqp_url, "target.amqp_url")?;
            interpolate_secret(
                &mut target.management_password,
                "target.management_password",
            )?;
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

    /// The source section, or `Error::Config("Source configuration required for backup")`
    /// (SPEC.md "Errors", Missing section).
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
        self.validate_storage()?;
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
        if id.chars().any(char::is_control) {
            return Err(config_err(format!(
                "backup_id {id:?} must not contain control characters"
            )));
        }
        Ok(())
    }

    fn validate_storage(&self) -> Result<()> {
        match &self.storage {
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
        if self.mode == Mode::Backup {
            if let Some(tls) = self.source.as_ref().and_then(|s| s.tls.as_ref()) {
                if tls.enabled {
                    return Err(config_err("source.tls.enabled: TLS is not supported yet"));
                }
            }
            if self.backup.stream_enabled {
                return Err(config_err(
                    "backup.stream_enabled: the stream protocol is not supported yet",
                ));
            }
            if !self.backup.stop_at_current_depth {
                return Err(config_err(
                    "continuous backup (backup.stop_at_current_depth: false) is not supported yet",
                ));
            }
        }
        let urls = [
            (
                "source.amqp_url",
                self.source.as_ref().map(|s| s.amqp_url.as_str()),
            ),
            (
                "target.amqp_url",
                self.target.as_ref().map(|t| t.amqp_url.as_str()),
            ),
        ];
        for (field, url) in urls {
            if url.is_some_and(|u| u.starts_with("amqps://")) {
                return Err(config_err(format!(
                    "{field}: amqps (TLS) is not supported yet"
                )));
            }
        }
        if self.offset_storage.is_some() {
            return Err(config_err("offset_storage is not supported yet"));
        }
        if self.mode == Mode::Restore && self.restore.checkpoint_state.is_some() {
            return Err(config_err(
                "restore.checkpoint_state: resumable restore is not supported yet",
            ));
        }
        Ok(())
    }
}

fn validate_source(source: &SourceConfig) -> Result<()> {
    check_scheme(
        &source.amqp_url,
        "source.amqp_url",
        &["amqp://", "amqps://"],
    )?;
    check_scheme(
        &source.management_url,
        "source.management_url",
        &["http://", "https://"],
    )?;
    check_non_empty(&source.management_username, "source.management_username")?;
    if source.stream_port == 0 {
        return Err(config_err("source.stream_port must be between 1 and 65535"));
    }
    if let Some(tls) = &source.tls {
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err(config_err(
                "source.tls.client_cert and source.tls.client_key must be given together",
            ));
        }
    }
    Ok(())
}

fn validate_target(target: &TargetConfig) -> Result<()> {
    check_scheme(
        &target.amqp_url,
        "target.amqp_url",
        &["amqp://", "amqps://"],
    )?;
    match &target.management_url {
        Some(url) => {
            check_scheme(url, "target.management_url", &["http://", "https://"])?;
            match &target.management_username {
                None => {
                    return Err(config_err(
                        "target.management_username is required when target.management_url is set",
                    ))
                }
                Some(u) => check_non_empty(u, "target.management_username")?,
            }
            if target.management_password.is_none() {
                return Err(config_err(
                    "target.management_password is required when target.management_url is set",
                ));
            }
        }
        None => {
            if target.management_username.is_some() || target.management_password.is_some() {
                return Err(config_err(
                    "target.management_url is required when target.management_username or target.management_password is set",
                ));
            }
        }
    }
    Ok(())
}

fn validate_backup_options(b: &BackupOptions) -> Result<()> {
    check_positive(b.segment_max_bytes, "backup.segment_max_bytes")?;
    check_positive(b.segment_max_interval_ms, "backup.segment_max_interval_ms")?;
    if b.compression == CompressionKind::Zstd && !(1..=22).contains(&b.compression_level) {
        return Err(config_err(format!(
            "backup.compression_level must be between 1 and 22 for zstd, got {}",
            b.compression_level
        )));
    }
    if b.max_concurrent_queues == 0 {
        return Err(config_err(
            "backup.max_concurrent_queues must be at least 1",
        ));
    }
    check_positive(
        b.checkpoint_interval_secs,
        "backup.checkpoint_interval_secs",
    )?;
    check_positive(b.sync_interval_secs, "backup.sync_interval_secs")?;
    Ok(())
}

fn validate_restore_options(r: &RestoreOptions) -> Result<()> {
    if let (Some(start), Some(end)) = (r.time_window_start, r.time_window_end) {
        if start > end {
            return Err(config_err(format!(
                "restore.time_window_start ({start}) must not be after restore.time_window_end ({end})"
            )));
        }
    }
    if r.max_concurrent_queues == 0 {
        return Err(config_err(
            "restore.max_concurrent_queues must be at least 1",
        ));
    }
    if r.produce_batch_size == 0 {
        return Err(config_err("restore.produce_batch_size must be at least 1"));
    }
    check_positive(
        r.checkpoint_interval_secs,
        "restore.checkpoint_interval_secs",
    )?;
    check_mapping(&r.queue_mapping, "restore.queue_mapping", false)?;
    check_mapping(&r.vhost_mapping, "restore.vhost_mapping", false)?;
    // Mapping to "" (the default exchange) is allowed.
    check_mapping(&r.exchange_mapping, "restore.exchange_mapping", true)?;
    if let Some(p) = &r.checkpoint_state {
        if p.as_os_str().is_empty() {
            return Err(config_err("restore.checkpoint_state must not be empty"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL_BACKUP: &str = "\
mode: backup
backup_id: b1
source:
  amqp_url: amqp://guest:guest@localhost:5672/%2f
  management_url: http://localhost:15672
  management_username: guest
  management_password: guest
storage:
  backend: filesystem
  path: /tmp/backups
";

    const MINIMAL_RESTORE: &str = "\
mode: restore
backup_id: b1
target:
  amqp_url: amqp://guest:guest@localhost:5672/%2f
  management_url: http://localhost:15672
  management_username: guest
  management_password: guest
storage:
  backend: memory
";

    /// Parses and interpolates without validating.
    fn parse(yaml: &str) -> Result<Config> {
        let mut c: Config =
            serde_norway::from_str(yaml).map_err(|e| Error::Serialization(e.to_string()))?;
        c.interpolate_env()?;
        Ok(c)
    }

    fn parsed(yaml: &str) -> Config {
        match parse(yaml) {
            Ok(c) => c,
            Err(e) => panic!("parse failed: {e}"),
        }
    }

    fn backup() -> Config {
        parsed(MINIMAL_BACKUP)
    }

    fn restore() -> Config {
        parsed(MINIMAL_RESTORE)
    }

    /// The message of the `Error::Config` that `validate` returns.
    fn invalid(c: &Config) -> String {
        match c.validate() {
            Err(Error::Config(m)) => m,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    /// The message of the `Error::Serialization` that loading `yaml` returns.
    fn serde_err(yaml: &str) -> String {
        match Config::from_yaml_str(yaml) {
            Err(Error::Serialization(m)) => m,
            other => panic!("expected a Serialization error, got {other:?}"),
        }
    }

    fn load_err(yaml: &str) -> String {
        match Config::from_yaml_str(yaml) {
            Err(Error::Config(m)) => m,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    const FULL: &str = "\
mode: backup
backup_id: full-1
source:
  amqp_url: amqps://user:pw@broker:5671/prod
  management_url: https://broker:15671
  management_username: admin
  management_password: s3cretpw
  stream_port: 5551
  tls:
    enabled: true
    ca_cert: /etc/ca.pem
    client_cert: /etc/client.pem
    client_key: /etc/client.key
  queues:
    include: ['orders.*', 'q?']
    exclude: ['*.tmp']
    vhosts: ['/', prod]
    types: [classic, quorum, stream]
    min_messages: 7
target:
  amqp_url: amqp://t:tpw@target:5673/%2f
  management_url: http://target:15673
  management_username: tadmin
  management_password: tsecret
storage:
  backend: filesystem
  path: /data/backups
backup:
  segment_max_bytes: 1048576
  segment_max_interval_ms: 1000
  compression: lz4
  compression_level: 9
  prefetch_count: 0
  requeue_strategy: nack
  max_concurrent_queues: 2
  checkpoint_interval_secs: 10
  sync_interval_secs: 20
  include_definitions: false
  stop_at_current_depth: false
  stream_enabled: true
restore:
  time_window_start: 1000
  time_window_end: 2000
  queue_mapping: {a: b, 'with space': 'x/y'}
  vhost_mapping: {'/': restored}
  exchange_mapping: {ex1: ex2}
  publish_mode: direct-to-queue
  publisher_confirms: false
  max_concurrent_queues: 8
  produce_batch_size: 500
  rate_limit_messages_per_sec: 250
  restore_definitions: false
  definitions_dry_run: true
  definitions_selection:
    vhosts: [prod]
    queues: [orders]
    exchanges: [ex1]
  create_missing_queues: true
  checkpoint_state: /var/lib/restore.db
  checkpoint_interval_secs: 15
  dry_run: true
offset_storage:
  backend: memory
  db_path: /var/lib/offsets.db
  s3_key: full-1/state/offsets.db
  sync_interval_secs: 12
metrics:
  enabled: false
  port: 9090
  bind_address: 127.0.0.1
  path: /m
";

    #[test]
    fn full_example_parses_every_field() {
        let c = parsed(FULL);
        assert_eq!(c.mode, Mode::Backup);
        assert_eq!(c.backup_id, "full-1");
        let s = c.source.as_ref().expect("source");
        assert_eq!(s.amqp_url, "amqps://user:pw@broker:5671/prod");
        assert_eq!(s.management_url, "https://broker:15671");
        assert_eq!(s.management_username, "admin");
        assert_eq!(s.management_password.expose(), "s3cretpw");
        assert_eq!(s.stream_port, 5551);
        assert_eq!(
            s.tls,
            Some(TlsConfig {
                enabled: true,
                ca_cert: Some("/etc/ca.pem".into()),
                client_cert: Some("/etc/client.pem".into()),
                client_key: Some("/etc/client.key".into()),
            })
        );
        assert_eq!(
            s.queues,
            Some(QueueSelection {
                include: vec!["orders.*".into(), "q?".into()],
                exclude: vec!["*.tmp".into()],
                vhosts: vec!["/".into(), "prod".into()],
                types: vec![QueueType::Classic, QueueType::Quorum, QueueType::Stream],
                min_messages: 7,
            })
        );
        let t = c.target.as_ref().expect("target");
        assert_eq!(t.amqp_url, "amqp://t:tpw@target:5673/%2f");
        assert_eq!(t.management_url.as_deref(), Some("http://target:15673"));
        assert_eq!(t.management_username.as_deref(), Some("tadmin"));
        assert_eq!(t.management_password, Some(Secret::new("tsecret")));
        assert_eq!(
            c.storage,
            StorageConfig::Filesystem(FilesystemStorage {
                path: "/data/backups".into()
            })
        );
        assert_eq!(
            c.backup,
            BackupOptions {
                segment_max_bytes: 1_048_576,
                segment_max_interval_ms: 1000,
                compression: CompressionKind::Lz4,
                compression_level: 9,
                prefetch_count: Some(0),
                requeue_strategy: RequeueStrategy::Nack,
                max_concurrent_queues: 2,
                checkpoint_interval_secs: 10,
                sync_interval_secs: 20,
                include_definitions: false,
                stop_at_current_depth: false,
                stream_enabled: true,
            }
        );
        let r = &c.restore;
        assert_eq!(r.time_window_start, Some(1000));
        assert_eq!(r.time_window_end, Some(2000));
        assert_eq!(r.queue_mapping.get("a").map(String::as_str), Some("b"));
        assert_eq!(
            r.queue_mapping.get("with space").map(String::as_str),
            Some("x/y")
        );
        assert_eq!(r.queue_mapping.len(), 2);
        assert_eq!(
            r.vhost_mapping.get("/").map(String::as_str),
            Some("restored")
        );
        assert_eq!(
            r.exchange_mapping.get("ex1").map(String::as_str),
            Some("ex2")
        );
        assert_eq!(r.publish_mode, PublishMode::DirectToQueue);
        assert!(!r.publisher_confirms);
        assert_eq!(r.max_concurrent_queues, 8);
        assert_eq!(r.produce_batch_size, 500);
        assert_eq!(r.rate_limit_messages_per_sec, 250);
        assert!(!r.restore_definitions);
        assert!(r.definitions_dry_run);
        assert_eq!(
            r.definitions_selection,
            DefinitionsSelection {
                vhosts: vec!["prod".into()],
                queues: vec!["orders".into()],
                exchanges: vec!["ex1".into()],
            }
        );
        assert!(r.create_missing_queues);
        assert_eq!(
            r.checkpoint_state,
            Some(PathBuf::from("/var/lib/restore.db"))
        );
        assert_eq!(r.checkpoint_interval_secs, 15);
        assert!(r.dry_run);
        assert_eq!(
            c.offset_storage,
            Some(OffsetStorageConfig {
                backend: OffsetBackend::Memory,
                db_path: "/var/lib/offsets.db".into(),
                s3_key: Some("full-1/state/offsets.db".into()),
                sync_interval_secs: 12,
            })
        );
        assert_eq!(
            c.metrics,
            Some(MetricsConfig {
                enabled: false,
                port: 9090,
                bind_address: "127.0.0.1".into(),
                path: "/m".into(),
            })
        );
        // Parses, but uses features not implemented yet.
        assert!(invalid(&c).contains("not supported yet"));
    }

    #[test]
    fn minimal_backup_gets_every_default() {
        let c = Config::from_yaml_str(MINIMAL_BACKUP).expect("valid");
        assert_eq!(c.mode, Mode::Backup);
        assert!(c.target.is_none());
        assert!(c.offset_storage.is_none());
        assert!(c.metrics.is_none());
        let s = c.source.as_ref().expect("source");
        assert_eq!(s.stream_port, 5552);
        assert!(s.tls.is_none());
        assert!(s.queues.is_none());
        let b = &c.backup;
        assert_eq!(b.segment_max_bytes, 134_217_728);
        assert_eq!(b.segment_max_interval_ms, 60_000);
        assert_eq!(b.compression, CompressionKind::Zstd);
        assert_eq!(b.compression_level, 3);
        assert_eq!(b.prefetch_count, None, "unset: the backup does not warn");
        assert_eq!(b.requeue_strategy, RequeueStrategy::Cancel);
        assert_eq!(b.max_concurrent_queues, 4);
        assert_eq!(b.checkpoint_interval_secs, 5);
        assert_eq!(b.sync_interval_secs, 30);
        assert!(b.include_definitions);
        assert!(b.stop_at_current_depth);
        assert!(!b.stream_enabled);
        let r = &c.restore;
        assert_eq!(r.time_window_start, None);
        assert_eq!(r.time_window_end, None);
        assert!(r.queue_mapping.is_empty());
        assert!(r.vhost_mapping.is_empty());
        assert!(r.exchange_mapping.is_empty());
        assert_eq!(r.publish_mode, PublishMode::Exchange);
        assert!(r.publisher_confirms);
        assert_eq!(r.max_concurrent_queues, 4);
        assert_eq!(r.produce_batch_size, 100);
        assert_eq!(r.rate_limit_messages_per_sec, 0);
        assert!(r.restore_definitions);
        assert!(!r.definitions_dry_run);
        assert!(r.definitions_selection.is_empty());
        assert!(!r.create_missing_queues);
        assert_eq!(r.checkpoint_state, None);
        assert_eq!(r.checkpoint_interval_secs, 60);
        assert!(!r.dry_run);
    }

    #[test]
    fn section_defaults() {
        let c = parsed(&format!(
            "{MINIMAL_BACKUP}offset_storage: {{}}\nmetrics: {{}}\n"
        ));
        assert_eq!(
            c.offset_storage,
            Some(OffsetStorageConfig {
                backend: OffsetBackend::Sqlite,
                db_path: "./offsets.db".into(),
                s3_key: None,
                sync_interval_secs: 30,
            })
        );
        assert_eq!(
            c.metrics,
            Some(MetricsConfig {
                enabled: true,
                port: 8080,
                bind_address: "0.0.0.0".into(),
                path: "/metrics".into(),
            })
        );
        let c = parsed(&MINIMAL_BACKUP.replace(
            "  management_password: guest\n",
            "  management_password: guest\n  tls: {}\n  queues: {}\n",
        ));
        let s = c.source.expect("source");
        assert_eq!(s.tls, Some(TlsConfig::default()));
        assert!(!TlsConfig::default().enabled);
        assert_eq!(s.queues, Some(QueueSelection::default()));
        assert_eq!(QueueSelection::default().min_messages, 0);
        // An empty section (YAML null) takes the defaults.
        let c = parsed(&format!("{MINIMAL_BACKUP}backup:\nrestore:\n"));
        assert_eq!(c.backup, BackupOptions::default());
        assert_eq!(c.restore, RestoreOptions::default());
    }

    #[test]
    fn minimal_restore() {
        let c = Config::from_yaml_str(MINIMAL_RESTORE).expect("valid");
        assert_eq!(c.mode, Mode::Restore);
        assert!(c.source.is_none());
        assert_eq!(c.storage, StorageConfig::Memory);
        assert_eq!(c.storage.backend_name(), "memory");
        let t = c.require_target().expect("target");
        assert_eq!(t.management_username.as_deref(), Some("guest"));
        // Without management access, restore_definitions must be turned off.
        let yaml = "\
mode: restore
backup_id: b1
target:
  amqp_url: amqp://localhost
storage:
  backend: memory
restore:
  restore_definitions: false
";
        let c = Config::from_yaml_str(yaml).expect("valid");
        let t = c.target.expect("target");
        assert_eq!(t.management_url, None);
        assert_eq!(t.management_username, None);
        assert_eq!(t.management_password, None);
    }

    #[test]
    fn missing_sections() {
        let mut c = backup();
        c.source = None;
        assert_eq!(invalid(&c), "Source configuration required for backup");
        assert_eq!(
            c.validate().map_err(|e| e.to_string()),
            Err("Configuration error: Source configuration required for backup".to_string())
        );
        let mut c = restore();
        c.target = None;
        assert_eq!(invalid(&c), "Target configuration required for restore");
        // A restore config does not need a source, nor a backup config a target.
        assert!(restore().validate().is_ok());
        assert!(backup().validate().is_ok());
        // Missing required top-level fields are YAML errors.
        assert!(serde_err("mode: backup\nstorage: {backend: memory}\n").contains("backup_id"));
        assert!(serde_err("backup_id: x\nstorage: {backend: memory}\n").contains("mode"));
        assert!(serde_err("mode: backup\nbackup_id: x\n").contains("storage"));
        assert!(
            serde_err(&MINIMAL_BACKUP.replace("  management_username: guest\n", ""))
                .contains("missing field `management_username`")
        );
    }

    #[test]
    fn backup_id_rules() {
        for (id, want) in [
            ("", "backup_id must not be empty"),
            ("a/b", "must not contain / or \\"),
            ("a\\b", "must not contain / or \\"),
            (".", "backup_id must not be \".\""),
            ("..", "backup_id must not be \"..\""),
            ("a\nb", "control characters"),
            ("a\u{7f}", "control characters"),
        ] {
            let mut c = backup();
            c.backup_id = id.to_string();
            let m = invalid(&c);
            assert!(m.contains(want), "{id:?}: {m}");
        }
        for id in [
            "nightly-2024-01-01",
            "a.b",
            "...",
            "with space",
            "日本",
            "_default",
        ] {
            let mut c = backup();
            c.backup_id = id.to_string();
            assert!(c.validate().is_ok(), "{id:?}");
        }
    }

    #[test]
    fn backup_option_ranges() {
        let check = |f: &dyn Fn(&mut BackupOptions), want: &str| {
            let mut c = backup();
            f(&mut c.backup);
            assert_eq!(invalid(&c), want);
        };
        check(
            &|b| b.compression_level = 0,
            "backup.compression_level must be between 1 and 22 for zstd, got 0",
        );
        check(
            &|b| b.compression_level = 23,
            "backup.compression_level must be between 1 and 22 for zstd, got 23",
        );
        check(
            &|b| b.compression_level = -1,
            "backup.compression_level must be between 1 and 22 for zstd, got -1",
        );
        check(
            &|b| b.segment_max_bytes = 0,
            "backup.segment_max_bytes must be greater than 0",
        );
        check(
            &|b| b.segment_max_interval_ms = 0,
            "backup.segment_max_interval_ms must be greater than 0",
        );
        check(
            &|b| b.max_concurrent_queues = 0,
            "backup.max_concurrent_queues must be at least 1",
        );
        check(
            &|b| b.checkpoint_interval_secs = 0,
            "backup.checkpoint_interval_secs must be greater than 0",
        );
        check(
            &|b| b.sync_interval_secs = 0,
            "backup.sync_interval_secs must be greater than 0",
        );
        for level in [1, 22] {
            let mut c = backup();
            c.backup.compression_level = level;
            assert!(c.validate().is_ok(), "level {level}");
        }
        for kind in [CompressionKind::Lz4, CompressionKind::None] {
            let mut c = backup();
            c.backup.compression = kind;
            c.backup.compression_level = 99;
            assert!(c.validate().is_ok(), "level ignored for {kind:?}");
        }
        let mut c = backup();
        c.backup.prefetch_count = Some(0);
        assert!(c.validate().is_ok(), "prefetch 0 = unlimited");
    }

    #[test]
    fn restore_option_ranges() {
        let check = |f: &dyn Fn(&mut RestoreOptions), want: &str| {
            let mut c = restore();
            f(&mut c.restore);
            assert_eq!(invalid(&c), want);
        };
        check(
            &|r| {
                r.time_window_start = Some(2);
                r.time_window_end = Some(1);
            },
            "restore.time_window_start (2) must not be after restore.time_window_end (1)",
        );
        check(
            &|r| r.max_concurrent_queues = 0,
            "restore.max_concurrent_queues must be at least 1",
        );
        check(
            &|r| r.produce_batch_size = 0,
            "restore.produce_batch_size must be at least 1",
        );
        check(
            &|r| r.checkpoint_interval_secs = 0,
            "restore.checkpoint_interval_secs must be greater than 0",
        );
        check(
            &|r| {
                r.queue_mapping.insert("a".into(), String::new());
            },
            "restore.queue_mapping maps \"a\" to an empty name",
        );
        check(
            &|r| {
                r.vhost_mapping.insert("/".into(), String::new());
            },
            "restore.vhost_mapping maps \"/\" to an empty name",
        );
        check(
            &|r| {
                r.queue_mapping.insert("a".into(), "x".repeat(256));
            },
            "restore.queue_mapping maps \"a\" to a name longer than 255 bytes",
        );
        let mut c = restore();
        c.restore.time_window_start = Some(5);
        c.restore.time_window_end = Some(5);
        c.restore.exchange_mapping.insert("e".into(), String::new());
        c.restore.queue_mapping.insert("a".into(), "x".repeat(255));
        assert!(
            c.validate().is_ok(),
            "equal window, default exchange, 255 bytes"
        );
        c.restore.time_window_end = None;
        assert!(c.validate().is_ok(), "open window");
    }

    #[test]
    fn url_rules() {
        let mut c = backup();
        c.source.as_mut().expect("source").amqp_url = "http://guest:pw@h".into();
        let m = invalid(&c);
        assert_eq!(m, "source.amqp_url must start with amqp:// or amqps://");
        let mut c = backup();
        c.source.as_mut().expect("source").amqp_url = "guest:topsecret@h".into();
        assert!(!invalid(&c).contains("topsecret"));
        let mut c = backup();
        c.source.as_mut().expect("source").amqp_url = "amqp://".into();
        assert!(invalid(&c).contains("source.amqp_url"), "scheme alone");
        let mut c = backup();
        c.source.as_mut().expect("source").amqp_url = "AMQPS://h".into();
        assert!(c.validate().is_ok(), "scheme is case-insensitive");
        let mut c = backup();
        c.source.as_mut().expect("source").management_url = "localhost:15672".into();
        assert_eq!(
            invalid(&c),
            "source.management_url must start with http:// or https://"
        );
        let mut c = backup();
        c.source.as_mut().expect("source").stream_port = 0;
        assert_eq!(
            invalid(&c),
            "source.stream_port must be between 1 and 65535"
        );
        let mut c = backup();
        c.source.as_mut().expect("source").management_username = " ".into();
        assert_eq!(invalid(&c), "source.management_username must not be empty");
        let mut c = restore();
        c.target.as_mut().expect("target").amqp_url = "amqp:/x".into();
        assert_eq!(
            invalid(&c),
            "target.amqp_url must start with amqp:// or amqps://"
        );
        let mut c = restore();
        c.target.as_mut().expect("target").management_url = Some("ftp://x".into());
        assert_eq!(
            invalid(&c),
            "target.management_url must start with http:// or https://"
        );
    }

    #[test]
    fn target_management_rules() {
        let mut c = restore();
        c.target.as_mut().expect("target").management_url = None;
        c.target.as_mut().expect("target").management_username = None;
        c.target.as_mut().expect("target").management_password = None;
        assert_eq!(
            invalid(&c),
            "target.management_url is required when restore.restore_definitions is true"
        );
        c.restore.restore_definitions = false;
        assert!(c.validate().is_ok());
        c.restore.create_missing_queues = true;
        assert_eq!(
            invalid(&c),
            "target.management_url is required when restore.create_missing_queues is true"
        );
        let mut c = restore();
        c.target.as_mut().expect("target").management_username = None;
        assert_eq!(
            invalid(&c),
            "target.management_username is required when target.management_url is set"
        );
        let mut c = restore();
        c.target.as_mut().expect("target").management_password = None;
        assert_eq!(
            invalid(&c),
            "target.management_password is required when target.management_url is set"
        );
        let mut c = restore();
        c.restore.restore_definitions = false;
        c.target.as_mut().expect("target").management_url = None;
        assert_eq!(
            invalid(&c),
            "target.management_url is required when target.management_username or target.management_password is set"
        );
        // Backup mode does not need the target's management access.
        let mut c = backup();
        c.target = Some(TargetConfig {
            amqp_url: "amqp://h".into(),
            management_url: None,
            management_username: None,
            management_password: None,
        });
        assert!(c.validate().is_ok());
    }

    #[test]
    fn storage_rules() {
        let mut c = backup();
        c.storage = StorageConfig::Filesystem(FilesystemStorage {
            path: PathBuf::new(),
        });
        assert_eq!(invalid(&c), "storage.path must not be empty");
        let s3 = |f: &dyn Fn(&mut S3Storage)| {
            let mut s = S3Storage {
                bucket: "b".into(),
                region: None,
                endpoint: None,
                access_key: None,
                secret_key: None,
                prefix: None,
                path_style: false,
                allow_http: false,
            };
            f(&mut s);
            let mut c = backup();
            c.storage = StorageConfig::S3(s);
            invalid(&c)
        };
        assert_eq!(
            s3(&|s| s.bucket = String::new()),
            "storage.bucket must not be empty"
        );
        assert_eq!(
            s3(&|s| s.endpoint = Some("http://127.0.0.1:8333".into())),
            "storage.allow_http must be true when storage.endpoint uses http://"
        );
        assert_eq!(
            s3(&|s| s.endpoint = Some("127.0.0.1:8333".into())),
            "storage.endpoint must start with http:// or https://"
        );
        assert_eq!(
            s3(&|s| s.access_key = Some(Secret::new("k"))),
            "storage.access_key and storage.secret_key must be given together"
        );
        assert!(s3(&|s| s.prefix = Some("../up".into())).starts_with("storage.prefix"));
        assert!(s3(&|s| s.prefix = Some("/abs".into())).starts_with("storage.prefix"));
        let mut c = backup();
        c.storage = StorageConfig::S3(S3Storage {
            bucket: "b".into(),
            region: None,
            endpoint: Some("http://127.0.0.1:8333".into()),
            access_key: None,
            secret_key: None,
            prefix: Some("team/a".into()),
            path_style: true,
            allow_http: true,
        });
        assert_eq!(c.validate(), Ok(()), "a valid s3 config");
        let mut c = backup();
        c.storage = StorageConfig::Azure(AzureStorage {
            account_name: "acct".into(),
            container_name: String::new(),
            account_key: None,
            prefix: None,
            endpoint: None,
            use_workload_identity: None,
            client_id: None,
            tenant_id: None,
            client_secret: None,
            sas_token: None,
        });
        assert_eq!(invalid(&c), "storage.container_name must not be empty");
        let mut c = backup();
        c.storage = StorageConfig::Gcs(GcsStorage {
            bucket: "".into(),
            service_account_path: None,
            prefix: None,
        });
        assert_eq!(invalid(&c), "storage.bucket must not be empty");
    }

    #[test]
    fn storage_yaml_shapes() {
        let with_storage = |s: &str| {
            MINIMAL_BACKUP.replace(
                "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
                &format!("storage:\n{s}"),
            )
        };
        let c = parsed(&with_storage(
            "  backend: s3\n  bucket: bk\n  region: eu-west-1\n  endpoint: http://127.0.0.1:8333\n  access_key: AK\n  secret_key: SK\n  prefix: p\n  path_style: true\n  allow_http: true\n",
        ));
        assert_eq!(
            c.storage,
            StorageConfig::S3(S3Storage {
                bucket: "bk".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:8333".into()),
                access_key: Some(Secret::new("AK")),
                secret_key: Some(Secret::new("SK")),
                prefix: Some("p".into()),
                path_style: true,
                allow_http: true,
            })
        );
        let c = parsed(&with_storage("  backend: s3\n  bucket: bk\n"));
        match &c.storage {
            StorageConfig::S3(s) => {
                assert!(!s.path_style && !s.allow_http);
                assert_eq!((s.region.as_ref(), s.access_key.as_ref()), (None, None));
            }
            other => panic!("{other:?}"),
        }
        let c = parsed(&with_storage(
            "  backend: azure\n  account_name: acct\n  container_name: cont\n  account_key: AKEY\n  prefix: p\n  endpoint: https://x.blob\n  use_workload_identity: true\n  client_id: cid\n  tenant_id: tid\n  client_secret: CSEC\n  sas_token: SAS\n",
        ));
        assert_eq!(
            c.storage,
            StorageConfig::Azure(AzureStorage {
                account_name: "acct".into(),
                container_name: "cont".into(),
                account_key: Some(Secret::new("AKEY")),
                prefix: Some("p".into()),
                endpoint: Some("https://x.blob".into()),
                use_workload_identity: Some(true),
                client_id: Some("cid".into()),
                tenant_id: Some("tid".into()),
                client_secret: Some(Secret::new("CSEC")),
                sas_token: Some(Secret::new("SAS")),
            })
        );
        let c = parsed(&with_storage(
            "  backend: gcs\n  bucket: g\n  service_account_path: /k.json\n  prefix: p\n",
        ));
        assert_eq!(
            c.storage,
            StorageConfig::Gcs(GcsStorage {
                bucket: "g".into(),
                service_account_path: Some("/k.json".into()),
                prefix: Some("p".into()),
            })
        );
        // The tag may come after the other fields.
        let c = parsed(&with_storage("  path: /x\n  backend: filesystem\n"));
        assert_eq!(c.storage.backend_name(), "filesystem");
        // Numeric-looking secrets stay text, unchanged.
        let c = parsed(&with_storage(
            "  backend: s3\n  bucket: 0123\n  access_key: 007\n  secret_key: 1e3\n",
        ));
        match &c.storage {
            StorageConfig::S3(s) => {
                assert_eq!(s.bucket, "0123");
                assert_eq!(s.access_key.as_ref().map(Secret::expose), Some("007"));
                assert_eq!(s.secret_key.as_ref().map(Secret::expose), Some("1e3"));
            }
            other => panic!("{other:?}"),
        }
        // Errors.
        let m = serde_err(&with_storage(
            "  backend: filesystem\n  path: /x\n  bukket: b\n",
        ));
        assert!(m.starts_with("storage: unknown field `bukket`"), "{m}");
        assert!(m.contains("at line 11 column 3"), "{m}");
        let m = serde_err(&with_storage("  backend: s3\n  bucket: b\n  path: /x\n"));
        assert!(
            m.contains("storage: field `path` does not apply to backend s3"),
            "{m}"
        );
        let m = serde_err(&with_storage("  backend: memory\n  path: /x\n"));
        assert!(
            m.contains("storage: field `path` does not apply to backend memory"),
            "{m}"
        );
        let m = serde_err(&with_storage("  backend: s3\n  region: r\n"));
        assert!(
            m.contains("storage: missing field `bucket` for backend s3"),
            "{m}"
        );
        let m = serde_err(&with_storage("  backend: filesystem\n"));
        assert!(
            m.contains("storage: missing field `path` for backend filesystem"),
            "{m}"
        );
        let m = serde_err(&with_storage("  backend: azure\n  account_name: a\n"));
        assert!(
            m.contains("missing field `container_name` for backend azure"),
            "{m}"
        );
        let m = serde_err(&with_storage("  path: /x\n"));
        assert!(m.contains("storage: missing field `backend`"), "{m}");
        let m = serde_err(&with_storage("  backend: Filesystem\n  path: /x\n"));
        assert!(m.contains("unknown variant `Filesystem`"), "{m}");
        assert!(m.contains("at line 9 column 12"), "{m}");
        let m = serde_err(&with_storage("  backend: ftp\n"));
        assert!(m.contains("unknown variant `ftp`"), "{m}");
        let m = serde_err(&with_storage(
            "  backend: s3\n  bucket: b\n  path_style: maybe\n",
        ));
        assert!(m.contains("storage.path_style"), "{m}");
    }

    #[test]
    fn not_yet_supported() {
        let check = |f: &dyn Fn(&mut Config), base: Config, want: &str| {
            let mut c = base;
            f(&mut c);
            assert_eq!(invalid(&c), want);
            assert_eq!(
                c.check_supported().map_err(|e| e.message().to_string()),
                Err(want.to_string())
            );
        };
        check(
            &|c| {
                c.source.as_mut().expect("source").tls = Some(TlsConfig {
                    enabled: true,
                    ..Default::default()
                })
            },
            backup(),
            "source.tls.enabled: TLS is not supported yet",
        );
        check(
            &|c| c.backup.stream_enabled = true,
            backup(),
            "backup.stream_enabled: the stream protocol is not supported yet",
        );
        check(
            &|c| c.backup.stop_at_current_depth = false,
            backup(),
            "continuous backup (backup.stop_at_current_depth: false) is not supported yet",
        );
        check(
            &|c| c.offset_storage = Some(OffsetStorageConfig::default()),
            backup(),
            "offset_storage is not supported yet",
        );
        check(
            &|c| c.restore.checkpoint_state = Some("/tmp/r.db".into()),
            restore(),
            "restore.checkpoint_state: resumable restore is not supported yet",
        );
        // Disabled or irrelevant settings are accepted.
        let mut c = backup();
        c.source.as_mut().expect("source").tls = Some(TlsConfig {
            enabled: false,
            ca_cert: Some("/ca.pem".into()),
            client_cert: None,
            client_key: None,
        });
        c.metrics = Some(MetricsConfig {
            enabled: false,
            ..Default::default()
        });
        c.restore.checkpoint_state = Some("/tmp/r.db".into());
        assert!(c.validate().is_ok(), "{:?}", c.validate());
        let mut c = restore();
        c.backup.stream_enabled = true;
        c.backup.stop_at_current_depth = false;
        assert!(
            c.validate().is_ok(),
            "backup options do not matter for restore"
        );
    }

    #[test]
    fn section_value_rules() {
        let mut c = backup();
        c.source.as_mut().expect("source").tls = Some(TlsConfig {
            enabled: false,
            ca_cert: None,
            client_cert: Some("/c.pem".into()),
            client_key: None,
        });
        assert_eq!(
            invalid(&c),
            "source.tls.client_cert and source.tls.client_key must be given together"
        );
        let mut c = backup();
        c.metrics = Some(MetricsConfig {
            enabled: false,
            path: "metrics".into(),
            ..Default::default()
        });
        assert_eq!(invalid(&c), "metrics.path must start with /");
        let mut c = backup();
        c.metrics = Some(MetricsConfig {
            enabled: false,
            path: "/health".into(),
            ..Default::default()
        });
        assert!(invalid(&c).starts_with("metrics.path must not be /health"));
        let mut c = backup();
        c.metrics = Some(MetricsConfig {
            enabled: false,
            bind_address: String::new(),
            ..Default::default()
        });
        assert_eq!(invalid(&c), "metrics.bind_address must not be empty");
        let mut c = backup();
        c.offset_storage = Some(OffsetStorageConfig {
            sync_interval_secs: 0,
            ..Default::default()
        });
        assert_eq!(
            invalid(&c),
            "offset_storage.sync_interval_secs must be greater than 0"
        );
        let mut c = backup();
        c.offset_storage = Some(OffsetStorageConfig {
            db_path: PathBuf::new(),
            ..Default::default()
        });
        assert_eq!(invalid(&c), "offset_storage.db_path must not be empty");
    }

    #[test]
    fn enum_values_are_lowercase_only() {
        let m = serde_err(&MINIMAL_BACKUP.replace("mode: backup", "mode: Backup"));
        assert!(m.contains("unknown variant `Backup`"), "{m}");
        assert!(m.contains("at line 1 column 7"), "{m}");
        let m = serde_err(&format!("{MINIMAL_BACKUP}backup:\n  compression: ZSTD\n"));
        assert!(
            m.contains("backup.compression: unknown variant `ZSTD`"),
            "{m}"
        );
        assert!(m.contains("at line 12 column 16"), "{m}");
        let m = serde_err(&format!(
            "{MINIMAL_BACKUP}backup:\n  requeue_strategy: Cancel\n"
        ));
        assert!(
            m.contains("unknown variant `Cancel`") && m.contains("line 12"),
            "{m}"
        );
        let m = serde_err(&format!(
            "{MINIMAL_RESTORE}restore:\n  publish_mode: direct_to_queue\n"
        ));
        assert!(
            m.contains("unknown variant `direct_to_queue`") && m.contains("line"),
            "{m}"
        );
        let m = serde_err(&MINIMAL_BACKUP.replace(
            "  management_password: guest\n",
            "  management_password: guest\n  queues:\n    types: [Classic]\n",
        ));
        assert!(
            m.contains("unknown variant `Classic`") && m.contains("line 9 column 13"),
            "{m}"
        );
        for (yaml, want) in [
            (
                format!("{MINIMAL_BACKUP}backup:\n  compression: lz4\n"),
                CompressionKind::Lz4,
            ),
            (
                format!("{MINIMAL_BACKUP}backup:\n  compression: none\n"),
                CompressionKind::None,
            ),
        ] {
            assert_eq!(parsed(&yaml).backup.compression, want);
        }
        for (name, want) in [
            ("cancel", RequeueStrategy::Cancel),
            ("nack", RequeueStrategy::Nack),
            ("reject", RequeueStrategy::Reject),
            ("get", RequeueStrategy::Get),
        ] {
            let yaml = format!("{MINIMAL_BACKUP}backup:\n  requeue_strategy: {name}\n");
            assert_eq!(parsed(&yaml).backup.requeue_strategy, want);
        }
        let yaml = format!("{MINIMAL_RESTORE}restore:\n  publish_mode: exchange\n");
        assert_eq!(parsed(&yaml).restore.publish_mode, PublishMode::Exchange);
    }

    #[test]
    fn yaml_syntax_and_type_errors() {
        let m = serde_err(&MINIMAL_BACKUP.replace("  path: /tmp/backups", "\tpath: /tmp/backups"));
        assert!(m.contains("at line 10 column 1"), "tabs: {m}");
        let m = serde_err(&format!(
            "{MINIMAL_BACKUP}backup:\n  prefetch_count: 70000\n"
        ));
        assert!(
            m.contains("backup.prefetch_count") && m.contains("line 12"),
            "{m}"
        );
        let m = serde_err(&format!(
            "{MINIMAL_BACKUP}backup:\n  segment_max_bytes: -1\n"
        ));
        assert!(
            m.contains("backup.segment_max_bytes") && m.contains("line 12"),
            "{m}"
        );
        let m = serde_err(&format!(
            "{MINIMAL_BACKUP}backup:\n  include_definitions: yes\n"
        ));
        assert!(m.contains("backup.include_definitions"), "{m}");
        let m = serde_err("[1, 2]");
        assert!(m.contains("expected struct Config"), "{m}");
        let m = serde_err("");
        assert!(m.contains("mode"), "empty file: {m}");
        let m = serde_err("mode: backup\nmode: restore\n");
        assert!(m.contains("duplicate"), "{m}");
        let m = serde_err(&format!(
            "{MINIMAL_RESTORE}restore:\n  time_window_start: soon\n"
        ));
        assert!(m.contains("restore.time_window_start"), "{m}");
        // A serialization error displays with its category prefix.
        let e = Config::from_yaml_str("mode: Backup").expect_err("invalid");
        assert!(e.to_string().starts_with("Serialization error: "), "{e}");
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let m = serde_err(&format!("{MINIMAL_BACKUP}extra: 1\n"));
        assert!(
            m.contains("unknown field `extra`") && m.contains("line 11"),
            "{m}"
        );
        let m = serde_err(&format!("{MINIMAL_BACKUP}backup:\n  compresion: lz4\n"));
        assert!(
            m.contains("backup: unknown field `compresion`") && m.contains("line 12"),
            "{m}"
        );
        let m = serde_err(&format!("{MINIMAL_RESTORE}restore:\n  dryrun: true\n"));
        assert!(m.contains("restore: unknown field `dryrun`"), "{m}");
        let m = serde_err(&format!(
            "{MINIMAL_RESTORE}restore:\n  definitions_selection:\n    queue: [a]\n"
        ));
        assert!(m.contains("unknown field `queue`"), "{m}");
        let m = serde_err(&MINIMAL_BACKUP.replace("  management_username", "  management_user"));
        assert!(m.contains("source: unknown field `management_user`"), "{m}");
        let m = serde_err(&MINIMAL_RESTORE.replace("  management_url", "  mgmt_url"));
        assert!(m.contains("target: unknown field `mgmt_url`"), "{m}");
        let m = serde_err(&MINIMAL_BACKUP.replace(
            "  management_password: guest\n",
            "  management_password: guest\n  queues:\n    includes: [a]\n",
        ));
        assert!(m.contains("unknown field `includes`"), "{m}");
        let m = serde_err(&MINIMAL_BACKUP.replace(
            "  management_password: guest\n",
            "  management_password: guest\n  tls:\n    verify: false\n",
        ));
        assert!(m.contains("unknown field `verify`"), "{m}");
        let m = serde_err(&format!("{MINIMAL_BACKUP}metrics:\n  host: x\n"));
        assert!(m.contains("unknown field `host`"), "{m}");
        let m = serde_err(&format!("{MINIMAL_BACKUP}offset_storage:\n  path: x\n"));
        assert!(m.contains("unknown field `path`"), "{m}");
    }

    #[test]
    fn env_interpolation() {
        std::env::set_var("RMQB_CFGTEST_PW1", "from-env-pw");
        std::env::set_var("RMQB_CFGTEST_USER1", "alice");
        std::env::set_var("RMQB_CFGTEST_HOST1", "broker.local");
        let yaml = MINIMAL_BACKUP
            .replace(
                "amqp_url: amqp://guest:guest@localhost:5672/%2f",
                "amqp_url: amqp://${RMQB_CFGTEST_USER1}:${RMQB_CFGTEST_PW1}@${RMQB_CFGTEST_HOST1}:5672/%2f",
            )
            .replace(
                "management_password: guest",
                "management_password: ${RMQB_CFGTEST_PW1}",
            );
        let c = Config::from_yaml_str(&yaml).expect("valid");
        let s = c.source.expect("source");
        assert_eq!(s.amqp_url, "amqp://alice:from-env-pw@broker.local:5672/%2f");
        assert_eq!(s.management_password.expose(), "from-env-pw");
        // Other fields are not interpolated.
        assert_eq!(s.management_username, "guest");

        // Target fields.
        std::env::set_var("RMQB_CFGTEST_PW2", "tpw");
        let yaml = MINIMAL_RESTORE
            .replace("guest:guest@", "guest:${RMQB_CFGTEST_PW2}@")
            .replace(
                "management_password: guest",
                "management_password: ${RMQB_CFGTEST_PW2}",
            );
        let c = Config::from_yaml_str(&yaml).expect("valid");
        let t = c.target.expect("target");
        assert_eq!(t.amqp_url, "amqp://guest:tpw@localhost:5672/%2f");
        assert_eq!(t.management_password, Some(Secret::new("tpw")));

        // Unset variable.
        let yaml = MINIMAL_BACKUP.replace(
            "management_password: guest",
            "management_password: ${RMQB_CFGTEST_UNSET_A}",
        );
        assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_A referenced in source.management_password is not set"
        );
        let yaml = MINIMAL_RESTORE.replace("guest:guest@", "guest:${RMQB_CFGTEST_UNSET_B}@");
        assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_B referenced in target.amqp_url is not set"
        );
        let yaml = MINIMAL_BACKUP.replace("guest:guest@", "guest:${RMQB_CFGTEST_UNSET_C}@");
        assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_C referenced in source.amqp_url is not set"
        );
        let yaml = MINIMAL_RESTORE.replace(
            "management_password: guest",
            "management_password: ${RMQB_CFGTEST_UNSET_D}",
        );
        assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_D referenced in target.management_password is not set"
        );
    }

    #[test]
    fn env_interpolation_edge_cases() {
        std::env::set_var("RMQB_CFGTEST_E1", "v1");
        std::env::set_var("RMQB_CFGTEST_EMPTY", "");
        let f = "source.management_password";
        assert_eq!(interpolate("plain", f), Ok("plain".to_string()));
        assert_eq!(interpolate("${RMQB_CFGTEST_E1}", f), Ok("v1".to_string()));
        assert_eq!(
            interpolate("a${RMQB_CFGTEST_E1}b${RMQB_CFGTEST_E1}c", f),
            Ok("av1bv1c".to_string())
        );
        assert_eq!(
            interpolate("x${RMQB_CFGTEST_EMPTY}y", f),
            Ok("xy".to_string())
        );
        assert_eq!(
            interpolate("$${RMQB_CFGTEST_E1}", f),
            Ok("${RMQB_CFGTEST_E1}".to_string())
        );
        assert_eq!(interpolate("pa$$word$", f), Ok("pa$$word$".to_string()));
        assert_eq!(
            interpolate("$HOME", f),
            Ok("$HOME".to_string()),
            "only ${{...}}"
        );
        assert_eq!(
            interpolate("é${RMQB_CFGTEST_E1}日", f),
            Ok("év1日".to_string())
        );
        // Values are not re-expanded.
        std::env::set_var("RMQB_CFGTEST_NESTED", "${RMQB_CFGTEST_E1}");
        assert_eq!(
            interpolate("${RMQB_CFGTEST_NESTED}", f),
            Ok("${RMQB_CFGTEST_E1}".to_string())
        );
        for bad in [
            "${RMQB_CFGTEST_E1",
            "ab${",
            "${}",
            "${A-B}",
            "${1A}",
            "${ A}",
        ] {
            match interpolate(bad, f) {
                Err(Error::Config(m)) => {
                    assert!(m.contains(f), "{bad}: {m}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // The secret around a bad reference is not echoed.
        match interpolate("hunter2${oops", f) {
            Err(e) => assert!(!e.to_string().contains("hunter2"), "{e}"),
            Ok(v) => panic!("{v}"),
        }
    }

    #[test]
    fn env_interpolation_in_storage_secrets() {
        std::env::set_var("RMQB_CFGTEST_AK", "akid");
        std::env::set_var("RMQB_CFGTEST_SK", "skey");
        let yaml = MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: s3\n  bucket: b\n  access_key: ${RMQB_CFGTEST_AK}\n  secret_key: ${RMQB_CFGTEST_SK}\n",
        );
        let c = parsed(&yaml);
        match &c.storage {
            StorageConfig::S3(s) => {
                assert_eq!(s.access_key.as_ref().map(Secret::expose), Some("akid"));
                assert_eq!(s.secret_key.as_ref().map(Secret::expose), Some("skey"));
            }
            other => panic!("{other:?}"),
        }
        let yaml = MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: azure\n  account_name: a\n  container_name: c\n  account_key: ${RMQB_CFGTEST_AK}\n  client_secret: ${RMQB_CFGTEST_SK}\n  sas_token: ${RMQB_CFGTEST_UNSET_SAS}\n",
        );
        assert_eq!(
            load_err(&yaml),
            "Environment variable RMQB_CFGTEST_UNSET_SAS referenced in storage.sas_token is not set"
        );
    }

    #[test]
    fn debug_output_hides_secrets() {
        std::env::set_var("RMQB_CFGTEST_DBG", "EnvSecretValue");
        let yaml = "\
mode: restore
backup_id: dbg
source:
  amqp_url: amqp://u:SrcUrlPw@h/%2f
  management_url: http://admin:MgmtUrlPw@h:15672
  management_username: u
  management_password: SrcMgmtPw
target:
  amqp_url: amqp://u:${RMQB_CFGTEST_DBG}@h/%2f
  management_url: http://h:15672
  management_username: u
  management_password: TgtMgmtPw
storage:
  backend: azure
  account_name: acct
  container_name: cont
  account_key: AzAccountKey
  client_secret: AzClientSecret
  sas_token: AzSasToken
";
        let c = parsed(yaml);
        let dbg = format!("{c:?} {c:#?}");
        for secret in [
            "SrcUrlPw",
            "MgmtUrlPw",
            "SrcMgmtPw",
            "EnvSecretValue",
            "TgtMgmtPw",
            "AzAccountKey",
            "AzClientSecret",
            "AzSasToken",
        ] {
            assert!(!dbg.contains(secret), "{secret} leaked in {dbg}");
        }
        assert!(dbg.contains("amqp://u:****@h/%2f"), "{dbg}");
        assert!(dbg.contains("acct") && dbg.contains("cont"), "{dbg}");
        let s3 = parsed(&MINIMAL_BACKUP.replace(
            "storage:\n  backend: filesystem\n  path: /tmp/backups\n",
            "storage:\n  backend: s3\n  bucket: b\n  access_key: S3AccessKey\n  secret_key: S3SecretKey\n",
        ));
        let dbg = format!("{s3:?}");
        assert!(
            !dbg.contains("S3AccessKey") && !dbg.contains("S3SecretKey"),
            "{dbg}"
        );
        assert!(!dbg.contains("guest:guest"), "{dbg}");
        assert_eq!(format!("{:?}", Secret::new("x")), "****");
        assert_eq!(redact_url("user:pw@host"), "****");
        // A URL without a scheme is hidden entirely.
        let mut c = backup();
        c.source.as_mut().expect("source").amqp_url = "guest:NoSchemePw@h".into();
        assert!(!format!("{c:?}").contains("NoSchemePw"));
    }

    #[test]
    fn load_reports_unreadable_file() {
        let path = Path::new("/nonexistent/rmq-backup/config.yaml");
        match Config::load(path) {
            Err(Error::Config(m)) => {
                assert!(
                    m.starts_with("Cannot read config file /nonexistent/rmq-backup/config.yaml: "),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn load_reads_a_file() {
        let dir = std::env::temp_dir().join(format!("rmqb-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("c.yaml");
        std::fs::write(&path, MINIMAL_BACKUP).expect("write");
        let c = Config::load(&path);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(c.expect("valid").backup_id, "b1");
    }

    #[test]
    fn example_files_load_and_validate() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        // The scratch crate that builds this file lives elsewhere; find the examples.
        let examples = [root.join("examples"), PathBuf::from("/work/main/examples")]
            .into_iter()
            .find(|p| p.join("config.yaml").exists())
            .expect("examples directory");
        let b = Config::load(&examples.join("config.yaml")).expect("config.yaml validates");
        assert_eq!(b.mode, Mode::Backup);
        assert_eq!(b.storage.backend_name(), "filesystem");
        assert!(b.source.as_ref().and_then(|s| s.queues.as_ref()).is_some());
        let r = Config::load(&examples.join("restore.yaml")).expect("restore.yaml validates");
        assert_eq!(r.mode, Mode::Restore);
        assert_eq!(
            r.backup_id, b.backup_id,
            "the restore example restores the backup example"
        );
        assert_eq!(
            r.restore.queue_mapping.get("orders").map(String::as_str),
            Some("orders-restored")
        );
    }
}
