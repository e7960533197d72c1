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
use std::io::{self, Read, Seek, SeekFrom};
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
    ServiceAccount(Box<ServiceAccount>),
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
                Ok(Credentials::ServiceAccount(Box::new(ServiceAccount {
                    client_email: need(f.client_email, "client_email")?,
                    private_key_id: f.private_key_id,
                    key,
                    token_uri: f.token_uri.unwrap_or_else(|| GOOGLE_TOKEN_URI.to_string()),
                })))
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
                    // As the last resort of the default chain, a metadata server that cannot
                    // be reached (no such host off GCE, refused, timed out) means "nothing
                    // configured"; an HTTP answer is reported as it is.
                    let answered = reason.starts_with(|c: char| c.is_ascii_digit());
                    if *fallback && !answered {
                        format!(
                            "no credentials found (no service_account_path, \
                             GOOGLE_APPLICATION_CREDENTIALS or application default credentials) \
                             and the GCE metadata server is unreachable ({reason})"
                        )
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

/// [`super::http_agent`] with this backend's I/O timeout.
fn new_agent(connect: Duration) -> ureq::Agent {
    super::http_agent(connect, IO_TIMEOUT)
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
        self.download(key, |mut resp| {
            let mut reader = resp.body_mut().as_reader();
            super::body_to_file(&mut reader, path, |e| {
                let (transient, reason) = classify_io(e);
                to_attempt(transient, Error::Storage(format!("{ctx}: {reason}")))
            })
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
                // A server that hands back the token it was given would loop forever.
                Some(t) if token.as_deref() == Some(t.as_str()) => {
                    return Err(Error::Storage(format!(
                        "{ctx}: the server repeated a page token"
                    )))
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::conformance::{self, TempDir};
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
    use std::collections::HashMap;
    use std::io::BufRead;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    /// fake-gcs-server, started by scripts/setup-storage.sh.
    const EMULATOR: &str = "http://127.0.0.1:4443";

    fn fast() -> Policy {
        Policy {
            attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2] ^ seed)
            .collect()
    }

    fn unique(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "rmqb-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A bucket on fake-gcs-server unique to this call; emptied and deleted on drop.
    struct TestBucket(String);

    impl TestBucket {
        fn new(tag: &str) -> TestBucket {
            let name = unique(tag);
            let resp = new_agent(CONNECT_TIMEOUT)
                .post(format!("{EMULATOR}/storage/v1/b?project=test"))
                .send_json(serde_json::json!({ "name": name }))
                .expect("create bucket (is fake-gcs-server running?)");
            assert_eq!(resp.status().as_u16(), 200, "create bucket {name}");
            TestBucket(name)
        }
    }

    impl Drop for TestBucket {
        fn drop(&mut self) {
            if let Ok(s) = GcsBackend::new(emulator_options(&self.0)) {
                for k in s.list("").unwrap_or_default() {
                    let _ = s.delete(&k);
                }
            }
            let _ = new_agent(CONNECT_TIMEOUT)
                .delete(format!("{EMULATOR}/storage/v1/b/{}", self.0))
                .call();
        }
    }

    fn emulator_options(bucket: &str) -> GcsOptions {
        let mut o = GcsOptions::new(bucket, Credentials::Anonymous);
        o.endpoint = Some(EMULATOR.into());
        o.policy = fast();
        o
    }

    fn emulator_backend(bucket: &str, threshold: u64, chunk: u64) -> GcsBackend {
        let mut o = emulator_options(bucket);
        o.upload_threshold = threshold;
        o.chunk_size = chunk;
        GcsBackend::new(o).expect("open")
    }

    #[test]
    fn conforms_on_fake_gcs_server() {
        let b = TestBucket::new("conf");
        // Defaults: the suite's 20 MiB file goes through a resumable upload in 8 MiB chunks.
        let s = emulator_backend(&b.0, DEFAULT_UPLOAD_THRESHOLD, DEFAULT_CHUNK_SIZE);
        conformance::run(&s);
        assert_eq!(s.location(), format!("gcs://{}", b.0));
    }

    #[test]
    fn resumable_uploads_with_small_chunks() {
        let b = TestBucket::new("chunks");
        let s = emulator_backend(&b.0, 300_000, 256 * 1024);
        assert_eq!(s.chunk_size, CHUNK_ALIGN);
        conformance::run(&s);
        let tmp = TempDir::new("gcs-chunks");
        // A last chunk shorter than the others, one exactly full, and a file of one chunk + 1 byte.
        for (i, size) in [1_000_000usize, 2 * 262_144, 262_145, 300_001]
            .into_iter()
            .enumerate()
        {
            let data = pattern(size, i as u8);
            let src = tmp.0.join(format!("src{i}"));
            std::fs::write(&src, &data).expect("write");
            let key = format!("big/file {i}");
            s.put_file(&key, &src).expect("put_file");
            assert_eq!(s.head(&key).expect("head"), Some(size as u64));
            let dst = tmp.0.join(format!("dst{i}"));
            assert_eq!(s.get_to_file(&key, &dst).expect("get"), size as u64);
            assert!(std::fs::read(&dst).expect("read") == data, "size {size}");
            let bytes_key = format!("big/bytes {i}");
            s.put_bytes(&bytes_key, &data).expect("put_bytes");
            assert!(s.get_bytes(&bytes_key).expect("get") == data, "size {size}");
        }
        assert_eq!(s.list("big/").expect("list").len(), 8);
        // Overwrite a chunked object with a small one.
        s.put_bytes("big/file 0", b"small").expect("overwrite");
        assert_eq!(s.get_bytes("big/file 0").expect("get"), b"small");
    }

    #[test]
    fn open_uses_storage_emulator_host() {
        let b = TestBucket::new("env");
        let cfg = crate::config::GcsStorage {
            bucket: b.0.clone(),
            service_account_path: Some(PathBuf::from("/nonexistent/ignored-with-emulator.json")),
            prefix: None,
        };
        // No scheme means http, as in Google's client libraries.
        let env = |name: &str| (name == "STORAGE_EMULATOR_HOST").then(|| "127.0.0.1:4443".into());
        let s = open_with_env(&cfg, &env).expect("open");
        assert_eq!(s.base, EMULATOR);
        s.put_bytes("b1/manifest.json", b"{}").expect("put");
        assert_eq!(s.list_backup_ids().expect("ids"), ["b1"]);
        assert_eq!(s.location(), format!("gcs://{}", b.0));
    }

    #[test]
    fn missing_bucket_fails_on_put_not_on_open() {
        let bucket = unique("absent");
        let s = emulator_backend(&bucket, 300_000, 256 * 1024);
        assert_eq!(
            s.put_bytes("b/manifest.json", b"{}")
                .expect_err("no bucket"),
            Error::Storage("Failed to put b/manifest.json: NoSuchBucket".into())
        );
        // The resumable path reports the same.
        let tmp = TempDir::new("gcs-absent");
        let src = tmp.0.join("big");
        std::fs::write(&src, pattern(400_000, 3)).expect("write");
        assert_eq!(
            s.put_file("b/queues/q/segment-0001", &src)
                .expect_err("no bucket")
                .to_string(),
            "Storage error: Failed to put b/queues/q/segment-0001: NoSuchBucket"
        );
        assert_eq!(
            s.get_bytes("b/manifest.json").expect_err("absent"),
            Error::Storage("Key not found: b/manifest.json".into())
        );
    }

    #[test]
    fn missing_keys() {
        let b = TestBucket::new("missing");
        let s = emulator_backend(&b.0, DEFAULT_UPLOAD_THRESHOLD, DEFAULT_CHUNK_SIZE);
        let tmp = TempDir::new("gcs-missing");
        let key = "nope/manifest.json";
        let want = Error::Storage(format!("Key not found: {key}"));
        assert_eq!(s.get_bytes(key).expect_err("missing"), want);
        assert_eq!(
            s.get_to_file(key, &tmp.0.join("out")).expect_err("missing"),
            want
        );
        assert_eq!(s.head(key).expect("head"), None);
        s.delete(key).expect("delete of a missing key succeeds");
        assert!(s.list("nope/").expect("list").is_empty());
    }

    #[test]
    fn unreachable_endpoint() {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut o = GcsOptions::new("bucket", Credentials::Anonymous);
        o.endpoint = Some(format!("http://127.0.0.1:{port}"));
        o.policy = fast();
        assert_eq!(
            GcsBackend::new(o).err().expect("unreachable").to_string(),
            "Storage error: Failed to create GCS backend: endpoint connection error"
        );
    }

    #[test]
    fn object_names_are_one_path_segment() {
        assert_eq!(enc("a/b c+%41~x.y_z-"), "a%2Fb%20c%2B%2541~x.y_z-");
        assert_eq!(enc("ünï"), "%C3%BCn%C3%AF");
        assert_eq!(
            normalize_endpoint("127.0.0.1:4443/"),
            "http://127.0.0.1:4443"
        );
        assert_eq!(
            normalize_endpoint("https://storage.example"),
            "https://storage.example"
        );
    }

    // ----- A tiny HTTP server playing token endpoints, the metadata server and GCS. -----

    #[derive(Clone, Debug)]
    struct Seen {
        method: String,
        target: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
        fn path(&self) -> &str {
            self.target.split('?').next().unwrap_or("")
        }
        fn form(&self) -> HashMap<String, String> {
            String::from_utf8_lossy(&self.body)
                .split('&')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| {
                    let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
                    (k.to_string(), v.into_owned())
                })
                .collect()
        }
    }

    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    type Log = Arc<Mutex<Vec<Seen>>>;

    /// Serves `handler` on 127.0.0.1:<free port>, one request per connection; returns the base
    /// URL and the log of requests received.
    fn serve(handler: impl Fn(&Seen) -> Reply + Send + 'static) -> (String, Log) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let log: Log = Arc::new(Mutex::new(Vec::new()));
        let seen_log = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Some(seen) = read_request(&stream) else {
                    continue;
                };
                seen_log.lock().expect("log").push(seen.clone());
                let r = handler(&seen);
                let mut out = format!(
                    "HTTP/1.1 {} {}\r\ncontent-length: {}\r\nconnection: close\r\n",
                    r.status,
                    canonical_reason(r.status),
                    r.body.len()
                );
                for (k, v) in &r.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                let mut w = &stream;
                let _ = w
                    .write_all(out.as_bytes())
                    .and_then(|_| w.write_all(&r.body));
            }
        });
        (base, log)
    }

    fn read_request(stream: &TcpStream) -> Option<Seen> {
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .ok()?;
        let mut r = io::BufReader::new(stream);
        let mut line = String::new();
        r.read_line(&mut line).ok()?;
        let mut parts = line.split_whitespace();
        let method = parts.next()?.to_string();
        let target = parts.next()?.to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':')?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).ok()?;
        Some(Seen {
            method,
            target,
            headers,
            body,
        })
    }

    /// A throwaway 2048-bit RSA key (PKCS#8 PEM) made by the `openssl` CLI.
    fn throwaway_key() -> String {
        let out = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .output()
            .expect("the openssl CLI generates the test's throwaway RSA key");
        assert!(out.status.success(), "openssl genpkey failed");
        String::from_utf8(out.stdout).expect("PEM")
    }

    /// Checks a JWT bearer grant: signature (with the public key), header and claims.
    fn check_jwt(
        form: &HashMap<String, String>,
        public_der: &[u8],
        token_uri: &str,
    ) -> std::result::Result<(), &'static str> {
        if form.get("grant_type").map(String::as_str) != Some(JWT_GRANT) {
            return Err("grant_type");
        }
        let jwt = form.get("assertion").ok_or("assertion")?;
        let (signed, sig) = jwt.rsplit_once('.').ok_or("jwt shape")?;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let sig = b64.decode(sig).map_err(|_| "signature base64")?;
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_der)
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| "signature")?;
        let (h, c) = signed.split_once('.').ok_or("jwt shape")?;
        let decode = |s: &str| -> std::result::Result<serde_json::Value, &'static str> {
            let raw = b64.decode(s).map_err(|_| "base64")?;
            serde_json::from_slice(&raw).map_err(|_| "json")
        };
        let header = decode(h)?;
        let claims = decode(c)?;
        if header != serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "kid-1"}) {
            return Err("header");
        }
        let iat = claims["iat"].as_u64().ok_or("iat")?;
        let ok = claims["iss"] == "backup@test.iam.gserviceaccount.com"
            && claims["scope"] == SCOPE
            && claims["aud"] == token_uri
            && claims["exp"].as_u64() == Some(iat + 3600)
            && unix_now().abs_diff(iat) < 120;
        ok.then_some(()).ok_or("claims")
    }

    const TOKEN: &str = "ya29.test-access-token-SECRET";

    fn write_service_account(dir: &Path, name: &str, pem: &str, token_uri: &str) -> PathBuf {
        let path = dir.join(name);
        let json = serde_json::json!({
            "type": "service_account",
            "project_id": "test",
            "private_key_id": "kid-1",
            "private_key": pem,
            "client_email": "backup@test.iam.gserviceaccount.com",
            "client_id": "123",
            "token_uri": token_uri,
        });
        std::fs::write(&path, json.to_string()).expect("write key file");
        path
    }

    fn listener_options(bucket: &str, endpoint: &str, credentials: Credentials) -> GcsOptions {
        let mut o = GcsOptions::new(bucket, credentials);
        o.endpoint = Some(endpoint.into());
        o.policy = fast();
        o
    }

    /// Asserts that no error text holds a secret.
    fn assert_no_secret(errors: &[String], secrets: &[&str]) {
        for e in errors {
            for s in secrets {
                assert!(!e.contains(s), "secret {s:?} in error {e:?}");
            }
        }
    }

    #[test]
    fn service_account_jwt_reaches_storage_as_bearer_token() {
        let pem = throwaway_key();
        let der = base64::engine::general_purpose::STANDARD
            .decode(
                pem.lines()
                    .filter(|l| !l.starts_with("-----"))
                    .collect::<String>(),
            )
            .expect("der");
        let public_der = RsaKeyPair::from_pkcs8(&der)
            .expect("key")
            .public()
            .as_ref()
            .to_vec();
        let token_uri: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
        let uri = token_uri.clone();
        let (token_base, token_log) = serve(move |seen| {
            let want = uri.get().cloned().unwrap_or_default();
            match check_jwt(&seen.form(), &public_der, &want) {
                Ok(()) if seen.method == "POST" && seen.path() == "/token" => reply(
                    200,
                    &format!(
                        r#"{{"access_token":"{TOKEN}","expires_in":3600,"token_type":"Bearer"}}"#
                    ),
                ),
                Ok(()) => reply(404, "{}"),
                Err(what) => reply(400, &format!(r#"{{"error":"bad_{what}"}}"#)),
            }
        });
        token_uri.set(format!("{token_base}/token")).expect("once");
        let (storage, storage_log) = serve(|seen| {
            if seen.header("authorization") != Some(&format!("Bearer {TOKEN}")) {
                return reply(401, r#"{"error":{"code":401,"message":"Login Required"}}"#);
            }
            match (seen.method.as_str(), seen.path()) {
                ("GET", "/storage/v1/b/bkt/o") => reply(200, r#"{"kind":"storage#objects"}"#),
                ("GET", "/storage/v1/b/bkt/o/x%2Fy") => reply(200, "hello"),
                ("POST", "/upload/storage/v1/b/bkt/o") => reply(
                    403,
                    r#"{"error":{"code":403,"message":"backup@test does not have storage.objects.create access","errors":[{"reason":"forbidden"}]}}"#,
                ),
                _ => reply(404, "{}"),
            }
        });
        let tmp = TempDir::new("gcs-sa");
        let key_file =
            write_service_account(&tmp.0, "sa.json", &pem, &format!("{token_base}/token"));
        let mut errors = Vec::new();

        let creds = Credentials::resolve(Some(&key_file), &|_| None).expect("key file");
        assert!(format!("{creds:?}").starts_with("ServiceAccount("));
        let s = GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
        let err = s.put_bytes("a/b", b"data").expect_err("denied");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to put a/b: 403 Forbidden"
        );
        errors.push(err.to_string());
        assert_eq!(s.get_bytes("x/y").expect("get"), b"hello");
        {
            let seen = storage_log.lock().expect("log");
            assert_eq!(seen.len(), 3);
            for r in seen.iter() {
                assert_eq!(
                    r.header("authorization"),
                    Some(format!("Bearer {TOKEN}").as_str())
                );
            }
        }
        // One token for all requests (cached), fetched with a valid JWT (else: 400 bad_...).
        assert_eq!(token_log.lock().expect("log").len(), 1);

        // A 403 on the probe fails the creation.
        let (denied, _) = serve(|_| reply(403, r#"{"error":{"code":403,"message":"denied"}}"#));
        let creds = Credentials::from_file(&key_file).expect("key file");
        let err = GcsBackend::new(listener_options("bkt", &denied, creds))
            .err()
            .expect("denied");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create GCS backend: 403 Forbidden"
        );
        errors.push(err.to_string());

        // A token endpoint refusing the grant.
        let (refusing, _) = serve(|_| {
            reply(
                400,
                r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#,
            )
        });
        let bad = write_service_account(&tmp.0, "bad.json", &pem, &format!("{refusing}/token"));
        let creds = Credentials::from_file(&bad).expect("key file");
        let err = GcsBackend::new(listener_options("bkt", &storage, creds))
            .err()
            .expect("refused");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create GCS backend: token request failed: 400 invalid_grant"
        );
        errors.push(err.to_string());

        // An unreachable token endpoint.
        let dead = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port");
        let gone =
            write_service_account(&tmp.0, "gone.json", &pem, &format!("http://{dead}/token"));
        let creds = Credentials::from_file(&gone).expect("key file");
        let err = GcsBackend::new(listener_options("bkt", &storage, creds))
            .err()
            .expect("unreachable");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create GCS backend: token request failed: token endpoint connection error"
        );
        errors.push(err.to_string());

        let key_lines: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let mut secrets = vec![TOKEN];
        secrets.extend(key_lines.iter().copied());
        assert_no_secret(&errors, &secrets);
    }

    #[test]
    fn authorized_user_tokens_are_refreshed_before_expiry_and_after_401() {
        let fetches = Arc::new(AtomicU32::new(0));
        let n = fetches.clone();
        let (token_base, _) = serve(move |seen| {
            let f = seen.form();
            let ok = seen.method == "POST"
                && f.get("grant_type").map(String::as_str) == Some("refresh_token")
                && f.get("client_id").map(String::as_str) == Some("cid.apps")
                && f.get("client_secret").map(String::as_str) == Some("CLIENT-SECRET+/=")
                && f.get("refresh_token").map(String::as_str) == Some("1//REFRESH-SECRET");
            if !ok {
                return reply(400, r#"{"error":"invalid_request"}"#);
            }
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            // Lives 2 s: refreshed after 1 s (half its life).
            reply(
                200,
                &format!(r#"{{"access_token":"tok-{i}","expires_in":2,"token_type":"Bearer"}}"#),
            )
        });
        let reject_next = Arc::new(AtomicU32::new(0));
        let reject = reject_next.clone();
        let (storage, storage_log) = serve(move |seen| {
            if reject.swap(0, Ordering::SeqCst) == 1 {
                return reply(
                    401,
                    r#"{"error":{"code":401,"message":"Invalid Credentials"}}"#,
                );
            }
            match seen.path() {
                "/storage/v1/b/bkt/o" => reply(200, r#"{"kind":"storage#objects"}"#),
                _ => reply(200, r#"{"size":"42"}"#),
            }
        });
        let tmp = TempDir::new("gcs-user");
        let file = tmp.0.join("adc.json");
        let json = serde_json::json!({
            "type": "authorized_user",
            "client_id": "cid.apps",
            "client_secret": "CLIENT-SECRET+/=",
            "refresh_token": "1//REFRESH-SECRET",
            "token_uri": format!("{token_base}/token"),
        });
        std::fs::write(&file, json.to_string()).expect("write");
        // Found as application default credentials below CLOUDSDK_CONFIG.
        let adc_dir = tmp.0.join("gcloud");
        std::fs::create_dir_all(&adc_dir).expect("mkdir");
        std::fs::copy(&file, adc_dir.join(ADC_FILE)).expect("copy");
        let dir = adc_dir.to_string_lossy().into_owned();
        let env = move |name: &str| (name == "CLOUDSDK_CONFIG").then(|| dir.clone());
        let creds = Credentials::resolve(None, &env).expect("adc");
        let s = GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
        assert_eq!(s.head("k").expect("head"), Some(42));
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "cached");
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(s.head("k").expect("head"), Some(42));
        assert_eq!(fetches.load(Ordering::SeqCst), 2, "refreshed");
        // A 401 is not retried but drops the token.
        reject_next.store(1, Ordering::SeqCst);
        let err = s.head("k").expect_err("401");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to head k: 401 Unauthorized"
        );
        assert_eq!(s.head("k").expect("head"), Some(42));
        assert_eq!(fetches.load(Ordering::SeqCst), 3, "fetched again after 401");
        let auth: Vec<String> = storage_log
            .lock()
            .expect("log")
            .iter()
            .map(|r| r.header("authorization").unwrap_or("").to_string())
            .collect();
        assert_eq!(
            auth,
            [
                "Bearer tok-1",
                "Bearer tok-1",
                "Bearer tok-2",
                "Bearer tok-2",
                "Bearer tok-3"
            ]
        );
        assert_no_secret(
            &[err.to_string()],
            &["tok-", "CLIENT-SECRET", "REFRESH-SECRET"],
        );
    }

    #[test]
    fn metadata_server_tokens() {
        let (meta, meta_log) = serve(|seen| {
            if seen.path() == METADATA_TOKEN_PATH
                && seen.header("metadata-flavor") == Some("Google")
            {
                reply(
                    200,
                    r#"{"access_token":"meta-token","expires_in":3599,"token_type":"Bearer"}"#,
                )
            } else {
                reply(404, "{}")
            }
        });
        let (storage, storage_log) = serve(|_| reply(200, r#"{"kind":"storage#objects"}"#));
        // GCE_METADATA_HOST names the server when no credentials file is found.
        let host = meta.trim_start_matches("http://").to_string();
        let env = move |name: &str| match name {
            "GCE_METADATA_HOST" => Some(host.clone()),
            "HOME" => Some("/nonexistent-home".into()),
            _ => None,
        };
        let creds = Credentials::resolve(None, &env).expect("metadata");
        GcsBackend::new(listener_options("bkt", &storage, creds)).expect("open");
        assert_eq!(meta_log.lock().expect("log").len(), 1);
        assert_eq!(
            storage_log.lock().expect("log")[0].header("authorization"),
            Some("Bearer meta-token")
        );
        // No credentials anywhere and no metadata server.
        let dead = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port");
        let creds = Credentials::Metadata {
            base_url: format!("http://{dead}"),
            fallback: true,
        };
        let err = GcsBackend::new(listener_options("bkt", &storage, creds))
            .err()
            .expect("no credentials");
        assert!(
            err.to_string()
                .starts_with("Storage error: Failed to create GCS backend: no credentials found"),
            "{err}"
        );
    }

    #[test]
    fn credentials_are_resolved_in_order() {
        let tmp = TempDir::new("gcs-resolve");
        let user = |name: &str| {
            let p = tmp.0.join(format!("{name}.json"));
            let json = serde_json::json!({
                "type": "authorized_user", "client_id": name,
                "client_secret": "s", "refresh_token": "r",
            });
            std::fs::write(&p, json.to_string()).expect("write");
            p
        };
        let explicit = user("explicit");
        let gac = user("gac");
        let sdk = tmp.0.join("sdk");
        std::fs::create_dir_all(&sdk).expect("mkdir");
        std::fs::rename(user("sdk"), sdk.join(ADC_FILE)).expect("mv");
        let home = tmp.0.join("home");
        std::fs::create_dir_all(home.join(".config/gcloud")).expect("mkdir");
        std::fs::rename(user("home"), home.join(".config/gcloud").join(ADC_FILE)).expect("mv");
        let vars: HashMap<&str, String> = [
            ("GOOGLE_APPLICATION_CREDENTIALS", gac.display().to_string()),
            ("CLOUDSDK_CONFIG", sdk.display().to_string()),
            ("HOME", home.display().to_string()),
        ]
        .into_iter()
        .collect();
        let kind = |path: Option<&Path>, skip: &[&str]| -> String {
            let env = |n: &str| vars.get(n).filter(|_| !skip.contains(&n)).cloned();
            format!("{:?}", Credentials::resolve(path, &env).expect("resolve"))
        };
        assert_eq!(kind(Some(&explicit), &[]), "AuthorizedUser(explicit)");
        assert_eq!(kind(None, &[]), "AuthorizedUser(gac)");
        assert_eq!(
            kind(None, &["GOOGLE_APPLICATION_CREDENTIALS"]),
            "AuthorizedUser(sdk)"
        );
        assert_eq!(
            kind(None, &["GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"]),
            "AuthorizedUser(home)"
        );
        assert_eq!(
            kind(
                None,
                &["GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "HOME"]
            ),
            "Metadata(http://metadata.google.internal)"
        );
        // A named file that is missing is an error, not a fall-through.
        let err = Credentials::resolve(None, &|n| {
            (n == "GOOGLE_APPLICATION_CREDENTIALS").then(|| "/nonexistent/key.json".into())
        })
        .expect_err("missing file");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create GCS backend: invalid credentials file \
             /nonexistent/key.json: No such file or directory"
        );
    }

    #[test]
    fn credentials_file_errors_hide_key_material() {
        let tmp = TempDir::new("gcs-badkey");
        let cases = [
            r#"{"type":"service_account","client_email":"a@b","private_key":"-----BEGIN PRIVATE KEY-----\nU0VDUkVUS0VZTUFURVJJQUw=\n-----END PRIVATE KEY-----\n"}"#,
            r#"{"type":"service_account","client_email":"a@b","private_key":["SECRETKEYMATERIAL"]}"#,
            r#"{"type":"service_account","private_key":"SECRETKEYMATERIAL" "#,
            r#"{"type":"authorized_user","client_secret":"SECRETKEYMATERIAL"}"#,
            r#"{"type":"SECRETKEYMATERIAL/with/slashes?x=1"}"#,
        ];
        for (i, text) in cases.iter().enumerate() {
            let p = tmp.0.join(format!("k{i}.json"));
            std::fs::write(&p, text).expect("write");
            let err = Credentials::from_file(&p).expect_err(text).to_string();
            assert!(
                err.starts_with(&format!(
                    "Storage error: Failed to create GCS backend: invalid credentials file {}: ",
                    p.display()
                )),
                "{err}"
            );
            assert_no_secret(&[err], &["SECRETKEYMATERIAL", "U0VDUkVUS0VZTUFURVJJQUw"]);
        }
    }

    #[test]
    fn resumable_upload_resumes_from_the_offset_gcs_reports() {
        /// The object being assembled, and how many chunk PUTs arrived.
        #[derive(Default)]
        struct Session {
            stored: Vec<u8>,
            chunk_puts: u32,
            done: bool,
        }
        let state = Arc::new(Mutex::new(Session::default()));
        let st = state.clone();
        let base: Arc<OnceLock<String>> = Arc::new(OnceLock::new());
        let b = base.clone();
        let (url, log) = serve(move |seen| {
            let mut s = st.lock().expect("state");
            let persisted = |s: &Session| {
                let mut r = reply(308, "");
                if !s.stored.is_empty() {
                    r.headers
                        .push(("range".into(), format!("bytes=0-{}", s.stored.len() - 1)));
                }
                r
            };
            match (seen.method.as_str(), seen.path()) {
                ("GET", "/storage/v1/b/bkt/o") => reply(200, "{}"),
                ("POST", "/upload/storage/v1/b/bkt/o") => {
                    let mut r = reply(200, "");
                    let loc = format!(
                        "{}/session/s1?upload_id=SESSION-SECRET",
                        b.get().expect("base")
                    );
                    r.headers.push(("location".into(), loc));
                    r
                }
                ("PUT", "/session/s1") if seen.target.contains("upload_id=SESSION-SECRET") => {
                    let range = seen.header("content-range").unwrap_or("").to_string();
                    if let Some(total) = range.strip_prefix("bytes */") {
                        if s.done {
                            return reply(200, &format!(r#"{{"size":"{total}"}}"#));
                        }
                        return persisted(&s);
                    }
                    let Some((span, total)) =
                        range.strip_prefix("bytes ").and_then(|r| r.split_once('/'))
                    else {
                        return reply(400, "{}");
                    };
                    let first: usize = span
                        .split('-')
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(usize::MAX);
                    if first != s.stored.len() {
                        return reply(
                            400,
                            r#"{"error":{"code":400,"errors":[{"reason":"wrongOffset"}]}}"#,
                        );
                    }
                    s.chunk_puts += 1;
                    if s.chunk_puts == 2 {
                        // Keep half of the second chunk, then fail.
                        let keep = seen.body.len() / 2;
                        s.stored.extend_from_slice(&seen.body[..keep]);
                        return reply(
                            503,
                            r#"{"error":{"code":503,"errors":[{"reason":"backendError"}]}}"#,
                        );
                    }
                    if s.chunk_puts == 10 {
                        return reply(410, r#"{"error":{"code":410,"message":"Gone"}}"#);
                    }
                    s.stored.extend_from_slice(&seen.body);
                    if total != "*" && s.stored.len().to_string() == total {
                        s.done = true;
                        return reply(200, &format!(r#"{{"name":"big","size":"{total}"}}"#));
                    }
                    persisted(&s)
                }
                _ => reply(404, "{}"),
            }
        });
        base.set(url.clone()).expect("once");
        let mut o = listener_options("bkt", &url, Credentials::Anonymous);
        o.upload_threshold = 256 * 1024;
        o.chunk_size = 512 * 1024;
        let s = GcsBackend::new(o).expect("open");
        let data = pattern(1536 * 1024 + 1000, 9);
        s.put_bytes("big", &data).expect("resumable put");
        assert!(
            state.lock().expect("state").stored == data,
            "object assembled"
        );
        let ranges: Vec<String> = log
            .lock()
            .expect("log")
            .iter()
            .filter(|r| r.method == "PUT")
            .map(|r| r.header("content-range").unwrap_or("").to_string())
            .collect();
        let total = data.len();
        assert_eq!(
            ranges,
            [
                "bytes 0-524287/*".to_string(),
                "bytes 524288-1048575/*".into(),
                format!("bytes */{total}"),
                "bytes 786432-1310719/*".into(),
                format!("bytes 1310720-{}/{total}", total - 1),
            ]
        );
        // A session that expires: the error names the key, never the session URL.
        {
            let mut st = state.lock().expect("state");
            *st = Session::default();
            st.chunk_puts = 8;
        }
        let err = s.put_bytes("big", &data).expect_err("gone");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to put big: 410 Gone"
        );
        assert_no_secret(&[err.to_string()], &["SESSION-SECRET", "session/s1"]);
    }

    #[test]
    fn listing_follows_page_tokens() {
        let (url, log) = serve(|seen| {
            if seen.path() != "/storage/v1/b/bkt/o" {
                return reply(404, "{}");
            }
            if !seen.target.contains("prefix=") {
                return reply(200, r#"{"kind":"storage#objects"}"#);
            }
            if seen.target.contains("pageToken=t%2F1%2Bx") {
                reply(200, r#"{"items":[{"name":"p q/c"},{"name":"p q/a//bad"}]}"#)
            } else {
                reply(
                    200,
                    r#"{"items":[{"name":"p q/b"},{"name":"p q/a"}],"nextPageToken":"t/1+x"}"#,
                )
            }
        });
        let s =
            GcsBackend::new(listener_options("bkt", &url, Credentials::Anonymous)).expect("open");
        assert_eq!(s.list("p q/").expect("list"), ["p q/a", "p q/b", "p q/c"]);
        let targets: Vec<String> = log
            .lock()
            .expect("log")
            .iter()
            .map(|r| r.target.clone())
            .collect();
        assert!(targets[1].contains("&prefix=p%20q%2F"), "{targets:?}");
        assert!(targets[2].contains("&pageToken=t%2F1%2Bx"), "{targets:?}");
    }
}
