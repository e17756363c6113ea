//! `async def` reconciles and Manager `do` functions: a worker thread that
//! got an awaitable back waits for it to run on an asyncio event loop.
//!
//! The engine stays free of any async runtime: the only loop is Python's
//! asyncio, on a thread the binding owns (`reconq._aio.EventLoopThread`,
//! one per controller or manager, started at the first awaitable) or the
//! loop the user passed. The worker submits the awaitable as a task
//! (`reconq._aio.Run`) and blocks, detached, on its context's
//! [`StopSignal`]: the task's done callback ([`TaskDone`]) wakes it with
//! [`StopSignal::notify`], a cancellation with [`StopSignal::set`], so one
//! condition variable serves both and nothing polls. Cancelled (stop,
//! `cancel(key)`, a timeout, supersede, lost leadership or partition), the
//! worker cancels the task (`task.cancel()`: the coroutine sees
//! `asyncio.CancelledError`) and still waits for it to end, as it waits for
//! a sync reconcile that was cancelled, so never two runs of one key at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use super::context::PyContext;
use crate::context::{Context, StopSignal};

/// Whether a reconcile's result is to be awaited: its type has `__await__`
/// (coroutines, tasks, futures, any awaitable class). Asked only of results
/// that are not None, so a sync reconcile's success pays nothing.
pub(crate) fn is_awaitable(result: &Bound<'_, PyAny>) -> bool {
    result.get_type().hasattr(pyo3::intern!(result.py(), "__await__")).unwrap_or(false)
}

/// The event loop of one controller or manager: a
/// `reconq._aio.EventLoopThread` (ours, started lazily, or the user's).
/// Made at the first awaitable unless the user passed a loop, so a
/// program whose reconciles are all sync never imports asyncio.
pub(crate) struct EventLoop {
    name: String,
    runner: PyOnceLock<Py<PyAny>>,
}

/// `reconq._aio`, imported once.
static AIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn aio(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(AIO.get_or_try_init(py, || Ok::<_, PyErr>(py.import("reconq._aio")?.unbind()))?.bind(py))
}

impl EventLoop {
    /// The loop for the owner named `name`: `user_loop` if given (and not
    /// None), else a thread `reconq-<name>-asyncio` started when first
    /// needed. `TypeError` if `user_loop` is not an asyncio event loop.
    pub(crate) fn new(py: Python<'_>, name: &str, user_loop: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let event_loop = Self { name: name.to_owned(), runner: PyOnceLock::new() };
        if let Some(user_loop) = user_loop.filter(|l| !l.is_none()) {
            // Checked now: a wrong `loop=` is the constructor's error.
            let runner = aio(py)?.getattr("EventLoopThread")?.call1((name, user_loop))?.unbind();
            let _ = event_loop.runner.set(py, runner);
        }
        Ok(event_loop)
    }

    /// The runner, ours made (not started: its thread starts at the first
    /// task) on first use.
    fn runner<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyAny>> {
        let runner = self.runner.get_or_try_init(py, || {
            Ok::<_, PyErr>(aio(py)?.getattr("EventLoopThread")?.call1((&self.name, py.None()))?.unbind())
        })?;
        Ok(runner.bind(py))
    }

    /// Ends our loop's thread (never the user's loop). Only once no worker
    /// waits on it: the owner's workers have exited.
    pub(crate) fn stop(&self, py: Python<'_>) -> PyResult<()> {
        match self.runner.get(py) {
            Some(runner) => runner.call_method0(py, "stop").map(drop),
            None => Ok(()),
        }
    }

    /// Whether the caller is a task on this loop: a blocking call from
    /// there (a stop waiting for the workers) would wait for itself.
    pub(crate) fn on_loop_thread(&self, py: Python<'_>) -> bool {
        let Some(runner) = self.runner.get(py) else { return false };
        runner.call_method0(py, "on_loop_thread").and_then(|b| b.is_truthy(py)).unwrap_or(false)
    }

    /// Runs `awaitable` as a task on the loop, with `reconq.context()`
    /// answering `key` and `ctx` inside it, and waits (detached) for it to
    /// end; cancels the task when `ctx` is cancelled. Returns what it
    /// returned, or its exception (`asyncio.CancelledError` if cancelled).
    pub(crate) fn run<'py>(
        &self,
        awaitable: Bound<'py, PyAny>,
        key: &Bound<'py, PyAny>,
        ctx: &Context,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = awaitable.py();
        let signal = ctx.cancel_signal();
        let finished = Arc::new(AtomicBool::new(false));
        let done = TaskDone { finished: Arc::clone(&finished), signal: signal.clone() };
        let loop_ = self.runner(py)?.call_method0("loop")?;
        let context = PyContext::snapshot(key, ctx);
        let run = aio(py)?.getattr("Run")?.call1((loop_, awaitable, context, done))?;
        let is_finished = || finished.load(Ordering::Acquire);
        py.detach(|| signal.wait_for(|| is_finished() || signal.is_set()));
        if !is_finished() {
            run.call_method0("cancel")?;
            py.detach(|| signal.wait_for(is_finished));
        }
        run.call_method0("result")
    }
}

/// The done callback of one task: called on the loop's thread, it wakes
/// the worker waiting in [`EventLoop::run`].
#[pyclass(frozen)]
struct TaskDone {
    finished: Arc<AtomicBool>,
    signal: StopSignal,
}

#[pymethods]
impl TaskDone {
    fn __call__(&self) {
        self.finished.store(true, Ordering::Release);
        self.signal.notify();
    }
}
