//! Checks of the Python callables reconq calls from its own threads.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

static IS_COROUTINE_FUNCTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `obj` must be callable and not an `async def` function: engine threads
/// call it directly, with no event loop, so a coroutine function would
/// return a coroutine that never runs (`what` names the argument).
pub(crate) fn check_sync_callable(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    let py = obj.py();
    if !obj.is_callable() {
        let kind = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("{what} must be callable, not {kind}")));
    }
    let check = IS_COROUTINE_FUNCTION
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("inspect")?.getattr("iscoroutinefunction")?.unbind()))?;
    if check.bind(py).call1((obj,))?.is_truthy()? {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a plain function, not a coroutine function (async def): reconq calls it on its own \
             threads, with no event loop"
        )));
    }
    Ok(())
}
