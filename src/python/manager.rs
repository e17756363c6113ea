//! `reconq.Manager`: named periodic controllers (guarantees §5, Cilium's
//! `pkg/controller`) with Python `do` / `stop` callables.
//!
//! GIL discipline:
//! * Each controller thread attaches to the interpreter once for its whole
//!   life (the manager's thread wrapper) and runs detached; `do` and `stop`
//!   re-attach only for the call. The engine calls them with no lock held.
//! * Calls that may drop the last reference to old callables (`update`,
//!   `remove`, `remove_all`) run detached, so a `__del__` never runs under
//!   the manager's registry lock; the decref is deferred to the next attach.
//! * Blocking waits (`remove(wait=True)`, `remove_all(wait=True)`) run
//!   detached.
//! * Failures are logged through the `reconq` logger from the controller
//!   thread, outside every engine lock.
//!
//! Interpreter exit and fork: a manager with controllers is in
//! `reconq._lifecycle`'s registry (weakly), whose exit hook stops it with
//! [`PyManager::_stop_at_exit`]: its `stop` functions run before the
//! interpreter finalizes, and a hung `do` cannot hang the exit.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyException, PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use super::attach::{attach, python_thread_wrapper};
use super::awaiting::{EventLoop, is_awaitable};
use super::context::with_scope;
use super::convert::{check_reconcile_callable, check_sync_callable, non_negative_from_py, type_name};
use super::election::PyLeaderElection;
use super::errors::describe;
use super::killable_call;
use super::logs::{Fields, log_about};
use crate::{
    context::Context, manager::ControllerParams, manager::DoError, manager::Manager, manager::UnknownController,
};

/// Named periodic controllers: each runs its `do()` on its own thread until
/// it succeeds, then every `interval` seconds, retrying failures with linear
/// backoff; `stop()` runs once when it is removed.
///
/// `do` may be an `async def` function: it then runs as a task on the
/// asyncio loop `loop` (keyword-only; running, on a thread of the
/// user's), or on a loop thread of the manager's own
/// (`reconq-<name>-asyncio`, started at the first coroutine, ended by
/// `remove_all(wait=True)` and at exit), and is cancelled
/// (`asyncio.CancelledError`) when its context is. `stop` stays a
/// plain function.
#[pyclass(name = "Manager", module = "reconq", frozen, weakref)]
pub(crate) struct PyManager {
    manager: Manager,
    /// Where `async def` `do` functions run; our loop's thread ends when
    /// every controller was removed and waited for.
    event_loop: Arc<EventLoop>,
}

fn unknown_to_py(e: UnknownController) -> PyErr {
    PyKeyError::new_err(e.name)
}

/// A controller name: `str` (subclasses too), `TypeError` otherwise.
fn name_from_py(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyTypeError::new_err(format!("controller name must be a str, not {}", type_name(obj)))),
    }
}

/// A callable taking no arguments, as `check` accepts it: `do` (sync or
/// `async def`: `check_reconcile_callable`) or `stop` (sync only).
fn callable_from_py(
    obj: &Bound<'_, PyAny>,
    what: &str,
    check: fn(&Bound<'_, PyAny>, &str, usize) -> PyResult<()>,
) -> PyResult<Arc<Py<PyAny>>> {
    check(obj, what, 0)?;
    Ok(Arc::new(obj.clone().unbind()))
}

/// A `do` run: its context, and the loop an `async def` one runs on.
struct DoRun<'a> {
    ctx: &'a Context,
    event_loop: &'a EventLoop,
}

/// Logs a failed `do` / `stop` with its traceback.
fn log_failure(py: Python<'_>, level: &str, what: &str, name: &str, err: &PyErr) {
    let args = ("controller %r: %s raised %s", name, what, describe(py, err));
    log_about(py, level, args, Some(err), &Fields::controller(name));
}

/// Calls `f()`, turning an exception (any `BaseException`) or a Rust panic
/// into `Err("Type: message")`, logged. With `run` (a `do`),
/// `reconq.context()` inside `f` answers its context, keyed by the
/// controller's name, and an awaitable `f()` returned is awaited on its loop.
fn call_logged(f: &Py<PyAny>, what: &str, name: &str, run: Option<DoRun<'_>>) -> Result<(), String> {
    attach(|py| {
        let call = || match &run {
            Some(DoRun { ctx, event_loop }) => {
                let key = PyString::new(py, name);
                let result = with_scope(key.as_any(), ctx, || killable_call::call(f.bind(py), ()))?;
                if is_awaitable(&result) { event_loop.run(result, key.as_any(), ctx).map(drop) } else { Ok(()) }
            }
            None => killable_call::call(f.bind(py), ()).map(drop),
        };
        // A `PanicException` raised from Python turns back into a panic
        // when fetched; catch it here so it is described and logged too.
        match catch_unwind(AssertUnwindSafe(call)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => {
                let level = if what == "stop" { "error" } else { "warning" };
                log_failure(py, level, what, name, &err);
                Err(describe(py, &err))
            }
            Err(_) => {
                let err = PyException::new_err(format!("{what} panicked"));
                log_failure(py, "error", what, name, &err);
                Err(format!("PanicException: {what} panicked"))
            }
        }
    })
    .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
}

#[pymethods]
impl PyManager {
    /// `name` labels its controllers in `reconq.status()`. With
    /// `leader_election`, `do` functions run only while this process leads
    /// (one election may serve several managers and controllers).
    #[new]
    #[pyo3(signature = (name="manager", leader_election=None, *, r#loop=None))]
    fn new(
        py: Python<'_>,
        name: &str,
        leader_election: Option<PyRef<'_, PyLeaderElection>>,
        r#loop: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let event_loop = Arc::new(EventLoop::new(py, name, r#loop)?);
        let mut builder = Manager::builder()
            .name(name)
            .thread_wrapper(python_thread_wrapper())
            // `call_logged` logs exceptions itself, with their tracebacks.
            .log_errors(false);
        if let Some(election) = leader_election {
            super::election::hold_until_exit(election.py(), &election)?;
            builder = builder.leader_election(election.inner.clone());
        }
        Ok(Self { manager: builder.build(), event_loop })
    }

    /// Creates the controller `name`, or replaces its parameters; either way
    /// its (new) `do` runs at once (right after a run in progress). `do()`
    /// fails by raising; after the n-th consecutive failure the next try is
    /// `n * error_retry_base` seconds later (`no_error_retry=True`: after
    /// `interval`). After a success it runs again every `interval` seconds
    /// (`None` or 0: only on the next update or trigger). `stop()` runs once
    /// when the controller is removed, after `do` ran at least once; only the
    /// latest `stop` given runs. `error_retry_base=0` means the default, 1 s.
    /// `max_retry_interval` caps the wait after a failure (None or 0: no
    /// cap), as Cilium's `MaxRetryInterval`. Inside `do`,
    /// `reconq.context()` gives the run's context: cancelled when the
    /// controller is removed, replaced by an update, or its manager stopped.
    #[allow(clippy::too_many_arguments)] // the Python signature (guarantees §5)
    // `error_retry_base=None` is accepted too and means the default, 1.0.
    #[pyo3(
        signature = (name, r#do, *, stop=None, interval=None, error_retry_base=None, no_error_retry=false, max_retry_interval=None),
        text_signature = "($self, name, do, *, stop=None, interval=None, error_retry_base=1.0, no_error_retry=False, max_retry_interval=None)"
    )]
    fn update(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        r#do: &Bound<'_, PyAny>,
        stop: Option<&Bound<'_, PyAny>>,
        interval: Option<&Bound<'_, PyAny>>,
        error_retry_base: Option<&Bound<'_, PyAny>>,
        no_error_retry: bool,
        max_retry_interval: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        // Check everything before changing anything.
        let name = name_from_py(name)?;
        let do_fn = callable_from_py(r#do, "do", check_reconcile_callable)?;
        let stop_fn = match stop {
            Some(s) if !s.is_none() => Some(callable_from_py(s, "stop", check_sync_callable)?),
            _ => None,
        };
        let interval = match interval {
            Some(i) if !i.is_none() => Some(non_negative_from_py(i, "interval")?),
            _ => None,
        };
        let retry_base = match error_retry_base {
            Some(b) if !b.is_none() => non_negative_from_py(b, "error_retry_base")?,
            _ => crate::manager::DEFAULT_ERROR_RETRY_BASE,
        };
        let max_retry_interval = match max_retry_interval {
            Some(m) if !m.is_none() => Some(non_negative_from_py(m, "max_retry_interval")?),
            _ => None,
        };

        let do_name = name.clone();
        let event_loop = Arc::clone(&slf.get().event_loop);
        let mut params = ControllerParams::with_context(move |ctx| -> Result<(), DoError> {
            let run = DoRun { ctx, event_loop: &event_loop };
            call_logged(&do_fn, "do", &do_name, Some(run)).map_err(DoError::new)
        })
        .run_interval(interval)
        .error_retry_base(retry_base)
        .max_retry_interval(max_retry_interval)
        .no_error_retry(no_error_retry);
        if let Some(stop_fn) = stop_fn {
            let stop_name = name.clone();
            params = params.stop(move || {
                let _ = call_logged(&stop_fn, "stop", &stop_name, None);
            });
        }
        // From its first controller on, the exit hook stops it.
        py.import("reconq._lifecycle")?.call_method1("add_manager", (slf,))?;
        let manager = &slf.get().manager;
        py.detach(|| manager.try_update(name, params))?;
        Ok(())
    }

    /// Runs the controller's `do` now (or right after a run in progress).
    /// `KeyError` if there is no such controller.
    fn trigger(&self, name: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = name_from_py(name)?;
        self.manager.trigger(&name).map_err(unknown_to_py)
    }

    /// Removes the controller: it finishes a run in progress (or runs `do`
    /// once if it never ran), then `stop` runs. With `wait=True`, blocks
    /// until that is done (not when called from the controller's own `do`).
    /// `KeyError` if there is no such controller.
    #[pyo3(signature = (name, wait=false))]
    fn remove(&self, py: Python<'_>, name: &Bound<'_, PyAny>, wait: bool) -> PyResult<()> {
        let name = name_from_py(name)?;
        let manager = &self.manager;
        let removed = py.detach(|| if wait { manager.remove_and_wait(&name) } else { manager.remove(&name) });
        removed.map_err(unknown_to_py)
    }

    /// Removes every controller; with `wait=True`, blocks until all their
    /// `stop` functions ran and their threads exited.
    #[pyo3(signature = (wait=false))]
    fn remove_all(&self, py: Python<'_>, wait: bool) {
        let manager = &self.manager;
        py.detach(|| if wait { manager.remove_all_and_wait() } else { manager.remove_all() });
        if wait {
            self.stop_event_loop(py);
        }
    }

    /// One dict per controller, sorted by name: `name`, `successes`,
    /// `failures`, `consecutive_failures`, `last_error` ("Type: message" or
    /// None), `last_error_time`, `last_success_time` (`time.time()` floats or
    /// None), plus `last_duration`, `running` and `next_run_in` (seconds or
    /// None: waiting for an update or trigger).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let statuses = self.manager.status();
        let list = PyList::empty(py);
        for s in &statuses {
            list.append(super::status::to_py(py, s)?)?;
        }
        Ok(list)
    }

    /// The manager's name (shown in `reconq.status()`).
    #[getter]
    fn name(&self) -> &str {
        self.manager.name()
    }

    /// The controllers' names, sorted.
    fn names(&self) -> Vec<String> {
        self.manager.names()
    }

    fn __len__(&self) -> usize {
        self.manager.len()
    }

    fn __contains__(&self, name: &Bound<'_, PyAny>) -> bool {
        match name.cast::<PyString>() {
            Ok(s) => s.to_cow().is_ok_and(|s| self.manager.contains(&s)),
            Err(_) => false,
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// `remove_all(wait=True)`.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.remove_all(py, true);
    }

    /// The interpreter's exit (`reconq._lifecycle`): removes every
    /// controller and waits up to `timeout` seconds for their threads, on a
    /// thread of its own so a hung `do` cannot hang the exit.
    fn _stop_at_exit(&self, py: Python<'_>, timeout: f64) {
        let manager = self.manager.clone();
        let timeout = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
        let stopped = py.detach(move || {
            let (tx, rx) = crossbeam_channel::bounded::<()>(0);
            let joiner = std::thread::Builder::new().name("reconq-mgr-exit".into()).spawn(move || {
                manager.remove_all_and_wait();
                // The manager's last handle may hold Python callables: drop
                // it here, detached (the decrefs are deferred), not later.
                drop(manager);
                let _ = tx.send(());
            });
            joiner.is_ok() && rx.recv_timeout(timeout).is_ok()
        });
        // A `do` still running may wait on a task: the loop stays then.
        if stopped {
            self.stop_event_loop(py);
        }
    }

    fn __repr__(&self) -> String {
        let names = self.manager.names();
        let shown: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        format!("<reconq.Manager name={:?} controllers=[{}]>", self.manager.name(), shown.join(", "))
    }
}

impl PyManager {
    /// Ends the manager's own loop thread once no `do` runs (logged if it
    /// fails: the removal itself went well).
    fn stop_event_loop(&self, py: Python<'_>) {
        if let Err(e) = self.event_loop.stop(py) {
            log_failure(py, "error", "its asyncio loop thread's stop", self.manager.name(), &e);
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyManager>()
}
