//! A queue's records from storage: each segment that meets the time window fetched to a spool
//! file, verified against the manifest (CRC32, SHA-256, record count) before any record of it
//! is used, decoded, filtered by the window, and sent in batches to the publisher, in order.

use crate::config::RestoreOptions;
use crate::error::{Error, Result};
use crate::manifest::{QueueBackup, SegmentMetadata};
use crate::record::{decode_record, BackupRecord};
use crate::segment::{sha256_file, SegmentReader};
use crate::spool::unique_file;
use crate::storage::Storage;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Records per batch from the segment decoder to the publisher.
const RECORD_BATCH: usize = 256;
/// Body bytes per batch from the segment decoder to the publisher.
const RECORD_BATCH_BYTES: usize = 1 << 20;

/// True when a segment may hold records inside the time window.
pub(super) fn segment_in_window(s: &SegmentMetadata, opts: &RestoreOptions) -> bool {
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

/// Raw record JSON per chunk handed to a decode worker, bytes.
const CHUNK_JSON_BYTES: usize = 1 << 20;

/// Decode workers per queue being restored: one per core (`available_parallelism`), at most 4.
fn decode_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
}

/// A chunk of one segment's raw records on its way to a decode worker, and where the worker
/// sends the decoded records.
type DecodeJob = (
    Vec<Vec<u8>>,
    crossbeam_channel::Sender<Result<Vec<BackupRecord>>>,
);

/// A decoded chunk to be forwarded in order, and how many more in-window records to skip
/// from here on (an earlier run published them).
type Pending = (crossbeam_channel::Receiver<Result<Vec<BackupRecord>>>, u64);

/// Fetches each segment of `backup` that meets the time window into a spool file, verifies
/// it (CRC32), decodes its records and sends them in batches, in order. Records outside the
/// window are counted in `outside_window`. The first `skip` records inside the window (those
/// an earlier run published) are left out; whole segments of them are not even fetched when
/// no time window is set.
///
/// This thread fetches, verifies and decompresses; chunks of raw records are decoded on
/// [`decode_workers`] threads at once, and a forwarding thread puts them back in order,
/// applies the window and the skip, and sends them to the publisher (bounded channels: at most
/// a few 1 MiB chunks in flight per queue).
pub(super) fn decode_segments(
    opts: &RestoreOptions,
    storage: &dyn Storage,
    spool: &Path,
    backup: &QueueBackup,
    tx: &crossbeam_channel::Sender<Vec<BackupRecord>>,
    outside_window: &AtomicU64,
    skip: u64,
) -> Result<()> {
    let workers = decode_workers();
    let (job_tx, job_rx) = crossbeam_channel::bounded::<DecodeJob>(workers);
    let (order_tx, order_rx) = crossbeam_channel::bounded::<Pending>(workers);
    std::thread::scope(|s| {
        for _ in 0..workers {
            let job_rx = job_rx.clone();
            crate::spool::spawn_named(s, "record-decoder", move || {
                for (raw, done) in job_rx {
                    let decoded = raw.iter().map(|json| decode_record(json)).collect();
                    let _ = done.send(decoded);
                }
            });
        }
        drop(job_rx);
        let forwarder = crate::spool::spawn_named(s, "record-forwarder", move || {
            forward_in_order(order_rx, tx, outside_window, opts)
        });
        let read = read_segments(opts, storage, spool, backup, skip, &job_tx, &order_tx);
        drop(job_tx);
        drop(order_tx);
        let forwarded = forwarder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("record forwarder panicked".into())));
        read.and(forwarded)
    })
}

/// Fetches, verifies and decompresses the segments, handing chunks of raw records to the
/// decode workers and their places in line to the forwarder.
fn read_segments(
    opts: &RestoreOptions,
    storage: &dyn Storage,
    spool: &Path,
    backup: &QueueBackup,
    mut skip: u64,
    jobs: &crossbeam_channel::Sender<DecodeJob>,
    order: &crossbeam_channel::Sender<Pending>,
) -> Result<()> {
    let windowless = opts.time_window_start.is_none() && opts.time_window_end.is_none();
    // Hands one chunk over; false when the publisher side stopped (it reports why).
    let hand_over = |raw: Vec<Vec<u8>>, skip_from_here: u64| -> bool {
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        order.send((done_rx, skip_from_here)).is_ok() && jobs.send((raw, done_tx)).is_ok()
    };
    for segment in backup
        .segments
        .iter()
        .filter(|s| segment_in_window(s, opts))
    {
        if windowless && skip >= segment.record_count {
            skip -= segment.record_count;
            continue;
        }
        let path = unique_file(spool, &segment.key);
        let result = (|| -> Result<bool> {
            storage.get_to_file(&segment.key, &path)?;
            let reader = verified_segment(&path, segment)?;
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
            for json in reader.records() {
                let json = json?;
                chunk_bytes += json.len();
                chunk.push(json);
                if chunk.len() >= RECORD_BATCH || chunk_bytes >= CHUNK_JSON_BYTES {
                    chunk_bytes = 0;
                    let full = std::mem::take(&mut chunk);
                    if !hand_over(full, std::mem::take(&mut skip)) {
                        return Ok(false);
                    }
                }
            }
            Ok(chunk.is_empty() || hand_over(chunk, std::mem::take(&mut skip)))
        })();
        let _ = std::fs::remove_file(&path);
        if !result? {
            break;
        }
    }
    Ok(())
}

/// Receives the decoded chunks in their order, leaves out records outside the window and the
/// records to skip, and sends batches to the publisher.
fn forward_in_order(
    order: crossbeam_channel::Receiver<Pending>,
    tx: &crossbeam_channel::Sender<Vec<BackupRecord>>,
    outside_window: &AtomicU64,
    opts: &RestoreOptions,
) -> Result<()> {
    let mut skip = 0u64;
    let mut batch = Vec::with_capacity(RECORD_BATCH);
    let mut batch_bytes = 0usize;
    for (done, more_skip) in order {
        skip += more_skip;
        let records = done
            .recv()
            .unwrap_or_else(|_| Err(Error::Io("a record decoder stopped".into())))?;
        for record in records {
            if !in_window(record.backed_up_at, opts) {
                outside_window.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if skip > 0 {
                skip -= 1;
                continue;
            }
            batch_bytes += record.body().len();
            batch.push(record);
            if batch.len() >= RECORD_BATCH || batch_bytes >= RECORD_BATCH_BYTES {
                batch_bytes = 0;
                let full = std::mem::replace(&mut batch, Vec::with_capacity(RECORD_BATCH));
                if tx.send(full).is_err() {
                    return Ok(()); // the publisher stopped; it reports why
                }
            }
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(batch);
    }
    Ok(())
}

/// Opens a fetched segment and checks it against the manifest before anything of it is
/// published: CRC32 (in `SegmentReader::open`), SHA-256 and record count, so a segment that
/// is not the one the backup wrote (a leftover of another run, a damaged file) is refused.
fn verified_segment(path: &Path, segment: &SegmentMetadata) -> Result<SegmentReader> {
    let with_key =
        |e: Error| Error::Serialization(format!("{} (segment {})", e.message(), segment.key));
    let reader = SegmentReader::open(path).map_err(with_key)?;
    let sha = sha256_file(path)?;
    if sha != segment.checksum {
        return Err(with_key(Error::Serialization(format!(
            "SHA-256 mismatch: expected {}, got {sha}",
            segment.checksum
        ))));
    }
    if reader.header().record_count != segment.record_count {
        return Err(with_key(Error::Serialization(format!(
            "Expected {} records but found {}",
            segment.record_count,
            reader.header().record_count
        ))));
    }
    Ok(reader)
}
