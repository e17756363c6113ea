//! `reconq.PollingSource`, `reconq.EtcdSource` and `reconq.Source`
//! (docs/sources.md): what a `reconq.Cache` keeps a copy of.
//!
//! Each Python class only holds its arguments, checked; a `Cache` makes
//! its own Rust source of them ([`SourceSpec::build`]), so one source object
//! may serve several caches. Every Rust source a Python cache runs has the
//! same types ([`AnySource`]): Python keys ([`PyKey`]), Python objects
//! ([`PyObj`]), and positions and versions as [`SourceValue`]s, so one
//! `Cache` class serves them all.
//!
//! Bad items never stop a cache (guarantees §13, "Bad input"): a key that
//! is not a valid key is logged and skipped (an event that carried a
//! position still moves the cache there, as a bookmark).

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use super::attach::{attach, attached_scope};
use super::cache_values::{DecodedValue, PyObj, SourceValue};
use super::convert::{check_sync_callable, check_sync_callable_of, positive_from_py, type_name};
use super::election::endpoints_from_py;
use super::errors::describe;
use super::key::PyKey;
use super::killable_call::call;
use super::logs::log;
use crate::cache::ReadKept;
use crate::source::{
    BatchScope, Changes, Event, Item, Listing, ListingOf, ResumeState, Source, SourceError, Stop, StopHook,
};
use crate::{source::EtcdSource, source::PollingSource};

/// The item, event and listing types of every source a Python cache runs.
pub(crate) type PyItem = Item<PyKey, PyObj, SourceValue>;
type PyEvent = Event<PyKey, PyObj, SourceValue, SourceValue>;

/// A source with the Python cache's types, whatever system it reads.
pub(crate) struct AnySource(
    Box<dyn Source<Key = PyKey, Object = PyObj, Position = SourceValue, Version = SourceValue>>,
);

impl Source for AnySource {
    type Key = PyKey;
    type Object = PyObj;
    type Position = SourceValue;
    type Version = SourceValue;

    fn list(&mut self, stop: &Stop) -> Result<ListingOf<Self>, SourceError> {
        self.0.list(stop)
    }

    fn changes(&mut self, from: Option<&SourceValue>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        self.0.changes(from, stop)
    }

    fn resume_state(&self) -> Option<ResumeState> {
        self.0.resume_state()
    }

    fn restore(&mut self, position: &SourceValue, state: &[u8]) -> bool {
        self.0.restore(position, state)
    }
}

/// A Rust source whose positions are integers (etcd's revision, a poll
/// count), seen with [`SourceValue`] positions.
struct IntPositions<S>(S);

/// An integer position of a Rust source, as a [`SourceValue`] and back.
trait IntPosition: Sized {
    fn to_value(self) -> SourceValue;
    fn from_value(value: &SourceValue) -> Option<Self>;
}

impl IntPosition for i64 {
    fn to_value(self) -> SourceValue {
        SourceValue::Int(self)
    }

    fn from_value(value: &SourceValue) -> Option<Self> {
        match value {
            SourceValue::Int(i) => Some(*i),
            SourceValue::Object(_) => None,
        }
    }
}

impl IntPosition for u64 {
    fn to_value(self) -> SourceValue {
        SourceValue::Int(i64::try_from(self).unwrap_or(i64::MAX))
    }

    fn from_value(value: &SourceValue) -> Option<Self> {
        i64::from_value(value).and_then(|i| u64::try_from(i).ok())
    }
}

impl<S> Source for IntPositions<S>
where
    S: Source<Key = PyKey, Object = PyObj>,
    S::Position: IntPosition,
    S::Version: Into<SourceValue>,
{
    type Key = PyKey;
    type Object = PyObj;
    type Position = SourceValue;
    type Version = SourceValue;

    fn list(&mut self, stop: &Stop) -> Result<ListingOf<Self>, SourceError> {
        let listing = self.0.list(stop)?;
        let items = listing
            .items
            .into_iter()
            .map(|item| Item { key: item.key, obj: item.obj, version: item.version.map(Into::into) })
            .collect();
        Ok(Listing { items, position: listing.position.map(IntPosition::to_value) })
    }

    fn changes(&mut self, from: Option<&SourceValue>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let from = match from {
            None => None,
            Some(value) => Some(
                S::Position::from_value(value).ok_or_else(|| SourceError::expired("not a position of this source"))?,
            ),
        };
        let stream = self.0.changes(from.as_ref(), stop)?;
        Ok(Box::new(stream.map(|event| {
            event.map(|event| match event {
                Event::Put { key, obj, position, version } => Event::Put {
                    key,
                    obj,
                    position: position.map(IntPosition::to_value),
                    version: version.map(Into::into),
                },
                Event::Delete { key, position } => Event::Delete { key, position: position.map(IntPosition::to_value) },
                Event::Bookmark { position } => Event::Bookmark { position: position.to_value() },
                Event::CaughtUp { position } => Event::CaughtUp { position: position.to_value() },
            })
        })))
    }

    fn resume_state(&self) -> Option<ResumeState> {
        self.0.resume_state()
    }

    /// A position that is not one of this source's restores nothing.
    fn restore(&mut self, position: &SourceValue, state: &[u8]) -> bool {
        S::Position::from_value(position).is_some_and(|position| self.0.restore(&position, state))
    }
}

/// The Python classes of `reconq._sources`, imported once.
struct EventTypes {
    put: Py<PyType>,
    delete: Py<PyType>,
    bookmark: Py<PyType>,
    position_expired: Py<PyType>,
}

static EVENT_TYPES: PyOnceLock<EventTypes> = PyOnceLock::new();

fn event_types(py: Python<'_>) -> PyResult<&EventTypes> {
    EVENT_TYPES.get_or_try_init(py, || {
        let m = py.import("reconq._sources")?;
        let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
        Ok(EventTypes {
            put: get("Put")?,
            delete: get("Delete")?,
            bookmark: get("Bookmark")?,
            position_expired: get("PositionExpired")?,
        })
    })
}

/// A key from a source, or `None` (logged: that item is skipped).
fn source_key(cache: &str, what: &str, key: &Bound<'_, PyAny>) -> Option<PyKey> {
    PyKey::from_py(key)
        .map_err(|e| {
            let message = describe(key.py(), &e);
            log(key.py(), "error", ("cache %r: %s has a bad key, skipped: %s", cache, what, message), None);
        })
        .ok()
}

/// The items of a list (`PollingSource`'s `list_fn`, `Source.list`): a
/// dict `{key: obj}`, or an iterable of `(key, obj)` / `(key, obj,
/// version)`. Anything else fails the list (retried after a back-off); a
/// bad key only skips its item.
fn items_from_py(cache: &str, what: &str, items: &Bound<'_, PyAny>) -> PyResult<Vec<PyItem>> {
    let item = |key: &Bound<'_, PyAny>, obj: Bound<'_, PyAny>, version: Option<Bound<'_, PyAny>>| {
        let version = version.and_then(|v| SourceValue::optional_from_py(&v));
        source_key(cache, what, key).map(|key| Item { key, obj: PyObj::new(obj), version })
    };
    if let Ok(dict) = items.cast::<PyDict>() {
        return Ok(dict.iter().filter_map(|(key, obj)| item(&key, obj, None)).collect());
    }
    let mut out = Vec::new();
    for entry in items.try_iter().map_err(|_| not_items(what, items))? {
        let entry = entry?;
        let tuple = entry.cast::<PyTuple>().map_err(|_| not_items(what, &entry))?;
        match tuple.len() {
            2 => out.extend(item(&tuple.get_item(0)?, tuple.get_item(1)?, None)),
            3 => out.extend(item(&tuple.get_item(0)?, tuple.get_item(1)?, Some(tuple.get_item(2)?))),
            _ => return Err(not_items(what, &entry)),
        }
    }
    Ok(out)
}

fn not_items(what: &str, got: &Bound<'_, PyAny>) -> PyErr {
    let type_name = type_name(got);
    PyTypeError::new_err(format!(
        "{what} must give a dict {{key: obj}} or an iterable of (key, obj) or (key, obj, version) tuples; got {type_name}"
    ))
}

/// What a Python call failed with, as the cache's error: `PositionExpired`
/// means relist.
fn source_error(py: Python<'_>, e: &PyErr) -> SourceError {
    let expired = event_types(py).is_ok_and(|t| e.is_instance(py, t.position_expired.bind(py)));
    let message = describe(py, e);
    if expired { SourceError::expired(message) } else { SourceError::new(message) }
}

fn interpreter_gone() -> SourceError {
    SourceError::new("the Python interpreter is shutting down")
}

/// `reconq.Source(list, changes)`: any system, from Python. `list()` (or
/// `list(stop)`) and `changes(position, stop)` run on the cache's thread,
/// attached only while in Python; `stop` is a `threading.Event` set when
/// the cache stops, which a blocking call should heed (a stop with a
/// deadline leaves one that does not behind).
struct PythonSource {
    cache: Arc<str>,
    list: Py<PyAny>,
    /// `list` takes the stop event ([`PySource::list_takes_stop`]).
    list_takes_stop: bool,
    changes: Py<PyAny>,
    /// The `threading.Event` given to `changes`, made at the first call,
    /// and the hook that sets it when the cache stops.
    stop_event: Option<(Py<PyAny>, StopHook)>,
}

impl PythonSource {
    /// The stop event, made (and tied to `stop`) at the first call.
    fn stop_event<'py>(&mut self, py: Python<'py>, stop: &Stop) -> PyResult<Bound<'py, PyAny>> {
        if let Some((event, _)) = &self.stop_event {
            return Ok(event.bind(py).clone());
        }
        let event = py.import("threading")?.getattr("Event")?.call0()?;
        let setter = event.clone().unbind();
        // Runs on the thread that stops the cache, detached.
        let hook = stop.on_set(move || {
            attach(|py| {
                if let Err(e) = setter.bind(py).call_method0("set") {
                    e.write_unraisable(py, None);
                }
            });
        });
        self.stop_event = Some((event.clone().unbind(), hook));
        Ok(event)
    }

    /// `list()`, or `list(stop)` if it takes the stop event.
    fn call_list<'py>(&self, stop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let list = self.list.bind(stop.py());
        if self.list_takes_stop { call(list, (stop,)) } else { call(list, ()) }
    }

    /// A Python event as the cache's; `None` (logged) for what cannot be
    /// had: an object that is no event is skipped, a put or delete with a
    /// bad key is a bookmark at its position (if any).
    fn event(&self, event: &Bound<'_, PyAny>) -> PyResult<Option<PyEvent>> {
        let py = event.py();
        let types = event_types(py)?;
        let position =
            || -> PyResult<Option<SourceValue>> { Ok(SourceValue::optional_from_py(&event.getattr("position")?)) };
        let at = |position: Option<SourceValue>| position.map(|position| Event::Bookmark { position });
        if event.is_instance(types.put.bind(py))? {
            let position = position()?;
            let Some(key) = source_key(&self.cache, "a Put", &event.getattr("key")?) else { return Ok(at(position)) };
            let obj = PyObj::new(event.getattr("obj")?);
            let version = SourceValue::optional_from_py(&event.getattr("version")?);
            return Ok(Some(Event::Put { key, obj, position, version }));
        }
        if event.is_instance(types.delete.bind(py))? {
            let position = position()?;
            let Some(key) = source_key(&self.cache, "a Delete", &event.getattr("key")?) else {
                return Ok(at(position));
            };
            return Ok(Some(Event::Delete { key, position }));
        }
        if event.is_instance(types.bookmark.bind(py))? {
            return Ok(at(position()?));
        }
        let type_name = type_name(event);
        let args = ("cache %r: changes() gave a %s, not a Put, Delete or Bookmark; skipped", &*self.cache, type_name);
        log(py, "error", args, None);
        Ok(None)
    }
}

impl Source for PythonSource {
    type Key = PyKey;
    type Object = PyObj;
    type Position = SourceValue;
    type Version = SourceValue;

    fn list(&mut self, stop: &Stop) -> Result<ListingOf<Self>, SourceError> {
        attach(|py| {
            let listed = self.stop_event(py, stop).and_then(|event| self.call_list(&event)).and_then(|listed| {
                let (items, position): (Bound<'_, PyAny>, Bound<'_, PyAny>) = listed
                    .extract()
                    .map_err(|_| PyTypeError::new_err("Source list() must return (items, position): a 2-tuple"))?;
                let items = items_from_py(&self.cache, "Source list()", &items)?;
                Ok(Listing { items, position: SourceValue::optional_from_py(&position) })
            });
            listed.map_err(|e| source_error(py, &e))
        })
        .unwrap_or_else(|| Err(interpreter_gone()))
    }

    fn changes(&mut self, from: Option<&SourceValue>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let stream = attach(|py| {
            let stream = self.stop_event(py, stop).and_then(|event| {
                let from = match from {
                    Some(from) => from.to_py(py)?,
                    None => py.None().into_bound(py),
                };
                Ok(call(self.changes.bind(py), (from, event))?.try_iter()?.unbind())
            });
            stream.map_err(|e| source_error(py, &e))
        })
        .unwrap_or_else(|| Err(interpreter_gone()))?;
        let this = &*self;
        Ok(Box::new(std::iter::from_fn(move || {
            attach(|py| {
                loop {
                    let next = stream.bind(py).clone().next()?;
                    match next.and_then(|event| this.event(&event)) {
                        Ok(Some(event)) => return Some(Ok(event)),
                        Ok(None) => continue,
                        Err(e) => return Some(Err(source_error(py, &e))),
                    }
                }
            })
            .unwrap_or_else(|| Some(Err(interpreter_gone())))
        })))
    }
}

/// A Python `list_fn` as a `PollingSource`'s list function.
fn poll_with(cache: Arc<str>, list_fn: Py<PyAny>) -> impl FnMut() -> Result<Vec<PyItem>, String> + Send + 'static {
    move || {
        attach(|py| {
            let items = call(list_fn.bind(py), ()).and_then(|items| items_from_py(&cache, "list_fn", &items));
            items.map_err(|e| describe(py, &e))
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    }
}

/// etcd keys as Python keys: `str`, or `bytes` when not UTF-8.
fn etcd_key(bytes: &[u8]) -> Result<PyKey, std::convert::Infallible> {
    Ok(match std::str::from_utf8(bytes) {
        Ok(s) => PyKey::Str(s.into()),
        Err(_) => PyKey::Bytes(bytes.into()),
    })
}

/// An etcd value as the cache's object: its bytes, kept as Rust's (no
/// GIL taken on the cache's thread: [`PyObj::Bytes`]), or `decode(bytes)`;
/// with `keep_bytes` (a cache with a store), that with the bytes beside
/// it ([`PyObj::Decoded`]), so the store keeps the bytes and a restart
/// reads them back through this same function.
fn etcd_value(
    decode: Option<Arc<Py<PyAny>>>,
    keep_bytes: bool,
) -> impl Fn(&[u8]) -> Result<PyObj, String> + Send + Sync + 'static {
    move |bytes: &[u8]| {
        let Some(decode) = &decode else { return Ok(PyObj::Bytes(bytes.into())) };
        attach(|py| {
            let value = pyo3::types::PyBytes::new(py, bytes).into_any();
            let decoded = call(decode.bind(py), (value,)).map_err(|e| format!("decode raised {}", describe(py, &e)))?;
            Ok(match keep_bytes {
                true => PyObj::Decoded(Arc::new(DecodedValue { raw: bytes.into(), obj: decoded.unbind() })),
                false => PyObj::new(decoded),
            })
        })
        .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
    }
}

/// How a stored etcd cache's kept values read back at a restart: `read`
/// (the source's own decode), all inside `scope`.
pub(crate) struct ReadBack {
    pub(crate) read: Arc<ReadKept<PyObj>>,
    pub(crate) scope: Option<BatchScope>,
}

/// A source's `name`: `None`, or a non-empty str without NUL.
fn source_name(name: Option<String>, default: impl FnOnce() -> String) -> PyResult<String> {
    match name {
        Some(name) if name.is_empty() || name.contains('\0') => {
            Err(PyValueError::new_err("name must be non-empty, without NUL characters"))
        }
        Some(name) => Ok(name),
        None => Ok(default()),
    }
}

/// A callable's `__qualname__` (or its type's name), for default names.
fn qualname(f: &Bound<'_, PyAny>) -> String {
    f.getattr("__qualname__")
        .and_then(|n| n.extract::<String>())
        .or_else(|_| f.get_type().name().map(|n| n.to_string()))
        .unwrap_or_else(|_| "source".into())
}

/// Calls `list_fn()` every `interval` seconds and turns the differences
/// from the poll before into puts and deletes (a poll is not a relist).
/// `list_fn` returns a dict `{key: obj}` or an iterable of `(key, obj)` /
/// `(key, obj, version)`. `name` (default: `list_fn`'s qualified name)
/// names a cache made of it unless the cache is given one.
#[pyclass(name = "PollingSource", module = "reconq", frozen)]
pub(crate) struct PyPollingSource {
    list_fn: Py<PyAny>,
    interval: Duration,
    name: String,
}

#[pymethods]
impl PyPollingSource {
    #[new]
    #[pyo3(signature = (list_fn, interval, *, name=None))]
    fn new(list_fn: &Bound<'_, PyAny>, interval: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Self> {
        check_sync_callable(list_fn, "list_fn", 0)?;
        let interval = positive_from_py(interval, "interval")?;
        let name = source_name(name, || qualname(list_fn))?;
        Ok(Self { list_fn: list_fn.clone().unbind(), interval, name })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Seconds between polls.
    #[getter]
    fn interval(&self) -> f64 {
        self.interval.as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!("<reconq.PollingSource name={:?} interval={}>", self.name, self.interval.as_secs_f64())
    }
}

/// The keys under `prefix` of the etcd cluster at `endpoints` (one
/// `http://host:port` or a list): keys are the etcd key without the prefix
/// (`str`, or `bytes` when not UTF-8), objects the values (`bytes`, or
/// `decode(bytes)`; a `decode` that raises is logged and that change
/// skipped), a key's version its `mod_revision`, the position etcd's
/// revision. `progress_timeout` (seconds, positive; None: 11 minutes) is
/// how long the watch may go without an event or a progress notification
/// before it is taken as stalled and resumed: above etcd's
/// `--experimental-watch-progress-notify-interval` (10 min unless set).
#[pyclass(name = "EtcdSource", module = "reconq", frozen)]
pub(crate) struct PyEtcdSource {
    endpoints: Vec<String>,
    prefix: String,
    decode: Option<Arc<Py<PyAny>>>,
    name: String,
    /// `None`: the Rust source's default.
    progress_timeout: Option<Duration>,
}

#[pymethods]
impl PyEtcdSource {
    #[new]
    #[pyo3(signature = (endpoints, prefix, *, decode=None, name=None, progress_timeout=None))]
    fn new(
        endpoints: &Bound<'_, PyAny>,
        prefix: &str,
        decode: Option<&Bound<'_, PyAny>>,
        name: Option<String>,
        progress_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let endpoints = endpoints_from_py(endpoints)?;
        let progress_timeout =
            progress_timeout.filter(|t| !t.is_none()).map(|t| positive_from_py(t, "progress_timeout")).transpose()?;
        // Checked now (a malformed endpoint, an empty prefix); built again
        // by each cache made of it.
        EtcdSource::new(endpoints.clone(), prefix).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let decode = match decode {
            Some(decode) if !decode.is_none() => {
                check_sync_callable(decode, "decode", 1)?;
                Some(Arc::new(decode.clone().unbind()))
            }
            _ => None,
        };
        let name = source_name(name, || prefix.to_owned())?;
        Ok(Self { endpoints, prefix: prefix.to_owned(), decode, name, progress_timeout })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Seconds a watch may stay silent before it is resumed (None: the
    /// default, 11 minutes).
    #[getter]
    fn progress_timeout(&self) -> Option<f64> {
        self.progress_timeout.map(|t| t.as_secs_f64())
    }

    fn __repr__(&self) -> String {
        format!("<reconq.EtcdSource name={:?} endpoints={:?} prefix={:?}>", self.name, self.endpoints, self.prefix)
    }
}

/// Any other system, from Python: `list()` returns `(items, position)`
/// (items as for `PollingSource`; position None: the source has no
/// positions and is relisted after every break), `changes(position, stop)`
/// an iterator of `Put`, `Delete` and `Bookmark` from `position` on.
/// `stop` is a `threading.Event` set when the cache stops: a blocking
/// iterator should return soon after. A `list` that needs one positional
/// argument (`def list(stop)`) is given the same event; one that can be
/// called with none is called with none. A stop with a deadline (a
/// controller's `stop(timeout=)`, `Cache.stop(timeout=)`, the exit hook)
/// leaves a call that ignores the event behind, still running.
/// Raising `PositionExpired` relists; raising anything else, or ending, is
/// a break, resumed from the last position applied.
#[pyclass(name = "Source", module = "reconq", frozen)]
pub(crate) struct PySource {
    list: Py<PyAny>,
    /// `list` cannot be called with no argument and can with one: it is
    /// given the stop event. Told by its signature, so a `list()` written
    /// before there was an event (or with only optional parameters) is
    /// still called as before.
    list_takes_stop: bool,
    changes: Py<PyAny>,
    name: String,
}

#[pymethods]
impl PySource {
    #[new]
    #[pyo3(signature = (list, changes, *, name=None))]
    fn new(list: &Bound<'_, PyAny>, changes: &Bound<'_, PyAny>, name: Option<String>) -> PyResult<Self> {
        let list_takes_stop = check_sync_callable_of(list, "list", &[0, 1])? == 1;
        check_sync_callable(changes, "changes", 2)?;
        let name = source_name(name, || qualname(list))?;
        Ok(Self { list: list.clone().unbind(), list_takes_stop, changes: changes.clone().unbind(), name })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    fn __repr__(&self) -> String {
        format!("<reconq.Source name={:?}>", self.name)
    }
}

/// One of the three source classes, as `Cache(source)` was given it.
pub(crate) enum SourceSpec<'py> {
    Polling(PyRef<'py, PyPollingSource>),
    Etcd(PyRef<'py, PyEtcdSource>),
    Python(PyRef<'py, PySource>),
}

impl<'py> SourceSpec<'py> {
    /// The source classes, or `TypeError` naming the argument.
    pub(crate) fn from_py(source: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = source.extract::<PyRef<'py, PyPollingSource>>() {
            return Ok(SourceSpec::Polling(s));
        }
        if let Ok(s) = source.extract::<PyRef<'py, PyEtcdSource>>() {
            return Ok(SourceSpec::Etcd(s));
        }
        if let Ok(s) = source.extract::<PyRef<'py, PySource>>() {
            return Ok(SourceSpec::Python(s));
        }
        let type_name = type_name(source);
        Err(PyTypeError::new_err(format!(
            "source must be a reconq.PollingSource, EtcdSource or Source, not {type_name}"
        )))
    }

    pub(crate) fn name(&self) -> &str {
        match self {
            SourceSpec::Polling(s) => &s.name,
            SourceSpec::Etcd(s) => &s.name,
            SourceSpec::Python(s) => &s.name,
        }
    }

    /// A new Rust source for the cache named `cache`, `stored` or not;
    /// for a stored etcd cache, how a value it kept reads back (the
    /// source's own `decode`).
    pub(crate) fn build(&self, py: Python<'py>, cache: &str, stored: bool) -> PyResult<(AnySource, Option<ReadBack>)> {
        let cache: Arc<str> = Arc::from(cache);
        let invalid = |e: crate::error::InvalidArgument| PyValueError::new_err(e.to_string());
        let mut read_kept = None;
        let source = AnySource(match self {
            SourceSpec::Polling(s) => {
                let polling = PollingSource::with_items(s.interval, poll_with(cache, s.list_fn.clone_ref(py)));
                // Comparing Python objects calls Python: once a poll.
                Box::new(IntPositions(polling.map_err(invalid)?.compare_in(attached_scope())))
            }
            SourceSpec::Etcd(s) => {
                let mut etcd = EtcdSource::new(s.endpoints.clone(), s.prefix.clone()).map_err(invalid)?;
                if let Some(timeout) = s.progress_timeout {
                    etcd = etcd.progress_timeout(timeout).map_err(invalid)?;
                }
                let value = Arc::new(etcd_value(s.decode.clone(), stored));
                // A Python decode attaches once per page or restart.
                let scope = s.decode.is_some().then(attached_scope);
                // A value that decode refuses now (it changed since) is
                // unreadable: the restart relists.
                let read = Arc::clone(&value);
                read_kept =
                    Some(ReadBack { read: Arc::new(move |bytes: &[u8]| read(bytes).ok()), scope: scope.clone() });
                let etcd = etcd.keys(etcd_key).decode(move |bytes: &[u8]| value(bytes));
                Box::new(IntPositions(match scope {
                    Some(scope) => etcd.decode_in(scope),
                    None => etcd,
                }))
            }
            SourceSpec::Python(s) => Box::new(PythonSource {
                cache,
                list: s.list.clone_ref(py),
                list_takes_stop: s.list_takes_stop,
                changes: s.changes.clone_ref(py),
                stop_event: None,
            }),
        });
        Ok((source, read_kept))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPollingSource>()?;
    m.add_class::<PyEtcdSource>()?;
    m.add_class::<PySource>()
}
