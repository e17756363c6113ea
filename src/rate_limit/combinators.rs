//! Limiters built from other limiters.

use std::time::Duration;

use super::RateLimiter;

/// The strictest of several limiters: `when` asks every member (so each
/// counts the try) and returns the longest wait (client-go's
/// `MaxOfRateLimiter`).
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> MaxOf<K> {
    /// The longest wait of `limiters` (each is asked, so each counts the
    /// try). With none, no wait.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        Self { limiters }
    }
}

impl<K> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        self.limiters.iter().map(|l| l.when(key)).max().unwrap_or(Duration::ZERO)
    }
    fn forget(&self, key: &K) {
        self.limiters.iter().for_each(|l| l.forget(key));
    }
    fn num_requeues(&self, key: &K) -> u32 {
        self.limiters.iter().map(|l| l.num_requeues(key)).max().unwrap_or(0)
    }
}

/// Caps another limiter's wait at `max` (client-go's
/// `WithMaxWaitRateLimiter`, added because a busy token bucket can push waits
/// to many minutes).
#[derive(Debug)]
pub struct WithMaxWait<L> {
    limiter: L,
    max: Duration,
}

impl<L> WithMaxWait<L> {
    /// `limiter`'s waits, none longer than `max`.
    pub fn new(limiter: L, max: Duration) -> Self {
        Self { limiter, max }
    }
}

impl<K, L: RateLimiter<K>> RateLimiter<K> for WithMaxWait<L> {
    fn when(&self, key: &K) -> Duration {
        self.limiter.when(key).min(self.max)
    }
    fn forget(&self, key: &K) {
        self.limiter.forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        self.limiter.num_requeues(key)
    }
}
