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
//! - conditional writes (`put_*_new`, `put_bytes_if`): `ifGenerationMatch`, in a multipart
//!   upload up to the threshold and a resumable one above it (`conditional`); the version is the
//!   object's `generation`, which `get_with_version` reads from `x-goog-generation`.
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

//!
//! Files: `credentials` (key files, ADC, metadata server, JWT), `auth` (access tokens and
//! their cache), `client` (requests, retries, errors), `upload` (simple and resumable
//! uploads), `conditional` (create-only and compare-and-replace writes); the `Storage` impl and
//! downloads are here.

mod auth;
mod client;
mod conditional;
mod credentials;
mod listing;
#[cfg(test)]
mod tests;
mod upload;

use super::retry::{self, Attempt, Policy};
use super::{validate_key, validate_prefix, Conditional, ObjectVersion, Storage};
use crate::error::{Error, Result};
use auth::*;
use client::*;
pub use credentials::*;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use upload::*;
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
    opts.object_lock = cfg.object_lock.as_ref().map(|l| {
        crate::repository::storage::object_lock::ObjectLock::new(l, cfg.prefix.as_deref())
    });
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
    /// `storage.object_lock`: the object retention of every upload of a locked key.
    pub object_lock: Option<crate::repository::storage::object_lock::ObjectLock>,
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
            policy: Policy::for_backend("gcs"),
            object_lock: None,
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
    lock: Option<crate::repository::storage::object_lock::ObjectLock>,
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
    /// The object resource an upload of `key` sends: its name, and with `storage.object_lock`
    /// a `retention` (`Unlocked` for governance, `Locked` for compliance, `retainUntilTime`)
    /// unless the key is not locked. GCS refuses to replace an object under retention, and a
    /// run writes its manifest (and a shard its part) twice, interrupted then completed: those
    /// keys stay unlocked here (docs/protecting-backups.md "Protecting backups from deletion").
    pub(super) fn metadata(&self, key: &str) -> serde_json::Value {
        let mut m = serde_json::json!({ "name": key });
        let rewritten = key.ends_with("/manifest.json") || key.contains("/parts/");
        if let Some(l) = self
            .lock
            .as_ref()
            .filter(|l| l.applies_to(key) && !rewritten)
        {
            let mode = match l.mode {
                crate::config::LockMode::Governance => "Unlocked",
                crate::config::LockMode::Compliance => "Locked",
            };
            m["retention"] = serde_json::json!({
                "mode": mode,
                "retainUntilTime": l.until_rfc3339(),
            });
        }
        m
    }

    /// Whether an upload of `key` carries a retention ([`Self::metadata`]).
    pub(super) fn locks(&self, key: &str) -> bool {
        self.metadata(key).get("retention").is_some()
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
    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        validate_key(key)?;
        self.put_data_conditional(key, data, 0)
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
        self.put_bytes_if_impl(key, data, version)
    }

    /// Streams the file: a simple upload up to the threshold, else a resumable upload read one
    /// chunk at a time (`chunk_size` bytes of memory).
    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        match open_source(path, self.upload_threshold)? {
            UploadSource::Small(data) => self.simple_upload(key, &data),
            UploadSource::Large(mut src) => self.resumable_upload(key, &mut src, None).map(|_| ()),
        }
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        validate_key(key)?;
        if data.len() as u64 <= self.upload_threshold {
            self.simple_upload(key, data)
        } else {
            self.resumable_upload(key, &mut SliceSource(data), None)
                .map(|_| ())
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
        Ok(self
            .list_with_times(prefix)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    fn list_with_times(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        let mut keys = Vec::new();
        self.list_items(prefix, "name,updated", |item| {
            let t = item
                .updated
                .as_deref()
                .and_then(|u| crate::run::units::parse_time(u).ok());
            keys.push((item.name, t));
        })?;
        keys.sort();
        keys.dedup_by(|a, b| a.0 == b.0);
        Ok(keys)
    }

    /// `retention.retainUntilTime` of every object in one listing (`objects.list` returns the
    /// object resources with their retention), not one request per object.
    fn latest_retention(&self, prefix: &str) -> Result<Option<i64>> {
        let mut latest = None;
        self.list_items(prefix, "name,retention", |item| {
            let until = item.retention.and_then(|r| r.retain_until_time);
            latest = latest.max(
                until
                    .as_deref()
                    .and_then(|u| crate::run::units::parse_time(u).ok()),
            );
        })?;
        Ok(latest)
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
    /// `retention.retainUntilTime` of the object resource.
    fn retained_until(&self, key: &str) -> Result<Option<i64>> {
        validate_key(key)?;
        let ctx = format!("Failed to head {key}");
        let url = format!("{}?fields=retention", self.object_url(key));
        retry::run(self.policy, &format!("head {key}"), || {
            let mut resp = self.call(&ctx, http::Request::get(&url), ())?;
            match resp.status().as_u16() {
                200 => {
                    let v: serde_json::Value = read_json(&mut resp, &ctx)?;
                    Ok(v.pointer("/retention/retainUntilTime")
                        .and_then(|t| t.as_str())
                        .and_then(|t| crate::run::units::parse_time(t).ok()))
                }
                404 => {
                    drain(resp);
                    Ok(None)
                }
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }

    fn location(&self) -> String {
        format!("gcs://{}", self.bucket)
    }
}
