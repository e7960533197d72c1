//! The backup pipeline without a broker: records from memory through `encode_record` (segment
//! format version 1) or `encode_meta` and the raw body (version 2), the segment writer's
//! compression (zstd-3) and a spool file that is then deleted (a null storage), with 0, 1 and 2
//! zstd worker threads (the compression pool; 0 compresses on the encoding thread). Shows where
//! the limit of a compression-bound shape goes with more cores.
//!
//! `PIPELINE_VERSIONS` (default `1 2`), `PIPELINE_WORKERS` (default `0 1 2`) and
//! `PIPELINE_COMPRESSIONS` (default `zstd`; `zstd lz4 none`) choose the lines;
//! `PIPELINE_SHAPES` (a regex-free substring, e.g. `65536 B random`) keeps matching shapes.
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
use rmq_backup::repository::record::{encode_meta, encode_record, BackupRecord};
use rmq_backup::repository::segment::{Compression, SegmentWriter, VERSION_2};
use std::time::Instant;

fn records(n: usize, size: usize, text: bool) -> Vec<BackupRecord> {
    let msgs = Messages::generate(n, size, text);
    (0..n).map(|i| bench_record(i, &msgs)).collect()
}

/// One pass: every record encoded and appended to segments of at most 128 MiB (the format's
/// default `segment_max_bytes`), each finished and deleted. Returns (seconds, CPU seconds).
fn pass(
    recs: &[BackupRecord],
    version: u8,
    compression: Compression,
    workers: u32,
    dir: &std::path::Path,
) -> (f64, f64) {
    let me = std::process::id();
    let cpu0 = cpu_secs(me).unwrap_or(0.0);
    let started = Instant::now();
    let mut json = Vec::new();
    let mut writer: Option<SegmentWriter> = None;
    let mut k = 0;
    for r in recs {
        json.clear();
        let len = if version == VERSION_2 {
            encode_meta(r, &mut json);
            json.len() + 4 + r.body.len()
        } else {
            encode_record(r, &mut json);
            json.len()
        };
        if writer
            .as_ref()
            .is_some_and(|w| w.uncompressed_bytes() + len as u64 + 4 > 128 << 20)
        {
            let done = writer.take().unwrap().finish().expect("finish");
            std::fs::remove_file(done.path).expect("remove");
        }
        let w = writer.get_or_insert_with(|| {
            k += 1;
            SegmentWriter::create_with_workers(
                &dir.join(format!("seg-{k}")),
                compression,
                3,
                workers,
            )
            .and_then(|w| w.with_version(version))
            .expect("segment")
        });
        if version == VERSION_2 {
            w.append_parts(&json, &r.body, r.backed_up_at)
        } else {
            w.append(&json, r.backed_up_at)
        }
        .expect("append");
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
    let list = |var: &str, default: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_else(|_| default.into())
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let versions: Vec<u8> = list("PIPELINE_VERSIONS", "1 2")
        .iter()
        .map(|v| v.parse().expect("PIPELINE_VERSIONS: 1 or 2"))
        .collect();
    let workers_list: Vec<u32> = list("PIPELINE_WORKERS", "0 1 2")
        .iter()
        .map(|v| v.parse().expect("PIPELINE_WORKERS: numbers"))
        .collect();
    let compressions: Vec<Compression> = list("PIPELINE_COMPRESSIONS", "zstd")
        .iter()
        .map(|c| match c.as_str() {
            "lz4" => Compression::Lz4,
            "none" => Compression::None,
            _ => Compression::Zstd,
        })
        .collect();
    let keep = std::env::var("PIPELINE_SHAPES").unwrap_or_default();
    println!(
        "{:<28} {:>2} {:>5} {:>12} {:>10} {:>10} {:>12}",
        "shape", "v", "comp", "zstd workers", "msg/s", "MB/s body", "CPU-s/100k"
    );
    for (n, size, text) in [
        (100_000usize, 1024usize, true),
        (100_000, 1024, false),
        (5_000, 65_536, true),
        (5_000, 65_536, false),
        (300, 1 << 20, false),
    ] {
        let shape = format!("{n} x {size} B {}", if text { "text" } else { "random" });
        if !shape.contains(&keep) {
            continue;
        }
        let recs = records(n, size, text);
        for &c in &compressions {
            for &version in &versions {
                for &workers in &workers_list {
                    let best = (0..3)
                        .map(|_| pass(&recs, version, c, workers, &dir))
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                        .unwrap();
                    println!(
                        "{shape:<28} {version:>2} {:>5} {workers:>12} {:>10.0} {:>10.1} {:>12.2}",
                        c.as_str(),
                        n as f64 / best.0,
                        (n * size) as f64 / best.0 / 1e6,
                        best.1 * 100_000.0 / n as f64
                    );
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
