//! Limiters that remember each key's failures.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::RateLimiter;
use super::failure_counts::FailureCounts;
use crate::clock::duration_from_nanos;

/// `base * 2^n`, capped at `max`, where `n` is the key's failures so far
/// (client-go's `ItemExponentialFailureRateLimiter`).
///
/// ```
/// use reconq::{ExponentialBackoff, RateLimiter};
/// use std::time::Duration;
///
/// let limiter = ExponentialBackoff::new(Duration::from_millis(1), Duration::from_secs(1));
/// let waits: Vec<_> = (0..4).map(|_| limiter.when(&"key")).collect();
/// assert_eq!(waits, [1, 2, 4, 8].map(Duration::from_millis));
/// ```
pub struct ExponentialBackoff<K> {
    base: Duration,
    max: Duration,
    failures: FailureCounts<K>,
}

impl<K: Eq + Hash + Clone> ExponentialBackoff<K> {
    /// Waits `base` for a key's first try, doubling with each failure
    /// until [`forget`](RateLimiter::forget), at most `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max, failures: FailureCounts::new() }
    }
}

/// `base * 2^exponent` without overflow: anything past `max` is `max`.
fn backoff(base: Duration, exponent: u32, max: Duration) -> Duration {
    if base.is_zero() {
        return Duration::ZERO;
    }
    if exponent < 128
        && let Some(nanos) = base.as_nanos().checked_mul(1 << exponent)
        && nanos < max.as_nanos()
    {
        return duration_from_nanos(nanos);
    }
    max
}

impl<K: Eq + Hash + Clone + Send> RateLimiter<K> for ExponentialBackoff<K> {
    fn when(&self, key: &K) -> Duration {
        backoff(self.base, self.failures.record(key), self.max)
    }
    fn forget(&self, key: &K) {
        self.failures.forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.get(key)
    }
}

impl<K> fmt::Debug for ExponentialBackoff<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialBackoff").field("base", &self.base).field("max", &self.max).finish()
    }
}

/// `fast` for a key's first `max_fast_attempts` tries, then `slow`
/// (client-go's `ItemFastSlowRateLimiter`).
pub struct FastSlow<K> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    failures: FailureCounts<K>,
}

impl<K: Eq + Hash + Clone> FastSlow<K> {
    /// Waits `fast` for a key's first `max_fast_attempts` tries, `slow` after.
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self { fast, slow, max_fast_attempts, failures: FailureCounts::new() }
    }
}

impl<K: Eq + Hash + Clone + Send> RateLimiter<K> for FastSlow<K> {
    fn when(&self, key: &K) -> Duration {
        if self.failures.record(key) < self.max_fast_attempts { self.fast } else { self.slow }
    }
    fn forget(&self, key: &K) {
        self.failures.forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.get(key)
    }
}

impl<K> fmt::Debug for FastSlow<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlow")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_saturates_without_overflow() {
        let max = Duration::from_secs(1000);
        assert_eq!(backoff(Duration::from_millis(5), 0, max), Duration::from_millis(5));
        assert_eq!(backoff(Duration::from_millis(5), 17, max), Duration::from_millis(655_360));
        assert_eq!(backoff(Duration::from_millis(5), 18, max), max);
        assert_eq!(backoff(Duration::from_millis(5), u32::MAX, max), max);
        assert_eq!(backoff(Duration::MAX, 3, Duration::MAX), Duration::MAX);
        assert_eq!(backoff(Duration::ZERO, 300, max), Duration::ZERO);
    }
}
