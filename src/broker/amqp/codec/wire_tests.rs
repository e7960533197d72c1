//! [`WireProperties`] against the decoder it must agree with: whatever bytes it accepts,
//! [`decode_properties`] reads whole; whatever that reads whole, it accepts.

use super::wire::WireValue;
use super::*;
use crate::broker::amqp::types::{BasicProperties, FieldValue, WireProperties};

/// Every type code, nested, and each property set.
fn rich() -> BasicProperties {
    let every: Vec<(String, FieldValue)> = vec![
        ("t".into(), FieldValue::Bool(true)),
        ("b".into(), FieldValue::I8(-8)),
        ("B".into(), FieldValue::U8(200)),
        ("s".into(), FieldValue::I16(-16)),
        ("u".into(), FieldValue::U16(60000)),
        ("I".into(), FieldValue::I32(-32)),
        ("i".into(), FieldValue::U32(4_000_000_000)),
        ("l".into(), FieldValue::I64(-64)),
        ("f".into(), FieldValue::F32(1.5)),
        ("d".into(), FieldValue::F64(-2.5)),
        (
            "D".into(),
            FieldValue::Decimal {
                scale: 2,
                value: 314,
            },
        ),
        ("S".into(), FieldValue::LongString(vec![0xff, 0x00, b'a'])),
        ("T".into(), FieldValue::Timestamp(1_700_000_000)),
        ("V".into(), FieldValue::Void),
        ("x".into(), FieldValue::Bytes(vec![1, 2, 3])),
        ("é".into(), FieldValue::LongString(b"utf-8 key".to_vec())),
    ];
    let mut headers = every.clone();
    headers.push(("F".into(), FieldValue::Table(every.clone())));
    headers.push((
        "A".into(),
        FieldValue::Array(every.into_iter().map(|(_, v)| v).collect()),
    ));
    headers.push(("x-delivery-count".into(), FieldValue::I64(3)));
    headers.push(("x-delivery-count".into(), FieldValue::I64(9)));
    BasicProperties {
        content_type: Some("application/json".into()),
        content_encoding: Some("gzip".into()),
        headers: Some(headers),
        delivery_mode: Some(2),
        priority: Some(9),
        correlation_id: Some("corr".into()),
        reply_to: Some("reply".into()),
        expiration: Some("60000".into()),
        message_id: Some("id-1".into()),
        timestamp: Some(u64::MAX),
        kind: Some("type".into()),
        user_id: Some("guest".into()),
        app_id: Some("app".into()),
        cluster_id: Some("cluster".into()),
    }
}

fn encoded(p: &BasicProperties) -> Vec<u8> {
    let mut b = Vec::new();
    put_properties(&mut b, p).unwrap();
    b
}

/// The decoder's verdict on `b`: its properties when it reads every byte.
fn decoded_whole(b: &[u8]) -> Option<BasicProperties> {
    let mut d = Decoder::new(b);
    let p = decode_properties(&mut d).ok()?;
    d.is_empty().then_some(p)
}

fn agrees(b: &[u8]) {
    let wire = WireProperties::new(b.to_vec());
    match (wire, decoded_whole(b)) {
        (Ok(w), Some(p)) => {
            assert_eq!(w.as_bytes(), b);
            // Compared as bytes: a changed byte may make a NaN, which is not equal to itself.
            let back = w.decode().unwrap();
            assert_eq!(
                encoded(&back),
                encoded(&p),
                "{:?}",
                b.escape_ascii().to_string()
            );
        }
        (Err(_), None) => {}
        (w, p) => panic!(
            "checker {:?} but decoder {:?} for {:?}",
            w.map(|_| ()),
            p.map(|_| ()),
            b.escape_ascii().to_string()
        ),
    }
}

#[test]
fn kept_bytes_decode_to_what_the_decoder_reads() {
    let mut cases = vec![rich(), BasicProperties::default()];
    // Each property alone.
    let r = rich();
    let alone: [fn(&BasicProperties, &mut BasicProperties); 14] = [
        |r, p| p.content_type = r.content_type.clone(),
        |r, p| p.content_encoding = r.content_encoding.clone(),
        |r, p| p.headers = r.headers.clone(),
        |r, p| p.delivery_mode = r.delivery_mode,
        |r, p| p.priority = r.priority,
        |r, p| p.correlation_id = r.correlation_id.clone(),
        |r, p| p.reply_to = r.reply_to.clone(),
        |r, p| p.expiration = r.expiration.clone(),
        |r, p| p.message_id = r.message_id.clone(),
        |r, p| p.timestamp = r.timestamp,
        |r, p| p.kind = r.kind.clone(),
        |r, p| p.user_id = r.user_id.clone(),
        |r, p| p.app_id = r.app_id.clone(),
        |r, p| p.cluster_id = r.cluster_id.clone(),
    ];
    for set in alone {
        let mut p = BasicProperties::default();
        set(&r, &mut p);
        cases.push(p);
    }
    cases.push(BasicProperties {
        headers: Some(Vec::new()),
        ..Default::default()
    });
    for p in cases {
        let b = encoded(&p);
        let w = WireProperties::new(b.clone()).unwrap();
        assert_eq!(w.as_bytes(), &b[..]);
        assert_eq!(w.decode().unwrap(), p);
        assert_eq!(WireProperties::encode(&p).unwrap(), w);
    }
}

#[test]
fn every_truncation_and_byte_change_gets_the_decoders_verdict() {
    let b = encoded(&rich());
    for cut in 0..b.len() {
        agrees(&b[..cut]);
        assert!(WireProperties::new(b[..cut].to_vec()).is_err(), "cut {cut}");
    }
    for i in 0..b.len() {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xc3, 0xff, b[i] ^ 0x20] {
            let mut c = b.clone();
            c[i] = v;
            agrees(&c);
        }
    }
    // Bytes after the last property: the decoder stops before them, the checker refuses.
    let mut long = b.clone();
    long.push(0);
    let e = WireProperties::new(long).unwrap_err();
    assert!(
        e.to_string().contains("1 bytes after the last property"),
        "{e}"
    );
}

#[test]
fn random_bytes_get_the_decoders_verdict() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let rich = encoded(&rich());
    for i in 0..50_000 {
        let len = (next() % 48) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 2 == 0 && b.len() >= 2 {
            // Headers only, so that tables are walked, not refused at the flags.
            b[0] = 0x20;
            b[1] = 0;
        }
        if i % 7 == 0 {
            // A valid prefix with a random tail.
            let cut = (next() as usize) % rich.len();
            b = [&rich[..cut], &b[..]].concat();
        }
        agrees(&b);
    }
}

#[test]
fn a_header_is_found_at_the_top_level_only() {
    let w = WireProperties::new(encoded(&rich())).unwrap();
    assert!(
        matches!(w.header("x-delivery-count"), Some(WireValue::I64(3))),
        "the first"
    );
    assert!(matches!(
        w.header("é"),
        Some(WireValue::LongString(b"utf-8 key"))
    ));
    assert!(w.header("absent").is_none());
    let none = WireProperties::new(encoded(&BasicProperties::default())).unwrap();
    assert!(none.header("x-delivery-count").is_none());
    let nested = BasicProperties {
        content_type: Some("c".into()),
        headers: Some(vec![(
            "t".into(),
            FieldValue::Table(vec![("inner".into(), FieldValue::U8(1))]),
        )]),
        ..Default::default()
    };
    let w = WireProperties::new(encoded(&nested)).unwrap();
    assert!(w.header("inner").is_none());
    assert!(matches!(w.header("t"), Some(WireValue::Table(_))));
}

/// The borrowed view gives every property and header of the decoded properties.
#[test]
fn the_view_gives_what_the_decoder_gives() {
    fn owned(v: WireValue<'_>) -> FieldValue {
        match v {
            WireValue::Bool(b) => FieldValue::Bool(b),
            WireValue::I8(n) => FieldValue::I8(n),
            WireValue::U8(n) => FieldValue::U8(n),
            WireValue::I16(n) => FieldValue::I16(n),
            WireValue::U16(n) => FieldValue::U16(n),
            WireValue::I32(n) => FieldValue::I32(n),
            WireValue::U32(n) => FieldValue::U32(n),
            WireValue::I64(n) => FieldValue::I64(n),
            WireValue::F32(f) => FieldValue::F32(f),
            WireValue::F64(f) => FieldValue::F64(f),
            WireValue::Decimal { scale, value } => FieldValue::Decimal { scale, value },
            WireValue::LongString(b) => FieldValue::LongString(b.to_vec()),
            WireValue::Array(a) => FieldValue::Array(a.map(|v| owned(v.unwrap())).collect()),
            WireValue::Timestamp(t) => FieldValue::Timestamp(t),
            WireValue::Table(t) => FieldValue::Table(
                t.map(|e| {
                    let (k, v) = e.unwrap();
                    (k.to_string(), owned(v))
                })
                .collect(),
            ),
            WireValue::Void => FieldValue::Void,
            WireValue::Bytes(b) => FieldValue::Bytes(b.to_vec()),
        }
    }
    let o = |s: Option<&str>| s.map(str::to_string);
    for p in [rich(), BasicProperties::default()] {
        let w = WireProperties::new(encoded(&p)).unwrap();
        let f = w.fields().unwrap();
        let back = BasicProperties {
            content_type: o(f.content_type),
            content_encoding: o(f.content_encoding),
            headers: f.headers.map(|t| match owned(WireValue::Table(t)) {
                FieldValue::Table(t) => t,
                _ => unreachable!(),
            }),
            delivery_mode: f.delivery_mode,
            priority: f.priority,
            correlation_id: o(f.correlation_id),
            reply_to: o(f.reply_to),
            expiration: o(f.expiration),
            message_id: o(f.message_id),
            timestamp: f.timestamp,
            kind: o(f.kind),
            user_id: o(f.user_id),
            app_id: o(f.app_id),
            cluster_id: o(f.cluster_id),
        };
        assert_eq!(encoded(&back), encoded(&p));
    }
}

#[test]
fn deep_nesting_is_refused_as_the_decoder_refuses_it() {
    let mut v = FieldValue::Void;
    for _ in 0..(MAX_NESTING + 2) {
        v = FieldValue::Array(vec![v]);
    }
    // put_properties refuses such a table itself: build its bytes by hand.
    let mut inner = Vec::new();
    fn put(buf: &mut Vec<u8>, v: &FieldValue) {
        match v {
            FieldValue::Array(items) => {
                buf.push(b'A');
                let mut body = Vec::new();
                for i in items {
                    put(&mut body, i);
                }
                buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
                buf.extend_from_slice(&body);
            }
            _ => buf.push(b'V'),
        }
    }
    inner.push(1);
    inner.push(b'k');
    put(&mut inner, &v);
    let mut b = vec![0x20, 0x00];
    b.extend_from_slice(&(inner.len() as u32).to_be_bytes());
    b.extend_from_slice(&inner);
    agrees(&b);
    let e = WireProperties::new(b).unwrap_err();
    assert!(e.to_string().contains("nested deeper"), "{e}");
}

#[test]
fn a_content_header_gives_its_body_size_and_properties() {
    let p = rich();
    let mut payload = vec![0, 60, 0, 0];
    payload.extend_from_slice(&1234u64.to_be_bytes());
    payload.extend_from_slice(&encoded(&p));
    let (size, w) = WireProperties::of_content_header(&payload).unwrap();
    assert_eq!(size, 1234);
    assert_eq!(w.unwrap().decode().unwrap(), p);
    assert!(WireProperties::of_content_header(&payload[..11]).is_err());
    let (_, w) = WireProperties::of_content_header(&payload[..13]).unwrap();
    assert!(w.is_err());
}
