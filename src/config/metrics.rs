//! `metrics` (SPEC.md "metrics"): the metrics HTTP server's address and path, and where the
//! metrics of a run go when it ends (`textfile`, `pushgateway_*`). Parsing and defaults only;
//! the server is `crate::metrics::server`, the export `crate::metrics::export`.

use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `metrics`: the metrics HTTP server and the export at the end of a run (`textfile`,
/// `pushgateway_*`; the book's "Metrics and alerts").
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve the HTTP endpoint; default true. `textfile` and `pushgateway_url` work either way.
    pub enabled: bool,
    /// TCP port; default 8080.
    pub port: u16,
    /// Default `0.0.0.0`.
    pub bind_address: String,
    /// Metrics path; default `/metrics`; must start with `/` and not be `/`, `/health`,
    /// `/healthz`.
    pub path: String,
    /// A file the text exposition is written to (atomically) when a run ends, for
    /// node_exporter's textfile collector; absent means none.
    pub textfile: Option<PathBuf>,
    /// Base URL of a Prometheus Pushgateway (`http(s)://[user:password@]host:port[/prefix]`,
    /// `${ENV}` allowed) the text exposition is POSTed to when a run ends; absent means none.
    pub pushgateway_url: Option<String>,
    /// The `job` of the Pushgateway group; default `rmq-backup`.
    pub pushgateway_job: String,
    /// More labels of the Pushgateway group (the group is job, these, and `mode`); default
    /// none. Label names match `[a-zA-Z_][a-zA-Z0-9_]*`, are not `job` or `mode`, and values
    /// are not empty.
    pub pushgateway_grouping: BTreeMap<String, String>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            port: 8080,
            bind_address: "0.0.0.0".to_string(),
            path: "/metrics".to_string(),
            textfile: None,
            pushgateway_url: None,
            pushgateway_job: "rmq-backup".to_string(),
            pushgateway_grouping: BTreeMap::new(),
        }
    }
}

impl std::fmt::Debug for MetricsConfig {
    /// The Pushgateway URL with its password masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsConfig")
            .field("enabled", &self.enabled)
            .field("port", &self.port)
            .field("bind_address", &self.bind_address)
            .field("path", &self.path)
            .field("textfile", &self.textfile)
            .field(
                "pushgateway_url",
                &self.pushgateway_url.as_deref().map(super::redact_url),
            )
            .field("pushgateway_job", &self.pushgateway_job)
            .field("pushgateway_grouping", &self.pushgateway_grouping)
            .finish()
    }
}
