//! The synchronisation primitives the queue is built on, behind one seam.
//!
//! Normally these are `parking_lot`'s mutex and condvar (no poisoning, no
//! spurious wake-ups, cheap uncontended paths). With the internal `shuttle`
//! feature they become shuttle's instrumented versions, so the model-checking
//! tests in `tests/model.rs` can explore thread interleavings of the very same
//! queue code. The API is parking_lot's shape: `lock()` returns a guard and
//! condvar waits borrow the guard mutably. The spin counter's atomic is
//! swapped the same way.

#[cfg(not(feature = "shuttle"))]
mod imp {
    use std::time::Instant;

    pub(crate) use parking_lot::{Mutex, MutexGuard};
    pub(crate) use std::sync::atomic::AtomicUsize;

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            self.0.wait(guard);
        }

        /// Returns whether the wait timed out (rather than being notified).
        pub(crate) fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) -> bool {
            self.0.wait_until(guard, deadline).timed_out()
        }

        /// Returns whether a waiting thread was woken.
        pub(crate) fn notify_one(&self) -> bool {
            self.0.notify_one()
        }

        /// Returns how many waiting threads were woken.
        pub(crate) fn notify_all(&self) -> usize {
            self.0.notify_all()
        }
    }
}

#[cfg(feature = "shuttle")]
mod imp {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    pub(crate) use shuttle::sync::atomic::AtomicUsize;

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

    /// shuttle's condvar, counting its waiters so `notify_*` can report how
    /// many it woke as parking_lot's does. The count is exact because the
    /// queue waits and notifies only with its mutex held, shuttle's waits
    /// never time out and its condvar never wakes spuriously.
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

        /// shuttle never times a wait out, so the models use no deadlines.
        pub(crate) fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _deadline: Instant) -> bool {
            self.wait(guard);
            false
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

pub(crate) use imp::{AtomicUsize, Condvar, Mutex, MutexGuard};
