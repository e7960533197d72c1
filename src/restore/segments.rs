//! A queue's records from storage: each segment that meets the time window fetched to a spool
//! file, verified against the manifest (CRC32, SHA-256, record count) before any record of it
//! is used, decoded, filtered by the window, and sent in batches to the publisher, in order.

use crate::config::RestoreOptions;
use crate::error::{Error, Result};
use crate::repository::encryption::Identities;
use crate::repository::fetch::{fetch_segment, Check, FetchedSegment};
use crate::repository::manifest::{QueueBackup, SegmentMetadata};
use crate::repository::record::BackupRecord;
use crate::repository::segment::{RawRecord, SegmentReader};
use crate::repository::spool::unique_file;
use crate::repository::storage::Storage;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Records per batch from the segment decoder to the publisher.
const RECORD_BATCH: usize = 256;
/// Body bytes per batch from the segment decoder to the publisher.
const RECORD_BATCH_BYTES: usize = 1 << 20;

/// True when a segment may hold records inside the time window.
pub(crate) fn segment_in_window(s: &SegmentMetadata, opts: &RestoreOptions) -> bool {
    let after_start = opts
        .time_window_start
        .is_none_or(|start| s.last_timestamp.is_none_or(|last| last >= start));
    let before_end = opts
        .time_window_end
        .is_none_or(|end| s.first_timestamp.is_none_or(|first| first <= end));
    after_start && before_end
}

pub(super) fn in_window(backed_up_at: i64, opts: &RestoreOptions) -> bool {
    opts.time_window_start.is_none_or(|s| backed_up_at >= s)
        && opts.time_window_end.is_none_or(|e| backed_up_at <= e)
}

/// Raw record bytes (JSON, or metadata and body) per chunk handed to a decode worker.
const CHUNK_RAW_BYTES: usize = 1 << 20;

/// Chunks decoded at once for each of `queues` queues restored at once: the cores
/// ([`crate::cores`]) shared among them, at least 1 and at most 4 each (1: the queue's
/// fetching thread decodes). Measured on 2 cores: 8 queues restored at once with 2 decoders
/// each peaked at 103-146 MB (threads, their malloc arenas and chunks in flight) against
/// 51-80 MB with one decoder each.
pub(super) fn decode_workers(queues: usize) -> usize {
    (crate::cores() / queues.max(1)).clamp(1, 4)
}

/// A decoded chunk to be forwarded in order.
type Pending<T> = crossbeam_channel::Receiver<Result<Vec<T>>>;

/// What the segment decoder sends on: records as they are (`cat`), or each converted on the
/// decode threads into what its consumer needs (`super::outgoing::Outgoing` for a restore).
pub(crate) trait Decoded: Send + 'static {
    /// How its segments are checked: before any record is handed over (a restore publishes
    /// what it gets), or as they are read (`cat`, whose output ends with the error of a
    /// segment that fails: issue 38, item 5).
    const CHECK: Check;

    /// Converts one decoded record.
    fn from_record(record: BackupRecord) -> Self;
    /// When the record was backed up, epoch ms (the time window).
    fn backed_up_at(&self) -> i64;
    /// Body bytes (the size of a batch).
    fn body_len(&self) -> usize;
}

impl Decoded for BackupRecord {
    const CHECK: Check = Check::AsRead;

    fn from_record(record: BackupRecord) -> Self {
        record
    }

    fn backed_up_at(&self) -> i64 {
        self.backed_up_at
    }

    fn body_len(&self) -> usize {
        self.body().len()
    }
}

/// Fetches each segment of `backup` that meets the time window into a spool file, verifies
/// it (CRC32), decodes its records and sends them in batches, in order. Records outside the
/// window are counted in `outside_window`. The first `skip` records inside the window (those
/// an earlier run published) are left out; whole segments of them are not even fetched when
/// no time window is set.
///
/// This thread fetches, verifies and decompresses, and with one worker ([`decode_workers`]:
/// more queues restored at once than cores) decodes the records itself. With more, two
/// segment readers fetch, verify and decompress successive segments at once
/// ([`segment_readers`]), and up to
/// `workers` chunks of raw records at once are decoded on rayon's pool (one thread per core,
/// shared by every queue: DESIGN.md "a rayon pool for CPU work") and a forwarding thread puts
/// them back in order (bounded channels: a few 1 MiB chunks in flight). Either way [`Forward`]
/// applies the window and the skip and sends batches to the publisher.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_segments<T: Decoded>(
    opts: &RestoreOptions,
    storage: &dyn Storage,
    spool: &Path,
    backup: &QueueBackup,
    tx: &crossbeam_channel::Sender<Vec<T>>,
    outside_window: &AtomicU64,
    skip: u64,
    workers: usize,
    keys: Option<&Identities>,
) -> Result<()> {
    fn decode<T: Decoded>(raw: Vec<RawRecord>) -> Result<Vec<T>> {
        raw.into_iter()
            .map(|r| r.into_record().map(T::from_record))
            .collect()
    }
    let (todo, skip) = segments_to_read(&backup.segments, opts, skip);
    let read =
        |chunk_records, readers, hand_over: &mut dyn FnMut(Vec<RawRecord>) -> Result<bool>| {
            read_segments(
                storage,
                spool,
                backup,
                &todo,
                chunk_records,
                readers,
                keys,
                T::CHECK,
                hand_over,
            )
        };
    if workers <= 1 {
        let mut forward = Forward::new(tx, outside_window, opts, skip);
        // One record at a time: nothing held twice (raw and decoded) per queue.
        read(1, 1, &mut |raw| Ok(forward.push(decode(raw)?)))?;
        forward.finish();
        return Ok(());
    }
    let (order_tx, order_rx) = crossbeam_channel::bounded::<Pending<T>>(workers);
    std::thread::scope(|s| {
        let forwarder = crate::repository::spool::spawn_named(s, "record-forwarder", move || {
            let mut forward = Forward::new(tx, outside_window, opts, skip);
            for done in order_rx {
                let records = done
                    .recv()
                    .unwrap_or_else(|_| Err(Error::Io("a record decoder stopped".into())))?;
                if !forward.push(records) {
                    return Ok(()); // the publisher stopped; it reports why
                }
            }
            forward.finish();
            Ok(())
        });
        let read = read(RECORD_BATCH, segment_readers(workers), &mut |raw| {
            let (done_tx, done_rx) = crossbeam_channel::bounded(1);
            // Waits while `workers` chunks are on their way (the forwarder takes them in order).
            if order_tx.send(done_rx).is_err() {
                return Ok(false);
            }
            rayon::spawn(move || {
                let _ = done_tx.send(decode(raw));
            });
            Ok(true)
        });
        drop(order_tx);
        let forwarded = forwarder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("record forwarder panicked".into())));
        read.and(forwarded)
    })
}

/// Segments of one queue fetched, verified and decompressed at once, each by its own thread
/// (handed over in order): 2 when the queue has a core to spare (`workers` > 1), else 1.
/// Measured on 2 cores, 5,000 x 64 KiB random bodies: with one such thread, it was busy 83%
/// of the restore (zstd 48% of the process, SHA-256 6%) while the decode pool waited.
fn segment_readers(workers: usize) -> usize {
    workers.clamp(1, 2)
}

/// The segments to read, in order, and how many in-window records to skip from the first of
/// them: those in the time window, less the whole segments at the start of the `skip` records
/// an earlier run published (only without a time window, where every record counts).
pub(super) fn segments_to_read<'a>(
    segments: &'a [SegmentMetadata],
    opts: &RestoreOptions,
    mut skip: u64,
) -> (Vec<&'a SegmentMetadata>, u64) {
    let windowless = opts.time_window_start.is_none() && opts.time_window_end.is_none();
    let mut todo = Vec::new();
    for segment in segments.iter().filter(|s| segment_in_window(s, opts)) {
        if windowless && todo.is_empty() && skip >= segment.record_count {
            skip -= segment.record_count;
            continue;
        }
        todo.push(segment);
    }
    (todo, skip)
}

/// What a segment reader hands over: a chunk of raw records, or the end of a segment (an
/// error ends the segment and the reader).
enum Piece {
    Chunk(Vec<RawRecord>),
    End(Result<()>),
}

/// Fetches, verifies (decrypting with `keys` what is stored encrypted) and decompresses the
/// segments `todo` of `backup`, handing chunks of at most `chunk_records` raw records to
/// `hand_over`, in order, which says false when the publisher side stopped. With more than one reader ([`segment_readers`]), reader `r` takes
/// segments `r`, `r + readers`, ... (bounded channels: 2 chunks each) and this thread takes
/// their chunks segment by segment, so a segment's error is reported after the records before
/// it, as with one reader.
#[allow(clippy::too_many_arguments)]
fn read_segments(
    storage: &dyn Storage,
    spool: &Path,
    backup: &QueueBackup,
    todo: &[&SegmentMetadata],
    chunk_records: usize,
    readers: usize,
    keys: Option<&Identities>,
    check: Check,
    hand_over: &mut dyn FnMut(Vec<RawRecord>) -> Result<bool>,
) -> Result<()> {
    let readers = readers.clamp(1, todo.len().max(1));
    if readers == 1 {
        for segment in todo {
            if !read_segment(
                storage,
                spool,
                segment,
                chunk_records,
                keys,
                check,
                hand_over,
            )? {
                break;
            }
        }
        return Ok(());
    }
    std::thread::scope(|s| {
        let mut rxs = Vec::with_capacity(readers);
        let mut handles = Vec::with_capacity(readers);
        for r in 0..readers {
            let (tx, rx) = crossbeam_channel::bounded::<Piece>(2);
            rxs.push(rx);
            let mine: Vec<&SegmentMetadata> =
                todo.iter().skip(r).step_by(readers).copied().collect();
            handles.push(crate::repository::spool::spawn_named(
                s,
                "segment-reader",
                move || {
                    let _log = crate::run::logging::queue_scope(&backup.vhost, &backup.name);
                    for segment in mine {
                        let mut send = |chunk| Ok(tx.send(Piece::Chunk(chunk)).is_ok());
                        let read = read_segment(
                            storage,
                            spool,
                            segment,
                            chunk_records,
                            keys,
                            check,
                            &mut send,
                        );
                        let go = matches!(read, Ok(true));
                        if tx.send(Piece::End(read.map(|_| ()))).is_err() || !go {
                            return; // this thread's consumer stopped, or the segment failed
                        }
                    }
                },
            ));
        }
        let mut take_in_order = || -> Result<()> {
            for i in 0..todo.len() {
                loop {
                    match rxs[i % readers].recv() {
                        Ok(Piece::Chunk(chunk)) => {
                            if !hand_over(chunk)? {
                                return Ok(());
                            }
                        }
                        Ok(Piece::End(read)) => {
                            read?;
                            break;
                        }
                        Err(_) => return Err(Error::Io("a segment reader stopped".into())),
                    }
                }
            }
            Ok(())
        };
        let taken = take_in_order();
        // The readers see their channel closed at their next send and stop.
        drop(rxs);
        let mut joined = Ok(());
        for h in handles {
            if h.join().is_err() {
                joined = Err(Error::Io("a segment reader panicked".into()));
            }
        }
        taken.and(joined)
    })
}

/// Fetches, verifies (as `check` says) and decompresses one segment, handing chunks of at most `chunk_records`
/// raw records (and [`CHUNK_RAW_BYTES`]) to `send`. Ok(false) when `send` said false.
fn read_segment(
    storage: &dyn Storage,
    spool: &Path,
    segment: &SegmentMetadata,
    chunk_records: usize,
    keys: Option<&Identities>,
    check: Check,
    send: &mut dyn FnMut(Vec<RawRecord>) -> Result<bool>,
) -> Result<bool> {
    let path = unique_file(spool, &segment.key);
    // `_files`: the spool files, removed when this segment is done.
    let FetchedSegment {
        reader,
        files: _files,
    } = fetch_segment(storage, &path, segment, keys, check).map_err(|e| with_key(e, segment))?;
    check_count(&reader, segment)?;
    log::debug!(
        "segment {}: {} records",
        segment.key,
        reader.header().record_count
    );
    log::trace!(
        "segment {} verified: {} bytes, sha256 {}, timestamps {:?}..{:?}",
        segment.key,
        segment.size_bytes,
        segment.checksum,
        segment.first_timestamp,
        segment.last_timestamp
    );
    let mut chunk = Vec::new();
    let mut chunk_bytes = 0usize;
    for raw in reader.records() {
        let raw = raw?;
        chunk_bytes += raw.len();
        chunk.push(raw);
        if chunk.len() >= chunk_records || chunk_bytes >= CHUNK_RAW_BYTES {
            chunk_bytes = 0;
            if !send(std::mem::take(&mut chunk))? {
                return Ok(false);
            }
        }
    }
    Ok(chunk.is_empty() || send(chunk)?)
}

/// The records of a queue on their way to the publisher, in order: leaves out records outside
/// the window and the records to skip, and sends batches.
struct Forward<'a, T> {
    tx: &'a crossbeam_channel::Sender<Vec<T>>,
    outside_window: &'a AtomicU64,
    opts: &'a RestoreOptions,
    /// In-window records still to leave out (an earlier run published them).
    skip: u64,
    batch: Vec<T>,
    batch_bytes: usize,
}

impl<'a, T: Decoded> Forward<'a, T> {
    fn new(
        tx: &'a crossbeam_channel::Sender<Vec<T>>,
        outside_window: &'a AtomicU64,
        opts: &'a RestoreOptions,
        skip: u64,
    ) -> Forward<'a, T> {
        Forward {
            tx,
            outside_window,
            opts,
            skip,
            batch: Vec::with_capacity(RECORD_BATCH),
            batch_bytes: 0,
        }
    }

    /// Takes the next records; false when the publisher stopped.
    fn push(&mut self, records: Vec<T>) -> bool {
        for record in records {
            if !in_window(record.backed_up_at(), self.opts) {
                self.outside_window.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            self.batch_bytes += record.body_len();
            self.batch.push(record);
            if self.batch.len() >= RECORD_BATCH || self.batch_bytes >= RECORD_BATCH_BYTES {
                self.batch_bytes = 0;
                let full = std::mem::replace(&mut self.batch, Vec::with_capacity(RECORD_BATCH));
                if self.tx.send(full).is_err() {
                    return false;
                }
            }
        }
        true
    }

    /// Sends the last, partial batch.
    fn finish(self) {
        if !self.batch.is_empty() {
            let _ = self.tx.send(self.batch);
        }
    }
}

/// Names the segment in a format error (other errors name it already, or concern no
/// segment).
fn with_key(e: Error, segment: &SegmentMetadata) -> Error {
    match e {
        Error::Serialization(m) => Error::Serialization(format!("{m} (segment {})", segment.key)),
        other => other,
    }
}

/// Checks the record count of a verified segment (`crate::repository::fetch::fetch_segment` checked its
/// CRC32 and SHA-256) against the manifest before anything of it is published, so a segment
/// that is not the one the backup wrote (a leftover of another run) is refused.
fn check_count(reader: &SegmentReader, segment: &SegmentMetadata) -> Result<()> {
    if reader.header().record_count != segment.record_count {
        return Err(with_key(
            Error::Serialization(format!(
                "Expected {} records but found {}",
                segment.record_count,
                reader.header().record_count
            )),
            segment,
        ));
    }
    Ok(())
}
