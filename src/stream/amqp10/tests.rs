use super::*;

/// A small AMQP 1.0 encoder for hand-made messages.
fn str8(s: &str) -> Vec<u8> {
    let mut v = vec![0xa1, s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}
fn sym8(s: &str) -> Vec<u8> {
    let mut v = vec![0xa3, s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}
fn vbin8(b: &[u8]) -> Vec<u8> {
    let mut v = vec![0xa0, b.len() as u8];
    v.extend_from_slice(b);
    v
}
fn compound(code: u8, items: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = items.concat();
    if code == 0xc0 || code == 0xc1 {
        let mut v = vec![code, (body.len() + 1) as u8, items.len() as u8];
        v.extend_from_slice(&body);
        v
    } else {
        let mut v = vec![code];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(&(items.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }
}
fn section(code: u8, value: Vec<u8>) -> Vec<u8> {
    let mut v = vec![0x00, 0x53, code];
    v.extend_from_slice(&value);
    v
}

fn sample_message() -> Vec<u8> {
    let null = vec![0x40];
    let mut ts = vec![0x83];
    ts.extend_from_slice(&1_700_000_123_456i64.to_be_bytes());
    let properties = compound(
        0xc0,
        &[
            str8("m-1"),        // message-id
            vbin8(b"guest"),    // user-id
            null.clone(),       // to
            null.clone(),       // subject
            str8("replies"),    // reply-to
            str8("corr-9"),     // correlation-id
            sym8("text/plain"), // content-type
            sym8("gzip"),       // content-encoding
            null.clone(),       // absolute-expiry-time
            ts,                 // creation-time
        ],
    );
    let annotations = compound(
        0xc1,
        &[
            sym8("x-basic-priority"),
            vec![0x50, 7],
            sym8("x-basic-delivery-mode"),
            vec![0x50, 2],
            sym8("x-basic-expiration"),
            str8("60000"),
            sym8("x-exchange"),
            str8("amq.direct"),
            sym8("x-routing-key"),
            str8("rk"),
        ],
    );
    let mut long = vec![0x81];
    long.extend_from_slice(&(-5i64).to_be_bytes());
    let mut hts = vec![0x83];
    hts.extend_from_slice(&1_600_000_000_000i64.to_be_bytes());
    let app = compound(
        0xd1,
        &[
            str8("x-basic-type"),
            str8("order"),
            str8("x-basic-app-id"),
            str8("shop"),
            str8("s"),
            str8("text"),
            str8("l"),
            long,
            str8("i"),
            vec![0x54, 0xfe],
            str8("u"),
            vec![0x52, 9],
            str8("b"),
            vec![0x41],
            str8("t"),
            hts,
            str8("x"),
            vbin8(&[0, 255]),
            str8("v"),
            vec![0x40],
            str8("d"),
            {
                let mut d = vec![0x82];
                d.extend_from_slice(&1.5f64.to_be_bytes());
                d
            },
        ],
    );
    let mut header = section(0x70, compound(0xc0, &[vec![0x41]]));
    header.extend(section(0x72, annotations));
    header.extend(section(0x73, properties));
    header.extend(section(0x74, app));
    header.extend(section(0x75, vbin8(b"hello ")));
    header.extend(section(0x75, vbin8(b"world")));
    header
}

#[test]
fn a_message_maps_to_the_record_a_0_9_1_reader_would_see() {
    let m = decode_message(&sample_message()).unwrap();
    let rec = to_record(
        m,
        Origin {
            stream: "events",
            vhost: "/",
            offset: 41,
            backed_up_at: 5,
        },
    )
    .unwrap();
    assert_eq!(rec.body, b"hello world");
    let p = &rec.properties;
    assert_eq!(p.message_id.as_deref(), Some("m-1"));
    assert_eq!(p.user_id.as_deref(), Some("guest"));
    assert_eq!(p.reply_to.as_deref(), Some("replies"));
    assert_eq!(p.correlation_id.as_deref(), Some("corr-9"));
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!(p.content_encoding.as_deref(), Some("gzip"));
    assert_eq!(p.timestamp, Some(1_700_000_123));
    assert_eq!(p.priority, Some(7));
    assert_eq!(p.delivery_mode, Some(2));
    assert_eq!(p.expiration.as_deref(), Some("60000"));
    assert_eq!(p.type_field.as_deref(), Some("order"));
    assert_eq!(p.app_id.as_deref(), Some("shop"));
    assert_eq!(
        (rec.exchange.as_str(), rec.routing_key.as_str()),
        ("amq.direct", "rk")
    );
    assert_eq!(rec.delivery_tag, 42);
    assert_eq!(rec.source_queue, "events");
    use BackupHeaderValue as H;
    assert_eq!(
        rec.headers,
        vec![
            ("s".to_string(), H::LongString("text".into())),
            ("l".to_string(), H::LongLongInt(-5)),
            ("i".to_string(), H::LongInt(-2)),
            ("u".to_string(), H::LongUInt(9)),
            ("b".to_string(), H::Bool(true)),
            ("t".to_string(), H::Timestamp(1_600_000_000)),
            ("x".to_string(), H::Bytes(vec![0, 255])),
            ("v".to_string(), H::Void),
            ("d".to_string(), H::Double(1.5)),
        ]
    );
}

#[test]
fn every_scalar_type_decodes() {
    let cases: Vec<(Vec<u8>, Value)> = vec![
        (vec![0x40], Value::Null),
        (vec![0x56, 1], Value::Bool(true)),
        (vec![0x42], Value::Bool(false)),
        (vec![0x50, 200], Value::Ubyte(200)),
        (vec![0x51, 0xff], Value::Byte(-1)),
        (vec![0x60, 1, 0], Value::Ushort(256)),
        (vec![0x61, 0xff, 0xfe], Value::Short(-2)),
        (vec![0x70, 0, 0, 1, 0], Value::Uint(256)),
        (vec![0x43], Value::Uint(0)),
        (vec![0x53, 7], Value::Ulong(7)),
        (vec![0x44], Value::Ulong(0)),
        (vec![0x55, 0xff], Value::Long(-1)),
        (vec![0x73, 0, 0, 0, 65], Value::Char(65)),
        (vec![0x74, 1, 2, 3, 4], Value::Decimal(vec![1, 2, 3, 4])),
        (
            vec![0xb1, 0, 0, 0, 2, b'h', b'i'],
            Value::String("hi".into()),
        ),
        (vec![0xb3, 0, 0, 0, 1, b'k'], Value::Symbol("k".into())),
        (vec![0x45], Value::List(vec![])),
        // array8 of two smallints.
        (
            vec![0xe0, 4, 2, 0x54, 1, 2],
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
        ),
    ];
    for (bytes, want) in cases {
        let (v, n) = decode_value(&bytes).unwrap();
        assert_eq!((v, n), (want, bytes.len()), "{bytes:?}");
    }
    let mut uuid = vec![0x98];
    uuid.extend_from_slice(&[0x11; 16]);
    assert_eq!(decode_value(&uuid).unwrap().0, Value::Uuid([0x11; 16]));
}

#[test]
fn bodies_a_record_cannot_carry_are_errors() {
    let seq = section(0x76, compound(0xc0, &[vec![0x41]]));
    assert!(decode_message(&seq)
        .unwrap_err()
        .to_string()
        .contains("amqp-sequence"));
    let value = section(0x77, compound(0xc0, &[vec![0x41]]));
    let e = decode_message(&value).unwrap_err().to_string();
    assert!(e.contains("amqp-value body of list"), "{e}");
    // An amqp-value string or binary is the body.
    let m = decode_message(&section(0x77, str8("plain"))).unwrap();
    assert_eq!(m.body, b"plain");
}

#[test]
fn a_header_without_a_0_9_1_form_names_the_offset() {
    let app = compound(0xc1, &[str8("nested"), compound(0xc0, &[vec![0x41]])]);
    let m = decode_message(&section(0x74, app)).unwrap();
    let e = to_record(
        m,
        Origin {
            stream: "s1",
            vhost: "v",
            offset: 7,
            backed_up_at: 0,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("Serialization error: stream s1 in vhost v, offset 7: header nested:"),
        "{e}"
    );
}

#[test]
fn truncated_and_garbage_input_is_an_error_never_a_panic() {
    let good = sample_message();
    for n in 0..good.len() {
        let _ = decode_message(&good[..n]);
    }
    assert!(decode_message(&good[..good.len() - 1]).is_err());
    // A list announcing more elements than bytes; nesting beyond the limit.
    assert!(decode_value(&[0xd0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0]).is_err());
    let deep: Vec<u8> = std::iter::repeat_n(0x00u8, 10_000).collect();
    assert!(decode_value(&deep).is_err());
    assert!(decode_value(&[0xff])
        .unwrap_err()
        .to_string()
        .contains("unknown format code 0xff"));
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for len in [1usize, 3, 8, 40, 300] {
        for _ in 0..500 {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode_message(&b);
        }
    }
}
