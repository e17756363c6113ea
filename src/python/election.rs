//! `reconq.LeaderElection` (guarantees §10): the Rust [`LeaderElection`] for
//! Python. Campaign, keep-alives and watches run on the election's own
//! thread, with no Python in them; the properties read its state.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::convert::non_negative_from_py;
use crate::{coordination::LeaderElection, coordination::OnLost};

/// A campaign for leadership of `name` among every process with an
/// election of that name on the same etcd (`endpoints`: one
/// `http://host:port` or a list). Pass it to `Controller(leader_election=)`:
/// the controller reconciles only while this process leads.
#[pyclass(name = "LeaderElection", module = "reconq", frozen, weakref)]
pub(crate) struct PyLeaderElection {
    pub(crate) inner: LeaderElection,
}

#[pymethods]
impl PyLeaderElection {
    #[new]
    #[pyo3(signature = (endpoints, name, *, ttl=None, identity=None, on_lost="standby"))]
    fn new(
        endpoints: &Bound<'_, PyAny>,
        name: &str,
        ttl: Option<&Bound<'_, PyAny>>,
        identity: Option<String>,
        on_lost: &str,
    ) -> PyResult<Self> {
        let endpoints = endpoints_from_py(endpoints)?;
        let on_lost = match on_lost {
            "standby" => OnLost::Standby,
            "exit" => OnLost::Exit,
            other => return Err(PyValueError::new_err(format!("on_lost must be 'standby' or 'exit', not {other:?}"))),
        };
        let invalid = |e: crate::error::InvalidArgument| PyValueError::new_err(e.to_string());
        let mut election = LeaderElection::try_new(endpoints, name).map_err(invalid)?.on_lost(on_lost);
        if let Some(ttl) = ttl.filter(|t| !t.is_none()) {
            election = election.try_ttl(non_negative_from_py(ttl, "ttl")?).map_err(invalid)?;
        }
        if let Some(identity) = identity {
            election = election.identity(identity);
        }
        Ok(Self { inner: election })
    }

    /// Whether this process leads now.
    #[getter]
    fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// Who leads, as last seen (their identity), or None.
    #[getter]
    fn leader(&self) -> Option<String> {
        self.inner.leader()
    }

    /// The current leadership's fencing token if this process leads.
    #[getter]
    fn fencing_token(&self) -> Option<u64> {
        self.inner.fencing_token()
    }

    /// The last error talking to etcd, or None.
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.inner.last_error()
    }

    /// Starts campaigning (a controller using it starts it too, and gives
    /// it up when it stops). It is given up at the interpreter's exit
    /// (`reconq._lifecycle`), after controllers drained.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        hold_until_exit(slf.py(), slf)?;
        slf.get().inner.start();
        Ok(())
    }

    /// Gives leadership up at once (a standby takes over) and stops
    /// campaigning.
    fn stop(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.stop());
    }

    /// `with LeaderElection(...) as election:` gives the election itself;
    /// it is not started (a controller using it starts it).
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the block gives leadership up: `stop()`.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) {
        self.stop(py);
    }

    fn __repr__(&self) -> String {
        format!(
            "<reconq.LeaderElection name={:?} is_leader={} leader={:?}>",
            self.inner.name(),
            self.inner.is_leader(),
            self.inner.leader()
        )
    }
}

/// Keeps `election` in `reconq._lifecycle` until the interpreter exits,
/// whose hook gives it up after controllers and managers stopped: a stop
/// returns once the workers are gone, and the lease they release might
/// otherwise still be on its way to etcd when the process ends.
pub(crate) fn hold_until_exit<'py>(py: Python<'py>, election: impl IntoPyObject<'py>) -> PyResult<()> {
    py.import("reconq._lifecycle")?.call_method1("add_election", (election,))?;
    Ok(())
}

/// etcd endpoints from Python: one `str` or a list of them.
pub(crate) fn endpoints_from_py(endpoints: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(one) = endpoints.cast::<PyString>() {
        return Ok(vec![one.to_cow()?.into_owned()]);
    }
    endpoints.extract().map_err(|_| PyTypeError::new_err("endpoints must be a str or a list of str (http://host:port)"))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLeaderElection>()
}
