//! `backup --dry-run`: the plan of a backup without running it. It asks the management API
//! which queues exist and applies the same selection as a run (`select.rs`, and this shard's
//! share), then prints the queues and streams that would be read with their depth, bytes and an
//! estimate of the stored size, the selected queues that would be skipped and why, and where
//! the backup would be written. It reads no message, opens no AMQP connection, takes no lock,
//! creates no spool directory and does not open the storage (a filesystem path is not even
//! created).

use super::listing::Listing;
use super::select::select_queues;
use crate::broker::management::ManagementClient;
use crate::config::{CompressionKind, Config, StorageConfig};
use crate::error::{Error, Result};
use crate::repository::shard::Shard;
use crate::run::units::{human_bytes, table, thousands};
use serde::Serialize;
use std::fmt::Write as _;

/// Characters of record JSON per body byte: the body is an array of decimal byte values
/// (`[104,105]`), 3.57 characters per byte on average for random bytes (1, 2 or 3 digits and
/// a comma).
const JSON_CHARS_PER_BODY_BYTE: f64 = 3.57;
/// Record JSON around the body (properties, a few headers, exchange, routing key, names),
/// bytes; more with many headers.
const RECORD_OVERHEAD_BYTES: u64 = 400;

/// One queue or stream the backup would read.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedQueue {
    pub vhost: String,
    pub name: String,
    /// The management API's type name (`classic`, `quorum`, `stream`).
    pub queue_type: String,
    /// Messages now (management API `messages`; a stream's count can lag for seconds).
    pub messages: u64,
    /// Body bytes now (management API `message_bytes`), bytes.
    pub message_bytes: u64,
    /// Estimated size of its segments in storage, bytes ([`estimate_stored_bytes`]).
    pub estimated_stored_bytes: u64,
}

/// A selected queue the backup would leave alone.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedPlan {
    pub vhost: String,
    pub name: String,
    pub queue_type: String,
    pub reason: String,
}

/// The plan `backup --dry-run` prints.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    pub backup_id: String,
    /// Where the backup would be written: `<backend URL>/<prefix>/<backup_id>/`.
    pub storage: String,
    /// True when the definitions would be exported (`backup.include_definitions`, shard 0).
    pub definitions: bool,
    /// `zstd`, `lz4` or `none`.
    pub compression: String,
    /// `"<index> of <count>"` for a sharded backup.
    pub shard: Option<String>,
    pub queues: Vec<PlannedQueue>,
    pub skipped: Vec<SkippedPlan>,
    pub total_messages: u64,
    /// Bytes.
    pub total_message_bytes: u64,
    /// Bytes.
    pub estimated_stored_bytes: u64,
}

/// Estimated stored size of `messages` messages with `body_bytes` bytes of bodies, bytes: the
/// record JSON ([`JSON_CHARS_PER_BODY_BYTE`], [`RECORD_OVERHEAD_BYTES`]) divided by the
/// compression ratio. zstd level 3 was measured at a ratio of 2.5 on random bodies and about 7
/// on JSON-like text (ENVIRONMENT.md), so the estimate takes 2.5: an upper bound for text. lz4
/// is taken at 2.0 (not measured); `none` stores the JSON as it is.
pub fn estimate_stored_bytes(messages: u64, body_bytes: u64, compression: CompressionKind) -> u64 {
    let json = body_bytes as f64 * JSON_CHARS_PER_BODY_BYTE
        + messages.saturating_mul(RECORD_OVERHEAD_BYTES) as f64;
    let ratio = match compression {
        CompressionKind::Zstd => 2.5,
        CompressionKind::Lz4 => 2.0,
        CompressionKind::None => 1.0,
    };
    (json / ratio) as u64
}

/// Makes the plan of the backup `cfg` describes.
///
/// Errors: `Configuration error:` (source missing, a bad shard); the management API's
/// (`Management API error: ...`, `Authentication error: ...`); TLS files that cannot be read.
pub fn plan(cfg: &Config) -> Result<DryRun> {
    let source = cfg.require_source()?;
    let opts = &cfg.backup;
    let shard = opts.shard.as_ref().map(Shard::from_config).transpose()?;
    let resolved = crate::broker::tls::resolve(
        &source.amqp_url,
        Some(&source.management_url),
        source.tls.as_ref(),
        "source.tls",
    )?;
    let mgmt = ManagementClient::for_nodes(
        source.management_url.all(),
        &source.management_username,
        source.management_password.expose(),
        resolved.management.as_deref(),
    )?;
    let version = mgmt
        .overview()?
        .broker_version
        .as_deref()
        .and_then(crate::broker::BrokerVersion::parse);
    let (mut chosen, mut skipped) = select_queues(&mgmt, source, opts, version, Listing::Full)?;
    if let Some(s) = &shard {
        chosen.retain(|q| s.owns(&q.vhost, &q.name));
        skipped.retain(|q| s.owns(&q.vhost, &q.name));
    }
    let queues: Vec<PlannedQueue> = chosen
        .into_iter()
        .map(|q| PlannedQueue {
            estimated_stored_bytes: estimate_stored_bytes(
                q.messages,
                q.message_bytes,
                opts.compression,
            ),
            vhost: q.vhost,
            name: q.name,
            queue_type: q.type_name,
            messages: q.messages,
            message_bytes: q.message_bytes,
        })
        .collect();
    Ok(DryRun {
        backup_id: cfg.backup_id.clone(),
        storage: location(&cfg.storage, &cfg.backup_id),
        definitions: opts.include_definitions && shard.is_none_or(|s| s.index == 0),
        compression: format!("{:?}", opts.compression).to_lowercase(),
        shard: shard.map(|s| format!("{} of {}", s.index, s.count)),
        total_messages: queues.iter().map(|q| q.messages).sum(),
        total_message_bytes: queues.iter().map(|q| q.message_bytes).sum(),
        estimated_stored_bytes: queues.iter().map(|q| q.estimated_stored_bytes).sum(),
        queues,
        skipped: skipped
            .into_iter()
            .map(|s| SkippedPlan {
                vhost: s.vhost,
                name: s.name,
                queue_type: s.queue_type,
                reason: s.reason,
            })
            .collect(),
    })
}

/// Where the backup's keys would go, from the configuration alone (nothing is opened).
fn location(storage: &StorageConfig, backup_id: &str) -> String {
    let prefixed = |base: String, prefix: &Option<String>| {
        let p = prefix.as_deref().unwrap_or("").trim_matches('/');
        if p.is_empty() {
            format!("{base}/{backup_id}/")
        } else {
            format!("{base}/{p}/{backup_id}/")
        }
    };
    match storage {
        StorageConfig::Filesystem(f) => format!(
            "file://{}/{backup_id}/",
            f.path.display().to_string().trim_end_matches('/')
        ),
        StorageConfig::Memory => format!("memory://{backup_id}/"),
        StorageConfig::S3(s) => prefixed(format!("s3://{}", s.bucket), &s.prefix),
        StorageConfig::Azure(a) => prefixed(
            format!("azure://{}/{}", a.account_name, a.container_name),
            &a.prefix,
        ),
        StorageConfig::Gcs(g) => prefixed(format!("gcs://{}", g.bucket), &g.prefix),
    }
}

impl DryRun {
    /// The plan for people (`json` false) or as one JSON document.
    ///
    /// Errors: `Serialization error: output: ...` (JSON only; not expected).
    pub fn render(&self, json: bool) -> Result<String> {
        if json {
            let mut s = serde_json::to_string_pretty(self)
                .map_err(|e| Error::Serialization(format!("output: {e}")))?;
            s.push('\n');
            return Ok(s);
        }
        let mut out = format!(
            "Dry run of backup {}: nothing was read or written, no lock was taken.\n",
            self.backup_id
        );
        let _ = writeln!(out, "Storage: {}", self.storage);
        let _ = writeln!(
            out,
            "Definitions: {}; compression: {}{}",
            if self.definitions {
                "exported"
            } else {
                "not exported"
            },
            self.compression,
            self.shard
                .as_ref()
                .map(|s| format!("; shard {s}"))
                .unwrap_or_default()
        );
        let rows: Vec<Vec<String>> = self
            .queues
            .iter()
            .map(|q| {
                vec![
                    q.vhost.clone(),
                    q.name.clone(),
                    q.queue_type.clone(),
                    thousands(q.messages),
                    human_bytes(q.message_bytes),
                    human_bytes(q.estimated_stored_bytes),
                ]
            })
            .collect();
        if rows.is_empty() {
            out.push_str("No queue would be read.\n");
        } else {
            out.push_str(&table(
                &["VHOST", "QUEUE", "TYPE", "MESSAGES", "BYTES", "EST. STORED"],
                &rows,
            ));
        }
        let _ = writeln!(
            out,
            "Would read {} queue(s): {} messages, {} of bodies; about {} stored.",
            self.queues.len(),
            thousands(self.total_messages),
            human_bytes(self.total_message_bytes),
            human_bytes(self.estimated_stored_bytes)
        );
        if !self.skipped.is_empty() {
            let _ = writeln!(
                out,
                "Would skip {} selected queue(s) (the run would exit 4):",
                self.skipped.len()
            );
            for s in &self.skipped {
                let _ = writeln!(
                    out,
                    "  queue {} in vhost {} ({}): {}",
                    s.name, s.vhost, s.queue_type, s.reason
                );
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates() {
        assert_eq!(estimate_stored_bytes(0, 0, CompressionKind::Zstd), 0);
        // 1,000 messages of 1 KiB: 3.57 MiB of body JSON + 400 kB, zstd / 2.5.
        assert_eq!(
            estimate_stored_bytes(1000, 1_024_000, CompressionKind::Zstd),
            1_622_272
        );
        assert_eq!(
            estimate_stored_bytes(1, 100, CompressionKind::None),
            357 + 400
        );
    }

    #[test]
    fn locations() {
        let fs = StorageConfig::Filesystem(crate::config::FilesystemStorage {
            path: "/var/backups/".into(),
        });
        assert_eq!(location(&fs, "b1"), "file:///var/backups/b1/");
        assert_eq!(location(&StorageConfig::Memory, "b1"), "memory://b1/");
    }
}
