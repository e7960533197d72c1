//! Conditional writes of the S3 backend ([`crate::repository::storage::conditional`]).
//!
//! - Create only: `If-None-Match: *` on the PUT, or on CompleteMultipartUpload for a file of at
//!   least [`MULTIPART_THRESHOLD`] bytes (its parts go up unconditionally; nothing is visible
//!   before the completion, which is the atomic step). AWS S3 honours the header on both since
//!   August 2024, SeaweedFS 4.48 too (checked by hand: 412 on an existing key, and one winner
//!   of racing writers). A HEAD before a multipart upload skips uploading a file whose key
//!   already exists; it is an optimisation only, the precondition decides.
//! - Replace a version: `If-Match: "<etag>"` on the PUT. The version is the ETag, quotes
//!   included, as the PUT, GET or CompleteMultipartUpload answer gives it.
//!
//! The headers are signed: the request goes through a clone of the bucket made with
//! [`Bucket::with_extra_headers`]. A 412 `PreconditionFailed` answer (an error carrying 412,
//! rust-s3 being built with `fail-on-err`) is [`Conditional::Refused`]. A 409
//! `ConditionalRequestConflict` (AWS: a concurrent write of the key was in progress) is
//! retried like a 5xx.
//!
//! A retried request whose first attempt reached the store before its answer was lost sees
//! its own write as the existing object: a 412 (or, for a completion, `NoSuchUpload`) after
//! the first attempt is checked by comparing the stored object with ours, and equal bytes
//! count as written. Servers that ignore these headers (older S3-compatible ones) would
//! silently overwrite: docs/storage-backends.md "Storage" names the ones known to honour them.

use super::*;
use crate::repository::storage::{Conditional, ObjectVersion};
use s3::serde_types::Part;
use std::io::{BufRead, Write};
use ureq::http::{HeaderName, HeaderValue};

/// What a conditional PUT requires of the key.
pub(super) enum Precondition<'a> {
    /// No object has the key (`If-None-Match: *`).
    Absent,
    /// The object holds this version (`If-Match`).
    Version(&'a ObjectVersion),
}

/// The version of an ETag as a server sends it: trimmed, quoted when it came without quotes;
/// `None` when empty.
fn etag_version(raw: &str) -> Option<ObjectVersion> {
    let t = raw.trim();
    if t.is_empty() {
        None
    } else if t.starts_with('"') || t.starts_with("W/") {
        Some(ObjectVersion(t.to_string()))
    } else {
        Some(ObjectVersion(format!("\"{t}\"")))
    }
}

/// The `<ETag>` of a CompleteMultipartUpload answer, entities decoded.
fn xml_etag(body: &str) -> Option<ObjectVersion> {
    let start = body.find("<ETag>")? + "<ETag>".len();
    let end = body[start..].find("</ETag>")? + start;
    etag_version(
        &body[start..end]
            .replace("&quot;", "\"")
            .replace("&#34;", "\""),
    )
}

/// True for a refused precondition.
fn is_refusal(e: &S3Error) -> bool {
    matches!(e, S3Error::HttpFailWithBody(412, _))
}

/// Maps a failed conditional request: AWS's 409 `ConditionalRequestConflict` and a 200 answer
/// carrying an error (CompleteMultipartUpload's `InternalError`) are worth another try.
fn classify_conditional(key: &str, e: S3Error) -> Attempt {
    let retry = match &e {
        S3Error::HttpFailWithBody(409, body) => {
            error_code(body) == Some("ConditionalRequestConflict")
        }
        S3Error::HttpFailWithBody(200, _) => true,
        _ => false,
    };
    match classify("put", key, e) {
        Attempt::Permanent(m) if retry => Attempt::Transient(m),
        other => other,
    }
}

/// A writer that compares what it is given with a local file, for [`S3Storage::same_as_file`].
struct CompareWriter {
    file: std::io::BufReader<std::fs::File>,
    equal: bool,
    buf: Vec<u8>,
}

impl Write for CompareWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.equal {
            self.buf.resize(data.len(), 0);
            match self.file.read_exact(&mut self.buf) {
                Ok(()) => self.equal = self.buf == data,
                Err(_) => self.equal = false,
            }
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl S3Storage {
    /// A clone of the bucket that sends `name: value` with every request (signed with it).
    fn with_header(&self, key: &str, name: &'static str, value: &str) -> Result<Bucket> {
        let value = HeaderValue::from_str(value)
            .map_err(|_| Error::Storage(format!("Failed to put {key}: invalid object version")))?;
        let mut headers = self.lock_headers(key);
        headers.insert(HeaderName::from_static(name), value);
        self.bucket
            .with_extra_headers(headers)
            .map_err(|e| Error::Storage(format!("Failed to put {key}: {}", safe_reason(&e))))
    }

    /// One GET of `key` with its ETag; `None` when absent.
    fn get_once(
        &self,
        key: &str,
    ) -> std::result::Result<Option<(Vec<u8>, ObjectVersion)>, Attempt> {
        let data = match self.download.get_object(key) {
            Ok(data) => data,
            Err(e) if is_missing_key(&e) => return Ok(None),
            Err(e) => return Err(classify("get", key, e)),
        };
        let headers = data.headers();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let declared = header("content-length").and_then(|v| v.trim().parse::<u64>().ok());
        let version = header("etag").and_then(etag_version).ok_or_else(|| {
            Attempt::Permanent(Error::Storage(format!(
                "Failed to get {key}: answer without ETag"
            )))
        })?;
        let body = data.to_vec();
        check_length(key, body.len() as u64, declared)?;
        Ok(Some((body, version)))
    }

    /// [`Storage::get_with_version`]: the object and its ETag, retried.
    pub(super) fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        self.run(&format!("get {key}"), || self.get_once(key))
    }

    /// Written when the stored object holds `data` (our own earlier attempt), else refused.
    fn same_as_bytes(&self, key: &str, data: &[u8]) -> std::result::Result<Conditional, Attempt> {
        Ok(match self.get_once(key)? {
            Some((stored, version)) if stored == data => Conditional::Written(version),
            _ => Conditional::Refused,
        })
    }

    /// Written when the stored object holds the bytes of the file at `path` (compared while
    /// streaming, never all in memory), else refused.
    fn same_as_file(&self, key: &str, path: &Path) -> std::result::Result<Conditional, Attempt> {
        let (head, _) = match self.bucket.head_object(key) {
            Ok(h) => h,
            Err(e) if is_missing_key(&e) => return Ok(Conditional::Refused),
            Err(e) => return Err(classify("get", key, e)),
        };
        let file = std::fs::File::open(path).map_err(|e| read_error(path, &e))?;
        let len = file.metadata().map_err(|e| read_error(path, &e))?.len();
        let Some(version) = head.e_tag.as_deref().and_then(etag_version) else {
            return Ok(Conditional::Refused);
        };
        if head.content_length.map(|n| n.max(0) as u64) != Some(len) {
            return Ok(Conditional::Refused);
        }
        let mut cmp = CompareWriter {
            file: std::io::BufReader::with_capacity(1 << 20, file),
            equal: true,
            buf: Vec::new(),
        };
        match self.download.get_object_to_writer(key, &mut cmp) {
            Ok(_) => {}
            Err(e) if is_missing_key(&e) => return Ok(Conditional::Refused),
            Err(e) => return Err(classify("get", key, e)),
        }
        // The whole file was matched when nothing of it is left.
        let at_end = cmp.file.fill_buf().map(|b| b.is_empty()).unwrap_or(false);
        Ok(if cmp.equal && at_end {
            Conditional::Written(version)
        } else {
            Conditional::Refused
        })
    }

    /// One PUT of `data` under `precondition`, retried (see the module doc for retries).
    pub(super) fn put_conditional(
        &self,
        key: &str,
        data: &[u8],
        precondition: Precondition,
    ) -> Result<Conditional> {
        let bucket = match precondition {
            Precondition::Absent => self.with_header(key, "if-none-match", "*")?,
            Precondition::Version(v) => {
                let etag = etag_version(&v.0).ok_or_else(|| {
                    Error::Storage(format!("Failed to put {key}: empty object version"))
                })?;
                self.with_header(key, "if-match", &etag.0)?
            }
        };
        let mut attempt = 0u32;
        self.run(&format!("put {key}"), || {
            attempt += 1;
            match bucket.put_object(key, data) {
                // The body of a PUT answer is its ETag (rust-s3 `response_data(true)`).
                Ok(r) => match r.as_str().ok().and_then(etag_version) {
                    Some(v) => Ok(Conditional::Written(v)),
                    None => self.same_as_bytes(key, data),
                },
                Err(e) if is_refusal(&e) && attempt > 1 => self.same_as_bytes(key, data),
                Err(e) if is_refusal(&e) => Ok(Conditional::Refused),
                Err(e) => Err(classify_conditional(key, e)),
            }
        })
    }

    /// [`Storage::put_file_new`]: one create-only PUT below [`MULTIPART_THRESHOLD`], else a
    /// multipart upload completed with `If-None-Match: *` (aborted unless written).
    pub(super) fn put_file_new_impl(&self, key: &str, path: &Path) -> Result<Conditional> {
        let fail = |a: Attempt| match a {
            Attempt::Transient(e) | Attempt::Permanent(e) => e,
        };
        let mut file = std::fs::File::open(path).map_err(|e| fail(read_error(path, &e)))?;
        let size = file
            .metadata()
            .map_err(|e| fail(read_error(path, &e)))?
            .len();
        if size < MULTIPART_THRESHOLD {
            let mut data = Vec::with_capacity(size as usize);
            file.read_to_end(&mut data)
                .map_err(|e| fail(read_error(path, &e)))?;
            return self.put_conditional(key, &data, Precondition::Absent);
        }
        if self.head(key)?.is_some() {
            return Ok(Conditional::Refused);
        }
        log::trace!("storage: s3 create-only multipart upload of {key} ({size} bytes)");
        let what = format!("put {key}");
        let lock_bucket = self.put_bucket(key)?;
        let upload = self.run(&what, || {
            lock_bucket
                .initiate_multipart_upload(key, "application/octet-stream")
                .map_err(|e| classify("put", key, e))
        })?;
        let id = upload.upload_id.as_str();
        let outcome = self
            .upload_parts(key, path, &mut file, id)
            .and_then(|parts| self.complete_new(key, path, id, parts));
        if !matches!(outcome, Ok(Conditional::Written(_))) {
            // Best effort: a refused or failed upload leaves no parts behind.
            if let Err(e) = self.bucket.abort_upload(key, id) {
                log::debug!("storage: abort of the upload of {key}: {}", safe_reason(&e));
            }
        }
        outcome
    }

    /// Uploads the file in parts of [`MULTIPART_THRESHOLD`] bytes, one in memory at a time.
    fn upload_parts(
        &self,
        key: &str,
        path: &Path,
        file: &mut std::fs::File,
        upload_id: &str,
    ) -> Result<Vec<Part>> {
        let what = format!("put {key}");
        let mut parts = Vec::new();
        let mut buf = Vec::with_capacity(s3::bucket::CHUNK_SIZE);
        loop {
            buf.clear();
            Read::take(&mut *file, MULTIPART_THRESHOLD)
                .read_to_end(&mut buf)
                .map_err(|e| match read_error(path, &e) {
                    Attempt::Transient(e) | Attempt::Permanent(e) => e,
                })?;
            if buf.is_empty() && !parts.is_empty() {
                return Ok(parts);
            }
            let number = parts.len() as u32 + 1;
            let part = self.run(&what, || {
                self.bucket
                    .put_multipart_chunk(&buf, key, number, upload_id, "application/octet-stream")
                    .map_err(|e| classify("put", key, e))
            })?;
            parts.push(part);
            if (buf.len() as u64) < MULTIPART_THRESHOLD {
                return Ok(parts);
            }
        }
    }

    /// CompleteMultipartUpload with `If-None-Match: *`.
    fn complete_new(
        &self,
        key: &str,
        path: &Path,
        upload_id: &str,
        parts: Vec<Part>,
    ) -> Result<Conditional> {
        let bucket = self.with_header(key, "if-none-match", "*")?;
        let mut attempt = 0u32;
        self.run(&format!("put {key}"), || {
            attempt += 1;
            match bucket.complete_multipart_upload(key, upload_id, parts.clone()) {
                Ok(r) => match r.as_str().ok().and_then(xml_etag) {
                    Some(v) => Ok(Conditional::Written(v)),
                    None => self.same_as_file(key, path),
                },
                Err(e) if is_refusal(&e) && attempt == 1 => Ok(Conditional::Refused),
                // A retry after a completion whose answer was lost: the upload is gone.
                Err(e)
                    if attempt > 1
                        && (is_refusal(&e)
                            || matches!(&e, S3Error::HttpFailWithBody(404, b)
                                if error_code(b) == Some("NoSuchUpload"))) =>
                {
                    self.same_as_file(key, path)
                }
                Err(e) => Err(classify_conditional(key, e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::lossy_proxy;
    use super::super::tests::{options, TestBucket, ADMIN};
    use super::*;
    use crate::repository::storage::conformance::TempDir;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    #[test]
    fn multipart_create_only_on_seaweedfs() {
        let b = TestBucket::new("condmp");
        let s = S3Storage::open(options(&b.0, ADMIN)).expect("open");
        let tmp = TempDir::new("s3-cond-mp");
        let big = tmp.0.join("big");
        let data = pattern(MULTIPART_THRESHOLD as usize + 1000, 3);
        std::fs::write(&big, &data).expect("write");
        let v = s
            .put_file_new("seg/big", &big)
            .expect("put file new")
            .written()
            .expect("created");
        let (stored, seen) = s.get_with_version("seg/big").expect("get").expect("there");
        assert!(stored == data, "multipart object differs");
        assert_eq!(seen, v);
        assert_eq!(
            s.put_file_new("seg/big", &big).expect("again"),
            Conditional::Refused
        );
        assert!(big.exists());
        // The completion's own precondition: the key appears while the parts go up.
        let up = s
            .bucket
            .initiate_multipart_upload("seg/raced", "application/octet-stream")
            .expect("initiate");
        let mut file = std::fs::File::open(&big).expect("open");
        let parts = s
            .upload_parts("seg/raced", &big, &mut file, &up.upload_id)
            .expect("parts");
        assert_eq!(parts.len(), 2);
        s.put_bytes("seg/raced", b"first").expect("put");
        assert_eq!(
            s.complete_new("seg/raced", &big, &up.upload_id, parts)
                .expect("complete"),
            Conditional::Refused
        );
        let _ = s.bucket.abort_upload("seg/raced", &up.upload_id);
        assert_eq!(s.get_bytes("seg/raced").expect("get"), b"first");
        // What a retry that meets its own object compares.
        assert!(matches!(
            s.same_as_file("seg/big", &big),
            Ok(Conditional::Written(w)) if w == v
        ));
        let other = tmp.0.join("other");
        let mut changed = data.clone();
        changed[MULTIPART_THRESHOLD as usize + 10] ^= 1;
        std::fs::write(&other, &changed).expect("write");
        assert!(matches!(
            s.same_as_file("seg/big", &other),
            Ok(Conditional::Refused)
        ));
        assert!(matches!(
            s.same_as_file("seg/none", &other),
            Ok(Conditional::Refused)
        ));
        assert!(matches!(
            s.same_as_bytes("seg/raced", b"first"),
            Ok(Conditional::Written(_))
        ));
        assert!(matches!(
            s.same_as_bytes("seg/raced", b"other"),
            Ok(Conditional::Refused)
        ));
    }

    #[test]
    fn a_retry_that_meets_its_own_write_counts_as_written() {
        let b = TestBucket::new("condretry");
        // The answers of the first and the third PUT are lost, and of the first completion of
        // a multipart upload.
        let (puts, completions) = (AtomicU32::new(0), AtomicU32::new(0));
        let proxy = lossy_proxy::start("127.0.0.1:8333", move |line| {
            if line.starts_with("PUT ") && !line.contains("uploadId=") {
                [0, 2].contains(&puts.fetch_add(1, SeqCst))
            } else {
                line.starts_with("POST ")
                    && line.contains("uploadId=")
                    && completions.fetch_add(1, SeqCst) == 0
            }
        });
        let mut o = options(&b.0, ADMIN);
        o.endpoint = Some(proxy.url.clone());
        o.retry.attempts = 3;
        let s = S3Storage::open(o).expect("open");
        // Stored at the first attempt, its answer lost: the retry's 412 is our own object.
        let v1 = s
            .put_bytes_new("lock", b"mine")
            .expect("create")
            .written()
            .expect("written despite the lost answer");
        assert_eq!(proxy.lost.load(SeqCst), 1);
        let v2 = s
            .put_bytes_if("lock", b"mine, updated", &v1)
            .expect("replace")
            .written()
            .expect("replaced despite the lost answer");
        assert_eq!(proxy.lost.load(SeqCst), 2);
        assert_eq!(
            s.get_with_version("lock").expect("get"),
            Some((b"mine, updated".to_vec(), v2))
        );
        // Another writer's object is still refused.
        assert_eq!(
            s.put_bytes_new("lock", b"theirs").expect("create"),
            Conditional::Refused
        );
        // A multipart upload whose completion's answer is lost.
        let tmp = TempDir::new("s3-cond-retry");
        let big = tmp.0.join("big");
        let data = pattern(MULTIPART_THRESHOLD as usize + 5, 8);
        std::fs::write(&big, &data).expect("write");
        let v = s
            .put_file_new("seg/big", &big)
            .expect("put file new")
            .written()
            .expect("written despite the lost answer");
        assert_eq!(proxy.lost.load(SeqCst), 3);
        assert_eq!(s.get_with_version("seg/big").expect("get"), Some((data, v)));
    }

    #[test]
    fn etags_are_versions() {
        assert_eq!(
            etag_version(" \"abc\" "),
            Some(ObjectVersion("\"abc\"".into()))
        );
        assert_eq!(etag_version("abc"), Some(ObjectVersion("\"abc\"".into())));
        assert_eq!(etag_version(""), None);
        let body = "<CompleteMultipartUploadResult><ETag>&quot;d41d-2&quot;</ETag>\
                    </CompleteMultipartUploadResult>";
        assert_eq!(xml_etag(body), Some(ObjectVersion("\"d41d-2\"".into())));
        assert_eq!(xml_etag("<X/>"), None);
    }

    #[test]
    fn conditional_failures_are_classified() {
        let conflict = "<Error><Code>ConditionalRequestConflict</Code></Error>";
        assert!(matches!(
            classify_conditional("k", S3Error::HttpFailWithBody(409, conflict.into())),
            Attempt::Transient(_)
        ));
        assert!(matches!(
            classify_conditional("k", S3Error::HttpFailWithBody(409, String::new())),
            Attempt::Permanent(_)
        ));
        assert!(is_refusal(&S3Error::HttpFailWithBody(412, String::new())));
    }
}
