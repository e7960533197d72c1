//! `source` (SPEC.md "source"): the broker a backup reads from, its TLS settings and the
//! queue selection (matched in `crate::broker::selection`). Parsing and field checks only.

use schemars::JsonSchema;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use super::checks::{check_non_empty, config_err};
use super::{Secret, Urls};
use crate::broker::QueueType;
use crate::error::Result;

/// `source`: the broker a backup reads from.
#[derive(Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// `amqp://user:password@host:port/vhost` (vhost `/` written `%2f`); `amqps://` for TLS.
    /// A list names the nodes of a cluster, tried in order. Supports `${ENV_VAR}`
    /// interpolation.
    pub amqp_url: Urls,
    /// Base URL of the management HTTP API, `http://` or `https://`; a list is tried in order.
    pub management_url: Urls,
    /// Management API user name.
    pub management_username: String,
    /// Management API password; supports `${ENV_VAR}` interpolation. Required, here or in
    /// `management_password_file`.
    #[serde(default)]
    pub management_password: Secret,
    /// A file holding the management API password (docs/configuration.md "Secrets"), instead of
    /// `management_password`.
    #[serde(default)]
    pub management_password_file: Option<PathBuf>,
    /// A file holding the password of the user of every `amqp_url` (docs/configuration.md "Secrets"); the
    /// URLs then name the user without a password (`amqp://backup@rabbit/%2f`).
    #[serde(default)]
    pub amqp_password_file: Option<PathBuf>,
    /// Stream protocol port; used only when `backup.stream_enabled` is true. Unset: 5552, or
    /// 5551 (RabbitMQ's TLS stream port) when the source uses TLS.
    #[serde(default)]
    pub stream_port: Option<u16>,
    /// TLS for the AMQP, stream and https management connections; unset: TLS only where a
    /// URL says so (`amqps://`, `https://`).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Queue selection; unset selects every queue.
    #[serde(default)]
    pub queues: Option<QueueSelection>,
    /// Read each queue through a connection to the node that hosts it; default true. No effect on a single node.
    #[serde(default = "default_true")]
    pub node_local_reads: bool,
    /// Node name (`rabbit@host`) → `host:port` of its AMQP listener as this tool reaches it,
    /// for node-local reads where the broker's own addresses are not reachable (a Kubernetes
    /// Service per pod). Default empty: the addresses come from the management API.
    #[serde(default)]
    pub node_addresses: BTreeMap<String, String>,
}

fn default_true() -> bool {
    true
}

impl SourceConfig {
    /// The stream port: `stream_port`, else 5552, or 5551 when `tls` (the source uses TLS).
    pub fn stream_port_for(&self, tls: bool) -> u16 {
        self.stream_port.unwrap_or(if tls {
            crate::broker::tls::DEFAULT_STREAM_TLS_PORT
        } else {
            5552
        })
    }
}

impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceConfig")
            .field("amqp_url", &self.amqp_url)
            .field("management_url", &self.management_url)
            .field("management_username", &self.management_username)
            .field("management_password", &self.management_password)
            .field("management_password_file", &self.management_password_file)
            .field("amqp_password_file", &self.amqp_password_file)
            .field("stream_port", &self.stream_port)
            .field("tls", &self.tls)
            .field("queues", &self.queues)
            .field("node_local_reads", &self.node_local_reads)
            .field("node_addresses", &self.node_addresses)
            .finish()
    }
}

/// `source.tls` / `target.tls`: TLS for the AMQP, stream and https management connections of a
/// broker (the book's "Configuration", TLS and mutual TLS). The files are read when a run
/// starts, and by `config check`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Enable TLS, default false: turns an `amqp://` URL into `amqps://` (port 5671 unless the
    /// URL gives one). An `amqps://` URL uses TLS whatever this says.
    pub enabled: bool,
    /// CA certificate PEM file (one or more certificates); unset: the system CA store
    /// (`SSL_CERT_FILE` / `SSL_CERT_DIR` honoured).
    pub ca_cert: Option<PathBuf>,
    /// Client certificate PEM file (mutual TLS); requires `client_key`.
    pub client_cert: Option<PathBuf>,
    /// Client private key PEM file (mutual TLS; PKCS#8, PKCS#1 or SEC1, unencrypted); requires
    /// `client_cert`.
    pub client_key: Option<PathBuf>,
}

/// `source.queues`: which queues a backup reads. Every field defaults to "no restriction".
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
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

pub(super) fn validate_source(source: &SourceConfig) -> Result<()> {
    source
        .amqp_url
        .check("source.amqp_url", &["amqp://", "amqps://"])?;
    source
        .management_url
        .check("source.management_url", &["http://", "https://"])?;
    check_non_empty(&source.management_username, "source.management_username")?;
    if source.stream_port == Some(0) {
        return Err(config_err("source.stream_port must be between 1 and 65535"));
    }
    validate_tls(source.tls.as_ref(), "source.tls")
}

/// `client_cert` and `client_key` come together (`field`: `source.tls` or `target.tls`).
pub(super) fn validate_tls(tls: Option<&TlsConfig>, field: &str) -> Result<()> {
    match tls {
        Some(t) if t.client_cert.is_some() != t.client_key.is_some() => Err(config_err(format!(
            "{field}.client_cert and {field}.client_key must be given together"
        ))),
        _ => Ok(()),
    }
}
