//! `reconq.Controller`: the Rust controller with a Python reconcile function
//! (guarantees §4), triggers, watches, `enqueue_at` and hang reports
//! (guarantees §5). This file is the class and its methods, each a thin
//! call; the rooms beside it hold what the methods call:
//!
//! * `options`: `Controller(reconcile, **options)` to the engine's builder;
//! * `lifecycle`: start, stop and run, over the engine's stop and its
//!   signal rule;
//! * `triggers`: `add_trigger` over the engine's trigger registry;
//! * `batch`: `with c.batch():`.
//!
//! Every engine thread attaches once for its life (`attach`); reconcile
//! calls attach around the call only. No engine lock is held while Python
//! runs, and the small locks of the binding (the builder, the callback
//! cell, the watched caches) are never held across a Python call.

mod batch;
mod lifecycle;
mod options;
mod triggers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};
use pyo3::{PyTraverseError, PyVisit};

pub(crate) use batch::PyBatch;
use lifecycle::{Held, Life, refuse_on_own_worker, stop_options, stopping};
use options::{Built, Options};

use crate::clock::deadline_after;
use crate::controller::{ControllerHandle, DependencyError, KeyStatus, WatchError};
use crate::python::cache::PyCache;
use crate::python::convert::{
    Due, instant_to_wall, optional_callable, priority_from_py, timeout_from_py, type_name, with_exit_timeout,
};
use crate::python::election::PyLeaderElection;
use crate::python::errors::CycleError;
use crate::python::key::{PyKey, keys_to_py, parents_from_py};
use crate::python::reconciler::{PyEvents, keys_from_event};
use crate::python::sharding::PySharding;
use crate::python::signals::{wait_interruptibly, wait_synced_interruptibly};
use crate::python::store::store_error;
use crate::python::watch::watch_from_py;

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
/// Keyword-only arguments (durations in seconds; docs/guarantees.md has
/// the details):
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
///   partitions this replica owns; on gaining partitions, the keys of those
///   partitions that the watched caches map to are enqueued (deletes too).
/// - `resync=None`: with `sharding`, a callable listing every key; called
///   when partitions are gained (for keys no watched cache maps to).
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
    /// The builder, the callable and the watched caches, until it stops.
    held: Held,
    /// Built with `group=`: `stats()` reports `in_flight_by_group`.
    grouped: bool,
}

impl PyController {
    /// The controller as its start, stop and run see it.
    fn life<'a, 'py>(slf: &'a Bound<'py, Self>) -> Life<'a, 'py> {
        let this = slf.get();
        Life { object: slf.as_any(), name: &this.name, handle: &this.handle, held: &this.held }
    }

    /// Asks for `key` at `due` (the engine ignores it once a stop was
    /// requested: `Core::route`).
    fn enqueue_due(&self, key: PyKey, due: Due, priority: i32) {
        match due {
            Due::Now => self.handle.enqueue_with_priority(key, priority),
            Due::After(delay) => self.handle.enqueue_after_with_priority(key, delay, priority),
            Due::At(at) => self.handle.enqueue_at_with_priority(key, at, priority),
        }
    }
}

#[pymethods]
impl PyController {
    #[new]
    #[pyo3(signature = (
        reconcile, *, workers=1, rate_limiter=None, name="controller", hanging_threshold=None,
        timeout=None, group=None, max_in_flight_per_group=None, clock=None, jitter=None, parked_capacity=None,
        leader_election=None, store=None, sharding=None, resync=None, sync_timeout=120.0,
        supersede=false, debounce=None,
    ))]
    #[allow(clippy::too_many_arguments)] // the Python signature (guarantees §4, §7, §8)
    fn new(
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
        let options = Options {
            reconcile,
            workers,
            rate_limiter,
            name,
            hanging_threshold,
            timeout,
            group,
            max_in_flight_per_group,
            clock,
            jitter,
            parked_capacity,
            leader_election,
            store,
            sharding,
            resync,
            sync_timeout,
            supersede,
            debounce,
        };
        let Built { name, workers, builder, callback, grouped } = options.build()?;
        let handle = builder.handle();
        Ok(Self { name, workers, handle, held: Held::new(builder, callback), grouped })
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
        self.enqueue_due(PyKey::from_py(key)?, Due::Now, priority);
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
        self.enqueue_due(PyKey::from_py(key)?, Due::after(seconds)?, priority);
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
        self.enqueue_due(PyKey::from_py(key)?, Due::at(t)?, priority);
        Ok(())
    }

    /// Starts the worker threads and returns at once. Raises RuntimeError
    /// if it was started before or stopped (a controller runs once: make a
    /// new one), and, with nothing left running and the controller
    /// stopped, if the OS refuses a thread (each worker needs a stack:
    /// thousands of workers can exceed a memory or thread limit).
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::life(slf).start()
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
        Self::life(slf).run(stop_timeout)
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
        Ok(Self::life(slf).stop(stop_options(drain, timeout))?.finished)
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
        let report = Self::life(slf).stop(stop_options(true, timeout))?;
        let d = PyDict::new(py);
        d.set_item("finished", report.finished)?;
        d.set_item("unfinished", keys_to_py(py, &report.unfinished)?)?;
        d.set_item("dropped", keys_to_py(py, &report.dropped)?)?;
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
        refuse_on_own_worker(&self.handle, &self.name, "wait_idle()")?;
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
        outcome.map_err(|e| store_error(&e))
    }

    /// Counters, queue sizes, hanging reconciles, the last error.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let handle = &self.handle;
        let (stats, hanging) = py.detach(|| handle.core.stats_and_hanging());
        let d = crate::python::status::stats_to_py(py, &self.name, self.workers, handle.state(), &stats, hanging)?;
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
    /// close a cycle, and `ValueError` (nothing changed) with sharding if a
    /// parent's partition differs from the key's.
    fn set_dependencies(&self, py: Python<'_>, key: &Bound<'_, PyAny>, parents: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = PyKey::from_py(key)?;
        let parents = parents_from_py(parents)?;
        let handle = &self.handle;
        let refused = match py.detach(|| handle.set_dependencies(&key, parents)) {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        let name = |k: &PyKey| -> PyResult<String> { Ok(k.to_py(py)?.str()?.to_string()) };
        Err(match refused {
            DependencyError::Cycle(cycle) => {
                let names = cycle.keys.iter().map(name).collect::<PyResult<Vec<_>>>()?;
                CycleError::new_err(format!(
                    "set_dependencies: these parents would close a cycle: {} -> {}",
                    names.join(" -> "),
                    names[0]
                ))
            }
            DependencyError::CrossPartition(e) => PyValueError::new_err(format!(
                "set_dependencies: the parent {} (partition {}) of {} (partition {}) lies in another partition: with \
                 sharding, an edge must stay within one partition (give both keys the same partition_by value)",
                name(&e.parent)?,
                e.parent_partition,
                name(&e.key)?,
                e.key_partition
            )),
        })
    }

    /// A batch, for a `with` block (guarantees §15, U3): while any block is
    /// open (any thread, nested or overlapping), no key that becomes ready
    /// is handed out; when the last one exits, they are scheduled together,
    /// parents first. May be used before start.
    fn batch(&self) -> PyBatch {
        PyBatch::new(self.handle.clone())
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
        signature = (cache, *, map=None, predicate=None, resync=None, priority=0, list_priority=-100),
        text_signature = "($self, cache, *, map=None, predicate=None, resync=None, priority=0, list_priority=-100)"
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
        self.held.watched.lock().push(cache.clone().unbind());
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

    /// Runs `fn(stop_event)` (`stop_event` a `reconq.StopEvent`, a
    /// `threading.Event`) on its own thread and enqueues `key` when it
    /// returns, unless it raised or its stop event was set. A second
    /// trigger for `key` replaces (stops) this one; `remove_trigger(key)`
    /// and `stop()` set its stop event. Ignored once stopped.
    #[pyo3(name = "add_trigger")]
    fn add_trigger(&self, py: Python<'_>, key: &Bound<'_, PyAny>, r#fn: &Bound<'_, PyAny>) -> PyResult<()> {
        triggers::add_trigger(py, &self.handle, &self.name, PyKey::from_py(key)?, r#fn)
    }

    /// Sets the stop event of the trigger for `key` (it will not enqueue);
    /// returns whether there was one running.
    fn remove_trigger(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.handle.remove_trigger(&PyKey::from_py(key)?))
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
        if stopping(&self.handle) {
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
        let bound = with_exit_timeout(slf.py())?;
        Self::life(slf).stop(stop_options(true, Some(bound))).map(drop)
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
        if let Some(callback) = self.held.callback.try_lock()
            && let Some(callback) = callback.as_ref()
        {
            visit.call(&**callback)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        // Only reachable for a controller that is not running (a running one
        // is referenced by reconq._lifecycle).
        if let Some(mut callback) = self.held.callback.try_lock() {
            let taken = callback.take();
            drop(callback);
            drop(taken);
        }
    }
}
