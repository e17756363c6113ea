//! `reconq.Sharding` and `reconq.partition_of` (guarantees §11): the Rust
//! [`Sharding`] for Python. Membership, keep-alives and watches run on its
//! own thread; only `resync` calls into Python, there.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::attach::attach;
use super::convert::non_negative_from_py;
use super::election::endpoints_from_py;
use super::key::PyKey;
use crate::{coordination::Sharding, coordination::partition_of};

/// Membership of a group of replicas that split the keys' `partitions`
/// between them, on the etcd at `endpoints` (one `http://host:port` or a
/// list). Pass it to one `Controller(sharding=, resync=)`: the controller
/// reconciles only the keys of the partitions this process owns.
#[pyclass(name = "Sharding", module = "reconq", frozen)]
pub(crate) struct PySharding {
    pub(crate) inner: Sharding,
}

#[pymethods]
impl PySharding {
    #[new]
    #[pyo3(signature = (endpoints, name, *, partitions=64, ttl=None, identity=None))]
    fn new(
        endpoints: &Bound<'_, PyAny>,
        name: &str,
        partitions: i64,
        ttl: Option<&Bound<'_, PyAny>>,
        identity: Option<String>,
    ) -> PyResult<Self> {
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
        Ok(Self { inner: sharding })
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
/// of the key's store encoding, the same as Rust's `partition_of`.
#[pyfunction]
fn partition_of_py(key: &Bound<'_, PyAny>, partitions: i64) -> PyResult<u32> {
    Ok(partition_of(&PyKey::from_py(key)?, partitions_from_py(partitions)?))
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
            let listed = resync.bind(py).call0().and_then(|keys| {
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
