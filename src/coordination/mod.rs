//! Coordination between replicas through etcd: [`LeaderElection`] (one
//! replica of many reconciles; the others wait as warm standbys).

mod leader;

pub use leader::{LeaderElection, OnLost};
