//! The canonical bytes of a Python object, for a stored cache whose source
//! gives no versions (E9, `CacheBuilder::digest`): the cache keeps a hash
//! of them and compares it at a restart, so an unchanged object is not
//! reconciled again.
//!
//! Only plain data has canonical bytes: `None`, `bool`, `int`, `float`,
//! `str`, `bytes`, and `tuple`, `list` and `dict` of these (exact types: a
//! subclass may redefine `==`). Equal bytes mean the same types and
//! values, floats by their bits (so `1` and `1.0`, or `0.0` and `-0.0`,
//! differ: at worst a key counts as changed). Anything else, or nesting
//! deeper than
//! [`MAX_DEPTH`] (a list that holds itself), has none: the key counts as
//! changed at every restart, as without a digest.
//!
//! The bytes are this encoding's own (only hashed, never decoded): a tag
//! byte, then the payload; lengths and counts are u32 big-endian.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::attach::attach;
use super::cache_values::PyObj;

const NONE: u8 = 0x00;
const STR: u8 = 0x01;
/// An `int` that fits in an `i64`: its 8 bytes.
const INT: u8 = 0x02;
const BYTES: u8 = 0x03;
const TUPLE: u8 = 0x04;
const BOOL: u8 = 0x05;
/// An `int` beyond `i64`: its hexadecimal text (not decimal, which Python
/// limits to 4,300 digits).
const BIG_INT: u8 = 0x06;
const FLOAT: u8 = 0x07;
const LIST: u8 = 0x08;
/// Entries in the order of their keys' encodings, so the order the dict
/// was built in does not matter.
const DICT: u8 = 0x09;

/// How deep containers may nest.
const MAX_DEPTH: usize = 100;

/// `obj`'s canonical bytes, or `None` when it has none (see the module
/// docs).
pub(crate) fn canonical(obj: &PyObj) -> Option<Vec<u8>> {
    if let PyObj::Bytes(bytes) = obj {
        // As `bytes` from Python: the same digest whichever way it came.
        let mut out = Vec::with_capacity(bytes.len() + 5);
        return length_prefixed(BYTES, bytes, &mut out).map(|()| out);
    }
    attach(|py| {
        let mut out = Vec::new();
        encode(&obj.to_py(py), &mut out, MAX_DEPTH).map(|()| out)
    })
    .flatten()
}

fn encode(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> Option<()> {
    if obj.is_none() {
        out.push(NONE);
    } else if let Ok(b) = obj.cast_exact::<PyBool>() {
        out.extend([BOOL, u8::from(b.is_true())]);
    } else if let Ok(int) = obj.cast_exact::<PyInt>() {
        match int.extract::<i64>() {
            Ok(i) => {
                out.push(INT);
                out.extend_from_slice(&i.to_be_bytes());
            }
            Err(_) => {
                let hex: String = int.call_method1("__format__", ("x",)).ok()?.extract().ok()?;
                length_prefixed(BIG_INT, hex.as_bytes(), out)?;
            }
        }
    } else if let Ok(float) = obj.cast_exact::<PyFloat>() {
        out.push(FLOAT);
        out.extend_from_slice(&float.value().to_bits().to_be_bytes());
    } else if let Ok(text) = obj.cast_exact::<PyString>() {
        // A lone surrogate is not UTF-8: no bytes.
        length_prefixed(STR, text.to_cow().ok()?.as_bytes(), out)?;
    } else if let Ok(bytes) = obj.cast_exact::<PyBytes>() {
        length_prefixed(BYTES, bytes.as_bytes(), out)?;
    } else if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        sequence(TUPLE, tuple.len(), tuple.iter(), out, depth)?;
    } else if let Ok(list) = obj.cast_exact::<PyList>() {
        sequence(LIST, list.len(), list.iter(), out, depth)?;
    } else if let Ok(dict) = obj.cast_exact::<PyDict>() {
        let depth = depth.checked_sub(1)?;
        let mut entries = Vec::with_capacity(dict.len());
        for (key, value) in dict.iter() {
            let (mut key_bytes, mut value_bytes) = (Vec::new(), Vec::new());
            encode(&key, &mut key_bytes, depth)?;
            encode(&value, &mut value_bytes, depth)?;
            entries.push((key_bytes, value_bytes));
        }
        // By key only, stably: two keys with the same bytes (two NaN
        // objects) keep the dict's order, so dicts that map them to
        // different values never share a digest.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(DICT);
        out.extend_from_slice(&u32::try_from(entries.len()).ok()?.to_be_bytes());
        for (key, value) in entries {
            out.extend(key);
            out.extend(value);
        }
    } else {
        return None;
    }
    Some(())
}

fn length_prefixed(tag: u8, payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    out.push(tag);
    out.extend_from_slice(&u32::try_from(payload.len()).ok()?.to_be_bytes());
    out.extend_from_slice(payload);
    Some(())
}

fn sequence<'py>(
    tag: u8,
    len: usize,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    out: &mut Vec<u8>,
    depth: usize,
) -> Option<()> {
    let depth = depth.checked_sub(1)?;
    out.push(tag);
    out.extend_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
    items.map(|item| encode(&item, out, depth)).collect()
}
