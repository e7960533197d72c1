//! Azure Blob storage backend (SPEC.md `storage.backend: azure`), over the Blob service REST API
//! (version [`API_VERSION`]) with ureq: no SDK, no async runtime.
//!
//! Each key is one block blob in the container, named by the key. Operations and the REST calls
//! they make (Azure "Blob service REST API"):
//!
//! | trait call | REST operation |
//! |---|---|
//! | `put_*` up to the threshold (default 8 MiB) | Put Blob (single shot) |
//! | `put_*` above it | Put Block per ~8 MiB block read one at a time, then Put Block List (the atomic commit) |
//! | `get_bytes`, `get_to_file` | Get Blob, streamed |
//! | `head` | Get Blob Properties |
//! | `list` | List Blobs with `prefix`, following `NextMarker` |
//! | `delete` | Delete Blob (404 counts as success) |
//!
//! Endpoint: `storage.endpoint` when set (sovereign clouds such as
//! `https://<account>.blob.core.usgovcloudapi.net`, or the emulator's path-style
//! `http://127.0.0.1:10000/devstoreaccount1`), else `https://<account>.blob.core.windows.net`.
//!
//! Authentication, in SPEC.md's priority order ("storage", "Authentication"); each field falls
//! back to its standard environment variable:
//! 1. account key (`account_key`, `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_KEY`): Shared Key
//!    signing (HMAC-SHA256, Azure "Authorize with Shared Key");
//! 2. SAS token (`sas_token`, `AZURE_STORAGE_SAS_TOKEN`; with or without a leading `?`), appended to
//!    every request's query;
//! 3. service principal (`client_id`/`AZURE_CLIENT_ID` + `tenant_id`/`AZURE_TENANT_ID` +
//!    `client_secret`/`AZURE_CLIENT_SECRET`): OAuth 2.0 client-credentials grant at
//!    `{AZURE_AUTHORITY_HOST or https://login.microsoftonline.com}/{tenant}/oauth2/v2.0/token`,
//!    scope `https://storage.azure.com/.default`;
//! 4. workload identity (`use_workload_identity: true`, or auto-detected when
//!    `AZURE_FEDERATED_TOKEN_FILE` is set and `use_workload_identity` is not `false`): the same
//!    grant with the file's contents as a JWT client assertion (re-read on every refresh);
//! 5. the default chain: the environment forms above are already covered by 1-4, so what remains
//!    is managed identity through the instance metadata service (IMDS,
//!    `http://169.254.169.254/metadata/identity/oauth2/token`, 2 s timeout), user-assigned when a
//!    client id is known. Azure CLI and developer-tool credentials are not part of this chain.
//!
//! Bearer tokens are cached and refreshed 5 minutes before they expire (at half their lifetime
//! when that is shorter); one refresh at a time, shared by every thread.
//!
//! Errors (SPEC.md "Errors"), all `Storage error: ...` naming the operation and key:
//! `Key not found: <key>`, `Failed to put <key>: ContainerNotFound`,
//! `Failed to put <key>: 403 Forbidden`, otherwise `Failed to <op> <key>: <status> <error code>` or
//! `Failed to <op> <key>: <transport problem>`; the constructor reports
//! `Failed to create Azure backend: endpoint connection error`. Messages never hold the account
//! key, a SAS token, a client secret or a bearer token (no URL with its query is ever printed).
//! Every request is retried by [`retry::run`] when it fails transiently.

use super::retry::{self, Attempt, Policy};
use super::{io_reason, validate_key, validate_prefix, Storage};
use crate::config::{AzureStorage as AzureConfig, Secret};
use crate::error::{Error, Result};
use base64::Engine as _;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Blob service REST API version sent as `x-ms-version` (accepted by Azure and Azurite 3.x).
pub const API_VERSION: &str = "2021-08-06";
/// Objects up to this many bytes are written with one Put Blob; larger ones in blocks.
pub const DEFAULT_PUT_THRESHOLD: usize = 8 << 20;
/// Size of one Put Block request of a block upload, in bytes.
pub const DEFAULT_BLOCK_SIZE: usize = 8 << 20;
/// Microsoft Entra ID authority used when `AZURE_AUTHORITY_HOST` is not set.
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";
/// Token endpoint of the instance metadata service (managed identity).
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// Scope of Azure Storage for the v2.0 token endpoint.
const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
/// Resource of Azure Storage for IMDS (v1-style).
const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
/// Blobs per List Blobs page (the service's maximum).
const LIST_PAGE_SIZE: u32 = 5000;
/// Most blocks one blob may have (Put Block List limit).
const MAX_BLOCKS: u64 = 50_000;
/// Connection set-up budget of every request.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Budget of each socket read or write, and of waiting for response headers.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Budget of an IMDS request (connect and answer): off Azure nothing answers there.
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest List Blobs page or token answer read into memory.
const MAX_SMALL_BODY: u64 = 64 << 20;
/// Bytes of an error answer read to find its error code.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// Characters percent-encoded in a blob path: everything but unreserved characters and `/`.
const PATH_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');
/// Characters percent-encoded in query values and form fields: everything but unreserved ones.
const QUERY_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How requests are authorized (SPEC.md "storage": Azure authentication priority).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// Shared Key: the account key, base64 as the portal shows it.
    SharedKey(Secret),
    /// A SAS token: a query string without a leading `?`.
    Sas(Secret),
    /// Service principal with a client secret (OAuth 2.0 client credentials).
    ServicePrincipal {
        /// Directory (tenant) id or domain.
        tenant_id: String,
        /// Application (client) id.
        client_id: String,
        /// Client secret.
        client_secret: Secret,
    },
    /// Workload identity: a federated token file exchanged for an access token.
    WorkloadIdentity {
        /// Directory (tenant) id.
        tenant_id: String,
        /// Application (client) id.
        client_id: String,
        /// File holding the federated JWT (`AZURE_FEDERATED_TOKEN_FILE`), re-read per refresh.
        token_file: PathBuf,
    },
    /// Managed identity through IMDS; `client_id` selects a user-assigned identity.
    ManagedIdentity {
        /// Client id of a user-assigned identity, `None` for the system-assigned one.
        client_id: Option<String>,
    },
}

/// Everything [`AzureBlobStorage::new`] needs, resolved from the configuration and environment by
/// [`AzureOptions::from_config`], or built directly (tests, other clouds).
#[derive(Debug, Clone)]
pub struct AzureOptions {
    /// Storage account name.
    pub account: String,
    /// Blob container name.
    pub container: String,
    /// Blob service endpoint (`https://host[:port][/path]`); `None` for the public cloud.
    pub endpoint: Option<String>,
    /// How requests are authorized.
    pub credential: Credential,
    /// Entra ID authority for token requests, e.g. `https://login.microsoftonline.com`.
    pub authority_host: String,
    /// IMDS token endpoint for managed identity.
    pub imds_endpoint: String,
    /// Largest object written with a single Put Blob, in bytes.
    pub put_threshold: usize,
    /// Block size of block uploads, in bytes (raised when a file would need > 50,000 blocks).
    pub block_size: usize,
    /// Retry policy of every request.
    pub retry: Policy,
}

/// Reads a variable from `env`, treating an empty value as unset.
fn env_var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

impl AzureOptions {
    /// Resolves the `storage` section (SPEC.md "storage", backend `azure`) and the environment,
    /// read through `env` (pass `|k| std::env::var(k).ok()`), into options with the default
    /// threshold, block size and retry policy. Variables read: `AZURE_STORAGE_ACCOUNT_KEY`,
    /// `AZURE_STORAGE_KEY`, `AZURE_STORAGE_SAS_TOKEN`, `AZURE_CLIENT_ID`, `AZURE_TENANT_ID`,
    /// `AZURE_CLIENT_SECRET`, `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`.
    ///
    /// Errors (`Configuration error: ...`): an empty or malformed account or container name, an
    /// endpoint that is not `http(s)://host[/path]`, an account key that is not base64, a
    /// `client_secret` without client and tenant ids, `use_workload_identity: true` without a
    /// federated token file, client id and tenant id.
    pub fn from_config(
        cfg: &AzureConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AzureOptions> {
        let client_id = cfg
            .client_id
            .clone()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| env_var(env, "AZURE_CLIENT_ID"));
        let tenant_id = cfg
            .tenant_id
            .clone()
            .filter(|v| !v.trim().is_empty())
            .or_else(|| env_var(env, "AZURE_TENANT_ID"));
        let secret = |field: &Option<Secret>, vars: &[&str]| -> Option<Secret> {
            field
                .clone()
                .filter(|s| !s.expose().trim().is_empty())
                .or_else(|| vars.iter().find_map(|v| env_var(env, v)).map(Secret::new))
        };
        let account_key = secret(
            &cfg.account_key,
            &["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"],
        );
        let sas = secret(&cfg.sas_token, &["AZURE_STORAGE_SAS_TOKEN"]);
        let client_secret = secret(&cfg.client_secret, &["AZURE_CLIENT_SECRET"]);
        let token_file = env_var(env, "AZURE_FEDERATED_TOKEN_FILE");

        let credential =
            if let Some(key) = account_key {
                Credential::SharedKey(key)
            } else if let Some(sas) = sas {
                let text = sas.expose().trim();
                Credential::Sas(Secret::new(text.strip_prefix('?').unwrap_or(text)))
            } else if let (Some(t), Some(c), Some(s)) = (&tenant_id, &client_id, &client_secret) {
                Credential::ServicePrincipal {
                    tenant_id: t.clone(),
                    client_id: c.clone(),
                    client_secret: s.clone(),
                }
            } else if cfg.client_secret.is_some() {
                return Err(Error::Config(
                    "Azure service principal needs client_id, tenant_id and client_secret".into(),
                ));
            } else if cfg.use_workload_identity == Some(true)
                || (cfg.use_workload_identity.is_none() && token_file.is_some())
            {
                match (&tenant_id, &client_id, &token_file) {
                    (Some(t), Some(c), Some(f)) => Credential::WorkloadIdentity {
                        tenant_id: t.clone(),
                        client_id: c.clone(),
                        token_file: PathBuf::from(f),
                    },
                    _ => return Err(Error::Config(
                        "Azure workload identity needs AZURE_FEDERATED_TOKEN_FILE, client_id and \
                         tenant_id"
                            .into(),
                    )),
                }
            } else {
                Credential::ManagedIdentity { client_id }
            };
        Ok(AzureOptions {
            account: cfg.account_name.clone(),
            container: cfg.container_name.clone(),
            endpoint: cfg.endpoint.clone().filter(|e| !e.trim().is_empty()),
            credential,
            authority_host: env_var(env, "AZURE_AUTHORITY_HOST")
                .unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_string()),
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.to_string(),
            put_threshold: DEFAULT_PUT_THRESHOLD,
            block_size: DEFAULT_BLOCK_SIZE,
            retry: Policy::default(),
        })
    }
}

/// Opens the backend from the `storage` section (SPEC.md "storage"), probing the endpoint.
/// Credentials and the authority host fall back to the environment variables listed at
/// [`AzureOptions::from_config`]. `storage.prefix` is not applied here (the caller wraps the
/// result with [`super::with_prefix`]). Errors: see [`AzureOptions::from_config`] and
/// [`AzureBlobStorage::new`].
pub fn open(cfg: &AzureConfig) -> Result<Arc<dyn Storage>> {
    let options = AzureOptions::from_config(cfg, &|k| std::env::var(k).ok())?;
    Ok(Arc::new(AzureBlobStorage::new(options)?))
}

/// How a request is authorized, ready to use.
enum Auth {
    SharedKey(ring::hmac::Key),
    Sas(String),
    Bearer(TokenSource),
}

/// Where bearer tokens come from.
enum TokenKind {
    ClientSecret {
        client_id: String,
        client_secret: String,
    },
    Federated {
        client_id: String,
        token_file: PathBuf,
    },
    Imds,
}

/// A bearer-token source with its cache.
struct TokenSource {
    kind: TokenKind,
    /// Token endpoint (Entra ID v2.0) or IMDS URL with its query.
    url: String,
    cache: Mutex<Option<CachedToken>>,
}

struct CachedToken {
    token: String,
    refresh_at: Instant,
}

/// Why a request could not be sent or answered.
enum SendError {
    /// Transport failure (no HTTP answer).
    Transport(ureq::Error),
    /// The bearer token could not be obtained: detail and whether it is worth retrying.
    Token(String, bool),
}

/// Storage in an Azure Blob container. Shared by reference across threads.
pub struct AzureBlobStorage {
    agent: ureq::Agent,
    account: String,
    container: String,
    /// Endpoint without trailing `/`, e.g. `http://127.0.0.1:10000/devstoreaccount1`.
    base_url: String,
    /// Path part of the endpoint (`/devstoreaccount1` for the emulator, else empty).
    base_path: String,
    location: String,
    auth: Auth,
    put_threshold: usize,
    block_size: usize,
    retry: Policy,
    /// `maxresults` of List Blobs (the service's maximum is 5,000).
    page_size: u32,
}

impl std::fmt::Debug for AzureBlobStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureBlobStorage")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// One REST call: method, target, extra query parameters (raw values) and headers, body.
struct Call<'a> {
    method: &'static str,
    /// Blob name (unencoded), or `None` for a container-level operation.
    blob: Option<&'a str>,
    query: Vec<(&'static str, String)>,
    headers: Vec<(&'static str, String)>,
    body: &'a [u8],
}

impl<'a> Call<'a> {
    fn new(method: &'static str, blob: Option<&'a str>) -> Call<'a> {
        Call {
            method,
            blob,
            query: Vec::new(),
            headers: Vec::new(),
            body: &[],
        }
    }
}

type Response = ureq::http::Response<ureq::Body>;

fn config_error(what: &str) -> Error {
    Error::Config(what.to_string())
}

/// Splits and checks an endpoint: returns (base URL without trailing `/`, its path part).
fn parse_endpoint(endpoint: &str) -> Result<(String, String)> {
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
fn location_of(base_url: &str, container: &str) -> String {
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
        let agent = super::http_agent(CONNECT_TIMEOUT, IO_TIMEOUT);
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
        };
        storage.probe()?;
        Ok(storage)
    }

    /// Fetches the first token (bearer credentials) and checks that the endpoint answers.
    fn probe(&self) -> Result<()> {
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
    fn url_path(&self, blob: Option<&str>) -> String {
        let mut p = format!("{}/{}", self.base_path, self.container);
        if let Some(b) = blob {
            p.push('/');
            p.extend(utf8_percent_encode(b, PATH_SET));
        }
        p
    }

    /// Sends one request: dates, version, authorization; returns any HTTP answer.
    fn send(&self, call: &Call) -> std::result::Result<Response, SendError> {
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
    fn request<T>(
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

    /// Puts `data` with one Put Blob.
    fn put_blob(&self, key: &str, data: &[u8]) -> Result<()> {
        let mut call = Call::new("PUT", Some(key));
        call.headers.push(("x-ms-blob-type", "BlockBlob".into()));
        call.body = data;
        self.request("put", key, &call, |resp| expect_success("put", key, resp))
    }

    /// Uploads `first` followed by the rest of `src` as blocks of `block_size`, then commits the
    /// block list. Only one block is held in memory (plus what `first` holds).
    fn put_blocks(
        &self,
        key: &str,
        mut pending: Vec<u8>,
        src: &mut dyn Read,
        block_size: usize,
        on_read_error: &dyn Fn(io::Error) -> Error,
    ) -> Result<()> {
        let mut ids: Vec<String> = Vec::new();
        // Block ids carry a tag of this upload, so two writers of one blob (a rerun while an old
        // upload still runs) never commit each other's uncommitted blocks. All ids of a blob
        // have the same length, as the service requires.
        let upload = upload_tag();
        let mut eof = false;
        loop {
            if pending.len() < block_size && !eof {
                eof = fill(src, &mut pending, block_size).map_err(on_read_error)?;
            }
            if pending.is_empty() {
                break;
            }
            let n = pending.len().min(block_size);
            let id = base64::engine::general_purpose::STANDARD
                .encode(format!("rmq-{upload:016x}-{:08}", ids.len()));
            let mut call = Call::new("PUT", Some(key));
            call.query.push(("comp", "block".into()));
            call.query.push(("blockid", id.clone()));
            call.body = &pending[..n];
            self.request("put", key, &call, |resp| expect_success("put", key, resp))?;
            ids.push(id);
            pending.drain(..n);
        }
        let mut xml = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for id in &ids {
            xml.push_str("<Latest>");
            xml.push_str(id);
            xml.push_str("</Latest>");
        }
        xml.push_str("</BlockList>");
        let mut call = Call::new("PUT", Some(key));
        call.query.push(("comp", "blocklist".into()));
        call.headers
            .push(("content-type", "application/xml; charset=utf-8".into()));
        call.body = xml.as_bytes();
        self.request("put", key, &call, |resp| expect_success("put", key, resp))
    }

    /// Block size for an object of `len` bytes: the configured one, raised to stay within the
    /// 50,000-block limit.
    fn block_size_for(&self, len: u64) -> usize {
        let needed = len.div_ceil(MAX_BLOCKS);
        self.block_size
            .max(usize::try_from(needed).unwrap_or(usize::MAX))
    }

    /// Starts a Get Blob; a 404 of the blob gives `Key not found: <key>`.
    fn get_response(&self, key: &str) -> std::result::Result<Response, Attempt> {
        let call = Call::new("GET", Some(key));
        match self.send(&call) {
            Ok(resp) => {
                let status = resp.status().as_u16();
                if (200..300).contains(&status) {
                    Ok(resp)
                } else if status == 404 && !is_container_missing(&resp) {
                    Err(Attempt::Permanent(Error::Storage(format!(
                        "Key not found: {key}"
                    ))))
                } else {
                    Err(status_failure("get", key, resp))
                }
            }
            Err(SendError::Transport(e)) => Err(transport_failure("get", key, &e)),
            Err(SendError::Token(d, t)) => {
                let e = fail("get", key, &d);
                Err(if t {
                    Attempt::Transient(e)
                } else {
                    Attempt::Permanent(e)
                })
            }
        }
    }

    /// Creates the container (Create Container); an existing one is fine. The tool itself never
    /// creates containers; tests use this to set up Azurite.
    pub fn create_container(&self) -> Result<()> {
        let mut call = Call::new("PUT", None);
        call.query.push(("restype", "container".into()));
        self.request("create", &self.container, &call, |resp| {
            if resp.status().as_u16() == 409 {
                Ok(())
            } else {
                expect_success("create", &self.container, resp)
            }
        })
    }

    /// Deletes the container (Delete Container) with every blob in it; a missing one is fine.
    /// The tool itself never deletes containers; tests use this to clean up Azurite.
    pub fn delete_container(&self) -> Result<()> {
        let mut call = Call::new("DELETE", None);
        call.query.push(("restype", "container".into()));
        self.request("delete", &self.container, &call, |resp| {
            if resp.status().as_u16() == 404 {
                Ok(())
            } else {
                expect_success("delete", &self.container, resp)
            }
        })
    }

    /// The committed block list of `key` (Get Block List): number of blocks. Tests only.
    #[cfg(test)]
    fn committed_blocks(&self, key: &str) -> Result<usize> {
        let mut call = Call::new("GET", Some(key));
        call.query.push(("comp", "blocklist".into()));
        call.query.push(("blocklisttype", "committed".into()));
        self.request("get", key, &call, |mut resp| {
            let status = resp.status().as_u16();
            if !(200..300).contains(&status) {
                return Err(status_failure("get", key, resp));
            }
            let body = read_small(&mut resp).map_err(|e| transport_failure("get", key, &e))?;
            Ok(String::from_utf8_lossy(&body).matches("<Block>").count())
        })
    }
}

/// Reads from `src` into `buf` until it holds `want` bytes or the source ends; true at the end.
fn fill(src: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let missing = want.saturating_sub(buf.len()) as u64;
    if missing == 0 {
        return Ok(false);
    }
    let got = src.take(missing).read_to_end(buf)? as u64;
    Ok(got < missing)
}

/// `Failed to <op> <key>: <detail>`.
fn fail(op: &str, key: &str, detail: &str) -> Error {
    Error::Storage(format!("Failed to {op} {key}: {detail}"))
}

/// Text and transience of a transport error; never holds a URL query.
fn describe_transport(e: &ureq::Error) -> (String, bool) {
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
fn strip_queries(text: &str) -> String {
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

fn transport_failure(op: &str, key: &str, e: &ureq::Error) -> Attempt {
    let (detail, transient) = describe_transport(e);
    let err = fail(op, key, &detail);
    if transient {
        Attempt::Transient(err)
    } else {
        Attempt::Permanent(err)
    }
}

/// Reads a small body (List Blobs page, token answer) into memory.
fn read_small(resp: &mut Response) -> std::result::Result<Vec<u8>, ureq::Error> {
    resp.body_mut()
        .with_config()
        .limit(MAX_SMALL_BODY)
        .read_to_vec()
}

/// An error code as Azure sends it (`ContainerNotFound`): letters, digits, `_`, `-`, `.`; at most
/// 64 characters; `None` when nothing usable is left.
fn clean_code(code: &str) -> Option<String> {
    let c: String = code
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .take(64)
        .collect();
    (!c.is_empty()).then_some(c)
}

/// The error code of a failed answer: `x-ms-error-code`, else `<Code>` of the XML body.
fn error_code(resp: &mut Response) -> Option<String> {
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
fn status_failure(op: &str, key: &str, mut resp: Response) -> Attempt {
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

fn expect_success(op: &str, key: &str, resp: Response) -> std::result::Result<(), Attempt> {
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(status_failure(op, key, resp))
    }
}

/// True when a 404 names the container (from the header; HEAD answers have no body).
fn is_container_missing(resp: &Response) -> bool {
    resp.headers()
        .get("x-ms-error-code")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.trim() == "ContainerNotFound")
}

/// Shared Key string-to-sign for service version 2015-02-21 and later (Azure "Authorize with
/// Shared Key"): verb, the standard headers (Content-Length empty when 0), canonicalized
/// `x-ms-` headers, canonicalized resource `/<account><encoded path>` plus each query parameter
/// as `\n<name>:<value>` sorted by name.
fn string_to_sign(
    method: &str,
    content_length: usize,
    headers: &[(&str, String)],
    account: &str,
    encoded_path: &str,
    query: &[(&str, String)],
) -> String {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let length = if content_length == 0 {
        String::new()
    } else {
        content_length.to_string()
    };
    let mut s = format!(
        "{method}\n{}\n{}\n{length}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n",
        header("content-encoding"),
        header("content-language"),
        header("content-md5"),
        header("content-type"),
        header("date"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    );
    let mut ms: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    ms.sort();
    for (k, v) in ms {
        s.push_str(&format!("{k}:{v}\n"));
    }
    s.push('/');
    s.push_str(account);
    s.push_str(encoded_path);
    let mut q: Vec<(String, &str)> = query
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.as_str()))
        .collect();
    q.sort();
    for (k, v) in q {
        s.push_str(&format!("\n{k}:{v}"));
    }
    s
}

/// RFC 1123 date (`Sun, 06 Nov 1994 08:49:37 GMT`) for `x-ms-date`.
fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[days.rem_euclid(7) as usize],
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Iterates over the elements `<tag ...>inner</tag>` (and empty `<tag/>`) of `xml` in order,
/// giving (attribute text, raw inner text). Only for answers whose text content is escaped, as
/// Azure's are: a raw `<` is always markup.
fn elements<'x>(xml: &'x str, tag: &'x str) -> impl Iterator<Item = (&'x str, &'x str)> + 'x {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut pos = 0;
    std::iter::from_fn(move || loop {
        let start = pos + xml.get(pos..)?.find(&open)?;
        let after = start + open.len();
        let next = xml[after..].chars().next()?;
        if !matches!(next, '>' | '/' | ' ' | '\t' | '\r' | '\n') {
            pos = after;
            continue;
        }
        let gt = after + xml[after..].find('>')?;
        let attrs = &xml[after..gt];
        if attrs.ends_with('/') {
            pos = gt + 1;
            return Some((attrs.trim_end_matches('/'), ""));
        }
        let end = gt + 1 + xml[gt + 1..].find(&close)?;
        pos = end + close.len();
        return Some((attrs, &xml[gt + 1..end]));
    })
}

/// Decodes the five XML entities and numeric character references.
fn decode_entities(s: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let semi = rest[amp..]
            .find(';')
            .ok_or_else(|| "unterminated entity".to_string())?;
        let name = &rest[amp + 1..amp + semi];
        let c = match name {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) =
                    name.strip_prefix("#x").or_else(|| name.strip_prefix("#X"))
                {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = name.strip_prefix('#') {
                    dec.parse::<u32>().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown entity &{};", name.escape_debug()))?
            }
        };
        out.push(c);
        rest = &rest[amp + semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses one List Blobs page: blob names (entities decoded; `Encoded="true"` names
/// percent-decoded) and the next marker (`None` when empty or absent).
fn parse_list_page(xml: &str) -> std::result::Result<(Vec<String>, Option<String>), String> {
    if !xml.contains("<EnumerationResults") {
        return Err("not a List Blobs answer".into());
    }
    let mut names = Vec::new();
    for (_, blob) in elements(xml, "Blob") {
        let (attrs, raw) = elements(blob, "Name")
            .next()
            .ok_or_else(|| "blob without Name".to_string())?;
        let mut name = decode_entities(raw)?;
        if attrs.replace(' ', "").contains("Encoded=\"true\"") {
            name = percent_decode_str(&name)
                .decode_utf8()
                .map_err(|_| "undecodable blob name".to_string())?
                .into_owned();
        }
        names.push(name);
    }
    // The marker follows the Blobs element; search after it so no blob can shadow it.
    let tail = xml.rfind("</Blobs>").map_or(xml, |i| &xml[i..]);
    let next = match elements(tail, "NextMarker").next() {
        Some((_, raw)) => Some(decode_entities(raw)?).filter(|m| !m.is_empty()),
        None => None,
    };
    Ok((names, next))
}

impl TokenSource {
    /// A valid bearer token: the cached one, or a new one. Error: (detail, transient).
    fn token(&self, agent: &ureq::Agent) -> std::result::Result<String, (String, bool)> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.as_ref() {
            if Instant::now() < c.refresh_at {
                return Ok(c.token.clone());
            }
        }
        let (token, lifetime) = self.fetch(agent)?;
        let margin = Duration::from_secs(300).min(lifetime / 2);
        *cache = Some(CachedToken {
            token: token.clone(),
            refresh_at: Instant::now() + lifetime - margin,
        });
        Ok(token)
    }

    /// Drops the cached token.
    fn invalidate(&self) {
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// One token request. Returns the token and its lifetime.
    fn fetch(
        &self,
        agent: &ureq::Agent,
    ) -> std::result::Result<(String, Duration), (String, bool)> {
        let form = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, QUERY_SET)))
                .collect::<Vec<_>>()
                .join("&")
        };
        let (what, result) = match &self.kind {
            TokenKind::ClientSecret {
                client_id,
                client_secret,
            } => {
                let body = form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    ("client_secret", client_secret),
                    ("scope", STORAGE_SCOPE),
                ]);
                ("token request", self.post(agent, body))
            }
            TokenKind::Federated {
                client_id,
                token_file,
            } => {
                let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                    (
                        format!(
                            "cannot read federated token file {}: {}",
                            token_file.display(),
                            io_reason(&e)
                        ),
                        false,
                    )
                })?;
                let body = form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    (
                        "client_assertion_type",
                        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                    ),
                    ("client_assertion", assertion.trim()),
                    ("scope", STORAGE_SCOPE),
                ]);
                ("token request", self.post(agent, body))
            }
            TokenKind::Imds => {
                let request = ureq::http::Request::builder()
                    .method("GET")
                    .uri(self.url.as_str())
                    .header("Metadata", "true")
                    .body(());
                let result = match request {
                    Ok(r) => {
                        let r = agent
                            .configure_request(r)
                            .timeout_connect(Some(IMDS_TIMEOUT))
                            .timeout_recv_response(Some(IMDS_TIMEOUT))
                            .build();
                        agent.run(r)
                    }
                    Err(e) => Err(ureq::Error::Http(e)),
                };
                ("managed identity token request", result)
            }
        };
        let mut resp = result.map_err(|e| {
            let (d, t) = describe_transport(&e);
            (format!("{what} failed: {d}"), t)
        })?;
        let status = resp.status().as_u16();
        let body = read_small(&mut resp).map_err(|e| {
            let (d, t) = describe_transport(&e);
            (format!("{what} failed: {d}"), t)
        })?;
        let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        if !(200..300).contains(&status) {
            let code = json
                .as_ref()
                .and_then(|j| j.get("error"))
                .and_then(|e| e.as_str().or_else(|| e.get("code")?.as_str()))
                .and_then(clean_code)
                .unwrap_or_default();
            return Err((
                format!("{what} failed: {status} {code}")
                    .trim_end()
                    .to_string(),
                retry::is_transient_status(status),
            ));
        }
        let json = json.ok_or_else(|| (format!("{what} failed: answer is not JSON"), false))?;
        let token = json
            .get("access_token")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| (format!("{what} failed: no access_token in answer"), false))?;
        // expires_in is a number (Entra ID) or a string (IMDS).
        let secs = json
            .get("expires_in")
            .and_then(|v| v.as_u64().or_else(|| v.as_str()?.trim().parse().ok()))
            .unwrap_or(3600);
        Ok((token.to_string(), Duration::from_secs(secs.max(1))))
    }

    fn post(
        &self,
        agent: &ureq::Agent,
        body: String,
    ) -> std::result::Result<Response, ureq::Error> {
        let request = ureq::http::Request::builder()
            .method("POST")
            .uri(self.url.as_str())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .body(body)
            .map_err(ureq::Error::Http)?;
        agent.run(request)
    }
}

impl Storage for AzureBlobStorage {
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        let read_error = |e: io::Error| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        };
        let mut file = File::open(path).map_err(read_error)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        // Read up to threshold + 1 bytes: at most the threshold means one Put Blob.
        let mut first = Vec::new();
        let eof = fill(&mut file, &mut first, self.put_threshold.saturating_add(1))
            .map_err(read_error)?;
        if eof && first.len() <= self.put_threshold {
            return self.put_blob(key, &first);
        }
        let block_size = self.block_size_for(len);
        self.put_blocks(key, first, &mut file, block_size, &read_error)
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        validate_key(key)?;
        if data.len() <= self.put_threshold {
            return self.put_blob(key, data);
        }
        let block_size = self.block_size_for(data.len() as u64);
        let mut src = data;
        self.put_blocks(key, Vec::new(), &mut src, block_size, &|e| {
            Error::Io(format!("Failed to read {key}: {}", io_reason(&e)))
        })
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        validate_key(key)?;
        retry::run(self.retry, &format!("Azure get {key}"), || {
            let mut resp = self.get_response(key)?;
            resp.body_mut()
                .with_config()
                .limit(u64::MAX)
                .read_to_vec()
                .map_err(|e| transport_failure("get", key, &e))
        })
    }

    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        validate_key(key)?;
        retry::run(self.retry, &format!("Azure get {key}"), || {
            let resp = self.get_response(key)?;
            let mut body = resp.into_body().into_reader();
            super::body_to_file(&mut body, path, |e| {
                Attempt::Transient(fail(
                    "get",
                    key,
                    &format!("connection error: {}", strip_queries(&io_reason(e))),
                ))
            })
        })
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        let call = Call::new("HEAD", Some(key));
        self.request("head", key, &call, |resp| {
            let status = resp.status().as_u16();
            // A missing container counts as a missing blob here, as on S3 (whose HEAD cannot
            // tell them apart): the first put then reports SPEC.md's
            // `Failed to put <key>: ContainerNotFound`.
            if status == 404 {
                return Ok(None);
            }
            if !(200..300).contains(&status) {
                return Err(status_failure("head", key, resp));
            }
            resp.headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| {
                    Attempt::Permanent(fail("head", key, "answer without Content-Length"))
                })
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        let shown = if prefix.is_empty() { "/" } else { prefix };
        let mut keys = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut call = Call::new("GET", None);
            call.query.push(("restype", "container".into()));
            call.query.push(("comp", "list".into()));
            call.query.push(("maxresults", self.page_size.to_string()));
            if !prefix.is_empty() {
                call.query.push(("prefix", prefix.to_string()));
            }
            if let Some(m) = &marker {
                call.query.push(("marker", m.clone()));
            }
            let (names, next) = self.request("list", shown, &call, |mut resp| {
                let status = resp.status().as_u16();
                if !(200..300).contains(&status) {
                    return Err(status_failure("list", shown, resp));
                }
                let body =
                    read_small(&mut resp).map_err(|e| transport_failure("list", shown, &e))?;
                let text = String::from_utf8(body)
                    .map_err(|_| Attempt::Permanent(fail("list", shown, "answer is not UTF-8")))?;
                parse_list_page(&text).map_err(|d| {
                    Attempt::Permanent(fail("list", shown, &format!("bad answer: {d}")))
                })
            })?;
            for name in names {
                if !name.starts_with(prefix) {
                    continue;
                }
                if validate_key(&name).is_err() {
                    log::debug!("ignoring blob with an invalid key: {}", name.escape_debug());
                    continue;
                }
                keys.push(name);
            }
            match next {
                Some(m) if marker.as_ref() != Some(&m) => marker = Some(m),
                _ => break,
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let call = Call::new("DELETE", Some(key));
        self.request("delete", key, &call, |resp| {
            if resp.status().as_u16() == 404 {
                return Ok(());
            }
            expect_success("delete", key, resp)
        })
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

/// A number that differs between uploads (time, process and a per-process hash seed): the
/// tag in block ids. Not cryptographic; it only has to differ between concurrent writers.
fn upload_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::conformance::{self, TempDir};
    use std::collections::HashMap;
    use std::io::Write;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU32, Ordering};

    const ACCOUNT: &str = "devstoreaccount1";
    const KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    const ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

    fn fast_retry() -> Policy {
        Policy {
            attempts: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
        }
    }

    fn options(container: &str, credential: Credential) -> AzureOptions {
        AzureOptions {
            account: ACCOUNT.into(),
            container: container.into(),
            endpoint: Some(ENDPOINT.into()),
            credential,
            authority_host: DEFAULT_AUTHORITY_HOST.into(),
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.into(),
            put_threshold: DEFAULT_PUT_THRESHOLD,
            block_size: DEFAULT_BLOCK_SIZE,
            retry: fast_retry(),
        }
    }

    fn key_cred() -> Credential {
        Credential::SharedKey(Secret::new(KEY))
    }

    fn unique_container(tag: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!(
            "rmqb-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A fresh container in Azurite, deleted on drop.
    struct Container {
        name: String,
        admin: AzureBlobStorage,
    }

    impl Container {
        fn new(tag: &str) -> Container {
            let name = unique_container(tag);
            let admin = AzureBlobStorage::new(options(&name, key_cred())).expect("open admin");
            admin.create_container().expect("create container");
            Container { name, admin }
        }
    }

    impl Drop for Container {
        fn drop(&mut self) {
            let _ = self.admin.delete_container();
        }
    }

    /// Service SAS for a whole container with every permission (Azure "Create a service SAS",
    /// version 2020-12-06+).
    fn container_sas(container: &str, key_b64: &str) -> String {
        container_sas_with(container, key_b64, "racwdl")
    }

    /// Service SAS for a whole container with the permissions `sp` (`rl`: read and list only).
    fn container_sas_with(container: &str, key_b64: &str, sp: &str) -> String {
        let (se, sv, sr) = ("2099-01-01T00:00:00Z", API_VERSION, "c");
        let to_sign =
            format!("{sp}\n\n{se}\n/blob/{ACCOUNT}/{container}\n\n\n\n{sv}\n{sr}\n\n\n\n\n\n\n");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(key_b64)
            .expect("key");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw);
        let sig = base64::engine::general_purpose::STANDARD
            .encode(ring::hmac::sign(&key, to_sign.as_bytes()).as_ref());
        format!(
            "sv={sv}&sr={sr}&sp={sp}&se={}&sig={}",
            utf8_percent_encode(se, QUERY_SET),
            utf8_percent_encode(&sig, QUERY_SET)
        )
    }

    #[test]
    fn conforms_with_shared_key() {
        let c = Container::new("key");
        let s = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
        conformance::run(&s);
        assert_eq!(
            s.location(),
            format!("azure://127.0.0.1:10000/devstoreaccount1/{}", c.name)
        );
        // The 20 MiB file of the suite went up in blocks; check the block path on its own too.
        let data: Vec<u8> = (0..9 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
        s.put_bytes("big/blocks", &data).expect("put big");
        assert_eq!(s.committed_blocks("big/blocks").expect("blocks"), 2);
        assert!(s.get_bytes("big/blocks").expect("get") == data);
    }

    /// A read-only identity (a SAS with read and list only): reads work, a write is
    /// `Failed to put <key>: 403 Forbidden`, and the signature never shows.
    #[test]
    fn read_only_sas_cannot_write() {
        let c = Container::new("rosas");
        let admin = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
        admin.put_bytes("b/manifest.json", b"{}").expect("seed");
        let sas = container_sas_with(&c.name, KEY, "rl");
        let sig = sas.split("sig=").nth(1).expect("sig").to_string();
        let mut o = options(&c.name, Credential::Sas(Secret::new(sas)));
        o.retry = fast_retry();
        let ro = AzureBlobStorage::new(o).expect("open read-only");
        assert_eq!(ro.get_bytes("b/manifest.json").expect("read"), b"{}");
        assert_eq!(ro.list("b/").expect("list"), ["b/manifest.json"]);
        let err = ro.put_bytes("b/other.json", b"{}").expect_err("denied");
        assert_eq!(
            err,
            Error::Storage("Failed to put b/other.json: 403 Forbidden".into())
        );
        assert!(!format!("{err} {err:?}").contains(&sig));
    }

    #[test]
    fn conforms_with_sas_token() {
        let c = Container::new("sas");
        let sas = container_sas(&c.name, KEY);
        // With a leading '?', as portals copy it.
        let cfg = AzureConfig {
            account_name: ACCOUNT.into(),
            container_name: c.name.clone(),
            account_key: None,
            prefix: None,
            endpoint: Some(ENDPOINT.into()),
            use_workload_identity: None,
            client_id: None,
            tenant_id: None,
            client_secret: None,
            sas_token: Some(Secret::new(format!("?{sas}"))),
        };
        let mut o = AzureOptions::from_config(&cfg, &|_| None).expect("options");
        assert_eq!(o.credential, Credential::Sas(Secret::new(sas.clone())));
        o.retry = fast_retry();
        let s = AzureBlobStorage::new(o).expect("open");
        conformance::run(&s);
        // A tampered signature is refused, and the message holds no part of the token.
        let bad = sas.replace("sig=", "sig=AAAA");
        let s = AzureBlobStorage::new(options(&c.name, Credential::Sas(Secret::new(bad))))
            .expect("open");
        let err = s.put_bytes("x", b"x").expect_err("bad sas");
        assert_eq!(err, Error::Storage("Failed to put x: 403 Forbidden".into()));
        assert!(!err.to_string().contains("sig"), "{err}");
    }

    #[test]
    fn block_uploads_with_a_small_threshold() {
        let c = Container::new("blocks");
        let mut o = options(&c.name, key_cred());
        o.put_threshold = 100_000;
        o.block_size = 64 * 1024;
        let s = AzureBlobStorage::new(o).expect("open");
        let tmp = TempDir::new("azure-blocks");
        let data: Vec<u8> = (0..300_001u32).map(|i| (i * 7 % 256) as u8).collect();
        let src = tmp.0.join("src.bin");
        std::fs::write(&src, &data).expect("write");
        s.put_file("seg/one", &src).expect("put_file");
        assert_eq!(s.committed_blocks("seg/one").expect("blocks"), 5);
        assert_eq!(s.head("seg/one").expect("head"), Some(300_001));
        let dst = tmp.0.join("dst.bin");
        assert_eq!(s.get_to_file("seg/one", &dst).expect("get"), 300_001);
        assert!(std::fs::read(&dst).expect("read") == data);
        // Exactly the threshold: one Put Blob (a block blob without committed blocks).
        s.put_bytes("seg/two", &data[..100_000]).expect("put");
        assert_eq!(s.committed_blocks("seg/two").expect("blocks"), 0);
        s.put_bytes("seg/two", &data[..100_001]).expect("put");
        assert_eq!(s.committed_blocks("seg/two").expect("blocks"), 2);
        assert!(s.get_bytes("seg/two").expect("get") == data[..100_001]);
        // Overwriting a block blob with a smaller one replaces it whole.
        s.put_file("seg/one", &tmp.0.join("src.bin"))
            .expect("again");
        std::fs::write(&src, b"tiny").expect("write");
        s.put_file("seg/one", &src).expect("small");
        assert_eq!(s.get_bytes("seg/one").expect("get"), b"tiny");
        assert_eq!(s.list("seg/").expect("list"), ["seg/one", "seg/two"]);
    }

    #[test]
    fn listing_follows_markers() {
        let c = Container::new("pages");
        let mut s = AzureBlobStorage::new(options(&c.name, key_cred())).expect("open");
        // 4 blobs per page: 23 keys take 6 pages; names need XML escaping in the answer.
        s.page_size = 4;
        let mut want: Vec<String> = (0..23).map(|i| format!("p/k{i:02} &<>'\"")).collect();
        for k in &want {
            s.put_bytes(k, b"").expect("put");
        }
        s.put_bytes("q", b"").expect("put");
        want.sort();
        assert_eq!(s.list("p/").expect("list"), want);
        assert_eq!(s.list("p/k1").expect("list").len(), 10);
        assert_eq!(s.list("").expect("list").len(), 24);
    }

    #[test]
    fn missing_container_is_reported_on_use() {
        let name = unique_container("absent");
        let mut o = options(&name, key_cred());
        o.put_threshold = 10;
        o.block_size = 10;
        let s = AzureBlobStorage::new(o).expect("a missing container is not a creation error");
        let msg = |e: Error| e.to_string();
        assert_eq!(
            msg(s.put_bytes("b/manifest.json", b"{}").expect_err("put")),
            "Storage error: Failed to put b/manifest.json: ContainerNotFound"
        );
        assert_eq!(
            msg(s.put_bytes("b/big", &[1u8; 25]).expect_err("put blocks")),
            "Storage error: Failed to put b/big: ContainerNotFound"
        );
        assert_eq!(
            msg(s.get_bytes("b/x").expect_err("get")),
            "Storage error: Failed to get b/x: ContainerNotFound"
        );
        assert_eq!(s.head("b/x").expect("head"), None, "as on S3");
        assert_eq!(
            msg(s.list("").expect_err("list")),
            "Storage error: Failed to list /: ContainerNotFound"
        );
        s.delete("b/x").expect("delete of a missing blob succeeds");
    }

    #[test]
    fn wrong_key_is_403_forbidden_without_the_key() {
        let c = Container::new("badkey");
        let wrong = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
        let s = AzureBlobStorage::new(options(
            &c.name,
            Credential::SharedKey(Secret::new(wrong.clone())),
        ))
        .expect("open");
        let err = s.put_bytes("b/manifest.json", b"{}").expect_err("denied");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to put b/manifest.json: 403 Forbidden"
        );
        let tmp = TempDir::new("azure-badkey");
        std::fs::write(tmp.0.join("f"), b"data").expect("write");
        for e in [
            err,
            s.put_file("k", &tmp.0.join("f")).expect_err("put_file"),
            s.get_bytes("k").expect_err("get"),
            s.list("").expect_err("list"),
            s.head("k").expect_err("head"),
            s.delete("k").expect_err("delete"),
        ] {
            let text = e.to_string();
            assert!(text.contains("403 Forbidden"), "{text}");
            assert!(!text.contains(&wrong) && !text.contains(KEY), "{text}");
        }
        assert!(!format!("{s:?}").contains(&wrong));
    }

    #[test]
    fn unreachable_endpoint_fails_fast() {
        let started = Instant::now();
        let mut o = options("c1", key_cred());
        o.endpoint = Some("http://127.0.0.1:1/devstoreaccount1".into());
        o.retry = Policy::default();
        let err = AzureBlobStorage::new(o).expect_err("unreachable");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create Azure backend: endpoint connection error"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    fn cfg(container: &str) -> AzureConfig {
        AzureConfig {
            account_name: ACCOUNT.into(),
            container_name: container.into(),
            account_key: None,
            prefix: None,
            endpoint: Some(ENDPOINT.into()),
            use_workload_identity: None,
            client_id: None,
            tenant_id: None,
            client_secret: None,
            sas_token: None,
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn missing_credentials_fail_at_creation() {
        let mut o = AzureOptions::from_config(&cfg("c1"), &env_of(&[])).expect("options");
        assert_eq!(
            o.credential,
            Credential::ManagedIdentity { client_id: None }
        );
        // Nothing listens there: managed identity is unavailable, as off Azure.
        o.imds_endpoint = "http://127.0.0.1:1/metadata/identity/oauth2/token".into();
        let started = Instant::now();
        let err = AzureBlobStorage::new(o).expect_err("no credentials");
        let text = err.to_string();
        assert!(
            text.starts_with("Storage error: Failed to create Azure backend: no credentials found"),
            "{text}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        // An account key that is not base64 is a configuration error that does not echo it.
        let err = AzureBlobStorage::new(options(
            "c1",
            Credential::SharedKey(Secret::new("not*base64*secret")),
        ))
        .expect_err("bad key");
        assert_eq!(
            err,
            Error::Config("Invalid Azure account key: not base64".into())
        );
    }

    #[test]
    fn credentials_follow_the_priority_order_and_env_fallbacks() {
        let sp_env = [
            ("AZURE_CLIENT_ID", "cid"),
            ("AZURE_TENANT_ID", "tid"),
            ("AZURE_CLIENT_SECRET", "csecret"),
        ];
        // Account key first, from the field or either variable.
        let mut c = cfg("c1");
        c.account_key = Some(Secret::new("k1"));
        c.sas_token = Some(Secret::new("sv=1&sig=x"));
        let o = AzureOptions::from_config(&c, &env_of(&sp_env)).expect("o");
        assert_eq!(o.credential, Credential::SharedKey(Secret::new("k1")));
        assert!(!format!("{o:?}").contains("k1"), "{o:?}");
        for var in ["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"] {
            let o = AzureOptions::from_config(&cfg("c1"), &env_of(&[(var, "k2")])).expect("o");
            assert_eq!(o.credential, Credential::SharedKey(Secret::new("k2")));
        }
        // Then the SAS token, with or without '?'.
        let mut c = cfg("c1");
        c.sas_token = Some(Secret::new("sv=1&sig=x"));
        let o = AzureOptions::from_config(&c, &env_of(&sp_env)).expect("o");
        assert_eq!(o.credential, Credential::Sas(Secret::new("sv=1&sig=x")));
        let o = AzureOptions::from_config(
            &cfg("c1"),
            &env_of(&[("AZURE_STORAGE_SAS_TOKEN", "?sv=2&sig=y")]),
        )
        .expect("o");
        assert_eq!(o.credential, Credential::Sas(Secret::new("sv=2&sig=y")));
        // Then the service principal, before workload identity.
        let mut env = sp_env.to_vec();
        env.push(("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"));
        env.push(("AZURE_AUTHORITY_HOST", "https://login.example.us/"));
        let o = AzureOptions::from_config(&cfg("c1"), &env_of(&env)).expect("o");
        assert_eq!(
            o.credential,
            Credential::ServicePrincipal {
                tenant_id: "tid".into(),
                client_id: "cid".into(),
                client_secret: Secret::new("csecret")
            }
        );
        assert_eq!(o.authority_host, "https://login.example.us/");
        // Fields win over variables.
        let mut c = cfg("c1");
        c.client_id = Some("field-cid".into());
        c.tenant_id = Some("field-tid".into());
        c.client_secret = Some(Secret::new("field-secret"));
        let o = AzureOptions::from_config(&c, &env_of(&env)).expect("o");
        assert_eq!(
            o.credential,
            Credential::ServicePrincipal {
                tenant_id: "field-tid".into(),
                client_id: "field-cid".into(),
                client_secret: Secret::new("field-secret")
            }
        );
        // Workload identity is auto-detected from the token file variable...
        let wi_env = [
            ("AZURE_CLIENT_ID", "cid"),
            ("AZURE_TENANT_ID", "tid"),
            ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
        ];
        let wi = Credential::WorkloadIdentity {
            tenant_id: "tid".into(),
            client_id: "cid".into(),
            token_file: PathBuf::from("/var/run/token"),
        };
        let o = AzureOptions::from_config(&cfg("c1"), &env_of(&wi_env)).expect("o");
        assert_eq!(o.credential, wi);
        // ...unless switched off, which leaves managed identity (user-assigned by client id).
        let mut c = cfg("c1");
        c.use_workload_identity = Some(false);
        let o = AzureOptions::from_config(&c, &env_of(&wi_env)).expect("o");
        assert_eq!(
            o.credential,
            Credential::ManagedIdentity {
                client_id: Some("cid".into())
            }
        );
        // Asked for but incomplete: a configuration error.
        let mut c = cfg("c1");
        c.use_workload_identity = Some(true);
        let err = AzureOptions::from_config(&c, &env_of(&[])).expect_err("incomplete");
        assert!(matches!(err, Error::Config(_)), "{err}");
        // A client secret without ids is a configuration error that does not show it.
        let mut c = cfg("c1");
        c.client_secret = Some(Secret::new("lonely-secret"));
        let err = AzureOptions::from_config(&c, &env_of(&[])).expect_err("incomplete");
        assert!(!err.to_string().contains("lonely-secret"));
        // Empty values count as unset.
        let o = AzureOptions::from_config(&cfg("c1"), &env_of(&[("AZURE_STORAGE_KEY", " ")]))
            .expect("o");
        assert_eq!(
            o.credential,
            Credential::ManagedIdentity { client_id: None }
        );
    }

    #[test]
    fn endpoints_and_locations() {
        let s = AzureBlobStorage {
            agent: ureq::Agent::new_with_defaults(),
            account: "acct".into(),
            container: "c".into(),
            base_url: String::new(),
            base_path: String::new(),
            location: String::new(),
            auth: Auth::Sas(String::new()),
            put_threshold: 1,
            block_size: 1,
            retry: fast_retry(),
            page_size: 1,
        };
        assert_eq!(s.url_path(Some("a b/ü+%/x~y")), "/c/a%20b/%C3%BC%2B%25/x~y");
        assert_eq!(
            parse_endpoint("https://acct.blob.core.usgovcloudapi.net/").expect("ok"),
            (
                "https://acct.blob.core.usgovcloudapi.net".into(),
                String::new()
            )
        );
        assert_eq!(
            parse_endpoint(ENDPOINT).expect("ok"),
            (ENDPOINT.into(), "/devstoreaccount1".into())
        );
        for bad in [
            "ftp://x",
            "https://",
            "https://u:p@host",
            "https://host/?sig=abc",
            "host",
        ] {
            let err = parse_endpoint(bad).expect_err(bad);
            assert!(!err.to_string().contains("sig=abc"), "{err}");
        }
        // Public cloud, sovereign cloud and emulator locations (SPEC.md "Storage URLs").
        assert_eq!(
            location_of("https://acct.blob.core.windows.net", "backups"),
            "azure://acct.blob.core.windows.net/backups"
        );
        assert_eq!(
            location_of("https://acct.blob.core.usgovcloudapi.net", "backups"),
            "azure://acct.blob.core.usgovcloudapi.net/backups"
        );
        assert_eq!(
            location_of(ENDPOINT, "backups"),
            "azure://127.0.0.1:10000/devstoreaccount1/backups"
        );
        let mut o = options("Bad_Name", key_cred());
        o.endpoint = None;
        assert!(matches!(AzureBlobStorage::new(o), Err(Error::Config(_))));
    }

    #[test]
    fn shared_key_string_to_sign_is_canonical() {
        let headers = vec![
            ("x-ms-version", "2021-08-06".to_string()),
            ("x-ms-date", "Mon, 01 Jan 2024 00:00:00 GMT".to_string()),
            ("x-ms-blob-type", "BlockBlob".to_string()),
            ("content-type", "application/xml".to_string()),
        ];
        let query = vec![
            ("restype", "container".to_string()),
            ("comp", "list".to_string()),
            ("prefix", "a b/&".to_string()),
        ];
        let s = string_to_sign(
            "PUT",
            5,
            &headers,
            "devstoreaccount1",
            "/devstoreaccount1/c/a%20b",
            &query,
        );
        assert_eq!(
            s,
            "PUT\n\n\n5\n\napplication/xml\n\n\n\n\n\n\n\
             x-ms-blob-type:BlockBlob\nx-ms-date:Mon, 01 Jan 2024 00:00:00 GMT\n\
             x-ms-version:2021-08-06\n\
             /devstoreaccount1/devstoreaccount1/c/a%20b\ncomp:list\nprefix:a b/&\nrestype:container"
        );
        // Content-Length 0 is signed as empty.
        assert!(string_to_sign("GET", 0, &[], "a", "/c", &[]).starts_with("GET\n\n\n\n"));
    }

    #[test]
    fn dates_are_rfc1123() {
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(784_111_777)),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(1_709_210_096)),
            "Thu, 29 Feb 2024 12:34:56 GMT"
        );
    }

    #[test]
    fn list_pages_are_parsed() {
        let xml = "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults \
            ServiceEndpoint=\"http://x/\" ContainerName=\"c\"><Prefix>a</Prefix><MaxResults>2\
            </MaxResults><Blobs><Blob><Name>a/one &amp; &lt;two&gt; &#233;&#x4E2D;</Name>\
            <Properties><Content-Length>3</Content-Length></Properties></Blob>\
            <Blob><Name Encoded=\"true\">a/%EF%BF%BE</Name><Properties/></Blob></Blobs>\
            <NextMarker>2!8!&quot;x&quot;</NextMarker></EnumerationResults>";
        let (names, next) = parse_list_page(xml).expect("parse");
        assert_eq!(names, ["a/one & <two> é中", "a/\u{FFFE}"]);
        assert_eq!(next.as_deref(), Some("2!8!\"x\""));
        for end in [
            "<NextMarker />",
            "<NextMarker/>",
            "<NextMarker></NextMarker>",
            "",
        ] {
            let xml = format!(
                "<EnumerationResults><Blobs><Blob><Name>k</Name></Blob></Blobs>{end}</EnumerationResults>"
            );
            assert_eq!(
                parse_list_page(&xml).expect("parse"),
                (vec!["k".into()], None)
            );
        }
        let empty = "<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>";
        assert_eq!(parse_list_page(empty).expect("parse"), (vec![], None));
        assert!(parse_list_page("<Error><Code>X</Code></Error>").is_err());
        assert!(decode_entities("a &bogus; b").is_err());
        assert_eq!(
            clean_code(" ContainerNotFound\r\n").as_deref(),
            Some("ContainerNotFound")
        );
        assert_eq!(strip_queries("http://h/p?sig=abc def"), "http://h/p def");
    }

    // ---- Identity flows against local listeners (Entra ID, IMDS, a blob endpoint) ----

    /// One request as a local listener saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        target: String,
        headers: HashMap<String, String>,
        body: String,
    }

    type Handler = dyn Fn(&Seen) -> (u16, Vec<(String, String)>, String) + Send + Sync;

    /// Serves HTTP/1.1 on 127.0.0.1:<any>, one request per connection; records every request.
    fn serve(handler: Arc<Handler>) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let handler = Arc::clone(&handler);
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let method = parts.next().unwrap_or_default().to_string();
                    let target = parts.next().unwrap_or_default().to_string();
                    let mut headers = HashMap::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    reader.read_exact(&mut body).expect("body");
                    let req = Seen {
                        method,
                        target,
                        headers,
                        body: String::from_utf8_lossy(&body).into_owned(),
                    };
                    log.lock().expect("log").push(req.clone());
                    let (status, extra, body) = handler(&req);
                    let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
                    for (k, v) in extra {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                    if req.method == "HEAD" {
                        out.push_str("Content-Length: 0\r\n\r\n");
                    } else {
                        out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
                    }
                    let _ = stream.write_all(out.as_bytes());
                });
            }
        });
        (url, seen)
    }

    /// A blob endpoint that accepts everything and records the Authorization header.
    fn fake_blob_endpoint() -> (String, Arc<Mutex<Vec<Seen>>>) {
        let (url, seen) = serve(Arc::new(|req: &Seen| {
            let status = match req.method.as_str() {
                "PUT" => 201,
                "DELETE" => 202,
                _ => 200,
            };
            (status, vec![], String::new())
        }));
        (format!("{url}/{ACCOUNT}"), seen)
    }

    fn form(body: &str) -> HashMap<String, String> {
        body.split('&')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| {
                (
                    k.to_string(),
                    percent_decode_str(&v.replace('+', " "))
                        .decode_utf8_lossy()
                        .into_owned(),
                )
            })
            .collect()
    }

    /// An Entra ID token endpoint answering `tok-<n>` valid for `lifetime` seconds.
    fn fake_entra(lifetime: u64) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let n = Arc::new(AtomicU32::new(0));
        serve(Arc::new(move |req: &Seen| {
            let f = form(&req.body);
            if req.method != "POST" || f.get("scope").map(String::as_str) != Some(STORAGE_SCOPE) {
                return (400, vec![], "{\"error\":\"invalid_request\"}".into());
            }
            if f.get("client_secret").map(String::as_str) == Some("wrong-secret") {
                return (
                    401,
                    vec![],
                    "{\"error\":\"invalid_client\",\"error_description\":\"AADSTS7000215: \
                     Invalid client secret provided.\"}"
                        .into(),
                );
            }
            let i = n.fetch_add(1, Ordering::SeqCst) + 1;
            (
                200,
                vec![("Content-Type".into(), "application/json".into())],
                format!(
                    "{{\"token_type\":\"Bearer\",\"expires_in\":{lifetime},\"access_token\":\"tok-{i}\"}}"
                ),
            )
        }))
    }

    fn bearer_options(blob_url: &str, authority: &str, credential: Credential) -> AzureOptions {
        let mut o = options("backups", credential);
        o.endpoint = Some(blob_url.into());
        o.authority_host = authority.into();
        o
    }

    #[test]
    fn service_principal_token_reaches_the_blob_request() {
        let (authority, token_requests) = fake_entra(3599);
        let (blob, blob_requests) = fake_blob_endpoint();
        // Through from_config, with AZURE_AUTHORITY_HOST from the (fake) environment.
        let env = env_of(&[
            ("AZURE_CLIENT_ID", "app-1"),
            ("AZURE_TENANT_ID", "tenant-1"),
            ("AZURE_CLIENT_SECRET", "sp-secret-value"),
            ("AZURE_AUTHORITY_HOST", &authority),
        ]);
        let mut c = cfg("backups");
        c.endpoint = Some(blob.clone());
        let mut o = AzureOptions::from_config(&c, &env).expect("options");
        o.retry = fast_retry();
        let s = AzureBlobStorage::new(o).expect("open");
        s.put_bytes("b/manifest.json", b"{}").expect("put");
        s.delete("b/manifest.json").expect("delete");

        let tokens = token_requests.lock().expect("log").clone();
        assert_eq!(tokens.len(), 1, "one token, cached: {tokens:?}");
        assert_eq!(tokens[0].target, "/tenant-1/oauth2/v2.0/token");
        assert_eq!(
            tokens[0].headers.get("content-type").map(String::as_str),
            Some("application/x-www-form-urlencoded")
        );
        let f = form(&tokens[0].body);
        assert_eq!(f["grant_type"], "client_credentials");
        assert_eq!(f["client_id"], "app-1");
        assert_eq!(f["client_secret"], "sp-secret-value");
        assert_eq!(f["scope"], "https://storage.azure.com/.default");

        let blobs = blob_requests.lock().expect("log").clone();
        assert_eq!(blobs.len(), 3, "probe, put, delete: {blobs:?}");
        for r in &blobs {
            assert_eq!(r.headers["authorization"], "Bearer tok-1");
            assert_eq!(r.headers["x-ms-version"], API_VERSION);
        }
        assert_eq!(blobs[1].method, "PUT");
        assert_eq!(blobs[1].target, "/devstoreaccount1/backups/b/manifest.json");
        assert_eq!(blobs[1].headers["x-ms-blob-type"], "BlockBlob");
        assert_eq!(blobs[1].body, "{}");
    }

    #[test]
    fn bearer_tokens_are_refreshed_before_expiry() {
        // A 2 s token is refreshed after half its lifetime.
        let (authority, token_requests) = fake_entra(2);
        let (blob, blob_requests) = fake_blob_endpoint();
        let s = AzureBlobStorage::new(bearer_options(
            &blob,
            &authority,
            Credential::ServicePrincipal {
                tenant_id: "t".into(),
                client_id: "c".into(),
                client_secret: Secret::new("s"),
            },
        ))
        .expect("open");
        s.head("k").expect("head");
        std::thread::sleep(Duration::from_millis(1100));
        // Concurrent users share one refresh.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| s.head("k").expect("head"));
            }
        });
        assert_eq!(token_requests.lock().expect("log").len(), 2);
        let blobs = blob_requests.lock().expect("log").clone();
        assert_eq!(blobs[1].headers["authorization"], "Bearer tok-1");
        assert!(blobs[2..]
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer tok-2"));
    }

    #[test]
    fn a_refused_token_is_replaced() {
        let (authority, token_requests) = fake_entra(3599);
        let refused = Arc::new(AtomicU32::new(0));
        let r = Arc::clone(&refused);
        let (blob, _) = serve(Arc::new(move |req: &Seen| {
            if req.method == "PUT" && r.fetch_add(1, Ordering::SeqCst) == 0 {
                let code = (
                    "x-ms-error-code".to_string(),
                    "InvalidAuthenticationInfo".into(),
                );
                return (401, vec![code], String::new());
            }
            (201, vec![], String::new())
        }));
        let s = AzureBlobStorage::new(bearer_options(
            &format!("{blob}/{ACCOUNT}"),
            &authority,
            Credential::ServicePrincipal {
                tenant_id: "t".into(),
                client_id: "c".into(),
                client_secret: Secret::new("s"),
            },
        ))
        .expect("open");
        assert_eq!(
            s.put_bytes("k", b"v").expect_err("401").to_string(),
            "Storage error: Failed to put k: 401 InvalidAuthenticationInfo"
        );
        s.put_bytes("k", b"v").expect("new token");
        assert_eq!(token_requests.lock().expect("log").len(), 2);
    }

    #[test]
    fn token_failures_name_the_code_and_hide_the_secret() {
        let (authority, _) = fake_entra(3599);
        let (blob, blob_requests) = fake_blob_endpoint();
        let err = AzureBlobStorage::new(bearer_options(
            &blob,
            &authority,
            Credential::ServicePrincipal {
                tenant_id: "t".into(),
                client_id: "c".into(),
                client_secret: Secret::new("wrong-secret"),
            },
        ))
        .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "Storage error: Failed to create Azure backend: token request failed: 401 invalid_client"
        );
        assert!(blob_requests.lock().expect("log").is_empty());
        // An unreachable token endpoint.
        let err = AzureBlobStorage::new(bearer_options(
            &blob,
            "http://127.0.0.1:1",
            Credential::ServicePrincipal {
                tenant_id: "t".into(),
                client_id: "c".into(),
                client_secret: Secret::new("wrong-secret"),
            },
        ))
        .expect_err("unreachable");
        let text = err.to_string();
        assert!(
            text.starts_with("Storage error: Failed to create Azure backend: token request failed: connection error"),
            "{text}"
        );
        assert!(!text.contains("wrong-secret"));
    }

    #[test]
    fn workload_identity_sends_the_federated_token() {
        let (authority, token_requests) = fake_entra(3599);
        let (blob, blob_requests) = fake_blob_endpoint();
        let tmp = TempDir::new("azure-wi");
        let file = tmp.0.join("token");
        std::fs::write(&file, "eyJhbGciOi.federated.jwt\n").expect("write");
        let env = env_of(&[
            ("AZURE_CLIENT_ID", "wi-app"),
            ("AZURE_TENANT_ID", "wi-tenant"),
            ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().expect("utf8")),
            ("AZURE_AUTHORITY_HOST", &authority),
        ]);
        let mut c = cfg("backups");
        c.endpoint = Some(blob.clone());
        let mut o = AzureOptions::from_config(&c, &env).expect("options");
        assert!(matches!(o.credential, Credential::WorkloadIdentity { .. }));
        o.retry = fast_retry();
        let s = AzureBlobStorage::new(o).expect("open");
        s.put_bytes("k", b"v").expect("put");
        let tokens = token_requests.lock().expect("log").clone();
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].target, "/wi-tenant/oauth2/v2.0/token");
        let f = form(&tokens[0].body);
        assert_eq!(f["grant_type"], "client_credentials");
        assert_eq!(f["client_id"], "wi-app");
        assert_eq!(
            f["client_assertion_type"],
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
        );
        assert_eq!(f["client_assertion"], "eyJhbGciOi.federated.jwt");
        assert_eq!(f["scope"], STORAGE_SCOPE);
        assert!(!f.contains_key("client_secret"));
        let blobs = blob_requests.lock().expect("log").clone();
        assert!(blobs
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer tok-1"));
        // A missing token file fails creation and names the file.
        let mut o = bearer_options(
            &blob,
            &authority,
            Credential::WorkloadIdentity {
                tenant_id: "t".into(),
                client_id: "c".into(),
                token_file: tmp.0.join("absent"),
            },
        );
        o.retry = fast_retry();
        let err = AzureBlobStorage::new(o).expect_err("no file");
        assert!(
            err.to_string().contains("cannot read federated token file"),
            "{err}"
        );
    }

    #[test]
    fn managed_identity_asks_imds() {
        let (imds, imds_requests) = serve(Arc::new(|req: &Seen| {
            if req.headers.get("metadata").map(String::as_str) != Some("true") {
                return (400, vec![], "{\"error\":\"invalid_request\"}".into());
            }
            (
                200,
                vec![],
                "{\"access_token\":\"mi-token\",\"expires_in\":\"86399\",\"token_type\":\"Bearer\"}"
                    .into(),
            )
        }));
        let (blob, blob_requests) = fake_blob_endpoint();
        let mut o = options(
            "backups",
            Credential::ManagedIdentity {
                client_id: Some("uami-1".into()),
            },
        );
        o.endpoint = Some(blob);
        o.imds_endpoint = format!("{imds}/metadata/identity/oauth2/token");
        let s = AzureBlobStorage::new(o).expect("open");
        s.put_bytes("k", b"v").expect("put");
        let reqs = imds_requests.lock().expect("log").clone();
        assert_eq!(reqs.len(), 1);
        assert_eq!(reqs[0].method, "GET");
        assert_eq!(
            reqs[0].target,
            "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F&client_id=uami-1"
        );
        assert!(blob_requests
            .lock()
            .expect("log")
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer mi-token"));
    }

    #[test]
    fn no_secret_in_transport_errors() {
        // A blob endpoint that hangs up without answering: the SAS token must not show.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in listener.incoming() {
                drop(s);
            }
        });
        let sas = "sv=2021-08-06&sr=c&sp=rw&se=2099-01-01&sig=SUPERSECRETSIG%3D";
        let mut o = options("c1", Credential::Sas(Secret::new(sas)));
        o.endpoint = Some(format!("http://{addr}/devstoreaccount1"));
        let err = AzureBlobStorage::new(o).expect_err("hang-up");
        let text = err.to_string();
        assert_eq!(
            text,
            "Storage error: Failed to create Azure backend: endpoint connection error"
        );
        let e = transport_failure(
            "put",
            "k",
            &ureq::Error::BadUri(format!("http://h/c/k?{sas}")),
        );
        let (Attempt::Permanent(e) | Attempt::Transient(e)) = e;
        assert!(!e.to_string().contains("SUPERSECRET"), "{e}");
    }
}
