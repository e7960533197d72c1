//! Checking a segment in the same pass that decodes it (issue 38, item 5: what is checked is
//! what is read). [`Input`] is the file under the decompressor: every byte it hands on goes
//! into the CRC32 (header and payload) and the SHA-256 (the whole file) as it is read, and
//! [`Input::settle`] reads the rest of the file and the footer through the same sums once the
//! records are read. A writer that changes the file meanwhile changes what is hashed as well
//! as what is decoded, so the check fails for exactly the bytes the records came from.

use super::{hex_lower, io_err, ser, END_MAGIC, FOOTER_LEN, IO_BUF};
use crate::error::Result;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The running checksums of a file read from its start.
pub(super) struct Sums {
    crc: crc32fast::Hasher,
    sha: Option<Sha256>,
    /// Bytes hashed so far (the file's offset).
    pos: u64,
    /// The file's size when it was opened: the CRC32 covers all but its last 8 bytes.
    len: u64,
    /// The SHA-256 the manifest records (lowercase hex), if checked.
    expected: Option<String>,
}

impl Sums {
    /// Sums for a file of `len` bytes; `sha256`: the digest its bytes must have.
    pub(super) fn new(len: u64, sha256: Option<&str>) -> Sums {
        Sums {
            crc: crc32fast::Hasher::new(),
            sha: sha256.map(|_| Sha256::new()),
            pos: 0,
            len,
            expected: sha256.map(str::to_string),
        }
    }

    /// Takes the next `bytes` of the file.
    pub(super) fn update(&mut self, bytes: &[u8]) {
        let crc_left = (self.len - FOOTER_LEN).saturating_sub(self.pos);
        let c = bytes
            .len()
            .min(usize::try_from(crc_left).unwrap_or(usize::MAX));
        self.crc.update(&bytes[..c]);
        if let Some(sha) = &mut self.sha {
            sha.update(bytes);
        }
        self.pos += bytes.len() as u64;
    }
}

/// A segment file read from its start, through its [`Sums`] (`None` when it was verified
/// before: then it is read as it is).
pub(super) struct Input {
    pub(super) file: File,
    pub(super) sums: Option<Sums>,
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        if let Some(sums) = &mut self.sums {
            sums.update(&buf[..n]);
        }
        Ok(n)
    }
}

impl Input {
    /// Reads what the decoder left of the payload, then the footer, through the sums, and
    /// checks them: end magic, CRC32, SHA-256. Nothing to do without sums.
    ///
    /// Errors (`Error::Serialization`): `Segment file ended after {n} of its {len} bytes while
    /// it was read`, `Invalid segment end magic bytes`, `CRC32 mismatch: expected {stored}, got
    /// {computed}`, `SHA-256 mismatch: expected {manifest}, got {file's}`; `Error::Io` when it
    /// cannot be read.
    pub(super) fn settle(mut self, path: &Path) -> Result<()> {
        let Some(len) = self.sums.as_ref().map(|s| s.len) else {
            return Ok(());
        };
        let mut buf = vec![0u8; IO_BUF];
        let mut footer = [0u8; FOOTER_LEN as usize];
        loop {
            let pos = self.sums.as_ref().map_or(len, |s| s.pos);
            if pos >= len {
                break;
            }
            let want = usize::try_from(len - pos)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = match self.read(&mut buf[..want]) {
                Ok(0) => {
                    return Err(ser(format!(
                        "Segment file ended after {pos} of its {len} bytes while it was read"
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("Failed to read", path, e)),
            };
            // The footer: the last 8 bytes of the file, wherever a read ends.
            let end = pos + n as u64;
            if end > len - FOOTER_LEN {
                let from = (len - FOOTER_LEN).saturating_sub(pos) as usize;
                let at = (pos + from as u64 - (len - FOOTER_LEN)) as usize;
                footer[at..at + n - from].copy_from_slice(&buf[from..n]);
            }
        }
        let Some(sums) = self.sums else {
            return Ok(());
        };
        if &footer[4..8] != END_MAGIC {
            return Err(ser("Invalid segment end magic bytes"));
        }
        let stored = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]);
        let computed = sums.crc.finalize();
        if stored != computed {
            return Err(ser(format!(
                "CRC32 mismatch: expected {stored}, got {computed}"
            )));
        }
        if let (Some(expected), Some(sha)) = (sums.expected, sums.sha) {
            let got = hex_lower(&sha.finalize());
            if got != expected {
                return Err(ser(format!(
                    "SHA-256 mismatch: expected {expected}, got {got}"
                )));
            }
        }
        Ok(())
    }
}
