//! `reconq.WorkQueue`: the Rust queue with Python keys.
//!
//! GIL discipline: non-blocking operations (add, done, a `get` that finds a
//! ready key) run attached, holding the queue lock only briefly; the queue
//! never calls into Python under its lock (limiters are Rust). Every wait
//! that can block runs detached, as `signals` waits: in slices on the main
//! thread so Ctrl-C gets through, in one piece elsewhere so an idle queue
//! wakes nobody (G8).

use std::time::{Duration, Instant};

use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::clock::fake_clock_from_py;
use super::convert::{Due, priority_from_py, timeout_from_py};
use super::errors::ShutDown;
use super::key::PyKey;
use super::limiters::optional_limiter_from_py;
use super::signals::wait_interruptibly;
use crate::{queue::GetError, queue::WorkQueue};

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

impl PyWorkQueue {
    fn add_due(&self, key: PyKey, due: Due, priority: i32) {
        match due {
            Due::Now => self.queue.add_with_priority(key, priority),
            Due::After(delay) => self.queue.add_after_with_priority(key, delay, priority),
            Due::At(at) => self.queue.add_at_with_priority(key, at, priority),
        }
    }
}

#[pymethods]
impl PyWorkQueue {
    /// `name` turns on the queue's metrics (`workqueue_*{name=...}`, see
    /// `reconq.metrics_text()`); an unnamed queue records none. With a
    /// `reconq.FakeClock`, delays and back-offs are measured on it.
    #[new]
    #[pyo3(signature = (rate_limiter=None, *, name=None, clock=None))]
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
        self.add_due(PyKey::from_py(key)?, Due::Now, priority);
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
        self.add_due(PyKey::from_py(key)?, Due::after(seconds)?, priority);
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

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the block shuts the queue down: `shut_down()` (no drain:
    /// the block's own code decides what to finish).
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) {
        self.shut_down();
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
