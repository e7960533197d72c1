//! Stream messages stored whole (`crate::broker::stream::amqp10::RAW_BODY_HEADER`) published back
//! into a stream over the stream protocol, so that the target stream holds the same AMQP 1.0
//! bytes as the source did (over AMQP 0-9-1 they would become the body of a new message).
//!
//! The stream connection to the target opens on the first such record of a queue. The
//! publisher of the records before it has every publish confirmed first, and each batch here
//! is confirmed before the next record goes out over 0-9-1, so the stream keeps the backup's
//! order.

use crate::broker::stream::amqp10::{RAW_BODY_HEADER, RAW_BODY_VALUE};
use crate::broker::stream::{Publisher, StreamConnection, StreamOptions};
use crate::error::{Error, Result};
use crate::repository::record::{BackupHeaderValue, BackupRecord};
use std::time::Duration;

/// Longest wait for the confirms of one batch.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(120);
/// Message bytes per publish frame at most (RabbitMQ's default stream `frame_max` is 1 MiB).
const FRAME_BYTES: usize = 512 << 10;
/// A publish frame's bytes besides its messages: size, key, version, publisher id, count.
const FRAME_OVERHEAD: usize = 4 + 2 + 2 + 1 + 4;
/// Each message's bytes in a publish frame besides its own: publishing id and size.
const MESSAGE_OVERHEAD: usize = 8 + 4;

/// True when `record` holds a whole AMQP 1.0 message as its body.
pub(super) fn is_raw(record: &BackupRecord) -> bool {
    matches!(
        record.headers.as_slice(),
        [(k, BackupHeaderValue::LongString(v))] if k == RAW_BODY_HEADER && v == RAW_BODY_VALUE
    )
}

/// The target stream of one queue's restore, over the stream protocol.
pub(super) struct StreamTarget {
    options: StreamOptions,
    stream: String,
    open: Option<(StreamConnection, Publisher)>,
    next_id: u64,
}

impl StreamTarget {
    /// A target for stream `stream`; `options` give the target's host, stream port,
    /// credentials, vhost and TLS. Nothing connects yet.
    pub(super) fn new(options: StreamOptions, stream: &str) -> StreamTarget {
        StreamTarget {
            options,
            stream: stream.to_string(),
            open: None,
            next_id: 0,
        }
    }

    /// Publishes `messages` (whole AMQP 1.0 messages) in order and waits for every confirm.
    ///
    /// Errors: `Connection error` / `Stream protocol error` for the stream port (with a hint to
    /// set `target.stream_port`), a refused publish, or confirms missing after 120 s.
    pub(super) fn publish(&mut self, messages: &[&[u8]]) -> Result<()> {
        if self.open.is_none() {
            let conn = StreamConnection::open(&self.options).map_err(|e| {
                with_context(
                    e,
                    &format!(
                        "stream {} in vhost {}: the records stored whole as AMQP 1.0 messages go back over the stream protocol, port {} (target.stream_port)",
                        self.stream, self.options.vhost, self.options.port
                    ),
                )
            })?;
            let publisher = conn.declare_publisher(1, &self.stream)?;
            self.open = Some((conn, publisher));
        }
        let Some((conn, publisher)) = self.open.as_ref() else {
            return Ok(());
        };
        // RabbitMQ 4.x closes the connection on a frame over its frame_max (3.10 took one).
        let limit = match conn.frame_max() as usize {
            0 => usize::MAX,
            n => n,
        };
        let mut frame: Vec<(u64, &[u8])> = Vec::new();
        let mut bytes = 0usize;
        let mut sent = 0usize;
        for m in messages {
            if FRAME_OVERHEAD + MESSAGE_OVERHEAD + m.len() > limit {
                return Err(Error::Stream(format!(
                    "stream {} in vhost {}: a message stored whole of {} bytes does not fit in a publish frame of {} (the broker's stream frame_max, stream.frame_max)",
                    self.stream,
                    self.options.vhost,
                    m.len(),
                    limit
                )));
            }
            let framed = bytes + (frame.len() + 1) * MESSAGE_OVERHEAD + m.len();
            if !frame.is_empty()
                && (bytes + m.len() > FRAME_BYTES || FRAME_OVERHEAD + framed > limit)
            {
                conn.publish(publisher.id, &frame)?;
                sent += frame.len();
                frame.clear();
                bytes = 0;
            }
            frame.push((self.next_id, m));
            self.next_id += 1;
            bytes += m.len();
        }
        if !frame.is_empty() {
            conn.publish(publisher.id, &frame)?;
            sent += frame.len();
        }
        publisher.wait_confirms(sent, CONFIRM_TIMEOUT)
    }

    /// Closes the stream connection, when one was opened.
    pub(super) fn close(self) -> Result<()> {
        match self.open {
            Some((conn, _)) => conn.close(),
            None => Ok(()),
        }
    }
}

fn with_context(e: Error, context: &str) -> Error {
    match e {
        Error::Connection(m) => Error::Connection(format!("{context}: {m}")),
        Error::Stream(m) => Error::Stream(format!("{context}: {m}")),
        other => other,
    }
}
