//! Unit tests of the AMQP 1.0 client's pure parts (frames, performatives, SASL frames,
//! addresses), hostile input included (truncated frames, lengths beyond the input, garbage:
//! an error, never a panic), and of a connection to a scripted fake broker that goes silent or
//! closes the socket (an error that names what was lost, never a hang).

use std::io::{self, Cursor, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use super::codec::{encode_value, Value};
use super::frame::*;
use super::performative::*;
use super::sasl::{decode_sasl, put_plain_init, SaslFrame};
use super::{exchange_address, queue_address, ConnectOptions, Connection};
use crate::broker::amqp::transport::ReadFail;
use crate::broker::amqp::url::AmqpUrl;
use crate::error::Error;

fn frame_of(p: &Performative, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_frame(&mut out, TYPE_AMQP, channel, |b| {
        p.encode(b);
        b.extend_from_slice(payload);
    });
    out
}

fn every_performative() -> Vec<Performative> {
    let err = Some(AmqpError {
        condition: "amqp:not-found".into(),
        description: Some("no queue 'q' ✓".into()),
    });
    vec![
        Performative::Open(Open {
            container_id: "c".into(),
            hostname: Some("vhost:v".into()),
            max_frame_size: 131_072,
            channel_max: 255,
            idle_time_out: Some(30_000),
            properties: vec![(Value::Symbol("product".into()), Value::String("x".into()))],
        }),
        Performative::Begin(Begin {
            remote_channel: Some(3),
            next_outgoing_id: 7,
            incoming_window: 100,
            outgoing_window: u32::MAX,
            handle_max: 1023,
        }),
        Performative::Attach(Attach {
            name: "link".into(),
            handle: 2,
            role_receiver: true,
            snd_settle_mode: 0,
            rcv_settle_mode: 0,
            source: Some(Some("/queues/q".into())),
            target: Some(None),
            initial_delivery_count: Some(5),
            max_message_size: Some(1 << 20),
        }),
        Performative::Attach(Attach {
            name: "refused".into(),
            source: None,
            target: Some(Some("/queues/q".into())),
            ..Attach::default()
        }),
        Performative::Flow(Flow {
            next_incoming_id: Some(1),
            incoming_window: 2,
            next_outgoing_id: 3,
            outgoing_window: 4,
            handle: Some(5),
            delivery_count: Some(6),
            link_credit: Some(7),
            available: Some(8),
            drain: true,
            echo: true,
        }),
        Performative::Transfer(Transfer {
            handle: 1,
            delivery_id: Some(9),
            delivery_tag: Some(vec![0, 0, 0, 9]),
            message_format: Some(0),
            settled: Some(false),
            more: true,
            state: Some(DeliveryState::Outcome(Outcome::Accepted)),
            aborted: false,
        }),
        Performative::Disposition(Disposition {
            role_receiver: true,
            first: 1,
            last: Some(10),
            settled: true,
            state: Some(DeliveryState::Outcome(Outcome::Modified {
                delivery_failed: true,
                undeliverable_here: false,
                message_annotations: vec![(Value::Symbol("x-a".into()), Value::Long(1))],
            })),
        }),
        Performative::Disposition(Disposition {
            role_receiver: false,
            first: u32::MAX,
            last: None,
            settled: true,
            state: Some(DeliveryState::Outcome(Outcome::Rejected(err.clone()))),
        }),
        Performative::Disposition(Disposition {
            role_receiver: true,
            first: 0,
            last: Some(0),
            settled: false,
            state: Some(DeliveryState::Outcome(Outcome::Released)),
        }),
        Performative::Detach {
            handle: 4,
            closed: true,
            error: err.clone(),
        },
        Performative::End(None),
        Performative::Close(err),
    ]
}

#[test]
fn performatives_round_trip() {
    for p in every_performative() {
        let mut body = Vec::new();
        p.encode(&mut body);
        let (back, payload) = Performative::decode(&body).expect("decode");
        assert_eq!(back, p);
        assert!(payload.is_empty());
    }
}

#[test]
fn a_transfer_keeps_its_payload_and_frames_read_back() {
    let p = &every_performative()[5];
    let payload: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    let mut bytes = frame_of(p, 7, &payload);
    put_empty_frame(&mut bytes);
    bytes.extend(frame_of(&Performative::End(None), 7, &[]));
    let mut r = FrameReader::new(Cursor::new(bytes), 1 << 16);
    let f = r.next_frame().expect("frame").expect("some");
    assert_eq!((f.kind, f.channel), (TYPE_AMQP, 7));
    let (back, rest) = Performative::decode(f.body).expect("decode");
    assert_eq!(&back, p);
    assert_eq!(rest, &payload[..]);
    assert!(r
        .next_frame()
        .expect("empty")
        .expect("some")
        .body
        .is_empty());
    let f = r.next_frame().expect("end").expect("some");
    assert_eq!(
        Performative::decode(f.body).unwrap().0,
        Performative::End(None)
    );
    assert!(matches!(r.next_frame(), Err(ReadFail::Eof)));
}

/// Gives one byte per read, with a time-out between any two.
struct Dribble {
    bytes: Vec<u8>,
    pos: usize,
    tick: bool,
}

impl Read for Dribble {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tick = !self.tick;
        if self.tick {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, "tick"));
        }
        if self.pos == self.bytes.len() {
            return Ok(0);
        }
        buf[0] = self.bytes[self.pos];
        self.pos += 1;
        Ok(1)
    }
}

#[test]
fn frames_split_by_time_outs_lose_nothing() {
    let mut bytes = AMQP_PROTOCOL_HEADER.to_vec();
    for p in every_performative() {
        bytes.extend(frame_of(&p, 1, b"payload"));
    }
    let mut r = FrameReader::new(
        Dribble {
            bytes,
            pos: 0,
            tick: false,
        },
        4096,
    );
    let header = loop {
        if let Some(h) = r.protocol_header().expect("header") {
            break h;
        }
    };
    assert_eq!(header, AMQP_PROTOCOL_HEADER);
    let mut got = Vec::new();
    loop {
        match r.next_frame() {
            Ok(Some(f)) => got.push(Performative::decode(f.body).expect("decode").0),
            Ok(None) => continue,
            Err(ReadFail::Eof) => break,
            Err(_) => panic!("read error"),
        }
    }
    assert_eq!(got, every_performative());
}

fn read_all(bytes: Vec<u8>, max: usize) -> Result<usize, String> {
    let mut r = FrameReader::new(Cursor::new(bytes), max);
    let mut n = 0;
    loop {
        match r.next_frame() {
            Ok(Some(f)) => {
                if !f.body.is_empty() {
                    let _ = Performative::decode(f.body);
                }
                n += 1;
            }
            Ok(None) => return Err("time-out".into()),
            Err(ReadFail::Eof) => return Ok(n),
            Err(ReadFail::Protocol(e)) => return Err(e.to_string()),
            Err(ReadFail::Io(e)) => return Err(e.to_string()),
        }
    }
}

#[test]
fn hostile_frame_headers_are_errors() {
    let cases: [(&[u8], &str); 5] = [
        (&[0, 0, 0, 4, 2, 0, 0, 0], "frame size 4 is below 8"),
        (&[0, 1, 0, 0, 2, 0, 0, 0], "larger than the max-frame-size"),
        (&[0, 0, 0, 8, 1, 0, 0, 0], "data offset 1"),
        (&[0, 0, 0, 8, 9, 0, 0, 0], "data offset 9"),
        (&[0, 0, 0, 8, 2, 7, 0, 0], "unknown frame type 7"),
    ];
    for (bytes, want) in cases {
        let err = read_all(bytes.to_vec(), 4096).expect_err("refused");
        assert!(err.contains(want), "{err}");
    }
    // TLS bytes on a plain connection say so.
    let err = read_all(vec![0x16, 0x03, 0x03, 0x00, 0x40, 0x02, 0, 0], 4096).expect_err("tls");
    assert!(err.contains("TLS"), "{err}");
}

#[test]
fn truncated_frames_end_without_a_panic() {
    let mut bytes = Vec::new();
    for p in every_performative() {
        bytes.extend(frame_of(&p, 0, b"x"));
    }
    for cut in 0..bytes.len() {
        // A cut frame is the end of the stream, never a frame.
        let _ = read_all(bytes[..cut].to_vec(), 4096);
    }
}

/// Every prefix and many corruptions of every performative decode to an error or a value,
/// never a panic; lengths beyond the input are errors.
#[test]
fn hostile_performatives_never_panic() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for p in every_performative() {
        let mut body = Vec::new();
        p.encode(&mut body);
        for cut in 0..body.len() {
            assert!(
                Performative::decode(&body[..cut]).is_err(),
                "{p:?} cut at {cut}"
            );
        }
        for _ in 0..2000 {
            let mut b = body.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            let _ = Performative::decode(&b);
            let _ = decode_sasl(&b);
        }
    }
    // A list announcing 4 GiB in a few bytes.
    let huge = [
        0x00, 0x53, 0x10, 0xd0, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
    ];
    assert!(Performative::decode(&huge).is_err());
    // Garbage of every length.
    for n in 0..300 {
        let b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        let _ = Performative::decode(&b);
        let _ = decode_sasl(&b);
        let _ = read_all(b, 512);
    }
}

#[test]
fn wrong_fields_name_the_field() {
    // A transfer whose handle is a string.
    let v = Value::Described(
        Box::new(Value::Ulong(0x14)),
        Box::new(Value::List(vec![Value::String("h".into())])),
    );
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    let err = Performative::decode(&b).expect_err("refused").to_string();
    assert!(err.contains("transfer field handle is a string"), "{err}");
    // An attach without its name.
    let v = Value::Described(Box::new(Value::Ulong(0x12)), Box::new(Value::List(vec![])));
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    let err = Performative::decode(&b).expect_err("refused").to_string();
    assert!(err.contains("attach without its name"), "{err}");
    // Not a performative.
    let v = Value::Described(Box::new(Value::Ulong(0x70)), Box::new(Value::List(vec![])));
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    assert!(Performative::decode(&b).is_err());
    // Symbolic descriptors are understood.
    let v = Value::Described(
        Box::new(Value::Symbol("amqp:end:list".into())),
        Box::new(Value::List(vec![])),
    );
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    assert_eq!(Performative::decode(&b).unwrap().0, Performative::End(None));
}

#[test]
fn sasl_frames() {
    let mech = |v: Value| {
        let mut b = Vec::new();
        encode_value(
            &Value::Described(Box::new(Value::Ulong(0x40)), Box::new(Value::List(vec![v]))),
            &mut b,
        );
        decode_sasl(&b)
    };
    let one = mech(Value::Symbol("PLAIN".into())).unwrap();
    assert_eq!(one, SaslFrame::Mechanisms(vec!["PLAIN".into()]));
    let many = mech(Value::Array(
        None,
        vec![
            Value::Symbol("AMQPLAIN".into()),
            Value::Symbol("PLAIN".into()),
        ],
    ))
    .unwrap();
    assert_eq!(
        many,
        SaslFrame::Mechanisms(vec!["AMQPLAIN".into(), "PLAIN".into()])
    );
    assert!(mech(Value::Null).is_err());
    let mut out = Vec::new();
    put_plain_init(&mut out, "user", "pässword");
    let mut r = FrameReader::new(Cursor::new(out), 512);
    let f = r.next_frame().unwrap().unwrap();
    assert_eq!(f.kind, TYPE_SASL);
    let needle = b"\0user\0p\xc3\xa4ssword";
    assert!(f.body.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn addresses_are_percent_encoded() {
    assert_eq!(queue_address("q").unwrap(), "/queues/q");
    assert_eq!(
        queue_address("my queue/ü~._-").unwrap(),
        "/queues/my%20queue%2F%C3%BC~._-"
    );
    assert_eq!(
        exchange_address("amq.topic", "a.b/c").unwrap(),
        "/exchanges/amq.topic/a.b%2Fc"
    );
    assert_eq!(exchange_address("x", "").unwrap(), "/exchanges/x/");
    assert!(queue_address("").is_err());
    assert!(exchange_address("", "q").is_err());
    assert!(exchange_address("amq.default", "q").is_err());
}

/// A scripted broker: SASL PLAIN accepted, open answered (idle-time-out 1 s), then `then`.
fn fake_broker(then: fn(std::net::TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut r = FrameReader::new(s.try_clone().unwrap(), 1 << 16);
        assert_eq!(r.protocol_header().unwrap(), Some(SASL_PROTOCOL_HEADER));
        let mut out = SASL_PROTOCOL_HEADER.to_vec();
        let mech = Value::Described(
            Box::new(Value::Ulong(0x40)),
            Box::new(Value::List(vec![Value::Symbol("PLAIN".into())])),
        );
        put_frame(&mut out, TYPE_SASL, 0, |b| encode_value(&mech, b));
        s.write_all(&out).unwrap();
        r.next_frame().unwrap().expect("sasl-init");
        let outcome = Value::Described(
            Box::new(Value::Ulong(0x44)),
            Box::new(Value::List(vec![Value::Ubyte(0)])),
        );
        let mut out = Vec::new();
        put_frame(&mut out, TYPE_SASL, 0, |b| encode_value(&outcome, b));
        s.write_all(&out).unwrap();
        assert_eq!(r.protocol_header().unwrap(), Some(AMQP_PROTOCOL_HEADER));
        r.next_frame().unwrap().expect("open");
        let open = Performative::Open(Open {
            container_id: "fake".into(),
            max_frame_size: 4096,
            channel_max: 7,
            idle_time_out: Some(1000),
            properties: vec![(
                Value::Symbol("version".into()),
                Value::String("9.9.9".into()),
            )],
            ..Open::default()
        });
        let mut out = AMQP_PROTOCOL_HEADER.to_vec();
        out.extend(frame_of(&open, 0, &[]));
        s.write_all(&out).unwrap();
        then(s);
    });
    port
}

fn fake_options(port: u16) -> ConnectOptions {
    let mut opts = ConnectOptions::new(
        AmqpUrl::parse(&format!("amqp://guest:guest@127.0.0.1:{port}/v")).unwrap(),
    );
    opts.idle_time_out = Duration::from_secs(1);
    opts.rpc_timeout = Duration::from_secs(10);
    opts
}

#[test]
fn a_silent_broker_is_a_lost_connection() {
    let port = fake_broker(|s| {
        // Reads, never answers, never sends a heartbeat.
        let mut s = s;
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
    });
    let conn = Connection::open(&fake_options(port)).expect("open");
    assert_eq!(conn.server_property("version"), Some("9.9.9"));
    assert_eq!(conn.max_frame_size(), 4096);
    let start = Instant::now();
    let err = conn.session().err().expect("no begin comes");
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, Error::Connection(_)), "{err}");
    assert!(
        err.to_string()
            .contains("lost: no frame from the broker for"),
        "{err}"
    );
}

#[test]
fn a_closed_socket_is_a_lost_connection() {
    let port = fake_broker(|s| {
        std::thread::sleep(Duration::from_millis(300));
        drop(s);
    });
    let conn = Connection::open(&fake_options(port)).expect("open");
    let err = conn.session().err().expect("no begin comes");
    assert!(
        err.to_string().contains("connection to 127.0.0.1:")
            && err
                .to_string()
                .contains("lost: the broker closed the socket"),
        "{err}"
    );
}

#[test]
fn a_server_that_is_not_amqp_10_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut b = [0u8; 8];
        let _ = s.read_exact(&mut b);
        let _ = s.write_all(b"AMQP\x00\x00\x09\x01");
    });
    let err = Connection::open(&fake_options(port))
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains("answered with protocol header AMQP 0-0-9-1, not AMQP 1.0 with SASL"),
        "{err}"
    );
}

/// The fuzz target's seeds (fuzz/make_corpus.py) are valid frames whose performatives decode.
#[test]
fn the_fuzz_seeds_decode() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/amqp10_frame");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).expect("seeds") {
        let bytes = std::fs::read(entry.expect("seed").path()).expect("read");
        let mut r = FrameReader::new(Cursor::new(bytes), 1 << 16);
        loop {
            match r.next_frame() {
                Ok(Some(f)) if f.body.is_empty() => {}
                Ok(Some(f)) if f.kind == TYPE_SASL => {
                    decode_sasl(f.body).expect("SASL frame");
                }
                Ok(Some(f)) => {
                    Performative::decode(f.body).expect("performative");
                    seen += 1;
                }
                Err(ReadFail::Eof) => break,
                _ => panic!("a bad seed"),
            }
        }
    }
    assert!(seen >= 10, "{seen}");
}
