//! Conditional writes of the Azure backend ([`crate::repository::storage::conditional`]).
//!
//! - Create only: `If-None-Match: *` on Put Blob, or on Put Block List for an object above the
//!   put threshold (its blocks go up uncommitted, invisible until the commit, which is the
//!   atomic step; a refused upload's blocks are dropped by the service after a week). A Get
//!   Blob Properties before a block upload skips uploading a file whose key already exists; it
//!   is an optimisation only, the precondition decides.
//! - Replace a version: `If-Match: <etag>` on Put Blob (Put Block List above the threshold).
//!   The version is the blob's ETag as the service sends it, quotes included.
//!
//! Refused: 412 `ConditionNotMet`, 409 `BlobAlreadyExists` (create-only on an existing blob),
//! and 404 `BlobNotFound` (a replace of a blob that is gone). Azure and Azurite honour these
//! headers atomically.
//!
//! A retried write whose first attempt reached the service before its answer was lost meets
//! its own blob: a refusal after the first attempt is checked by comparing the stored blob
//! with ours (a file streamed, never all in memory), and equal bytes count as written.

use super::*;
use crate::repository::storage::{Conditional, ObjectVersion};
use std::io::{BufRead, BufReader, Read};

/// What a conditional write requires of the blob.
#[derive(Clone, Copy)]
pub(super) enum Precondition<'a> {
    /// No blob has the key (`If-None-Match: *`).
    Absent,
    /// The blob holds this version (`If-Match`).
    Version(&'a ObjectVersion),
}

impl Precondition<'_> {
    fn header(self) -> (&'static str, String) {
        match self {
            Precondition::Absent => ("if-none-match", "*".into()),
            Precondition::Version(v) => ("if-match", v.0.trim().to_string()),
        }
    }
}

/// What a refused write is compared with when a retry meets an existing blob.
pub(super) enum Ours<'a> {
    Bytes(&'a [u8]),
    File(&'a Path),
}

/// The ETag of an answer.
fn etag_of(resp: &Response) -> Option<ObjectVersion> {
    resp.headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| ObjectVersion(v.to_string()))
}

/// True when a failed conditional write's answer says the precondition did not hold: 412;
/// 409 `BlobAlreadyExists` (or a 409 without a code); 404 `BlobNotFound` for a replace.
fn is_refusal(resp: &Response) -> bool {
    let code = resp
        .headers()
        .get("x-ms-error-code")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    match resp.status().as_u16() {
        412 => true,
        409 => matches!(code, None | Some("BlobAlreadyExists")),
        404 => code == Some("BlobNotFound"),
        _ => false,
    }
}

/// True for [`AzureBlobStorage::get_response`]'s answer to a missing blob.
fn is_not_found(e: &Attempt, key: &str) -> bool {
    matches!(e, Attempt::Permanent(Error::Storage(m)) if *m == format!("Key not found: {key}"))
}

/// A failure to send as an [`Attempt`].
fn send_failure(op: &str, key: &str, e: SendError) -> Attempt {
    match e {
        SendError::Transport(e) => transport_failure(op, key, &e),
        SendError::Token(d, true) => Attempt::Transient(fail(op, key, &d)),
        SendError::Token(d, false) => Attempt::Permanent(fail(op, key, &d)),
    }
}

impl AzureBlobStorage {
    /// One Get Blob of `key` with its ETag; `None` when the blob is absent.
    fn get_once(
        &self,
        key: &str,
    ) -> std::result::Result<Option<(Vec<u8>, ObjectVersion)>, Attempt> {
        let mut resp = match self.get_response(key) {
            Ok(resp) => resp,
            Err(e) if is_not_found(&e, key) => return Ok(None),
            Err(e) => return Err(e),
        };
        let version = etag_of(&resp)
            .ok_or_else(|| Attempt::Permanent(fail("get", key, "answer without ETag")))?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .map_err(|e| transport_failure("get", key, &e))?;
        Ok(Some((body, version)))
    }

    /// [`Storage::get_with_version`]: the blob and its ETag, retried.
    pub(super) fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>> {
        retry::run(self.retry, &format!("Azure get {key}"), || {
            self.get_once(key)
        })
    }

    /// Written when the stored blob holds `ours` (an earlier attempt of this write), else
    /// refused.
    fn same_as(&self, key: &str, ours: &Ours) -> std::result::Result<Conditional, Attempt> {
        let path = match ours {
            Ours::Bytes(data) => {
                return Ok(match self.get_once(key)? {
                    Some((stored, v)) if stored == *data => Conditional::Written(v),
                    _ => Conditional::Refused,
                })
            }
            Ours::File(path) => *path,
        };
        let read_error = |e: &io::Error| {
            Attempt::Permanent(Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(e)
            )))
        };
        let mut local =
            BufReader::with_capacity(1 << 20, File::open(path).map_err(|e| read_error(&e))?);
        let resp = match self.get_response(key) {
            Ok(resp) => resp,
            Err(e) if is_not_found(&e, key) => return Ok(Conditional::Refused),
            Err(e) => return Err(e),
        };
        let version = etag_of(&resp)
            .ok_or_else(|| Attempt::Permanent(fail("get", key, "answer without ETag")))?;
        let mut remote = resp.into_body().into_reader();
        let (mut buf, mut mine) = (vec![0u8; 1 << 20], Vec::new());
        loop {
            let n = match remote.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let detail = format!("connection error: {}", strip_queries(&io_reason(&e)));
                    return Err(Attempt::Transient(fail("get", key, &detail)));
                }
            };
            mine.resize(n, 0);
            if local.read_exact(&mut mine).is_err() || mine[..] != buf[..n] {
                return Ok(Conditional::Refused);
            }
        }
        let at_end = local.fill_buf().map_err(|e| read_error(&e))?.is_empty();
        Ok(if at_end {
            Conditional::Written(version)
        } else {
            Conditional::Refused
        })
    }

    /// Sends `call` (a Put Blob or Put Block List carrying a precondition) with retries:
    /// written with the new ETag, refused, or, after a refusal of a retry, what comparing the
    /// stored blob with `ours` says.
    fn conditional_call(&self, key: &str, call: &Call, ours: Ours) -> Result<Conditional> {
        let mut attempt = 0u32;
        retry::run(self.retry, &format!("Azure put {key}"), || {
            attempt += 1;
            let resp = self.send(call).map_err(|e| send_failure("put", key, e))?;
            if resp.status().is_success() {
                return etag_of(&resp)
                    .map(Conditional::Written)
                    .ok_or_else(|| Attempt::Permanent(fail("put", key, "answer without ETag")));
            }
            if is_refusal(&resp) && !is_container_missing(&resp) {
                return if attempt > 1 {
                    self.same_as(key, &ours)
                } else {
                    Ok(Conditional::Refused)
                };
            }
            Err(status_failure("put", key, resp))
        })
    }

    /// A conditional write of `data`: one Put Blob up to the threshold, else blocks committed
    /// under the precondition.
    pub(super) fn put_data_conditional(
        &self,
        key: &str,
        data: &[u8],
        precondition: Precondition,
    ) -> Result<Conditional> {
        if data.len() <= self.put_threshold {
            let mut call = Call::new("PUT", Some(key));
            call.headers.push(("x-ms-blob-type", "BlockBlob".into()));
            call.headers.push(precondition.header());
            self.lock(key, &mut call);
            call.body = data;
            return self.conditional_call(key, &call, Ours::Bytes(data));
        }
        let block_size = self.block_size_for(data.len() as u64);
        let mut src = data;
        let ids = self.upload_blocks(key, Vec::new(), &mut src, block_size, &|e| {
            Error::Io(format!("Failed to read {key}: {}", io_reason(&e)))
        })?;
        self.commit_conditional(key, &ids, precondition, Ours::Bytes(data))
    }

    /// Put Block List of `ids` under `precondition`.
    pub(super) fn commit_conditional(
        &self,
        key: &str,
        ids: &[String],
        precondition: Precondition,
        ours: Ours,
    ) -> Result<Conditional> {
        let xml = block_list_xml(ids);
        let mut call = block_list_call(key, &xml);
        call.headers.push(precondition.header());
        self.lock(key, &mut call);
        self.conditional_call(key, &call, ours)
    }

    /// [`Storage::put_file_new`]: the file is streamed (one block in memory at a time).
    pub(super) fn put_file_new_impl(&self, key: &str, path: &Path) -> Result<Conditional> {
        let read_error = |e: io::Error| {
            Error::Io(format!(
                "Failed to read {}: {}",
                path.display(),
                io_reason(&e)
            ))
        };
        let mut file = File::open(path).map_err(read_error)?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut first = Vec::new();
        let eof = fill(&mut file, &mut first, self.put_threshold.saturating_add(1))
            .map_err(read_error)?;
        if eof && first.len() <= self.put_threshold {
            let mut call = Call::new("PUT", Some(key));
            call.headers.push(("x-ms-blob-type", "BlockBlob".into()));
            call.headers.push(Precondition::Absent.header());
            self.lock(key, &mut call);
            call.body = &first;
            return self.conditional_call(key, &call, Ours::Bytes(&first));
        }
        if self.head(key)?.is_some() {
            return Ok(Conditional::Refused);
        }
        let block_size = self.block_size_for(len);
        let ids = self.upload_blocks(key, first, &mut file, block_size, &read_error)?;
        self.commit_conditional(key, &ids, Precondition::Absent, Ours::File(path))
    }
}
