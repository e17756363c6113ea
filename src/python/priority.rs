//! Priorities from Python (guarantees §8): an `int` that fits in an `i32`,
//! else an `OverflowError` naming the argument and the range (pyo3's own
//! conversion says only "out of range integral type conversion attempted").

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;

/// Longest `int` shown in full in the error; longer ones say their size.
const SHOWN_DIGITS: usize = 30;

/// Reads `priority=` (for `#[pyo3(from_py_with = ...)]`).
pub(crate) fn priority_from_py(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
    obj.extract::<i32>().map_err(|e| {
        if !e.is_instance_of::<PyOverflowError>(obj.py()) {
            return e;
        }
        let text = obj.str().map(|s| s.to_string()).unwrap_or_default();
        let got = if text.len() <= SHOWN_DIGITS { text } else { format!("an int of {} digits", text.len()) };
        PyOverflowError::new_err(format!("priority must be between {} and {}, got {got}", i32::MIN, i32::MAX))
    })
}
