//! Conditional writes of the GCS backend ([`crate::repository::storage::conditional`]). The version of an
//! object is its `generation` (a decimal number; never 0).
//!
//! - Create only: `ifGenerationMatch=0`; replace a version: `ifGenerationMatch=<generation>`.
//!   A refused precondition is a 412 answer, [`Conditional::Refused`].
//! - Up to the upload threshold the data goes in one `uploadType=multipart` upload (JSON
//!   metadata and the bytes in one request), not the `uploadType=media` simple upload that
//!   unconditional puts use: fake-gcs-server 1.54 ignores `ifGenerationMatch` on media uploads
//!   and honours it, atomically, on multipart ones; real GCS honours it on both.
//! - Above the threshold: a resumable upload whose session is started with the precondition.
//!   Real GCS checks it when the session starts and again when the last chunk arrives (the
//!   atomic step); fake-gcs-server 1.54 ignores it on resumable uploads, so against the
//!   emulator only the check below holds, and two racing writers of a large file could both
//!   succeed there. Before a create-only resumable upload of a file, one `objects.get` skips
//!   uploading it when the key already exists; an optimisation only on real GCS.
//!
//! A retried multipart upload whose first attempt reached GCS before its answer was lost meets
//! its own object: a 412 after the first attempt is checked by comparing the stored object
//! with ours, and equal bytes count as written. A resumable upload needs no such check: after
//! a failure it asks the session, which reports the object it finalized.

use super::*;
use crate::repository::storage::{Conditional, ObjectVersion};

/// A number that differs between calls (not cryptographic): part of a multipart boundary.
fn boundary_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The `(content type, body)` of a `multipart/related` upload of `data` named `key`, with a
/// boundary that does not occur in `data`.
pub(super) fn multipart_body(metadata: &serde_json::Value, data: &[u8]) -> (String, Vec<u8>) {
    let metadata = metadata.to_string();
    let boundary = (0u32..)
        .map(|i| format!("rmq-backup-{:016x}-{i}", boundary_tag()))
        .find(|b| !data.windows(b.len()).any(|w| w == b.as_bytes()))
        .unwrap_or_default();
    let mut body = Vec::with_capacity(data.len() + metadata.len() + 256);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n\
             --{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/related; boundary={boundary}"), body)
}

/// Written with the generation of an upload's answer; an answer without one is an error.
fn written(ctx: &str, generation: Option<String>) -> std::result::Result<Conditional, Attempt> {
    generation
        .map(|g| Conditional::Written(ObjectVersion(g)))
        .ok_or_else(|| {
            Attempt::Permanent(Error::Storage(format!("{ctx}: answer without generation")))
        })
}

impl GcsBackend {
    /// One `GET ...?alt=media` of `key` with its generation (`x-goog-generation`); `None` when
    /// absent.
    fn get_once(
        &self,
        key: &str,
    ) -> std::result::Result<Option<(Vec<u8>, ObjectVersion)>, Attempt> {
        let ctx = format!("Failed to get {key}");
        let url = format!("{}?alt=media", self.object_url(key));
        let mut resp = self.call(&ctx, http::Request::get(&url), ())?;
        match resp.status().as_u16() {
            200 => {}
            404 => {
                drain(resp);
                return Ok(None);
            }
            _ => return Err(self.status_error(&ctx, resp)),
        }
        let generation = resp
            .headers()
            .get("x-goog-generation")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let Some(generation) = generation else {
            return Err(Attempt::Permanent(Error::Storage(format!(
                "{ctx}: answer without generation"
            ))));
        };
        let mut out = Vec::new();
        resp.body_mut()
            .as_reader()
            .read_to_end(&mut out)
            .map_err(|e| {
                let (transient, reason) = classify_io(&e);
                to_attempt(transient, Error::Storage(format!("{ctx}: {reason}")))
            })?;
        Ok(Some((out, ObjectVersion(generation))))
    }

    /// [`Storage::get_with_version`]: the object and its generation, retried.
    pub(super) fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        retry::run(self.policy, &format!("get {key}"), || self.get_once(key))
    }

    /// One `uploadType=multipart` upload of `data` with `ifGenerationMatch=<generation>`,
    /// retried (see the module doc for a retry that meets its own object).
    fn multipart_upload(&self, key: &str, data: &[u8], generation: u64) -> Result<Conditional> {
        let ctx = format!("Failed to put {key}");
        let url = format!(
            "{}&ifGenerationMatch={generation}",
            self.upload_url("multipart", key)
        );
        let (content_type, body) = multipart_body(&self.metadata(key), data);
        let mut attempt = 0u32;
        retry::run(self.policy, &format!("put {key}"), || {
            attempt += 1;
            let req = http::Request::post(&url).header("content-type", content_type.as_str());
            let mut resp = self.call(&ctx, req, &body[..])?;
            match resp.status().as_u16() {
                200 | 201 => {
                    let v: serde_json::Value = read_json(&mut resp, &ctx)?;
                    written(&ctx, generation_of(&v))
                }
                412 => {
                    drain(resp);
                    if attempt == 1 {
                        return Ok(Conditional::Refused);
                    }
                    Ok(match self.get_once(key)? {
                        Some((stored, v)) if stored == data => Conditional::Written(v),
                        _ => Conditional::Refused,
                    })
                }
                404 => Err(Self::no_such_bucket(key)),
                _ => Err(self.status_error(&ctx, resp)),
            }
        })
    }

    /// The outcome of a conditional resumable upload.
    fn resumable_conditional(
        &self,
        key: &str,
        src: &mut dyn ChunkSource,
        generation: u64,
    ) -> Result<Conditional> {
        match self.resumable_upload(key, src, Some(generation))? {
            Outcome::Stored(g) => {
                written(&format!("Failed to put {key}"), g).map_err(|a| match a {
                    Attempt::Transient(e) | Attempt::Permanent(e) => e,
                })
            }
            Outcome::Refused => Ok(Conditional::Refused),
        }
    }

    /// A write of `data` only while the object has `generation` (0: no object).
    pub(super) fn put_data_conditional(
        &self,
        key: &str,
        data: &[u8],
        generation: u64,
    ) -> Result<Conditional> {
        if data.len() as u64 <= self.upload_threshold {
            self.multipart_upload(key, data, generation)
        } else {
            self.resumable_conditional(key, &mut SliceSource(data), generation)
        }
    }

    /// [`Storage::put_bytes_if`]: the version must be a generation (a positive number).
    pub(super) fn put_bytes_if_impl(
        &self,
        key: &str,
        data: &[u8],
        version: &ObjectVersion,
    ) -> Result<Conditional> {
        match version.0.trim().parse::<u64>() {
            // No object has generation 0 (which would mean "create only").
            Ok(0) => Ok(Conditional::Refused),
            Ok(g) => self.put_data_conditional(key, data, g),
            Err(_) => Err(Error::Storage(format!(
                "Failed to put {key}: invalid object version"
            ))),
        }
    }

    /// [`Storage::put_file_new`]: a multipart upload up to the threshold, else a resumable one
    /// read one chunk at a time.
    pub(super) fn put_file_new_impl(&self, key: &str, path: &Path) -> Result<Conditional> {
        match open_source(path, self.upload_threshold)? {
            UploadSource::Small(data) => self.multipart_upload(key, &data, 0),
            UploadSource::Large(mut src) => {
                if self.head(key)?.is_some() {
                    return Ok(Conditional::Refused);
                }
                self.resumable_conditional(key, &mut src, 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_bodies_frame_the_data() {
        let (ct, body) = multipart_body(&serde_json::json!({ "name": "a/\"b\"" }), b"payload");
        let boundary = ct
            .strip_prefix("multipart/related; boundary=")
            .expect("boundary");
        let text = String::from_utf8(body).expect("utf-8");
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.contains(r#"{"name":"a/\"b\""}"#), "{text}");
        assert!(text.ends_with(&format!("\r\npayload\r\n--{boundary}--\r\n")));
    }
}
