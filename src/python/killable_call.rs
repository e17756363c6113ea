//! Calls of Python callables from engine threads that CPython may kill
//! while the call runs (see `attach`: on Python < 3.14 a thread that wants
//! the GIL back while the interpreter finalizes ends in `pthread_exit`, a
//! forced unwind that starts inside the call).
//!
//! PyO3 declares the C API `extern "C"`, which tells the compiler these
//! functions never unwind. Where PyO3's own code around such a call has
//! something to drop, the call site then has no unwind entry, and a forced
//! unwind that reaches it aborts the process: it never gets to the guard
//! in `attach`. The stable-ABI
//! (abi3) build hits this in every call (PyO3 builds an argument tuple it
//! owns, then `PyObject_Call`); the version-specific build, whose one-argument
//! call borrows, happens not to. So engine threads call Python here:
//! `PyObject_Call` declared `extern "C-unwind"`, with
//! [`hang_if_killed`]'s guard directly around it, so the forced unwind goes
//! no further than this frame and the thread parks as `attach` intends.

use std::ptr;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{BoundObject, ffi};

use super::attach::hang_if_killed;

/// `PyObject_Call`, through a pointer typed `extern "C-unwind"`, which
/// lets the call unwind (`pthread_exit` inside it is a forced unwind).
///
/// Not a second declaration of the symbol: PyO3's `extern "C"` one marks
/// the function `nounwind` in LLVM, which would then drop the landing pad
/// from our call too, and the optimizer sees through a plain function
/// pointer to the same declaration; `black_box` keeps the pointer opaque.
fn py_object_call() -> PyObjectCall {
    let declared: DeclaredPyObjectCall = ffi::PyObject_Call;
    // SAFETY: the same function; "C" and "C-unwind" are the same calling
    // convention, the latter only allows the callee to unwind.
    std::hint::black_box(unsafe { std::mem::transmute::<DeclaredPyObjectCall, PyObjectCall>(declared) })
}

/// `PyObject_Call` as PyO3 declares it.
type DeclaredPyObjectCall =
    unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;
type PyObjectCall =
    unsafe extern "C-unwind" fn(*mut ffi::PyObject, *mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// `callable(*args)`, safe to run on a thread CPython may kill during the
/// call.
pub(crate) fn call<'py>(
    callable: &Bound<'py, PyAny>,
    args: impl IntoPyObject<'py, Target = PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    call_kw(callable, args, None)
}

/// `callable(*args, **kwargs)` (`PyObject_Call`, in the stable ABI of every
/// Python 3), safe to run on a thread CPython may kill during the call.
pub(crate) fn call_kw<'py>(
    callable: &Bound<'py, PyAny>,
    args: impl IntoPyObject<'py, Target = PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callable.py();
    let args = args.into_pyobject(py).map_err(Into::into)?.into_bound();
    let kwargs = kwargs.map_or(ptr::null_mut(), |kwargs| kwargs.as_ptr());
    let call = py_object_call();
    // SAFETY: the pointers are live objects (or a NULL `kwargs`) for the
    // call (the GIL is held: `callable` is bound); the result is a new
    // reference or NULL with an exception set. If the thread is killed in
    // the call, the guard is the first thing dropped, and it never returns.
    let result = hang_if_killed(|| unsafe { call(callable.as_ptr(), args.as_ptr(), kwargs) });
    // SAFETY: as above.
    unsafe { Bound::from_owned_ptr_or_err(py, result) }
}
