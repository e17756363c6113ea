//! What a named queue records, under the queue's own lock: plain counters,
//! two tick histograms and the start stamps of the keys being processed.
//! No atomics, no extra lock, no call through a pointer per item.
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

use crate::observe::metrics::histogram::{TickHistogram, WORKQUEUE_BUCKETS, WORKQUEUE_N};
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

pub(crate) struct QueueMetrics {
    adds: u64,
    retries: u64,
    queue_duration: TickHistogram<WORKQUEUE_N>,
    work_duration: TickHistogram<WORKQUEUE_N>,
    /// Start stamps of the keys being processed, indexed by the `run` the
    /// key's slot keeps; a free entry holds `NOT_A_STAMP`. Its length is the
    /// most keys ever processed at once, so a scrape is O(workers).
    starts: Vec<u64>,
    free: Vec<u32>,
}

/// A named queue's values at one moment.
pub(crate) struct QueueSnapshot {
    pub(crate) depth: usize,
    pub(crate) adds: u64,
    pub(crate) retries: u64,
    pub(crate) queue_duration: crate::observe::metrics::histogram::HistogramSnapshot,
    pub(crate) work_duration: crate::observe::metrics::histogram::HistogramSnapshot,
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
            adds: 0,
            retries: 0,
            queue_duration: TickHistogram::new(&WORKQUEUE_BUCKETS),
            work_duration: TickHistogram::new(&WORKQUEUE_BUCKETS),
            starts: Vec::new(),
            free: Vec::new(),
        })))
    }

    /// A key was added (not deduplicated); returns its add stamp (0 when not
    /// recording).
    #[inline]
    pub(crate) fn on_add(&mut self, now: &mut Now) -> u64 {
        match self.0.as_deref_mut() {
            Some(m) => {
                m.adds += 1;
                now.get()
            }
            None => 0,
        }
    }

    /// A key added at `added` is handed out; returns the index of its start
    /// stamp (0 when not recording).
    #[inline]
    pub(crate) fn on_get(&mut self, added: u64, now: &mut Now) -> u32 {
        let Some(m) = self.0.as_deref_mut() else {
            return 0;
        };
        let now = now.get();
        m.queue_duration.observe(ticks::since(added, now));
        match m.free.pop() {
            Some(run) => {
                m.starts[run as usize] = now;
                run
            }
            None => {
                m.starts.push(now);
                (m.starts.len() - 1) as u32
            }
        }
    }

    /// The key whose start stamp is at `run` is done.
    #[inline]
    pub(crate) fn on_done(&mut self, run: u32, now: &mut Now) {
        let Some(m) = self.0.as_deref_mut() else {
            return;
        };
        let start = std::mem::replace(&mut m.starts[run as usize], ticks::NOT_A_STAMP);
        m.work_duration.observe(ticks::since(start, now.get()));
        m.free.push(run);
    }

    #[inline]
    pub(crate) fn on_retry(&mut self) {
        if let Some(m) = self.0.as_deref_mut() {
            m.retries += 1;
        }
    }

    #[cfg(test)]
    pub(crate) fn starts_len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.starts.len())
    }

    pub(crate) fn snapshot(&self, depth: usize) -> Option<QueueSnapshot> {
        let m = self.0.as_deref()?;
        let now = ticks::now();
        let (mut total, mut longest) = (0u128, 0u64);
        for &start in m.starts.iter().filter(|&&s| s != ticks::NOT_A_STAMP) {
            let age = ticks::since(start, now);
            total += u128::from(age);
            longest = longest.max(age);
        }
        Some(QueueSnapshot {
            depth,
            adds: m.adds,
            retries: m.retries,
            queue_duration: m.queue_duration.snapshot(),
            work_duration: m.work_duration.snapshot(),
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
