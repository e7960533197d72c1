use super::*;
use crate::broker::amqp::types::BasicProperties;

/// Encodes one value, decodes it, encodes again: identical bytes and the expected code.
fn roundtrip_value(v: &FieldValue, code: u8) {
    let mut a = Vec::new();
    put_field_value(&mut a, v).unwrap();
    assert_eq!(a[0], code, "type code of {v:?}");
    let mut d = Decoder::new(&a);
    let back = d.field_value().unwrap();
    assert!(d.is_empty(), "decoder left bytes for {v:?}");
    let mut b = Vec::new();
    put_field_value(&mut b, &back).unwrap();
    assert_eq!(a, b, "re-encoded bytes of {v:?}");
    // NaN != NaN: compare bytes above, values here only when comparable.
    if !matches!(back, FieldValue::F32(x) if x.is_nan())
        && !matches!(back, FieldValue::F64(x) if x.is_nan())
    {
        assert_eq!(&back, v);
    }
}

fn every_value() -> Vec<(FieldValue, u8)> {
    vec![
        (FieldValue::Bool(true), b't'),
        (FieldValue::Bool(false), b't'),
        (FieldValue::I8(-128), b'b'),
        (FieldValue::U8(255), b'B'),
        (FieldValue::I16(-32768), b's'),
        (FieldValue::U16(65535), b'u'),
        (FieldValue::I32(i32::MIN), b'I'),
        (FieldValue::U32(u32::MAX), b'i'),
        (FieldValue::I64(i64::MIN), b'l'),
        (FieldValue::F32(1.5), b'f'),
        (FieldValue::F32(f32::NAN), b'f'),
        (FieldValue::F64(-2.25e300), b'd'),
        (FieldValue::F64(f64::from_bits(0x7ff8_dead_beef_0001)), b'd'),
        (
            FieldValue::Decimal {
                scale: 2,
                value: 12345,
            },
            b'D',
        ),
        (FieldValue::LongString(b"hello".to_vec()), b'S'),
        (FieldValue::LongString(vec![0xff, 0xfe, 0x00, 0xc3]), b'S'),
        (FieldValue::LongString(Vec::new()), b'S'),
        (
            FieldValue::Array(vec![
                FieldValue::I32(1),
                FieldValue::LongString(b"a".to_vec()),
                FieldValue::Void,
            ]),
            b'A',
        ),
        (FieldValue::Array(Vec::new()), b'A'),
        (FieldValue::Timestamp(1_700_000_000), b'T'),
        (
            FieldValue::Table(vec![("k".into(), FieldValue::U8(1))]),
            b'F',
        ),
        (FieldValue::Table(Vec::new()), b'F'),
        (FieldValue::Void, b'V'),
        (FieldValue::Bytes(vec![0, 1, 2, 0xff]), b'x'),
    ]
}

#[test]
fn every_type_code_round_trips() {
    for (v, code) in every_value() {
        roundtrip_value(&v, code);
    }
}

#[test]
fn exact_wire_bytes() {
    let mut b = Vec::new();
    put_field_value(&mut b, &FieldValue::I16(-2)).unwrap();
    assert_eq!(b, [b's', 0xff, 0xfe]);
    b.clear();
    put_field_value(
        &mut b,
        &FieldValue::Decimal {
            scale: 3,
            value: 0x01020304,
        },
    )
    .unwrap();
    assert_eq!(b, [b'D', 3, 1, 2, 3, 4]);
    b.clear();
    put_table(&mut b, &vec![("ab".into(), FieldValue::Bool(true))]).unwrap();
    assert_eq!(b, [0, 0, 0, 5, 2, b'a', b'b', b't', 1]);
}

#[test]
fn nested_tables_and_arrays_round_trip() {
    let inner: FieldTable = every_value()
        .into_iter()
        .enumerate()
        .map(|(i, (v, _))| (format!("k{i}"), v))
        .collect();
    let table: FieldTable = vec![
        ("table".into(), FieldValue::Table(inner.clone())),
        (
            "array".into(),
            FieldValue::Array(vec![
                FieldValue::Table(inner.clone()),
                FieldValue::Array(vec![FieldValue::Array(vec![FieldValue::I64(7)])]),
            ]),
        ),
        ("empty".into(), FieldValue::Table(Vec::new())),
        ("ünïcödé key".into(), FieldValue::Void),
    ];
    let mut a = Vec::new();
    put_table(&mut a, &table).unwrap();
    let back = Decoder::new(&a).table().unwrap();
    let mut b = Vec::new();
    put_table(&mut b, &back).unwrap();
    assert_eq!(a, b);
    assert_eq!(back.len(), 4);
    assert_eq!(back[0].0, "table");
    assert_eq!(back[3].0, "ünïcödé key");
}

#[test]
fn empty_table() {
    let mut a = Vec::new();
    put_table(&mut a, &Vec::new()).unwrap();
    assert_eq!(a, [0, 0, 0, 0]);
    assert_eq!(Decoder::new(&a).table().unwrap(), Vec::new());
}

#[test]
fn non_utf8_key_is_an_error() {
    let bytes = [0, 0, 0, 4, 2, 0xff, 0xfe, b'V'];
    let err = Decoder::new(&bytes).table().unwrap_err();
    assert!(
        matches!(&err, Error::Amqp(m) if m.contains("not valid UTF-8")),
        "{err}"
    );
}

#[test]
fn unknown_type_code_is_an_error() {
    let bytes = [0, 0, 0, 3, 1, b'k', b'Z'];
    let err = Decoder::new(&bytes).table().unwrap_err();
    assert!(err
        .to_string()
        .contains("unknown field value type code 0x5a"));
}

#[test]
fn short_string_too_long_is_an_error() {
    let key = "k".repeat(256);
    let mut b = Vec::new();
    let err = put_table(&mut b, &vec![(key, FieldValue::Void)]).unwrap_err();
    assert!(err.to_string().contains("at most 255"), "{err}");
}

fn all_properties() -> BasicProperties {
    BasicProperties {
        content_type: Some("application/json".into()),
        content_encoding: Some("gzip".into()),
        headers: Some(vec![
            ("x-int".into(), FieldValue::I32(5)),
            ("x-bin".into(), FieldValue::LongString(vec![0x80, 0x81])),
        ]),
        delivery_mode: Some(2),
        priority: Some(9),
        correlation_id: Some("corr".into()),
        reply_to: Some("reply".into()),
        expiration: Some("60000".into()),
        message_id: Some("id-1".into()),
        timestamp: Some(1_700_000_000),
        kind: Some("type".into()),
        user_id: Some("guest".into()),
        app_id: Some("app".into()),
        cluster_id: Some("cluster".into()),
    }
}

#[test]
fn properties_all_and_none() {
    for p in [all_properties(), BasicProperties::default()] {
        let mut a = Vec::new();
        put_properties(&mut a, &p).unwrap();
        let back = decode_properties(&mut Decoder::new(&a)).unwrap();
        assert_eq!(back, p);
        let mut b = Vec::new();
        put_properties(&mut b, &back).unwrap();
        assert_eq!(a, b);
    }
    let mut a = Vec::new();
    put_properties(&mut a, &all_properties()).unwrap();
    assert_eq!(&a[..2], &[0xff, 0xfc], "all 14 flags");
    a.clear();
    put_properties(&mut a, &BasicProperties::default()).unwrap();
    assert_eq!(a, [0, 0]);
}

#[test]
fn each_property_flag_alone() {
    let full = all_properties();
    let singles: Vec<(u16, BasicProperties)> = vec![
        (
            15,
            BasicProperties {
                content_type: full.content_type.clone(),
                ..Default::default()
            },
        ),
        (
            13,
            BasicProperties {
                headers: full.headers.clone(),
                ..Default::default()
            },
        ),
        (
            12,
            BasicProperties {
                delivery_mode: Some(1),
                ..Default::default()
            },
        ),
        (
            6,
            BasicProperties {
                timestamp: Some(5),
                ..Default::default()
            },
        ),
        (
            5,
            BasicProperties {
                kind: Some("t".into()),
                ..Default::default()
            },
        ),
        (
            2,
            BasicProperties {
                cluster_id: Some("c".into()),
                ..Default::default()
            },
        ),
    ];
    for (bitno, p) in singles {
        assert_eq!(property_flags(&p), 1 << bitno);
        let mut a = Vec::new();
        put_properties(&mut a, &p).unwrap();
        assert_eq!(decode_properties(&mut Decoder::new(&a)).unwrap(), p);
    }
}

#[test]
fn non_utf8_property_is_an_error() {
    // content_type flag, short string with invalid UTF-8.
    let bytes = [0x80, 0x00, 2, 0xc3, 0x28];
    let err = decode_properties(&mut Decoder::new(&bytes)).unwrap_err();
    assert!(
        matches!(&err, Error::Amqp(m) if m.contains("content_type property is not valid UTF-8")),
        "{err}"
    );
}

#[test]
fn unknown_property_flags_are_an_error() {
    assert!(decode_properties(&mut Decoder::new(&[0x00, 0x02])).is_err());
    assert!(decode_properties(&mut Decoder::new(&[0x00, 0x01, 0x80, 0x00])).is_err());
    // continuation word with no flags is accepted
    assert_eq!(
        decode_properties(&mut Decoder::new(&[0x00, 0x01, 0x00, 0x00])).unwrap(),
        BasicProperties::default()
    );
}

#[test]
fn truncated_input_errors_without_panic() {
    let table: FieldTable = every_value()
        .into_iter()
        .enumerate()
        .map(|(i, (v, _))| (format!("k{i}"), v))
        .collect();
    let mut p = all_properties();
    p.headers = Some(table);
    let mut a = Vec::new();
    put_properties(&mut a, &p).unwrap();
    for n in 0..a.len() {
        assert!(
            decode_properties(&mut Decoder::new(&a[..n])).is_err(),
            "prefix of {n} bytes decoded"
        );
    }
    // method frames too
    let mut m = Vec::new();
    Method::BasicDeliver {
        consumer_tag: "ctag".into(),
        delivery_tag: 9,
        redelivered: true,
        exchange: b"ex".to_vec(),
        routing_key: b"rk".to_vec(),
    }
    .encode(&mut m)
    .unwrap();
    for n in 0..m.len() {
        assert!(Method::decode(&m[..n]).is_err(), "prefix of {n} bytes");
    }
}

#[test]
fn garbage_lengths_do_not_allocate() {
    // A table claiming 4 GiB, a long string claiming 4 GiB, a body size of 2^63.
    assert!(Decoder::new(&[0xff, 0xff, 0xff, 0xff, 0]).table().is_err());
    let s = [0, 0, 0, 9, 1, b'k', b'S', 0xff, 0xff, 0xff, 0xf0];
    assert!(Decoder::new(&s).table().is_err());
    let x = [b'x', 0xff, 0xff, 0xff, 0xff];
    assert!(Decoder::new(&x).field_value().is_err());
    // A frame header announcing a 4 GiB payload is rejected before any payload is read.
    let f = [FRAME_BODY, 0, 1, 0xff, 0xff, 0xff, 0xff];
    assert!(parse_frame(&f, 131_072).is_err());
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    // 10,000 nested arrays: 'A' + length + ...
    let depth = 10_000usize;
    let mut bytes = Vec::new();
    for i in 0..depth {
        bytes.push(b'A');
        let remaining = (depth - i - 1) * 5;
        bytes.extend_from_slice(&(remaining as u32).to_be_bytes());
    }
    let err = Decoder::new(&bytes).field_value().unwrap_err();
    assert!(err.to_string().contains("nested deeper"), "{err}");
}

#[test]
fn random_garbage_never_panics() {
    // Deterministic xorshift; decode random buffers as tables, properties, methods, frames.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = Decoder::new(&buf).table();
        let _ = Decoder::new(&buf).field_value();
        let _ = decode_properties(&mut Decoder::new(&buf));
        let _ = Method::decode(&buf);
        let _ = decode_content_header(&buf);
        let _ = parse_frame(&buf, 4096);
    }
}

#[test]
fn frames_and_publish_split_across_body_frames() {
    let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let props = all_properties();
    let mut buf = Vec::new();
    put_publish(&mut buf, 7, "ex", "rk", true, &props, &body, 4096).unwrap();
    let mut rest = &buf[..];
    let mut frames = Vec::new();
    while !rest.is_empty() {
        let (f, n) = parse_frame(rest, 4096 - FRAME_OVERHEAD).unwrap().unwrap();
        assert_eq!(f.channel, 7);
        assert!(n <= 4096);
        frames.push((f.kind, f.payload.to_vec()));
        rest = &rest[n..];
    }
    // method + header + ceil(10000 / 4088) = 3 body frames
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[0].0, FRAME_METHOD);
    assert_eq!(
        Method::decode(&frames[0].1).unwrap(),
        Method::BasicPublish {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            mandatory: true,
            immediate: false
        }
    );
    assert_eq!(frames[1].0, FRAME_HEADER);
    let h = decode_content_header(&frames[1].1).unwrap();
    assert_eq!(h.class_id, CLASS_BASIC);
    assert_eq!(h.body_size, 10_000);
    assert_eq!(h.properties.unwrap(), props);
    let joined: Vec<u8> = frames[2..]
        .iter()
        .inspect(|f| assert_eq!(f.0, FRAME_BODY))
        .flat_map(|f| f.1.clone())
        .collect();
    assert_eq!(joined, body);

    // empty body: no body frame
    buf.clear();
    put_publish(
        &mut buf,
        1,
        "",
        "q",
        false,
        &BasicProperties::default(),
        &[],
        4096,
    )
    .unwrap();
    let (_, n1) = parse_frame(&buf, 4096).unwrap().unwrap();
    let (h, n2) = parse_frame(&buf[n1..], 4096).unwrap().unwrap();
    assert_eq!(h.kind, FRAME_HEADER);
    assert_eq!(n1 + n2, buf.len());
}

/// Properties encoded beforehand publish the same bytes as the properties themselves, and
/// refuse what they refuse (a short string over 255 bytes), at encoding.
#[test]
fn encoded_properties_publish_the_same_frames() {
    let body = vec![5u8; 9000];
    for props in [all_properties(), BasicProperties::default()] {
        let (mut direct, mut encoded) = (Vec::new(), Vec::new());
        put_publish(&mut direct, 3, "ex", "rk", true, &props, &body, 4096).unwrap();
        let pre = EncodedProperties::new(&props).unwrap();
        put_publish(&mut encoded, 3, "ex", "rk", true, &pre, &body, 4096).unwrap();
        assert_eq!(direct, encoded);
        let mut flags_and_list = Vec::new();
        put_properties(&mut flags_and_list, &props).unwrap();
        assert_eq!(pre.as_bytes(), flags_and_list.as_slice());
    }
    let too_long = BasicProperties {
        message_id: Some("m".repeat(256)),
        ..Default::default()
    };
    let direct = put_publish(&mut Vec::new(), 1, "", "q", false, &too_long, b"x", 4096);
    let encoded = EncodedProperties::new(&too_long);
    assert_eq!(direct.unwrap_err(), encoded.unwrap_err());
}

#[test]
fn partial_and_bad_frames() {
    let mut buf = Vec::new();
    put_method_frame(&mut buf, 3, &Method::BasicQosOk, 4096).unwrap();
    for n in 0..buf.len() {
        assert!(parse_frame(&buf[..n], 4096).unwrap().is_none());
    }
    let last = buf.len() - 1;
    buf[last] = 0;
    assert!(parse_frame(&buf, 4096).is_err());
    let bad_type = [9u8, 0, 0, 0, 0, 0, 0, FRAME_END];
    assert!(parse_frame(&bad_type, 4096).is_err());
}

#[test]
fn oversized_method_frame_is_an_error() {
    let big: FieldTable = (0..500)
        .map(|i| (format!("key-{i}"), FieldValue::LongString(vec![b'x'; 20])))
        .collect();
    let m = Method::QueueDeclare {
        queue: "q".into(),
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        no_wait: false,
        arguments: big,
    };
    let mut buf = vec![1, 2, 3];
    let err = put_method_frame(&mut buf, 1, &m, 4096).unwrap_err();
    assert!(err.to_string().contains("frame_max"), "{err}");
    assert_eq!(buf, [1, 2, 3], "buffer restored");
}

#[test]
fn methods_round_trip() {
    let t: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )];
    let methods = vec![
        Method::ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: t.clone(),
            mechanisms: b"PLAIN AMQPLAIN".to_vec(),
            locales: b"en_US".to_vec(),
        },
        Method::ConnectionStartOk {
            client_properties: t.clone(),
            mechanism: "PLAIN".into(),
            response: Secret(b"\0u\0p".to_vec()),
            locale: "en_US".into(),
        },
        Method::ConnectionTune {
            channel_max: 2047,
            frame_max: 131072,
            heartbeat: 60,
        },
        Method::ConnectionTuneOk {
            channel_max: 2047,
            frame_max: 131072,
            heartbeat: 30,
        },
        Method::ConnectionOpen { vhost: "/".into() },
        Method::ConnectionOpenOk,
        Method::ConnectionClose {
            reply_code: 320,
            reply_text: "CONNECTION_FORCED".into(),
            class_id: 0,
            method_id: 0,
        },
        Method::ConnectionCloseOk,
        Method::ConnectionBlocked {
            reason: "low on memory".into(),
        },
        Method::ConnectionUnblocked,
        Method::ChannelOpen,
        Method::ChannelOpenOk,
        Method::ChannelFlow { active: true },
        Method::ChannelFlowOk { active: false },
        Method::ChannelClose {
            reply_code: 404,
            reply_text: "NOT_FOUND - no queue 'q' in vhost 'v'".into(),
            class_id: 50,
            method_id: 10,
        },
        Method::ChannelCloseOk,
        Method::ExchangeDeclare {
            exchange: "e".into(),
            kind: "topic".into(),
            passive: false,
            durable: true,
            auto_delete: false,
            internal: true,
            no_wait: false,
            arguments: t.clone(),
        },
        Method::ExchangeDeclareOk,
        Method::ExchangeDelete {
            exchange: "e".into(),
            if_unused: true,
            no_wait: false,
        },
        Method::ExchangeBind {
            destination: "d".into(),
            source: "s".into(),
            routing_key: "#".into(),
            no_wait: false,
            arguments: t.clone(),
        },
        Method::QueueDeclare {
            queue: "q".into(),
            passive: true,
            durable: true,
            exclusive: false,
            auto_delete: true,
            no_wait: false,
            arguments: t.clone(),
        },
        Method::QueueDeclareOk {
            queue: "q".into(),
            message_count: 10,
            consumer_count: 1,
        },
        Method::QueueBind {
            queue: "q".into(),
            exchange: "e".into(),
            routing_key: "k".into(),
            no_wait: false,
            arguments: t.clone(),
        },
        Method::QueuePurge {
            queue: "q".into(),
            no_wait: false,
        },
        Method::QueuePurgeOk { message_count: 3 },
        Method::QueueDelete {
            queue: "q".into(),
            if_unused: false,
            if_empty: true,
            no_wait: false,
        },
        Method::QueueDeleteOk { message_count: 4 },
        Method::QueueUnbind {
            queue: "q".into(),
            exchange: "e".into(),
            routing_key: "k".into(),
            arguments: t.clone(),
        },
        Method::BasicQos {
            prefetch_size: 0,
            prefetch_count: 100,
            global: true,
        },
        Method::BasicConsume {
            queue: "q".into(),
            consumer_tag: "c".into(),
            no_local: false,
            no_ack: true,
            exclusive: true,
            no_wait: false,
            arguments: t.clone(),
        },
        Method::BasicConsumeOk {
            consumer_tag: "c".into(),
        },
        Method::BasicCancel {
            consumer_tag: "c".into(),
            no_wait: true,
        },
        Method::BasicCancelOk {
            consumer_tag: "c".into(),
        },
        Method::BasicReturn {
            reply_code: 312,
            reply_text: b"NO_ROUTE".to_vec(),
            exchange: b"e".to_vec(),
            routing_key: vec![0xff],
        },
        Method::BasicDeliver {
            consumer_tag: "c".into(),
            delivery_tag: u64::MAX,
            redelivered: true,
            exchange: Vec::new(),
            routing_key: b"q".to_vec(),
        },
        Method::BasicGet {
            queue: "q".into(),
            no_ack: true,
        },
        Method::BasicGetOk {
            delivery_tag: 1,
            redelivered: false,
            exchange: Vec::new(),
            routing_key: b"q".to_vec(),
            message_count: 99,
        },
        Method::BasicGetEmpty,
        Method::BasicAck {
            delivery_tag: 5,
            multiple: true,
        },
        Method::BasicReject {
            delivery_tag: 5,
            requeue: true,
        },
        Method::BasicRecover { requeue: true },
        Method::BasicNack {
            delivery_tag: 6,
            multiple: true,
            requeue: true,
        },
        Method::ConfirmSelect { no_wait: false },
        Method::ConfirmSelectOk,
    ];
    for m in methods {
        let mut a = Vec::new();
        m.encode(&mut a).unwrap();
        let back = Method::decode(&a).unwrap();
        assert_eq!(back, m, "{}", m.name());
        let mut b = Vec::new();
        back.encode(&mut b).unwrap();
        assert_eq!(a, b, "{}", m.name());
        assert_ne!(m.name(), "unknown method");
    }
    assert_eq!(
        Method::decode(&[0, 99, 0, 1]).unwrap(),
        Method::Unknown {
            class_id: 99,
            method_id: 1
        }
    );
}

#[test]
fn nack_bits() {
    let mut a = Vec::new();
    Method::BasicNack {
        delivery_tag: 1,
        multiple: false,
        requeue: true,
    }
    .encode(&mut a)
    .unwrap();
    assert_eq!(*a.last().unwrap(), 0b10);
}
