//! `backup` (SPEC.md "backup"): segment rotation, compression, requeue strategy, concurrency
//! and checkpoint cadence of a backup run, with their defaults and range checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{check_positive, config_err};
use crate::error::Result;

/// `backup.compression`: `zstd` (default), `lz4` or `none`. The segment module has
/// its own `Compression`; the caller maps this onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompressionKind {
    #[default]
    Zstd,
    Lz4,
    None,
}

impl CompressionKind {
    /// The lowercase name (`zstd`, `lz4`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            CompressionKind::Zstd => "zstd",
            CompressionKind::Lz4 => "lz4",
            CompressionKind::None => "none",
        }
    }
}

/// `backup.requeue_strategy` (the book's "How a backup reads a queue"): how messages read without
/// acknowledgement are handed back to the broker. Default `cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequeueStrategy {
    /// basic.consume, then basic.cancel: the broker requeues every unacked message.
    #[default]
    Cancel,
    /// basic.get + basic.nack(requeue=true) per message.
    Nack,
    /// basic.reject(requeue=true) per message.
    Reject,
    /// basic.get (pull) one at a time, then nack.
    Get,
}

/// `backup` options; every field optional with the default shown.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct BackupOptions {
    /// Maximum uncompressed segment size in bytes before rotation; default 134217728; > 0.
    pub segment_max_bytes: u64,
    /// Maximum milliseconds before segment rotation; default 60000; > 0.
    pub segment_max_interval_ms: u64,
    /// Segment compression; default zstd. With zstd, a queue's segment that zstd did not
    /// shrink (to less than 98% of a payload of at least 256 KiB: random or already compressed
    /// bodies) is followed by 15 segments stored uncompressed, then one compressed again
    /// (docs/segment-format.md); each segment's header says which.
    pub compression: CompressionKind,
    /// zstd level 1..=22, default 3; ignored for lz4 and none.
    pub compression_level: i32,
    /// RBAK segment format version written (docs/segment-format.md): 1 (default, the common
    /// format, a record's body as a JSON array of numbers, which other tools read), 2 (a
    /// record's metadata as JSON, then its body as raw bytes; read by rmq-backup only) or 3
    /// (version 2, where a message read over AMQP 0-9-1 keeps its properties and headers as
    /// the broker sent them, in binary metadata: the least CPU; read by rmq-backup only, and
    /// refused by a reader older than it by the segment's header). Every reader of rmq-backup
    /// reads each.
    #[schemars(range(min = 1, max = 3))]
    pub segment_version: u8,
    /// AMQP QoS prefetch count (0 = unlimited); unset by default. Not used by a one-shot
    /// backup of classic and quorum queues, which must hold a queue's whole depth
    /// unacknowledged: each consumer's prefetch is sized to what it must hold (see the book's
    /// "How a backup reads a queue"), and the backup warns when the field is set.
    pub prefetch_count: Option<u16>,
    /// Default cancel. Quorum queues on RabbitMQ 4.3+ are always given back with
    /// `basic.nack(requeue)`, which does not count as a failed delivery (`backup/quorum.rs`).
    pub requeue_strategy: RequeueStrategy,
    /// Read quorum queues with a finite delivery limit on a broker that counts every return
    /// against it (3.x, 4.0-4.2); default false: such queues are left alone (exit 4). When
    /// true, each read costs each message one count: a queue is read while one more read
    /// leaves every message at most at limit - 1, judged before anything is taken from a
    /// record of earlier reads kept in the repository (rmq-backup-state/), then left alone
    /// (exit 4) until it has been seen empty or its limit is raised. See the book's "How a
    /// backup reads a queue".
    pub read_queues_with_delivery_limit: bool,
    /// Queues backed up in parallel (one AMQP connection each); default 4; >= 1.
    pub max_concurrent_queues: usize,
    /// Deprecated: "seconds between checkpoint writes" of other tools (>= 1 when set),
    /// accepted and without effect; remove it from the file. A backup records its progress at every stored segment: a queue's
    /// completion, and each segment of a stream in a continuous backup (closed by
    /// `segment_max_bytes` or `segment_max_interval_ms`, which bound what a killed run reads
    /// again). The backup warns when it is set.
    pub checkpoint_interval_secs: Option<u64>,
    /// Seconds between checkpoint syncs to remote storage; default 30; >= 1.
    pub sync_interval_secs: u64,
    /// How many times a queue's read starts again after its connection was lost (closed by an
    /// operator or the broker, a broker restart, a network stall caught by the heartbeat, the
    /// management API down); default 3; 0 = never. Each attempt reads the queue from its head
    /// (the broker has every message back) into new segments.
    pub connection_retries: u32,
    /// Wait before the first retry, milliseconds, doubling each time up to 30 s; default 1000.
    pub connection_retry_backoff_ms: u64,
    /// Export definitions; default true.
    pub include_definitions: bool,
    /// One-shot backup of the depth present at start; default true. False is a continuous
    /// backup: streams are followed live (needs `stream_enabled: true`), queues are still read
    /// once, to their depth at the start (the book's "Streams").
    pub stop_at_current_depth: bool,
    /// Read streams with the stream protocol (`source.stream_port`); default false, when
    /// streams are skipped with a warning.
    pub stream_enabled: bool,
    /// This run writes one part of a backup shared by `count` workers (the book's "Clusters
    /// and sharded backups"); unset by default: one run writes the whole backup.
    pub shard: Option<ShardConfig>,
    /// Consumer references (the stream protocol's offset tracking names, at most 256 bytes)
    /// whose stored offset is backed up for every stream read over the stream protocol, so
    /// that a restore can give each consumer its place in the new stream
    /// (`restore.stream_offsets`); default empty. RabbitMQ 3.10 cannot list references: they
    /// are named here.
    pub stream_offset_references: Vec<String>,
    /// Encrypt segments and definitions with age to these recipients (the book's "Encryption
    /// at rest"); unset by default: stored unencrypted.
    pub encryption: Option<super::encryption::BackupEncryption>,
    /// Queues read over AMQP 1.0 on RabbitMQ 4.0 and later (issue 39; the book's "Queues read
    /// over AMQP 1.0"): glob patterns matched against a queue's whole name, as
    /// `source.queues.include` (`*` any run of characters, `?` one); default empty, every queue
    /// read over AMQP 0-9-1. A matched queue's records keep each AMQP 1.0 message as its
    /// publisher sent it and are written in segment format version 2 whatever
    /// `segment_version` says; on a node older than 4.0 it is read over 0-9-1, with a warning.
    pub amqp10_queues: Vec<String>,
}

/// `backup.shard`: which part of a sharded backup this run writes (the book's "Clusters and
/// sharded backups").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// This worker's part, 0-based, below `count`; unset: the environment variable
    /// `JOB_COMPLETION_INDEX` (what a Kubernetes Indexed Job sets).
    #[serde(default)]
    pub index: Option<u32>,
    /// How many workers share the backup, at least 1.
    pub count: u32,
}

impl Default for BackupOptions {
    fn default() -> Self {
        BackupOptions {
            segment_max_bytes: 134_217_728,
            segment_max_interval_ms: 60_000,
            compression: CompressionKind::Zstd,
            compression_level: 3,
            segment_version: 1,
            prefetch_count: None,
            requeue_strategy: RequeueStrategy::Cancel,
            read_queues_with_delivery_limit: false,
            max_concurrent_queues: 4,
            checkpoint_interval_secs: None,
            sync_interval_secs: 30,
            connection_retries: 3,
            connection_retry_backoff_ms: 1000,
            include_definitions: true,
            stop_at_current_depth: true,
            stream_enabled: false,
            shard: None,
            stream_offset_references: Vec::new(),
            encryption: None,
            amqp10_queues: Vec::new(),
        }
    }
}

impl BackupOptions {
    /// True when the queue `name` matches a pattern of `backup.amqp10_queues`.
    pub fn reads_amqp10(&self, name: &str) -> bool {
        self.amqp10_queues
            .iter()
            .any(|p| crate::broker::selection::glob_matches(p, name))
    }

    /// The segment format version a queue's segments are written in: for a queue of
    /// `backup.amqp10_queues` 2, or 3 when `segment_version` is 3 (version 1 cannot hold its
    /// records), else `segment_version`.
    pub fn segment_version_for(&self, name: &str) -> u8 {
        if self.reads_amqp10(name) {
            self.segment_version
                .max(crate::repository::segment::VERSION_2)
        } else {
            self.segment_version
        }
    }
}

pub(super) fn validate_backup_options(b: &BackupOptions) -> Result<()> {
    if let Some(e) = &b.encryption {
        e.recipients()?;
    }
    check_positive(b.segment_max_bytes, "backup.segment_max_bytes")?;
    check_positive(b.segment_max_interval_ms, "backup.segment_max_interval_ms")?;
    if b.compression == CompressionKind::Zstd && !(1..=22).contains(&b.compression_level) {
        return Err(config_err(format!(
            "backup.compression_level must be between 1 and 22 for zstd, got {}",
            b.compression_level
        )));
    }
    if !(1..=3).contains(&b.segment_version) {
        return Err(config_err(format!(
            "backup.segment_version must be 1, 2 or 3, got {}",
            b.segment_version
        )));
    }
    if b.max_concurrent_queues == 0 {
        return Err(config_err(
            "backup.max_concurrent_queues must be at least 1",
        ));
    }
    if let Some(n) = b.checkpoint_interval_secs {
        check_positive(n, "backup.checkpoint_interval_secs")?;
    }
    check_positive(b.sync_interval_secs, "backup.sync_interval_secs")?;
    for r in &b.stream_offset_references {
        if r.is_empty() || r.len() > 256 {
            return Err(config_err(format!(
                "backup.stream_offset_references: {r:?} is not a consumer reference (1 to 256 bytes)"
            )));
        }
    }
    if let Some(p) = b.amqp10_queues.iter().find(|p| p.is_empty()) {
        return Err(config_err(format!(
            "backup.amqp10_queues: {p:?} is not a queue name pattern (empty)"
        )));
    }
    if let Some(shard) = &b.shard {
        if shard.count == 0 {
            return Err(config_err("backup.shard.count must be at least 1"));
        }
        if let Some(i) = shard.index.filter(|i| *i >= shard.count) {
            return Err(config_err(format!(
                "backup.shard.index {i} is not below backup.shard.count {}",
                shard.count
            )));
        }
    }
    Ok(())
}
