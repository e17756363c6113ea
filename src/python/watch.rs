//! `Controller.watch_cache(cache, map=None, predicate=None, resync=None,
//! priority=0, list_priority=-100)` (guarantees §13, E2, E5–E7): the Rust
//! [`Watch`] options from Python.
//!
//! `map` and `predicate` run on the cache's thread (or its catch-up thread,
//! for the keys a synced cache held when the watch began; `map` also on
//! the resync thread), attached only while in Python. An exception, or a `map` result
//! that is not keys, is the handler's failure: the controller logs it as
//! an ERROR, counts it in `stats()["handler_errors"]` and enqueues the
//! changed key itself (E6).

use std::time::Duration;

use pyo3::prelude::*;

use super::attach::{attach, attached_scope};
use super::cache_values::PyObj;
use super::convert::{check_sync_callable, positive_from_py};
use super::errors::describe;
use super::key::PyKey;
use super::killable_call::call;
use super::sources::AnySource;
use crate::controller::Watch;

fn optional_obj<'py>(py: Python<'py>, obj: Option<&PyObj>) -> Bound<'py, PyAny> {
    obj.map_or_else(|| py.None().into_bound(py), |obj| obj.to_py(py))
}

fn interpreter_gone() -> String {
    "the Python interpreter is shutting down".to_owned()
}

/// An optional callable of two arguments.
fn handler(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Py<PyAny>>> {
    match obj {
        Some(f) if !f.is_none() => {
            check_sync_callable(f, what, 2)?;
            Ok(Some(f.clone().unbind()))
        }
        _ => Ok(None),
    }
}

/// The watch options, checked (nothing is changed by a bad one).
pub(crate) fn watch_from_py(
    map: Option<&Bound<'_, PyAny>>,
    predicate: Option<&Bound<'_, PyAny>>,
    resync: Option<&Bound<'_, PyAny>>,
    priority: i32,
    list_priority: i32,
) -> PyResult<Watch<AnySource, PyKey>> {
    let map = handler(map, "map")?;
    let predicate = handler(predicate, "predicate")?;
    let map_or_predicate = map.is_some() || predicate.is_some();
    let resync: Option<Duration> =
        resync.filter(|r| !r.is_none()).map(|r| positive_from_py(r, "resync")).transpose()?;
    let mut watch = match map {
        None => Watch::new(),
        Some(map) => Watch::with_fallible_map(move |key: &PyKey, obj: Option<&PyObj>| {
            attach(|py| {
                let keys = key.to_py(py).and_then(|k| call(map.bind(py), (k, optional_obj(py, obj))));
                keys.and_then(|keys| PyKey::one_or_many(&keys)).map_err(|e| describe(py, &e))
            })
            .unwrap_or_else(|| Err(interpreter_gone()))
        }),
    };
    if let Some(predicate) = predicate {
        watch = watch.fallible_predicate(move |old: Option<&PyObj>, new: Option<&PyObj>| {
            attach(|py| {
                let accepted = call(predicate.bind(py), (optional_obj(py, old), optional_obj(py, new)));
                accepted.and_then(|a| a.is_truthy()).map_err(|e| describe(py, &e))
            })
            .unwrap_or_else(|| Err(interpreter_gone()))
        });
    }
    if map_or_predicate {
        watch = watch.handlers_in(attached_scope());
    }
    if let Some(every) = resync {
        watch = watch.resync(every).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    }
    Ok(watch.priority(priority).list_priority(list_priority))
}
