//! Log lines of leader election and sharding (the `etcd` feature).

use std::time::Duration;

use super::Few;

/// Target of the leader election's events.
const ELECTION: &str = "reconq::election";

/// Talking to etcd failed; the campaign retries after `backoff`.
pub(crate) fn election_error(election: &str, error: &str, backoff: Duration) {
    tracing::warn!(target: ELECTION, election = %election, error, retry_in = ?backoff, "etcd unreachable; standing by");
}

/// This process became leader.
pub(crate) fn election_won(election: &str, identity: &str, token: u64) {
    tracing::info!(target: ELECTION, election = %election, identity, fencing_token = token, "became leader");
}

/// This process lost its leadership.
pub(crate) fn election_lost(election: &str, token: u64, why: &str) {
    tracing::warn!(target: ELECTION, election = %election, fencing_token = token, why, "lost leadership");
}

/// etcd's history was reset: the election stepped down, raised the
/// fencing floor to `floor` and campaigns again after a TTL.
pub(crate) fn election_reset(election: &str, error: &str, floor: u64) {
    tracing::error!(
        target: ELECTION, election = %election, error, fencing_floor = floor,
        "etcd's history was reset; stepped down, campaigning again after a TTL"
    );
}

/// The leader campaigned before the fencing floor last rose: its lease is
/// revoked, so that the next leader's token lies above the floor.
pub(crate) fn election_below_floor(election: &str, leader: &str, created: i64) {
    tracing::error!(
        target: ELECTION, election = %election, leader, create_revision = created,
        "the leader campaigned before the fencing floor rose (after a reset of etcd it did not see); revoking its lease"
    );
}

/// Target of sharding's events.
const SHARDING: &str = "reconq::sharding";

/// Talking to etcd failed; sharding retries after `backoff`.
pub(crate) fn sharding_error(sharding: &str, error: &str, backoff: Duration) {
    tracing::warn!(target: SHARDING, sharding = %sharding, error, retry_in = ?backoff, "etcd unreachable; retrying");
}

/// etcd's history was reset: the replica dropped its partitions, raised
/// the fencing floor to `floor` and joins again after a TTL.
pub(crate) fn sharding_reset(sharding: &str, error: &str, floor: u64) {
    tracing::error!(
        target: SHARDING, sharding = %sharding, error, fencing_floor = floor,
        "etcd's history was reset; dropped every partition, joining again after a TTL"
    );
}

/// Partitions changed hands: gained (claimed) or given up.
pub(crate) fn partitions_moved(sharding: &str, what: &str, partitions: &std::collections::BTreeSet<u32>) {
    tracing::info!(target: SHARDING, sharding = %sharding, count = partitions.len(), partitions = ?Few(partitions), "{what}");
}

/// Partitions were lost without a hand-over (the lease expired or could
/// not be renewed in time).
pub(crate) fn partitions_lost(sharding: &str, why: &str, partitions: &std::collections::BTreeSet<u32>) {
    tracing::warn!(target: SHARDING, sharding = %sharding, count = partitions.len(), partitions = ?Few(partitions), why, "lost partitions");
}
