//! `reconq.Sharding` and `reconq.partition_of` (guarantees §11): the Rust
//! [`Sharding`] for Python. Membership, keep-alives and watches run on its
//! own thread; only `resync` calls into Python, there.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::attach::attach;
use super::convert::{non_negative_from_py, optional_callable};
use super::election::endpoints_from_py;
use super::key::PyKey;
use super::killable_call::call;
use crate::controller::PartitionByFn;
use crate::{coordination::Sharding, coordination::partition_of};

/// Membership of a group of replicas that split the keys' `partitions`
/// between them, on the etcd at `endpoints` (one `http://host:port` or a
/// list). Pass it to one `Controller(sharding=, resync=)`: the controller
/// reconciles only the keys of the partitions this process owns. With
/// `partition_by(key) -> key`, a key belongs to the partition of the key
/// it names (guarantees §17, C3).
#[pyclass(name = "Sharding", module = "reconq", frozen)]
pub(crate) struct PySharding {
    pub(crate) inner: Sharding,
    /// `partition_by`, given to the controller that uses this sharding.
    pub(crate) partition_by: Option<Py<PyAny>>,
}

#[pymethods]
impl PySharding {
    #[new]
    #[pyo3(signature = (endpoints, name, *, partitions=64, ttl=None, identity=None, partition_by=None))]
    fn new(
        endpoints: &Bound<'_, PyAny>,
        name: &str,
        partitions: i64,
        ttl: Option<&Bound<'_, PyAny>>,
        identity: Option<String>,
        partition_by: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let partition_by = optional_callable(partition_by, "partition_by", 1)?;
        let invalid = |e: crate::error::InvalidArgument| PyValueError::new_err(e.to_string());
        let partitions = partitions_from_py(partitions)?;
        let mut sharding = Sharding::try_new(endpoints_from_py(endpoints)?, name).map_err(invalid)?;
        sharding = sharding.try_partitions(partitions).map_err(invalid)?;
        if let Some(ttl) = ttl.filter(|t| !t.is_none()) {
            sharding = sharding.try_ttl(non_negative_from_py(ttl, "ttl")?).map_err(invalid)?;
        }
        if let Some(identity) = identity {
            sharding = sharding.identity(identity);
        }
        Ok(Self { inner: sharding, partition_by })
    }

    /// The partitions this process owns now.
    fn owned_partitions(&self) -> std::collections::BTreeSet<u32> {
        self.inner.owned_partitions()
    }

    #[getter]
    fn partitions(&self) -> u32 {
        self.inner.partition_count()
    }

    /// The last error talking to etcd, or None.
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.inner.status().last_error
    }

    fn __repr__(&self) -> String {
        let s = self.inner.status();
        format!(
            "<reconq.Sharding name={:?} partitions={} owned={} members={}>",
            s.name,
            s.partitions,
            s.owned.len(),
            s.members
        )
    }
}

/// The partition of `key` among `partitions` (guarantees §11, H1): FNV-1a
/// of the key's store encoding, the same as Rust's `partition_of`. With
/// `partition_by`, that of the key `partition_by(key)` names (§17, C3), as
/// a controller with `Sharding(partition_by=)` computes it; what it raises
/// propagates.
#[pyfunction]
#[pyo3(signature = (key, partitions, partition_by=None))]
fn partition_of_py(key: &Bound<'_, PyAny>, partitions: i64, partition_by: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let partitions = partitions_from_py(partitions)?;
    let key = PyKey::from_py(key)?;
    match partition_by.filter(|f| !f.is_none()) {
        None => Ok(partition_of(&key, partitions)),
        Some(partition_by) => partition_by_py(partition_by, &key, partitions),
    }
}

/// The partition of the key `partition_by` names for `key`: what it raises
/// (or a value that is not a key: `TypeError`) is the error.
fn partition_by_py(partition_by: &Bound<'_, PyAny>, key: &PyKey, partitions: u32) -> PyResult<u32> {
    let named = call(partition_by, (key.to_py(partition_by.py())?,))?;
    Ok(partition_of(&PyKey::from_py(&named)?, partitions))
}

/// A Python `partition_by` as the controller's fallible one: an exception
/// or a value that is not a key is the failure the controller logs (it
/// then partitions the key by itself).
pub(crate) fn partition_by_from_py(partition_by: Py<PyAny>) -> Arc<PartitionByFn<PyKey>> {
    Arc::new(move |key: &PyKey, partitions: u32| {
        attach(|py| {
            partition_by_py(partition_by.bind(py), key, partitions).map_err(|e| super::errors::describe(py, &e))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    })
}

/// A partition count from Python: 1 to 2**32-1.
fn partitions_from_py(partitions: i64) -> PyResult<u32> {
    u32::try_from(partitions)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| PyValueError::new_err(format!("partitions must be between 1 and 2**32-1, got {partitions}")))
}

/// `resync` for the Rust controller: calls the Python callable (attached
/// to the interpreter) and converts what it returns; an exception is
/// logged and lists nothing.
pub(crate) fn resync_from_py(resync: Py<PyAny>) -> impl Fn() -> Vec<PyKey> + Send + Sync + 'static {
    let resync = Arc::new(resync);
    move || {
        attach(|py| {
            let listed = call(resync.bind(py), ()).and_then(|keys| {
                keys.try_iter()?.map(|key| key.and_then(|k| PyKey::from_py(&k))).collect::<PyResult<Vec<_>>>()
            });
            listed.unwrap_or_else(|e| {
                let message = super::errors::describe(py, &e);
                tracing::error!(target: "reconq::controller", error = %message, "resync raised; no keys enqueued");
                Vec::new()
            })
        })
        .unwrap_or_default()
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySharding>()?;
    let f = wrap_pyfunction!(partition_of_py, m)?;
    m.add("partition_of", f)?;
    Ok(())
}
