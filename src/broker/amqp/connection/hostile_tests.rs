//! A broker that misbehaves after the handshake (issue "Faults", promise 6): every misdeed is a
//! clear `AMQP error` / `Connection error` that ends the connection, with memory bounded by
//! the negotiated frame size, and never a hang or a panic.

use super::tests::{fake_broker, fake_broker_tuned, fake_opts, wait_closed, FakePeer, Stage};
use super::*;
use crate::broker::amqp::codec::*;
use std::io::Write;

/// The error a connection ended with, once it ended (at most 3 s).
fn ended_with(conn: &Connection) -> Error {
    wait_closed(conn, Duration::from_secs(3));
    conn.open_channel().err().expect("the connection ended")
}

/// Sends raw bytes to the client.
fn raw(p: &mut FakePeer, bytes: &[u8]) {
    let _ = p.w.write_all(bytes);
}

/// A frame header: type, channel, payload size.
fn frame_head(kind: u8, channel: u16, size: u32) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend_from_slice(&channel.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b
}

#[test]
fn a_frame_larger_than_negotiated_ends_the_connection_before_it_is_read() {
    // A payload of 4 GiB announced: refused from its header, nothing allocated for it.
    let (port, t) = fake_broker(Stage::Open, 0, |mut p| {
        raw(&mut p, &frame_head(FRAME_METHOD, 0, u32::MAX));
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    let e = ended_with(&conn).to_string();
    assert!(e.contains("4294967295") && e.contains("frame"), "{e}");
    t.join().unwrap();
}

#[test]
fn a_frame_max_of_4_gib_is_not_taken() {
    let (port, t) = fake_broker_tuned(Stage::Open, 0, u32::MAX, |mut p| {
        // One payload over what the client itself allows.
        raw(&mut p, &frame_head(FRAME_BODY, 0, 200_000));
        raw(&mut p, &[0u8; 64]);
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    assert_eq!(
        conn.frame_max(),
        131_072,
        "the client's own frame_max, not 4 GiB"
    );
    let e = ended_with(&conn).to_string();
    assert!(e.contains("200000"), "{e}");
    t.join().unwrap();
}

#[test]
fn garbage_after_the_handshake_is_an_amqp_error() {
    let (port, t) = fake_broker(Stage::Open, 0, |mut p| {
        raw(&mut p, b"HTTP/1.1 400 Bad Request\r\n\r\nnot AMQP at all");
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    let e = ended_with(&conn);
    assert!(matches!(&e, Error::Amqp(_) | Error::Connection(_)), "{e:?}");
    t.join().unwrap();
}

#[test]
fn a_method_on_a_channel_never_opened_is_a_protocol_error() {
    let (port, t) = fake_broker(Stage::Open, 0, |mut p| {
        p.send(
            99,
            Method::BasicDeliver {
                consumer_tag: "x".into(),
                delivery_tag: 1,
                redelivered: false,
                exchange: Vec::new(),
                routing_key: b"q".to_vec(),
            },
        );
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    let e = ended_with(&conn).to_string();
    assert!(
        e.contains("the broker sent basic.deliver on channel 99, which was never opened"),
        "{e}"
    );
    t.join().unwrap();
}

#[test]
fn a_body_longer_than_its_header_announced_is_a_protocol_error() {
    let (port, t) = fake_broker(Stage::Open, 0, |mut p| {
        assert_eq!(p.method(), Method::ChannelOpen);
        p.send(1, Method::ChannelOpenOk);
        // basic.get-ok, a header announcing 4 bytes, then a body of 10.
        p.send(
            1,
            Method::BasicGetOk {
                delivery_tag: 1,
                redelivered: false,
                exchange: Vec::new(),
                routing_key: b"q".to_vec(),
                message_count: 0,
            },
        );
        let mut header = Vec::new();
        put_content_header_frame(
            &mut header,
            1,
            4,
            &crate::broker::amqp::BasicProperties::default(),
            0,
        )
        .unwrap();
        raw(&mut p, &header);
        let mut body = frame_head(FRAME_BODY, 1, 10);
        body.extend_from_slice(&[7u8; 10]);
        body.push(FRAME_END);
        raw(&mut p, &body);
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    let ch = conn.open_channel().unwrap();
    let r = ch.basic_get("q", false);
    let e = match r {
        Err(e) => e,
        Ok(_) => ended_with(&conn),
    }
    .to_string();
    assert!(e.contains("protocol error") && e.contains("body"), "{e}");
    t.join().unwrap();
}
