use super::api::RawQueue;
use super::*;
use crate::broker::QueueType;
use serde_json::Map;
use std::sync::atomic::{AtomicU32, Ordering};

const BASE: &str = "http://127.0.0.1:15672/";

fn client() -> ManagementClient {
    ManagementClient::new(BASE, "guest", "guest", None).expect("client")
}

/// A vhost unique to this test process and call, deleted on drop.
struct TestVhost {
    client: ManagementClient,
    name: String,
}

impl TestVhost {
    fn new(tag: &str) -> TestVhost {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "mgmt-test {tag}/{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            crate::now_ms()
        );
        let client = client();
        client.create_vhost(&name).expect("create vhost");
        client.set_permissions(&name, "guest").expect("permissions");
        TestVhost { client, name }
    }
}

impl Drop for TestVhost {
    fn drop(&mut self) {
        let _ = self.client.delete_vhost(&self.name);
    }
}

#[test]
fn encodes_path_segments() {
    assert_eq!(encode_segment("/"), "%2F");
    assert_eq!(encode_segment("my queue"), "my%20queue");
    assert_eq!(encode_segment("a/b"), "a%2Fb");
    assert_eq!(encode_segment("x+y"), "x%2By");
    assert_eq!(encode_segment("%41"), "%2541");
    assert_eq!(encode_segment("ünï"), "%C3%BCn%C3%AF");
    assert_eq!(encode_segment("amq.gen-A_b~"), "amq.gen-A_b~");
    assert_eq!(encode_segment(".."), "%2E%2E");
    assert_eq!(encode_segment("a?b#c&d=e"), "a%3Fb%23c%26d%3De");
}

#[test]
fn messages_fall_back_to_ready_plus_unacked() {
    let parse = |s: &str| QueueInfo::from(serde_json::from_str::<RawQueue>(s).expect("json"));
    let q = parse(r#"{"vhost":"/","name":"q","type":"quorum","messages":7,"messages_ready":1}"#);
    assert_eq!(q.messages, 7);
    assert_eq!(q.queue_type, Some(QueueType::Quorum));
    let q = parse(r#"{"vhost":"/","name":"q","messages_ready":3,"messages_unacknowledged":4}"#);
    assert_eq!(q.messages, 7);
    let q = parse(r#"{"vhost":"/","name":"q","type":"x-custom","arguments":[]}"#);
    assert_eq!(q.messages, 0);
    assert_eq!(q.queue_type, None);
    assert_eq!(q.type_name, "x-custom");
    assert!(q.arguments.is_empty());
    assert_eq!(q.policy, None);
}

#[test]
fn rejects_non_http_urls() {
    for bad in [
        "amqp://h:5672",
        "127.0.0.1:15672",
        "http://",
        "http:///x",
        "",
    ] {
        let err = ManagementClient::new(bad, "u", "p", None).expect_err(bad);
        assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
    }
    let err = ManagementClient::new("ftp://u:secret@h", "u", "p", None).expect_err("ftp");
    assert!(!err.to_string().contains("secret"), "{err}");
    assert!(ManagementClient::new("https://h:15671/prefix/", "u", "p", None).is_ok());
}

#[test]
fn the_queues_of_named_vhosts_are_listed_by_vhost() {
    let (a, b) = (TestVhost::new("in a"), TestVhost::new("in b"));
    let c = &a.client;
    for (vh, names) in [(&a, ["a1", "x y"]), (&b, ["b1", "b2"])] {
        for n in names {
            c.declare_queue(&vh.name, n, true, &Map::new()).expect(n);
        }
    }
    let names = |listed: Vec<QueueInfo>| {
        let mut n: Vec<(String, String)> = listed.into_iter().map(|q| (q.vhost, q.name)).collect();
        n.sort();
        n
    };
    let missing = format!("{} gone", a.name);
    let got = names(c.list_queues_in(&[a.name.clone(), missing]).expect("list"));
    assert_eq!(
        got,
        vec![
            (a.name.clone(), "a1".into()),
            (a.name.clone(), "x y".into())
        ]
    );
    // The same entries as the listing of every vhost gives for them.
    let all = c.list_queues().expect("all");
    for q in c.list_queues_in(std::slice::from_ref(&b.name)).expect("b") {
        let same = all.iter().find(|o| o.vhost == q.vhost && o.name == q.name);
        assert_eq!(
            same.map(|o| (&o.arguments, o.durable, &o.type_name)),
            Some((&q.arguments, q.durable, &q.type_name))
        );
    }
    let every = names(c.list_queues_in(&[]).expect("every"));
    assert!(every.contains(&(b.name.clone(), "b2".into())) && every.len() >= 4);
}

#[test]
fn queues_with_awkward_names_round_trip() {
    let vh = TestVhost::new("names");
    let c = &vh.client;
    let names = ["with space", "a/b", "ünïcødé", "x+y", "%41"];
    for (i, name) in names.iter().enumerate() {
        let mut args = Map::new();
        if i == 1 {
            args.insert("x-queue-type".into(), Value::from("quorum"));
        }
        args.insert("x-max-length".into(), Value::from(1000 + i as u64));
        c.declare_queue(&vh.name, name, true, &args).expect(name);
    }
    let listed: Vec<QueueInfo> = c
        .list_queues()
        .expect("list")
        .into_iter()
        .filter(|q| q.vhost == vh.name)
        .collect();
    let mut got: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
    got.sort();
    let mut want = names.to_vec();
    want.sort();
    assert_eq!(got, want);
    for (i, name) in names.iter().enumerate() {
        let q = c.get_queue(&vh.name, name).expect(name);
        assert_eq!(q.name, *name);
        assert_eq!(q.vhost, vh.name);
        assert!(q.durable);
        assert!(!q.auto_delete);
        assert_eq!(q.messages, 0);
        assert_eq!(
            q.arguments.get("x-max-length"),
            Some(&Value::from(1000 + i as u64))
        );
        let want_type = if i == 1 {
            QueueType::Quorum
        } else {
            QueueType::Classic
        };
        assert_eq!(q.queue_type, Some(want_type), "{name}");
        assert_eq!(q.type_name, want_type.as_str());
    }
    c.delete_queue(&vh.name, "with space").expect("delete");
    c.delete_queue(&vh.name, "with space")
        .expect("delete twice");
    let err = c.get_queue(&vh.name, "with space").expect_err("deleted");
    let enc = encode_segment(&vh.name);
    assert_eq!(
        err,
        Error::Management(format!("HTTP 404 for GET /api/queues/{enc}/with%20space"))
    );
}

#[test]
fn list_queues_lists_more_than_500() {
    let vh = TestVhost::new("paging");
    let c = &vh.client;
    let existing = c.list_queues().expect("list").len();
    let count = 520usize.saturating_sub(existing).max(1);
    let args = Map::new();
    for i in 0..count {
        c.declare_queue(&vh.name, &format!("q{i:04}"), false, &args)
            .expect("declare");
    }
    let listed = c.list_queues().expect("list");
    assert!(listed.len() > 500, "{}", listed.len());
    let mine = listed.iter().filter(|q| q.vhost == vh.name).count();
    assert_eq!(mine, count);
}

/// Queues declared and deleted while the pages are read (other jobs, other tests) must not
/// make the listing skip a queue that exists the whole time.
#[test]
fn list_queues_misses_nothing_while_queues_come_and_go() {
    let vh = TestVhost::new("paging-churn");
    let c = &vh.client;
    let args = Map::new();
    let count = 500 + 50;
    for i in 0..count {
        c.declare_queue(&vh.name, &format!("q{i:04}"), false, &args)
            .expect("declare");
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let churn = client();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Names that sort before every q....: each delete shifts the later pages.
                let name = format!("a-churn-{}", i % 8);
                let _ = churn.declare_queue(&vh.name, &name, false, &Map::new());
                let _ = churn.delete_queue(&vh.name, &name);
                i += 1;
            }
        });
        let counts: Vec<usize> = (0..8)
            .map(|_| {
                let listed = c.list_queues().expect("list");
                listed
                    .iter()
                    .filter(|q| q.vhost == vh.name && q.name.starts_with('q'))
                    .count()
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        assert!(
            counts.iter().all(|&n| n == count),
            "{count} queues, listed: {counts:?}"
        );
    });
}

#[test]
fn overview_definitions_and_nodes() {
    let c = client();
    let o = c.overview().expect("overview");
    let version = o.broker_version.expect("version");
    assert!(version.starts_with("3."), "{version}");
    assert!(o.cluster_name.is_some_and(|n| !n.is_empty()));

    let vh = TestVhost::new("defs");
    vh.client
        .declare_queue(&vh.name, "defs q", true, &Map::new())
        .expect("declare");
    let defs = c.export_definitions().expect("export");
    let v: Value = serde_json::from_slice(&defs).expect("json");
    let queues = v.get("queues").and_then(Value::as_array).expect("queues");
    assert!(queues
        .iter()
        .any(|q| q["name"] == "defs q" && q["vhost"] == vh.name.as_str()));

    // Import a definition of one more queue into the test vhost.
    let import = serde_json::json!({
        "queues": [{"name": "imported", "vhost": vh.name, "durable": true,
                    "auto_delete": false, "arguments": {}}]
    });
    c.import_definitions(import.to_string().as_bytes())
        .expect("import");
    assert_eq!(
        c.get_queue(&vh.name, "imported").expect("imported").name,
        "imported"
    );
    let err = c.import_definitions(b"{not json").expect_err("bad json");
    assert!(
        err.to_string()
            .starts_with("Management API error: HTTP 400 for POST /api/definitions"),
        "{err}"
    );

    let nodes = c.nodes_memory().expect("nodes");
    assert!(!nodes.is_empty());
    assert!(nodes[0].mem_used > 0 && nodes[0].mem_limit > 0, "{nodes:?}");
}

#[test]
fn wrong_password_gives_401() {
    let c = ManagementClient::new(BASE, "guest", "not-the-password", None).expect("client");
    let err = c.overview().expect_err("401");
    assert_eq!(
        err.to_string(),
        "Management API error: HTTP 401 for GET /api/overview"
    );
    let err = c.get_queue("/", "a b").expect_err("401");
    assert_eq!(
        err,
        Error::Management("HTTP 401 for GET /api/queues/%2F/a%20b".into())
    );
    assert!(!format!("{c:?}").contains("not-the-password"));
}

#[test]
fn unreachable_port() {
    let c = ManagementClient::new("http://127.0.0.1:1", "guest", "secret", None).expect("client");
    let err = c.overview().expect_err("unreachable");
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "Management API error: error sending request for url http://127.0.0.1:1/api/overview"
        ),
        "{msg}"
    );
    assert!(!msg.contains("secret"));
    let c = ManagementClient::new("http://u:secret@127.0.0.1:1", "u", "secret", None).expect("c");
    let msg = c.overview().expect_err("unreachable").to_string();
    assert!(
        msg.contains("http://u:****@127.0.0.1:1/api/overview"),
        "{msg}"
    );
    assert!(!msg.contains("secret"), "{msg}");
}
