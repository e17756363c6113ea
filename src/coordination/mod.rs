//! Coordination between replicas through etcd: [`LeaderElection`] (one
//! replica of many reconciles; the others wait as warm standbys) and
//! [`Sharding`] (replicas split the keys' partitions between them).

#[cfg(feature = "etcd")]
mod floor;
#[cfg(feature = "etcd")]
mod leader;
#[cfg(feature = "etcd")]
mod lease;
mod partition;
#[cfg(feature = "etcd")]
mod settings;
#[cfg(feature = "etcd")]
mod sharding;

pub use crate::observe::reports::{LeaderStatus, ShardStatus};
#[cfg(feature = "etcd")]
pub use leader::{LeaderElection, OnLost};
pub use partition::{partition_of, partition_of_by};
#[cfg(feature = "etcd")]
pub use settings::Endpoints;
#[cfg(feature = "etcd")]
pub(crate) use settings::check_endpoints;
#[cfg(feature = "etcd")]
pub use sharding::Sharding;
#[cfg(feature = "etcd")]
pub(crate) use sharding::{MAX_HANDOVER_BYTES, ShardAdmission, ShardHooks};

/// What a [`Manager`](crate::Manager) needs of a leader election: the seam
/// that keeps the manager free of etcd (implemented by `LeaderElection`
/// with the `etcd` feature).
pub(crate) trait Leading: Send + Sync {
    /// Campaigns while the returned seat lives; `on_lost` is called (with
    /// no lock held) each time leadership is lost meanwhile.
    fn join(&self, on_lost: Box<dyn Fn() + Send + Sync>) -> Box<dyn LeaderSeat>;
    fn status(&self) -> LeaderStatus;
}

/// One user's place in an election (see [`Leading::join`]).
pub(crate) trait LeaderSeat: Send + Sync {
    /// The leadership's fencing token while this process leads.
    fn token(&self) -> Option<u64>;
    /// Blocks until this process leads or `give_up()` turns true.
    fn wait_token(&self, give_up: &dyn Fn() -> bool);
    /// Wakes the threads in [`wait_token`](Self::wait_token).
    fn wake(&self);
}
