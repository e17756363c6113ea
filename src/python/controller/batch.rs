//! `with c.batch():` (guarantees §15, U3) over the engine's [`Batch`].

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::controller::{Batch, ControllerHandle};
use crate::python::key::PyKey;

/// `with c.batch():` — opens at `__enter__`, closes at `__exit__` (an
/// exception in the block included, which then propagates).
#[pyclass(name = "Batch", module = "reconq", frozen)]
pub(crate) struct PyBatch {
    handle: ControllerHandle<PyKey>,
    open: Mutex<Option<Batch<PyKey>>>,
}

impl PyBatch {
    pub(super) fn new(handle: ControllerHandle<PyKey>) -> Self {
        Self { handle, open: Mutex::new(None) }
    }
}

#[pymethods]
impl PyBatch {
    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<Self>> {
        let this = slf.get();
        let mut open = this.open.lock();
        if open.is_some() {
            return Err(PyRuntimeError::new_err("this batch is already open: use a new c.batch() to nest"));
        }
        let handle = &this.handle;
        *open = Some(slf.py().detach(|| handle.batch()));
        Ok(slf.clone().unbind())
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let closed = self.open.lock().take();
        py.detach(|| drop(closed));
        false
    }
}
