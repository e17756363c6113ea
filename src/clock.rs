//! Time sources.
//!
//! Every time-dependent part of reconq (the delay heap, the token bucket, the
//! controller's timeline) reads time through a [`Clock`], so tests can swap in
//! a [`FakeClock`] and step time by hand instead of sleeping.
//!
//! The one subtlety is waiting: a thread blocked until a due time must wake
//! when that time comes. With the real clock that is a timed condvar wait.
//! A fake clock's instants do not correspond to real time, so waiters block
//! without a timeout and the fake clock wakes them from [`FakeClock::advance`]
//! through the wakers registered with [`Clock::subscribe`].

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A callback a clock runs when time jumps, so blocked waiters re-check their
/// deadlines. Held weakly: a dropped queue simply stops being woken.
pub type Wake = Weak<dyn Fn() + Send + Sync>;

/// A source of monotonic time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant on this clock.
    fn now(&self) -> Instant;

    /// Whether this clock's instants are real instants, so a waiter may sleep
    /// until one with a timed wait. `false` for clocks that instead wake their
    /// subscribers whenever time moves.
    fn is_real_time(&self) -> bool {
        true
    }

    /// Registers `wake` to be called whenever this clock jumps forward.
    /// Real-time clocks never jump, so the default does nothing.
    fn subscribe(&self, wake: Wake) {
        let _ = wake;
    }
}

/// The operating system's monotonic clock ([`Instant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to, for deterministic tests.
///
/// Cloning gives another handle to the same clock.
///
/// ```
/// use reconq::{Clock, FakeClock};
/// use std::time::Duration;
///
/// let clock = FakeClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_millis(50));
/// assert_eq!(clock.now() - start, Duration::from_millis(50));
/// ```
#[derive(Clone, Default)]
pub struct FakeClock {
    inner: Arc<FakeClockInner>,
}

struct FakeClockInner {
    now: Mutex<Instant>,
    subscribers: Mutex<Vec<Wake>>,
}

impl Default for FakeClockInner {
    fn default() -> Self {
        Self { now: Mutex::new(Instant::now()), subscribers: Mutex::new(Vec::new()) }
    }
}

impl FakeClock {
    /// A fake clock standing at the current real instant.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` and wakes every subscriber. When it
    /// returns, every queue on this clock has made the keys that became due
    /// ready (workers may not have taken them yet).
    pub fn advance(&self, by: Duration) {
        {
            let mut now = self.inner.now.lock();
            *now += by;
        }
        self.wake_subscribers();
    }

    /// Sets the clock to `to`, which must not be earlier than now: monotonic
    /// clocks never go back.
    ///
    /// # Panics
    /// If `to` is earlier than the clock's current instant.
    pub fn set(&self, to: Instant) {
        {
            let mut now = self.inner.now.lock();
            assert!(to >= *now, "FakeClock::set: time cannot go backwards");
            *now = to;
        }
        self.wake_subscribers();
    }

    fn wake_subscribers(&self) {
        // Upgrade under the lock, call outside it: a wake callback takes the
        // subscriber's own lock and must not nest inside ours.
        let live: Vec<Arc<dyn Fn() + Send + Sync>> = {
            let mut subscribers = self.inner.subscribers.lock();
            subscribers.retain(|w| w.strong_count() > 0);
            subscribers.iter().filter_map(Weak::upgrade).collect()
        };
        for wake in live {
            wake();
        }
    }
}

impl fmt::Debug for FakeClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeClock").field("now", &*self.inner.now.lock()).finish()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        *self.inner.now.lock()
    }

    fn is_real_time(&self) -> bool {
        false
    }

    fn subscribe(&self, wake: Wake) {
        self.inner.subscribers.lock().push(wake);
    }
}

/// `now + delay`, saturating far in the future instead of overflowing
/// `Instant` (whose range is platform-defined).
pub(crate) fn deadline_after(now: Instant, delay: Duration) -> Instant {
    /// About 136 years: later than anything a queue will see, and safely
    /// representable on every platform.
    const FAR_FUTURE: Duration = Duration::from_secs(u32::MAX as u64);
    now.checked_add(delay.min(FAR_FUTURE)).or_else(|| now.checked_add(FAR_FUTURE)).unwrap_or(now)
}

/// A duration of `nanos` nanoseconds, for nanosecond counts computed in
/// `u128` that are known to fit.
pub(crate) fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    Duration::new((nanos / NANOS_PER_SEC) as u64, (nanos % NANOS_PER_SEC) as u32)
}
