//! Osiris chunks as `Deliver` frames carry them: `parse_chunk`, then every message of
//! `Chunk::messages()` to the end (simple entries, plain and zstd sub-entry batches).
//!
//! Each input is tried as it is and, when it holds a whole header, again with the CRC32 its
//! header announces made right, so that the fuzzer reaches the entries.
//!
//! Invariants beyond "no panic": errors are `Stream protocol error:` or `Compression error:`;
//! a chunk never gives more messages than its header announces, gives exactly that many when
//! it ends cleanly (none for a tracking chunk), no message over `MAX_MESSAGE` and no more
//! than `CHUNK_BUDGET` bytes in all; an error ends the iteration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::stream::chunk::{
    parse_chunk, CHUNK_BUDGET, CHUNK_HEADER_LEN, CHUNK_USER, MAX_MESSAGE,
};
use rmq_backup::Error;

fn chunk_error(e: &Error) {
    assert!(
        matches!(e, Error::Stream(_) | Error::Compression(_)),
        "unexpected error kind: {e:?}"
    );
}

fn read_all(b: &[u8]) {
    let chunk = match parse_chunk(b) {
        Ok(c) => c,
        Err(e) => return chunk_error(&e),
    };
    let h = chunk.header;
    assert!(h.next_offset().is_ok());
    let mut it = chunk.messages();
    let (mut count, mut bytes) = (0u64, 0u64);
    let mut clean = true;
    for m in it.by_ref() {
        match m {
            Ok(m) => {
                assert!(m.len() <= MAX_MESSAGE);
                count += 1;
                bytes += m.len() as u64;
                assert!(bytes <= CHUNK_BUDGET);
                assert!(count <= u64::from(h.num_records), "more than announced");
            }
            Err(e) => {
                chunk_error(&e);
                clean = false;
                break;
            }
        }
    }
    assert!(it.next().is_none(), "the iteration goes on after its end");
    if clean {
        let want = if h.chunk_type == CHUNK_USER {
            u64::from(h.num_records)
        } else {
            0
        };
        assert_eq!(count, want, "{h:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    read_all(data);
    if data.len() >= CHUNK_HEADER_LEN {
        let mut fixed = data.to_vec();
        let start = CHUNK_HEADER_LEN + fixed[44] as usize;
        let len = u32::from_be_bytes([fixed[36], fixed[37], fixed[38], fixed[39]]) as usize;
        if let Some(body) = start.checked_add(len).and_then(|end| data.get(start..end)) {
            let crc = crc32fast::hash(body);
            fixed[32..36].copy_from_slice(&crc.to_be_bytes());
            if fixed != data {
                read_all(&fixed);
            }
        }
    }
});
