//! Logging: the binding's own records on the one `reconq` Python logger
//! ([`log`]), and the engine's log events forwarded to Python `logging`.
//!
//! With no `tracing` subscriber in the extension (there is none: nothing in
//! it sets one), `tracing` events become `log` records, and this module's
//! logger, installed at import, hands them to [`pyo3_log`], which calls the
//! Python logger named after the target (`reconq::controller` ->
//! `logging.getLogger("reconq.controller")`, a child of `"reconq"`).
//!
//! * **Levels are not cached.** pyo3-log can cache each Python logger's
//!   level, after which `logging.getLogger("reconq").setLevel(...)` has no
//!   effect until the cache is reset. The engine logs only on failures,
//!   hangs and drain deadlines (never per reconcile), so checking the
//!   Python level on every record costs nothing that matters, and levels
//!   set at any time take effect at once. Only the logger objects are
//!   cached.
//! * **No span records.** The engine makes its spans only when a `tracing`
//!   subscriber exists (see `crate::logs`), and `tracing`'s own span
//!   lifecycle targets (`tracing::span...`) are filtered out here, so
//!   `logging` never sees `++ reconcile` / `-> reconcile` noise.
//! * **GIL.** Forwarding a record attaches to the interpreter. Records come
//!   from engine threads with no engine lock held (the rule in
//!   `crate::logs`), so a Python thread that holds the GIL while waiting for
//!   an engine lock cannot deadlock with a logging thread.
//! * **Interpreter exit.** While the interpreter finalizes, attaching is
//!   refused and the record is dropped, instead of the thread hanging (or
//!   being terminated) inside a log call.
//! * **Errors** raised by Python logging go to `sys.unraisablehook`; they
//!   are never left pending on the logging thread.

use log::{LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use pyo3_log::{Caching, Logger};

use super::attach::attach;
use super::killable_call::call_kw;

/// `logging.getLogger("reconq")`, looked up once: the binding's records
/// (a reconcile, a trigger, a `do` that raised; a signal's stop) go here.
static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// What a record is about, set as attributes of its `logging.LogRecord`
/// (`extra=`) so a handler or a JSON formatter reads them without parsing
/// the message: `record.controller` (its name), `record.key` (the key as
/// enqueued) and `record.attempt` (tries since the last success, 0 on the
/// first). Only the fields given are set (docs/logs.md lists which records
/// carry which); the message text stays as it was.
#[derive(Default)]
pub(crate) struct Fields<'a, 'py> {
    pub(crate) controller: Option<&'a str>,
    pub(crate) key: Option<&'a Bound<'py, PyAny>>,
    pub(crate) attempt: Option<u32>,
}

impl<'a> Fields<'a, '_> {
    /// A record about the controller `name` as a whole.
    pub(crate) fn controller(name: &'a str) -> Self {
        Self { controller: Some(name), ..Self::default() }
    }

    /// `extra=`: the fields given.
    fn extra<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let extra = PyDict::new(py);
        if let Some(controller) = self.controller {
            extra.set_item("controller", controller)?;
        }
        if let Some(key) = self.key {
            extra.set_item("key", key)?;
        }
        if let Some(attempt) = self.attempt {
            extra.set_item("attempt", attempt)?;
        }
        Ok(extra)
    }
}

/// Logs to `logging.getLogger("reconq")` at `level` ("error", "warning"...),
/// `%`-style, with the exception's traceback if given. Errors while logging
/// are reported as unraisable, never propagated.
pub(crate) fn log<'py, A>(py: Python<'py>, level: &str, args: A, exc: Option<&PyErr>)
where
    A: IntoPyObject<'py, Target = PyTuple>,
{
    log_about(py, level, args, exc, &Fields::default());
}

/// [`log`] with the record's [`Fields`].
pub(crate) fn log_about<'py, A>(py: Python<'py>, level: &str, args: A, exc: Option<&PyErr>, fields: &Fields<'_, 'py>)
where
    A: IntoPyObject<'py, Target = PyTuple>,
{
    if let Err(e) = try_log(py, level, args, exc, fields) {
        e.write_unraisable(py, None);
    }
}

/// [`log_about`], returning what the logging call raised: a caller on the
/// main thread must not swallow a KeyboardInterrupt that landed in it.
pub(crate) fn try_log<'py, A>(
    py: Python<'py>,
    level: &str,
    args: A,
    exc: Option<&PyErr>,
    fields: &Fields<'_, 'py>,
) -> PyResult<()>
where
    A: IntoPyObject<'py, Target = PyTuple>,
{
    (|| -> PyResult<()> {
        let logger = LOGGER.get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("logging")?.call_method1("getLogger", ("reconq",))?.unbind())
        })?;
        let logger = logger.bind(py);
        let levelno = match level {
            "debug" => 10,
            "info" => 20,
            "warning" => 30,
            _ => 40,
        };
        // Cheap when disabled (the logger caches it): skip building the call.
        if !logger.call_method1("isEnabledFor", (levelno,))?.is_truthy()? {
            return Ok(());
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("extra", fields.extra(py)?)?;
        if let Some(exc) = exc {
            // A (type, value, traceback) tuple: on Python < 3.12 the value
            // alone may lack its traceback.
            kwargs.set_item("exc_info", (exc.get_type(py), exc.value(py), exc.traceback(py)))?;
        }
        call_kw(&logger.getattr(level)?, args, Some(&kwargs))?;
        Ok(())
    })()
}

struct Bridge {
    inner: Logger,
}

impl Log for Bridge {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.inner.enabled(record.metadata()) {
            return;
        }
        // `try_attach`: `None` while the interpreter finalizes (pyo3-log's
        // own `attach` would hang or kill the thread then); nested inside
        // this, pyo3-log's attach is a no-op.
        attach(|py| {
            let pending = PyErr::take(py);
            self.inner.log(record);
            // pyo3-log leaves an error raised by Python logging pending.
            if let Some(err) = PyErr::take(py) {
                err.write_unraisable(py, None);
            }
            if let Some(pending) = pending {
                pending.restore(py);
            }
        });
    }

    fn flush(&self) {}
}

/// Installs the bridge as this extension's `log` logger (once; the
/// extension's `log` crate is its own, so no other module's logger is in
/// the way).
pub(crate) fn install(py: Python<'_>) -> PyResult<()> {
    // Other crates' records below WARNING never reach Python: deciding
    // whether one is wanted asks the Python logger, so takes the GIL, and
    // ureq makes five debug records per HTTP request (a cache's list page
    // and watch, a lease renewal), each a GIL hand-off on an engine
    // thread that then waits behind whatever Python runs (issue 36).
    let inner = Logger::new(py, Caching::Loggers)?
        .filter(LevelFilter::Warn)
        .filter_target("reconq".to_owned(), LevelFilter::Debug)
        .filter_target("tracing".to_owned(), LevelFilter::Off);
    if log::set_boxed_logger(Box::new(Bridge { inner })).is_ok() {
        log::set_max_level(LevelFilter::Debug);
    }
    Ok(())
}
