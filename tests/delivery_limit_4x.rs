//! Quorum queues on RabbitMQ 4.x where the facts a backup decides on change under it (issue
//! 37, items 3 and 4):
//!
//! - a cluster in the middle of an upgrade: the management API answers from a 4.3 node, the
//!   AMQP connection lands on a 4.0 node, where every return counts. The node the read happens
//!   on decides, before the first message is taken (here two brokers stand for the two nodes:
//!   the 4.3.6 management API lists the queue, the 4.0.5 broker holds the messages);
//! - on 4.3, a connection lost while a read holds messages gives them back counted: the retry
//!   keeps the same headroom as 4.0-4.2, and the manifest says how many got one count more.
//!
//! Both need RabbitMQ 4.3.6 (and the first 4.0.5) of `scripts/setup-rabbitmq-4x.sh`, whatever
//! `RMQ_TEST_BROKER` says.

mod common;

use common::proxy::TcpProxy;
use common::*;
use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection, FieldTable, FieldValue};
use rmq_backup::broker::management::encode_segment;
use std::time::{Duration, Instant};

/// A vhost of the test's own on broker `b`, deleted on drop.
struct Vhost {
    b: &'static TestBroker,
    name: String,
}

impl Vhost {
    fn new(b: &'static TestBroker, name: &str) -> Vhost {
        let m = b.management();
        let _ = m.delete_vhost(name);
        m.create_vhost(name).expect("create vhost");
        m.set_permissions(name, "guest").expect("permissions");
        Vhost {
            b,
            name: name.to_string(),
        }
    }

    fn connect(&self) -> Connection {
        let url = AmqpUrl::parse(&self.b.amqp_url(&self.name)).expect("url");
        Connection::open(&ConnectOptions::new(url)).expect("connect")
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = self.b.management().delete_vhost(&self.name);
    }
}

fn quorum_args() -> FieldTable {
    vec![(
        "x-queue-type".into(),
        FieldValue::LongString(b"quorum".to_vec()),
    )]
}

/// Sets policy `name` with `definition` on `vhost` of the broker behind `m`.
fn set_policy(m: &str, vhost: &str, name: &str, pattern: &str, definition: &str) {
    ureq::put(&format!(
        "{m}/api/policies/{}/{name}",
        encode_segment(vhost)
    ))
    .header("authorization", MANAGEMENT_AUTH)
    .header("content-type", "application/json")
    .send(format!(
        r#"{{"pattern":"{pattern}","definition":{definition},"apply-to":"queues"}}"#
    ))
    .expect("set policy");
    std::thread::sleep(Duration::from_millis(500));
}

/// Waits (at most 60 s) until the management API reports `limit` as `queue`'s delivery limit.
fn wait_for_limit(m: &str, vhost: &str, queue: &str, limit: i64) {
    let url = format!("{m}/api/queues/{}/{queue}", encode_segment(vhost));
    let start = Instant::now();
    loop {
        let q: serde_json::Value = ureq::get(&url)
            .header("authorization", MANAGEMENT_AUTH)
            .call()
            .expect("get queue")
            .body_mut()
            .read_json()
            .expect("queue json");
        if q["delivery_limit"].as_i64() == Some(limit) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the management API never showed delivery_limit {limit}: {q}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn backup_config(dir: &TempDir, vhost: &str, amqp: &str, mgmt: &str, extra: &str) -> String {
    let yaml = format!(
        r#"mode: backup
backup_id: "b"
source:
  amqp_url: "{amqp}"
  management_url: "{mgmt}"
  management_username: guest
  management_password: guest
  queues:
    vhosts: ["{vhost}"]
storage:
  backend: filesystem
  path: "{store}"
backup:
  include_definitions: false
{extra}
"#,
        store = dir.path().join("store").display()
    );
    write_config(dir.path(), "b.yaml", &yaml)
}

#[test]
fn the_older_node_behind_the_connection_decides() {
    let (new, old) = (TestBroker::named("4.3"), TestBroker::named("4.0"));
    let name = format!("rmqb-test-mixed-{}", unique_suffix());
    let (listed, held) = (Vhost::new(new, &name), Vhost::new(old, &name));
    // The same queue on both "nodes", as a cluster would show it; messages on the old one.
    for v in [&listed, &held] {
        let conn = v.connect();
        let ch = conn.open_channel().unwrap();
        ch.queue_declare("orders", true, false, false, &quorum_args())
            .unwrap();
        publish_bulk(&ch, "orders", 10, 16);
    }
    let dir = TempDir::new("mixed");
    let cfg = backup_config(&dir, &name, &old.amqp_url(&name), &new.management_url(), "");
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    let all = format!("{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(4), "{all}");
    assert!(
        all.contains("a node of the source runs RabbitMQ 4.0.5")
            && all.contains("skipped queue orders")
            && all.contains("delivery limit of 20"),
        "decided on 4.0.5, the node the read would happen on: {all}"
    );
    let conn = held.connect();
    let (order, counts) = drain(&conn, "orders", 10);
    assert_eq!(order, (0..10).collect::<Vec<_>>());
    assert!(
        counts.iter().all(|c| *c == 0),
        "not one message taken: {counts:?}"
    );
}

/// A backup of `queue` (`n` messages) on RabbitMQ 4.3.6 through a proxy that is cut once the
/// read has stored a segment: the exit code and the log.
fn cut_mid_read(v: &Vhost, queue: &str, n: usize, dir: &TempDir) -> (Option<i32>, String) {
    let b = v.b;
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", b.amqp_port).parse().unwrap());
    let amqp = format!(
        "amqp://guest:guest@127.0.0.1:{}/{}",
        proxy.port(),
        encode_segment(&v.name)
    );
    let cfg = backup_config(
        dir,
        &v.name,
        &amqp,
        &b.management_url(),
        "  connection_retry_backoff_ms: 200\n  segment_max_bytes: 100000\n",
    );
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, &format!("queue {queue}: {n} messages at start"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let store = dir.path().join("store");
    while !has_segment(&store) {
        assert!(Instant::now() < deadline, "no segment stored");
        std::thread::sleep(Duration::from_millis(2));
    }
    proxy.cut();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), rest_of(&lines).join("\n"))
}

fn has_segment(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                has_segment(&p)
            } else {
                name.starts_with("segment-") && !name.contains(".partial-")
            }
        })
}

#[test]
fn on_4_3_a_lost_connection_counts_and_the_retry_keeps_headroom() {
    let b = TestBroker::named("4.3");
    let v = Vhost::new(b, &format!("rmqb-test-lost43-{}", unique_suffix()));
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("fresh", true, false, false, &quorum_args())
        .unwrap();
    const N: usize = 50_000;
    publish_bulk(&ch, "fresh", N, 64);
    set_policy(
        &b.management_url(),
        &v.name,
        "limit",
        "^fresh$",
        r#"{"delivery-limit":3}"#,
    );

    // Messages at 0: the lost connection leaves what it held at 1, the retry reads them all.
    let dir = TempDir::new("lost43");
    let (code, log) = cut_mid_read(&v, "fresh", N, &dir);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("the connection was lost while the read held")
            && log.contains("reading it again from its head"),
        "{log}"
    );
    let m = manifest(&dir.path().join("store"), "b");
    assert_eq!(m.queues[0].message_count, N as u64);
    let raised = m.queues[0]
        .delivery_counts_raised
        .expect("the manifest counts what the loss raised");
    let (order, counts) = drain(&conn, "fresh", N);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..N as i64).collect::<Vec<_>>(), "every message");
    let at_one = counts.iter().filter(|c| **c == 1).count() as u64;
    assert!(
        counts.iter().all(|c| *c <= 1) && at_one >= raised && raised > 0,
        "the loss raised {at_one} (the manifest says at least {raised}); nothing else counted"
    );
}

#[test]
fn on_4_3_a_retry_leaves_alone_what_one_more_loss_would_drop() {
    let b = TestBroker::named("4.3");
    let v = Vhost::new(b, &format!("rmqb-test-near43-{}", unique_suffix()));
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("near", true, false, false, &quorum_args())
        .unwrap();
    const N: usize = 50_000;
    publish_bulk(&ch, "near", N, 64);
    set_policy(
        &b.management_url(),
        &v.name,
        "limit",
        "^near$",
        r#"{"delivery-limit":3}"#,
    );
    // The management API shows a new policy's limit only after its next statistics round
    // (measured on 4.3.6: 20 for about 5 s, then 3); a backup decides on what it shows.
    wait_for_limit(&b.management_url(), &v.name, "near", 3);
    // The application's own failed deliveries: every message at 1 (a closed channel's return
    // counts on 4.3). Two windows of 25,000, the second opened once the first is full.
    {
        let c = v.connect();
        let mut open = Vec::new();
        for w in 0..2 {
            let ch = c.open_channel().unwrap();
            ch.basic_qos(25_000, false).unwrap();
            let consumer = ch
                .basic_consume(
                    "near",
                    &format!("app-{w}"),
                    false,
                    false,
                    &FieldTable::new(),
                )
                .unwrap();
            for _ in 0..25_000 {
                consumer
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap()
                    .expect("delivery");
            }
            open.push(ch);
        }
        for ch in open {
            ch.close().unwrap();
        }
        let control = c.open_channel().unwrap();
        wait_ready(&control, "near", N as u32);
    }
    let dir = TempDir::new("near43");
    let (code, log) = cut_mid_read(&v, "near", N, &dir);
    assert_eq!(code, Some(4), "{log}");
    assert!(
        log.contains("skipped queue near")
            && log.contains("one more such loss would leave them at 3"),
        "{log}"
    );
    let (_, counts) = drain(&conn, "near", N);
    assert!(
        counts.iter().all(|c| *c <= 2),
        "nothing at the limit: {:?}",
        counts.iter().max()
    );
}

/// A quorum queue `q` of 10 messages on RabbitMQ 4.3.6 with a delayed-retry policy
/// (`delayed-retry-type` `kind`, `delayed-retry-min` `min_ms`), of which the application
/// rejected the first `rejected` (each then waits for its delayed retry when `kind` delays
/// failed deliveries).
fn delayed_retry_queue(v: &Vhost, kind: &str, min_ms: u64, rejected: usize) {
    let conn = v.connect();
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("q", true, false, false, &quorum_args())
        .unwrap();
    set_policy(
        &v.b.management_url(),
        &v.name,
        "retry",
        "^q$",
        &format!(r#"{{"delayed-retry-type":"{kind}","delayed-retry-min":{min_ms}}}"#),
    );
    publish_bulk(&ch, "q", 10, 16);
    if rejected > 0 {
        let app = conn.open_channel().unwrap();
        app.basic_qos(rejected as u16, false).unwrap();
        let consumer = app
            .basic_consume("q", "app", false, false, &FieldTable::new())
            .unwrap();
        let tags: Vec<u64> = (0..rejected)
            .map(|_| {
                consumer
                    .recv_timeout(Duration::from_secs(30))
                    .unwrap()
                    .expect("delivery")
                    .delivery_tag
            })
            .collect();
        app.basic_cancel(consumer.tag()).unwrap();
        for t in tags {
            app.basic_reject(t, true).unwrap();
        }
        app.close().unwrap();
    }
    // The management API's view of the queue (its policy, the delayed count) lags the queue by
    // a statistics interval (5-10 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = v.b.management().get_queue(&v.name, "q").unwrap();
        let shown = q
            .delayed_retry
            .as_deref()
            .is_some_and(|d| d.starts_with(kind));
        if shown && q.messages_delayed as usize == rejected * usize::from(kind != "returned") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the API does not show the delayed retry: {q:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn on_4_3_delayed_retries_of_returned_messages_leave_the_queue_alone() {
    let b = TestBroker::named("4.3");
    let v = Vhost::new(b, &format!("rmqb-test-delay-all-{}", unique_suffix()));
    delayed_retry_queue(&v, "all", 60_000, 0);
    let dir = TempDir::new("delay-all");
    let cfg = backup_config(&dir, &v.name, &b.amqp_url(&v.name), &b.management_url(), "");
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    assert!(
        stdout.contains("skipped queue q")
            && stdout.contains("delayed-retry-type all, min 60000 ms"),
        "{stdout}{stderr}"
    );
    // Nothing was given back, so nothing waits: every message still ready to its consumers.
    std::thread::sleep(Duration::from_secs(6));
    let q = b.management().get_queue(&v.name, "q").unwrap();
    assert_eq!((q.messages, q.messages_delayed), (10, 0), "{q:?}");
}

#[test]
fn on_4_3_messages_due_soon_are_waited_for_and_later_ones_left_out() {
    let b = TestBroker::named("4.3");
    // Due in 20 s: waited for, every message backed up; nacks are not delayed (failed only).
    let v = Vhost::new(b, &format!("rmqb-test-delay-soon-{}", unique_suffix()));
    delayed_retry_queue(&v, "failed", 20_000, 3);
    let dir = TempDir::new("delay-soon");
    let cfg = backup_config(&dir, &v.name, &b.amqp_url(&v.name), &b.management_url(), "");
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("wait for a delayed retry, due in"),
        "{stderr}"
    );
    let m = manifest(&dir.path().join("store"), "b");
    assert_eq!(m.queues[0].message_count, 10, "{stderr}");
    // Due in 10 minutes: the 7 ready ones are backed up, the 3 others named as left out.
    let v = Vhost::new(b, &format!("rmqb-test-delay-late-{}", unique_suffix()));
    delayed_retry_queue(&v, "failed", 600_000, 3);
    let dir = TempDir::new("delay-late");
    let cfg = backup_config(&dir, &v.name, &b.amqp_url(&v.name), &b.management_url(), "");
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    assert!(
        stdout.contains("3 message(s) left out")
            && stdout.contains("wait for a delayed retry until"),
        "{stdout}{stderr}"
    );
    let m = manifest(&dir.path().join("store"), "b");
    assert_eq!(m.queues[0].message_count, 7);
    assert_eq!(m.queues[0].messages_left_out, Some(3));
    let q = b.management().get_queue(&v.name, "q").unwrap();
    assert_eq!(
        q.messages_delayed, 3,
        "the backup delayed nothing more: {q:?}"
    );
}
