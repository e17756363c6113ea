//! Every span and log event the engine emits, in one place.
//!
//! Targets are fixed names, not module paths, so they survive refactoring
//! and map to stable Python logger names (`reconq.controller`,
//! `reconq.manager`): [`CONTROLLER`] for the reconcile loop, its watchdog,
//! triggers and watches; [`MANAGER`] for named periodic controllers.
//!
//! Levels follow controller-runtime, which logs `Reconciler error` at error
//! level for every failed reconcile: a failure or panic is an ERROR, a
//! failure that asked for a fixed retry delay (`retry_after`), a failed
//! manager `do`, a hanging reconcile and a drain deadline are WARNs. Nothing
//! is logged on the success path, and nothing should be at DEBUG or above:
//! in the Python bindings every such record takes the GIL to ask `logging`
//! whether it is wanted (`crate::python::logs`; TRACE is filtered out before).
//!
//! Every event carries its context (`controller`, `key`, `attempt`) as
//! fields of its own, not only through the enclosing span: `log` records
//! (what `tracing` emits when no `tracing` subscriber is set, and what the
//! Python bindings forward to `logging`) carry no span context, and a
//! subscriber may filter the span out.
//!
//! # The lock rule
//!
//! **No span or event may be created while an engine lock is held** (the
//! queue mutex, a controller's life / slot / key-memory / parked / trigger
//! locks, a manager's registry or controller state lock, the global
//! registry behind `reconq::status`). A subscriber or `log` logger may
//! block: the Python bindings' logger takes the GIL, and a Python thread
//! holding the GIL may itself be waiting for that engine lock. Call sites
//! compute what they need under the lock, release it, then log.

use std::fmt;
use std::time::Duration;

use crate::controller::RetryPolicy;

/// The target of the reconcile loop's spans and events.
pub(crate) const CONTROLLER: &str = "reconq::controller";
/// The target of named periodic controllers' spans and events.
pub(crate) const MANAGER: &str = "reconq::manager";

/// The span a reconcile (and the handling of its result) runs in: INFO,
/// named `reconcile`, with `controller`, `key` (its `Debug` form) and
/// `attempt`.
///
/// Made only once a `tracing` dispatcher exists anywhere in the process:
/// without one the span could only produce `log` records (a
/// `reconcile;controller=...` line per reconcile on [`CONTROLLER`], plus
/// `tracing::span` lifecycle lines), which are noise, and cost a `log`
/// level check per reconcile. With no subscriber this is one relaxed atomic
/// load; the key is formatted only if a subscriber records the span.
#[inline]
pub(crate) fn reconcile_span<K: fmt::Debug>(controller: &str, key: &K, attempt: u32) -> tracing::Span {
    if tracing::dispatcher::has_been_set() {
        tracing::info_span!(target: CONTROLLER, "reconcile", controller = %controller, key = ?key, attempt)
    } else {
        tracing::Span::none()
    }
}

/// A reconcile returned an error or panicked (call with no lock held).
pub(crate) fn reconcile_failed<K: fmt::Debug>(
    controller: &str,
    key: &K,
    attempt: u32,
    retry: RetryPolicy,
    error: &str,
    panicked: bool,
) {
    if panicked {
        tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?key, attempt, error,
            "reconcile panicked; retrying with backoff"
        );
        return;
    }
    match retry {
        RetryPolicy::RateLimited => tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?key, attempt, error,
            "reconcile failed; retrying with backoff"
        ),
        RetryPolicy::After(delay) => tracing::warn!(
            target: CONTROLLER,
            controller = %controller, key = ?key, attempt, error, retry_after = ?delay,
            "reconcile failed; retrying after a delay"
        ),
        RetryPolicy::Never => tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?key, attempt, error,
            "reconcile failed permanently; key parked"
        ),
    }
}

/// A reconcile has run longer than the hanging threshold (once per
/// reconcile; call with no lock held).
pub(crate) fn reconcile_hanging<K: fmt::Debug>(controller: &str, key: &K, running: Duration) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, key = ?key, seconds = running.as_secs_f64(),
        "reconcile has been running for {:.1} s",
        running.as_secs_f64()
    );
}

/// A drain's deadline passed (call with no lock held).
pub(crate) fn drain_deadline_passed<K: fmt::Debug>(controller: &str, unfinished: &[K]) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, unfinished = ?unfinished,
        "drain deadline passed; cancelled and detached the workers still running"
    );
}

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
    tracing::info!(target: SHARDING, sharding = %sharding, partitions = ?partitions, "{what}");
}

/// Partitions were lost without a hand-over (the lease expired or could
/// not be renewed in time).
pub(crate) fn partitions_lost(sharding: &str, why: &str, partitions: &std::collections::BTreeSet<u32>) {
    tracing::warn!(target: SHARDING, sharding = %sharding, partitions = ?partitions, why, "lost partitions");
}

/// A stop is still waiting for these reconciles to return (call with no
/// lock held).
pub(crate) fn stop_waiting<K: fmt::Debug>(controller: &str, running: &[K]) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, running = ?running,
        "stop waiting for reconciles to return"
    );
}

/// A stop dropped keys without reconciling them (call with no lock held).
/// Nothing is logged when it dropped none.
pub(crate) fn stop_dropped<K: fmt::Debug>(controller: &str, dropped: &[K]) {
    /// How many of the dropped keys the message names.
    const NAMED: usize = 20;
    if dropped.is_empty() {
        return;
    }
    let named = &dropped[..dropped.len().min(NAMED)];
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, dropped = dropped.len(), keys = ?named,
        "stop dropped keys waiting on a delay, a retry or the queue without reconciling them"
    );
}

/// `run_until_signal` got its first signal and drains.
pub(crate) fn signal_draining(controller: &str) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller,
        "stopping on a signal, draining (a second signal stops at once)"
    );
}

/// `run_until_signal`'s drain ran out of `stop_timeout`.
pub(crate) fn signal_stop_timeout_passed<K: fmt::Debug>(controller: &str, unfinished: &[K]) {
    tracing::warn!(target: CONTROLLER, controller = %controller, unfinished = ?unfinished, "stop_timeout passed; left running");
}

/// `run_until_signal` got a second signal and stopped at once; `returned`:
/// the cancelled reconciles returned within the grace.
pub(crate) fn second_signal(controller: &str, returned: bool) {
    if returned {
        tracing::warn!(
            target: CONTROLLER,
            controller = %controller,
            "second signal; stopped at once (running reconciles were cancelled and returned)"
        );
    } else {
        tracing::warn!(
            target: CONTROLLER,
            controller = %controller,
            "second signal; stopped without waiting for running reconciles"
        );
    }
}

/// A trigger function panicked (call with no lock held).
pub(crate) fn trigger_panicked<K: fmt::Debug>(controller: &str, key: &K, error: &str) {
    tracing::error!(target: CONTROLLER, controller = %controller, key = ?key, error, "trigger panicked");
}

/// A watch's transform panicked; the event is skipped (call with no lock
/// held).
pub(crate) fn watch_transform_panicked(controller: &str, error: &str) {
    tracing::error!(
        target: CONTROLLER,
        controller = %controller, error,
        "watch transform panicked; event skipped"
    );
}

/// The span a manager controller's run of `do` runs in: INFO, named `run`,
/// with `manager` (the manager's name) and `controller` (made only once a
/// `tracing` dispatcher exists, as [`reconcile_span`]).
#[inline]
pub(crate) fn manager_run_span(manager: &str, controller: &str) -> tracing::Span {
    if tracing::dispatcher::has_been_set() {
        tracing::info_span!(target: MANAGER, "run", manager = %manager, controller = %controller)
    } else {
        tracing::Span::none()
    }
}

/// A manager controller's `do` failed or panicked (call with no lock held).
/// A failure is a WARN (Cilium retries them as a matter of course), a panic
/// an ERROR.
pub(crate) fn manager_run_failed(
    manager: &str,
    controller: &str,
    consecutive_failures: u64,
    retry_in: Option<Duration>,
    error: &str,
    panicked: bool,
) {
    if panicked {
        tracing::error!(
            target: MANAGER,
            manager = %manager, controller = %controller, consecutive_failures, retry_in = ?retry_in, error,
            "do panicked"
        );
    } else {
        tracing::warn!(
            target: MANAGER,
            manager = %manager, controller = %controller, consecutive_failures, retry_in = ?retry_in, error,
            "do failed"
        );
    }
}

/// A manager controller's `stop` function panicked (call with no lock held).
pub(crate) fn manager_stop_panicked(manager: &str, controller: &str, error: &str) {
    tracing::error!(target: MANAGER, manager = %manager, controller = %controller, error, "stop panicked");
}

/// A controller's group function failed for a key; the key goes to group
/// None (once per key; call with no lock held).
pub(crate) fn group_failed<K: fmt::Debug>(controller: &str, key: &K, error: &str) {
    tracing::error!(
        target: CONTROLLER,
        controller = %controller, key = ?key, error,
        "group function failed; the key is in group None"
    );
}
