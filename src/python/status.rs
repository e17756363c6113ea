//! `reconq.status()` and `reconq.format_status()`: the global status
//! (`reconq::status`) as Python dicts and as a table.
//!
//! The snapshot is taken detached from the interpreter (it takes engine
//! locks, and a worker holding none may be waiting to attach); the dicts are
//! built afterwards, with no engine lock held. After `os.fork()` the child
//! forgets the parent's controllers (see `observe::registry`), so a status
//! taken there never waits on a lock a parent thread held at the fork.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{to_secs, unix_timestamp};
use super::key::PyKey;
use crate::status::{EntryKind, HangingKey, StatusEntry, format_table, snapshot};

/// The key as the Python object it was made from, or its repr for keys
/// that are not Python keys.
fn hanging_key_to_py<'py>(py: Python<'py>, hanging: &HangingKey) -> PyResult<Bound<'py, PyAny>> {
    match hanging.downcast_ref::<PyKey>() {
        Some(key) => key.to_py(py),
        None => Ok(pyo3::types::PyString::new(py, &hanging.key).into_any()),
    }
}

fn entry_to_py<'py>(py: Python<'py>, e: &StatusEntry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", e.kind.label())?;
    d.set_item("name", &e.name)?;
    if let EntryKind::Periodic(p) = &e.kind {
        d.set_item("manager", &p.manager)?;
    }
    d.set_item("state", e.state())?;
    if let EntryKind::Controller(c) = &e.kind {
        d.set_item("workers", c.workers)?;
        d.set_item("reconciles", c.reconciles)?;
    }
    d.set_item("successes", e.successes)?;
    d.set_item("failures", e.failures)?;
    if let EntryKind::Controller(c) = &e.kind {
        d.set_item("requeues", c.requeues)?;
        d.set_item("panics", c.panics)?;
    }
    d.set_item("consecutive_failures", e.consecutive_failures)?;
    d.set_item("last_error", e.last_error.as_deref())?;
    d.set_item("last_error_time", e.last_error_time.map(unix_timestamp))?;
    d.set_item("last_success_time", e.last_success_time.map(unix_timestamp))?;
    match &e.kind {
        EntryKind::Controller(c) => {
            d.set_item("depth", c.depth)?;
            d.set_item("processing", c.processing)?;
            d.set_item("waiting", c.waiting)?;
            d.set_item("parked", c.parked)?;
            d.set_item("held", c.held)?;
            d.set_item("superseded", c.superseded)?;
            d.set_item("hanging_threshold", c.hanging_threshold.map(to_secs))?;
            let hanging = PyDict::new(py);
            for h in &c.hanging {
                hanging.set_item(hanging_key_to_py(py, h)?, to_secs(h.running))?;
            }
            d.set_item("hanging", hanging)?;
            set_scale_out_items(&d, c.store.as_ref(), c.leader.as_ref(), c.shards.as_ref(), c.not_owned)?;
        }
        EntryKind::Cache(c) => {
            d.set_item("synced", c.synced)?;
            d.set_item("keys", c.keys)?;
            d.set_item("position", c.position.as_deref())?;
            d.set_item("relists", c.relists)?;
        }
        EntryKind::Periodic(p) => {
            d.set_item("running", p.running)?;
            d.set_item("last_duration", p.last_duration.map(to_secs))?;
            d.set_item("next_run_in", p.next_run_in.map(to_secs))?;
            if let Some(leader) = &p.leader {
                super::election::set_leader_items(&d, leader)?;
            }
        }
    }
    Ok(d)
}

/// Every live Controller, every named controller of every live Manager and
/// every live Cache in this process: one dict each, controllers first, then
/// periodic ones, then caches, each kind sorted by name. See the stub (`reconq._native.pyi`) for the keys.
#[pyfunction]
fn status<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
    let entries = py.detach(snapshot);
    let list = PyList::empty(py);
    for e in &entries {
        list.append(entry_to_py(py, e)?)?;
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

/// The store, leader-election and sharding fields of a controller's
/// `stats()` and status entry: each only when the controller uses it.
pub(crate) fn set_scale_out_items(
    d: &Bound<'_, PyDict>,
    store: Option<&crate::StoreStats>,
    leader: Option<&crate::LeaderStatus>,
    shards: Option<&crate::ShardStatus>,
    not_owned: u64,
) -> PyResult<()> {
    if let Some(store) = store {
        super::store::set_store_items(d, store)?;
    }
    if let Some(leader) = leader {
        super::election::set_leader_items(d, leader)?;
    }
    if let Some(shards) = shards {
        d.set_item("not_owned", not_owned)?;
        super::sharding::set_shard_items(d, shards)?;
    }
    Ok(())
}
