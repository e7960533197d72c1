//! RBAK segment files (SPEC.md "Segment file (RBAK format)"): a streaming writer that spools to a
//! local file and a streaming reader that verifies a local file before handing out records.
//!
//! Layout (little-endian):
//!
//! ```text
//! 0  "RBAK" | 4 version (1, 2 or 3) | 5 compression (0 none, 1 zstd, 2 lz4) | 6 reserved 0x0000
//! 8  record count u64 | 16 first backed_up_at i64 | 24 last backed_up_at i64     (32 bytes)
//! 32 payload: one zstd frame, one lz4 frame, or raw bytes, holding for each record
//!    version 1: u32 length + that many bytes of BackupRecord JSON
//!    version 2: u32 length + metadata JSON (every field but the body), u32 length + body bytes
//!    version 3: as version 2, the metadata JSON or binary (first byte 0x00)
//! N-8 CRC32 of bytes 0..N-8 | N-4 "KABR"
//! ```
//!
//! docs/segment-format.md describes the versions byte by byte. Every reader here reads each;
//! the writer writes version 1 unless told otherwise ([`SegmentWriter::with_version`]).
//!
//! Memory stays flat whatever the segment size: the writer streams through the compressor into
//! the spool file and the reader decompresses as it iterates. Format violations are
//! `Error::Serialization` with SPEC.md's messages, decompression failures `Error::Compression`,
//! and local file failures `Error::Io`.

mod checked;
mod raw;
mod reader;
#[cfg(test)]
mod tests;
mod writer;
mod zstd_sink;

pub use raw::RawRecord;
pub use reader::{Records, SegmentReader, MAX_RECORD_BYTES};
pub use writer::{zstd_workers, FinishedSegment, SegmentWriter, LARGE_BODY_BYTES};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Magic at offset 0.
pub const MAGIC: &[u8; 4] = b"RBAK";
/// End magic, the last 4 bytes.
pub const END_MAGIC: &[u8; 4] = b"KABR";
/// Segment format version 1 (SPEC.md "Segment file"): what this tool writes by default, and
/// what other readers of the format read.
pub const VERSION: u8 = 1;
/// Segment format version 2 (docs/segment-format.md): each record's metadata as JSON, then
/// its body as raw bytes (`backup.segment_version: 2`).
pub const VERSION_2: u8 = 2;
/// Segment format version 3 (docs/segment-format.md): version 2's records, where a message
/// read over AMQP 0-9-1 keeps its properties as the broker sent them, in binary metadata
/// (`backup.segment_version: 3`).
pub const VERSION_3: u8 = 3;
/// Header size in bytes.
pub const HEADER_LEN: u64 = 32;
/// Footer size in bytes (CRC32 + end magic).
pub const FOOTER_LEN: u64 = 8;

const IO_BUF: usize = 256 * 1024;

/// Payload compression (SPEC.md "backup" `compression`; lowercase in YAML and JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Stored as is (code 0).
    None,
    /// One zstd frame (code 1). The default.
    #[default]
    Zstd,
    /// One lz4 frame (code 2).
    Lz4,
}

impl Compression {
    /// The compression of a stored file, from its extension (`.zst`, `.lz4`, none), before
    /// the `.age` of an encrypted file (`crate::repository::encryption::EXTENSION`).
    pub fn from_key(key: &str) -> Compression {
        let key = key.strip_suffix(".age").unwrap_or(key);
        if key.ends_with(".zst") {
            Compression::Zstd
        } else if key.ends_with(".lz4") {
            Compression::Lz4
        } else {
            Compression::None
        }
    }
}

impl From<crate::config::CompressionKind> for Compression {
    fn from(kind: crate::config::CompressionKind) -> Self {
        match kind {
            crate::config::CompressionKind::Zstd => Compression::Zstd,
            crate::config::CompressionKind::Lz4 => Compression::Lz4,
            crate::config::CompressionKind::None => Compression::None,
        }
    }
}

impl Compression {
    /// The header's compression byte: 0 none, 1 zstd, 2 lz4.
    pub fn code(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zstd => 1,
            Compression::Lz4 => 2,
        }
    }

    /// The compression of a header byte, `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<Compression> {
        match code {
            0 => Some(Compression::None),
            1 => Some(Compression::Zstd),
            2 => Some(Compression::Lz4),
            _ => None,
        }
    }

    /// File extension for storage keys (SPEC.md "Storage layout"): `.zst`, `.lz4` or empty.
    pub fn extension(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Zstd => ".zst",
            Compression::Lz4 => ".lz4",
        }
    }

    /// The lowercase name (`none`, `zstd`, `lz4`).
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
        }
    }
}

/// The decoded 32-byte header of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Format version ([`VERSION`], [`VERSION_2`] or [`VERSION_3`] once a reader accepted the
    /// file).
    pub version: u8,
    /// Payload compression.
    pub compression: Compression,
    /// Number of records in the payload.
    pub record_count: u64,
    /// backed_up_at (epoch ms) of the first record; 0 when there is none.
    pub first_timestamp: i64,
    /// backed_up_at (epoch ms) of the last record; 0 when there is none.
    pub last_timestamp: i64,
}

impl SegmentHeader {
    /// The 32 header bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut h = [0u8; 32];
        h[0..4].copy_from_slice(MAGIC);
        h[4] = self.version;
        h[5] = self.compression.code();
        h[8..16].copy_from_slice(&self.record_count.to_le_bytes());
        h[16..24].copy_from_slice(&self.first_timestamp.to_le_bytes());
        h[24..32].copy_from_slice(&self.last_timestamp.to_le_bytes());
        h
    }
}

pub(crate) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    // A full spool disk is a storage matter for the operator: say which path.
    if e.raw_os_error() == Some(28) {
        return Error::Storage(format!(
            "{what} {}: No space left on device (the spool directory, RMQ_BACKUP_SPOOL_DIR)",
            path.display()
        ));
    }
    Error::Io(format!("{what} {}: {e}", path.display()))
}

/// Lowercase hex SHA-256 of a whole file, read in 256 KiB chunks.
///
/// Errors: `Error::Io` when the file cannot be opened or read.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|e| io_err("Failed to open", path, e))?;
    sha256_open(&mut file, path)
}

/// Lowercase hex SHA-256 of the file open as `file` (named `path` in messages), from where it
/// stands to its end.
///
/// Errors: `Error::Io` when it cannot be read.
pub fn sha256_open(file: &mut File, path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("Failed to read", path, e)),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hex_lower(&hasher.finalize()))
}

/// Lowercase hex of bytes.
pub fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

pub(crate) fn ser(msg: impl Into<String>) -> Error {
    Error::Serialization(msg.into())
}
