//! What backups left behind in a quorum queue: per source queue, the highest
//! `x-delivery-count` the tool's reads may have left on one of its messages (issue 37,
//! docs/reading-queues.md "Quorum queues and their delivery limit").
//!
//! On RabbitMQ 3.x and 4.0-4.2 every return of a quorum message counts as a failed delivery,
//! and a message returned once more after reaching the queue's delivery limit is dropped or
//! dead-lettered. A read cannot see a message's count before it holds it, so the decision to
//! read must come from what earlier runs left: this record. It lives in the repository, not in
//! one backup, so that it outlasts retention and every backup id:
//!
//! ```text
//! {prefix}/rmq-backup-state/delivery-counts/{cluster}/{vhost}/{queue}.json
//! ```
//!
//! (`{cluster}` is the source's `cluster_name`, each name escaped as the manifest's keys are;
//! the `rmq-backup-state` component is reserved: no backup id may take it, `list` and
//! `forget` never see a backup in it, and `storage.object_lock` never locks it, since every
//! read rewrites it.)
//!
//! A read writes the record **before** it takes any message (`reading: true`, the count as it
//! will be once the read has given everything back), and again after (`reading: false`, the
//! count it saw plus one): a run killed in between leaves a record that already counts the
//! return its connection's close made.

use crate::error::{Error, Result};
use crate::repository::manifest::{escape_component, escape_vhost};
use crate::repository::storage::{Conditional, ObjectVersion, Storage};
use serde::{Deserialize, Serialize};

/// The first key component of the repository's own state, beside the backup ids: reserved.
pub const STATE_PREFIX: &str = "rmq-backup-state";

/// The record of one source queue (JSON, the object at [`key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountRecord {
    /// The source's `cluster_name` (`GET /api/overview`).
    pub cluster: String,
    pub vhost: String,
    pub queue: String,
    /// The highest `x-delivery-count` any message of the queue may have from this tool's
    /// reads: each message a read gave back with a counted return is at most this. `None`:
    /// not known (a first read under way).
    pub max_delivery_count: Option<u64>,
    /// True from just before a read takes its first message until it has given every message
    /// back; `max_delivery_count` then already counts that read's return.
    pub reading: bool,
    /// The delivery limit in effect when the record was written (`None`: none).
    pub delivery_limit: Option<u64>,
    /// The source's RabbitMQ version then, as the broker reported it.
    pub broker_version: Option<String>,
    /// The backup whose read wrote it.
    pub backup_id: String,
    /// When it was written, epoch ms.
    pub updated_at: i64,
    /// Messages that read gave back with a counted return (0 while `reading`).
    pub messages: u64,
}

/// A record as stored, with the version a replace must match.
#[derive(Debug, Clone)]
pub struct Stored {
    pub record: CountRecord,
    pub version: ObjectVersion,
}

/// The key of the record of `queue` in `vhost` of the source cluster `cluster`.
pub fn key(cluster: &str, vhost: &str, queue: &str) -> String {
    format!(
        "{STATE_PREFIX}/delivery-counts/{}/{}/{}.json",
        escape_component(cluster),
        escape_vhost(vhost),
        escape_component(queue)
    )
}

/// Reads the record of `queue`; `Ok(None)` when there is none.
///
/// Errors: the storage's; `Manifest error: ... is not a delivery-count record` for an object
/// that does not parse (a record this tool cannot trust is not taken as "no record").
pub fn load(
    storage: &dyn Storage,
    cluster: &str,
    vhost: &str,
    queue: &str,
) -> Result<Option<Stored>> {
    let k = key(cluster, vhost, queue);
    let Some((bytes, version)) = storage.get_with_version(&k)? else {
        return Ok(None);
    };
    let record = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Manifest(format!(
            "{k} is not a delivery-count record ({e}); remove it only once the queue's messages that earlier backups read are gone"
        ))
    })?;
    Ok(Some(Stored { record, version }))
}

/// Writes `record` over `previous` (the version read, or `None` for a new record).
///
/// Errors: the storage's (a storage that refuses to replace objects, such as a GCS bucket
/// with a retention policy, refuses the second write); `Storage error: ... was changed by
/// another run meanwhile` when the object is not the version read.
pub fn save(
    storage: &dyn Storage,
    record: &CountRecord,
    previous: Option<&ObjectVersion>,
) -> Result<ObjectVersion> {
    let k = key(&record.cluster, &record.vhost, &record.queue);
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|e| Error::Serialization(format!("delivery-count record {k}: {e}")))?;
    let written = match previous {
        None => storage.put_bytes_new(&k, &bytes)?,
        Some(v) => storage.put_bytes_if(&k, &bytes, v)?,
    };
    match written {
        Conditional::Written(v) => Ok(v),
        Conditional::Refused => Err(Error::Storage(format!(
            "{k} was changed by another run meanwhile (two backups read the same queue at once?)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::storage::memory::MemoryStorage;

    fn record(max: Option<u64>, reading: bool) -> CountRecord {
        CountRecord {
            cluster: "rabbit@h".into(),
            vhost: "/".into(),
            queue: "a/b".into(),
            max_delivery_count: max,
            reading,
            delivery_limit: Some(20),
            broker_version: Some("4.0.5".into()),
            backup_id: "night-1".into(),
            updated_at: 1,
            messages: 0,
        }
    }

    #[test]
    fn keys_escape_every_name() {
        assert_eq!(
            key("rabbit@h", "/", "a/b"),
            "rmq-backup-state/delivery-counts/rabbit@h/_default/a%2Fb.json"
        );
        assert_eq!(
            key("c", ".v", ".."),
            "rmq-backup-state/delivery-counts/c/%2Ev/%2E..json"
        );
        crate::repository::storage::validate_key(&key("c/d", "v\n", "")).unwrap();
    }

    #[test]
    fn a_record_is_created_then_replaced_only_over_the_version_read() {
        let s = MemoryStorage::named("delivery-counts-replace");
        assert!(load(s.as_ref(), "rabbit@h", "/", "a/b").unwrap().is_none());
        let v1 = save(s.as_ref(), &record(Some(1), true), None).unwrap();
        let got = load(s.as_ref(), "rabbit@h", "/", "a/b").unwrap().unwrap();
        assert_eq!(got.record, record(Some(1), true));
        assert_eq!(got.version, v1);
        let v2 = save(s.as_ref(), &record(Some(1), false), Some(&v1)).unwrap();
        assert!(
            save(s.as_ref(), &record(Some(2), true), None).is_err(),
            "exists"
        );
        let stale = save(s.as_ref(), &record(Some(2), true), Some(&v1)).unwrap_err();
        assert!(
            stale.to_string().contains("changed by another run"),
            "{stale}"
        );
        assert_eq!(
            load(s.as_ref(), "rabbit@h", "/", "a/b")
                .unwrap()
                .unwrap()
                .version,
            v2
        );
    }

    #[test]
    fn a_record_that_does_not_parse_is_an_error_not_an_absence() {
        let s = MemoryStorage::named("delivery-counts-garbage");
        s.put_bytes(&key("c", "v", "q"), b"{").unwrap();
        let e = load(s.as_ref(), "c", "v", "q").unwrap_err();
        assert!(e.to_string().starts_with("Manifest error: "), "{e}");
    }
}
