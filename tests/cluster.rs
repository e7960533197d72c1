//! A backup of the three-node test cluster (issue "Clusters and scale-out";
//! scripts/setup-rabbitmq-cluster.sh): each queue read through a connection to the node that
//! hosts it, several URLs tried in order, and a node killed mid-backup.

mod common;

use common::cluster::{self, ClusterVhost, NodeBack};
use common::*;
use rmq_backup::broker::amqp::{Channel, Connection, FieldTable, FieldValue};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time on the cluster (one of them kills a node).
static CLUSTER: Mutex<()> = Mutex::new(());

const N: usize = 20_000;

/// Declares `name` of `kind` through node `n` (a classic queue lives there, a quorum queue's
/// first leader is there) and publishes `N` numbered persistent messages.
fn seed(vhost: &str, n: u8, name: &str, kind: &str) {
    let conn = cluster::connect(n, vhost);
    let ch = conn.open_channel().unwrap();
    declare(&ch, name, kind, FieldTable::new());
    publish_bulk_persistent(&ch, name, N, 100);
    let _ = conn.close();
}

/// A backup config for `vhost` on the cluster, through nodes `amqp` (their AMQP and
/// management URLs as lists, in that order).
fn config(dir: &TempDir, id: &str, vhost: &str, amqp: &[u8], extra: &str) -> String {
    let urls: Vec<String> = amqp
        .iter()
        .map(|n| cluster::amqp_url(*n, vhost, "heartbeat=2"))
        .collect();
    let mgmt: Vec<String> = amqp.iter().map(|n| cluster::management_url(*n)).collect();
    config_with(dir, id, vhost, &urls, &mgmt, extra)
}

/// A backup config for `vhost` with these `amqp_url` and `management_url` lists.
fn config_with(
    dir: &TempDir,
    id: &str,
    vhost: &str,
    amqp: &[String],
    mgmt: &[String],
    extra: &str,
) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let yaml = format!(
        "mode: backup\nbackup_id: {id}\nsource:\n  amqp_url: [{}]\n  management_url: [{}]\n  management_username: guest\n  management_password: guest\n  queues:\n    vhosts: [\"{vhost}\"]\n{extra}storage:\n  backend: filesystem\n  path: \"{}\"\nbackup:\n  include_definitions: false\n  max_concurrent_queues: 1\n  connection_retries: 3\n  connection_retry_backoff_ms: 500\n",
        list(amqp),
        list(mgmt),
        dir.path().join("store").display()
    );
    write_config(dir.path(), &format!("{id}.yaml"), &yaml)
}

/// The node hosting each queue of `vhost`, as the management API says.
fn homes(vhost: &str) -> BTreeMap<String, String> {
    cluster::management(1)
        .list_queues()
        .unwrap()
        .into_iter()
        .filter(|q| q.vhost == vhost)
        .map(|q| (q.name, q.node.unwrap_or_default()))
        .collect()
}

/// The cluster's `consumer.created` events (rabbitmq_event_exchange, enabled by
/// scripts/setup-rabbitmq-cluster.sh), collected from before a backup starts: unlike sampling
/// `rabbitmqctl list_consumers`, no consumer is missed however short its read.
struct ConsumerEvents {
    _conn: Connection,
    ch: Channel,
    queue: String,
}

impl ConsumerEvents {
    fn listen() -> ConsumerEvents {
        let conn = cluster::connect(1, "/");
        let ch = conn.open_channel().unwrap();
        let none = FieldTable::new();
        let queue = ch
            .queue_declare("", false, true, true, &none)
            .unwrap()
            .queue;
        ch.queue_bind(&queue, "amq.rabbitmq.event", "consumer.created", &none)
            .unwrap();
        ConsumerEvents {
            _conn: conn,
            ch,
            queue,
        }
    }

    /// For each queue of `vhost`, the nodes its consumers' channels lived on (a channel pid,
    /// `<rmqc2@vm.1693.1234.0>`, names its node); waits up to 10 s for `queues` to appear.
    fn nodes(&self, vhost: &str, queues: usize) -> BTreeMap<String, BTreeSet<String>> {
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.len() < queues && Instant::now() < deadline {
            let Some(got) = self.ch.basic_get(&self.queue, true).unwrap() else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let headers = got.delivery.properties.headers.unwrap_or_default();
            let text = |key: &str| match headers.iter().find(|(k, _)| k == key) {
                Some((_, FieldValue::LongString(v))) => String::from_utf8_lossy(v).into_owned(),
                other => panic!("consumer.created without {key}: {other:?} in {headers:?}"),
            };
            if text("vhost") != vhost {
                continue;
            }
            let channel = text("channel");
            let node = channel
                .trim_start_matches('<')
                .split('.')
                .next()
                .unwrap_or("");
            seen.entry(text("queue"))
                .or_default()
                .insert(node.to_string());
        }
        seen
    }
}

/// Queue `name` of `vhost` on node `n` holds the `N` messages, in order.
fn whole(n: u8, vhost: &str, name: &str) {
    let conn = cluster::connect(n, vhost);
    let deadline = Instant::now() + Duration::from_secs(60);
    while (depth(&conn, name) as usize) < N {
        assert!(Instant::now() < deadline, "{name} never whole again");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(depth(&conn, name) as usize, N, "{name}");
    assert_eq!(
        seqs(&peek(&conn, name, N)),
        (0..N as i64).collect::<Vec<_>>(),
        "{name} in order"
    );
}

#[test]
fn each_queue_is_read_through_its_own_node() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let vh = ClusterVhost::new("node-local");
    seed(&vh.name, 2, "on-2", "classic");
    seed(&vh.name, 3, "on-3", "classic");
    seed(&vh.name, 1, "quorum", "quorum");
    let homes = homes(&vh.name);
    assert_eq!(homes["on-2"], format!("rmqc2@{}", cluster::host()));
    assert_eq!(homes["on-3"], format!("rmqc3@{}", cluster::host()));
    let dir = TempDir::new("node-local");
    // One URL, the first node's: the others' addresses come from the broker's listeners.
    let cfg = config(&dir, "local", &vh.name, &[1], "");
    let events = ConsumerEvents::listen();
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let seen = events.nodes(&vh.name, homes.len());
    for (queue, home) in &homes {
        let nodes = seen
            .get(queue)
            .unwrap_or_else(|| panic!("{queue}'s consumers were never seen: {seen:?}"));
        assert_eq!(
            nodes,
            &BTreeSet::from([home.clone()]),
            "{queue} lives on {home}"
        );
    }
    let m = manifest(&dir.path().join("store"), "local");
    assert_eq!(m.total_messages, 3 * N as u64);
    for name in ["on-2", "on-3", "quorum"] {
        assert_eq!(
            seqs(&backed_up(&dir.path().join("store"), "local", name)),
            (0..N as i64).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_node_that_does_not_answer_is_skipped() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let vh = ClusterVhost::new("skip-node");
    seed(&vh.name, 2, "q", "classic");
    let dir = TempDir::new("skip-node");
    // The first URL and management URL point where nothing listens; node-local reads off, so
    // the connection comes from the list itself.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = config_with(
        &dir,
        "skip",
        &vh.name,
        &[
            format!("amqp://guest:guest@127.0.0.1:{closed}/%2f"),
            cluster::amqp_url(2, &vh.name, ""),
        ],
        &[
            format!("http://127.0.0.1:{closed}"),
            cluster::management_url(2),
        ],
        "  node_local_reads: false\n",
    );
    let out = run_cli(&["backup", "--config", &cfg]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{closed}")) && stderr.contains("trying"),
        "the skipped node is named: {stderr}"
    );
    assert_eq!(
        manifest(&dir.path().join("store"), "skip").total_messages,
        N as u64
    );
}

#[test]
fn a_node_killed_mid_backup_is_read_around_and_its_classic_queue_waits_for_a_rerun() {
    let _one = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    let vh = ClusterVhost::new("node-loss");
    // Read in this order (by name): the quorum queue led by rmqc3, during whose read rmqc3 is
    // killed; a classic queue on rmqc1; a classic queue on rmqc3, unavailable until it is back.
    seed(&vh.name, 3, "a-quorum", "quorum");
    seed(&vh.name, 1, "b-classic-1", "classic");
    seed(&vh.name, 3, "c-classic-3", "classic");
    assert_eq!(
        homes(&vh.name)["a-quorum"],
        format!("rmqc3@{}", cluster::host())
    );
    let dir = TempDir::new("node-loss");
    let cfg = config(&dir, "loss", &vh.name, &[1, 2, 3], "");
    let back = NodeBack(3);
    let (child, lines) = spawn_cli(&["backup", "--config", &cfg], &[]);
    wait_line(&lines, &format!("queue a-quorum: {N} messages at start"));
    cluster::kill_node(3);
    let killed = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        killed.elapsed() < Duration::from_secs(120),
        "{:?}",
        killed.elapsed()
    );
    let log = rest_of(&lines).join("\n");
    assert_eq!(out.status.code(), Some(1), "{log}");
    // The quorum queue was read again through a live node, the classic one on rmqc1 read; the
    // classic queue on the dead node fails the run, named.
    assert!(
        log.contains(&format!(
            "queue a-quorum in vhost {}: {N} messages in",
            vh.name
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "queue b-classic-1 in vhost {}: {N} messages in",
            vh.name
        )),
        "{log}"
    );
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("c-classic-3") && last.contains("down"),
        "{log}"
    );
    let store = dir.path().join("store");
    assert!(manifest(&store, "loss").completed_at.is_none());
    assert_eq!(
        seqs(&backed_up(&store, "loss", "a-quorum")),
        (0..N as i64).collect::<Vec<_>>()
    );
    whole(1, &vh.name, "a-quorum");
    whole(1, &vh.name, "b-classic-1");

    // The node back, the same command completes the backup.
    drop(back);
    let out = run_cli(&["backup", "--config", &cfg]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    let m = manifest(&store, "loss");
    assert!(m.completed_at.is_some());
    assert_eq!(m.total_messages, 3 * N as u64);
    whole(3, &vh.name, "c-classic-3");
}
