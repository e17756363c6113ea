//! What a cache of a Python-facing source holds (docs/sources.md): objects,
//! positions and versions as Python values the Rust cache can keep, clone
//! and compare from its own thread.
//!
//! * Cloning never needs the interpreter (an `Arc` around the `Py`), so the
//!   cache's readers clone under its lock with the GIL released.
//! * Comparing does (Python's `==`): the cache compares on a relist, under
//!   its write lock, so it attaches there. Python code run under that lock
//!   (`==` and index functions) is marked ([`under_cache_lock`]): a cache
//!   read from it would wait for the lock its own thread holds, so reads
//!   refuse instead ([`refuse_under_cache_lock`]).
//! * etcd's revisions and versions, and Python ints that fit, are kept as
//!   `i64`: compared and shown without the interpreter.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyString};

use super::attach::attach;
use super::errors::describe;
use crate::{key_encoding::Keepable, key_encoding::encode_key};

thread_local! {
    /// This thread runs Python code under a cache's write lock.
    static UNDER_CACHE_LOCK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (Python code called by a cache under its lock) marked, so a
/// cache read from it raises instead of deadlocking.
pub(crate) fn under_cache_lock<R>(f: impl FnOnce() -> R) -> R {
    let was = UNDER_CACHE_LOCK.replace(true);
    let result = f();
    UNDER_CACHE_LOCK.set(was);
    result
}

/// Raises `RuntimeError` when called from Python code a cache runs under
/// its lock (an index function, an object's `__eq__`).
pub(crate) fn refuse_under_cache_lock() -> PyResult<()> {
    if UNDER_CACHE_LOCK.get() {
        return Err(PyRuntimeError::new_err(
            "a cache cannot be read from an index function (or an object's __eq__) while a cache applies a change",
        ));
    }
    Ok(())
}

/// A Python object kept by a cache. Equal when it is the same object or
/// Python's `==` says so (an `==` that raises: not equal, a change).
#[derive(Clone)]
pub(crate) struct PyObj(Arc<Py<PyAny>>);

impl PyObj {
    pub(crate) fn new(obj: Bound<'_, PyAny>) -> Self {
        Self(Arc::new(obj.unbind()))
    }

    pub(crate) fn to_py<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.0.bind(py).clone()
    }
}

impl PartialEq for PyObj {
    fn eq(&self, other: &Self) -> bool {
        if self.0.as_ptr() == other.0.as_ptr() {
            return true;
        }
        attach(|py| under_cache_lock(|| self.0.bind(py).eq(other.0.bind(py)).unwrap_or(false))).unwrap_or(false)
    }
}

impl fmt::Debug for PyObj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<Python object>")
    }
}

/// A position or a version from a source: an integer (etcd's revisions,
/// a poll count, a Python `int` that fits in 64 bits), or any other Python
/// object with its `repr` taken when it arrived (so status tables show it
/// without the interpreter).
#[derive(Clone)]
pub(crate) enum SourceValue {
    Int(i64),
    /// `kept`: a `str` or `bytes` in the key encoding, as a cache with a
    /// store keeps it (E9); `None` for any other object (not kept).
    Object {
        obj: PyObj,
        repr: Arc<str>,
        kept: Option<Arc<[u8]>>,
    },
}

impl SourceValue {
    pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> Self {
        if obj.is_instance_of::<PyInt>()
            && !obj.is_instance_of::<PyBool>()
            && let Ok(i) = obj.extract::<i64>()
        {
            return SourceValue::Int(i);
        }
        let py = obj.py();
        let repr = py
            .import("reprlib")
            .and_then(|reprlib| reprlib.call_method1("repr", (obj,)))
            .and_then(|r| r.extract::<String>())
            .unwrap_or_else(|e| format!("<unprintable: {}>", describe(py, &e)));
        let kept = if let Ok(text) = obj.cast_exact::<PyString>() {
            text.to_cow().ok().map(|text| encode_key(&text.into_owned()))
        } else if let Ok(bytes) = obj.cast_exact::<PyBytes>() {
            Some(encode_key(&bytes.as_bytes().to_vec()))
        } else {
            None
        };
        SourceValue::Object { obj: PyObj::new(obj.clone()), repr: repr.into(), kept: kept.map(Arc::from) }
    }

    /// `None` (no value) or the value, from Python.
    pub(crate) fn optional_from_py(obj: &Bound<'_, PyAny>) -> Option<Self> {
        (!obj.is_none()).then(|| Self::from_py(obj))
    }

    pub(crate) fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            SourceValue::Int(i) => i.into_pyobject(py)?.into_any(),
            SourceValue::Object { obj, .. } => obj.to_py(py),
        })
    }
}

impl PartialEq for SourceValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SourceValue::Int(a), SourceValue::Int(b)) => a == b,
            (SourceValue::Object { obj: a, .. }, SourceValue::Object { obj: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl fmt::Debug for SourceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceValue::Int(i) => write!(f, "{i}"),
            SourceValue::Object { repr, .. } => f.write_str(repr),
        }
    }
}

/// An `int`, `str` or `bytes` is kept as its key encoding; any other
/// object is not (E9: that key counts as changed at a restart).
impl Keepable for SourceValue {
    fn kept_bytes(&self) -> Option<Vec<u8>> {
        match self {
            SourceValue::Int(i) => Some(encode_key(i)),
            SourceValue::Object { kept, .. } => kept.as_deref().map(<[u8]>::to_vec),
        }
    }
}

impl From<i64> for SourceValue {
    fn from(i: i64) -> Self {
        SourceValue::Int(i)
    }
}
