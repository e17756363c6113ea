//! Coordination between replicas through etcd: [`LeaderElection`] (one
//! replica of many reconciles; the others wait as warm standbys) and
//! [`Sharding`] (replicas split the keys' partitions between them).

mod floor;
mod leader;
mod lease;
mod partition;
mod settings;
mod sharding;

pub(crate) use leader::Seat;
pub use leader::{LeaderElection, LeaderStatus, OnLost};
pub use partition::partition_of;
pub use settings::Endpoints;
pub(crate) use sharding::ShardHooks;
pub use sharding::{ShardStatus, Sharding};
