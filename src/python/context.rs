//! `reconq.context()` (guarantees §7): what a Python reconcile or Manager `do`
//! sees besides its key, read from a function as `contextvars`-style code
//! does, so the reconcile's signature stays `reconcile(key)`.
//!
//! The engine marks the running call with a [`Scope`] on the worker's stack
//! and a thread-local pointer to it: two plain stores per call, no
//! allocation and no reference counting, so a reconcile that never asks
//! for its context pays nothing measurable (P1 stays where it was). Only
//! `reconq.context()` builds a Python object, copying what it needs.

use std::cell::Cell;
use std::ptr;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::convert::timeout_from_py;
use super::signals::wait_for_signal;
use crate::{context::Context, context::StopSignal};

/// The call in progress on this thread: its key and its Rust [`Context`].
pub(crate) struct Scope<'a> {
    key: &'a Bound<'a, PyAny>,
    ctx: &'a Context,
}

thread_local! {
    /// The innermost [`Scope`] on this thread, or null.
    static CURRENT: Cell<*const Scope<'static>> = const { Cell::new(ptr::null()) };
}

/// Runs `call` with `reconq.context()` answering `key` and `ctx`.
///
/// Invariant: `CURRENT` points at a `Scope` only while the frame that owns
/// it is inside this function; the guard puts the previous value back on
/// every exit, unwinding included, so a dangling pointer is never visible.
pub(crate) fn with_scope<'a, R>(key: &'a Bound<'a, PyAny>, ctx: &'a Context, call: impl FnOnce() -> R) -> R {
    struct Restore(*const Scope<'static>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let scope = Scope { key, ctx };
    let pointer = (&raw const scope).cast::<Scope<'static>>();
    let _restore = Restore(CURRENT.with(|c| c.replace(pointer)));
    call()
}

/// The context of the reconcile or Manager `do` running on this thread,
/// or of the `async def` one whose task runs here (an event loop's thread:
/// see `awaiting`). Raises `RuntimeError` anywhere else.
#[pyfunction]
pub(crate) fn context(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let pointer = CURRENT.with(Cell::get);
    if pointer.is_null() {
        return task_context(py);
    }
    // SAFETY: non-null means a `with_scope` frame on this thread is live
    // (see its invariant), and we are called from inside it.
    let scope = unsafe { &*pointer };
    Ok(Py::new(py, PyContext::snapshot(scope.key, scope.ctx))?.into_any())
}

/// `reconq._aio.CURRENT`, looked up once.
static TASK_CONTEXT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The context an asyncio task of an `async def` reconcile runs with (set
/// in its `contextvars` context by `reconq._aio.Run`); `RuntimeError` when
/// there is none. Off the sync path: only where no scope is on this thread.
fn task_context(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let var =
        TASK_CONTEXT.get_or_try_init(py, || Ok::<_, PyErr>(py.import("reconq._aio")?.getattr("CURRENT")?.unbind()))?;
    let context = var.bind(py).call_method1("get", (py.None(),))?;
    if context.is_none() {
        return Err(PyRuntimeError::new_err("reconq.context() called outside a reconcile or a Manager do"));
    }
    Ok(context.unbind())
}

/// What a reconcile sees besides its key (see `reconq.context()`). Usable
/// after the reconcile returned: `cancelled` then keeps its last value.
#[pyclass(name = "Context", module = "reconq", frozen)]
pub(crate) struct PyContext {
    key: Py<PyAny>,
    attempt: u32,
    priority: i32,
    fencing_token: Option<u64>,
    signal: StopSignal,
}

impl PyContext {
    /// What `reconq.context()` answers for `key` and `ctx`, copied out.
    pub(crate) fn snapshot(key: &Bound<'_, PyAny>, ctx: &Context) -> Self {
        Self {
            key: key.clone().unbind(),
            attempt: ctx.attempt(),
            priority: ctx.priority(),
            fencing_token: ctx.fencing_token(),
            signal: ctx.cancel_signal().clone(),
        }
    }
}

#[pymethods]
impl PyContext {
    /// The key being reconciled (a Manager `do`: the controller's name).
    #[getter]
    fn key(&self, py: Python<'_>) -> Py<PyAny> {
        self.key.clone_ref(py)
    }

    /// Tries since the last success or forget: 0 on the first (a Manager
    /// `do`: its consecutive failures).
    #[getter]
    fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The priority the key was handed out with.
    #[getter]
    fn priority(&self) -> i32 {
        self.priority
    }

    /// The fencing token of the leadership this runs under; None without
    /// leader election or sharding.
    #[getter]
    fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Whether the engine wants this call to end early (stop, cancel(key),
    /// a timeout; for a Manager `do`: remove, replace, stop). Read live.
    #[getter]
    fn cancelled(&self) -> bool {
        self.signal.is_set()
    }

    /// Sleeps, with the GIL released, until cancelled or `timeout` seconds
    /// passed (None: no limit); returns whether it was cancelled.
    #[pyo3(signature = (timeout=None))]
    fn wait_cancelled(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        wait_for_signal(py, &self.signal, timeout_from_py(timeout)?)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "<reconq.Context key={} attempt={} priority={} cancelled={} fencing_token={:?}>",
            self.key.bind(py).repr()?,
            self.attempt,
            self.priority,
            self.signal.is_set(),
            self.fencing_token
        ))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyContext>()?;
    m.add_function(wrap_pyfunction!(context, m)?)?;
    Ok(())
}
