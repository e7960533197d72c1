//! Shared set-up of the integration tests: a vhost of their own on the real local broker
//! (deleted on drop), a diverse message set, publishing, non-destructive reading, comparison,
//! and running the real binary.
//!
//! The broker is chosen by `RMQ_TEST_BROKER` ([`broker`]): `4.3` (the default, RabbitMQ 4.3.6
//! of `scripts/setup-rabbitmq-4x.sh`), `4.0` (4.0.5, beside it), `3.10` (the host's 3.10.8 of
//! `scripts/setup-rabbitmq.sh`) or `4.3-no-metrics` (4.3.6 with the management API's message
//! statistics off); guest/guest. `RMQ_TEST_AMQP_URL` and `RMQ_TEST_MANAGEMENT_URL` override
//! the URLs.
#![allow(dead_code)]

use rmq_backup::broker::amqp::{
    AmqpUrl, BasicProperties, Channel, ConnectOptions, Connection, Delivery, FieldTable, FieldValue,
};
use rmq_backup::broker::management::ManagementClient;

pub mod buckets;
pub mod cluster;
pub mod hooked_storage;
pub mod http_proxy;
pub mod proton;
pub mod proxy;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A test broker: its ports on 127.0.0.1 and how to run its `rabbitmqctl`.
#[derive(Debug)]
pub struct TestBroker {
    /// What `RMQ_TEST_BROKER` calls it.
    pub name: &'static str,
    /// RabbitMQ's (major, minor) version.
    pub version: (u32, u32),
    pub amqp_port: u16,
    pub management_port: u16,
    pub stream_port: u16,
    /// The chroot it runs in (`scripts/setup-rabbitmq-4x.sh`), under `RMQ_BACKUP_BROKERS_DIR`;
    /// `None`: the host's own broker.
    chroot: Option<&'static str>,
}

const BROKERS: [TestBroker; 4] = [
    TestBroker {
        name: "4.3",
        version: (4, 3),
        amqp_port: 5692,
        management_port: 15692,
        stream_port: 5572,
        chroot: Some("rabbitmq-4.3"),
    },
    TestBroker {
        name: "4.0",
        version: (4, 0),
        amqp_port: 5690,
        management_port: 15690,
        stream_port: 5570,
        chroot: Some("rabbitmq-4.0"),
    },
    TestBroker {
        name: "3.10",
        version: (3, 10),
        amqp_port: 5672,
        management_port: 15672,
        stream_port: 5552,
        chroot: None,
    },
    TestBroker {
        name: "4.3-no-metrics",
        version: (4, 3),
        amqp_port: 5694,
        management_port: 15694,
        stream_port: 5574,
        chroot: Some("rabbitmq-4.3-no-metrics"),
    },
];

impl TestBroker {
    /// The broker `RMQ_TEST_BROKER` names; panics on a name it does not know.
    pub fn named(name: &str) -> &'static TestBroker {
        BROKERS.iter().find(|b| b.name == name).unwrap_or_else(|| {
            panic!("RMQ_TEST_BROKER={name}: not one of 4.3, 4.0, 3.10, 4.3-no-metrics")
        })
    }

    /// True for RabbitMQ 4.x.
    pub fn is_4x(&self) -> bool {
        self.version.0 >= 4
    }

    /// True where every quorum queue has a delivery limit of 20 without any argument or policy
    /// (4.0 and later).
    pub fn default_delivery_limit(&self) -> bool {
        self.is_4x()
    }

    /// True where `basic.nack(requeue)` gives a quorum queue's message back without raising
    /// its delivery count (4.3 and later).
    pub fn uncounted_nack(&self) -> bool {
        self.version >= (4, 3)
    }

    /// `rabbitmqctl` of this broker (in its chroot for 4.x).
    pub fn rabbitmqctl(&self) -> Command {
        match self.chroot {
            Some(dir) => {
                let base = std::env::var("RMQ_BACKUP_BROKERS_DIR")
                    .unwrap_or_else(|_| "/opt/rmq-backup-brokers".into());
                let mut c = Command::new("chroot");
                c.arg(Path::new(&base).join(dir)).arg("rabbitmqctl");
                c
            }
            None => Command::new("rabbitmqctl"),
        }
    }

    pub fn amqp_base(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}", self.amqp_port)
    }

    pub fn management_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.management_port)
    }

    pub fn management(&self) -> ManagementClient {
        ManagementClient::new(&self.management_url(), "guest", "guest", None)
            .expect("management client")
    }

    /// The percent-encoded AMQP URL of `vhost` on this broker.
    pub fn amqp_url(&self, vhost: &str) -> String {
        format!("{}/{}", self.amqp_base(), encode_vhost(vhost))
    }

    /// An AMQP connection to `vhost` on this broker.
    pub fn connect(&self, vhost: &str) -> Connection {
        let url = AmqpUrl::parse(&self.amqp_url(vhost)).expect("url");
        Connection::open(&ConnectOptions::new(url)).expect("connect")
    }
}

/// The broker under test: `RMQ_TEST_BROKER` (default `4.3`).
pub fn broker() -> &'static TestBroker {
    TestBroker::named(&std::env::var("RMQ_TEST_BROKER").unwrap_or_else(|_| "4.3".into()))
}

/// The test broker's stream protocol port.
pub fn stream_port() -> u16 {
    broker().stream_port
}

pub fn amqp_base() -> String {
    std::env::var("RMQ_TEST_AMQP_URL").unwrap_or_else(|_| broker().amqp_base())
}

pub fn management_url() -> String {
    std::env::var("RMQ_TEST_MANAGEMENT_URL").unwrap_or_else(|_| broker().management_url())
}

/// `Authorization` header of the test broker's management API (guest:guest).
pub const MANAGEMENT_AUTH: &str = "Basic Z3Vlc3Q6Z3Vlc3Q=";

/// Names of the broker's connections whose client-provided name starts with `prefix`
/// (the management API lists a connection within its statistics interval, ~5 s).
pub fn connection_names(prefix: &str) -> Vec<String> {
    let mut r = ureq::get(&format!("{}/api/connections", management_url()))
        .header("authorization", MANAGEMENT_AUTH)
        .call()
        .expect("connections");
    let list: serde_json::Value =
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["client_properties"]["connection_name"]
                .as_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect()
}

/// Waits (at most 60 s) for a connection named `prefix...` and closes it as an operator
/// would (`DELETE /api/connections/{name}`: CONNECTION_FORCED); returns its name.
pub fn close_connection(prefix: &str, reason: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let name = loop {
        if let Some(n) = connection_names(prefix).into_iter().next() {
            break n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no connection named {prefix}..."
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let url = format!(
        "{}/api/connections/{}",
        management_url(),
        rmq_backup::broker::management::encode_segment(&name)
    );
    ureq::delete(&url)
        .header("authorization", MANAGEMENT_AUTH)
        .header("x-reason", reason)
        .call()
        .expect("close the connection");
    name
}

pub fn management() -> ManagementClient {
    ManagementClient::new(&management_url(), "guest", "guest", None).expect("management client")
}

/// The percent-encoded AMQP URL of a vhost.
pub fn amqp_url(vhost: &str) -> String {
    format!("{}/{}", amqp_base(), encode_vhost(vhost))
}

/// A vhost name as the path of an AMQP URL.
fn encode_vhost(vhost: &str) -> String {
    vhost
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `<pid>-<counter>-<epoch ms>`: unique per process, per call and per run, so that no two
/// tests (running side by side, or a reused pid meeting a leftover) share a name.
pub fn unique_suffix() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        rmq_backup::now_ms()
    )
}

/// SeaweedFS's S3 endpoint (scripts/setup-storage.sh).
pub const S3_ENDPOINT: &str = "http://127.0.0.1:8333";
/// The SeaweedFS identity allowed everything (scripts/setup-storage.sh).
pub const S3_ADMIN: (&str, &str) = ("rmqbackup-admin", "rmqbackup-admin-secret");

/// A fresh SeaweedFS bucket of the test's own, emptied and deleted on drop.
pub struct S3Bucket(pub s3::Bucket);

impl S3Bucket {
    pub fn new(tag: &str) -> S3Bucket {
        let name = format!("rmqb-{tag}-{}", unique_suffix());
        let creds =
            s3::creds::Credentials::new(Some(S3_ADMIN.0), Some(S3_ADMIN.1), None, None, None)
                .expect("credentials");
        let region = s3::Region::Custom {
            region: "us-east-1".into(),
            endpoint: S3_ENDPOINT.into(),
        };
        let created = s3::Bucket::create_with_path_style(
            &name,
            region,
            creds,
            s3::BucketConfiguration::default(),
        )
        .unwrap_or_else(|e| panic!("create bucket {name} (scripts/setup-storage.sh): {e}"));
        S3Bucket(*created.bucket)
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }
}

impl Drop for S3Bucket {
    fn drop(&mut self) {
        if let Ok(pages) = self.0.list(String::new(), None) {
            for o in pages.into_iter().flat_map(|p| p.contents) {
                let _ = self.0.delete_object(&o.key);
            }
        }
        let _ = self.0.delete();
    }
}

/// A vhost of the test's own, created fresh and deleted on drop.
pub struct TestVhost {
    pub name: String,
}

impl TestVhost {
    pub fn new(prefix: &str) -> TestVhost {
        let name = format!("rmqb-test-{prefix}-{}", unique_suffix());
        let m = management();
        let _ = m.delete_vhost(&name);
        m.create_vhost(&name).expect("create vhost");
        m.set_permissions(&name, "guest").expect("permissions");
        TestVhost { name }
    }

    /// A name for another vhost that this one deletes on drop too (restore targets).
    pub fn sibling(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.name)
    }

    pub fn connect(&self) -> Connection {
        connect(&self.name)
    }
}

impl Drop for TestVhost {
    fn drop(&mut self) {
        let m = management();
        let _ = m.delete_vhost(&self.name);
        for suffix in ["target", "target2", "mapped"] {
            let _ = m.delete_vhost(&self.sibling(suffix));
        }
    }
}

pub fn connect(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&amqp_url(vhost)).expect("url");
    Connection::open(&ConnectOptions::new(url)).expect("connect")
}

/// Declares a durable queue of type `kind` with `extra` arguments. On a broker where every
/// return of a quorum message counts and quorum queues have a delivery limit by default
/// (4.0-4.2), a quorum queue without its own `x-delivery-limit` gets `-1` (none): the remedy
/// README gives, without which a backup leaves the queue alone (tests/delivery_limit.rs).
pub fn declare(ch: &Channel, name: &str, kind: &str, extra: FieldTable) {
    let mut args = extra;
    if kind != "classic" {
        args.push((
            "x-queue-type".into(),
            FieldValue::LongString(kind.as_bytes().to_vec()),
        ));
    }
    let b = broker();
    if kind == "quorum"
        && b.default_delivery_limit()
        && !b.uncounted_nack()
        && !args.iter().any(|(k, _)| k == "x-delivery-limit")
    {
        args.push(("x-delivery-limit".into(), FieldValue::I64(-1)));
    }
    ch.queue_declare(name, true, false, false, &args)
        .expect("declare queue");
}

/// One message to publish: properties and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Msg {
    pub props: BasicProperties,
    pub body: Vec<u8>,
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A header table with every AMQP field type, nested tables and arrays, and a long string that
/// is not valid UTF-8.
pub fn every_header_type(i: u64) -> FieldTable {
    vec![
        ("bool".into(), FieldValue::Bool(i.is_multiple_of(2))),
        ("i8".into(), FieldValue::I8(-5)),
        ("u8".into(), FieldValue::U8(250)),
        ("i16".into(), FieldValue::I16(-30_000)),
        ("u16".into(), FieldValue::U16(60_000)),
        ("i32".into(), FieldValue::I32(-2_000_000_000)),
        ("u32".into(), FieldValue::U32(4_000_000_000)),
        ("i64".into(), FieldValue::I64(-9_000_000_000_000 - i as i64)),
        ("f32".into(), FieldValue::F32(1.5)),
        ("f64".into(), FieldValue::F64(-2.25e-10)),
        (
            "decimal".into(),
            FieldValue::Decimal {
                scale: 2,
                value: 12_345,
            },
        ),
        (
            "text".into(),
            FieldValue::LongString(format!("héllo wörld ✓ {i}").into_bytes()),
        ),
        (
            "not-utf8".into(),
            FieldValue::LongString(vec![0xff, 0xfe, 0x00, b'a', 0xc3]),
        ),
        ("timestamp".into(), FieldValue::Timestamp(1_700_000_000 + i)),
        ("void".into(), FieldValue::Void),
        ("bytes".into(), FieldValue::Bytes(vec![0, 1, 2, 255])),
        (
            "array".into(),
            FieldValue::Array(vec![
                FieldValue::I32(1),
                FieldValue::LongString(b"two".to_vec()),
                FieldValue::Array(vec![FieldValue::Bool(false)]),
                FieldValue::Table(vec![("k".into(), FieldValue::I64(3))]),
            ]),
        ),
        (
            "table".into(),
            FieldValue::Table(vec![
                ("inner".into(), FieldValue::LongString(b"v".to_vec())),
                (
                    "deeper".into(),
                    FieldValue::Table(vec![("x".into(), FieldValue::U8(1))]),
                ),
            ]),
        ),
    ]
}

/// `n` diverse messages: every property set or none, every header type, empty, tiny, 1 KiB,
/// unicode and (once, when `with_big`) 1 MiB bodies.
pub fn diverse_messages(n: usize, seed: u64, with_big: bool) -> Vec<Msg> {
    let mut rng = Rng::new(seed);
    (0..n as u64)
        .map(|i| {
            let body = match i % 6 {
                0 => Vec::new(),
                1 => vec![i as u8],
                2 => rng.bytes(1024),
                3 => format!("unicode body ✓ {i} — ünïcødé").into_bytes(),
                4 if with_big && i == 4 => rng.bytes(1 << 20),
                _ => {
                    let n = (rng.next() % 4096) as usize;
                    rng.bytes(n)
                }
            };
            let props = match i % 6 {
                // An empty header table, which a queue keeps apart from none.
                3 => BasicProperties {
                    headers: Some(Vec::new()),
                    ..Default::default()
                },
                0 => BasicProperties::default(),
                1 | 4 => BasicProperties {
                    content_type: Some("application/octet-stream".into()),
                    content_encoding: Some("identity".into()),
                    headers: Some(every_header_type(i)),
                    delivery_mode: Some(2),
                    priority: Some((i % 10) as u8),
                    correlation_id: Some(format!("corr-{i}")),
                    reply_to: Some("replies".into()),
                    expiration: Some("86400000".into()),
                    message_id: Some(format!("msg-{i}")),
                    timestamp: Some(1_700_000_000 + i),
                    kind: Some("test.type".into()),
                    user_id: Some("guest".into()),
                    app_id: Some("rmq-backup-tests".into()),
                    cluster_id: Some("cluster-x".into()),
                },
                _ => BasicProperties {
                    headers: Some(vec![("seq".into(), FieldValue::I64(i as i64))]),
                    delivery_mode: Some(1),
                    message_id: Some(format!("msg-{i}")),
                    ..Default::default()
                },
            };
            Msg { props, body }
        })
        .collect()
}

/// Publishes `msgs` to `queue` through the default exchange, with confirms.
pub fn publish(ch: &Channel, queue: &str, msgs: &[Msg]) {
    publish_via(ch, "", queue, msgs);
}

pub fn publish_via(ch: &Channel, exchange: &str, routing_key: &str, msgs: &[Msg]) {
    ch.confirm_select().expect("confirm.select");
    for m in msgs {
        ch.basic_publish(exchange, routing_key, true, &m.props, &m.body)
            .expect("publish");
        if ch.outstanding_confirms() >= 1000 {
            let s = ch
                .wait_for_confirms(500, Duration::from_secs(60))
                .expect("confirms");
            assert!(
                s.nacked.is_empty() && s.returned.is_empty(),
                "seed publish failed: {s:?}"
            );
        }
    }
    let s = ch
        .wait_for_confirms(0, Duration::from_secs(60))
        .expect("confirms");
    assert!(
        s.nacked.is_empty() && s.returned.is_empty(),
        "seed publish failed: {s:?}"
    );
}

/// Publishes `n` messages of `size` random bytes, fast (for deep queues), numbered in their
/// `seq` header and their first 8 body bytes.
pub fn publish_bulk(ch: &Channel, queue: &str, n: usize, size: usize) {
    publish_numbered(ch, queue, n, size, None);
}

/// [`publish_bulk`] with `delivery_mode` 2: messages a classic queue keeps over a restart.
pub fn publish_bulk_persistent(ch: &Channel, queue: &str, n: usize, size: usize) {
    publish_numbered(ch, queue, n, size, Some(2));
}

fn publish_numbered(ch: &Channel, queue: &str, n: usize, size: usize, delivery_mode: Option<u8>) {
    ch.confirm_select().expect("confirm.select");
    let mut rng = Rng::new(n as u64);
    for i in 0..n {
        let mut body = rng.bytes(size);
        body[..8.min(size)].copy_from_slice(&(i as u64).to_be_bytes()[..8.min(size)]);
        let props = BasicProperties {
            headers: Some(vec![("seq".into(), FieldValue::I64(i as i64))]),
            delivery_mode,
            ..Default::default()
        };
        ch.basic_publish("", queue, true, &props, &body)
            .expect("publish");
        if ch.outstanding_confirms() >= 2000 {
            ch.wait_for_confirms(1000, Duration::from_secs(60))
                .expect("confirms");
        }
    }
    ch.wait_for_confirms(0, Duration::from_secs(120))
        .expect("confirms");
}

/// The integer header `key` of a delivery (`publish_bulk` numbers its messages in `seq`).
pub fn header_i64(d: &Delivery, key: &str) -> i64 {
    match d
        .properties
        .headers
        .as_ref()
        .and_then(|h| h.iter().find(|(k, _)| k == key))
    {
        Some((_, FieldValue::I64(n))) => *n,
        other => panic!("no {key} header: {other:?}"),
    }
}

/// The `seq` headers of `ds`, in order.
pub fn seqs(ds: &[Delivery]) -> Vec<i64> {
    ds.iter().map(|d| header_i64(d, "seq")).collect()
}

/// Takes the `n` messages of a queue that holds `n` away, in order: their sequence numbers
/// (`seq`) and delivery counts. One consumer with automatic acknowledgement, so nothing goes
/// back to the queue (nothing is counted or dropped by this read). It replaced a `basic.get`
/// per message, which on a RabbitMQ 4.3.6 quorum queue of 50,000 took about 200 s (the broker
/// answering one get at a time); a consumer takes seconds.
pub fn drain(conn: &Connection, queue: &str, n: usize) -> (Vec<i64>, Vec<u64>) {
    let ch = conn.open_channel().expect("channel");
    let consumer = ch
        .basic_consume(queue, "drain", true, false, &FieldTable::new())
        .expect("consume");
    let got: Vec<Delivery> = (0..n)
        .map(|i| {
            consumer
                .recv_timeout(Duration::from_secs(60))
                .expect("delivery")
                .unwrap_or_else(|| panic!("queue {queue}: message {i} of {n} never came"))
        })
        .collect();
    let _ = ch.close();
    let counts = got
        .iter()
        .map(rmq_backup::broker::reader::delivery_count)
        .collect();
    (seqs(&got), counts)
}

/// Reads the first `n` messages of `queue` without removing any (consume windows without ack,
/// then close), in order.
pub fn peek(conn: &Connection, queue: &str, n: usize) -> Vec<Delivery> {
    peek_as(conn, queue, n, false)
}

/// [`peek`], each delivery's properties kept as the broker sent them (`Delivery::wire`) when
/// `wire`.
pub fn peek_as(conn: &Connection, queue: &str, n: usize, wire: bool) -> Vec<Delivery> {
    let mut out: Vec<Delivery> = Vec::with_capacity(n);
    let mut channels = Vec::new();
    while out.len() < n {
        let window = (n - out.len()).min(65_535);
        let ch = conn.open_channel().expect("channel");
        ch.keep_wire_properties(wire);
        ch.basic_qos(window as u16, false).expect("qos");
        let consumer = ch
            .basic_consume(
                queue,
                &format!("peek-{}", channels.len()),
                false,
                false,
                &FieldTable::new(),
            )
            .expect("consume");
        let mut last_tag = 0;
        for _ in 0..window {
            let d = consumer
                .recv_timeout(Duration::from_secs(60))
                .expect("delivery")
                .unwrap_or_else(|| {
                    panic!("queue {queue}: only {} of {n} messages arrived", out.len())
                });
            last_tag = d.delivery_tag;
            out.push(d);
        }
        channels.push((ch, consumer, last_tag));
    }
    let control = conn.open_channel().expect("channel");
    let before = control
        .queue_declare_passive(queue)
        .expect("passive declare")
        .message_count;
    // On 4.x a nack gives the messages back in order (and on 4.3 without raising a quorum
    // message's delivery count, where a close raises it); 3.10 applies a large nack to a
    // quorum queue in hash order, and a close keeps the order. The connection's broker decides
    // (the test cluster is 3.10 whatever the test broker). The channels close once the nacked
    // messages are back (a close first would return them itself).
    let nack = version_of(conn) >= (4, 0);
    for (ch, consumer, last_tag) in &channels {
        let _ = ch.basic_cancel(consumer.tag());
        if nack {
            let _ = ch.basic_nack(*last_tag, true, true);
        }
    }
    let back = || {
        // Quorum queues apply returns asynchronously: wait until the messages are ready again.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while (control
            .queue_declare_passive(queue)
            .expect("passive declare")
            .message_count as usize)
            < before as usize + n
        {
            assert!(
                std::time::Instant::now() < deadline,
                "queue {queue}: peeked messages did not come back"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    if nack {
        back();
    }
    for (ch, _, _) in channels {
        let _ = ch.close();
    }
    back();
    let _ = control.close();
    out
}

/// The (major, minor) version of the broker `conn` is connected to, from its
/// `server-properties`.
pub fn version_of(conn: &Connection) -> (u32, u32) {
    conn.server_properties()
        .iter()
        .find(|(k, _)| k == "version")
        .and_then(|(_, v)| match v {
            FieldValue::LongString(b) => std::str::from_utf8(b).ok(),
            _ => None,
        })
        .and_then(rmq_backup::broker::BrokerVersion::parse)
        .map_or((0, 0), |v| (v.major, v.minor))
}

/// Waits (at most 30 s) until `queue` holds `n` ready messages: messages given back by a
/// closed channel or consumer are requeued by the broker after close-ok, not before.
pub fn wait_ready(ch: &Channel, queue: &str, n: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = ch
            .queue_declare_passive(queue)
            .expect("passive declare")
            .message_count;
        if ready == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queue {queue}: {ready} ready, {n} expected"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Ready messages in `queue` (passive declare) once the count has settled: messages given
/// back by a consumer that just closed take a moment to be ready again, so the count must stay
/// the same for 300 ms (at most 30 s).
pub fn depth(conn: &Connection, queue: &str) -> u32 {
    let ch = conn.open_channel().expect("channel");
    let read = || {
        ch.queue_declare_passive(queue)
            .expect("passive declare")
            .message_count
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut last, mut since) = (read(), std::time::Instant::now());
    while since.elapsed() < Duration::from_millis(300) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let n = read();
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        }
    }
    let _ = ch.close();
    last
}

/// How a queue gives header tables back (ENVIRONMENT.md): classic queues keep the keys in
/// their order on every delivery; quorum queues sort them once a message was requeued (and add
/// `x-delivery-count`), streams always.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    InOrder,
    Sorted,
}

impl Headers {
    /// The header behaviour of a queue of type `kind` (`classic`, `quorum`, `stream`) on the
    /// test broker: RabbitMQ 4.x sorts every message's header keys when it is published, on
    /// every queue type (measured on 4.0.5 and 4.3.6).
    pub fn of(kind: &str) -> Headers {
        if kind == "classic" && !broker().is_4x() {
            Headers::InOrder
        } else {
            Headers::Sorted
        }
    }
}

/// Headers a broker adds to a message it delivers: a quorum queue's delivery count (3.x, 4.x)
/// and acquired count (4.3).
pub const BROKER_HEADERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// Properties as compared: without the broker's own [`BROKER_HEADERS`], header keys sorted
/// only for [`Headers::Sorted`]. For a classic queue an empty table and an absent one stay
/// different; a quorum queue merges them itself (a requeue adds `x-delivery-count` to both),
/// so for [`Headers::Sorted`] an empty table counts as none.
pub fn comparable(props: &BasicProperties, headers: Headers) -> BasicProperties {
    let mut p = props.clone();
    if let Some(h) = p.headers.as_mut() {
        let before = h.len();
        h.retain(|(k, _)| !BROKER_HEADERS.contains(&k.as_str()));
        // RabbitMQ 4.x sorts the keys of every message at publish, whatever the queue.
        if headers == Headers::Sorted || broker().is_4x() {
            h.sort_by(|a, b| a.0.cmp(&b.0));
        }
        if h.is_empty() && (before > 0 || headers == Headers::Sorted) {
            p.headers = None;
        }
    }
    p
}

/// `msgs` in the order a queue of type `kind` on the test broker delivers them, published in
/// this order: quorum queues of RabbitMQ 4.3 deliver by priority, highest first (no priority
/// counts as 4); those of 4.0-4.2 have two levels (above 4, and the rest) and deliver two
/// high for one normal while both have messages (measured on 4.3.6 and 4.0.5). Classic queues
/// without `x-max-priority`, 3.x quorum queues and streams keep the publish order.
pub fn in_broker_order(msgs: &[Msg], kind: &str) -> Vec<Msg> {
    let b = broker();
    if kind != "quorum" || !b.is_4x() {
        return msgs.to_vec();
    }
    let priority = |m: &Msg| m.props.priority.unwrap_or(4);
    if b.version >= (4, 3) {
        let mut out = msgs.to_vec();
        out.sort_by_key(|m| std::cmp::Reverse(priority(m)));
        return out;
    }
    let (high, normal): (Vec<&Msg>, Vec<&Msg>) = msgs.iter().partition(|m| priority(m) > 4);
    let (mut high, mut normal) = (high.into_iter(), normal.into_iter());
    let mut out = Vec::with_capacity(msgs.len());
    loop {
        let mut took = false;
        for m in high.by_ref().take(2) {
            out.push(m.clone());
            took = true;
        }
        if let Some(m) = normal.next() {
            out.push(m.clone());
            took = true;
        }
        if !took {
            return out;
        }
    }
}

/// Asserts that `got` holds exactly `expected`, in order: body, every property, every header
/// with its type, header keys in their order (a classic queue).
pub fn assert_same(expected: &[Msg], got: &[Delivery], what: &str) {
    assert_same_as(expected, got, Headers::InOrder, what);
}

/// [`assert_same`] for a queue whose header behaviour is `headers`.
pub fn assert_same_as(expected: &[Msg], got: &[Delivery], headers: Headers, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: message count");
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        assert_eq!(g.body, e.body, "{what}: body of message {i}");
        assert_eq!(
            comparable(&g.properties, headers),
            comparable(&e.props, headers),
            "{what}: properties of message {i}"
        );
    }
}

/// What a restore gives back for `msgs`: the record format keeps `headers` as an array, never
/// null (SPEC.md BackupRecord), so a message published with an empty header table comes back
/// with none (README "What a backup keeps").
pub fn as_restored(msgs: &[Msg]) -> Vec<Msg> {
    msgs.iter()
        .map(|m| Msg {
            props: restored_props(&m.props),
            body: m.body.clone(),
        })
        .collect()
}

/// [`as_restored`] of one message's properties.
pub fn restored_props(props: &BasicProperties) -> BasicProperties {
    let mut p = props.clone();
    if p.headers.as_ref().is_some_and(|h| h.is_empty()) {
        p.headers = None;
    }
    p
}

/// Reads `n` messages of stream `name` over AMQP 0-9-1 from its first offset (prefetch 100,
/// acks only for credit), without the broker's `x-stream-offset` header.
pub fn read_stream_091(conn: &Connection, name: &str, n: usize) -> Vec<Delivery> {
    let ch = conn.open_channel().expect("channel");
    ch.basic_qos(100, false).expect("qos");
    let args: FieldTable = vec![(
        "x-stream-offset".into(),
        FieldValue::LongString(b"first".to_vec()),
    )];
    let consumer = ch
        .basic_consume(name, "check", false, false, &args)
        .expect("consume");
    let mut out = Vec::new();
    while out.len() < n {
        let mut d = consumer
            .recv_timeout(Duration::from_secs(30))
            .expect("recv")
            .expect("a delivery within 30 s");
        ch.basic_ack(d.delivery_tag, false).expect("ack");
        if let Some(h) = d.properties.headers.as_mut() {
            h.retain(|(k, _)| k != "x-stream-offset");
            if h.is_empty() {
                d.properties.headers = None;
            }
        }
        out.push(d);
    }
    ch.close().expect("close");
    out
}

/// The manifest of backup `id` in the filesystem store `store`.
pub fn manifest(store: &Path, id: &str) -> rmq_backup::repository::manifest::Manifest {
    rmq_backup::repository::manifest::Manifest::from_json(
        &std::fs::read(store.join(id).join("manifest.json")).expect("manifest"),
    )
    .expect("parse")
}

/// Runs `scripts/<name>` from the repository and returns the absolute path it prints on its
/// last line of stdout (what build-static.sh and build-deb.sh built); panics with its stderr
/// when it fails.
pub fn script_output_path(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts").join(name))
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    assert!(
        out.status.success(),
        "scripts/{name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let last = printed.lines().last().unwrap_or_default().trim();
    root.join(last).display().to_string()
}

/// The messages a backup holds for `queue` (first match by name), decoded from its segments
/// in order, as a restore would publish them.
pub fn backed_up(store: &Path, backup_id: &str, queue: &str) -> Vec<Delivery> {
    use rmq_backup::repository::segment::SegmentReader;
    let m = manifest(store, backup_id);
    let q = m
        .queues
        .iter()
        .find(|q| q.name == queue)
        .unwrap_or_else(|| panic!("{queue} not in backup {backup_id}"));
    let mut out = Vec::new();
    for s in &q.segments {
        let reader = SegmentReader::open(&store.join(&s.key)).expect("segment");
        for json in reader.records() {
            let record = json.expect("record").into_record().expect("decode");
            let (delivery_tag, redelivered) = (record.delivery_tag, record.redelivered);
            let (exchange, routing_key) = (record.exchange.clone(), record.routing_key.clone());
            let (properties, body) = record.into_amqp();
            out.push(Delivery {
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
                properties,
                wire: None,
                body,
            });
        }
    }
    out
}

/// A fresh temp directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("rmqb-{prefix}-{}", unique_suffix()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn url(&self) -> String {
        format!("file://{}", self.0.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `rmq-backup` binary the tests run: this build's, or the one `RMQ_BACKUP_TEST_BIN`
/// names (to run the CLI tests against another build: the static binary, or an older commit's
/// to show a regression test failing there).
pub fn binary() -> String {
    std::env::var("RMQ_BACKUP_TEST_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_rmq-backup").to_string())
}

/// Runs the real `rmq-backup` binary.
pub fn run_cli(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run rmq-backup")
}

/// Runs the real `rmq-backup` binary with extra environment variables.
pub fn run_cli_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .output()
        .expect("run rmq-backup")
}

/// Runs the real `rmq-backup` binary and returns its output and its peak resident set size
/// in KiB (`VmHWM` of `/proc/<pid>/status`, read every 5 ms until it exits).
pub fn run_cli_peak_rss(args: &[&str]) -> (Output, u64) {
    let child = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rmq-backup");
    let status = format!("/proc/{}/status", child.id());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(&status) {
                    if let Some(kb) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmHWM:"))
                        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
                    {
                        peak = peak.max(kb);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        })
    };
    let out = child.wait_with_output().expect("wait for rmq-backup");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, watch.join().expect("watcher"))
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Writes `yaml` to `dir/name` and returns the path as a string.
pub fn write_config(dir: &Path, name: &str, yaml: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, yaml).expect("write config");
    p.display().to_string()
}

/// A backup config for the test broker, reading only `vhost`, writing to `dir`.
pub fn backup_yaml(backup_id: &str, vhost: &str, dir: &Path, extra_backup: &str) -> String {
    format!(
        r#"mode: backup
backup_id: "{backup_id}"
source:
  amqp_url: "{amqp}"
  management_url: "{mgmt}"
  management_username: guest
  management_password: guest
  stream_port: {stream}
  queues:
    vhosts: ["{vhost}"]
storage:
  backend: filesystem
  path: "{dir}"
backup:
  include_definitions: true
{extra_backup}
"#,
        amqp = amqp_url(vhost),
        mgmt = management_url(),
        stream = stream_port(),
        dir = dir.display(),
    )
}

/// A restore config for the test broker.
pub fn restore_yaml(backup_id: &str, dir: &Path, restore: &str) -> String {
    format!(
        r#"mode: restore
backup_id: "{backup_id}"
target:
  amqp_url: "{amqp}"
  management_url: "{mgmt}"
  management_username: guest
  management_password: guest
  stream_port: {stream}
storage:
  backend: filesystem
  path: "{dir}"
restore:
{restore}
"#,
        amqp = amqp_url("/"),
        mgmt = management_url(),
        stream = stream_port(),
        dir = dir.display(),
    )
}

/// Starts the binary with `args`, its stderr lines sent to the receiver as they come.
pub fn spawn_cli(
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(binary())
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The stderr lines of an exited [`spawn_cli`] child not received yet: all of them, up to its
/// end (the reader thread may still be sending when the child has exited).
pub fn rest_of(rx: &std::sync::mpsc::Receiver<String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(10)) {
        out.push(line);
    }
    out
}

/// Waits (at most 120 s) for a stderr line containing `needle`; panics with what came.
pub fn wait_line(rx: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    panic!(
        "no line with {needle:?}; stderr so far:\n{}",
        seen.join("\n")
    );
}

/// How the test broker converts stream messages for AMQP 0-9-1 (its version), for records
/// made with `rmq_backup::broker::stream::amqp10::to_record`.
pub fn conversion() -> rmq_backup::broker::stream::amqp10::Conversion {
    let (major, minor) = broker().version;
    rmq_backup::broker::stream::amqp10::Conversion::of_version(&format!("{major}.{minor}"))
}

/// Writes age `secret` into `dir/identity.txt`, readable by its owner only (as
/// `restore.encryption.identity_file` requires); returns its path.
pub fn identity_file(dir: &Path, secret: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("identity.txt");
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}
