//! Segment format version 2 (docs/segment-format.md): round trips through the writer and the
//! reader for every compression, bodies of every size, and damaged payloads, which are errors,
//! never panics.

use super::*;
use crate::repository::record::{encode_meta, BackupHeaderValue, BackupProperties, BackupRecord};

fn record(i: usize, body: Vec<u8>) -> BackupRecord {
    BackupRecord {
        body,
        properties: BackupProperties {
            content_type: Some("application/octet-stream".into()),
            delivery_mode: Some(2),
            priority: Some((i % 10) as u8),
            message_id: Some(format!("m-{i}")),
            timestamp: Some(1_700_000_000),
            ..BackupProperties::default()
        },
        headers: vec![
            ("i".into(), BackupHeaderValue::Long(i as i64)),
            ("v".into(), BackupHeaderValue::Void),
        ],
        exchange: "ex".into(),
        routing_key: format!("rk.{i}"),
        delivery_tag: i as u64 + 1,
        redelivered: i.is_multiple_of(2),
        backed_up_at: 1_700_000_000_000 + i as i64,
        source_queue: "q".into(),
        source_vhost: "/".into(),
        message_format: None,
        wire: None,
    }
}

/// Bodies: empty, one byte, random (incompressible) 64 KiB, 1 MiB of text, and 3 MiB random
/// (past the 1 MiB compression chunk).
fn records() -> Vec<BackupRecord> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    vec![
        record(0, Vec::new()),
        record(1, vec![0]),
        record(2, random(64 << 10)),
        record(3, b"text ".repeat(200_000)),
        record(4, random(3 << 20)),
        record(5, b"[1,2,3]".to_vec()),
    ]
}

fn write_v2(path: &Path, c: Compression, recs: &[BackupRecord]) -> FinishedSegment {
    let mut w = SegmentWriter::create(path, c, 3)
        .unwrap()
        .with_version(VERSION_2)
        .unwrap();
    let mut meta = Vec::new();
    let mut expected = 0;
    for r in recs {
        meta.clear();
        encode_meta(r, &mut meta);
        expected += 8 + (meta.len() + r.body.len()) as u64;
        w.append_parts(&meta, &r.body, r.backed_up_at).unwrap();
    }
    assert_eq!(w.uncompressed_bytes(), expected);
    w.finish().unwrap()
}

fn decode_all(path: &Path) -> Result<Vec<BackupRecord>> {
    SegmentReader::open(path)?
        .records()
        .map(|r| r?.into_record())
        .collect()
}

#[test]
fn version_2_round_trip_in_every_compression() {
    let dir = TempDir::new("v2-rt");
    let recs = records();
    for c in ALL {
        let path = dir.file(&format!("v2-{}", c.as_str()));
        let fin = write_v2(&path, c, &recs);
        assert_eq!(fin.version, VERSION_2);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..4], b"RBAK");
        assert_eq!(bytes[4], 2, "header byte 4 is the version");
        assert_eq!(bytes[5], c.code());
        let reader = SegmentReader::open(&path).unwrap();
        assert_eq!(reader.header().version, 2);
        assert_eq!(reader.header().record_count, recs.len() as u64);
        assert_eq!(decode_all(&path).unwrap(), recs, "{c:?}");
        // A borrowed decode gives the same.
        let first = SegmentReader::open(&path)
            .unwrap()
            .records()
            .next()
            .unwrap();
        assert_eq!(first.unwrap().decode().unwrap(), recs[0]);
    }
}

#[test]
fn an_empty_version_2_segment_reads_back_empty() {
    let dir = TempDir::new("v2-empty");
    let path = dir.file("empty");
    write_v2(&path, Compression::Zstd, &[]);
    assert_eq!(decode_all(&path).unwrap(), Vec::new());
    assert_eq!(std::fs::read(&path).unwrap()[4], 2);
}

#[test]
fn a_writer_takes_records_in_its_own_version_only() {
    let dir = TempDir::new("v2-api");
    let mut w1 = SegmentWriter::create(&dir.file("a"), Compression::None, 3).unwrap();
    assert_eq!(w1.version(), VERSION);
    assert!(w1.append_parts(b"{}", b"x", 0).is_err());
    let mut w2 = SegmentWriter::create(&dir.file("b"), Compression::None, 3)
        .unwrap()
        .with_version(VERSION_2)
        .unwrap();
    assert!(w2.append(b"{}", 0).is_err());
    w2.append_parts(b"{}", b"", 0).unwrap();
    assert!(w2.with_version(VERSION).is_err(), "records were appended");
    let w4 = SegmentWriter::create(&dir.file("c"), Compression::None, 3).unwrap();
    assert!(w4.with_version(4).is_err());
    let mut w3 = SegmentWriter::create(&dir.file("d"), Compression::None, 3)
        .unwrap()
        .with_version(VERSION_3)
        .unwrap();
    assert!(w3.append(b"{}", 0).is_err());
    w3.append_parts(b"{}", b"", 0).unwrap();
}

/// Version 3: records whose properties were kept as the broker sent them (binary metadata)
/// beside records in version 2's JSON metadata, in one segment, in every compression.
#[test]
fn version_3_round_trip_of_binary_and_json_metadata() {
    use crate::broker::amqp::{BasicProperties, Delivery, FieldValue, WireProperties};
    use crate::repository::record::encode_meta_v3;
    let dir = TempDir::new("v3-rt");
    let mut recs = records();
    let mut wired = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let p = BasicProperties {
            content_type: Some("text/plain".into()),
            headers: Some(vec![
                ("i".into(), FieldValue::I64(i as i64)),
                ("s".into(), FieldValue::LongString(vec![0xff, b'a'])),
            ]),
            ..Default::default()
        };
        let d = Delivery {
            delivery_tag: i as u64 + 100,
            redelivered: i % 3 == 0,
            exchange: "ex".into(),
            routing_key: format!("rk.{i}"),
            properties: BasicProperties::default(),
            wire: Some(WireProperties::encode(&p).unwrap()),
            body: r.body.clone(),
        };
        wired.push(BackupRecord::from_delivery(d, "q", "/", r.backed_up_at));
    }
    recs.extend(wired);
    for c in ALL {
        let path = dir.file(&format!("v3-{}", c.as_str()));
        let mut w = SegmentWriter::create(&path, c, 3)
            .unwrap()
            .with_version(VERSION_3)
            .unwrap();
        let mut meta = Vec::new();
        for r in &recs {
            meta.clear();
            encode_meta_v3(r, &mut meta);
            w.append_parts(&meta, &r.body, r.backed_up_at).unwrap();
        }
        assert_eq!(w.finish().unwrap().version, VERSION_3);
        assert_eq!(std::fs::read(&path).unwrap()[4], 3, "header byte 4");
        let expected: Vec<BackupRecord> = recs
            .iter()
            .map(|r| r.clone().decode_wire().unwrap())
            .collect();
        assert_eq!(decode_all(&path).unwrap(), expected, "{c:?}");
    }
}

/// Every truncation and every corrupted byte of a version 2 payload (stored plain, with a
/// correct CRC32, so that the reader gets that far) is an error or a record, never a panic;
/// truncations are always errors.
#[test]
fn damaged_version_2_payloads_are_errors_not_panics() {
    let dir = TempDir::new("v2-damage");
    let recs = vec![record(0, b"hello".to_vec()), record(1, vec![7; 300])];
    let path = dir.file("good");
    write_v2(&path, Compression::None, &recs);
    let b = std::fs::read(&path).unwrap();
    let n = b.len();
    let (header, payload) = (&b[..32], &b[32..n - 8]);
    for cut in 0..payload.len() {
        let p = write(&dir, "cut", &forge(header, &payload[..cut]));
        assert!(decode_all(&p).is_err(), "cut at {cut} must fail");
    }
    for i in 0..payload.len() {
        let mut bad = payload.to_vec();
        bad[i] ^= 0xa5;
        let p = write(&dir, "flip", &forge(header, &bad));
        let _ = decode_all(&p);
    }
    // The messages name what is missing.
    let meta_len = u32::from_le_bytes(le4(&payload[..4])) as usize;
    let p = write(&dir, "nobody", &forge(header, &payload[..4 + meta_len]));
    assert_eq!(
        decode_all(&p).unwrap_err(),
        Error::Serialization("Truncated record 1: its body's length prefix is missing".into())
    );
    let p = write(
        &dir,
        "halfprefix",
        &forge(header, &payload[..4 + meta_len + 2]),
    );
    assert_eq!(
        decode_all(&p).unwrap_err(),
        Error::Serialization("Truncated body length prefix of record 1".into())
    );
    // A version 1 payload under a version 2 header is refused, not misread.
    let v1 = good(&dir, Compression::None, 2);
    let mut h = v1[..32].to_vec();
    h[4] = 2;
    let p = write(&dir, "v1as2", &forge(&h, &v1[32..v1.len() - 8]));
    assert!(decode_all(&p).is_err());
}

#[test]
fn a_body_longer_than_the_limit_is_refused_before_it_is_read() {
    let dir = TempDir::new("v2-max");
    let path = dir.file("big");
    write_v2(&path, Compression::Zstd, &[record(0, vec![1; 10_000])]);
    let e = SegmentReader::open(&path)
        .unwrap()
        .max_record_bytes(5_000)
        .records()
        .next()
        .unwrap()
        .unwrap_err();
    assert_eq!(
        e,
        Error::Serialization(
            "Record 1 announces 10000 bytes, more than the 5000 a record may have".into()
        )
    );
}

fn le4(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}
