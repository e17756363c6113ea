//! `reconq.Cache` (guarantees §13, docs/sources.md): the Rust [`Cache`] of a
//! Python-facing source ([`AnySource`]), read from Python.
//!
//! * The cache's thread is attached to the interpreter once for its life
//!   (as a controller's workers) and detached except while it calls Python:
//!   the source's functions, `decode`, index functions and `==` on a relist.
//! * Every read waits for the cache's lock detached, so the cache's
//!   thread, which may hold that lock while it waits for the GIL (an index
//!   function), is never waited for by a thread that holds the GIL. `get`,
//!   the read of every reconcile, first tries the lock with the GIL held
//!   and detaches only if it is taken: each detach is a hand-off of the
//!   GIL to another thread, and taking it back waits for that thread
//!   (up to `sys.getswitchinterval()` if it runs Python): issue 36's tail.
//! * Index values are Python keys (str, int, bytes, tuples of these): the
//!   Rust index holds each as its key encoding (`crate::key_encoding`), so
//!   `by_index` finds a value by Python's `==` for those types, with no scan.
//! * A started cache is held weakly by `reconq._lifecycle`, which stops it
//!   at exit; dropping the last reference to a running cache stops it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::attach::{attach, attached_scope, python_thread_wrapper};
use super::cache_values::{PyObj, refuse_under_cache_lock, under_cache_lock};
use super::convert::{check_sync_callable, timeout_from_py, type_name, unix_timestamp, with_exit_timeout};
use super::errors::describe;
use super::key::PyKey;
use super::killable_call::call;
use super::logs::log;
use super::signals::{wait_interruptibly, wait_synced_interruptibly};
use super::sources::{AnySource, ReadBack, SourceSpec};
use super::store::{store_error, store_from_py};
use crate::clock::deadline_after;
use crate::{cache::Cache, cache::CacheError, key_encoding::encode_key};

/// The Rust cache every Python cache is.
pub(crate) type PyCacheCore = Cache<AnySource>;

/// A local copy of a source's items, kept by its own thread: it lists,
/// then applies the change stream, resumes it after a break, relists when
/// its position expired (keys missing from the new list are deletes), and
/// backs off after failures. `indexes={"name": fn}` with `fn(key, obj)`
/// giving the values `by_index(name, value)` finds the key under. A
/// controller's `watch_cache` starts it; or `start()` it yourself.
/// `store=` (a path or `SqliteStore`, its controllers' file) keeps its key
/// set and versions (for a key without one, a digest of its object, if it
/// is plain data) with their pending keys, so a restart reconciles only
/// what changed while down (E9); `flush()` waits for them to be on disk.
/// An `EtcdSource` also keeps its values there (etcd's bytes, which
/// `decode` reads again), so a
/// restart loads them and resumes etcd's stream from the kept revision
/// instead of listing the prefix again (it relists only if that revision
/// was compacted).
#[pyclass(name = "Cache", module = "reconq", frozen, weakref)]
pub(crate) struct PyCache {
    pub(crate) cache: PyCacheCore,
    /// The process whose `start()` started it (0: none): dropping the last
    /// reference stops it there. A forked child has no cache threads, so
    /// dropping its copy must not try to stop (and join) them.
    started_by: AtomicU32,
}

/// An index value as the Rust index keeps it: its key encoding, one
/// `char` per byte (a `String` that is equal exactly when the keys are).
fn index_value(value: &PyKey) -> String {
    encode_key(value).into_iter().map(char::from).collect()
}

/// What an index function returned, as values (read as `map`'s keys are:
/// [`PyKey::one_or_many`]). A value that is not a valid key raises.
fn index_values(values: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    Ok(PyKey::one_or_many(values)?.iter().map(index_value).collect())
}

/// A Python index function as the Rust cache's. It runs under the cache's
/// lock (marked: a cache read from it raises); raising, or giving a value
/// that is not hashable as a key, is logged and leaves the key out of
/// that index.
fn index_fn(
    cache: Arc<str>,
    index: String,
    function: Py<PyAny>,
) -> impl Fn(&PyKey, &PyObj) -> Vec<String> + Send + Sync + 'static {
    move |key, obj| {
        attach(|py| {
            under_cache_lock(|| {
                let values = key.to_py(py).and_then(|k| call(function.bind(py), (k, obj.to_py(py))));
                match values.and_then(|values| index_values(&values)) {
                    Ok(values) => values,
                    Err(e) => {
                        let shown = key.to_py(py).map(|k| key.log_repr(&k)).unwrap_or_else(|_| format!("{key:?}"));
                        let message = describe(py, &e);
                        let args = (
                            "cache %r: index %r failed for key %s, which is left out of it: %s",
                            &*cache,
                            &index,
                            shown,
                            message,
                        );
                        log(py, "error", args, Some(&e));
                        Vec::new()
                    }
                }
            })
        })
        .unwrap_or_default()
    }
}

/// `indexes=`: None, or a dict of str names to functions of `(key, obj)`.
fn indexes_from_py(indexes: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, Py<PyAny>)>> {
    let Some(indexes) = indexes.filter(|i| !i.is_none()) else { return Ok(Vec::new()) };
    let dict = indexes.cast::<PyDict>().map_err(|_| {
        let type_name = type_name(indexes);
        PyTypeError::new_err(format!("indexes must be a dict {{name: fn(key, obj)}}, not {type_name}"))
    })?;
    dict.iter()
        .map(|(name, function)| {
            let name: String = name.extract().map_err(|_| PyTypeError::new_err("indexes: names must be str"))?;
            check_sync_callable(&function, &format!("indexes[{name:?}]"), 2)?;
            Ok((name, function.unbind()))
        })
        .collect()
}

fn lifecycle(py: Python<'_>, what: &str, cache: &Bound<'_, PyCache>) -> PyResult<()> {
    py.import("reconq._lifecycle")?.call_method1(what, (cache,))?;
    Ok(())
}

impl PyCache {
    /// Starts the cache (if not running) and has `reconq._lifecycle` stop
    /// it at exit; `RuntimeError` once stopped.
    pub(crate) fn start_bound(slf: &Bound<'_, Self>) -> PyResult<()> {
        let cache = &slf.get().cache;
        slf.py().detach(|| cache.start()).map_err(|e| match e {
            CacheError::Stopped { .. } => PyRuntimeError::new_err(format!("{e}: make a new Cache")),
            CacheError::Thread(_) => PyRuntimeError::new_err(e.to_string()),
        })?;
        slf.get().started_by.store(std::process::id(), Ordering::Relaxed);
        lifecycle(slf.py(), "add_cache", slf)
    }
}

#[pymethods]
impl PyCache {
    #[new]
    #[pyo3(signature = (source, *, name=None, indexes=None, store=None))]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        name: Option<String>,
        indexes: Option<&Bound<'_, PyAny>>,
        store: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let store = store.filter(|s| !s.is_none()).map(|s| store_from_py(py, s)).transpose()?;
        let spec = SourceSpec::from_py(source)?;
        let name = name.unwrap_or_else(|| spec.name().to_owned());
        if name.is_empty() || name.contains('\0') {
            return Err(PyValueError::new_err("name must be non-empty, without NUL characters"));
        }
        let indexes = indexes_from_py(indexes)?;
        let cache_name: Arc<str> = Arc::from(name.as_str());
        // A list calls Python for its index functions, and to compare
        // Python objects (an etcd value is compared by its bytes).
        let lists_call_python = !indexes.is_empty() || !matches!(spec, SourceSpec::Etcd(_));
        let (source, read_kept) = spec.build(py, &name, store.is_some())?;
        let mut builder = Cache::builder(name.as_str(), source).thread_wrapper(python_thread_wrapper());
        if lists_call_python {
            builder = builder.lists_in(attached_scope());
        }
        for (index, function) in indexes {
            builder = builder.index(index.clone(), index_fn(Arc::clone(&cache_name), index, function));
        }
        if let Some(store) = &store {
            // A source without versions keeps digests of its objects.
            builder = builder.store(store).digest(super::digest::canonical);
            builder = match read_kept {
                Some(ReadBack { read, scope }) => builder.keep_objects_read_by(read, scope),
                None => builder.keep_objects(),
            };
        }
        let cache = builder.build().map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { cache, started_by: AtomicU32::new(0) })
    }

    #[getter]
    fn name(&self) -> &str {
        self.cache.name()
    }

    /// The last state seen of `key`; None when absent.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        refuse_under_cache_lock()?;
        let key = PyKey::from_py(key)?;
        let cache = &self.cache;
        let found = cache.try_get(&key).unwrap_or_else(|| py.detach(|| cache.get(&key)));
        Ok(found.map(|obj| obj.to_py(py)))
    }

    /// Every key held now, in no particular order.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        refuse_under_cache_lock()?;
        let cache = &self.cache;
        let keys = py.detach(|| cache.keys());
        PyList::new(py, keys.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        refuse_under_cache_lock()?;
        let cache = &self.cache;
        Ok(py.detach(|| cache.len()))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        refuse_under_cache_lock()?;
        let key = PyKey::from_py(key)?;
        let cache = &self.cache;
        Ok(py.detach(|| cache.contains(&key)))
    }

    /// The keys whose function of index `index` gave `value` (no scan).
    /// `KeyError` for an unknown index; `TypeError` for a value no index
    /// function can give (not a str, int, bytes or tuple of these).
    fn by_index<'py>(&self, py: Python<'py>, index: &str, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        refuse_under_cache_lock()?;
        let value = index_value(&PyKey::from_py(value)?);
        let cache = &self.cache;
        let keys = py.detach(|| cache.by_index(index, &value)).map_err(|e| PyKeyError::new_err(e.to_string()))?;
        PyList::new(py, keys.iter().map(|k| k.to_py(py)).collect::<PyResult<Vec<_>>>()?)
    }

    /// Whether the first list has been applied.
    #[getter]
    fn synced(&self) -> bool {
        self.cache.synced()
    }

    /// Waits (GIL released) until the first list has been applied;
    /// returns whether it was, False at once if the cache is stopped
    /// unsynced, or after `timeout` seconds (None: no limit).
    #[pyo3(signature = (timeout=None))]
    fn wait_synced(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let cache = &self.cache;
        wait_synced_interruptibly(py, timeout_from_py(timeout)?, |slice| cache.wait_synced(slice))
    }

    /// A dict: name, synced, keys, position, relists, events, errors,
    /// last_error, last_error_time.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        refuse_under_cache_lock()?;
        let cache = &self.cache;
        let stats = py.detach(|| cache.stats());
        let d = PyDict::new(py);
        d.set_item("name", &stats.name)?;
        d.set_item("synced", stats.synced)?;
        d.set_item("keys", stats.keys)?;
        d.set_item("position", stats.position.map(|p| p.to_py(py)).transpose()?)?;
        d.set_item("relists", stats.relists)?;
        d.set_item("resumed", stats.resumed)?;
        d.set_item("events", stats.events)?;
        d.set_item("errors", stats.errors)?;
        d.set_item("last_error", stats.last_error)?;
        d.set_item("last_error_time", stats.last_error_time.map(unix_timestamp))?;
        Ok(d)
    }

    /// Blocks (without the GIL) until every change the cache applied
    /// before the call is on disk with what it enqueued: each watching
    /// controller's pending keys and its copy of the cache's key set,
    /// versions and position (E9). The point to advance a position kept
    /// outside from. Raises OSError (or ValueError) naming the store error
    /// when a write fails (the rows stay pending for the next flush).
    /// Without a store, or with no controller watching, it returns at once.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let cache = &self.cache;
        let pending = py.detach(|| cache.ask_flush());
        let outcome = wait_interruptibly(py, None, |slice| pending.wait(slice))?.expect("waited without a deadline");
        outcome.map_err(|e| store_error(&e))
    }

    /// Starts the cache's thread (a controller that watches it starts it
    /// too). `RuntimeError` once stopped: a cache runs once.
    fn start(slf: &Bound<'_, Self>) -> PyResult<()> {
        Self::start_bound(slf)
    }

    /// Stops the cache for good: sets its source's stop event and waits
    /// for its thread, at most `timeout` seconds (None: no limit); returns
    /// whether it exited. A `list` or iterator that ignores its stop event
    /// is left behind at the timeout: it applies nothing more, and its
    /// thread exits when it returns. Idempotent.
    #[pyo3(signature = (timeout=None))]
    fn stop(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let deadline = timeout_from_py(timeout)?.map(|t| deadline_after(Instant::now(), t));
        let cache = &self.cache;
        let exited =
            wait_interruptibly(py, deadline, |slice| cache.stop_timeout(slice.unwrap_or(Duration::MAX)).then_some(()))?;
        Ok(exited.is_some())
    }

    /// `with Cache(...) as cache:` gives the cache itself; it is not
    /// started (a controller's `watch_cache` or `start()` starts it).
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the block stops the cache, waiting for its thread at most
    /// `reconq._lifecycle.WITH_EXIT_TIMEOUT` seconds.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<()> {
        let bound = with_exit_timeout(py)?;
        let cache = &self.cache;
        py.detach(|| cache.stop_timeout(bound));
        Ok(())
    }

    /// The exit hook's stop (`reconq._lifecycle`): waits at most `timeout`
    /// seconds for the cache's thread, then leaves it (a source that
    /// ignores its stop event must not hold the exit).
    fn _stop_at_exit(&self, py: Python<'_>, timeout: f64) {
        let wait = Duration::try_from_secs_f64(timeout).unwrap_or(Duration::ZERO);
        let cache = &self.cache;
        py.detach(|| cache.stop_timeout(wait));
    }

    fn __repr__(&self) -> String {
        let stats = self.cache.stats();
        format!(
            "<reconq.Cache name={:?} synced={} keys={} position={:?} relists={} errors={}>",
            stats.name, stats.synced, stats.keys, stats.position, stats.relists, stats.errors
        )
    }
}

impl Drop for PyCache {
    /// A cache started in this process whose last reference went stops
    /// (its thread is joined on a thread of its own: this one may hold the
    /// GIL the cache's thread waits for).
    fn drop(&mut self) {
        if self.started_by.load(Ordering::Relaxed) == std::process::id() && !self.cache.is_stopped() {
            let cache = self.cache.clone();
            let _ = std::thread::Builder::new().name("reconq-cache-stop".into()).spawn(move || cache.stop());
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCache>()?;
    super::sources::register(m)
}
