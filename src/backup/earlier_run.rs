//! An earlier run of this backup that may still hold messages.
//!
//! A run stopped without closing its connections (SIGSTOPped, its machine frozen, its network
//! cut) keeps them open on the broker until the broker misses its heartbeats (two heartbeat
//! intervals: two minutes with the broker's default of 60 s; never with heartbeats off), and
//! with them every message it had been delivered and not yet given back. When this run finds
//! an earlier run's manifest interrupted, each queue read waits until the management API has
//! statistics for the queue (`super::unacked`); when it took over the lock of a run that had
//! not ended (`crate::repository::lock::RunLock::replaced`), the connections of that run are closed
//! through the management API while reads wait, so that the broker gives their messages back
//! now.
//!
//! Every connection of a run carries its run id (`... (run <run_id>)`, the lock's
//! `<host>-<pid>-<started_at>`), so that exactly the run whose lock was taken over is closed:
//! never another backup that happens to use the same `backup_id` with other storage, nor
//! another part of a sharded backup. The API lists a connection up to a statistics interval
//! (5 s) after it opened, which is why the list is read again while reads wait.

use crate::broker::management::ManagementClient;
use crate::repository::lock::RunLock;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the connection list is read again while reads wait.
const RELIST: Duration = Duration::from_secs(1);

/// This run's view of an earlier run of the same backup (see the module documentation).
pub(super) struct EarlierRun {
    /// How the names of the backup's connections start (`rmq-backup <id> `, with the part).
    prefix: String,
    /// `run <run_id>)`: how the names of this run's connections end.
    own: String,
    /// How the names of the connections of the run whose lock this one took over end.
    taken_over: Option<String>,
    /// True when an earlier run may still hold messages.
    seen: bool,
    /// When the list was read last, and the earlier run's connections closed so far.
    closed: Mutex<(Option<Instant>, HashSet<String>)>,
}

impl EarlierRun {
    /// `prefix`: how the backup's connection names start; `interrupted`: an earlier run's
    /// manifest was found interrupted; `lock`: this run's lock. Nothing is closed yet: a
    /// queue's read closes the connections while it waits for their messages
    /// ([`Self::close_listed`]), after its first look at the queue, so that what they held
    /// counts as unacknowledged at the start (`super::unacked`).
    pub(super) fn find(prefix: String, interrupted: bool, lock: &RunLock) -> EarlierRun {
        EarlierRun {
            prefix,
            own: format!("run {})", lock.run_id()),
            taken_over: lock.replaced().map(|l| format!("run {})", l.run_id)),
            seen: interrupted || lock.replaced().is_some(),
            closed: Mutex::new((None, HashSet::new())),
        }
    }

    /// True when an earlier run of this backup may still hold messages.
    pub(super) fn seen(&self) -> bool {
        self.seen
    }

    /// The name of one of this run's connections: the backup's prefix, `what` (the vhost, or
    /// the stream), `detail` (`thread <n>, `, or empty) and this run's id.
    pub(super) fn connection_name(&self, what: &str, detail: &str) -> String {
        format!("{}{what} ({detail}{}", self.prefix, self.own)
    }

    /// Closes, at most once per [`RELIST`], the connections of the run whose lock this one
    /// took over that the API lists now. Never fails: a list the API does not give, or a
    /// close it refuses (a user without the right), is logged, and reads wait for the broker.
    pub(super) fn close_listed(&self, mgmt: &ManagementClient) {
        let Some(suffix) = &self.taken_over else {
            return;
        };
        let Ok(mut closed) = self.closed.lock() else {
            return;
        };
        if closed.0.is_some_and(|t| t.elapsed() < RELIST) {
            return;
        }
        closed.0 = Some(Instant::now());
        let open = match mgmt.connections_named(&self.prefix) {
            Ok(open) => open,
            Err(e) => {
                log::warn!("the connections of the run this one took the lock over from cannot be listed ({e}); reads wait for the broker to give back what it holds");
                return;
            }
        };
        for (name, given) in open.iter().filter(|(_, given)| given.ends_with(suffix)) {
            if !closed.1.insert(name.clone()) {
                continue;
            }
            log::warn!("connection {given} of an earlier run of this backup (its lock taken over) is still open: closing it, so that the broker gives back the messages it holds");
            if let Err(e) = mgmt.close_connection(name) {
                log::warn!("connection {given} of an earlier run not closed ({e}); reads wait until the broker closes it");
            }
        }
    }
}
