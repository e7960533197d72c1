//! Encryption at rest with age (<https://age-encryption.org/v1>, the `age` crate): what a
//! backup stores encrypted, to whom, and the decryption of what a reader fetches.
//!
//! A backup written with `backup.encryption` encrypts each finished segment file (the RBAK
//! bytes, compressed as usual) and the definitions export to X25519 recipients (`age1...`
//! public keys): the machine that backs up never holds what it takes to read a backup. The
//! stored object is a plain age file (binary, not armored) whose plaintext is the file an
//! unencrypted backup would store; its key gets [`EXTENSION`] after the usual one
//! (`segment-0001.zst.age`, `definitions.json.zst.age`), so `age -d -i key.txt -o
//! segment-0001.zst segment-0001.zst.age` gives a RBAK file any reader accepts.
//!
//! The manifest stays readable: it records the scheme and the recipients' public keys
//! ([`EncryptionInfo`]), and per segment how it is stored; its SHA-256 covers the stored
//! (encrypted) bytes, so `validate` without `--deep` needs no key. A reader holds
//! [`Identities`] (`AGE-SECRET-KEY-1...`, from `restore.encryption.identity_file`,
//! `--identity-file` or [`IDENTITY_ENV`]).
//!
//! Errors are `Encryption error:` (exit 1, `error_type` `encryption`); a file or key that
//! cannot be read or parsed from the configuration is `Configuration error:`. No message
//! holds a secret: identities are named by where they came from, never by their text.

use crate::error::{Error, Result};
use age::secrecy::zeroize::Zeroizing;
use age::secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The scheme recorded in the manifest, per segment (`encryption: "age"`) and at the top
/// ([`EncryptionInfo::scheme`]): an age v1 file encrypted to X25519 recipients.
pub const SCHEME: &str = "age";

/// Appended to the key of an encrypted object, after the compression's extension.
pub const EXTENSION: &str = ".age";

/// The environment variable that may hold the identities (the text of an age identity file)
/// of `restore`, `validate --deep` and `cat`, when no identity file is given.
pub const IDENTITY_ENV: &str = "RMQ_BACKUP_AGE_IDENTITY";

/// Buffer size of the file copies, bytes.
const IO_BUF: usize = 256 * 1024;

/// How every age v1 file starts (<https://age-encryption.org/v1>, "Header"): the version line
/// of the binary (not armored) format this tool writes.
pub const MAGIC: &[u8] = b"age-encryption.org/v1\n";

/// The largest identity file read, bytes (an X25519 identity line is 74 bytes).
const MAX_IDENTITY_FILE: usize = 1 << 20;

/// The manifest's top-level `encryption` object (absent in an unencrypted backup): the scheme
/// and the public keys the backup was encrypted to. Never a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncryptionInfo {
    /// Always [`SCHEME`] for backups this version writes.
    pub scheme: String,
    /// The recipients' public keys (`age1...`), in the order configured.
    pub recipients: Vec<String>,
}

/// The public keys a backup encrypts to (`backup.encryption`).
#[derive(Clone)]
pub struct Recipients {
    keys: Vec<age::x25519::Recipient>,
}

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.public_keys()).finish()
    }
}

impl Recipients {
    /// Parses `age1...` public keys. `field` names where they came from for messages (a
    /// public key is not a secret, but only its position is quoted).
    ///
    /// Errors: `Configuration error: {field} entry {n} is not an age X25519 recipient
    /// (age1...): {why}`; `Configuration error: {field} names no recipient` when empty.
    pub fn parse<'a>(keys: impl IntoIterator<Item = &'a str>, field: &str) -> Result<Recipients> {
        let mut out = Vec::new();
        for (i, k) in keys.into_iter().enumerate() {
            let key = k.trim().parse::<age::x25519::Recipient>().map_err(|why| {
                Error::Config(format!(
                    "{field} entry {} is not an age X25519 recipient (age1...): {why}",
                    i + 1
                ))
            })?;
            if !out.contains(&key) {
                out.push(key);
            }
        }
        if out.is_empty() {
            return Err(Error::Config(format!("{field} names no recipient")));
        }
        Ok(Recipients { keys: out })
    }

    /// The lines of a recipients file (as `age -R`): one `age1...` key per line; empty lines
    /// and `#` comments are skipped.
    pub fn file_lines(text: &str) -> impl Iterator<Item = &str> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
    }

    /// The manifest entry for these recipients.
    pub fn info(&self) -> EncryptionInfo {
        EncryptionInfo {
            scheme: SCHEME.to_string(),
            recipients: self.public_keys(),
        }
    }

    /// The public keys, `age1...`.
    pub fn public_keys(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.to_string()).collect()
    }

    /// Whether `keys` (public keys as a manifest records them) are exactly these recipients,
    /// in any order: a segment encrypted to them can be read by these recipients and by no
    /// one else.
    pub fn same_as(&self, keys: &[String]) -> bool {
        let mine = self.public_keys();
        mine.iter().all(|k| keys.contains(k)) && keys.iter().all(|k| mine.contains(k))
    }

    fn encryptor(&self) -> Result<age::Encryptor> {
        age::Encryptor::with_recipients(self.keys.iter().map(|k| k as &dyn age::Recipient))
            .map_err(|e| Error::Encryption(format!("cannot start age encryption: {e}")))
    }

    /// Encrypts the file `plain` into a new file `sealed` (created, never overwritten) and
    /// returns its size in bytes and the lowercase SHA-256 hex of its bytes, computed as they
    /// are written. `plain` is left in place (the caller removes it).
    ///
    /// Errors: `Error::Io` (or `Storage error` for a full spool disk) for file failures,
    /// `Error::Encryption` when age fails.
    pub fn encrypt_file(&self, plain: &Path, sealed: &Path) -> Result<(u64, String)> {
        let mut input = File::open(plain).map_err(|e| io_err("Failed to open", plain, e))?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(sealed)
            .map_err(|e| io_err("Failed to create", sealed, e))?;
        let hashing = HashingWriter {
            inner: BufWriter::with_capacity(IO_BUF, out),
            sha: Sha256::new(),
            bytes: 0,
        };
        let mut writer = self
            .encryptor()?
            .wrap_output(hashing)
            .map_err(|e| io_err("Failed to write", sealed, e))?;
        std::io::copy(&mut input, &mut writer).map_err(|e| io_err("Failed to write", sealed, e))?;
        let mut hashing = writer
            .finish()
            .map_err(|e| io_err("Failed to write", sealed, e))?;
        hashing
            .inner
            .flush()
            .map_err(|e| io_err("Failed to write", sealed, e))?;
        Ok((
            hashing.bytes,
            crate::repository::segment::hex_lower(&hashing.sha.finalize()),
        ))
    }

    /// Encrypts `plain` in memory (the definitions export).
    ///
    /// Errors: `Error::Encryption` when age fails.
    pub fn encrypt_bytes(&self, plain: &[u8]) -> Result<Vec<u8>> {
        let fail = |e: std::io::Error| Error::Encryption(format!("age encryption failed: {e}"));
        let mut out = Vec::with_capacity(plain.len() + 256);
        let mut writer = self.encryptor()?.wrap_output(&mut out).map_err(fail)?;
        writer.write_all(plain).map_err(fail)?;
        writer.finish().map_err(fail)?;
        Ok(out)
    }
}

/// Counts and hashes what goes to the sealed file.
struct HashingWriter<W: Write> {
    inner: W,
    sha: Sha256,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The private keys a reader decrypts with (`AGE-SECRET-KEY-1...`). `Debug` shows where they
/// came from and their public keys, never the keys.
pub struct Identities {
    keys: Vec<age::x25519::Identity>,
    /// Where they came from, for messages: a field and path, or the environment variable.
    source: String,
}

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identities({}: {:?})", self.source, self.public_keys())
    }
}

impl Identities {
    /// Parses the text of an age identity file: one `AGE-SECRET-KEY-1...` per line, empty
    /// lines and `#` comments skipped. `source` says where the text came from (for messages).
    ///
    /// Errors: `Configuration error: {source}: line {n} is not an age X25519 identity
    /// (AGE-SECRET-KEY-1...)` (the line itself is never quoted), or `... holds no identity`.
    pub fn parse(text: &str, source: &str) -> Result<Identities> {
        let is_key = |line: &str| !line.is_empty() && !line.starts_with('#');
        // Sized once: a vector that grows moves the keys and frees the old buffer unwiped
        // (`age::x25519::Identity` wipes itself on drop, not where a move leaves a copy).
        let mut keys = Vec::with_capacity(text.lines().filter(|l| is_key(l.trim())).count());
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if !is_key(line) {
                continue;
            }
            let key = line.parse::<age::x25519::Identity>().map_err(|_| {
                Error::Config(format!(
                    "{source}: line {} is not an age X25519 identity (AGE-SECRET-KEY-1...)",
                    i + 1
                ))
            })?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(Error::Config(format!("{source} holds no age identity")));
        }
        Ok(Identities {
            keys,
            source: source.to_string(),
        })
    }

    /// The identities of a reader: from `file` when given (`field` names the option, e.g.
    /// `restore.encryption.identity_file` or `--identity-file`), else from [`IDENTITY_ENV`]
    /// when set, else `None` (enough for unencrypted backups).
    ///
    /// The file's text is held in a buffer wiped when it is dropped (as is the variable's copy
    /// of the environment), and a file that group or others may read or change is warned
    /// about, one line naming it and its mode, as ssh does for its keys ([`too_open`]).
    ///
    /// Errors: `Configuration error: Cannot read {field} {path}: {why}`, `... is not UTF-8
    /// text`, and as [`Identities::parse`].
    pub fn load(file: Option<&Path>, field: &str) -> Result<Option<Identities>> {
        if let Some(path) = file {
            let source = format!("{field} {}", path.display());
            let bytes = read_identity_file(path, &source).map_err(|e| {
                Error::Config(format!(
                    "Cannot read {source}: {}",
                    crate::repository::storage::io_reason(&e)
                ))
            })?;
            let text = std::str::from_utf8(&bytes)
                .map_err(|_| Error::Config(format!("{source} is not UTF-8 text")))?;
            return Identities::parse(text, &source).map(Some);
        }
        match std::env::var(IDENTITY_ENV).map(Zeroizing::new) {
            Ok(text) if !text.trim().is_empty() => Identities::parse(&text, IDENTITY_ENV).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::Config(format!("{IDENTITY_ENV} is not valid UTF-8")))
            }
        }
    }

    /// The public keys (`age1...`) of these identities.
    pub fn public_keys(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| k.to_public().to_string())
            .collect()
    }

    /// Recipients made of these identities' public keys: what the reader itself can decrypt
    /// (the restore's snapshot of the target's definitions is encrypted to them).
    pub fn recipients(&self) -> Recipients {
        Recipients {
            keys: self.keys.iter().map(|k| k.to_public()).collect(),
        }
    }

    /// Where these identities came from (a field and path, or [`IDENTITY_ENV`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether one of these identities opens a file encrypted to `recipients` (public keys,
    /// `age1...`): an X25519 identity opens what was encrypted to its own public key, which is
    /// derived from it, and nothing else.
    pub fn opens(&self, recipients: &[String]) -> bool {
        self.public_keys().iter().any(|k| recipients.contains(k))
    }

    /// Decrypts the age file `sealed` into a new file `plain`; `what` names it for messages
    /// (a storage key). On an error `plain` may hold part of the plaintext: the caller
    /// removes it.
    ///
    /// Errors: `Encryption error: {what}: none of the identities in {source} can decrypt it
    /// (wrong identity)`, `Encryption error: {what}: the age file is damaged or was altered
    /// ({detail})`; `Error::Io` for local file failures.
    pub fn decrypt_file(&self, sealed: &Path, plain: &Path, what: &str) -> Result<()> {
        let input = File::open(sealed).map_err(|e| io_err("Failed to open", sealed, e))?;
        self.decrypt_open(input, plain, what)
    }

    /// [`Identities::decrypt_file`] of the age file read from `input` (a file open where it
    /// stands, or a reader that hashes what it hands on: `crate::repository::fetch`).
    ///
    /// Errors: as [`Identities::decrypt_file`].
    pub fn decrypt_open(&self, input: impl Read, plain: &Path, what: &str) -> Result<()> {
        let mut reader = self.decrypting(BufReader::with_capacity(IO_BUF, input), what)?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(plain)
            .map_err(|e| io_err("Failed to create", plain, e))?;
        let mut out = BufWriter::with_capacity(IO_BUF, out);
        copy(&mut reader, &mut out, what, plain)?;
        out.flush().map_err(|e| io_err("Failed to write", plain, e))
    }

    /// Decrypts an age file held in memory (the definitions export).
    ///
    /// Errors: as [`Identities::decrypt_file`].
    pub fn decrypt_bytes(&self, sealed: &[u8], what: &str) -> Result<Vec<u8>> {
        let mut reader = self.decrypting(sealed, what)?;
        let mut out = Vec::with_capacity(sealed.len());
        reader
            .read_to_end(&mut out)
            .map_err(|e| read_failure(e, what))?;
        Ok(out)
    }

    fn decrypting<R: std::io::BufRead>(
        &self,
        input: R,
        what: &str,
    ) -> Result<age::stream::StreamReader<R>> {
        let decryptor = age::Decryptor::new_buffered(input).map_err(|e| self.failure(e, what))?;
        if decryptor.is_scrypt() {
            return Err(Error::Encryption(format!(
                "{what} is encrypted with a passphrase, which this version does not read"
            )));
        }
        decryptor
            .decrypt(self.keys.iter().map(|k| k as &dyn age::Identity))
            .map_err(|e| self.failure(e, what))
    }

    fn failure(&self, e: age::DecryptError, what: &str) -> Error {
        match e {
            age::DecryptError::NoMatchingKeys => Error::Encryption(format!(
                "{what}: none of the identities in {} can decrypt it (wrong identity)",
                self.source
            )),
            age::DecryptError::Io(e) => read_failure(e, what),
            other => damaged(what, &format!("{other:?}")),
        }
    }
}

/// `Encryption error: {what}: the age file is damaged or was altered ({detail})`.
fn damaged(what: &str, detail: &str) -> Error {
    Error::Encryption(format!(
        "{what}: the age file is damaged or was altered ({detail})"
    ))
}

/// An error while reading decrypted bytes: age reports a chunk that does not authenticate
/// (and a truncated file) as `InvalidData` / `UnexpectedEof`.
fn read_failure(e: std::io::Error, what: &str) -> Error {
    match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
            damaged(what, &e.to_string())
        }
        _ => Error::Io(format!("Failed to read {what}: {e}")),
    }
}

fn copy(reader: &mut impl Read, out: &mut impl Write, what: &str, plain: &Path) -> Result<()> {
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_failure(e, what)),
        };
        out.write_all(&buf[..n])
            .map_err(|e| io_err("Failed to write", plain, e))?;
    }
}

/// The warning for an identity file of mode `mode` (the permission bits of `stat(2)`) when
/// group or others may read or change it, as ssh refuses such private keys ("UNPROTECTED
/// PRIVATE KEY FILE"); `None` for mode 0600, 0400 and the like. `source` names the file.
pub fn too_open(mode: u32, source: &str) -> Option<String> {
    let mode = mode & 0o7777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{source} has mode {mode:04o}: group or others may read or change it, and it holds private keys; chmod 600 it"
        )
    })
}

/// Reads an identity file into a buffer wiped on drop, warning when [`too_open`] (the mode of
/// the file opened, a symlink's target). A pipe (`<(...)`) is read as well as a file.
///
/// Errors: the file's, or `InvalidData` past [`MAX_IDENTITY_FILE`] bytes.
fn read_identity_file(path: &Path, source: &str) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Some(warning) = too_open(meta.permissions().mode(), source) {
            log::warn!("{warning}");
        }
    }
    let hint = usize::try_from(meta.len()).unwrap_or(MAX_IDENTITY_FILE);
    read_wiped(&mut file, hint.min(MAX_IDENTITY_FILE))
}

/// Reads `input` to its end into a buffer wiped on drop; when the buffer must grow, the
/// bytes move to a larger one and the old one is wiped (a `Vec` that grows by itself frees
/// its old buffer as it is). `hint`: the expected size, bytes.
///
/// Errors: `input`'s, or `InvalidData` past [`MAX_IDENTITY_FILE`] bytes.
fn read_wiped(input: &mut impl Read, hint: usize) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut buf = Zeroizing::new(Vec::with_capacity(hint.max(128)));
    let mut chunk = Zeroizing::new([0u8; 1024]);
    loop {
        let n = match input.read(&mut chunk[..]) {
            Ok(0) => return Ok(buf),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let len = buf.len() + n;
        if len > MAX_IDENTITY_FILE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than {MAX_IDENTITY_FILE} bytes: not an age identity file"),
            ));
        }
        if len > buf.capacity() {
            let mut bigger = Zeroizing::new(Vec::with_capacity(len.max(2 * buf.capacity())));
            bigger.extend_from_slice(&buf);
            buf = bigger; // the old buffer is wiped as it drops
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Checks that `info` names a scheme this version reads.
///
/// Errors: `Encryption error: backup {id} is encrypted with scheme {s}, which this version
/// does not read`.
pub fn check_scheme(info: &EncryptionInfo, backup_id: &str) -> Result<()> {
    if info.scheme == SCHEME {
        Ok(())
    } else {
        Err(Error::Encryption(format!(
            "backup {backup_id} is encrypted with scheme {:?}, which this version does not read",
            info.scheme
        )))
    }
}

/// The error of a reader that meets an encrypted object (`what`, a key or a backup) without
/// identities.
pub fn missing_identity(what: &str) -> Error {
    Error::Encryption(format!(
        "{what} is encrypted (age) and no identity was given: set restore.encryption.identity_file (restore), --identity-file (validate --deep, cat) or {IDENTITY_ENV}"
    ))
}

/// A fresh X25519 identity and its public key, as `age-keygen` makes them (tests, examples).
pub fn generate() -> (String, String) {
    let id = age::x25519::Identity::generate();
    (
        id.to_string().expose_secret().to_string(),
        id.to_public().to_string(),
    )
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    crate::repository::segment::io_err(what, path, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_errors_name_no_secret() {
        let (secret, public) = generate();
        let r = Recipients::parse([public.as_str()], "backup.encryption.recipients").unwrap();
        assert_eq!(r.info().recipients, vec![public.clone()]);
        let sealed = r.encrypt_bytes(b"hello definitions").unwrap();
        assert!(!sealed.windows(5).any(|w| w == b"hello"));
        let ids = Identities::parse(&format!("# key\n{secret}\n"), "test").unwrap();
        assert_eq!(ids.public_keys(), vec![public.clone()]);
        assert_eq!(
            ids.decrypt_bytes(&sealed, "d").unwrap(),
            b"hello definitions"
        );
        assert!(ids.opens(&r.info().recipients));

        let (other, _) = generate();
        let wrong = Identities::parse(&other, "other").unwrap();
        let e = wrong.decrypt_bytes(&sealed, "d").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Encryption error: d: none of the identities in other"),
            "{e}"
        );
        assert!(!e.to_string().contains(&other));
        assert!(!wrong.opens(&r.info().recipients));

        let mut flipped = sealed.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 1;
        let e = ids.decrypt_bytes(&flipped, "d").unwrap_err();
        assert!(e.to_string().contains("damaged or was altered"), "{e}");

        let e = Identities::parse("AGE-SECRET-KEY-1NOPE", "f").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Configuration error: f: line 1 is not an age X25519 identity (AGE-SECRET-KEY-1...)"
        );
        let e = Recipients::parse(["age1nope"], "backup.encryption.recipients").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("Configuration error: backup.encryption.recipients entry 1 is not"),
            "{e}"
        );
    }

    #[test]
    fn keys_compare_as_sets() {
        let (_, a) = generate();
        let (_, b) = generate();
        let ab = Recipients::parse([a.as_str(), b.as_str()], "r").unwrap();
        assert!(ab.same_as(&[b.clone(), a.clone()]));
        assert!(!ab.same_as(std::slice::from_ref(&a)));
        assert!(!ab.same_as(&[a.clone(), b.clone(), "age1other".into()]));
        let only_a = Recipients::parse([a.as_str()], "r").unwrap();
        assert!(only_a.same_as(std::slice::from_ref(&a)));
        assert!(!only_a.same_as(&[]));
    }

    #[test]
    fn an_identity_opens_what_was_encrypted_to_its_public_key() {
        let (s1, p1) = generate();
        let (s2, p2) = generate();
        let (_, p3) = generate();
        // Two identities, a comment and blank lines.
        let ids = Identities::parse(&format!("# one\n{s1}\n\n  {s2}  \n"), "f").unwrap();
        assert_eq!(ids.keys.capacity(), 2, "sized once, never grown");
        assert_eq!(ids.public_keys(), [p1.clone(), p2.clone()]);
        assert_eq!(ids.recipients().public_keys(), [p1.clone(), p2.clone()]);
        assert!(ids.opens(&[p3.clone(), p2.clone()]));
        assert!(!ids.opens(std::slice::from_ref(&p3)));
        assert!(!ids.opens(&[]));
        assert_eq!(ids.source(), "f");
        // What the derived recipients encrypt, these identities decrypt.
        let sealed = ids.recipients().encrypt_bytes(b"snapshot").unwrap();
        let second = Identities::parse(&s2, "g").unwrap();
        assert_eq!(second.decrypt_bytes(&sealed, "s").unwrap(), b"snapshot");
    }

    #[test]
    fn identity_files_open_to_group_or_others_are_warned_about() {
        for mode in [0o600, 0o400, 0o700, 0o100600, 0o100400] {
            assert_eq!(too_open(mode, "f"), None, "{mode:o}");
        }
        for mode in [
            0o644, 0o640, 0o604, 0o660, 0o620, 0o602, 0o610, 0o777, 0o100644,
        ] {
            let w = too_open(mode, "restore.encryption.identity_file /k").unwrap();
            assert!(
                w.starts_with("restore.encryption.identity_file /k has mode 0")
                    && w.contains(&format!("{:04o}", mode & 0o7777))
                    && w.contains("group or others")
                    && !w.contains('\n'),
                "{w}"
            );
        }
    }

    /// A reader that hands out `n` bytes at a time.
    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn identity_text_is_read_whole_through_wiped_buffers() {
        let text: Vec<u8> = (0..5000u32).map(|i| b'A' + (i % 26) as u8).collect();
        for (hint, step) in [(0, 7), (5000, 1024), (100, 1000), (10_000, 3)] {
            let got = read_wiped(&mut Trickle(&text, step), hint).unwrap();
            assert_eq!(&got[..], &text[..], "hint {hint}, step {step}");
        }
        let huge = vec![b'x'; MAX_IDENTITY_FILE + 1];
        let e = read_wiped(&mut Trickle(&huge, 1024), 0).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let e = Identities::load(Some(Path::new("/nonexistent/key.txt")), "--identity-file")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Configuration error: Cannot read --identity-file /nonexistent/key.txt: No such file or directory"
        );
    }

    #[test]
    fn files_round_trip() {
        let dir = std::env::temp_dir().join(format!("rmq-enc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (secret, public) = generate();
        let r = Recipients::parse([public.as_str()], "r").unwrap();
        let plain: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join("p"), &plain).unwrap();
        let (size, sha) = r.encrypt_file(&dir.join("p"), &dir.join("s")).unwrap();
        assert_eq!(size, std::fs::metadata(dir.join("s")).unwrap().len());
        assert_eq!(
            sha,
            crate::repository::segment::sha256_file(&dir.join("s")).unwrap()
        );
        let ids = Identities::parse(&secret, "t").unwrap();
        ids.decrypt_file(&dir.join("s"), &dir.join("back"), "k")
            .unwrap();
        assert_eq!(std::fs::read(dir.join("back")).unwrap(), plain);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
