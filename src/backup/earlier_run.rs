//! An earlier run of this backup that may still hold messages.
//!
//! A run stopped without closing its connections (SIGSTOPped, its machine frozen, its network
//! cut) keeps them open on the broker until the broker misses its heartbeats (two heartbeat
//! intervals: two minutes with the broker's default of 60 s; never with heartbeats off), and
//! with them every message it had been delivered and not yet given back. When this run finds
//! such a run (an interrupted manifest, or a connection of it still open), each queue read
//! waits until the management API has statistics for the queue (`super::unacked`), and
//! while a read waits, the earlier run's connections are closed through the management API,
//! so that the broker gives their messages back now.
//!
//! Connections are told by their names: every connection of a run is named
//! `<prefix>... (..., run <tag>)` (`super::run_state::Target::connection_prefix`, and a tag of
//! this run's own); one with the prefix and another tag is an earlier run's. A part of a
//! sharded backup has its own prefix and leaves the other parts' connections alone. The
//! API lists a connection up to a statistics interval (5 s) after it opened, which is why the
//! list is read again while reads wait.

use crate::management::ManagementClient;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the connection list is read again while reads wait.
const RELIST: Duration = Duration::from_secs(1);

/// This run's view of an earlier run of the same backup (see the module documentation).
pub(super) struct EarlierRun {
    /// How the names of the backup's connections start.
    prefix: String,
    /// `run <tag>`, in the names of this run's connections.
    own: String,
    /// True when an earlier run may still hold messages.
    seen: bool,
    /// When the list was read last, and the earlier run's connections closed so far.
    closed: Mutex<(Option<Instant>, HashSet<String>)>,
}

impl EarlierRun {
    /// `prefix`: how the backup's connection names start; `interrupted`: an earlier run's
    /// manifest was found interrupted. Closes the earlier run's connections listed now.
    pub(super) fn find(mgmt: &ManagementClient, prefix: String, interrupted: bool) -> EarlierRun {
        let mut e = EarlierRun {
            prefix,
            own: format!("run {:x}", crate::now_ms()),
            seen: interrupted,
            closed: Mutex::new((None, HashSet::new())),
        };
        e.seen |= e.close_listed(mgmt);
        e
    }

    /// True when an earlier run of this backup may still hold messages.
    pub(super) fn seen(&self) -> bool {
        self.seen
    }

    /// The name of one of this run's connections: the backup's prefix, `what` (the vhost and
    /// thread, or the stream), and this run's tag.
    pub(super) fn connection_name(&self, what: &str, detail: &str) -> String {
        format!("{}{what} ({detail}{})", self.prefix, self.own)
    }

    /// Closes, at most once per [`RELIST`], the earlier run's connections the API lists now;
    /// true when it lists one. Never fails: a list the API does not give, or a close it
    /// refuses (a user without the right), is logged, and reads wait for the broker.
    pub(super) fn close_listed(&self, mgmt: &ManagementClient) -> bool {
        let Ok(mut closed) = self.closed.lock() else {
            return false;
        };
        if closed.0.is_some_and(|t| t.elapsed() < RELIST) {
            return false;
        }
        closed.0 = Some(Instant::now());
        let open = match mgmt.connections_named(&self.prefix) {
            Ok(open) => open,
            Err(e) => {
                log::warn!("the connections of an earlier run of this backup cannot be listed ({e}); reads wait for the broker to give back what it holds");
                return false;
            }
        };
        let mut found = false;
        for (name, given) in open.iter().filter(|(_, given)| !given.contains(&self.own)) {
            found = true;
            if !closed.1.insert(name.clone()) {
                continue;
            }
            log::warn!("connection {given} of an earlier run of this backup is still open: closing it, so that the broker gives back the messages it holds");
            if let Err(e) = mgmt.close_connection(name) {
                log::warn!("connection {given} of an earlier run not closed ({e}); reads wait until the broker closes it");
            }
        }
        found
    }
}
