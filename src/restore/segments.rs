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

/// Fetches each segment of `backup` that meets the time window into a spool file, verifies
/// it (CRC32), decodes its records and sends them in batches, in order. Records outside the
/// window are counted in `outside_window`. The first `skip` records inside the window (those
/// an earlier run published) are left out; whole segments of them are not even fetched when
/// no time window is set.
pub(super) fn decode_segments(
    opts: &RestoreOptions,
    storage: &dyn Storage,
    spool: &Path,
    backup: &QueueBackup,
    tx: &crossbeam_channel::Sender<Vec<BackupRecord>>,
    outside_window: &AtomicU64,
    mut skip: u64,
) -> Result<()> {
    let windowless = opts.time_window_start.is_none() && opts.time_window_end.is_none();
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
        let result = (|| -> Result<()> {
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
            let mut batch = Vec::with_capacity(RECORD_BATCH);
            let mut batch_bytes = 0usize;
            for json in reader.records() {
                let record = decode_record(&json?)?;
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
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            Ok(())
        })();
        let _ = std::fs::remove_file(&path);
        result?;
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
