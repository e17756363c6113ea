//! Helpers shared by the integration tests. Each test binary uses a subset.
#![allow(dead_code)]

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use reconq::{FakeClock, RateLimiter, WorkQueue};

/// Generous bound for anything that must eventually happen: long enough to
/// never fire on a loaded machine, short enough to fail instead of hang.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A queue on a fake clock (default limiter) and the clock driving it.
pub fn fake_queue<K>() -> (WorkQueue<K>, FakeClock)
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
{
    let clock = FakeClock::new();
    (WorkQueue::builder().clock(clock.clone()).build(), clock)
}

/// A queue on a fake clock with the given limiter.
pub fn fake_queue_with<K, L>(limiter: L) -> (WorkQueue<K>, FakeClock)
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
    L: RateLimiter<K> + 'static,
{
    let clock = FakeClock::new();
    (
        WorkQueue::builder()
            .clock(clock.clone())
            .rate_limiter(limiter)
            .build(),
        clock,
    )
}

/// Runs `f` on a new thread; its result arrives on the returned channel.
pub fn spawn_with_result<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// The value `rx` delivers within [`PATIENCE`], or a panic naming `what`.
pub fn expect_within<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|e| panic!("{what}: nothing within {PATIENCE:?} ({e})"))
}

/// Polls `cond` until it holds, panicking after [`PATIENCE`].
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(ms(1));
    }
}

/// `n` successive `when(key)` answers of `limiter`.
pub fn whens<K, L: RateLimiter<K> + ?Sized>(limiter: &L, key: &K, n: usize) -> Vec<Duration> {
    (0..n).map(|_| limiter.when(key)).collect()
}
