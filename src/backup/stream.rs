//! One stream's backup over the stream protocol (`backup.stream_enabled: true`): its own
//! stream connection, the stream's end found by subscribing at `last` once the broker has said
//! the stream holds a chunk (`StreamStats`, 3.11+; the management API's counts lag, and 3.10
//! has no StreamStats: there the count decides the wait), then a read from the first offset up to
//! that end with credit-based flow control, each message decoded (`crate::broker::stream::amqp10`)
//! into a record and handed to the same segment builder as a queue's (`super::segments`).
//! Reading a stream takes nothing from it.
//!
//! A continuous backup (`stop_at_current_depth: false`) follows the stream instead, until
//! SIGTERM or SIGINT ends the run normally; a rerun resumes after the last stored segment
//! (`resume::resume_stream`).

use super::conns::CountedConnection;
use super::context::QueueContext;
use super::resume;
use super::segments::{build_segments, Batches, Upload};
use crate::broker::management::QueueInfo;
use crate::broker::stream::amqp10::{to_record, Conversion, Origin, RAW_BODY_HEADER};
use crate::broker::stream::chunk::parse_chunk;
use crate::broker::stream::{OffsetSpec, StreamConnection};
use crate::broker::QueueType;
use crate::error::{Error, Result};
use crate::metrics;
use crate::now_ms;
use crate::repository::manifest::QueueBackup;
use crate::repository::record::BackupRecord;
use crate::repository::spool::spawn_named;
use crate::run::progress;
use crossbeam_channel::{bounded, Sender};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Chunks granted to the broker at a time (each chunk holds up to a few thousand messages).
const CREDIT: u16 = 4;
/// The longest wait for the next chunk of a stream known to hold more.
const CHUNK_WAIT: Duration = Duration::from_secs(30);
/// How long a stream the management API counts no message in is given to show its last chunk
/// (its counts lag the stream by up to ~10 s).
const EMPTY_WAIT: Duration = Duration::from_secs(5);
/// A continuous backup hands its records to the segment builder after this long without a
/// chunk, so that `segment_max_interval_ms` closes segments of an idle stream.
const IDLE_FLUSH: Duration = Duration::from_secs(1);

/// The offset of the stream's last message now, `None` when it is empty: the first chunk a
/// subscription at `last` receives is the stream's last chunk.
///
/// Whether to wait for that chunk: on RabbitMQ 3.11 and later the broker says whether the
/// stream holds a chunk (`StreamStats`), and then one is waited for up to [`CHUNK_WAIT`]. The
/// management API's count cannot say it: it has none for a stream seconds old (`null` for 4 s
/// after 2,000 messages were published and confirmed, 4.0.5 under load), and with its 0 a
/// non-empty stream whose chunk took longer than [`EMPTY_WAIT`] was backed up as empty. On
/// 3.10, which has no `StreamStats`, the count decides the wait as before.
///
/// Errors: the broker's answer to `StreamStats`, the subscription's, or `Stream protocol
/// error` when a stream the management API counts messages in shows no chunk within 30 s.
fn last_offset(conn: &StreamConnection, q: &QueueInfo) -> Result<Option<u64>> {
    let holds_chunk = if conn.has_stream_stats() {
        Some(conn.committed_chunk_id(&q.name)?.is_some())
    } else {
        None
    };
    let wait = match holds_chunk {
        Some(false) => return Ok(None),
        Some(true) => CHUNK_WAIT,
        None if q.messages > 0 => CHUNK_WAIT,
        None => EMPTY_WAIT,
    };
    match crate::broker::stream::offsets::last_offset(conn, &q.name, wait)? {
        // Chunks that are not messages only (the broker's offset tracking), which no reader
        // is sent: empty, as the management API counts it.
        None if holds_chunk == Some(true) && q.messages == 0 => {
            log::warn!(
                "stream {} in vhost {}: the broker says it holds chunks, but none with messages came within {} s and the management API counts none: backed up as empty (chunks of offset tracking only)",
                q.name,
                q.vhost,
                wait.as_secs()
            );
            Ok(None)
        }
        None if q.messages > 0 => Err(Error::Stream(format!(
            "stream {} in vhost {}: no chunk from its end within {} s although the management API counts {} messages",
            q.name,
            q.vhost,
            wait.as_secs(),
            q.messages
        ))),
        end => Ok(end),
    }
}

/// The offset of the last message of stream `q` now, read from the header of its last chunk
/// over the stream protocol (`None`: empty), for a stream read through AMQP 0-9-1
/// (`super::stream_amqp`), which has no exact way to find it. The connection is given
/// [`PROBE_CONNECT`] to open.
///
/// Errors: the connection's (the stream port does not answer: no stream plugin, a firewall)
/// and [`last_offset`]'s.
pub(super) fn end_over_stream_protocol(ctx: &QueueContext, q: &QueueInfo) -> Result<Option<u64>> {
    let conn = CountedConnection::open_within(ctx, q, Some(PROBE_CONNECT))?;
    let end = last_offset(&conn.0, q);
    drop(conn);
    end
}

/// How long the stream port is given to accept a connection that only asks for the end.
const PROBE_CONNECT: Duration = Duration::from_secs(5);

/// Backs up one stream: every message from its first offset to its last at the start of the
/// run, in order. `Ok(None)`: the stream was deleted after it was listed.
pub(super) fn backup_stream(
    ctx: &QueueContext,
    q: &QueueInfo,
    uploads: &Sender<Upload>,
) -> Result<Option<QueueBackup>> {
    let continuous = !ctx.read.opts.stop_at_current_depth;
    if !continuous {
        if let Some(done) = resume::completed_earlier(ctx, q, QueueType::Stream)? {
            return Ok(Some(done));
        }
    }
    let (kept, after, from) = if continuous {
        resume::resume_stream(ctx, q)?
    } else {
        (Vec::new(), resume::start_queue(ctx, q)?, 0)
    };
    let conn = CountedConnection::open(ctx, q)?;
    let conn = &conn.0;
    let offsets = consumer_offsets(ctx, conn, q)?;
    let end = if continuous {
        None
    } else {
        match last_offset(conn, q) {
            Err(Error::Stream(m)) if m.contains("stream does not exist") => {
                log::warn!(
                    "stream {} in vhost {} was deleted after it was listed: skipped",
                    q.name,
                    q.vhost
                );
                return Ok(None);
            }
            Ok(None) => Some(None),
            other => Some(other?),
        }
    };
    log::info!(
        "stream {} in vhost {}: backing up {} over the stream protocol",
        q.name,
        q.vhost,
        match end {
            None => format!("continuously from offset {from} until stopped"),
            Some(Some(e)) => format!("offsets up to {e}"),
            Some(None) => "nothing (empty)".to_string(),
        }
    );
    let m = metrics::global().backup_queue(&q.name, &q.vhost, QueueType::Stream.as_str());
    let _row = progress::row(
        format!("{} (stream, vhost {})", q.name, q.vhost),
        end.flatten().map_or(0, |e| e.saturating_add(1)),
        m.messages_read.clone(),
        m.bytes_read.clone(),
    );
    let started = Instant::now();
    let (batch_tx, batch_rx) = bounded::<Vec<BackupRecord>>(4);
    let (read, built) = std::thread::scope(|s| {
        let builder = spawn_named(s, "segment-builder", || {
            build_segments(ctx, q, &m, batch_rx, uploads, after).and_then(|s| s.wait())
        });
        let read = match end {
            Some(None) => Ok((0, None)),
            Some(Some(end)) => read_stream(ctx, conn, q, from, Some(end), &m, &batch_tx),
            None => read_stream(ctx, conn, q, from, None, &m, &batch_tx),
        };
        drop(batch_tx);
        let built = builder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("segment builder panicked".into())));
        (read, built)
    });
    // A builder failure (storage, encoding) is the cause when the read saw it stop.
    let ((read, last), built) = match (read, built) {
        (_, Err(e)) | (Err(e), _) => return Err(e),
        (Ok(r), Ok(b)) => (r, b),
    };
    let mut segments = kept;
    segments.extend(built);
    log::info!(
        "stream {} in vhost {}: {read} messages read in {} segment(s) this run, last offset {}, {:.1} s",
        q.name,
        q.vhost,
        segments.len(),
        last.map_or("none".to_string(), |e| e.to_string()),
        started.elapsed().as_secs_f64()
    );
    let mut done = completed(ctx, q, last, segments)?;
    done.consumer_offsets = offsets;
    Ok(Some(done))
}

/// The offsets that the references of `backup.stream_offset_references` have stored for
/// stream `q`, asked before its read starts; references with none are left out.
///
/// Errors: the stream protocol's (a refused query).
fn consumer_offsets(
    ctx: &QueueContext,
    conn: &StreamConnection,
    q: &QueueInfo,
) -> Result<BTreeMap<String, u64>> {
    let mut found = BTreeMap::new();
    for reference in &ctx.read.opts.stream_offset_references {
        if let Some(offset) = conn.query_offset(reference, &q.name)? {
            found.insert(reference.clone(), offset);
        }
    }
    if !found.is_empty() {
        log::info!(
            "stream {} in vhost {}: consumer offsets {found:?}",
            q.name,
            q.vhost
        );
    }
    Ok(found)
}

/// A stream's backup done: its last offset (when it had messages) and its completion in the
/// checkpoint database, and its manifest entry.
pub(super) fn completed(
    ctx: &QueueContext,
    q: &QueueInfo,
    last: Option<u64>,
    segments: Vec<crate::repository::manifest::SegmentMetadata>,
) -> Result<QueueBackup> {
    if let Some(cp) = ctx.store.checkpoints {
        if let Some(e) = last {
            cp.set_stream_offset(&ctx.store.checkpoint_id, &q.vhost, &q.name, e)?;
        }
        cp.complete_backup_queue(&ctx.store.checkpoint_id, &q.vhost, &q.name)?;
    }
    Ok(QueueBackup::from_segments(
        &q.vhost,
        &q.name,
        QueueType::Stream,
        segments,
    ))
}

/// Reads from offset `from` (or the first still present) up to `end`, or, without an end,
/// until SIGTERM/SIGINT (a continuous backup: the stop ends the read normally), into batches of
/// records. Returns the number of messages read and the last offset read.
fn read_stream(
    ctx: &QueueContext,
    conn: &StreamConnection,
    q: &QueueInfo,
    from: u64,
    end: Option<u64>,
    m: &metrics::BackupQueueMetrics,
    batches: &Sender<Vec<BackupRecord>>,
) -> Result<(u64, Option<u64>)> {
    let spec = if from == 0 {
        OffsetSpec::First
    } else {
        OffsetSpec::Offset(from)
    };
    // The broker's version decides how its messages map to records (`stream::amqp10`).
    let conversion = Conversion::of_version(conn.server_version());
    let sub = conn.subscribe(1, &q.name, spec, CREDIT)?;
    let mut next = from;
    let (mut read, mut last) = (0u64, None);
    let mut raw_messages = 0u64;
    let mut batches = Batches::new(batches, m);
    while end.is_none_or(|e| next <= e) {
        if let Some(why) = ctx.read.lock.lost() {
            return Err(Error::Io(why));
        }
        if let Some(why) = crate::run::signals::stop_reason("backup") {
            if end.is_some() {
                return Err(Error::Io(why));
            }
            log::info!(
                "stream {} in vhost {}: {why}; the last segment is stored and the backup completed",
                q.name,
                q.vhost
            );
            break;
        }
        let wait = if end.is_some() {
            CHUNK_WAIT
        } else {
            IDLE_FLUSH
        };
        let Some(chunk) = sub.next_chunk(wait)? else {
            if let Some(e) = end {
                return Err(Error::Stream(format!(
                    "stream {} in vhost {}: no chunk within {} s at offset {next} (its end at the start: {e})",
                    q.name,
                    q.vhost,
                    CHUNK_WAIT.as_secs()
                )));
            }
            batches.flush()?;
            continue;
        };
        conn.credit(sub.id, 1)?;
        let at_chunk = |e: Error| match e {
            Error::Stream(m) => {
                Error::Stream(format!("stream {} in vhost {}: {m}", q.name, q.vhost))
            }
            Error::Compression(m) => {
                Error::Compression(format!("stream {} in vhost {}: {m}", q.name, q.vhost))
            }
            other => other,
        };
        let c = parse_chunk(&chunk).map_err(at_chunk)?;
        let first = c.header.first_offset;
        if first > next {
            log::debug!(
                "stream {}: offsets {next}..{first} are gone (retention); reading from {first}",
                q.name
            );
        }
        for (offset, message) in (first..).zip(c.messages()) {
            let message = message.map_err(at_chunk)?;
            if offset < next {
                continue;
            }
            if end.is_some_and(|e| offset > e) {
                break;
            }
            let (rec, raw) = to_record(
                &message,
                Origin {
                    conversion,
                    stream: &q.name,
                    vhost: &q.vhost,
                    offset,
                    backed_up_at: now_ms(),
                },
            );
            if let Some(why) = raw {
                raw_messages += 1;
                if raw_messages == 1 {
                    log::warn!(
                        "stream {} in vhost {}, offset {offset}: an AMQP 1.0 message a 0-9-1 record cannot hold ({why}); it is stored whole as its encoded bytes (header {RAW_BODY_HEADER}), and so is every such message",
                        q.name,
                        q.vhost
                    );
                }
            }
            batches.push(rec)?;
            read += 1;
            last = Some(offset);
        }
        next = next.max(c.header.next_offset()?);
    }
    if raw_messages > 0 {
        log::warn!(
            "stream {} in vhost {}: {raw_messages} message(s) stored whole as AMQP 1.0 bytes (docs/streams.md \"Streams\")",
            q.name,
            q.vhost
        );
    }
    batches.flush()?;
    conn.unsubscribe(sub.id)?;
    Ok((read, last))
}
