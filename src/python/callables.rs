//! Checks of the Python callables reconq calls from its own threads.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

static IS_COROUTINE_FUNCTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

static IS_ASYNC_GENERATOR_FUNCTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

static SIGNATURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `inspect.<name>`, looked up once into `cell`.
fn inspect<'py>(py: Python<'py>, cell: &'static PyOnceLock<Py<PyAny>>, name: &str) -> PyResult<&'py Bound<'py, PyAny>> {
    Ok(cell.get_or_try_init(py, || Ok::<_, PyErr>(py.import("inspect")?.getattr(name)?.unbind()))?.bind(py))
}

/// `obj` must be callable and neither an `async def` function nor an
/// async generator function: engine threads call it directly, with no
/// event loop, so a coroutine function would return a coroutine that never
/// runs, and an async generator one an iterator that is not one (`what`
/// names the argument). It must also accept `args` positional arguments
/// where Python can tell (see [`arguments_taken`]).
pub(crate) fn check_sync_callable(obj: &Bound<'_, PyAny>, what: &str, args: usize) -> PyResult<()> {
    check_sync_callable_of(obj, what, &[args]).map(drop)
}

/// [`check_sync_callable`] for a callable that may take one of several
/// numbers of positional arguments: the first of `choices` it accepts,
/// which is the number to call it with (`choices[0]` if Python cannot
/// tell).
pub(crate) fn check_sync_callable_of(obj: &Bound<'_, PyAny>, what: &str, choices: &[usize]) -> PyResult<usize> {
    let py = obj.py();
    if !obj.is_callable() {
        let kind = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("{what} must be callable, not {kind}")));
    }
    let kinds = [
        (&IS_COROUTINE_FUNCTION, "iscoroutinefunction", "a coroutine function (async def)"),
        (&IS_ASYNC_GENERATOR_FUNCTION, "isasyncgenfunction", "an async generator function (async def with yield)"),
    ];
    for (cell, check, kind) in kinds {
        if inspect(py, cell, check)?.call1((obj,))?.is_truthy()? {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a plain function, not {kind}: reconq calls it on its own threads, with no event loop"
            )));
        }
    }
    arguments_taken(obj, what, choices)
}

/// The first of `choices` (numbers of positional arguments) a call of
/// `obj` accepts: checked now, with `inspect.signature`, because a wrong
/// signature would otherwise show only when the engine calls it, as a
/// failure retried forever. A callable without a signature (some
/// builtins) is taken to accept `choices[0]`.
fn arguments_taken(obj: &Bound<'_, PyAny>, what: &str, choices: &[usize]) -> PyResult<usize> {
    let py = obj.py();
    let signature = match inspect(py, &SIGNATURE, "signature")?.call1((obj,)) {
        Ok(signature) => signature,
        Err(e) if e.is_instance_of::<PyValueError>(py) || e.is_instance_of::<PyTypeError>(py) => return Ok(choices[0]),
        Err(e) => return Err(e),
    };
    let mut refusal = None;
    for &args in choices {
        let placeholders = PyTuple::new(py, (0..args).map(|_| py.None()))?;
        match signature.call_method1("bind", placeholders) {
            Ok(_) => return Ok(args),
            Err(e) if e.is_instance_of::<PyTypeError>(py) => refusal = Some(e),
            Err(e) => return Err(e),
        }
    }
    let takes: Vec<String> = choices.iter().map(|&args| takes(args)).collect();
    let refusal = refusal.map(|e| e.value(py).to_string()).unwrap_or_default();
    Err(PyTypeError::new_err(format!(
        "{what} must accept {}, but its signature is {signature} ({refusal})",
        takes.join(" or ")
    )))
}

fn takes(args: usize) -> String {
    match args {
        0 => "no arguments".to_owned(),
        1 => "one positional argument".to_owned(),
        n => format!("{n} positional arguments"),
    }
}
