//! The glue between the Rust controller and Python callables: the
//! [`Reconciler`] that calls a Python `reconcile(key)` (awaiting it on the
//! controller's event loop when it is `async def`: `awaiting`) and maps its
//! result onto the guarantees §4 table, and Python iterators as watch
//! sources.
//!
//! GIL discipline: engine threads attach once for their lifetime (see
//! `attach`) and stay
//! detached while in Rust (blocked on the queue, taking engine locks); the
//! callbacks here re-attach (cheap: the thread state already exists) only
//! around Python calls, and are always called with no engine lock held.

use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyList};

use super::attach::attach;
use super::awaiting::{EventLoop, is_awaitable};
use super::context::with_scope;
use super::errors::{Outcome, classify, describe};
use super::key::PyKey;
use super::killable_call::call;
use super::logs::{Fields, log_about};
use crate::logs::{Loudness, failure_loudness};
use crate::{context::Context, controller::Action, controller::ReconcileError, controller::Reconciler};

/// The Python callable a controller calls; emptied when the controller stops
/// (or is garbage-collected), which breaks reference cycles through it.
pub(crate) type CallbackCell = Mutex<Option<Arc<Py<PyAny>>>>;

/// Calls a Python `reconcile(key)` (guarantees §4's table).
pub(crate) struct PyReconciler {
    pub(crate) callback: Arc<CallbackCell>,
    pub(crate) name: Arc<str>,
    /// Where an `async def` reconcile's coroutine runs.
    pub(crate) event_loop: Arc<EventLoop>,
}

impl Reconciler<PyKey> for PyReconciler {
    fn reconcile(&self, key: &PyKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let callback = self.callback.lock().clone();
        let Some(callback) = callback else {
            return Err(ReconcileError::new("the controller was stopped"));
        };
        attach(|py| self.call(py, &callback, key, ctx))
            .unwrap_or_else(|| Err(ReconcileError::new("the Python interpreter is shutting down")))
    }
}

impl PyReconciler {
    fn call(&self, py: Python<'_>, callback: &Py<PyAny>, key: &PyKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let key_obj = match key.to_py(py) {
            Ok(k) => k,
            Err(e) => return Err(ReconcileError::new(describe(py, &e))),
        };
        let result = with_scope(&key_obj, ctx, || call(callback.bind(py), (&key_obj,)));
        // An `async def` reconcile (or one returning an awaitable): its
        // outcome is what the awaitable gives, classified the same way.
        let result = match result {
            Ok(value) if !value.is_none() && is_awaitable(&value) => self.event_loop.run(value, &key_obj, ctx),
            other => other,
        };
        let raised = result.as_ref().err().map(|e| e.clone_ref(py));
        let failed = |level: &str, message: &str, exc: Option<&PyErr>| {
            self.log_failure(py, key, &key_obj, ctx, level, message, exc);
        };
        match classify(py, result) {
            Outcome::Success => Ok(Action::Done),
            Outcome::Requeue => Ok(Action::Requeue),
            Outcome::RequeueAfter(d) => Ok(Action::RequeueAfter(d)),
            Outcome::RetryAfter(d, message) => {
                failed("warning", &message, None);
                Err(ReconcileError::retry_after(d, message))
            }
            Outcome::Permanent(message) => {
                failed("error", &message, raised.as_ref());
                Err(ReconcileError::permanent(message))
            }
            Outcome::Failed(message) => {
                failed("error", &message, raised.as_ref());
                Err(ReconcileError::new(message))
            }
            Outcome::Fatal(err) => {
                // KeyboardInterrupt, SystemExit... on a worker thread: a
                // failure like any other; the worker goes on.
                let message = describe(py, &err);
                failed("error", &message, Some(&err));
                Err(ReconcileError::new(message))
            }
        }
    }

    /// Logs a failed reconcile of `key` (`key_obj` in Python) at `level`,
    /// with `exc`'s traceback; a repeat of the key's previous error more
    /// quietly and without its traceback (see `logs::failure_loudness`).
    ///
    /// Cold and out of line: inlined into `call`, this code sat in the
    /// success path every worker runs per key and spread it over more
    /// instruction-cache lines (cachegrind on P1 at one worker: 43 L1i misses
    /// a key, 17 before the third wave added it, 16 with it out of line).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn log_failure(
        &self,
        py: Python<'_>,
        key: &PyKey,
        key_obj: &Bound<'_, PyAny>,
        ctx: &Context,
        level: &str,
        message: &str,
        exc: Option<&PyErr>,
    ) {
        let attempt = ctx.attempt();
        let (level, exc, what) = match failure_loudness(attempt, ctx.previous_error.as_deref(), message) {
            Loudness::Full => (level, exc, "failed"),
            Loudness::Again => ("warning", None, "failed again"),
            Loudness::Quiet => ("debug", None, "failed again"),
        };
        let shown = key.log_repr(key_obj);
        let args = ("controller %r: reconcile of %s %s (attempt %d): %s", &*self.name, shown, what, attempt, message);
        let fields = Fields { controller: Some(&self.name), key: Some(key_obj), attempt: Some(attempt) };
        log_about(py, level, args, exc, &fields);
    }
}

/// A Python iterator as the event source of a watch. Ends at
/// `StopIteration`, or at an exception (logged).
pub(crate) struct PyEvents {
    pub(crate) iter: Option<Py<PyIterator>>,
    pub(crate) name: Arc<str>,
}

impl Iterator for PyEvents {
    type Item = Py<PyAny>;

    fn next(&mut self) -> Option<Py<PyAny>> {
        let iter = self.iter.as_ref()?;
        let next = attach(|py| match iter.bind(py).clone().next() {
            Some(Ok(event)) => Some(event.unbind()),
            Some(Err(e)) => {
                let message = describe(py, &e);
                let args = ("controller %r: watch iterable raised: %s", &*self.name, message);
                log_about(py, "error", args, Some(&e), &Fields::controller(&self.name));
                None
            }
            None => None,
        })
        .flatten();
        if next.is_none() {
            self.release();
        }
        next
    }
}

impl PyEvents {
    fn release(&mut self) {
        if let Some(iter) = self.iter.take() {
            // Decref now if we can; otherwise PyO3 defers it.
            let _ = attach(move |_py| drop(iter));
        }
    }
}

impl Drop for PyEvents {
    fn drop(&mut self) {
        self.release();
    }
}

/// The keys a watch enqueues for one event: `transform(event)` (or the
/// event), a `list` giving one key per element. Bad keys and exceptions in
/// `transform` are logged and skipped.
/// `reprlib.repr(obj)`: a repr of any object short enough for a log line
/// (an event or a bad key can be arbitrarily large).
fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let py = obj.py();
    py.import("reprlib")
        .and_then(|reprlib| reprlib.call_method1("repr", (obj,)))
        .and_then(|r| r.extract::<String>())
        .unwrap_or_else(|e| format!("<unprintable: {}>", describe(py, &e)))
}

pub(crate) fn keys_from_event(name: &str, transform: Option<&Py<PyAny>>, event: Py<PyAny>) -> Vec<PyKey> {
    attach(|py| {
        let event = event.into_bound(py);
        let value = match transform {
            Some(t) => match call(t.bind(py), (&event,)) {
                Ok(v) => v,
                Err(e) => {
                    let message = describe(py, &e);
                    let args =
                        ("controller %r: watch transform raised for event %s: %s", name, short_repr(&event), message);
                    log_about(py, "error", args, Some(&e), &Fields::controller(name));
                    return Vec::new();
                }
            },
            None => event,
        };
        let convert = |item: &Bound<'_, PyAny>| match PyKey::from_py(item) {
            Ok(k) => Some(k),
            Err(e) => {
                let message = describe(py, &e);
                let item = short_repr(item);
                let args = ("controller %r: watch produced a bad key %s: %s", name, item, message);
                log_about(py, "error", args, None, &Fields::controller(name));
                None
            }
        };
        match value.cast::<PyList>() {
            Ok(list) => list.iter().filter_map(|item| convert(&item)).collect(),
            Err(_) => convert(&value).into_iter().collect(),
        }
    })
    .unwrap_or_default()
}
