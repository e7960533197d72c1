//! The management API calls the tool makes (SPEC.md "Calls the tool makes to the broker's
//! management API") and the shapes of their answers: queues, overview, nodes, definitions,
//! vhosts, permissions. The HTTP plumbing (timeouts, retries, errors) is the parent's.

use super::{
    encode_segment, ManagementClient, Method, DEFINITIONS_TIMEOUT, QUEUE_COLUMNS, REQUEST_TIMEOUT,
};
use crate::broker::QueueType;
use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashSet;

/// The management API's alarms health check (RabbitMQ 3.8.10+).
const HEALTH_ALARMS: &str = "/api/health/checks/alarms";

/// One queue as listed by `GET /api/queues` (fields of the management API).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueueInfo {
    /// Virtual host name (`/` for the default vhost).
    pub vhost: String,
    /// Exact queue name.
    pub name: String,
    /// Parsed queue type; `None` for types this tool does not know (plugins).
    pub queue_type: Option<QueueType>,
    /// The API's raw `type` field (`classic`, `quorum`, `stream`, ...); empty when absent.
    pub type_name: String,
    /// Message count: `messages`, else `messages_ready + messages_unacknowledged`, else 0 (stats not
    /// emitted yet, e.g. a queue declared a moment ago); without the messages waiting for a
    /// delayed retry ([`Self::messages_delayed`]), which no consumer can take.
    pub messages: u64,
    /// RabbitMQ 4.3 quorum queues: `messages_delayed`, the messages waiting for a delayed retry
    /// (neither ready nor unacknowledged: no consumer and no `basic.get` is given them before
    /// their time; 0 where the API does not report it).
    pub messages_delayed: u64,
    /// `last_delayed_at`: when the last of them becomes ready again, epoch ms.
    pub delayed_until: Option<i64>,
    /// `delayed_retry`: the queue's delayed-retry setting as the broker describes it
    /// (`all (min: 15000ms, max: 60000ms)`; its first word is the type: `all`, `failed`,
    /// `returned`, `disabled`), whatever set it (policy, operator policy, argument).
    pub delayed_retry: Option<String>,
    /// `messages_unacknowledged` (0 when the statistics do not have it yet).
    pub unacknowledged: u64,
    /// False while the API has no message statistics for the queue (declared less than a
    /// statistics interval ago): `messages` and `unacknowledged` are then 0 whatever it holds.
    pub statistics: bool,
    /// Durable flag.
    pub durable: bool,
    /// Auto-delete flag.
    pub auto_delete: bool,
    /// Exclusive flag (`exclusive` field; false when absent).
    pub exclusive: bool,
    /// Queue arguments (`x-queue-type`, `x-max-length`, ...).
    pub arguments: Map<String, Value>,
    /// Name of the policy applied to the queue, if any.
    pub policy: Option<String>,
    /// Definition of the effective policy (empty when none).
    pub effective_policy_definition: Map<String, Value>,
    /// The node that hosts the queue: a quorum queue's `leader`, else `node` (a classic
    /// queue's node, a stream's leader); `None` when the API does not say.
    pub node: Option<String>,
    /// `state` (`running`, `down` when its node is gone, ...); `None` before statistics.
    pub state: Option<String>,
    /// `message_bytes`: the bodies of its messages, ready and unacknowledged, in bytes (0 when
    /// the statistics do not have it yet, and in [`ManagementClient::list_queues_live`]'s
    /// listing; streams report their log size).
    pub message_bytes: u64,
    /// `delivery_limit` of a quorum queue as RabbitMQ 4.x reports it, whatever set it (its
    /// default of 20, the argument, a policy, an operator policy): `Some(-1)` for
    /// `"unlimited"`; `None` where the API does not report it (3.x, other queue types).
    pub delivery_limit: Option<i64>,
    /// True when the listing says which policies apply (`effective_policy_definition` or
    /// `delivery_limit` present): a queue declared less than a statistics interval ago is
    /// listed without them while the broker collects statistics.
    pub policy_known: bool,
}

/// The queue object as the API sends it; every field optional since `columns` and stats vary.
#[derive(Deserialize)]
pub(super) struct RawQueue {
    #[serde(default)]
    vhost: String,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "type")]
    type_name: Option<String>,
    #[serde(default)]
    messages: Option<u64>,
    #[serde(default)]
    messages_ready: Option<u64>,
    #[serde(default)]
    messages_unacknowledged: Option<u64>,
    #[serde(default)]
    durable: Option<bool>,
    #[serde(default)]
    auto_delete: Option<bool>,
    #[serde(default)]
    exclusive: Option<bool>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    policy: Option<Value>,
    #[serde(default)]
    effective_policy_definition: Option<Value>,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    leader: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    message_bytes: Option<u64>,
    #[serde(default)]
    delivery_limit: Option<Value>,
    #[serde(default)]
    messages_delayed: Option<u64>,
    #[serde(default)]
    last_delayed_at: Option<i64>,
    #[serde(default)]
    delayed_retry: Option<String>,
}

/// Turns a JSON value into a map; `[]` (how the broker sometimes renders an empty map) and `null`
/// give an empty map.
fn value_to_map(v: Option<Value>) -> Map<String, Value> {
    match v {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

impl From<RawQueue> for QueueInfo {
    fn from(r: RawQueue) -> Self {
        let statistics = r.messages.is_some()
            || r.messages_ready.is_some()
            || r.messages_unacknowledged.is_some();
        let messages = match (r.messages, r.messages_ready, r.messages_unacknowledged) {
            (Some(m), _, _) => m,
            (None, None, None) => 0,
            (None, ready, unacked) => ready.unwrap_or(0).saturating_add(unacked.unwrap_or(0)),
        };
        let delayed = r.messages_delayed.unwrap_or(0);
        // `messages` counts delayed messages too (RabbitMQ 4.3, measured); the sum does not.
        let messages = if r.messages.is_some() {
            messages.saturating_sub(delayed)
        } else {
            messages
        };
        let type_name = r.type_name.unwrap_or_default();
        let policy_known = r.effective_policy_definition.is_some() || r.delivery_limit.is_some();
        let policy = match r.policy {
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            _ => None,
        };
        QueueInfo {
            vhost: r.vhost,
            name: r.name,
            queue_type: QueueType::from_api(&type_name),
            type_name,
            messages,
            messages_delayed: delayed,
            delayed_until: r.last_delayed_at.filter(|_| delayed > 0),
            delayed_retry: r.delayed_retry.filter(|d| !d.is_empty()),
            unacknowledged: r.messages_unacknowledged.unwrap_or(0),
            statistics,
            durable: r.durable.unwrap_or(false),
            auto_delete: r.auto_delete.unwrap_or(false),
            exclusive: r.exclusive.unwrap_or(false),
            arguments: value_to_map(r.arguments),
            policy,
            effective_policy_definition: value_to_map(r.effective_policy_definition),
            node: r.leader.or(r.node).filter(|n| !n.is_empty()),
            state: r.state,
            message_bytes: r.message_bytes.unwrap_or(0),
            policy_known,
            delivery_limit: match r.delivery_limit {
                Some(Value::Number(n)) => n.as_i64(),
                Some(Value::String(s)) if s == "unlimited" => Some(-1),
                _ => None,
            },
        }
    }
}

/// Cluster identity from `GET /api/overview`, written to the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Overview {
    /// `cluster_name` field.
    #[serde(default)]
    pub cluster_name: Option<String>,
    /// `rabbitmq_version` field (e.g. `3.10.8`).
    #[serde(default, rename = "rabbitmq_version")]
    pub broker_version: Option<String>,
    /// `listeners`: each node's listening sockets (AMQP, stream, clustering, ...).
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// `disable_stats` (RabbitMQ 4.x): true when the management API keeps no message
    /// statistics (`management_agent.disable_metrics_collector = true`): no counts, no
    /// consumers, no connections. Absent (3.x): false.
    #[serde(default)]
    pub disable_stats: bool,
}

/// One listening socket of a node (`/api/overview` `listeners`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Listener {
    /// The node (`rabbit@host`).
    pub node: String,
    /// `amqp`, `amqp/ssl`, `stream`, `stream/ssl`, `http`, `clustering`, ...
    pub protocol: String,
    /// The address it is bound to (`::` or `0.0.0.0` for every interface).
    pub ip_address: String,
    pub port: u16,
}

/// Memory use of one node from `GET /api/nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMemory {
    /// Node name (`rabbit@host`).
    pub name: String,
    /// Memory used, in bytes (0 when not reported).
    pub mem_used: u64,
    /// Memory high watermark, in bytes (0 when not reported).
    pub mem_limit: u64,
    /// True while the node's memory alarm is raised (publishers are blocked).
    pub mem_alarm: bool,
}

#[derive(Deserialize)]
struct RawNode {
    #[serde(default)]
    name: String,
    #[serde(default)]
    mem_used: Option<u64>,
    #[serde(default)]
    mem_limit: Option<u64>,
    #[serde(default)]
    mem_alarm: Option<bool>,
}

impl ManagementClient {
    /// Lists every queue of every vhost the user can see (`GET /api/queues`, only the columns
    /// [`QueueInfo`] needs), in one request: one consistent snapshot. (Reading it by pages
    /// skipped queues while others were declared or deleted between two pages: an offset
    /// shifts under the reader.) Errors: see the module documentation.
    pub fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        self.list_queues_in(&[])
    }

    /// The queues of `vhosts` (exact names), as [`Self::list_queues`] lists them, one request
    /// per vhost (`GET /api/queues/{vhost}`): a broker builds the listing of every queue it
    /// has for `GET /api/queues`, which took 6 s with 20,000 queues in another vhost (RabbitMQ
    /// 3.10.8 here). A vhost that does not exist has no queues (its 404 is not an error).
    /// Empty `vhosts`: every vhost, [`Self::list_queues`]. Errors: see the module documentation.
    pub fn list_queues_in(&self, vhosts: &[String]) -> Result<Vec<QueueInfo>> {
        self.queues_with(vhosts, &format!("columns={QUEUE_COLUMNS}"))
    }

    /// The queues of `vhosts` (empty: every vhost) from the listing without statistics
    /// (`disable_stats=true&enable_queue_totals=true`, RabbitMQ 3.8+), about half the broker's
    /// work of [`Self::list_queues_in`] (20,000 queues: 2.4 s against 6.1 s on 3.10.8, 1.2
    /// against 2.6-3.9 s on 4.3.6; docs/performance.md). Measured on 3.10.8, 4.0.5 and 4.3.6
    /// (`management_agent.disable_metrics_collector` too), what it holds and lacks:
    /// - counts (`messages`, `messages_ready`, `messages_unacknowledged`) of classic and quorum
    ///   queues, the queue's live ones (a queue declared a moment ago shows what it holds, where
    ///   the full listing shows no counts until its next statistics interval); none for
    ///   streams;
    /// - `node` (classic), `leader` (quorum); neither for streams;
    /// - `policy`, the name of the user policy applied (absent when none), never an operator
    ///   policy's; `effective_policy_definition` and `delivery_limit` for quorum queues on 4.3
    ///   only;
    /// - no `message_bytes` (0 here) and no `state` on 3.10.8 streams.
    ///
    /// Errors: see the module documentation.
    pub fn list_queues_live(&self, vhosts: &[String]) -> Result<Vec<QueueInfo>> {
        self.queues_with(
            vhosts,
            &format!("disable_stats=true&enable_queue_totals=true&columns={QUEUE_COLUMNS}"),
        )
    }

    /// `GET /api/queues` (empty `vhosts`) or `GET /api/queues/{vhost}` for each of `vhosts`
    /// with `query`, each queue once.
    fn queues_with(&self, vhosts: &[String], query: &str) -> Result<Vec<QueueInfo>> {
        let mut seen: HashSet<(String, String)> = HashSet::new();
        if vhosts.is_empty() {
            let raw: Vec<RawQueue> = self.get_json("/api/queues", Some(query))?;
            return Ok(raw
                .into_iter()
                .filter(|q| seen.insert((q.vhost.clone(), q.name.clone())))
                .map(QueueInfo::from)
                .collect());
        }
        let mut out = Vec::new();
        for vhost in vhosts {
            let path = format!("/api/queues/{}", encode_segment(vhost));
            let (status, body) = self.request(
                Method::Get,
                &path,
                Some(query),
                None,
                REQUEST_TIMEOUT,
                Some(404),
            )?;
            if status == 404 {
                log::debug!("vhost {vhost} of source.queues.vhosts does not exist: no queues");
                continue;
            }
            let raw: Vec<RawQueue> = serde_json::from_slice(&body).map_err(|e| {
                Error::Management(format!("invalid JSON in response to GET {path}: {e}"))
            })?;
            out.extend(
                raw.into_iter()
                    .filter(|q| &q.vhost == vhost && seen.insert((q.vhost.clone(), q.name.clone())))
                    .map(QueueInfo::from),
            );
        }
        Ok(out)
    }

    /// One queue (`GET /api/queues/{vhost}/{name}`). A missing queue or vhost gives
    /// `HTTP 404 for GET /api/queues/<vhost>/<name>`.
    pub fn get_queue(&self, vhost: &str, name: &str) -> Result<QueueInfo> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        let query = format!("columns={QUEUE_COLUMNS}");
        let raw: RawQueue = self.get_json(&path, Some(&query))?;
        Ok(QueueInfo::from(raw))
    }

    /// Cluster name, broker version and listeners (`GET /api/overview`); needs the monitoring
    /// or administrator tag (SPEC.md "Authentication").
    pub fn overview(&self) -> Result<Overview> {
        self.get_json(
            "/api/overview",
            Some("columns=cluster_name,rabbitmq_version,listeners,disable_stats"),
        )
    }

    /// The deprecated features the broker denies (`GET /api/deprecated-features`, RabbitMQ
    /// 3.13 and later: each feature's `state`, `denied` or `permitted`), by name, such as
    /// `transient_nonexcl_queues` or `global_qos`
    /// (`deprecated_features.permit.<name> = false` in rabbitmq.conf). A broker without the
    /// endpoint (3.12 and earlier: 404) denies none.
    ///
    /// Errors: the management API's.
    pub fn denied_deprecated_features(&self) -> Result<Vec<String>> {
        let path = "/api/deprecated-features";
        let (status, body) =
            self.request(Method::Get, path, None, None, REQUEST_TIMEOUT, Some(404))?;
        if status == 404 {
            return Ok(Vec::new());
        }
        let all: Vec<Value> = serde_json::from_slice(&body).map_err(|e| {
            Error::Management(format!("invalid JSON in response to GET {path}: {e}"))
        })?;
        Ok(all
            .iter()
            .filter(|f| f.get("state").and_then(Value::as_str) == Some("denied"))
            .filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string))
            .collect())
    }

    /// The broker's definitions as the raw JSON bytes of `GET /api/definitions` (up to 1 GiB).
    pub fn export_definitions(&self) -> Result<Vec<u8>> {
        let (_, body) = self.request(
            Method::Get,
            "/api/definitions",
            None,
            None,
            DEFINITIONS_TIMEOUT,
            None,
        )?;
        Ok(body)
    }

    /// Imports definitions (`POST /api/definitions` with the JSON as body); needs the
    /// administrator tag. Invalid or conflicting definitions give `HTTP 400`/`HTTP 500 for POST
    /// /api/definitions: <reason>`.
    pub fn import_definitions(&self, json: &[u8]) -> Result<()> {
        self.request(
            Method::Post,
            "/api/definitions",
            None,
            Some(json),
            DEFINITIONS_TIMEOUT,
            None,
        )?;
        Ok(())
    }

    /// Creates a vhost (`PUT /api/vhosts/{name}`); existing vhosts are left as they are.
    pub fn create_vhost(&self, name: &str) -> Result<()> {
        let path = format!("/api/vhosts/{}", encode_segment(name));
        self.request(Method::Put, &path, None, Some(b"{}"), REQUEST_TIMEOUT, None)?;
        Ok(())
    }

    /// Deletes a vhost and everything in it (`DELETE /api/vhosts/{name}`); a missing vhost is not
    /// an error.
    pub fn delete_vhost(&self, name: &str) -> Result<()> {
        let path = format!("/api/vhosts/{}", encode_segment(name));
        self.delete(&path)
    }

    /// Declares a queue (`PUT /api/queues/{vhost}/{name}` with `durable`, `auto_delete: false` and
    /// `arguments`, e.g. `{"x-queue-type": "quorum"}`). Declaring an existing queue with the same
    /// properties succeeds; different properties give `HTTP 400 for PUT ...: <reason>`.
    pub fn declare_queue(
        &self,
        vhost: &str,
        name: &str,
        durable: bool,
        arguments: &Map<String, Value>,
    ) -> Result<()> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        let body = serde_json::json!({
            "durable": durable,
            "auto_delete": false,
            "arguments": arguments,
        });
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| Error::Serialization(format!("queue declaration: {e}")))?;
        self.request(
            Method::Put,
            &path,
            None,
            Some(&bytes),
            REQUEST_TIMEOUT,
            None,
        )?;
        Ok(())
    }

    /// Deletes a queue and its messages (`DELETE /api/queues/{vhost}/{name}`); a missing queue is
    /// not an error.
    pub fn delete_queue(&self, vhost: &str, name: &str) -> Result<()> {
        let path = format!(
            "/api/queues/{}/{}",
            encode_segment(vhost),
            encode_segment(name)
        );
        self.delete(&path)
    }

    /// Grants `user` full permissions (configure, write and read `.*`) on `vhost`
    /// (`PUT /api/permissions/{vhost}/{user}`).
    pub fn set_permissions(&self, vhost: &str, user: &str) -> Result<()> {
        let path = format!(
            "/api/permissions/{}/{}",
            encode_segment(vhost),
            encode_segment(user)
        );
        let body = br#"{"configure":".*","write":".*","read":".*"}"#;
        self.request(Method::Put, &path, None, Some(body), REQUEST_TIMEOUT, None)?;
        Ok(())
    }

    /// The nodes with a memory alarm in effect now, from `GET /api/health/checks/alarms`
    /// (RabbitMQ 3.8.10+: 200 when no alarm, 503 listing `{node, resource}`), which the node
    /// answers live; `/api/nodes` reports `mem_alarm` with its statistics (measured on 3.10.8:
    /// still `false` 6 s after the alarm the health check listed at once). Disk alarms are
    /// left out: a backup only reads.
    ///
    /// Errors: the management API's, `Error::Management` for an answer that is not JSON.
    pub fn memory_alarms(&self) -> Result<Vec<String>> {
        #[derive(Deserialize)]
        struct Alarm {
            node: String,
            resource: String,
        }
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            alarms: Vec<Alarm>,
        }
        let (_, body) = self.request(
            Method::Get,
            HEALTH_ALARMS,
            None,
            None,
            REQUEST_TIMEOUT,
            Some(503),
        )?;
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| {
            Error::Management(format!(
                "invalid JSON in response to GET {HEALTH_ALARMS}: {e}"
            ))
        })?;
        Ok(answer
            .alarms
            .into_iter()
            .filter(|a| a.resource == "memory")
            .map(|a| a.node)
            .collect())
    }

    /// Memory use and alarm state of every node (`GET /api/nodes`), used to check headroom before
    /// holding a whole queue unacknowledged (DESIGN.md decision 7).
    pub fn nodes_memory(&self) -> Result<Vec<NodeMemory>> {
        let raw: Vec<RawNode> = self.get_json(
            "/api/nodes",
            Some("columns=name,mem_used,mem_limit,mem_alarm"),
        )?;
        Ok(raw
            .into_iter()
            .map(|n| NodeMemory {
                name: n.name,
                mem_used: n.mem_used.unwrap_or(0),
                mem_limit: n.mem_limit.unwrap_or(0),
                mem_alarm: n.mem_alarm.unwrap_or(false),
            })
            .collect())
    }
}
