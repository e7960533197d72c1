//! `target` (SPEC.md "target"): the broker a restore publishes to, and its optional
//! management access. Parsing and field checks only.

use schemars::JsonSchema;
use std::fmt;

use serde::Deserialize;

use super::checks::{check_non_empty, config_err};
use super::{Secret, Urls};
use crate::error::Result;

/// `target`: the broker a restore publishes to.
#[derive(Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// AMQP URL of the target broker, or a list of the nodes of a cluster tried in order;
    /// supports `${ENV_VAR}` interpolation.
    pub amqp_url: Urls,
    /// Management API base URL (or a list, tried in order); required when
    /// `restore.restore_definitions` or `restore.create_missing_queues` is true.
    #[serde(default)]
    pub management_url: Option<Urls>,
    /// Required together with `management_url`.
    #[serde(default)]
    pub management_username: Option<String>,
    /// Required together with `management_url`; supports `${ENV_VAR}` interpolation.
    #[serde(default)]
    pub management_password: Option<Secret>,
    /// A file holding the management API password (docs/configuration.md "Secrets"), instead of
    /// `management_password`.
    #[serde(default)]
    pub management_password_file: Option<std::path::PathBuf>,
    /// A file holding the password of the user of every `amqp_url` (docs/configuration.md "Secrets").
    #[serde(default)]
    pub amqp_password_file: Option<std::path::PathBuf>,
    /// TLS for the target's AMQP, stream and https management connections, as `source.tls`.
    #[serde(default)]
    pub tls: Option<super::TlsConfig>,
    /// Stream protocol port of the target: used only to publish stream messages a backup
    /// stored whole as AMQP 1.0 bytes (header `x-rmq-backup-body`) back into a stream. Unset:
    /// 5552, or 5551 when the target uses TLS.
    #[serde(default)]
    pub stream_port: Option<u16>,
}

impl TargetConfig {
    /// The stream port: `stream_port`, else 5552, or 5551 when `tls` (the target uses TLS).
    pub fn stream_port_for(&self, tls: bool) -> u16 {
        self.stream_port.unwrap_or(if tls {
            crate::broker::tls::DEFAULT_STREAM_TLS_PORT
        } else {
            5552
        })
    }
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetConfig")
            .field("amqp_url", &self.amqp_url)
            .field("management_url", &self.management_url)
            .field("management_username", &self.management_username)
            .field("management_password", &self.management_password)
            .field("management_password_file", &self.management_password_file)
            .field("amqp_password_file", &self.amqp_password_file)
            .field("tls", &self.tls)
            .field("stream_port", &self.stream_port)
            .finish()
    }
}

pub(super) fn validate_target(target: &TargetConfig) -> Result<()> {
    target
        .amqp_url
        .check("target.amqp_url", &["amqp://", "amqps://"])?;
    match &target.management_url {
        Some(url) => {
            url.check("target.management_url", &["http://", "https://"])?;
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
    if target.stream_port == Some(0) {
        return Err(config_err("target.stream_port must be between 1 and 65535"));
    }
    super::source::validate_tls(target.tls.as_ref(), "target.tls")
}
