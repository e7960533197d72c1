//! What a restore learns of its target before it publishes, from one listing of the management
//! API (when `target.management_url` is set): which target queues are streams (their records
//! go differently: `super::publish`, `super::raw_stream`), and the node that hosts each, so
//! that a queue is published through a connection to its own node (`crate::broker::nodes`: the cluster
//! then does not forward every message to it). A queue the restore creates lives on the node
//! its declaring connection went to (RabbitMQ's default `client-local` locator), so its
//! messages are local too.

use super::QueueRestore;
use crate::broker::amqp::AmqpUrl;
use crate::broker::management::{ManagementClient, QueueInfo};
use crate::broker::nodes::Nodes;
use crate::broker::QueueType;
use crate::error::Result;
use std::collections::{BTreeMap, HashMap};

/// Sets each queue's `target_is_stream` and `target_node`, and returns the target's nodes
/// (`urls`, with node-local addresses when the management API lists more than one node).
///
/// Without the management API the backup's queue types are taken for the targets' and every
/// connection goes through `urls`. A listing that fails is only a warning: nothing is
/// node-local then, and types come from the backup.
pub(super) fn look(
    mgmt: Option<&ManagementClient>,
    urls: Vec<AmqpUrl>,
    queues: &mut [QueueRestore],
) -> Result<Nodes> {
    // The target vhosts' queues only (a broker builds the listing of every queue it has for
    // `GET /api/queues`: seconds on a broker with many).
    let mut vhosts: Vec<String> = queues.iter().map(|q| q.target_vhost.clone()).collect();
    vhosts.sort();
    vhosts.dedup();
    let listed = mgmt
        .filter(|_| !vhosts.is_empty())
        .map(|m| -> Result<_> { Ok((m.overview()?, m.list_queues_in(&vhosts)?)) });
    let (nodes, by_name) = match listed {
        Some(Ok((overview, listed))) => {
            let nodes = Nodes::with_locality(urls, &overview.listeners, &BTreeMap::new())?;
            let by_name: HashMap<(String, String), QueueInfo> = listed
                .into_iter()
                .map(|q| ((q.vhost.clone(), q.name.clone()), q))
                .collect();
            (nodes, by_name)
        }
        Some(Err(e)) => {
            log::warn!("the target's queues could not be listed ({e}): every queue is published through target.amqp_url");
            (Nodes::new(urls), HashMap::new())
        }
        None => (Nodes::new(urls), HashMap::new()),
    };
    for q in queues {
        let info = by_name.get(&(q.target_vhost.clone(), q.target_queue.clone()));
        q.target_is_stream = match info {
            Some(info) => info.queue_type == Some(QueueType::Stream),
            None => q.queue_type == Some(QueueType::Stream),
        };
        q.target_node = info.and_then(|i| i.node.clone());
    }
    Ok(nodes)
}
