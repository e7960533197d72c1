//! Broker-level names shared by the jobs: the queue type and a queue's identity.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Type of a queue, lowercase in YAML and JSON (`classic`, `quorum`, `stream`), as in the
/// manifest's `queue_type` and `source.queues.types` (SPEC.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Classic,
    Quorum,
    Stream,
}

impl QueueType {
    /// The lowercase name (`classic`, `quorum`, `stream`).
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }

    /// Parses the management API's `type` field; unknown types (plugins) give `None`.
    pub fn from_api(s: &str) -> Option<QueueType> {
        match s {
            "classic" => Some(QueueType::Classic),
            "quorum" => Some(QueueType::Quorum),
            "stream" => Some(QueueType::Stream),
            _ => None,
        }
    }
}

impl fmt::Display for QueueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
