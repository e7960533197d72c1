//! Broker definitions (topology): the export written by a backup and the import done by a
//! restore (SPEC.md "Definitions file", "restore" options `restore_definitions`,
//! `definitions_dry_run`, `definitions_selection`, storage layout `definitions/`).
//!
//! The file is the management API's `GET /api/definitions` JSON, compressed like the segments
//! (`definitions/definitions.json<ext>`). On import the JSON is filtered by
//! `definitions_selection` and renamed by `vhost_mapping`, `queue_mapping` and
//! `exchange_mapping`, then posted to `POST /api/definitions`; before a full import the target's
//! own definitions are saved to `definitions/rollback-before-import-<epoch ms><ext>`. Into
//! RabbitMQ 4.x, what 4.x refuses is taken out first and, with
//! `restore.convert_mirrored_queues`, mirrored classic queues become quorum queues (`migrate`,
//! docs/migration.md "From RabbitMQ 3.x to 4.x").
//!
//! - this file: export, reading a stored file, import, compression;
//! - `select`: `definitions_selection` and the name mappings;
//! - `migrate`: a 3.x export made importable by 4.x; `policy`: which policy applied to a queue;
//! - `deprecated`: what a target that denies deprecated features would leave out (transient
//!   queues, declared durable).

pub mod deprecated;
mod migrate;
mod policy;
mod select;

pub use migrate::{
    Change, PolicyKind, MIRRORING_KEYS, QUORUM_REFUSED_ARGUMENTS, REMOVED_POLICY_KEYS,
};
pub use select::{rename, select};

use crate::broker::management::ManagementClient;
use crate::broker::BrokerVersion;
use crate::config::{ConvertMirroredQueues, RestoreOptions};
use crate::error::{Error, Result};
use crate::repository::encryption::{self, Identities, Recipients};
use crate::repository::manifest::DefinitionsBackup;
use crate::repository::segment::Compression;
use crate::repository::storage::{Conditional, Storage};
use serde_json::Value;
use std::io::{Read, Write};

/// Exports the source broker's definitions, stores them compressed under
/// `{backup_id}/definitions/definitions.json<ext>` and returns the manifest entry. With
/// `encrypt` (`backup.encryption`) the compressed file is stored encrypted, under
/// `definitions.json<ext>.age` (`crate::repository::encryption`).
///
/// The file is created, or replaces the version this run found (an interrupted run's), with a
/// conditional write (docs/storage-backends.md): never another run's newer export.
///
/// Errors: management API errors, `Serialization error` when the export is not JSON,
/// compression, encryption and storage errors; `Storage error: {key} was written by another run
/// of backup {id} meanwhile: ...` when the conditional write is refused.
pub fn export(
    mgmt: &ManagementClient,
    storage: &dyn Storage,
    backup_id: &str,
    compression: Compression,
    level: i32,
    encrypt: Option<&Recipients>,
) -> Result<DefinitionsBackup> {
    let raw = mgmt.export_definitions()?;
    let doc: Value = serde_json::from_slice(&raw)
        .map_err(|e| Error::Serialization(format!("definitions export is not JSON: {e}")))?;
    let count = |k: &str| doc.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    let ext = match encrypt {
        Some(_) => format!("{}{}", compression.extension(), encryption::EXTENSION),
        None => compression.extension().to_string(),
    };
    let key = crate::repository::manifest::definitions_key(backup_id, &ext);
    let compressed = compress(&raw, compression, level)?;
    let data = match encrypt {
        Some(recipients) => recipients.encrypt_bytes(&compressed)?,
        None => compressed,
    };
    // Written only over what this run found there: a run whose write hung until another run
    // had taken the backup over and completed it (with its own export, which its manifest's
    // size describes) is refused, never replaces that export.
    let written = match storage.get_with_version(&key)? {
        None => storage.put_bytes_new(&key, &data)?,
        Some((_, version)) => storage.put_bytes_if(&key, &data, &version)?,
    };
    if written == Conditional::Refused {
        return Err(Error::Storage(format!(
            "{key} was written by another run of backup {backup_id} meanwhile: this run does not replace it (the other run owns the backup)"
        )));
    }
    log::info!(
        "definitions: {} vhosts, {} queues, {} exchanges, {} bindings stored in {key}",
        count("vhosts"),
        count("queues"),
        count("exchanges"),
        count("bindings")
    );
    Ok(DefinitionsBackup {
        key,
        vhost_count: count("vhosts"),
        queue_count: count("queues"),
        exchange_count: count("exchanges"),
        user_count: count("users"),
        size_bytes: raw.len() as u64,
        encryption: encrypt.map(|_| encryption::SCHEME.to_string()),
        checksum: Some(sha256_hex(&data)),
    })
}

/// The lowercase hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    crate::repository::segment::hex_lower(&sha2::Sha256::digest(data))
}

/// Checks the stored bytes of the definitions export against the manifest's `checksum`
/// (nothing to check in a backup made before it was recorded).
///
/// Errors: `Serialization error: {key}: SHA-256 mismatch: expected {manifest}, got {stored}:
/// the definitions export was altered or replaced`.
pub fn check_stored(entry: &DefinitionsBackup, stored: &[u8]) -> Result<()> {
    let Some(expected) = &entry.checksum else {
        return Ok(());
    };
    let got = sha256_hex(stored);
    if &got != expected {
        return Err(Error::Serialization(format!(
            "{}: SHA-256 mismatch: expected {expected}, got {got}: the definitions export was altered or replaced",
            entry.key
        )));
    }
    Ok(())
}

/// What an import did or, in a dry run, would do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub vhosts: usize,
    pub queues: usize,
    pub exchanges: usize,
    pub bindings: usize,
    pub users: usize,
    /// Key of the rollback snapshot written before the import, if any.
    pub rollback_key: Option<String>,
    /// The target's version, when known (`GET /api/overview`).
    pub target_version: Option<BrokerVersion>,
    /// What was changed to make the definitions importable by a RabbitMQ 4.x target, and the
    /// queues converted (`migrate`), in the order logged; empty for a 3.x target.
    pub changes: Vec<Change>,
    /// Queues declared as quorum queues by `restore.convert_mirrored_queues`: (vhost, queue)
    /// as named in the backup.
    pub converted: Vec<(String, String)>,
}

/// The definitions JSON of a backup: fetched, then [`decode_stored`].
///
/// Errors: the storage's; those of [`decode_stored`].
pub fn read_stored(
    storage: &dyn Storage,
    entry: &DefinitionsBackup,
    keys: Option<&Identities>,
) -> Result<Vec<u8>> {
    decode_stored(entry, &storage.get_bytes(&entry.key)?, keys)
}

/// The definitions JSON of the stored export `stored`: checked against the manifest's SHA-256
/// when it records one ([`check_stored`]), decrypted with `keys` when stored encrypted
/// (`entry.encryption`), decompressed. The bytes checked are the bytes decoded.
///
/// Errors: those of [`check_stored`]; `Encryption error:` for an encrypted file without
/// `keys`, with the wrong ones, or damaged; decompression errors.
pub fn decode_stored(
    entry: &DefinitionsBackup,
    stored: &[u8],
    keys: Option<&Identities>,
) -> Result<Vec<u8>> {
    check_stored(entry, stored)?;
    let decrypted;
    let compressed = match entry.encryption.as_deref() {
        None => stored,
        Some(encryption::SCHEME) => {
            decrypted = keys
                .ok_or_else(|| encryption::missing_identity(&entry.key))?
                .decrypt_bytes(stored, &entry.key)?;
            &decrypted[..]
        }
        Some(other) => {
            return Err(Error::Encryption(format!(
                "{} is stored with encryption {other:?}, which this version does not read",
                entry.key
            )))
        }
    };
    decompress(compressed, Compression::from_key(&entry.key))
}

/// Restores the definitions of a backup into the target broker (or, with
/// `definitions_dry_run`, only checks them). `target` is the target's version
/// (`rabbitmq_version` of `GET /api/overview`): into 4.x the definitions are migrated first
/// ([`prepare`]), each change logged as a warning before anything is written; `None` (unknown)
/// imports them as they are. `keys` decrypt an encrypted backup's file; the target's own
/// definitions (password hashes) saved before the import are encrypted to `rollback_to` when
/// given: the restorer's own identity (`Identities::recipients`), never the recipients
/// `manifest.json` lists, which nothing authenticates.
///
/// Errors: a selected vhost, queue or exchange absent from the backup fails before anything is
/// imported (`Configuration error`); storage, decryption, decompression and management API
/// errors (`HTTP 400` or `HTTP 500` when the broker refuses the definitions).
#[allow(clippy::too_many_arguments)]
pub fn import(
    mgmt: &ManagementClient,
    storage: &dyn Storage,
    backup_id: &str,
    entry: &DefinitionsBackup,
    opts: &RestoreOptions,
    target: Option<BrokerVersion>,
    keys: Option<&Identities>,
    rollback_to: Option<&Recipients>,
) -> Result<ImportSummary> {
    let raw = read_stored(storage, entry, keys)?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|e| {
        Error::Serialization(format!("definitions file {} is not JSON: {e}", entry.key))
    })?;
    // Which deprecated features the target denies (4.x: a denied transient queue would be left
    // out of the import without a word).
    let denied = match target {
        Some(v) if migrate::needed(v) => mgmt.denied_deprecated_features()?,
        _ => Vec::new(),
    };
    let (doc, changes) = prepare(doc, opts, target, &denied)?;
    let mut summary = summarize(&doc);
    summary.target_version = target;
    match target {
        Some(v) if migrate::needed(v) || !changes.is_empty() => {
            for c in &changes {
                log::warn!("definitions for RabbitMQ {v}: {c}");
            }
        }
        Some(v) if opts.convert_mirrored_queues.is_some() => log::warn!(
            "restore.convert_mirrored_queues: the target runs RabbitMQ {v}, which still mirrors classic queues; the queues keep their type"
        ),
        Some(_) => {}
        None => log::warn!(
            "the target's RabbitMQ version is unknown: the definitions are imported as they are (into RabbitMQ 4.x a 3.x backup's mirroring policies fail the import)"
        ),
    }
    summary.converted = changes
        .iter()
        .filter_map(|c| match c {
            Change::Converted { vhost, queue, .. } => Some((vhost.clone(), queue.clone())),
            _ => None,
        })
        .collect();
    summary.changes = changes;
    if opts.definitions_dry_run {
        log::info!(
            "definitions dry run: {} vhosts, {} queues, {} exchanges, {} bindings, {} users, {} change(s) for the target; nothing imported",
            summary.vhosts,
            summary.queues,
            summary.exchanges,
            summary.bindings,
            summary.users,
            summary.changes.len()
        );
        return Ok(summary);
    }
    let compression = Compression::from_key(&entry.key);
    let snapshot = mgmt.export_definitions()?;
    let mut ext = compression.extension().to_string();
    let mut stored = compress(&snapshot, compression, 3)?;
    if let Some(recipients) = rollback_to {
        ext.push_str(encryption::EXTENSION);
        stored = recipients.encrypt_bytes(&stored)?;
    }
    let rollback_key =
        crate::repository::manifest::rollback_definitions_key(backup_id, crate::now_ms(), &ext);
    storage.put_bytes(&rollback_key, &stored)?;
    log::info!("target definitions saved to {rollback_key} before the import");
    let body =
        serde_json::to_vec(&doc).map_err(|e| Error::Serialization(format!("definitions: {e}")))?;
    mgmt.import_definitions(&body)?;
    summary.rollback_key = Some(rollback_key);
    log::info!(
        "definitions imported: {} vhosts, {} queues, {} exchanges, {} bindings",
        summary.vhosts,
        summary.queues,
        summary.exchanges,
        summary.bindings
    );
    Ok(summary)
}

/// The definitions a restore posts: `doc` (the backup's) selected by `definitions_selection`,
/// migrated for a RabbitMQ 4.x `target` (mirrored queues, with `convert_mirrored_queues`,
/// decided on the whole export: a selection of queues keeps no policy), then renamed by the
/// mappings. Returns the changes the migration made (names as in the backup), in order.
///
/// `denied`: the deprecated features the target denies
/// (`ManagementClient::denied_deprecated_features`; [`deprecated`]).
///
/// Errors: those of [`select`].
pub fn prepare(
    doc: Value,
    opts: &RestoreOptions,
    target: Option<BrokerVersion>,
    denied: &[String],
) -> Result<(Value, Vec<Change>)> {
    let migrating = target.is_some_and(migrate::needed);
    let mirrored = match opts.convert_mirrored_queues {
        Some(ConvertMirroredQueues::Quorum) if migrating => Some(migrate::mirrored_queues(&doc)),
        _ => None,
    };
    let mut doc = select(doc, &opts.definitions_selection)?;
    let mut changes = Vec::new();
    if migrating {
        if let Some((_, unreadable)) = &mirrored {
            changes.extend(unreadable.iter().cloned());
        }
        changes.extend(migrate::for_4x(
            &mut doc,
            mirrored.as_ref().map(|(queues, _)| queues),
        ));
    }
    if denied
        .iter()
        .any(|f| f == deprecated::TRANSIENT_NONEXCL_QUEUES)
    {
        changes.extend(deprecated::make_durable(&mut doc));
    }
    Ok((rename(doc, opts), changes))
}

fn summarize(doc: &Value) -> ImportSummary {
    let count = |k: &str| doc.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    ImportSummary {
        vhosts: count("vhosts"),
        queues: count("queues"),
        exchanges: count("exchanges"),
        bindings: count("bindings"),
        users: count("users"),
        ..Default::default()
    }
}

/// Compresses a whole buffer (definitions files; segments stream through `segment`).
pub fn compress(data: &[u8], compression: Compression, level: i32) -> Result<Vec<u8>> {
    let err = |e: std::io::Error| Error::Compression(format!("definitions: {e}"));
    match compression {
        Compression::None => Ok(data.to_vec()),
        Compression::Zstd => zstd::encode_all(data, level).map_err(err),
        Compression::Lz4 => {
            let mut enc = lz4::EncoderBuilder::new().build(Vec::new()).map_err(err)?;
            enc.write_all(data).map_err(err)?;
            let (out, result) = enc.finish();
            result.map_err(err)?;
            Ok(out)
        }
    }
}

/// The largest definitions file a restore decompresses: 128 MiB, six times the largest
/// request body the management API accepts by default (`management.http.max_body_size`,
/// 20,000,000 bytes in RabbitMQ 3.10), so that a few KiB of zstd cannot make a restore inflate
/// gigabytes.
pub const DEFINITIONS_MAX_BYTES: u64 = 128 << 20;

/// Decompresses a whole buffer written by [`compress`], at most [`DEFINITIONS_MAX_BYTES`].
///
/// Errors: `Compression error: definitions: ...` for a damaged buffer or one that inflates past
/// the limit.
pub fn decompress(data: &[u8], compression: Compression) -> Result<Vec<u8>> {
    decompress_at_most(data, compression, DEFINITIONS_MAX_BYTES)
}

/// [`decompress`] with another limit, in bytes of output (the fuzz target's is smaller).
pub fn decompress_at_most(data: &[u8], compression: Compression, max: u64) -> Result<Vec<u8>> {
    let err = |e: std::io::Error| Error::Compression(format!("definitions: {e}"));
    let mut out = Vec::new();
    let read = match compression {
        Compression::None => (&mut &data[..]).take(max + 1).read_to_end(&mut out),
        Compression::Zstd => zstd::stream::read::Decoder::new(data)
            .map_err(err)?
            .take(max + 1)
            .read_to_end(&mut out),
        Compression::Lz4 => {
            let mut dec = lz4::Decoder::new(data).map_err(err)?;
            let read = dec.by_ref().take(max + 1).read_to_end(&mut out);
            // A frame cut short reads as a clean end; only `finish` tells.
            match (read, dec.finish().1) {
                (Ok(n), Ok(())) => Ok(n),
                (Err(e), _) | (Ok(_), Err(e)) if out.len() as u64 <= max => Err(e),
                (read, _) => read,
            }
        }
    };
    read.map_err(err)?;
    if out.len() as u64 > max {
        return Err(Error::Compression(format!(
            "definitions: more than {max} bytes once decompressed; refused"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "rabbit_version": "3.10.8",
            "vhosts": [{"name": "a"}, {"name": "b"}],
            "queues": [{"name": "q1", "vhost": "a"}, {"name": "q2", "vhost": "a"}],
        }))
        .unwrap()
    }

    #[test]
    fn compression_round_trips() {
        let data = sample();
        for c in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let packed = compress(&data, c, 3).unwrap();
            assert_eq!(decompress(&packed, c).unwrap(), data, "{c:?}");
        }
        assert!(matches!(
            decompress(b"garbage", Compression::Zstd),
            Err(Error::Compression(_))
        ));
    }

    #[test]
    fn truncated_and_oversized_definitions_are_refused() {
        let data = sample();
        for c in [Compression::Zstd, Compression::Lz4] {
            let packed = compress(&data, c, 3).unwrap();
            let cut = &packed[..packed.len() - 3];
            assert!(
                matches!(decompress(cut, c), Err(Error::Compression(_))),
                "{c:?}: a cut buffer"
            );
        }
        // A bomb: 1 MiB of zeros packs into a few hundred bytes.
        let zeros = vec![0u8; 1 << 20];
        for c in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let packed = compress(&zeros, c, 19).unwrap();
            assert_eq!(
                decompress_at_most(&packed, c, 1 << 20).unwrap().len(),
                1 << 20,
                "{c:?}: at the limit"
            );
            assert_eq!(
                decompress_at_most(&packed, c, (1 << 20) - 1).unwrap_err(),
                Error::Compression(format!(
                    "definitions: more than {} bytes once decompressed; refused",
                    (1 << 20) - 1
                )),
                "{c:?}: past the limit"
            );
        }
    }
}
