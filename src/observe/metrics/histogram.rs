//! Fixed-bucket histograms counted in raw clock ticks.
//!
//! Bucket bounds are converted from seconds to ticks once, so an
//! observation is a subtraction, a branch-free count of the bounds below the
//! value and two additions: no float conversion on the hot path. The last
//! bound is `u64::MAX` (the `+Inf` bucket), so every value has a bucket.
//!
//! [`TickHistogram`] is plain integers, for data already under a lock (the
//! queue's). [`WorkerHistogram`] is atomics with a single writer (one worker
//! thread) and any number of readers (scrapes).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::ticks;

/// client-go's workqueue buckets, `ExponentialBuckets(10e-9, 10, 10)`: 10 ns
/// to 10 s, computed as Go does (repeated multiplication), so the `le`
/// labels are the same floats.
pub(crate) static WORKQUEUE_BUCKETS: [f64; 10] = exponential(10e-9, 10.0);

/// controller-runtime's `reconcile_time_seconds` buckets.
pub(crate) static RECONCILE_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5,
    1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
];

/// Number of buckets (finite ones plus `+Inf`) of the two histogram kinds.
pub(crate) const WORKQUEUE_N: usize = WORKQUEUE_BUCKETS.len() + 1;
pub(crate) const RECONCILE_N: usize = RECONCILE_BUCKETS.len() + 1;

const fn exponential<const N: usize>(start: f64, factor: f64) -> [f64; N] {
    let mut out = [0.0; N];
    let mut value = start;
    let mut i = 0;
    while i < N {
        out[i] = value;
        value *= factor;
        i += 1;
    }
    out
}

/// `seconds` (N - 1 finite bounds) as ticks, plus the `+Inf` bound.
fn tick_bounds<const N: usize>(seconds: &[f64]) -> [u64; N] {
    assert_eq!(seconds.len() + 1, N);
    let mut bounds = [u64::MAX; N];
    for (bound, &s) in bounds.iter_mut().zip(seconds) {
        *bound = ticks::from_seconds(s);
    }
    bounds
}

/// The bucket of `value`: the first bound not below it (`le` semantics: a
/// value equal to a bound belongs to that bound's bucket). A linear scan
/// from the smallest bound: durations cluster, so the exit branch predicts
/// well, and it beat a branch-free count in the queue's profile.
#[inline(always)]
fn bucket<const N: usize>(bounds: &[u64; N], value: u64) -> usize {
    bounds.iter().position(|&b| value <= b).unwrap_or(N - 1)
}

/// A histogram's values at one moment, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    /// The finite upper bounds, ascending.
    pub(crate) bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds`,
    /// the last being `+Inf`.
    pub(crate) counts: Vec<u64>,
    pub(crate) sum: f64,
}

impl HistogramSnapshot {
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s observations (same bounds) to this one.
    pub(crate) fn merge(&mut self, other: &HistogramSnapshot) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum += other.sum;
    }
}

/// Bucket bounds in ticks: read-only once made, so they can sit apart
/// from the counts (which move between cores with the lock that guards
/// them) and be shared by several histograms.
pub(crate) struct TickBounds<const N: usize> {
    ticks: [u64; N],
    seconds: &'static [f64],
}

impl<const N: usize> TickBounds<N> {
    pub(crate) fn new(seconds: &'static [f64]) -> Self {
        Self { ticks: tick_bounds(seconds), seconds }
    }
}

/// A histogram's counts in plain integers, for use under a lock; its
/// bounds are a [`TickBounds`] kept elsewhere.
pub(crate) struct TickCounts<const N: usize> {
    counts: [u64; N],
    sum: u128,
}

impl<const N: usize> TickCounts<N> {
    pub(crate) fn new() -> Self {
        Self { counts: [0; N], sum: 0 }
    }

    #[inline(always)]
    pub(crate) fn observe(&mut self, bounds: &TickBounds<N>, ticks: u64) {
        self.counts[bucket(&bounds.ticks, ticks)] += 1;
        self.sum += u128::from(ticks);
    }

    /// Number of observations.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub(crate) fn snapshot(&self, bounds: &TickBounds<N>) -> HistogramSnapshot {
        HistogramSnapshot { bounds: bounds.seconds, counts: self.counts.to_vec(), sum: ticks::to_seconds(self.sum) }
    }
}

/// A histogram one thread writes and any thread reads.
pub(crate) struct WorkerHistogram<const N: usize> {
    bounds: [u64; N],
    counts: [AtomicU64; N],
    /// Ticks, wrapping (after centuries of cumulative time at GHz rates).
    sum: AtomicU64,
    seconds: &'static [f64],
}

impl<const N: usize> WorkerHistogram<N> {
    pub(crate) fn new(seconds: &'static [f64]) -> Self {
        Self { bounds: tick_bounds(seconds), counts: [const { AtomicU64::new(0) }; N], sum: AtomicU64::new(0), seconds }
    }

    /// Records `ticks`. Only one thread may call this (a load and a store,
    /// not a read-modify-write: no lock prefix, no contention).
    #[inline]
    pub(crate) fn observe_single_writer(&self, ticks: u64) {
        let count = &self.counts[bucket(&self.bounds, ticks)];
        count.store(count.load(Relaxed) + 1, Relaxed);
        self.sum.store(self.sum.load(Relaxed).wrapping_add(ticks), Relaxed);
    }

    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            bounds: self.seconds,
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum: ticks::to_seconds(u128::from(self.sum.load(Relaxed))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_client_go_and_controller_runtime_lists() {
        // Go's ExponentialBuckets(10e-9, 10, 10) accumulates rounding the
        // same way: 1e-05 and 1e-04 come out one ulp low.
        let expected = [1e-8, 1e-7, 1e-6, 9.999999999999999e-6, 9.999999999999999e-5, 0.001, 0.01, 0.1, 1.0, 10.0];
        assert_eq!(WORKQUEUE_BUCKETS, expected);
        assert_eq!(RECONCILE_BUCKETS.len(), 40);
        assert!(RECONCILE_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn values_land_in_le_buckets() {
        let bounds = TickBounds::<WORKQUEUE_N>::new(&WORKQUEUE_BUCKETS);
        let mut h = TickCounts::new();
        h.observe(&bounds, 0);
        h.observe(&bounds, ticks::from_seconds(0.5)); // <= 1 s
        h.observe(&bounds, ticks::from_seconds(1000.0)); // +Inf
        h.observe(&bounds, u64::MAX);
        assert_eq!(h.count(), 4);
        let s = h.snapshot(&bounds);
        assert_eq!(s.count(), 4);
        assert_eq!(s.counts[0], 1);
        assert_eq!(s.counts[8], 1, "0.5 s is in the le=1 bucket");
        assert_eq!(s.counts[10], 2);
        let w = WorkerHistogram::<RECONCILE_N>::new(&RECONCILE_BUCKETS);
        w.observe_single_writer(ticks::from_seconds(0.007));
        assert_eq!(w.snapshot().counts[1], 1, "7 ms is in the le=0.01 bucket");
        assert!((w.snapshot().sum - 0.007).abs() < 1e-6);
    }
}
