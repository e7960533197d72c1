//! Google Cloud Storage backend (SPEC.md `storage.backend: gcs`), over the GCS JSON API
//! (<https://cloud.google.com/storage/docs/json_api/v1>) with blocking ureq requests.
//!
//! Requests (object names are percent-encoded as one path segment, `/` included):
//! - put: a simple upload (`POST /upload/storage/v1/b/<bucket>/o?uploadType=media`) up to
//!   [`GcsOptions::upload_threshold`] bytes (8 MiB by default); above it a resumable upload
//!   session (`uploadType=resumable`) fed with `PUT` chunks of [`GcsOptions::chunk_size`] bytes
//!   (a multiple of 256 KiB), each read from the file when it is sent. An object only appears when
//!   its last chunk arrives, so a reader never sees a partial object. After a transient failure the
//!   session's status is queried (`Content-Range: bytes */<size>`) and the upload goes on from the
//!   offset GCS reports (GCS doc "Perform resumable uploads").
//! - get: `GET /storage/v1/b/<bucket>/o/<name>?alt=media`, streamed; head: `objects.get` with
//!   `fields=size`; list: `objects.list` with `prefix`, following `pageToken`; delete:
//!   `objects.delete` (404 counts as success).
//!
//! Endpoint and credentials ([`open`]):
//! - `STORAGE_EMULATOR_HOST` (`http://127.0.0.1:4443`, or `127.0.0.1:4443` meaning http): the base
//!   URL instead of `https://storage.googleapis.com`, and no credentials are sent (as Google's
//!   client libraries do).
//! - Otherwise credentials come from, in order: `storage.service_account_path`,
//!   `GOOGLE_APPLICATION_CREDENTIALS`, the application default credentials file
//!   (`$CLOUDSDK_CONFIG/application_default_credentials.json`, else
//!   `$HOME/.config/gcloud/application_default_credentials.json`; types `service_account` and
//!   `authorized_user`), then the GCE metadata server (`GCE_METADATA_HOST` overrides
//!   `metadata.google.internal`). See [`Credentials::resolve`].
//!
//! Errors (SPEC.md "Errors"), all `Storage error: ...`: `Key not found: <key>`;
//! `Failed to put <key>: NoSuchBucket` when the bucket is missing (GCS answers the upload with its
//! own 404 `notFound`; the S3 name is kept so that the message is the same for every backend);
//! `Failed to put <key>: 403 Forbidden`; `Failed to <op> <key>: <status> <GCS reason>`;
//! `Failed to create GCS backend: endpoint connection error` or `...: 403 Forbidden` from the
//! probe made when opening. No message holds a token, a private key, a client secret, a refresh
//! token or an upload session URL.

use super::retry::{self, Attempt, Policy};
use super::{io_reason, validate_key, validate_prefix, Storage};
use crate::error::{Error, Result};
use base64::Engine;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use serde::Deserialize;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use ureq::http;

/// Base URL of Google's JSON API (both `/storage/v1` and `/upload/storage/v1` live below it).
pub const GOOGLE_ENDPOINT: &str = "https://storage.googleapis.com";
/// OAuth scope requested for service-account tokens: read and write objects.
pub const SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
/// Google's OAuth 2.0 token endpoint, used when a credentials file names none.
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// Resumable-upload chunks must be multiples of this many bytes (256 KiB; GCS JSON API doc).
pub const CHUNK_ALIGN: u64 = 256 * 1024;
/// Default largest object sent by a single simple upload: 8 MiB.
pub const DEFAULT_UPLOAD_THRESHOLD: u64 = 8 << 20;
/// Default resumable-upload chunk: 8 MiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 8 << 20;

const METADATA_DEFAULT_HOST: &str = "metadata.google.internal";
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
const ADC_FILE: &str = "application_default_credentials.json";
const JWT_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Connect (and name resolution) timeout of storage and token requests.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout of the metadata server (it is local when it exists at all).
const METADATA_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of each socket read or write and of waiting for a response's headers.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of an error response read for its reason.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;
/// Largest JSON answer (listing page, token) accepted.
const JSON_BODY_LIMIT: u64 = 16 << 20;
const CREATE_CTX: &str = "Failed to create GCS backend";

/// Characters left as they are in a path segment or query value: RFC 3986 "unreserved".
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes `s` as one URL path segment or query value (`/` becomes `%2F`).
fn enc(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Opens the backend from the `storage` section (SPEC.md "storage"), probing the endpoint with one
/// `objects.list` request (`maxResults=1`). Reads `STORAGE_EMULATOR_HOST`,
/// `GOOGLE_APPLICATION_CREDENTIALS`, `CLOUDSDK_CONFIG`, `HOME` and `GCE_METADATA_HOST` (see the
/// module doc). `storage.prefix` is not applied here: the caller wraps the result with
/// [`super::with_prefix`]. Errors: `Storage error: Failed to create GCS backend: <reason>`.
pub fn open(cfg: &crate::config::GcsStorage) -> Result<Arc<dyn Storage>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    Ok(Arc::new(open_with_env(cfg, &env)?))
}

/// [`open`] with the environment given as a lookup function (tests run in one process).
fn open_with_env(
    cfg: &crate::config::GcsStorage,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<GcsBackend> {
    let (endpoint, credentials) = match env("STORAGE_EMULATOR_HOST") {
        Some(host) => (Some(host), Credentials::Anonymous),
        None => (
            None,
            Credentials::resolve(cfg.service_account_path.as_deref(), env)?,
        ),
    };
    let mut opts = GcsOptions::new(&cfg.bucket, credentials);
    opts.endpoint = endpoint;
    GcsBackend::new(opts)
}

/// Normalises an endpoint: trailing `/` removed, `http://` added when no scheme is given.
fn normalize_endpoint(endpoint: &str) -> String {
    let e = endpoint.trim().trim_end_matches('/');
    if e.contains("://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

// ---------------------------------------------------------------------------------------------
// Credentials and tokens
// ---------------------------------------------------------------------------------------------

/// Where access tokens come from.
pub enum Credentials {
    /// No `Authorization` header (emulators).
    Anonymous,
    /// A service-account key: a self-signed RS256 JWT exchanged at the key's `token_uri`
    /// (Google doc "Using OAuth 2.0 for Server to Server Applications").
    ServiceAccount(ServiceAccount),
    /// A user's refresh token from `gcloud auth application-default login`.
    AuthorizedUser(AuthorizedUser),
    /// The GCE metadata server at `base_url` (e.g. `http://metadata.google.internal`).
    /// `fallback` is true when nothing else was configured (it shapes the error message).
    Metadata {
        /// Scheme and host, no trailing `/`.
        base_url: String,
        /// Chosen because no other credentials were found.
        fallback: bool,
    },
}

/// The parts of a service-account JSON key file that are used.
pub struct ServiceAccount {
    client_email: String,
    private_key_id: Option<String>,
    key: RsaKeyPair,
    token_uri: String,
}

/// The parts of an `authorized_user` credentials file that are used.
pub struct AuthorizedUser {
    client_id: String,
    client_secret: String,
    refresh_token: String,
    token_uri: String,
}

impl std::fmt::Debug for Credentials {
    /// Names the kind and the account only: never the key, secret or token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => write!(f, "Anonymous"),
            Credentials::ServiceAccount(sa) => write!(f, "ServiceAccount({})", sa.client_email),
            Credentials::AuthorizedUser(u) => write!(f, "AuthorizedUser({})", u.client_id),
            Credentials::Metadata { base_url, .. } => write!(f, "Metadata({base_url})"),
        }
    }
}

/// A credentials file as Google writes them (both kinds in one shape).
#[derive(Deserialize)]
struct CredentialsFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    refresh_token: Option<String>,
}

impl Credentials {
    /// Finds credentials in SPEC.md "Authentication" order: `service_account_path`, then the file
    /// named by `GOOGLE_APPLICATION_CREDENTIALS`, then the application default credentials file
    /// (`$CLOUDSDK_CONFIG/application_default_credentials.json` or
    /// `$HOME/.config/gcloud/application_default_credentials.json`, when it exists), then the GCE
    /// metadata server (`http://$GCE_METADATA_HOST`, default `metadata.google.internal`; it is
    /// only contacted when a token is needed). `env` looks up an environment variable.
    /// Errors: `Storage error: Failed to create GCS backend: invalid credentials file <path>: <reason>`.
    pub fn resolve(
        service_account_path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Credentials> {
        if let Some(p) = service_account_path {
            return Credentials::from_file(p);
        }
        if let Some(p) = env("GOOGLE_APPLICATION_CREDENTIALS") {
            return Credentials::from_file(Path::new(&p));
        }
        let adc = match env("CLOUDSDK_CONFIG") {
            Some(dir) => Some(PathBuf::from(dir).join(ADC_FILE)),
            None => env("HOME").map(|h| PathBuf::from(h).join(".config/gcloud").join(ADC_FILE)),
        };
        if let Some(p) = adc.filter(|p| p.is_file()) {
            return Credentials::from_file(&p);
        }
        let host = env("GCE_METADATA_HOST").unwrap_or_else(|| METADATA_DEFAULT_HOST.to_string());
        Ok(Credentials::Metadata {
            base_url: normalize_endpoint(&host),
            fallback: true,
        })
    }

    /// Reads a JSON credentials file of type `service_account` or `authorized_user`.
    /// Errors: `Storage error: Failed to create GCS backend: invalid credentials file <path>:
    /// <reason>` (the reason never quotes the file's content).
    pub fn from_file(path: &Path) -> Result<Credentials> {
        let fail = |reason: &str| {
            Error::Storage(format!(
                "{CREATE_CTX}: invalid credentials file {}: {reason}",
                path.display()
            ))
        };
        let data = std::fs::read(path).map_err(|e| fail(&io_reason(&e)))?;
        Credentials::from_json(&data).map_err(|r| fail(&r))
    }

    /// Parses a credentials file; the error is a reason without any of the file's content.
    fn from_json(data: &[u8]) -> std::result::Result<Credentials, String> {
        let f: CredentialsFile = serde_json::from_slice(data)
            .map_err(|e| format!("not valid JSON (line {}, column {})", e.line(), e.column()))?;
        let need = |v: Option<String>, name: &str| v.ok_or_else(|| format!("{name} missing"));
        match f.kind.as_deref() {
            Some("service_account") => {
                let pem = need(f.private_key, "private_key")?;
                let key = parse_rsa_pem(&pem)?;
                Ok(Credentials::ServiceAccount(ServiceAccount {
                    client_email: need(f.client_email, "client_email")?,
                    private_key_id: f.private_key_id,
                    key,
                    token_uri: f.token_uri.unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string()),
                }))
            }
            Some("authorized_user") => Ok(Credentials::AuthorizedUser(AuthorizedUser {
                client_id: need(f.client_id, "client_id")?,
                client_secret: need(f.client_secret, "client_secret")?,
                refresh_token: need(f.refresh_token, "refresh_token")?,
                token_uri: f.token_uri.unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string()),
            })),
            Some(other) => Err(format!(
                "credentials type {} is not supported (service_account or authorized_user)",
                short_reason(other).unwrap_or_else(|| "?".into())
            )),
            None => Err("type missing".into()),
        }
    }
}

/// Decodes a PEM RSA private key: PKCS#8 (`BEGIN PRIVATE KEY`, what Google issues) or PKCS#1
/// (`BEGIN RSA PRIVATE KEY`). Errors never quote the key.
fn parse_rsa_pem(pem: &str) -> std::result::Result<RsaKeyPair, String> {
    let pkcs8 = pem.contains("-----BEGIN PRIVATE KEY-----");
    let pkcs1 = pem.contains("-----BEGIN RSA PRIVATE KEY-----");
    if !pkcs8 && !pkcs1 {
        return Err("private_key is not a PEM private key".into());
    }
    let b64: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .map_err(|_| "private_key is not valid base64".to_string())?;
    let key = if pkcs8 {
        RsaKeyPair::from_pkcs8(&der)
    } else {
        RsaKeyPair::from_der(&der)
    };
    key.map_err(|e| format!("private_key rejected: {e}"))
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ServiceAccount {
    /// The signed JWT assertion for the token request, issued at `iat` (seconds since epoch).
    fn assertion(
        &self,
        rng: &ring::rand::SystemRandom,
        iat: u64,
    ) -> std::result::Result<String, String> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = serde_json::Value::String(kid.clone());
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + 3600,
        });
        let input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, rng, input.as_bytes(), &mut sig)
            .map_err(|_| "signing the token request failed".to_string())?;
        Ok(format!("{input}.{}", b64.encode(sig)))
    }
}

/// An access token and when to fetch the next one.
struct CachedToken {
    token: String,
    refresh_at: Instant,
}

/// The answer of a token endpoint or the metadata server.
#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

/// Access tokens of one set of credentials, cached until shortly before they expire and shared
/// by all threads (one fetch at a time).
struct TokenSource {
    credentials: Credentials,
    agent: ureq::Agent,
    metadata_agent: ureq::Agent,
    policy: Policy,
    cache: Mutex<Option<CachedToken>>,
    rng: ring::rand::SystemRandom,
}

impl TokenSource {
    fn new(credentials: Credentials, agent: ureq::Agent, policy: Policy) -> TokenSource {
        TokenSource {
            credentials,
            agent,
            metadata_agent: new_agent(METADATA_CONNECT_TIMEOUT),
            policy,
            cache: Mutex::new(None),
            rng: ring::rand::SystemRandom::new(),
        }
    }

    /// The current token (`None` for anonymous access), fetched when missing or about to expire.
    /// The error is a reason for messages, without secrets.
    fn bearer(&self) -> std::result::Result<Option<String>, String> {
        if matches!(self.credentials, Credentials::Anonymous) {
            return Ok(None);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.as_ref() {
            if Instant::now() < c.refresh_at {
                return Ok(Some(c.token.clone()));
            }
        }
        let fetched_at = Instant::now();
        let t = self.fetch()?;
        // Refresh 5 minutes before expiry, or at half the lifetime of a short-lived token.
        let life = Duration::from_secs(t.expires_in.unwrap_or(3600));
        let margin = (life / 2).min(Duration::from_secs(300));
        *cache = Some(CachedToken {
            token: t.access_token.clone(),
            refresh_at: fetched_at + life - margin,
        });
        Ok(Some(t.access_token))
    }

    /// Forgets the cached token (after a 401), so that the next request fetches a new one.
    fn invalidate(&self) {
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn fetch(&self) -> std::result::Result<TokenResponse, String> {
        match &self.credentials {
            Credentials::Anonymous => Err("no credentials".into()),
            Credentials::ServiceAccount(sa) => {
                let jwt = sa.assertion(&self.rng, unix_now())?;
                let form = format!("grant_type={}&assertion={}", enc(JWT_GRANT), enc(&jwt));
                self.exchange(&sa.token_uri, &form)
            }
            Credentials::AuthorizedUser(u) => {
                let form = format!(
                    "grant_type=refresh_token&client_id={}&client_secret={}&refresh_token={}",
                    enc(&u.client_id),
                    enc(&u.client_secret),
                    enc(&u.refresh_token)
                );
                self.exchange(&u.token_uri, &form)
            }
            Credentials::Metadata { base_url, fallback } => {
                let url = format!("{base_url}{METADATA_TOKEN_PATH}");
                let policy = Policy {
                    attempts: self.policy.attempts.min(3),
                    ..self.policy
                };
                let result = run_token_request(policy, "metadata token request", || {
                    let req = http::Request::get(&url)
                        .header("metadata-flavor", "Google")
                        .body(());
                    match req {
                        Ok(r) => self.metadata_agent.run(r),
                        Err(e) => Err(ureq::Error::Http(e)),
                    }
                });
                result.map_err(|reason| {
                    if *fallback && reason.contains("connection error") {
                        "no credentials found (no service_account_path, \
                         GOOGLE_APPLICATION_CREDENTIALS or application default credentials) \
                         and the GCE metadata server is unreachable"
                            .to_string()
                    } else {
                        format!("metadata server: {reason}")
                    }
                })
            }
        }
    }

    /// Posts an OAuth form to `token_uri` and reads the token from the answer.
    fn exchange(&self, token_uri: &str, form: &str) -> std::result::Result<TokenResponse, String> {
        run_token_request(self.policy, "token request", || {
            let req = http::Request::post(token_uri)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form.as_bytes());
            match req {
                Ok(r) => self.agent.run(r),
                Err(e) => Err(ureq::Error::Http(e)),
            }
        })
        .map_err(|reason| format!("token request failed: {reason}"))
    }
}

/// Runs one token request with retries; the error is a reason such as `400 invalid_grant` or
/// `token endpoint connection error`.
fn run_token_request(
    policy: Policy,
    what: &str,
    mut send: impl FnMut() -> std::result::Result<http::Response<ureq::Body>, ureq::Error>,
) -> std::result::Result<TokenResponse, String> {
    let result = retry::run(policy, what, || {
        let mut resp = send().map_err(|e| {
            let (transient, reason) = classify(&e);
            let reason = if reason == "endpoint connection error" {
                "token endpoint connection error".to_string()
            } else {
                reason
            };
            to_attempt(transient, Error::Storage(reason))
        })?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = read_limited(&mut resp, ERROR_BODY_LIMIT);
            let code = oauth_error_code(&body)
                .or_else(|| api_reason(&body))
                .unwrap_or_else(|| canonical_reason(status));
            return Err(Attempt::from_status(
                status,
                Error::Storage(format!("{status} {code}")),
            ));
        }
        let body = read_limited(&mut resp, JSON_BODY_LIMIT);
        serde_json::from_slice::<TokenResponse>(&body)
            .map_err(|_| Attempt::Permanent(Error::Storage("answer holds no access_token".into())))
    });
    result.map_err(|e| e.message().to_string())
}

/// The `error` code of an OAuth error answer (`{"error":"invalid_grant",...}`), if short and plain.
fn oauth_error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    short_reason(v.get("error")?.as_str()?)
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers
// ---------------------------------------------------------------------------------------------

/// An agent that returns every status as a response, follows no redirects (a 308 is the answer
/// of a resumable chunk), and times out connecting after `connect` and each read or write after
/// [`IO_TIMEOUT`].
fn new_agent(connect: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_resolve(Some(connect))
        .timeout_connect(Some(connect))
        .timeout_per_read(Some(IO_TIMEOUT))
        .timeout_per_write(Some(IO_TIMEOUT))
        .timeout_recv_response(Some(IO_TIMEOUT))
        .user_agent(concat!("rmq-backup/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// Transient or permanent, for [`retry::run`].
fn to_attempt(transient: bool, e: Error) -> Attempt {
    if transient {
        Attempt::Transient(e)
    } else {
        Attempt::Permanent(e)
    }
}

/// Classifies a ureq error: (worth retrying, short reason without URL or secrets).
fn classify(e: &ureq::Error) -> (bool, String) {
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
fn classify_io(e: &io::Error) -> (bool, String) {
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
fn read_limited(resp: &mut http::Response<ureq::Body>, limit: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = resp
        .body_mut()
        .as_reader()
        .take(limit)
        .read_to_end(&mut out);
    out
}

/// Reads a whole JSON answer (at most [`JSON_BODY_LIMIT`] bytes); errors become `ctx: <reason>`.
fn read_json<T: serde::de::DeserializeOwned>(
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
fn api_reason(body: &[u8]) -> Option<String> {
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
fn short_reason(s: &str) -> Option<String> {
    let ok = !s.is_empty()
        && s.len() <= 60
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.'));
    ok.then(|| s.to_string())
}

fn canonical_reason(status: u16) -> String {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("error")
        .to_string()
}

/// Reads and drops the rest of a small answer so the connection can be reused.
fn drain(mut resp: http::Response<ureq::Body>) {
    let _ = read_limited(&mut resp, ERROR_BODY_LIMIT);
}

// ---------------------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------------------

/// Options of [`GcsBackend::new`].
#[derive(Debug)]
pub struct GcsOptions {
    /// Bucket name.
    pub bucket: String,
    /// Base URL instead of [`GOOGLE_ENDPOINT`] (`http://host:port`; no scheme means http).
    pub endpoint: Option<String>,
    /// Where access tokens come from.
    pub credentials: Credentials,
    /// Objects up to this many bytes go in one simple upload; larger ones in a resumable upload.
    pub upload_threshold: u64,
    /// Bytes per resumable-upload chunk, rounded down to a multiple of [`CHUNK_ALIGN`]
    /// (at least one).
    pub chunk_size: u64,
    /// Retries of each request.
    pub policy: Policy,
}

impl GcsOptions {
    /// Defaults: Google's endpoint, 8 MiB threshold and chunks, the default retry policy.
    pub fn new(bucket: &str, credentials: Credentials) -> GcsOptions {
        GcsOptions {
            bucket: bucket.to_string(),
            endpoint: None,
            credentials,
            upload_threshold: DEFAULT_UPLOAD_THRESHOLD,
            chunk_size: DEFAULT_CHUNK_SIZE,
            policy: Policy::default(),
        }
    }
}

/// A bucket of Google Cloud Storage (or of an emulator speaking its JSON API).
pub struct GcsBackend {
    agent: ureq::Agent,
    /// Base URL, no trailing `/`.
    base: String,
    bucket: String,
    tokens: TokenSource,
    upload_threshold: u64,
    chunk_size: u64,
    policy: Policy,
}

/// What a resumable-upload request left behind.
enum Step {
    /// The object exists; its size as GCS reports it.
    Done(Option<u64>),
    /// GCS holds the first `n` bytes; send the rest from there.
    Next(u64),
}

/// Bytes of an upload, fetched chunk by chunk.
trait ChunkSource {
    /// Total size in bytes.
    fn total(&self) -> u64;
    /// The bytes `[start, start + len)`.
    fn chunk(&mut self, start: u64, len: usize) -> Result<&[u8]>;
}

struct SliceSource<'a>(&'a [u8]);

impl ChunkSource for SliceSource<'_> {
    fn total(&self) -> u64 {
        self.0.len() as u64
    }
    fn chunk(&mut self, start: u64, len: usize) -> Result<&[u8]> {
        let start = start as usize;
        Ok(&self.0[start..start + len])
    }
}

/// A file read one chunk at a time into one reused buffer.
struct FileSource<'a> {
    file: File,
    path: &'a Path,
    total: u64,
    buf: Vec<u8>,
    /// Offset of `buf` in the file, when it holds data.
    buf_start: Option<u64>,
}

impl ChunkSource for FileSource<'_> {
    fn total(&self) -> u64 {
        self.total
    }
    fn chunk(&mut self, start: u64, len: usize) -> Result<&[u8]> {
        if self.buf_start != Some(start) || self.buf.len() != len {
            self.buf_start = None;
            self.buf.resize(len, 0);
            let read = self
                .file
                .seek(SeekFrom::Start(start))
                .and_then(|_| self.file.read_exact(&mut self.buf));
            read.map_err(|e| {
                let reason = if e.kind() == io::ErrorKind::UnexpectedEof {
                    "file shrank during upload".to_string()
                } else {
                    io_reason(&e)
                };
                Error::Io(format!("Failed to read {}: {reason}", self.path.display()))
            })?;
            self.buf_start = Some(start);
        }
        Ok(&self.buf)
    }
}

fn source_read_error(path: &Path, e: &io::Error) -> Error {
    Error::Io(format!(
        "Failed to read {}: {}",
        path.display(),
        io_reason(e)
    ))
}

/// The end of a `Range: bytes=0-<last>` header plus one; no header means nothing is stored.
fn persisted_bytes(resp: &http::Response<ureq::Body>) -> Option<u64> {
    match resp.headers().get("range") {
        None => Some(0),
        Some(v) => {
            let last = v
                .to_str()
                .ok()?
                .trim()
                .strip_prefix("bytes=")?
                .split_once('-')?
                .1;
            last.trim().parse::<u64>().ok().map(|n| n + 1)
        }
    }
}

/// The `size` of an object resource (a decimal string in the JSON API; a number is accepted).
fn size_of(v: &serde_json::Value) -> Option<u64> {
    match v.get("size")? {
        serde_json::Value::String(s) => s.parse().ok(),
        serde_json::Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

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
        };
        backend.probe()?;
        Ok(backend)
    }

    fn probe(&self) -> Result<()> {
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
    fn object_url(&self, key: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            enc(&self.bucket),
            enc(key)
        )
    }

    /// `<base>/upload/storage/v1/b/<bucket>/o?uploadType=<kind>&name=<name>`.
    fn upload_url(&self, kind: &str, key: &str) -> String {
        format!(
            "{}/upload/storage/v1/b/{}/o?uploadType={kind}&name={}",
            self.base,
            enc(&self.bucket),
            enc(key)
        )
    }

    /// Sends one request with the bearer token. Transport failures become `ctx: <reason>`,
    /// transient ones retried; every HTTP status comes back as a response.
    fn call(
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
    fn status_error(&self, ctx: &str, mut resp: http::Response<ureq::Body>) -> Attempt {
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

    fn no_such_bucket(key: &str) -> Attempt {
        Attempt::Permanent(Error::Storage(format!("Failed to put {key}: NoSuchBucket")))
    }

    /// One simple upload (`uploadType=media`) of `data`.
    fn simple_upload(&self, key: &str, data: &[u8]) -> Result<()> {
        let ctx = format!("Failed to put {key}");
        let url = self.upload_url("media", key);
        retry::run(self.policy, &format!("put {key}"), || {
            let req = http::Request::post(&url).header("content-type", "application/octet-stream");
            let resp = self.call(&ctx, req, data)?;
            match resp.status().as_u16() {
                200 | 201 => {
                    drain(resp);
                    Ok(())
                }
                404 => Err(Self::no_such_bucket(key)),
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }

    /// Starts a resumable upload session of `total` bytes; returns its session URL (a secret:
    /// never put it in a message).
    fn start_session(&self, key: &str, ctx: &str, total: u64) -> Result<String> {
        let url = self.upload_url("resumable", key);
        retry::run(self.policy, &format!("put {key}"), || {
            let req = http::Request::post(&url)
                .header("content-type", "application/json; charset=UTF-8")
                .header("x-upload-content-type", "application/octet-stream")
                .header("x-upload-content-length", total.to_string());
            let resp = self.call(ctx, req, &b"{}"[..])?;
            match resp.status().as_u16() {
                200 | 201 => {
                    let location = resp
                        .headers()
                        .get("location")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    drain(resp);
                    match location {
                        Some(l) if l.starts_with('/') => Ok(format!("{}{l}", self.base)),
                        Some(l) => Ok(l),
                        None => Err(Attempt::Permanent(Error::Storage(format!(
                            "{ctx}: no upload session in the answer"
                        )))),
                    }
                }
                404 => Err(Self::no_such_bucket(key)),
                _ => Err(self.status_error(ctx, resp)),
            }
        })
    }

    /// Reads the answer to a chunk or a status query of a resumable upload.
    fn session_step(
        &self,
        ctx: &str,
        mut resp: http::Response<ureq::Body>,
    ) -> std::result::Result<Step, Attempt> {
        match resp.status().as_u16() {
            200 | 201 => {
                let v: serde_json::Value = read_json(&mut resp, ctx)?;
                Ok(Step::Done(size_of(&v)))
            }
            308 => {
                let n = persisted_bytes(&resp).ok_or_else(|| {
                    Attempt::Permanent(Error::Storage(format!("{ctx}: invalid Range answer")))
                })?;
                drain(resp);
                Ok(Step::Next(n))
            }
            _ => Err(self.status_error(ctx, resp)),
        }
    }

    /// Uploads `src` through a resumable session, one chunk at a time.
    fn resumable_upload(&self, key: &str, src: &mut dyn ChunkSource) -> Result<()> {
        let ctx = format!("Failed to put {key}");
        let what = format!("put {key}");
        let total = src.total();
        let session = self.start_session(key, &ctx, total)?;
        let mut offset = 0u64;
        let mut stalls = 0u32;
        loop {
            let len = self.chunk_size.min(total - offset) as usize;
            let last = offset + len as u64 == total;
            let data = src.chunk(offset, len)?;
            let range = if last {
                format!("bytes {offset}-{}/{total}", total - 1)
            } else {
                format!("bytes {offset}-{}/*", offset + len as u64 - 1)
            };
            let mut resync = false;
            let step = retry::run(self.policy, &what, || {
                if resync {
                    // After a failure, ask GCS how much it holds (GCS doc "Checking the status of
                    // a resumable upload") and go on from there.
                    let req = http::Request::put(&session)
                        .header("content-range", format!("bytes */{total}"));
                    let resp = self.call(&ctx, req, &[][..])?;
                    match self.session_step(&ctx, resp)? {
                        Step::Next(n) if n == offset => {}
                        other => return Ok(other),
                    }
                }
                let req = http::Request::put(&session).header("content-range", range.as_str());
                let result = self
                    .call(&ctx, req, data)
                    .and_then(|resp| self.session_step(&ctx, resp));
                if matches!(result, Err(Attempt::Transient(_))) {
                    resync = true;
                }
                result
            })?;
            match step {
                Step::Done(Some(size)) if size != total => {
                    return Err(Error::Storage(format!(
                        "{ctx}: stored object has {size} of {total} bytes"
                    )))
                }
                Step::Done(_) => return Ok(()),
                Step::Next(n) if n >= total || n > offset + len as u64 => {
                    return Err(Error::Storage(format!(
                        "{ctx}: upload session reports {n} of {total} bytes"
                    )))
                }
                Step::Next(n) => {
                    if n <= offset {
                        stalls += 1;
                        if stalls >= self.policy.attempts.max(1) {
                            return Err(Error::Storage(format!("{ctx}: upload makes no progress")));
                        }
                    } else {
                        stalls = 0;
                    }
                    offset = n;
                }
            }
        }
    }

    /// `GET ...?alt=media`, retried; `on_body` consumes the body of a 200 answer.
    fn download<T>(
        &self,
        key: &str,
        mut on_body: impl FnMut(http::Response<ureq::Body>) -> std::result::Result<T, Attempt>,
    ) -> Result<T> {
        validate_key(key)?;
        let ctx = format!("Failed to get {key}");
        let url = format!("{}?alt=media", self.object_url(key));
        retry::run(self.policy, &format!("get {key}"), || {
            let resp = self.call(&ctx, http::Request::get(&url), ())?;
            match resp.status().as_u16() {
                200 => on_body(resp),
                404 => Err(Attempt::Permanent(Error::Storage(format!(
                    "Key not found: {key}"
                )))),
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }
}

impl Storage for GcsBackend {
    /// Streams the file: a simple upload up to the threshold, else a resumable upload read one
    /// chunk at a time (`chunk_size` bytes of memory).
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        let mut file = File::open(path).map_err(|e| source_read_error(path, &e))?;
        let total = file
            .metadata()
            .map_err(|e| source_read_error(path, &e))?
            .len();
        if total <= self.upload_threshold {
            let mut data = Vec::with_capacity(total as usize);
            (&mut file)
                .take(total)
                .read_to_end(&mut data)
                .map_err(|e| source_read_error(path, &e))?;
            return self.simple_upload(key, &data);
        }
        let mut src = FileSource {
            file,
            path,
            total,
            buf: Vec::new(),
            buf_start: None,
        };
        self.resumable_upload(key, &mut src)
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        validate_key(key)?;
        if data.len() as u64 <= self.upload_threshold {
            self.simple_upload(key, data)
        } else {
            self.resumable_upload(key, &mut SliceSource(data))
        }
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        let ctx = format!("Failed to get {key}");
        self.download(key, |mut resp| {
            let mut out = Vec::new();
            resp.body_mut()
                .as_reader()
                .read_to_end(&mut out)
                .map_err(|e| {
                    let (transient, reason) = classify_io(&e);
                    to_attempt(transient, Error::Storage(format!("{ctx}: {reason}")))
                })?;
            Ok(out)
        })
    }

    /// Streams the body into `path` through a 1 MiB buffer; a transient failure part-way starts
    /// the download again (the file is truncated).
    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        let ctx = format!("Failed to get {key}");
        let write_error = |e: &io::Error| {
            Attempt::Permanent(Error::Io(format!(
                "Failed to write {}: {}",
                path.display(),
                io_reason(e)
            )))
        };
        let mut buf = vec![0u8; 1 << 20];
        self.download(key, |mut resp| {
            let mut out = File::create(path).map_err(|e| write_error(&e))?;
            let mut reader = resp.body_mut().as_reader();
            let mut total = 0u64;
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let (transient, reason) = classify_io(&e);
                        return Err(to_attempt(
                            transient,
                            Error::Storage(format!("{ctx}: {reason}")),
                        ));
                    }
                };
                out.write_all(&buf[..n]).map_err(|e| write_error(&e))?;
                total += n as u64;
            }
            out.flush().map_err(|e| write_error(&e))?;
            Ok(total)
        })
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        let ctx = format!("Failed to head {key}");
        let url = format!("{}?fields=size", self.object_url(key));
        retry::run(self.policy, &format!("head {key}"), || {
            let mut resp = self.call(&ctx, http::Request::get(&url), ())?;
            match resp.status().as_u16() {
                200 => {
                    let v: serde_json::Value = read_json(&mut resp, &ctx)?;
                    size_of(&v).map(Some).ok_or_else(|| {
                        Attempt::Permanent(Error::Storage(format!("{ctx}: answer has no size")))
                    })
                }
                404 => {
                    drain(resp);
                    Ok(None)
                }
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }

    /// Follows `nextPageToken` through every page; keys that [`validate_key`] refuses are skipped.
    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        #[derive(Deserialize)]
        struct Item {
            name: String,
        }
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            items: Vec<Item>,
            #[serde(rename = "nextPageToken")]
            next_page_token: Option<String>,
        }
        let ctx = format!(
            "Failed to list {}",
            if prefix.is_empty() { "/" } else { prefix }
        );
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?maxResults=1000&fields=items(name),nextPageToken",
                self.base,
                enc(&self.bucket)
            );
            if !prefix.is_empty() {
                url.push_str(&format!("&prefix={}", enc(prefix)));
            }
            if let Some(t) = &token {
                url.push_str(&format!("&pageToken={}", enc(t)));
            }
            let page: Page = retry::run(self.policy, &ctx, || {
                let mut resp = self.call(&ctx, http::Request::get(&url), ())?;
                match resp.status().as_u16() {
                    200 => read_json(&mut resp, &ctx),
                    _ => Err(self.status_error(&ctx, resp)),
                }
            })?;
            for item in page.items {
                if !item.name.starts_with(prefix) {
                    continue;
                }
                if validate_key(&item.name).is_ok() {
                    keys.push(item.name);
                } else {
                    log::debug!("gcs: skipping object {:?}: not a valid key", item.name);
                }
            }
            match page.next_page_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => break,
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let ctx = format!("Failed to delete {key}");
        let url = self.object_url(key);
        retry::run(self.policy, &format!("delete {key}"), || {
            let resp = self.call(&ctx, http::Request::delete(&url), ())?;
            match resp.status().as_u16() {
                200 | 204 | 404 => {
                    drain(resp);
                    Ok(())
                }
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }

    /// `gcs://<bucket>` (SPEC.md "Storage URLs").
    fn location(&self) -> String {
        format!("gcs://{}", self.bucket)
    }
}
