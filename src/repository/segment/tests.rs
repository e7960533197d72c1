use super::reader::le8;
use super::*;
use std::path::PathBuf;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "rmq-backup-segment-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ALL: [Compression; 3] = [Compression::None, Compression::Zstd, Compression::Lz4];

fn record_json(i: usize) -> Vec<u8> {
    // Varied sizes, some large enough to span compressor blocks.
    let n = (i * 7919) % 3000 + if i % 50 == 7 { 200_000 } else { 0 };
    let mut v = format!("{{\"i\":{i},\"pad\":\"").into_bytes();
    v.extend((0..n).map(|k| b'a' + ((k * 31 + i) % 26) as u8));
    v.extend_from_slice(b"\"}");
    v
}

fn write_segment(path: &Path, c: Compression, n: usize) -> FinishedSegment {
    let mut w = SegmentWriter::create(path, c, 3).unwrap();
    assert_eq!(w.compression(), c);
    let mut expected_uncompressed = 0;
    for i in 0..n {
        let j = record_json(i);
        expected_uncompressed += 4 + j.len() as u64;
        w.append(&j, 1000 + i as i64).unwrap();
    }
    assert_eq!(w.record_count(), n as u64);
    assert_eq!(w.uncompressed_bytes(), expected_uncompressed);
    w.finish().unwrap()
}

fn read_all(path: &Path) -> Result<Vec<Vec<u8>>> {
    SegmentReader::open(path)?
        .records()
        .map(|r| match r? {
            RawRecord::Json(json) => Ok(json),
            other => panic!("a version 1 record: {other:?}"),
        })
        .collect()
}

#[test]
fn compression_codes_names_and_serde() {
    for (c, code, ext, name) in [
        (Compression::None, 0, "", "none"),
        (Compression::Zstd, 1, ".zst", "zstd"),
        (Compression::Lz4, 2, ".lz4", "lz4"),
    ] {
        assert_eq!(c.code(), code);
        assert_eq!(Compression::from_code(code), Some(c));
        // Also under the `.age` of an encrypted file.
        assert_eq!(Compression::from_key(&format!("b/s-0001{ext}")), c);
        assert_eq!(Compression::from_key(&format!("b/s-0001{ext}.age")), c);
        assert_eq!(c.extension(), ext);
        assert_eq!(c.as_str(), name);
        assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{name}\""));
        assert_eq!(
            serde_json::from_str::<Compression>(&format!("\"{name}\"")).unwrap(),
            c
        );
    }
    assert_eq!(Compression::from_code(3), None);
    assert_eq!(Compression::default(), Compression::Zstd);
    assert!(serde_json::from_str::<Compression>("\"Zstd\"").is_err());
}

#[test]
fn round_trip_all_compressions_and_sizes() {
    let dir = TempDir::new("rt");
    for c in ALL {
        for n in [0usize, 1, 257] {
            let path = dir.file(&format!("seg-{}-{n}", c.as_str()));
            let fin = write_segment(&path, c, n);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(fin.path, path);
            assert_eq!(fin.record_count, n as u64);
            assert_eq!(fin.size_bytes, bytes.len() as u64);
            assert_eq!(fin.checksum.len(), 64);
            assert_eq!(fin.checksum, hex_lower(&Sha256::digest(&bytes)));
            assert_eq!(sha256_file(&path).unwrap(), fin.checksum);
            // Header and footer bytes as SPEC.md lays them out.
            assert_eq!(&bytes[0..4], b"RBAK");
            assert_eq!(bytes[4], 1);
            assert_eq!(bytes[5], c.code());
            assert_eq!(&bytes[6..8], &[0, 0]);
            assert_eq!(u64::from_le_bytes(le8(&bytes[8..16])), n as u64);
            let (first, last) = if n == 0 {
                (0, 0)
            } else {
                (1000, 1000 + n as i64 - 1)
            };
            assert_eq!(i64::from_le_bytes(le8(&bytes[16..24])), first);
            assert_eq!(i64::from_le_bytes(le8(&bytes[24..32])), last);
            assert_eq!(fin.first_timestamp, (n > 0).then_some(first));
            assert_eq!(fin.last_timestamp, (n > 0).then_some(last));
            let end = bytes.len();
            assert_eq!(&bytes[end - 4..], b"KABR");
            let crc = crc32fast::hash(&bytes[..end - 8]);
            assert_eq!(&bytes[end - 8..end - 4], &crc.to_le_bytes());
            // Payload is really compressed with the stated codec.
            let payload = &bytes[32..end - 8];
            let raw: Vec<u8> = match c {
                Compression::None => payload.to_vec(),
                Compression::Zstd => zstd::stream::decode_all(payload).unwrap(),
                Compression::Lz4 => {
                    let mut d = lz4::Decoder::new(payload).unwrap();
                    let mut v = Vec::new();
                    d.read_to_end(&mut v).unwrap();
                    v
                }
            };
            assert_eq!(raw.len() as u64, fin.uncompressed_bytes);
            if c != Compression::None && n > 1 {
                assert!(payload.len() < raw.len() / 2, "{c:?} compresses");
            }
            // Read back.
            let reader = SegmentReader::open(&path).unwrap();
            assert_eq!(reader.header().record_count, n as u64);
            assert_eq!(reader.header().compression, c);
            assert_eq!(reader.header().version, 1);
            assert_eq!(reader.payload_len(), payload.len() as u64);
            let mut records = reader.records();
            assert_eq!(records.header().first_timestamp, first);
            let mut i = 0;
            for rec in records.by_ref() {
                assert_eq!(
                    rec.unwrap(),
                    RawRecord::Json(record_json(i)),
                    "{c:?} record {i}"
                );
                i += 1;
            }
            assert_eq!(i, n);
            assert_eq!(records.records_read(), n as u64);
            assert!(records.next().is_none());
        }
    }
}

#[test]
fn empty_record_and_discard() {
    let dir = TempDir::new("misc");
    let path = dir.file("empty-json");
    let mut w = SegmentWriter::create(&path, Compression::Zstd, 3).unwrap();
    w.append(b"", 5).unwrap();
    w.append(b"{}", 6).unwrap();
    assert_eq!(w.uncompressed_bytes(), 4 + 4 + 2);
    w.finish().unwrap();
    assert_eq!(read_all(&path).unwrap(), vec![b"".to_vec(), b"{}".to_vec()]);

    let path = dir.file("discarded");
    let mut w = SegmentWriter::create(&path, Compression::Lz4, 3).unwrap();
    assert_eq!(w.path(), path.as_path());
    w.append(b"{}", 1).unwrap();
    assert!(path.exists());
    w.discard().unwrap();
    assert!(!path.exists());
}

#[test]
fn bad_zstd_level_is_a_compression_error() {
    let dir = TempDir::new("lvl");
    let r = SegmentWriter::create(&dir.file("x"), Compression::Zstd, 1000);
    // zstd clamps most levels; if it refuses, the error must be a Compression error.
    if let Err(e) = r {
        assert!(matches!(e, Error::Compression(_)), "{e:?}");
    }
}

fn err_of(path: &Path) -> Error {
    match read_all(path) {
        Ok(v) => panic!("expected an error, read {} records", v.len()),
        Err(e) => e,
    }
}

fn good(dir: &TempDir, c: Compression, n: usize) -> Vec<u8> {
    let path = dir.file(&format!("good-{}-{n}", c.as_str()));
    write_segment(&path, c, n);
    std::fs::read(&path).unwrap()
}

/// Rebuilds a file from header + payload with a correct CRC and end magic.
fn forge(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = header.to_vec();
    v.extend_from_slice(payload);
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v.extend_from_slice(b"KABR");
    v
}

fn write(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.file(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn corruption_bad_magic() {
    let dir = TempDir::new("magic");
    for c in ALL {
        let mut b = good(&dir, c, 3);
        b[0] = b'X';
        let e = err_of(&write(&dir, "bad", &b));
        assert_eq!(
            e,
            Error::Serialization("Invalid segment magic bytes".into())
        );
        assert_eq!(
            e.to_string(),
            "Serialization error: Invalid segment magic bytes"
        );
    }
    // Not a segment at all, and empty files.
    for junk in [&b""[..], b"RB", b"{\"json\": true}\n"] {
        let e = err_of(&write(&dir, "junk", junk));
        assert_eq!(
            e,
            Error::Serialization("Invalid segment magic bytes".into())
        );
    }
}

#[test]
fn corruption_bad_end_magic() {
    let dir = TempDir::new("endmagic");
    for c in ALL {
        let mut b = good(&dir, c, 3);
        let n = b.len();
        b[n - 1] = b'X';
        let e = err_of(&write(&dir, "bad", &b));
        assert_eq!(
            e,
            Error::Serialization("Invalid segment end magic bytes".into())
        );
    }
}

#[test]
fn corruption_flipped_bytes_fail_crc() {
    let dir = TempDir::new("crc");
    for c in ALL {
        let orig = good(&dir, c, 20);
        let n = orig.len();
        // A payload byte, a header count byte, a timestamp byte, the CRC itself.
        for pos in [40, n / 2, n - 9, 9, 20, n - 8] {
            let mut b = orig.clone();
            b[pos] ^= 0x01;
            let e = err_of(&write(&dir, "bad", &b));
            let stored = u32::from_le_bytes(b[n - 8..n - 4].try_into().unwrap());
            let computed = crc32fast::hash(&b[..n - 8]);
            assert_eq!(
                e,
                Error::Serialization(format!("CRC32 mismatch: expected {stored}, got {computed}")),
                "{c:?} pos {pos}"
            );
        }
    }
}

#[test]
fn corruption_unknown_version() {
    let dir = TempDir::new("ver");
    let mut b = good(&dir, Compression::Zstd, 2);
    b[4] = 4;
    let e = err_of(&write(&dir, "v4", &b));
    assert_eq!(
        e,
        Error::Serialization("Unsupported segment version: 4".into())
    );
    assert_eq!(
        e.to_string(),
        "Serialization error: Unsupported segment version: 4"
    );
    b[4] = 0;
    let e = err_of(&write(&dir, "v0", &b));
    assert_eq!(
        e,
        Error::Serialization("Unsupported segment version: 0".into())
    );
}

#[test]
fn corruption_bad_compression_code() {
    let dir = TempDir::new("code");
    let b = good(&dir, Compression::None, 2);
    let n = b.len();
    let mut h = b[..32].to_vec();
    h[5] = 7;
    let e = err_of(&write(&dir, "c7", &forge(&h, &b[32..n - 8])));
    assert_eq!(
        e,
        Error::Serialization("Unknown segment compression code: 7".into())
    );
    // Right code byte, wrong codec for the payload: a decompression error.
    let z = good(&dir, Compression::Zstd, 2);
    let zn = z.len();
    let mut h = z[..32].to_vec();
    h[5] = Compression::Lz4.code();
    let e = err_of(&write(&dir, "mix", &forge(&h, &z[32..zn - 8])));
    assert!(matches!(e, Error::Compression(_)), "{e:?}");
}

#[test]
fn corruption_header_count_differs_from_records() {
    let dir = TempDir::new("count");
    for c in ALL {
        let b = good(&dir, c, 5);
        let n = b.len();
        for (claimed, msg) in [
            (7u64, "Expected 7 records but found 5"),
            (3, "Expected 3 records but found 5"),
            (0, "Expected 0 records but found 5"),
        ] {
            let mut h = b[..32].to_vec();
            h[8..16].copy_from_slice(&claimed.to_le_bytes());
            let path = write(&dir, "count", &forge(&h, &b[32..n - 8]));
            let results: Vec<Result<RawRecord>> =
                SegmentReader::open(&path).unwrap().records().collect();
            let oks = results.iter().filter(|r| r.is_ok()).count() as u64;
            assert_eq!(oks, claimed.min(5), "{c:?}: no surplus record handed out");
            assert_eq!(
                results.last().unwrap().as_ref().unwrap_err(),
                &Error::Serialization(msg.into()),
                "{c:?}"
            );
            assert_eq!(
                results.len() as u64,
                oks + 1,
                "iteration stops after the error"
            );
        }
    }
}

#[test]
fn corruption_truncated_record_behind_valid_crc() {
    let dir = TempDir::new("trunc-rec");
    // Uncompressed: cut the payload in the middle of a record and in a length prefix.
    let b = good(&dir, Compression::None, 3);
    let n = b.len();
    let payload = &b[32..n - 8];
    let first_len = u32::from_le_bytes(payload[0..4].try_into().unwrap()) as usize;
    let e = err_of(&write(
        &dir,
        "t1",
        &forge(&b[..32], &payload[..4 + first_len / 2]),
    ));
    assert_eq!(
        e,
        Error::Serialization(format!(
            "Truncated record 1: expected {first_len} bytes, got {}",
            first_len / 2
        ))
    );
    let e = err_of(&write(
        &dir,
        "t2",
        &forge(&b[..32], &payload[..4 + first_len + 2]),
    ));
    assert_eq!(
        e,
        Error::Serialization("Truncated record length prefix after record 1".into())
    );
    // Compressed payloads cut short: the frame is incomplete.
    for c in [Compression::Zstd, Compression::Lz4] {
        let b = good(&dir, c, 60);
        let n = b.len();
        let payload = &b[32..n - 8];
        let cut = forge(&b[..32], &payload[..payload.len() * 2 / 3]);
        let e = err_of(&write(&dir, "t3", &cut));
        assert!(
            matches!(e, Error::Compression(_) | Error::Serialization(_)),
            "{c:?}: {e:?}"
        );
        let cut = forge(&b[..32], &payload[..payload.len() - 3]);
        let e = err_of(&write(&dir, "t4", &cut));
        assert!(
            matches!(e, Error::Compression(_) | Error::Serialization(_)),
            "{c:?}: {e:?}"
        );
        // Garbage after the frame.
        let mut extra = payload.to_vec();
        extra.extend_from_slice(b"garbage!");
        let e = err_of(&write(&dir, "t5", &forge(&b[..32], &extra)));
        assert!(matches!(e, Error::Compression(_)), "{c:?}: {e:?}");
    }
}

#[test]
fn corruption_truncated_file() {
    let dir = TempDir::new("trunc-file");
    for c in ALL {
        let b = good(&dir, c, 10);
        for keep in [b.len() - 1, b.len() - 8, b.len() / 2, 41, 40] {
            let e = err_of(&write(&dir, "cut", &b[..keep]));
            assert!(
                matches!(&e, Error::Serialization(m)
                        if m == "Invalid segment end magic bytes" || m.starts_with("CRC32 mismatch")),
                "{c:?} keep {keep}: {e:?}"
            );
        }
        for keep in [39usize, 32, 10, 6] {
            let e = err_of(&write(&dir, "short", &b[..keep]));
            assert_eq!(
                e,
                Error::Serialization(format!(
                    "Segment file too short: {keep} bytes, a segment has at least 40"
                )),
                "{c:?}"
            );
        }
    }
}

#[test]
fn missing_file_is_io_error() {
    let dir = TempDir::new("missing");
    match SegmentReader::open(&dir.file("nope")) {
        Err(Error::Io(m)) => assert!(m.contains("nope"), "{m}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("opened a missing file"),
    }
    assert!(matches!(sha256_file(&dir.file("nope")), Err(Error::Io(_))));
    let r = SegmentWriter::create(&dir.file("no/such/dir/x"), Compression::None, 3);
    assert!(matches!(r, Err(Error::Io(_))));
}

#[test]
fn hex_and_sha_of_known_input() {
    let dir = TempDir::new("sha");
    let p = write(&dir, "abc", b"abc");
    assert_eq!(
        sha256_file(&p).unwrap(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(hex_lower(&[0, 0xab, 0xff]), "00abff");
}

#[test]
fn zstd_workers_follow_the_cores() {
    use super::writer::default_zstd_workers;
    use super::writer::LARGE_BODY_BYTES;
    // Small bodies: the broker needs the second core of a small machine.
    assert_eq!(default_zstd_workers(1, 1024), 0);
    assert_eq!(default_zstd_workers(2, 1024), 0);
    assert_eq!(default_zstd_workers(4, 1024), 3);
    assert_eq!(default_zstd_workers(64, 1024), 8);
    // Large bodies: compression bounds the backup, every core compresses.
    assert_eq!(default_zstd_workers(1, LARGE_BODY_BYTES), 1);
    assert_eq!(default_zstd_workers(2, LARGE_BODY_BYTES - 1), 0);
    assert_eq!(default_zstd_workers(2, 1 << 20), 2);
    assert_eq!(default_zstd_workers(64, 1 << 20), 8);
}

#[test]
fn a_segment_compressed_by_zstd_workers_reads_back() {
    let dir = TempDir::new("zstdmt");
    let path = dir.file("mt.rbak");
    // More than one job (1 MiB) of input, so several workers take part.
    let records: Vec<Vec<u8>> = (0..3000u32)
        .map(|i| {
            format!(
                "{{\"n\":{i},\"pad\":\"{}\"}}",
                "x".repeat((i % 2000) as usize)
            )
            .into_bytes()
        })
        .collect();
    let mut w = SegmentWriter::create_with_workers(&path, Compression::Zstd, 3, 2).unwrap();
    for (i, r) in records.iter().enumerate() {
        w.append(r, i as i64).unwrap();
    }
    w.finish().unwrap();
    let reader = SegmentReader::open(&path).unwrap();
    let back: Vec<RawRecord> = reader.records().map(|r| r.unwrap()).collect();
    let records: Vec<RawRecord> = records.into_iter().map(RawRecord::Json).collect();
    assert_eq!(back, records);
}

#[test]
fn a_record_longer_than_the_limit_is_refused_before_it_is_read() {
    let dir = TempDir::new("max-record");
    for c in [Compression::None, Compression::Zstd, Compression::Lz4] {
        let path = dir.file(&format!("max-{}", c.as_str()));
        write_segment(&path, c, 3);
        let mut records = SegmentReader::open(&path).unwrap().records();
        let first = records.next().unwrap().unwrap();
        let limit = first.len() as u64 - 1;
        let results: Vec<_> = SegmentReader::open(&path)
            .unwrap()
            .max_record_bytes(limit)
            .records()
            .collect();
        assert_eq!(results.len(), 1, "{c:?}: the iteration ends at the error");
        assert_eq!(
            results[0].as_ref().unwrap_err(),
            &Error::Serialization(format!(
                "Record 1 announces {} bytes, more than the {limit} a record may have",
                first.len()
            )),
            "{c:?}"
        );
        // With the longest record as the limit, every record is read.
        let longest = records
            .map(|r| r.unwrap().len())
            .fold(first.len(), usize::max);
        let all = SegmentReader::open(&path)
            .unwrap()
            .max_record_bytes(longest as u64)
            .records()
            .collect::<Result<Vec<_>>>();
        assert_eq!(all.unwrap().len(), 3, "{c:?}");
    }
    const {
        assert!(
            MAX_RECORD_BYTES > 4 * 512 * 1024 * 1024,
            "a 512 MiB body fits"
        )
    };
}

#[test]
fn a_segment_kept_in_memory_is_the_file_byte_for_byte_and_spills_when_it_grows() {
    let dir = TempDir::new("in-memory");
    for c in ALL {
        let on_disk = write_segment(&dir.file(&format!("disk-{}", c.as_str())), c, 120);
        let expected = std::fs::read(&on_disk.path).unwrap();
        assert_eq!(on_disk.data, None);
        for (spill_at, stays) in [(usize::MAX, true), (expected.len(), true), (64, false)] {
            let path = dir.file(&format!("mem-{}-{spill_at}", c.as_str()));
            let mut w = SegmentWriter::create_in_memory_up_to(&path, c, 3, 0, spill_at).unwrap();
            for i in 0..120 {
                w.append(&record_json(i), 1000 + i as i64).unwrap();
            }
            let got = w.finish().unwrap();
            assert_eq!(got.checksum, on_disk.checksum, "{c:?} spill_at {spill_at}");
            assert_eq!(got.size_bytes, on_disk.size_bytes);
            assert_eq!(got.record_count, 120);
            if stays {
                assert!(!path.exists(), "{c:?}: no spool file while in memory");
                assert_eq!(got.data.as_deref(), Some(&expected[..]), "{c:?}");
            } else {
                assert_eq!(got.data, None, "{c:?}: spilled");
                assert_eq!(std::fs::read(&path).unwrap(), expected, "{c:?}");
                assert_eq!(read_all(&path).unwrap().len(), 120);
            }
        }
    }
}

#[path = "v2_tests.rs"]
mod v2;

fn stream_all(path: &Path, sha256: Option<&str>) -> Result<Vec<Vec<u8>>> {
    let file = std::fs::File::open(path).unwrap();
    SegmentReader::stream(file, path, sha256)?
        .records()
        .map(|r| match r? {
            RawRecord::Json(json) => Ok(json),
            other => panic!("a version 1 record: {other:?}"),
        })
        .collect()
}

fn is_check(e: &Error) -> bool {
    matches!(e, Error::Serialization(m)
        if m == "Invalid segment end magic bytes"
            || m.starts_with("CRC32 mismatch")
            || m.starts_with("SHA-256 mismatch")
            || m.starts_with("Segment file too short"))
}

#[test]
fn a_streamed_segment_is_checked_in_the_pass_that_reads_it() {
    let dir = TempDir::new("stream");
    for c in ALL {
        // Whole: the same records as a verified read; the SHA-256 checked at the end.
        let b = good(&dir, c, 60);
        let path = write(&dir, "whole", &b);
        let sha = crate::repository::segment::sha256_file(&path).unwrap();
        let records = read_all(&path).unwrap();
        assert_eq!(stream_all(&path, None).unwrap(), records, "{c:?}");
        assert_eq!(stream_all(&path, Some(&sha)).unwrap(), records, "{c:?}");
        let e = stream_all(&path, Some(&"0".repeat(64))).unwrap_err();
        assert_eq!(
            e,
            Error::Serialization(format!(
                "SHA-256 mismatch: expected {}, got {sha}",
                "0".repeat(64)
            )),
            "{c:?}"
        );
        // Every damage a verified read finds, a streamed one finds; a failed checksum is
        // reported, not the decoding error it causes. Seven records: the eighth of
        // `record_json` is 200 KB, and a case for every third byte of it kept the debug build
        // busy 15 minutes (CI).
        let small = good(&dir, c, 7);
        let mut cases: Vec<Vec<u8>> = (0..small.len())
            .step_by(3)
            .map(|i| {
                let mut v = small.clone();
                v[i] ^= 0x20;
                v
            })
            .collect();
        for keep in [
            small.len() - 1,
            small.len() - 8,
            small.len() / 2,
            41,
            40,
            39,
            6,
        ] {
            cases.push(small[..keep].to_vec());
        }
        let mut grown = small.clone();
        grown.extend_from_slice(b"more");
        cases.push(grown);
        for (i, bytes) in cases.iter().enumerate() {
            let path = write(&dir, "case", bytes);
            let verified = read_all(&path);
            let streamed = stream_all(&path, None);
            match (&verified, &streamed) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{c:?} case {i}"),
                (Err(v), Err(s)) => {
                    if is_check(v) {
                        assert!(is_check(s), "{c:?} case {i}: {v} / {s}");
                    } else {
                        assert_eq!(v, s, "{c:?} case {i}");
                    }
                }
                _ => panic!("{c:?} case {i}: verified {verified:?}, streamed {streamed:?}"),
            }
        }
        // Damage behind a valid CRC32: the same errors.
        let n = small.len();
        let mut h = small[..32].to_vec();
        h[8..16].copy_from_slice(&3u64.to_le_bytes());
        let path = write(&dir, "count", &forge(&h, &small[32..n - 8]));
        assert_eq!(
            stream_all(&path, None).unwrap_err(),
            Error::Serialization("Expected 3 records but found 7".into()),
            "{c:?}"
        );
    }
}

#[test]
fn a_record_the_caller_cannot_decode_is_reported_as_the_damage_of_its_segment() {
    let dir = TempDir::new("fail");
    for c in ALL {
        let small = good(&dir, c, 8);
        let caller = || Error::Serialization("Invalid backup record: the caller's".into());
        // A good segment: the caller's error stands.
        let path = write(&dir, "good", &small);
        let mut records = SegmentReader::stream(std::fs::File::open(&path).unwrap(), &path, None)
            .unwrap()
            .records();
        records.next().unwrap().unwrap();
        assert_eq!(records.fail(caller()), caller(), "{c:?}");
        // A byte changed in the last record: the first record still reads, and the caller's
        // error about it gives way to the failed check of the rest of the file.
        let mut bad = small.clone();
        let i = bad.len() - 12;
        bad[i] ^= 0x01;
        let path = write(&dir, "bad", &bad);
        let mut records = SegmentReader::stream(std::fs::File::open(&path).unwrap(), &path, None)
            .unwrap()
            .records();
        let e = match records.next().unwrap() {
            Ok(_) => records.fail(caller()),
            Err(e) => e,
        };
        assert!(is_check(&e) || c != Compression::None, "{c:?}: {e}");
        assert_ne!(e, caller(), "{c:?}");
    }
}
