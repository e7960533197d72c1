//! From RabbitMQ 3.x to 4.x (docs/migration.md "From RabbitMQ 3.x to 4.x"): a backup of a 3.10.8 vhost
//! with classic-mirroring policies, restored with its definitions into 4.3.6 (as it was, with
//! the mirrored queue converted to a quorum queue, and with that queue created by
//! `create_missing_queues`), into 4.0.5, and into 3.10.8.
//!
//! The test names its brokers itself (`TestBroker::named("3.10")`, `("4.3")`), whatever
//! `RMQ_TEST_BROKER` says, and deletes every vhost it made on both at the end.

mod common;

use common::*;
use rmq_backup::broker::amqp::Channel;
use serde_json::{json, Value};

/// The vhosts a test made on each broker, deleted on drop.
struct Vhosts(Vec<(&'static TestBroker, String)>);

impl Vhosts {
    fn add(&mut self, b: &'static TestBroker, name: &str) -> String {
        self.0.push((b, name.to_string()));
        name.to_string()
    }
}

impl Drop for Vhosts {
    fn drop(&mut self) {
        for (b, name) in &self.0 {
            let _ = b.management().delete_vhost(name);
        }
    }
}

/// `GET path` of broker `b`'s management API, as JSON.
fn get_json(b: &TestBroker, path: &str) -> Value {
    let mut r = ureq::get(&format!("{}{path}", b.management_url()))
        .header("authorization", MANAGEMENT_AUTH)
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

fn enc(s: &str) -> String {
    rmq_backup::broker::management::encode_segment(s)
}

/// The policies of `vhost`: name to (pattern, apply-to, definition).
fn policies(b: &TestBroker, vhost: &str) -> Vec<(String, Value)> {
    let mut all: Vec<(String, Value)> = get_json(b, &format!("/api/policies/{}", enc(vhost)))
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                json!([p["pattern"], p["apply-to"], p["definition"]]),
            )
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// The bindings of `vhost` from its exchanges: (source, destination, routing key).
fn bindings(b: &TestBroker, vhost: &str) -> Vec<(String, String, String)> {
    let mut all: Vec<(String, String, String)> =
        get_json(b, &format!("/api/bindings/{}", enc(vhost)))
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["source"] != "")
            .map(|b| {
                let s = |k: &str| b[k].as_str().unwrap().to_string();
                (s("source"), s("destination"), s("routing_key"))
            })
            .collect();
    all.sort();
    all
}

/// The `policy` the management API lists for a queue, once its statistics have it (the field
/// is absent until then: up to 30 s); "" when none.
fn applied_policy(b: &TestBroker, vhost: &str, queue: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let q = get_json(b, &format!("/api/queues/{}/{}", enc(vhost), enc(queue)));
        match q.get("policy") {
            Some(Value::String(p)) => return p.clone(),
            Some(Value::Null) if q.get("messages").is_some() => return String::new(),
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no policy listed for {queue}: {q}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

const MIRRORED: &str = "mirrored.orders";
const PLAIN: &str = "plain";
const EXCHANGE: &str = "orders.x";

/// The source vhost on 3.10.8: a mirroring policy with a TTL over `mirrored.`, one that only
/// mirrors `only-ha`, a topic exchange bound to the mirrored queue (a lazy classic queue), a
/// plain queue no policy reaches; diverse messages in both queues, those of the mirrored one
/// routed through the exchange.
fn seed_source(b: &TestBroker, vhost: &str, msgs: &[Msg]) {
    let m = b.management();
    m.create_vhost(vhost).expect("create vhost");
    m.set_permissions(vhost, "guest").expect("permissions");
    let defs = json!({
        "policies": [
            {"vhost": vhost, "name": "ha-ttl", "pattern": "^mirrored\\.", "apply-to": "all",
             "priority": 0, "definition": {"ha-mode": "all", "message-ttl": 86400000}},
            {"vhost": vhost, "name": "ha-only", "pattern": "^only-ha$", "apply-to": "queues",
             "priority": 1, "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"}}
        ],
        "exchanges": [{"vhost": vhost, "name": EXCHANGE, "type": "topic", "durable": true,
                       "auto_delete": false, "internal": false, "arguments": {}}],
        "queues": [
            {"vhost": vhost, "name": MIRRORED, "durable": true, "auto_delete": false,
             "arguments": {"x-queue-mode": "lazy"}},
            {"vhost": vhost, "name": PLAIN, "durable": true, "auto_delete": false, "arguments": {}}
        ],
        "bindings": [{"vhost": vhost, "source": EXCHANGE, "destination": MIRRORED,
                      "destination_type": "queue", "routing_key": "orders.#", "arguments": {}}]
    });
    m.import_definitions(&serde_json::to_vec(&defs).unwrap())
        .expect("import the source definitions");
    let conn = b.connect(vhost);
    let ch: Channel = conn.open_channel().expect("channel");
    publish_via(&ch, EXCHANGE, "orders.new", msgs);
    publish(&ch, PLAIN, &msgs[..10]);
    assert_eq!(
        applied_policy(b, vhost, MIRRORED),
        "ha-ttl",
        "3.10 applies the mirroring policy"
    );
    let _ = ch.close();
    let _ = conn.close();
}

/// A backup configuration for `vhost` on broker `b`.
fn backup_config(b: &TestBroker, id: &str, vhost: &str, store: &std::path::Path) -> String {
    format!(
        r#"mode: backup
backup_id: "{id}"
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
  path: "{store}"
backup:
  include_definitions: true
"#,
        amqp = b.amqp_url(vhost),
        mgmt = b.management_url(),
        stream = b.stream_port,
        store = store.display(),
    )
}

/// A restore configuration into broker `b`: the source vhost's definitions only, mapped to
/// `target`.
fn restore_config(
    b: &TestBroker,
    id: &str,
    store: &std::path::Path,
    source: &str,
    target: &str,
    extra: &str,
) -> String {
    format!(
        r#"mode: restore
backup_id: "{id}"
target:
  amqp_url: "{amqp}"
  management_url: "{mgmt}"
  management_username: guest
  management_password: guest
  stream_port: {stream}
storage:
  backend: filesystem
  path: "{store}"
restore:
  restore_definitions: true
  definitions_selection:
    vhosts: ["{source}"]
  vhost_mapping:
    "{source}": "{target}"
{extra}"#,
        amqp = b.amqp_url("/"),
        mgmt = b.management_url(),
        stream = b.stream_port,
        store = store.display(),
    )
}

fn run(dir: &std::path::Path, name: &str, yaml: &str, command: &str) -> (i32, String, String) {
    let cfg = write_config(dir, name, yaml);
    let out = run_cli(&[command, "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

/// The order a quorum queue of RabbitMQ 4.3 delivers `msgs` in: by their `priority` property,
/// highest first (none counts as 4, at most 31), in publishing order within one priority
/// (`rabbit_fifo`'s DEFAULT_PRIORITY and MAX_PRIORITY, `rabbit_fifo_pq`).
fn quorum_order(msgs: &[Msg]) -> Vec<Msg> {
    let mut v = msgs.to_vec();
    v.sort_by_key(|m| std::cmp::Reverse(m.props.priority.unwrap_or(4).min(31)));
    v
}

const WARN_HA_MODE: &str = "definitions for RabbitMQ 4.3.6: policy ha-ttl in vhost {v}: key ha-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key";

#[test]
fn a_3_10_backup_with_mirroring_policies_restores_into_4_3_and_3_10() {
    let old = TestBroker::named("3.10");
    let new = TestBroker::named("4.3");
    let mut vhosts = Vhosts(Vec::new());
    let v = vhosts.add(old, &format!("rmqb-test-migration-{}", unique_suffix()));
    let msgs = diverse_messages(30, 30, false);
    seed_source(old, &v, &msgs);
    let dir = TempDir::new("migration");
    let store = dir.path().join("store");
    let (code, stdout, stderr) = run(
        dir.path(),
        "backup.yaml",
        &backup_config(old, "m", &v, &store),
        "backup",
    );
    assert_eq!(code, 0, "backup: {stdout}{stderr}");
    let expected = as_restored(&msgs);
    let expected_plain = as_restored(&msgs[..10]);
    let warned = |stderr: &str, line: &str| {
        let line = line.replace("{v}", &v);
        assert!(stderr.contains(&line), "no warning\n{line}\nin:\n{stderr}");
    };
    let ha_only_skipped = [
        "definitions for RabbitMQ 4.3.6: policy ha-only in vhost {v}: key ha-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "definitions for RabbitMQ 4.3.6: policy ha-only in vhost {v}: key ha-sync-mode dropped: RabbitMQ 4.0 removed classic queue mirroring and 4.x refuses the key",
        "definitions for RabbitMQ 4.3.6: policy ha-only in vhost {v}: not imported: no key is left once the keys RabbitMQ 4.x refuses are dropped",
    ];

    // Into 4.3.6: the policies without their mirroring keys, everything else as it was.
    let t1 = vhosts.add(new, &format!("{v}-t1"));
    let (code, stdout, stderr) = run(
        dir.path(),
        "restore-4.3.yaml",
        &restore_config(new, "m", &store, &v, &t1, ""),
        "restore",
    );
    assert_eq!(code, 0, "restore into 4.3: {stdout}{stderr}");
    warned(&stderr, WARN_HA_MODE);
    for line in ha_only_skipped {
        warned(&stderr, line);
    }
    assert!(!stderr.contains("quorum queue"), "{stderr}");
    assert_eq!(
        policies(new, &t1),
        [(
            "ha-ttl".to_string(),
            json!(["^mirrored\\.", "all", {"message-ttl": 86400000}])
        )]
    );
    assert_eq!(
        bindings(new, &t1),
        [(EXCHANGE.into(), MIRRORED.into(), "orders.#".into())]
    );
    let q = new.management().get_queue(&t1, MIRRORED).expect("queue");
    assert_eq!(q.type_name, "classic");
    assert_eq!(q.arguments.get("x-queue-mode"), Some(&json!("lazy")));
    let conn = new.connect(&t1);
    let got = peek(&conn, MIRRORED, msgs.len());
    assert_same_as(&expected, &got, Headers::Sorted, "4.3, mirrored queue");
    let got = peek(&conn, PLAIN, 10);
    assert_same_as(&expected_plain, &got, Headers::Sorted, "4.3, plain queue");
    drop(conn);

    // The dry run with convert_mirrored_queues lists every change and writes nothing.
    let convert = "  convert_mirrored_queues: quorum\n";
    let t2 = vhosts.add(new, &format!("{v}-t2"));
    let (code, stdout, stderr) = run(
        dir.path(),
        "dry.yaml",
        &restore_config(
            new,
            "m",
            &store,
            &v,
            &t2,
            &format!("{convert}  dry_run: true\n"),
        ),
        "restore",
    );
    assert_eq!(code, 0, "dry run: {stdout}{stderr}");
    let converted = format!("queue {MIRRORED} in vhost {v}: declared as a quorum queue (restore.convert_mirrored_queues), policy ha-ttl mirrored it; a quorum queue delivers messages of a higher priority property first");
    let lazy = format!(
        "queue {MIRRORED} in vhost {v}: argument x-queue-mode = \"lazy\" dropped: a quorum queue refuses it"
    );
    for line in [
        WARN_HA_MODE.replace("definitions for RabbitMQ 4.3.6: ", ""),
        ha_only_skipped[2].replace("definitions for RabbitMQ 4.3.6: ", ""),
        converted.clone(),
        lazy.clone(),
    ] {
        let line = line.replace("{v}", &v);
        assert!(
            stdout.contains(&format!("\n  {line}\n")),
            "{line}\nnot listed in:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("Changed for RabbitMQ 4.3.6 (6 change(s), names as in the backup):"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "  {v}/{MIRRORED} -> {t2}/{MIRRORED} (a quorum queue): 30 messages in backup"
        )),
        "{stdout}"
    );
    warned(
        &stderr,
        &format!("definitions for RabbitMQ 4.3.6: {converted}"),
    );
    assert!(
        new.management().get_queue(&t2, MIRRORED).is_err(),
        "the dry run created nothing"
    );

    // With convert_mirrored_queues: the mirrored queue arrives as a quorum queue, its
    // messages published in order; the plain queue stays classic.
    let (code, stdout, stderr) = run(
        dir.path(),
        "convert.yaml",
        &restore_config(new, "m", &store, &v, &t2, convert),
        "restore",
    );
    assert_eq!(code, 0, "restore with conversion: {stdout}{stderr}");
    warned(
        &stderr,
        &format!("definitions for RabbitMQ 4.3.6: {converted}"),
    );
    warned(&stderr, &format!("definitions for RabbitMQ 4.3.6: {lazy}"));
    warned(&stderr, WARN_HA_MODE);
    let q = new.management().get_queue(&t2, MIRRORED).expect("queue");
    assert_eq!(q.type_name, "quorum", "{q:?}");
    assert_eq!(
        serde_json::Value::Object(q.arguments.clone()),
        json!({"x-queue-type": "quorum"})
    );
    assert_eq!(
        new.management().get_queue(&t2, PLAIN).unwrap().type_name,
        "classic"
    );
    assert_eq!(
        bindings(new, &t2),
        [(EXCHANGE.into(), MIRRORED.into(), "orders.#".into())]
    );
    let conn = new.connect(&t2);
    let got = peek(&conn, MIRRORED, msgs.len());
    assert_same_as(
        &quorum_order(&expected),
        &got,
        Headers::Sorted,
        "4.3, converted quorum queue",
    );
    let got = peek(&conn, PLAIN, 10);
    assert_same_as(&expected_plain, &got, Headers::Sorted, "4.3, plain queue");
    // The TTL part of the mirroring policy still applies to the quorum queue.
    assert_eq!(applied_policy(new, &t2, MIRRORED), "ha-ttl");
    drop(conn);

    // Queues the restore creates itself (definitions only checked, create_missing_queues):
    // the converted one is declared a quorum queue.
    let t4 = vhosts.add(new, &format!("{v}-t4"));
    new.management().create_vhost(&t4).unwrap();
    new.management().set_permissions(&t4, "guest").unwrap();
    let (code, stdout, stderr) = run(
        dir.path(),
        "create.yaml",
        &restore_config(
            new,
            "m",
            &store,
            &v,
            &t4,
            &format!("{convert}  definitions_dry_run: true\n  publish_mode: direct-to-queue\n  create_missing_queues: true\n"),
        ),
        "restore",
    );
    assert_eq!(code, 0, "restore creating the queues: {stdout}{stderr}");
    let created = new.management().get_queue(&t4, MIRRORED).expect("created");
    assert_eq!(created.type_name, "quorum", "{created:?}");
    assert_eq!(
        new.management().get_queue(&t4, PLAIN).unwrap().type_name,
        "classic"
    );
    assert!(
        policies(new, &t4).is_empty(),
        "the definitions were not imported"
    );
    let conn = new.connect(&t4);
    let got = peek(&conn, MIRRORED, msgs.len());
    assert_same_as(
        &quorum_order(&expected),
        &got,
        Headers::Sorted,
        "4.3, created quorum queue",
    );
    drop(conn);

    // Into 4.0.5: the same keys dropped, the version named.
    let old4 = TestBroker::named("4.0");
    let t5 = vhosts.add(old4, &format!("{v}-t5"));
    let (code, stdout, stderr) = run(
        dir.path(),
        "restore-4.0.yaml",
        &restore_config(old4, "m", &store, &v, &t5, ""),
        "restore",
    );
    assert_eq!(code, 0, "restore into 4.0: {stdout}{stderr}");
    warned(&stderr, &WARN_HA_MODE.replace("4.3.6", "4.0.5"));
    warned(&stderr, &ha_only_skipped[2].replace("4.3.6", "4.0.5"));
    let conn = old4.connect(&t5);
    let got = peek(&conn, MIRRORED, msgs.len());
    assert_same_as(&expected, &got, Headers::Sorted, "4.0, mirrored queue");
    drop(conn);

    // Into 3.10.8 with the same options: nothing changes.
    let t3 = vhosts.add(old, &format!("{v}-t3"));
    let (code, stdout, stderr) = run(
        dir.path(),
        "restore-3.10.yaml",
        &restore_config(old, "m", &store, &v, &t3, convert),
        "restore",
    );
    assert_eq!(code, 0, "restore into 3.10: {stdout}{stderr}");
    assert!(!stderr.contains("dropped"), "{stderr}");
    assert!(
        stderr.contains("restore.convert_mirrored_queues: the target runs RabbitMQ 3.10.8, which still mirrors classic queues; the queues keep their type"),
        "{stderr}"
    );
    assert_eq!(
        policies(old, &t3),
        [
            (
                "ha-only".to_string(),
                json!(["^only-ha$", "queues", {"ha-mode": "all", "ha-sync-mode": "automatic"}])
            ),
            (
                "ha-ttl".to_string(),
                json!(["^mirrored\\.", "all", {"ha-mode": "all", "message-ttl": 86400000}])
            ),
        ]
    );
    let q = old.management().get_queue(&t3, MIRRORED).expect("queue");
    assert_eq!(q.type_name, "classic");
    assert_eq!(
        bindings(old, &t3),
        [(EXCHANGE.into(), MIRRORED.into(), "orders.#".into())]
    );
    let conn = old.connect(&t3);
    let got = peek(&conn, MIRRORED, msgs.len());
    assert_same_as(&expected, &got, Headers::InOrder, "3.10, mirrored queue");
    drop(conn);
}

/// A 3.10.8 vhost with a transient (non-durable, non-exclusive) queue and its messages, backed
/// up and restored into RabbitMQ 4.3.6 as an operator locks it down
/// (`deprecated_features.permit.transient_nonexcl_queues = false`, `global_qos = false`:
/// `RMQ_TEST_BROKER=4.3-no-metrics`, scripts/setup-rabbitmq-4x.sh). That broker would leave
/// the queue out of the definitions import without a word: the restore declares it durable,
/// says so, and restores every message. The tool's own connections use no denied feature: a
/// backup of the restored vhost on the locked-down broker completes too.
#[test]
fn a_transient_queue_of_3_10_restores_into_a_4_3_that_denies_transient_queues() {
    let old = TestBroker::named("3.10");
    let locked = TestBroker::named("4.3-no-metrics");
    let denied: Vec<String> = locked
        .management()
        .denied_deprecated_features()
        .expect("deprecated features");
    assert!(
        denied.iter().any(|f| f == "transient_nonexcl_queues"),
        "scripts/setup-rabbitmq-4x.sh denies it on {}: {denied:?}",
        locked.name
    );
    let mut vhosts = Vhosts(Vec::new());
    let v = vhosts.add(old, &format!("rmqb-test-transient-{}", unique_suffix()));
    let target = vhosts.add(locked, &format!("{v}-restored"));
    let m = old.management();
    m.create_vhost(&v).expect("create vhost");
    m.set_permissions(&v, "guest").expect("permissions");
    let conn = old.connect(&v);
    let ch = conn.open_channel().unwrap();
    ch.queue_declare("transient", false, false, false, &Default::default())
        .unwrap();
    let msgs = diverse_messages(20, 7, false);
    publish(&ch, "transient", &msgs);
    let dir = TempDir::new("transient");
    let store = dir.path().join("store");
    let (code, out, err) = run(
        dir.path(),
        "b.yaml",
        &backup_config(old, "t", &v, &store),
        "backup",
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(
        dir.path(),
        "r.yaml",
        &restore_config(locked, "t", &store, &v, &target, ""),
        "restore",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("queue transient in vhost")
            && err.contains("declared durable")
            && err.contains("transient_nonexcl_queues"),
        "the change is named: {err}"
    );
    let q = get_json(locked, &format!("/api/queues/{}/transient", enc(&target)));
    assert_eq!(q["durable"], true, "{q}");
    let tconn = locked.connect(&target);
    let got = peek(&tconn, "transient", msgs.len());
    assert_same_as(
        &as_restored(&msgs),
        &got,
        Headers::Sorted,
        "restored into the locked-down broker",
    );
    // A backup from the locked-down broker: the tool's own connections use no denied feature.
    let store2 = dir.path().join("store2");
    let (code, out, err) = run(
        dir.path(),
        "b2.yaml",
        &backup_config(locked, "again", &target, &store2),
        "backup",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        backed_up(&store2, "again", "transient").len(),
        msgs.len(),
        "{out}{err}"
    );
}
