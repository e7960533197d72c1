//! Backup records (`record::decode_record`, the hot-path JSON codec, and the serde derives
//! with their custom body and float codecs), compared against plain serde_json as the
//! record tests do.
//!
//! Invariants beyond "no panic": `decode_record` accepts exactly what
//! `serde_json::from_slice::<BackupRecord>` accepts, with the same record; its errors are
//! `Serialization error: Invalid backup record:`; a decoded record encodes
//! (`encode_record`) to bytes identical to `serde_json::to_vec`, which decode back to a record
//! that encodes to the same bytes (compared as bytes: a NaN is not equal to itself).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::repository::record::{decode_record, encode_record, BackupRecord};
use rmq_backup::Error;

fn encode(r: &BackupRecord) -> Vec<u8> {
    let mut out = Vec::new();
    encode_record(r, &mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let ours = decode_record(data);
    let reference = serde_json::from_slice::<BackupRecord>(data);
    let rec = match (ours, reference) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                encode(&a),
                encode(&b),
                "decode_record and serde_json disagree"
            );
            a
        }
        (Err(e), Err(_)) => {
            assert!(matches!(e, Error::Serialization(_)), "{e:?}");
            assert!(
                e.to_string()
                    .starts_with("Serialization error: Invalid backup record: "),
                "{e}"
            );
            return;
        }
        (a, b) => panic!(
            "decode_record {:?} but serde_json {:?}",
            a.map(|_| "accepts"),
            b.map(|_| "accepts")
        ),
    };
    let once = encode(&rec);
    let reference = serde_json::to_vec(&rec).expect("serde_json encodes a record");
    assert!(once == reference, "encode_record differs from serde_json");
    let back = decode_record(&once).unwrap_or_else(|e| panic!("re-encoded record: {e}"));
    assert!(
        encode(&back) == once,
        "a record does not survive its encoding"
    );
});
