//! `reconq.WorkQueue`: the Rust queue with Python keys.
//!
//! GIL discipline: non-blocking operations (add, done, a `get` that finds a
//! ready key) run attached, holding the queue lock only briefly; the queue
//! never calls into Python under its lock (limiters are Rust). Every wait
//! that can block runs detached. On the main thread, untimed or long waits
//! are cut into slices of at most 100 ms, re-attaching between slices to run
//! `check_signals()`, so Ctrl-C raises `KeyboardInterrupt` promptly. Other
//! threads never see signals, so they wait in one piece and an idle queue
//! wakes nobody (G8).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

use super::clock::fake_clock_from_py;
use super::duration::{delay_from_py, timeout_from_py};
use super::errors::ShutDown;
use super::key::PyKey;
use super::limiters::optional_limiter_from_py;
use super::priority::priority_from_py;
use crate::{GetError, WorkQueue};

/// How long a main-thread wait runs before checking for signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// `threading.main_thread().ident`, recorded at import (0: unknown).
static MAIN_THREAD_IDENT: AtomicU64 = AtomicU64::new(0);

pub(crate) fn record_main_thread(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py.import("threading")?.call_method0("main_thread")?.getattr("ident")?.extract()?;
    MAIN_THREAD_IDENT.store(ident, Ordering::Relaxed);
    Ok(())
}

/// Whether signals can reach this thread (only CPython's main thread runs
/// signal handlers; `check_signals` elsewhere is a no-op).
pub(crate) fn on_main_thread() -> bool {
    // SAFETY: takes no arguments and touches no Python state.
    let ident = unsafe { pyo3::ffi::PyThread_get_thread_ident() } as u64;
    let main = MAIN_THREAD_IDENT.load(Ordering::Relaxed);
    main == 0 || ident == main
}

/// Runs `wait(slice)` detached until it returns `Some`, or until `deadline`
/// passes (then `None`); on the main thread in slices of at most 100 ms with
/// `check_signals()` in between. `wait` must return within its slice.
pub(crate) fn wait_interruptibly<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    wait: impl Fn(Option<Duration>) -> Option<T> + Sync,
) -> PyResult<Option<T>> {
    let sliced = on_main_thread();
    loop {
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let slice = match (remaining, sliced) {
            (Some(r), true) => Some(r.min(SIGNAL_SLICE)),
            (None, true) => Some(SIGNAL_SLICE),
            (r, false) => r,
        };
        if let Some(value) = py.detach(|| wait(slice)) {
            return Ok(Some(value));
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

/// A `wait_synced(timeout)` of the engine (a cache's, a controller's), as
/// [`wait_interruptibly`] runs it: `wait(slice)` returns whether synced,
/// and `false` at once when it never will be (a cache stopped unsynced),
/// which a `false` before its slice ran out tells apart from a slice
/// that passed.
pub(crate) fn wait_synced_interruptibly(
    py: Python<'_>,
    timeout: Option<Duration>,
    wait: impl Fn(Option<Duration>) -> bool + Sync,
) -> PyResult<bool> {
    let deadline = timeout.map(|t| crate::clock::deadline_after(Instant::now(), t));
    let synced = wait_interruptibly(py, deadline, |slice| {
        let began = Instant::now();
        let synced = wait(slice);
        (synced || slice.is_none_or(|slice| began.elapsed() < slice)).then_some(synced)
    })?;
    Ok(synced.unwrap_or(false))
}

/// A deduplicating, delaying, rate-limiting work queue (client-go's
/// `workqueue` semantics). Keys are str, int, bytes or tuples of these.
#[pyclass(name = "WorkQueue", module = "reconq", frozen)]
pub(crate) struct PyWorkQueue {
    queue: WorkQueue<PyKey>,
}

enum Got {
    Key(PyKey),
    ShutDown,
}

#[pymethods]
impl PyWorkQueue {
    /// `name` turns on the queue's metrics (`workqueue_*{name=...}`, see
    /// `reconq.metrics_text()`); an unnamed queue records none. With a
    /// `reconq.FakeClock`, delays and back-offs are measured on it.
    #[new]
    #[pyo3(signature = (rate_limiter=None, name=None, clock=None))]
    fn new(
        rate_limiter: Option<&Bound<'_, PyAny>>,
        name: Option<String>,
        clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let limiter = optional_limiter_from_py(rate_limiter)?;
        let clock = fake_clock_from_py(clock)?;
        let mut builder = WorkQueue::builder().rate_limiter(limiter);
        if let Some(name) = name {
            builder = builder.name(name);
        }
        if let Some(clock) = clock {
            builder = builder.clock(clock);
        }
        Ok(Self { queue: builder.build() })
    }

    /// Marks `key` as needing processing now, at `priority` (higher is
    /// handed out first; adding a waiting key raises its priority, never
    /// lowers it). Ignored once shut down.
    #[pyo3(signature = (key, priority=0))]
    fn add(&self, key: &Bound<'_, PyAny>, #[pyo3(from_py_with = priority_from_py)] priority: i32) -> PyResult<()> {
        self.queue.add_with_priority(PyKey::from_py(key)?, priority);
        Ok(())
    }

    /// Marks `key` as needing processing `seconds` from now (<= 0: now); it
    /// keeps `priority` when it becomes ready.
    #[pyo3(signature = (key, seconds, priority=0))]
    fn add_after(
        &self,
        key: &Bound<'_, PyAny>,
        seconds: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority_from_py)] priority: i32,
    ) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        let delay = delay_from_py(seconds, "seconds")?;
        self.queue.add_after_with_priority(key, delay, priority);
        Ok(())
    }

    /// Re-adds `key` after the wait the queue's rate limiter gives.
    fn add_rate_limited(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        self.queue.add_rate_limited(PyKey::from_py(key)?);
        Ok(())
    }

    /// Clears the rate limiter's memory of `key` (does not mark it done).
    fn forget(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        self.queue.forget(&PyKey::from_py(key)?);
        Ok(())
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    fn num_requeues(&self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        Ok(self.queue.num_requeues(&PyKey::from_py(key)?))
    }

    /// Blocks until a key is ready and returns it; pair it with `done(key)`.
    /// Raises `ShutDown` once the queue is shut down and nothing is ready,
    /// `TimeoutError` if `timeout` seconds pass first.
    #[pyo3(signature = (timeout=None))]
    fn get<'py>(&self, py: Python<'py>, timeout: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let timeout = timeout_from_py(timeout)?;
        // Fast path: a ready key needs no waiting, so no detaching.
        if let Some(key) = self.queue.try_get() {
            return key.to_py(py);
        }
        let deadline = timeout.map(|t| crate::clock::deadline_after(Instant::now(), t));
        let queue = &self.queue;
        let got = wait_interruptibly(py, deadline, |slice| match slice {
            None => Some(queue.get().map_or(Got::ShutDown, Got::Key)),
            Some(slice) => match queue.get_timeout(slice) {
                Ok(key) => Some(Got::Key(key)),
                Err(GetError::ShutDown) => Some(Got::ShutDown),
                Err(GetError::Timeout) => None,
            },
        });
        match got {
            Ok(Some(Got::Key(key))) => key.to_py(py),
            Ok(Some(Got::ShutDown)) => Err(ShutDown::new_err("the queue is shut down")),
            Ok(None) => Err(PyTimeoutError::new_err("no key became ready in time")),
            Err(e) => Err(e),
        }
    }

    /// Marks the processing of `key` finished; if it was added meanwhile it
    /// becomes ready again. A key not being processed is left alone.
    fn done(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        self.queue.done(&PyKey::from_py(key)?);
        Ok(())
    }

    /// Number of ready keys (not counting processing or delayed ones).
    fn __len__(&self) -> usize {
        self.queue.len()
    }

    /// Stops accepting keys and drops delayed ones; ready keys are still
    /// handed out, then `get` raises `ShutDown`. Ends a pending drain.
    fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// `shut_down()`, then blocks until every key handed out is done. With a
    /// `timeout` (seconds), returns whether the drain finished in time.
    #[pyo3(signature = (timeout=None))]
    fn shut_down_with_drain(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = timeout_from_py(timeout)?;
        let deadline = timeout.map(|t| crate::clock::deadline_after(Instant::now(), t));
        let queue = &self.queue;
        let drained = wait_interruptibly(py, deadline, |slice| {
            let Some(slice) = slice else {
                return Some(queue.shut_down_with_drain_timeout(Duration::MAX));
            };
            let slice_end = Instant::now() + slice;
            if queue.shut_down_with_drain_timeout(slice) {
                Some(true)
            } else if Instant::now() < slice_end {
                // Returned early without finishing: a `shut_down()` ended
                // the drain.
                Some(false)
            } else {
                None
            }
        })?;
        // On KeyboardInterrupt the queue stays shut down; the drain is given up.
        Ok(drained.unwrap_or(false))
    }

    /// Whether `shut_down()` (or a drain) was called.
    #[getter]
    fn shutting_down(&self) -> bool {
        self.queue.is_shutting_down()
    }

    fn __repr__(&self) -> String {
        let c = self.queue.counts();
        format!(
            "<reconq.WorkQueue ready={} processing={} delayed={} shutting_down={}>",
            c.ready,
            c.processing,
            c.delayed,
            if self.queue.is_shutting_down() { "True" } else { "False" }
        )
    }
}
