//! A rerun of an interrupted backup (same `backup_id`; SPEC.md "States and transitions" rule 1).
//!
//! - With `offset_storage`, a queue the checkpoint database marks completed reuses its stored
//!   segments after each is checked against its recorded size and SHA-256; a queue not
//!   completed is read again from the head (AMQP delivery tags are no offsets).
//! - Without it, every queue is read again.
//!
//! Either way a queue read again writes its segments with numbers after the highest segment of
//! that queue already in storage, so no segment is ever overwritten, and once the rerun's
//! manifest is complete the earlier run's segments it does not list are deleted (best effort:
//! a storage that refuses deletes leaves them, unlisted, and `validate` ignores them).

use super::QueueContext;
use crate::broker::QueueType;
use crate::error::{Error, Result};
use crate::management::QueueInfo;
use crate::manifest::{self, Manifest, QueueBackup, SegmentMetadata};
use crate::segment::sha256_file;
use crate::spool::unique_file;
use crate::storage::Storage;
use std::collections::HashSet;

/// When the checkpoint database says `q` was completed by an earlier run and every one of its
/// segments checks out, the queue's manifest entry made of them; `None` when it must be read.
pub(super) fn completed_earlier(
    ctx: &QueueContext,
    q: &QueueInfo,
    kind: QueueType,
) -> Result<Option<QueueBackup>> {
    let Some(cp) = ctx.checkpoints else {
        return Ok(None);
    };
    let Some(state) = cp.backup_queue(ctx.backup_id, &q.vhost, &q.name)? else {
        return Ok(None);
    };
    if !state.completed {
        log::info!(
            "queue {} in vhost {}: not completed by the earlier run ({} segment(s) stored); read again from the start",
            q.name,
            q.vhost,
            state.segments.len()
        );
        return Ok(None);
    }
    for s in &state.segments {
        if let Err(e) = verify_stored(ctx, s) {
            log::warn!(
                "queue {} in vhost {}: segment {} of the earlier run does not check out ({e}); the queue is read again",
                q.name,
                q.vhost,
                s.key
            );
            return Ok(None);
        }
    }
    log::info!(
        "queue {} in vhost {}: completed by an earlier run; {} verified segment(s) reused",
        q.name,
        q.vhost,
        state.segments.len()
    );
    Ok(Some(QueueBackup::from_segments(
        &q.vhost,
        &q.name,
        kind,
        state.segments,
    )))
}

/// Fetches a stored segment and checks its size and SHA-256 against its metadata.
fn verify_stored(ctx: &QueueContext, s: &SegmentMetadata) -> Result<()> {
    match ctx.storage.head(&s.key)? {
        None => return Err(Error::Storage(format!("Key not found: {}", s.key))),
        Some(size) if size != s.size_bytes => {
            return Err(Error::Storage(format!(
                "{} is {size} bytes, {} recorded",
                s.key, s.size_bytes
            )))
        }
        Some(_) => {}
    }
    let path = unique_file(ctx.spool, &s.key);
    let sha = ctx
        .storage
        .get_to_file(&s.key, &path)
        .and_then(|_| sha256_file(&path));
    let _ = std::fs::remove_file(&path);
    let sha = sha?;
    if sha != s.checksum {
        return Err(Error::Serialization(format!(
            "SHA-256 mismatch: expected {}, got {sha}",
            s.checksum
        )));
    }
    Ok(())
}

/// Starts reading `q`: records the start in the checkpoint database (forgetting an earlier
/// run's partial segments) and returns the sequence number its segments follow (0 on a first
/// run; on a rerun the highest segment number of the queue already in storage).
pub(super) fn start_queue(ctx: &QueueContext, q: &QueueInfo) -> Result<u64> {
    if let Some(cp) = ctx.checkpoints {
        cp.start_backup_queue(ctx.backup_id, &q.vhost, &q.name, q.messages)?;
    }
    if !ctx.rerun {
        return Ok(0);
    }
    let prefix = manifest::queue_prefix(ctx.backup_id, &q.vhost, &q.name);
    let highest = ctx
        .storage
        .list(&prefix)?
        .iter()
        .filter_map(|k| segment_number(k.strip_prefix(&prefix)?))
        .max()
        .unwrap_or(0);
    if highest > 0 {
        log::info!(
            "queue {} in vhost {}: the earlier run stored segments up to {highest}; new segments follow",
            q.name,
            q.vhost
        );
    }
    Ok(highest)
}

/// Where a continuous backup of stream `q` starts (`stop_at_current_depth: false`).
///
/// On a rerun with `offset_storage`, the segments the earlier run stored (and recorded) are
/// kept after each checks out, and reading resumes at the offset after the last record of the
/// last one (a record's `delivery_tag` is its offset + 1): no gap, no duplicate. Segments the
/// earlier run stored without recording them (killed in between) number after the kept ones;
/// they are not listed and are deleted once the rerun completes. Otherwise the stream is read
/// from its first offset, as [`start_queue`] starts a queue.
///
/// Returns (kept segments, the sequence new segments follow, the first offset to read).
pub(super) fn resume_stream(
    ctx: &QueueContext,
    q: &QueueInfo,
) -> Result<(Vec<SegmentMetadata>, u64, u64)> {
    let earlier = match ctx.checkpoints {
        Some(cp) if ctx.rerun => cp.backup_queue(ctx.backup_id, &q.vhost, &q.name)?,
        _ => None,
    };
    let kept = earlier.map(|state| state.segments).unwrap_or_default();
    let Some(last) = kept.last() else {
        return Ok((Vec::new(), start_queue(ctx, q)?, 0));
    };
    for s in &kept {
        verify_stored(ctx, s)?;
    }
    let next = last_record_offset(ctx, last)? + 1;
    let prefix = manifest::queue_prefix(ctx.backup_id, &q.vhost, &q.name);
    let after = ctx
        .storage
        .list(&prefix)?
        .iter()
        .filter_map(|k| segment_number(k.strip_prefix(&prefix)?))
        .max()
        .unwrap_or(0)
        .max(last.sequence);
    log::info!(
        "stream {} in vhost {}: the earlier run stored {} segment(s) up to offset {}; reading resumes at offset {next}",
        q.name,
        q.vhost,
        kept.len(),
        next - 1
    );
    Ok((kept, after, next))
}

/// The offset of the last record of a stored stream segment (its `delivery_tag` - 1).
fn last_record_offset(ctx: &QueueContext, s: &SegmentMetadata) -> Result<u64> {
    let path = unique_file(ctx.spool, &s.key);
    let last = ctx.storage.get_to_file(&s.key, &path).and_then(|_| {
        let reader = crate::segment::SegmentReader::open(&path)?;
        let mut last = None;
        for json in reader.records() {
            last = Some(json?);
        }
        match last {
            Some(json) => crate::record::decode_record(&json),
            None => Err(Error::Serialization(format!("{}: no records", s.key))),
        }
    });
    let _ = std::fs::remove_file(&path);
    let tag = last?.delivery_tag;
    tag.checked_sub(1).ok_or_else(|| {
        Error::Serialization(format!(
            "{}: its last record has delivery_tag 0, not a stream offset",
            s.key
        ))
    })
}

/// The number of a segment file name (`segment-0012.zst` -> 12).
fn segment_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("segment-")?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// After a rerun completed: deletes the segments under the queues of `manifest` that it does
/// not list (the earlier run's). Failures are logged, never fatal.
pub(super) fn remove_unlisted_segments(storage: &dyn Storage, manifest: &Manifest) {
    for q in &manifest.queues {
        let prefix = manifest::queue_prefix(&manifest.backup_id, &q.vhost, &q.name);
        let listed: HashSet<&str> = q.segments.iter().map(|s| s.key.as_str()).collect();
        let keys = match storage.list(&prefix) {
            Ok(keys) => keys,
            Err(e) => {
                log::warn!("cannot list {prefix} to remove the earlier run's segments: {e}");
                continue;
            }
        };
        for key in keys.iter().filter(|k| !listed.contains(k.as_str())) {
            match storage.delete(key) {
                Ok(()) => log::info!("{key}: segment of the earlier run, not in the backup, removed"),
                Err(e) => log::warn!("{key}: segment of the earlier run, not in the backup, could not be removed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::segment_number;

    #[test]
    fn segment_numbers_come_from_file_names() {
        assert_eq!(segment_number("segment-0001.zst"), Some(1));
        assert_eq!(segment_number("segment-12345.lz4"), Some(12345));
        assert_eq!(segment_number("segment-0007"), Some(7));
        assert_eq!(segment_number("other-0001.zst"), None);
        assert_eq!(segment_number("segment-.zst"), None);
    }
}
