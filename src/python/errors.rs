//! Exceptions and reconcile results.
//!
//! `ShutDown`, `CycleError` and `StoreLocked` are imported here from
//! `python/reconq/_errors.py`. `Requeue`, `RetryAfter` and `PermanentError`
//! are plain Python classes (`python/reconq/_results.py`) so users can
//! subclass and pickle them freely; the Rust side finds them through
//! [`result_types`] and turns what a reconcile did into an [`Outcome`] with
//! [`classify`] (guarantees §4, the reconcile results table).

use std::time::Duration;

use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::convert::{delay_from_py, type_name};

// reconq's own exceptions are Python classes (`python/reconq/_errors.py`)
// under one base, `reconq.ReconqError`, so `CycleError` can also be a
// `ValueError`; each is imported once, when first raised.
pyo3::import_exception!(reconq._errors, CycleError);
pyo3::import_exception!(reconq._errors, ShutDown);
pyo3::import_exception!(reconq._errors, StoreLocked);

/// The result classes of `reconq._results`, imported once.
pub(crate) struct ResultTypes {
    pub(crate) requeue: Py<PyType>,
    pub(crate) retry_after: Py<PyType>,
    pub(crate) permanent_error: Py<PyType>,
}

static RESULT_TYPES: PyOnceLock<ResultTypes> = PyOnceLock::new();

pub(crate) fn result_types(py: Python<'_>) -> PyResult<&ResultTypes> {
    RESULT_TYPES.get_or_try_init(py, || {
        let m = py.import("reconq._results")?;
        let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
        Ok(ResultTypes {
            requeue: get("Requeue")?,
            retry_after: get("RetryAfter")?,
            permanent_error: get("PermanentError")?,
        })
    })
}

/// What the controller does after a reconcile (guarantees §4 table).
pub(crate) enum Outcome {
    /// Returned `None`: `forget(key)`, counted as a success.
    Success,
    /// Returned `Requeue()`: `add_rate_limited(key)`, counted as a requeue.
    Requeue,
    /// Returned `Requeue(after=s)`: `forget(key)`, `add_after(key, s)`; a requeue.
    RequeueAfter(Duration),
    /// Raised `RetryAfter(s)`: `add_after(key, s)`; a failure.
    RetryAfter(Duration, String),
    /// Raised `PermanentError`: `forget(key)`, no retry; a failure.
    Permanent(String),
    /// Raised any other `Exception`, or returned something else:
    /// `add_rate_limited(key)`; a failure.
    Failed(String),
    /// Raised a `BaseException` that is not an `Exception` (`KeyboardInterrupt`,
    /// `SystemExit`, a Rust panic): the caller decides; retried like `Failed`
    /// unless it stops.
    Fatal(PyErr),
}

/// `"ExceptionType: message"`, as `stats()["last_error"]` shows it.
pub(crate) fn describe(py: Python<'_>, err: &PyErr) -> String {
    let ty = err.get_type(py);
    let name = ty.qualname().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
    let msg = err.value(py).str().map(|s| s.to_string()).unwrap_or_default();
    if msg.is_empty() { name } else { format!("{name}: {msg}") }
}

/// Classifies what a reconcile callback returned or raised.
pub(crate) fn classify(py: Python<'_>, result: PyResult<Bound<'_, PyAny>>) -> Outcome {
    let types = match result_types(py) {
        Ok(t) => t,
        Err(e) => return Outcome::Fatal(e),
    };
    match result {
        Ok(value) if value.is_none() => Outcome::Success,
        Ok(value) if value.is_instance(types.requeue.bind(py)).unwrap_or(false) => match value.getattr("after") {
            Ok(after) if after.is_none() => Outcome::Requeue,
            Ok(after) => match delay_from_py(&after, "Requeue.after") {
                Ok(d) => Outcome::RequeueAfter(d),
                Err(e) => Outcome::Failed(describe(py, &e)),
            },
            Err(e) => Outcome::Failed(describe(py, &e)),
        },
        Ok(value) => {
            let type_name = type_name(&value);
            let e = PyTypeError::new_err(format!("reconcile must return None or reconq.Requeue, not {type_name}"));
            Outcome::Failed(describe(py, &e))
        }
        Err(err) => {
            let value = err.value(py);
            if value.is_instance(types.retry_after.bind(py)).unwrap_or(false) {
                match value.getattr("after").and_then(|a| delay_from_py(&a, "RetryAfter.after")) {
                    Ok(d) => Outcome::RetryAfter(d, describe(py, &err)),
                    Err(e) => Outcome::Failed(describe(py, &e)),
                }
            } else if value.is_instance(types.permanent_error.bind(py)).unwrap_or(false) {
                Outcome::Permanent(describe(py, &err))
            } else if err.is_instance_of::<PyException>(py) {
                Outcome::Failed(describe(py, &err))
            } else {
                Outcome::Fatal(err)
            }
        }
    }
}
