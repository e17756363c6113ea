//! `reconq.SqliteStore` and the `store=` option's value.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::{PyException, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::duration::positive_secs;
use crate::store::{SqliteStore, StoreError};

pyo3::create_exception!(
    reconq,
    StoreLocked,
    PyException,
    "Raised by start() when another live controller holds this name in the store file."
);

/// The Python exception for a store error: `StoreLocked`, `ValueError`
/// (not a database, newer schema) or `OSError`.
pub(crate) fn store_error(err: &StoreError) -> PyErr {
    match err {
        StoreError::Locked(_) => StoreLocked::new_err(err.to_string()),
        StoreError::Invalid(_) => PyValueError::new_err(err.to_string()),
        StoreError::Io(_) => PyOSError::new_err(err.to_string()),
    }
}

/// An embedded SQLite store for controllers' pending work.
#[pyclass(name = "SqliteStore", module = "reconq", frozen)]
pub(crate) struct PySqliteStore {
    pub(crate) store: SqliteStore,
}

#[pymethods]
impl PySqliteStore {
    #[new]
    #[pyo3(signature = (path, flush_interval=1.0))]
    fn new(py: Python<'_>, path: PathBuf, flush_interval: f64) -> PyResult<Self> {
        let interval = positive_secs(flush_interval, "flush_interval")?;
        let store = py.detach(|| SqliteStore::open_with_flush_interval(path, interval)).map_err(|e| store_error(&e))?;
        Ok(Self { store })
    }

    /// The database file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.store.path().to_path_buf()
    }

    /// Seconds between flushes, at most.
    #[getter]
    fn flush_interval(&self) -> f64 {
        self.store.flush_interval().as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!("SqliteStore({:?}, flush_interval={})", self.store.path(), self.flush_interval())
    }
}

/// The `store=` argument: a `SqliteStore`, or a path opened with the
/// default flush interval.
pub(crate) fn store_from_py(py: Python<'_>, store: &Bound<'_, PyAny>) -> PyResult<SqliteStore> {
    if let Ok(store) = store.cast::<PySqliteStore>() {
        return Ok(store.get().store.clone());
    }
    let path: PathBuf = store.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "store must be a SqliteStore or a path, not {}",
            store.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string())
        ))
    })?;
    py.detach(|| SqliteStore::open_with_flush_interval(path, Duration::from_secs(1))).map_err(|e| store_error(&e))
}

/// The store fields of `stats()` and `status()` entries: `store_pending`,
/// `last_flush_time` and `store_error`.
pub(crate) fn set_store_items(d: &Bound<'_, pyo3::types::PyDict>, store: &crate::StoreStats) -> PyResult<()> {
    d.set_item("store_pending", store.pending)?;
    d.set_item("last_flush_time", store.last_flush_time.map(super::duration::unix_timestamp))?;
    d.set_item("store_error", store.error.as_deref())
}
