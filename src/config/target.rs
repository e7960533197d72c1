//! `target` (SPEC.md "target"): the broker a restore publishes to, and its optional
//! management access. Parsing and field checks only.

use std::fmt;

use serde::Deserialize;

use super::checks::{check_non_empty, check_scheme, config_err};
use super::{redact_url, Secret};
use crate::error::Result;

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
    /// TLS for the target's AMQP and https management connections, as `source.tls`.
    #[serde(default)]
    pub tls: Option<super::TlsConfig>,
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
            .field("tls", &self.tls)
            .finish()
    }
}

pub(super) fn validate_target(target: &TargetConfig) -> Result<()> {
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
    super::source::validate_tls(target.tls.as_ref(), "target.tls")
}
