//! Coordination between replicas through etcd: [`LeaderElection`] (one
//! replica of many reconciles; the others wait as warm standbys).

mod leader;

pub(crate) use leader::Seat;
pub use leader::{LeaderElection, LeaderStatus, OnLost};
