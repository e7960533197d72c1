//! RBAK segment files: `SegmentReader::open` (magic, version, compression, size, end magic,
//! CRC32) and every record of `records()` (plain, zstd and lz4 payloads), each parsed with
//! `RawRecord::into_record` as a restore does (either segment version).
//!
//! The reader opens a path: each input is written to a file first (in `$TMPDIR`). An input that ends with
//! the end magic `KABR` is the whole file; any other input is a header and payload, and the
//! footer (its correct CRC32 and `KABR`) is appended, so that the fuzzer reaches the payload.
//!
//! Records are limited to 16 MiB of JSON (`SegmentReader::max_record_bytes`).
//!
//! Invariants beyond "no panic": errors are `Serialization error:` or `Compression error:`; a
//! segment never gives more records than its header announces, and exactly that many when it
//! ends cleanly; an error ends the iteration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::repository::segment::{SegmentReader, END_MAGIC};
use rmq_backup::Error;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Records longer than this are refused (production: `MAX_RECORD_BYTES`, 2 GiB, what a
/// 512 MiB message can take): a few KiB of zstd can announce and really hold a record of
/// hundreds of MiB, which is legitimate data, not a fault, and past libFuzzer's RSS limit.
const MAX_RECORD: u64 = 16 << 20;

fn file() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("rmq-backup-fuzz-segment-{}", std::process::id()))
    })
}

fn segment_error(e: &Error) {
    assert!(
        matches!(e, Error::Serialization(_) | Error::Compression(_)),
        "unexpected error kind: {e:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if !data.ends_with(END_MAGIC) {
        bytes.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
        bytes.extend_from_slice(END_MAGIC);
    }
    let path = file();
    std::fs::write(path, &bytes).expect("write the segment file");
    let reader = match SegmentReader::open(path) {
        Ok(r) => r.max_record_bytes(MAX_RECORD),
        Err(e) => return segment_error(&e),
    };
    let announced = reader.header().record_count;
    let mut records = reader.records();
    let mut count = 0u64;
    let mut clean = true;
    for r in records.by_ref() {
        match r {
            Ok(json) => {
                count += 1;
                assert!(count <= announced, "more records than announced");
                if let Err(e) = json.into_record() {
                    assert!(matches!(e, Error::Serialization(_)), "{e:?}");
                }
            }
            Err(e) => {
                segment_error(&e);
                clean = false;
                break;
            }
        }
    }
    assert!(
        records.next().is_none(),
        "the iteration goes on after its end"
    );
    assert_eq!(records.records_read(), count);
    if clean {
        assert_eq!(count, announced);
    }
});
