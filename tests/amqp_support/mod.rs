#![allow(dead_code)]
//! Helpers for tests against the local broker: a vhost per test, deleted on drop.

use rmq_backup::broker::amqp::{AmqpUrl, BasicProperties, ConnectOptions, Connection, FieldValue};

pub struct Vhost {
    pub name: String,
}

/// One management API call as guest (ureq, so the tests need no curl); returns the body.
pub fn curl(method: &str, path: &str, body: Option<&str>) -> String {
    let url = format!("{}/api/{path}", crate::shared::management_url());
    let auth = "Basic Z3Vlc3Q6Z3Vlc3Q="; // guest:guest
    let result = match (method, body) {
        ("GET", _) => ureq::get(&url).header("authorization", auth).call(),
        ("DELETE", _) => ureq::delete(&url).header("authorization", auth).call(),
        ("PUT", Some(b)) => ureq::put(&url)
            .header("authorization", auth)
            .header("content-type", "application/json")
            .send(b),
        ("PUT", None) => ureq::put(&url).header("authorization", auth).send_empty(),
        _ => panic!("unsupported method {method}"),
    };
    let mut resp = result.unwrap_or_else(|e| panic!("{method} {path} failed: {e}"));
    resp.body_mut().read_to_string().unwrap_or_default()
}

impl Vhost {
    pub fn new(test: &str) -> Vhost {
        // Unique per process, per call and per run (a reused pid must not meet a leftover).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "amqp-test-{test}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            rmq_backup::now_ms()
        );
        curl("PUT", &format!("vhosts/{name}"), None);
        curl(
            "PUT",
            &format!("permissions/{name}/guest"),
            Some(r#"{"configure":".*","write":".*","read":".*"}"#),
        );
        Vhost { name }
    }

    pub fn url(&self) -> String {
        format!("{}/{}", crate::shared::amqp_base(), self.name)
    }

    pub fn connect(&self) -> Connection {
        let mut o = ConnectOptions::new(AmqpUrl::parse(&self.url()).unwrap());
        o.rpc_timeout = std::time::Duration::from_secs(20);
        Connection::open(&o).unwrap()
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        curl("DELETE", &format!("vhosts/{}", self.name), None);
    }
}

/// Properties with all 14 fields and every header type code, varying with `i`.
pub fn rich_properties(i: u32) -> BasicProperties {
    let nested = vec![
        ("inner-int".to_string(), FieldValue::I32(-(i as i32))),
        (
            "inner-bin".to_string(),
            FieldValue::LongString(vec![0xc3, 0x28, i as u8]),
        ),
        (
            "inner-array".to_string(),
            FieldValue::Array(vec![FieldValue::Void, FieldValue::Bool(true)]),
        ),
    ];
    BasicProperties {
        content_type: Some("application/octet-stream".into()),
        content_encoding: Some("identity".into()),
        headers: Some(vec![
            ("bool".into(), FieldValue::Bool(i.is_multiple_of(2))),
            ("i8".into(), FieldValue::I8(-5)),
            ("u8".into(), FieldValue::U8(200)),
            ("i16".into(), FieldValue::I16(-30000)),
            ("u16".into(), FieldValue::U16(60000)),
            ("i32".into(), FieldValue::I32(-2_000_000_000)),
            ("u32".into(), FieldValue::U32(4_000_000_000)),
            ("i64".into(), FieldValue::I64(i as i64 * -1_000_000_007)),
            ("f32".into(), FieldValue::F32(1.25)),
            ("f64".into(), FieldValue::F64(-3.5e100)),
            (
                "decimal".into(),
                FieldValue::Decimal {
                    scale: 2,
                    value: 12345 + i,
                },
            ),
            (
                "utf8".into(),
                FieldValue::LongString(format!("héllo {i}").into_bytes()),
            ),
            (
                "not-utf8".into(),
                FieldValue::LongString(vec![0xff, 0xfe, 0x80, (i % 256) as u8]),
            ),
            (
                "array".into(),
                FieldValue::Array(vec![
                    FieldValue::I64(1),
                    FieldValue::LongString(b"two".to_vec()),
                    FieldValue::Table(nested.clone()),
                    FieldValue::Array(vec![FieldValue::U8(3)]),
                ]),
            ),
            (
                "timestamp".into(),
                FieldValue::Timestamp(1_700_000_000 + i as u64),
            ),
            ("table".into(), FieldValue::Table(nested)),
            ("void".into(), FieldValue::Void),
            (
                "bytes".into(),
                FieldValue::Bytes(vec![0, 1, 2, 0xff, i as u8]),
            ),
            ("empty-table".into(), FieldValue::Table(Vec::new())),
            ("seq".into(), FieldValue::U32(i)),
        ]),
        delivery_mode: Some(2),
        priority: Some((i % 10) as u8),
        correlation_id: Some(format!("corr-{i}")),
        reply_to: Some("reply-queue".into()),
        expiration: Some("3600000".into()),
        message_id: Some(format!("msg-{i}")),
        timestamp: Some(1_600_000_000 + i as u64),
        kind: Some("test.type".into()),
        user_id: Some("guest".into()),
        app_id: Some("amqp-tests".into()),
        cluster_id: Some("cluster-x".into()),
    }
}

/// Publishes hand-made frames over a raw connection (no validation on our side), to put
/// messages the typed API cannot express (non-UTF-8 short strings) into a queue.
pub mod raw {
    use rmq_backup::broker::amqp::codec::*;
    use rmq_backup::broker::amqp::transport::{FrameReader, Transport};
    use std::io::Write;
    use std::time::Duration;

    pub struct RawConn {
        w: Transport,
        r: FrameReader,
    }

    impl RawConn {
        fn next(&mut self) -> Method {
            loop {
                let f = self.r.next_frame().unwrap().expect("frame");
                if f.kind == FRAME_METHOD {
                    return Method::decode(f.payload).unwrap();
                }
            }
        }

        fn send(&mut self, ch: u16, m: Method) {
            let mut b = Vec::new();
            put_method_frame(&mut b, ch, &m, 131072).unwrap();
            self.w.write_all(&b).unwrap();
        }

        pub fn open(vhost: &str) -> RawConn {
            let t = Transport::connect_tcp(
                "127.0.0.1",
                crate::shared::broker().amqp_port,
                Duration::from_secs(5),
            )
            .unwrap();
            t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let w = t.try_clone().unwrap();
            let mut c = RawConn {
                w,
                r: FrameReader::new(t, 131072),
            };
            c.w.write_all(PROTOCOL_HEADER).unwrap();
            assert!(matches!(c.next(), Method::ConnectionStart { .. }));
            c.send(
                0,
                Method::ConnectionStartOk {
                    client_properties: Vec::new(),
                    mechanism: "PLAIN".into(),
                    response: rmq_backup::broker::amqp::codec::Secret(b"\0guest\0guest".to_vec()),
                    locale: "en_US".into(),
                },
            );
            assert!(matches!(c.next(), Method::ConnectionTune { .. }));
            c.send(
                0,
                Method::ConnectionTuneOk {
                    channel_max: 10,
                    frame_max: 131072,
                    heartbeat: 0,
                },
            );
            c.send(
                0,
                Method::ConnectionOpen {
                    vhost: vhost.into(),
                },
            );
            assert_eq!(c.next(), Method::ConnectionOpenOk);
            c.send(1, Method::ChannelOpen);
            assert_eq!(c.next(), Method::ChannelOpenOk);
            c.send(1, Method::ConfirmSelect { no_wait: false });
            assert_eq!(c.next(), Method::ConfirmSelectOk);
            c
        }

        /// Publishes with a hand-written content header payload (after class/weight/size) and
        /// raw exchange/routing key bytes; waits for the broker's ack.
        pub fn publish(
            &mut self,
            exchange: &[u8],
            routing_key: &[u8],
            props_wire: &[u8],
            body: &[u8],
        ) {
            let mut b = Vec::new();
            let f = begin_frame(&mut b, FRAME_METHOD, 1);
            b.extend_from_slice(&[0, 60, 0, 40, 0, 0]);
            put_short_bytes(&mut b, exchange, "x").unwrap();
            put_short_bytes(&mut b, routing_key, "x").unwrap();
            b.push(0);
            end_frame(&mut b, f, 131072).unwrap();
            let f = begin_frame(&mut b, FRAME_HEADER, 1);
            b.extend_from_slice(&[0, 60, 0, 0]);
            b.extend_from_slice(&(body.len() as u64).to_be_bytes());
            b.extend_from_slice(props_wire);
            end_frame(&mut b, f, 131072).unwrap();
            put_body_frames(&mut b, 1, body, 131072);
            self.w.write_all(&b).unwrap();
            match self.next() {
                Method::BasicAck { .. } => {}
                other => panic!("expected basic.ack, got {other:?}"),
            }
        }

        pub fn close(mut self) {
            self.send(
                0,
                Method::ConnectionClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    class_id: 0,
                    method_id: 0,
                },
            );
            assert_eq!(self.next(), Method::ConnectionCloseOk);
        }
    }
}
