//! One queue's backup: its own AMQP connection, the read (`crate::reader`), and the batches of
//! records handed to the queue's segment builder (`super::segments`).

use super::resume;
use super::segments::{build_segments, Batches, Upload};
use super::QueueContext;
use crate::amqp::Connection;
use crate::broker::QueueType;
use crate::config::RequeueStrategy;
use crate::error::{Error, Result};
use crate::management::QueueInfo;
use crate::manifest::QueueBackup;
use crate::metrics;
use crate::now_ms;
use crate::progress;
use crate::reader;
use crate::record::BackupRecord;
use crate::spool::spawn_named;
use crossbeam_channel::{bounded, Sender};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Batches in flight between a queue thread and its segment builder.
const BATCH_CHANNEL: usize = 4;
/// Deliveries buffered between a queue's AMQP connection and its queue thread.
const CONSUMER_BUFFER: usize = 512;

/// Backs up one queue on its own AMQP connection. `Ok(None)`: the queue was deleted after it
/// was listed.
pub(super) fn backup_queue(
    ctx: &QueueContext,
    q: &QueueInfo,
    uploads: &Sender<Upload>,
) -> Result<Option<QueueBackup>> {
    let kind = q.queue_type.unwrap_or(QueueType::Classic);
    if !ctx.opts.stop_at_current_depth {
        log::warn!(
            "queue {} in vhost {} ({}): a continuous backup follows streams only; this queue is backed up once, to its depth at the start (holding its messages longer would take them from its own consumers)",
            q.name,
            q.vhost,
            kind.as_str()
        );
    }
    if let Some(done) = resume::completed_earlier(ctx, q, kind)? {
        return Ok(Some(done));
    }
    let after = resume::start_queue(ctx, q)?;
    let mut strategy = ctx.opts.requeue_strategy;
    if q.auto_delete && matches!(strategy, RequeueStrategy::Cancel | RequeueStrategy::Reject) {
        // Cancelling the last consumer of an auto-delete queue deletes it, messages and all;
        // basic.get registers no consumer.
        log::info!(
            "queue {} in vhost {} is auto-delete: read with basic.get instead of a consumer",
            q.name,
            q.vhost
        );
        strategy = RequeueStrategy::Get;
    }
    let mut options = ctx.connect_options(
        &q.vhost,
        format!("rmq-backup {} {}/{}", ctx.backup_id, q.vhost, q.name),
    );
    // A deeper delivery buffer absorbs the segment builder's pauses (a compressed chunk, a
    // rotation) without stalling the broker; batches are bounded by bytes too, so large
    // messages still hold at most ~8 MiB here.
    options.consumer_buffer = CONSUMER_BUFFER;
    let conn = Connection::open(&options)?;
    log::info!("queue {} in vhost {}: backing up", q.name, q.vhost);
    // Resolved once: the per-message updates below are relaxed atomic adds.
    let m = metrics::global().backup_queue(&q.name, &q.vhost, kind.as_str());
    let _row = progress::row(
        format!("{} (vhost {})", q.name, q.vhost),
        q.messages,
        m.messages_read.clone(),
        m.bytes_read.clone(),
    );

    let (batch_tx, batch_rx) = bounded::<Vec<BackupRecord>>(BATCH_CHANNEL);
    let started = Instant::now();
    let (read, built) = std::thread::scope(|s| {
        let builder = spawn_named(s, "segment-builder", || {
            build_segments(ctx, q, &m, batch_rx, uploads, after)
        });
        let mut batches = Batches::new(&batch_tx, &m);
        let mut sink = |d: crate::amqp::Delivery| -> Result<()> {
            batches.push(BackupRecord::from_delivery(d, &q.name, &q.vhost, now_ms()))
        };
        let should_stop = || {
            if let Some(why) = ctx.lock.lost() {
                return Some(why);
            }
            if let Some(why) = crate::signals::stop_reason("backup") {
                return Some(why);
            }
            if ctx.stop.load(Ordering::Relaxed) {
                return Some("backup stopped: the broker blocked another connection".to_string());
            }
            conn.blocked().map(|reason| {
                ctx.stop.store(true, Ordering::Relaxed);
                format!(
                    "broker blocked the connection ({reason}); backup of queue {} stopped, every message left in place",
                    q.name
                )
            })
        };
        let read = reader::read_queue(&conn, &q.name, kind, strategy, &mut sink, &should_stop);
        if read.is_ok() {
            let _ = batches.flush();
        }
        drop(batches);
        drop(batch_tx);
        let built = builder
            .join()
            .unwrap_or_else(|_| Err(Error::Io("segment builder panicked".into())));
        (read, built)
    });
    let closed = conn.close();
    // A builder failure (storage, encoding) is the cause when the reader saw only a closed channel.
    let segments = match (read, built) {
        (Err(Error::Amqp(m)), Ok(segments))
            if segments.is_empty() && m.starts_with("NOT_FOUND - no queue") =>
        {
            log::warn!(
                "queue {} in vhost {} was deleted after it was listed: skipped",
                q.name,
                q.vhost
            );
            return Ok(None);
        }
        (Err(e), Ok(_)) => return Err(e),
        (_, Err(e)) => return Err(e),
        (Ok(outcome), Ok(segments)) => {
            log::info!(
                "queue {} in vhost {}: {} messages in {} segment(s), {:.1} s",
                q.name,
                q.vhost,
                outcome.read,
                segments.len(),
                started.elapsed().as_secs_f64()
            );
            segments
        }
    };
    if let Err(e) = closed {
        log::debug!("closing connection of queue {}: {e}", q.name);
    }
    if let Some(cp) = ctx.checkpoints {
        cp.complete_backup_queue(ctx.backup_id, &q.vhost, &q.name)?;
    }
    Ok(Some(QueueBackup::from_segments(
        &q.vhost, &q.name, kind, segments,
    )))
}
