//! What a named queue records, under the queue's own lock: two tick
//! histograms, the start stamps of the keys being processed and a couple of
//! rare counters. No atomics, no extra lock, no call through a pointer per
//! item, and nothing written by an add but the stamp in its key's slot.
//!
//! Semantics are client-go's (`workqueue/metrics.go`):
//! * an *add* is an add that was not deduplicated: the key became ready, or
//!   was marked to run again after `done`; a delayed key counts when its
//!   due time makes it ready (client-go's delaying queue adds it then);
//! * *depth* is the number of keys waiting to be handed out: ready ones and
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
    pub(crate) depth: usize,
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

    /// `depth` is the number of added keys not handed out yet: every add
    /// ends up handed out (counted by the queue-duration histogram),
    /// dropped, or still waiting, so that is also how adds are counted.
    pub(crate) fn snapshot(&self, depth: usize) -> Option<QueueSnapshot> {
        let m = self.0.as_deref()?;
        let now = ticks::now();
        let (mut total, mut longest) = (0u128, 0u64);
        for &start in m.hot.starts.iter().filter(|&&s| s & FREE == 0) {
            let age = ticks::since(start, now);
            total += u128::from(age);
            longest = longest.max(age);
        }
        Some(QueueSnapshot {
            depth,
            adds: m.hot.queue_duration.count() + depth as u64 + m.discarded,
            retries: m.retries,
            queue_duration: m.hot.queue_duration.snapshot(&m.bounds),
            work_duration: m.hot.work_duration.snapshot(&m.bounds),
            unfinished_seconds: ticks::to_seconds(total),
            longest_seconds: ticks::to_seconds(u128::from(longest)),
        })
    }
}

impl QueueSnapshot {
    /// Adds this queue's samples, labelled `name`.
    pub(crate) fn collect(self, name: &str, out: &mut MetricFamilies) {
        let labels = [("name", name)];
        out.gauge("workqueue_depth", "Current depth of workqueue", &labels, self.depth as f64);
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
