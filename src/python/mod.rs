//! The `reconq._native` extension module (guarantees §4), built by maturin with the
//! `python` feature. `python/reconq/__init__.py` re-exports everything.
//!
//! The rooms, floor by floor from the bottom; a room imports only rooms on
//! lower floors (no circle, no arrow up into a folder's `mod.rs`;
//! `tests/layering.rs` checks it):
//!
//! 1. `attach` (engine threads attach once for their life),
//!    `killable_call` (engine threads call user code so that Python's exit
//!    can end them, beside `attach`'s guard), `convert` (plain arguments:
//!    seconds, timestamps, priorities, callables, type names), `metrics`,
//!    `value_bytes` (an etcd value held inline when short).
//! 2. `key` (Python keys as a GIL-free Rust value), `errors` (exceptions,
//!    reconcile results), `logs` (the one `reconq` logger; the engine's
//!    events to Python `logging`), `signals` (waits Ctrl-C gets through),
//!    `clock`, `election`, `store`.
//! 3. `cache_values`, `context` (`reconq.context()`), `limiters`,
//!    `sharding`.
//! 4. `awaiting` (`async def` reconciles and `do`s on an asyncio loop),
//!    `queue`, `reconciler` (a Python reconcile and watch iterators for the
//!    engine), `manager`, `sources`, `digest`, `status`.
//! 5. `cache`, `watch` (`watch_cache`'s options).
//! 6. `controller/`: the class (`mod.rs`) over `options`, `lifecycle`
//!    (start, stop, run), `triggers` and `batch`.

mod attach;
mod awaiting;
mod cache;
mod cache_values;
mod clock;
mod context;
mod controller;
mod convert;
mod digest;
mod election;
mod errors;
mod key;
mod killable_call;
mod limiters;
mod logs;
mod manager;
mod metrics;
mod queue;
mod reconciler;
mod sharding;
mod signals;
mod sources;
mod status;
mod store;
mod value_bytes;
mod watch;

use pyo3::prelude::*;

#[pymodule(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    signals::record_main_thread(py)?;
    // The engine's own log events go to Python `logging` (see `logs`).
    logs::install(py)?;

    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<store::PySqliteStore>()?;

    m.add_class::<queue::PyWorkQueue>()?;
    m.add_class::<clock::PyFakeClock>()?;

    m.add_class::<limiters::PyRateLimiter>()?;
    m.add_class::<limiters::ExponentialBackoff>()?;
    m.add_class::<limiters::FastSlow>()?;
    m.add_class::<limiters::TokenBucket>()?;
    m.add_class::<limiters::MaxOf>()?;
    m.add_class::<limiters::WithMaxWait>()?;
    m.add_function(wrap_pyfunction!(limiters::default_rate_limiter, m)?)?;

    m.add_class::<controller::PyController>()?;
    m.add_class::<controller::PyBatch>()?;
    context::register(m)?;
    election::register(m)?;
    sharding::register(m)?;
    manager::register(m)?;
    status::register(m)?;
    metrics::register(m)?;
    cache::register(m)?;
    Ok(())
}
