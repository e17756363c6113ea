//! Every span and log event the engine emits, in one place.
//!
//! Targets are fixed names, not module paths, so they survive refactoring
//! and map to stable Python logger names (`reconq.controller`,
//! `reconq.manager`): [`CONTROLLER`] for the reconcile loop, its watchdog,
//! triggers and watches; [`MANAGER`] for named periodic controllers;
//! `reconq::cache` for caches and their sources.
//!
//! Levels follow controller-runtime, which logs `Reconciler error` at error
//! level for every failed reconcile: a failure or panic is an ERROR, a
//! failure that asked for a fixed retry delay (`retry_after`), a failed
//! manager `do`, a hanging reconcile and a drain deadline are WARNs; a key
//! failing again with the same error is a WARN or a DEBUG (see
//! [`failure_loudness`]). Nothing is logged on the success path, and
//! nothing per reconcile should be at DEBUG or above: in the Python
//! bindings every such record takes the GIL to ask `logging` whether it is
//! wanted (`crate::python::logs`; TRACE is filtered out before).
//!
//! Log lines stay bounded whatever the input: keys show at most
//! [`KEY_CHARS`] characters of their `Debug` form ([`Short`]), lists at most
//! [`LIST_ITEMS`] elements ([`Few`]), and a key failing the same way again
//! and again is logged in full only on its first failure
//! ([`failure_loudness`]); the counters in `stats()` and the metrics still
//! count every failure.
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

#[cfg(feature = "etcd")]
mod replicas;
#[cfg(feature = "etcd")]
pub(crate) use replicas::*;

/// The target of the reconcile loop's spans and events.
pub(crate) const CONTROLLER: &str = "reconq::controller";
/// The target of named periodic controllers' spans and events.
pub(crate) const MANAGER: &str = "reconq::manager";

/// The most characters of a key's `Debug` form a log line shows: a 100 MiB
/// key must not make a 100 MiB line.
pub(crate) const KEY_CHARS: usize = 300;

/// The most elements of a list (keys, partitions) a log line names.
pub(crate) const LIST_ITEMS: usize = 20;

/// What ends a value cut at [`KEY_CHARS`].
const CUT_MARKER: &str = "…[truncated]";

/// A value's `Debug` form cut after [`KEY_CHARS`] bytes (at a character
/// boundary) with [`CUT_MARKER`]. Formatting stops at the cut, so a huge
/// key costs no more than a short one.
pub(crate) struct Short<'a, T: ?Sized>(pub(crate) &'a T);

impl<T: fmt::Debug + ?Sized> fmt::Debug for Short<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut capped = Capped { out: f, left: KEY_CHARS, cut: false };
        let written = fmt::write(&mut capped, format_args!("{:?}", self.0));
        if capped.cut { f.write_str(CUT_MARKER) } else { written }
    }
}

/// Whether `text` is a [`Short`] form that was cut (the Python bindings
/// then show it instead of the key's `repr`).
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn was_cut(text: &str) -> bool {
    text.ends_with(CUT_MARKER)
}

/// Passes text through until `left` bytes are used up, then stops the
/// formatting (with an error that [`Short`] turns into its marker).
struct Capped<'a, 'f> {
    out: &'a mut fmt::Formatter<'f>,
    left: usize,
    cut: bool,
}

impl fmt::Write for Capped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if s.len() <= self.left {
            self.left -= s.len();
            return self.out.write_str(s);
        }
        let mut end = self.left;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.out.write_str(&s[..end])?;
        self.left = 0;
        self.cut = true;
        Err(fmt::Error)
    }
}

/// A list's first [`LIST_ITEMS`] elements (each [`Short`]), then how many
/// more there are: `[1, 2, 3, … (61 more)]`.
pub(crate) struct Few<'a, C: ?Sized>(pub(crate) &'a C);

impl<'a, C, T> fmt::Debug for Few<'a, C>
where
    C: ?Sized,
    &'a C: IntoIterator<Item = &'a T>,
    <&'a C as IntoIterator>::IntoIter: ExactSizeIterator,
    T: fmt::Debug + 'a,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items = self.0.into_iter();
        let more = items.len().saturating_sub(LIST_ITEMS);
        let mut list = f.debug_list();
        list.entries(items.take(LIST_ITEMS).map(Short));
        if more > 0 {
            list.entry(&format_args!("… ({more} more)"));
        }
        list.finish()
    }
}

/// How loudly a failed reconcile is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loudness {
    /// The key's first failure since it last succeeded, or an error unlike
    /// its previous one: in full (ERROR, with the traceback in Python).
    Full,
    /// The same error again, on a failure count that is a power of two
    /// (the 2nd, 3rd, 5th, 9th, ... failure): a WARN without traceback, so
    /// a key stuck failing shows up with ever longer gaps.
    Again,
    /// The same error again otherwise: DEBUG.
    Quiet,
}

/// How to log the failure of a key on try `attempt` (0 = first) with
/// `error`, when its previous failure (since its last success) said
/// `previous`. A key retried every few milliseconds would otherwise log
/// (with a traceback, in Python) on every retry.
pub(crate) fn failure_loudness(attempt: u32, previous: Option<&str>, error: &str) -> Loudness {
    if previous != Some(error) {
        Loudness::Full
    } else if attempt.is_power_of_two() {
        Loudness::Again
    } else {
        Loudness::Quiet
    }
}

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
        tracing::info_span!(target: CONTROLLER, "reconcile", controller = %controller, key = ?Short(key), attempt)
    } else {
        tracing::Span::none()
    }
}

/// What follows a failed reconcile, as its log line says it (the
/// controller's `RetryPolicy`, without logs depending on the controller).
#[derive(Debug, Clone, Copy)]
pub(crate) enum NextTry {
    Backoff,
    After(Duration),
    Parked,
}

/// A reconcile returned an error or panicked (call with no lock held).
/// A repeat of the key's previous error is logged more quietly (see
/// [`failure_loudness`]).
pub(crate) fn reconcile_failed<K: fmt::Debug>(
    controller: &str,
    key: &K,
    attempt: u32,
    retry: NextTry,
    error: &str,
    panicked: bool,
    previous: Option<&str>,
) {
    match failure_loudness(attempt, previous, error) {
        Loudness::Full => {}
        Loudness::Again => {
            tracing::warn!(
                target: CONTROLLER,
                controller = %controller, key = ?Short(key), attempt, error,
                "reconcile failed again with the same error"
            );
            return;
        }
        Loudness::Quiet => {
            tracing::debug!(
                target: CONTROLLER,
                controller = %controller, key = ?Short(key), attempt, error,
                "reconcile failed again with the same error"
            );
            return;
        }
    }
    if panicked {
        tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?Short(key), attempt, error,
            "reconcile panicked; retrying with backoff"
        );
        return;
    }
    match retry {
        NextTry::Backoff => tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?Short(key), attempt, error,
            "reconcile failed; retrying with backoff"
        ),
        NextTry::After(delay) => tracing::warn!(
            target: CONTROLLER,
            controller = %controller, key = ?Short(key), attempt, error, retry_after = ?delay,
            "reconcile failed; retrying after a delay"
        ),
        NextTry::Parked => tracing::error!(
            target: CONTROLLER,
            controller = %controller, key = ?Short(key), attempt, error,
            "reconcile failed permanently; key parked"
        ),
    }
}

/// A reconcile has run longer than the hanging threshold (once per
/// reconcile; call with no lock held).
pub(crate) fn reconcile_hanging<K: fmt::Debug>(controller: &str, key: &K, running: Duration) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, key = ?Short(key), seconds = running.as_secs_f64(),
        "reconcile has been running for {:.1} s",
        running.as_secs_f64()
    );
}

/// A drain's deadline passed (call with no lock held).
pub(crate) fn drain_deadline_passed<K: fmt::Debug>(controller: &str, unfinished: &[K]) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, unfinished = ?Few(unfinished),
        "drain deadline passed; cancelled and detached the workers still running"
    );
}

/// A stop's wait for threads ended (its deadline, or its grace after the
/// workers) with these caches (stopped by it) still in their source,
/// which ignores its stop: left behind (call with no lock
/// held). Nothing is logged when there are none.
pub(crate) fn stop_left_caches(controller: &str, caches: &[String]) {
    if caches.is_empty() {
        return;
    }
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, caches = ?caches,
        "stop gave up waiting for caches still blocked in their source (it ignores its stop); left behind"
    );
}

/// A stop is still waiting for these reconciles to return (call with no
/// lock held).
pub(crate) fn stop_waiting<K: fmt::Debug>(controller: &str, running: &[K]) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, running = ?Few(running),
        "stop waiting for reconciles to return"
    );
}

/// A stop dropped keys without reconciling them (call with no lock held).
/// Nothing is logged when it dropped none.
pub(crate) fn stop_dropped<K: fmt::Debug>(controller: &str, dropped: &[K]) {
    if dropped.is_empty() {
        return;
    }
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, dropped = dropped.len(), keys = ?Few(dropped),
        "stop dropped keys waiting on a delay, a retry or the queue without reconciling them"
    );
}

/// At start, the stored parents of `keys` closed a cycle with parents set
/// before start, which won; the store forgets the stored ones (call with
/// no lock held). Nothing is logged when none were dropped.
pub(crate) fn stored_edges_dropped<K: fmt::Debug>(controller: &str, keys: &[K]) {
    if keys.is_empty() {
        return;
    }
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, keys = ?Few(keys),
        "stored dependencies dropped: with the dependencies set before start they would close a cycle"
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
    tracing::error!(target: CONTROLLER, controller = %controller, key = ?Short(key), error, "trigger panicked");
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
        controller = %controller, key = ?Short(key), error,
        "group function failed; the key is in group None"
    );
}

/// A controller's `partition_by` failed for a key (it panicked, raised,
/// or named no valid key); the key is partitioned by itself. Logged at the
/// 1st, 2nd, 4th, ... failure of the controller's function (`failures`
/// counts them all; call with no lock held).
pub(crate) fn partition_by_failed<K: fmt::Debug>(controller: &str, key: &K, error: &str, failures: u64) {
    tracing::error!(
        target: CONTROLLER,
        controller = %controller, key = ?Short(key), error, failures,
        "partition_by failed; the key is partitioned by itself"
    );
}

/// A watch of a sharded controller could not keep the tombstone of a
/// delete (its set is full, C1): a replica gaining the key's partition
/// later learns of the delete only through `resync`.
pub(crate) fn tombstones_full<K: fmt::Debug>(controller: &str, cache: &str, key: &K, bound: usize, overflow: u64) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, cache = %cache, key = ?Short(key), bound, overflow,
        "tombstones full: a delete of a key another replica owns is not kept for a later gain"
    );
}

/// A partition given up had more pending keys than one hand-over holds
/// (C2): `left_out` of them wait for their next enqueue (a cache's list at
/// the next owner's gain, `resync`).
#[cfg(feature = "etcd")]
pub(crate) fn handover_full(controller: &str, partition: u32, left_out: usize, bound: usize) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, partition, left_out, bound,
        "hand-over full: keys pending for a partition given up are not handed over"
    );
}

/// A hand-over read at a gain (C2) was not all readable: the keys before
/// the unreadable part were enqueued, `unread` bytes were not (another
/// program's keys, or a newer format).
#[cfg(feature = "etcd")]
pub(crate) fn handover_unreadable(controller: &str, enqueued: usize, unread: usize) {
    tracing::warn!(
        target: CONTROLLER,
        controller = %controller, enqueued, unread,
        "hand-over partly unreadable: keys of another shape were dropped"
    );
}

/// Target of caches' and sources' events.
const CACHE: &str = "reconq::cache";

/// A cache's source failed (a list or stream error, a refused
/// connection, a stalled stream); it retries after `retry_in`.
pub(crate) fn cache_failed(cache: &str, error: &str, expired: bool, retry_in: Duration) {
    tracing::warn!(
        target: CACHE, cache = %cache, error, expired, retry_in = ?retry_in,
        "cache source failed; retrying"
    );
}

/// A cache's position expired (etcd: compacted, or its history reset);
/// it relists now.
pub(crate) fn cache_expired(cache: &str, error: &str) {
    tracing::info!(target: CACHE, cache = %cache, error, "cache position expired; relisting");
}

/// A stored cache that keeps its objects restarted from its snapshot
/// and resumes its source's stream (E9).
pub(crate) fn cache_resumed(cache: &str, keys: usize) {
    tracing::info!(target: CACHE, cache = %cache, keys, "cache loaded from its store; resuming the source's stream");
}

/// A stored cache cannot resume from its snapshot (none kept, unreadable,
/// or the source refused its position): it lists.
pub(crate) fn cache_not_resumed(cache: &str, why: &str) {
    tracing::info!(target: CACHE, cache = %cache, why, "cache not resumed from its store; listing");
}

/// A stored cache stopped keeping its snapshot for this run (an object
/// or a position it cannot keep): its next restart relists.
pub(crate) fn cache_snapshot_dropped(cache: &str, why: &str) {
    tracing::info!(target: CACHE, cache = %cache, why, "cache keeps no snapshot; its next restart relists");
}

/// A cache's index function panicked: the key is left out of that index
/// (call with no lock held).
pub(crate) fn cache_index_failed<K: fmt::Debug>(cache: &str, index: &str, key: &K, error: &str) {
    tracing::error!(
        target: CACHE, cache = %cache, index, key = ?Short(key), error,
        "index function panicked; the key is left out of that index"
    );
}

/// A cache's subscriber panicked (call with no lock held).
pub(crate) fn cache_subscriber_panicked<K: fmt::Debug>(cache: &str, key: &K, error: &str) {
    tracing::error!(target: CACHE, cache = %cache, key = ?Short(key), error, "cache subscriber panicked");
}

/// A controller's `map` or `predicate` for a watched cache failed: the
/// changed key itself is enqueued (E6).
pub(crate) fn watch_handler_failed<K: fmt::Debug>(controller: &str, cache: &str, handler: &str, key: &K, error: &str) {
    tracing::error!(
        target: CONTROLLER, controller = %controller, cache = %cache, handler, key = ?Short(key), error,
        "watch_cache handler failed; the changed key is enqueued"
    );
}

/// A controller has waited `waited` for a cache it watched at start to
/// sync (E5): it hands out no key until then.
pub(crate) fn watch_not_synced(controller: &str, cache: &str, waited: Duration, last_error: Option<&str>) {
    tracing::error!(
        target: CONTROLLER, controller = %controller, cache = %cache, waited = ?waited,
        last_error = last_error.unwrap_or("none"),
        "cache not synced; the controller hands out no key until it is"
    );
}

/// A watch's resync thread could not be spawned: no resync for it.
pub(crate) fn watch_resync_unavailable(controller: &str, cache: &str, error: &str) {
    tracing::error!(
        target: CONTROLLER, controller = %controller, cache = %cache, error,
        "cannot spawn the resync thread of a watched cache; it will not resync"
    );
}

/// An etcd source skipped an item it could not read (a key that is not
/// UTF-8, a value its decode function refused).
#[cfg(feature = "etcd")]
pub(crate) fn source_skipped(source: &str, key: &str, why: &str) {
    tracing::warn!(target: CACHE, source = %source, key = ?Short(key), why, "source item skipped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_key_is_cut_at_a_character_boundary_with_a_marker() {
        let key = "é".repeat(10 * KEY_CHARS);
        let shown = format!("{:?}", Short(&key));
        assert!(was_cut(&shown), "{shown}");
        assert!(shown.len() <= KEY_CHARS + CUT_MARKER.len(), "{} bytes", shown.len());
        assert_eq!(format!("{:?}", Short(&"short")), "\"short\"");
        assert!(!was_cut(&format!("{:?}", Short(&"short"))));
    }

    #[test]
    fn a_long_list_names_its_first_items_and_counts_the_rest() {
        let partitions: std::collections::BTreeSet<u32> = (0..1024).collect();
        let shown = format!("{:?}", Few(&partitions));
        assert!(shown.starts_with("[0, 1, 2,") && shown.ends_with(", 19, … (1004 more)]"), "{shown}");
        assert_eq!(format!("{:?}", Few(&[1, 2][..])), "[1, 2]");
    }

    #[test]
    fn a_repeated_error_is_logged_in_full_once_then_at_powers_of_two() {
        let loudness: Vec<Loudness> =
            (0..9).map(|attempt| failure_loudness(attempt, (attempt > 0).then_some("down"), "down")).collect();
        use Loudness::*;
        assert_eq!(loudness, [Full, Again, Again, Quiet, Again, Quiet, Quiet, Quiet, Again]);
        assert_eq!(failure_loudness(5, Some("down"), "refused"), Full, "a new error is logged in full");
    }
}
