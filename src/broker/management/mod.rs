//! Blocking client of the RabbitMQ management HTTP API (ureq, no async runtime).
//!
//! Used for queue discovery, the manifest's cluster name and broker version, definitions export and
//! import, and (for restore and tests) vhost, queue and permission set-up (SPEC.md "Calls the tool
//! makes to the broker's management API"). Every path segment (vhost, queue name, user) is
//! percent-encoded for a URL *path*: space is `%20` (never `+`), `/` is `%2F` (so the default vhost
//! `/` is `%2F`), non-ASCII characters are their UTF-8 bytes percent-encoded.
//!
//! Errors (SPEC.md "Errors"), all in the `Management API error:` category:
//! - API not reachable: `error sending request for url <url>: <detail>`;
//! - https handshake refused: `TLS handshake with <base url> failed: <why>` (`crate::broker::tls`);
//! - any non-2xx answer: `HTTP <status> for <METHOD> <path>`, where `<path>` is the request path as
//!   sent without the query string (e.g. `/api/queues/%2F/my%20queue`); the broker's short `reason`
//!   is appended as `: <reason>`, except for 404 and for a failed login (401 `Login failed`,
//!   `Not_Authorized` on RabbitMQ 4.x).
//!
//! The password is sent only in the `Authorization` header and never appears in a message or log.

mod api;
mod holders;
mod policies;

pub use api::{Listener, NodeMemory, Overview, QueueInfo};
pub use holders::{ConsumerInfo, QueueHolders};
pub use policies::{PolicyInfo, PolicyKind};

use crate::error::{mask_url, Error, Result};
use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connect timeout of every request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Whole-request timeout of ordinary calls.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Whole-request timeout of definitions export and import, which can be large (thousands of queues).
const DEFINITIONS_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest response body read (definitions of very large brokers), in bytes.
const MAX_BODY_BYTES: u64 = 1 << 30;
/// Attempts of one idempotent API call that fails transiently.
const ATTEMPTS: u32 = 3;
/// Columns requested from `/api/queues` to keep the payload small.
const QUEUE_COLUMNS: &str = "vhost,name,type,messages,messages_ready,messages_unacknowledged,\
durable,auto_delete,exclusive,arguments,policy,effective_policy_definition,node,leader,state,message_bytes,\
delivery_limit,messages_delayed,last_delayed_at,delayed_retry";

/// Characters left as they are in a path segment: ASCII letters, digits, `-`, `_`, `~`, `.`
/// (RFC 3986 unreserved). Everything else, including `/`, `+`, `%` and space, is percent-encoded.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'~')
    .remove(b'.');

/// Percent-encodes one path segment (vhost, queue or user name) for a URL path.
///
/// `/` gives `%2F`, space `%20`, `+` `%2B`, non-ASCII its UTF-8 bytes; a segment made only of dots
/// (`.`, `..`) is fully encoded so that no URL normalisation can change the path.
pub fn encode_segment(segment: &str) -> String {
    if !segment.is_empty() && segment.bytes().all(|b| b == b'.') {
        return "%2E".repeat(segment.len());
    }
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// A blocking management API client. Cheap to share by reference across threads (`Send + Sync`);
/// connections are pooled.
#[derive(Clone)]
pub struct ManagementClient {
    agent: ureq::Agent,
    /// The nodes' base URLs, tried in order (never empty).
    bases: Arc<[Base]>,
    /// The base URL that answered last: requests go there first.
    current: Arc<AtomicUsize>,
    /// `Basic ...` value of the Authorization header.
    authorization: String,
    /// For https: what a failed handshake's message names (`crate::broker::tls`).
    tls: Option<crate::broker::tls::Context>,
    /// Tries per idempotent request ([`ATTEMPTS`], or 1: see [`Self::single_attempt`]).
    attempts: u32,
}

/// One base URL of the management API.
struct Base {
    /// Without trailing slash, e.g. `http://127.0.0.1:15672`.
    url: String,
    /// For messages, password masked.
    masked: String,
}

impl std::fmt::Debug for ManagementClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bases: Vec<&str> = self.bases.iter().map(|b| b.masked.as_str()).collect();
        f.debug_struct("ManagementClient")
            .field("bases", &bases)
            .finish_non_exhaustive()
    }
}

/// HTTP methods used by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Get,
    Put,
    Post,
    Delete,
}

impl Method {
    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

impl ManagementClient {
    /// Creates a client for `base_url` (`http://host:15672` or `https://...`, a trailing slash is
    /// tolerated, a path prefix such as `/rabbitmq` is kept). Timeouts: connect 10 s, whole request
    /// 60 s (300 s for definitions export and import). No request is made here.
    ///
    /// Errors: `Configuration error: Invalid management URL: <url>` when the URL is not http(s).
    /// `tls`: the trust anchors and client certificate for an `https` URL (`crate::broker::tls`);
    /// `None` uses ureq's defaults (the Mozilla roots bundled in the binary).
    pub fn new(
        base_url: &str,
        username: &str,
        password: &str,
        tls: Option<&crate::broker::tls::TlsClient>,
    ) -> Result<Self> {
        Self::for_nodes(&[base_url.to_string()], username, password, tls)
    }

    /// [`Self::new`] for the management API of several nodes (`source.management_url` as a
    /// list): each request goes to the node that answered last; one that does not answer (no
    /// connection, a timeout) is followed at once by the next, with a warning.
    ///
    /// Errors: as [`Self::new`], for any of `base_urls`, or an empty list.
    pub fn for_nodes(
        base_urls: &[String],
        username: &str,
        password: &str,
        tls: Option<&crate::broker::tls::TlsClient>,
    ) -> Result<Self> {
        let mut bases = Vec::with_capacity(base_urls.len());
        for base_url in base_urls {
            let base = base_url.trim().trim_end_matches('/').to_string();
            let lower = base.to_ascii_lowercase();
            let rest = lower
                .strip_prefix("http://")
                .or_else(|| lower.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || base.contains(['?', '#'])
            {
                return Err(Error::Config(format!(
                    "Invalid management URL: {}",
                    mask_url(base_url)
                )));
            }
            bases.push(Base {
                masked: mask_url(&base),
                url: base,
            });
        }
        if bases.is_empty() {
            return Err(Error::Config("no management URL".into()));
        }
        let mut config = ureq::Agent::config_builder();
        if let Some(tls) = tls {
            config = config.tls_config(tls.http_config());
        }
        let config = config
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            .max_redirects(0)
            .user_agent(concat!("rmq-backup/", env!("CARGO_PKG_VERSION")))
            .build();
        let credentials = format!("{username}:{password}");
        Ok(ManagementClient {
            agent: config.new_agent(),
            bases: bases.into(),
            current: Arc::new(AtomicUsize::new(0)),
            tls: tls.map(|t| t.context().clone()),
            attempts: ATTEMPTS,
            authorization: format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials.as_bytes())
            ),
        })
    }

    /// This client, each request tried once: for a caller that asks again soon anyway (the
    /// backup's memory alarm watch) and would only repeat the retry warnings.
    pub fn single_attempt(mut self) -> ManagementClient {
        self.attempts = 1;
        self
    }

    /// Sends one request and returns the status and body of a 2xx answer.
    ///
    /// `path` starts with `/api/` and is already percent-encoded; `query` (without `?`) is appended.
    /// `answer` is a status that is an answer, not an error (a DELETE's 404: already gone; the
    /// alarms health check's 503: the alarms in effect): returned with its body.
    /// One API call, retried up to [`ATTEMPTS`] times with backoff when it is idempotent (not
    /// POST) and failed transiently: no answer, or a 5xx to a GET (the broker answers 500 to
    /// `GET /api/queues` while a vhost is being deleted), 502/503/504 to PUT and DELETE.
    fn request(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<&[u8]>,
        timeout: Duration,
        answer: Option<u16>,
    ) -> Result<(u16, Vec<u8>)> {
        let mut attempt = 1;
        loop {
            let result = self.request_any_node(method, path, query, body, timeout, answer);
            let transient = match &result {
                Err(Error::Management(m)) if method != Method::Post => {
                    m.starts_with("error sending request")
                        || (method == Method::Get && m.starts_with("HTTP 5"))
                        || ["HTTP 502", "HTTP 503", "HTTP 504"]
                            .iter()
                            .any(|p| m.starts_with(p))
                }
                _ => false,
            };
            if !transient || attempt >= self.attempts {
                return result;
            }
            let delay =
                Duration::from_millis(250 * (1 << attempt) + (crate::now_ms() % 100) as u64);
            if let Err(e) = &result {
                log::warn!("{e}; retrying in {} ms", delay.as_millis());
            }
            std::thread::sleep(delay);
            attempt += 1;
        }
    }

    /// One try of a request: on the node that answered last, then, when it does not answer,
    /// on each other node in turn (the one that answers is used from then on). When none
    /// answers, the error names each.
    fn request_any_node(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<&[u8]>,
        timeout: Duration,
        answer: Option<u16>,
    ) -> Result<(u16, Vec<u8>)> {
        let n = self.bases.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut unanswered = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let base = &self.bases[i];
            match self.request_once(base, method, path, query, body, timeout, answer) {
                Err(Error::Management(m)) if n > 1 && m.starts_with("error sending request") => {
                    if k + 1 < n {
                        log::warn!(
                            "{m}; trying the management API at {}",
                            self.bases[(i + 1) % n].masked
                        );
                    }
                    unanswered.push(m);
                }
                result => {
                    if k > 0 {
                        self.current.store(i, Ordering::Relaxed);
                    }
                    return result;
                }
            }
        }
        Err(Error::Management(unanswered.join("; ")))
    }

    /// A failed TLS handshake in plain words, when `e` is one (and the URL is https).
    fn tls_failure(&self, e: &ureq::Error) -> Option<String> {
        let rustls_error = match e {
            ureq::Error::Rustls(r) => r,
            ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<rustls::Error>()?,
            _ => return None,
        };
        Some(match &self.tls {
            Some(context) => context.describe(rustls_error),
            None => rustls_error.to_string(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn request_once(
        &self,
        base: &Base,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<&[u8]>,
        timeout: Duration,
        answer: Option<u16>,
    ) -> Result<(u16, Vec<u8>)> {
        let url = match query {
            Some(q) => format!("{}{}?{}", base.url, path, q),
            None => format!("{}{}", base.url, path),
        };
        let shown_url = format!("{}{}", base.masked, path);
        let send_error = |detail: String| {
            Error::Management(format!(
                "error sending request for url {shown_url}: {detail}"
            ))
        };
        let mut builder = ureq::http::Request::builder()
            .method(method.as_str())
            .uri(url.as_str())
            .header("Authorization", self.authorization.as_str())
            .header("Accept", "application/json");
        if body.is_some() {
            builder = builder.header("Content-Type", "application/json");
        }
        let request = builder
            .body(body.unwrap_or(&[]))
            .map_err(|e| send_error(e.to_string()))?;
        let request = self
            .agent
            .configure_request(request)
            .timeout_global(Some(timeout))
            .build();
        let started = Instant::now();
        let response = self.agent.run(request);
        let mut response = match response {
            Ok(r) => r,
            Err(e) => {
                log::trace!(
                    "management {} {} failed after {} ms: {}",
                    method.as_str(),
                    path,
                    started.elapsed().as_millis(),
                    e
                );
                if let Some(why) = self.tls_failure(&e) {
                    // Not transient: no retry.
                    return Err(Error::Management(format!(
                        "TLS handshake with {} failed: {why}",
                        base.masked
                    )));
                }
                return Err(send_error(e.to_string()));
            }
        };
        let status = response.status().as_u16();
        let read = response
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec();
        log::trace!(
            "management {} {} -> {} in {} ms",
            method.as_str(),
            path,
            status,
            started.elapsed().as_millis()
        );
        if (200..300).contains(&status) {
            let data = read.map_err(|e| {
                Error::Management(format!(
                    "error reading response for {} {path}: {e}",
                    method.as_str()
                ))
            })?;
            return Ok((status, data));
        }
        if answer == Some(status) {
            return Ok((status, read.unwrap_or_default()));
        }
        let mut message = format!("HTTP {status} for {} {path}", method.as_str());
        if status != 404 {
            // A failed login (401 "Login failed" on 3.x, "Not_Authorized" on 4.x) stays bare,
            // as SPEC.md shows it; other refusals (401 "Access refused." for a reserved name,
            // 403, 400, 500) say why.
            let reason = read.ok().and_then(|b| error_reason(&b));
            let login_failed =
                |r: &String| status == 401 && (r == "Login failed" || r == "Not_Authorized");
            if let Some(reason) = reason.filter(|r| !login_failed(r)) {
                message.push_str(": ");
                message.push_str(&reason);
                message.push_str(crate::broker::permissions::explain_management(&reason));
            }
        }
        Err(Error::Management(message))
    }

    /// `DELETE path`; a 404 (already gone) is not an error. Errors: see [`Self::request`].
    fn delete(&self, path: &str) -> Result<()> {
        self.request(Method::Delete, path, None, None, REQUEST_TIMEOUT, Some(404))?;
        Ok(())
    }

    /// GET returning parsed JSON.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: Option<&str>,
    ) -> Result<T> {
        let (_, body) = self.request(Method::Get, path, query, None, REQUEST_TIMEOUT, None)?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::Management(format!("invalid JSON in response to GET {path}: {e}")))
    }
}

/// Extracts a short reason from an error body (`{"error": ..., "reason": ...}`); at most 300
/// characters, `None` when the body holds nothing useful.
fn error_reason(body: &[u8]) -> Option<String> {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let reason = v.get("reason").or_else(|| v.get("error"))?;
            match reason {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }
        }
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() || text.starts_with('<') {
        return None;
    }
    const MAX: usize = 300;
    if text.chars().count() > MAX {
        let cut: String = text.chars().take(MAX).collect();
        Some(format!("{cut}..."))
    } else {
        Some(text)
    }
}

#[cfg(test)]
mod tests;
