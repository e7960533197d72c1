//! A stream-protocol peer that misbehaves after the login (issue "Faults", promise 6): an
//! oversized or garbage frame, more chunks than credit, silence instead of heartbeats, a
//! `frame_max` of 4 GiB. Each ends the connection with a clear error, within bounded memory
//! and time; none hangs or panics.

use super::protocol::open_frame;
use super::protocol::{key, FrameBuf, RESPONSE_OK};
use super::{OffsetSpec, StreamConnection, StreamOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size).ok()?;
    let mut f = vec![0u8; u32::from_be_bytes(size) as usize];
    s.read_exact(&mut f).ok()?;
    Some(f)
}

/// Answers the login (peer properties, SASL PLAIN, tune with `frame_max` and `heartbeat`,
/// open), then hands the socket to `after`.
fn fake_stream_broker(
    frame_max: u32,
    heartbeat: u32,
    after: impl FnOnce(TcpStream) + Send + 'static,
) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        loop {
            let Some(f) = read_frame(&mut s) else { return };
            let (k, mut c) = open_frame(&f).unwrap();
            let reply = match k {
                key::PEER_PROPERTIES => {
                    let corr = c.u32().unwrap();
                    FrameBuf::new(key::PEER_PROPERTIES | key::RESPONSE)
                        .u32(corr)
                        .u16(RESPONSE_OK)
                        .u32(0)
                        .finish()
                }
                key::SASL_HANDSHAKE => {
                    let corr = c.u32().unwrap();
                    FrameBuf::new(key::SASL_HANDSHAKE | key::RESPONSE)
                        .u32(corr)
                        .u16(RESPONSE_OK)
                        .u32(1)
                        .string("PLAIN")
                        .unwrap()
                        .finish()
                }
                key::SASL_AUTHENTICATE => {
                    let corr = c.u32().unwrap();
                    s.write_all(
                        &FrameBuf::new(key::SASL_AUTHENTICATE | key::RESPONSE)
                            .u32(corr)
                            .u16(RESPONSE_OK)
                            .finish(),
                    )
                    .unwrap();
                    FrameBuf::new(key::TUNE)
                        .u32(frame_max)
                        .u32(heartbeat)
                        .finish()
                }
                k if k == key::TUNE | key::RESPONSE => continue,
                key::OPEN => {
                    let corr = c.u32().unwrap();
                    s.write_all(
                        &FrameBuf::new(key::OPEN | key::RESPONSE)
                            .u32(corr)
                            .u16(RESPONSE_OK)
                            .u32(0)
                            .finish(),
                    )
                    .unwrap();
                    return after(s);
                }
                other => panic!("unexpected key {other:#06x} during the login"),
            };
            s.write_all(&reply).unwrap();
        }
    });
    (port, t)
}

fn options(port: u16, heartbeat: u32) -> StreamOptions {
    StreamOptions {
        host: "127.0.0.1".into(),
        port,
        user: "u".into(),
        password: "p".into(),
        vhost: "/".into(),
        connect_timeout: Duration::from_secs(2),
        rpc_timeout: Duration::from_secs(2),
        heartbeat_secs: heartbeat,
        connection_name: "t".into(),
        tls: None,
    }
}

/// Subscribes (answered OK by `answer_subscribe`) and returns what the subscription ends with.
fn subscription_error(conn: &StreamConnection) -> String {
    let sub = conn
        .subscribe(1, "s", OffsetSpec::First, 2)
        .expect("subscribed");
    let started = Instant::now();
    loop {
        match sub.next_chunk(Duration::from_secs(5)) {
            Err(e) => return e.to_string(),
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error within {:?}", started.elapsed()),
        }
    }
}

/// Answers the subscribe request on `s`.
fn answer_subscribe(s: &mut TcpStream) {
    let f = read_frame(s).expect("subscribe");
    let (k, mut c) = open_frame(&f).unwrap();
    assert_eq!(k, key::SUBSCRIBE);
    let corr = c.u32().unwrap();
    s.write_all(
        &FrameBuf::new(key::SUBSCRIBE | key::RESPONSE)
            .u32(corr)
            .u16(RESPONSE_OK)
            .finish(),
    )
    .unwrap();
}

#[test]
fn a_frame_of_4_gib_ends_the_connection_unread() {
    let (port, t) = fake_stream_broker(u32::MAX, 0, |mut s| {
        answer_subscribe(&mut s);
        let _ = s.write_all(&u32::MAX.to_be_bytes());
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = StreamConnection::open(&options(port, 0)).expect("login, frame_max 4 GiB");
    let e = subscription_error(&conn);
    assert!(e.contains("received a frame of 4294967295 bytes"), "{e}");
    t.join().unwrap();
}

#[test]
fn garbage_after_the_login_ends_the_connection() {
    let (port, t) = fake_stream_broker(1 << 20, 0, |mut s| {
        answer_subscribe(&mut s);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = StreamConnection::open(&options(port, 0)).unwrap();
    let e = subscription_error(&conn);
    assert!(
        e.starts_with("Connection error: ") || e.starts_with("Stream protocol error: "),
        "{e}"
    );
    t.join().unwrap();
}

#[test]
fn more_chunks_than_credit_is_a_protocol_error() {
    let (port, t) = fake_stream_broker(1 << 20, 0, |mut s| {
        answer_subscribe(&mut s);
        for _ in 0..10 {
            let f = FrameBuf::new(key::DELIVER).u8(1).raw(&[0u8; 64]).finish();
            if s.write_all(&f).is_err() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    });
    let conn = StreamConnection::open(&options(port, 0)).unwrap();
    let sub = conn.subscribe(1, "s", OffsetSpec::First, 2).unwrap();
    // Nothing is read from the subscription: the broker must not send more than 2 (+ slack).
    std::thread::sleep(Duration::from_millis(300));
    let mut e = None;
    for _ in 0..10 {
        match sub.next_chunk(Duration::from_secs(3)) {
            Err(err) => {
                e = Some(err.to_string());
                break;
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
        }
    }
    let e = e.expect("an error");
    assert!(
        e.contains("delivered more chunks to subscription 1 than its credit"),
        "{e}"
    );
    t.join().unwrap();
}

#[test]
fn a_silent_broker_is_lost_after_two_heartbeats() {
    let (port, t) = fake_stream_broker(1 << 20, 1, |mut s| {
        answer_subscribe(&mut s);
        // Reads what comes, sends nothing.
        let end = Instant::now() + Duration::from_secs(4);
        while Instant::now() < end && read_frame(&mut s).is_some() {}
    });
    let conn = StreamConnection::open(&options(port, 1)).unwrap();
    let started = Instant::now();
    let e = subscription_error(&conn);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("lost: no frame for"), "{e}");
    t.join().unwrap();
}
