//! # reconq
//!
//! A synchronous controller engine: a deduplicating, delaying, rate-limiting
//! work queue (client-go's `workqueue` semantics, minus its known bugs)
//! feeding a fixed pool of OS threads that run your reconcile function. No
//! async runtime: idle threads block and use no CPU. The same engine is a
//! Python extension, not on PyPI yet: install it from a checkout of the
//! repository into a virtualenv (`python3 -m venv .venv && .venv/bin/pip
//! install .`; building needs a Rust toolchain).
//!
//! You hand it keys; it guarantees that each key is reconciled, never by two
//! workers at once, with duplicates collapsed while it waits, and that a key
//! changed while it runs is reconciled again afterwards (level-triggered);
//! failures are retried with back-off. `docs/guarantees.md` in the
//! repository spells every guarantee out (cited as "guarantees §N" in
//! these docs).
//!
//! ```
//! use std::time::Duration;
//! use reconq::{Action, Controller, ReconcileError};
//!
//! let handle = Controller::from_fn("greeter", |name: &String, ctx| {
//!     if name.is_empty() {
//!         return Err(ReconcileError::permanent("no name")); // parked, not retried
//!     }
//!     if ctx.attempt() == 0 && name == "flaky" {
//!         return Err(ReconcileError::new("backend busy")); // retried with back-off
//!     }
//!     println!("hello, {name}");
//!     Ok(Action::Done)
//! })
//! .workers(4)
//! .start();
//!
//! for name in ["ada", "flaky", "ada", ""] {
//!     handle.enqueue(name.to_string()); // the second "ada" is deduplicated if still waiting
//! }
//! assert!(handle.wait_idle(Duration::from_secs(10)));
//! assert!(handle.stop_with_drain(Duration::from_secs(10)));
//! ```
//!
//! Where to go next:
//! - [`Controller`] (the builder: workers, rate limiter, priorities and
//!   groups, timeouts, a fake clock) and [`ControllerHandle`] (enqueue,
//!   stats, inspect, stop); [`Context`] is what a reconcile sees.
//! - [`WorkQueue`] on its own, with client-go's `get` / `done` loop, and the
//!   rate limiters ([`ExponentialBackoff`], [`default_rate_limiter`], ...).
//! - [`Manager`]: Cilium-style named periodic controllers.
//! - [`metrics`] (Prometheus text and the `metrics` facade) and [`status`].
//! - [`FakeClock`] for deterministic tests of back-offs and delays.
//! - The README (two commands to set up, a first controller in Python,
//!   what else it does, benchmarks) and the pages of `docs/` it links.
//!
//! Linux and macOS are the supported platforms.

// docs.rs (Cargo.toml's `[package.metadata.docs.rs]`) marks each item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
// The docs link to the builder methods of the features they mention
// (`Controller::store`, `LeaderElection`, ...), which a build without those
// features does not have. The default build has every feature, so it still
// checks every link (`.ci/run` builds the docs both ways with `-D warnings`).
#![cfg_attr(
    not(all(feature = "store", feature = "etcd", feature = "parallelize")),
    allow(rustdoc::broken_intra_doc_links)
)]

// Signal handling (src/signals.rs: sigaction and a self-pipe) and the
// store's file lock (src/store/lock.rs: flock) are POSIX: say so before the
// compiler lists what it cannot find.
#[cfg(not(unix))]
compile_error!("reconq supports Linux and macOS (Unix) only: it uses POSIX signals, pipes and file locks");

mod cache;
mod clock;
mod context;
mod controller;
mod coordination;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod graph;
mod key_encoding;
mod logs;
mod manager;
pub mod metrics;
mod observe;
mod panics;
#[cfg(feature = "parallelize")]
mod parallelize;
#[cfg(feature = "python")]
mod python;
mod queue;
mod rate_limit;
mod shrink;
mod signals;
pub mod source;
mod store;
mod sync;
mod thread;

pub use cache::{Applied, Cache, CacheBuilder, CacheError, CacheStats, CacheUse, Subscription, UnknownIndex};
pub use clock::{Clock, FakeClock, SystemClock, Wake};
pub use controller::{
    Action, Batch, BoxError, Context, Controller, ControllerHandle, ControllerKey, CrossPartitionError, CycleError,
    DEFAULT_LIST_PRIORITY, DependencyError, KeyInfo, KeyStatus, ReconcileError, Reconciler, RetryPolicy, StartError,
    Stats, StopOptions, StopReport, StopSignal, Stopping, TriggerOutcome, Watch, WatchError,
};
#[cfg(feature = "etcd")]
pub use coordination::{Endpoints, LeaderElection, OnLost, Sharding};
pub use coordination::{LeaderStatus, ShardStatus, partition_of, partition_of_by};
/// The channel crate [`ControllerHandle::watch_channel`] takes receivers of,
/// re-exported so a program uses the same version.
pub use crossbeam_channel;
pub use error::InvalidArgument;
#[cfg(feature = "etcd")]
pub use etcd::EtcdError;
pub use key_encoding::{Keepable, KeptObject, StoreKey, decode_key, encode_key};
pub use manager::{
    ControllerParams, ControllerStatus, DEFAULT_ERROR_RETRY_BASE, DEFAULT_MANAGER_NAME, DoError, Manager,
    ManagerBuilder, UnknownController, WeakManager,
};
pub use observe::status;
#[cfg(feature = "parallelize")]
pub use parallelize::{ParallelizeOptions, parallelize, parallelize_with};
pub use queue::{GetError, KeyState, QueueCounts, WorkQueue, WorkQueueBuilder};
pub use rate_limit::{
    ExponentialBackoff, FastSlow, MaxOf, RateLimiter, TokenBucket, WithMaxWait, default_rate_limiter,
};
#[cfg(feature = "etcd")]
pub use source::EtcdSource;
pub use source::{PollingSource, Source, SourceError};
#[cfg(feature = "store")]
pub use store::{SCHEMA_VERSION, SqliteStore, StoreClaim, StoredKey, StoredState};
pub use store::{StoreError, StoreStats};
pub use thread::ThreadWrapper;

/// The Rust examples of the README and of every page in `docs/`, compiled
/// and run as doc tests: one hidden item per page, documented by the page.
/// `tests/python/test_readme.py` checks that every page is listed. The
/// pages show every capability, so they are tested with every feature on.
#[cfg(all(doctest, feature = "store", feature = "etcd", feature = "parallelize"))]
mod doc_pages {
    macro_rules! pages {
        ($($page:ident = $path:literal,)*) => {
            $(#[doc = include_str!($path)] pub struct $page;)*
        };
    }

    pages! {
        Readme = "../README.md",
        Architecture = "../docs/architecture.md",
        Benchmarks = "../docs/benchmarks.md",
        Guarantees = "../docs/guarantees.md",
        HotPath = "../docs/hot_path.md",
        Lifecycle = "../docs/lifecycle.md",
        Logs = "../docs/logs.md",
        Metrics = "../docs/metrics.md",
        Periodic = "../docs/periodic.md",
        Queue = "../docs/queue.md",
        Replicas = "../docs/replicas.md",
        Scheduling = "../docs/scheduling.md",
        Sources = "../docs/sources.md",
        Status = "../docs/status.md",
        Store = "../docs/store.md",
        Testing = "../docs/testing.md",
    }
}

/// The Rust API conventions a user's compiler enforces (issue 35), checked
/// as doc tests: each `compile_fail` example is paired with the same code
/// written as it should be, which compiles, or pinned to its error code, so
/// a failure for another reason (a typo, a renamed item) does not pass
/// unnoticed.
#[cfg(doctest)]
mod conventions {
    /// A builder dropped before `.start()` is a warning (`#[must_use]`):
    ///
    /// ```compile_fail
    /// #![deny(unused_must_use)]
    /// use reconq::{Action, Controller};
    /// Controller::from_fn("forgotten", |_: &String, _| Ok(Action::Done)).workers(2);
    /// ```
    ///
    /// ```
    /// #![deny(unused_must_use)]
    /// use reconq::{Action, Controller};
    /// let handle = Controller::from_fn("started", |_: &String, _| Ok(Action::Done)).workers(2).start();
    /// handle.stop();
    /// ```
    pub struct BuilderMustBeUsed;

    /// An error enum may grow (`#[non_exhaustive]`): a match outside the
    /// crate needs a wildcard arm.
    ///
    /// ```compile_fail,E0004
    /// fn why(error: &reconq::StoreError) -> &'static str {
    ///     match error {
    ///         reconq::StoreError::Locked(_) => "locked",
    ///         reconq::StoreError::Invalid(_) => "invalid",
    ///         reconq::StoreError::Io(_) => "io",
    ///     }
    /// }
    /// ```
    ///
    /// ```
    /// fn why(error: &reconq::StoreError) -> &'static str {
    ///     match error {
    ///         reconq::StoreError::Locked(_) => "locked",
    ///         reconq::StoreError::Invalid(_) => "invalid",
    ///         reconq::StoreError::Io(_) => "io",
    ///         _ => "other",
    ///     }
    /// }
    /// assert_eq!(why(&reconq::StoreError::Locked("orders".into())), "locked");
    /// ```
    pub struct ErrorEnumsMayGrow;

    /// A report may grow (`#[non_exhaustive]`): it cannot be built by a
    /// literal outside the crate, only read.
    ///
    /// ```compile_fail,E0639
    /// let _ = reconq::ShardStatus {
    ///     name: String::new(),
    ///     partitions: 1,
    ///     owned: Default::default(),
    ///     members: 1,
    ///     last_error: None,
    /// };
    /// ```
    pub struct ReportsMayGrow;
}
