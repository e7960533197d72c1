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
//! - any non-2xx answer: `HTTP <status> for <METHOD> <path>`, where `<path>` is the request path as
//!   sent without the query string (e.g. `/api/queues/%2F/my%20queue`); the broker's short `reason`
//!   is appended as `: <reason>`, except for 404 and for a failed login (401 `Login failed`).
//!
//! The password is sent only in the `Authorization` header and never appears in a message or log.

use crate::broker::QueueType;
use crate::error::{mask_url, Error, Result};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Connect timeout of every request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Whole-request timeout of ordinary calls.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Whole-request timeout of definitions export and import, which can be large (thousands of queues).
const DEFINITIONS_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest page the management API accepts for paginated listings.
const PAGE_SIZE: u32 = 500;
/// Largest response body read (definitions of very large brokers), in bytes.
const MAX_BODY_BYTES: u64 = 1 << 30;
/// Attempts of one idempotent API call that fails transiently.
const ATTEMPTS: u32 = 3;
/// Columns requested from `/api/queues` to keep the payload small.
const QUEUE_COLUMNS: &str = "vhost,name,type,messages,messages_ready,messages_unacknowledged,\
durable,auto_delete,exclusive,arguments,policy,effective_policy_definition";

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

/// One queue as listed by `GET /api/queues` (fields of the management API).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInfo {
    /// Virtual host name (`/` for the default vhost).
    pub vhost: String,
    /// Exact queue name.
    pub name: String,
    /// Parsed queue type; `None` for types this tool does not know (plugins).
    pub queue_type: Option<QueueType>,
    /// The API's raw `type` field (`classic`, `quorum`, `stream`, ...); empty when absent.
    pub type_name: String,
    /// Message count: `messages`, else `messages_ready + messages_unacknowledged`, else 0 (stats not
    /// emitted yet, e.g. a queue declared a moment ago).
    pub messages: u64,
    /// Durable flag.
    pub durable: bool,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Exclusive flag (`exclusive` field; false when absent).
    pub exclusive: bool,
    /// Queue arguments (`x-queue-type`, `x-max-length`, ...).
    pub arguments: Map<String, Value>,
    /// Name of the policy applied to the queue, if any.
    pub policy: Option<String>,
    /// Definition of the effective policy (empty when none).
    pub effective_policy_definition: Map<String, Value>,
}

/// The queue object as the API sends it; every field optional since `columns` and stats vary.
#[derive(Deserialize)]
struct RawQueue {
    #[serde(default)]
    vhost: String,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "type")]
    type_name: Option<String>,
    #[serde(default)]
    messages: Option<u64>,
    #[serde(default)]
    messages_ready: Option<u64>,
    #[serde(default)]
    messages_unacknowledged: Option<u64>,
    #[serde(default)]
    durable: Option<bool>,
    #[serde(default)]
    auto_delete: Option<bool>,
    #[serde(default)]
    exclusive: Option<bool>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    policy: Option<Value>,
    #[serde(default)]
    effective_policy_definition: Option<Value>,
}

/// Turns a JSON value into a map; `[]` (how the broker sometimes renders an empty map) and `null`
/// give an empty map.
fn value_to_map(v: Option<Value>) -> Map<String, Value> {
    match v {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

impl From<RawQueue> for QueueInfo {
    fn from(r: RawQueue) -> Self {
        let messages = match (r.messages, r.messages_ready, r.messages_unacknowledged) {
            (Some(m), _, _) => m,
            (None, None, None) => 0,
            (None, ready, unacked) => ready.unwrap_or(0).saturating_add(unacked.unwrap_or(0)),
        };
        let type_name = r.type_name.unwrap_or_default();
        let policy = match r.policy {
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            _ => None,
        };
        QueueInfo {
            vhost: r.vhost,
            name: r.name,
            queue_type: QueueType::from_api(&type_name),
            type_name,
            messages,
            durable: r.durable.unwrap_or(false),
            auto_delete: r.auto_delete.unwrap_or(false),
            exclusive: r.exclusive.unwrap_or(false),
            arguments: value_to_map(r.arguments),
            policy,
            effective_policy_definition: value_to_map(r.effective_policy_definition),
        }
    }
}

/// One page of a paginated listing.
#[derive(Deserialize)]
struct Page<T> {
    #[serde(default = "Vec::new")]
    items: Vec<T>,
    #[serde(default)]
    page_count: u64,
}

/// Cluster identity from `GET /api/overview`, written to the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Overview {
    /// `cluster_name` field.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// `rabbitmq_version` field (e.g. `3.10.8`).
    #[serde(default, rename = "rabbitmq_version")]
    pub broker_version: Option<String>,
}

/// Memory use of one node from `GET /api/nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMemory {
    /// Node name (`rabbit@host`).
    pub name: String,
    /// Memory used, in bytes (0 when not reported).
    pub mem_used: u64,
    /// Memory high watermark, in bytes (0 when not reported).
    pub mem_limit: u64,
    /// True while the node's memory alarm is raised (publishers are blocked).
    pub mem_alarm: bool,
}

#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    name: String,
    #[serde(default)]
    mem_used: Option<u64>,
    #[serde(default)]
    mem_limit: Option<u64>,
    #[serde(default)]
    mem_alarm: Option<bool>,
}

/// A blocking management API client. Cheap to share by reference across threads (`Send + Sync`);
/// connections are pooled.
pub struct ManagementClient {
    agent: ureq::Agent,
    /// Base URL without trailing slash, e.g. `http://127.0.0.1:15672`.
    base: String,
    /// Base URL for messages, password masked.
    base_masked: String,
    /// `Basic ...` value of the Authorization header.
    authorization: String,
}

impl std::fmt::Debug for ManagementClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagementClient")
            .field("base", &self.base_masked)
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
    pub fn new(base_url: &str, username: &str, password: &str) -> Result<Self> {
        let base = base_url.trim().trim_end_matches('/').to_string();
        let lower = base.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || base.contains(['?', '#']) {
            return Err(Error::Config(format!(
                "Invalid management URL: {}",
                mask_url(base_url)
            )));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(REQUEST_TIMEOUT))
            .max_redirects(0)
            .user_agent(concat!("rmq-backup/", env!("CARGO_PKG_VERSION")))
            .build();
        let credentials = format!("{username}:{password}");
        Ok(ManagementClient {
            agent: config.new_agent(),
            base_masked: mask_url(&base),
            base,
            authorization: format!("Basic {}", base64(credentials.as_bytes())),
        })
    }

    /// Sends one request and returns the status and body of a 2xx answer.
    ///
    /// `path` starts with `/api/` and is already percent-encoded; `query` (without `?`) is appended.
    /// `ok_404` makes a 404 a success (returned as status 404 with an empty body).
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
        ok_404: bool,
    ) -> Result<(u16, Vec<u8>)> {
        let mut attempt = 1;
        loop {
            let result = self.request_once(method, path, query, body, timeout, ok_404);
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
            if !transient || attempt >= ATTEMPTS {
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

    fn request_once(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<&[u8]>,
        timeout: Duration,
        ok_404: bool,
    ) -> Result<(u16, Vec<u8>)> {
        let url = match query {
            Some(q) => format!("{}{}?{}", self.base, path, q),
            None => format!("{}{}", self.base, path),
        };
        let shown_url = format!("{}{}", self.base_masked, path);
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
        if status == 404 && ok_404 {
            return Ok((status, Vec::new()));
        }
        let mut message = format!("HTTP {status} for {} {path}", method.as_str());
        if status != 404 {
            // A failed login (401 "Login failed") stays bare, as SPEC.md shows it; other refusals
            // (401 "Access refused." for a reserved name, 403, 400, 500) say why.
            let reason = read.ok().and_then(|b| error_reason(&b));
            if let Some(reason) = reason.filter(|r| !(status == 401 && r == "Login failed")) {
                message.push_str(": ");
                message.push_str(&reason);
            }
        }
        Err(Error::Management(message))
    }

    /// GET returning parsed JSON.
    fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: Option<&str>,
    ) -> Result<T> {
        let (_, body) = self.request(Method::Get, path, query, None, REQUEST_TIMEOUT, false)?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::Management(format!("invalid JSON in response to GET {path}: {e}")))
    }

    /// Lists every queue of every vhost the user can see (`GET /api/queues`, paginated 500 per
    /// page, only the columns [`QueueInfo`] needs). A queue seen twice while pages shift is kept
    /// once. Errors: see the module documentation.
    pub fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let mut out = Vec::new();
        let mut seen: HashSet<(String, String)> = HashSet::new();
        let mut page: u64 = 1;
        loop {
            let query = format!("page={page}&page_size={PAGE_SIZE}&columns={QUEUE_COLUMNS}");
            let p: Page<RawQueue> = self.get_json("/api/queues", Some(&query))?;
            for raw in p.items {
                if seen.insert((raw.vhost.clone(), raw.name.clone())) {
                    out.push(QueueInfo::from(raw));
                }
            }
            if page >= p.page_count {
                break;
            }
            page += 1;
        }
        Ok(out)
    }

    /// One queue (`GET /api/queues/{vhost}/{name}`). A missing queue or vhost gives
    /// `HTTP 404 for GET /api/queues/<vhost>/<name>`.
    pub fn get_queue(&self, vhost: &str, name: &str) -> Result<QueueInfo> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        let query = format!("columns={QUEUE_COLUMNS}");
        let raw: RawQueue = self.get_json(&path, Some(&query))?;
        Ok(QueueInfo::from(raw))
    }

    /// Cluster name and broker version (`GET /api/overview`); needs the monitoring or
    /// administrator tag (SPEC.md "Authentication").
    pub fn overview(&self) -> Result<Overview> {
        self.get_json(
            "/api/overview",
            Some("columns=cluster_name,rabbitmq_version"),
        )
    }

    /// The broker's definitions as the raw JSON bytes of `GET /api/definitions` (up to 1 GiB).
    pub fn export_definitions(&self) -> Result<Vec<u8>> {
        let (_, body) = self.request(
            Method::Get,
            "/api/definitions",
            None,
            None,
            DEFINITIONS_TIMEOUT,
            false,
        )?;
        Ok(body)
    }

    /// Imports definitions (`POST /api/definitions` with the JSON as body); needs the
    /// administrator tag. Invalid or conflicting definitions give `HTTP 400`/`HTTP 500 for POST
    /// /api/definitions: <reason>`.
    pub fn import_definitions(&self, json: &[u8]) -> Result<()> {
        self.request(
            Method::Post,
            "/api/definitions",
            None,
            Some(json),
            DEFINITIONS_TIMEOUT,
            false,
        )?;
        Ok(())
    }

    /// Creates a vhost (`PUT /api/vhosts/{name}`); existing vhosts are left as they are.
    pub fn create_vhost(&self, name: &str) -> Result<()> {
        let path = format!("/api/vhosts/{}", encode_segment(name));
        self.request(
            Method::Put,
            &path,
            None,
            Some(b"{}"),
            REQUEST_TIMEOUT,
            false,
        )?;
        Ok(())
    }

    /// Deletes a vhost and everything in it (`DELETE /api/vhosts/{name}`); a missing vhost is not
    /// an error.
    pub fn delete_vhost(&self, name: &str) -> Result<()> {
        let path = format!("/api/vhosts/{}", encode_segment(name));
        self.request(Method::Delete, &path, None, None, REQUEST_TIMEOUT, true)?;
        Ok(())
    }

    /// Declares a queue (`PUT /api/queues/{vhost}/{name}` with `durable`, `auto_delete: false` and
    /// `arguments`, e.g. `{"x-queue-type": "quorum"}`). Declaring an existing queue with the same
    /// properties succeeds; different properties give `HTTP 400 for PUT ...: <reason>`.
    pub fn declare_queue(
        &self,
        vhost: &str,
        name: &str,
        durable: bool,
        arguments: &Map<String, Value>,
    ) -> Result<()> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        let body = serde_json::json!({
            "durable": durable,
            "auto_delete": false,
            "arguments": arguments,
        });
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| Error::Serialization(format!("queue declaration: {e}")))?;
        self.request(
            Method::Put,
            &path,
            None,
            Some(&bytes),
            REQUEST_TIMEOUT,
            false,
        )?;
        Ok(())
    }

    /// Deletes a queue and its messages (`DELETE /api/queues/{vhost}/{name}`); a missing queue is
    /// not an error.
    pub fn delete_queue(&self, vhost: &str, name: &str) -> Result<()> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        self.request(Method::Delete, &path, None, None, REQUEST_TIMEOUT, true)?;
        Ok(())
    }

    /// Grants `user` full permissions (configure, write and read `.*`) on `vhost`
    /// (`PUT /api/permissions/{vhost}/{user}`).
    pub fn set_permissions(&self, vhost: &str, user: &str) -> Result<()> {
        let path = format!(
            "/api/permissions/{}/{}",
            encode_segment(vhost),
            encode_segment(user)
        );
        let body = br#"{"configure":".*","write":".*","read":".*"}"#;
        self.request(Method::Put, &path, None, Some(body), REQUEST_TIMEOUT, false)?;
        Ok(())
    }

    /// Memory use and alarm state of every node (`GET /api/nodes`), used to check headroom before
    /// holding a whole queue unacknowledged (DESIGN.md decision 7).
    pub fn nodes_memory(&self) -> Result<Vec<NodeMemory>> {
        let raw: Vec<RawNode> = self.get_json(
            "/api/nodes",
            Some("columns=name,mem_used,mem_limit,mem_alarm"),
        )?;
        Ok(raw
            .into_iter()
            .map(|n| NodeMemory {
                name: n.name,
                mem_used: n.mem_used.unwrap_or(0),
                mem_limit: n.mem_limit.unwrap_or(0),
                mem_alarm: n.mem_alarm.unwrap_or(false),
            })
            .collect())
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

/// Standard base64 (RFC 4648, with padding), for the Basic Authorization header.
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63] as char);
        out.push(ALPHABET[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const BASE: &str = "http://127.0.0.1:15672/";

    fn client() -> ManagementClient {
        ManagementClient::new(BASE, "guest", "guest").expect("client")
    }

    /// A vhost unique to this test process and call, deleted on drop.
    struct TestVhost {
        client: ManagementClient,
        name: String,
    }

    impl TestVhost {
        fn new(tag: &str) -> TestVhost {
            static N: AtomicU32 = AtomicU32::new(0);
            let name = format!(
                "mgmt-test {tag}/{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let client = client();
            client.create_vhost(&name).expect("create vhost");
            client.set_permissions(&name, "guest").expect("permissions");
            TestVhost { client, name }
        }
    }

    impl Drop for TestVhost {
        fn drop(&mut self) {
            let _ = self.client.delete_vhost(&self.name);
        }
    }

    #[test]
    fn encodes_path_segments() {
        assert_eq!(encode_segment("/"), "%2F");
        assert_eq!(encode_segment("my queue"), "my%20queue");
        assert_eq!(encode_segment("a/b"), "a%2Fb");
        assert_eq!(encode_segment("x+y"), "x%2By");
        assert_eq!(encode_segment("%41"), "%2541");
        assert_eq!(encode_segment("ünï"), "%C3%BCn%C3%AF");
        assert_eq!(encode_segment("amq.gen-A_b~"), "amq.gen-A_b~");
        assert_eq!(encode_segment(".."), "%2E%2E");
        assert_eq!(encode_segment("a?b#c&d=e"), "a%3Fb%23c%26d%3De");
    }

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(b"guest:guest"), "Z3Vlc3Q6Z3Vlc3Q=");
    }

    #[test]
    fn messages_fall_back_to_ready_plus_unacked() {
        let parse = |s: &str| QueueInfo::from(serde_json::from_str::<RawQueue>(s).expect("json"));
        let q =
            parse(r#"{"vhost":"/","name":"q","type":"quorum","messages":7,"messages_ready":1}"#);
        assert_eq!(q.messages, 7);
        assert_eq!(q.queue_type, Some(QueueType::Quorum));
        let q = parse(r#"{"vhost":"/","name":"q","messages_ready":3,"messages_unacknowledged":4}"#);
        assert_eq!(q.messages, 7);
        let q = parse(r#"{"vhost":"/","name":"q","type":"x-custom","arguments":[]}"#);
        assert_eq!(q.messages, 0);
        assert_eq!(q.queue_type, None);
        assert_eq!(q.type_name, "x-custom");
        assert!(q.arguments.is_empty());
        assert_eq!(q.policy, None);
    }

    #[test]
    fn rejects_non_http_urls() {
        for bad in [
            "amqp://h:5672",
            "127.0.0.1:15672",
            "http://",
            "http:///x",
            "",
        ] {
            let err = ManagementClient::new(bad, "u", "p").expect_err(bad);
            assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
        }
        let err = ManagementClient::new("ftp://u:secret@h", "u", "p").expect_err("ftp");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert!(ManagementClient::new("https://h:15671/prefix/", "u", "p").is_ok());
    }

    #[test]
    fn queues_with_awkward_names_round_trip() {
        let vh = TestVhost::new("names");
        let c = &vh.client;
        let names = ["with space", "a/b", "ünïcødé", "x+y", "%41"];
        for (i, name) in names.iter().enumerate() {
            let mut args = Map::new();
            if i == 1 {
                args.insert("x-queue-type".into(), Value::from("quorum"));
            }
            args.insert("x-max-length".into(), Value::from(1000 + i as u64));
            c.declare_queue(&vh.name, name, true, &args).expect(name);
        }
        let listed: Vec<QueueInfo> = c
            .list_queues()
            .expect("list")
            .into_iter()
            .filter(|q| q.vhost == vh.name)
            .collect();
        let mut got: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
        got.sort();
        let mut want = names.to_vec();
        want.sort();
        assert_eq!(got, want);
        for (i, name) in names.iter().enumerate() {
            let q = c.get_queue(&vh.name, name).expect(name);
            assert_eq!(q.name, *name);
            assert_eq!(q.vhost, vh.name);
            assert!(q.durable);
            assert!(!q.auto_delete);
            assert_eq!(q.messages, 0);
            assert_eq!(
                q.arguments.get("x-max-length"),
                Some(&Value::from(1000 + i as u64))
            );
            let want_type = if i == 1 {
                QueueType::Quorum
            } else {
                QueueType::Classic
            };
            assert_eq!(q.queue_type, Some(want_type), "{name}");
            assert_eq!(q.type_name, want_type.as_str());
        }
        c.delete_queue(&vh.name, "with space").expect("delete");
        c.delete_queue(&vh.name, "with space")
            .expect("delete twice");
        let err = c.get_queue(&vh.name, "with space").expect_err("deleted");
        let enc = encode_segment(&vh.name);
        assert_eq!(
            err,
            Error::Management(format!("HTTP 404 for GET /api/queues/{enc}/with%20space"))
        );
    }

    #[test]
    fn list_queues_pages_past_500() {
        let vh = TestVhost::new("paging");
        let c = &vh.client;
        let existing = c.list_queues().expect("list").len();
        let count = (PAGE_SIZE as usize + 20).saturating_sub(existing).max(1);
        let args = Map::new();
        for i in 0..count {
            c.declare_queue(&vh.name, &format!("q{i:04}"), false, &args)
                .expect("declare");
        }
        let listed = c.list_queues().expect("list");
        assert!(listed.len() > PAGE_SIZE as usize, "{}", listed.len());
        let mine = listed.iter().filter(|q| q.vhost == vh.name).count();
        assert_eq!(mine, count);
    }

    #[test]
    fn overview_definitions_and_nodes() {
        let c = client();
        let o = c.overview().expect("overview");
        let version = o.broker_version.expect("version");
        assert!(version.starts_with("3."), "{version}");
        assert!(o.cluster_name.is_some_and(|n| !n.is_empty()));

        let vh = TestVhost::new("defs");
        vh.client
            .declare_queue(&vh.name, "defs q", true, &Map::new())
            .expect("declare");
        let defs = c.export_definitions().expect("export");
        let v: Value = serde_json::from_slice(&defs).expect("json");
        let queues = v.get("queues").and_then(Value::as_array).expect("queues");
        assert!(queues
            .iter()
            .any(|q| q["name"] == "defs q" && q["vhost"] == vh.name.as_str()));

        // Import a definition of one more queue into the test vhost.
        let import = serde_json::json!({
            "queues": [{"name": "imported", "vhost": vh.name, "durable": true,
                        "auto_delete": false, "arguments": {}}]
        });
        c.import_definitions(import.to_string().as_bytes())
            .expect("import");
        assert_eq!(
            c.get_queue(&vh.name, "imported").expect("imported").name,
            "imported"
        );
        let err = c.import_definitions(b"{not json").expect_err("bad json");
        assert!(
            err.to_string()
                .starts_with("Management API error: HTTP 400 for POST /api/definitions"),
            "{err}"
        );

        let nodes = c.nodes_memory().expect("nodes");
        assert!(!nodes.is_empty());
        assert!(nodes[0].mem_used > 0 && nodes[0].mem_limit > 0, "{nodes:?}");
    }

    #[test]
    fn wrong_password_gives_401() {
        let c = ManagementClient::new(BASE, "guest", "not-the-password").expect("client");
        let err = c.overview().expect_err("401");
        assert_eq!(
            err.to_string(),
            "Management API error: HTTP 401 for GET /api/overview"
        );
        let err = c.get_queue("/", "a b").expect_err("401");
        assert_eq!(
            err,
            Error::Management("HTTP 401 for GET /api/queues/%2F/a%20b".into())
        );
        assert!(!format!("{c:?}").contains("not-the-password"));
    }

    #[test]
    fn unreachable_port() {
        let c = ManagementClient::new("http://127.0.0.1:1", "guest", "secret").expect("client");
        let err = c.overview().expect_err("unreachable");
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "Management API error: error sending request for url http://127.0.0.1:1/api/overview"
            ),
            "{msg}"
        );
        assert!(!msg.contains("secret"));
        let c = ManagementClient::new("http://u:secret@127.0.0.1:1", "u", "secret").expect("c");
        let msg = c.overview().expect_err("unreachable").to_string();
        assert!(
            msg.contains("http://u:****@127.0.0.1:1/api/overview"),
            "{msg}"
        );
        assert!(!msg.contains("secret"), "{msg}");
    }
}
