//! The AMQP 1.0 side of the benchmark (`BENCH_PROTOCOL=amqp10`, RabbitMQ 4.0+): the same
//! messages as the 0-9-1 run encoded as AMQP 1.0 messages, seeding and the raw references over
//! AMQP 1.0 with the project's own client (`rmq_backup::broker::amqp10`) as the raw client.
//!
//! Like the 0-9-1 references, the raw ones time only reading / publishing: connections,
//! sessions and links are opened and every message is encoded before the clock starts.

use super::{bench_amqp, connect, declare_queues, queue_names, queue_type, Args, Messages};
use super::{raw_confirm_window, RawRead};
use rmq_backup::broker::amqp::{AmqpUrl, Connection as Conn091, FieldValue};
use rmq_backup::broker::amqp10::codec::{encode_value, Value};
use rmq_backup::broker::amqp10::{queue_address, ConnectOptions, Connection, Outcome};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// `BENCH_PROTOCOL=amqp10`: seed, read, back up and restore over AMQP 1.0 (else 0-9-1).
pub fn amqp10_mode() -> bool {
    std::env::var("BENCH_PROTOCOL").as_deref() == Ok("amqp10")
}

/// The major version of a RabbitMQ version string ("4.3.6" -> 4; 0 when it does not parse).
pub fn major(version: &str) -> u32 {
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// An AMQP 1.0 connection to `vhost` of the benchmark's broker (the client's defaults).
pub fn connect10(vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&format!("{}/{vhost}", bench_amqp())).expect("url");
    Connection::open(&ConnectOptions::new(url)).expect("connect over AMQP 1.0")
}

/// A described section (part 3, 3.2): descriptor `code`, value `v`.
fn section(code: u64, v: Value, out: &mut Vec<u8>) {
    encode_value(
        &Value::Described(Box::new(Value::Ulong(code)), Box::new(v)),
        out,
    );
}

/// A 0-9-1 header value as an application property (simple types only, part 3, 3.2.5).
fn simple(v: &FieldValue) -> Value {
    match v {
        FieldValue::LongString(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        FieldValue::I64(n) => Value::Long(*n),
        FieldValue::I32(n) => Value::Int(*n),
        FieldValue::Bool(b) => Value::Bool(*b),
        other => Value::String(format!("{other:?}")),
    }
}

/// The benchmark's messages as AMQP 1.0 messages, encoded before any clock: message `i` of
/// [`Messages`] as a header (durable, the 0-9-1 persistent), properties (its message id),
/// application-properties (its 20 headers) and one data section (its body).
pub struct Encoded(Vec<Vec<u8>>);

impl Encoded {
    pub fn new(msgs: &Messages) -> Encoded {
        let encoded = (0..msgs.distinct())
            .map(|i| {
                let m = msgs.get(i);
                let mut out = Vec::with_capacity(m.body.len() + 1024);
                section(0x70, Value::List(vec![Value::Bool(true)]), &mut out);
                let id = m.properties.message_id.clone().unwrap_or_default();
                section(0x73, Value::List(vec![Value::String(id)]), &mut out);
                let props = m
                    .properties
                    .headers
                    .iter()
                    .flatten()
                    .map(|(k, v)| (Value::String(k.clone()), simple(v)))
                    .collect();
                section(0x74, Value::Map(props), &mut out);
                section(0x75, Value::Binary(m.body.clone()), &mut out);
                out
            })
            .collect();
        Encoded(encoded)
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.0[i % self.0.len()]
    }
}

/// Publishes `n` messages of `enc` into `queue` of `vhost` over AMQP 1.0, unsettled, each
/// settled by the broker with `accepted` (its publisher confirm), a sliding window of
/// [`raw_confirm_window`] unsettled as the 0-9-1 raw publish; the connection, session and link
/// are opened before `barrier` and the clock. Returns when it started and ended.
fn publish_one(
    vhost: &str,
    queue: &str,
    n: usize,
    enc: &Encoded,
    barrier: &Barrier,
) -> (Instant, Instant) {
    let conn = connect10(vhost);
    let session = conn.session().expect("session");
    let sender = session
        .sender(&queue_address(queue).expect("address"))
        .expect("sender");
    let window = raw_confirm_window() as usize;
    let check = |outcomes: Vec<rmq_backup::broker::amqp10::SendOutcome>| {
        for o in outcomes {
            assert_eq!(
                o.outcome,
                Outcome::Accepted,
                "a raw AMQP 1.0 publish failed"
            );
        }
    };
    barrier.wait();
    let started = Instant::now();
    for i in 0..n {
        if sender.unsettled() >= window {
            check(
                sender
                    .wait_settled(window - 1, Duration::from_secs(60))
                    .expect("settled"),
            );
        }
        sender.send(enc.get(i)).expect("send");
    }
    check(
        sender
            .wait_settled(0, Duration::from_secs(60))
            .expect("settled"),
    );
    let ended = Instant::now();
    sender.detach().expect("detach");
    session.end().expect("end");
    conn.close().expect("close");
    (started, ended)
}

/// [`publish_one`] into every queue of `queues` at once (a connection each): the time from the
/// first start to the last end.
pub fn publish_parallel10(
    vhost: &str,
    queues: &[String],
    per_queue: usize,
    enc: &Encoded,
) -> Duration {
    let barrier = Barrier::new(queues.len());
    let parts: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .iter()
            .map(|q| s.spawn(|| publish_one(vhost, q, per_queue, enc, &barrier)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("publisher"))
            .collect()
    });
    let start = parts.iter().map(|p| p.0).min().expect("a queue");
    let end = parts.iter().map(|p| p.1).max().expect("a queue");
    end - start
}

/// [`super::seed`] over AMQP 1.0: declares the queues (0-9-1), publishes `a.n` messages of
/// `enc` into them over AMQP 1.0, and returns a 0-9-1 connection to `vhost` (for the depth
/// polls of [`raw_read10`]).
pub fn seed10(vhost: &str, a: &Args, enc: &Encoded) -> Conn091 {
    let queues = queue_names();
    println!(
        "seeding {} x {} B {} messages (20 application properties) into {} {} queue(s) over AMQP 1.0 ...",
        a.n,
        a.size,
        a.kind(),
        queues.len(),
        queue_type()
    );
    let conn = connect(vhost);
    declare_queues(&conn, &queues);
    publish_parallel10(vhost, &queues, a.n / queues.len(), enc);
    conn
}

/// The raw read over AMQP 1.0: one receiver link on `queue` of `vhost` (attached before the
/// clock, no credit), then inside the clock credit for all `n`, every delivery taken unsettled,
/// all given back with one settled `released` disposition (rmq-backup's give-back), and the
/// queue's ready count (0-9-1 `control` connection) polled until it is `n` again (1 ms doubling
/// up to 50 ms, at most 60 s), as the 0-9-1 [`super::raw_read`].
pub fn raw_read10(vhost: &str, control: &Conn091, queue: &str, n: usize) -> RawRead {
    let conn = connect10(vhost);
    let session = conn.session().expect("session");
    let mut receiver = session
        .receiver(&queue_address(queue).expect("address"), 0)
        .expect("receiver");
    let ch = control.open_channel().expect("channel");
    let started = Instant::now();
    receiver
        .add_credit(u32::try_from(n).expect("credit"))
        .expect("credit");
    let (mut first, mut last) = (None, 0);
    for _ in 0..n {
        let d = receiver
            .recv(Duration::from_secs(60))
            .expect("recv")
            .expect("a delivery within 60 s");
        first.get_or_insert(d.delivery_id);
        last = d.delivery_id;
    }
    let delivered = Instant::now();
    if let Some(first) = first {
        receiver
            .disposition(first, last, Outcome::Released)
            .expect("disposition");
    }
    let mut pause = Duration::from_millis(1);
    while (ch
        .queue_declare_passive(queue)
        .expect("declare")
        .message_count as usize)
        < n
    {
        assert!(
            delivered.elapsed() < Duration::from_secs(60),
            "the raw AMQP 1.0 read's messages did not come back within 60 s"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    let whole = Instant::now();
    ch.close().expect("close");
    receiver.detach().expect("detach");
    session.end().expect("end");
    conn.close().expect("close");
    RawRead {
        delivered: delivered - started,
        whole: whole - started,
    }
}
