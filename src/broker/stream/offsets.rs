//! Where a stream ends, read from the header of its last chunk: a subscription at `last`
//! receives the stream's last chunk first (PROTOCOL.adoc "Subscribe", offset specification
//! `last`). Used by a backup to know where to stop and by a restore to know which offsets the
//! messages it published took (stream consumer offsets, `crate::restore`).

use super::chunk::parse_header;
use super::{OffsetSpec, StreamConnection};
use crate::error::Result;
use std::time::Duration;

/// The offset of the last message of `stream` now, or `None` when no chunk arrived within
/// `wait` (an empty stream sends none). Uses subscription id 0 of `conn`, released before it
/// returns.
///
/// Errors: the subscription's (`Stream protocol error: ... stream does not exist`), a chunk
/// that does not parse.
pub fn last_offset(conn: &StreamConnection, stream: &str, wait: Duration) -> Result<Option<u64>> {
    let sub = conn.subscribe(0, stream, OffsetSpec::Last, 1)?;
    let chunk = sub.next_chunk(wait);
    conn.unsubscribe(0)?;
    match chunk? {
        Some(c) => parse_header(&c)?.last_offset(),
        None => Ok(None),
    }
}
