//! Stream-protocol frames as a broker sends them: the reader thread's framing and dispatch
//! (`stream::decode_received`: size-prefixed frames, deliveries, publish confirms and errors,
//! the broker's close, metadata updates, credit errors, responses), the metadata and
//! `StreamStats` responses (`stream::client::parse_metadata`, `parse_stream_stats`), the
//! chunks that deliveries carry, and `Cursor` driven field by field.
//!
//! Invariants beyond "no panic": the reading ends with a `Stream protocol error:` or a
//! `Connection error:`, never more frames than the bytes hold; a cursor never reads past its
//! data, consumes exactly what it returns, and fails only with `Stream protocol error:`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::stream::chunk::parse_chunk;
use rmq_backup::broker::stream::client::{parse_metadata, parse_stream_stats};
use rmq_backup::broker::stream::decode_received;
use rmq_backup::broker::stream::protocol::{key, Cursor};
use rmq_backup::Error;

fn stream(e: &Error) {
    assert!(matches!(e, Error::Stream(_)), "not a stream error: {e:?}");
    assert!(e.to_string().starts_with("Stream protocol error: "), "{e}");
}

/// Reads fields as `ops` says from `data`, checking the cursor's accounting.
fn cursor_program(ops: &[u8], data: &[u8]) {
    let mut c = Cursor::new(data);
    for &op in ops {
        let before = c.remaining();
        let r: Result<usize, Error> = match op % 10 {
            0 => c.u8().map(|_| 1),
            1 => c.u16().map(|_| 2),
            2 => c.u32().map(|_| 4),
            3 => c.u64().map(|_| 8),
            4 => c.string().map(|s| {
                // Lossy UTF-8 may grow the text, never beyond 3 bytes per byte.
                assert!(s.len() <= 3 * before);
                usize::MAX
            }),
            5 => c.bytes().map(|b| {
                assert!(b.len() + 4 <= before);
                b.len() + 4
            }),
            6 => c.count((op / 10) as usize).map(|n| {
                assert!(n.saturating_mul(((op / 10) as usize).max(1)) <= before - 4);
                4
            }),
            7 => c.string_map().map(|_| usize::MAX),
            8 => Ok(c.rest().len()),
            _ => c.u16().map(|_| 2),
        };
        match r {
            Ok(usize::MAX) => assert!(c.remaining() <= before),
            Ok(n) => assert_eq!(before - c.remaining(), n, "op {op}"),
            Err(e) => {
                stream(&e);
                return;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (frames, end) = decode_received(data);
    assert!(
        matches!(end, Error::Stream(_) | Error::Connection(_)),
        "{end:?}"
    );
    let framed: usize = frames.iter().map(|f| f.len() + 4).sum();
    assert!(framed <= data.len());
    for f in &frames {
        assert!(f.len() >= 4);
        if let Err(e) = parse_metadata(f) {
            stream(&e);
        }
        if let Err(e) = parse_stream_stats(f) {
            stream(&e);
        }
        if u16::from_be_bytes([f[0], f[1]]) == key::DELIVER && f.len() > 5 {
            // What a subscription hands to the backup: the chunk after the subscription id.
            if let Ok(chunk) = parse_chunk(&f[5..]) {
                for m in chunk.messages() {
                    if m.is_err() {
                        break;
                    }
                }
            }
        }
    }
    if let Some((&n, rest)) = data.split_first() {
        let k = (n as usize).min(rest.len());
        cursor_program(&rest[..k], &rest[k..]);
    }
});
