//! [`RawRecord`]: one record as a segment stores it, before decoding: version 1's JSON, or
//! version 2's metadata JSON and raw body (docs/segment-format.md).

use crate::error::Result;
use crate::repository::record::{decode_meta, decode_record, BackupRecord};

/// One record read from a segment, not yet decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawRecord {
    /// Version 1: the BackupRecord JSON (body as an array of numbers).
    Json(Vec<u8>),
    /// Version 2: the metadata JSON (every field but the body) and the body's bytes.
    Parts {
        /// Metadata JSON (`crate::repository::record::encode_meta`).
        meta: Vec<u8>,
        /// The message body as it was.
        body: Vec<u8>,
    },
}

impl RawRecord {
    /// Decodes the record, the body moved (version 2) rather than copied.
    ///
    /// Errors: `Error::Serialization` when the JSON or the metadata is not a valid record.
    pub fn into_record(self) -> Result<BackupRecord> {
        match self {
            RawRecord::Json(json) => decode_record(&json),
            RawRecord::Parts { meta, body } => decode_meta(&meta, body),
        }
    }

    /// Decodes the record from a borrowed raw record (the body copied for version 2).
    ///
    /// Errors: as [`RawRecord::into_record`].
    pub fn decode(&self) -> Result<BackupRecord> {
        match self {
            RawRecord::Json(json) => decode_record(json),
            RawRecord::Parts { meta, body } => decode_meta(meta, body.clone()),
        }
    }

    /// Bytes the record takes in the payload, length prefixes excluded.
    pub fn len(&self) -> usize {
        match self {
            RawRecord::Json(json) => json.len(),
            RawRecord::Parts { meta, body } => meta.len() + body.len(),
        }
    }

    /// True for a version 1 record of no bytes (never valid JSON).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
