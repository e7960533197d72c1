//! The TLS nodes of `scripts/setup-rabbitmq-tls.sh` and their test CA, for the TLS tests:
//! - rmqtls: amqps 5671, stream over TLS 5551, management https 15671, client certificate
//!   optional; plain AMQP 5674 (RabbitMQ 3.10.8);
//! - rmqmtls: amqps 5681, stream 5561, https 15681, client certificate required; plain 5684;
//! - the TLS listeners of the RabbitMQ 4.x nodes of `scripts/setup-rabbitmq-4x.sh`, with the
//!   same CA and server certificate, client certificate optional: 4.3 amqps 5693, stream 5573,
//!   https 15693; 4.0 amqps 5691, stream 5571, https 15691 ([`tls_node`]).
//!
//! The server certificate is valid for `localhost` only.
#![allow(dead_code)]

use crate::common::unique_suffix;
use rmq_backup::broker::amqp::{AmqpUrl, ConnectOptions, Connection};
use rmq_backup::broker::management::ManagementClient;
use rmq_backup::broker::tls::TlsClient;
use rmq_backup::config::TlsConfig;
use std::path::PathBuf;
use std::sync::Arc;

pub fn tls_dir() -> PathBuf {
    PathBuf::from(
        std::env::var("RMQ_BACKUP_TLS_DIR").unwrap_or_else(|_| "/tmp/rmq-backup-tls".into()),
    )
}

pub fn file(name: &str) -> PathBuf {
    let p = tls_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-rabbitmq-tls.sh",
        p.display()
    );
    p
}

pub fn settings(ca: &str, client: Option<(&str, &str)>) -> TlsConfig {
    TlsConfig {
        enabled: true,
        ca_cert: Some(file(ca)),
        client_cert: client.map(|(c, _)| file(c)),
        client_key: client.map(|(_, k)| file(k)),
    }
}

pub fn tls_client(cfg: &TlsConfig) -> Arc<TlsClient> {
    Arc::new(TlsClient::load(Some(cfg), "source.tls").expect("TLS settings"))
}

/// One of the two TLS nodes.
pub struct Node {
    pub amqps: u16,
    pub stream: u16,
    pub plain: u16,
    pub https: u16,
    /// The client certificate the node requires, if any.
    pub client: Option<(&'static str, &'static str)>,
}

pub const TLS_NODE: Node = Node {
    amqps: 5671,
    stream: 5551,
    plain: 5674,
    https: 15671,
    client: None,
};
pub const MTLS_NODE: Node = Node {
    amqps: 5681,
    stream: 5561,
    plain: 5684,
    https: 15681,
    client: Some(("client.pem", "client.pkcs8.key")),
};

/// The TLS node of the test broker (`common::broker`): its own TLS listeners on 4.x, rmqtls
/// for 3.10. Client certificate optional.
pub fn tls_node() -> Node {
    let b = crate::common::broker();
    match b.version {
        (4, 3) => Node {
            amqps: 5693,
            stream: 5573,
            plain: b.amqp_port,
            https: 15693,
            client: None,
        },
        (4, 0) => Node {
            amqps: 5691,
            stream: 5571,
            plain: b.amqp_port,
            https: 15691,
            client: None,
        },
        _ => TLS_NODE,
    }
}

impl Node {
    pub fn management(&self) -> ManagementClient {
        ManagementClient::new(
            &format!("https://localhost:{}", self.https),
            "guest",
            "guest",
            Some(&tls_client(&settings("ca.pem", self.client))),
        )
        .expect("management client")
    }

    pub fn plain(&self, vhost: &str) -> Connection {
        let url = AmqpUrl::parse(&format!(
            "amqp://guest:guest@127.0.0.1:{}/{}",
            self.plain,
            vhost.replace('/', "%2f")
        ))
        .expect("url");
        Connection::open(&ConnectOptions::new(url)).expect("plain connection")
    }
}

/// A vhost of the test's own on a TLS node (with the sibling "target"), deleted on drop.
pub struct TlsVhost<'a> {
    pub node: &'a Node,
    pub name: String,
}

impl<'a> TlsVhost<'a> {
    pub fn new(node: &'a Node, prefix: &str) -> TlsVhost<'a> {
        let name = format!("rmqb-tls-{prefix}-{}", unique_suffix());
        let m = node.management();
        m.create_vhost(&name).expect("create vhost over https");
        m.set_permissions(&name, "guest").expect("permissions");
        TlsVhost { node, name }
    }

    pub fn target(&self) -> String {
        format!("{}-target", self.name)
    }
}

impl Drop for TlsVhost<'_> {
    fn drop(&mut self) {
        let m = self.node.management();
        let _ = m.delete_vhost(&self.name);
        let _ = m.delete_vhost(&self.target());
    }
}
