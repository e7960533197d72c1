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
//! | `put_*_new`, `put_bytes_if` | the `put_*` calls with `If-None-Match: *` / `If-Match: <etag>` (`conditional`) |
//! | `get_with_version` | Get Blob, with its ETag |
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

//!
//! Files: `options` (credential and options), `auth` (Shared Key signing, bearer tokens),
//! `client` (client, signed requests, retries, errors), `blobs` (Put Blob, block uploads,
//! reads, containers), `conditional` (create-only and compare-and-replace writes), `xml`
//! (List Blobs pages, error codes); the `Storage` impl is here.

mod auth;
mod blobs;
mod client;
mod conditional;
mod options;
#[cfg(test)]
mod tests;
mod xml;

use super::retry::{self, Attempt, Policy};
use super::{io_reason, validate_key, validate_prefix, Conditional, ObjectVersion, Storage};
use crate::config::AzureStorage as AzureConfig;
use crate::error::{Error, Result};
use auth::*;
use blobs::*;
use client::*;
use conditional::Precondition;
pub use options::*;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xml::*;

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
    /// `storage.object_lock`.
    lock: Option<crate::repository::storage::object_lock::ObjectLock>,
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

type Response = ureq::http::Response<ureq::Body>;

impl Storage for AzureBlobStorage {
    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        validate_key(key)?;
        self.put_data_conditional(key, data, Precondition::Absent)
    }

    fn put_file_new(&self, key: &str, path: &Path) -> Result<Conditional> {
        validate_key(key)?;
        self.put_file_new_impl(key, path)
    }

    fn get_with_version(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        validate_key(key)?;
        self.get_versioned(key)
    }

    fn put_bytes_if(&self, key: &str, data: &[u8], version: &ObjectVersion) -> Result<Conditional> {
        validate_key(key)?;
        self.put_data_conditional(key, data, Precondition::Version(version))
    }

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
        Ok(self
            .list_with_times(prefix)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    fn list_with_times(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
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
            for (name, modified) in names {
                if !name.starts_with(prefix) {
                    continue;
                }
                if validate_key(&name).is_err() {
                    log::debug!("ignoring blob with an invalid key: {}", name.escape_debug());
                    continue;
                }
                keys.push((name, modified));
            }
            match next {
                Some(m) if marker.as_ref() != Some(&m) => marker = Some(m),
                _ => break,
            }
        }
        keys.sort();
        keys.dedup_by(|a, b| a.0 == b.0);
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

    /// `x-ms-immutability-policy-until-date` of Get Blob Properties.
    fn retained_until(&self, key: &str) -> Result<Option<i64>> {
        validate_key(key)?;
        let call = Call::new("HEAD", Some(key));
        self.request("head", key, &call, |resp| {
            let status = resp.status().as_u16();
            if status == 404 {
                return Ok(None);
            }
            if !(200..300).contains(&status) {
                return Err(status_failure("head", key, resp));
            }
            Ok(resp
                .headers()
                .get("x-ms-immutability-policy-until-date")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| xml::parse_http_date(v.trim())))
        })
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}
