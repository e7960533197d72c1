//! The HTTP plumbing of the GCS backend: the client, authorized requests with timeouts and
//! retries, and error messages from the JSON API's answers without secrets.

use super::*;
use crate::error::{Error, Result};
use crate::repository::storage::retry::{self, Attempt};
use std::io::{self, Read};
use std::time::Duration;
use ureq::http;

/// [`crate::repository::storage::http_agent`] with this backend's I/O timeout.
pub(super) fn new_agent(connect: Duration) -> ureq::Agent {
    crate::repository::storage::http_agent(connect, IO_TIMEOUT)
}

/// Transient or permanent, for [`retry::run`].
pub(super) fn to_attempt(transient: bool, e: Error) -> Attempt {
    if transient {
        Attempt::Transient(e)
    } else {
        Attempt::Permanent(e)
    }
}

/// Classifies a ureq error: (worth retrying, short reason without URL or secrets).
pub(super) fn classify(e: &ureq::Error) -> (bool, String) {
    match e {
        ureq::Error::Timeout(_) => (true, "timeout".into()),
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            (true, "endpoint connection error".into())
        }
        ureq::Error::Io(io) => classify_io(io),
        ureq::Error::Tls(m) => (false, format!("TLS error: {m}")),
        ureq::Error::Rustls(r) => (false, format!("TLS error: {r}")),
        ureq::Error::Protocol(_) => (true, "HTTP protocol error".into()),
        ureq::Error::BodyExceedsLimit(_) => (false, "answer too large".into()),
        ureq::Error::BadUri(_) | ureq::Error::Http(_) => (false, "invalid request URL".into()),
        _ => (false, "HTTP client error".into()),
    }
}

/// Classifies an I/O error of a request or of reading a response body.
pub(super) fn classify_io(e: &io::Error) -> (bool, String) {
    if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
        return classify(inner);
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused
        | K::NotConnected
        | K::AddrNotAvailable
        | K::HostUnreachable
        | K::NetworkUnreachable => (true, "endpoint connection error".into()),
        K::TimedOut | K::WouldBlock => (true, "timeout".into()),
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::Interrupted => (true, e.kind().to_string()),
        k => (false, k.to_string()),
    }
}

/// Reads at most `limit` bytes of a response body; read errors end the read (best effort).
pub(super) fn read_limited(resp: &mut http::Response<ureq::Body>, limit: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = resp
        .body_mut()
        .as_reader()
        .take(limit)
        .read_to_end(&mut out);
    out
}

/// Reads a whole JSON answer (at most [`JSON_BODY_LIMIT`] bytes); errors become `ctx: <reason>`.
pub(super) fn read_json<T: serde::de::DeserializeOwned>(
    resp: &mut http::Response<ureq::Body>,
    ctx: &str,
) -> std::result::Result<T, Attempt> {
    let mut out = Vec::new();
    resp.body_mut()
        .as_reader()
        .take(JSON_BODY_LIMIT)
        .read_to_end(&mut out)
        .map_err(|e| {
            let (transient, reason) = classify_io(&e);
            to_attempt(transient, Error::Storage(format!("{ctx}: {reason}")))
        })?;
    serde_json::from_slice(&out)
        .map_err(|_| Attempt::Permanent(Error::Storage(format!("{ctx}: invalid JSON answer"))))
}

/// The `reason` (else `message`) of a GCS JSON error (`{"error":{"errors":[{"reason":...}]}}`).
pub(super) fn api_reason(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let err = v.get("error")?;
    let reason = err
        .get("errors")
        .and_then(|e| e.get(0))
        .and_then(|e| e.get("reason"))
        .and_then(|r| r.as_str())
        .or_else(|| err.get("message").and_then(|m| m.as_str()))?;
    short_reason(reason)
}

/// `s` when it is a short, plain reason (letters, digits, space, `_`, `-`, `.`): never a URL or
/// a quoted value.
pub(super) fn short_reason(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= 60
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.'));
    ok.then(|| s.to_string())
}

pub(super) fn canonical_reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("error")
        .to_string()
}

/// Reads and drops the rest of a small answer so the connection can be reused.
pub(super) fn drain(mut resp: http::Response<ureq::Body>) {
    let _ = read_limited(&mut resp, ERROR_BODY_LIMIT);
}

// ---------------------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------------------

impl GcsBackend {
    /// Builds the backend and probes it with one `objects.list` request (`maxResults=1`), which
    /// also fetches the first token. A missing bucket is not an error here (the first put reports
    /// `NoSuchBucket`). Errors (`Storage error: Failed to create GCS backend: <reason>`):
    /// `endpoint connection error`, `403 Forbidden`, `401 Unauthorized`, token failures such as
    /// `token request failed: 400 invalid_grant`, `invalid bucket name <name>`.
    pub fn new(opts: GcsOptions) -> Result<GcsBackend> {
        if opts.bucket.is_empty() || opts.bucket.contains('/') || opts.bucket.len() > 222 {
            return Err(Error::Storage(format!(
                "{CREATE_CTX}: invalid bucket name {}",
                opts.bucket.escape_debug()
            )));
        }
        let agent = new_agent(CONNECT_TIMEOUT);
        let backend = GcsBackend {
            tokens: TokenSource::new(opts.credentials, agent.clone(), opts.policy),
            agent,
            base: opts
                .endpoint
                .as_deref()
                .map(normalize_endpoint)
                .unwrap_or_else(|| GOOGLE_ENDPOINT.to_string()),
            bucket: opts.bucket,
            upload_threshold: opts.upload_threshold,
            chunk_size: (opts.chunk_size / CHUNK_ALIGN).max(1) * CHUNK_ALIGN,
            policy: opts.policy,
            lock: opts.object_lock,
        };
        backend.probe()?;
        Ok(backend)
    }

    pub(super) fn probe(&self) -> Result<()> {
        let url = format!(
            "{}/storage/v1/b/{}/o?maxResults=1&fields=kind",
            self.base,
            enc(&self.bucket)
        );
        retry::run(self.policy, "create GCS backend", || {
            let resp = self.call(CREATE_CTX, http::Request::get(&url), ())?;
            match resp.status().as_u16() {
                200 | 404 => {
                    drain(resp);
                    Ok(())
                }
                _ => Err(self.status_error(CREATE_CTX, resp)),
            }
        })
    }

    /// `<base>/storage/v1/b/<bucket>/o/<name>`.
    pub(super) fn object_url(&self, key: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            enc(&self.bucket),
            enc(key)
        )
    }

    /// `<base>/upload/storage/v1/b/<bucket>/o?uploadType=<kind>&name=<name>`.
    pub(super) fn upload_url(&self, kind: &str, key: &str) -> String {
        format!(
            "{}/upload/storage/v1/b/{}/o?uploadType={kind}&name={}",
            self.base,
            enc(&self.bucket),
            enc(key)
        )
    }

    /// Sends one request with the bearer token. Transport failures become `ctx: <reason>`,
    /// transient ones retried; every HTTP status comes back as a response.
    pub(super) fn call(
        &self,
        ctx: &str,
        builder: http::request::Builder,
        body: impl ureq::AsSendBody,
    ) -> std::result::Result<http::Response<ureq::Body>, Attempt> {
        let builder = match self.tokens.bearer() {
            Ok(Some(token)) => builder.header("authorization", format!("Bearer {token}")),
            Ok(None) => builder,
            Err(reason) => {
                return Err(Attempt::Permanent(Error::Storage(format!(
                    "{ctx}: {reason}"
                ))))
            }
        };
        let req = builder
            .body(body)
            .map_err(|_| Attempt::Permanent(Error::Storage(format!("{ctx}: invalid request"))))?;
        self.agent.run(req).map_err(|e| {
            let (transient, reason) = classify(&e);
            to_attempt(transient, Error::Storage(format!("{ctx}: {reason}")))
        })
    }

    /// `ctx: <status> <reason>` for an unexpected status (`403 Forbidden`, `401 Unauthorized`,
    /// else GCS's reason code or the status's name); 5xx, 408 and 429 are transient. A 401 drops
    /// the cached token.
    pub(super) fn status_error(&self, ctx: &str, mut resp: http::Response<ureq::Body>) -> Attempt {
        let status = resp.status().as_u16();
        let reason = match status {
            401 => {
                self.tokens.invalidate();
                "Unauthorized".to_string()
            }
            403 => "Forbidden".to_string(),
            _ => api_reason(&read_limited(&mut resp, ERROR_BODY_LIMIT))
                .unwrap_or_else(|| canonical_reason(status)),
        };
        Attempt::from_status(status, Error::Storage(format!("{ctx}: {status} {reason}")))
    }

    pub(super) fn no_such_bucket(key: &str) -> Attempt {
        Attempt::Permanent(Error::Storage(format!("Failed to put {key}: NoSuchBucket")))
    }
}
