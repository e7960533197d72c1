//! The metrics HTTP server of SPEC.md "Endpoints / Metrics HTTP server": tiny_http on a thread
//! of its own, started by `backup` and `restore` when `metrics.enabled`.
//!
//! | path | status | content type | body |
//! |---|---|---|---|
//! | `{metrics.path}` | 200 | `text/plain; version=0.0.4` | [`super::Metrics::render`] |
//! | `/health`, `/healthz` | 200 | `application/json` | `{"status":"ok"}` |
//! | `/health`, `/healthz` | 503 | `application/json` | `{"status":"error","reason":"..."}` while the broker connection is lost |
//! | `/` | 200 | `text/html; charset=utf-8` | an index linking to the others |
//! | anything else | 404 | `text/plain; charset=utf-8` | `Not Found` |
//!
//! Methods other than GET and HEAD get 405. The query string is ignored.

use super::{global, HealthStatus, Metrics, CONTENT_TYPE};
use crate::config::MetricsConfig;
use crate::error::{Error, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A running metrics server; stops (and its thread ends) on drop.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
    path: String,
}

impl MetricsServer {
    /// Binds `metrics.bind_address`:`metrics.port` (port 0 picks a free port) and serves the
    /// process-wide registry ([`global`]) on a thread named `metrics-http`. Logs
    /// `metrics: serving on http://<addr><path>` at info level.
    ///
    /// Errors: `IO error: metrics server cannot listen on <addr> (metrics.bind_address and
    /// metrics.port): <reason>` when the address is taken or not local.
    pub fn start(cfg: &MetricsConfig) -> Result<MetricsServer> {
        let host = if cfg.bind_address.contains(':') && !cfg.bind_address.starts_with('[') {
            format!("[{}]", cfg.bind_address) // an IPv6 address
        } else {
            cfg.bind_address.clone()
        };
        let wanted = format!("{host}:{}", cfg.port);
        let server = tiny_http::Server::http(&wanted).map_err(|e| {
            Error::Io(format!(
                "metrics server cannot listen on {wanted} (metrics.bind_address and metrics.port): {e}"
            ))
        })?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Error::Io(format!("metrics server on {wanted}: not an IP address")))?;
        let server = Arc::new(server);
        let serving = server.clone();
        let path = cfg.path.clone();
        let thread_path = path.clone();
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    respond(global(), &thread_path, request);
                }
            })
            .map_err(|e| Error::Io(format!("cannot start the metrics server thread: {e}")))?;
        log::info!("metrics: serving on http://{addr}{path}");
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            addr,
            path,
        })
    }

    /// The address actually bound (the chosen port when `metrics.port` is 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics path.
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Requests already accepted get their answer (the final values), not tiny_http's 500;
        // a bounded number, so that a busy client cannot hold the exit.
        for _ in 0..16 {
            match self.server.try_recv() {
                Ok(Some(request)) => respond(global(), &self.path, request),
                _ => break,
            }
        }
    }
}

/// Status, content type and body of the answer to `method` on `url`.
pub fn route(
    metrics: &Metrics,
    metrics_path: &str,
    method: &str,
    url: &str,
) -> (u16, &'static str, String) {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let known = path == metrics_path || matches!(path, "/" | "/health" | "/healthz");
    if !known {
        return (404, "text/plain; charset=utf-8", "Not Found\n".into());
    }
    if method != "GET" && method != "HEAD" {
        return (
            405,
            "text/plain; charset=utf-8",
            "Method Not Allowed\n".into(),
        );
    }
    if path == metrics_path {
        return (200, CONTENT_TYPE, metrics.render());
    }
    match path {
        "/health" | "/healthz" => match metrics.health.status(metrics.progress()) {
            HealthStatus::Ok => (200, "application/json", r#"{"status":"ok"}"#.into()),
            HealthStatus::Lost(reason) => (
                503,
                "application/json",
                serde_json::json!({"status": "error", "reason": reason}).to_string(),
            ),
        },
        _ => (200, "text/html; charset=utf-8", index_html(metrics_path)),
    }
}

fn index_html(metrics_path: &str) -> String {
    let p: String = metrics_path
        .chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            c => c.to_string(),
        })
        .collect();
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rmq-backup</title></head>\n<body><h1>rmq-backup {}</h1>\n<ul>\n<li><a href=\"{p}\">{p}</a>: metrics (text exposition 0.0.4)</li>\n<li><a href=\"/health\">/health</a>, <a href=\"/healthz\">/healthz</a>: health</li>\n</ul></body></html>\n",
        env!("CARGO_PKG_VERSION")
    )
}

fn respond(metrics: &Metrics, metrics_path: &str, request: tiny_http::Request) {
    let (status, content_type, body) = route(
        metrics,
        metrics_path,
        request.method().as_str(),
        request.url(),
    );
    log::trace!(
        "metrics: {} {} -> {status}",
        request.method(),
        request.url()
    );
    let mut response = tiny_http::Response::from_string(body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", content_type) {
        response = response.with_header(h);
    }
    if status == 405 {
        if let Ok(h) = tiny_http::Header::from_bytes("Allow", "GET, HEAD") {
            response = response.with_header(h);
        }
    }
    if let Err(e) = request.respond(response) {
        log::debug!("metrics: answering a request: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let m = Metrics::new();
        let (s, ct, body) = route(&m, "/metrics", "GET", "/metrics?x=1");
        assert_eq!((s, ct), (200, CONTENT_TYPE));
        assert!(body.contains("# TYPE broker_backup_messages_read counter"));
        assert_eq!(
            route(&m, "/metrics", "GET", "/healthz"),
            (200, "application/json", r#"{"status":"ok"}"#.to_string())
        );
        m.health
            .connection_lost("Connection error: reset \"x\"".into(), 0);
        let (s, ct, body) = route(&m, "/metrics", "GET", "/health");
        assert_eq!((s, ct), (503, "application/json"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "error");
        assert_eq!(v["reason"], "Connection error: reset \"x\"");
        let (s, ct, body) = route(&m, "/m<x>", "GET", "/");
        assert_eq!((s, ct), (200, "text/html; charset=utf-8"));
        assert!(body.contains("href=\"/m&lt;x&gt;\"") && body.contains("href=\"/health\""));
        assert_eq!(route(&m, "/metrics", "GET", "/nope").0, 404);
        assert_eq!(route(&m, "/metrics", "GET", "/metrics/").0, 404);
        assert_eq!(route(&m, "/metrics", "POST", "/metrics").0, 405);
        assert_eq!(route(&m, "/metrics", "HEAD", "/metrics").0, 200);
    }
}
