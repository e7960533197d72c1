//! The repository side: what a backup is in storage. Records (`record`) are framed into
//! segments (`segment`), encrypted (`encryption`), spooled (`spool`) and stored (`storage`);
//! the manifest (`manifest`) and a sharded backup's parts (`shard`) say what a backup holds;
//! the run lock (`lock`), what reads left in quorum queues
//! (`delivery_counts`), fetching segments back (`fetch`) and checkpoint databases
//! (`checkpoint`) complete it. The jobs (`crate::backup`, `crate::restore`, `crate::inspect`,
//! `crate::retention`) sit between this side and the broker side (`crate::broker`).

pub mod checkpoint;
pub mod delivery_counts;
pub mod encryption;
pub mod fetch;
pub mod lock;
pub mod manifest;
pub mod record;
pub mod segment;
pub mod shard;
pub mod spool;
pub mod storage;
