//! The synchronisation primitives the engine is built on, behind one seam.
//!
//! Normally these are `parking_lot`'s mutex and condvar (no poisoning, no
//! spurious wake-ups, cheap uncontended paths) and `std`'s atomics, re-exported
//! as they are. With the internal `shuttle` feature they become shuttle's
//! instrumented versions, so the model-checking tests (`tests/shuttle.rs`,
//! `tests/shuttle_controller.rs`) can explore thread interleavings of the very
//! same queue, controller and manager code. Threads are swapped the same way
//! in [`crate::thread`].
//!
//! What goes through the seam: every lock, condvar and atomic whose
//! interleavings matter (the queue's, the controller's life cycle, worker
//! slots, pending keys, stop and cancel flags, stop signals, the watchdog's,
//! and the manager's registry and per-controller state). What does not:
//! locks that are never held across another synchronisation operation
//! (per-key memory, the parked set, rate limiters, the fake clock, the
//! observe registry) and plain statistics counters. Under shuttle those are
//! still real locks, taken and released between two scheduling points, so
//! they cannot block a model.
//!
//! The API is parking_lot's shape: `lock()` returns a guard, condvar waits
//! borrow the guard mutably and timed waits return a [`WaitTimeoutResult`].
//!
//! **Time under shuttle.** shuttle has no clock. A timed wait whose deadline
//! has already passed when it starts times out at once (after releasing and
//! retaking the lock, as a real wait would); any other timed wait never times
//! out. So models use only zero timeouts (deterministic: always passed) or
//! long ones (deterministic: never reached, and a model that would need the
//! deadline to make progress deadlocks, which shuttle reports, instead of
//! passing by luck). Delays that must elapse use a `FakeClock`, whose waits
//! are untimed and woken by `advance`.

#[cfg(not(feature = "shuttle"))]
mod imp {
    pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};
}

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::thread_local;
/// `thread_local!`: std's, or shuttle's under shuttle, whose model threads
/// all run on one OS thread (a std thread-local would be shared by them).
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::thread_local;

#[cfg(feature = "shuttle")]
mod imp {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicUsize};

    /// shuttle's mutex behind parking_lot's API (no poisoning to handle).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

    pub(crate) struct MutexGuard<'a, T> {
        mutex: &'a Mutex<T>,
        inner: Option<shuttle::sync::MutexGuard<'a, T>>,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(shuttle::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard { mutex: self, inner: Some(self.raw_lock()) }
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }

        fn raw_lock(&self) -> shuttle::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T> MutexGuard<'_, T> {
        /// Runs `f` with the lock released, as parking_lot's does.
        pub(crate) fn unlocked<U>(guard: &mut Self, f: impl FnOnce() -> U) -> U {
            guard.inner = None;
            let result = f();
            guard.inner = Some(guard.mutex.raw_lock());
            result
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.inner.as_ref().expect("guard present outside a wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.inner.as_mut().expect("guard present outside a wait")
        }
    }

    /// Whether a timed wait timed out, as parking_lot's.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub(crate) fn timed_out(self) -> bool {
            self.0
        }
    }

    /// shuttle's condvar, counting its waiters so `notify_*` can report how
    /// many it woke as parking_lot's does. The count is exact for callers
    /// that wait and notify with the mutex held (the queue does), because
    /// shuttle's waits never time out, a timed-out wait here never waited,
    /// and shuttle's condvar never wakes spuriously.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar {
        inner: shuttle::sync::Condvar,
        waiting: std::sync::atomic::AtomicUsize,
    }

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self::default()
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            use std::sync::atomic::Ordering::Relaxed;
            self.waiting.fetch_add(1, Relaxed);
            let inner = guard.inner.take().expect("guard present outside a wait");
            guard.inner = Some(self.inner.wait(inner).unwrap_or_else(|e| e.into_inner()));
        }

        /// Times out at once if `deadline` has passed, else waits untimed
        /// (see the module's notes on time).
        pub(crate) fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) -> WaitTimeoutResult {
            if Instant::now() >= deadline {
                // Release and retake the lock, as a real wait does: other
                // threads may run in between.
                MutexGuard::unlocked(guard, || ());
                return WaitTimeoutResult(true);
            }
            self.wait(guard);
            WaitTimeoutResult(false)
        }

        pub(crate) fn notify_one(&self) -> bool {
            use std::sync::atomic::Ordering::Relaxed;
            let woke = self.waiting.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok();
            self.inner.notify_one();
            woke
        }

        pub(crate) fn notify_all(&self) -> usize {
            use std::sync::atomic::Ordering::Relaxed;
            self.inner.notify_all();
            self.waiting.swap(0, Relaxed)
        }
    }
}

pub(crate) use imp::{AtomicBool, AtomicUsize, Condvar, Mutex, MutexGuard};

/// Rounds of [`spin_until`]: exponential up to 64 pauses a round, about
/// 450 pauses in all: 15–20 µs on the project's VM (a `pause` takes about
/// 40 ns there), far beyond a critical section of the queue and far below a
/// time slice. Six rounds (about 1 µs) parked more often and ran W1's bare
/// queue slower at two workers in alternating runs.
const HOT_SPIN_ROUNDS: u32 = 12;

/// Spins (CPU `pause`s, `rounds` rounds, 1, 2, 4 .. 64 pauses each) until `ready()`, which
/// is asked after each round; whether it said so. The caller parks if not.
///
/// It never gives the CPU up (`sched_yield`, as `crossbeam_utils::Backoff`'s
/// `snooze` and parking_lot's spin do): on a machine whose cores are busy
/// with other work, the scheduler puts a thread that yields behind every
/// other runnable thread's time slice. The queue's spin ended in
/// `snooze`'s yields, and under two busy loops of another process each of
/// the four workers of `benches/python/tail_latency.py` yielded about 140
/// times a second, 0.4-0.6 ms each on average and up to 36 ms; adds
/// meanwhile left the spinner its key (docs/benchmarks.md, the tail
/// section). A spin of pauses only is preempted like any running thread,
/// no sooner.
#[inline]
pub(crate) fn spin_until(rounds: u32, mut ready: impl FnMut() -> bool) -> bool {
    for round in 0..rounds {
        for _ in 0..1u32 << round.min(6) {
            std::hint::spin_loop();
        }
        if ready() {
            return true;
        }
    }
    false
}

/// Locks `mutex`, spinning a little first while another thread holds it.
///
/// For locks held for tens of nanoseconds by one thread per core at a time
/// (the queue's). parking_lot gives the CPU up (`sched_yield`) after a
/// few spins; on a VM that system call costs more than the critical section
/// it waits for, and perf put a third of W1's time in it. This spin
/// watches the lock with plain reads (its cache line stays shared) and
/// tries it only when it looks free; a holder that was preempted is still
/// waited for by parking, after the spin.
#[cfg(not(feature = "shuttle"))]
#[inline]
pub(crate) fn lock_hot<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    if let Some(guard) = mutex.try_lock() {
        return guard;
    }
    let mut guard = None;
    spin_until(HOT_SPIN_ROUNDS, || {
        if !mutex.is_locked() {
            guard = mutex.try_lock();
        }
        guard.is_some()
    });
    guard.unwrap_or_else(|| mutex.lock())
}

/// Under shuttle a spin would only add scheduling points: a plain lock.
#[cfg(feature = "shuttle")]
pub(crate) fn lock_hot<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock()
}
