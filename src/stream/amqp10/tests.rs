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

#[test]
fn every_value_encodes_and_decodes_back() {
    let values = vec![
        Value::Null,
        Value::Bool(true),
        Value::Bool(false),
        Value::Ubyte(255),
        Value::Byte(-128),
        Value::Ushort(65_535),
        Value::Short(-1),
        Value::Uint(u32::MAX),
        Value::Int(i32::MIN),
        Value::Ulong(u64::MAX),
        Value::Long(i64::MIN),
        Value::Float(1.25),
        Value::Double(-0.5),
        Value::Decimal(vec![1; 4]),
        Value::Decimal(vec![2; 8]),
        Value::Decimal(vec![3; 16]),
        Value::Char(0x1F600),
        Value::Timestamp(-5),
        Value::Uuid([7; 16]),
        Value::Binary(vec![0, 1, 255]),
        Value::String("héllo".into()),
        Value::InvalidString(vec![0xff, 0xfe]),
        Value::Symbol("sym".into()),
        Value::List(vec![Value::Int(1), Value::String("x".into())]),
        Value::Map(vec![(Value::Symbol("k".into()), Value::Long(2))]),
        Value::Array(vec![Value::Long(1), Value::Long(2)]),
        Value::Described(
            Box::new(Value::Ulong(0x75)),
            Box::new(Value::Binary(vec![9])),
        ),
    ];
    for v in values {
        let mut b = Vec::new();
        encode_value(&v, &mut b);
        assert_eq!(decode_value(&b).unwrap(), (v.clone(), b.len()), "{v:?}");
    }
    let all = Value::List(vec![Value::Map(vec![(Value::Null, Value::Array(vec![]))])]);
    let mut b = Vec::new();
    encode_value(&all, &mut b);
    // An empty array keeps a constructor (null), read back as an empty array.
    assert_eq!(decode_value(&b).unwrap().0, all);
}

#[test]
fn an_encoded_message_decodes_to_the_same_sections() {
    let m = Message {
        properties: vec![
            Value::String("id-1".into()),
            Value::Null,
            Value::Null,
            Value::String("subject".into()),
        ],
        message_annotations: vec![(
            Value::Symbol("x-routing-key".into()),
            Value::String("rk".into()),
        )],
        application_properties: vec![(Value::String("n".into()), Value::Long(3))],
        body: b"payload".to_vec(),
    };
    assert_eq!(decode_message(&encode_message(&m)).unwrap(), m);
}

/// A chunk RabbitMQ 3.10.8 delivered over the stream protocol for one message published over
/// AMQP 0-9-1 (content type, delivery mode 2, priority 3, message id, timestamp, type, app id,
/// expiration, headers s = "text", l = -5, b = true; body "hello"), captured from the broker.
const CAPTURED_CHUNK: &str = "5000000100000001000001a21007421d00000000000000010000000000000000e0e7534d000000ec0000002d00000000000000e8005372c16b0aa30d782d726f7574696e672d6b6579a103636170a30a782d65786368616e6765a100a310782d62617369632d7072696f726974795003a315782d62617369632d64656c69766572792d6d6f64655002a312782d62617369632d65787069726174696f6ea1053630303030005373c0250da1036d2d314040404040a30a746578742f706c61696e4040830000018bcfe56800404040005374c13f0aa10c782d62617369632d74797065a1056f72646572a10e782d62617369632d6170702d6964a10473686f70a10173a10474657874a1016c55fba101625601005375a00568656c6c6f";

#[test]
fn a_captured_chunk_decodes_to_the_published_message() {
    let bytes: Vec<u8> = (0..CAPTURED_CHUNK.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&CAPTURED_CHUNK[i..i + 2], 16).unwrap())
        .collect();
    let chunk = crate::stream::chunk::parse_chunk(&bytes).unwrap();
    assert_eq!(chunk.header.num_records, 1);
    assert_eq!(
        chunk.header.trailer_len, 45,
        "the broker sends the tracking trailer too"
    );
    let m = decode_message(&chunk.messages[0]).unwrap();
    let rec = to_record(
        m,
        Origin {
            stream: "cap",
            vhost: "v",
            offset: 0,
            backed_up_at: 1,
        },
    )
    .unwrap();
    assert_eq!(rec.body, b"hello");
    let p = &rec.properties;
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!((p.delivery_mode, p.priority), (Some(2), Some(3)));
    assert_eq!(p.message_id.as_deref(), Some("m-1"));
    assert_eq!(p.timestamp, Some(1_700_000_000));
    assert_eq!(p.type_field.as_deref(), Some("order"));
    assert_eq!(p.app_id.as_deref(), Some("shop"));
    assert_eq!(p.expiration.as_deref(), Some("60000"));
    assert_eq!(
        (rec.exchange.as_str(), rec.routing_key.as_str()),
        ("", "cap")
    );
    use BackupHeaderValue as H;
    assert_eq!(
        rec.headers,
        vec![
            ("s".to_string(), H::LongString("text".into())),
            ("l".to_string(), H::LongLongInt(-5)),
            ("b".to_string(), H::Bool(true)),
        ]
    );
    // Every truncation of the captured chunk is an error, never a panic.
    for n in 0..bytes.len() - 45 {
        assert!(
            crate::stream::chunk::parse_chunk(&bytes[..n]).is_err(),
            "{n}"
        );
    }
}
