//! Tests of the AMQP client against the test broker (`common::broker`, guest/guest).

#[path = "amqp_support/mod.rs"]
mod common;
#[path = "common/mod.rs"]
mod shared;

use common::{rich_properties, Vhost};
use rmq_backup::broker::amqp::{
    AmqpUrl, BasicProperties, ConnectOptions, Connection, Delivery, FieldTable, FieldValue,
};
use rmq_backup::Error;
use shared::wait_ready;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn opts(url: &str) -> ConnectOptions {
    ConnectOptions::new(AmqpUrl::parse(url).unwrap())
}

/// `props` as the test broker delivers them: RabbitMQ 4.x sorts every message's header keys
/// when it is published (3.10 keeps a classic queue's in their order).
fn as_delivered(props: &BasicProperties) -> BasicProperties {
    let mut p = props.clone();
    if shared::broker().is_4x() {
        if let Some(h) = p.headers.as_mut() {
            h.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        }
    }
    p
}

/// Every field equal, header values with their exact types and in the order the broker
/// delivers them ([`as_delivered`]).
fn assert_same_message(got: &Delivery, props: &BasicProperties, body: &[u8], what: &str) {
    assert_eq!(got.properties, as_delivered(props), "{what}: properties");
    assert_eq!(got.body, body, "{what}: body");
}

fn consume_n(
    ch: &rmq_backup::broker::amqp::Channel,
    queue: &str,
    n: usize,
) -> (rmq_backup::broker::amqp::Consumer, Vec<Delivery>) {
    let c = ch
        .basic_consume(queue, "", false, false, &Vec::new())
        .unwrap();
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match c.recv_timeout(T).unwrap() {
            Some(d) => got.push(d),
            None => panic!("timed out after {} of {n} deliveries", got.len()),
        }
    }
    (c, got)
}

#[test]
fn connect_and_server_properties() {
    let vh = Vhost::new("connect");
    let conn = vh.connect();
    let product = conn
        .server_properties()
        .iter()
        .find(|(k, _)| k == "product")
        .map(|(_, v)| v.clone());
    assert_eq!(product, Some(FieldValue::LongString(b"RabbitMQ".to_vec())));
    assert_eq!(conn.heartbeat(), Some(Duration::from_secs(30)));
    assert_eq!(conn.frame_max(), 131_072);
    assert!(conn.blocked().is_none());
    let ch = conn.open_channel().unwrap();
    assert_eq!(ch.id(), 1);
    let ch2 = conn.open_channel().unwrap();
    assert_eq!(ch2.id(), 2);
    ch.close().unwrap();
    ch2.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn bad_password_is_authentication_error() {
    let e = Connection::open(&opts(
        &shared::amqp_base().replace("guest:guest", "guest:wrong-pw"),
    ))
    .err()
    .unwrap();
    assert_eq!(
        e,
        Error::Authentication("AMQP authentication failed for user guest".into())
    );
    assert_eq!(
        e.to_string(),
        "Authentication error: AMQP authentication failed for user guest"
    );
}

#[test]
fn missing_vhost_is_authentication_error_with_reason() {
    let e = Connection::open(&opts(&format!("{}/no-such-vhost-xyz", shared::amqp_base())))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Authentication(_)), "{msg}");
    assert!(
        msg.starts_with(
            "Authentication error: AMQP authentication failed for user guest: NOT_ALLOWED"
        ),
        "{msg}"
    );
    assert!(msg.contains("no-such-vhost-xyz"), "{msg}");
}

#[test]
fn wrong_port_is_connection_error_with_masked_password() {
    let e = Connection::open(&opts("amqp://guest:topsecret@127.0.0.1:1/%2f"))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Connection(_)), "{msg}");
    assert!(
        msg.starts_with(
            "Connection error: Failed to connect to amqp://guest:****@127.0.0.1:1/%2F: "
        ),
        "{msg}"
    );
    assert!(msg.contains("refused"), "{msg}");
    assert!(!msg.contains("topsecret"), "{msg}");
}

#[test]
fn not_found_passive_declare_keeps_broker_text() {
    let vh = Vhost::new("notfound");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let e = ch.queue_declare_passive("nope").unwrap_err();
    let expected = format!("NOT_FOUND - no queue 'nope' in vhost '{}'", vh.name);
    assert_eq!(e, Error::Amqp(expected.clone()));
    assert_eq!(e.to_string(), format!("AMQP error: {expected}"));
    // the channel stays closed with that error; the connection is fine
    assert_eq!(
        ch.basic_qos(1, false).unwrap_err(),
        Error::Amqp(expected.clone())
    );
    assert_eq!(ch.close().unwrap_err(), Error::Amqp(expected));
    let ch = conn.open_channel().unwrap();
    assert_eq!(ch.id(), 1, "channel id reused after the broker closed it");
    let ok = ch
        .queue_declare("q", false, false, false, &Vec::new())
        .unwrap();
    assert_eq!((ok.queue.as_str(), ok.message_count), ("q", 0));
    ch.close().unwrap();
    conn.close().unwrap();
}

/// 1000 messages with every header type and all properties: published with confirms,
/// consumed back (no_ack=false, prefetch 0) equal and in order, then cancel + close puts them
/// back in the queue.
#[test]
fn round_trip_1000_rich_messages_classic() {
    let vh = Vhost::new("roundtrip");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("rt", true, false, false, &Vec::new())
        .unwrap();
    ch.confirm_select().unwrap();
    let n = 1000u32;
    for i in 0..n {
        let body = format!("body {i}").into_bytes();
        let seq = ch
            .basic_publish("", "rt", true, &rich_properties(i), &body)
            .unwrap();
        assert_eq!(seq, i as u64 + 1);
    }
    let st = ch.wait_for_confirms(0, T).unwrap();
    assert!(st.nacked.is_empty() && st.returned.is_empty(), "{st:?}");
    assert_eq!(ch.outstanding_confirms(), 0);
    assert_eq!(ch.queue_declare_passive("rt").unwrap().message_count, n);

    let cch = conn.open_channel().unwrap();
    cch.basic_qos(0, false).unwrap();
    let (consumer, got) = consume_n(&cch, "rt", n as usize);
    for (i, d) in got.iter().enumerate() {
        let body = format!("body {i}").into_bytes();
        assert_same_message(
            d,
            &rich_properties(i as u32),
            &body,
            &format!("message {i}"),
        );
        assert_eq!(d.delivery_tag, i as u64 + 1);
        assert!(!d.redelivered);
        assert_eq!(d.exchange, "");
        assert_eq!(d.routing_key, "rt");
    }
    // non-UTF-8 long string survives byte for byte with its type code
    let h = got[7].properties.headers.as_ref().unwrap();
    let v = &h.iter().find(|(k, _)| k == "not-utf8").unwrap().1;
    assert_eq!(v, &FieldValue::LongString(vec![0xff, 0xfe, 0x80, 7]));
    assert!(consumer
        .recv_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
    cch.basic_cancel(consumer.tag()).unwrap();
    let e = consumer
        .recv_timeout(Duration::from_millis(100))
        .unwrap_err();
    assert!(e.to_string().contains("cancelled"), "{e}");
    cch.close().unwrap();
    wait_ready(&ch, "rt", n);

    // a second pass sees them redelivered, same order
    let cch = conn.open_channel().unwrap();
    let (_c, again) = consume_n(&cch, "rt", n as usize);
    assert!(again.iter().all(|d| d.redelivered));
    for (i, d) in again.iter().enumerate() {
        assert_same_message(
            d,
            &rich_properties(i as u32),
            format!("body {i}").as_bytes(),
            "again",
        );
    }
    drop(cch); // drop closes best-effort: unacked go back
    let deadline = Instant::now() + T;
    while ch.queue_declare_passive("rt").unwrap().message_count != n {
        assert!(
            Instant::now() < deadline,
            "messages not requeued after drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ch.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn basic_get_nack_reject_requeue() {
    let vh = Vhost::new("get");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("g", false, false, false, &Vec::new())
        .unwrap();
    assert!(ch.basic_get("g", false).unwrap().is_none());
    ch.confirm_select().unwrap();
    for i in 0..3u32 {
        ch.basic_publish("", "g", false, &rich_properties(i), &[i as u8; 10])
            .unwrap();
    }
    ch.wait_for_confirms(0, T).unwrap();
    let g = ch.basic_get("g", false).unwrap().unwrap();
    assert_eq!(g.message_count, 2);
    assert_same_message(&g.delivery, &rich_properties(0), &[0; 10], "get");
    ch.basic_nack(g.delivery.delivery_tag, false, true).unwrap();
    // requeued at the head
    let g = ch.basic_get("g", false).unwrap().unwrap();
    assert!(g.delivery.redelivered);
    assert_eq!(g.delivery.body, [0; 10]);
    ch.basic_reject(g.delivery.delivery_tag, true).unwrap();
    let g = ch.basic_get("g", false).unwrap().unwrap();
    assert!(g.delivery.redelivered);
    ch.basic_ack(g.delivery.delivery_tag, false).unwrap();
    let g = ch.basic_get("g", true).unwrap().unwrap();
    assert_eq!(g.delivery.body, [1; 10]);
    assert_eq!(g.message_count, 1);
    assert_eq!(ch.queue_purge("g").unwrap(), 1);
    assert!(ch.basic_get("g", true).unwrap().is_none());
    assert_eq!(ch.queue_delete("g").unwrap(), 0);
    ch.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn quorum_queue_round_trip() {
    let vh = Vhost::new("quorum");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    let args: FieldTable = vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )];
    ch.queue_declare("qq", true, false, false, &args).unwrap();
    ch.confirm_select().unwrap();
    let n = 300u32;
    for i in 0..n {
        ch.basic_publish(
            "",
            "qq",
            false,
            &rich_properties(i),
            format!("q{i}").as_bytes(),
        )
        .unwrap();
    }
    let st = ch.wait_for_confirms(0, T).unwrap();
    assert!(st.nacked.is_empty());
    let cch = conn.open_channel().unwrap();
    cch.basic_qos(0, false).unwrap();
    let (c, got) = consume_n(&cch, "qq", n as usize);
    // Quorum queues of RabbitMQ 4.x deliver by priority (`shared::in_broker_order`).
    let published: Vec<shared::Msg> = (0..n)
        .map(|i| shared::Msg {
            props: rich_properties(i),
            body: format!("q{i}").into_bytes(),
        })
        .collect();
    for (d, m) in got
        .iter()
        .zip(shared::in_broker_order(&published, "quorum"))
    {
        assert_same_message(d, &m.props, &m.body, "quorum");
    }
    cch.basic_cancel(c.tag()).unwrap();
    cch.close().unwrap();
    let deadline = Instant::now() + T;
    while ch.queue_declare_passive("qq").unwrap().message_count != n {
        assert!(Instant::now() < deadline, "quorum messages not requeued");
        std::thread::sleep(Duration::from_millis(50));
    }
    ch.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn large_and_empty_bodies() {
    let vh = Vhost::new("bodies");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("b", false, false, false, &Vec::new())
        .unwrap();
    ch.confirm_select().unwrap();
    let big: Vec<u8> = (0..(1 << 20) as u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let odd: Vec<u8> = vec![7; 131_072 - 8]; // exactly one full body frame
    let bodies: Vec<Vec<u8>> = vec![big.clone(), Vec::new(), odd.clone(), big.clone()];
    for b in &bodies {
        ch.basic_publish("", "b", false, &BasicProperties::default(), b)
            .unwrap();
    }
    ch.wait_for_confirms(0, T).unwrap();
    let (_c, got) = consume_n(&ch, "b", bodies.len());
    for (d, b) in got.iter().zip(&bodies) {
        assert_eq!(d.body.len(), b.len());
        assert!(d.body == *b);
        assert_eq!(d.properties, BasicProperties::default());
    }
    ch.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn returns_and_channel_errors_reach_publisher() {
    let vh = Vhost::new("returns");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.confirm_select().unwrap();
    ch.basic_publish("", "no-such-queue", true, &BasicProperties::default(), b"x")
        .unwrap();
    ch.basic_publish(
        "",
        "no-such-queue",
        false,
        &BasicProperties::default(),
        b"y",
    )
    .unwrap();
    let st = ch.wait_for_confirms(0, T).unwrap();
    assert_eq!(st.returned.len(), 1, "{st:?}");
    assert_eq!(st.returned[0].reply_code, 312);
    assert_eq!(st.returned[0].reply_text, "NO_ROUTE");
    assert_eq!(st.returned[0].routing_key, "no-such-queue");
    assert!(ch.wait_for_confirms(0, T).unwrap().returned.is_empty());

    // publishing to a missing exchange closes the channel asynchronously
    ch.basic_publish("missing-ex", "k", false, &BasicProperties::default(), b"z")
        .unwrap();
    let e = ch.wait_for_confirms(0, T).unwrap_err();
    assert_eq!(
        e,
        Error::Amqp(format!(
            "NOT_FOUND - no exchange 'missing-ex' in vhost '{}'",
            vh.name
        ))
    );
    let e2 = ch
        .basic_publish("", "q", false, &BasicProperties::default(), b"")
        .unwrap_err();
    assert_eq!(e, e2);

    // exchange + bind + routed publish
    let ch = conn.open_channel().unwrap();
    ch.exchange_declare("ex", "direct", false, true, &Vec::new())
        .unwrap();
    ch.queue_declare("bound", false, false, false, &Vec::new())
        .unwrap();
    ch.queue_bind("bound", "ex", "rk", &Vec::new()).unwrap();
    ch.confirm_select().unwrap();
    ch.basic_publish("ex", "rk", true, &BasicProperties::default(), b"routed")
        .unwrap();
    assert!(ch.wait_for_confirms(0, T).unwrap().returned.is_empty());
    let g = ch.basic_get("bound", true).unwrap().unwrap();
    assert_eq!(g.delivery.exchange, "ex");
    assert_eq!(g.delivery.routing_key, "rk");
    assert_eq!(g.delivery.body, b"routed");
    conn.close().unwrap();
}

#[test]
fn deleted_queue_cancels_consumer_with_error() {
    let vh = Vhost::new("cancelnotify");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("d", false, false, false, &Vec::new())
        .unwrap();
    let c = ch
        .basic_consume("d", "my-tag", false, false, &Vec::new())
        .unwrap();
    assert_eq!(c.tag(), "my-tag");
    let other = conn.open_channel().unwrap();
    other.queue_delete("d").unwrap();
    let e = c.recv_timeout(T).unwrap_err();
    assert!(e.to_string().contains("cancelled by the broker"), "{e}");
    // channel still usable
    ch.queue_declare("d2", false, false, false, &Vec::new())
        .unwrap();
    conn.close().unwrap();
}

#[test]
fn back_pressure_keeps_the_connection_alive() {
    // A consumer buffer of 4, 2000 messages, a slow reader: the reader thread blocks, the
    // connection stays healthy, every message arrives in order.
    let vh = Vhost::new("backpressure");
    let mut o = opts(&vh.url());
    o.consumer_buffer = 4;
    o.heartbeat_secs = 2;
    let conn = Connection::open(&o).unwrap();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("bp", false, false, false, &Vec::new())
        .unwrap();
    ch.confirm_select().unwrap();
    for i in 0..2000u32 {
        ch.basic_publish(
            "",
            "bp",
            false,
            &BasicProperties::default(),
            &i.to_be_bytes(),
        )
        .unwrap();
        if ch.outstanding_confirms() > 200 {
            ch.wait_for_confirms(100, T).unwrap();
        }
    }
    ch.wait_for_confirms(0, T).unwrap();
    let c = ch
        .basic_consume("bp", "", true, false, &Vec::new())
        .unwrap();
    // hold the reader blocked for longer than two heartbeat intervals
    std::thread::sleep(Duration::from_secs(5));
    assert!(conn.is_open());
    // a second channel's RPC still works once the consumer drains
    for i in 0..2000u32 {
        let d = c.recv_timeout(T).unwrap().unwrap();
        assert_eq!(d.body, i.to_be_bytes());
    }
    assert_eq!(ch.queue_declare_passive("bp").unwrap().message_count, 0);
    conn.close().unwrap();
}

#[test]
fn connection_close_reaches_consumers_and_channels() {
    let vh = Vhost::new("connclose");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("c", false, false, false, &Vec::new())
        .unwrap();
    let c = ch
        .basic_consume("c", "", false, false, &Vec::new())
        .unwrap();
    // Force-close our connection from the management API.
    let deadline = Instant::now() + T;
    loop {
        let text = common::curl(
            "GET",
            &format!("vhosts/{}/connections?columns=name", vh.name),
            None,
        );
        if let Some(start) = text.find("\"name\":\"") {
            let rest = &text[start + 8..];
            let name = &rest[..rest.find('"').unwrap()];
            let enc = name
                .replace(' ', "%20")
                .replace('>', "%3E")
                .replace(':', "%3A");
            common::curl("DELETE", &format!("connections/{enc}"), None);
            break;
        }
        assert!(Instant::now() < deadline, "connection not listed: {text}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let e = c.recv_timeout(T).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("Connection error: connection closed by broker: CONNECTION_FORCED"),
        "{msg}"
    );
    assert_eq!(ch.queue_declare_passive("c").unwrap_err(), e);
    assert!(!conn.is_open());
    assert_eq!(conn.open_channel().err().unwrap(), e);
    assert_eq!(conn.close().unwrap_err(), e);
}

/// Messages the typed API cannot publish (non-UTF-8 short strings) fail one by one on the
/// consumer with an `AMQP error: ... not valid UTF-8 ...`, never silently, and the good
/// messages around them arrive intact.
#[test]
fn non_utf8_short_strings_are_errors_not_losses() {
    use rmq_backup::broker::amqp::codec::put_properties;
    let vh = Vhost::new("nonutf8");
    let conn = vh.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("u", false, false, false, &Vec::new())
        .unwrap();
    ch.exchange_declare("fan", "fanout", false, false, &Vec::new())
        .unwrap();
    ch.queue_bind("u", "fan", "", &Vec::new()).unwrap();

    let mut raw = common::raw::RawConn::open(&vh.name);
    let mut good = Vec::new();
    put_properties(&mut good, &rich_properties(1)).unwrap();
    raw.publish(b"", b"u", &good, b"first");
    // content_type = "\xc3\x28"
    raw.publish(b"", b"u", &[0x80, 0x00, 2, 0xc3, 0x28], b"bad content type");
    raw.publish(b"", b"u", &good, b"second");
    // headers table with key "\xff"
    raw.publish(
        b"",
        b"u",
        &[0x20, 0x00, 0, 0, 0, 3, 1, 0xff, b'V'],
        b"bad key",
    );
    // routing key "\xfe" through the fanout exchange
    raw.publish(b"fan", &[0xfe], &good, b"bad routing key");
    raw.publish(b"", b"u", &good, b"third");
    raw.close();

    let c = ch
        .basic_consume("u", "", false, false, &Vec::new())
        .unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        match c.recv_timeout(T) {
            Ok(Some(d)) => {
                assert_eq!(d.properties, as_delivered(&rich_properties(1)));
                outcomes.push(String::from_utf8(d.body).unwrap());
            }
            Ok(None) => panic!("timeout"),
            Err(e) => {
                assert!(matches!(e, Error::Amqp(_)), "{e}");
                assert!(e.to_string().contains("not valid UTF-8"), "{e}");
                outcomes.push(e.to_string());
            }
        }
    }
    assert_eq!(outcomes[0], "first");
    assert!(
        outcomes[1].contains("content_type property is not valid UTF-8"),
        "{}",
        outcomes[1]
    );
    assert_eq!(outcomes[2], "second");
    assert!(
        outcomes[3].contains("field table key is not valid UTF-8"),
        "{}",
        outcomes[3]
    );
    assert!(
        outcomes[4].contains("routing key of a delivery is not valid UTF-8"),
        "{}",
        outcomes[4]
    );
    assert_eq!(outcomes[5], "third");
    assert!(conn.is_open());
    ch.basic_cancel(c.tag()).unwrap();
    ch.close().unwrap();
    // nothing was lost: all 6 are back in the queue
    let ch = conn.open_channel().unwrap();
    wait_ready(&ch, "u", 6);
    conn.close().unwrap();
}
