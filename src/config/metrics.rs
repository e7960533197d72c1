//! `metrics` (SPEC.md "metrics"): the metrics HTTP server's address and path. Parsing and
//! defaults only; the server is `crate::metrics::server`.

use serde::Deserialize;

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
