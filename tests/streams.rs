//! Streams backed up over the stream protocol (`backup.stream_enabled: true`) on the real
//! broker: what the backup holds is, message by message and in order, what an AMQP 0-9-1
//! reader of the stream sees (ignoring the broker's own `x-stream-offset`).

mod common;

use common::*;
use rmq_backup::amqp::{Connection, Delivery, FieldTable, FieldValue};
use std::time::Duration;

/// Messages a stream keeps when they are published over AMQP 0-9-1: every header type but
/// `decimal` (the broker's conversion crashes the channel) and tables and arrays (it drops them).
fn stream_messages(n: usize, seed: u64) -> Vec<Msg> {
    diverse_messages(n, seed, true)
        .into_iter()
        .map(|mut m| {
            if let Some(h) = m.props.headers.as_mut() {
                h.retain(|(_, v)| {
                    !matches!(
                        v,
                        FieldValue::Decimal { .. } | FieldValue::Table(_) | FieldValue::Array(_)
                    )
                });
            }
            m
        })
        .collect()
}

fn declare_stream(conn: &Connection, name: &str) {
    let ch = conn.open_channel().expect("channel");
    let args: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"stream".to_vec()),
    )];
    ch.queue_declare(name, true, false, false, &args)
        .expect("declare stream");
    ch.close().expect("close");
}

/// Reads `n` messages of stream `name` over AMQP 0-9-1 from its first offset (prefetch 100,
/// acks only for credit), without the broker's `x-stream-offset` header.
fn read_091(conn: &Connection, name: &str, n: usize) -> Vec<Delivery> {
    let ch = conn.open_channel().expect("channel");
    ch.basic_qos(100, false).expect("qos");
    let args: FieldTable = vec![(
        "x-stream-offset".into(),
        FieldValue::LongString(b"first".to_vec()),
    )];
    let consumer = ch
        .basic_consume(name, "check", false, false, &args)
        .expect("consume");
    let mut out = Vec::new();
    while out.len() < n {
        let mut d = consumer
            .recv_timeout(Duration::from_secs(30))
            .expect("recv")
            .expect("a delivery within 30 s");
        ch.basic_ack(d.delivery_tag, false).expect("ack");
        if let Some(h) = d.properties.headers.as_mut() {
            h.retain(|(k, _)| k != "x-stream-offset");
            if h.is_empty() {
                d.properties.headers = None;
            }
        }
        out.push(d);
    }
    ch.close().expect("close");
    out
}

fn same(expected: &[Delivery], got: &[Delivery], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: message count");
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        assert_eq!(g.body, e.body, "{what}: body of message {i}");
        assert_eq!(
            comparable(&g.properties, Headers::Sorted),
            comparable(&e.properties, Headers::Sorted),
            "{what}: properties of message {i}"
        );
    }
}

#[test]
fn a_stream_backed_up_over_the_stream_protocol_holds_what_a_0_9_1_reader_sees() {
    let v = TestVhost::new("streams");
    let conn = v.connect();
    declare_stream(&conn, "events");
    let msgs = stream_messages(60, 11);
    let ch = conn.open_channel().expect("channel");
    publish(&ch, "events", &msgs);
    ch.close().expect("close");
    let seen = read_091(&conn, "events", msgs.len());
    for (m, d) in msgs.iter().zip(&seen) {
        assert_eq!(d.body, m.body, "the stream holds what was published");
    }

    let dir = TempDir::new("streams");
    let cfg = write_config(
        dir.path(),
        "backup.yaml",
        &backup_yaml("s1", &v.name, dir.path(), "  stream_enabled: true"),
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let got = backed_up(dir.path(), "s1", "events");
    same(&seen, &got, "stream backup");
    // Offsets: delivery tags are offset + 1, in order.
    let tags: Vec<u64> = got.iter().map(|d| d.delivery_tag).collect();
    assert_eq!(tags, (1..=msgs.len() as u64).collect::<Vec<_>>());
}
