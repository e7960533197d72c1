//! The test cluster of `scripts/setup-rabbitmq-cluster.sh`: nodes rmqc1..3 (AMQP 5701-5703,
//! management 15701-15703). Tests that raise an alarm on a node, stop or kill it, use these
//! nodes, never the main broker other tests run beside; a test that stops a node starts it
//! again (and [`NodeBack`] does when the test fails first).

use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection};
use rmq_backup::broker::management::{encode_segment, ManagementClient};
use std::process::Command;
use std::time::{Duration, Instant};

/// The short host name the nodes are named after (`rmqc1@<host>`).
pub fn host() -> String {
    String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string()
}

/// `rabbitmqctl -n rmqc<n>@<host> args...`; panics with its output when it fails.
pub fn ctl(n: u8, args: &[&str]) {
    let node = format!("rmqc{n}@{}", host());
    let out = Command::new("rabbitmqctl")
        .args(["-n", &node])
        .args(args)
        .output()
        .expect("rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} on {node}: {out:?}"
    );
}

/// The AMQP URL of node `n` for `vhost`, with `query` (`heartbeat=1`) when not empty.
pub fn amqp_url(n: u8, vhost: &str, query: &str) -> String {
    let q = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    format!(
        "amqp://guest:guest@127.0.0.1:570{n}/{}{q}",
        encode_segment(vhost)
    )
}

pub fn management_url(n: u8) -> String {
    format!("http://127.0.0.1:1570{n}")
}

pub fn management(n: u8) -> ManagementClient {
    ManagementClient::new(&management_url(n), "guest", "guest", None).unwrap()
}

pub fn connect(n: u8, vhost: &str) -> Connection {
    let url = AmqpUrl::parse(&amqp_url(n, vhost, "")).unwrap();
    Connection::open(&ConnectOptions::new(url)).unwrap_or_else(|e| panic!("rmqc{n}: {e}"))
}

/// A vhost of the test's own on the cluster, deleted on drop.
pub struct ClusterVhost {
    pub name: String,
}

impl ClusterVhost {
    pub fn new(prefix: &str) -> ClusterVhost {
        let name = format!("rmqb-test-{prefix}-{}", super::unique_suffix());
        let m = management(1);
        m.create_vhost(&name).expect("create vhost on the cluster");
        m.set_permissions(&name, "guest").expect("permissions");
        ClusterVhost { name }
    }
}

impl Drop for ClusterVhost {
    fn drop(&mut self) {
        for n in 1..=3 {
            if management(n).delete_vhost(&self.name).is_ok() {
                return;
            }
        }
    }
}

/// Sets the memory high watermark of node rmqc1 (`0.0000001` raises the alarm at once, `0.4`
/// clears it).
pub fn watermark(value: &str) {
    ctl(1, &["set_vm_memory_high_watermark", value]);
}

/// Clears rmqc1's memory alarm when dropped, whatever the test did.
pub struct ClearAlarm;

impl Drop for ClearAlarm {
    fn drop(&mut self) {
        watermark("0.4");
    }
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
        .is_ok()
}

/// Waits (at most 180 s) until node `n` answers on its AMQP and management ports again.
pub fn wait_node(n: u8) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while !(port_open(5700 + u16::from(n)) && port_open(15700 + u16::from(n))) {
        assert!(Instant::now() < deadline, "rmqc{n} did not come back");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Kills node `n`'s Erlang VM with SIGKILL (a node lost, not stopped).
pub fn kill_node(n: u8) {
    let pid_file = format!(
        "{}/nodes/rmqc{n}/rmqc{n}.pid",
        std::env::var("RMQ_BACKUP_CLUSTER_DIR")
            .unwrap_or_else(|_| "/tmp/rmq-backup-cluster".into())
    );
    let pid = std::fs::read_to_string(&pid_file).expect("node pid file");
    let out = Command::new("kill")
        .args(["-9", pid.trim()])
        .output()
        .expect("kill");
    assert!(out.status.success(), "kill rmqc{n}: {out:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while port_open(5700 + u16::from(n)) {
        assert!(Instant::now() < deadline, "rmqc{n} still answers");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts the cluster's stopped nodes again (`scripts/setup-rabbitmq-cluster.sh`) and waits
/// until they are clustered.
pub fn start_nodes() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/setup-rabbitmq-cluster.sh"
    );
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("setup script");
    assert!(out.status.success(), "{out:?}");
}

/// Brings every node of the cluster back when dropped: its application started
/// (`start_app` is a no-op on a running one) and a killed node started again.
pub struct NodeBack(pub u8);

impl Drop for NodeBack {
    fn drop(&mut self) {
        let node = format!("rmqc{}@{}", self.0, host());
        let _ = Command::new("rabbitmqctl")
            .args(["-n", &node, "start_app"])
            .output();
        start_nodes();
    }
}
