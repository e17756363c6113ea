//! `reconq.status()` and `reconq.format_status()`: the global status
//! (`reconq::status`) as Python dicts and as a table.
//!
//! The snapshot is taken detached from the interpreter (it takes engine
//! locks, and a worker holding none may be waiting to attach); the dicts are
//! built afterwards, with no engine lock held. After `os.fork()` the child
//! forgets the parent's controllers (see `observe::registry`), so a status
//! taken there never waits on a lock a parent thread held at the fork.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::convert::{to_secs, unix_timestamp};
use super::key::PyKey;
use crate::controller::Stats;
use crate::observe::fields::{Field, Visit, Walk};
use crate::{
    observe::status::HangingKey, observe::status::RunState, observe::status::format_table, observe::status::snapshot,
};

/// Renders a walk into a dict: the Python side of `observe::fields`, for
/// every dict of the status vocabulary (`status()` entries, `stats()`,
/// `Manager.status()`).
struct PyFields<'py> {
    dict: Bound<'py, PyDict>,
}

impl Visit for PyFields<'_> {
    type Error = PyErr;

    fn field(&mut self, name: &'static str, value: Field<'_>) -> PyResult<()> {
        let py = self.dict.py();
        match value {
            Field::Count(n) => self.dict.set_item(name, n),
            Field::MaybeCount(n) => self.dict.set_item(name, n),
            Field::Flag(flag) => self.dict.set_item(name, flag),
            Field::Text(text) => self.dict.set_item(name, text),
            Field::Time(at) => self.dict.set_item(name, at.map(unix_timestamp)),
            Field::Seconds(d) => self.dict.set_item(name, d.map(to_secs)),
            Field::Hanging(keys) => {
                let hanging = PyDict::new(py);
                for h in keys {
                    hanging.set_item(hanging_key_to_py(py, h)?, to_secs(h.running))?;
                }
                self.dict.set_item(name, hanging)
            }
            Field::ByPriority(ready) => {
                let by_priority = PyDict::new(py);
                for (priority, n) in ready {
                    by_priority.set_item(priority, n)?;
                }
                self.dict.set_item(name, by_priority)
            }
        }
    }
}

/// The key as the Python object it was made from, or its repr for keys
/// that are not Python keys.
fn hanging_key_to_py<'py>(py: Python<'py>, hanging: &HangingKey) -> PyResult<Bound<'py, PyAny>> {
    match hanging.downcast_ref::<PyKey>() {
        Some(key) => key.to_py(py),
        None => Ok(PyString::new(py, &hanging.key).into_any()),
    }
}

/// `shape`'s fields as a dict.
pub(crate) fn to_py<'py>(py: Python<'py>, shape: &impl Walk) -> PyResult<Bound<'py, PyDict>> {
    let mut fields = PyFields { dict: PyDict::new(py) };
    shape.walk(&mut fields)?;
    Ok(fields.dict)
}

/// A controller's `stats()`: its name, workers and state, then `stats`
/// with its `hanging` keys.
pub(crate) fn stats_to_py<'py>(
    py: Python<'py>,
    name: &str,
    workers: usize,
    state: RunState,
    stats: &Stats,
    hanging: Vec<(PyKey, std::time::Duration)>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut fields = PyFields { dict: PyDict::new(py) };
    fields.field("name", Field::text(name))?;
    fields.field("workers", Field::size(workers))?;
    fields.field("state", Field::text(state.as_str()))?;
    let hanging: Vec<HangingKey> = hanging.into_iter().map(|(key, running)| HangingKey::new(key, running)).collect();
    stats.walk(&hanging, &mut fields)?;
    Ok(fields.dict)
}

/// Every live Controller, every named controller of every live Manager and
/// every live Cache in this process: one dict each, controllers first, then
/// periodic ones, then caches, each kind sorted by name. See the stub (`reconq._native.pyi`) for the keys.
#[pyfunction]
fn status<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
    let entries = py.detach(snapshot);
    let list = PyList::empty(py);
    for e in &entries {
        list.append(to_py(py, e)?)?;
    }
    Ok(list)
}

/// `status()` as an aligned text table under a summary line.
#[pyfunction]
fn format_status(py: Python<'_>) -> String {
    py.detach(|| format_table(&snapshot()))
}

/// After `os.fork()`, in the child (`reconq._lifecycle`'s at-fork hook):
/// see `observe::registry`.
#[pyfunction]
fn _after_fork_in_child() {
    crate::observe::after_fork_in_child();
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(status, m)?)?;
    m.add_function(wrap_pyfunction!(format_status, m)?)?;
    // Private: set as an attribute, so it stays out of `__all__`.
    m.as_any().setattr("_after_fork_in_child", wrap_pyfunction!(_after_fork_in_child, m)?)
}
