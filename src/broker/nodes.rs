//! The nodes of the broker a job connects to (issue "Clusters and scale-out").
//!
//! **Several URLs.** `amqp_url` may list the nodes of a cluster (`crate::config::Urls`): a
//! connection goes to the first that answers, in order; one that does not answer (refused,
//! unreachable, a timeout) is skipped with a warning, and when none answers the error names
//! each. An authentication failure is not skipped (the nodes of a cluster share their users).
//!
//! **Node-local reads.** A backup reads each queue through a connection to the node that hosts
//! it (a classic queue's node, a quorum queue's or a stream's leader: `QueueInfo::node`), so
//! that the cluster does not forward every message from that node to another. A node's AMQP
//! address comes from, in order:
//! 1. `source.node_addresses` (node name → `host:port`), for what the broker cannot know: a
//!    Kubernetes Service or a load balancer per node;
//! 2. the URL of `amqp_url` whose `host:port` is the node's AMQP listener (`/api/overview`
//!    `listeners`), or whose host is the host part of the node name (`rabbit@<host>`);
//! 3. the listener's own address when it is bound to one (not `::` or `0.0.0.0`), else the host
//!    of the node name (in Kubernetes the pod's DNS name), with the listener's port.
//!
//! Credentials, vhost, TLS and options are those of the first URL. An address that does not
//! answer is warned about once and not tried again in the run: that node's queues are read
//! through `amqp_url`. With a single node, or `source.node_local_reads: false`, every
//! connection goes through `amqp_url`.

use crate::broker::amqp::{AmqpUrl, ConnectOptions, Connection};
use crate::broker::management::Listener;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// The AMQP addresses of a broker's nodes (see the module documentation).
#[derive(Debug)]
pub struct Nodes {
    /// `amqp_url`, in order (never empty).
    urls: Vec<AmqpUrl>,
    /// Node name → its AMQP address, for node-local connections; empty without locality.
    by_node: HashMap<String, AmqpUrl>,
    /// Nodes whose address did not answer: not tried again.
    unreachable: Mutex<HashSet<String>>,
}

impl Nodes {
    /// Connections through `urls` (never empty), in order, without node-local addresses.
    pub fn new(urls: Vec<AmqpUrl>) -> Nodes {
        Nodes {
            urls,
            by_node: HashMap::new(),
            unreachable: Mutex::new(HashSet::new()),
        }
    }

    /// [`Nodes::new`] with the address of each node for node-local connections, from
    /// `explicit` (`source.node_addresses`) and the broker's `listeners` (see the module
    /// documentation). Nothing is node-local when the listeners name fewer than two nodes and
    /// `explicit` is empty.
    ///
    /// Errors: `Configuration error: source.node_addresses ...` for an address that is not
    /// `host:port`.
    pub fn with_locality(
        urls: Vec<AmqpUrl>,
        listeners: &[Listener],
        explicit: &BTreeMap<String, String>,
    ) -> Result<Nodes> {
        let mut nodes = Nodes::new(urls);
        let Some(first) = nodes.urls.first().cloned() else {
            return Ok(nodes);
        };
        let protocol = if first.tls { "amqp/ssl" } else { "amqp" };
        let amqp: Vec<&Listener> = listeners
            .iter()
            .filter(|l| l.protocol == protocol)
            .collect();
        let names: HashSet<&str> = amqp.iter().map(|l| l.node.as_str()).collect();
        if names.len() > 1 {
            for l in &amqp {
                let url = nodes.listener_url(&first, l);
                nodes.by_node.entry(l.node.clone()).or_insert(url);
            }
        }
        for (node, address) in explicit {
            let (host, port) = split_host_port(address).ok_or_else(|| {
                Error::Config(format!(
                    "source.node_addresses: {address:?} (node {node}) is not host:port"
                ))
            })?;
            let mut url = first.clone();
            url.host = host;
            url.port = port;
            nodes.by_node.insert(node.clone(), url);
        }
        for (node, url) in &nodes.by_node {
            log::debug!("node {node}: AMQP at {}", url.host_port());
        }
        Ok(nodes)
    }

    /// The address of listener `l` (rules 2 and 3 of the module documentation), with the
    /// credentials and options of `first`.
    fn listener_url(&self, first: &AmqpUrl, l: &Listener) -> AmqpUrl {
        let node_host = l.node.split_once('@').map_or("", |(_, h)| h);
        if let Some(given) = self.urls.iter().find(|u| {
            (u.port == l.port && (u.host == l.ip_address || u.host == node_host))
                || (u.host == node_host && !node_host.is_empty())
        }) {
            return given.clone();
        }
        let mut url = first.clone();
        url.host = match l.ip_address.as_str() {
            "::" | "0.0.0.0" | "" => node_host.to_string(),
            ip => ip.to_string(),
        };
        url.port = l.port;
        url
    }

    /// The first URL of `amqp_url`.
    pub fn first(&self) -> &AmqpUrl {
        &self.urls[0]
    }

    /// The AMQP address of `node` for node-local connections, when it has one that has not
    /// failed.
    pub fn address_of(&self, node: &str) -> Option<&AmqpUrl> {
        let failed = self
            .unreachable
            .lock()
            .map(|u| u.contains(node))
            .unwrap_or(false);
        self.by_node.get(node).filter(|_| !failed)
    }

    /// True when some node has a node-local address.
    pub fn node_local(&self) -> bool {
        !self.by_node.is_empty()
    }

    /// Opens a connection with `options` (its URL gives the vhost): to `node`'s own address
    /// when there is one, else (or when it does not answer) to the URLs of `amqp_url` in
    /// order.
    ///
    /// Errors: the connection's own error when one URL is configured, or when it is no lost
    /// or refused connection (`Error::Authentication`, `Error::Config`, ...);
    /// `Error::Connection("Failed to connect to any node: <url>: <why>; ...")` when none of
    /// several answers.
    pub fn connect(&self, options: &ConnectOptions, node: Option<&str>) -> Result<Connection> {
        let vhost = &options.url.vhost;
        let attempt = |url: &AmqpUrl| {
            let mut o = options.clone();
            o.url = url.clone();
            o.url.vhost = vhost.clone();
            Connection::open(&o)
        };
        if let Some((node, url)) = node.and_then(|n| Some((n, self.address_of(n)?))) {
            match attempt(url) {
                Err(Error::Connection(e)) => {
                    log::warn!(
                        "node {node} does not answer at its own address ({e}); its queues are read through amqp_url"
                    );
                    if let Ok(mut u) = self.unreachable.lock() {
                        u.insert(node.to_string());
                    }
                }
                other => return other,
            }
        }
        let mut failures = Vec::new();
        for (i, url) in self.urls.iter().enumerate() {
            match attempt(url) {
                Err(Error::Connection(e)) if self.urls.len() > 1 => {
                    if i + 1 < self.urls.len() {
                        log::warn!("{e}; trying the next node of amqp_url");
                    }
                    failures.push(e.trim_start_matches("Failed to connect to ").to_string());
                }
                other => return other,
            }
        }
        Err(Error::Connection(format!(
            "Failed to connect to any node: {}",
            failures.join("; ")
        )))
    }
}

/// `host:port` (`[v6]:port` too) split; `None` when the port is missing or not a number.
fn split_host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.trim().rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!host.is_empty()).then(|| (host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> AmqpUrl {
        AmqpUrl::parse(s).unwrap()
    }

    fn listener(node: &str, protocol: &str, ip: &str, port: u16) -> Listener {
        Listener {
            node: node.into(),
            protocol: protocol.into(),
            ip_address: ip.into(),
            port,
        }
    }

    #[test]
    fn each_node_gets_the_given_url_that_reaches_it_or_its_listener() {
        let urls = vec![
            url("amqp://u:p@127.0.0.1:5701/v?heartbeat=5"),
            url("amqp://u:p@127.0.0.1:5702/v?heartbeat=5"),
        ];
        let listeners = [
            listener("rmqc1@vm", "amqp", "127.0.0.1", 5701),
            listener("rmqc2@vm", "amqp", "127.0.0.1", 5702),
            listener("rmqc3@vm", "amqp", "127.0.0.1", 5703),
            listener("rmqc3@vm", "clustering", "127.0.0.1", 25703),
            listener("rabbit@pod-0.svc", "amqp", "::", 5672),
        ];
        let nodes = Nodes::with_locality(urls, &listeners, &BTreeMap::new()).unwrap();
        assert_eq!(nodes.address_of("rmqc2@vm").unwrap().port, 5702);
        // Not given: the listener's address, with the first URL's credentials and options.
        let c3 = nodes.address_of("rmqc3@vm").unwrap();
        assert_eq!((c3.host.as_str(), c3.port), ("127.0.0.1", 5703));
        assert_eq!((c3.user.as_str(), c3.heartbeat), ("u", Some(5)));
        // Bound to every interface: the host of the node name.
        let pod = nodes.address_of("rabbit@pod-0.svc").unwrap();
        assert_eq!((pod.host.as_str(), pod.port), ("pod-0.svc", 5672));
        assert!(nodes.address_of("rabbit@elsewhere").is_none());
    }

    #[test]
    fn one_node_is_not_node_local_and_explicit_addresses_win() {
        let urls = vec![url("amqps://u:p@lb:5671/")];
        let one = [listener("rabbit@a", "amqp/ssl", "::", 5671)];
        let nodes = Nodes::with_locality(urls.clone(), &one, &BTreeMap::new()).unwrap();
        assert!(!nodes.node_local());
        let explicit: BTreeMap<String, String> =
            [("rabbit@a".to_string(), "a.example:30671".to_string())].into();
        let nodes = Nodes::with_locality(urls.clone(), &one, &explicit).unwrap();
        let a = nodes.address_of("rabbit@a").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.tls), ("a.example", 30671, true));
        let bad: BTreeMap<String, String> = [("rabbit@a".to_string(), "a".to_string())].into();
        let e = Nodes::with_locality(urls, &one, &bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Configuration error: source.node_addresses: \"a\" (node rabbit@a) is not host:port"
        );
    }

    #[test]
    fn host_port_splits() {
        assert_eq!(split_host_port("h:1"), Some(("h".into(), 1)));
        assert_eq!(split_host_port("[::1]:5672"), Some(("::1".into(), 5672)));
        assert_eq!(split_host_port("h"), None);
        assert_eq!(split_host_port("h:0"), None);
        assert_eq!(split_host_port(":5672"), None);
    }

    #[test]
    fn no_node_answering_names_each() {
        // Two closed ports on this machine.
        let closed = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (a, b) = (closed(), closed());
        let nodes = Nodes::new(vec![
            url(&format!("amqp://u:secret@127.0.0.1:{a}/")),
            url(&format!("amqp://u:secret@127.0.0.1:{b}/")),
        ]);
        let Err(e) = nodes.connect(&ConnectOptions::new(url("amqp://x@h/vh")), None) else {
            panic!("connected to a closed port");
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "Connection error: Failed to connect to any node: amqp://u:****@127.0.0.1:"
            ),
            "{msg}"
        );
        assert!(
            msg.contains(&format!(":{a}/vh: ")) && msg.contains(&format!(":{b}/vh: ")),
            "{msg}"
        );
        assert!(!msg.contains("secret"));
    }
}
