//! Blob operations of the Azure backend: Put Blob, block uploads (Put Block + Put Block
//! List, resumed from the committed blocks), reads, and container set-up for tests.

use super::*;
use crate::error::{Error, Result};
use crate::repository::storage::retry::Attempt;
use base64::Engine as _;
use std::io::{self, Read};
use std::time::{SystemTime, UNIX_EPOCH};

impl AzureBlobStorage {
    /// Adds the version-level immutability policy of `storage.object_lock` to a Put Blob or
    /// Put Block List of `key` (`x-ms-immutability-policy-until-date`, RFC 1123, and
    /// `x-ms-immutability-policy-mode`: `Unlocked` for governance, `Locked` for compliance)
    /// when the key is locked ([`crate::repository::storage::object_lock`]).
    pub(super) fn lock(&self, key: &str, call: &mut Call) {
        if let Some(l) = self.lock.as_ref().filter(|l| l.applies_to(key)) {
            let until = UNIX_EPOCH + std::time::Duration::from_millis(l.until_ms().max(0) as u64);
            call.headers.push((
                "x-ms-immutability-policy-until-date",
                auth::http_date(until),
            ));
            let mode = match l.mode {
                crate::config::LockMode::Governance => "Unlocked",
                crate::config::LockMode::Compliance => "Locked",
            };
            call.headers
                .push(("x-ms-immutability-policy-mode", mode.into()));
        }
    }

    /// Puts `data` with one Put Blob.
    pub(super) fn put_blob(&self, key: &str, data: &[u8]) -> Result<()> {
        let mut call = Call::new("PUT", Some(key));
        call.headers.push(("x-ms-blob-type", "BlockBlob".into()));
        self.lock(key, &mut call);
        call.body = data;
        self.request("put", key, &call, |resp| expect_success("put", key, resp))
    }

    /// Uploads `first` followed by the rest of `src` as blocks of `block_size`, then commits the
    /// block list. Only one block is held in memory (plus what `first` holds).
    pub(super) fn put_blocks(
        &self,
        key: &str,
        pending: Vec<u8>,
        src: &mut dyn Read,
        block_size: usize,
        on_read_error: &dyn Fn(io::Error) -> Error,
    ) -> Result<()> {
        let ids = self.upload_blocks(key, pending, src, block_size, on_read_error)?;
        let xml = block_list_xml(&ids);
        let mut call = block_list_call(key, &xml);
        self.lock(key, &mut call);
        self.request("put", key, &call, |resp| expect_success("put", key, resp))
    }

    /// Uploads `pending` followed by the rest of `src` as uncommitted blocks of `block_size`
    /// (Put Block); returns their ids in order. Nothing is visible until they are committed.
    pub(super) fn upload_blocks(
        &self,
        key: &str,
        mut pending: Vec<u8>,
        src: &mut dyn Read,
        block_size: usize,
        on_read_error: &dyn Fn(io::Error) -> Error,
    ) -> Result<Vec<String>> {
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
        Ok(ids)
    }

    /// Block size for an object of `len` bytes: the configured one, raised to stay within the
    /// 50,000-block limit.
    pub(super) fn block_size_for(&self, len: u64) -> usize {
        let needed = len.div_ceil(MAX_BLOCKS);
        self.block_size
            .max(usize::try_from(needed).unwrap_or(usize::MAX))
    }

    /// Starts a Get Blob; a 404 of the blob gives `Key not found: <key>`.
    pub(super) fn get_response(&self, key: &str) -> std::result::Result<Response, Attempt> {
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
    pub(super) fn committed_blocks(&self, key: &str) -> Result<usize> {
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

/// The body of Put Block List committing the blocks `ids` in order.
pub(super) fn block_list_xml(ids: &[String]) -> String {
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
    for id in ids {
        xml.push_str("<Latest>");
        xml.push_str(id);
        xml.push_str("</Latest>");
    }
    xml.push_str("</BlockList>");
    xml
}

/// Put Block List of `key` with the body `xml` (the atomic commit of a block upload).
pub(super) fn block_list_call<'a>(key: &'a str, xml: &'a str) -> Call<'a> {
    let mut call = Call::new("PUT", Some(key));
    call.query.push(("comp", "blocklist".into()));
    call.headers
        .push(("content-type", "application/xml; charset=utf-8".into()));
    call.body = xml.as_bytes();
    call
}

/// Reads from `src` into `buf` until it holds `want` bytes or the source ends; true at the end.
pub(super) fn fill(src: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let missing = want.saturating_sub(buf.len()) as u64;
    if missing == 0 {
        return Ok(false);
    }
    let got = src.take(missing).read_to_end(buf)? as u64;
    Ok(got < missing)
}

/// A number that differs between uploads (time, process and a per-process hash seed): the
/// tag in block ids. Not cryptographic; it only has to differ between concurrent writers.
pub(super) fn upload_tag() -> u64 {
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
