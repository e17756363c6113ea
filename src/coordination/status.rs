//! What leader election and sharding show in status and stats: plain data,
//! compiled without the `etcd` feature too, so stats and status entries
//! have one shape whatever the build.

use std::collections::BTreeSet;

/// A snapshot of a leader election (`LeaderElection`), as status and stats show it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
pub struct ShardStatus {
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
