//! Conditional writes: what keeps two runs off one backup (`crate::repository::lock`) and keeps a stored
//! segment from ever being replaced. Each backend maps them to its own precondition:
//!
//! | operation | S3 | Azure Blob | GCS | filesystem | memory |
//! |---|---|---|---|---|---|
//! | create only ([`Storage::put_bytes_new`], [`Storage::put_file_new`]) | `If-None-Match: *` | `If-None-Match: *` | `ifGenerationMatch=0` | `link(2)` of the finished temp file | under its lock |
//! | replace a version ([`Storage::put_bytes_if`]) | `If-Match: <etag>` | `If-Match: <etag>` | `ifGenerationMatch=<generation>` | compare and rename under `flock(2)` | under its lock |
//!
//! A refused precondition is [`Conditional::Refused`], never an error; a backend that cannot
//! tell (an old S3-compatible server ignoring the header) is documented in docs/storage-backends.md "Storage".
//!
//! [`Storage::put_bytes_new`]: super::Storage::put_bytes_new
//! [`Storage::put_file_new`]: super::Storage::put_file_new
//! [`Storage::put_bytes_if`]: super::Storage::put_bytes_if

/// The version of a stored object a conditional replace compares with: its ETag (S3, Azure),
/// its generation (GCS), or a digest of its bytes (filesystem, memory). Opaque to callers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectVersion(pub String);

/// The outcome of a conditional write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conditional {
    /// Written; the object's new version.
    Written(ObjectVersion),
    /// Not written: the precondition did not hold (the key exists, or holds another version).
    Refused,
}

impl Conditional {
    /// The new version when written.
    pub fn written(self) -> Option<ObjectVersion> {
        match self {
            Conditional::Written(v) => Some(v),
            Conditional::Refused => None,
        }
    }
}

/// A version made of the SHA-256 of `data` (filesystem and memory backends).
pub fn digest_version(data: &[u8]) -> ObjectVersion {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(data);
    ObjectVersion(d.iter().map(|b| format!("{b:02x}")).collect())
}
