//! Uploads to GCS: one simple upload for small objects, resumable sessions in aligned chunks
//! for large ones (resumed from the bytes the server says it has).

use super::*;
use crate::error::{Error, Result};
use crate::repository::storage::io_reason;
use crate::repository::storage::retry::{self, Attempt};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use ureq::http;

/// What a resumable-upload request left behind.
pub(super) enum Step {
    /// The object exists; its size and generation as GCS reports them.
    Done(Option<u64>, Option<String>),
    /// GCS holds the first `n` bytes; send the rest from there.
    Next(u64),
    /// The upload's `ifGenerationMatch` did not hold (412).
    Refused,
}

/// The outcome of an upload that may carry a precondition.
pub(super) enum Outcome {
    /// Stored; the object's generation when the answer gave it.
    Stored(Option<String>),
    /// The precondition did not hold.
    Refused,
}

/// The `generation` of an object resource (a decimal string in the JSON API; a number is
/// accepted).
pub(super) fn generation_of(v: &serde_json::Value) -> Option<String> {
    match v.get("generation")? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => n.as_u64().map(|n| n.to_string()),
        _ => None,
    }
}

/// Bytes of an upload, fetched chunk by chunk.
pub(super) trait ChunkSource {
    /// Total size in bytes.
    fn total(&self) -> u64;
    /// The bytes `[start, start + len)`.
    fn chunk(&mut self, start: u64, len: usize) -> Result<&[u8]>;
}

pub(super) struct SliceSource<'a>(pub(super) &'a [u8]);

impl ChunkSource for SliceSource<'_> {
    fn total(&self) -> u64 {
        self.0.len() as u64
    }
    fn chunk(&mut self, start: u64, len: usize) -> Result<&[u8]> {
        let start = start as usize;
        Ok(&self.0[start..start + len])
    }
}

/// A local file to upload, opened by [`open_source`].
pub(super) enum UploadSource<'a> {
    /// At most the upload threshold: read whole, for one request.
    Small(Vec<u8>),
    /// Larger: read one chunk at a time by a resumable upload.
    Large(FileSource<'a>),
}

/// Opens the local file `path` for an upload: read whole when it has at most `threshold`
/// bytes, else as a [`FileSource`].
///
/// Errors: `IO error: Failed to read <path>: <reason>` ([`source_read_error`]).
pub(super) fn open_source(path: &Path, threshold: u64) -> Result<UploadSource<'_>> {
    let mut file = File::open(path).map_err(|e| source_read_error(path, &e))?;
    let total = file
        .metadata()
        .map_err(|e| source_read_error(path, &e))?
        .len();
    if total <= threshold {
        let mut data = Vec::with_capacity(total as usize);
        (&mut file)
            .take(total)
            .read_to_end(&mut data)
            .map_err(|e| source_read_error(path, &e))?;
        return Ok(UploadSource::Small(data));
    }
    Ok(UploadSource::Large(FileSource {
        file,
        path,
        total,
        buf: Vec::new(),
        buf_start: None,
    }))
}

/// A file read one chunk at a time into one reused buffer.
pub(super) struct FileSource<'a> {
    pub(super) file: File,
    pub(super) path: &'a Path,
    pub(super) total: u64,
    pub(super) buf: Vec<u8>,
    /// Offset of `buf` in the file, when it holds data.
    pub(super) buf_start: Option<u64>,
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

pub(super) fn source_read_error(path: &Path, e: &io::Error) -> Error {
    Error::Io(format!(
        "Failed to read {}: {}",
        path.display(),
        io_reason(e)
    ))
}

/// The end of a `Range: bytes=0-<last>` header plus one; no header means nothing is stored.
pub(super) fn persisted_bytes(resp: &http::Response<ureq::Body>) -> Option<u64> {
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

impl GcsBackend {
    /// One simple upload (`uploadType=media`) of `data`.
    /// With a retention to set ([`Self::locks`]), one `uploadType=multipart` upload instead,
    /// the object resource beside the data.
    pub(super) fn simple_upload(&self, key: &str, data: &[u8]) -> Result<()> {
        let ctx = format!("Failed to put {key}");
        let locked = self.locks(key);
        let url = self.upload_url(if locked { "multipart" } else { "media" }, key);
        let (content_type, body) = if locked {
            let (ct, body) = super::conditional::multipart_body(&self.metadata(key), data);
            (ct, std::borrow::Cow::Owned(body))
        } else {
            (
                "application/octet-stream".to_string(),
                std::borrow::Cow::Borrowed(data),
            )
        };
        retry::run(self.policy, &format!("put {key}"), || {
            let req = http::Request::post(&url).header("content-type", content_type.as_str());
            let resp = self.call(&ctx, req, &body[..])?;
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

    /// Starts a resumable upload session of `total` bytes, with `ifGenerationMatch` when
    /// `if_generation` is given; returns its session URL (a secret: never put it in a
    /// message), or `None` when GCS refuses the precondition already (412).
    pub(super) fn start_session(
        &self,
        key: &str,
        ctx: &str,
        total: u64,
        if_generation: Option<u64>,
    ) -> Result<Option<String>> {
        let mut url = self.upload_url("resumable", key);
        if let Some(g) = if_generation {
            url.push_str(&format!("&ifGenerationMatch={g}"));
        }
        retry::run(self.policy, &format!("put {key}"), || {
            let req = http::Request::post(&url)
                .header("content-type", "application/json; charset=UTF-8")
                .header("x-upload-content-type", "application/octet-stream")
                .header("x-upload-content-length", total.to_string());
            let resp = self.call(ctx, req, self.metadata(key).to_string().as_bytes())?;
            match resp.status().as_u16() {
                200 | 201 => {
                    let location = resp
                        .headers()
                        .get("location")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    drain(resp);
                    match location {
                        Some(l) if l.starts_with('/') => Ok(Some(format!("{}{l}", self.base))),
                        Some(l) => Ok(Some(l)),
                        None => Err(Attempt::Permanent(Error::Storage(format!(
                            "{ctx}: no upload session in the answer"
                        )))),
                    }
                }
                404 => Err(Self::no_such_bucket(key)),
                412 if if_generation.is_some() => {
                    drain(resp);
                    Ok(None)
                }
                _ => Err(self.status_error(ctx, resp)),
            }
        })
    }

    /// Reads the answer to a chunk or a status query of a resumable upload.
    pub(super) fn session_step(
        &self,
        ctx: &str,
        mut resp: http::Response<ureq::Body>,
    ) -> std::result::Result<Step, Attempt> {
        match resp.status().as_u16() {
            200 | 201 => {
                let v: serde_json::Value = read_json(&mut resp, ctx)?;
                Ok(Step::Done(size_of(&v), generation_of(&v)))
            }
            308 => {
                let n = persisted_bytes(&resp).ok_or_else(|| {
                    Attempt::Permanent(Error::Storage(format!("{ctx}: invalid Range answer")))
                })?;
                drain(resp);
                Ok(Step::Next(n))
            }
            412 => {
                drain(resp);
                Ok(Step::Refused)
            }
            _ => Err(self.status_error(ctx, resp)),
        }
    }

    /// Uploads `src` through a resumable session, one chunk at a time; with
    /// `ifGenerationMatch` when `if_generation` is given (real GCS checks it when the session
    /// starts and when the last chunk arrives; fake-gcs-server 1.54 ignores it on resumable
    /// uploads).
    pub(super) fn resumable_upload(
        &self,
        key: &str,
        src: &mut dyn ChunkSource,
        if_generation: Option<u64>,
    ) -> Result<Outcome> {
        let ctx = format!("Failed to put {key}");
        let total = src.total();
        // A status query makes fake-gcs-server 1.54 finish the object with what it holds
        // (real GCS answers 308 and keeps the session): such an upload starts again, once.
        let mut restarted = false;
        loop {
            match self.resumable_session(key, src, if_generation, &ctx)? {
                Err(size) if !restarted => {
                    log::warn!(
                        "{key}: the upload session ended early with {size} of {total} bytes; uploading again in a new session"
                    );
                    restarted = true;
                }
                Err(size) => {
                    return Err(Error::Storage(format!(
                        "{ctx}: stored object has {size} of {total} bytes"
                    )))
                }
                Ok(outcome) => return Ok(outcome),
            }
        }
    }

    /// One resumable session of [`Self::resumable_upload`]; `Ok(Err(size))` when the session
    /// ended with an object of `size` bytes short of the file.
    fn resumable_session(
        &self,
        key: &str,
        src: &mut dyn ChunkSource,
        if_generation: Option<u64>,
        ctx: &str,
    ) -> Result<std::result::Result<Outcome, u64>> {
        let ctx = ctx.to_string();
        let what = format!("put {key}");
        let total = src.total();
        let Some(session) = self.start_session(key, &ctx, total, if_generation)? else {
            return Ok(Ok(Outcome::Refused));
        };
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
                Step::Done(Some(size), _) if size < total => return Ok(Err(size)),
                Step::Done(Some(size), _) if size != total => {
                    return Err(Error::Storage(format!(
                        "{ctx}: stored object has {size} of {total} bytes"
                    )))
                }
                Step::Done(_, generation) => return Ok(Ok(Outcome::Stored(generation))),
                Step::Refused => return Ok(Ok(Outcome::Refused)),
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
}
