//! `restore` (SPEC.md "restore"): time window, mappings, publish mode, confirms, rate limit,
//! definitions import and dry runs, with their defaults and range checks.

use schemars::JsonSchema;
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::checks::{check_positive, config_err};
use crate::error::Result;

/// Longest AMQP 0-9-1 queue or exchange name, in bytes (names are `shortstr`).
const MAX_AMQP_NAME_BYTES: usize = 255;

/// `restore.publish_mode`: `exchange` (default) or `direct-to-queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PublishMode {
    /// Original exchange and routing key; exchange_mapping applies.
    #[default]
    Exchange,
    /// Default exchange with routing key = target queue name.
    DirectToQueue,
}

/// `restore.definitions_selection`: partial definitions import. All lists empty =
/// import everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DefinitionsSelection {
    /// Vhosts to restore.
    pub vhosts: Vec<String>,
    /// Queue names to restore (with the exchanges and bindings they need).
    pub queues: Vec<String>,
    /// Exchange names to restore.
    pub exchanges: Vec<String>,
}

impl DefinitionsSelection {
    /// True when no list has an entry (import everything).
    pub fn is_empty(&self) -> bool {
        self.vhosts.is_empty() && self.queues.is_empty() && self.exchanges.is_empty()
    }
}

/// `restore.convert_mirrored_queues` (docs/migration.md "From RabbitMQ 3.x to 4.x"): the type a classic
/// queue that a classic-mirroring policy applied to in the backup is declared with when the
/// target runs RabbitMQ 4.x, which removed mirroring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConvertMirroredQueues {
    /// A quorum queue (`x-queue-type: quorum`), as RabbitMQ's migration guide advises.
    Quorum,
}

/// `restore` options; every field optional with the default shown.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RestoreOptions {
    /// Epoch ms; only records with backed_up_at >= this are restored.
    pub time_window_start: Option<i64>,
    /// Epoch ms; only records with backed_up_at <= this are restored.
    pub time_window_end: Option<i64>,
    /// Source queue name -> target queue name.
    pub queue_mapping: BTreeMap<String, String>,
    /// Source vhost -> target vhost.
    pub vhost_mapping: BTreeMap<String, String>,
    /// Source exchange -> target exchange (publish_mode exchange).
    pub exchange_mapping: BTreeMap<String, String>,
    /// Default exchange.
    pub publish_mode: PublishMode,
    /// Default true.
    pub publisher_confirms: bool,
    /// Queues restored in parallel; default 4; >= 1.
    pub max_concurrent_queues: usize,
    /// Publish batch size; default 100; >= 1.
    pub produce_batch_size: usize,
    /// Messages per second; default 0 = unlimited.
    pub rate_limit_messages_per_sec: u64,
    /// Restore definitions before messages; default true; needs target management access.
    pub restore_definitions: bool,
    /// Validate definitions without importing; default false.
    pub definitions_dry_run: bool,
    /// Default empty (everything).
    pub definitions_selection: DefinitionsSelection,
    /// Declare the mirrored classic queues of a RabbitMQ 3.x backup as quorum queues on a 4.x
    /// target; default none (they stay classic). Needs `restore_definitions`.
    pub convert_mirrored_queues: Option<ConvertMirroredQueues>,
    /// Create missing target queues (direct-to-queue); default false; needs target management
    /// access.
    pub create_missing_queues: bool,
    /// Restore checkpoint database path: a rerun skips what was confirmed (the book's "Resuming
    /// a killed run").
    pub checkpoint_state: Option<PathBuf>,
    /// Accepted (default 60, >= 1) and has no effect: a restore records each queue's
    /// confirmed prefix whenever it moves (at every wait for confirms and after every batch of
    /// records), so a rerun publishes again at most the window in flight. A restore warns
    /// when it is set to anything but 60.
    pub checkpoint_interval_secs: u64,
    /// How long publishing waits while the target blocks its connections (a memory or disk
    /// alarm, `connection.blocked`) before the restore fails; default 300; >= 1.
    pub blocked_timeout_secs: u64,
    /// Publish nothing, print a summary; default false.
    pub dry_run: bool,
    /// What becomes of the stream consumer offsets a backup holds
    /// (`backup.stream_offset_references`); default translate.
    pub stream_offsets: StreamOffsets,
    /// Where the identity of an encrypted backup is (docs/encryption.md "Encryption at rest"); unset:
    /// `RMQ_BACKUP_AGE_IDENTITY`.
    pub encryption: Option<super::encryption::RestoreEncryption>,
}

/// `restore.stream_offsets` (docs/streams.md "Stream consumer offsets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamOffsets {
    /// Each backed-up offset is translated to the offset that the last restored message at or
    /// before it took in the target stream (its consumer resumes at the next one), and stored
    /// there under the same reference; a reference before every restored message is left unset
    /// with a warning.
    #[default]
    Translate,
    /// Consumer offsets are not restored.
    Skip,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            time_window_start: None,
            time_window_end: None,
            queue_mapping: BTreeMap::new(),
            vhost_mapping: BTreeMap::new(),
            exchange_mapping: BTreeMap::new(),
            publish_mode: PublishMode::Exchange,
            publisher_confirms: true,
            max_concurrent_queues: 4,
            produce_batch_size: 100,
            rate_limit_messages_per_sec: 0,
            restore_definitions: true,
            definitions_dry_run: false,
            definitions_selection: DefinitionsSelection::default(),
            convert_mirrored_queues: None,
            create_missing_queues: false,
            checkpoint_state: None,
            checkpoint_interval_secs: 60,
            blocked_timeout_secs: 300,
            dry_run: false,
            stream_offsets: StreamOffsets::Translate,
            encryption: None,
        }
    }
}

fn check_mapping(map: &BTreeMap<String, String>, field: &str, allow_empty: bool) -> Result<()> {
    for (from, to) in map {
        if to.is_empty() && !allow_empty {
            return Err(config_err(format!(
                "{field} maps {from:?} to an empty name"
            )));
        }
        if to.len() > MAX_AMQP_NAME_BYTES {
            return Err(config_err(format!(
                "{field} maps {from:?} to a name longer than {MAX_AMQP_NAME_BYTES} bytes"
            )));
        }
    }
    Ok(())
}

pub(super) fn validate_restore_options(r: &RestoreOptions) -> Result<()> {
    if let (Some(start), Some(end)) = (r.time_window_start, r.time_window_end) {
        if start > end {
            return Err(config_err(format!(
                "restore.time_window_start ({start}) must not be after restore.time_window_end ({end})"
            )));
        }
    }
    if r.max_concurrent_queues == 0 {
        return Err(config_err(
            "restore.max_concurrent_queues must be at least 1",
        ));
    }
    if r.produce_batch_size == 0 {
        return Err(config_err("restore.produce_batch_size must be at least 1"));
    }
    check_positive(
        r.checkpoint_interval_secs,
        "restore.checkpoint_interval_secs",
    )?;
    check_positive(r.blocked_timeout_secs, "restore.blocked_timeout_secs")?;
    check_mapping(&r.queue_mapping, "restore.queue_mapping", false)?;
    check_mapping(&r.vhost_mapping, "restore.vhost_mapping", false)?;
    // Mapping to "" (the default exchange) is allowed.
    check_mapping(&r.exchange_mapping, "restore.exchange_mapping", true)?;
    if r.convert_mirrored_queues.is_some() && !r.restore_definitions {
        return Err(config_err(
            "restore.convert_mirrored_queues needs restore.restore_definitions: true (the mirroring policies and the queues to convert are read from the backup's definitions)",
        ));
    }
    if let Some(p) = &r.checkpoint_state {
        if p.as_os_str().is_empty() {
            return Err(config_err("restore.checkpoint_state must not be empty"));
        }
    }
    Ok(())
}
