//! One token bucket shared by all keys.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::RateLimiter;
use crate::clock::{Clock, SystemClock, duration_from_nanos};
use crate::error::InvalidArgument;

/// An overall (not per-key) token bucket: `qps` tokens a second, at most
/// `burst` saved up. Like client-go's `BucketRateLimiter`, every `when` takes
/// a token, borrowing from the future when the bucket is empty, and returns
/// the wait until that token exists: with burst 2 at 10 qps, calls in quick
/// succession give 0, 0, 100 ms, 200 ms.
///
/// Refills happen in whole *quanta* of at most 1 ms (a sixteenth of the token
/// interval at high rates), so calls within one quantum see exactly the same
/// bucket and waits come out exact; a token may appear up to one quantum
/// late, never early.
pub struct TokenBucket {
    qps: f64,
    burst: u32,
    quantum: Duration,
    clock: Arc<dyn Clock>,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    /// May be negative: tokens already promised to callers told to wait.
    tokens: f64,
    /// The last refill, on the quantum grid.
    refilled_at: Instant,
}

impl TokenBucket {
    /// A full bucket on the system clock.
    ///
    /// # Panics
    /// If `qps` is not a positive finite number or `burst` is 0; see
    /// [`try_new`](Self::try_new) for the fallible form.
    pub fn new(qps: f64, burst: u32) -> Self {
        Self::try_new(qps, burst).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A full bucket on the system clock, or an error for a `qps` that is
    /// not positive and finite or a `burst` of 0.
    pub fn try_new(qps: f64, burst: u32) -> Result<Self, InvalidArgument> {
        Self::with_clock(qps, burst, SystemClock)
    }

    /// A full bucket reading time from `clock`.
    pub fn with_clock(qps: f64, burst: u32, clock: impl Clock) -> Result<Self, InvalidArgument> {
        if !(qps.is_finite() && qps > 0.0) {
            return Err(InvalidArgument::new(format!("qps must be a positive finite number, got {qps}")));
        }
        if burst == 0 {
            return Err(InvalidArgument::new("burst must be at least 1"));
        }
        let interval = Duration::try_from_secs_f64(1.0 / qps).unwrap_or(Duration::MAX);
        let quantum = (interval / 16).clamp(Duration::from_nanos(1), Duration::from_millis(1));
        let now = clock.now();
        Ok(Self {
            qps,
            burst,
            quantum,
            clock: Arc::new(clock),
            bucket: Mutex::new(Bucket { tokens: f64::from(burst), refilled_at: now }),
        })
    }
}

impl<K> RateLimiter<K> for TokenBucket {
    fn when(&self, _key: &K) -> Duration {
        let now = self.clock.now();
        let mut bucket = self.bucket.lock();
        let elapsed = now.saturating_duration_since(bucket.refilled_at);
        let quantum = self.quantum.as_nanos();
        let refill = duration_from_nanos(elapsed.as_nanos() / quantum * quantum);
        if !refill.is_zero() {
            bucket.refilled_at += refill;
            bucket.tokens = (bucket.tokens + refill.as_secs_f64() * self.qps).min(f64::from(self.burst));
        }
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-bucket.tokens / self.qps).unwrap_or(Duration::MAX)
        }
    }

    fn forget(&self, _key: &K) {}

    /// Always 0: the bucket keeps no per-key history (as in client-go).
    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket").field("qps", &self.qps).field("burst", &self.burst).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn borrows_tokens_from_the_future() {
        let clock = FakeClock::new();
        let bucket = TokenBucket::with_clock(10.0, 2, clock.clone()).unwrap();
        let waits: Vec<_> = (0..4).map(|_| bucket.when(&())).collect();
        assert_eq!(waits, [ms(0), ms(0), ms(100), ms(200)]);
        // 300 ms later three tokens have been made: the debt of two is paid
        // and one is left for the next call.
        clock.advance(ms(300));
        assert_eq!(bucket.when(&()), ms(0));
        assert_eq!(bucket.when(&()), ms(100));
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let clock = FakeClock::new();
        let bucket = TokenBucket::with_clock(100.0, 3, clock.clone()).unwrap();
        clock.advance(Duration::from_secs(3600));
        let waits: Vec<_> = (0..4).map(|_| bucket.when(&())).collect();
        assert_eq!(waits, [ms(0), ms(0), ms(0), ms(10)]);
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(TokenBucket::try_new(f64::NAN, 1).is_err());
        assert!(TokenBucket::try_new(0.0, 1).is_err());
        assert!(TokenBucket::try_new(-1.0, 1).is_err());
        assert!(TokenBucket::try_new(f64::INFINITY, 1).is_err());
        assert!(TokenBucket::try_new(1.0, 0).is_err());
        assert!(TokenBucket::try_new(1e-300, 1).is_ok());
    }
}
