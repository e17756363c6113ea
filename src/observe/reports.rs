//! What leader election, sharding and a controller's store show in status
//! and stats: plain data, compiled without the `etcd` and `store` features
//! too, so stats and status entries have one shape whatever the build.
//! Defined here, in the status vocabulary, so that reporting names no
//! feature's module; `coordination` and `store` re-export them.

use std::collections::BTreeSet;
use std::time::SystemTime;

/// A snapshot of a leader election (`LeaderElection`), as status and stats show it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderStatus {
    /// The election's name.
    pub name: String,
    /// This process's fencing token while it leads, `None` on a standby.
    pub fencing_token: Option<u64>,
    /// Who leads, as last seen (their identity).
    pub leader: Option<String>,
    /// The last error talking to etcd, if the last attempt failed.
    pub last_error: Option<String>,
}

impl LeaderStatus {
    /// Whether this process leads.
    pub fn is_leader(&self) -> bool {
        self.fencing_token.is_some()
    }
}

/// A snapshot of a sharding (`Sharding`), as status and stats show it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The sharding's name.
    pub name: String,
    /// The number of partitions of the key space.
    pub partitions: u32,
    /// The partitions this process owns now.
    pub owned: BTreeSet<u32>,
    /// Live replicas, as last seen.
    pub members: usize,
    /// The last error talking to etcd, if the last attempt failed.
    pub last_error: Option<String>,
}

/// The store's part of a controller's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Changes not yet written, including those a flush is writing now (a
    /// key changed twice since the last flush counts twice until then).
    pub pending: usize,
    /// When the last flush succeeded.
    pub last_flush_time: Option<SystemTime>,
    /// The last flush's error, until a flush succeeds.
    pub error: Option<String>,
}
