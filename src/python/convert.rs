//! Arguments from Python to Rust values, and back: every check of the
//! binding's plain arguments, so each error names the argument and says
//! what was expected, the same way everywhere. Every check runs before the
//! call changes anything. This room takes nothing from the rest of the
//! binding (keys have theirs, `key.rs`).
//!
//! Seconds (float or int) to `Duration` (guarantees §4, "Durations"):
//! * NaN is a `ValueError` everywhere; `bool` is a `TypeError`.
//! * Delays (`add_after`, `Requeue(after=)`...): negative means now.
//! * Timeouts and limiter parameters: negative is a `ValueError`.
//! * Intervals (`interval=`, `debounce=`...): not positive is a `ValueError`.
//! * Infinity and values past `Duration::MAX` are an `OverflowError`.
//!
//! Also: `time.time()` timestamps, priorities (guarantees §8), the
//! controller's `jitter=` and `timeout=`, and the callables reconq calls
//! from its own threads.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyTuple};

/// The name of `obj`'s type, for error messages ("?" if even that fails).
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// Reads a number of seconds. `bool` is refused: `timeout=True` is a bug.
fn seconds(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be a number of seconds, not bool")));
    }
    let secs: f64 = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            return PyOverflowError::new_err(format!("{what} is out of range"));
        }
        let type_name = type_name(obj);
        PyTypeError::new_err(format!("{what} must be a number of seconds (float or int), not {type_name}"))
    })?;
    if secs.is_nan() {
        return Err(PyValueError::new_err(format!("{what} must not be NaN")));
    }
    Ok(secs)
}

fn from_secs(secs: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| out_of_range(what, secs))
}

/// The error for a number of seconds too large for a `Duration` (or an
/// instant), short however large the number: `1e300` is shown as `1e300`,
/// not as its 301 digits.
fn out_of_range(what: &str, secs: f64) -> PyErr {
    let largest = Duration::MAX.as_secs_f64();
    PyOverflowError::new_err(format!("{what} is out of range: {} seconds (at most {largest:e})", shown(secs)))
}

/// A float for an error message: `1e300` rather than its 301 digits.
pub(crate) fn shown(x: f64) -> String {
    if x.abs() < 1e15 { format!("{x}") } else { format!("{x:e}") }
}

/// A positive number of seconds (`flush_interval=`, `debounce=`): not
/// positive (or NaN) is a `ValueError`, past `Duration::MAX` an
/// `OverflowError` (not "not positive").
pub(crate) fn positive_secs(secs: f64, what: &str) -> PyResult<Duration> {
    match Duration::try_from_secs_f64(secs) {
        Err(_) if secs > 0.0 => Err(out_of_range(what, secs)),
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(PyValueError::new_err(format!("{what} must be a positive number of seconds, got {}", shown(secs)))),
    }
}

/// [`positive_secs`] for any Python object (`interval=`, `resync=`): a
/// `bool` or a non-number is a `TypeError` first.
pub(crate) fn positive_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    positive_secs(seconds(obj, what)?, what)
}

/// A delay: negative means now (zero).
pub(crate) fn delay_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let secs = seconds(obj, what)?;
    if secs <= 0.0 { Ok(Duration::ZERO) } else { from_secs(secs, what) }
}

/// A duration that must not be negative (timeouts, limiter parameters).
pub(crate) fn non_negative_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Duration> {
    let secs = seconds(obj, what)?;
    if secs < 0.0 {
        return Err(PyValueError::new_err(format!("{what} must not be negative, got {secs}")));
    }
    from_secs(secs, what)
}

/// How long leaving a `with` block waits for what it stops
/// (`reconq._lifecycle.WITH_EXIT_TIMEOUT`, read each time so tests can
/// lower it): bounded, so an `__exit__` cannot hang on a stuck reconcile
/// or a source that ignores its stop event.
pub(crate) fn with_exit_timeout(py: Python<'_>) -> PyResult<Duration> {
    let bound = py.import("reconq._lifecycle")?.getattr("WITH_EXIT_TIMEOUT")?;
    non_negative_from_py(&bound, "reconq._lifecycle.WITH_EXIT_TIMEOUT")
}

/// An optional timeout: `None` is "wait forever".
pub(crate) fn timeout_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    match obj {
        None => Ok(None),
        Some(obj) if obj.is_none() => Ok(None),
        Some(obj) => non_negative_from_py(obj, "timeout").map(Some),
    }
}

/// Seconds as a Python float.
pub(crate) fn to_secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A wall-clock time as a `time.time()` timestamp (negative before 1970).
pub(crate) fn unix_timestamp(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A `time.time()` timestamp, checked.
fn timestamp_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!("{what} must be a time.time() timestamp, not bool")));
    }
    let t: f64 = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyOverflowError::new_err(format!("{what} is out of range"))
        } else {
            PyTypeError::new_err(format!("{what} must be a time.time() timestamp, not {}", type_name(obj)))
        }
    })?;
    if t.is_nan() {
        return Err(PyValueError::new_err(format!("{what} must not be NaN")));
    }
    Ok(t)
}

/// A `time.time()` timestamp as an `Instant`: a time in the past is now.
pub(crate) fn instant_from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Instant> {
    let t = timestamp_from_py(obj, what)?;
    let now = Instant::now();
    let ahead = t - wall_now();
    if ahead <= 0.0 {
        return Ok(now);
    }
    Duration::try_from_secs_f64(ahead)
        .ok()
        .and_then(|d| now.checked_add(d))
        .ok_or_else(|| PyOverflowError::new_err(format!("{what} is out of range: {}", shown(t))))
}

fn wall_now() -> f64 {
    unix_timestamp(SystemTime::now())
}

/// An `Instant` as a `time.time()` timestamp.
pub(crate) fn instant_to_wall(at: Instant) -> f64 {
    let now = Instant::now();
    let wall = wall_now();
    if at >= now { wall + (at - now).as_secs_f64() } else { wall - (now - at).as_secs_f64() }
}

/// When an enqueue from Python (`WorkQueue.add*`, `Controller.enqueue*`)
/// asks for its key.
pub(crate) enum Due {
    Now,
    /// `seconds=` from now (<= 0: now).
    After(Duration),
    /// At `t=`, a `time.time()` timestamp (in the past: now).
    At(Instant),
}

impl Due {
    pub(crate) fn after(seconds: &Bound<'_, PyAny>) -> PyResult<Self> {
        delay_from_py(seconds, "seconds").map(Self::After)
    }

    pub(crate) fn at(t: &Bound<'_, PyAny>) -> PyResult<Self> {
        instant_from_py(t, "t").map(Self::At)
    }
}

/// Longest `int` shown in full in a priority's error; longer ones say their
/// size.
const SHOWN_DIGITS: usize = 30;

/// Reads `priority=` (for `#[pyo3(from_py_with = ...)]`; guarantees §8): an
/// `int` that fits in an `i32`, else an `OverflowError` naming the argument
/// and the range (pyo3's own conversion says only "out of range integral
/// type conversion attempted").
pub(crate) fn priority_from_py(obj: &Bound<'_, PyAny>) -> PyResult<i32> {
    obj.extract::<i32>().map_err(|e| {
        if !e.is_instance_of::<PyOverflowError>(obj.py()) {
            return e;
        }
        let text = obj.str().map(|s| s.to_string()).unwrap_or_default();
        let got = if text.len() <= SHOWN_DIGITS { text } else { format!("an int of {} digits", text.len()) };
        PyOverflowError::new_err(format!("priority must be between {} and {}, got {got}", i32::MIN, i32::MAX))
    })
}

/// `jitter=(fraction, seed)`: `0 <= fraction <= 1`, a seed that fits u64.
pub(crate) fn jitter_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<(f64, u64)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    let (fraction, seed): (f64, u64) = obj.extract().map_err(|e: PyErr| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            PyOverflowError::new_err("jitter seed is out of range (0 to 2**64 - 1)")
        } else {
            PyTypeError::new_err(format!("jitter must be a (fraction, seed) tuple, not {}", type_name(obj)))
        }
    })?;
    if !(0.0..=1.0).contains(&fraction) {
        return Err(PyValueError::new_err(format!("jitter fraction must be within 0 and 1, got {fraction}")));
    }
    Ok(Some((fraction, seed)))
}

/// A reconcile's `timeout=`: positive seconds or None (guarantees §7).
pub(crate) fn reconcile_timeout_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let timeout = timeout_from_py(obj)?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(PyValueError::new_err("timeout must be positive"));
    }
    Ok(timeout)
}

static IS_COROUTINE_FUNCTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

static IS_ASYNC_GENERATOR_FUNCTION: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

static SIGNATURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `inspect.<name>`, looked up once into `cell`.
fn inspect<'py>(py: Python<'py>, cell: &'static PyOnceLock<Py<PyAny>>, name: &str) -> PyResult<&'py Bound<'py, PyAny>> {
    Ok(cell.get_or_try_init(py, || Ok::<_, PyErr>(py.import("inspect")?.getattr(name)?.unbind()))?.bind(py))
}

/// An optional callable taking `args` positional arguments (None: none).
pub(crate) fn optional_callable(
    obj: Option<&Bound<'_, PyAny>>,
    what: &str,
    args: usize,
) -> PyResult<Option<Py<PyAny>>> {
    match obj {
        Some(f) if !f.is_none() => {
            check_sync_callable(f, what, args)?;
            Ok(Some(f.clone().unbind()))
        }
        _ => Ok(None),
    }
}

/// `obj` must be callable and neither an `async def` function nor an
/// async generator function: engine threads call it directly, with no
/// event loop, so a coroutine function would return a coroutine that never
/// runs, and an async generator one an iterator that is not one (`what`
/// names the argument). It must also accept `args` positional arguments
/// where Python can tell (see [`arguments_taken`]).
pub(crate) fn check_sync_callable(obj: &Bound<'_, PyAny>, what: &str, args: usize) -> PyResult<()> {
    check_callable(obj, what, &[args], Calls::Sync).map(drop)
}

/// A reconcile or a Manager `do`: as [`check_sync_callable`], except that
/// an `async def` function is welcome (the binding awaits what it returns
/// on an event loop: `awaiting`). An async generator function is still
/// refused: what it returns is neither a result nor an awaitable.
pub(crate) fn check_reconcile_callable(obj: &Bound<'_, PyAny>, what: &str, args: usize) -> PyResult<()> {
    check_callable(obj, what, &[args], Calls::SyncOrAsync).map(drop)
}

/// [`check_sync_callable`] for a callable that may take one of several
/// numbers of positional arguments: the first of `choices` it accepts,
/// which is the number to call it with (`choices[0]` if Python cannot
/// tell).
pub(crate) fn check_sync_callable_of(obj: &Bound<'_, PyAny>, what: &str, choices: &[usize]) -> PyResult<usize> {
    check_callable(obj, what, choices, Calls::Sync)
}

/// Which kinds of callable an argument takes.
#[derive(Clone, Copy, PartialEq)]
enum Calls {
    /// Plain functions only: called on engine threads, no event loop.
    Sync,
    /// Plain or `async def` functions (reconciles and `do`s).
    SyncOrAsync,
}

impl Calls {
    /// What the argument must be, and why other kinds are refused.
    fn rule(self) -> (&'static str, &'static str) {
        match self {
            Self::Sync => ("a plain function", "reconq calls it on its own threads, with no event loop"),
            Self::SyncOrAsync => ("a function or an async def function", "it must return a result or an awaitable"),
        }
    }
}

fn check_callable(obj: &Bound<'_, PyAny>, what: &str, choices: &[usize], calls: Calls) -> PyResult<usize> {
    let py = obj.py();
    if !obj.is_callable() {
        return Err(PyTypeError::new_err(format!("{what} must be callable, not {}", type_name(obj))));
    }
    // Each kind with the argument that refuses it: a coroutine function
    // only where no loop runs it, an async generator function everywhere.
    let refused = [
        (Calls::Sync, &IS_COROUTINE_FUNCTION, "iscoroutinefunction", "a coroutine function (async def)"),
        (
            calls,
            &IS_ASYNC_GENERATOR_FUNCTION,
            "isasyncgenfunction",
            "an async generator function (async def with yield)",
        ),
    ];
    for (refused_by, cell, check, kind) in refused {
        if refused_by == calls && inspect(py, cell, check)?.call1((obj,))?.is_truthy()? {
            let (must, why) = calls.rule();
            return Err(PyTypeError::new_err(format!("{what} must be {must}, not {kind}: {why}")));
        }
    }
    arguments_taken(obj, what, choices)
}

/// The first of `choices` (numbers of positional arguments) a call of
/// `obj` accepts: checked now, with `inspect.signature`, because a wrong
/// signature would otherwise show only when the engine calls it, as a
/// failure retried forever. A callable without a signature (some
/// builtins) is taken to accept `choices[0]`.
fn arguments_taken(obj: &Bound<'_, PyAny>, what: &str, choices: &[usize]) -> PyResult<usize> {
    let py = obj.py();
    let signature = match inspect(py, &SIGNATURE, "signature")?.call1((obj,)) {
        Ok(signature) => signature,
        Err(e) if e.is_instance_of::<PyValueError>(py) || e.is_instance_of::<PyTypeError>(py) => return Ok(choices[0]),
        Err(e) => return Err(e),
    };
    let mut refusal = None;
    for &args in choices {
        let placeholders = PyTuple::new(py, (0..args).map(|_| py.None()))?;
        match signature.call_method1("bind", placeholders) {
            Ok(_) => return Ok(args),
            Err(e) if e.is_instance_of::<PyTypeError>(py) => refusal = Some(e),
            Err(e) => return Err(e),
        }
    }
    let takes: Vec<String> = choices.iter().map(|&args| takes(args)).collect();
    let refusal = refusal.map(|e| e.value(py).to_string()).unwrap_or_default();
    Err(PyTypeError::new_err(format!(
        "{what} must accept {}, but its signature is {signature} ({refusal})",
        takes.join(" or ")
    )))
}

fn takes(args: usize) -> String {
    match args {
        0 => "no arguments".to_owned(),
        1 => "one positional argument".to_owned(),
        n => format!("{n} positional arguments"),
    }
}
