//! `reconq.SqliteStore` and the `store=` option's value.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::convert::positive_secs;
use super::errors::StoreLocked;
use crate::store::{SqliteStore, StoreError, is_open_in_this_process};

/// The Python exception for a store error: `StoreLocked`, `ValueError`
/// (not a database, newer schema) or `OSError`.
pub(crate) fn store_error(err: &StoreError) -> PyErr {
    match err {
        StoreError::Locked(_) => StoreLocked::new_err(err.to_string()),
        StoreError::Invalid(_) => PyValueError::new_err(err.to_string()),
        StoreError::Io(_) => PyOSError::new_err(err.to_string()),
    }
}

/// Refuses `sqlite3.connect` on a store file this process has open: a
/// second SQLite library in one process ignores our locks and corrupts the
/// file or crashes the process (see `crate::store` `open_files`). An audit
/// hook (PEP 578) is the stdlib's own way to veto an operation.
#[pyfunction]
fn refuse_sqlite3_on_open_stores(py: Python<'_>, event: &str, args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
    if event != "sqlite3.connect" {
        return Ok(());
    }
    let Some(path) = args.get_item(0).ok().and_then(|database| database.extract::<PathBuf>().ok()) else {
        return Ok(());
    };
    // A URI (`file:state.db?mode=ro`) names the file before its query.
    let text = path.to_string_lossy();
    let file =
        text.strip_prefix("file:").map_or(path.as_path(), |rest| Path::new(rest.split('?').next().unwrap_or("")));
    if !is_open_in_this_process(file) {
        return Ok(());
    }
    let error = py.import("sqlite3")?.getattr("OperationalError")?;
    Err(PyErr::from_value(error.call1((format!(
        "{} is a reconq store open in this process: a second SQLite library in one process (this sqlite3 \
         module) ignores its locks and can corrupt it or crash the process. Read it from another process \
         (the sqlite3 shell, a script), or after the store is closed",
        path.display()
    ),))?))
}

/// Installs [`refuse_sqlite3_on_open_stores`] once, when Python first
/// opens a store.
fn guard_against_second_sqlite(py: Python<'_>) -> PyResult<()> {
    static INSTALLED: Once = Once::new();
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        result = wrap_pyfunction!(refuse_sqlite3_on_open_stores, py)
            .and_then(|hook| py.import("sys")?.call_method1("addaudithook", (hook,)).map(drop));
    });
    result
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
        guard_against_second_sqlite(py)?;
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
    guard_against_second_sqlite(py)?;
    py.detach(|| SqliteStore::open_with_flush_interval(path, Duration::from_secs(1))).map_err(|e| store_error(&e))
}
