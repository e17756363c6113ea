//! `reconq.Controller`: the Rust controller with a Python reconcile function
//! (guarantees §4), triggers, watches, `enqueue_at` and hang reports (guarantees §5).
//!
//! * Every engine thread attaches once for its life (see
//!   [`python_thread_wrapper`]); reconcile calls attach around the call only.
//! * Every blocking wait here (`run`, `stop`, `wait_idle`) runs detached; on
//!   the main thread in slices of at most 100 ms with `check_signals()`
//!   between, so Ctrl-C gets through.
//! * No engine lock is held while Python runs; the small locks of this file
//!   (trigger events, the callback cell) are never held across a Python call.
//! * A started controller is kept in `reconq._lifecycle` until stopped, and
//!   an `atexit` hook stops the ones still running (with drain) so the
//!   interpreter exits cleanly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyboardInterrupt, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::{PyTraverseError, PyVisit};

use super::attach::attach;
use super::attach::python_thread_wrapper;
use super::cache::PyCache;
use super::callables::check_sync_callable;
use super::clock::fake_clock_from_py;
use super::duration::{delay_from_py, non_negative_from_py, positive_secs, shown, timeout_from_py, unix_timestamp};
use super::election::PyLeaderElection;
use super::errors::type_name;
use super::key::PyKey;
use super::limiters::limiter_from_py;
use super::priority::priority_from_py;
use super::queue::{wait_interruptibly, wait_synced_interruptibly};
use super::reconciler::{AUX_GRACE, CallbackCell, PyEvents, PyReconciler, keys_from_event, log, try_log};
use super::sharding::{PySharding, resync_from_py};
use super::watch::watch_from_py;
use crate::clock::deadline_after;
use crate::controller::GroupFn;
use crate::observe::status::RunState;
use crate::{Batch, Controller, ControllerHandle, KeyStatus, StopOptions, StopReport, StopSignal, WatchError};

/// The Python `threading.Event`s of live triggers, so a stop, a removal or a
/// replacement can set them.
#[derive(Default)]
struct TriggerEvents {
    /// The controller is stopping: new triggers are refused.
    closed: bool,
    next_id: u64,
    map: HashMap<PyKey, (u64, Py<PyAny>)>,
}

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

/// A pool of worker threads calling `reconcile(key)` for keys enqueued,
/// never two at once for one key.
///
/// `reconcile` returns None (success), `Requeue()` / `Requeue(after=s)`, or
/// raises `RetryAfter(s)`, `PermanentError` (no retry; see `parked()`) or
/// anything else (retried with the rate limiter's backoff). Any other return
/// value is a failure (TypeError). Every exception is a failure, including
/// `KeyboardInterrupt` and `SystemExit`: a worker never dies. Failures are
/// logged on the "reconq" logger.
///
/// Keyword arguments (durations in seconds; docs/guarantees.md has the
/// details):
///
/// - `workers=1`: worker threads, at least 1.
/// - `rate_limiter=None`: the retry back-off (a `RateLimiter`); None means
///   `default_rate_limiter()`.
/// - `name="controller"`: the name in logs, metrics, `status()` and a
///   store.
/// - `hanging_threshold=None`: report reconciles running longer than this
///   (`stats()["hanging"]`, the status table, a log line).
/// - `timeout=None`: cancel a reconcile running longer than this; it then
///   counts as a failure and is retried.
/// - `group=None`: `group(key)` names the key's group, for
///   `max_in_flight_per_group`.
/// - `max_in_flight_per_group=None`: at most this many reconciles of one
///   group at once.
/// - `clock=None`: a `FakeClock` that every delay and back-off is measured
///   on (tests).
/// - `jitter=None`: `(fraction, seed)`: retry delays scaled by a seeded
///   random factor in [1 - fraction, 1 + fraction].
/// - `parked_capacity=None`: the most permanently failed keys kept.
/// - `leader_election=None`: a `LeaderElection`: reconcile only while this
///   process leads.
/// - `store=None`: a `SqliteStore` or a path: pending and parked keys and
///   failure counts survive a restart.
/// - `sharding=None`: a `Sharding`: reconcile only the keys of the
///   partitions this replica owns.
/// - `resync=None`: with `sharding`, a callable listing every key; called
///   when partitions are gained.
/// - `sync_timeout=120.0`: while a cache watched at start has not synced,
///   an ERROR every this many seconds names it and its last error.
/// - `supersede=False`: a key that becomes ready while it is reconciled
///   cancels that reconcile (counted as `superseded`) and runs again after
///   it, with the higher of the two priorities; not when the reconcile
///   enqueued its own key.
/// - `debounce=None`: seconds: an enqueue, a watch or cache event or a
///   trigger makes the key due this long after the latest of them, but at
///   most 10 times this after the first of the burst.
#[pyclass(name = "Controller", module = "reconq", frozen)]
pub(crate) struct PyController {
    name: Arc<str>,
    workers: usize,
    handle: ControllerHandle<PyKey>,
    /// The builder until `start` (or a stop before start) takes it.
    builder: Mutex<Option<Controller<PyKey>>>,
    callback: Arc<CallbackCell>,
    triggers: Arc<Mutex<TriggerEvents>>,
    /// Built with `group=`: `stats()` reports `in_flight_by_group`.
    grouped: bool,
    /// The caches it watches, held until it stops: a cache the user
    /// started and let go of must not stop under it (`PyCache`'s drop).
    watched: Mutex<Vec<Py<PyCache>>>,
}

/// `with c.batch():` — opens at `__enter__`, closes at `__exit__` (an
/// exception in the block included, which then propagates).
#[pyclass(name = "Batch", module = "reconq", frozen)]
pub(crate) struct PyBatch {
    handle: ControllerHandle<PyKey>,
    open: Mutex<Option<Batch<PyKey>>>,
}

#[pymethods]
impl PyBatch {
    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<Self>> {
        let this = slf.get();
        let mut open = this.open.lock();
        if open.is_some() {
            return Err(PyRuntimeError::new_err("this batch is already open: use a new c.batch() to nest"));
        }
        let handle = &this.handle;
        *open = Some(slf.py().detach(|| handle.batch()));
        Ok(slf.clone().unbind())
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let closed = self.open.lock().take();
        py.detach(|| drop(closed));
        false
    }
}

/// Keys as a Python list.
fn keys_to_py<'py>(py: Python<'py>, keys: &[PyKey]) -> PyResult<Bound<'py, PyList>> {
    let items = keys.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// `set_dependencies`'s `parents`: an iterable of keys, but not a str,
/// bytes or tuple (each of those is a key itself: `["a"]`, not `"a"`).
fn parents_from_py(parents: &Bound<'_, PyAny>) -> PyResult<Vec<PyKey>> {
    if parents.is_instance_of::<PyString>()
        || parents.is_instance_of::<PyBytes>()
        || parents.is_instance_of::<PyTuple>()
    {
        return Err(PyTypeError::new_err(format!(
            "parents must be a list of keys, not a {} (a key itself: wrap it in a list)",
            type_name(parents)
        )));
    }
    let iter = parents
        .try_iter()
        .map_err(|_| PyTypeError::new_err(format!("parents must be a list of keys, not {}", type_name(parents))))?;
    iter.enumerate().map(|(nth, parent)| PyKey::from_py_in(&parent?, format_args!("parents[{nth}]"))).collect()
}

/// After a second signal, how long `run()` waits for the cancelled
/// reconciles to return before it returns anyway.
const SECOND_SIGNAL_GRACE: Duration = Duration::from_secs(1);

/// While `run()` waits: SIGTERM (the stop signal of systemd, Docker and
/// Kubernetes) raises KeyboardInterrupt as Ctrl-C does, so it drains too.
/// Only on the main thread (the only one Python lets set handlers) and only
/// if SIGTERM has its default disposition: a program's own handler wins.
/// The previous handler is put back on drop.
struct SigtermAsInterrupt {
    previous: Option<Py<PyAny>>,
}

impl SigtermAsInterrupt {
    fn install(py: Python<'_>) -> PyResult<Self> {
        if !super::queue::on_main_thread() {
            return Ok(Self { previous: None });
        }
        let signal = py.import("signal")?;
        let sigterm = signal.getattr("SIGTERM")?;
        let previous = signal.call_method1("getsignal", (&sigterm,))?;
        if !previous.eq(signal.getattr("SIG_DFL")?)? {
            return Ok(Self { previous: None });
        }
        signal.call_method1("signal", (&sigterm, signal.getattr("default_int_handler")?))?;
        Ok(Self { previous: Some(previous.unbind()) })
    }
}

impl Drop for SigtermAsInterrupt {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            attach(|py| {
                let restored = py
                    .import("signal")
                    .and_then(|signal| signal.call_method1("signal", (signal.getattr("SIGTERM")?, previous)).map(drop));
                if let Err(e) = restored {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
}

/// A `time.time()` timestamp, checked.
fn timestamp_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be a time.time() timestamp, not bool")));
    }
    let t: f64 = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyOverflowError::new_err(format!("{what} is out of range"))
        } else {
            PyTypeError::new_err(format!("{what} must be a time.time() timestamp, not {}", type_name(obj)))
        }
    })?;
    if t.is_nan() {
        return Err(PyValueError::new_err(format!("{what} must not be NaN")));
    }
    Ok(t)
}

fn wall_now() -> f64 {
    unix_timestamp(SystemTime::now())
}

/// An `Instant` as a `time.time()` timestamp.
fn instant_to_wall(at: Instant) -> f64 {
    let now = Instant::now();
    let wall = wall_now();
    if at >= now { wall + (at - now).as_secs_f64() } else { wall - (now - at).as_secs_f64() }
}

/// `jitter=(fraction, seed)`: `0 <= fraction <= 1`, a seed that fits u64.
fn jitter_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<(f64, u64)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let (fraction, seed): (f64, u64) = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyOverflowError::new_err("jitter seed is out of range (0 to 2**64 - 1)")
        } else {
            PyTypeError::new_err(format!("jitter must be a (fraction, seed) tuple, not {}", type_name(obj)))
        }
    })?;
    if !(0.0..=1.0).contains(&fraction) {
        return Err(PyValueError::new_err(format!("jitter fraction must be within 0 and 1, got {fraction}")));
    }
    Ok(Some((fraction, seed)))
}

/// `timeout=`: positive seconds or None (guarantees §7).
fn reconcile_timeout_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let timeout = timeout_from_py(obj)?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(PyValueError::new_err("timeout must be positive"));
    }
    Ok(timeout)
}

/// An optional callable taking `args` positional arguments.
fn optional_callable(obj: Option<&Bound<'_, PyAny>>, what: &str, args: usize) -> PyResult<Option<Py<PyAny>>> {
    match obj {
        Some(f) if !f.is_none() => {
            check_sync_callable(f, what, args)?;
            Ok(Some(f.clone().unbind()))
        }
        _ => Ok(None),
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
            value.map_err(|e| super::errors::describe(py, &e))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    })
}

fn lifecycle(py: Python<'_>, what: &str, controller: &Bound<'_, PyController>) -> PyResult<()> {
    py.import("reconq._lifecycle")?.call_method1(what, (controller,))?;
    Ok(())
}

impl PyController {
    /// Sets every trigger's stop event and refuses new triggers.
    fn close_triggers(&self, py: Python<'_>) {
        let events: Vec<Py<PyAny>> = {
            let mut reg = self.triggers.lock();
            reg.closed = true;
            reg.map.drain().map(|(_, (_, event))| event).collect()
        };
        for event in events {
            if let Err(e) = event.bind(py).call_method0("set") {
                e.write_unraisable(py, None);
            }
        }
    }

    /// Drops the reconcile callable (breaks cycles through it).
    fn release_callback(&self) {
        let callback = self.callback.lock().take();
        drop(callback);
    }

    /// Refuses a call that waits for the controller to become idle or
    /// stopped when made from one of its own reconciles: it would wait for
    /// itself forever (the worker never returns, and a later `stop()`
    /// without a timeout waits for that worker).
    fn refuse_on_own_worker(&self, call: &str) -> PyResult<()> {
        if self.handle.on_own_worker() {
            return Err(PyRuntimeError::new_err(format!(
                "{call} called from a reconcile of controller {:?}: it would wait for that reconcile itself",
                &*self.name
            )));
        }
        Ok(())
    }

    /// `stop` and `stop_with_report`: stops, and reports what was left.
    /// The engine's stop is waited for here, in slices (Ctrl-C gets
    /// through); trigger and watch threads get [`AUX_GRACE`] once the
    /// workers are done, then are left behind.
    fn stop_reporting(slf: &Bound<'_, Self>, drain: bool, timeout: Option<Duration>) -> PyResult<StopReport<PyKey>> {
        let py = slf.py();
        let this = slf.get();
        let handle = &this.handle;
        // Called from a reconcile of this controller, waiting for the
        // workers would wait for ourselves: the stop is started here and a
        // drain finishes on a thread of its own, without a deadline.
        let own_worker = handle.on_own_worker();
        let timeout = if own_worker { None } else { timeout };
        // Detached: a stop lets go of the caches it watched, and stopping
        // one sets its source's stop event, which takes the GIL.
        let mut stopping = py.detach(|| handle.stop_with(StopOptions { drain, timeout, aux_grace: Some(AUX_GRACE) }));
        // Never started: the stop above was all it needed.
        let unstarted = this.builder.lock().take();
        drop(unstarted);
        this.close_triggers(py);
        let result = if own_worker {
            if drain {
                std::thread::spawn(move || while stopping.wait(Duration::MAX).is_none() {});
            }
            Ok(StopReport { finished: false, ..StopReport::finished_with_nothing_left() })
        } else {
            let stopping = Mutex::new(stopping);
            match wait_interruptibly(py, None, |slice| stopping.lock().wait(slice.unwrap_or(Duration::MAX))) {
                Ok(report) => Ok(report.expect("a wait without a deadline returns the report")),
                Err(e) => {
                    // Interrupted (Ctrl-C): give up a drain, stop at once.
                    py.detach(|| handle.stop());
                    Err(e)
                }
            }
        };
        this.release_callback();
        let watched = std::mem::take(&mut *this.watched.lock());
        drop(watched);
        lifecycle(py, "untrack", slf)?;
        result
    }

    /// A stop was requested (here or through the engine): enqueues from
    /// Python are ignored from then on.
    fn stopping(&self) -> bool {
        matches!(self.handle.state(), RunState::Stopping | RunState::Stopped)
    }
}

#[pymethods]
impl PyController {
    #[new]
    #[allow(clippy::too_many_arguments)] // the Python signature (guarantees §4, §7, §8)
    #[pyo3(signature = (
        reconcile, workers=1, rate_limiter=None, name="controller", hanging_threshold=None,
        timeout=None, group=None, max_in_flight_per_group=None, clock=None, jitter=None, parked_capacity=None,
        leader_election=None, store=None, sharding=None, resync=None, sync_timeout=120.0,
        supersede=false, debounce=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        reconcile: &Bound<'_, PyAny>,
        workers: i64,
        rate_limiter: Option<&Bound<'_, PyAny>>,
        name: &str,
        hanging_threshold: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        group: Option<&Bound<'_, PyAny>>,
        max_in_flight_per_group: Option<i64>,
        clock: Option<&Bound<'_, PyAny>>,
        jitter: Option<&Bound<'_, PyAny>>,
        parked_capacity: Option<i64>,
        leader_election: Option<PyRef<'_, PyLeaderElection>>,
        store: Option<&Bound<'_, PyAny>>,
        sharding: Option<PyRef<'_, PySharding>>,
        resync: Option<&Bound<'_, PyAny>>,
        sync_timeout: f64,
        supersede: bool,
        debounce: Option<f64>,
    ) -> PyResult<Self> {
        check_sync_callable(reconcile, "reconcile", 1)?;
        let sync_timeout = positive_secs(sync_timeout, "sync_timeout")?;
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(PyValueError::new_err(format!("workers must be between 1 and {MAX_WORKERS}, got {workers}")));
        }
        let workers = usize::try_from(workers).expect("checked: 1..=MAX_WORKERS");
        if name.contains('\0') {
            return Err(PyValueError::new_err("name must not contain NUL characters"));
        }
        // None keeps the engine's default (a per-key exponential back-off).
        let limiter = rate_limiter.filter(|l| !l.is_none()).map(|l| limiter_from_py(l, "rate_limiter")).transpose()?;
        let threshold = match hanging_threshold {
            Some(t) if !t.is_none() => Some(non_negative_from_py(t, "hanging_threshold")?),
            _ => None,
        };
        let timeout = reconcile_timeout_from_py(timeout)?;
        let group = optional_callable(group, "group", 1)?;
        let max_in_flight_per_group = match max_in_flight_per_group {
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
        let clock = fake_clock_from_py(clock)?;
        let jitter = jitter_from_py(jitter)?;
        let parked_capacity = match parked_capacity {
            None => None,
            Some(n) if n < 1 => {
                return Err(PyValueError::new_err(format!("parked_capacity must be at least 1, got {n}")));
            }
            Some(n) => {
                Some(usize::try_from(n).map_err(|_| PyOverflowError::new_err("parked_capacity is out of range"))?)
            }
        };
        let store = match store {
            Some(store) if !store.is_none() => Some(super::store::store_from_py(py, store)?),
            _ => None,
        };
        if leader_election.is_some() && sharding.is_some() {
            return Err(PyValueError::new_err("a controller takes leader_election or sharding, not both"));
        }
        let resync = optional_callable(resync, "resync", 0)?;
        let name: Arc<str> = Arc::from(name);
        let callback: Arc<CallbackCell> = Arc::new(Mutex::new(Some(Arc::new(reconcile.clone().unbind()))));
        let reconciler = PyReconciler { callback: Arc::clone(&callback), name: Arc::clone(&name) };
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
        if let Some(election) = leader_election {
            super::election::hold_until_exit(election.py(), &election)?;
            builder = builder.leader_election(election.inner.clone());
        }
        if let Some(store) = store {
            builder = builder.store(store);
        }
        if let Some(sharding) = sharding {
            builder = builder.sharding(sharding.inner.clone());
        }
        if let Some(resync) = resync {
            builder = builder.resync(resync_from_py(resync));
        }
        builder = builder.sync_timeout(sync_timeout).map_err(|e| PyValueError::new_err(e.to_string()))?;
        builder = builder.supersede(supersede);
        if let Some(window) = debounce {
            builder = builder.debounce(positive_secs(window, "debounce")?);
        }
        let handle = builder.handle();
        Ok(Self {
            name,
            workers,
            handle,
            builder: Mutex::new(Some(builder)),
            callback,
            triggers: Arc::new(Mutex::new(TriggerEvents::default())),
            grouped,
            watched: Mutex::new(Vec::new()),
        })
    }

    /// The controller's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The number of worker threads.
    #[getter]
    fn workers(&self) -> usize {
        self.workers
    }

    /// Asks for `key` to be reconciled, at `priority` (higher first; an
    /// enqueue raises a waiting key's priority, never lowers it). Ignored
    /// once stopped.
    #[pyo3(signature = (key, priority=0))]
    fn enqueue(&self, key: &Bound<'_, PyAny>, #[pyo3(from_py_with = priority_from_py)] priority: i32) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        if !self.stopping() {
            self.handle.enqueue_with_priority(key, priority);
        }
        Ok(())
    }

    /// Asks for `key` to be reconciled `seconds` from now (<= 0: now).
    #[pyo3(signature = (key, seconds, priority=0))]
    fn enqueue_after(
        &self,
        key: &Bound<'_, PyAny>,
        seconds: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority_from_py)] priority: i32,
    ) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        let delay = delay_from_py(seconds, "seconds")?;
        if !self.stopping() {
            self.handle.enqueue_after_with_priority(key, delay, priority);
        }
        Ok(())
    }

    /// Asks for `key` to be reconciled at `t`, a `time.time()` timestamp (a
    /// time in the past means now).
    #[pyo3(signature = (key, t, priority=0))]
    fn enqueue_at(
        &self,
        key: &Bound<'_, PyAny>,
        t: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = priority_from_py)] priority: i32,
    ) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        let t = timestamp_from_py(t, "t")?;
        let now = Instant::now();
        let ahead = t - wall_now();
        let at = if ahead <= 0.0 {
            now
        } else {
            Duration::try_from_secs_f64(ahead)
                .ok()
                .and_then(|d| now.checked_add(d))
                .ok_or_else(|| PyOverflowError::new_err(format!("t is out of range: {}", shown(t))))?
        };
        if !self.stopping() {
            self.handle.enqueue_at_with_priority(key, at, priority);
        }
        Ok(())
    }

    /// Starts the worker threads and returns at once. Raises RuntimeError
    /// if it was started before or stopped (a controller runs once: make a
    /// new one), and, with nothing left running and the controller
    /// stopped, if the OS refuses a thread (each worker needs a stack:
    /// thousands of workers can exceed a memory or thread limit).
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let refused = |why: &str| PyRuntimeError::new_err(format!("controller {:?} {why}", &*this.name));
        // `stop()` takes the builder too: it decides which refusal this is.
        let builder = this.builder.lock().take();
        if this.stopping() {
            drop(builder);
            return Err(refused("was stopped and cannot start again: make a new Controller"));
        }
        let Some(builder) = builder else {
            return Err(refused("is already started"));
        };
        // Spawning takes engine locks; the new threads attach at once. A
        // store's claim and restore happen here too (file I/O).
        let started = py.detach(move || builder.try_start().map(drop));
        if let Err(e) = started {
            // Nothing runs: the controller is stopped, as after stop() (a
            // failed claim left it unstopped).
            py.detach(|| this.handle.stop());
            this.release_callback();
            if let Some(store) = e.get_ref().and_then(|inner| inner.downcast_ref::<crate::StoreError>()) {
                return Err(super::store::store_error(store));
            }
            return Err(PyRuntimeError::new_err(format!("controller {:?} could not start: {e}", &*this.name)));
        }
        lifecycle(py, "track", slf)
    }

    /// Starts, then blocks until the controller is stopped (by `stop()` from
    /// another thread). Ctrl-C (SIGINT) or SIGTERM (when it has no handler
    /// of the program's own) stops it with drain, for at most `stop_timeout`
    /// seconds (None: until the reconciles return); a second signal during
    /// the drain stops at once (running reconciles are cancelled and left
    /// to return on their own). Either way `run()` then returns normally;
    /// the keys it left are logged. After `start()`, it only blocks until
    /// the controller is stopped; stopped before it ever started, it
    /// raises RuntimeError, as `start()` does. Raises
    /// RuntimeError when called from one of this controller's reconciles
    /// (it would wait for itself).
    #[pyo3(signature = (stop_timeout=None))]
    fn run(slf: &Bound<'_, Self>, stop_timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let py = slf.py();
        slf.get().refuse_on_own_worker("run()")?;
        let stop_timeout = timeout_from_py(stop_timeout)?;
        let handle = &slf.get().handle;
        let _sigterm = SigtermAsInterrupt::install(py)?;
        // A Ctrl-C may land while start() runs Python code, too. Started
        // already: run() only blocks until stopped (at once if it is).
        let started = handle.has_started();
        let waited = (if started { Ok(()) } else { Self::start(slf) })
            .and_then(|()| wait_interruptibly(py, None, |slice| handle.wait_stopped(slice).then_some(())));
        match waited {
            Ok(_) => Ok(()),
            Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => {
                let draining =
                    ("controller %r: stopping on a signal, draining (a second signal stops at once)", &*slf.get().name);
                // A second signal may land in the logging call itself.
                let stopped = match try_log(py, "warning", draining, None) {
                    Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => Err(e),
                    _ => Self::stop_reporting(slf, true, stop_timeout),
                };
                match stopped {
                    Ok(report) if report.finished => Ok(()),
                    Ok(report) => {
                        let left = report.unfinished.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?;
                        log(
                            py,
                            "warning",
                            ("controller %r: stop_timeout passed; left running: %r", &*slf.get().name, left),
                            None,
                        );
                        Ok(())
                    }
                    Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => {
                        // The drain was cut short (or never began): stop at
                        // once, cancelling the running reconciles, and give
                        // those that heed it a moment to return (a third
                        // signal cuts this short too).
                        if !slf.get().stopping() {
                            Self::stop_reporting(slf, false, Some(Duration::ZERO))?;
                        }
                        let deadline = deadline_after(Instant::now(), SECOND_SIGNAL_GRACE);
                        let returned =
                            wait_interruptibly(py, Some(deadline), |slice| handle.wait_stopped(slice).then_some(()));
                        let returned = matches!(returned, Ok(Some(())));
                        let what = if returned {
                            "controller %r: second signal; stopped at once (running reconciles were cancelled and returned)"
                        } else {
                            "controller %r: second signal; stopped without waiting for running reconciles"
                        };
                        log(py, "warning", (what, &*slf.get().name), None);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => {
                let _ = Self::stop(slf, true, None);
                Err(e)
            }
        }
    }

    /// Stops the controller; returns whether every worker finished within
    /// `timeout` seconds (None: no limit). With `drain`, keys ready now are
    /// still reconciled and delayed keys dropped; without, workers finish
    /// their current reconcile and ready keys are abandoned. Every trigger's
    /// stop event is set. Stopping twice, or before start, returns True.
    /// Called from a reconcile of this controller, it starts the stop and
    /// returns False at once (it cannot wait for itself).
    #[pyo3(signature = (drain=true, timeout=None))]
    fn stop(slf: &Bound<'_, Self>, drain: bool, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = timeout_from_py(timeout)?;
        Ok(Self::stop_reporting(slf, drain, timeout)?.finished)
    }

    /// `stop(drain=True, timeout)` that also says what it left: a dict with
    /// `finished` (every worker finished in time), `unfinished` (keys whose
    /// reconcile was still running at the deadline) and `dropped` (keys
    /// dropped without a reconcile: waiting on a delay or a retry, or ready
    /// at the deadline) and, with a store, `store_error` (why the stop's
    /// last flush failed, else None; the file then keeps the last
    /// successful flush), and `unfinished_caches`: the names of the caches
    /// this stop stopped whose thread was still in its source at the
    /// deadline (a `list` or iterator that ignores its stop event), left
    /// behind.
    #[pyo3(signature = (timeout=None))]
    fn stop_with_report<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let timeout = timeout_from_py(timeout)?;
        let report = Self::stop_reporting(slf, true, timeout)?;
        let keys = |keys: &[PyKey]| -> PyResult<Bound<'py, PyList>> {
            PyList::new(py, keys.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?)
        };
        let d = PyDict::new(py);
        d.set_item("finished", report.finished)?;
        d.set_item("unfinished", keys(&report.unfinished)?)?;
        d.set_item("dropped", keys(&report.dropped)?)?;
        d.set_item("unfinished_caches", &report.unfinished_caches)?;
        if slf.get().handle.core.rt.get().is_some_and(|rt| rt.store.is_some()) {
            // With a store only, as in `stats()`.
            d.set_item("store_error", report.store_error.as_deref())?;
        }
        Ok(d)
    }

    /// Blocks until nothing is ready, being reconciled or waiting for a due
    /// time; returns False if `timeout` seconds passed first. Once it
    /// returns True, `stats()` counts every reconcile that has returned.
    /// Keys waiting for a retry or a `Requeue(after=)` resync count as
    /// busy, so a controller that resyncs never becomes idle. Raises
    /// RuntimeError when called from one of this controller's reconciles
    /// (it would wait for itself).
    #[pyo3(signature = (timeout=None))]
    fn wait_idle(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = timeout_from_py(timeout)?;
        self.refuse_on_own_worker("wait_idle()")?;
        let deadline = timeout.map(|t| deadline_after(Instant::now(), t));
        let handle = &self.handle;
        let idle =
            wait_interruptibly(py, deadline, |slice| handle.wait_idle(slice.unwrap_or(Duration::MAX)).then_some(()))?;
        Ok(idle.is_some())
    }

    /// Blocks (without the GIL) until everything enqueued or changed
    /// (done, retried, delayed, parked) before the call is on disk in the
    /// controller's store, without waiting for `flush_interval`: the point
    /// to record a change feed's position from. Raises OSError (or
    /// ValueError) naming the store error when the write fails (the keys
    /// stay pending and are written again at the next flush), and
    /// RuntimeError before start(). Without a store it returns at once;
    /// after stop() it returns the outcome of the stop's last flush.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let pending = self.handle.ask_flush().map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let outcome = wait_interruptibly(py, None, |slice| pending.wait(slice))?.expect("waited without a deadline");
        outcome.map_err(|e| super::store::store_error(&e))
    }

    /// Counters, queue sizes, hanging reconciles, the last error.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let handle = &self.handle;
        let (stats, hanging) = py.detach(|| handle.core.stats_and_hanging());
        let d = super::status::stats_to_py(py, &self.name, self.workers, handle.state(), &stats, hanging)?;
        if self.grouped {
            let by_group = PyDict::new(py);
            for (group, running) in handle.in_flight_by_group::<PyKey>() {
                let group = match group {
                    Some(g) => g.to_py(py)?,
                    None => py.None().into_bound(py),
                };
                by_group.set_item(group, running)?;
            }
            d.set_item("in_flight_by_group", by_group)?;
        }
        Ok(d)
    }

    /// With `sharding`: the partitions this replica owns now (empty
    /// before start, or while cut off from etcd).
    fn owned_partitions(&self, py: Python<'_>) -> std::collections::BTreeSet<u32> {
        let handle = &self.handle;
        py.detach(|| handle.owned_partitions())
    }

    /// Cancels the running reconcile of `key` (cooperatively: it sees
    /// `reconq.context().cancelled`); returns whether one was running.
    fn cancel(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.handle.cancel(&PyKey::from_py(key)?))
    }

    /// Where `key` stands: a dict with `state` ("unknown", "ready",
    /// "waiting", "running" or "parked"), `attempts`, `last_error`,
    /// `next_run` (a time.time() timestamp or None) and `since` (when the
    /// running reconcile started, or None).
    fn inspect<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let key = PyKey::from_py(key)?;
        let handle = &self.handle;
        let info = py.detach(|| handle.inspect(&key));
        let (state, since) = match info.state {
            KeyStatus::Unknown => ("unknown", None),
            KeyStatus::Ready => ("ready", None),
            KeyStatus::Waiting { .. } => ("waiting", None),
            KeyStatus::Running { since } => ("running", Some(instant_to_wall(since))),
            KeyStatus::Parked => ("parked", None),
        };
        let d = PyDict::new(py);
        d.set_item("state", state)?;
        d.set_item("attempts", info.attempts)?;
        d.set_item("last_error", info.last_error)?;
        d.set_item("next_run", info.next_run.map(instant_to_wall))?;
        d.set_item("since", since)?;
        let waiting_for = py.detach(|| handle.waiting_for(&key));
        d.set_item("waiting_for", keys_to_py(py, &waiting_for)?)?;
        Ok(d)
    }

    /// Keys that failed permanently (raised PermanentError), oldest first.
    fn parked<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        keys_to_py(py, &self.handle.parked())
    }

    /// Makes `key` run after `parents` (a list or any iterable of keys but
    /// a str, bytes or tuple, which are keys themselves): replaces its
    /// earlier parents (`[]` clears them), enqueues nothing, may be called
    /// before start. Raises `CycleError` (nothing changed) if they would
    /// close a cycle.
    fn set_dependencies(&self, py: Python<'_>, key: &Bound<'_, PyAny>, parents: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        let parents = parents_from_py(parents)?;
        let handle = &self.handle;
        py.detach(|| handle.set_dependencies(&key, parents)).map_err(|cycle| {
            let names = cycle.keys.iter().map(|k| Ok(k.to_py(py)?.str()?.to_string())).collect::<PyResult<Vec<_>>>();
            match names {
                Ok(names) => super::errors::CycleError::new_err(format!(
                    "set_dependencies: these parents would close a cycle: {} -> {}",
                    names.join(" -> "),
                    names[0]
                )),
                Err(e) => e,
            }
        })
    }

    /// A batch, for a `with` block (guarantees §15, U3): while any block is
    /// open (any thread, nested or overlapping), no key that becomes ready
    /// is handed out; when the last one exits, they are scheduled together,
    /// parents first. May be used before start.
    fn batch(&self) -> PyBatch {
        PyBatch { handle: self.handle.clone(), open: Mutex::new(None) }
    }

    /// `key`'s direct parents (`[]` if none).
    fn dependencies<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let key = PyKey::from_py(key)?;
        keys_to_py(py, &self.handle.dependencies(&key))
    }

    /// `key`'s direct dependents (`[]` if none).
    fn dependents<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let key = PyKey::from_py(key)?;
        keys_to_py(py, &self.handle.dependents(&key))
    }

    /// Takes `key` out of the parked set and enqueues it; returns whether it
    /// was parked.
    fn requeue_parked(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.handle.requeue_parked(&PyKey::from_py(key)?))
    }

    /// Reconciles what changes in `cache` (guarantees §13): each change
    /// enqueues the keys `map(key, obj)` gives (default: the key; for a
    /// delete `obj` is the last state held, or None; an update maps the old
    /// object, then the new one, and enqueues both results), if
    /// `predicate(old, new)` accepts it (default: every delete, every put
    /// whose object differs); at `priority` for live changes and
    /// `list_priority` for lists, relists and the `resync` every `resync`
    /// seconds. A `map` or `predicate` that raises is logged and counted
    /// (`stats()["handler_errors"]`), and the changed key is enqueued.
    /// Watched before `start()`, the cache holds the controller until it
    /// has synced and its keys reached the controller (and `start()`
    /// starts it); after, it is started at once and holds nothing. Returns
    /// at once: the keys a synced cache already holds go through `map` on
    /// a catch-up thread of the cache. RuntimeError if the cache or the
    /// controller was stopped.
    #[pyo3(
        signature = (cache, map=None, predicate=None, resync=None, priority=0, list_priority=-100),
        text_signature = "($self, cache, map=None, predicate=None, resync=None, priority=0, list_priority=-100)"
    )]
    #[allow(clippy::too_many_arguments)] // the Python signature (guarantees §13)
    fn watch_cache(
        &self,
        py: Python<'_>,
        cache: &Bound<'_, PyAny>,
        map: Option<&Bound<'_, PyAny>>,
        predicate: Option<&Bound<'_, PyAny>>,
        resync: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = priority_from_py)] priority: i32,
        #[pyo3(from_py_with = priority_from_py)] list_priority: i32,
    ) -> PyResult<()> {
        let cache = cache
            .cast::<PyCache>()
            .map_err(|_| PyTypeError::new_err(format!("cache must be a reconq.Cache, not {}", type_name(cache))))?;
        let watch = watch_from_py(map, predicate, resync, priority, list_priority)?;
        let handle = &self.handle;
        let core = &cache.get().cache;
        py.detach(|| handle.watch_cache(core, watch)).map_err(|e| match e {
            WatchError::StoreMismatch(_) => PyValueError::new_err(e.to_string()),
            e => PyRuntimeError::new_err(e.to_string()),
        })?;
        self.watched.lock().push(cache.clone().unbind());
        Ok(())
    }

    /// Blocks (GIL released) until every cache this controller watches
    /// has synced and every key it held then has reached the controller;
    /// returns whether they have: True at once if it watches
    /// none, False at once if one was stopped unsynced, or after `timeout`
    /// seconds (None: no limit).
    #[pyo3(signature = (timeout=None))]
    fn wait_synced(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let handle = &self.handle;
        wait_synced_interruptibly(py, timeout_from_py(timeout)?, |slice| handle.wait_synced(slice))
    }

    /// Runs `fn(stop_event)` (`stop_event` a `threading.Event`) on its own
    /// thread and enqueues `key` when it returns, unless it raised or its
    /// stop event was set. A second trigger for `key` replaces (stops) this
    /// one; `remove_trigger(key)` and `stop()` set its stop event. Ignored
    /// once stopped.
    #[pyo3(name = "add_trigger")]
    fn add_trigger(&self, py: Python<'_>, key: &Bound<'_, PyAny>, r#fn: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        check_sync_callable(r#fn, "fn", 1)?;
        let event = py.import("threading")?.getattr("Event")?.call0()?;
        let (id, replaced) = {
            let mut reg = self.triggers.lock();
            if reg.closed {
                None
            } else {
                let id = reg.next_id;
                reg.next_id += 1;
                Some((id, reg.map.insert(key.clone(), (id, event.clone().unbind()))))
            }
        }
        .map_or((None, None), |(id, replaced)| (Some(id), replaced));
        if let Some((_, old)) = replaced {
            old.bind(py).call_method0("set")?;
        }
        let Some(id) = id else {
            return Ok(()); // stopping
        };
        let registry = Arc::clone(&self.triggers);
        let name = Arc::clone(&self.name);
        let trigger = r#fn.clone().unbind();
        let event = event.unbind();
        let trigger_key = key.clone();
        let handle = &self.handle;
        py.detach(move || {
            handle.add_trigger(key, move |_signal: &StopSignal| -> bool {
                let fired = attach(|py| {
                    let event = event.bind(py);
                    let result = trigger.bind(py).call1((event,));
                    let mine = {
                        let mut reg = registry.lock();
                        match reg.map.get(&trigger_key) {
                            Some((live, _)) if *live == id => reg.map.remove(&trigger_key),
                            _ => None,
                        }
                    };
                    drop(mine);
                    match result {
                        Ok(_) => !event.is_truthy_method(),
                        Err(e) => {
                            let message = super::errors::describe(py, &e);
                            let key = trigger_key.to_py(py).map(|obj| trigger_key.log_repr(&obj)).unwrap_or_default();
                            log(
                                py,
                                "error",
                                ("controller %r: trigger for %s raised: %s", &*name, key, message),
                                Some(&e),
                            );
                            false
                        }
                    }
                });
                fired.unwrap_or(false)
            });
        });
        Ok(())
    }

    /// Sets the stop event of the trigger for `key` (it will not enqueue);
    /// returns whether there was one running.
    fn remove_trigger(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = PyKey::from_py(key)?;
        let existed = self.handle.remove_trigger(&key);
        let removed = self.triggers.lock().map.remove(&key);
        if let Some((_, event)) = removed {
            event.bind(py).call_method0("set")?;
        }
        Ok(existed)
    }

    /// Consumes `iterable` on its own thread and enqueues `transform(event)`
    /// (or the event itself) for each event: a list enqueues each element,
    /// anything else (a tuple too) is one key. Bad keys and exceptions in
    /// `transform` are logged and skipped; an exception from the iterable
    /// ends the watch. Ignored once stopped.
    #[pyo3(signature = (iterable, transform=None))]
    fn watch(&self, py: Python<'_>, iterable: &Bound<'_, PyAny>, transform: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let transform = optional_callable(transform, "transform", 1)?;
        let iter = iterable.try_iter()?.unbind();
        if self.stopping() {
            return Ok(());
        }
        let events = PyEvents { iter: Some(iter), name: Arc::clone(&self.name) };
        let name = Arc::clone(&self.name);
        let handle = &self.handle;
        py.detach(move || {
            handle.watch(events, move |event: Py<PyAny>| keys_from_event(&name, transform.as_ref(), event));
        });
        Ok(())
    }

    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<Self>> {
        Self::start(slf)?;
        Ok(slf.clone().unbind())
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        slf: &Bound<'_, Self>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        // Bounded, so leaving the block cannot hang on a stuck reconcile.
        let bound = slf.py().import("reconq._lifecycle")?.getattr("WITH_EXIT_TIMEOUT")?;
        let bound = non_negative_from_py(&bound, "reconq._lifecycle.WITH_EXIT_TIMEOUT")?;
        Self::stop_reporting(slf, true, Some(bound)).map(drop)
    }

    fn __repr__(&self) -> String {
        let s = self.handle.stats();
        format!(
            "<reconq.Controller name={:?} workers={} state={} reconciles={} successes={} failures={} requeues={} depth={} processing={} waiting={}>",
            &*self.name,
            self.workers,
            self.handle.state().as_str(),
            s.reconciles,
            s.successes,
            s.failures,
            s.requeues,
            s.depth,
            s.processing,
            s.waiting
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(callback) = self.callback.try_lock()
            && let Some(callback) = callback.as_ref()
        {
            visit.call(&**callback)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        // Only reachable for a controller that is not running (a running one
        // is referenced by reconq._lifecycle).
        if let Some(mut callback) = self.callback.try_lock() {
            let taken = callback.take();
            drop(callback);
            drop(taken);
        }
    }
}

/// `event.is_set()` for a `threading.Event`, false on any error.
trait EventExt {
    fn is_truthy_method(&self) -> bool;
}

impl EventExt for Bound<'_, PyAny> {
    fn is_truthy_method(&self) -> bool {
        self.call_method0("is_set").and_then(|v| v.is_truthy()).unwrap_or(false)
    }
}
