use super::*;
use crate::repository::record::{BackupHeaderValue, BackupRecord};

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
    ts.extend_from_slice(&1_700_000_123_000i64.to_be_bytes());
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
            {
                let mut v = vec![0x71];
                v.extend_from_slice(&(-2i32).to_be_bytes());
                v
            },
            str8("u"),
            vec![0x70, 0, 0, 0, 9],
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
    let mut m = section(0x72, annotations);
    m.extend(section(0x73, properties));
    m.extend(section(0x74, app));
    m.extend(section(0x75, vbin8(b"hello world")));
    m
}

fn at(offset: u64) -> Origin<'static> {
    Origin {
        conversion: Conversion::MsgRecord,
        stream: "events",
        vhost: "/",
        offset,
        backed_up_at: 5,
    }
}

/// The record of `bytes`, which must be mapped (not stored whole).
fn mapped(bytes: &[u8]) -> BackupRecord {
    let (rec, raw) = to_record(bytes, at(41));
    assert_eq!(raw, None, "stored whole");
    rec
}

/// Why `bytes` is stored whole; its record holds them, unchanged.
fn stored_whole(bytes: &[u8]) -> String {
    let (rec, raw) = to_record(bytes, at(9));
    let why = raw.expect("mapped, not stored whole");
    assert_eq!(rec.body, bytes);
    assert_eq!(
        rec.headers,
        vec![(
            RAW_BODY_HEADER.to_string(),
            BackupHeaderValue::LongString(RAW_BODY_VALUE.into())
        )]
    );
    assert_eq!(
        rec.properties,
        crate::repository::record::BackupProperties::default()
    );
    assert_eq!((rec.delivery_tag, rec.exchange.as_str()), (9, ""));
    why
}

#[test]
fn a_message_maps_to_the_record_a_0_9_1_reader_would_see() {
    let rec = mapped(&sample_message());
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
    // SPEC.md "Segment file": a stream record's routing is empty, its tag is the offset.
    assert_eq!((rec.exchange.as_str(), rec.routing_key.as_str()), ("", ""));
    assert_eq!(rec.delivery_tag, 41);
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
            Value::Array(None, vec![Value::Int(1), Value::Int(2)]),
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
fn messages_a_record_cannot_carry_are_stored_whole() {
    let data = section(0x75, vbin8(b"x"));
    let with = |extra: Vec<u8>| {
        let mut m = extra;
        m.extend_from_slice(&data);
        m
    };
    let props = |fields: Vec<Vec<u8>>| section(0x73, compound(0xc0, &fields));
    let app = |k: Vec<u8>, v: Vec<u8>| section(0x74, compound(0xc1, &[k, v]));
    let mut ulong = vec![0x80];
    ulong.extend_from_slice(&7u64.to_be_bytes());
    let mut ms = vec![0x83];
    ms.extend_from_slice(&1_700_000_000_123i64.to_be_bytes());
    let null = vec![0x40];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            section(0x77, compound(0xc0, &[vec![0x41]])),
            "an amqp-value body",
        ),
        (section(0x77, str8("plain")), "an amqp-value body"),
        (
            section(0x76, compound(0xc0, &[vec![0x41]])),
            "an amqp-sequence body",
        ),
        (with(section(0x75, vbin8(b"y"))), "a second data section"),
        (props(vec![str8("id")]), "no data section"),
        (Vec::new(), "no data section"),
        (
            with(section(0x70, compound(0xc0, &[vec![0x41]]))),
            "a header section",
        ),
        (
            with(section(0x71, compound(0xc1, &[]))),
            "delivery annotations",
        ),
        (with(section(0x78, compound(0xc1, &[]))), "a footer"),
        (
            with(props(vec![
                null.clone(),
                null.clone(),
                null.clone(),
                str8("subj"),
            ])),
            "the subject property is set",
        ),
        (with(props(vec![ulong.clone()])), "message-id is a ulong"),
        (
            with(section(
                0x73,
                compound(
                    0xd0,
                    &[{
                        let mut v = vec![0xb1];
                        v.extend_from_slice(&256u32.to_be_bytes());
                        v.extend_from_slice(&[b'm'; 256]);
                        v
                    }],
                ),
            )),
            "message-id is a string of 256 bytes",
        ),
        (
            with(props(vec![null.clone(); 14])),
            "a properties list of 14 fields",
        ),
        (
            with(props(vec![
                null.clone(),
                null.clone(),
                null.clone(),
                null.clone(),
                null.clone(),
                null.clone(),
                str8("text/plain"),
            ])),
            "content-type is a string",
        ),
        (
            with(props(
                vec![null.clone(); 9].into_iter().chain([ms]).collect(),
            )),
            "creation-time 1700000000123 ms is not whole seconds",
        ),
        (
            with(app(str8("h"), sym8("s"))),
            "header h: an application property of type symbol",
        ),
        (
            with(app(str8("h"), ulong)),
            "header h: an application property of type ulong",
        ),
        (
            with(app(sym8("k"), str8("v"))),
            "an application property key is a symbol",
        ),
        (
            with(app(str8("h"), compound(0xc0, &[vec![0x41]]))),
            "header h: an application property of type list",
        ),
        (
            with(section(
                0x72,
                compound(0xc1, &[sym8("x-opt-other"), str8("v")]),
            )),
            "message annotation x-opt-other",
        ),
        (
            vec![0xff, 0x00],
            "Invalid AMQP 1.0 message: a section is not a described value",
        ),
    ];
    for (bytes, want) in cases {
        let why = stored_whole(&bytes);
        assert!(why.starts_with(want), "{want:?}: {why}");
    }
    // A data section alone is the body.
    assert_eq!(mapped(&data).body, b"x");
}

/// A 6 KB message of issue 20: an array of 6,000 nulls described by a list of 6,000 nulls, as
/// an amqp-value body. Held once, its descriptor costs its own size, not 6,000 copies.
#[test]
fn a_described_array_costs_its_size_not_its_elements_times_its_descriptor() {
    let n = 6_000usize;
    let descriptor = compound(0xd0, &vec![vec![0x40]; n]);
    let mut body = vec![0x00];
    body.extend_from_slice(&descriptor);
    body.push(0x40);
    // array32: size, count, then the constructor and zero-width elements.
    let mut array = vec![0xf0];
    array.extend_from_slice(&((body.len() + 4 + n) as u32).to_be_bytes());
    array.extend_from_slice(&(n as u32).to_be_bytes());
    array.extend_from_slice(&body);
    array.extend(std::iter::repeat_n(0u8, n)); // room the count demands, unread
    let (v, _) = decode_value(&array).unwrap();
    match v {
        Value::Array(Some(d), items) => {
            assert_eq!(items.len(), n);
            assert!(matches!(*d, Value::List(ref l) if l.len() == n));
        }
        other => panic!("{other:?}"),
    }
    // As an amqp-value body it is not even decoded: the message is stored whole.
    let message = section(0x77, array);
    let t = std::time::Instant::now();
    assert_eq!(stored_whole(&message), "an amqp-value body");
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
}

#[test]
fn zero_width_elements_cannot_outnumber_the_bytes() {
    // An array of nulls announcing more elements than its bytes.
    let mut a = vec![0xf0];
    a.extend_from_slice(&9u32.to_be_bytes());
    a.extend_from_slice(&100u32.to_be_bytes());
    a.extend_from_slice(&[0x40, 0, 0, 0, 0]);
    let e = decode_value(&a).unwrap_err().to_string();
    assert!(e.contains("100 elements announced in 5 bytes"), "{e}");
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
        Value::Array(None, vec![Value::Long(1), Value::Long(2)]),
        Value::Array(
            Some(Box::new(Value::Symbol("d".into()))),
            vec![Value::Long(1), Value::Long(2)],
        ),
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
    let all = Value::List(vec![Value::Map(vec![(
        Value::Null,
        Value::Array(None, vec![]),
    )])]);
    let mut b = Vec::new();
    encode_value(&all, &mut b);
    // An empty array keeps a constructor (null), read back as an empty array.
    assert_eq!(decode_value(&b).unwrap().0, all);
}

/// Found with the fuzz target `amqp10_value` (decoded values re-encoded): an array of booleans
/// was written with the first element's constructor, `true` (0x41) or `false` (0x42), which carry no value, so
/// `[true, false]` read back as `[true, true]`.
#[test]
fn an_array_of_booleans_keeps_each_value() {
    let v = Value::Array(None, vec![Value::Bool(true), Value::Bool(false)]);
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    assert_eq!(b, [0xf0, 0, 0, 0, 7, 0, 0, 0, 2, 0x56, 1, 0]);
    assert_eq!(decode_value(&b).unwrap(), (v, b.len()));
    // As the fuzzer found it: an array8 of two booleans (0x56), re-encoded and read back.
    let (v, _) = decode_value(&[0xe0, 4, 2, 0x56, 0, 1]).unwrap();
    assert_eq!(
        v,
        Value::Array(None, vec![Value::Bool(false), Value::Bool(true)])
    );
    let mut b = Vec::new();
    encode_value(&v, &mut b);
    assert_eq!(decode_value(&b).unwrap().0, v);
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
        header: None,
        not_carried: None,
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
    let chunk = crate::broker::stream::chunk::parse_chunk(&bytes).unwrap();
    assert_eq!(chunk.header.num_records, 1);
    assert_eq!(
        chunk.header.trailer_len, 45,
        "the broker sends the tracking trailer too"
    );
    let message = chunk.messages().next().unwrap().unwrap();
    let (rec, raw) = to_record(
        &message,
        Origin {
            conversion: Conversion::MsgRecord,
            stream: "cap",
            vhost: "v",
            offset: 0,
            backed_up_at: 1,
        },
    );
    assert_eq!(raw, None, "what RabbitMQ wrote for a 0-9-1 publisher maps");
    assert_eq!(rec.body, b"hello");
    let p = &rec.properties;
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!((p.delivery_mode, p.priority), (Some(2), Some(3)));
    assert_eq!(p.message_id.as_deref(), Some("m-1"));
    assert_eq!(p.timestamp, Some(1_700_000_000));
    assert_eq!(p.type_field.as_deref(), Some("order"));
    assert_eq!(p.app_id.as_deref(), Some("shop"));
    assert_eq!(p.expiration.as_deref(), Some("60000"));
    assert_eq!((rec.exchange.as_str(), rec.routing_key.as_str()), ("", ""));
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
        let whole = crate::broker::stream::chunk::parse_chunk(&bytes[..n])
            .and_then(|c| c.messages().collect::<Result<Vec<_>>>());
        assert!(whole.is_err(), "{n}");
    }
}
