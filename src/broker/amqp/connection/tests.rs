use super::handshake::{negotiate, table_str};
use super::*;
use crate::broker::amqp::codec::*;
use crate::broker::amqp::transport::FrameReader;
use crate::broker::amqp::types::{BasicProperties, FieldValue};
use std::io::Write;

#[test]
fn negotiation() {
    assert_eq!(negotiate(30u16, 60), 30);
    assert_eq!(negotiate(0u16, 60), 60);
    assert_eq!(negotiate(30u16, 0), 30);
    assert_eq!(negotiate(0u16, 0), 0);
    assert_eq!(negotiate(131_072u32, 4096), 4096);
}

#[test]
fn options_defaults_follow_url() {
    let o = ConnectOptions::new(
        AmqpUrl::parse("amqp://h/v?heartbeat=7&connection_timeout=1500").unwrap(),
    );
    assert_eq!(o.heartbeat_secs, 7);
    assert_eq!(o.connect_timeout, Duration::from_millis(1500));
    assert_eq!(o.rpc_timeout, Duration::from_secs(30));
    assert_eq!(o.frame_max, 131_072);
    let o = ConnectOptions::new(AmqpUrl::parse("amqp://h").unwrap());
    assert_eq!(o.heartbeat_secs, 30);
    assert_eq!(o.connect_timeout, Duration::from_secs(10));
}

#[test]
fn confirms_single_multiple_and_nack() {
    let (tx, _rx) = unbounded();
    let c = ChanShared {
        id: 1,
        wire_properties: AtomicBool::new(false),
        state: Mutex::new(ChanState {
            closed: None,
            rpc_tx: tx,
            pending_consumer: None,
            consumers: HashMap::new(),
            confirm_mode: true,
            next_seq: 10,
            unconfirmed: (1..=10).collect(),
            nacked: Vec::new(),
            returned: Vec::new(),
        }),
        cond: Condvar::new(),
    };
    c.confirm(3, false, false);
    c.confirm(5, true, false);
    assert_eq!(
        lock(&c.state)
            .unconfirmed
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        vec![6, 7, 8, 9, 10]
    );
    c.confirm(7, false, true);
    c.confirm(8, true, true);
    assert_eq!(lock(&c.state).nacked, vec![7, 6, 8]);
    c.confirm(0, true, false);
    assert!(lock(&c.state).unconfirmed.is_empty());
    // an unknown tag changes nothing
    c.confirm(42, false, true);
    assert_eq!(lock(&c.state).nacked.len(), 3);
}

/// A fake broker on a local socket: the reader must turn garbage into an error, not a panic.
#[test]
fn garbage_from_server_during_handshake_is_a_connection_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hdr = [0u8; 8];
        std::io::Read::read_exact(&mut s, &mut hdr).unwrap();
        // a frame header announcing a 4 GiB method frame
        s.write_all(&[1, 0, 0, 0xff, 0xff, 0xff, 0xff]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let mut o = ConnectOptions::new(
        AmqpUrl::parse(&format!("amqp://u:secret@127.0.0.1:{port}/v")).unwrap(),
    );
    o.rpc_timeout = Duration::from_secs(2);
    let e = Connection::open(&o).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Connection(_)), "{msg}");
    assert!(
        msg.contains("Failed to connect to amqp://u:****@127.0.0.1"),
        "{msg}"
    );
    assert!(msg.contains("exceeds"), "{msg}");
    assert!(!msg.contains("secret"));
    t.join().unwrap();
}

#[test]
fn silent_server_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (_s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
    });
    let mut o =
        ConnectOptions::new(AmqpUrl::parse(&format!("amqp://u:p@127.0.0.1:{port}/v")).unwrap());
    o.connect_timeout = Duration::from_millis(300);
    o.rpc_timeout = Duration::from_millis(300);
    let start = Instant::now();
    let e = Connection::open(&o).err().unwrap();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        e.to_string()
            .contains("timed out during the AMQP handshake"),
        "{e}"
    );
    t.join().unwrap();
}

/// How far a fake broker goes with the handshake.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Stage {
    /// Close the socket right after connection.start-ok.
    EofAfterStartOk,
    /// Complete the handshake.
    Open,
}

pub(super) struct FakePeer {
    pub(super) frames: FrameReader,
    pub(super) w: Transport,
}

impl FakePeer {
    pub(super) fn next(&mut self) -> Option<(u8, u16, Option<Method>)> {
        loop {
            match self.frames.next_frame() {
                Ok(Some(f)) => {
                    let m = (f.kind == FRAME_METHOD).then(|| Method::decode(f.payload).unwrap());
                    return Some((f.kind, f.channel, m));
                }
                Ok(None) => continue,
                Err(_) => return None,
            }
        }
    }
    pub(super) fn method(&mut self) -> Method {
        loop {
            if let (_, _, Some(m)) = self.next().expect("frame") {
                return m;
            }
        }
    }
    pub(super) fn send(&mut self, ch: u16, m: Method) {
        let mut b = Vec::new();
        put_method_frame(&mut b, ch, &m, 0).unwrap();
        self.w.write_all(&b).unwrap();
    }
}

/// A broker stand-in on a local port; `after` runs once the handshake is done.
pub(super) fn fake_broker<T: Send + 'static>(
    stage: Stage,
    heartbeat: u16,
    after: impl FnOnce(FakePeer) -> T + Send + 'static,
) -> (u16, std::thread::JoinHandle<Option<T>>) {
    fake_broker_tuned(stage, heartbeat, 131072, after)
}

/// [`fake_broker`] proposing `frame_max` in its connection.tune.
pub(super) fn fake_broker_tuned<T: Send + 'static>(
    stage: Stage,
    heartbeat: u16,
    frame_max: u32,
    after: impl FnOnce(FakePeer) -> T + Send + 'static,
) -> (u16, std::thread::JoinHandle<Option<T>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut hdr = [0u8; 8];
        std::io::Read::read_exact(&mut &s, &mut hdr).unwrap();
        assert_eq!(&hdr, PROTOCOL_HEADER);
        let t = Transport::Tcp(s);
        t.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut p = FakePeer {
            w: t.try_clone().unwrap(),
            frames: FrameReader::new(t, 1 << 20),
        };
        p.send(
            0,
            Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: vec![(
                    "product".into(),
                    FieldValue::LongString(b"Fake".to_vec()),
                )],
                mechanisms: b"AMQPLAIN PLAIN".to_vec(),
                locales: b"en_US".to_vec(),
            },
        );
        let Method::ConnectionStartOk {
            client_properties,
            response,
            ..
        } = p.method()
        else {
            panic!("expected start-ok")
        };
        assert_eq!(response.0, b"\0user\0pw");
        assert_eq!(format!("{response:?}"), "****");
        assert_eq!(table_str(&client_properties, "product"), "rmq-backup");
        if stage == Stage::EofAfterStartOk {
            return None;
        }
        p.send(
            0,
            Method::ConnectionTune {
                channel_max: 0,
                frame_max,
                heartbeat,
            },
        );
        assert!(matches!(p.method(), Method::ConnectionTuneOk { .. }));
        assert!(matches!(p.method(), Method::ConnectionOpen { .. }));
        p.send(0, Method::ConnectionOpenOk);
        Some(after(p))
    });
    (port, t)
}

pub(super) fn fake_opts(port: u16, heartbeat: u16) -> ConnectOptions {
    let mut o =
        ConnectOptions::new(AmqpUrl::parse(&format!("amqp://user:pw@127.0.0.1:{port}/v")).unwrap());
    o.heartbeat_secs = heartbeat;
    o.rpc_timeout = Duration::from_millis(500);
    o.blocked_timeout = Duration::from_millis(500);
    o
}

pub(super) fn wait_closed(conn: &Connection, within: Duration) {
    let deadline = Instant::now() + within;
    while conn.is_open() {
        assert!(Instant::now() < deadline, "connection still open");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn socket_closed_after_start_ok_is_authentication_error() {
    let (port, t) = fake_broker(Stage::EofAfterStartOk, 0, |_| ());
    let e = Connection::open(&fake_opts(port, 0)).err().unwrap();
    assert_eq!(
        e,
        Error::Authentication("AMQP authentication failed for user user".into())
    );
    t.join().unwrap();
}

#[test]
fn silent_broker_is_lost_after_missed_heartbeats_and_we_send_ours() {
    let (port, t) = fake_broker(Stage::Open, 1, |mut p| {
        // Read for 3.5 s without ever sending anything; count the client's heartbeats.
        let end = Instant::now() + Duration::from_millis(3500);
        let mut heartbeats = 0;
        while Instant::now() < end {
            match p.frames.next_frame() {
                Ok(Some(f)) if f.kind == FRAME_HEARTBEAT => heartbeats += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        heartbeats
    });
    let conn = Connection::open(&fake_opts(port, 5)).unwrap();
    assert_eq!(conn.heartbeat(), Some(Duration::from_secs(1)), "min(5, 1)");
    let start = Instant::now();
    wait_closed(&conn, Duration::from_secs(4));
    assert!(start.elapsed() >= Duration::from_secs(2));
    let e = conn.open_channel().err().unwrap();
    assert_eq!(
        e,
        Error::Connection(format!(
            "connection to 127.0.0.1:{port} lost: missed heartbeats"
        ))
    );
    assert_eq!(conn.close().unwrap_err(), e);
    let heartbeats = t.join().unwrap().unwrap();
    assert!(heartbeats >= 2, "client sent {heartbeats} heartbeats");
}

#[test]
fn eof_after_handshake_is_connection_reset() {
    let (port, t) = fake_broker(Stage::Open, 0, drop);
    let conn = Connection::open(&fake_opts(port, 0)).unwrap();
    assert_eq!(conn.heartbeat(), None, "both 0: off");
    wait_closed(&conn, Duration::from_secs(3));
    assert_eq!(
        conn.open_channel().err().unwrap(),
        Error::Connection("connection reset by peer".into())
    );
    t.join().unwrap();
}

#[test]
fn blocked_connection_holds_publishes_until_unblocked() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (port, t) = fake_broker(Stage::Open, 0, move |mut p| {
        assert_eq!(p.method(), Method::ChannelOpen);
        p.send(1, Method::ChannelOpenOk);
        p.send(
            0,
            Method::ConnectionBlocked {
                reason: "low on memory".into(),
            },
        );
        rx.recv().unwrap(); // the client saw the timeout
        p.send(0, Method::ConnectionUnblocked);
        // the publish: method, header, 3 body frames (10,000 bytes at frame_max 4096)
        let mut kinds = Vec::new();
        while kinds.len() < 5 {
            let (kind, ch, m) = p.next().unwrap();
            assert_eq!(ch, 1);
            if let Some(m) = m {
                assert_eq!(m.name(), "basic.publish");
            }
            kinds.push(kind);
        }
        p.send(
            0,
            Method::ConnectionClose {
                reply_code: 320,
                reply_text: "CONNECTION_FORCED - bye".into(),
                class_id: 0,
                method_id: 0,
            },
        );
        assert_eq!(p.method(), Method::ConnectionCloseOk);
        kinds
    });
    let mut o = fake_opts(port, 0);
    o.frame_max = 4096;
    let conn = Connection::open(&o).unwrap();
    assert_eq!(conn.frame_max(), 4096);
    let ch = conn.open_channel().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while conn.blocked().is_none() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(conn.blocked().as_deref(), Some("low on memory"));
    let start = Instant::now();
    let e = ch
        .basic_publish("", "q", false, &BasicProperties::default(), b"x")
        .unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(450));
    assert_eq!(
            e,
            Error::Connection(format!(
                "connection to 127.0.0.1:{port} is blocked by the broker (low on memory); gave up after 0.5s"
            ))
        );
    tx.send(()).unwrap();
    let body = vec![9u8; 10_000];
    // the publish waits for the unblock, then goes out
    assert_eq!(
        ch.basic_publish("", "q", false, &BasicProperties::default(), &body)
            .unwrap(),
        0
    );
    let kinds = t.join().unwrap().unwrap();
    assert_eq!(
        kinds,
        vec![
            FRAME_METHOD,
            FRAME_HEADER,
            FRAME_BODY,
            FRAME_BODY,
            FRAME_BODY
        ]
    );
    wait_closed(&conn, Duration::from_secs(3));
    let e = ch.basic_qos(1, false).unwrap_err();
    assert_eq!(
        e,
        Error::Connection("connection closed by broker: CONNECTION_FORCED - bye".into())
    );
}
