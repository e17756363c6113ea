//! What a named queue records, under the queue's own lock: two tick
//! histograms, the start stamps of the keys being processed and a couple of
//! rare counters. No atomics, no extra lock, no call through a pointer per
//! item, and nothing written by an add but the stamp in its key's slot.
//!
//! Semantics are client-go's (`workqueue/metrics.go`):
//! * an *add* is an add that was not deduplicated: the key became ready, or
//!   was marked to run again after `done`; a delayed key counts when its
//!   due time makes it ready (client-go's delaying queue adds it then);
//! * *depth* is the number of keys waiting to be handed out (per priority,
//!   as controller-runtime's priority queue counts it): ready ones and
//!   ones marked to run again after `done` (client-go counts both);
//! * *queue duration* is from that add to the `get` that hands the key out;
//!   *work duration* from that `get` to `done`;
//! * *unfinished work* and *longest running* are computed at scrape time
//!   from the start stamps of the keys being processed;
//! * a *retry* is every `add_after` / `add_rate_limited` / `add_at` call
//!   while the queue is not shut down, as client-go's `AddAfter` counts.
//!
//! The stamps are raw clock ticks ([`ticks`]); a queue records only if it has
//! a name, and an unnamed queue never reads the clock for metrics.

use crossbeam_utils::CachePadded;

use super::ready::Priority;
use crate::observe::metrics::histogram::{HistogramSnapshot, TickBounds, TickCounts, WORKQUEUE_BUCKETS, WORKQUEUE_N};
use crate::observe::metrics::{MetricFamilies, ticks};

/// One clock reading shared by everything one locked operation records
/// (`done_and_get` stamps the `done` and the next `get` alike). Taken
/// before locking where the operation will most likely record (see
/// `Shared::stamp`), else on first use, so operations that record nothing
/// never read the clock.
#[derive(Default)]
pub(crate) struct Now {
    value: u64,
    used: bool,
}

impl Now {
    /// A reading to be taken on first use.
    pub(crate) fn new() -> Self {
        Self { value: 0, used: false }
    }

    /// A reading taken now.
    #[inline]
    pub(crate) fn read() -> Self {
        Self { value: ticks::now().max(1), used: false }
    }

    /// A reading taken by the caller.
    pub(crate) fn at(stamp: u64) -> Self {
        Self { value: stamp.max(1), used: false }
    }

    /// The reading, taken now if it was not yet.
    pub(crate) fn reading(&mut self) -> u64 {
        let used = self.used;
        let value = self.get();
        self.used = used;
        value
    }

    /// Whether anything recorded this reading.
    pub(crate) fn used(&self) -> bool {
        self.used
    }

    #[inline]
    fn get(&mut self) -> u64 {
        if self.value == 0 {
            self.value = ticks::now().max(1);
        }
        self.used = true;
        self.value
    }
}

/// A queue's metrics if it is named, nothing otherwise.
pub(crate) struct Recorder(Option<Box<QueueMetrics>>);

/// Laid out for the lock's sake: whatever a `get` or `done` writes sits in
/// one padded block (`hot`, a few cache lines that move between cores with
/// the lock, like the rest of the queue's state), apart from the read-only
/// bounds and from anything else. An add writes nothing here at all: the
/// add count is derived (see [`Recorder::snapshot`]); the add stamp goes in
/// the key's slot, which the add writes anyway.
pub(crate) struct QueueMetrics {
    bounds: TickBounds<WORKQUEUE_N>,
    hot: CachePadded<Hot>,
    /// Calls of the `add_after` family (rare next to gets).
    retries: u64,
    /// Adds whose keys were dropped without being handed out
    /// (`shut_down_now`).
    discarded: u64,
}

struct Hot {
    queue_duration: TickCounts<WORKQUEUE_N>,
    work_duration: TickCounts<WORKQUEUE_N>,
    /// Start stamps of the keys being processed, indexed by the `run` their
    /// slot keeps. A free entry holds `FREE | next free index`: the free
    /// list lives in the slab itself. Its length is the most keys ever
    /// processed at once, so a scrape is O(workers).
    starts: Vec<u64>,
    /// First free entry of `starts`, or `NO_RUN`.
    free: u32,
}

/// Tags a free `starts` entry (stamps never have the top bit set).
const FREE: u64 = 1 << 63;
const NO_RUN: u32 = u32::MAX;

/// A named queue's values at one moment.
pub(crate) struct QueueSnapshot {
    /// Keys waiting per priority, highest first (no priority with none).
    pub(crate) depth: Vec<(Priority, usize)>,
    pub(crate) adds: u64,
    pub(crate) retries: u64,
    pub(crate) queue_duration: HistogramSnapshot,
    pub(crate) work_duration: HistogramSnapshot,
    pub(crate) unfinished_seconds: f64,
    pub(crate) longest_seconds: f64,
}

impl Recorder {
    pub(crate) fn off() -> Self {
        Self(None)
    }

    pub(crate) fn on() -> Self {
        ticks::init();
        Self(Some(Box::new(QueueMetrics {
            bounds: TickBounds::new(&WORKQUEUE_BUCKETS),
            hot: CachePadded::new(Hot {
                queue_duration: TickCounts::new(),
                work_duration: TickCounts::new(),
                starts: Vec::new(),
                free: NO_RUN,
            }),
            retries: 0,
            discarded: 0,
        })))
    }

    /// A key was added (not deduplicated); returns its add stamp (0 when not
    /// recording).
    #[inline]
    pub(crate) fn on_add(&self, now: &mut Now) -> u64 {
        if self.0.is_some() { now.get() } else { 0 }
    }

    /// A key added at `added` is handed out; returns the index of its start
    /// stamp (0 when not recording).
    #[inline]
    pub(crate) fn on_get(&mut self, added: u64, now: &mut Now) -> u32 {
        let Some(m) = self.0.as_deref_mut() else {
            return 0;
        };
        let now = now.get();
        let hot = &mut *m.hot;
        hot.queue_duration.observe(&m.bounds, ticks::since(added, now));
        match hot.free {
            NO_RUN => {
                hot.starts.push(now);
                (hot.starts.len() - 1) as u32
            }
            run => {
                let entry = &mut hot.starts[run as usize];
                hot.free = *entry as u32;
                *entry = now;
                run
            }
        }
    }

    /// The key whose start stamp is at `run` is done.
    #[inline]
    pub(crate) fn on_done(&mut self, run: u32, now: &mut Now) {
        let Some(m) = self.0.as_deref_mut() else {
            return;
        };
        let hot = &mut *m.hot;
        let start = std::mem::replace(&mut hot.starts[run as usize], FREE | u64::from(hot.free));
        hot.free = run;
        hot.work_duration.observe(&m.bounds, ticks::since(start, now.get()));
    }

    #[inline]
    pub(crate) fn on_retry(&mut self) {
        if let Some(m) = self.0.as_deref_mut() {
            m.retries += 1;
        }
    }

    /// `keys` added keys were dropped without being handed out.
    pub(crate) fn on_discard(&mut self, keys: usize) {
        if let Some(m) = self.0.as_deref_mut() {
            m.discarded += keys as u64;
        }
    }

    #[cfg(test)]
    pub(crate) fn starts_len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.hot.starts.len())
    }

    /// `depth` gives the added keys not handed out yet, per priority: every
    /// add ends up handed out (counted by the queue-duration histogram),
    /// dropped, or still waiting, so that is also how adds are counted.
    pub(crate) fn snapshot(&self, depth: impl FnOnce() -> Vec<(Priority, usize)>) -> Option<QueueSnapshot> {
        let m = self.0.as_deref()?;
        let depth = depth();
        let waiting: usize = depth.iter().map(|(_, keys)| keys).sum();
        let now = ticks::now();
        let (mut total, mut longest) = (0u128, 0u64);
        for &start in m.hot.starts.iter().filter(|&&s| s & FREE == 0) {
            let age = ticks::since(start, now);
            total += u128::from(age);
            longest = longest.max(age);
        }
        Some(QueueSnapshot {
            adds: m.hot.queue_duration.count() + waiting as u64 + m.discarded,
            depth,
            retries: m.retries,
            queue_duration: m.hot.queue_duration.snapshot(&m.bounds),
            work_duration: m.hot.work_duration.snapshot(&m.bounds),
            unfinished_seconds: ticks::to_seconds(total),
            longest_seconds: ticks::to_seconds(u128::from(longest)),
        })
    }
}

/// At most this many `priority` series per queue, as controller-runtime
/// (`maxRecommendedUniquePriorities`): a program that uses more puts its
/// whole depth in one series labelled [`PRIORITIES_EXCEEDED`].
const MAX_PRIORITY_SERIES: usize = 25;
const PRIORITIES_EXCEEDED: &str = "exceeded_cardinality_limit";

/// The `(priority label, keys)` series of `workqueue_depth`: always one for
/// priority 0 (so a queue's depth is there from its creation, as before any
/// priority is used), one more for each other priority with keys waiting
/// now. A priority whose keys are all gone leaves the exposition (its
/// series goes stale), where controller-runtime keeps it at 0.
fn depth_series(depth: &[(Priority, usize)]) -> Vec<(String, usize)> {
    let mut series: Vec<(String, usize)> = depth.iter().map(|(prio, keys)| (prio.to_string(), *keys)).collect();
    if !depth.iter().any(|(prio, _)| *prio == 0) {
        let at = depth.iter().position(|(prio, _)| *prio < 0).unwrap_or(depth.len());
        series.insert(at, ("0".to_string(), 0));
    }
    if series.len() > MAX_PRIORITY_SERIES {
        let total = series.iter().map(|(_, keys)| keys).sum();
        series = vec![(PRIORITIES_EXCEEDED.to_string(), total)];
    }
    series
}

impl QueueSnapshot {
    /// Adds this queue's samples, labelled as controller-runtime labels a
    /// queue's: `name` and `controller` both the queue's name (a
    /// controller's queue is named after it), and `priority` on the depth.
    pub(crate) fn collect(self, name: &str, out: &mut MetricFamilies) {
        let labels = [("name", name), ("controller", name)];
        for (priority, keys) in depth_series(&self.depth) {
            let labels = [("name", name), ("controller", name), ("priority", &priority)];
            out.gauge("workqueue_depth", "Current depth of workqueue by workqueue and priority", &labels, keys as f64);
        }
        out.counter("workqueue_adds_total", "Total number of adds handled by workqueue", &labels, self.adds as f64);
        out.histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            &labels,
            self.queue_duration,
        );
        out.histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            &labels,
            self.work_duration,
        );
        out.gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. \
             Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate \
             at which this increases.",
            &labels,
            self.unfinished_seconds,
        );
        out.gauge_max(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            &labels,
            self.longest_seconds,
        );
        out.counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            &labels,
            self.retries as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(series: &[(String, usize)]) -> Vec<(&str, usize)> {
        series.iter().map(|(label, keys)| (label.as_str(), *keys)).collect()
    }

    #[test]
    fn depth_has_a_priority_0_series_and_one_per_priority_waiting() {
        assert_eq!(labels(&depth_series(&[])), [("0", 0)]);
        assert_eq!(labels(&depth_series(&[(3, 2), (-1, 4)])), [("3", 2), ("0", 0), ("-1", 4)]);
        assert_eq!(labels(&depth_series(&[(0, 5)])), [("0", 5)]);
    }

    #[test]
    fn too_many_priorities_share_one_series() {
        let depth: Vec<(Priority, usize)> = (1..MAX_PRIORITY_SERIES as Priority).rev().map(|p| (p, 1)).collect();
        assert_eq!(depth_series(&depth).len(), MAX_PRIORITY_SERIES, "24 priorities and 0");
        let mut more = depth.clone();
        more.push((0, 1));
        more.insert(0, (100, 1));
        assert_eq!(labels(&depth_series(&more)), [(PRIORITIES_EXCEEDED, MAX_PRIORITY_SERIES + 1)]);
    }
}
