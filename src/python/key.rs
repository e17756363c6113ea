//! Python keys as a Rust value that hashes and compares without the GIL.
//!
//! Accepted (guarantees §4): `str`, `int` (which includes `bool`), `bytes`, and
//! tuples of these, nested; subclasses of `str`/`int`/`bytes` too. Anything
//! else is a `TypeError` naming the type, raised at the call that passed it.
//!
//! Equality follows Python's `==` for these types: `True == 1`, so `True` and
//! `1` are the same key, and a key added as `True` comes back as `1`; a `str`
//! subclass comes back as a plain `str`. What comes back always compares equal
//! (`==`) to what went in, and hashes equally.

use std::fmt;
use std::sync::Arc;

use pyo3::exceptions::{PyOverflowError, PyRecursionError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyList, PyString, PyTuple};

use super::convert::type_name;
use crate::key_encoding::{
    StoreKey, TAG_BYTES, TAG_INT, TAG_STR, decode_int, decode_len_prefixed, decode_tuple_header, encode_int,
    encode_len_prefixed, encode_tuple_header,
};

/// Nesting deeper than this is refused (it would only risk the stack).
const MAX_DEPTH: usize = 64;

/// A queue key taken from Python.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum PyKey {
    Int(i64),
    Str(Arc<str>),
    /// A `str` holding lone surrogates (not valid UTF-8), kept as its
    /// `surrogatepass` UTF-8 encoding. Never equal to a `Str`, as in Python.
    SurrogateStr(Arc<[u8]>),
    Bytes(Arc<[u8]>),
    Tuple(Arc<[PyKey]>),
}

impl PyKey {
    /// Converts a Python object, or raises `TypeError` / `OverflowError`.
    pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::from_py_at(obj, 0)
    }

    /// [`from_py`](Self::from_py) for one of the keys an argument holds:
    /// the error, of the same type, begins with `what` (such as
    /// `parents[2]`), so it names the argument.
    pub(crate) fn from_py_in(obj: &Bound<'_, PyAny>, what: impl fmt::Display) -> PyResult<Self> {
        Self::from_py(obj).map_err(|e| {
            let py = obj.py();
            PyErr::from_type(e.get_type(py), format!("{what}: {}", e.value(py)))
        })
    }

    fn from_py_at(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Self> {
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(match s.to_cow() {
                Ok(s) => PyKey::Str(Arc::from(s)),
                Err(_) => {
                    let encoded = s.call_method1("encode", ("utf-8", "surrogatepass"))?;
                    PyKey::SurrogateStr(Arc::from(encoded.cast::<PyBytes>()?.as_bytes()))
                }
            });
        }
        if let Ok(i) = obj.cast::<PyInt>() {
            return i
                .extract::<i64>()
                .map(PyKey::Int)
                .map_err(|_| PyOverflowError::new_err("int keys must fit in a signed 64-bit integer"));
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(PyKey::Bytes(Arc::from(b.as_bytes())));
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            if depth >= MAX_DEPTH {
                return Err(PyRecursionError::new_err(format!("tuple keys may be nested at most {MAX_DEPTH} deep")));
            }
            let items = t.iter().map(|item| Self::from_py_at(&item, depth + 1)).collect::<PyResult<Vec<_>>>()?;
            return Ok(PyKey::Tuple(items.into()));
        }
        let type_name = type_name(obj);
        Err(PyTypeError::new_err(format!("keys must be str, int, bytes or tuples of these, not {type_name}")))
    }

    /// The keys a user function returned where one key or several may come
    /// back (a watch's `map`, an index function): a `str`, `int`, `bytes`
    /// or tuple is one key (not its letters or items), None is none, any
    /// other iterable gives one key per element.
    pub(crate) fn one_or_many(value: &Bound<'_, PyAny>) -> PyResult<Vec<Self>> {
        if value.is_none() {
            return Ok(Vec::new());
        }
        let one = value.is_instance_of::<PyString>()
            || value.is_instance_of::<PyInt>()
            || value.is_instance_of::<PyBytes>()
            || value.is_instance_of::<PyTuple>();
        if one {
            return Ok(vec![Self::from_py(value)?]);
        }
        value.try_iter()?.map(|key| Self::from_py(&key?)).collect()
    }

    /// A Python value equal (`==`) to the one the key was made from.
    pub(crate) fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            PyKey::Int(i) => i.into_pyobject(py)?.into_any(),
            PyKey::Str(s) => PyString::new(py, s).into_any(),
            PyKey::SurrogateStr(b) => PyBytes::new(py, b).call_method1("decode", ("utf-8", "surrogatepass"))?,
            PyKey::Bytes(b) => PyBytes::new(py, b).into_any(),
            PyKey::Tuple(items) => {
                let items = items.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any()
            }
        })
    }
}

impl PyKey {
    /// The key as a log line shows it: Python's `repr` of `obj` (the key as
    /// a Python value), or for a key too long for a log line its Python-like
    /// notation cut at `logs::KEY_CHARS` (which costs no more than a short
    /// key: the cut stops the formatting).
    pub(crate) fn log_repr(&self, obj: &Bound<'_, PyAny>) -> String {
        let short = format!("{:?}", crate::logs::Short(self));
        if crate::logs::was_cut(&short) {
            return short;
        }
        obj.repr().map(|r| r.to_string()).unwrap_or(short)
    }
}

/// Python-like notation, for logs and error messages.
impl fmt::Debug for PyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyKey::Int(i) => write!(f, "{i}"),
            PyKey::Str(s) => write!(f, "{s:?}"),
            PyKey::SurrogateStr(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            PyKey::Bytes(b) => {
                f.write_str("b'")?;
                for &byte in b.iter() {
                    match byte {
                        b'\\' => f.write_str("\\\\")?,
                        b'\'' => f.write_str("\\'")?,
                        0x20..=0x7e => write!(f, "{}", byte as char)?,
                        _ => write!(f, "\\x{byte:02x}")?,
                    }
                }
                f.write_str("'")
            }
            PyKey::Tuple(items) => {
                f.write_str("(")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item:?}")?;
                }
                if items.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for PyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The documented key encoding (`crate::key_encoding`): the same bytes as
/// Rust keys of the same shape, for the store and for `partition_of`.
impl StoreKey for PyKey {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            PyKey::Int(i) => encode_int(*i, out),
            PyKey::Str(s) => encode_len_prefixed(TAG_STR, s.as_bytes(), out),
            // Lone surrogates: their `surrogatepass` bytes under the str tag
            // (not UTF-8, so a Rust `String` refuses them).
            PyKey::SurrogateStr(b) => encode_len_prefixed(TAG_STR, b, out),
            PyKey::Bytes(b) => encode_len_prefixed(TAG_BYTES, b, out),
            PyKey::Tuple(items) => {
                encode_tuple_header(items.len(), out);
                for item in items.iter() {
                    item.encode(out);
                }
            }
        }
    }

    fn decode(input: &mut &[u8]) -> Option<Self> {
        match *input.first()? {
            TAG_INT => decode_int(input).map(PyKey::Int),
            TAG_STR => {
                let bytes = decode_len_prefixed(TAG_STR, input)?;
                Some(match std::str::from_utf8(bytes) {
                    Ok(s) => PyKey::Str(s.into()),
                    Err(_) => PyKey::SurrogateStr(bytes.into()),
                })
            }
            TAG_BYTES => decode_len_prefixed(TAG_BYTES, input).map(|b| PyKey::Bytes(b.into())),
            _ => {
                let arity = decode_tuple_header(input)?;
                let items = (0..arity).map(|_| PyKey::decode(input)).collect::<Option<Vec<_>>>()?;
                Some(PyKey::Tuple(items.into()))
            }
        }
    }
}

/// Keys as a Python list.
pub(crate) fn keys_to_py<'py>(py: Python<'py>, keys: &[PyKey]) -> PyResult<Bound<'py, PyList>> {
    let items = keys.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// `set_dependencies`'s `parents`: an iterable of keys, but not a str,
/// bytes or tuple (each of those is a key itself: `["a"]`, not `"a"`).
pub(crate) fn parents_from_py(parents: &Bound<'_, PyAny>) -> PyResult<Vec<PyKey>> {
    if parents.is_instance_of::<PyString>()
        || parents.is_instance_of::<PyBytes>()
        || parents.is_instance_of::<PyTuple>()
    {
        return Err(PyTypeError::new_err(format!(
            "parents must be a list of keys, not a {} (a key itself: wrap it in a list)",
            type_name(parents)
        )));
    }
    let iter = parents
        .try_iter()
        .map_err(|_| PyTypeError::new_err(format!("parents must be a list of keys, not {}", type_name(parents))))?;
    iter.enumerate().map(|(nth, parent)| PyKey::from_py_in(&parent?, format_args!("parents[{nth}]"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_python_like() {
        let k =
            PyKey::Tuple(vec![PyKey::Str("a".into()), PyKey::Int(-3), PyKey::Bytes(Arc::from(&b"x\0'"[..]))].into());
        assert_eq!(format!("{k:?}"), r#"("a", -3, b'x\x00\'')"#);
        assert_eq!(format!("{:?}", PyKey::Tuple(vec![PyKey::Int(1)].into())), "(1,)");
    }
}
