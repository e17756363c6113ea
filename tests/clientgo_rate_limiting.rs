//! Ports of client-go's `default_rate_limiters_test.go` and
//! `rate_limiting_queue_test.go` (research notes §5), plus the token bucket
//! numbers the spec (§2, §3) pins down.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{fake_queue_with, ms, secs, whens};
use reconq::{
    Clock, ExponentialBackoff, FakeClock, FastSlow, KeyState, MaxOf, RateLimiter, TokenBucket, WithMaxWait,
    default_rate_limiter,
};

fn mins(n: u64) -> Duration {
    secs(60 * n)
}

fn hours(n: u64) -> Duration {
    secs(3600 * n)
}

/// client-go's per-key limiter test: key "one" fails five times and waits
/// `waits`, key "two" twice and waits as "one" did, each counted on its
/// own; forgetting "one" starts it over and leaves "two" alone.
fn assert_per_key_and_forget_resets(limiter: &impl RateLimiter<&'static str>, waits: [Duration; 5]) {
    assert_eq!(whens(limiter, &"one", 5), waits);
    assert_eq!(limiter.num_requeues(&"one"), 5);
    assert_eq!(whens(limiter, &"two", 2), waits[..2]);
    assert_eq!(limiter.num_requeues(&"two"), 2);

    limiter.forget(&"one");
    assert_eq!(limiter.num_requeues(&"one"), 0);
    assert_eq!(limiter.when(&"one"), waits[0]);
    assert_eq!(limiter.num_requeues(&"two"), 2, "forget touches only its key");
}

// TestItemExponentialFailureRateLimiter
#[test]
fn exponential_backoff_doubles_per_key_and_forget_resets() {
    assert_per_key_and_forget_resets(&ExponentialBackoff::new(ms(1), secs(1)), [1, 2, 4, 8, 16].map(ms));
}

#[test]
fn exponential_backoff_reaches_the_cap_and_stays() {
    let limiter = ExponentialBackoff::new(ms(1), secs(1));
    let waits = whens(&limiter, &"k", 12);
    assert_eq!(waits[9], ms(512));
    assert_eq!(waits[10], secs(1), "1024 ms is capped at 1 s");
    assert_eq!(waits[11], secs(1));
}

// TestItemExponentialFailureRateLimiterOverFlow, first case.
#[test]
fn exponential_backoff_no_overflow_ms_base() {
    let limiter = ExponentialBackoff::new(ms(1), secs(1000));
    assert_eq!(whens(&limiter, &"one", 6)[5], ms(32));
    assert_eq!(whens(&limiter, &"overflow1", 1001)[1000], secs(1000));
}

// TestItemExponentialFailureRateLimiterOverFlow, (1min, 1000h) case.
#[test]
fn exponential_backoff_no_overflow_minute_base() {
    let limiter = ExponentialBackoff::new(mins(1), hours(1000));
    assert_eq!(whens(&limiter, &"two", 3)[2], mins(4));
    assert_eq!(whens(&limiter, &"overflow2", 1001)[1000], hours(1000));
}

#[test]
fn exponential_backoff_with_client_go_defaults_caps_on_the_nineteenth_failure() {
    let limiter = ExponentialBackoff::new(ms(5), secs(1000));
    let waits = whens(&limiter, &"k", 19);
    assert_eq!(waits[17], ms(655_360));
    assert_eq!(waits[18], secs(1000));
}

// TestItemFastSlowRateLimiter
#[test]
fn fast_slow_switches_after_max_fast_attempts() {
    assert_per_key_and_forget_resets(&FastSlow::new(ms(5), secs(10), 3), [ms(5), ms(5), ms(5), secs(10), secs(10)]);
}

// TestMaxOfRateLimiter
#[test]
fn max_of_returns_the_largest_wait_and_forgets_in_all() {
    let limiter: MaxOf<&str> =
        MaxOf::new(vec![Box::new(FastSlow::new(ms(5), secs(3), 3)), Box::new(ExponentialBackoff::new(ms(1), secs(1)))]);
    // After forget both members start over: the backoff's 1 ms loses to
    // FastSlow's 5 ms.
    assert_per_key_and_forget_resets(&limiter, [ms(5), ms(5), ms(5), secs(3), secs(3)]);
}

/// client-go's `StepRateLimiter`: 5 ms for the first 100 calls overall, then
/// 1000 s.
#[derive(Default)]
struct StepLimiter {
    calls: AtomicU32,
}

impl<K> RateLimiter<K> for StepLimiter {
    fn when(&self, _key: &K) -> Duration {
        if self.calls.fetch_add(1, Ordering::Relaxed) < 100 { ms(5) } else { secs(1000) }
    }
    fn forget(&self, _key: &K) {}
    fn num_requeues(&self, _key: &K) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }
}

// TestWithMaxWaitRateLimiter
#[test]
fn with_max_wait_caps_the_inner_limiter() {
    let limiter = WithMaxWait::new(StepLimiter::default(), secs(500));
    for i in 0..100 {
        assert_eq!(limiter.when(&i), ms(5), "call {i}");
    }
    for i in 100..200 {
        assert_eq!(limiter.when(&i), secs(500), "call {i}");
    }
    assert_eq!(RateLimiter::<i32>::num_requeues(&limiter, &0), 200, "num_requeues delegates");
}

#[test]
fn token_bucket_borrows_from_the_future_like_client_go() {
    let clock = FakeClock::new();
    let bucket = TokenBucket::with_clock(10.0, 2, clock.clone()).unwrap();
    assert_eq!(whens(&bucket, &"a", 4), [ms(0), ms(0), ms(100), ms(200)]);
    assert_eq!(RateLimiter::<&str>::num_requeues(&bucket, &"a"), 0, "the bucket is not per key");
    // 1 s later the bucket is full again (debt of 2 repaid, capped at burst).
    clock.advance(secs(1));
    assert_eq!(whens(&bucket, &"b", 3), [ms(0), ms(0), ms(100)]);
}

#[test]
fn default_rate_limiter_is_backoff_5ms_max_with_bucket_10qps_burst_100() {
    let limiter = default_rate_limiter::<u32>();
    // 100 distinct keys: each a first failure (5 ms), the bucket has tokens.
    for k in 0..100 {
        assert_eq!(limiter.when(&k), ms(5), "key {k}");
    }
    // The 101st token is 100 ms away (a hair less if real time moved on).
    let wait = limiter.when(&100);
    assert!(wait > ms(90) && wait <= ms(100), "{wait:?}");
    assert_eq!(limiter.num_requeues(&7), 1);
}

// TestRateLimitingQueue. client-go reads each `readyAt` from its channel; in
// reconq the earliest due time of a waiting key wins (G5), so the second
// `add_rate_limited` is observed after the first one fired and was done.
#[test]
fn rate_limiting_queue_delays_by_the_limiter_and_forget_resets() {
    let (q, clock) = fake_queue_with(ExponentialBackoff::new(ms(1), secs(1)));
    let due_in = |key: &str| match q.key_state(&key.to_string()) {
        KeyState::Waiting { due } => due - clock.now(),
        other => panic!("{key} should be waiting, is {other:?}"),
    };
    let cycle = |key: &str| {
        clock.advance(secs(1));
        let got = q.get().unwrap();
        assert_eq!(got, key);
        q.done(&got);
    };
    // Two rate-limited adds of `key`, each waited out and handed out.
    let fail_twice = |key: &str| {
        for wait in [ms(1), ms(2)] {
            q.add_rate_limited(key.to_string());
            assert_eq!(due_in(key), wait);
            cycle(key);
        }
    };

    fail_twice("one");
    assert_eq!(q.num_requeues(&"one".to_string()), 2);
    fail_twice("two");

    q.forget(&"one".to_string());
    assert_eq!(q.num_requeues(&"one".to_string()), 0);
    q.add_rate_limited("one".to_string());
    assert_eq!(due_in("one"), ms(1));
    assert_eq!(q.num_requeues(&"two".to_string()), 2);
}

#[test]
fn add_rate_limited_while_waiting_counts_but_keeps_the_earliest_due_time() {
    let (q, clock) = fake_queue_with(ExponentialBackoff::new(ms(10), secs(1)));
    let t0 = clock.now();
    q.add_rate_limited(1);
    q.add_rate_limited(1);
    q.add_rate_limited(1);
    assert_eq!(q.num_requeues(&1), 3);
    assert_eq!(q.key_state(&1), KeyState::Waiting { due: t0 + ms(10) });
    clock.advance(ms(10));
    assert_eq!(q.try_get(), Some(1));
}

#[test]
fn forget_does_not_mark_done() {
    let (q, _clock) = fake_queue_with(ExponentialBackoff::new(ms(10), secs(1)));
    q.add(1);
    assert_eq!(q.get(), Some(1));
    q.forget(&1);
    assert_eq!(q.counts().processing, 1, "forget only clears the limiter");
    q.done(&1);
    assert_eq!(q.counts().processing, 0);
}
