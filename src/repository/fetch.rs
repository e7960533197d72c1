//! Reading what a backup stored: the one place where a stored segment is opened for reading
//! (restore, `cat`, `validate --deep`, the resume of a stream backup), so that every reader
//! checks and decrypts the same way.
//!
//! A segment is fetched to a spool file, or opened where it lies when the storage keeps it as
//! a local file (the filesystem backend, `Storage::open_local`: never written, moved or
//! removed here), and checked against the manifest before any record of it is used, through
//! the one open handle that is then read: a plain segment by its CRC32 and SHA-256 in one pass
//! (`SegmentReader::verify`); an encrypted one (`SegmentMetadata::encryption`,
//! docs/encryption.md "Encryption at rest") first by the SHA-256 of the stored age file, then
//! decrypted whole into a spool file (age authenticates every 64 KiB chunk and the header, so
//! a wrong key or an altered byte fails here), then by its CRC32. The spool files are removed
//! when the [`FetchedSegment`] is dropped, and on every error.

use crate::error::{Error, Result};
use crate::repository::encryption::{self, Identities};
use crate::repository::manifest::{Manifest, SegmentMetadata};
use crate::repository::segment::{io_err, sha256_open, SegmentReader};
use crate::repository::storage::Storage;
use std::io::{Read, Seek, SeekFrom};
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

/// Fetches `segment` to the spool file `path` (or opens it in place: see the module's doc) and
/// verifies it; `keys` decrypt an encrypted segment. An encrypted segment's plaintext is written beside
/// `path` (`<path>.plain`).
///
/// Errors (messages without the key; the caller names the segment): the storage's;
/// `Serialization error:` for a RBAK file that does not check out (magic, CRC32, ...) and
/// `SHA-256 mismatch: expected {manifest}, got {file}`; `Encryption error: {key} ...` for an
/// encrypted segment without `keys`, with the wrong ones, or altered (a MAC that fails);
/// `Error::Io` for spool files.
pub fn fetch_segment(
    storage: &dyn Storage,
    path: &Path,
    segment: &SegmentMetadata,
    keys: Option<&Identities>,
) -> Result<FetchedSegment> {
    let mut files = SpoolFiles(Vec::new());
    // A backend that keeps objects as local files (the filesystem) is read in place: the
    // stored file is checked and read through one open handle, never copied, moved or removed.
    let (stored, stored_path) = match storage.open_local(&segment.key)? {
        Some(local) => local,
        None => {
            files.0.push(path.to_path_buf());
            storage.get_to_file(&segment.key, path)?;
            let file = std::fs::File::open(path).map_err(|e| io_err("Failed to open", path, e))?;
            (file, path.to_path_buf())
        }
    };
    let reader = match segment.encryption.as_deref() {
        // CRC32 and SHA-256 in one pass over the file.
        None => SegmentReader::verify(stored, &stored_path, Some(&segment.checksum))?,
        Some(encryption::SCHEME) => {
            // The stored bytes first: a shallow validate proves the same without the key.
            // Checked, then decrypted, through one handle: what was checked is what is read.
            let mut stored = stored;
            let rewind = |f: &mut std::fs::File| {
                f.seek(SeekFrom::Start(0))
                    .map_err(|e| io_err("Failed to read", &stored_path, e))
            };
            let sha = sha256_open(&mut stored, &stored_path)?;
            if sha != segment.checksum {
                return Err(Error::Serialization(format!(
                    "SHA-256 mismatch: expected {}, got {sha}",
                    segment.checksum
                )));
            }
            let keys = keys.ok_or_else(|| encryption::missing_identity(&segment.key))?;
            rewind(&mut stored)?;
            if !starts_with_age_header(&mut stored, &stored_path)? {
                return Err(Error::Encryption(format!(
                    "{}: not an age file, though the manifest says it is encrypted: it was replaced or altered; refused",
                    segment.key
                )));
            }
            rewind(&mut stored)?;
            let mut plain = path.as_os_str().to_owned();
            plain.push(".plain");
            let plain = PathBuf::from(plain);
            files.0.push(plain.clone());
            keys.decrypt_open(stored, &plain, &segment.key)?;
            // Only the plaintext is read from here on; a spool copy of the stored file goes.
            if stored_path == path {
                let _ = std::fs::remove_file(path);
            }
            SegmentReader::open(&plain)?
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

/// Whether the file open as `file` (named `path` in messages) continues as an age v1 file
/// starts ([`encryption::MAGIC`]).
///
/// Errors: `Error::Io` when it cannot be read.
fn starts_with_age_header(file: &mut std::fs::File, path: &Path) -> Result<bool> {
    let mut head = Vec::with_capacity(encryption::MAGIC.len());
    Read::by_ref(file)
        .take(encryption::MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_err("Failed to read", path, e))?;
    Ok(head == encryption::MAGIC)
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

    #[test]
    fn only_age_files_pass_as_age_files() {
        let dir = std::env::temp_dir().join(format!("rmq-fetch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (_, public) = encryption::generate();
        let r = encryption::Recipients::parse([public.as_str()], "r").unwrap();
        std::fs::write(dir.join("a"), r.encrypt_bytes(b"x").unwrap()).unwrap();
        let starts = |name: &str| {
            let p = dir.join(name);
            starts_with_age_header(&mut std::fs::File::open(&p).unwrap(), &p).unwrap()
        };
        assert!(starts("a"));
        for (name, bytes) in [
            ("rbak", &b"RBAK\x01..."[..]),
            ("short", b"age"),
            ("empty", b""),
        ] {
            std::fs::write(dir.join(name), bytes).unwrap();
            assert!(!starts(name), "{name}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A stored segment and its manifest entry, written under `key` to `storage`.
    fn stored(
        storage: &dyn Storage,
        key: &str,
        seal: Option<&encryption::Recipients>,
    ) -> SegmentMetadata {
        use crate::repository::segment::{sha256_file, Compression, SegmentWriter};
        let spool = std::env::temp_dir().join(format!(
            "rmq-fetch-seg-{}-{}",
            std::process::id(),
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
                fetch_segment(&fs, &spool, &seg, Some(&keys)).unwrap();
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
            let e = fetch_segment(&fs, &spool, &seg, Some(&keys))
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains("CRC32 mismatch") || e.contains("SHA-256 mismatch"),
                "{key}: {e}"
            );
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
        let e = fetch_segment(&fs, &spool, &other, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("Serialization error: SHA-256 mismatch: expected 000"),
            "{e}"
        );
        let e = fetch_segment(
            &fs,
            &spool,
            &SegmentMetadata {
                key: "b/q/none".into(),
                ..other
            },
            None,
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
            fetch_segment(storage.as_ref(), &spool, &seg, None).unwrap();
        assert!(spool.exists());
        assert_eq!(reader.records().count(), 3);
        drop(files);
        assert!(!spool.exists());
        let bad = SegmentMetadata {
            checksum: "0".repeat(64),
            ..seg
        };
        assert!(fetch_segment(storage.as_ref(), &spool, &bad, None).is_err());
        assert!(!spool.exists(), "removed on an error too");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
