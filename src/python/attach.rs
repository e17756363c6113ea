//! Attaching to the interpreter from engine threads: once for each thread's
//! life ([`python_thread_wrapper`]), around each callback ([`attach`]), and
//! safely at exit.
//!
//! On Python < 3.14, a thread that wants the GIL back while the interpreter
//! finalizes is killed with `pthread_exit` (CPython gh-87135): a *forced
//! unwind* through our frames. Rust runs their destructors, and PyO3's
//! attach guard then calls `PyGILState_Release` on a thread state that is no
//! longer current, which aborts the process ("Fatal Python error:
//! PyGILState_Release"). That happens whenever a reconcile (or trigger,
//! watch, `do`) is still running when the exit hook gives up waiting for it
//! (`reconq._lifecycle.EXIT_TIMEOUT`) and it returns to Python while the
//! interpreter tears down.
//!
//! [`attach`] puts a guard *inside* the attach, around the Python code: its
//! destructor runs first during such an unwind and parks the thread forever
//! instead, which is what Python 3.14 itself does (and what PyO3 does when
//! attaching fails the same way). The process then exits normally; the
//! parked thread goes with it.

use std::sync::Arc;

use pyo3::Python;

use crate::thread::ThreadWrapper;

/// [`Python::try_attach`] (`None` once the interpreter finalizes), with the
/// thread parked forever rather than unwound if CPython kills it inside `f`.
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    Python::try_attach(|py| hang_if_killed(|| f(py)))
}

/// Runs a batch of calls into Python attached to the interpreter once
/// (each call's own [`attach`] then costs a thread-local check); if it is
/// shutting down, detached, where each call fails on its own.
pub(crate) fn attached_scope() -> crate::source::BatchScope {
    std::sync::Arc::new(|batch: &mut dyn FnMut()| {
        if attach(|_| batch()).is_none() {
            batch();
        }
    })
}

/// Runs `f`; if the thread is torn down by a forced unwind (not a Rust panic)
/// on the way, parks it forever.
pub(crate) fn hang_if_killed<R>(f: impl FnOnce() -> R) -> R {
    struct HangOnForcedUnwind;
    impl Drop for HangOnForcedUnwind {
        fn drop(&mut self) {
            // Only reached while unwinding: the normal path forgets the
            // guard. A Rust panic goes on unwinding (it is caught above).
            if !std::thread::panicking() {
                loop {
                    std::thread::park();
                }
            }
        }
    }
    let guard = HangOnForcedUnwind;
    let result = f();
    std::mem::forget(guard);
    result
}

/// Runs each engine thread attached to the interpreter once for its whole
/// life (one `PyThreadState`, so `threading.local` persists and callbacks
/// attach cheaply), detached while the engine code runs.
pub(crate) fn python_thread_wrapper() -> ThreadWrapper {
    Arc::new(|body: &mut dyn FnMut()| {
        struct Body<'a>(&'a mut dyn FnMut());
        // SAFETY: `py.detach` runs the closure on this same thread; the
        // body never leaves it.
        unsafe impl Send for Body<'_> {}
        impl Body<'_> {
            fn run(&mut self) {
                (self.0)()
            }
        }
        let mut body = Body(body);
        let ran = attach(|py| {
            let body = &mut body;
            py.detach(move || body.run());
        });
        if ran.is_none() {
            // The interpreter is finalizing: run detached; callbacks fail.
            body.run();
        }
    })
}
