//! The HTTP plumbing of the Azure backend: building the client, signed requests with
//! timeouts and retries, and errors that name the key and the cause without secrets.

use super::*;
use crate::error::{Error, Result};
use crate::repository::storage::io_reason;
use crate::repository::storage::retry::{self, Attempt, Policy};
use base64::Engine as _;
use percent_encoding::utf8_percent_encode;
use std::io::Read;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

impl<'a> Call<'a> {
    pub(super) fn new(method: &'static str, blob: Option<&'a str>) -> Call<'a> {
        Call {
            method,
            blob,
            query: Vec::new(),
            headers: Vec::new(),
            body: &[],
        }
    }
}

pub(super) fn config_error(what: &str) -> Error {
    Error::Config(what.to_string())
}

/// Splits and checks an endpoint: returns (base URL without trailing `/`, its path part).
pub(super) fn parse_endpoint(endpoint: &str) -> Result<(String, String)> {
    let e = endpoint.trim().trim_end_matches('/');
    let lower = e.to_ascii_lowercase();
    let rest_start = if lower.starts_with("https://") {
        8
    } else if lower.starts_with("http://") {
        7
    } else {
        return Err(config_error(
            "Invalid Azure endpoint: must start with http:// or https://",
        ));
    };
    let rest = &e[rest_start..];
    let host_end = rest.find('/').unwrap_or(rest.len());
    let host = &rest[..host_end];
    if host.is_empty()
        || host.contains('@')
        || e.contains(['?', '#'])
        || e.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(config_error(
            "Invalid Azure endpoint: expected http(s)://host[:port][/path] without credentials or query",
        ));
    }
    Ok((e.to_string(), rest[host_end..].to_string()))
}

/// SPEC.md "Storage URLs" form of a container: `azure://<endpoint without scheme>/<container>`,
/// e.g. `azure://acct.blob.core.windows.net/backups`,
/// `azure://127.0.0.1:10000/devstoreaccount1/backups`.
pub(super) fn location_of(base_url: &str, container: &str) -> String {
    let rest = base_url.split_once("://").map_or(base_url, |(_, r)| r);
    format!("azure://{rest}/{container}")
}

impl AzureBlobStorage {
    /// Builds the backend and makes one cheap probe request (Get Container Properties). Any HTTP
    /// answer counts as reachable: a missing container or denied access shows on the first
    /// operation (`Failed to put <key>: ContainerNotFound` / `403 Forbidden`). For bearer-token
    /// credentials the first token is fetched here.
    ///
    /// Errors: `Configuration error: ...` for malformed names, endpoint or account key;
    /// `Storage error: Failed to create Azure backend: endpoint connection error` when the
    /// endpoint cannot be reached; `Storage error: Failed to create Azure backend: <token
    /// problem>` when a token cannot be had (managed identity: `no credentials found ...`).
    pub fn new(options: AzureOptions) -> Result<AzureBlobStorage> {
        let account = options.account.trim().to_string();
        if account.is_empty()
            || !account
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(config_error(
                "Invalid Azure account name: expected lowercase letters and digits",
            ));
        }
        let container = options.container.trim().to_string();
        let body = container.strip_prefix('$').unwrap_or(&container);
        if body.is_empty()
            || !body
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(Error::Config(format!(
                "Invalid Azure container name: {}",
                container.escape_debug()
            )));
        }
        let (base_url, base_path) = match &options.endpoint {
            Some(e) => parse_endpoint(e)?,
            None => (
                format!("https://{account}.blob.core.windows.net"),
                String::new(),
            ),
        };
        let location = location_of(&base_url, &container);
        let token_url = |tenant: &str| {
            format!(
                "{}/{}/oauth2/v2.0/token",
                options.authority_host.trim().trim_end_matches('/'),
                utf8_percent_encode(tenant, QUERY_SET)
            )
        };
        let bearer = |kind: TokenKind, url: String| {
            Auth::Bearer(TokenSource {
                kind,
                url,
                cache: Mutex::new(None),
            })
        };
        let auth = match &options.credential {
            Credential::SharedKey(key) => {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(key.expose().trim())
                    .map_err(|_| config_error("Invalid Azure account key: not base64"))?;
                Auth::SharedKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw))
            }
            Credential::Sas(sas) => {
                let text = sas.expose().trim();
                Auth::Sas(text.strip_prefix('?').unwrap_or(text).to_string())
            }
            Credential::ServicePrincipal {
                tenant_id,
                client_id,
                client_secret,
            } => bearer(
                TokenKind::ClientSecret {
                    client_id: client_id.clone(),
                    client_secret: client_secret.expose().to_string(),
                },
                token_url(tenant_id),
            ),
            Credential::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file,
            } => bearer(
                TokenKind::Federated {
                    client_id: client_id.clone(),
                    token_file: token_file.clone(),
                },
                token_url(tenant_id),
            ),
            Credential::ManagedIdentity { client_id } => {
                let mut url = format!(
                    "{}?api-version=2018-02-01&resource={}",
                    options.imds_endpoint.trim(),
                    utf8_percent_encode(STORAGE_RESOURCE, QUERY_SET)
                );
                if let Some(id) = client_id {
                    url.push_str("&client_id=");
                    url.extend(utf8_percent_encode(id, QUERY_SET));
                }
                bearer(TokenKind::Imds, url)
            }
        };
        let agent = crate::repository::storage::http_agent(CONNECT_TIMEOUT, IO_TIMEOUT);
        let storage = AzureBlobStorage {
            agent,
            account,
            container,
            base_url,
            base_path,
            location,
            auth,
            put_threshold: options.put_threshold.max(1),
            block_size: options.block_size.max(1),
            retry: options.retry,
            page_size: LIST_PAGE_SIZE,
            lock: options.object_lock,
        };
        storage.probe()?;
        Ok(storage)
    }

    /// Fetches the first token (bearer credentials) and checks that the endpoint answers.
    pub(super) fn probe(&self) -> Result<()> {
        let create_error =
            |detail: &str| Error::Storage(format!("Failed to create Azure backend: {detail}"));
        if let Auth::Bearer(source) = &self.auth {
            let imds = matches!(source.kind, TokenKind::Imds);
            // Off Azure nothing answers at IMDS: one short try, no retries.
            let policy = if imds {
                Policy {
                    attempts: 1,
                    ..self.retry
                }
            } else {
                self.retry
            };
            retry::run(policy, "Azure token request", || {
                source.token(&self.agent).map(|_| ()).map_err(|(d, t)| {
                    let msg = if imds {
                        format!(
                            "no credentials found (set account_key, sas_token, client_id + \
                             tenant_id + client_secret, or workload identity; managed identity: \
                             {d})"
                        )
                    } else {
                        d
                    };
                    let e = create_error(&msg);
                    if t {
                        Attempt::Transient(e)
                    } else {
                        Attempt::Permanent(e)
                    }
                })
            })?;
        }
        let mut call = Call::new("HEAD", None);
        call.query.push(("restype", "container".into()));
        let policy = Policy {
            attempts: self.retry.attempts.min(3),
            base_delay: self.retry.base_delay.min(Duration::from_millis(100)),
            max_delay: self.retry.max_delay.min(Duration::from_millis(500)),
            backend: self.retry.backend,
        };
        let status = retry::run(policy, "Azure endpoint probe", || match self.send(&call) {
            Ok(resp) => Ok(resp.status().as_u16()),
            Err(SendError::Transport(e)) => {
                let err = create_error("endpoint connection error");
                if describe_transport(&e).1 {
                    Err(Attempt::Transient(err))
                } else {
                    Err(Attempt::Permanent(err))
                }
            }
            Err(SendError::Token(d, t)) => {
                let err = create_error(&d);
                Err(if t {
                    Attempt::Transient(err)
                } else {
                    Attempt::Permanent(err)
                })
            }
        })?;
        match status {
            200..=299 => {}
            404 => log::warn!(
                "Azure container {} does not exist at {}",
                self.container,
                self.location
            ),
            401 | 403 => log::warn!(
                "Azure probe of {}: HTTP {status}: check the credentials",
                self.location
            ),
            s => log::debug!("Azure probe of {}: HTTP {s}", self.location),
        }
        Ok(())
    }

    /// URL path of a container or blob, percent-encoded, starting with `/`.
    pub(super) fn url_path(&self, blob: Option<&str>) -> String {
        let mut p = format!("{}/{}", self.base_path, self.container);
        if let Some(b) = blob {
            p.push('/');
            p.extend(utf8_percent_encode(b, PATH_SET));
        }
        p
    }

    /// Sends one request: dates, version, authorization; returns any HTTP answer.
    pub(super) fn send(&self, call: &Call) -> std::result::Result<Response, SendError> {
        let path = self.url_path(call.blob);
        let mut query: Vec<String> = call
            .query
            .iter()
            .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, QUERY_SET)))
            .collect();
        if let Auth::Sas(sas) = &self.auth {
            if !sas.is_empty() {
                query.push(sas.clone());
            }
        }
        let mut url = format!("{}{}", self.base_url, &path[self.base_path.len()..]);
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        let mut headers: Vec<(&str, String)> = vec![
            ("x-ms-date", http_date(SystemTime::now())),
            ("x-ms-version", API_VERSION.to_string()),
        ];
        headers.extend(call.headers.iter().map(|(k, v)| (*k, v.clone())));
        match &self.auth {
            Auth::SharedKey(key) => {
                let to_sign = string_to_sign(
                    call.method,
                    call.body.len(),
                    &headers,
                    &self.account,
                    &path,
                    &call.query,
                );
                let sig = ring::hmac::sign(key, to_sign.as_bytes());
                headers.push((
                    "authorization",
                    format!(
                        "SharedKey {}:{}",
                        self.account,
                        base64::engine::general_purpose::STANDARD.encode(sig.as_ref())
                    ),
                ));
            }
            Auth::Sas(_) => {}
            Auth::Bearer(source) => {
                let token = source
                    .token(&self.agent)
                    .map_err(|(d, t)| SendError::Token(d, t))?;
                headers.push(("authorization", format!("Bearer {token}")));
            }
        }
        let mut builder = ureq::http::Request::builder()
            .method(call.method)
            .uri(url.as_str());
        for (k, v) in &headers {
            builder = builder.header(*k, v.as_str());
        }
        let request = builder
            .body(call.body)
            .map_err(|e| SendError::Transport(ureq::Error::Http(e)))?;
        let resp = self.agent.run(request).map_err(SendError::Transport)?;
        if let Auth::Bearer(source) = &self.auth {
            if resp.status().as_u16() == 401 {
                // Revoked or expired early: the next request fetches a new token.
                source.invalidate();
            }
        }
        Ok(resp)
    }

    /// Runs `call` with retries; `handle` turns each HTTP answer into a value or an [`Attempt`].
    /// `op` (`put`, `get`, ...) and `key` name the failure in messages.
    pub(super) fn request<T>(
        &self,
        op: &str,
        key: &str,
        call: &Call,
        mut handle: impl FnMut(Response) -> std::result::Result<T, Attempt>,
    ) -> Result<T> {
        retry::run(self.retry, &format!("Azure {op} {key}"), || {
            match self.send(call) {
                Ok(resp) => handle(resp),
                Err(SendError::Transport(e)) => Err(transport_failure(op, key, &e)),
                Err(SendError::Token(d, t)) => {
                    let e = fail(op, key, &d);
                    Err(if t {
                        Attempt::Transient(e)
                    } else {
                        Attempt::Permanent(e)
                    })
                }
            }
        })
    }
}

/// `Failed to <op> <key>: <detail>`.
pub(super) fn fail(op: &str, key: &str, detail: &str) -> Error {
    Error::Storage(format!("Failed to {op} {key}: {detail}"))
}

/// Text and transience of a transport error; never holds a URL query.
pub(super) fn describe_transport(e: &ureq::Error) -> (String, bool) {
    match e {
        ureq::Error::Timeout(_) => ("connection error: timeout".into(), true),
        ureq::Error::Io(io) => (format!("connection error: {}", io_reason(io)), true),
        ureq::Error::ConnectionFailed => ("connection error: connection failed".into(), true),
        ureq::Error::HostNotFound => ("connection error: host not found".into(), false),
        ureq::Error::Tls(s) => (format!("TLS error: {s}"), false),
        other => (strip_queries(&other.to_string()), false),
    }
}

/// Removes every URL query (from `?` to the next whitespace) from `text`.
pub(super) fn strip_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut skipping = false;
    for c in text.chars() {
        if c == '?' {
            skipping = true;
        } else if c.is_whitespace() {
            skipping = false;
        }
        if !skipping {
            out.push(c);
        }
    }
    out
}

pub(super) fn transport_failure(op: &str, key: &str, e: &ureq::Error) -> Attempt {
    let (detail, transient) = describe_transport(e);
    let err = fail(op, key, &detail);
    if transient {
        Attempt::Transient(err)
    } else {
        Attempt::Permanent(err)
    }
}

/// Reads a small body (List Blobs page, token answer) into memory.
pub(super) fn read_small(resp: &mut Response) -> std::result::Result<Vec<u8>, ureq::Error> {
    resp.body_mut()
        .with_config()
        .limit(MAX_SMALL_BODY)
        .read_to_vec()
}

/// An error code as Azure sends it (`ContainerNotFound`): letters, digits, `_`, `-`, `.`; at most
/// 64 characters; `None` when nothing usable is left.
pub(super) fn clean_code(code: &str) -> Option<String> {
    let c: String = code
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(64)
        .collect();
    (!c.is_empty()).then_some(c)
}

/// The error code of a failed answer: `x-ms-error-code`, else `<Code>` of the XML body.
pub(super) fn error_code(resp: &mut Response) -> Option<String> {
    if let Some(code) = resp
        .headers()
        .get("x-ms-error-code")
        .and_then(|v| v.to_str().ok())
        .and_then(clean_code)
    {
        return Some(code);
    }
    let mut body = Vec::new();
    let _ = resp
        .body_mut()
        .as_reader()
        .take(MAX_ERROR_BODY)
        .read_to_end(&mut body);
    let text = String::from_utf8_lossy(&body);
    let inner = elements(&text, "Code").next()?.1;
    clean_code(&decode_entities(inner).ok()?)
}

/// The failure for a non-2xx answer (SPEC.md "Errors"): `ContainerNotFound`, `403 Forbidden`,
/// else `<status> <code or reason>`.
pub(super) fn status_failure(op: &str, key: &str, mut resp: Response) -> Attempt {
    let status = resp.status();
    let code = error_code(&mut resp);
    let detail = if code.as_deref() == Some("ContainerNotFound") {
        "ContainerNotFound".to_string()
    } else if status.as_u16() == 403 {
        "403 Forbidden".to_string()
    } else {
        let reason = code
            .or_else(|| status.canonical_reason().map(str::to_string))
            .unwrap_or_default();
        format!("{} {reason}", status.as_u16())
            .trim_end()
            .to_string()
    };
    Attempt::from_status(status.as_u16(), fail(op, key, &detail))
}

pub(super) fn expect_success(
    op: &str,
    key: &str,
    resp: Response,
) -> std::result::Result<(), Attempt> {
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(status_failure(op, key, resp))
    }
}

/// True when a 404 names the container (from the header; HEAD answers have no body).
pub(super) fn is_container_missing(resp: &Response) -> bool {
    resp.headers()
        .get("x-ms-error-code")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.trim() == "ContainerNotFound")
}
