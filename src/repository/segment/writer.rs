//! [`SegmentWriter`]: streams records through the compressor into a local spool file, then
//! writes the footer and hashes the file, ready to upload. Memory stays flat whatever the
//! segment size.

use sha2::Digest;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::zstd_sink::ZstdSink;
use super::{
    hex_lower, io_err, sha256_file, Compression, SegmentHeader, END_MAGIC, FOOTER_LEN, HEADER_LEN,
    VERSION, VERSION_2, VERSION_3,
};
use crate::error::{Error, Result};

/// What [`SegmentWriter::finish`] produced: the spool file (or the bytes), ready to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedSegment {
    /// The spool file holding the complete segment; it does not exist when `data` holds it.
    pub path: PathBuf,
    /// The complete segment, when it stayed in memory
    /// ([`SegmentWriter::create_in_memory_up_to`]); no spool file was written then.
    pub data: Option<Vec<u8>>,
    /// Records written.
    pub record_count: u64,
    /// backed_up_at (epoch ms) of the first record, `None` when empty.
    pub first_timestamp: Option<i64>,
    /// backed_up_at (epoch ms) of the last record, `None` when empty.
    pub last_timestamp: Option<i64>,
    /// Size of the whole file (header + compressed payload + footer), bytes.
    pub size_bytes: u64,
    /// Payload bytes before compression, including the 4-byte length prefixes.
    pub uncompressed_bytes: u64,
    /// Lowercase SHA-256 hex of the whole file (SPEC.md SegmentMetadata `checksum`).
    pub checksum: String,
    /// The segment format version written (header byte 4).
    pub version: u8,
}

/// Where a segment's bytes go while it is built: memory until they would pass `spill_at`
/// bytes, then its spool file (created then, with what memory held).
enum Spool {
    Memory {
        buf: Vec<u8>,
        path: PathBuf,
        spill_at: usize,
    },
    File(File),
}

impl Spool {
    /// The spool file at `path`, created now; a spool file is never shared, so an existing
    /// one is a bug, not data to truncate.
    fn create_file(path: &Path) -> std::io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
    }
}

impl Write for Spool {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        match self {
            Spool::Memory {
                buf,
                path,
                spill_at,
            } => {
                if buf.len() + data.len() <= *spill_at {
                    buf.extend_from_slice(data);
                    return Ok(data.len());
                }
                let mut file = Spool::create_file(path)?;
                file.write_all(buf)?;
                *self = Spool::File(file);
                self.write(data)
            }
            Spool::File(f) => f.write(data),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Spool::Memory { .. } => Ok(()),
            Spool::File(f) => f.flush(),
        }
    }
}

/// Counts and CRCs the bytes written to the spool after the header.
struct CrcWriter {
    file: Spool,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Write for CrcWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

enum Sink {
    Plain(CrcWriter),
    Zstd(ZstdSink<CrcWriter>),
    Lz4(lz4::Encoder<CrcWriter>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Zstd(w) => w.write(buf),
            Sink::Lz4(w) => w.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(buf),
            Sink::Zstd(w) => w.write_all(buf),
            Sink::Lz4(w) => w.write_all(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Zstd(w) => w.flush(),
            Sink::Lz4(w) => w.flush(),
        }
    }
}

/// Bytes handed to the compressor at a time. zstd compresses large contiguous inputs about a
/// third faster than 64 KiB pieces (measured at level 3 on record JSON: 135 vs 98 MB/s).
const COMPRESS_CHUNK: usize = 1 << 20;

/// Input bytes per zstd job when compression runs on worker threads: small jobs keep the
/// memory of each segment being written to a few MiB (workers + 2 jobs, plus the window).
const ZSTD_JOB_SIZE: u32 = 1 << 20;

/// Mean body size (bytes) from which a queue's records count as large: their compression, not
/// the broker, bounds a backup, and zstd gets worker threads even on a small machine.
pub const LARGE_BODY_BYTES: usize = 16 * 1024;

/// zstd worker threads for a segment whose records carry bodies of `mean_body_bytes` on
/// average, or `RMQ_BACKUP_ZSTD_WORKERS` when set (0 = compress on the segment builder's
/// thread). The workers are the compression pool: zstd compresses the segment's 1 MiB jobs on
/// them in parallel while the builder goes on encoding records, and still writes one frame (the
/// RBAK format is unchanged: SPEC.md "Segment file"). A pool that compressed independent blocks
/// would need one frame per block, which other readers of the format may not expect.
///
/// Default (cores from [`crate::cores`]): large bodies
/// ([`LARGE_BODY_BYTES`]) get one worker per core, at most 8; small bodies get none on a
/// machine of 2 cores or fewer, else the cores less one, at most 8. Measured on 2 cores shared
/// with the broker (release, 2 rounds): 64 KiB random bodies backed up at 649 msg/s without
/// workers, 702 with 1 and 913 with 2 (RSS 26 -> 38 MB); 100,000 x 1 KiB text fell from 0.94 to
/// 0.81-0.86 of the raw read with 2, the workers taking CPU the broker needed to deliver.
pub fn zstd_workers(mean_body_bytes: usize) -> u32 {
    static FORCED: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("RMQ_BACKUP_ZSTD_WORKERS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    forced.unwrap_or_else(|| default_zstd_workers(crate::cores(), mean_body_bytes))
}

/// [`zstd_workers`]' default for a machine of `cores` cores.
pub(super) fn default_zstd_workers(cores: usize, mean_body_bytes: usize) -> u32 {
    if mean_body_bytes >= LARGE_BODY_BYTES {
        cores.min(8) as u32
    } else if cores <= 2 {
        0
    } else {
        (cores - 1).min(8) as u32
    }
}

/// zstd worker threads of every segment being written in this process, against a budget of
/// one per core, at most 8 (`RMQ_BACKUP_ZSTD_WORKERS` times 8 when set): segments of queues
/// backed up at once share the cores instead of each starting a worker per core (4 queues of
/// large bodies started 32 compression threads on 2 cores).
mod worker_budget {
    use std::sync::atomic::{AtomicU32, Ordering};

    static IN_USE: AtomicU32 = AtomicU32::new(0);

    /// Computed once.
    fn budget() -> u32 {
        static BUDGET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        *BUDGET.get_or_init(|| {
            let cores = crate::cores() as u32;
            let forced = super::zstd_workers(0);
            cores.min(8).max(forced.saturating_mul(8).min(64))
        })
    }

    /// Takes up to `want` workers from the budget; returns how many it took (maybe 0: the
    /// segment is then compressed on its builder's thread).
    pub(super) fn claim(want: u32) -> u32 {
        let budget = budget();
        let mut taken = 0;
        let _ = IN_USE.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            taken = want.min(budget.saturating_sub(used));
            Some(used + taken)
        });
        taken
    }

    /// Gives back `n` workers taken by [`claim`].
    pub(super) fn release(n: u32) {
        if n > 0 {
            IN_USE.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// Streams records into a segment spool file.
///
/// `create` writes a 32-byte placeholder header and starts the compressor; `append` adds one
/// record; `finish` ends the compressed frame, writes the real header and the footer, and
/// checksums the file. The spool file is not fsynced: it is a local staging copy, and storage
/// makes the stored segment durable. Dropping a writer without a successful `finish` removes
/// its spool file (a failed run leaves no plaintext behind: docs/encryption.md "Encryption at rest");
/// [`SegmentWriter::discard`] does so and reports a failure to remove it.
pub struct SegmentWriter {
    path: PathBuf,
    compression: Compression,
    sink: Option<BufWriter<Sink>>,
    record_count: u64,
    first_timestamp: Option<i64>,
    last_timestamp: Option<i64>,
    uncompressed_bytes: u64,
    /// Set by a successful `finish`: the spool file is the caller's from then on.
    finished: bool,
    /// zstd workers taken from the process's budget (`worker_budget`), given back on drop.
    workers: u32,
    /// The format version written ([`VERSION`], [`VERSION_2`] or [`VERSION_3`]).
    version: u8,
}

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        worker_budget::release(self.workers);
        if !self.finished {
            self.sink = None; // closes the file
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl SegmentWriter {
    /// Creates (truncating) the spool file at `spool_path`. `level` is the zstd level (SPEC.md
    /// "backup" `compression_level`, 1 to 22); it is ignored for lz4 (fast mode) and none.
    ///
    /// Errors: `Error::Io` when the file cannot be created or written, `Error::Compression` when
    /// the compressor cannot start (for example an invalid level).
    pub fn create(
        spool_path: &Path,
        compression: Compression,
        level: i32,
    ) -> Result<SegmentWriter> {
        SegmentWriter::create_with_workers(spool_path, compression, level, zstd_workers(0))
    }

    /// [`SegmentWriter::create`] with up to `workers` zstd worker threads (0: compress on the
    /// caller's thread; fewer when the segments being written take the process's budget of one
    /// per core); see [`zstd_workers`].
    pub fn create_with_workers(
        spool_path: &Path,
        compression: Compression,
        level: i32,
        workers: u32,
    ) -> Result<SegmentWriter> {
        let file = Spool::create_file(spool_path)
            .map_err(|e| io_err("Failed to create", spool_path, e))?;
        SegmentWriter::start(spool_path, Spool::File(file), compression, level, workers)
    }

    /// [`SegmentWriter::create_with_workers`], the segment kept in memory while it takes at
    /// most `spill_at` bytes (compressed) and written to its spool file from then on: a small
    /// segment never touches the disk until storage stores it ([`FinishedSegment::data`]).
    /// Measured: 5,000 queues of 4 small messages, a spool file created and removed per
    /// segment took 40% of a backup's CPU in ext4's inode allocation.
    ///
    /// Errors: as `create_with_workers`; a failure to create the spool file comes from the
    /// `append` or `finish` that fills memory.
    pub fn create_in_memory_up_to(
        spool_path: &Path,
        compression: Compression,
        level: i32,
        workers: u32,
        spill_at: usize,
    ) -> Result<SegmentWriter> {
        let spool = Spool::Memory {
            buf: Vec::new(),
            path: spool_path.to_path_buf(),
            spill_at,
        };
        SegmentWriter::start(spool_path, spool, compression, level, workers)
    }

    /// Writes the placeholder header to `file` and starts the compressor.
    fn start(
        spool_path: &Path,
        mut file: Spool,
        compression: Compression,
        level: i32,
        workers: u32,
    ) -> Result<SegmentWriter> {
        file.write_all(&[0u8; HEADER_LEN as usize])
            .map_err(|e| io_err("Failed to write", spool_path, e))?;
        let crc = CrcWriter {
            file,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let mut claimed = 0;
        let sink = match compression {
            Compression::None => Sink::Plain(crc),
            Compression::Zstd => {
                let taken = worker_budget::claim(workers);
                match ZstdSink::new(crc, level, taken, ZSTD_JOB_SIZE) {
                    Ok(sink) => {
                        claimed = taken;
                        Sink::Zstd(sink)
                    }
                    Err(e) => {
                        worker_budget::release(taken);
                        return Err(Error::Compression(format!(
                            "Failed to start zstd level {level}: {e}"
                        )));
                    }
                }
            }
            Compression::Lz4 => Sink::Lz4(
                lz4::EncoderBuilder::new()
                    .build(crc)
                    .map_err(|e| Error::Compression(format!("Failed to start lz4: {e}")))?,
            ),
        };
        Ok(SegmentWriter {
            path: spool_path.to_path_buf(),
            compression,
            sink: Some(BufWriter::with_capacity(COMPRESS_CHUNK, sink)),
            record_count: 0,
            first_timestamp: None,
            last_timestamp: None,
            uncompressed_bytes: 0,
            finished: false,
            workers: claimed,
            version: VERSION,
        })
    }

    /// Writes segment format `version` ([`VERSION`], the default, [`VERSION_2`] or [`VERSION_3`];
    /// docs/segment-format.md) instead; set before the first record.
    ///
    /// Errors: `Error::Serialization` for another version, or once a record was appended.
    pub fn with_version(mut self, version: u8) -> Result<SegmentWriter> {
        if ![VERSION, VERSION_2, VERSION_3].contains(&version) {
            return Err(Error::Serialization(format!(
                "Unsupported segment version: {version}"
            )));
        }
        if self.record_count > 0 {
            return Err(Error::Serialization(
                "The segment version is chosen before the first record".into(),
            ));
        }
        self.version = version;
        Ok(self)
    }

    /// The format version this writer writes.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// Appends one record: its JSON (one BackupRecord) and its backed_up_at (epoch ms), which
    /// becomes the header's first/last timestamp. The record is written in version 1 (`with_version` not called, or given [`VERSION`]).
    ///
    /// Errors: `Error::Serialization` when the JSON is 4 GiB or larger (the length prefix is a
    /// u32) or the writer writes version 2 or 3, `Error::Io` when writing fails.
    pub fn append(&mut self, record_json: &[u8], backed_up_at: i64) -> Result<()> {
        if self.version != VERSION {
            return Err(Error::Serialization(format!(
                "A version {} segment takes records as metadata and body, not JSON",
                self.version
            )));
        }
        self.append_frames(&[record_json], backed_up_at)
    }

    /// Appends one record in version 2 or 3 ([`SegmentWriter::with_version`]): its metadata
    /// (`crate::repository::record::encode_meta`, `encode_meta_v3`) and its body as raw bytes, each after its u32
    /// little-endian length, and its backed_up_at (epoch ms) for the header.
    ///
    /// Errors: `Error::Serialization` when either part is 4 GiB or larger or the writer writes
    /// version 1, `Error::Io` when writing fails.
    pub fn append_parts(&mut self, meta: &[u8], body: &[u8], backed_up_at: i64) -> Result<()> {
        if self.version == VERSION {
            return Err(Error::Serialization(format!(
                "A version {} segment takes records as JSON, not metadata and body",
                self.version
            )));
        }
        self.append_frames(&[meta, body], backed_up_at)
    }

    /// Writes one record as `frames`, each a u32 little-endian length and its bytes.
    fn append_frames(&mut self, frames: &[&[u8]], backed_up_at: i64) -> Result<()> {
        let mut lens = [0u32; 2];
        for (len, frame) in lens.iter_mut().zip(frames) {
            *len = u32::try_from(frame.len()).map_err(|_| {
                Error::Serialization(format!(
                    "Record of {} bytes exceeds the 4 GiB record limit",
                    frame.len()
                ))
            })?;
        }
        let sink = self
            .sink
            .as_mut()
            .ok_or_else(|| Error::Io("Segment writer already failed".into()))?;
        let res = frames.iter().zip(lens).try_for_each(|(frame, len)| {
            sink.write_all(&len.to_le_bytes())
                .and_then(|()| sink.write_all(frame))
        });
        if let Err(e) = res {
            // The frame is now in an unknown state: refuse further use.
            self.sink = None;
            return Err(io_err("Failed to write", &self.path, e));
        }
        self.record_count += 1;
        self.first_timestamp.get_or_insert(backed_up_at);
        self.last_timestamp = Some(backed_up_at);
        self.uncompressed_bytes += frames.iter().map(|f| 4 + f.len() as u64).sum::<u64>();
        Ok(())
    }

    /// Records appended so far.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Payload bytes appended so far before compression, including the 4-byte prefixes (the
    /// quantity `segment_max_bytes` limits).
    pub fn uncompressed_bytes(&self) -> u64 {
        self.uncompressed_bytes
    }

    /// The spool file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compression in use.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// For zstd, the payload appended so far and the compressed bytes it became: the
    /// compressor is flushed first (the workers' jobs finished, a block boundary the frame's end
    /// would make anyway), so call it when no more records come. `None` for lz4 and none, and
    /// when the flush fails (`finish` then reports the failure).
    pub fn zstd_progress(&mut self) -> Option<(u64, u64)> {
        let sink = self.sink.as_mut()?;
        if !matches!(sink.get_ref(), Sink::Zstd(_)) || sink.flush().is_err() {
            return None;
        }
        match sink.get_ref() {
            Sink::Zstd(z) => Some(z.progress()),
            _ => None,
        }
    }

    /// Ends the compressed frame, writes the header (count, first/last timestamp, 0 when
    /// empty) and the footer (CRC32 of header + payload, `KABR`), and computes the SHA-256 of
    /// the file by reading it back.
    ///
    /// Errors: `Error::Io` for file failures, `Error::Compression` when the compressor fails to
    /// end its frame.
    pub fn finish(mut self) -> Result<FinishedSegment> {
        let path = self.path.clone();
        let sink = self
            .sink
            .take()
            .ok_or_else(|| Error::Io("Segment writer already failed".into()))?;
        let sink = sink
            .into_inner()
            .map_err(|e| io_err("Failed to write", &path, e.into_error()))?;
        let crcw = match sink {
            Sink::Plain(w) => w,
            Sink::Zstd(enc) => enc
                .finish()
                .map_err(|e| Error::Compression(format!("Failed to end zstd frame: {e}")))?,
            Sink::Lz4(enc) => {
                let (w, res) = enc.finish();
                res.map_err(|e| Error::Compression(format!("Failed to end lz4 frame: {e}")))?;
                w
            }
        };
        let CrcWriter {
            file,
            crc: payload_crc,
            bytes: payload_len,
        } = crcw;
        let header = SegmentHeader {
            version: self.version,
            compression: self.compression,
            record_count: self.record_count,
            first_timestamp: self.first_timestamp.unwrap_or(0),
            last_timestamp: self.last_timestamp.unwrap_or(0),
        }
        .to_bytes();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&header);
        crc.combine(&payload_crc);
        let crc = crc.finalize();
        let mut footer = [0u8; 8];
        footer[0..4].copy_from_slice(&crc.to_le_bytes());
        footer[4..8].copy_from_slice(END_MAGIC);
        let size_bytes = HEADER_LEN + payload_len + FOOTER_LEN;
        let (data, checksum) = match file {
            Spool::Memory { mut buf, .. } => {
                buf.extend_from_slice(&footer);
                buf[..HEADER_LEN as usize].copy_from_slice(&header);
                let checksum = hex_lower(&sha2::Sha256::digest(&buf));
                (Some(buf), checksum)
            }
            Spool::File(mut file) => {
                let write = |file: &mut File| -> std::io::Result<()> {
                    file.write_all(&footer)?;
                    file.seek(SeekFrom::Start(0))?;
                    file.write_all(&header)
                };
                write(&mut file).map_err(|e| io_err("Failed to write", &path, e))?;
                drop(file);
                (None, sha256_file(&path)?)
            }
        };
        self.finished = true;
        Ok(FinishedSegment {
            path,
            data,
            record_count: self.record_count,
            first_timestamp: self.first_timestamp,
            last_timestamp: self.last_timestamp,
            size_bytes,
            uncompressed_bytes: self.uncompressed_bytes,
            checksum,
            version: self.version,
        })
    }

    /// Abandons the segment and removes its spool file.
    ///
    /// Errors: `Error::Io` when the file exists but cannot be removed.
    pub fn discard(mut self) -> Result<()> {
        self.sink = None; // closes the file
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("Failed to remove", &self.path, e)),
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn segments_written_at_once_share_one_budget_of_zstd_workers() {
        let dir = std::env::temp_dir().join(format!("rmqb-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let writers: Vec<SegmentWriter> = (0..6)
            .map(|i| {
                SegmentWriter::create_with_workers(
                    &dir.join(format!("s{i}")),
                    Compression::Zstd,
                    3,
                    8,
                )
                .unwrap()
            })
            .collect();
        let taken: u32 = writers.iter().map(|w| w.workers).sum();
        // Other tests may hold some of the budget: never more than it, whatever they do.
        assert!(taken <= cores.min(8), "{taken} workers on {cores} cores");
        drop(writers);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
