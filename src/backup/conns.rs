//! The source's connections: how a read connects ([`ReadContext::connect_options`], the
//! stream protocol's [`ReadContext::stream_options`]), a stream read's counted connection
//! ([`CountedConnection`]), and the AMQP connection of one queue thread: opened on first use and reused for every queue the
//! thread reads after it in the same vhost, a channel (or a few) per queue. A connection per
//! queue cost more than the read of a small queue (issue "Clusters and scale-out": 2,000 queues
//! of 10 messages took longer than a raw client reading them all on one connection).
//!
//! A queue's read gives its messages back by closing its own channels (`crate::broker::reader`), so a
//! connection carries nothing from one queue to the next. After any failure the connection is
//! closed (which gives back whatever it still held) and the next queue opens a new one.
//!
//! Its name, shown in the management UI: `rmq-backup <backup_id> <vhost> (thread <n>, run <run_id>)`
//! (`rmq-backup <backup_id> (part <i> of <n>) ...` for a part of a sharded backup); every
//! name rmq-backup gives starts with `rmq-backup ` (`super::unacked`).

use super::context::{QueueContext, ReadContext};
use crate::broker::amqp::{Channel, Connection};
use crate::broker::management::QueueInfo;
use crate::broker::stream::StreamConnection;
use crate::error::Result;
use crate::metrics;
use std::time::Duration;

/// Deliveries buffered between a connection and the queue thread reading it.
const CONSUMER_BUFFER: usize = 512;

/// One queue thread's connection (see the module documentation).
pub(super) struct ThreadConnection {
    thread: usize,
    open: Option<Open>,
}

struct Open {
    vhost: String,
    /// The node it was opened for (`None`: through `amqp_url`).
    node: Option<String>,
    conn: Connection,
    /// For passive declares, queue after queue; opened again when an error closed it.
    control: Channel,
}

impl ThreadConnection {
    /// No connection yet, for queue thread number `thread` (its name says it).
    pub(super) fn new(thread: usize) -> ThreadConnection {
        ThreadConnection { thread, open: None }
    }

    /// A connection to `vhost` on the source, to `node` when it has a node-local address
    /// (`crate::broker::nodes`), and an open channel of it for passive declares: the open ones when
    /// they are for `vhost` and `node` and still open, else new ones (the old connection
    /// closed).
    ///
    /// Errors: those of [`crate::broker::nodes::Nodes::connect`] and [`Connection::open_channel`].
    pub(super) fn get(
        &mut self,
        ctx: &QueueContext,
        vhost: &str,
        node: Option<&str>,
    ) -> Result<(&Connection, &Channel)> {
        let node = node.filter(|n| ctx.read.nodes.address_of(n).is_some());
        let open = match self.open.take() {
            Some(mut o) if o.vhost == vhost && o.node.as_deref() == node && o.conn.is_open() => {
                if !o.control.is_open() {
                    o.control = o.conn.open_channel()?;
                }
                o
            }
            old => {
                self.open = old;
                self.discard();
                let mut options = ctx.read.connect_options(
                    vhost,
                    ctx.read
                        .earlier_run
                        .connection_name(vhost, &format!("thread {}, ", self.thread)),
                );
                // A deeper delivery buffer absorbs the segment builder's pauses (a compressed
                // chunk, a rotation) without stalling the broker; batches are bounded by bytes
                // too, so large messages still hold at most ~8 MiB here.
                options.consumer_buffer = CONSUMER_BUFFER;
                let conn = ctx.read.nodes.connect(&options, node)?;
                ctx.read.broker_version.observe(conn.server_properties());
                let control = conn.open_channel()?;
                Open {
                    vhost: vhost.to_string(),
                    node: node.map(str::to_string),
                    conn,
                    control,
                }
            }
        };
        let open = self.open.insert(open);
        Ok((&open.conn, &open.control))
    }

    /// Closes the connection, if any (after a failure: the broker takes back what it held).
    pub(super) fn discard(&mut self) {
        if let Some(open) = self.open.take() {
            drop(open.control);
            if let Err(e) = open.conn.close() {
                log::debug!("closing the connection to vhost {}: {e}", open.vhost);
            }
        }
    }
}

impl Drop for ThreadConnection {
    fn drop(&mut self) {
        self.discard();
    }
}

/// Opens a stream connection to the queue's vhost, counted in
/// `broker_backup_stream_connections_active` while it lives.
pub(super) struct CountedConnection(pub(super) StreamConnection);

impl CountedConnection {
    pub(super) fn open(ctx: &QueueContext, q: &QueueInfo) -> Result<CountedConnection> {
        Self::open_within(ctx, q, None)
    }

    /// [`CountedConnection::open`], the TCP connect bounded by `connect_timeout` when given.
    pub(super) fn open_within(
        ctx: &QueueContext,
        q: &QueueInfo,
        connect_timeout: Option<Duration>,
    ) -> Result<CountedConnection> {
        let mut o = ctx.read.stream_options(
            &q.vhost,
            ctx.read
                .earlier_run
                .connection_name(&format!("{}/{}", q.vhost, q.name), ""),
        );
        if let Some(t) = connect_timeout {
            o.connect_timeout = o.connect_timeout.min(t);
        }
        let conn = StreamConnection::open(&o)?;
        metrics::global().stream_connections.inc();
        Ok(CountedConnection(conn))
    }
}

impl Drop for CountedConnection {
    fn drop(&mut self) {
        metrics::global().stream_connections.dec();
    }
}

impl ReadContext<'_> {
    /// The source's URL (TLS applied) with `vhost`.
    pub(super) fn url_of(&self, vhost: &str) -> crate::broker::amqp::AmqpUrl {
        let mut url = self.nodes.first().clone();
        url.vhost = vhost.to_string();
        url
    }

    /// Connection options for `vhost` on the source (TLS as configured), shown in the
    /// management UI as `connection_name`.
    pub(super) fn connect_options(
        &self,
        vhost: &str,
        connection_name: String,
    ) -> crate::broker::amqp::ConnectOptions {
        let mut options = crate::broker::amqp::ConnectOptions::new(self.url_of(vhost));
        options.connection_name = connection_name;
        options.tls = self.tls.clone();
        options
    }

    /// Stream-protocol options for `vhost` on the source: its stream port (5551 by default
    /// with TLS) and TLS as configured.
    pub(super) fn stream_options(
        &self,
        vhost: &str,
        connection_name: String,
    ) -> crate::broker::stream::StreamOptions {
        let url = self.url_of(vhost);
        let port = self.source.stream_port_for(url.tls);
        let mut options = crate::broker::stream::StreamOptions::from_amqp_url(&url, port);
        options.connection_name = connection_name;
        options.tls = self.tls.clone();
        options
    }
}

/// The AMQP 1.0 connection a queue of `backup.amqp10_queues` is read on (`None`: the queue is
/// read over 0-9-1): to the same node, host, port, TLS, credentials and vhost as its 0-9-1
/// connection, opened for this queue and closed after it (issue 39). A node older than 4.0
/// (the version seen on the 0-9-1 connection) has no AMQP 1.0 core: the queue is read over
/// 0-9-1, with a warning naming the key.
///
/// Errors: those of [`crate::broker::amqp10::Connection::open`].
pub(super) fn amqp10_connection(
    ctx: &QueueContext,
    q: &QueueInfo,
) -> Result<Option<crate::broker::amqp10::Connection>> {
    if !ctx.read.opts.reads_amqp10(&q.name) {
        return Ok(None);
    }
    let version = ctx.read.broker_version.get();
    if version.is_none_or(|v| v.major < 4) {
        log::warn!(
            "queue {} in vhost {} matches backup.amqp10_queues, but the broker ({}) is older than RabbitMQ 4.0, which reads AMQP 1.0 natively: read over AMQP 0-9-1",
            q.name,
            q.vhost,
            version.map_or_else(|| "version unknown".to_string(), |v| v.to_string())
        );
        return Ok(None);
    }
    let node = q.node.as_deref().and_then(|n| ctx.read.nodes.address_of(n));
    let mut url = node.cloned().unwrap_or_else(|| ctx.read.url_of(&q.vhost));
    url.vhost = q.vhost.clone();
    let mut options = crate::broker::amqp10::ConnectOptions::new(url);
    options.connection_name = ctx.read.earlier_run.connection_name(&q.vhost, "AMQP 1.0, ");
    options.tls = ctx.read.tls.clone();
    crate::broker::amqp10::Connection::open(&options).map(Some)
}
