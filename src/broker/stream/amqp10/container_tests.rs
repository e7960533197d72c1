//! The mapping of RabbitMQ 3.13+ messages (`super::container`) on messages captured from real
//! streams: each fixture is the bytes a stream held for a message published over AMQP 0-9-1
//! (read over the stream protocol on 4.3.6 and 4.0.5, 2026-11; published to the default
//! exchange, routing key `s`).

use super::*;
use crate::repository::record::{BackupHeaderValue as H, BackupProperties};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// 4.3.6: Published with no properties (delivery mode absent): header `[false, null, null, true, 0]`.
const NO_PROPERTIES: &str = concat!(
    "005370c006054240404143005372c12104a30d782d726f7574696e672d6b6579a10173a30a782d6578636861",
    "6e6765a100005375a0046e6f6e65",
);

/// 4.3.6: Published with delivery mode 2 only: header `[true, null, null, true, 0]`.
const PERSISTENT: &str = concat!(
    "005370c006054140404143005372c12104a30d782d726f7574696e672d6b6579a10173a30a782d6578636861",
    "6e6765a100005375a003646d32",
);

/// 4.3.6: Published with priority 0 and expiration "0": header `[false, 0, 0, true, 0]`.
const PRIORITY_0_TTL_0: &str = concat!(
    "005370c00705425000434143005372c12104a30d782d726f7574696e672d6b6579a10173a30a782d65786368",
    "616e6765a100005375a0027030",
);

/// 4.3.6: Published with every property (delivery mode 2, priority 5, expiration 86400000, reply-to
/// "replies q/1", type, app-id, user-id guest, cluster-id, timestamp 1700000001) and the headers
/// zeta (S), alpha (l), x-custom (S), x-num (I), bytes (x), not-utf8 (S, not UTF-8), ts (T),
/// void (V), arr (A), tab (F), x-arr (A), x-tab (F).
const EVERY_PROPERTY: &str = concat!(
    "005370c00b054150057005265c004143005372c16c0ea30d782d726f7574696e672d6b6579a10173a30a782d",
    "65786368616e6765a100a30c782d62617369632d74797065a106742e74797065a308782d637573746f6da102",
    "7863a305782d6e756d54fda305782d617272c006025401a10173a305782d746162c10602a3016b5503005373",
    "c0570ba1056d73672d31a00567756573744040a1172f7175657565732f7265706c6965732532307125324631",
    "a104636f7272a3106170706c69636174696f6e2f6a736f6ea304677a697040830000018bcfe56be8a1036170",
    "70005374c1420ca1047a657461a1017aa105616c7068615507a1056279746573a0030001ffa1086e6f742d75",
    "746638a003ff0061a1027473830000018bcfe56800a104766f696440005375a003616c6c",
);

/// 4.3.6: Published with message-id and correlation-id `urn:uuid:...` and an empty header table.
const UUID_IDS: &str = concat!(
    "005370c006054240404143005372c12104a30d782d726f7574696e672d6b6579a10173a30a782d6578636861",
    "6e6765a100005373c02706986ba7b8109dad11d180b400c04fd430c840404040986ba7b8119dad11d180b400",
    "c04fd430c8005375a00475756964",
);

/// 4.3.6: Published with the header CC = ["other"].
const CC: &str = concat!(
    "005370c006054240404143005372c13106a30d782d726f7574696e672d6b6579a10173a30a782d6578636861",
    "6e6765a100a304782d6363c00801a1056f74686572005375a0026363",
);

/// 4.0.5: the message of [`EVERY_PROPERTY`]: reply-to stored as it is, the stream's own
/// annotations last.
const EVERY_PROPERTY_4_0: &str = concat!(
    "005370c00b054150057005265c004143005372c16c0ea30c782d62617369632d74797065a106742e74797065",
    "a308782d637573746f6da1027863a305782d6e756d54fda305782d617272c006025401a10173a305782d7461",
    "62c10602a3016b5503a30a782d65786368616e6765a100a30d782d726f7574696e672d6b6579a10173005373",
    "c04d0da1056d73672d31a00567756573744040a10b7265706c69657320712f31a104636f7272a3106170706c",
    "69636174696f6e2f6a736f6ea304677a697040830000018bcfe56be8a1036170704040005374c1420ca1047a",
    "657461a1017aa105616c7068615507a1056279746573a0030001ffa1086e6f742d75746638a003ff0061a102",
    "7473830000018bcfe56800a104766f696440005375a003616c6c",
);

fn origin(conversion: Conversion) -> Origin<'static> {
    Origin {
        conversion,
        stream: "s",
        vhost: "v",
        offset: 7,
        backed_up_at: 1,
    }
}

/// The record of `hex_bytes` on a 4.2+ broker, which must be mapped.
fn mapped(hex_bytes: &str) -> (BackupProperties, Vec<(String, H)>, Vec<u8>) {
    let (r, raw) = to_record(&hex(hex_bytes), origin(Conversion::ContainerQueueAddresses));
    assert_eq!(raw, None, "mapped");
    assert_eq!((r.delivery_tag, r.exchange.as_str()), (7, ""));
    (r.properties, r.headers, r.body)
}

/// Why the message `m` is stored whole on a 4.2+ broker.
fn stored_whole(m: &Message) -> String {
    let bytes = encode_message(m);
    let (r, raw) = to_record(&bytes, origin(Conversion::ContainerQueueAddresses));
    assert_eq!(r.body, bytes, "the record holds the bytes");
    assert_eq!(
        r.headers,
        vec![(RAW_BODY_HEADER.into(), H::LongString(RAW_BODY_VALUE.into()))]
    );
    raw.expect("stored whole")
}

#[test]
fn the_header_section_gives_delivery_mode_priority_and_expiration() {
    let (p, h, body) = mapped(NO_PROPERTIES);
    // durable false: no delivery mode, as it was published (a 4.x consumer is given 1).
    assert_eq!(p, BackupProperties::default());
    assert_eq!((h, body), (vec![], b"none".to_vec()));
    let (p, _, _) = mapped(PERSISTENT);
    assert_eq!(
        p,
        BackupProperties {
            delivery_mode: Some(2),
            ..Default::default()
        }
    );
    let (p, _, _) = mapped(PRIORITY_0_TTL_0);
    assert_eq!(
        (p.delivery_mode, p.priority, p.expiration.as_deref()),
        (None, Some(0), Some("0"))
    );
}

#[test]
fn every_property_and_header_maps_as_a_0_9_1_consumer_is_given_them() {
    let want = BackupProperties {
        content_type: Some("application/json".into()),
        content_encoding: Some("gzip".into()),
        delivery_mode: Some(2),
        priority: Some(5),
        correlation_id: Some("corr".into()),
        reply_to: Some("replies q/1".into()),
        expiration: Some("86400000".into()),
        message_id: Some("msg-1".into()),
        timestamp: Some(1_700_000_001),
        type_field: Some("t.type".into()),
        user_id: Some("guest".into()),
        app_id: Some("app".into()),
        // The broker drops cluster-id; it drops the tables and arrays of non-x- headers.
        cluster_id: None,
    };
    let headers = || {
        let x = vec![
            ("x-custom".to_string(), H::LongString("xc".into())),
            ("x-num".to_string(), H::LongInt(-3)),
            (
                "x-arr".to_string(),
                H::Array(vec![H::LongInt(1), H::LongString("s".into())]),
            ),
            (
                "x-tab".to_string(),
                H::Table(vec![("k".into(), H::LongLongInt(3))]),
            ),
        ];
        let rest = vec![
            ("zeta".to_string(), H::LongString("z".into())),
            ("alpha".to_string(), H::LongLongInt(7)),
            // A byte array is stored as binary, given back as a long string.
            ("bytes".to_string(), H::LongStringBytes(vec![0, 1, 255])),
            ("not-utf8".to_string(), H::LongStringBytes(vec![255, 0, 97])),
            ("ts".to_string(), H::Timestamp(1_700_000_000)),
            ("void".to_string(), H::Void),
        ];
        [x, rest].concat()
    };
    let (p, h, body) = mapped(EVERY_PROPERTY);
    assert_eq!(p, want);
    assert_eq!(h, headers());
    assert_eq!(body, b"all");
    // 4.0 stores the reply-to as it is: the same record.
    let (r, raw) = to_record(&hex(EVERY_PROPERTY_4_0), origin(Conversion::Container));
    assert_eq!(raw, None);
    assert_eq!((r.properties, r.headers), (want, headers()));
}

#[test]
fn uuid_ids_and_cc_map_back_to_their_0_9_1_strings() {
    let (p, h, _) = mapped(UUID_IDS);
    assert_eq!(
        p.message_id.as_deref(),
        Some("urn:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    );
    assert_eq!(
        p.correlation_id.as_deref(),
        Some("urn:uuid:6ba7b811-9dad-11d1-80b4-00c04fd430c8")
    );
    assert_eq!(h, vec![]);
    let (_, h, _) = mapped(CC);
    assert_eq!(
        h,
        vec![(
            "CC".to_string(),
            H::Array(vec![H::LongString("other".into())])
        )]
    );
}

#[test]
fn the_broker_version_decides_the_mapping() {
    assert_eq!(Conversion::of_version("3.10.8"), Conversion::MsgRecord);
    assert_eq!(Conversion::of_version("3.12.14"), Conversion::MsgRecord);
    assert_eq!(Conversion::of_version("3.13.7"), Conversion::Container);
    assert_eq!(Conversion::of_version("4.0.5"), Conversion::Container);
    assert_eq!(Conversion::of_version("4.1.8"), Conversion::Container);
    assert_eq!(
        Conversion::of_version("4.2.0-rc.1"),
        Conversion::ContainerQueueAddresses
    );
    assert_eq!(
        Conversion::of_version("4.3.6"),
        Conversion::ContainerQueueAddresses
    );
    assert_eq!(
        Conversion::of_version(""),
        Conversion::ContainerQueueAddresses
    );
    // Before 3.13 a header section is not what the broker's conversion writes: stored whole.
    let (r, raw) = to_record(&hex(PERSISTENT), origin(Conversion::MsgRecord));
    assert_eq!(raw.as_deref(), Some("a header section"));
    assert_eq!(r.body, hex(PERSISTENT));
    // On 4.0 a reply-to `/queues/...` is given to a consumer as it is; on 4.2+ decoded.
    let m = Message {
        properties: vec![
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::String("/queues/a%20b".into()),
        ],
        body: b"x".to_vec(),
        ..Default::default()
    };
    let bytes = encode_message(&m);
    let reply_to = |c| to_record(&bytes, origin(c)).0.properties.reply_to;
    assert_eq!(
        reply_to(Conversion::Container).as_deref(),
        Some("/queues/a%20b")
    );
    assert_eq!(
        reply_to(Conversion::ContainerQueueAddresses).as_deref(),
        Some("a b")
    );
}

#[test]
fn a_message_without_a_header_is_durable_before_4_2_and_transient_since() {
    let m = Message {
        properties: vec![Value::String("m".into())],
        body: b"b".to_vec(),
        ..Default::default()
    };
    let bytes = encode_message(&m);
    let mode = |c| {
        let (r, raw) = to_record(&bytes, origin(c));
        assert_eq!(raw, None);
        r.properties.delivery_mode
    };
    // Measured: a 0-9-1 consumer of 4.0.5 is given 2, one of 4.3.6 none.
    assert_eq!(mode(Conversion::Container), Some(2));
    assert_eq!(mode(Conversion::ContainerQueueAddresses), None);
    assert_eq!(mode(Conversion::MsgRecord), None);
}

#[test]
fn broker_delivery_state_is_not_content() {
    // first-acquirer false, delivery-count 3 (an AMQP 1.0 publisher's): the same record.
    let m = Message {
        header: Some(vec![
            Value::Bool(true),
            Value::Null,
            Value::Null,
            Value::Bool(false),
            Value::Uint(3),
        ]),
        body: b"b".to_vec(),
        ..Default::default()
    };
    let (r, raw) = to_record(
        &encode_message(&m),
        origin(Conversion::ContainerQueueAddresses),
    );
    assert_eq!(raw, None);
    assert_eq!(r.properties.delivery_mode, Some(2));
    assert_eq!(r.headers, vec![]);
}

#[test]
fn what_the_broker_would_store_back_otherwise_is_stored_whole() {
    let s = |t: &str| Value::String(t.into());
    let sym = |t: &str| Value::Symbol(t.into());
    let base = || Message {
        header: Some(vec![Value::Bool(false)]),
        body: b"b".to_vec(),
        ..Default::default()
    };
    let with_ma = |k: &str, v: Value| Message {
        message_annotations: vec![(sym(k), v)],
        ..base()
    };
    let with_ap = |k: &str, v: Value| Message {
        application_properties: vec![(s(k), v)],
        ..base()
    };
    let with_prop = |i: usize, v: Value| {
        let mut properties = vec![Value::Null; i + 1];
        properties[i] = v;
        Message {
            properties,
            ..base()
        }
    };
    let cases: Vec<(Message, &str)> = vec![
        (
            Message {
                header: Some(vec![Value::Ubyte(1)]),
                ..base()
            },
            "header durable is a ubyte",
        ),
        (
            Message {
                header: Some(vec![Value::Null; 6]),
                ..base()
            },
            "a header section of 6 fields",
        ),
        (
            Message {
                header: Some(vec![Value::Null, Value::Null, Value::Ulong(5)]),
                ..base()
            },
            "header ttl is a ulong",
        ),
        (
            with_ma("x-basic-delivery-mode", Value::Ubyte(2)),
            "message annotation x-basic-delivery-mode",
        ),
        (
            with_ma("x-opt-rabbitmq-received-time", Value::Timestamp(1000)),
            "message annotation x-opt-rabbitmq-received-time",
        ),
        (with_ma("other", s("v")), "message annotation other"),
        (
            with_ma("x-sym", sym("v")),
            "message annotation x-sym: a symbol has no 0-9-1 header the broker stores back as it",
        ),
        (
            with_ma("x-big", Value::Ulong(1)),
            "message annotation x-big: a ulong has no 0-9-1 header the broker stores back as it",
        ),
        (
            with_ap("x-in-ap", s("v")),
            "application property x-in-ap (the broker stores an x- header as a message annotation)",
        ),
        (
            with_ap("nul", s("a\0b")),
            "header nul: a string of 3 bytes the broker would store back as binary (NUL, or over 4096 bytes)",
        ),
        (
            with_ap("list", Value::List(vec![])),
            "header list: a list has no 0-9-1 header the broker stores back as it",
        ),
        (
            with_prop(0, s("urn:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8")),
            "message-id is a string the broker would store as a uuid",
        ),
        (
            with_prop(0, Value::Ulong(42)),
            "message-id is a ulong a 0-9-1 short string cannot hold",
        ),
        (
            with_prop(4, s("/queues/a b")),
            "reply-to /queues/a b is not the address the broker writes for a queue name",
        ),
        (with_prop(3, s("subj")), "the subject property is set"),
        (with_prop(11, Value::Uint(1)), "the group-sequence property is set"),
        (
            with_prop(9, Value::Timestamp(1_500)),
            "creation-time 1500 ms is not whole seconds since 1970",
        ),
    ];
    for (m, why) in cases {
        assert_eq!(stored_whole(&m), why);
    }
}

#[test]
fn a_binary_header_a_long_string_could_not_have_become_stays_a_byte_array() {
    // Valid UTF-8 without NUL: a 0-9-1 long string would be stored as a string, so this came
    // from a byte array (`x`), which the broker stores back as binary.
    let m = Message {
        header: Some(vec![Value::Bool(false)]),
        application_properties: vec![
            (Value::String("b".into()), Value::Binary(b"text".to_vec())),
            (Value::String("n".into()), Value::Binary(b"a\0".to_vec())),
            (Value::String("l".into()), Value::String("y".repeat(5000))),
        ],
        body: vec![],
        ..Default::default()
    };
    let bytes = encode_message(&m);
    let (_, why) = to_record(&bytes, origin(Conversion::ContainerQueueAddresses));
    assert_eq!(
        why.as_deref(),
        Some("header l: a string of 5000 bytes the broker would store back as binary (NUL, or over 4096 bytes)")
    );
    let m = Message {
        application_properties: m.application_properties[..2].to_vec(),
        ..m
    };
    let (r, why) = to_record(
        &encode_message(&m),
        origin(Conversion::ContainerQueueAddresses),
    );
    assert_eq!(why, None);
    assert_eq!(
        r.headers,
        vec![
            ("b".to_string(), H::Bytes(b"text".to_vec())),
            ("n".to_string(), H::LongString("a\0".into())),
        ]
    );
}

#[test]
fn the_captured_messages_encode_back_to_their_bytes() {
    for fixture in [
        NO_PROPERTIES,
        PERSISTENT,
        PRIORITY_0_TTL_0,
        EVERY_PROPERTY,
        UUID_IDS,
        CC,
        EVERY_PROPERTY_4_0,
    ] {
        let m = decode_message(&hex(fixture)).unwrap();
        assert!(m.header.is_some());
        assert_eq!(m.not_carried, None);
        // Same sections (the encoder takes the widest constructors, so compare decoded).
        assert_eq!(decode_message(&encode_message(&m)).unwrap(), m);
    }
}
