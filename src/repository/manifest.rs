//! The backup manifest (SPEC.md "Manifest", `{backup_id}/manifest.json`) and the storage keys of
//! a backup (SPEC.md "Storage layout"; DESIGN.md decisions 4 and 6).
//!
//! Keys are relative to the storage prefix (the storage layer prepends `storage.prefix`). Vhost
//! and queue names are escaped by [`escape_component`] so that no name can leave the backup's
//! prefix or make two queues share a key; the manifest records every key, so a restore never
//! parses paths.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::broker::QueueType;
use crate::error::{Error, Result};
use crate::repository::segment::FinishedSegment;

mod parts;
pub use parts::{merge_parts, parts_prefix, Shard};

/// The manifest, written as the last step of a backup (SPEC.md "Manifest"). Field order is the
/// JSON key order; nullable fields are written as `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Equals the configured backup_id.
    pub backup_id: String,
    /// When the backup started, epoch ms.
    pub created_at: i64,
    /// When it completed, epoch ms; `None` when the backup was interrupted.
    pub completed_at: Option<i64>,
    /// Cluster name from the management API overview.
    pub source_cluster: Option<String>,
    /// Broker version from the management API. Read also from `rabbitmq_version` (DESIGN.md
    /// decision 4).
    #[serde(alias = "rabbitmq_version")]
    pub broker_version: Option<String>,
    /// Version of the tool that created the backup.
    pub backup_tool_version: String,
    /// The definitions export, when one was taken.
    pub definitions: Option<DefinitionsBackup>,
    /// One entry per backed-up queue.
    pub queues: Vec<QueueBackup>,
    /// Sum of all queues' message counts.
    pub total_messages: u64,
    /// Sum of compressed segment sizes, bytes.
    pub total_bytes: u64,
    /// Number of segment files.
    pub total_segments: u64,
    /// In a part of a sharded backup (`{backup_id}/parts/...`, [`merge_parts`]): which part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// In a sharded backup's merged manifest: how many parts it was written in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
    /// An encrypted backup's scheme and recipients' public keys (README "Encryption at
    /// rest"); absent in an unencrypted backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<crate::repository::encryption::EncryptionInfo>,
}

/// The definitions file of a backup (SPEC.md "Manifest", DefinitionsBackup).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefinitionsBackup {
    /// Storage key of the compressed definitions file.
    pub key: String,
    /// Vhosts in the definitions.
    pub vhost_count: usize,
    /// Queues in the definitions.
    pub queue_count: usize,
    /// Exchanges in the definitions.
    pub exchange_count: usize,
    /// Users in the definitions.
    pub user_count: usize,
    /// Uncompressed size of the definitions JSON, bytes.
    pub size_bytes: u64,
    /// How the file is stored when not as SPEC.md says: `age` (`crate::repository::encryption::SCHEME`)
    /// for an age file whose plaintext is the compressed definitions. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// SHA-256 (lowercase hex) of the file as stored: the compressed export, or the age file
    /// when `encryption` is set (issue 38: every reader checks it before using the export).
    /// Absent in backups made before it was recorded, which are read unchecked as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// One backed-up queue (SPEC.md "Manifest", QueueBackup).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueBackup {
    /// Virtual host.
    pub vhost: String,
    /// Queue name.
    pub name: String,
    /// `classic`, `quorum` or `stream`.
    pub queue_type: QueueType,
    /// The queue's segments in sequence order.
    pub segments: Vec<SegmentMetadata>,
    /// Messages backed up from this queue.
    pub message_count: u64,
    /// backed_up_at (epoch ms) of the first message.
    pub first_message_timestamp: Option<i64>,
    /// backed_up_at (epoch ms) of the last message.
    pub last_message_timestamp: Option<i64>,
    /// Messages the queue held unacknowledged by consumers when its read started (classic and
    /// quorum queues; absent in backups made before rmq-backup recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_unacknowledged_at_start: Option<u64>,
    /// Of those, the messages this backup does not hold: unacknowledged by a live consumer of
    /// another application (`crate::backup` exits 4). Absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_left_out: Option<u64>,
    /// Quorum queues: the messages whose `x-delivery-count` this backup raised by one (each
    /// message read where every return counts, RabbitMQ 3.x and 4.0-4.2; on 4.3 and later
    /// the messages a lost connection gave back). Absent when none (docs/reading-queues.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_counts_raised: Option<u64>,
    /// Streams: consumer reference → the offset it had stored when the stream's read started
    /// (`backup.stream_offset_references`; references with no stored offset are absent).
    /// Absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumer_offsets: BTreeMap<String, u64>,
}

/// One segment file (SPEC.md "Manifest", SegmentMetadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMetadata {
    /// Storage key of the segment file.
    pub key: String,
    /// Sequence number within the queue, from 1.
    pub sequence: u64,
    /// Records in the segment.
    pub record_count: u64,
    /// Whole file size (header + compressed payload + footer), bytes.
    pub size_bytes: u64,
    /// Payload size before compression, bytes.
    pub uncompressed_bytes: u64,
    /// backed_up_at (epoch ms) of the first record.
    pub first_timestamp: Option<i64>,
    /// backed_up_at (epoch ms) of the last record.
    pub last_timestamp: Option<i64>,
    /// Lowercase SHA-256 hex (64 characters) of the whole segment file as stored (of the
    /// age file when the segment is encrypted).
    pub checksum: String,
    /// How the segment is stored when not as SPEC.md says: `age`
    /// (`crate::repository::encryption::SCHEME`) for an age file whose plaintext is the RBAK file; then
    /// `size_bytes` and `checksum` are the age file's. Absent for a plain RBAK file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    /// The public keys (`age1...`) an encrypted segment was encrypted to, in the order
    /// configured (docs/encryption.md "Encryption at rest"): a reader checks its identity against the
    /// segments it reads, not against the backup's list alone, which a rerun or the parts of a
    /// sharded backup may have written with other keys. Absent for a plain segment, and in
    /// segments written before rmq-backup recorded it (then only the manifest's
    /// `encryption.recipients` says who may read them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<Vec<String>>,
    /// The segment's format version (docs/segment-format.md) when it is not 1, as its header
    /// says: `describe` shows it and a rerun compares it with `backup.segment_version`
    /// without fetching the segment. Absent for version 1, so a version 1 backup's manifest
    /// is what SPEC.md shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_version: Option<u8>,
}

impl SegmentMetadata {
    /// The segment's format version: `segment_version`, 1 when absent.
    pub fn version(&self) -> u8 {
        self.segment_version
            .unwrap_or(crate::repository::segment::VERSION)
    }
}

#[cfg(test)]
impl SegmentMetadata {
    /// A segment for tests of what is derived from metadata alone: `key`, `sequence` and
    /// `record_count` as given, 1 byte stored and uncompressed, no timestamps, checksum or
    /// encryption.
    pub(crate) fn example(key: String, sequence: u64, record_count: u64) -> SegmentMetadata {
        SegmentMetadata {
            key,
            sequence,
            record_count,
            size_bytes: 1,
            uncompressed_bytes: 1,
            first_timestamp: None,
            last_timestamp: None,
            checksum: String::new(),
            encryption: None,
            recipients: None,
            segment_version: None,
        }
    }
}

impl QueueBackup {
    /// The entry of a queue whose `segments` (in sequence order) are stored: message count and
    /// first/last timestamps follow from them.
    pub fn from_segments(
        vhost: &str,
        name: &str,
        queue_type: QueueType,
        segments: Vec<SegmentMetadata>,
    ) -> QueueBackup {
        QueueBackup {
            vhost: vhost.to_string(),
            name: name.to_string(),
            queue_type,
            message_count: segments.iter().map(|s| s.record_count).sum(),
            first_message_timestamp: segments.iter().find_map(|s| s.first_timestamp),
            last_message_timestamp: segments.iter().rev().find_map(|s| s.last_timestamp),
            segments,
            messages_unacknowledged_at_start: None,
            messages_left_out: None,
            delivery_counts_raised: None,
            consumer_offsets: BTreeMap::new(),
        }
    }
}

/// Whether a stream segment follows the one before it with nothing missing between them:
/// its first offset is the next after the last offset of the one before, or it is the next
/// segment number (written right after it by the same read) and its first offset is higher.
///
/// A stream's offsets rise by one per message except where the broker keeps a chunk that is
/// not a message, which no reader is sent: a tracking chunk at the start of each of the
/// stream's segment files (`x-stream-max-segment-size-bytes`, 500 MB by default), so offsets
/// have gaps that hide nothing (found by the soak, `tests/streams.rs`). A reader cannot tell
/// such a gap from a lost segment, so across a hole in the segment numbers (a killed run's
/// unrecorded segments) only the next offset counts.
pub fn stream_segment_follows(before: (u64, u64), next: (u64, u64)) -> bool {
    let ((seq_before, last), (seq, first)) = (before, next);
    last.checked_add(1) == Some(first) || (seq == seq_before + 1 && first > last)
}

impl SegmentMetadata {
    /// Metadata of a finished segment stored under `key` with sequence number `sequence`.
    pub fn from_finished(key: String, sequence: u64, seg: &FinishedSegment) -> SegmentMetadata {
        SegmentMetadata {
            key,
            sequence,
            record_count: seg.record_count,
            size_bytes: seg.size_bytes,
            uncompressed_bytes: seg.uncompressed_bytes,
            first_timestamp: seg.first_timestamp,
            last_timestamp: seg.last_timestamp,
            checksum: seg.checksum.clone(),
            encryption: None,
            recipients: None,
            segment_version: (seg.version != crate::repository::segment::VERSION)
                .then_some(seg.version),
        }
    }
}

impl Manifest {
    /// An empty manifest for a backup started at `created_at` (epoch ms), written by this
    /// version of the tool; `completed_at` stays `None` until the backup completes.
    pub fn new(backup_id: &str, created_at: i64) -> Manifest {
        Manifest {
            backup_id: backup_id.to_string(),
            created_at,
            completed_at: None,
            source_cluster: None,
            broker_version: None,
            backup_tool_version: env!("CARGO_PKG_VERSION").to_string(),
            definitions: None,
            queues: Vec::new(),
            total_messages: 0,
            total_bytes: 0,
            total_segments: 0,
            shard: None,
            parts: None,
            encryption: None,
        }
    }

    /// Sets `total_messages`, `total_bytes` and `total_segments` from the queues.
    pub fn recompute_totals(&mut self) {
        self.total_messages = self.queues.iter().map(|q| q.message_count).sum();
        self.total_segments = self.queues.iter().map(|q| q.segments.len() as u64).sum();
        self.total_bytes = self
            .queues
            .iter()
            .flat_map(|q| &q.segments)
            .map(|s| s.size_bytes)
            .sum();
    }

    /// The manifest as pretty-printed JSON (two-space indent), as stored.
    ///
    /// Errors: `Error::Manifest` if serialisation fails (it cannot for these types).
    pub fn to_json_pretty(&self) -> Result<String> {
        serde_json::to_string_pretty(self)
            .map_err(|e| Error::Manifest(format!("Failed to serialize manifest: {e}")))
    }

    /// Parses a stored manifest (also accepts `rabbitmq_version` for `broker_version`).
    ///
    /// Errors: `Error::Manifest` with serde_json's message (line and column) when the bytes are
    /// not a valid manifest.
    pub fn from_json(bytes: &[u8]) -> Result<Manifest> {
        serde_json::from_slice(bytes).map_err(|e| Error::Manifest(format!("Invalid manifest: {e}")))
    }
}

impl Manifest {
    /// Reads the manifest of `backup_id` from `storage` and checks that it is that backup's
    /// and that every key it lists (segments, definitions) lies under `{backup_id}/`: a
    /// manifest is never followed into another backup's objects (nor out of the storage:
    /// `../` and absolute keys are refused by the storage itself).
    ///
    /// A sharded backup without `manifest.json` yet is read from its parts, merged in memory
    /// ([`merge_parts`]): reading writes nothing.
    ///
    /// Errors: `Storage error: Key not found: <id>/manifest.json` and the storage's;
    /// `Manifest error: Invalid manifest: ...`; `Manifest error: <id>/manifest.json ...` when
    /// it names another backup id or lists a key outside `{backup_id}/`.
    pub fn read(
        storage: &dyn crate::repository::storage::Storage,
        backup_id: &str,
    ) -> Result<Manifest> {
        let key = manifest_key(backup_id);
        let bytes = match storage.get_bytes(&key) {
            Ok(bytes) => bytes,
            // A sharded backup whose parts are not merged yet.
            Err(Error::Storage(e)) if e.starts_with("Key not found") => {
                return match merge_parts(storage, backup_id)? {
                    Some(m) => Ok(m),
                    None => Err(Error::Storage(e)),
                };
            }
            Err(e) => return Err(e),
        };
        let m = Manifest::from_json(&bytes)?;
        m.check_keys(&key, backup_id)?;
        Ok(m)
    }

    /// Checks that the manifest stored at `key` is backup `backup_id`'s and lists no key
    /// outside `{backup_id}/` (see [`Manifest::read`]).
    ///
    /// Errors: `Manifest error: ...` naming `key`.
    pub fn check_keys(&self, key: &str, backup_id: &str) -> Result<()> {
        let m = self;
        if m.backup_id != backup_id {
            return Err(Error::Manifest(format!(
                "{key} is the manifest of backup {:?}, not of {backup_id:?}",
                m.backup_id
            )));
        }
        let prefix = format!("{backup_id}/");
        let keys = m
            .queues
            .iter()
            .flat_map(|q| q.segments.iter().map(|s| s.key.as_str()))
            .chain(m.definitions.as_ref().map(|d| d.key.as_str()));
        for k in keys {
            if !k.starts_with(&prefix) || k.split('/').any(|c| c == ".." || c == ".") {
                return Err(Error::Manifest(format!(
                    "{key} lists {k:?}, which lies outside backup {backup_id}: refused before anything is read"
                )));
            }
        }
        Ok(())
    }
}

/// Key of the manifest: `{backup_id}/manifest.json`.
pub fn manifest_key(backup_id: &str) -> String {
    format!("{backup_id}/manifest.json")
}

/// Key of the definitions file: `{backup_id}/definitions/definitions.json{ext}`, where `ext` is
/// [`crate::repository::segment::Compression::extension`].
pub fn definitions_key(backup_id: &str, ext: &str) -> String {
    format!("{backup_id}/definitions/definitions.json{ext}")
}

/// Key of the definitions snapshot taken before a full restore imports definitions:
/// `{backup_id}/definitions/rollback-before-import-{timestamp}{ext}` (`timestamp` as given,
/// e.g. epoch ms).
pub fn rollback_definitions_key(backup_id: &str, timestamp: i64, ext: &str) -> String {
    format!("{backup_id}/definitions/rollback-before-import-{timestamp}{ext}")
}

/// Key of the synced checkpoint database: `{backup_id}/state/offsets.db`.
pub fn offsets_db_key(backup_id: &str) -> String {
    format!("{backup_id}/state/offsets.db")
}

/// Key of a queue's directory, with a trailing `/`: `{backup_id}/queues/{vhost}/{queue}/`, both
/// names escaped (see [`segment_key`]).
pub fn queue_prefix(backup_id: &str, vhost: &str, queue: &str) -> String {
    format!(
        "{backup_id}/queues/{}/{}/",
        escape_vhost(vhost),
        escape_component(queue)
    )
}

/// Key of a segment: `{backup_id}/queues/{vhost}/{queue}/segment-{seq:04}{ext}` (SPEC.md
/// "Storage layout"; numbering starts at 1 and keeps counting past 9999 with more digits).
/// The vhost `/` is written `_default`; other names are escaped by [`escape_vhost`] and
/// [`escape_component`].
pub fn segment_key(backup_id: &str, vhost: &str, queue: &str, seq: u64, ext: &str) -> String {
    format!(
        "{}segment-{seq:04}{ext}",
        queue_prefix(backup_id, vhost, queue)
    )
}

/// Escapes a vhost name for a key: `/` becomes `_default`, a vhost literally named `_default`
/// becomes `%5Fdefault`, everything else as [`escape_component`].
pub fn escape_vhost(vhost: &str) -> String {
    match vhost {
        "/" => "_default".to_string(),
        "_default" => "%5Fdefault".to_string(),
        other => escape_component(other),
    }
}

/// Escapes one name for use as a single key component (DESIGN.md decision 6): percent-encodes
/// (uppercase hex, per UTF-8 byte) `%`, `/`, `\`, control characters (Unicode `Cc`, including
/// DEL and C1) and a leading `.`; an empty name becomes `%` alone. Everything else (spaces,
/// unicode) is kept. The mapping is injective: a `%` in the output is either followed by two hex
/// digits that decode to an escaped character, or is the whole (empty-name) component, so
/// distinct names never share a key, and no component is `.`, `..`, empty, or contains a
/// separator.
pub fn escape_component(name: &str) -> String {
    if name.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(name.len());
    for (i, ch) in name.char_indices() {
        let escape = matches!(ch, '%' | '/' | '\\') || ch.is_control() || (i == 0 && ch == '.');
        if escape {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn sample() -> Manifest {
        Manifest {
            backup_id: "b1".into(),
            created_at: 1_700_000_000_000,
            completed_at: Some(1_700_000_001_000),
            source_cluster: Some("rabbit@h".into()),
            broker_version: Some("3.10.8".into()),
            backup_tool_version: "0.1.0".into(),
            definitions: Some(DefinitionsBackup {
                key: definitions_key("b1", ".zst"),
                vhost_count: 2,
                queue_count: 3,
                exchange_count: 4,
                user_count: 1,
                size_bytes: 999,
                encryption: None,
                checksum: None,
            }),
            queues: vec![QueueBackup {
                vhost: "/".into(),
                name: "orders".into(),
                queue_type: QueueType::Quorum,
                segments: vec![SegmentMetadata {
                    key: segment_key("b1", "/", "orders", 1, ".zst"),
                    sequence: 1,
                    record_count: 10,
                    size_bytes: 500,
                    uncompressed_bytes: 5000,
                    first_timestamp: Some(1),
                    last_timestamp: Some(2),
                    checksum: "ab".repeat(32),
                    encryption: None,
                    recipients: None,
                    segment_version: None,
                }],
                message_count: 10,
                first_message_timestamp: Some(1),
                last_message_timestamp: Some(2),
                messages_unacknowledged_at_start: None,
                messages_left_out: None,
                delivery_counts_raised: None,
                consumer_offsets: [("app-1".to_string(), 41)].into(),
            }],
            total_messages: 10,
            total_bytes: 500,
            total_segments: 1,
            shard: None,
            parts: None,
            encryption: None,
        }
    }

    #[test]
    fn manifest_json_shape() {
        let m = sample();
        let v: serde_json::Value = serde_json::from_str(&m.to_json_pretty().unwrap()).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort();
        let mut expected = vec![
            "backup_id",
            "created_at",
            "completed_at",
            "source_cluster",
            "broker_version",
            "backup_tool_version",
            "definitions",
            "queues",
            "total_messages",
            "total_bytes",
            "total_segments",
        ];
        expected.sort();
        assert_eq!(keys, expected); // the order is checked on the text below
        let text = m.to_json_pretty().unwrap();
        // Key order of every object, as in SPEC.md's tables.
        let in_order = |json: &str, keys: &[&str]| {
            let mut last = 0;
            for k in keys {
                let p = json[last..]
                    .find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{k} missing or out of order in {json}"));
                last += p + 1;
            }
        };
        in_order(
            &text,
            &[
                "backup_id",
                "created_at",
                "completed_at",
                "source_cluster",
                "broker_version",
                "backup_tool_version",
                "definitions",
                "queues",
                "total_messages",
                "total_bytes",
                "total_segments",
            ],
        );
        let defs = serde_json::to_string(&m.definitions).unwrap();
        in_order(
            &defs,
            &[
                "key",
                "vhost_count",
                "queue_count",
                "exchange_count",
                "user_count",
                "size_bytes",
            ],
        );
        let queue = serde_json::to_string(&m.queues[0]).unwrap();
        in_order(
            &queue,
            &[
                "vhost",
                "name",
                "queue_type",
                "segments",
                "message_count",
                "first_message_timestamp",
                "last_message_timestamp",
            ],
        );
        let seg = serde_json::to_string(&m.queues[0].segments[0]).unwrap();
        in_order(
            &seg,
            &[
                "key",
                "sequence",
                "record_count",
                "size_bytes",
                "uncompressed_bytes",
                "first_timestamp",
                "last_timestamp",
                "checksum",
            ],
        );
        assert!(text.starts_with("{\n  \"backup_id\": \"b1\","), "{text}");
        assert_eq!(v["queues"][0]["queue_type"], "quorum");
        assert_eq!(
            v["queues"][0]["segments"][0]["key"],
            "b1/queues/_default/orders/segment-0001.zst"
        );
        assert_eq!(
            v["definitions"]["key"],
            "b1/definitions/definitions.json.zst"
        );
        assert_eq!(v["definitions"]["size_bytes"], 999);
        // Nulls are written, not skipped.
        let mut m2 = sample();
        m2.completed_at = None;
        m2.definitions = None;
        m2.source_cluster = None;
        let t2 = m2.to_json_pretty().unwrap();
        assert!(t2.contains("\"completed_at\": null"), "{t2}");
        assert!(t2.contains("\"definitions\": null"), "{t2}");
        assert!(t2.contains("\"source_cluster\": null"), "{t2}");
        assert_eq!(Manifest::from_json(t2.as_bytes()).unwrap(), m2);
    }

    #[test]
    fn manifest_round_trip_and_alias() {
        let m = sample();
        let text = m.to_json_pretty().unwrap();
        assert_eq!(Manifest::from_json(text.as_bytes()).unwrap(), m);
        let legacy = text.replace("\"broker_version\"", "\"rabbitmq_version\"");
        assert!(legacy.contains("rabbitmq_version"));
        let back = Manifest::from_json(legacy.as_bytes()).unwrap();
        assert_eq!(back.broker_version.as_deref(), Some("3.10.8"));
        assert!(!back.to_json_pretty().unwrap().contains("rabbitmq_version"));
    }

    #[test]
    fn the_definitions_checksum_is_optional() {
        // A manifest written before the checksum was recorded: read, and written back without.
        let m = sample();
        let text = m.to_json_pretty().unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(v["definitions"].get("checksum").is_none(), "{text}");
        let old = Manifest::from_json(text.as_bytes()).unwrap();
        assert_eq!(old.definitions.as_ref().unwrap().checksum, None);
        let mut new = m.clone();
        new.definitions.as_mut().unwrap().checksum = Some("ab".repeat(32));
        let text = new.to_json_pretty().unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["definitions"]["checksum"], "ab".repeat(32));
        assert_eq!(Manifest::from_json(text.as_bytes()).unwrap(), new);
    }

    #[test]
    fn manifest_errors() {
        let e = Manifest::from_json(b"{not json").unwrap_err();
        assert!(matches!(e, Error::Manifest(_)));
        assert!(
            e.to_string()
                .starts_with("Manifest error: Invalid manifest: "),
            "{e}"
        );
        let text = sample().to_json_pretty().unwrap();
        let bad_type = text.replace("\"quorum\"", "\"Quorum\"");
        assert!(matches!(
            Manifest::from_json(bad_type.as_bytes()),
            Err(Error::Manifest(_))
        ));
        let missing = text.replace("\"backup_id\": \"b1\",", "");
        assert!(Manifest::from_json(missing.as_bytes()).is_err());
    }

    #[test]
    fn segment_metadata_from_finished() {
        let fin = FinishedSegment {
            data: None,
            path: "/tmp/x".into(),
            record_count: 3,
            first_timestamp: Some(10),
            last_timestamp: Some(20),
            size_bytes: 100,
            uncompressed_bytes: 300,
            checksum: "0".repeat(64),
            version: 1,
        };
        let m = SegmentMetadata::from_finished("k".into(), 7, &fin);
        assert_eq!(m.key, "k");
        assert_eq!(m.sequence, 7);
        assert_eq!(m.record_count, 3);
        assert_eq!(m.size_bytes, 100);
        assert_eq!(m.uncompressed_bytes, 300);
        assert_eq!(m.first_timestamp, Some(10));
        assert_eq!(m.last_timestamp, Some(20));
        assert_eq!(m.checksum, "0".repeat(64));
    }

    #[test]
    fn keys_follow_storage_layout() {
        assert_eq!(manifest_key("b1"), "b1/manifest.json");
        assert_eq!(
            definitions_key("b1", ".zst"),
            "b1/definitions/definitions.json.zst"
        );
        assert_eq!(definitions_key("b1", ""), "b1/definitions/definitions.json");
        assert_eq!(
            rollback_definitions_key("b1", 1700000000000, ".lz4"),
            "b1/definitions/rollback-before-import-1700000000000.lz4"
        );
        assert_eq!(offsets_db_key("b1"), "b1/state/offsets.db");
        assert_eq!(
            segment_key("b1", "/", "orders", 1, ".zst"),
            "b1/queues/_default/orders/segment-0001.zst"
        );
        assert_eq!(
            segment_key("b1", "prod", "q", 42, ".lz4"),
            "b1/queues/prod/q/segment-0042.lz4"
        );
        assert_eq!(
            segment_key("b1", "v", "q", 9999, ""),
            "b1/queues/v/q/segment-9999"
        );
        assert_eq!(
            segment_key("b1", "v", "q", 12345, ""),
            "b1/queues/v/q/segment-12345"
        );
        assert_eq!(queue_prefix("b1", "/", "q"), "b1/queues/_default/q/");
    }

    #[test]
    fn escaping_rules() {
        let cases = [
            ("orders", "orders"),
            ("my queue", "my queue"),
            ("a/b", "a%2Fb"),
            ("a\\b", "a%5Cb"),
            ("100%", "100%25"),
            ("%2F", "%252F"),
            (".", "%2E"),
            ("..", "%2E."),
            ("...", "%2E.."),
            (".hidden", "%2Ehidden"),
            ("a.b.", "a.b."),
            ("../etc", "%2E.%2Fetc"),
            ("tab\there", "tab%09here"),
            ("nl\n", "nl%0A"),
            ("nul\0", "nul%00"),
            ("del\u{7f}", "del%7F"),
            ("c1\u{85}", "c1%C2%85"),
            ("héllo-中文-🎉", "héllo-中文-🎉"),
            ("_default", "_default"),
            ("", "%"),
        ];
        for (name, escaped) in cases {
            assert_eq!(escape_component(name), escaped, "{name:?}");
        }
        assert_eq!(escape_vhost("/"), "_default");
        assert_eq!(escape_vhost("_default"), "%5Fdefault");
        assert_eq!(escape_vhost("prod/eu"), "prod%2Feu");
        assert_eq!(escape_vhost(".."), "%2E.");
        assert_eq!(
            segment_key("b", "..", "../../x", 1, ""),
            "b/queues/%2E./%2E.%2F..%2Fx/segment-0001"
        );
    }

    /// Inverse of the escaping, to prove it loses nothing.
    fn unescape(s: &str) -> String {
        if s == "%" {
            return String::new();
        }
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn distinct_names_give_distinct_safe_keys() {
        let names = [
            "",
            "/",
            "//",
            "_default",
            "%5Fdefault",
            "%",
            "%25",
            "%2F",
            "a/b",
            "a%2Fb",
            "a\\b",
            "a%5Cb",
            ".",
            "..",
            "...",
            "%2E",
            "%2E.",
            ".a",
            "a.",
            " ",
            "  ",
            "a b",
            "a+b",
            "a%20b",
            "\n",
            "%0A",
            "\u{0}",
            "é",
            "e\u{301}",
            "中",
            "🎉",
            "_",
            "default",
            "segment-0001",
            "queues",
            "x/../y",
            "x/./y",
            "\\..\\",
            "\u{85}",
            "\u{2028}",
        ];
        let mut keys = HashSet::new();
        for vhost in names {
            for queue in names {
                let key = segment_key("bk", vhost, queue, 1, ".zst");
                assert!(
                    keys.insert(key.clone()),
                    "collision for {vhost:?}/{queue:?}: {key}"
                );
                let parts: Vec<&str> = key.split('/').collect();
                assert_eq!(parts.len(), 5, "{key}");
                assert_eq!(parts[0], "bk");
                assert_eq!(parts[1], "queues");
                assert_eq!(parts[4], "segment-0001.zst");
                for part in &parts[2..4] {
                    assert!(!part.is_empty() && *part != "." && *part != "..", "{key}");
                    assert!(!part.starts_with('.'), "{key}");
                    assert!(!part.contains('\\'), "{key}");
                    assert!(!part.chars().any(char::is_control), "{key}");
                }
                if vhost != "/" {
                    let v = if parts[2] == "%5Fdefault" {
                        "_default".to_string()
                    } else {
                        unescape(parts[2])
                    };
                    assert_eq!(v, vhost);
                }
                assert_eq!(unescape(parts[3]), queue);
            }
        }
        assert_eq!(keys.len(), names.len() * names.len());
    }

    #[test]
    fn a_stream_segment_follows_across_offsets_no_message_takes() {
        // The next offset: follows, whatever the numbers (a killed run's segment between).
        assert!(stream_segment_follows((3, 80), (4, 81)));
        assert!(stream_segment_follows((3, 80), (5, 81)));
        // A gap in offsets right after (the broker's tracking chunk): follows.
        assert!(stream_segment_follows((3, 80), (4, 82)));
        // A gap in offsets across a hole in the numbers: a segment may be missing.
        assert!(!stream_segment_follows((3, 80), (5, 108)));
        // Offsets that repeat or go back never follow.
        assert!(!stream_segment_follows((3, 80), (4, 80)));
        assert!(!stream_segment_follows((3, 80), (4, 10)));
        assert!(!stream_segment_follows((3, u64::MAX), (4, 0)));
    }
}
