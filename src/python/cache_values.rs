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
use super::value_bytes::ValueBytes;
use crate::key_encoding::{Keepable, KeptObject, decode_key, encode_key};

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

/// An object kept by a cache: a Python object, or the bytes of an etcd
/// value with no `decode` kept as Rust bytes (`bytes` to Python when
/// read).
///
/// Why the bytes stay Rust's: the cache's thread then applies an etcd
/// event and the default predicate compares it with what was held
/// without taking the GIL at all. Each GIL acquisition on that thread
/// waits behind whatever Python runs (a reconcile holding the GIL makes
/// it wait up to `sys.getswitchinterval()`, 5 ms): the put -> reconcile
/// tail (issue 36). And a value of up to 22 bytes costs nothing beyond
/// this enum ([`ValueBytes`]), instead of an `Arc` and a Python `bytes`
/// object (33 bytes and more a value): docs/sources.md, "What a key
/// costs".
#[derive(Clone)]
pub(crate) enum PyObj {
    Python(Arc<Py<PyAny>>),
    /// An etcd value (no `decode`): a new `bytes` at each read, equal to
    /// the last.
    Bytes(ValueBytes),
    /// An etcd value and what `decode` made of it, in a cache with a
    /// store: the bytes are what the store keeps, so a restart resumes
    /// (decoding them again) instead of relisting, and what two values
    /// are compared by, without the interpreter.
    Decoded(Arc<DecodedValue>),
}

/// See [`PyObj::Decoded`].
pub(crate) struct DecodedValue {
    pub(crate) raw: Box<[u8]>,
    pub(crate) obj: Py<PyAny>,
}

// The cache puts an `Arc` around each object: 16 bytes of counts and
// these 24 make one 40-byte request (malloc's 48-byte chunk). A bigger
// `PyObj` would cost every key of every cache.
const _: () = assert!(size_of::<PyObj>() == 24);

impl PyObj {
    pub(crate) fn new(obj: Bound<'_, PyAny>) -> Self {
        Self::Python(Arc::new(obj.unbind()))
    }

    pub(crate) fn to_py<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        match self {
            Self::Python(obj) => obj.bind(py).clone(),
            Self::Bytes(bytes) => PyBytes::new(py, bytes).into_any(),
            Self::Decoded(decoded) => decoded.obj.bind(py).clone(),
        }
    }
}

/// Equal when it is the same object or Python's `==` says so (an `==`
/// that raises: not equal, a change); bytes by their contents, without
/// the interpreter, and so decoded values (by the bytes decoded: one
/// `decode` makes equal objects of equal bytes). One source gives one
/// kind: two kinds are never compared (unequal).
impl PartialEq for PyObj {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Bytes(a), Self::Bytes(b)) => a == b,
            (Self::Decoded(a), Self::Decoded(b)) => a.raw == b.raw,
            (Self::Python(a), Self::Python(b)) => {
                a.as_ptr() == b.as_ptr()
                    || attach(|py| under_cache_lock(|| a.bind(py).eq(b.bind(py)).unwrap_or(false))).unwrap_or(false)
            }
            _ => false,
        }
    }
}

impl fmt::Debug for PyObj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Python(_) => f.write_str("<Python object>"),
            Self::Bytes(bytes) => write!(f, "<{} bytes>", bytes.len()),
            Self::Decoded(decoded) => write!(f, "<decoded from {} bytes>", decoded.raw.len()),
        }
    }
}

/// A position or a version from a source: an integer (etcd's revisions,
/// a poll count, a Python `int` that fits in 64 bits), or any other Python
/// object with its `repr` taken when it arrived (so status tables show it
/// without the interpreter).
///
/// 16 bytes: a cache keeps one for each key (its version), so the rare
/// object is behind one pointer and the common integer is inline.
#[derive(Clone)]
pub(crate) enum SourceValue {
    Int(i64),
    Object(Arc<SourceObject>),
}

/// A [`SourceValue`] that is not an integer.
pub(crate) struct SourceObject {
    obj: PyObj,
    repr: Box<str>,
    /// A `str` or `bytes` in the key encoding, as a cache with a store
    /// keeps it (E9); `None` for any other object (not kept).
    kept: Option<Box<[u8]>>,
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
        let kept = kept.map(Vec::into_boxed_slice);
        SourceValue::Object(Arc::new(SourceObject { obj: PyObj::new(obj.clone()), repr: repr.into(), kept }))
    }

    /// `None` (no value) or the value, from Python.
    pub(crate) fn optional_from_py(obj: &Bound<'_, PyAny>) -> Option<Self> {
        (!obj.is_none()).then(|| Self::from_py(obj))
    }

    pub(crate) fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            SourceValue::Int(i) => i.into_pyobject(py)?.into_any(),
            SourceValue::Object(object) => object.obj.to_py(py),
        })
    }
}

impl PartialEq for SourceValue {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SourceValue::Int(a), SourceValue::Int(b)) => a == b,
            (SourceValue::Object(a), SourceValue::Object(b)) => a.obj == b.obj,
            _ => false,
        }
    }
}

impl fmt::Debug for SourceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceValue::Int(i) => write!(f, "{i}"),
            SourceValue::Object(object) => f.write_str(&object.repr),
        }
    }
}

/// An `int`, `str` or `bytes` is kept as its key encoding; any other
/// object is not (E9: that key counts as changed at a restart).
impl Keepable for SourceValue {
    fn kept_bytes(&self) -> Option<Vec<u8>> {
        match self {
            SourceValue::Int(i) => Some(encode_key(i)),
            SourceValue::Object(object) => object.kept.as_deref().map(<[u8]>::to_vec),
        }
    }

    /// Only an `int` reads back without the interpreter (etcd's revisions
    /// and versions): a restart resumes only a source whose positions are
    /// ints (`EtcdSource`).
    fn from_kept_bytes(bytes: &[u8]) -> Option<Self> {
        decode_key::<i64>(bytes).map(SourceValue::Int)
    }
}

/// An etcd value is kept as its bytes, decoded or not, so a restart
/// resumes (`CacheBuilder::keep_objects`; a decoded one is read back by
/// the source's `decode`, `sources::etcd_value`); a Python object is not
/// (its cache relists at a restart, as before).
impl KeptObject for PyObj {
    fn kept_object(&self) -> Option<Vec<u8>> {
        match self {
            Self::Bytes(bytes) => Some(bytes.to_vec()),
            Self::Decoded(decoded) => Some(decoded.raw.to_vec()),
            Self::Python(_) => None,
        }
    }

    fn from_kept_object(bytes: &[u8]) -> Option<Self> {
        Some(Self::Bytes(bytes.into()))
    }
}

impl From<i64> for SourceValue {
    fn from(i: i64) -> Self {
        SourceValue::Int(i)
    }
}
