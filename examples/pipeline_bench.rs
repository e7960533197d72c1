//! The backup pipeline without a broker: records from memory through `encode_record`, the
//! segment writer's compression (zstd-3) and a spool file that is then deleted (a null storage),
//! with 0, 1 and 2 zstd worker threads (the compression pool; 0 compresses on the encoding
//! thread). Shows where the limit of a compression-bound shape goes with more cores.
//!
//! ```text
//! cargo run --release --example pipeline_bench      (or scripts/bench.sh pipeline)
//! ```
//!
//! Records are built like the broker benchmark's (`bench_common::Messages`, 20 headers), before
//! the clock starts.
//! Prints msg/s, MB/s of body and CPU seconds (user + system, all threads) per 100,000 messages,
//! the best of 3 runs per line.

mod bench_common;

use bench_common::*;
use rmq_backup::record::{encode_record, BackupRecord};
use rmq_backup::segment::{Compression, SegmentWriter};
use std::time::Instant;

fn records(n: usize, size: usize, text: bool) -> Vec<BackupRecord> {
    let msgs = Messages::generate(n, size, text);
    (0..n).map(|i| bench_record(i, &msgs)).collect()
}

/// One pass: every record encoded and appended to segments of at most 128 MiB (SPEC.md's
/// default `segment_max_bytes`), each finished and deleted. Returns (seconds, CPU seconds).
fn pass(recs: &[BackupRecord], workers: u32, dir: &std::path::Path) -> (f64, f64) {
    let me = std::process::id();
    let cpu0 = cpu_secs(me).unwrap_or(0.0);
    let started = Instant::now();
    let mut json = Vec::new();
    let mut writer: Option<SegmentWriter> = None;
    let mut k = 0;
    for r in recs {
        json.clear();
        encode_record(r, &mut json);
        if writer
            .as_ref()
            .is_some_and(|w| w.uncompressed_bytes() + json.len() as u64 + 4 > 128 << 20)
        {
            let done = writer.take().unwrap().finish().expect("finish");
            std::fs::remove_file(done.path).expect("remove");
        }
        let w = writer.get_or_insert_with(|| {
            k += 1;
            SegmentWriter::create_with_workers(
                &dir.join(format!("seg-{k}")),
                Compression::Zstd,
                3,
                workers,
            )
            .expect("segment")
        });
        w.append(&json, r.backed_up_at).expect("append");
    }
    if let Some(w) = writer {
        let done = w.finish().expect("finish");
        std::fs::remove_file(done.path).expect("remove");
    }
    let secs = started.elapsed().as_secs_f64();
    (secs, cpu_secs(me).unwrap_or(0.0) - cpu0)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("rmqb-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    println!(
        "backup pipeline without a broker: encode + zstd-3 + spool file, {} cores here; best of 3",
        std::thread::available_parallelism().map_or(1, |c| c.get())
    );
    println!(
        "{:<28} {:>12} {:>10} {:>10} {:>12}",
        "shape", "zstd workers", "msg/s", "MB/s body", "CPU-s/100k"
    );
    for (n, size, text) in [
        (100_000usize, 1024usize, true),
        (100_000, 1024, false),
        (5_000, 65_536, true),
        (5_000, 65_536, false),
        (300, 1 << 20, false),
    ] {
        let recs = records(n, size, text);
        let shape = format!("{n} x {size} B {}", if text { "text" } else { "random" });
        for workers in [0u32, 1, 2] {
            let best = (0..3)
                .map(|_| pass(&recs, workers, &dir))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap();
            println!(
                "{shape:<28} {workers:>12} {:>10.0} {:>10.1} {:>12.2}",
                n as f64 / best.0,
                (n * size) as f64 / best.0 / 1e6,
                best.1 * 100_000.0 / n as f64
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
