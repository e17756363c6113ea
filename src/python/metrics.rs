//! `reconq.metrics_text()`, `reconq.start_http_server()` and the
//! `MetricsServer` it returns: the Rust exposition (`crate::metrics`) for
//! Python. Rendering never calls into Python, so it runs detached (other
//! Python threads keep running while a scrape walks the queues).

use parking_lot::Mutex;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

use crate::metrics::{self, MetricsServer};

/// The metrics of every live named queue and controller, in the Prometheus
/// text format 0.0.4.
#[pyfunction]
fn metrics_text(py: Python<'_>) -> String {
    py.detach(metrics::render)
}

/// Serves `GET /metrics` on `addr:port` from one background thread (no CPU
/// while idle), and `/status` (the status table; JSON on `Accept:
/// application/json` or `?format=json`), `/healthz` and `/readyz`
/// (Kubernetes probes: 200 `ok`, or 503 with one line per problem). `port=0` picks a free port (see `.port`). `addr` defaults to
/// 127.0.0.1 (this machine only); pass `addr="0.0.0.0"` for a scrape from
/// outside a container. Returns a `MetricsServer`; the server runs until
/// it is closed (`close()`, or a `with` block) or the process ends, even if
/// the returned object is dropped.
#[pyfunction]
#[pyo3(signature = (port=0, addr="127.0.0.1"))]
fn start_http_server(py: Python<'_>, port: u16, addr: &str) -> PyResult<PyMetricsServer> {
    let addr = addr.to_owned();
    let server = py.detach(|| metrics::serve((addr.as_str(), port))).map_err(|e| {
        // An OSError of the same kind (errno), naming the address: "Address
        // already in use" alone does not say which.
        let errno = e.raw_os_error().unwrap_or(0);
        PyOSError::new_err((errno, format!("start_http_server: cannot listen on {addr} port {port}: {e}")))
    })?;
    Ok(PyMetricsServer { addr: server.local_addr(), server: Mutex::new(Some(server)) })
}

/// A running metrics endpoint; stops on `close()` (collecting it without
/// closing leaves the server running until the process ends).
#[pyclass(name = "MetricsServer", module = "reconq", frozen)]
pub(crate) struct PyMetricsServer {
    addr: std::net::SocketAddr,
    server: Mutex<Option<MetricsServer>>,
}

#[pymethods]
impl PyMetricsServer {
    /// The port the server listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address the server listens on.
    #[getter]
    fn addr(&self) -> String {
        self.addr.ip().to_string()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.server.lock().is_none()
    }

    /// Stops the server (waits for its accepting thread; connections being
    /// answered end on their own, each within 5 s). Closing twice is fine.
    fn close(&self, py: Python<'_>) {
        let server = self.server.lock().take();
        if let Some(mut server) = server {
            py.detach(move || server.close());
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "serving" };
        format!("<reconq.MetricsServer http://{}/metrics {state}>", self.addr)
    }
}

impl Drop for PyMetricsServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.get_mut().take() {
            server.detach();
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMetricsServer>()?;
    m.add_function(wrap_pyfunction!(metrics_text, m)?)?;
    m.add_function(wrap_pyfunction!(start_http_server, m)?)?;
    Ok(())
}
