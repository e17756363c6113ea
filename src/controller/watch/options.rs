//! [`Watch`]: how a controller hears of a cache's changes (E6, E7): which
//! keys a change enqueues (`map`), whether it enqueues at all
//! (`predicate`), at which priority, and how often every cached key is
//! enqueued again (`resync`).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::error::InvalidArgument;
use crate::panics;
use crate::source::{BatchScope, Source};

/// A map that reports its failure (a panic caught, or a Python exception):
/// the change then enqueues its own key (E6).
pub(crate) type MapFn<S, K> =
    dyn Fn(&<S as Source>::Key, Option<&<S as Source>::Object>) -> Result<Vec<K>, String> + Send + Sync;
/// A predicate that reports its failure, as [`MapFn`].
pub(crate) type PredicateFn<S> =
    dyn Fn(Option<&<S as Source>::Object>, Option<&<S as Source>::Object>) -> Result<bool, String> + Send + Sync;
/// How a controller key is made from the cache key a failed map was given.
pub(crate) type FallbackFn<S, K> = dyn Fn(&<S as Source>::Key) -> K + Send + Sync;

/// The priority of keys enqueued by a list, a relist, a `PollingSource`'s
/// first poll or a resync, by default: controller-runtime's `LowPriority`,
/// so a (re)list of many keys does not delay live changes.
pub const DEFAULT_LIST_PRIORITY: i32 = -100;

/// How a controller watches a cache of source `S`, enqueueing keys of type
/// `K` (see [`Controller::watch_cache`](crate::Controller::watch_cache)).
///
/// ```
/// use std::time::Duration;
/// use reconq::{PollingSource, Watch};
///
/// type Source = PollingSource<String, u64>;
/// // Every change enqueues its own key (the defaults)...
/// let same: Watch<Source, String> = Watch::new();
/// // ...or the keys `map` gives, only when the size grew, every key again
/// // each hour, live changes ahead of other work.
/// let owners: Watch<Source, String> = Watch::with_map(|key: &String, _size: Option<&u64>| {
///     vec![key.split('/').next().unwrap_or_default().to_string()]
/// })
/// .predicate(|old: Option<&u64>, new: Option<&u64>| new > old)
/// .resync(Duration::from_secs(3600))
/// .unwrap()
/// .priority(10);
/// # let _ = (same, owners);
/// ```
#[must_use = "a Watch does nothing until given to `Controller::watch_cache`"]
pub struct Watch<S: Source, K> {
    pub(crate) map: Arc<MapFn<S, K>>,
    pub(crate) fallback: Arc<FallbackFn<S, K>>,
    /// `None`: the default (every delete, every put that changed the object).
    pub(crate) predicate: Option<Arc<PredicateFn<S>>>,
    pub(crate) resync: Option<Duration>,
    pub(crate) priority: i32,
    pub(crate) list_priority: i32,
    /// What a run of changes' calls of `map` and `predicate` run inside,
    /// if anything (see [`BatchScope`]).
    pub(crate) scope: Option<BatchScope>,
}

impl<S: Source> Watch<S, S::Key> {
    /// Each change enqueues its own key (the cache's keys are the
    /// controller's), with the default predicate, no resync, live changes
    /// at priority 0 and lists at [`DEFAULT_LIST_PRIORITY`].
    pub fn new() -> Self {
        Self::with_map(|key: &S::Key, _: Option<&S::Object>| [key.clone()])
    }
}

impl<S: Source> Default for Watch<S, S::Key> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Source, K> Watch<S, K>
where
    S::Key: Into<K>,
{
    /// Each change enqueues the keys `map(key, obj)` gives: `obj` is the
    /// object the cache now holds, or for a delete the last one it held
    /// (`None` when it never held one). A put that replaced an object maps
    /// the old one, then the new one, and enqueues both results, once each
    /// (controller-runtime's mapped handlers: a child that changed owners
    /// reaches its old owner and its new one). Called on the cache's
    /// thread (keep it quick), or for the keys a synced cache held when the
    /// watch began, on its catch-up thread. A panic is logged as an ERROR, counted in
    /// [`Stats::handler_errors`](crate::Stats::handler_errors), and the
    /// change enqueues its own key (`key.into()`): missing a change is
    /// worse than one reconcile too many, which is why `S::Key: Into<K>`.
    pub fn with_map<I>(map: impl Fn(&S::Key, Option<&S::Object>) -> I + Send + Sync + 'static) -> Self
    where
        I: IntoIterator<Item = K>,
    {
        Self::with_fallible_map(move |key: &S::Key, obj: Option<&S::Object>| {
            catch_unwind(AssertUnwindSafe(|| map(key, obj).into_iter().collect()))
                .map_err(|panic| panics::message(&*panic))
        })
    }

    /// [`with_map`](Self::with_map) with a map that reports its failures
    /// (the Python bindings' `map=`).
    pub(crate) fn with_fallible_map(
        map: impl Fn(&S::Key, Option<&S::Object>) -> Result<Vec<K>, String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            map: Arc::new(map),
            fallback: Arc::new(|key: &S::Key| key.clone().into()),
            predicate: None,
            resync: None,
            priority: 0,
            list_priority: DEFAULT_LIST_PRIORITY,
            scope: None,
        }
    }
}

impl<S: Source, K> Watch<S, K> {
    /// Whether a change enqueues at all: `predicate(old, new)`, `old` `None`
    /// for a new key, `new` `None` for a delete. The default enqueues every
    /// delete (also of a key the cache never held: `old` and `new` `None`)
    /// and every put whose object differs from the one held before
    /// (`S::Object: PartialEq`), so a relist or a poll that finds a key
    /// unchanged enqueues nothing. Called where `map` is. A panic
    /// counts as `true` and is logged and counted as `map`'s.
    pub fn predicate(
        self,
        predicate: impl Fn(Option<&S::Object>, Option<&S::Object>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.fallible_predicate(move |old: Option<&S::Object>, new: Option<&S::Object>| {
            catch_unwind(AssertUnwindSafe(|| predicate(old, new))).map_err(|panic| panics::message(&*panic))
        })
    }

    /// [`predicate`](Self::predicate) reporting its failures (the Python
    /// bindings' `predicate=`).
    pub(crate) fn fallible_predicate(
        mut self,
        predicate: impl Fn(Option<&S::Object>, Option<&S::Object>) -> Result<bool, String> + Send + Sync + 'static,
    ) -> Self {
        self.predicate = Some(Arc::new(predicate));
        self
    }

    /// `map` and `predicate` called for a run of changes inside `scope`
    /// (the Python binding: one hold of the GIL for the run).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn handlers_in(mut self, scope: BatchScope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Enqueues every cached key (through `map`) every `every`, from the
    /// cache's first sync on, each period jittered by ±10% (so controllers
    /// started together do not resync together), at the list priority,
    /// measured on the controller's clock (a [`FakeClock`](crate::FakeClock)
    /// moves it). Off by default. A zero period is refused (nothing changed).
    pub fn resync(mut self, every: Duration) -> Result<Self, InvalidArgument> {
        if every.is_zero() {
            return Err(InvalidArgument::new("watch_cache: resync must be positive, got 0 s"));
        }
        self.resync = Some(every);
        Ok(self)
    }

    /// The priority of keys enqueued by live changes (stream events, a
    /// `PollingSource`'s later polls); default 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The priority of keys enqueued by the cache's list and relists (and a
    /// `PollingSource`'s first poll) and by resyncs; default
    /// [`DEFAULT_LIST_PRIORITY`].
    pub fn list_priority(mut self, priority: i32) -> Self {
        self.list_priority = priority;
        self
    }
}

impl<S: Source, K> Clone for Watch<S, K> {
    fn clone(&self) -> Self {
        Self {
            map: Arc::clone(&self.map),
            fallback: Arc::clone(&self.fallback),
            predicate: self.predicate.clone(),
            resync: self.resync,
            priority: self.priority,
            list_priority: self.list_priority,
            scope: self.scope.clone(),
        }
    }
}

impl<S: Source, K> fmt::Debug for Watch<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("predicate", &self.predicate.as_ref().map_or("default", |_| "custom"))
            .field("resync", &self.resync)
            .field("priority", &self.priority)
            .field("list_priority", &self.list_priority)
            .finish_non_exhaustive()
    }
}
