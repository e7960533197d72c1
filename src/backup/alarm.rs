//! A backup and the source's memory alarm (DESIGN.md decision 7: a broker under a memory
//! alarm is not read, and a read stops cleanly, every message left in place, when one is
//! raised).
//!
//! RabbitMQ blocks a connection (`connection.blocked`) only once it publishes while an alarm
//! lasts; a backup only reads, so it never hears of one that way (RabbitMQ 3.10.8, tried: a
//! backup read a queue to its end under an alarm). The run therefore asks the management API
//! (`GET /api/nodes`) before it starts, and its alarms health check (which, unlike
//! `/api/nodes`, answers live) every [`POLL`] while it reads; the first alarm it sees stops
//! every queue read: the messages a read holds unacknowledged are what the broker
//! keeps in memory for it, and giving them back is what relieves the broker. Stream reads over
//! the stream protocol hold nothing and finish.

use crate::broker::management::ManagementClient;
use crate::error::{Error, Result};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the management API is asked for alarms while queues are read.
pub const POLL: Duration = Duration::from_secs(2);

/// Why the run stops, set once by the first cause (an alarm, a blocked connection) and read by
/// every queue read between deliveries.
#[derive(Debug, Default)]
pub(super) struct Stop(Mutex<Option<String>>);

impl Stop {
    /// Records `why` unless a reason is recorded already.
    pub(super) fn set(&self, why: String) {
        let mut reason = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if reason.is_none() {
            *reason = Some(why);
        }
    }

    /// The reason the run stops, if it does.
    pub(super) fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Refuses to start while a node has a memory alarm (its publishers are blocked; reading now
/// would only add pressure); warns when a node uses more than 80 % of its limit.
///
/// Errors: `Error::Amqp` naming the node and its memory, or the management API's error.
pub(super) fn check_headroom(mgmt: &ManagementClient) -> Result<()> {
    for node in mgmt.nodes_memory()? {
        if node.mem_alarm {
            return Err(Error::Amqp(format!(
                "broker node {} has a memory alarm ({} of {} bytes used); backup not started, every message left in place",
                node.name, node.mem_used, node.mem_limit
            )));
        }
        if node.mem_limit > 0 && node.mem_used > node.mem_limit / 10 * 8 {
            log::warn!(
                "broker node {} uses {} of its {} bytes memory limit",
                node.name,
                node.mem_used,
                node.mem_limit
            );
        }
    }
    Ok(())
}

/// Asks the management API for alarms every [`POLL`] until `done` returns true, and records
/// the first one in `stop`. A management API that does not answer is no alarm (the reads do
/// not need it): said once at warning level, and once more when it answers again.
pub(super) fn watch(mgmt: &ManagementClient, stop: &Stop, done: &dyn Fn() -> bool) {
    let mgmt = mgmt.clone().single_attempt();
    let mut silent = false;
    let mut next = Instant::now() + POLL;
    while !done() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        next = Instant::now() + POLL;
        match mgmt.memory_alarms() {
            Ok(nodes) => {
                if std::mem::take(&mut silent) {
                    log::info!("the management API answers again; memory alarms are watched");
                }
                if let Some(node) = nodes.first() {
                    stop.set(format!(
                        "broker node {node} raised a memory alarm; backup stopped, every message left in place"
                    ));
                    return;
                }
            }
            Err(e) if !silent => {
                silent = true;
                log::warn!(
                    "memory alarms are not watched while the management API does not answer: {e}"
                );
            }
            Err(_) => {}
        }
    }
}
