//! Keeping a lease alive on time (guarantees §10 L3, §11), for leader
//! election and sharding alike: a keep-alive every `ttl / 3`, retried soon
//! after a failure, each try waiting only until the renew deadline, so a
//! holder cut off from etcd learns it lost the lease before the server can
//! expire it and someone else can take over.

use std::time::{Duration, Instant};

use super::settings::renew_deadline;
use crate::etcd::{EtcdClient, EtcdError};

/// How soon a failed keep-alive is tried again (before the deadline).
const RETRY: Duration = Duration::from_millis(200);

/// One lease being kept alive by the thread that holds it.
pub(super) struct LeaseKeeper {
    lease: i64,
    ttl: Duration,
    /// When the last successful keep-alive (or the grant) was sent.
    renewed: Instant,
    /// When the next keep-alive is due.
    next: Instant,
}

/// What one [`LeaseKeeper::renew`] came to.
pub(super) enum Renewal {
    /// Renewed by a keep-alive sent at this instant.
    Renewed(Instant),
    /// This try failed; the next is due soon, at the deadline at the latest.
    Failed(EtcdError),
    /// The lease is gone, or could not be renewed before the deadline: why.
    Lost(&'static str),
}

impl LeaseKeeper {
    /// Keeps `lease`, granted by a call sent at `granted`.
    pub(super) fn new(lease: i64, ttl: Duration, granted: Instant) -> Self {
        Self { lease, ttl, renewed: granted, next: granted + ttl / 3 }
    }

    /// When the next keep-alive is due.
    pub(super) fn due(&self) -> Instant {
        self.next
    }

    /// Sends one keep-alive, waiting for its answer only until the renew
    /// deadline.
    pub(super) fn renew(&mut self, client: &EtcdClient) -> Renewal {
        let deadline = self.renewed + renew_deadline(self.ttl);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Renewal::Lost("could not renew the lease in time");
        }
        let sent = Instant::now();
        match client.keep_alive(self.lease, left) {
            Ok(Some(_)) => {
                self.renewed = sent;
                self.next = sent + self.ttl / 3;
                Renewal::Renewed(sent)
            }
            Ok(None) => Renewal::Lost("the lease expired"),
            Err(e) => {
                self.next = (Instant::now() + RETRY).min(deadline);
                Renewal::Failed(e)
            }
        }
    }
}
