//! Broker definitions (topology): the export written by a backup and the import done by a
//! restore (SPEC.md "Definitions file", "restore" options `restore_definitions`,
//! `definitions_dry_run`, `definitions_selection`, storage layout `definitions/`).
//!
//! The file is the management API's `GET /api/definitions` JSON, compressed like the segments
//! (`definitions/definitions.json<ext>`). On import the JSON is filtered by
//! `definitions_selection` and renamed by `vhost_mapping`, `queue_mapping` and
//! `exchange_mapping`, then posted to `POST /api/definitions`; before a full import the target's
//! own definitions are saved to `definitions/rollback-before-import-<epoch ms><ext>`.

use crate::config::{DefinitionsSelection, RestoreOptions};
use crate::encryption::{self, Identities, Recipients};
use crate::error::{Error, Result};
use crate::management::ManagementClient;
use crate::manifest::DefinitionsBackup;
use crate::segment::Compression;
use crate::storage::Storage;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};

/// Exports the source broker's definitions, stores them compressed under
/// `{backup_id}/definitions/definitions.json<ext>` and returns the manifest entry. With
/// `encrypt` (`backup.encryption`) the compressed file is stored encrypted, under
/// `definitions.json<ext>.age` (`crate::encryption`).
///
/// Errors: management API errors, `Serialization error` when the export is not JSON,
/// compression, encryption and storage errors.
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
    let key = crate::manifest::definitions_key(backup_id, &ext);
    let compressed = compress(&raw, compression, level)?;
    match encrypt {
        Some(recipients) => storage.put_bytes(&key, &recipients.encrypt_bytes(&compressed)?)?,
        None => storage.put_bytes(&key, &compressed)?,
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
    })
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
}

/// The definitions JSON of a backup: fetched, decrypted with `keys` when stored encrypted
/// (`entry.encryption`), decompressed.
///
/// Errors: the storage's; `Encryption error:` for an encrypted file without `keys`, with the
/// wrong ones, or damaged; decompression errors.
pub fn read_stored(
    storage: &dyn Storage,
    entry: &DefinitionsBackup,
    keys: Option<&Identities>,
) -> Result<Vec<u8>> {
    let stored = storage.get_bytes(&entry.key)?;
    let compressed = match entry.encryption.as_deref() {
        None => stored,
        Some(encryption::SCHEME) => keys
            .ok_or_else(|| encryption::missing_identity(&entry.key))?
            .decrypt_bytes(&stored, &entry.key)?,
        Some(other) => {
            return Err(Error::Encryption(format!(
                "{} is stored with encryption {other:?}, which this version does not read",
                entry.key
            )))
        }
    };
    decompress(&compressed, Compression::from_key(&entry.key))
}

/// Restores the definitions of a backup into the target broker (or, with
/// `definitions_dry_run`, only checks them). `keys` decrypt an encrypted backup's file; the
/// target's own definitions (password hashes) saved before the import are encrypted to
/// `rollback_to` when given: the restorer's own identity (`Identities::recipients`), never the
/// recipients `manifest.json` lists, which nothing authenticates.
///
/// Errors: a selected vhost, queue or exchange absent from the backup fails before anything is
/// imported (`Configuration error`); storage, decryption, decompression and management API
/// errors (`HTTP 500` when the broker refuses the definitions).
pub fn import(
    mgmt: &ManagementClient,
    storage: &dyn Storage,
    backup_id: &str,
    entry: &DefinitionsBackup,
    opts: &RestoreOptions,
    keys: Option<&Identities>,
    rollback_to: Option<&Recipients>,
) -> Result<ImportSummary> {
    let raw = read_stored(storage, entry, keys)?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|e| {
        Error::Serialization(format!("definitions file {} is not JSON: {e}", entry.key))
    })?;
    let doc = select(doc, &opts.definitions_selection)?;
    let doc = rename(doc, opts);
    let mut summary = summarize(&doc);
    if opts.definitions_dry_run {
        log::info!("definitions dry run: {summary:?}; nothing imported");
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
    let rollback_key = crate::manifest::rollback_definitions_key(backup_id, crate::now_ms(), &ext);
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

fn summarize(doc: &Value) -> ImportSummary {
    let count = |k: &str| doc.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    ImportSummary {
        vhosts: count("vhosts"),
        queues: count("queues"),
        exchanges: count("exchanges"),
        bindings: count("bindings"),
        users: count("users"),
        rollback_key: None,
    }
}

fn str_field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn array_mut<'a>(doc: &'a mut Value, k: &str) -> Option<&'a mut Vec<Value>> {
    doc.get_mut(k).and_then(Value::as_array_mut)
}

/// Applies `definitions_selection` (SPEC.md "definitions_selection fields"). An empty selection
/// keeps everything.
pub fn select(mut doc: Value, sel: &DefinitionsSelection) -> Result<Value> {
    if sel.vhosts.is_empty() && sel.queues.is_empty() && sel.exchanges.is_empty() {
        return Ok(doc);
    }
    let names = |doc: &Value, k: &str, field: &str| -> BTreeSet<String> {
        doc.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| str_field(v, field).to_string()).collect())
            .unwrap_or_default()
    };
    let have_vhosts = names(&doc, "vhosts", "name");
    let have_queues = names(&doc, "queues", "name");
    let have_exchanges = names(&doc, "exchanges", "name");
    for (kind, wanted, have) in [
        ("vhost", &sel.vhosts, &have_vhosts),
        ("queue", &sel.queues, &have_queues),
        ("exchange", &sel.exchanges, &have_exchanges),
    ] {
        if let Some(missing) = wanted.iter().find(|w| !have.contains(*w)) {
            return Err(Error::Config(format!(
                "restore.definitions_selection names {kind} {missing}, which is not in the backup definitions; nothing was imported"
            )));
        }
    }
    let in_vhost =
        |v: &Value| sel.vhosts.is_empty() || sel.vhosts.iter().any(|h| h == str_field(v, "vhost"));
    let entity_mode = !sel.queues.is_empty() || !sel.exchanges.is_empty();

    let queues: BTreeSet<&str> = sel.queues.iter().map(String::as_str).collect();
    let mut exchanges: BTreeSet<String> = sel.exchanges.iter().cloned().collect();
    let bindings = doc
        .get("bindings")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut kept_bindings = Vec::new();
    for b in bindings {
        if !in_vhost(&b) {
            continue;
        }
        let to_queue = str_field(&b, "destination_type") == "queue";
        let dest = str_field(&b, "destination");
        let source = str_field(&b, "source");
        let keep = if !entity_mode {
            true
        } else if to_queue && queues.contains(dest) {
            // Bindings routing to a selected queue are kept with their source exchange.
            exchanges.insert(source.to_string());
            true
        } else {
            sel.exchanges.iter().any(|e| e == source)
                && (if to_queue {
                    queues.contains(dest)
                } else {
                    sel.exchanges.iter().any(|e| e == dest)
                })
        };
        if keep {
            kept_bindings.push(b);
        }
    }
    if let Some(b) = array_mut(&mut doc, "bindings") {
        *b = kept_bindings;
    }
    if let Some(q) = array_mut(&mut doc, "queues") {
        q.retain(|q| in_vhost(q) && (!entity_mode || queues.contains(str_field(q, "name"))));
    }
    if let Some(x) = array_mut(&mut doc, "exchanges") {
        x.retain(|x| in_vhost(x) && (!entity_mode || exchanges.contains(str_field(x, "name"))));
    }
    // Vhosts: the selected ones, or (queues/exchanges only) those holding what is kept.
    let vhost_names: BTreeSet<String> = if entity_mode {
        ["queues", "exchanges", "bindings"]
            .iter()
            .filter_map(|k| doc.get(*k).and_then(Value::as_array))
            .flatten()
            .map(|v| str_field(v, "vhost").to_string())
            .collect()
    } else {
        sel.vhosts.iter().cloned().collect()
    };
    if let Some(v) = array_mut(&mut doc, "vhosts") {
        v.retain(|v| vhost_names.contains(str_field(v, "name")));
    }
    for k in ["permissions", "topic_permissions", "policies", "parameters"] {
        if let Some(a) = array_mut(&mut doc, k) {
            a.retain(|v| !entity_mode && in_vhost(v));
        }
    }
    // Users: only those the kept permissions name (vhost selection), so that the import can
    // grant them; global parameters belong to the whole cluster and are left out.
    let users: BTreeSet<String> = doc
        .get("permissions")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|p| str_field(p, "user").to_string()).collect())
        .unwrap_or_default();
    if let Some(a) = array_mut(&mut doc, "users") {
        a.retain(|u| users.contains(str_field(u, "name")));
    }
    if let Some(a) = array_mut(&mut doc, "global_parameters") {
        a.clear();
    }
    Ok(doc)
}

/// Applies `vhost_mapping`, `queue_mapping` and `exchange_mapping` to the definitions.
pub fn rename(mut doc: Value, opts: &RestoreOptions) -> Value {
    fn map_field(v: &mut Value, field: &str, mapping: &BTreeMap<String, String>) {
        if let Some(Value::String(s)) = v.get_mut(field) {
            if let Some(to) = mapping.get(s.as_str()) {
                *s = to.clone();
            }
        }
    }
    if let Some(a) = array_mut(&mut doc, "vhosts") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.vhost_mapping));
    }
    for k in [
        "queues",
        "exchanges",
        "bindings",
        "permissions",
        "topic_permissions",
        "policies",
        "parameters",
    ] {
        if let Some(a) = array_mut(&mut doc, k) {
            a.iter_mut()
                .for_each(|v| map_field(v, "vhost", &opts.vhost_mapping));
        }
    }
    if let Some(a) = array_mut(&mut doc, "queues") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.queue_mapping));
    }
    if let Some(a) = array_mut(&mut doc, "exchanges") {
        a.iter_mut()
            .for_each(|v| map_field(v, "name", &opts.exchange_mapping));
    }
    if let Some(a) = array_mut(&mut doc, "bindings") {
        for b in a.iter_mut() {
            map_field(b, "source", &opts.exchange_mapping);
            let mapping = if str_field(b, "destination_type") == "queue" {
                &opts.queue_mapping
            } else {
                &opts.exchange_mapping
            };
            map_field(b, "destination", mapping);
        }
    }
    doc
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
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "rabbit_version": "3.10.8",
            "rabbitmq_version": "3.10.8",
            "users": [{"name": "guest"}],
            "vhosts": [{"name": "a"}, {"name": "b"}],
            "permissions": [{"user": "guest", "vhost": "a"}, {"user": "guest", "vhost": "b"}],
            "policies": [{"name": "p", "vhost": "b"}],
            "parameters": [],
            "global_parameters": [{"name": "cluster_name"}],
            "queues": [
                {"name": "q1", "vhost": "a"}, {"name": "q2", "vhost": "a"}, {"name": "q3", "vhost": "b"}
            ],
            "exchanges": [
                {"name": "x1", "vhost": "a"}, {"name": "x2", "vhost": "a"}, {"name": "x3", "vhost": "b"}
            ],
            "bindings": [
                {"source": "x1", "vhost": "a", "destination": "q1", "destination_type": "queue", "routing_key": "k"},
                {"source": "x2", "vhost": "a", "destination": "q2", "destination_type": "queue", "routing_key": "k"},
                {"source": "x1", "vhost": "a", "destination": "x2", "destination_type": "exchange", "routing_key": "k"},
                {"source": "x3", "vhost": "b", "destination": "q3", "destination_type": "queue", "routing_key": "k"}
            ]
        })
    }

    fn names(doc: &Value, k: &str) -> Vec<String> {
        doc[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| str_field(v, "name").to_string())
            .collect()
    }

    #[test]
    fn empty_selection_keeps_everything() {
        let doc = select(sample(), &DefinitionsSelection::default()).unwrap();
        assert_eq!(doc, sample());
    }

    #[test]
    fn vhost_selection_keeps_that_vhost_only() {
        let sel = DefinitionsSelection {
            vhosts: vec!["b".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "vhosts"), vec!["b"]);
        assert_eq!(names(&doc, "queues"), vec!["q3"]);
        assert_eq!(names(&doc, "exchanges"), vec!["x3"]);
        assert_eq!(doc["bindings"].as_array().unwrap().len(), 1);
        assert_eq!(doc["policies"].as_array().unwrap().len(), 1);
        assert_eq!(doc["permissions"].as_array().unwrap().len(), 1);
        assert_eq!(
            names(&doc, "users"),
            vec!["guest"],
            "the user the permissions name"
        );
        assert!(doc["global_parameters"].as_array().unwrap().is_empty());
    }

    #[test]
    fn queue_selection_keeps_source_exchanges_and_bindings() {
        let sel = DefinitionsSelection {
            queues: vec!["q1".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "queues"), vec!["q1"]);
        assert_eq!(names(&doc, "exchanges"), vec!["x1"]);
        assert_eq!(
            names(&doc, "vhosts"),
            vec!["a"],
            "only the vhost holding q1"
        );
        let b = doc["bindings"].as_array().unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(str_field(&b[0], "destination"), "q1");
        assert!(doc["policies"].as_array().unwrap().is_empty());
    }

    #[test]
    fn exchange_selection_keeps_bindings_between_selected() {
        let sel = DefinitionsSelection {
            exchanges: vec!["x1".into(), "x2".into()],
            ..Default::default()
        };
        let doc = select(sample(), &sel).unwrap();
        assert_eq!(names(&doc, "exchanges"), vec!["x1", "x2"]);
        assert!(names(&doc, "queues").is_empty());
        let b = doc["bindings"].as_array().unwrap();
        assert_eq!(b.len(), 1, "only x1 -> x2: the queues are not selected");
        assert_eq!(str_field(&b[0], "destination"), "x2");
    }

    #[test]
    fn missing_selection_fails_before_import() {
        let sel = DefinitionsSelection {
            queues: vec!["nope".into()],
            ..Default::default()
        };
        let err = select(sample(), &sel).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Configuration error: restore.definitions_selection names queue nope, which is not in the backup definitions; nothing was imported"
        );
    }

    #[test]
    fn renames_vhosts_queues_exchanges() {
        let mut opts = RestoreOptions::default();
        opts.vhost_mapping.insert("a".into(), "a2".into());
        opts.queue_mapping.insert("q1".into(), "q1-new".into());
        opts.exchange_mapping.insert("x2".into(), "x2-new".into());
        let doc = rename(sample(), &opts);
        assert_eq!(names(&doc, "vhosts"), vec!["a2", "b"]);
        assert_eq!(names(&doc, "queues"), vec!["q1-new", "q2", "q3"]);
        assert_eq!(str_field(&doc["queues"][0], "vhost"), "a2");
        assert_eq!(names(&doc, "exchanges"), vec!["x1", "x2-new", "x3"]);
        let b = &doc["bindings"];
        assert_eq!(str_field(&b[0], "destination"), "q1-new");
        assert_eq!(str_field(&b[1], "source"), "x2-new");
        assert_eq!(str_field(&b[2], "destination"), "x2-new");
        assert_eq!(str_field(&b[3], "vhost"), "b");
    }

    #[test]
    fn compression_round_trips() {
        let data = serde_json::to_vec(&sample()).unwrap();
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
        let data = serde_json::to_vec(&sample()).unwrap();
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
