//! A Python controller's start, stop and run, over the engine's
//! [`Stopping`](crate::controller::Stopping).
//!
//! * Every blocking wait here runs detached; on the main thread in slices
//!   of at most 100 ms with `check_signals()` between (`signals`), so
//!   Ctrl-C gets through, with no helper thread.
//! * What a first and a second signal do to `run()` is the engine's rule
//!   ([`on_signal`]); this file only waits for it as Python must.
//! * A started controller is kept in `reconq._lifecycle` until stopped, and
//!   an `atexit` hook stops the ones still running (with drain) so the
//!   interpreter exits cleanly.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;

use crate::controller::run_signals::on_signal;
use crate::controller::{Controller, ControllerHandle, StopOptions, StopReport};
use crate::observe::status::RunState;
use crate::python::attach::attach;
use crate::python::awaiting::EventLoop;
use crate::python::cache::PyCache;
use crate::python::convert::timeout_from_py;
use crate::python::errors::describe;
use crate::python::key::{PyKey, keys_to_py};
use crate::python::logs::{Fields, log_about, try_log};
use crate::python::reconciler::CallbackCell;
use crate::python::signals::{SigtermAsInterrupt, wait_interruptibly};
use crate::python::store::store_error;
use crate::store::StoreError;

/// How long a stop waits for trigger and watch threads once the workers are
/// done, when no timeout was given (a watch blocked in an iterator that never
/// yields cannot be interrupted; it is left behind).
const AUX_GRACE: Duration = Duration::from_secs(1);

/// A stop from Python: trigger and watch threads get [`AUX_GRACE`] once the
/// workers are done, then are left behind.
pub(super) fn stop_options(drain: bool, timeout: Option<Duration>) -> StopOptions {
    StopOptions { drain, timeout, aux_grace: Some(AUX_GRACE) }
}

/// What the binding holds for a controller until it stops.
pub(super) struct Held {
    /// The builder until `start` (or a stop before start) takes it.
    pub(super) builder: Mutex<Option<Controller<PyKey>>>,
    /// The reconcile callable; emptied at the stop, which breaks reference
    /// cycles through it.
    pub(super) callback: Arc<CallbackCell>,
    /// The caches it watches, held until it stops: a cache the user
    /// started and let go of must not stop under it (`PyCache`'s drop).
    pub(super) watched: Mutex<Vec<Py<PyCache>>>,
    /// Where `async def` reconciles run: our loop's thread ends once the
    /// workers exited (a worker may be waiting on a task until then).
    pub(super) event_loop: Arc<EventLoop>,
}

impl Held {
    pub(super) fn new(builder: Controller<PyKey>, callback: Arc<CallbackCell>, event_loop: Arc<EventLoop>) -> Self {
        Self { builder: Mutex::new(Some(builder)), callback, watched: Mutex::new(Vec::new()), event_loop }
    }

    /// Drops the reconcile callable.
    fn release_callback(&self) {
        let callback = self.callback.lock().take();
        drop(callback);
    }
}

/// A stop was requested (here or through the engine): enqueues from Python
/// are ignored from then on, and a start is refused.
pub(super) fn stopping(handle: &ControllerHandle<PyKey>) -> bool {
    matches!(handle.state(), RunState::Stopping | RunState::Stopped)
}

/// Refuses a call that waits for the controller to become idle or stopped
/// when made from one of its own reconciles: it would wait for itself
/// forever (the worker never returns, and a later `stop()` without a
/// timeout waits for that worker).
pub(super) fn refuse_on_own_worker(handle: &ControllerHandle<PyKey>, name: &str, call: &str) -> PyResult<()> {
    if handle.on_own_worker() {
        return Err(PyRuntimeError::new_err(format!(
            "{call} called from a reconcile of controller {name:?}: it would wait for that reconcile itself"
        )));
    }
    Ok(())
}

/// A controller as its start, stop and run see it, lent by the pyclass.
pub(super) struct Life<'a, 'py> {
    /// The controller as Python sees it: what `reconq._lifecycle` holds
    /// while it runs.
    pub(super) object: &'a Bound<'py, PyAny>,
    pub(super) name: &'a str,
    pub(super) handle: &'a ControllerHandle<PyKey>,
    pub(super) held: &'a Held,
}

impl Life<'_, '_> {
    /// Starts the worker threads (see `Controller.start`).
    pub(super) fn start(&self) -> PyResult<()> {
        let py = self.object.py();
        let handle = self.handle;
        let refused = |why: &str| PyRuntimeError::new_err(format!("controller {:?} {why}", self.name));
        // `stop()` takes the builder too: it decides which refusal this is.
        let builder = self.held.builder.lock().take();
        if stopping(handle) {
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
            py.detach(|| handle.stop());
            self.held.release_callback();
            if let Some(store) = e.get_ref().and_then(|inner| inner.downcast_ref::<StoreError>()) {
                return Err(store_error(store));
            }
            return Err(PyRuntimeError::new_err(format!("controller {:?} could not start: {e}", self.name)));
        }
        lifecycle(py, "track", self.object)
    }

    /// Stops as `options` say, and reports what was left. The engine's
    /// stop is waited for here, in slices (Ctrl-C gets through).
    pub(super) fn stop(&self, options: StopOptions) -> PyResult<StopReport<PyKey>> {
        let py = self.object.py();
        let handle = self.handle;
        // Called from a reconcile of this controller (a worker, or a task
        // of an `async def` one on its loop), waiting for the workers would
        // wait for ourselves: the stop is started here and finishes on a
        // thread of its own, without a deadline.
        let own_worker = handle.on_own_worker() || self.held.event_loop.on_loop_thread(py);
        let options = if own_worker { StopOptions { timeout: None, ..options } } else { options };
        // Detached: a stop lets go of the caches it watched, and stopping
        // one sets its source's stop event, which takes the GIL.
        let mut stopping = py.detach(|| handle.stop_with(options));
        // Never started: the stop above was all it needed.
        let unstarted = self.held.builder.lock().take();
        drop(unstarted);
        let result = if own_worker {
            let event_loop = Arc::clone(&self.held.event_loop);
            let name = self.name.to_owned();
            std::thread::spawn(move || {
                while stopping.wait(Duration::MAX).is_none() {}
                stop_event_loop(&event_loop, &name);
            });
            Ok(StopReport { finished: false, ..StopReport::finished_with_nothing_left() })
        } else {
            let stopping = Mutex::new(stopping);
            match wait_interruptibly(py, None, |slice| stopping.lock().wait(slice.unwrap_or(Duration::MAX))) {
                Ok(report) => {
                    let report = report.expect("a wait without a deadline returns the report");
                    // Workers still running (a deadline passed) may wait on
                    // a task: the loop stays, as they do (a daemon thread).
                    if report.finished {
                        stop_event_loop(&self.held.event_loop, self.name);
                    }
                    Ok(report)
                }
                Err(e) => {
                    // Interrupted (Ctrl-C): give up a drain, stop at once.
                    py.detach(|| handle.stop());
                    Err(e)
                }
            }
        };
        self.held.release_callback();
        let watched = std::mem::take(&mut *self.held.watched.lock());
        drop(watched);
        lifecycle(py, "untrack", self.object)?;
        result
    }

    /// Starts, then blocks until the controller is stopped (see
    /// `Controller.run`); a signal stops it by the engine's rule.
    pub(super) fn run(&self, stop_timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let py = self.object.py();
        let handle = self.handle;
        refuse_on_own_worker(handle, self.name, "run()")?;
        let stop_timeout = timeout_from_py(stop_timeout)?;
        let _sigterm = SigtermAsInterrupt::install(py)?;
        // A Ctrl-C may land while start() runs Python code, too. Started
        // already: run() only blocks until stopped (at once if it is).
        let started = handle.has_started();
        let waited = (if started { Ok(()) } else { self.start() })
            .and_then(|()| wait_interruptibly(py, None, |slice| handle.wait_stopped(slice).then_some(())));
        match waited {
            Ok(_) => Ok(()),
            Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => self.first_signal(stop_timeout),
            Err(e) => {
                let _ = self.stop(stop_options(true, None));
                Err(e)
            }
        }
    }

    /// The first signal: the engine's drain, for at most `stop_timeout`.
    fn first_signal(&self, stop_timeout: Option<Duration>) -> PyResult<()> {
        let py = self.object.py();
        let draining = ("controller %r: stopping on a signal, draining (a second signal stops at once)", self.name);
        // A second signal may land in the logging call itself.
        let stopped = match try_log(py, "warning", draining, None, &Fields::controller(self.name)) {
            Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => Err(e),
            _ => self.stop(StopOptions { aux_grace: Some(AUX_GRACE), ..on_signal::first(stop_timeout) }),
        };
        match stopped {
            Ok(report) if report.finished => Ok(()),
            Ok(report) => {
                let left = keys_to_py(py, &report.unfinished)?;
                let args = ("controller %r: stop_timeout passed; left running: %r", self.name, left);
                log_about(py, "warning", args, None, &Fields::controller(self.name));
                Ok(())
            }
            Err(e) if e.is_instance_of::<PyKeyboardInterrupt>(py) => self.second_signal(),
            Err(e) => Err(e),
        }
    }

    /// A second signal cut the drain short (or it never began): the
    /// binding's stop at once, unless it ran already, then the engine's
    /// rule, whose grace for the cancelled reconciles a third signal cuts
    /// short too.
    fn second_signal(&self) -> PyResult<()> {
        let py = self.object.py();
        let handle = self.handle;
        if !stopping(handle) {
            self.stop(stop_options(false, Some(Duration::ZERO)))?;
        }
        let until = on_signal::second(handle);
        let returned = wait_interruptibly(py, Some(until), |slice| handle.wait_stopped(slice).then_some(()));
        let what = if matches!(returned, Ok(Some(()))) {
            "controller %r: second signal; stopped at once (running reconciles were cancelled and returned)"
        } else {
            "controller %r: second signal; stopped without waiting for running reconciles"
        };
        log_about(py, "warning", (what, self.name), None, &Fields::controller(self.name));
        Ok(())
    }
}

/// Ends the controller's own event loop thread (see `awaiting`), logging
/// a failure: the stop itself went well.
fn stop_event_loop(event_loop: &EventLoop, name: &str) {
    attach(|py| {
        if let Err(e) = event_loop.stop(py) {
            let args = ("controller %r: could not stop its asyncio loop thread: %s", name, describe(py, &e));
            log_about(py, "error", args, Some(&e), &Fields::controller(name));
        }
    });
}

/// `reconq._lifecycle.track(controller)` or `untrack`.
fn lifecycle(py: Python<'_>, what: &str, controller: &Bound<'_, PyAny>) -> PyResult<()> {
    py.import("reconq._lifecycle")?.call_method1(what, (controller,))?;
    Ok(())
}
