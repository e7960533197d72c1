//! Streams holding messages a publisher wrote to hurt, or that AMQP 0-9-1 cannot express
//! (issue "Defects found by test and review", items 1 and 2), written to a real stream with
//! the in-tree stream client: a 6 KB array of 6,000 nulls described by a list of 6,000 nulls,
//! `amqp-value` and `amqp-sequence` bodies, two `data` sections, a `subject`, and a zstd
//! sub-entry batch of ~40 KB that announces 1 GiB. The backup stays small in memory, stores
//! every message it can read (whole, as its AMQP 1.0 bytes, where a record cannot map it), and
//! refuses the bomb with an error that names the stream and the offset; a restore into a
//! stream gives the messages back byte for byte.

mod common;

use common::*;
use rmq_backup::broker::stream::amqp10::{encode_message, to_record, Message, Origin, Value};
use rmq_backup::broker::stream::chunk::parse_chunk;
use rmq_backup::broker::stream::{OffsetSpec, StreamConnection, StreamOptions};
use std::time::Duration;

fn stream_options(vhost: &str) -> StreamOptions {
    let url = rmq_backup::broker::amqp::AmqpUrl::parse(&amqp_url(vhost)).unwrap();
    StreamOptions::from_amqp_url(&url, stream_port())
}

/// AMQP 1.0 encoding helpers for hand-made messages.
fn section(code: u8, value: Vec<u8>) -> Vec<u8> {
    let mut v = vec![0x00, 0x53, code];
    v.extend_from_slice(&value);
    v
}
fn list32(items: &[Vec<u8>]) -> Vec<u8> {
    let body = items.concat();
    let mut v = vec![0xd0];
    v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    v.extend_from_slice(&(items.len() as u32).to_be_bytes());
    v.extend_from_slice(&body);
    v
}
fn data(b: &[u8]) -> Vec<u8> {
    let mut v = vec![0xb0];
    v.extend_from_slice(&(b.len() as u32).to_be_bytes());
    v.extend_from_slice(b);
    section(0x75, v)
}

/// The message of issue 20 item 1: an amqp-value array of `n` nulls whose descriptor is a list
/// of `n` nulls (decoded naively, n² values).
fn nulls_bomb(n: usize) -> Vec<u8> {
    let descriptor = list32(&vec![vec![0x40]; n]);
    let mut body = vec![0x00];
    body.extend_from_slice(&descriptor);
    body.push(0x40);
    let mut array = vec![0xf0];
    array.extend_from_slice(&((body.len() + 4 + n) as u32).to_be_bytes());
    array.extend_from_slice(&(n as u32).to_be_bytes());
    array.extend_from_slice(&body);
    array.extend(std::iter::repeat_n(0u8, n));
    section(0x77, array)
}

/// A message RabbitMQ's 0-9-1 conversion could have written: it maps to a record.
fn plain(i: usize) -> Vec<u8> {
    encode_message(&Message {
        properties: vec![Value::String(format!("m-{i}"))],
        message_annotations: vec![],
        application_properties: vec![(Value::String("i".into()), Value::Long(i as i64))],
        body: format!("plain {i}").into_bytes(),
        header: None,
        not_carried: None,
    })
}

/// Messages a record cannot map: each is stored whole.
fn unmappable() -> Vec<Vec<u8>> {
    let mut subject = section(
        0x73,
        list32(&[vec![0x40], vec![0x40], vec![0x40], {
            let mut s = vec![0xa1, 4];
            s.extend_from_slice(b"subj");
            s
        }]),
    );
    subject.extend(data(b"with a subject"));
    let mut two_data = data(b"first ");
    two_data.extend(data(b"second"));
    let mut ulong_id = section(0x73, list32(&[vec![0x53, 42]]));
    ulong_id.extend(data(b"ulong message-id"));
    vec![
        nulls_bomb(6_000),
        section(0x77, list32(&[vec![0x41], vec![0x55, 7]])),
        section(0x76, list32(&[vec![0x41]])),
        two_data,
        subject,
        ulong_id,
    ]
}

/// Publishes `messages` as simple entries and waits for their confirms.
fn publish(conn: &StreamConnection, stream: &str, messages: &[Vec<u8>]) {
    let publisher = conn.declare_publisher(1, stream).expect("publisher");
    for (n, frame) in messages.chunks(100).enumerate() {
        let batch: Vec<(u64, &[u8])> = frame
            .iter()
            .enumerate()
            .map(|(i, m)| ((n * 100 + i) as u64, m.as_slice()))
            .collect();
        conn.publish(1, &batch).expect("publish");
    }
    publisher
        .wait_confirms(messages.len(), Duration::from_secs(30))
        .expect("confirms");
}

/// A zstd frame of `count` messages of `size` zero bytes, each a 4-byte length then the zeros,
/// made of raw and RLE blocks by hand: a few bytes per 128 KiB, nothing large in memory.
fn zstd_zeros(count: usize, size: usize) -> Vec<u8> {
    const BLOCK: usize = 128 << 10;
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
    // Frame header: no content size, a window descriptor of 1 MiB (exponent 10).
    f.push(0x00);
    f.push(10 << 3);
    let mut blocks: Vec<(u8, usize, Vec<u8>)> = Vec::new();
    for _ in 0..count {
        blocks.push((0, 4, (size as u32).to_be_bytes().to_vec()));
        let mut left = size;
        while left > 0 {
            let n = left.min(BLOCK);
            blocks.push((1, n, vec![0]));
            left -= n;
        }
    }
    let last = blocks.len() - 1;
    for (i, (kind, n, payload)) in blocks.into_iter().enumerate() {
        let header = (u32::from(i == last)) | (u32::from(kind) << 1) | ((n as u32) << 3);
        f.extend_from_slice(&header.to_le_bytes()[..3]);
        f.extend_from_slice(&payload);
    }
    f
}

/// Reads `n` messages of `stream` over the stream protocol, as the bytes the stream holds.
fn read_raw(vhost: &str, stream: &str, n: usize) -> Vec<Vec<u8>> {
    let conn = StreamConnection::open(&stream_options(vhost)).expect("stream connection");
    let sub = conn
        .subscribe(1, stream, OffsetSpec::First, 2)
        .expect("subscribe");
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = sub
            .next_chunk(Duration::from_secs(30))
            .expect("chunk")
            .expect("a chunk within 30 s");
        conn.credit(1, 1).expect("credit");
        let c = parse_chunk(&chunk).expect("parse");
        for m in c.messages() {
            out.push(m.expect("message").into_owned());
        }
    }
    conn.close().expect("close");
    out
}

fn record(bytes: &[u8]) -> (rmq_backup::repository::record::BackupRecord, bool) {
    let (mut r, raw) = to_record(
        bytes,
        Origin {
            conversion: conversion(),
            stream: "s",
            vhost: "v",
            offset: 0,
            backed_up_at: 0,
        },
    );
    r.properties.timestamp = None;
    (r, raw.is_some())
}

#[test]
fn messages_a_record_cannot_map_are_stored_whole_and_restored_byte_for_byte() {
    let v = TestVhost::new("stream-odd");
    let sconn = StreamConnection::open(&stream_options(&v.name)).expect("stream connection");
    sconn.create_stream("odd", &[]).expect("create stream");
    // 201 messages: 195 plain ones around the six odd ones (the 6 KB array among them).
    let mut messages: Vec<Vec<u8>> = (0..100).map(plain).collect();
    messages.extend(unmappable());
    messages.extend((100..195).map(plain));
    publish(&sconn, "odd", &messages);
    sconn.close().unwrap();

    let dir = TempDir::new("stream-odd");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("odd", &v.name, &store, "  stream_enabled: true"),
    );
    let (out, peak_kb) = run_cli_peak_rss(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(peak_kb < 100 << 10, "peak RSS {peak_kb} KiB");
    assert!(
        stderr.contains("6 message(s) stored whole as AMQP 1.0 bytes"),
        "{stderr}"
    );
    let m = manifest(&store, "odd");
    assert_eq!(m.queues[0].message_count, messages.len() as u64);
    let url = format!("file://{}", store.display());
    let out = run_cli(&["validate", "--path", &url, "--backup-id", "odd", "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));

    // Restored into a new stream: the odd messages come back as the same bytes, the plain
    // ones as the same record.
    let target = TestVhost::new("stream-odd-target");
    let restore = format!(
        "  publish_mode: direct-to-queue\n  restore_definitions: false\n  create_missing_queues: true\n  vhost_mapping:\n    \"{}\": \"{}\"\n",
        v.name, target.name
    );
    let rcfg = write_config(dir.path(), "r.yaml", &restore_yaml("odd", &store, &restore));
    let out = run_cli(&["restore", "--config", &rcfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let restored = read_raw(&target.name, "odd", messages.len());
    assert_eq!(restored.len(), messages.len());
    for (i, (want, got)) in messages.iter().zip(&restored).enumerate() {
        let (want_rec, want_raw) = record(want);
        if want_raw {
            assert!(got == want, "message {i}: not the same bytes");
        } else {
            let (got_rec, got_raw) = record(got);
            assert!(!got_raw, "message {i} came back unmappable");
            assert_eq!(
                (&got_rec.body, &got_rec.properties, &got_rec.headers),
                (&want_rec.body, &want_rec.properties, &want_rec.headers),
                "message {i}"
            );
        }
    }
}

/// Over AMQP 0-9-1, RabbitMQ 3.10 cannot convert an amqp-value body (its channel crashes):
/// the error says what to do. (Only a tame message here: the 6 KB array above makes the
/// broker itself allocate ~10 GB while it reports the crash, raising a memory alarm.) RabbitMQ
/// 4.x converts it (the body is the encoded value, type `amqp-1.0`): both reads back it up.
#[test]
fn a_message_the_broker_cannot_convert_for_0_9_1_names_stream_enabled() {
    let v = TestVhost::new("stream-091-odd");
    let sconn = StreamConnection::open(&stream_options(&v.name)).expect("stream connection");
    sconn.create_stream("tame", &[]).expect("create stream");
    let mut messages: Vec<Vec<u8>> = (0..5).map(plain).collect();
    messages.push(section(0x77, list32(&[vec![0x41]])));
    publish(&sconn, "tame", &messages);
    sconn.close().unwrap();
    let dir = TempDir::new("stream-091-odd");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("tame", &v.name, &dir.path().join("store"), ""),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    if broker().is_4x() {
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        let held = backed_up(&dir.path().join("store"), "tame", "tame");
        assert_eq!(held.len(), 6);
        assert_eq!(held[5].properties.kind.as_deref(), Some("amqp-1.0"));
    } else {
        assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
        assert!(
            stderr.contains(
                "set backup.stream_enabled: true to read the stream over the stream protocol"
            ),
            "{stderr}"
        );
    }
    // Over the stream protocol the same stream backs up.
    let cfg = write_config(
        dir.path(),
        "s.yaml",
        &backup_yaml(
            "tame-s",
            &v.name,
            &dir.path().join("store"),
            "  stream_enabled: true",
        ),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
}

#[test]
fn a_compression_bomb_ends_the_backup_with_a_clear_error_in_bounded_memory() {
    let v = TestVhost::new("stream-bomb");
    let sconn = StreamConnection::open(&stream_options(&v.name)).expect("stream connection");
    sconn.create_stream("bomb", &[]).expect("create stream");
    let mut messages: Vec<Vec<u8>> = (0..10).map(plain).collect();
    messages.push(nulls_bomb(6_000));
    publish(&sconn, "bomb", &messages);
    // 1,024 messages of 1 MiB of zeros: 1 GiB in ~40 KB of zstd.
    let batch = zstd_zeros(1024, 1 << 20);
    assert!(batch.len() < 64 << 10, "{} bytes", batch.len());
    let publisher = sconn.declare_publisher(2, "bomb").expect("publisher");
    sconn
        .publish_sub_batch(2, 0, 4, 1024, 1024 * ((1 << 20) + 4), &batch)
        .expect("publish the batch");
    let confirmed = publisher.wait_confirms(1, Duration::from_secs(30));
    if broker().version >= (4, 3) {
        // RabbitMQ 4.3 refuses a sub-entry batch announcing more than 64 MiB uncompressed
        // (`max_uncompressed_sub_entry_batch_size`): no stream of 4.3 holds this bomb, and the
        // reader's bound is checked on 4.0 and 3.10 (and in src/broker/stream/chunk.rs).
        let e = confirmed.expect_err("4.3 refuses the batch").to_string();
        assert!(e.contains("precondition failed"), "{e}");
        return;
    }
    confirmed.expect("confirm");
    sconn.close().unwrap();

    let dir = TempDir::new("stream-bomb");
    let store = dir.path().join("store");
    let cfg = write_config(
        dir.path(),
        "b.yaml",
        &backup_yaml("bomb", &v.name, &store, "  stream_enabled: true"),
    );
    let (out, peak_kb) = run_cli_peak_rss(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(peak_kb < 100 << 10, "peak RSS {peak_kb} KiB");
    let line = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        line,
        format!(
            "Stream protocol error: stream bomb in vhost {}: chunk at offset 11: its messages take more than 512 MiB once decompressed; rmq-backup reads at most that much per chunk (a compression bomb, or a chunk no RabbitMQ stream client writes)",
            v.name
        ),
        "{stderr}"
    );
    assert!(manifest(&store, "bomb").completed_at.is_none());
}
