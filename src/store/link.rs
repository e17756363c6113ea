//! The seam between a controller and its store: the controller marks the
//! keys it changes and answers "what is this key now?"; the store restores
//! at start, flushes and reports. Compiled without the `store` feature too,
//! so the controller reaches a store only through these traits (without
//! the feature it never has one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::StoreError;
use super::cache_snapshot::CacheSnapshot;
use super::key_rows::KeyRows;
use crate::observe::reports::StoreStats;

/// What a store keeps of one key, in the controller's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyView {
    /// `Some`: waiting for this due time (queue clock); `None`: ready.
    pub(crate) due: Option<Instant>,
    /// Parked with this error (then `due` is ignored).
    pub(crate) parked: Option<String>,
    pub(crate) failures: u32,
    pub(crate) priority: i32,
}

/// The controller's side of the seam.
#[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
pub(crate) trait KeySource<K>: Send + Sync {
    /// The view of each key, `None` for a key with nothing to keep.
    fn views(&self, keys: &[K], out: &mut Vec<Option<KeyView>>);
    /// The dependents D2 enqueued since the last call, each with its view,
    /// taken and sampled at one instant: asked after [`views`](Self::views),
    /// so that no flush writes a finished key without the dependents it
    /// enqueued (see `WorkQueue::take_dependents_views`).
    fn dependents_views(&self, out: &mut Vec<(K, Option<KeyView>)>);
    /// Now on the queue's clock (to turn due instants into wall time).
    fn now(&self) -> Instant;
    /// `key`'s parents now, in the order set (guarantees §14).
    fn parents(&self, key: &K) -> Vec<K>;
}

/// What a controller holds of its store, whatever its key type.
pub(crate) trait StoreLink<K>: Flush {
    /// `key` changed: write it at the next flush.
    fn mark(&self, key: &K);
    /// `key`'s parents were set: write them at the next flush.
    fn mark_edges(&self, key: &K);
    /// Hands every stored key to `restore`, due times on the queue clock
    /// at `now`.
    fn restore(&self, now: Instant, restore: &mut dyn FnMut(K, KeyView));
    /// Every stored key's parents (once, at start; call with no engine
    /// lock held: rows of another key shape are logged and skipped).
    fn restore_edges(&self) -> Vec<(K, Vec<K>)>;
    /// The flusher thread's body: returns after the final flush at stop
    /// (after [`workers_done`](Self::workers_done)), releasing the claim.
    /// A failed final flush stays in `stats().error`, its keys in
    /// `pending`.
    fn run_flusher(&self, source: &dyn KeySource<K>);
    /// Wakes the flusher for a stop.
    fn wake(&self);
    /// No worker can change a key any more (the controller stopped): the
    /// flusher may do its final flush.
    fn workers_done(&self);
    fn stats(&self) -> StoreStats;
    /// The rows kept at the last run for `cache` (E9; none if none), in
    /// key order, handed out once, to the watch of that cache.
    fn take_kept(&self, cache: &str) -> KeyRows;
    /// A watched cache keeps `snapshot` of its own contents (E9, to resume
    /// after a restart): every write takes its marks after the cache rows.
    fn keep_snapshot(&self, snapshot: &Arc<CacheSnapshot>);
    /// The controller was told of `change` to `key` (encoded) of `cache`,
    /// then at `position` (encoded): kept at the next flush, with the
    /// controller's pending keys. Call it after the enqueues the change
    /// caused (see `cache_rows`).
    fn mark_cache(&self, cache: &Arc<str>, key: Vec<u8>, change: KeptChange, position: Option<Vec<u8>>);
    /// Runs `then` on the flusher once a write took every change marked
    /// before this call, asking for that write at once (no tick). With
    /// `created`, a version-less row of that key of that cache is marked
    /// first: the trace of a create, which must be on disk before the
    /// create's keys are handed out (E9: otherwise a crash loses the only
    /// record that would deliver the key's delete). Version-less, it may
    /// reach the disk before the pending keys of its change: a restart
    /// counts such a key as changed (or deleted), never as handled. `then`
    /// runs even if the write failed (the failure is logged and in the
    /// stats: a failing store does not stop reconciles), and is dropped if
    /// the controller stopped first.
    fn after_write(&self, created: Option<(&Arc<str>, Vec<u8>)>, then: AfterWrite);
    /// Whether an [`after_write`](Self::after_write) has not run yet: a
    /// watched cache's change held until its trace is written is work the
    /// controller has (`wait_idle` waits for it).
    fn holds_changes(&self) -> bool;
}

/// What waits for a write ([`StoreLink::after_write`]).
pub(crate) type AfterWrite = Box<dyn FnOnce() + Send>;

/// One change to a kept key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeptChange {
    /// The controller was told of this version (`None`: none to keep).
    Put(Option<Vec<u8>>),
    /// The controller was told of the key's delete.
    Delete,
}

/// `flush()` of whatever a store's flusher writes, whatever its key type:
/// a controller's keys today; a cache whose rows that flusher writes too
/// (issue 25) can hand out tickets through the same trait.
pub(crate) trait Flush: Send + Sync {
    /// Asks for a write of every change marked before this call and wakes
    /// the flusher; returns the ticket to wait for with
    /// [`flushed`](Self::flushed). After the final flush, the ticket is
    /// answered at once with its outcome (nothing changes any more).
    fn ask_flush(&self) -> u64;
    /// Blocks until the write that covers `ticket` committed or failed
    /// (`Some`), or `timeout` passed (`None`; `None` waits without a limit).
    fn flushed(&self, ticket: u64, timeout: Option<Duration>) -> Option<Result<(), StoreError>>;
}

/// A flush asked of one or more flushers (a controller's, or those of the
/// controllers a cache feeds), to wait for in slices (Python checks for
/// signals between them).
pub(crate) struct PendingFlush {
    /// Empty: no store, nothing to wait for.
    tickets: Vec<(Arc<dyn Flush>, u64)>,
}

impl PendingFlush {
    /// Asks each of `flushers` for a write of every change marked before
    /// this call.
    pub(crate) fn ask(flushers: impl IntoIterator<Item = Arc<dyn Flush>>) -> Self {
        Self {
            tickets: flushers
                .into_iter()
                .map(|flush| {
                    let ticket = flush.ask_flush();
                    (flush, ticket)
                })
                .collect(),
        }
    }

    /// The writes' outcome once every one is known (the first error, if
    /// any), `None` if `timeout` passed first (`None` waits without a
    /// limit).
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<(), StoreError>> {
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let mut outcome = Ok(());
        for (flush, ticket) in &self.tickets {
            let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            let written = flush.flushed(*ticket, left)?;
            if outcome.is_ok() {
                outcome = written;
            }
        }
        Some(outcome)
    }
}
