//! The store ceiling (issue 41, item 3): the least any verified backup must do with a queue,
//! as a raw reference for `examples/bench.rs` (included there with `#[path]`, so it is built
//! with the other raw references, release, the project's own AMQP client).
//!
//! Inside its clock, and nothing else:
//! - read the queue exactly as the raw read does (`PreparedRead::run_with`: consumer windows
//!   of 65,535 without acks, the channels closed to give everything back, the ready count
//!   polled until the queue is whole again);
//! - write each body, as it comes, to files in the backup's storage directory (the same
//!   file system as rmq-backup's segments), 1 MiB writes, a file per 128 MiB (the default
//!   `segment_max_bytes`), each `fsync`ed when it is full (a stored segment is synced too);
//! - SHA-256 every byte written (a backup's manifest holds each segment's SHA-256).
//!
//! Writing and hashing run on a thread of their own, fed by a bounded channel of bodies (the
//! bodies themselves, not copies), and a full file is synced on a third thread while the next
//! one is written, so the read, the writes and the disk overlap as in rmq-backup (its uploader
//! threads sync each segment while the queue is still being read; a single `fsync` at the end
//! made this reference slower than the backup). Files, threads and channels are made before
//! the clock starts. No record framing, no metadata, no compression, no manifest: a backup
//! must do at least this much, so its msg/s over this one's says how near the floor of its
//! own work it runs.

use crate::bench_common::{prepare_read, RawRead};
use rmq_backup::broker::amqp::Connection;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Bodies in flight between the reader and the storing thread (at most 64 MiB of 1 MiB
/// bodies).
const IN_FLIGHT: usize = 64;

/// Bytes per file, as the default `segment_max_bytes` (128 MiB).
const FILE_BYTES: u64 = 128 << 20;

/// Reads all `n` messages of `queue` on `conn` as the raw read does, writing every body into
/// the files `{prefix}-0`, `{prefix}-1`, ... (a new one per [`FILE_BYTES`]; removed
/// afterwards) and hashing each; returns the time to the last delivery and to the later of the
/// queue whole again and the last file synced with every SHA-256 done.
pub fn store_read(conn: &Connection, queue: &str, n: usize, prefix: &Path) -> RawRead {
    let prepared = prepare_read(conn, queue, n);
    let name = |i: usize| prefix.with_extension(format!("{i}"));
    // Enough files made ahead for every body (the sizes are known: n bodies of this run).
    let files: Vec<std::fs::File> = (0..4)
        .map(|i| std::fs::File::create(name(i)).expect("store ceiling file"))
        .collect();
    let (tx, rx) = crossbeam_channel::bounded::<Vec<u8>>(IN_FLIGHT);
    let (sync_tx, sync_rx) = crossbeam_channel::unbounded::<std::fs::File>();
    let mut made = files.len();
    let read = std::thread::scope(|s| {
        let syncer = s.spawn(move || {
            for f in sync_rx {
                f.sync_all().expect("store ceiling fsync");
            }
            Instant::now()
        });
        let store = s.spawn(move || {
            let mut files = files.into_iter();
            let mut out = std::io::BufWriter::with_capacity(
                1 << 20,
                files.next().expect("store ceiling file"),
            );
            let (mut sha, mut in_file, mut next) = (Sha256::new(), 0u64, 1usize);
            for body in rx {
                if in_file >= FILE_BYTES {
                    let file = files.next().unwrap_or_else(|| {
                        next += 1;
                        std::fs::File::create(name(next + 2)).expect("store ceiling file")
                    });
                    let full = std::mem::replace(
                        &mut out,
                        std::io::BufWriter::with_capacity(1 << 20, file),
                    );
                    std::hint::black_box(std::mem::take(&mut sha).finalize());
                    sync_tx
                        .send(full.into_inner().expect("store ceiling flush"))
                        .expect("store ceiling syncer");
                    in_file = 0;
                }
                sha.update(&body);
                out.write_all(&body).expect("store ceiling write");
                in_file += body.len() as u64;
            }
            std::hint::black_box(sha.finalize());
            sync_tx
                .send(out.into_inner().expect("store ceiling flush"))
                .expect("store ceiling syncer");
            next
        });
        let started = Instant::now();
        let (delivered, whole) = prepared.run_with(|body| {
            tx.send(body).expect("store ceiling thread");
        });
        drop(tx);
        made += store.join().expect("store ceiling thread");
        let stored = syncer.join().expect("store ceiling syncer");
        RawRead {
            delivered: delivered - started,
            whole: whole.max(stored) - started,
        }
    });
    for i in 0..made + 2 {
        let _ = std::fs::remove_file(name(i));
    }
    read
}
