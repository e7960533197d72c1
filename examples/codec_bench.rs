//! Record codec benchmark: MB/s of message body for `encode_record` / `decode_record` against
//! plain `serde_json`, at 1 KiB and 64 KiB random bodies, on one core; then nanoseconds per
//! record of version 2 metadata (`encode_meta`) against serde_json's.
//!
//! Run with `cargo run --release --example codec_bench`.

use rmq_backup::repository::record::{
    decode_record, encode_meta, encode_record, BackupHeaderValue, BackupProperties, BackupRecord,
};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// xorshift64*: deterministic bodies.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

fn record(body_len: usize, seed: u64) -> BackupRecord {
    BackupRecord {
        body: random_bytes(seed, body_len),
        properties: BackupProperties {
            content_type: Some("application/octet-stream".into()),
            delivery_mode: Some(2),
            priority: Some(0),
            message_id: Some(format!("msg-{seed}")),
            timestamp: Some(1_700_000_000),
            app_id: Some("bench".into()),
            ..Default::default()
        },
        headers: (0..10)
            .map(|i| {
                let v = match i % 5 {
                    0 => BackupHeaderValue::LongString(format!("value-{i}")),
                    1 => BackupHeaderValue::LongInt(i),
                    2 => BackupHeaderValue::Bool(true),
                    3 => BackupHeaderValue::Timestamp(1_700_000_000),
                    _ => BackupHeaderValue::Double(1.5),
                };
                (format!("x-header-{i}"), v)
            })
            .collect(),
        exchange: "amq.direct".into(),
        routing_key: "bench".into(),
        delivery_tag: seed,
        redelivered: false,
        backed_up_at: 1_700_000_000_000,
        source_queue: "bench-queue".into(),
        source_vhost: "/".into(),
        message_format: None,
        wire: None,
    }
}

/// Runs `f` repeatedly in 5 windows of `min / 5` each and returns the best window's MB/s of
/// body (best-of, so that other processes on a shared machine disturb the figure less).
fn rate(body_bytes: usize, min: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let window = min / 5;
    let mut best = 0.0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let mut iters = 0u64;
        while start.elapsed() < window {
            f();
            iters += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        best = best.max((body_bytes as f64 * iters as f64) / secs / 1e6);
    }
    best
}

fn main() {
    let min = Duration::from_millis(
        std::env::var("BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500),
    );
    println!("record codec, one core, MB/s of body (random bytes, 10 headers; best of 5 windows)");
    #[cfg(target_arch = "x86_64")]
    println!(
        "body array: {} path",
        if std::is_x86_feature_detected!("ssse3") {
            "SSSE3"
        } else {
            "scalar"
        }
    );
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14}",
        "body", "encode", "serde_json enc", "decode", "serde_json dec"
    );
    for (label, body_len, batch) in [("1 KiB", 1024usize, 256usize), ("64 KiB", 65536, 8)] {
        let recs: Vec<BackupRecord> = (0..batch as u64).map(|s| record(body_len, s + 1)).collect();
        let jsons: Vec<Vec<u8>> = recs
            .iter()
            .map(|r| {
                let mut v = Vec::new();
                encode_record(r, &mut v);
                v
            })
            .collect();
        for (r, j) in recs.iter().zip(&jsons) {
            assert_eq!(
                j,
                &serde_json::to_vec(r).expect("serde_json"),
                "encoding differs"
            );
            assert_eq!(&decode_record(j).expect("decode"), r, "decoding differs");
        }
        let total = body_len * batch;
        let mut buf = Vec::with_capacity(body_len * 4 + 4096);
        let enc = rate(total, min, || {
            for r in &recs {
                buf.clear();
                encode_record(black_box(r), &mut buf);
                black_box(&buf);
            }
        });
        let enc_ref = rate(total, min, || {
            for r in &recs {
                buf.clear();
                serde_json::to_writer(&mut buf, black_box(r)).expect("serde_json");
                black_box(&buf);
            }
        });
        let dec = rate(total, min, || {
            for j in &jsons {
                black_box(decode_record(black_box(j)).expect("decode"));
            }
        });
        let dec_ref = rate(total, min, || {
            for j in &jsons {
                black_box(
                    serde_json::from_slice::<BackupRecord>(black_box(j)).expect("serde_json"),
                );
            }
        });
        println!("{label:>8} {enc:>14.0} {enc_ref:>14.0} {dec:>14.0} {dec_ref:>14.0}");
    }
    // Version 2 metadata: `encode_meta` against serde_json writing the same record without
    // its body (`"body":null` more: how encode_meta wrote it before `record/write.rs`).
    let recs: Vec<BackupRecord> = (0..256u64)
        .map(|s| BackupRecord {
            body: Vec::new(),
            ..record(0, s + 1)
        })
        .collect();
    let mut buf = Vec::with_capacity(4096);
    // `rate` with one "byte" per record: million records per second.
    let per_record = |mrec_s: f64| 1e3 / mrec_s;
    let meta = rate(recs.len(), min, || {
        for r in &recs {
            buf.clear();
            encode_meta(black_box(r), &mut buf);
            black_box(&buf);
        }
    });
    let meta_ref = rate(recs.len(), min, || {
        for r in &recs {
            buf.clear();
            serde_json::to_writer(&mut buf, black_box(r)).expect("serde_json");
            black_box(&buf);
        }
    });
    println!(
        "version 2 metadata (10 headers), ns per record: encode_meta {:.0}, serde_json {:.0}",
        per_record(meta),
        per_record(meta_ref)
    );
}
