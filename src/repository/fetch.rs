//! Reading what a backup stored: the one place where a stored segment is opened for reading
//! (restore, `cat`, `validate --deep`, the resume of a stream backup), so that every reader
//! checks and decrypts the same way.
//!
//! What is checked is what is read (issue 38, item 5): every byte of a stored segment is read
//! once, and the bytes hashed are the bytes used, as [`Check`] says:
//!
//! - [`Check::AsRead`] (`validate --deep`, `cat`, a stream's resume): the segment is opened
//!   where it lies when the storage keeps it as a local file (the filesystem backend,
//!   `Storage::open_local`: never written, moved or removed here), else fetched to a spool
//!   file, and its CRC32 and SHA-256 are computed in the pass that decodes its records
//!   (`SegmentReader::stream`): a writer that changes the file meanwhile fails the check of
//!   the very bytes the records came from, which ends the records with the error.
//! - [`Check::First`] (restore): the segment is fetched into the spool (0700, this process's
//!   own) from every backend, checked there (`SegmentReader::verify`), then read there: no
//!   record is published before its whole segment checked out, and nobody else can change the
//!   file between the check and the read.
//!
//! An encrypted segment (`SegmentMetadata::encryption`, docs/encryption.md "Encryption at
//! rest") is hashed as it is decrypted (age authenticates every 64 KiB chunk and the header, so
//! a wrong key or an altered byte fails there too) into a plaintext spool file, then read as
//! its check says. The spool files are removed when the [`FetchedSegment`] is dropped, and on
//! every error.

use crate::error::{Error, Result};
use crate::repository::encryption::{self, Identities};
use crate::repository::manifest::{Manifest, SegmentMetadata};
use crate::repository::segment::{io_err, SegmentReader};
use crate::repository::storage::Storage;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A fetched, verified segment, ready to iterate. Keep `files` alive while reading: its
/// spool files go when it is dropped.
pub struct FetchedSegment {
    /// The verified segment.
    pub reader: SegmentReader,
    /// Its spool files (the stored file, and the plaintext of an encrypted one).
    pub files: SpoolFiles,
}

/// Spool files removed on drop.
pub struct SpoolFiles(Vec<PathBuf>);

impl Drop for SpoolFiles {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Files named in a refusal message before "and N more".
const NAMED: usize = 10;

/// Checks, before anything of `manifest`'s backup is read or published, that `keys` open what
/// this reader will read of it: `segments` (those of the queues and time window it reads),
/// and the definitions export when `definitions`. An unencrypted backup needs no identity
/// (and ignores any given).
///
/// A backup is encrypted when its manifest says so at the top or for any file. Then every
/// file read must be stored encrypted (a file in clear was not written by this backup:
/// anyone who can write to the storage can put one there), and one of `keys` must be among
/// the recipients the file was encrypted to: a segment's own `recipients`, else (segments
/// written before they were recorded, and the definitions) the manifest's
/// `encryption.recipients`. An X25519 identity opens exactly what was encrypted to its
/// public key, so this proves, without fetching anything, that no file will fail for the key
/// after others were published; a file that does not match its header still fails when it
/// is fetched ([`fetch_segment`]).
///
/// Errors (`Encryption error:`, exit 1): `backup {id} is encrypted (age) and no identity was
/// given: ...`; `backup {id} is encrypted, but {n} file(s) it lists are stored unencrypted:
/// {keys}: refused ...`; `none of the identities in {source} (public keys ...) is a recipient
/// of backup {id} (encrypted to ...): wrong identity` when they open none of the files;
/// `the identities in {source} (public keys ...) cannot open {n} of the {total} file(s) this
/// reads of backup {id}: {key} (encrypted to ...), ...: wrong identity` when they open some;
/// an unknown scheme.
pub fn check_readable<'m>(
    manifest: &'m Manifest,
    keys: Option<&Identities>,
    segments: impl IntoIterator<Item = &'m SegmentMetadata>,
    definitions: bool,
) -> Result<()> {
    let id = &manifest.backup_id;
    let encrypted = manifest.encryption.is_some()
        || manifest
            .queues
            .iter()
            .flat_map(|q| &q.segments)
            .any(|s| s.encryption.is_some())
        || manifest
            .definitions
            .as_ref()
            .is_some_and(|d| d.encryption.is_some());
    if !encrypted {
        return Ok(());
    }
    if let Some(info) = &manifest.encryption {
        encryption::check_scheme(info, id)?;
    }
    let keys = keys.ok_or_else(|| encryption::missing_identity(&format!("backup {id}")))?;
    let mut files: Vec<Stored<'m>> = segments
        .into_iter()
        .map(|s| Stored {
            key: &s.key,
            encryption: s.encryption.as_deref(),
            recipients: s.recipients.as_deref(),
        })
        .collect();
    if let Some(d) = manifest.definitions.as_ref().filter(|_| definitions) {
        files.push(Stored {
            key: &d.key,
            encryption: d.encryption.as_deref(),
            recipients: None,
        });
    }
    let top = manifest
        .encryption
        .as_ref()
        .map_or(&[][..], |i| &i.recipients[..]);
    refusal(id, &files, top, keys).map_or(Ok(()), Err)
}

/// A file a reader will read, as the manifest records it.
#[derive(Debug, Clone, Copy)]
struct Stored<'a> {
    key: &'a str,
    encryption: Option<&'a str>,
    /// Its own recipients (segments written since they are recorded).
    recipients: Option<&'a [String]>,
}

/// Why `keys` may not read `files` of the encrypted backup `id` (see [`check_readable`]);
/// `top`: the manifest's `encryption.recipients`. `None` when they may.
fn refusal(id: &str, files: &[Stored], top: &[String], keys: &Identities) -> Option<Error> {
    if let Some(f) = files
        .iter()
        .find(|f| f.encryption.is_some_and(|e| e != encryption::SCHEME))
    {
        return Some(Error::Encryption(format!(
            "{} is stored with encryption {:?}, which this version does not read",
            f.key,
            f.encryption.unwrap_or_default()
        )));
    }
    let plain: Vec<&str> = files
        .iter()
        .filter(|f| f.encryption.is_none())
        .map(|f| f.key)
        .collect();
    if !plain.is_empty() {
        return Some(Error::Encryption(format!(
            "backup {id} is encrypted, but {} file(s) it lists are stored unencrypted: {}: refused (anyone who can write to the storage can put a file there)",
            plain.len(),
            named(plain.iter().map(|k| k.to_string()).collect())
        )));
    }
    let closed: Vec<(&str, &[String])> = files
        .iter()
        .map(|f| (f.key, f.recipients.unwrap_or(top)))
        .filter(|(_, to)| !keys.opens(to))
        .collect();
    if closed.is_empty() {
        return None;
    }
    let mine = keys.public_keys().join(", ");
    let to = |r: &[String]| match r {
        [] => "no recipient recorded".to_string(),
        r => r.join(", "),
    };
    if closed.len() == files.len() {
        let mut all: Vec<&String> = Vec::new();
        for r in top.iter().chain(closed.iter().flat_map(|(_, r)| r.iter())) {
            if !all.contains(&r) {
                all.push(r);
            }
        }
        return Some(Error::Encryption(format!(
            "none of the identities in {} (public keys {mine}) is a recipient of backup {id} (encrypted to {}): wrong identity",
            keys.source(),
            if all.is_empty() {
                "no recipient recorded".to_string()
            } else {
                all.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            }
        )));
    }
    Some(Error::Encryption(format!(
        "the identities in {} (public keys {mine}) cannot open {} of the {} file(s) this reads of backup {id}: {}: wrong identity (the backup was written to other recipients in part: a rerun or a part with other keys)",
        keys.source(),
        closed.len(),
        files.len(),
        named(
            closed
                .iter()
                .map(|(k, r)| format!("{k} (encrypted to {})", to(r)))
                .collect()
        )
    )))
}

/// The first [`NAMED`] of `items`, comma-separated, then how many more there are.
fn named(items: Vec<String>) -> String {
    let more = items.len().saturating_sub(NAMED);
    let mut out = items.into_iter().take(NAMED).collect::<Vec<_>>().join(", ");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// How a reader wants a segment checked (issue 38, item 5: what is checked is what is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// In the pass that reads its records ([`SegmentReader::stream`]): each byte read once,
    /// a filesystem storage's file read in place; a failed check is the last item of the
    /// records, after the records read before it. For readers whose verdict comes at the end
    /// of a segment: `validate --deep`, `cat` (whose output then ends with the error, exit 1),
    /// a stream's resume.
    AsRead,
    /// Before any record is handed out, on a private copy: the stored file fetched into the
    /// spool (0700, this process's) even from a filesystem storage, checked there, then read
    /// there. For a restore, which publishes each record as it comes: what it publishes is
    /// what was checked, whoever else can write to the repository.
    First,
}

/// Fetches `segment` to the spool file `path` (or, with [`Check::AsRead`], opens it in place:
/// see the module's doc) and checks it as `check` says; `keys` decrypt an encrypted segment,
/// whose SHA-256 is computed as it is decrypted (one pass over the stored bytes) into its
/// plaintext beside `path` (`<path>.plain`).
///
/// Errors (messages without the key; the caller names the segment): the storage's;
/// `Serialization error:` for a RBAK file that does not check out (magic, CRC32, ...) and
/// `SHA-256 mismatch: expected {manifest}, got {file}`; `Encryption error: {key} ...` for an
/// encrypted segment without `keys`, with the wrong ones, or altered (a MAC that fails);
/// `Error::Io` for spool files. With [`Check::AsRead`], the checks after the header come from
/// the records.
pub fn fetch_segment(
    storage: &dyn Storage,
    path: &Path,
    segment: &SegmentMetadata,
    keys: Option<&Identities>,
    check: Check,
) -> Result<FetchedSegment> {
    let mut files = SpoolFiles(Vec::new());
    // A backend that keeps objects as local files (the filesystem) is read in place when the
    // check comes with the read: never copied, moved or removed.
    let local = match check {
        Check::AsRead => storage.open_local(&segment.key)?,
        Check::First => None,
    };
    let (stored, stored_path) = match local {
        Some(local) => local,
        None => {
            files.0.push(path.to_path_buf());
            storage.get_to_file(&segment.key, path)?;
            let file = std::fs::File::open(path).map_err(|e| io_err("Failed to open", path, e))?;
            (file, path.to_path_buf())
        }
    };
    let reader = match segment.encryption.as_deref() {
        None => match check {
            Check::AsRead => SegmentReader::stream(stored, &stored_path, Some(&segment.checksum))?,
            // CRC32 and SHA-256 in one pass over the private copy, then its records.
            Check::First => SegmentReader::verify(stored, &stored_path, Some(&segment.checksum))?,
        },
        Some(encryption::SCHEME) => {
            let plain = suffixed(path, ".plain");
            files.0.push(plain.clone());
            decrypt_checked(stored, &stored_path, &plain, segment, keys)?;
            // Only the plaintext is read from here on; a spool copy of the stored file goes.
            if stored_path == path {
                let _ = std::fs::remove_file(path);
            }
            // The plaintext is this process's own file: read as the check asks all the same.
            let file =
                std::fs::File::open(&plain).map_err(|e| io_err("Failed to open", &plain, e))?;
            match check {
                Check::AsRead => SegmentReader::stream(file, &plain, None)?,
                Check::First => SegmentReader::verify(file, &plain, None)?,
            }
        }
        Some(other) => {
            return Err(Error::Encryption(format!(
                "{} is stored with encryption {other:?}, which this version does not read",
                segment.key
            )))
        }
    };
    Ok(FetchedSegment { reader, files })
}

/// `path` with `suffix` appended.
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// A reader that hashes what it hands on (SHA-256).
struct Hashing<R> {
    inner: R,
    sha: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: Read> Hashing<R> {
    /// Reads the rest through the hash and returns its lowercase hex digest.
    fn finish(mut self, path: &Path) -> Result<String> {
        std::io::copy(&mut self, &mut std::io::sink())
            .map_err(|e| io_err("Failed to read", path, e))?;
        Ok(crate::repository::segment::hex_lower(&self.sha.finalize()))
    }
}

/// Decrypts the stored age file `stored` (named `stored_path`) into `plain`, hashing its bytes
/// as they are decrypted: one read of the stored bytes, so the file checked against the
/// manifest's SHA-256 is the file decrypted. A SHA-256 that does not match is the error,
/// before a decryption error it causes (age authenticates every chunk and the header: a wrong
/// key or an altered byte fails there too).
fn decrypt_checked(
    stored: std::fs::File,
    stored_path: &Path,
    plain: &Path,
    segment: &SegmentMetadata,
    keys: Option<&Identities>,
) -> Result<()> {
    let mut input = Hashing {
        inner: stored,
        sha: Sha256::new(),
    };
    let mismatch = |sha: String| {
        Error::Serialization(format!(
            "SHA-256 mismatch: expected {}, got {sha}",
            segment.checksum
        ))
    };
    let mut head = Vec::with_capacity(encryption::MAGIC.len());
    Read::by_ref(&mut input)
        .take(encryption::MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_err("Failed to read", stored_path, e))?;
    let age = head == encryption::MAGIC;
    let decrypted = match keys {
        // The stored bytes first: a shallow validate proves the same without the key.
        None => Err(encryption::missing_identity(&segment.key)),
        Some(_) if !age => Err(Error::Encryption(format!(
            "{}: not an age file, though the manifest says it is encrypted: it was replaced or altered; refused",
            segment.key
        ))),
        Some(keys) => keys.decrypt_open(
            std::io::Cursor::new(head).chain(&mut input),
            plain,
            &segment.key,
        ),
    };
    let sha = input.finish(stored_path)?;
    if sha != segment.checksum {
        return Err(mismatch(sha));
    }
    decrypted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (Identities, String) {
        let (secret, public) = encryption::generate();
        (Identities::parse(&secret, "id.txt").unwrap(), public)
    }

    fn file<'a>(key: &'a str, recipients: Option<&'a [String]>) -> Stored<'a> {
        Stored {
            key,
            encryption: Some(encryption::SCHEME),
            recipients,
        }
    }

    #[test]
    fn every_file_read_must_open_with_the_identity() {
        let (keys, mine) = ids();
        let (_, other) = encryption::generate();
        let (mine, other) = (vec![mine], vec![other]);
        let both = vec![other[0].clone(), mine[0].clone()];
        // Own lists decide; the manifest's list is the fallback of files without one.
        let ok = [
            file("a", Some(&mine)),
            file("b", Some(&both)),
            file("c", None),
        ];
        assert!(refusal("b1", &ok, &both, &keys).is_none());
        assert!(refusal("b1", &[], &other, &keys).is_none());
        // A part written to another key: named, with what it was encrypted to.
        let mixed = [file("a", Some(&mine)), file("b", Some(&other))];
        let e = refusal("b1", &mixed, &both, &keys).unwrap().to_string();
        assert!(
            e.starts_with("Encryption error: the identities in id.txt (public keys ")
                && e.contains(&format!(
                    "cannot open 1 of the 2 file(s) this reads of backup b1: b (encrypted to {}): wrong identity",
                    other[0]
                )),
            "{e}"
        );
        // A file without its own list falls back to the manifest's, which lacks the key.
        let e = refusal(
            "b1",
            &[file("a", Some(&mine)), file("c", None)],
            &other,
            &keys,
        )
        .unwrap()
        .to_string();
        assert!(
            e.contains("cannot open 1 of the 2") && e.contains(" c (encrypted to "),
            "{e}"
        );
        // Opens nothing: the wrong identity, every key named once.
        let e = refusal(
            "b1",
            &[file("b", Some(&other)), file("c", None)],
            &other,
            &keys,
        )
        .unwrap()
        .to_string();
        assert_eq!(
            e,
            format!(
                "Encryption error: none of the identities in id.txt (public keys {}) is a recipient of backup b1 (encrypted to {}): wrong identity",
                mine[0], other[0]
            )
        );
        let e = refusal("b1", &[file("c", None)], &[], &keys)
            .unwrap()
            .to_string();
        assert!(e.contains("(encrypted to no recipient recorded)"), "{e}");
    }

    #[test]
    fn a_file_in_clear_or_of_another_scheme_is_refused() {
        let (keys, mine) = ids();
        let mine = vec![mine];
        let plain = Stored {
            key: "q/segment-0002.zst",
            encryption: None,
            recipients: None,
        };
        let files = [file("q/segment-0001.zst.age", Some(&mine)), plain];
        let e = refusal("b1", &files, &mine, &keys).unwrap().to_string();
        assert_eq!(
            e,
            "Encryption error: backup b1 is encrypted, but 1 file(s) it lists are stored unencrypted: q/segment-0002.zst: refused (anyone who can write to the storage can put a file there)"
        );
        let odd = Stored {
            key: "k",
            encryption: Some("rot13"),
            recipients: None,
        };
        let e = refusal("b1", &[odd], &mine, &keys).unwrap().to_string();
        assert_eq!(
            e,
            "Encryption error: k is stored with encryption \"rot13\", which this version does not read"
        );
    }

    #[test]
    fn what_a_reader_reads_decides() {
        use crate::repository::manifest::{DefinitionsBackup, QueueBackup};
        let (keys, mine) = ids();
        let (_, other) = encryption::generate();
        let seg = |n: u64, to: Option<&str>| SegmentMetadata {
            encryption: to.map(|_| encryption::SCHEME.to_string()),
            recipients: to.map(|k| vec![k.to_string()]),
            ..SegmentMetadata::example(format!("b1/queues/v/q{n}/segment-0001.zst.age"), 1, 1)
        };
        let queue = |n: u64, to: Option<&str>| {
            QueueBackup::from_segments(
                "v",
                &format!("q{n}"),
                crate::broker::QueueType::Classic,
                vec![seg(n, to)],
            )
        };
        // Unencrypted: nothing needed, whatever is given.
        let mut m = Manifest::new("b1", 0);
        m.queues = vec![queue(1, None)];
        let all = |m: &Manifest| {
            m.queues
                .iter()
                .flat_map(|q| &q.segments)
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(check_readable(&m, None, &all(&m), true).is_ok());
        assert!(check_readable(&m, Some(&keys), &all(&m), true).is_ok());
        // Encrypted (even with the top-level entry stripped): an identity is needed.
        m.queues = vec![queue(1, Some(&mine)), queue(2, Some(&other))];
        let e = check_readable(&m, None, &all(&m), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is encrypted (age) and no identity was given"),
            "{e}"
        );
        // Only what is read counts: queue 1 alone opens, both do not.
        assert!(check_readable(&m, Some(&keys), &m.queues[0].segments, false).is_ok());
        let e = check_readable(&m, Some(&keys), &all(&m), false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot open 1 of the 2") && e.contains("q2/"),
            "{e}"
        );
        // The definitions, when read, by the top-level list; in clear they are refused.
        m.queues.truncate(1);
        m.encryption = Some(encryption::EncryptionInfo {
            scheme: encryption::SCHEME.into(),
            recipients: vec![other.clone()],
        });
        m.definitions = Some(DefinitionsBackup {
            key: "b1/definitions/definitions.json.zst.age".into(),
            vhost_count: 1,
            queue_count: 1,
            exchange_count: 0,
            user_count: 0,
            size_bytes: 1,
            encryption: Some(encryption::SCHEME.into()),
            checksum: None,
        });
        assert!(check_readable(&m, Some(&keys), &all(&m), false).is_ok());
        let e = check_readable(&m, Some(&keys), &all(&m), true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot open 1 of the 2") && e.contains("definitions.json"),
            "{e}"
        );
        m.definitions.as_mut().unwrap().encryption = None;
        let e = check_readable(&m, Some(&keys), &all(&m), true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1 file(s) it lists are stored unencrypted: b1/definitions/"),
            "{e}"
        );
        // An unknown top-level scheme.
        m.encryption.as_mut().unwrap().scheme = "gpg".into();
        let e = check_readable(&m, Some(&keys), &all(&m), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("scheme \"gpg\""), "{e}");
    }

    #[test]
    fn long_lists_are_cut() {
        assert_eq!(named(vec!["a".into(), "b".into()]), "a, b");
        let many: Vec<String> = (0..13).map(|i| i.to_string()).collect();
        assert_eq!(named(many), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 3 more");
    }

    /// A stored segment and its manifest entry, written under `key` to `storage`.
    fn stored(
        storage: &dyn Storage,
        key: &str,
        seal: Option<&encryption::Recipients>,
    ) -> SegmentMetadata {
        use crate::repository::segment::{sha256_file, Compression, SegmentWriter};
        // Tests run side by side and store the same keys: a file of their own each.
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let spool = std::env::temp_dir().join(format!(
            "rmq-fetch-seg-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            key.replace('/', "-")
        ));
        let mut w = SegmentWriter::create(&spool, Compression::Zstd, 3).unwrap();
        for i in 0..3 {
            w.append(format!("{{\"i\":{i}}}").as_bytes(), 1000 + i)
                .unwrap();
        }
        let fin = w.finish().unwrap();
        let mut bytes = std::fs::read(&spool).unwrap();
        if let Some(r) = seal {
            bytes = r.encrypt_bytes(&bytes).unwrap();
        }
        std::fs::write(&spool, &bytes).unwrap();
        let checksum = sha256_file(&spool).unwrap();
        let _ = std::fs::remove_file(&spool);
        storage.put_bytes(key, &bytes).unwrap();
        SegmentMetadata {
            key: key.into(),
            sequence: 1,
            record_count: 3,
            size_bytes: bytes.len() as u64,
            uncompressed_bytes: fin.uncompressed_bytes,
            first_timestamp: Some(1000),
            last_timestamp: Some(1002),
            checksum,
            encryption: seal.map(|_| encryption::SCHEME.to_string()),
            recipients: None,
            segment_version: None,
        }
    }

    /// Fetches `seg` and reads its records: their count, or the first error.
    fn read_through(
        storage: &dyn Storage,
        spool: &Path,
        seg: &SegmentMetadata,
        keys: Option<&Identities>,
        check: Check,
    ) -> Result<usize> {
        let FetchedSegment { reader, files: _f } = fetch_segment(storage, spool, seg, keys, check)?;
        let mut n = 0;
        for r in reader.records() {
            r?;
            n += 1;
        }
        Ok(n)
    }

    /// A plain segment of 3 records, each `{"v":"<c>"}`: the same size for every `c`.
    fn segment_of(c: char) -> Vec<u8> {
        use crate::repository::segment::{Compression, SegmentWriter};
        let path = std::env::temp_dir().join(format!("rmq-fetch-of-{}-{c}", std::process::id()));
        let mut w = SegmentWriter::create(&path, Compression::None, 0).unwrap();
        for i in 0..3 {
            w.append(format!("{{\"v\":\"{c}\"}}").as_bytes(), 1000 + i)
                .unwrap();
        }
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        bytes
    }

    /// Issue 38, item 5: a file in a filesystem repository rewritten in place, again and again,
    /// between the manifest's bytes and another valid segment of the same size, while it is
    /// read. No read may hand out the other segment's records and end without an error: the
    /// records read are the bytes checked (as read, or on a private copy first).
    #[test]
    fn what_is_checked_is_what_is_read_while_a_writer_changes_the_file() {
        use crate::repository::storage::filesystem::FilesystemStorage;
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = std::env::temp_dir().join(format!("rmq-fetch-race-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        let fs = FilesystemStorage::new(&dir.join("store")).unwrap();
        let (good, forged) = (segment_of('a'), segment_of('b'));
        assert_eq!(good.len(), forged.len());
        fs.put_bytes("b/q/seg", &good).unwrap();
        let seg = SegmentMetadata {
            key: "b/q/seg".into(),
            sequence: 1,
            record_count: 3,
            size_bytes: good.len() as u64,
            uncompressed_bytes: 0,
            first_timestamp: Some(1000),
            last_timestamp: Some(1002),
            checksum: crate::repository::segment::hex_lower(&{
                use sha2::Digest;
                sha2::Sha256::digest(&good)
            }),
            encryption: None,
            recipients: None,
            segment_version: None,
        };
        let path = dir.join("store").join("b/q/seg");
        let stop = AtomicBool::new(false);
        let spool = dir.join("spool").join("s.rbak");
        std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    f.write_all_at(&forged, 0).unwrap();
                    std::thread::yield_now();
                    f.write_all_at(&good, 0).unwrap();
                    std::thread::yield_now();
                }
            });
            let mut forged_read = 0;
            for round in 0..4000 {
                let check = if round % 2 == 0 {
                    Check::AsRead
                } else {
                    Check::First
                };
                let Ok(FetchedSegment { reader, files: _f }) =
                    fetch_segment(&fs, &spool, &seg, None, check)
                else {
                    continue;
                };
                let records: Result<Vec<_>> = reader.records().collect();
                if let Ok(records) = records {
                    let bodies: Vec<String> = records
                        .iter()
                        .map(|r| match r {
                            crate::repository::segment::RawRecord::Json(j) => {
                                String::from_utf8_lossy(j).into_owned()
                            }
                            other => panic!("{other:?}"),
                        })
                        .collect();
                    if bodies.iter().any(|b| b.contains("\"b\"")) {
                        forged_read += 1;
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
            assert_eq!(
                forged_read, 0,
                "reads that handed out the other segment's records"
            );
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_filesystem_segment_is_read_in_place_and_left_where_it_is() {
        use crate::repository::storage::filesystem::FilesystemStorage;
        let dir = std::env::temp_dir().join(format!("rmq-fetch-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        let fs = FilesystemStorage::new(&dir.join("store")).unwrap();
        let (secret, public) = encryption::generate();
        let keys = Identities::parse(&secret, "id.txt").unwrap();
        let to = encryption::Recipients::parse([public.as_str()], "r").unwrap();
        let spool = dir.join("spool").join("s.rbak");
        for (key, seal) in [("b/q/plain", None), ("b/q/sealed", Some(&to))] {
            let seg = stored(&fs, key, seal);
            let FetchedSegment { reader, files } =
                fetch_segment(&fs, &spool, &seg, Some(&keys), Check::AsRead).unwrap();
            assert_eq!(reader.records().count(), 3, "{key}");
            // Plain: nothing spooled; sealed: only the plaintext.
            let spooled: Vec<_> = std::fs::read_dir(dir.join("spool"))
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert_eq!(
                spooled.len(),
                usize::from(seal.is_some()),
                "{key}: {spooled:?}"
            );
            drop(files);
            assert_eq!(
                std::fs::read_dir(dir.join("spool")).unwrap().count(),
                0,
                "{key}"
            );
            assert!(
                fs.head(key).unwrap().is_some(),
                "{key}: the stored file stays"
            );
            // A byte altered in place is found, by CRC32 (plain) or SHA-256 (sealed).
            let path = dir.join("store").join(key);
            let mut bytes = std::fs::read(&path).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            for check in [Check::AsRead, Check::First] {
                let e = read_through(&fs, &spool, &seg, Some(&keys), check)
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("CRC32 mismatch") || e.contains("SHA-256 mismatch"),
                    "{key} {check:?}: {e}"
                );
            }
            assert!(
                fs.head(key).unwrap().is_some(),
                "{key}: a damaged file stays too"
            );
        }
        // A segment whose CRC32 holds but whose bytes are not the manifest's: SHA-256.
        let seg = stored(&fs, "b/q/other", None);
        let other = SegmentMetadata {
            checksum: "0".repeat(64),
            ..seg
        };
        for check in [Check::AsRead, Check::First] {
            let e = read_through(&fs, &spool, &other, None, check)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("Serialization error: SHA-256 mismatch: expected 000"),
                "{check:?}: {e}"
            );
        }
        let e = fetch_segment(
            &fs,
            &spool,
            &SegmentMetadata {
                key: "b/q/none".into(),
                ..other
            },
            None,
            Check::AsRead,
        )
        .err()
        .unwrap()
        .to_string();
        assert_eq!(e, "Storage error: Key not found: b/q/none");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_remote_segment_goes_through_a_spool_file_removed_after_use() {
        let storage = crate::repository::storage::memory::MemoryStorage::named("fetch-remote");
        let dir = std::env::temp_dir().join(format!("rmq-fetch-remote-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spool = dir.join("s.rbak");
        let seg = stored(storage.as_ref(), "b/q/plain", None);
        let FetchedSegment { reader, files } =
            fetch_segment(storage.as_ref(), &spool, &seg, None, Check::AsRead).unwrap();
        assert!(spool.exists());
        assert_eq!(reader.records().count(), 3);
        drop(files);
        assert!(!spool.exists());
        let bad = SegmentMetadata {
            checksum: "0".repeat(64),
            ..seg
        };
        assert!(read_through(storage.as_ref(), &spool, &bad, None, Check::AsRead).is_err());
        assert!(!spool.exists(), "removed on an error too");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
