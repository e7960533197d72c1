//! What the queue threads of a backup share, in two halves that follow the data: what a
//! queue's read needs from the broker side ([`ReadContext`]: the source, its connections,
//! what may hold a queue's messages, why a run stops) and what storing its records needs from
//! the repository side ([`StoreContext`]: segments, their encryption and compression, storage,
//! checkpoints, what an earlier run stored). A queue's job gets both ([`QueueContext`]).

use super::{alarm, earlier_run, quorum, stored, LeftOut};
use crate::broker::management::ManagementClient;
use crate::broker::nodes::Nodes;
use crate::config::{BackupOptions, SourceConfig};
use crate::repository::checkpoint::Checkpoints;
use crate::repository::encryption::Recipients;
use crate::repository::lock::RunLock;
use crate::repository::segment::Compression;
use crate::repository::storage::Storage;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What every queue thread shares: the read half and the store half.
pub(super) struct QueueContext<'a> {
    /// What a queue's read needs (the broker side).
    pub(super) read: ReadContext<'a>,
    /// What storing a queue's records needs (the repository side).
    pub(super) store: StoreContext<'a>,
}

/// What reading a queue needs: the source broker, how to connect to it, who may hold a
/// queue's messages, and why a run stops.
pub(super) struct ReadContext<'a> {
    pub(super) source: &'a SourceConfig,
    /// `source.amqp_url` with `source.tls` applied (`crate::broker::tls::resolve`), and the address of
    /// each node for node-local reads.
    pub(super) nodes: Nodes,
    /// The TLS settings of the source's AMQP and stream connections, when its AMQP URL uses
    /// TLS.
    pub(super) tls: Option<Arc<crate::broker::tls::TlsClient>>,
    /// `backup` options of the configuration.
    pub(super) opts: &'a BackupOptions,
    /// An earlier run of this backup that may still hold messages; this run's connection
    /// names.
    pub(super) earlier_run: earlier_run::EarlierRun,
    /// The source broker's version: what giving a quorum queue's messages back costs
    /// (`quorum`).
    pub(super) broker_version: quorum::SeenVersion,
    /// The source's `cluster_name` (`GET /api/overview`), which names its queues' records of
    /// delivery counts (`counted`).
    pub(super) cluster: Option<String>,
    /// False when the source's management API keeps no message statistics (`unacked`).
    pub(super) statistics: bool,
    /// The source's management API (who holds a queue's unacknowledged messages).
    pub(super) mgmt: &'a ManagementClient,
    /// Queues backed up without some of their messages, as the queue threads find them.
    pub(super) left_out: Mutex<Vec<LeftOut>>,
    /// Why the run stops, once it must: a memory alarm on the source, a connection the broker
    /// blocked.
    pub(super) stop: alarm::Stop,
    /// The run's lock: when another run takes it over, this one stops.
    pub(super) lock: &'a RunLock,
}

/// What storing a queue's records needs: the backup's identity, how segments are made, where
/// they go, and what an earlier run or attempt stored.
pub(super) struct StoreContext<'a> {
    /// `backup` options of the configuration.
    pub(super) opts: &'a BackupOptions,
    pub(super) backup_id: &'a str,
    /// The id this run's state is kept under in the checkpoint database
    /// (`run_state::Target::checkpoint_id`).
    pub(super) checkpoint_id: String,
    pub(super) compression: Compression,
    /// `backup.encryption`: the recipients every segment is encrypted to.
    pub(super) encrypt: Option<&'a Recipients>,
    pub(super) spool: &'a Path,
    /// Where segments go (and, on a rerun, where the earlier run's are found).
    pub(super) storage: &'a dyn Storage,
    /// The `offset_storage` checkpoint database, when configured.
    pub(super) checkpoints: Option<&'a Checkpoints>,
    /// The segments storage held for this backup id when the run started, and the highest
    /// segment number each queue's attempts of this run assigned.
    pub(super) earlier: stored::Earlier,
    /// Queues (vhost, name) read more than once by this run (`retry`): their abandoned
    /// attempts' segments are removed once the backup completes.
    pub(super) retried: Mutex<std::collections::HashSet<(String, String)>>,
}
