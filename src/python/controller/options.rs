//! `Controller(reconcile, **options)` to the engine's builder: every
//! argument is checked (the errors name it) before anything is built, and
//! each option maps onto one builder call (the Python signature, with its
//! defaults, is the `#[new]` in `mod.rs`; docs/guarantees.md has the rules).

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;

use crate::controller::{Controller, GroupFn};
use crate::python::attach::{attach, python_thread_wrapper};
use crate::python::awaiting::EventLoop;
use crate::python::clock::fake_clock_from_py;
use crate::python::convert::{
    check_reconcile_callable, jitter_from_py, non_negative_from_py, optional_callable, positive_secs,
    reconcile_timeout_from_py,
};
use crate::python::election::{PyLeaderElection, hold_until_exit};
use crate::python::errors::describe;
use crate::python::key::PyKey;
use crate::python::limiters::limiter_from_py;
use crate::python::reconciler::{CallbackCell, PyReconciler};
use crate::python::sharding::{PySharding, partition_by_from_py, resync_from_py};
use crate::python::store::store_from_py;

/// The most worker threads a Python controller takes. Every worker waiting
/// for the GIL wakes at each switch interval (5 ms) to ask for it, so with
/// n workers busy each hand-over of the GIL costs O(n) wake-ups and a
/// drain of k keys O(n·k): a stop draining four keys per worker took
/// 0.08 s with 1,000 workers, 0.6 s with 2,000, 6.5 s with 4,000 and 75 s
/// with 8,000 (a stop with nothing to drain stays linear: 0.7 s for
/// 14,000). Past a few hundred threads more workers only add that
/// cost (I/O-bound reconciles release the GIL, but a thousand in flight is
/// already far past what one interpreter keeps busy).
const MAX_WORKERS: i64 = 1024;

/// The arguments of `Controller(...)` as pyo3 hands them over.
pub(super) struct Options<'a, 'py> {
    pub(super) reconcile: &'a Bound<'py, PyAny>,
    pub(super) workers: i64,
    pub(super) rate_limiter: Option<&'a Bound<'py, PyAny>>,
    pub(super) name: &'a str,
    pub(super) hanging_threshold: Option<&'a Bound<'py, PyAny>>,
    pub(super) timeout: Option<&'a Bound<'py, PyAny>>,
    pub(super) group: Option<&'a Bound<'py, PyAny>>,
    pub(super) max_in_flight_per_group: Option<i64>,
    pub(super) clock: Option<&'a Bound<'py, PyAny>>,
    pub(super) jitter: Option<&'a Bound<'py, PyAny>>,
    pub(super) parked_capacity: Option<i64>,
    pub(super) leader_election: Option<PyRef<'py, PyLeaderElection>>,
    pub(super) store: Option<&'a Bound<'py, PyAny>>,
    pub(super) sharding: Option<PyRef<'py, PySharding>>,
    pub(super) resync: Option<&'a Bound<'py, PyAny>>,
    pub(super) sync_timeout: f64,
    pub(super) supersede: bool,
    pub(super) debounce: Option<f64>,
    /// The asyncio loop `async def` reconciles run on (None: one of ours).
    pub(super) event_loop: Option<&'a Bound<'py, PyAny>>,
}

/// A controller built from Python: the engine's builder, and what the
/// binding keeps beside it.
pub(super) struct Built {
    pub(super) name: Arc<str>,
    pub(super) workers: usize,
    pub(super) builder: Controller<PyKey>,
    /// The reconcile callable, emptied when the controller stops.
    pub(super) callback: Arc<CallbackCell>,
    /// Built with `group=`: `stats()` reports `in_flight_by_group`.
    pub(super) grouped: bool,
    /// Where `async def` reconciles run; stopped after the workers.
    pub(super) event_loop: Arc<EventLoop>,
}

impl Options<'_, '_> {
    /// Checks every argument, then builds.
    pub(super) fn build(self) -> PyResult<Built> {
        let py = self.reconcile.py();
        check_reconcile_callable(self.reconcile, "reconcile", 1)?;
        let sync_timeout = positive_secs(self.sync_timeout, "sync_timeout")?;
        if !(1..=MAX_WORKERS).contains(&self.workers) {
            return Err(PyValueError::new_err(format!(
                "workers must be between 1 and {MAX_WORKERS}, got {}",
                self.workers
            )));
        }
        let workers = usize::try_from(self.workers).expect("checked: 1..=MAX_WORKERS");
        if self.name.contains('\0') {
            return Err(PyValueError::new_err("name must not contain NUL characters"));
        }
        // None keeps the engine's default (a per-key exponential back-off).
        let limiter =
            self.rate_limiter.filter(|l| !l.is_none()).map(|l| limiter_from_py(l, "rate_limiter")).transpose()?;
        let threshold = match self.hanging_threshold {
            Some(t) if !t.is_none() => Some(non_negative_from_py(t, "hanging_threshold")?),
            _ => None,
        };
        let timeout = reconcile_timeout_from_py(self.timeout)?;
        let group = optional_callable(self.group, "group", 1)?;
        let max_in_flight_per_group = match self.max_in_flight_per_group {
            None => None,
            Some(n) if n < 1 => {
                return Err(PyValueError::new_err(format!("max_in_flight_per_group must be at least 1, got {n}")));
            }
            Some(_) if group.is_none() => {
                return Err(PyValueError::new_err("max_in_flight_per_group needs a group function"));
            }
            Some(n) => Some(
                usize::try_from(n).map_err(|_| PyOverflowError::new_err("max_in_flight_per_group is out of range"))?,
            ),
        };
        let clock = fake_clock_from_py(self.clock)?;
        let jitter = jitter_from_py(self.jitter)?;
        let parked_capacity = match self.parked_capacity {
            None => None,
            Some(n) if n < 1 => {
                return Err(PyValueError::new_err(format!("parked_capacity must be at least 1, got {n}")));
            }
            Some(n) => {
                Some(usize::try_from(n).map_err(|_| PyOverflowError::new_err("parked_capacity is out of range"))?)
            }
        };
        let store = match self.store {
            Some(store) if !store.is_none() => Some(store_from_py(py, store)?),
            _ => None,
        };
        if self.leader_election.is_some() && self.sharding.is_some() {
            return Err(PyValueError::new_err("a controller takes leader_election or sharding, not both"));
        }
        let resync = optional_callable(self.resync, "resync", 0)?;
        let event_loop = Arc::new(EventLoop::new(py, self.name, self.event_loop)?);
        let name: Arc<str> = Arc::from(self.name);
        let callback: Arc<CallbackCell> = Arc::new(Mutex::new(Some(Arc::new(self.reconcile.clone().unbind()))));
        let reconciler = PyReconciler {
            callback: Arc::clone(&callback),
            name: Arc::clone(&name),
            event_loop: Arc::clone(&event_loop),
        };
        let mut builder = Controller::new(&*name, reconciler)
            .workers(workers)
            .thread_wrapper(python_thread_wrapper())
            // `PyReconciler` logs exceptions itself, with their tracebacks.
            .log_errors(false);
        if let Some(limiter) = limiter {
            builder = builder.rate_limiter(limiter);
        }
        if let Some(threshold) = threshold {
            builder = builder.hanging_threshold(threshold);
        }
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        let grouped = group.is_some();
        if let Some(group) = group {
            builder = builder.group_fallible(python_group_fn(group));
        }
        if let Some(n) = max_in_flight_per_group {
            builder = builder.max_in_flight_per_group(n);
        }
        if let Some(clock) = clock {
            builder = builder.clock(clock);
        }
        if let Some((fraction, seed)) = jitter {
            builder = builder.jitter(fraction, seed);
        }
        if let Some(capacity) = parked_capacity {
            builder = builder.parked_capacity(capacity);
        }
        if let Some(election) = self.leader_election {
            hold_until_exit(election.py(), &election)?;
            builder = builder.leader_election(election.inner.clone());
        }
        if let Some(store) = store {
            builder = builder.store(store);
        }
        if let Some(sharding) = self.sharding {
            builder = builder.sharding(sharding.inner.clone());
            if let Some(partition_by) = &sharding.partition_by {
                builder = builder.partition_by_fallible(partition_by_from_py(partition_by.clone_ref(py)));
            }
        }
        if let Some(resync) = resync {
            builder = builder.resync(resync_from_py(resync));
        }
        builder = builder.sync_timeout(sync_timeout).map_err(|e| PyValueError::new_err(e.to_string()))?;
        builder = builder.supersede(self.supersede);
        if let Some(window) = self.debounce {
            builder = builder.debounce(positive_secs(window, "debounce")?);
        }
        Ok(Built { name, workers, builder, callback, grouped, event_loop })
    }
}

/// A Python `group(key)` as the controller's fallible group function: its
/// result must be a valid key (str, int, bytes, tuples); None is group
/// None. An exception or a bad value puts the key in group None (logged
/// once per key by the controller).
fn python_group_fn(group: Py<PyAny>) -> Box<GroupFn<PyKey, PyKey>> {
    Box::new(move |key: &PyKey| {
        attach(|py| {
            let called = key.to_py(py).and_then(|k| group.bind(py).call1((k,)));
            let value = called.and_then(|v| if v.is_none() { Ok(None) } else { PyKey::from_py(&v).map(Some) });
            value.map_err(|e| describe(py, &e))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    })
}
