//! Waiting with the GIL released while Python's signals still get through.
//!
//! Only CPython's main thread runs signal handlers, so only there is a
//! blocking wait cut into slices of at most 100 ms, re-attaching between
//! slices to run `check_signals()`: Ctrl-C raises `KeyboardInterrupt`
//! promptly. Other threads wait in one piece, so an idle wait wakes nobody
//! (G8). And while `Controller.run()` waits, SIGTERM raises
//! `KeyboardInterrupt` as Ctrl-C does ([`SigtermAsInterrupt`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use super::attach::attach;
use crate::clock::deadline_after;
use crate::context::StopSignal;

/// How long a main-thread wait runs before checking for signals.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// `threading.main_thread().ident`, recorded at import (0: unknown).
static MAIN_THREAD_IDENT: AtomicU64 = AtomicU64::new(0);

pub(crate) fn record_main_thread(py: Python<'_>) -> PyResult<()> {
    let ident: u64 = py.import("threading")?.call_method0("main_thread")?.getattr("ident")?.extract()?;
    MAIN_THREAD_IDENT.store(ident, Ordering::Relaxed);
    Ok(())
}

/// Whether signals can reach this thread (only CPython's main thread runs
/// signal handlers; `check_signals` elsewhere is a no-op).
pub(crate) fn on_main_thread() -> bool {
    // SAFETY: takes no arguments and touches no Python state.
    let ident = unsafe { pyo3::ffi::PyThread_get_thread_ident() } as u64;
    let main = MAIN_THREAD_IDENT.load(Ordering::Relaxed);
    main == 0 || ident == main
}

/// Runs `wait(slice)` detached until it returns `Some`, or until `deadline`
/// passes (then `None`); on the main thread in slices of at most 100 ms with
/// `check_signals()` in between. `wait` must return within its slice.
pub(crate) fn wait_interruptibly<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    wait: impl Fn(Option<Duration>) -> Option<T> + Sync,
) -> PyResult<Option<T>> {
    let sliced = on_main_thread();
    loop {
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let slice = match (remaining, sliced) {
            (Some(r), true) => Some(r.min(SIGNAL_SLICE)),
            (None, true) => Some(SIGNAL_SLICE),
            (r, false) => r,
        };
        if let Some(value) = py.detach(|| wait(slice)) {
            return Ok(Some(value));
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

/// A `wait_synced(timeout)` of the engine (a cache's, a controller's), as
/// [`wait_interruptibly`] runs it: `wait(slice)` returns whether synced,
/// and `false` at once when it never will be (a cache stopped unsynced),
/// which a `false` before its slice ran out tells apart from a slice
/// that passed.
pub(crate) fn wait_synced_interruptibly(
    py: Python<'_>,
    timeout: Option<Duration>,
    wait: impl Fn(Option<Duration>) -> bool + Sync,
) -> PyResult<bool> {
    let deadline = timeout.map(|t| deadline_after(Instant::now(), t));
    let synced = wait_interruptibly(py, deadline, |slice| {
        let began = Instant::now();
        let synced = wait(slice);
        (synced || slice.is_none_or(|slice| began.elapsed() < slice)).then_some(synced)
    })?;
    Ok(synced.unwrap_or(false))
}

/// Waits until `signal` is set, for at most `timeout` (None: no limit), as
/// [`wait_interruptibly`] runs it; returns whether it is set.
pub(crate) fn wait_for_signal(py: Python<'_>, signal: &StopSignal, timeout: Option<Duration>) -> PyResult<bool> {
    let deadline = timeout.map(|t| deadline_after(Instant::now(), t));
    let set =
        wait_interruptibly(py, deadline, |slice| signal.wait_timeout(slice.unwrap_or(Duration::MAX)).then_some(()))?;
    Ok(set.is_some() || signal.is_set())
}

/// While `run()` waits: SIGTERM (the stop signal of systemd, Docker and
/// Kubernetes) raises KeyboardInterrupt as Ctrl-C does, so it drains too.
/// Only on the main thread (the only one Python lets set handlers) and only
/// if SIGTERM has its default disposition: a program's own handler wins.
/// The previous handler is put back on drop.
pub(crate) struct SigtermAsInterrupt {
    previous: Option<Py<PyAny>>,
}

impl SigtermAsInterrupt {
    pub(crate) fn install(py: Python<'_>) -> PyResult<Self> {
        if !on_main_thread() {
            return Ok(Self { previous: None });
        }
        let signal = py.import("signal")?;
        let sigterm = signal.getattr("SIGTERM")?;
        let previous = signal.call_method1("getsignal", (&sigterm,))?;
        if !previous.eq(signal.getattr("SIG_DFL")?)? {
            return Ok(Self { previous: None });
        }
        signal.call_method1("signal", (&sigterm, signal.getattr("default_int_handler")?))?;
        Ok(Self { previous: Some(previous.unbind()) })
    }
}

impl Drop for SigtermAsInterrupt {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            attach(|py| {
                let restored = py
                    .import("signal")
                    .and_then(|signal| signal.call_method1("signal", (signal.getattr("SIGTERM")?, previous)).map(drop));
                if let Err(e) = restored {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
}
