//! One stream's backup through AMQP 0-9-1 (`backup.stream_enabled: false`): a consumer with
//! `x-stream-offset`, a prefetch window, and acknowledgements that only give the broker credit
//! (a stream keeps its messages whatever a consumer does).
//!
//! The end is the offset of the stream's last message when the read starts: read from the
//! header of its last chunk over the stream protocol (`super::stream::end_over_stream_protocol`)
//! when the stream port answers; else the highest offset a 0-9-1 consumer at `last` receives
//! until the stream is quiet (0-9-1 has no exact way to ask). Then the stream is read from
//! `first` up to it. The broker's own `x-stream-offset` header is
//! metadata, not part of the message: it gives the record's offset (its `delivery_tag`,
//! SPEC.md "Segment file") and is left out of its headers. What the broker's 0-9-1 conversion drops
//! (table and array headers of messages published over 0-9-1) is not in the backup; see
//! docs/streams.md "Streams".

use super::context::QueueContext;
use super::resume;
use super::segments::{build_segments, Batches, Upload};
use crate::broker::amqp::{Channel, Connection, Delivery, FieldValue};
use crate::broker::management::QueueInfo;
use crate::broker::QueueType;
use crate::error::{Error, Result};
use crate::metrics;
use crate::now_ms;
use crate::repository::manifest::QueueBackup;
use crate::repository::record::BackupRecord;
use crate::repository::spool::spawn_named;
use crate::run::progress;
use crossbeam_channel::{bounded, Sender};
use std::time::{Duration, Instant};

/// Unacknowledged deliveries the broker may send ahead.
const PREFETCH: u16 = 1000;
/// Without the stream protocol: the end is the last offset delivered before this long without
/// a delivery ...
const QUIET: Duration = Duration::from_secs(3);
/// ... or this long after the first.
const END_LIMIT: Duration = Duration::from_secs(60);
/// How long a stream the management API counts no message in is given to deliver (its counts
/// lag the stream by up to ~10 s).
const EMPTY_WAIT: Duration = Duration::from_secs(5);
/// The longest wait for the next delivery of a stream known to hold more.
const DELIVERY_WAIT: Duration = Duration::from_secs(30);

/// The offset the broker put in a stream delivery's `x-stream-offset` header.
fn offset_of(d: &Delivery) -> Option<u64> {
    d.properties
        .headers
        .as_ref()?
        .iter()
        .find(|(k, _)| k == "x-stream-offset")
        .and_then(|(_, v)| match v {
            FieldValue::I64(n) => u64::try_from(*n).ok(),
            FieldValue::U32(n) => Some(*n as u64),
            FieldValue::I32(n) => u64::try_from(*n).ok(),
            _ => None,
        })
}

/// Removes the broker's `x-stream-offset` header (and the table it leaves empty).
fn strip_offset(d: &mut Delivery) {
    if let Some(h) = d.properties.headers.as_mut() {
        h.retain(|(k, _)| k != "x-stream-offset");
        if h.is_empty() {
            d.properties.headers = None;
        }
    }
}

fn consume_from(ch: &Channel, stream: &str, from: &str) -> Result<crate::broker::amqp::Consumer> {
    ch.basic_qos(PREFETCH, false)?;
    let args = vec![(
        "x-stream-offset".to_string(),
        FieldValue::LongString(from.as_bytes().to_vec()),
    )];
    ch.basic_consume(stream, "rmq-backup", false, false, &args)
}

/// The stream's last offset now, `None` when it is empty: the header of its last chunk over
/// the stream protocol when the stream port answers (exact), else [`last_offset_until_quiet`].
fn end_of_stream(ctx: &QueueContext, conn: &Connection, q: &QueueInfo) -> Result<Option<u64>> {
    match super::stream::end_over_stream_protocol(ctx, q) {
        Ok(end) => Ok(end),
        Err(e) => {
            log::warn!(
                "stream {} in vhost {}: its end cannot be read over the stream protocol ({e}); it is taken over AMQP 0-9-1 as the last offset delivered from its end until nothing more comes for {} s, which includes what publishers add meanwhile",
                q.name,
                q.vhost,
                QUIET.as_secs()
            );
            last_offset_until_quiet(conn, q)
        }
    }
}

/// The highest offset delivered by a consumer at `last` until [`QUIET`] passes without a
/// delivery (RabbitMQ delivers the whole last chunk, then what is published after), at most
/// [`END_LIMIT`]; `None` when nothing comes within [`DELIVERY_WAIT`] (the management API's
/// count says the stream holds messages) or [`EMPTY_WAIT`] (it says none).
fn last_offset_until_quiet(conn: &Connection, q: &QueueInfo) -> Result<Option<u64>> {
    let ch = conn.open_channel()?;
    let consumer = consume_from(&ch, &q.name, "last")?;
    let first_wait = if q.messages > 0 {
        DELIVERY_WAIT
    } else {
        EMPTY_WAIT
    };
    let mut end = None;
    let started = Instant::now();
    let mut wait = first_wait;
    while let Some(d) = consumer.recv_timeout(wait)? {
        ch.basic_ack(d.delivery_tag, false)?;
        end = end.max(offset_of(&d));
        if started.elapsed() >= END_LIMIT {
            break;
        }
        wait = QUIET;
    }
    ch.close()?;
    if end.is_none() && q.messages > 0 {
        return Err(Error::Amqp(format!(
            "stream {} in vhost {}: nothing delivered from its end within {} s although the management API counts {} messages",
            q.name,
            q.vhost,
            first_wait.as_secs(),
            q.messages
        )));
    }
    Ok(end)
}

/// Backs up one stream through AMQP 0-9-1, from its first offset to its last at the start.
pub(super) fn backup_stream_amqp(
    ctx: &QueueContext,
    q: &QueueInfo,
    uploads: &Sender<Upload>,
) -> Result<Option<QueueBackup>> {
    if let Some(done) = resume::completed_earlier(ctx, q, QueueType::Stream)? {
        return Ok(Some(done));
    }
    let after = resume::start_queue(ctx, q)?;
    let options = ctx.read.connect_options(
        &q.vhost,
        ctx.read
            .earlier_run
            .connection_name(&format!("{}/{}", q.vhost, q.name), ""),
    );
    let conn = ctx.read.nodes.connect(&options, q.node.as_deref())?;
    let end = end_of_stream(ctx, &conn, q).map_err(with_conversion_hint)?;
    log::info!(
        "stream {} in vhost {}: backing up {} through AMQP 0-9-1 (backup.stream_enabled is false)",
        q.name,
        q.vhost,
        end.map_or("nothing (empty)".to_string(), |e| format!(
            "offsets up to {e}"
        ))
    );
    let m = metrics::global().backup_queue(&q.name, &q.vhost, QueueType::Stream.as_str());
    let _row = progress::row(
        format!("{} (stream, vhost {})", q.name, q.vhost),
        end.map_or(0, |e| e.saturating_add(1)),
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
            Some(end) => read_to(ctx, &conn, q, end, &m, &batch_tx),
            None => Ok(0),
        };
        drop(batch_tx);
        let built = builder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("segment builder panicked".into())));
        (read, built)
    });
    if let Err(e) = conn.close() {
        log::debug!("closing connection of stream {}: {e}", q.name);
    }
    let (read, segments) = match (read, built) {
        (_, Err(e)) | (Err(e), _) => return Err(with_conversion_hint(e)),
        (Ok(r), Ok(b)) => (r, b),
    };
    log::info!(
        "stream {} in vhost {}: {read} messages in {} segment(s), {:.1} s",
        q.name,
        q.vhost,
        segments.len(),
        started.elapsed().as_secs_f64()
    );
    super::stream::completed(ctx, q, end, segments).map(Some)
}

/// RabbitMQ 3.10 cannot convert some stream messages for an AMQP 0-9-1 reader (an
/// `amqp-value` or `amqp-sequence` body, no `data` section): the channel crashes (the reader
/// sees `INTERNAL_ERROR`, or no answer at all), and a hostile message can make the broker
/// itself allocate gigabytes while it reports the crash. The stream protocol reads them
/// (`backup.stream_enabled: true`). Every AMQP or connection error of the read says so.
fn with_conversion_hint(e: Error) -> Error {
    let hint = "; if the stream holds messages of AMQP 1.0 or stream-protocol clients (an amqp-value or amqp-sequence body), RabbitMQ 3.10 cannot convert them for an AMQP 0-9-1 reader: set backup.stream_enabled: true to read the stream over the stream protocol, which stores such messages whole";
    match e {
        Error::Amqp(m) => Error::Amqp(format!("{m}{hint}")),
        Error::Connection(m) => Error::Connection(format!("{m}{hint}")),
        other => other,
    }
}

/// Reads offsets from the first to `end` into batches of records; returns how many.
fn read_to(
    ctx: &QueueContext,
    conn: &Connection,
    q: &QueueInfo,
    end: u64,
    m: &metrics::BackupQueueMetrics,
    batches: &Sender<Vec<BackupRecord>>,
) -> Result<u64> {
    let ch = conn.open_channel()?;
    let consumer = consume_from(&ch, &q.name, "first")?;
    let (mut next, mut read) = (0u64, 0u64);
    let mut batches = Batches::new(batches, m);
    while next <= end {
        if let Some(why) = ctx
            .read
            .lock
            .lost()
            .or_else(|| crate::run::signals::stop_reason("backup"))
        {
            return Err(Error::Io(why));
        }
        let mut d = consumer.recv_timeout(DELIVERY_WAIT)?.ok_or_else(|| {
            Error::Amqp(format!(
                "stream {} in vhost {}: no delivery within {} s at offset {next} (its end at the start: {end})",
                q.name,
                q.vhost,
                DELIVERY_WAIT.as_secs()
            ))
        })?;
        // Acknowledgements give the broker credit; they take nothing from a stream.
        ch.basic_ack(d.delivery_tag, false)?;
        let offset = offset_of(&d).ok_or_else(|| {
            Error::Amqp(format!(
                "stream {} in vhost {}: a delivery without x-stream-offset",
                q.name, q.vhost
            ))
        })?;
        if offset < next {
            continue;
        }
        if offset > end {
            break;
        }
        next = offset.checked_add(1).ok_or_else(|| {
            Error::Amqp(format!(
                "stream {} in vhost {}: a delivery at offset {offset}, beyond the largest",
                q.name, q.vhost
            ))
        })?;
        strip_offset(&mut d);
        // SPEC.md "Segment file": a stream record's delivery tag is its offset, its exchange
        // and routing key are empty.
        d.delivery_tag = offset;
        d.exchange.clear();
        d.routing_key.clear();
        d.redelivered = false;
        batches.push(BackupRecord::from_delivery(d, &q.name, &q.vhost, now_ms()))?;
        read += 1;
    }
    batches.flush()?;
    ch.close()?;
    Ok(read)
}
