//! [`SegmentReader`]: verifies a local segment file (magic, version, compression, size, end
//! magic, CRC32) before handing out its records, which [`Records`] decompresses and parses as it
//! iterates; or, opened with [`SegmentReader::stream`], checks it in the pass that reads the
//! records (`checked.rs`).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom, Take};
use std::path::{Path, PathBuf};

use super::checked::{Input, Sums};
use super::{
    io_err, ser, Compression, RawRecord, SegmentHeader, END_MAGIC, FOOTER_LEN, HEADER_LEN, IO_BUF,
    MAGIC, VERSION, VERSION_2, VERSION_3,
};
use crate::error::{Error, Result};

/// The largest record a reader accepts by default: 2 GiB + 64 MiB of JSON (version 2: of
/// metadata, and of body, each). RabbitMQ refuses messages over 512 MiB (`max_message_size`
/// cannot be set higher), and a body is written as a JSON number array of at most 4 bytes per
/// body byte (`255,`), plus properties and headers.
/// Larger announced lengths are refused before anything is allocated or decompressed for them,
/// so a small compressed payload cannot make a reader inflate more than this per record
/// (`SegmentReader::max_record_bytes` lowers it, as the fuzz target does).
pub const MAX_RECORD_BYTES: u64 = (2 << 30) + (64 << 20);

/// A verified segment file, ready to iterate.
///
/// [`SegmentReader::open`] checks, in order: magic, version, compression code, minimum size
/// (40 bytes), end magic, and the CRC32 over header + payload (one streaming pass). The records
/// are then read in a second streaming pass by [`SegmentReader::records`].
/// [`SegmentReader::stream`] checks the header only, and the rest in the pass that reads the
/// records.
pub struct SegmentReader {
    path: PathBuf,
    header: SegmentHeader,
    input: Input,
    payload_len: u64,
    max_record: u64,
}

impl SegmentReader {
    /// Opens and verifies the segment at `path`.
    ///
    /// Errors (`Error::Serialization` unless noted): `Invalid segment magic bytes`,
    /// `Unsupported segment version: {n}`, `Unknown segment compression code: {n}`,
    /// `Segment file too short: {n} bytes, a segment has at least 40`,
    /// `Invalid segment end magic bytes`, `CRC32 mismatch: expected {stored}, got {computed}`;
    /// `Error::Io` when the file cannot be read.
    pub fn open(path: &Path) -> Result<SegmentReader> {
        let file = File::open(path).map_err(|e| io_err("Failed to open", path, e))?;
        SegmentReader::verify(file, path, None)
    }

    /// Verifies the segment open as `file` (named `path` in messages), as [`SegmentReader::open`]
    /// does, and, when `sha256` is given, that the SHA-256 of the whole file is that lowercase
    /// hex digest, both in one streaming pass over the file (a segment's bytes are read once
    /// to be checked, once more as records).
    ///
    /// Errors: those of [`SegmentReader::open`], then
    /// `Serialization error: SHA-256 mismatch: expected {sha256}, got {file's}` (a CRC32 mismatch
    /// is reported first when both fail).
    pub fn verify(mut file: File, path: &Path, sha256: Option<&str>) -> Result<SegmentReader> {
        let len = file
            .metadata()
            .map_err(|e| io_err("Failed to stat", path, e))?
            .len();
        let mut h = [0u8; 32];
        let got = read_full(&mut file, &mut h).map_err(|e| io_err("Failed to read", path, e))?;
        let header = parse_header(&h, got, len)?;
        let mut footer = [0u8; 8];
        file.seek(SeekFrom::Start(len - FOOTER_LEN))
            .and_then(|_| file.read_exact(&mut footer))
            .map_err(|e| io_err("Failed to read", path, e))?;
        if &footer[4..8] != END_MAGIC {
            return Err(ser("Invalid segment end magic bytes"));
        }
        let stored = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]);
        let (computed, sha) = checksums(&mut file, len - FOOTER_LEN, sha256.is_some())
            .map_err(|e| io_err("Failed to read", path, e))?;
        if stored != computed {
            return Err(ser(format!(
                "CRC32 mismatch: expected {stored}, got {computed}"
            )));
        }
        if let (Some(expected), Some(sha)) = (sha256, sha) {
            if sha != expected {
                return Err(ser(format!(
                    "SHA-256 mismatch: expected {expected}, got {sha}"
                )));
            }
        }
        Ok(SegmentReader {
            path: path.to_path_buf(),
            header,
            input: Input { file, sums: None },
            payload_len: len - HEADER_LEN - FOOTER_LEN,
            max_record: MAX_RECORD_BYTES,
        })
    }

    /// Opens the segment open as `file` (named `path` in messages) to be checked in the pass
    /// that reads its records: here its header (magic, version, compression code, minimum
    /// size); the end magic, the CRC32 and, when `sha256` is given, the SHA-256 of the whole
    /// file as [`Records`] reads them, the last item it yields being the error when one
    /// fails. So the bytes checked are the bytes decoded, read once (`checked.rs`), though a
    /// record is handed out before the check of its segment ends: for readers whose verdict
    /// comes at the end of a segment (`validate --deep`, `cat`), not for one that acts on each
    /// record (a restore publishes: [`SegmentReader::verify`] a private copy).
    ///
    /// Errors: the header's, as [`SegmentReader::open`]; then, from the records, a failed
    /// check (reported before a decoding error it causes): `Invalid segment end magic bytes`,
    /// `CRC32 mismatch: ...`, `SHA-256 mismatch: expected {sha256}, got {file's}`.
    pub fn stream(file: File, path: &Path, sha256: Option<&str>) -> Result<SegmentReader> {
        let len = file
            .metadata()
            .map_err(|e| io_err("Failed to stat", path, e))?
            .len();
        let mut input = Input {
            file,
            sums: Some(Sums::new(len.max(FOOTER_LEN), sha256)),
        };
        let mut h = [0u8; 32];
        let got = read_full(&mut input, &mut h).map_err(|e| io_err("Failed to read", path, e))?;
        let header = parse_header(&h, got, len)?;
        Ok(SegmentReader {
            path: path.to_path_buf(),
            header,
            input,
            payload_len: len - HEADER_LEN - FOOTER_LEN,
            max_record: MAX_RECORD_BYTES,
        })
    }

    /// Refuses records longer than `bytes` of JSON (default [`MAX_RECORD_BYTES`]) with
    /// `Serialization error: Record {n} announces {len} bytes, more than the {bytes} a record
    /// may have`, before reading them.
    pub fn max_record_bytes(mut self, bytes: u64) -> SegmentReader {
        self.max_record = bytes;
        self
    }

    /// The verified header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Size in bytes of the compressed payload.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// Iterates the records (each a [`RawRecord`] of the header's version), decompressing as it
    /// goes. After the last record it checks the count against the header (`Expected {n}
    /// records but found {m}`; surplus records are not handed out) and that the payload ends
    /// cleanly (a truncated record or frame is an error). After an error the iterator ends.
    pub fn records(self) -> Records {
        let SegmentReader {
            path,
            header,
            mut input,
            payload_len,
            max_record,
        } = self;
        // A streamed file stands at the payload already (its header went through the sums).
        let at_payload = match input.sums {
            Some(_) => Ok(HEADER_LEN),
            None => input.file.seek(SeekFrom::Start(HEADER_LEN)),
        };
        let source = at_payload
            .map_err(|e| io_err("Failed to read", &path, e))
            .and_then(|_| {
                let raw = BufReader::with_capacity(IO_BUF, input.take(payload_len));
                Ok(match header.compression {
                    Compression::None => Source::Plain(raw),
                    Compression::Zstd => {
                        Source::Zstd(zstd::stream::read::Decoder::with_buffer(raw).map_err(
                            |e| Error::Compression(format!("Failed to start zstd: {e}")),
                        )?)
                    }
                    Compression::Lz4 => Source::Lz4(
                        lz4::Decoder::new(raw)
                            .map_err(|e| Error::Compression(format!("Failed to start lz4: {e}")))?,
                    ),
                })
            });
        let (reader, pending) = match source {
            Ok(s) => (Some(BufReader::with_capacity(64 * 1024, s)), None),
            Err(e) => (None, Some(e)),
        };
        Records {
            path,
            header,
            reader,
            left: None,
            pending_error: pending,
            max_record,
            count: 0,
            done: false,
        }
    }
}

/// The header of a file of `len` bytes whose first `got` bytes (at most 32) are `h`: magic,
/// version, compression code, minimum size, in this order.
fn parse_header(h: &[u8; 32], got: usize, len: u64) -> Result<SegmentHeader> {
    if got < 4 || &h[0..4] != MAGIC {
        return Err(ser("Invalid segment magic bytes"));
    }
    if got >= 5 && ![VERSION, VERSION_2, VERSION_3].contains(&h[4]) {
        return Err(ser(format!("Unsupported segment version: {}", h[4])));
    }
    let compression = if got >= 6 {
        Compression::from_code(h[5])
            .ok_or_else(|| ser(format!("Unknown segment compression code: {}", h[5])))?
    } else {
        Compression::None
    };
    if len < HEADER_LEN + FOOTER_LEN {
        return Err(ser(format!(
            "Segment file too short: {len} bytes, a segment has at least 40"
        )));
    }
    Ok(SegmentHeader {
        version: h[4],
        compression,
        record_count: u64::from_le_bytes(le8(&h[8..16])),
        first_timestamp: i64::from_le_bytes(le8(&h[16..24])),
        last_timestamp: i64::from_le_bytes(le8(&h[24..32])),
    })
}

pub(super) fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    a
}

/// Reads until `buf` is full or end of file; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// One pass over `file` from its start: the CRC32 of its first `crc_len` bytes and, when
/// `sha` is set, the lowercase hex SHA-256 of the whole file.
fn checksums(file: &mut File, crc_len: u64, sha: bool) -> std::io::Result<(u32, Option<String>)> {
    use sha2::Digest;
    file.seek(SeekFrom::Start(0))?;
    let mut crc = crc32fast::Hasher::new();
    let mut hasher = sha.then(sha2::Sha256::new);
    let mut left = crc_len;
    let mut buf = vec![0u8; IO_BUF];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let c = n.min(usize::try_from(left).unwrap_or(usize::MAX));
        crc.update(&buf[..c]);
        left -= c as u64;
        match &mut hasher {
            Some(h) => h.update(&buf[..n]),
            None if left == 0 => break,
            None => {}
        }
    }
    Ok((
        crc.finalize(),
        hasher.map(|h| super::hex_lower(&h.finalize())),
    ))
}

type Raw = BufReader<Take<Input>>;

enum Source {
    Plain(Raw),
    Zstd(zstd::stream::read::Decoder<'static, Raw>),
    Lz4(lz4::Decoder<Raw>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Zstd(r) => r.read(buf),
            Source::Lz4(r) => r.read(buf),
        }
    }
}

/// Iterator over the records of a verified segment, each a [`RawRecord`] (version 1: the JSON
/// of a BackupRecord; version 2: its metadata JSON and body).
pub struct Records {
    path: PathBuf,
    header: SegmentHeader,
    reader: Option<BufReader<Source>>,
    /// The file under a finished decompressor, until its check ([`Records::conclude`]).
    left: Option<Raw>,
    pending_error: Option<Error>,
    max_record: u64,
    count: u64,
    done: bool,
}

impl Records {
    /// The segment header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Records handed out so far.
    pub fn records_read(&self) -> u64 {
        self.count
    }

    /// Ends the iteration on a caller's error `e` about a record it was handed (one that does
    /// not decode as a BackupRecord, say): a segment opened with [`SegmentReader::stream`] is
    /// checked first, the rest of its file read, and a failed check (`CRC32 mismatch: ...`,
    /// `SHA-256 mismatch: ...`, ...) is returned in place of `e`, as the damage that explains
    /// it; otherwise `e`.
    pub fn fail(mut self, e: Error) -> Error {
        match self.conclude(Err(e)) {
            Err(e) => e,
            Ok(()) => ser("a failed record was concluded as good"),
        }
    }

    fn read_error(&self, e: std::io::Error) -> Error {
        match self.header.compression {
            Compression::None => io_err("Failed to read", &self.path, e),
            c => Error::Compression(format!(
                "Failed to decompress {} segment {}: {e}",
                c.as_str(),
                self.path.display()
            )),
        }
    }

    /// Reads the next record; `Ok(None)` at a clean end of the payload.
    fn read_record(&mut self) -> Result<Option<RawRecord>> {
        let Some(first) = self.read_frame(true)? else {
            return Ok(None);
        };
        if self.header.version == VERSION {
            return Ok(Some(RawRecord::Json(first)));
        }
        match self.read_frame(false)? {
            Some(body) => Ok(Some(RawRecord::Parts { meta: first, body })),
            None => Err(ser(format!(
                "Truncated record {}: its body's length prefix is missing",
                self.count + 1
            ))),
        }
    }

    /// Reads one length-prefixed frame (a u32 little-endian length, then that many bytes);
    /// `Ok(None)` at the end of the payload. `first`: the frame starts a record.
    fn read_frame(&mut self, first: bool) -> Result<Option<Vec<u8>>> {
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        let mut len = [0u8; 4];
        let got = match read_full(reader, &mut len) {
            Ok(n) => n,
            Err(e) => return Err(self.read_error(e)),
        };
        if got == 0 {
            return Ok(None);
        }
        if got < 4 {
            return Err(ser(if first {
                format!("Truncated record length prefix after record {}", self.count)
            } else {
                format!("Truncated body length prefix of record {}", self.count + 1)
            }));
        }
        let len = u64::from(u32::from_le_bytes(len));
        if len > self.max_record {
            return Err(ser(format!(
                "Record {} announces {len} bytes, more than the {} a record may have",
                self.count + 1,
                self.max_record
            )));
        }
        // Grow as data arrives rather than trusting the length for the allocation.
        let mut bytes = Vec::with_capacity(len.min(16 << 20) as usize);
        if let Err(e) = reader.take(len).read_to_end(&mut bytes) {
            return Err(self.read_error(e));
        }
        if (bytes.len() as u64) < len {
            return Err(ser(format!(
                "Truncated record {}: expected {len} bytes, got {}",
                self.count + 1,
                bytes.len()
            )));
        }
        Ok(Some(bytes))
    }

    /// Checks that the compressed stream ended properly and nothing follows it.
    fn finish_stream(&mut self) -> Result<()> {
        let Some(reader) = self.reader.take() else {
            return Ok(());
        };
        let (raw, lz4_end) = match reader.into_inner() {
            Source::Plain(raw) => (raw, Ok(())),
            Source::Zstd(dec) => (dec.finish(), Ok(())),
            Source::Lz4(dec) => {
                let (raw, res) = dec.finish();
                (raw, res)
            }
        };
        let raw = self.left.insert(raw);
        if lz4_end.is_err() {
            return Err(Error::Compression(format!(
                "Failed to decompress lz4 segment {}: truncated lz4 frame",
                self.path.display()
            )));
        }
        if self.header.compression != Compression::Lz4 {
            return Ok(());
        }
        let mut probe = [0u8; 1];
        match raw.read(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(Error::Compression(format!(
                "Trailing bytes after the lz4 frame of segment {}",
                self.path.display()
            ))),
            Err(e) => Err(io_err("Failed to read", &self.path, e)),
        }
    }

    /// Ends the iteration with `outcome`; a segment opened with [`SegmentReader::stream`] is
    /// checked first (the rest of its file read through its sums), and a failed check is
    /// the error, whatever `outcome` says: the damage it shows explains a decoding error.
    fn conclude(&mut self, outcome: Result<()>) -> Result<()> {
        self.done = true;
        let raw = match self.reader.take() {
            Some(reader) => Some(match reader.into_inner() {
                Source::Plain(raw) => raw,
                Source::Zstd(dec) => dec.finish(),
                Source::Lz4(dec) => dec.finish().0,
            }),
            None => self.left.take(),
        };
        let Some(raw) = raw else {
            return outcome;
        };
        let input = raw.into_inner().into_inner();
        input.settle(&self.path)?;
        outcome
    }
}

impl Iterator for Records {
    type Item = Result<RawRecord>;

    fn next(&mut self) -> Option<Result<RawRecord>> {
        if self.done {
            return None;
        }
        if let Some(e) = self.pending_error.take() {
            return self.conclude(Err(e)).err().map(Err);
        }
        match self.read_record() {
            Ok(Some(record)) => {
                if self.count < self.header.record_count {
                    self.count += 1;
                    return Some(Ok(record));
                }
                // More records than the header says: count them for the message.
                let mut found = self.count + 1;
                let outcome = loop {
                    match self.read_record() {
                        Ok(Some(_)) => found += 1,
                        Ok(None) => {
                            break Err(ser(format!(
                                "Expected {} records but found {found}",
                                self.header.record_count
                            )))
                        }
                        Err(e) => break Err(e),
                    }
                };
                self.conclude(outcome).err().map(Err)
            }
            Ok(None) => {
                let mut outcome = self.finish_stream();
                if outcome.is_ok() && self.count != self.header.record_count {
                    outcome = Err(ser(format!(
                        "Expected {} records but found {}",
                        self.header.record_count, self.count
                    )));
                }
                self.conclude(outcome).err().map(Err)
            }
            Err(e) => self.conclude(Err(e)).err().map(Err),
        }
    }
}
