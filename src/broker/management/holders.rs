//! Who holds a queue's unacknowledged messages: its message counts and its consumers with the
//! names their connections gave themselves (`GET /api/queues/{vhost}/{name}`,
//! `GET /api/vhosts/{vhost}/connections`); the connections an earlier run of a backup left
//! open, and their close (`GET /api/connections`, `DELETE /api/connections/{name}`).
//!
//! Counts come from the management plugin's statistics, which lag the broker by up to its
//! `collect_statistics_interval` (5 s by default); consumers and connections are listed from
//! the broker's events, within a moment of their creation and close.

use super::{encode_segment, ManagementClient};
use crate::error::Result;
use serde::Deserialize;
use serde_json::Value;

/// A queue's counts and consumers as the management API reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueHolders {
    /// `messages`: ready + unacknowledged (not the messages waiting for a delayed retry, which
    /// RabbitMQ 4.3 counts in `messages` too).
    pub messages: u64,
    /// `messages_ready`.
    pub ready: u64,
    /// `messages_unacknowledged`: delivered to a consumer or a `basic.get` and not settled.
    pub unacknowledged: u64,
    /// False while the API has no message statistics for the queue (a queue declared less
    /// than a statistics interval ago): the counts above are then 0 whatever the queue holds.
    pub statistics: bool,
    /// The queue's consumers.
    pub consumers: Vec<ConsumerInfo>,
}

/// One consumer of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    pub consumer_tag: String,
    /// The broker's name of the consumer's connection (`127.0.0.1:50412 -> 127.0.0.1:5672`).
    pub connection: String,
    /// The name the client gave its connection (`connection_name` client property), when
    /// it gave one: rmq-backup names its own `rmq-backup <backup_id> ...` (`crate::backup`).
    pub connection_name: Option<String>,
    /// `prefetch_count` of the consumer (0: unlimited).
    pub prefetch_count: u64,
    /// False for a consumer in automatic acknowledgement mode (holds nothing).
    pub ack_required: bool,
}

#[derive(Deserialize)]
struct RawQueue {
    #[serde(default)]
    messages: Option<u64>,
    #[serde(default)]
    messages_ready: Option<u64>,
    #[serde(default)]
    messages_unacknowledged: Option<u64>,
    #[serde(default)]
    messages_delayed: Option<u64>,
    #[serde(default)]
    consumer_details: Option<Value>,
}

#[derive(Deserialize)]
struct RawConnection {
    #[serde(default)]
    name: String,
    #[serde(default)]
    user_provided_name: Option<String>,
    #[serde(default)]
    client_properties: Option<Value>,
}

impl RawConnection {
    fn given_name(&self) -> Option<String> {
        self.user_provided_name.clone().or_else(|| {
            self.client_properties
                .as_ref()?
                .get("connection_name")?
                .as_str()
                .map(str::to_string)
        })
    }
}

impl ManagementClient {
    /// The counts and consumers of queue `name` in `vhost`, each consumer with the name its
    /// connection gave itself.
    ///
    /// Errors: `Management API error: HTTP 404 for GET /api/queues/<vhost>/<name>` when the
    /// queue is gone; see the module documentation of `crate::broker::management` for the others.
    pub fn queue_holders(&self, vhost: &str, name: &str) -> Result<QueueHolders> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        let raw: RawQueue = self.get_json(
            &path,
            Some("columns=messages,messages_ready,messages_unacknowledged,messages_delayed,consumer_details"),
        )?;
        let mut holders = QueueHolders {
            messages: raw
                .messages
                .unwrap_or(0)
                .saturating_sub(raw.messages_delayed.unwrap_or(0)),
            ready: raw.messages_ready.unwrap_or(0),
            unacknowledged: raw.messages_unacknowledged.unwrap_or(0),
            statistics: raw.messages.is_some()
                || raw.messages_ready.is_some()
                || raw.messages_unacknowledged.is_some(),
            consumers: Vec::new(),
        };
        let details = match raw.consumer_details {
            Some(Value::Array(list)) => list,
            _ => Vec::new(),
        };
        if details.is_empty() {
            return Ok(holders);
        }
        let connections: Vec<RawConnection> = self.get_json(
            &format!("/api/vhosts/{}/connections", encode_segment(vhost)),
            Some("columns=name,user_provided_name,client_properties"),
        )?;
        for c in details {
            let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
            let connection = text(c.pointer("/channel_details/connection_name"));
            let connection_name = connections
                .iter()
                .find(|raw| raw.name == connection)
                .and_then(RawConnection::given_name);
            holders.consumers.push(ConsumerInfo {
                consumer_tag: text(c.get("consumer_tag")),
                connection,
                connection_name,
                prefetch_count: c.get("prefetch_count").and_then(Value::as_u64).unwrap_or(0),
                ack_required: c
                    .get("ack_required")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            });
        }
        Ok(holders)
    }

    /// The open connections (AMQP and stream) whose client-given name starts with `prefix`,
    /// as `(broker's name, given name)` pairs, from `GET /api/connections` (listed from the
    /// broker's events, within a moment of an open or a close).
    ///
    /// Errors: see the module documentation of `crate::broker::management`.
    pub fn connections_named(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let all: Vec<RawConnection> = self.get_json(
            "/api/connections",
            Some("columns=name,user_provided_name,client_properties"),
        )?;
        Ok(all
            .into_iter()
            .filter_map(|c| {
                let given = c.given_name()?;
                given.starts_with(prefix).then_some((c.name, given))
            })
            .collect())
    }

    /// Closes connection `name` (the broker's name of it: its client is sent
    /// `CONNECTION_FORCED - Closed via management plugin`) with `DELETE /api/connections/{name}`;
    /// a connection already gone is not an error. The broker gives back every message the
    /// connection's channels held unacknowledged.
    ///
    /// Errors: see the module documentation of `crate::broker::management` (HTTP 401/403 when the
    /// user may not close it).
    pub fn close_connection(&self, name: &str) -> Result<()> {
        let path = format!("/api/connections/{}", encode_segment(name));
        self.delete(&path)
    }
}
