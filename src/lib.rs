//! # reconq
//!
//! A synchronous controller engine: a deduplicating, delaying, rate-limiting
//! work queue (client-go's `workqueue` semantics, minus its known bugs) feeding
//! a fixed pool of OS threads that run your reconcile function. No async
//! runtime: idle threads block on a condvar and use no CPU.
//!
//! The public contract is the project's `API.md`; the crate root exports every
//! name in it.

mod clock;
mod controller;
mod error;
mod logs;
mod manager;
pub mod metrics;
mod observe;
mod parallelize;
#[cfg(feature = "python")]
mod python;
mod queue;
mod rate_limit;
mod store;
mod sync;
mod thread;

pub use clock::{Clock, FakeClock, SystemClock, Wake};
pub use controller::{
    Action, BoxError, Context, Controller, ControllerHandle, ControllerKey, KeyInfo, KeyStatus, ReconcileError,
    Reconciler, RetryPolicy, Stats, StopReport, StopSignal, TriggerOutcome,
};
pub use error::InvalidArgument;
pub use manager::{
    ControllerParams, ControllerStatus, DEFAULT_ERROR_RETRY_BASE, DEFAULT_MANAGER_NAME, DoError, Manager,
    ManagerBuilder, UnknownController, WeakManager,
};
pub use observe::status;
pub use parallelize::{ParallelizeOptions, parallelize, parallelize_with};
pub use store::{SCHEMA_VERSION, SqliteStore, StoreClaim, StoreError, StoreStats, StoreKey, StoredKey, StoredState, decode_key, encode_key};
pub use queue::{GetError, KeyState, QueueCounts, WorkQueue, WorkQueueBuilder};
pub use rate_limit::{
    ExponentialBackoff, FastSlow, MaxOf, RateLimiter, TokenBucket, WithMaxWait, default_rate_limiter,
};
pub use thread::ThreadWrapper;

/// The README's Rust examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
