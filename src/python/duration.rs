//! Seconds (float or int) from Python to `Duration` (guarantees §4, "Durations").
//!
//! * NaN is a `ValueError` everywhere.
//! * Delays (`add_after`, `Requeue(after=)`...): negative means now.
//! * Timeouts and limiter parameters: negative is a `ValueError`.
//! * Infinity and values past `Duration::MAX` are an `OverflowError`.
//!
//! Every check runs before the call changes anything.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::errors::type_name;

/// Reads a number of seconds. `bool` is refused: `timeout=True` is a bug.
fn seconds(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be a number of seconds, not bool")));
    }
    let secs: f64 = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            return PyOverflowError::new_err(format!("{what} is out of range"));
        }
        let type_name = type_name(obj);
        PyTypeError::new_err(format!("{what} must be a number of seconds (float or int), not {type_name}"))
    })?;
    if secs.is_nan() {
        return Err(PyValueError::new_err(format!("{what} must not be NaN")));
    }
    Ok(secs)
}

fn from_secs(secs: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| out_of_range(what, secs))
}

/// The error for a number of seconds too large for a `Duration` (or an
/// instant), short however large the number: `1e300` is shown as `1e300`,
/// not as its 301 digits.
fn out_of_range(what: &str, secs: f64) -> PyErr {
    let largest = Duration::MAX.as_secs_f64();
    PyOverflowError::new_err(format!("{what} is out of range: {} seconds (at most {largest:e})", shown(secs)))
}

/// A float for an error message: `1e300` rather than its 301 digits.
pub(crate) fn shown(x: f64) -> String {
    if x.abs() < 1e15 { format!("{x}") } else { format!("{x:e}") }
}

/// A positive number of seconds (`flush_interval=`): not positive (or NaN)
/// is a `ValueError`, past `Duration::MAX` an `OverflowError` (not "not
/// positive").
pub(crate) fn positive_secs(secs: f64, what: &str) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(secs) {
        Err(_) if secs > 0.0 => Err(out_of_range(what, secs)),
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(PyValueError::new_err(format!("{what} must be a positive number of seconds, got {}", shown(secs)))),
    }
}

/// A delay: negative means now (zero).
pub(crate) fn delay_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let secs = seconds(obj, what)?;
    if secs <= 0.0 { Ok(Duration::ZERO) } else { from_secs(secs, what) }
}

/// A duration that must not be negative (timeouts, limiter parameters).
pub(crate) fn non_negative_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let secs = seconds(obj, what)?;
    if secs < 0.0 {
        return Err(PyValueError::new_err(format!("{what} must not be negative, got {secs}")));
    }
    from_secs(secs, what)
}

/// An optional timeout: `None` is "wait forever".
pub(crate) fn timeout_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    match obj {
        None => Ok(None),
        Some(obj) if obj.is_none() => Ok(None),
        Some(obj) => non_negative_from_py(obj, "timeout").map(Some),
    }
}

/// Seconds as a Python float.
pub(crate) fn to_secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A wall-clock time as a `time.time()` timestamp (negative before 1970).
pub(crate) fn unix_timestamp(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}
