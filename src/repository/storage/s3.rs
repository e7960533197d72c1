//! Amazon S3 and S3-compatible stores (MinIO, SeaweedFS, Ceph RGW), with rust-s3 over attohttpc
//! (synchronous; TLS by rustls with the system CA store, so `SSL_CERT_FILE` and `SSL_CERT_DIR`
//! name private CAs).
//!
//! Configuration (SPEC.md "storage", backend `s3`): `bucket`, `region`, `endpoint`,
//! `access_key`, `secret_key`, `path_style`, `allow_http` (`prefix` is applied by the caller
//! through [`super::with_prefix`]). Fallbacks, in order:
//! - region: `storage.region`, `AWS_REGION`, `AWS_DEFAULT_REGION`, then `us-east-1`;
//! - credentials: `storage.access_key` + `storage.secret_key`; else `AWS_ACCESS_KEY_ID` +
//!   `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`), the shared credentials file (`AWS_PROFILE`),
//!   web identity (`AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`), the ECS/EKS container
//!   endpoint, then the EC2 instance role (IMDSv2, then v1); temporary credentials are refreshed
//!   before they expire.
//!
//! Objects up to [`MULTIPART_THRESHOLD`] bytes go up in one PUT; larger files in a multipart
//! upload of 8 MiB parts read from the file one at a time (never the whole file in memory),
//! completed atomically. Every request has a timeout and is retried by [`super::retry`] on
//! 5xx, 408, 429 and connection failures, never on other 4xx.
//!
//! Conditional writes (`put_*_new`, `put_bytes_if`, `get_with_version`) send `If-None-Match: *`
//! or `If-Match: <etag>`; the version is the ETag (`conditional`).
//!
//! Errors (SPEC.md "Errors"): `Failed to put <key>: 403 Forbidden`,
//! `Failed to put <key>: NoSuchBucket`, `Key not found: <key>`, and at creation
//! `Failed to create S3 backend: endpoint connection error`.

mod conditional;
#[cfg(test)]
pub(crate) mod lossy_proxy;

use super::retry::{self, Attempt, Policy};
use super::{io_reason, validate_key, validate_prefix, Conditional, ObjectVersion, Storage};
use crate::error::{Error, Result};
use conditional::Precondition;
use s3::creds::Credentials;
use s3::error::S3Error;
use s3::{Bucket, Region};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Files of at least this many bytes are uploaded in parts (rust-s3's part size, 8 MiB).
pub const MULTIPART_THRESHOLD: u64 = s3::bucket::CHUNK_SIZE as u64;

/// Upper bound of one request, whole body included (a backstop: attohttpc's own 30 s connect
/// and read timeouts catch a dead peer first).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Everything needed to reach one bucket; secrets are plain strings here and never printed.
#[derive(Clone, Default)]
pub struct S3Options {
    /// Bucket name.
    pub bucket: String,
    /// Region; `None` falls back to `AWS_REGION`, `AWS_DEFAULT_REGION`, then `us-east-1`.
    pub region: Option<String>,
    /// Endpoint URL of an S3-compatible service (`http://127.0.0.1:8333`); `None` for AWS.
    pub endpoint: Option<String>,
    /// Access key id; with `secret_key`, or both `None` for the environment/instance chain.
    pub access_key: Option<String>,
    /// Secret access key.
    pub secret_key: Option<String>,
    /// Path-style requests (`<endpoint>/<bucket>/<key>`), needed by most self-hosted stores.
    pub path_style: bool,
    /// Allow an `http://` endpoint.
    pub allow_http: bool,
    /// Retry policy of every request.
    pub retry: Policy,
    /// `storage.object_lock`: the retention headers of every put of a locked key.
    pub object_lock: Option<super::object_lock::ObjectLock>,
}

impl S3Options {
    /// Options of the `storage` section of a configuration.
    pub fn from_config(cfg: &crate::config::S3Storage) -> S3Options {
        S3Options {
            bucket: cfg.bucket.clone(),
            region: cfg.region.clone(),
            endpoint: cfg.endpoint.clone(),
            access_key: cfg.access_key.as_ref().map(|s| s.expose().to_string()),
            secret_key: cfg.secret_key.as_ref().map(|s| s.expose().to_string()),
            path_style: cfg.path_style,
            allow_http: cfg.allow_http,
            retry: Policy::for_backend("s3"),
            object_lock: cfg
                .object_lock
                .as_ref()
                .map(|l| super::object_lock::ObjectLock::new(l, cfg.prefix.as_deref())),
        }
    }
}

/// Opens the bucket of the `storage` section (SPEC.md "storage", backend s3) and probes the
/// endpoint with one listing request. Errors: `Storage error: Failed to create S3 backend:
/// <reason>` (`endpoint connection error` when nothing answers; no credentials found).
pub fn open(cfg: &crate::config::S3Storage) -> Result<Arc<dyn Storage>> {
    Ok(Arc::new(S3Storage::open(S3Options::from_config(cfg))?))
}

/// An S3 bucket as a [`Storage`].
pub struct S3Storage {
    bucket: Box<Bucket>,
    /// The same bucket without the whole-request limit, for downloads of any size: attohttpc's
    /// 30 s connect and read timeouts still catch a dead peer.
    download: Box<Bucket>,
    retry: Policy,
    location: String,
    lock: Option<super::object_lock::ObjectLock>,
}

fn create_error(reason: impl std::fmt::Display) -> Error {
    Error::Storage(format!("Failed to create S3 backend: {reason}"))
}

/// The first environment variable of `names` that is set and not empty.
fn env_first(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
}

impl S3Storage {
    /// Connects to the bucket of `opts` and probes the endpoint (see [`open`]).
    pub fn open(opts: S3Options) -> Result<S3Storage> {
        crate::install_tls_provider();
        // Our retry policy replaces rust-s3's own (process-wide) retries.
        s3::set_retries(0);
        let region_name = opts
            .region
            .clone()
            .filter(|r| !r.is_empty())
            .or_else(|| env_first(&["AWS_REGION", "AWS_DEFAULT_REGION"]))
            .unwrap_or_else(|| "us-east-1".to_string());
        let region = match &opts.endpoint {
            Some(endpoint) => {
                let lower = endpoint.to_ascii_lowercase();
                if lower.starts_with("http://") && !opts.allow_http {
                    return Err(Error::Config(
                        "storage.allow_http must be true when storage.endpoint uses http://".into(),
                    ));
                }
                Region::Custom {
                    region: region_name.clone(),
                    endpoint: endpoint.trim_end_matches('/').to_string(),
                }
            }
            None => match region_name.parse::<Region>() {
                Ok(Region::Custom { .. }) | Err(_) => Region::Custom {
                    region: region_name.clone(),
                    endpoint: format!("https://s3.{region_name}.amazonaws.com"),
                },
                Ok(r) => r,
            },
        };
        let credentials = match (&opts.access_key, &opts.secret_key) {
            (Some(a), Some(s)) => Credentials::new(Some(a), Some(s), None, None, None),
            _ => Credentials::default(),
        }
        .map_err(|_| {
            create_error(
                "no credentials: set storage.access_key and storage.secret_key, \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, or an instance role",
            )
        })?;
        let mut bucket = Bucket::new(&opts.bucket, region, credentials)
            .map_err(|e| create_error(safe_reason(&e)))?;
        if opts.path_style {
            bucket.set_path_style();
        }
        let mut download = bucket.clone();
        download.set_request_timeout(None);
        bucket.set_request_timeout(Some(REQUEST_TIMEOUT));
        let mut location = format!("s3://{}", opts.bucket);
        let mut params = Vec::new();
        if let Some(e) = &opts.endpoint {
            params.push(format!("endpoint={e}"));
        }
        if opts.path_style {
            params.push("path_style=true".to_string());
        }
        if !params.is_empty() {
            location = format!("{location}?{}", params.join("&"));
        }
        let storage = S3Storage {
            bucket,
            download,
            retry: opts.retry,
            location,
            lock: opts.object_lock,
        };
        storage.probe()?;
        Ok(storage)
    }

    /// One listing request of at most one key: only a failure to reach the endpoint is an error
    /// here (a missing bucket or a denied listing is reported by the operation that needs it).
    fn probe(&self) -> Result<()> {
        let policy = Policy {
            attempts: self.retry.attempts.min(2),
            ..self.retry
        };
        let mut reason = String::new();
        let outcome = retry::run(policy, "probe the S3 endpoint", || {
            match self
                .bucket
                .list_page(String::new(), None, None, None, Some(1))
            {
                Ok(_) => Ok(()),
                Err(S3Error::HttpFailWithBody(status, _)) if status < 500 => Ok(()),
                Err(e) => {
                    reason = safe_reason(&e);
                    Err(classify("probe", "", e))
                }
            }
        });
        outcome.map_err(
            |_| match reason.strip_prefix("endpoint connection error (") {
                // Keep SPEC.md's wording and add the cause (refused, TLS certificate, timeout).
                Some(cause) => create_error(format!(
                    "endpoint connection error: {}",
                    cause.trim_end_matches(')')
                )),
                None => create_error(format!("endpoint answered {reason}")),
            },
        )
    }

    /// The S3 Object Lock headers of a put of `key` (`x-amz-object-lock-mode`,
    /// `x-amz-object-lock-retain-until-date`, the date from now), empty when `key` is not
    /// locked ([`super::object_lock`]).
    pub(super) fn lock_headers(&self, key: &str) -> ureq::http::HeaderMap {
        let mut h = ureq::http::HeaderMap::new();
        if let Some(l) = self.lock.as_ref().filter(|l| l.applies_to(key)) {
            let mode = match l.mode {
                crate::config::LockMode::Governance => "GOVERNANCE",
                crate::config::LockMode::Compliance => "COMPLIANCE",
            };
            if let (Ok(m), Ok(u)) = (
                ureq::http::HeaderValue::from_str(mode),
                ureq::http::HeaderValue::from_str(&l.until_rfc3339()),
            ) {
                h.insert(
                    ureq::http::HeaderName::from_static("x-amz-object-lock-mode"),
                    m,
                );
                h.insert(
                    ureq::http::HeaderName::from_static("x-amz-object-lock-retain-until-date"),
                    u,
                );
            }
        }
        h
    }

    /// `e` of a put of `key`, with what to do when the bucket refused the lock headers (S3
    /// answers 400 InvalidRequest to a bucket without Object Lock).
    fn lock_hint(&self, key: &str, e: Error) -> Error {
        let locked = self.lock.as_ref().is_some_and(|l| l.applies_to(key));
        match e {
            Error::Storage(m) if locked && m.contains("InvalidRequest") => Error::Storage(format!(
                "{m} (storage.object_lock needs a bucket created with Object Lock enabled)"
            )),
            e => e,
        }
    }

    /// The bucket a put of `key` goes through: with the lock headers when it is locked.
    fn put_bucket(&self, key: &str) -> Result<std::borrow::Cow<'_, Bucket>> {
        let h = self.lock_headers(key);
        if h.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(&*self.bucket));
        }
        self.bucket
            .with_extra_headers(h)
            .map(std::borrow::Cow::Owned)
            .map_err(|e| Error::Storage(format!("Failed to put {key}: {}", safe_reason(&e))))
    }

    /// One put of the file at `path` (a multipart upload from [`MULTIPART_THRESHOLD`] on),
    /// retried; the lock headers when `key` is locked.
    fn put_file_plain(&self, key: &str, path: &Path) -> Result<()> {
        let bucket = self.put_bucket(key)?;
        self.run(&format!("put {key}"), || {
            let mut file = std::fs::File::open(path).map_err(|e| read_error(path, &e))?;
            let size = file.metadata().map_err(|e| read_error(path, &e))?.len();
            if size < MULTIPART_THRESHOLD {
                let mut data = Vec::with_capacity(size as usize);
                file.read_to_end(&mut data)
                    .map_err(|e| read_error(path, &e))?;
                bucket
                    .put_object(key, &data)
                    .map(|_| ())
                    .map_err(|e| classify("put", key, e))
            } else {
                log::trace!("storage: s3 multipart upload of {key} ({size} bytes)");
                match bucket.put_object_stream(&mut file, key) {
                    Ok(_) => Ok(()),
                    // A read error of the source file surfaces as io; the file is local.
                    Err(S3Error::Io(e)) if e.kind() != std::io::ErrorKind::ConnectionReset => {
                        Err(read_error(path, &e))
                    }
                    Err(e) => Err(classify("put", key, e)),
                }
            }
        })
    }

    fn run<T>(&self, what: &str, op: impl FnMut() -> std::result::Result<T, Attempt>) -> Result<T> {
        retry::run(self.retry, what, op)
    }
}

/// The `<Code>` of an S3 XML error body, if any.
fn error_code(body: &str) -> Option<&str> {
    let start = body.find("<Code>")? + "<Code>".len();
    let end = body[start..].find("</Code>")? + start;
    Some(body[start..end].trim()).filter(|c| !c.is_empty())
}

/// A short description of a rust-s3 error without anything secret: transport errors say
/// what failed at the connection level, HTTP errors give status and S3 error code.
fn safe_reason(e: &S3Error) -> String {
    match e {
        S3Error::HttpFailWithBody(403, _) => "403 Forbidden".to_string(),
        S3Error::HttpFailWithBody(status, body) => match error_code(body) {
            Some("NoSuchBucket") => "NoSuchBucket".to_string(),
            Some(code) => format!("{status} {code}"),
            None => format!("HTTP {status}"),
        },
        S3Error::Atto(err) => format!("endpoint connection error ({})", atto_reason(err)),
        S3Error::Io(err) => format!("endpoint connection error ({})", io_reason(err)),
        S3Error::Credentials(_) => "credentials could not be loaded".to_string(),
        other => {
            // rust-s3's other errors (XML, UTF-8, region) carry no secret, but cut them short.
            let text = other.to_string();
            text.chars().take(200).collect()
        }
    }
}

/// attohttpc's error without the request URL (which could carry a presigned query).
fn atto_reason(err: &attohttpc::Error) -> String {
    match err.kind() {
        attohttpc::ErrorKind::Io(io) => io_reason(io),
        attohttpc::ErrorKind::ConnectNotSupported => "connect not supported".into(),
        attohttpc::ErrorKind::InvalidBaseUrl => "invalid endpoint URL".into(),
        attohttpc::ErrorKind::TooManyRedirections => "too many redirections".into(),
        _ => {
            let text = err.to_string();
            match text.find("http") {
                Some(pos) => text[..pos].trim_end().to_string(),
                None => text,
            }
        }
    }
}

/// Maps a failed request to an [`Attempt`]: `Failed to <op> <key>: <reason>`, transient on
/// 5xx/408/429 and connection-level failures.
fn classify(op: &str, key: &str, e: S3Error) -> Attempt {
    let message = Error::Storage(format!("Failed to {op} {key}: {}", safe_reason(&e)));
    match e {
        S3Error::HttpFailWithBody(status, _) => Attempt::from_status(status, message),
        S3Error::Atto(_) | S3Error::Io(_) => Attempt::Transient(message),
        _ => Attempt::Permanent(message),
    }
}

/// True when the error is S3's answer for a missing object (404 without NoSuchBucket).
fn is_missing_key(e: &S3Error) -> bool {
    matches!(e, S3Error::HttpFailWithBody(404, body) if error_code(body) != Some("NoSuchBucket"))
}

/// A body shorter or longer than its declared length is a transient failure (a connection cut
/// mid-body): `Failed to get <key>: body truncated (<got> of <declared> bytes)`.
fn check_length(key: &str, got: u64, declared: Option<u64>) -> std::result::Result<(), Attempt> {
    match declared {
        Some(want) if want != got => Err(Attempt::Transient(Error::Storage(format!(
            "Failed to get {key}: body truncated ({got} of {want} bytes)"
        )))),
        _ => Ok(()),
    }
}

fn not_found(key: &str) -> Attempt {
    Attempt::Permanent(Error::Storage(format!("Key not found: {key}")))
}

fn read_error(path: &Path, e: &std::io::Error) -> Attempt {
    Attempt::Permanent(Error::Io(format!(
        "Failed to read {}: {}",
        path.display(),
        io_reason(e)
    )))
}

impl Storage for S3Storage {
    fn put_bytes_new(&self, key: &str, data: &[u8]) -> Result<Conditional> {
        validate_key(key)?;
        self.put_conditional(key, data, Precondition::Absent)
            .map_err(|e| self.lock_hint(key, e))
    }

    fn put_file_new(&self, key: &str, path: &Path) -> Result<Conditional> {
        validate_key(key)?;
        self.put_file_new_impl(key, path)
            .map_err(|e| self.lock_hint(key, e))
    }

    fn get_with_version(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        validate_key(key)?;
        self.get_versioned(key)
    }

    fn put_bytes_if(&self, key: &str, data: &[u8], version: &ObjectVersion) -> Result<Conditional> {
        validate_key(key)?;
        self.put_conditional(key, data, Precondition::Version(version))
            .map_err(|e| self.lock_hint(key, e))
    }

    fn put_file(&self, key: &str, path: &Path) -> Result<()> {
        validate_key(key)?;
        self.put_file_plain(key, path)
            .map_err(|e| self.lock_hint(key, e))
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> Result<()> {
        validate_key(key)?;
        let bucket = self.put_bucket(key)?;
        self.run(&format!("put {key}"), || {
            bucket
                .put_object(key, data)
                .map(|_| ())
                .map_err(|e| classify("put", key, e))
        })
        .map_err(|e| self.lock_hint(key, e))
    }

    fn get_bytes(&self, key: &str) -> Result<Vec<u8>> {
        validate_key(key)?;
        self.run(&format!("get {key}"), || {
            match self.download.get_object(key) {
                Ok(data) => {
                    let declared = data
                        .headers()
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .and_then(|(_, v)| v.trim().parse::<u64>().ok());
                    let body = data.to_vec();
                    check_length(key, body.len() as u64, declared)?;
                    Ok(body)
                }
                Err(e) if is_missing_key(&e) => Err(not_found(key)),
                Err(e) => Err(classify("get", key, e)),
            }
        })
    }

    fn get_to_file(&self, key: &str, path: &Path) -> Result<u64> {
        validate_key(key)?;
        self.run(&format!("get {key}"), || {
            // attohttpc ends a body cut short by the peer without an error, so the size from a
            // HEAD is compared with what arrived.
            let declared = match self.bucket.head_object(key) {
                Ok((h, _)) => h.content_length.map(|n| n.max(0) as u64),
                Err(e) if is_missing_key(&e) => return Err(not_found(key)),
                Err(e) => return Err(classify("get", key, e)),
            };
            let file = std::fs::File::create(path).map_err(|e| {
                Attempt::Permanent(Error::Io(format!(
                    "Failed to write {}: {}",
                    path.display(),
                    io_reason(&e)
                )))
            })?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            match self.download.get_object_to_writer(key, &mut out) {
                Ok(_) => {}
                Err(e) if is_missing_key(&e) => return Err(not_found(key)),
                Err(e) => return Err(classify("get", key, e)),
            }
            let file = out.into_inner().map_err(|e| {
                Attempt::Permanent(Error::Io(format!(
                    "Failed to write {}: {}",
                    path.display(),
                    io_reason(e.error())
                )))
            })?;
            let got = file.metadata().map(|m| m.len()).map_err(|e| {
                Attempt::Permanent(Error::Io(format!(
                    "Failed to read {}: {}",
                    path.display(),
                    io_reason(&e)
                )))
            })?;
            check_length(key, got, declared)?;
            Ok(got)
        })
    }

    fn head(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        self.run(&format!("head {key}"), || {
            match self.bucket.head_object(key) {
                Ok((h, _)) => Ok(Some(h.content_length.unwrap_or(0).max(0) as u64)),
                Err(S3Error::HttpFailWithBody(404, _)) => Ok(None),
                Err(e) => Err(classify("head", key, e)),
            }
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        let shown = if prefix.is_empty() { "/" } else { prefix };
        let mut keys: Vec<String> = self.run(&format!("list {shown}"), || {
            self.bucket
                .list(prefix.to_string(), None)
                .map(|pages| {
                    pages
                        .into_iter()
                        .flat_map(|p| p.contents.into_iter().map(|o| o.key))
                        .collect()
                })
                .map_err(|e| classify("list", shown, e))
        })?;
        keys.retain(|k| k.starts_with(prefix));
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        self.run(&format!("delete {key}"), || {
            match self.bucket.delete_object(key) {
                Ok(_) => Ok(()),
                Err(e) if is_missing_key(&e) => Ok(()),
                Err(e) => Err(classify("delete", key, e)),
            }
        })
    }

    /// S3 `DeleteObjects`, 1,000 keys a request, each request retried; a key the answer lists
    /// as an error fails the call naming it (`Storage error: Failed to delete <key>: <code>`).
    fn delete_many(&self, keys: &[String]) -> Result<()> {
        for chunk in keys.chunks(1000) {
            chunk.iter().try_for_each(|k| validate_key(k))?;
            let what = format!("delete {} keys from {}", chunk.len(), chunk[0]);
            // A request that fails names its first key and how many more it held.
            let named = match chunk.len() {
                1 => chunk[0].clone(),
                n => format!("{} (and {} more keys)", chunk[0], n - 1),
            };
            let outcome = self.run(&what, || {
                let ids: Vec<s3::serde_types::ObjectIdentifier> = chunk
                    .iter()
                    .map(s3::serde_types::ObjectIdentifier::new)
                    .collect();
                self.bucket
                    .delete_objects(ids)
                    .map_err(|e| classify("delete", &named, e))
            })?;
            if let Some(e) = outcome.errors.iter().find(|e| e.code != "NoSuchKey") {
                return Err(Error::Storage(format!(
                    "Failed to delete {}: {} {}",
                    e.key, e.code, e.message
                )));
            }
        }
        Ok(())
    }

    fn list_with_times(&self, prefix: &str) -> Result<Vec<(String, Option<i64>)>> {
        validate_prefix(prefix)?;
        let shown = if prefix.is_empty() { "/" } else { prefix };
        let mut keys: Vec<(String, Option<i64>)> = self.run(&format!("list {shown}"), || {
            self.bucket
                .list(prefix.to_string(), None)
                .map(|pages| {
                    pages
                        .into_iter()
                        .flat_map(|p| p.contents.into_iter())
                        .map(|o| {
                            let t = crate::run::units::parse_time(&o.last_modified).ok();
                            (o.key, t)
                        })
                        .collect()
                })
                .map_err(|e| classify("list", shown, e))
        })?;
        keys.retain(|(k, _)| k.starts_with(prefix));
        keys.sort();
        keys.dedup_by(|a, b| a.0 == b.0);
        Ok(keys)
    }

    fn location(&self) -> String {
        self.location.clone()
    }

    /// `x-amz-object-lock-retain-until-date` of a HEAD (needs `s3:GetObjectRetention`; an
    /// identity without it sees none).
    fn retained_until(&self, key: &str) -> Result<Option<i64>> {
        validate_key(key)?;
        self.run(&format!("head {key}"), || {
            match self.bucket.head_object(key) {
                Ok((h, _)) => Ok(h
                    .object_lock_retain_until_date
                    .and_then(|d| crate::run::units::parse_time(&d).ok())),
                Err(S3Error::HttpFailWithBody(404, _)) => Ok(None),
                Err(e) => Err(classify("head", key, e)),
            }
        })
    }
}

/// Tests against the SeaweedFS of `scripts/setup-storage.sh` (127.0.0.1:8333, SigV4 enforced,
/// identities `rmqbackup-admin` and the read-only `rmqbackup-readonly`).
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::repository::storage::conformance;
    use std::sync::atomic::{AtomicU32, Ordering};

    pub const ENDPOINT: &str = "http://127.0.0.1:8333";
    pub const ADMIN: (&str, &str) = ("rmqbackup-admin", "rmqbackup-admin-secret");
    pub const READONLY: (&str, &str) = ("rmqbackup-readonly", "rmqbackup-readonly-secret");

    pub fn options(bucket: &str, creds: (&str, &str)) -> S3Options {
        S3Options {
            bucket: bucket.to_string(),
            region: Some("us-east-1".into()),
            endpoint: Some(ENDPOINT.into()),
            access_key: Some(creds.0.into()),
            secret_key: Some(creds.1.into()),
            path_style: true,
            allow_http: true,
            retry: Policy {
                attempts: 2,
                base_delay: Duration::from_millis(50),
                max_delay: Duration::from_millis(100),
                backend: "s3",
            },
            object_lock: None,
        }
    }

    /// A bucket created for one test and deleted, with everything in it, on drop.
    pub struct TestBucket(pub String);

    impl TestBucket {
        pub fn new(tag: &str) -> TestBucket {
            static N: AtomicU32 = AtomicU32::new(0);
            let name = format!(
                "rmqb-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let creds = Credentials::new(Some(ADMIN.0), Some(ADMIN.1), None, None, None)
                .expect("credentials");
            let region = Region::Custom {
                region: "us-east-1".into(),
                endpoint: ENDPOINT.into(),
            };
            Bucket::create_with_path_style(
                &name,
                region,
                creds,
                s3::BucketConfiguration::default(),
            )
            .unwrap_or_else(|e| {
                panic!("create bucket {name} (is SeaweedFS running? scripts/setup-storage.sh): {e}")
            });
            TestBucket(name)
        }
    }

    impl Drop for TestBucket {
        fn drop(&mut self) {
            if let Ok(s) = S3Storage::open(options(&self.0, ADMIN)) {
                for k in s.list("").unwrap_or_default() {
                    let _ = s.delete(&k);
                }
                let _ = s.bucket.delete();
            }
        }
    }

    #[test]
    fn a_bucket_without_object_lock_refuses_the_lock_and_says_why() {
        let b = TestBucket::new("nolock");
        let mut o = options(&b.0, ADMIN);
        o.object_lock = Some(crate::repository::storage::object_lock::ObjectLock::new(
            &crate::config::ObjectLockConfig {
                mode: crate::config::LockMode::Governance,
                retain_for: crate::config::RetainFor(60),
            },
            None,
        ));
        let s = S3Storage::open(o).expect("open");
        let e = s
            .put_bytes("b/manifest.json", b"{}")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("Storage error: Failed to put b/manifest.json: 400 InvalidRequest")
                && e.ends_with(
                    "(storage.object_lock needs a bucket created with Object Lock enabled)"
                ),
            "{e}"
        );
        let e = s.put_bytes_new("b/x", b"{}").unwrap_err().to_string();
        assert!(e.contains("needs a bucket created with Object Lock"), "{e}");
        // Keys a run rewrites carry no lock: written as in any bucket.
        s.put_bytes("b/state/lock.json", b"{}")
            .expect("unlocked key");
    }

    #[test]
    fn seaweedfs_conforms() {
        let b = TestBucket::new("conf");
        let s = S3Storage::open(options(&b.0, ADMIN)).expect("open");
        conformance::run(&s);
        assert_eq!(
            s.location(),
            format!("s3://{}?endpoint={ENDPOINT}&path_style=true", b.0)
        );
    }

    #[test]
    fn prefixed_seaweedfs_conforms() {
        let b = TestBucket::new("prefixed");
        let s: Arc<dyn Storage> = Arc::new(S3Storage::open(options(&b.0, ADMIN)).expect("open"));
        let p =
            crate::repository::storage::with_prefix(s.clone(), Some("team/prod")).expect("prefix");
        conformance::run(p.as_ref());
        p.put_bytes("b1/manifest.json", b"{}").expect("put");
        assert_eq!(s.list("").expect("list"), ["team/prod/b1/manifest.json"]);
        assert_eq!(p.list_backup_ids().expect("ids"), ["b1"]);
    }

    #[test]
    fn missing_bucket_is_reported_by_the_first_put() {
        let s = S3Storage::open(options("rmqb-no-such-bucket", ADMIN)).expect("open");
        assert_eq!(
            s.put_bytes("b/manifest.json", b"{}").expect_err("put"),
            Error::Storage("Failed to put b/manifest.json: NoSuchBucket".into())
        );
        let tmp = conformance::TempDir::new("s3-nobucket");
        let f = tmp.0.join("seg");
        std::fs::write(&f, b"segment").expect("write");
        assert_eq!(
            s.put_file("b/queues/v/q/segment-0001.zst", &f)
                .expect_err("put_file"),
            Error::Storage("Failed to put b/queues/v/q/segment-0001.zst: NoSuchBucket".into())
        );
    }

    #[test]
    fn read_only_identity_cannot_write_and_says_so_without_secrets() {
        let b = TestBucket::new("ro");
        let admin = S3Storage::open(options(&b.0, ADMIN)).expect("open admin");
        admin.put_bytes("b/manifest.json", b"{}").expect("seed");
        let ro = S3Storage::open(options(&b.0, READONLY)).expect("open read-only");
        let err = ro.put_bytes("b/other.json", b"{}").expect_err("denied");
        assert_eq!(
            err,
            Error::Storage("Failed to put b/other.json: 403 Forbidden".into())
        );
        // Reading works with the read-only identity.
        assert_eq!(ro.get_bytes("b/manifest.json").expect("read"), b"{}");
        assert_eq!(ro.list_backup_ids().expect("ids"), ["b"]);
        // A batch delete that is denied names its keys; nothing is deleted.
        let keys = ["b/manifest.json".to_string(), "b/other.json".to_string()];
        let err = ro.delete_many(&keys).expect_err("denied");
        assert!(
            err.to_string()
                .starts_with("Storage error: Failed to delete b/manifest.json"),
            "{err}"
        );
        assert_eq!(
            admin.get_bytes("b/manifest.json").expect("still there"),
            b"{}"
        );
        // A wrong secret is denied too, and neither secret shows up anywhere.
        let mut bad = options(&b.0, ADMIN);
        bad.secret_key = Some("wrong-secret-value-123".into());
        let wrong = S3Storage::open(bad).expect("open with a wrong secret");
        let err = wrong.put_bytes("b/x", b"x").expect_err("denied");
        assert_eq!(
            err,
            Error::Storage("Failed to put b/x: 403 Forbidden".into())
        );
        for text in [err.to_string(), format!("{err:?}"), wrong.location()] {
            assert!(!text.contains("wrong-secret-value-123"), "{text}");
            assert!(!text.contains(ADMIN.1), "{text}");
        }
    }

    #[test]
    fn unreachable_endpoint_fails_at_creation() {
        let mut o = options("any-bucket", ADMIN);
        o.endpoint = Some("http://127.0.0.1:1".into());
        let started = std::time::Instant::now();
        let err = S3Storage::open(o).err().expect("unreachable");
        assert_eq!(
            err,
            Error::Storage(
                "Failed to create S3 backend: endpoint connection error: Connection refused".into()
            )
        );
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn http_endpoint_needs_allow_http() {
        let mut o = options("any-bucket", ADMIN);
        o.allow_http = false;
        assert!(matches!(S3Storage::open(o), Err(Error::Config(m)) if m.contains("allow_http")));
    }

    #[test]
    fn short_bodies_are_transient_failures() {
        assert!(check_length("k", 10, Some(10)).is_ok());
        assert!(check_length("k", 10, None).is_ok());
        match check_length("k", 10, Some(100)) {
            Err(Attempt::Transient(e)) => assert_eq!(
                e,
                Error::Storage("Failed to get k: body truncated (10 of 100 bytes)".into())
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn error_codes_are_extracted() {
        let body =
            "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>x</Message></Error>";
        assert_eq!(error_code(body), Some("NoSuchKey"));
        assert_eq!(error_code("<Error></Error>"), None);
        assert_eq!(error_code(""), None);
        assert!(is_missing_key(&S3Error::HttpFailWithBody(404, body.into())));
        assert!(is_missing_key(&S3Error::HttpFailWithBody(
            404,
            String::new()
        )));
        assert!(!is_missing_key(&S3Error::HttpFailWithBody(
            404,
            "<Error><Code>NoSuchBucket</Code></Error>".into()
        )));
        assert!(matches!(
            classify("put", "k", S3Error::HttpFailWithBody(503, String::new())),
            Attempt::Transient(_)
        ));
        assert!(matches!(
            classify("put", "k", S3Error::HttpFailWithBody(400, String::new())),
            Attempt::Permanent(_)
        ));
    }
}
