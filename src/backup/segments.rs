//! Segments of one queue: records encoded and appended to the current segment (streaming
//! compression into a spool file), rotation on `segment_max_bytes` / `segment_max_interval_ms`,
//! and the uploader threads that finish each segment and store it.

use super::context::QueueContext;
use super::incompressible::{no_gain, Choice, EARLY_VERDICT_BYTES};
use crate::broker::management::QueueInfo;
use crate::error::{Error, Result};
use crate::metrics::BackupQueueMetrics;
use crate::repository::encryption::{self, Recipients};
use crate::repository::lock::RunLock;
use crate::repository::manifest::{self, SegmentMetadata};
use crate::repository::record::{
    check_version_1, encode_meta, encode_meta_v3, encode_record, BackupRecord,
};
use crate::repository::segment::{hex_lower, SegmentWriter};
use crate::repository::spool::unique_file;
use crate::repository::storage::{Conditional, Storage};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Compressed bytes up to which a segment is built in memory, not in a spool file (a queue of a
/// few messages costs no file created and removed): segments being built, queued for the
/// uploaders and being stored hold at most this much each.
const IN_MEMORY_SEGMENT_BYTES: usize = 1 << 20;

/// Records per batch handed from a reader to its segment builder.
const BATCH_RECORDS: usize = 512;
/// Body bytes per batch handed from a reader to its segment builder.
const BATCH_BYTES: usize = 1 << 20;

/// What a queue's or stream's reader hands its segment builder: records in batches of
/// [`BATCH_RECORDS`] or [`BATCH_BYTES`] of body, each record counted in the queue's
/// `messages_read` and `bytes_read` as it comes.
pub(super) struct Batches<'a> {
    tx: &'a Sender<Vec<BackupRecord>>,
    m: &'a BackupQueueMetrics,
    batch: Vec<BackupRecord>,
    bytes: usize,
    /// Called before a batch would wait for room in a full `tx` (a small queue's builder
    /// starts then: `super::queue`).
    spill: Option<&'a dyn Fn()>,
}

impl<'a> Batches<'a> {
    pub(super) fn new(tx: &'a Sender<Vec<BackupRecord>>, m: &'a BackupQueueMetrics) -> Self {
        Batches {
            tx,
            m,
            batch: Vec::with_capacity(BATCH_RECORDS),
            bytes: 0,
            spill: None,
        }
    }

    /// The same, calling `spill` before a batch would wait for room in a full channel.
    pub(super) fn spill_with(self, spill: Option<&'a dyn Fn()>) -> Self {
        Batches { spill, ..self }
    }

    /// Counts `record` and adds it; a full batch goes to the builder.
    ///
    /// Errors: `Error::Io` when the segment builder stopped (its own error says why).
    pub(super) fn push(&mut self, record: BackupRecord) -> Result<()> {
        self.m.messages_read.inc();
        self.m.bytes_read.add(record.body.len() as u64);
        self.bytes += record.body.len();
        self.batch.push(record);
        if self.batch.len() >= BATCH_RECORDS || self.bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands over what is gathered, if anything.
    pub(super) fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.bytes = 0;
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_RECORDS));
        if let Some(spill) = self.spill.filter(|_| self.tx.is_full()) {
            spill();
        }
        self.tx
            .send(full)
            .map_err(|_| Error::Io("segment builder stopped".into()))
    }
}

/// A full segment on its way to storage: the uploader finishes and stores it.
pub(super) struct Upload {
    key: String,
    sequence: u64,
    writer: SegmentWriter,
    reply: Sender<Result<SegmentMetadata>>,
    /// The queue's counters (segments written and their bytes).
    metrics: BackupQueueMetrics,
}

/// Longest wait for the uploader to store a segment (each storage request has its own, much
/// shorter, timeouts and retries: this bounds a backend that never answers).
const UPLOAD_WAIT: Duration = Duration::from_secs(3600);

/// A segment handed to the uploaders and not recorded yet.
struct Pending {
    sequence: u64,
    reply: Receiver<Result<SegmentMetadata>>,
    /// Offsets of its first and last records (streams).
    offsets: Option<(u64, u64)>,
}

/// The segments of one queue: sent to the uploaders in sequence order, and recorded (in the
/// checkpoint database, when configured) in that order as they are stored, so that the
/// database never lists segment 5 without segment 4 (a resumed stream starts after the last
/// segment it lists, `resume::resume_stream`). Returned by [`build_segments`] with the last
/// segments possibly still on their way to storage: [`Stored::wait`] waits for them.
pub(super) struct Stored<'a> {
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    pending: VecDeque<Pending>,
    done: Vec<SegmentMetadata>,
}

impl<'a> Stored<'a> {
    /// No segment: the queue had nothing to read.
    pub(super) fn none(ctx: &'a QueueContext<'a>, q: &'a QueueInfo) -> Stored<'a> {
        Stored {
            ctx,
            q,
            pending: VecDeque::new(),
            done: Vec::new(),
        }
    }
}

impl Stored<'_> {
    /// Waits until every segment is stored (bounded by [`UPLOAD_WAIT`] each), records them,
    /// and returns their metadata in sequence order.
    ///
    /// Errors: the first segment's upload error, in sequence order; `Error::Storage` for a
    /// segment not stored within [`UPLOAD_WAIT`].
    pub(super) fn wait(mut self) -> Result<Vec<SegmentMetadata>> {
        self.record(true)?;
        Ok(self.done)
    }

    /// For a read that does not go into the backup: waits until the segments are stored and
    /// deletes them (best effort: a storage that refuses leaves them, listed by no manifest,
    /// for `forget --prune`). Failures are logged.
    pub(super) fn discard(self) {
        let (ctx, q) = (self.ctx, self.q);
        let keys: Vec<String> = match self.wait() {
            Ok(done) => done.into_iter().map(|s| s.key).collect(),
            Err(e) => {
                log::warn!(
                    "queue {} in vhost {}: segments of a read left out of the backup not all stored ({e}); what was stored is removed by the next completed run or forget --prune",
                    q.name,
                    q.vhost
                );
                return;
            }
        };
        for key in keys {
            if let Err(e) = ctx.store.storage.delete(&key) {
                crate::repository::storage::append_only::skip_delete(
                    "segment of a read left out of the backup",
                    &key,
                    &e,
                );
            }
        }
    }

    /// The number of segments, stored or on their way.
    pub(super) fn len(&self) -> usize {
        self.done.len() + self.pending.len()
    }

    /// True when the queue has no segment.
    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records the stored segments at the head of the queue of pending ones; with `wait`,
    /// every one (bounded by [`UPLOAD_WAIT`] each).
    fn record(&mut self, wait: bool) -> Result<()> {
        while let Some(head) = self.pending.front() {
            let result = if wait {
                head.reply.recv_timeout(UPLOAD_WAIT).map_err(|e| match e {
                    RecvTimeoutError::Timeout => Error::Storage(format!(
                        "segment {} of queue {} in vhost {} not stored within {} s",
                        head.sequence,
                        self.q.name,
                        self.q.vhost,
                        UPLOAD_WAIT.as_secs()
                    )),
                    RecvTimeoutError::Disconnected => Error::Io("segment uploader stopped".into()),
                })?
            } else {
                match head.reply.try_recv() {
                    Ok(r) => r,
                    Err(TryRecvError::Empty) => return Ok(()),
                    Err(TryRecvError::Disconnected) => {
                        return Err(Error::Io("segment uploader stopped".into()))
                    }
                }
            };
            let meta = result?;
            if let Some(cp) = self.ctx.store.checkpoints {
                cp.backup_segment_stored(
                    &self.ctx.store.checkpoint_id,
                    &self.q.vhost,
                    &self.q.name,
                    &meta,
                    head.offsets,
                )?;
            }
            self.done.push(meta);
            self.pending.pop_front();
        }
        Ok(())
    }
}

/// Receives batches of records, encodes them, appends them to the current segment,
/// rotates on `segment_max_bytes` / `segment_max_interval_ms`, hands finished segments to the
/// uploaders, records each once it and every one before it are stored, and returns them once
/// the batches end, the last ones perhaps still on their way to storage ([`Stored::wait`]:
/// a queue thread goes on to its next queue meanwhile). Segments are numbered from
/// `after + 1` (a rerun never overwrites an earlier run's segment).
pub(super) fn build_segments<'a>(
    ctx: &'a QueueContext<'a>,
    q: &'a QueueInfo,
    m: &BackupQueueMetrics,
    batches: Receiver<Vec<BackupRecord>>,
    uploads: &Sender<Upload>,
    after: u64,
) -> Result<Stored<'a>> {
    let _log = crate::run::logging::queue_scope(&q.vhost, &q.name);
    let max_bytes = ctx.store.opts.segment_max_bytes;
    let max_age = Duration::from_millis(ctx.store.opts.segment_max_interval_ms);
    let stream = q.queue_type == Some(crate::broker::QueueType::Stream);
    let mut current: Option<Open> = None;
    let mut sequence = after;
    let mut stored = Stored::none(ctx, q);
    // Segments that do not shrink are followed by uncompressed ones.
    let mut choice = Choice::new(ctx.store.compression);

    // Finishing a segment (last compressed block, header, SHA-256) happens on an uploader
    // thread, so reading and compressing go on meanwhile.
    let rotate = |current: &mut Option<Open>,
                  sequence: &mut u64,
                  stored: &mut Stored,
                  choice: &mut Choice,
                  why: &str|
     -> Result<()> {
        let Some(mut open) = current.take() else {
            return Ok(());
        };
        *sequence += 1;
        ctx.store
            .earlier
            .assigned(ctx.store.backup_id, q, *sequence);
        log::trace!(
            "queue {} in vhost {}: segment {} closed ({why}): {} records, {} bytes uncompressed, {} ms old",
            q.name,
            q.vhost,
            *sequence,
            open.writer.record_count(),
            open.writer.uncompressed_bytes(),
            open.opened.elapsed().as_millis()
        );
        let compression = open.writer.compression();
        if let Some((consumed, produced)) = open.writer.zstd_progress() {
            choice.judge(consumed, produced);
        }
        let ext = match ctx.store.encrypt {
            Some(_) => format!("{}{}", compression.extension(), encryption::EXTENSION),
            None => compression.extension().to_string(),
        };
        let key = manifest::segment_key(ctx.store.backup_id, &q.vhost, &q.name, *sequence, &ext);
        let (tx, rx) = bounded(1);
        uploads
            .send(Upload {
                key,
                sequence: *sequence,
                writer: open.writer,
                reply: tx,
                metrics: m.clone(),
            })
            .map_err(|_| Error::Io("segment uploaders stopped".into()))?;
        stored.pending.push_back(Pending {
            sequence: *sequence,
            reply: rx,
            offsets: open.tags.filter(|_| stream),
        });
        Ok(())
    };

    // One buffer for every record's JSON. Encoding runs here, not on a thread pool: on two
    // cores shared with the broker, pool threads waking per batch cost the broker more than
    // they save (measured: backup/raw read 0.84 -> 0.91 without rayon).
    let mut json = Vec::new();
    let version = ctx.store.opts.segment_version_for(&q.name);
    // Versions 2 and 3: each record as metadata and body.
    let parts = version != crate::repository::segment::VERSION;
    let v3 = version == crate::repository::segment::VERSION_3;
    loop {
        let mut wait = match &current {
            Some(open) => max_age.saturating_sub(open.opened.elapsed()),
            None => Duration::from_secs(3600),
        };
        if !stored.pending.is_empty() {
            // Stored segments are recorded within a second.
            wait = wait.min(Duration::from_secs(1));
        }
        let batch = match batches.recv_timeout(wait) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => {
                if current
                    .as_ref()
                    .is_some_and(|open| open.opened.elapsed() >= max_age)
                {
                    rotate(
                        &mut current,
                        &mut sequence,
                        &mut stored,
                        &mut choice,
                        "segment_max_interval_ms",
                    )?;
                }
                stored.record(false)?;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        // The batch's mean body size chooses the compression pool of a segment opened now.
        let mean_body = batch.iter().map(|r| r.body.len()).sum::<usize>() / batch.len().max(1);
        // One clock read per batch (at most `BATCH_RECORDS` records, 1 MiB of body) for the
        // segments' age, not one per record.
        let now = Instant::now();
        for record in &batch {
            json.clear();
            // Versions 2 and 3: `json` holds the metadata, the body is written as it is.
            let next_len = if parts {
                if v3 {
                    encode_meta_v3(record, &mut json);
                } else {
                    encode_meta(record, &mut json);
                }
                json.len() + 4 + record.body.len()
            } else {
                check_version_1(record)?;
                encode_record(record, &mut json);
                json.len()
            };
            let full = current.as_ref().is_some_and(|open| {
                segment_full(
                    open.writer.record_count(),
                    open.writer.uncompressed_bytes(),
                    next_len,
                    now.saturating_duration_since(open.opened),
                    max_bytes,
                    max_age,
                )
            });
            if full {
                rotate(
                    &mut current,
                    &mut sequence,
                    &mut stored,
                    &mut choice,
                    "full or old",
                )?;
            }
            if current.is_none() {
                let compression = choice.next();
                let path = unique_file(ctx.store.spool, &format!("{}-{}", q.vhost, q.name));
                let workers = crate::repository::segment::zstd_workers(mean_body);
                log::trace!(
                    "queue {} in vhost {}: segment {} opened in {} ({:?}, level {}, {workers} zstd workers)",
                    q.name,
                    q.vhost,
                    sequence + 1,
                    path.display(),
                    compression,
                    ctx.store.opts.compression_level
                );
                current = Some(Open {
                    writer: SegmentWriter::create_in_memory_up_to(
                        &path,
                        compression,
                        ctx.store.opts.compression_level,
                        workers,
                        IN_MEMORY_SEGMENT_BYTES,
                    )?
                    .with_version(version)?,
                    opened: Instant::now(),
                    tags: None,
                    judged_early: false,
                });
            }
            let mut early = false;
            if let Some(open) = current.as_mut() {
                if parts {
                    open.writer
                        .append_parts(&json, &record.body, record.backed_up_at)?;
                } else {
                    open.writer.append(&json, record.backed_up_at)?;
                }
                let tag = record.delivery_tag;
                open.tags = Some(open.tags.map_or((tag, tag), |(first, _)| (first, tag)));
                // Once per zstd segment, well before it is full: has it shrunk at all?
                if !open.judged_early
                    && open.writer.uncompressed_bytes() >= EARLY_VERDICT_BYTES
                    && max_bytes >= 2 * EARLY_VERDICT_BYTES
                {
                    open.judged_early = true;
                    early = open
                        .writer
                        .zstd_progress()
                        .is_some_and(|(consumed, produced)| no_gain(consumed, produced));
                }
            }
            if early {
                rotate(
                    &mut current,
                    &mut sequence,
                    &mut stored,
                    &mut choice,
                    "did not shrink",
                )?;
            }
        }
        stored.record(false)?;
    }
    rotate(
        &mut current,
        &mut sequence,
        &mut stored,
        &mut choice,
        "end of queue",
    )?;
    stored.record(false)?;
    Ok(stored)
}

/// A finished segment's stored form: bytes (a segment kept in memory, or sealed from one) or a
/// spool file.
enum Payload<'a> {
    Bytes(std::borrow::Cow<'a, [u8]>),
    File(&'a std::path::Path),
}

/// The segment being written.
struct Open {
    writer: SegmentWriter,
    opened: Instant,
    /// Delivery tags of its first and last records (a stream's offsets).
    tags: Option<(u64, u64)>,
    /// Its compression was judged at [`EARLY_VERDICT_BYTES`] (once per segment).
    judged_early: bool,
}

/// Whether the current segment must be finished before a record of `next_len` JSON bytes is
/// appended (`next_len`: its JSON, or in version 2 its metadata, body and the body's length
/// prefix): it is not empty and either the record would take it past `max_bytes`
/// (`segment_max_bytes`, uncompressed payload incl. the 4-byte length prefixes) or it is older
/// than `max_age` (`segment_max_interval_ms`). A single record larger than `max_bytes` still
/// gets a segment of its own.
fn segment_full(
    records: u64,
    uncompressed: u64,
    next_len: usize,
    age: Duration,
    max_bytes: u64,
    max_age: Duration,
) -> bool {
    records > 0 && (uncompressed + next_len as u64 + 4 > max_bytes || age >= max_age)
}

/// Finishes segments and stores them (the storage retries transient failures itself), then
/// removes the spool file; the queue's builder records each stored segment. A segment is
/// stored only while the run holds its lock, and only under a key no object has: a stored
/// segment is never replaced (`crate::repository::storage::conditional`).
///
/// With `encrypt` (`backup.encryption`), the finished segment is encrypted before the upload:
/// in memory when it was built there, else into a second spool file, the plaintext one removed
/// at once; the plaintext lives only while its segment is built. The manifest's size and
/// SHA-256 are the stored age file's, and its `recipients` the public keys it was encrypted to.
pub(super) fn uploader(
    jobs: Receiver<Upload>,
    storage: &dyn Storage,
    lock: &RunLock,
    encrypt: Option<&Recipients>,
) {
    // Recorded on every encrypted segment: who can read it (a reader checks its identity
    // against each segment it reads; a rerun reuses only segments encrypted to its own keys).
    let recorded = encrypt.map(Recipients::public_keys);
    for job in jobs {
        let path = job.writer.path().to_path_buf();
        let sealed = path.with_extension("rbak.age");
        let result = job.writer.finish().and_then(|finished| {
            log::debug!(
                segment = job.key.as_str();
                "segment {}: {} records, {} bytes ({} uncompressed)",
                job.key,
                finished.record_count,
                finished.size_bytes,
                finished.uncompressed_bytes
            );
            let mut meta =
                SegmentMetadata::from_finished(job.key.clone(), job.sequence, &finished);
            // What is stored: the segment's bytes (in memory, or in its spool file), sealed
            // first with `encrypt`.
            let payload = match (encrypt, &finished.data) {
                (Some(recipients), Some(plain)) => {
                    let sealed = recipients.encrypt_bytes(plain)?;
                    meta.size_bytes = sealed.len() as u64;
                    meta.checksum = hex_lower(&Sha256::digest(&sealed));
                    meta.encryption = Some(encryption::SCHEME.to_string());
                    meta.recipients.clone_from(&recorded);
                    Payload::Bytes(std::borrow::Cow::Owned(sealed))
                }
                (Some(recipients), None) => {
                    let sealed_now = recipients.encrypt_file(&finished.path, &sealed);
                    // The plaintext goes as soon as it is encrypted (or failed to be).
                    let _ = std::fs::remove_file(&finished.path);
                    let (size, checksum) = sealed_now?;
                    meta.size_bytes = size;
                    meta.checksum = checksum;
                    meta.encryption = Some(encryption::SCHEME.to_string());
                    meta.recipients.clone_from(&recorded);
                    Payload::File(sealed.as_path())
                }
                (None, Some(plain)) => Payload::Bytes(std::borrow::Cow::Borrowed(plain)),
                (None, None) => Payload::File(finished.path.as_path()),
            };
            // Object stores retry transient failures themselves (storage::retry).
            lock.check()?;
            let stored = match payload {
                Payload::Bytes(bytes) => storage.put_bytes_new(&job.key, &bytes)?,
                Payload::File(path) => storage.put_file_new(&job.key, path)?,
            };
            if stored == Conditional::Refused {
                return Err(Error::Storage(format!(
                    "Failed to write {}: the key holds a segment already (another run stored it); this run stops and leaves it alone",
                    job.key
                )));
            }
            job.metrics.segments_written.inc();
            job.metrics.segments_bytes.add(meta.size_bytes);
            log::trace!(
                segment = job.key.as_str();
                "segment {} stored: {} bytes, sha256 {}, timestamps {:?}..{:?}",
                job.key,
                meta.size_bytes,
                meta.checksum,
                meta.first_timestamp,
                meta.last_timestamp
            );
            Ok(meta)
        });
        // The storage may have taken the files over; otherwise they are removed here.
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(&sealed);
        let _ = job.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_rotation_rules() {
        let hour = Duration::from_secs(3600);
        let ms = Duration::from_millis;
        // An empty segment always takes the record, however large.
        assert!(!segment_full(0, 0, 10_000, hour, 100, ms(1)));
        // Size: the record fits exactly (prefix included), or would overflow.
        assert!(!segment_full(1, 50, 46, ms(0), 100, hour));
        assert!(segment_full(1, 50, 47, ms(0), 100, hour));
        // Age.
        assert!(!segment_full(3, 10, 1, ms(999), 1_000_000, ms(1000)));
        assert!(segment_full(3, 10, 1, ms(1000), 1_000_000, ms(1000)));
    }
}
