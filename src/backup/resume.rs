//! A rerun of an interrupted backup (same `backup_id`; SPEC.md "States and transitions" rule 1).
//!
//! - With `offset_storage`, a queue the checkpoint database marks completed reuses its stored
//!   segments after each is checked against its recorded size and SHA-256; a queue not
//!   completed is read again from the head (AMQP delivery tags are no offsets). The database
//!   is trusted only for the backup it was written for (`super::trust_checkpoints`). Segments
//!   encrypted to other recipients than this run's (`backup.encryption` changed) are never
//!   reused: their queue is read again ([`other_recipients`]).
//! - Without it, every queue is read again.
//! - A queue or stream whose stored segments would be kept but were written in another segment
//!   format version than `backup.segment_version` is refused (`Configuration error`, naming
//!   the version to set): a rerun does not mix versions within a queue ([`same_version`]).
//!
//! Either way a queue read again writes its segments with numbers after the highest segment of
//! that queue already in storage (`super::stored::Earlier`, one listing at the start of the run), so no
//! segment is ever overwritten, and once the rerun's manifest is complete and read back
//! unchanged, the segments it does not list are deleted (best effort: a storage that refuses
//! deletes leaves them, unlisted, and `validate` ignores them).

use super::context::QueueContext;
use crate::broker::management::QueueInfo;
use crate::broker::QueueType;
use crate::error::{Error, Result};
use crate::repository::checkpoint::StoredSegment;
use crate::repository::manifest::{self, Manifest, QueueBackup, SegmentMetadata};
use crate::repository::segment::sha256_file;
use crate::repository::spool::unique_file;
use crate::repository::storage::Storage;
use std::collections::HashSet;

/// When the checkpoint database says `q` was completed by an earlier run and every one of its
/// segments checks out, the queue's manifest entry made of them; `None` when it must be read.
pub(super) fn completed_earlier(
    ctx: &QueueContext,
    q: &QueueInfo,
    kind: QueueType,
) -> Result<Option<QueueBackup>> {
    let Some(cp) = ctx.store.checkpoints else {
        return Ok(None);
    };
    let Some(state) = cp.backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name)? else {
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
    same_version(ctx, q, state.segments.iter().map(|s| &s.metadata))?;
    if let Some(why) = other_recipients(
        ctx.store.encrypt,
        state.segments.iter().map(|s| &s.metadata),
    ) {
        log::warn!(
            "queue {} in vhost {}: {why}; the queue is read again",
            q.name,
            q.vhost
        );
        return Ok(None);
    }
    for s in &state.segments {
        if let Err(e) = verify_stored(ctx, &s.metadata) {
            log::warn!(
                "queue {} in vhost {}: segment {} of the earlier run does not check out ({e}); the queue is read again",
                q.name,
                q.vhost,
                s.metadata.key
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
        state.segments.into_iter().map(|s| s.metadata).collect(),
    )))
}

/// Refuses to keep segments an earlier run stored in another segment format version than
/// this run writes (`backup.segment_version`): a queue's segments, and a resumed stream's
/// continuation, stay in one version. (Every reader reads both versions; the refusal keeps
/// what a rerun stores to what its configuration says.) Queues read again from their head are
/// not concerned: their new segments are all this run's.
///
/// Errors: `Error::Config` naming the queue, both versions and the ways out.
fn same_version<'a>(
    ctx: &QueueContext,
    q: &QueueInfo,
    segments: impl IntoIterator<Item = &'a SegmentMetadata>,
) -> Result<()> {
    let want = ctx.store.opts.segment_version_for(&q.name);
    match segments.into_iter().find(|s| s.version() != want) {
        None => Ok(()),
        Some(s) => Err(Error::Config(format!(
            "queue {} in vhost {}: the earlier run of this backup stored {} in segment format version {}, and this run writes version {want} (backup.segment_version); a rerun continues in the version the backup was started with: set backup.segment_version: {} to resume it, or back up under a new backup_id",
            q.name,
            q.vhost,
            s.key,
            s.version(),
            s.version()
        ))),
    }
}

/// Why segments an earlier run stored encrypted cannot be reused by a run that encrypts to
/// `encrypt`: one was encrypted to other recipients (the manifest would list this run's only,
/// and the old keys would read it), or records none (written before rmq-backup recorded
/// them: who can read it is unknown). `None` when every encrypted one was encrypted to
/// exactly these recipients, or this run does not encrypt (`verify_stored` refuses the
/// encrypted ones then).
fn other_recipients<'a>(
    encrypt: Option<&crate::repository::encryption::Recipients>,
    segments: impl IntoIterator<Item = &'a SegmentMetadata>,
) -> Option<String> {
    let encrypt = encrypt?;
    segments
        .into_iter()
        .filter(|s| s.encryption.is_some())
        .find_map(|s| match &s.recipients {
            None => Some(format!(
                "the earlier run's segment {} does not record its recipients (written by an older version), so it may be encrypted to other keys than this run's",
                s.key
            )),
            Some(r) if !encrypt.same_as(r) => Some(format!(
                "the earlier run's segments are encrypted to other recipients than this run's ({} to {}; this run to {})",
                s.key,
                r.join(", "),
                encrypt.public_keys().join(", ")
            )),
            Some(_) => None,
        })
}

/// Fetches a stored segment and checks its size and SHA-256 against its metadata, and that
/// it is stored as this run stores segments (encrypted or not, `backup.encryption`): a run
/// that encrypts never keeps a plain segment, nor the other way round.
fn verify_stored(ctx: &QueueContext, s: &SegmentMetadata) -> Result<()> {
    if s.encryption.is_some() != ctx.store.encrypt.is_some() {
        return Err(Error::Encryption(format!(
            "{} is stored {}, but this run {} (backup.encryption changed)",
            s.key,
            if s.encryption.is_some() {
                "encrypted"
            } else {
                "unencrypted"
            },
            if ctx.store.encrypt.is_some() {
                "encrypts"
            } else {
                "does not encrypt"
            }
        )));
    }
    match ctx.store.storage.head(&s.key)? {
        None => return Err(Error::Storage(format!("Key not found: {}", s.key))),
        Some(size) if size != s.size_bytes => {
            return Err(Error::Storage(format!(
                "{} is {size} bytes, {} recorded",
                s.key, s.size_bytes
            )))
        }
        Some(_) => {}
    }
    let path = unique_file(ctx.store.spool, &s.key);
    let sha = ctx
        .store
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
/// run's partial segments) and returns the sequence number its segments follow: the highest
/// segment number of the queue in storage when the run started (0 when none).
pub(super) fn start_queue(ctx: &QueueContext, q: &QueueInfo) -> Result<u64> {
    if let Some(cp) = ctx.store.checkpoints {
        cp.start_backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name, q.messages)?;
    }
    let highest = ctx.store.earlier.highest(ctx.store.backup_id, q);
    if highest > 0 {
        log::info!(
            "queue {} in vhost {}: storage holds segments up to {highest} already (an earlier run's or attempt's); new segments follow",
            q.name,
            q.vhost
        );
    }
    Ok(highest)
}

/// The stored segments an earlier run recorded for a stream, up to the first that does not
/// follow the one before it (`manifest::stream_segment_follows`; without offsets, an older
/// database, its sequence number is not the next).
fn unbroken_prefix(q: &QueueInfo, segments: Vec<StoredSegment>) -> Vec<StoredSegment> {
    let mut kept: Vec<StoredSegment> = Vec::with_capacity(segments.len());
    for s in segments {
        let follows = match (kept.last(), s.offsets) {
            (None, _) => true,
            (Some(prev), Some((first, _))) => match prev.offsets {
                Some((_, last)) => crate::repository::manifest::stream_segment_follows(
                    (prev.metadata.sequence, last),
                    (s.metadata.sequence, first),
                ),
                None => prev.metadata.sequence + 1 == s.metadata.sequence,
            },
            (Some(prev), None) => prev.metadata.sequence + 1 == s.metadata.sequence,
        };
        if !follows {
            log::warn!(
                "stream {} in vhost {}: segment {} does not follow segment {} (offsets {:?} after {:?}); it and the ones after it are read again",
                q.name,
                q.vhost,
                s.metadata.sequence,
                kept.last().map_or(0, |p| p.metadata.sequence),
                s.offsets,
                kept.last().and_then(|p| p.offsets)
            );
            break;
        }
        kept.push(s);
    }
    kept
}

/// Where a continuous backup of stream `q` starts (`stop_at_current_depth: false`).
///
/// On a rerun with `offset_storage`, the unbroken prefix of the segments the earlier run
/// stored and recorded ([`unbroken_prefix`]) is kept after each checks out, and reading
/// resumes at the offset after the last record of the last one: no gap, no duplicate.
/// Segments stored without being recorded (the run was killed in between) number after the
/// kept ones; they are not listed and are deleted once the rerun completes. Otherwise the
/// stream is read from its first offset, as [`start_queue`] starts a queue.
///
/// Returns (kept segments, the sequence new segments follow, the first offset to read).
pub(super) fn resume_stream(
    ctx: &QueueContext,
    q: &QueueInfo,
) -> Result<(Vec<SegmentMetadata>, u64, u64)> {
    let earlier = match ctx.store.checkpoints {
        Some(cp) => cp.backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name)?,
        None => None,
    };
    let mut kept = unbroken_prefix(q, earlier.map(|state| state.segments).unwrap_or_default());
    if let Some(why) = other_recipients(ctx.store.encrypt, kept.iter().map(|s| &s.metadata)) {
        log::warn!(
            "stream {} in vhost {}: {why}; the stream is read again from its start",
            q.name,
            q.vhost
        );
        kept.clear();
    }
    let Some(last) = kept.last() else {
        return Ok((Vec::new(), start_queue(ctx, q)?, 0));
    };
    same_version(ctx, q, kept.iter().map(|s| &s.metadata))?;
    for s in &kept {
        verify_stored(ctx, &s.metadata)?;
    }
    let last_offset = match last.offsets {
        Some((_, l)) => l,
        None => last_record_offset(ctx, &last.metadata)?,
    };
    let next = last_offset.checked_add(1).ok_or_else(|| {
        Error::Stream(format!(
            "stream {} in vhost {}: the last offset stored is the largest there is",
            q.name, q.vhost
        ))
    })?;
    let after = ctx
        .store
        .earlier
        .highest(ctx.store.backup_id, q)
        .max(last.metadata.sequence);
    if let Some(cp) = ctx.store.checkpoints {
        // The segments after the prefix are no longer the queue's.
        cp.start_backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name, q.messages)?;
        for s in &kept {
            cp.backup_segment_stored(
                &ctx.store.checkpoint_id,
                &q.vhost,
                &q.name,
                &s.metadata,
                s.offsets,
            )?;
        }
    }
    log::info!(
        "stream {} in vhost {}: the earlier run stored {} segment(s) up to offset {last_offset}; reading resumes at offset {next}",
        q.name,
        q.vhost,
        kept.len(),
    );
    Ok((kept.into_iter().map(|s| s.metadata).collect(), after, next))
}

/// The offset of the last record of a stored stream segment: its `delivery_tag` (SPEC.md
/// "Segment file").
fn last_record_offset(ctx: &QueueContext, s: &SegmentMetadata) -> Result<u64> {
    let path = unique_file(ctx.store.spool, &s.key);
    // The backup side holds no identity: an encrypted segment cannot be read here, and needs
    // not be (its offsets are in the checkpoint database, schema 2, which every run that
    // encrypts writes).
    let last = crate::repository::fetch::fetch_segment(
        ctx.store.storage,
        &path,
        s,
        None,
        // Used once every record read checks out.
        crate::repository::fetch::Check::AsRead,
    )
    .and_then(|fetched| {
        let crate::repository::fetch::FetchedSegment {
            reader,
            files: _files,
        } = fetched;
        let mut last = None;
        for raw in reader.records() {
            last = Some(raw?);
        }
        match last {
            Some(raw) => raw.into_record(),
            None => Err(Error::Serialization(format!("{}: no records", s.key))),
        }
    });
    Ok(last?.delivery_tag)
}

/// After a run completed: deletes the segments under the queues of `manifest` (those of
/// `only`, when given: `(vhost, name)`) that it does not list (an earlier run's, an older
/// backup's with the same id, or an abandoned attempt's of this run), once the manifest read
/// back from `key` (the backup's or the part's) is still `manifest` (another run that took the
/// backup over would have written its own) and the run still holds its lock. Failures are
/// logged, never fatal.
pub(super) fn remove_unlisted_segments(
    storage: &dyn Storage,
    key: &str,
    manifest: &Manifest,
    lock: &crate::repository::lock::RunLock,
    only: Option<&HashSet<(String, String)>>,
) {
    let stored = storage
        .get_bytes(key)
        .and_then(|bytes| Manifest::from_json(&bytes));
    match stored {
        Ok(m) if m == *manifest => {}
        Ok(_) => {
            log::warn!("{key} is not the manifest this run wrote: the segments it does not list are left alone");
            return;
        }
        Err(e) => {
            log::warn!(
                "{key} cannot be read back ({e}): the segments it does not list are left alone"
            );
            return;
        }
    }
    for q in &manifest.queues {
        if only.is_some_and(|o| !o.contains(&(q.vhost.clone(), q.name.clone()))) {
            continue;
        }
        if let Some(why) = lock.lost() {
            log::warn!("{why}: the segments the manifest does not list are left alone");
            return;
        }
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
                Ok(()) => log::info!(
                    "{key}: segment of an earlier run or attempt, not in the backup, removed"
                ),
                Err(e) => crate::repository::storage::append_only::skip_delete(
                    "segment of an earlier run or attempt, not in the backup,",
                    key,
                    &e,
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(sequence: u64, offsets: Option<(u64, u64)>) -> StoredSegment {
        StoredSegment {
            metadata: SegmentMetadata::example(
                format!("b/queues/v/s/segment-{sequence:04}.zst"),
                sequence,
                1,
            ),
            offsets,
        }
    }

    fn sequences(kept: &[StoredSegment]) -> Vec<u64> {
        kept.iter().map(|s| s.metadata.sequence).collect()
    }

    #[test]
    fn a_resumed_stream_keeps_the_unbroken_prefix_only() {
        let q = QueueInfo {
            vhost: "v".into(),
            name: "s".into(),
            queue_type: Some(QueueType::Stream),
            type_name: "stream".into(),
            messages: 0,
            unacknowledged: 0,
            statistics: true,
            durable: true,
            auto_delete: false,
            exclusive: false,
            arguments: Default::default(),
            policy: None,
            effective_policy_definition: Default::default(),
            node: None,
            state: None,
            message_bytes: 0,
            delivery_limit: None,
            policy_known: true,
            ..QueueInfo::default()
        };
        let o = |a, b| Some((a, b));
        // By offsets: 1..3 follow each other; 5 starts after a hole (segment 4's offsets).
        let kept = unbroken_prefix(
            &q,
            vec![
                stored(1, o(0, 9)),
                stored(2, o(10, 19)),
                stored(3, o(20, 29)),
                stored(5, o(40, 49)),
            ],
        );
        assert_eq!(sequences(&kept), [1, 2, 3]);
        // A rerun's segments number after a killed run's unrecorded ones: offsets decide.
        let kept = unbroken_prefix(&q, vec![stored(1, o(0, 9)), stored(4, o(10, 12))]);
        assert_eq!(sequences(&kept), [1, 4]);
        // Overlapping offsets are no prefix either.
        let kept = unbroken_prefix(&q, vec![stored(1, o(0, 9)), stored(2, o(9, 12))]);
        assert_eq!(sequences(&kept), [1]);
        // Without offsets (schema version 1): sequence numbers decide.
        let kept = unbroken_prefix(&q, vec![stored(1, None), stored(2, None), stored(4, None)]);
        assert_eq!(sequences(&kept), [1, 2]);
        assert!(unbroken_prefix(&q, Vec::new()).is_empty());
    }

    #[test]
    fn segments_encrypted_to_other_keys_are_not_reused() {
        let (_, a) = crate::repository::encryption::generate();
        let (_, b) = crate::repository::encryption::generate();
        let run = crate::repository::encryption::Recipients::parse([a.as_str(), b.as_str()], "r")
            .unwrap();
        let seg = |n: u64, recipients: Option<Vec<String>>| SegmentMetadata {
            encryption: recipients.as_ref().map(|_| "age".to_string()),
            recipients,
            ..SegmentMetadata::example(format!("k{n}"), n, 1)
        };
        let same = [
            seg(1, Some(vec![b.clone(), a.clone()])),
            seg(2, Some(vec![a.clone(), b.clone()])),
        ];
        assert_eq!(other_recipients(Some(&run), &same), None);
        // A run that does not encrypt leaves the question to verify_stored.
        assert_eq!(other_recipients(None, &same), None);
        let fewer = [
            seg(1, Some(vec![a.clone(), b.clone()])),
            seg(2, Some(vec![a.clone()])),
        ];
        let why = other_recipients(Some(&run), &fewer).unwrap();
        assert!(
            why.starts_with("the earlier run's segments are encrypted to other recipients than this run's (k2 to ")
                && why.contains(&format!("; this run to {a}, {b})")),
            "{why}"
        );
        let unrecorded = [SegmentMetadata {
            encryption: Some("age".into()),
            ..SegmentMetadata::example("k9".into(), 9, 1)
        }];
        let why = other_recipients(Some(&run), &unrecorded).unwrap();
        assert!(
            why.contains("segment k9 does not record its recipients"),
            "{why}"
        );
        // Plain segments say nothing about keys.
        assert_eq!(other_recipients(Some(&run), &[seg(1, None)]), None);
    }
}
