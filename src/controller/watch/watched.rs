//! A cache and a watch as the rest of `controller/watch/` sees them: the
//! vocabulary its files share, kept below all of them so that none imports
//! the folder's `mod.rs`.

use std::fmt;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cache::{Cache, CacheError, CacheUse, Subscription};
use crate::source::{Source, Stop};

/// Why a controller cannot watch a cache.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchError {
    /// The cache was stopped: a stopped cache never runs again.
    CacheStopped {
        /// The cache's name.
        cache: String,
    },
    /// The controller was stopped.
    ControllerStopped {
        /// The controller's name.
        controller: String,
    },
    /// The OS refused a thread (the cache's, or its resync's).
    Thread(io::Error),
    /// The cache has a store and the controller has none, or another
    /// file (E9): the cache's rows are written with the controller's keys.
    StoreMismatch(String),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::CacheStopped { cache } => write!(f, "cache {cache:?} is stopped and cannot start again"),
            WatchError::ControllerStopped { controller } => {
                write!(f, "controller {controller:?} is stopped: it watches no cache any more")
            }
            WatchError::Thread(e) => write!(f, "cannot spawn a thread for a watched cache: {e}"),
            WatchError::StoreMismatch(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for WatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WatchError::Thread(e) => Some(e),
            WatchError::CacheStopped { .. } | WatchError::ControllerStopped { .. } | WatchError::StoreMismatch(_) => {
                None
            }
        }
    }
}

impl From<CacheError> for WatchError {
    fn from(e: CacheError) -> Self {
        match e {
            CacheError::Stopped { cache } => WatchError::CacheStopped { cache },
            CacheError::Thread(e) => WatchError::Thread(e),
        }
    }
}

/// A cache as the controller side sees it, whatever its source.
pub(crate) trait Watched: Send + Sync {
    fn name(&self) -> &str;
    /// The store file (canonical) of a cache with a store.
    fn stored_file(&self) -> Option<&Path>;
    fn is_stopped(&self) -> bool;
    fn synced(&self) -> bool;
    fn wait_synced(&self, timeout: Option<Duration>) -> bool;
    fn last_error(&self) -> Option<String>;
    /// See [`Cache::wait_exited`].
    fn wait_exited(&self, deadline: Instant) -> bool;
}

impl<S: Source> Watched for Cache<S> {
    fn name(&self) -> &str {
        Cache::name(self)
    }
    fn stored_file(&self) -> Option<&Path> {
        Cache::stored_file(self)
    }
    fn is_stopped(&self) -> bool {
        Cache::is_stopped(self)
    }
    fn synced(&self) -> bool {
        Cache::synced(self)
    }
    fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        Cache::wait_synced(self, timeout)
    }
    fn last_error(&self) -> Option<String> {
        self.stats().last_error
    }
    fn wait_exited(&self, deadline: Instant) -> bool {
        Cache::wait_exited(self, Some(deadline))
    }
}

/// A watch in force: dropping it unsubscribes, stops its resync and lets
/// the cache go (it stops if no one else uses it and it was not started
/// explicitly). Fields drop in order: no change is delivered to the
/// controller once the cache may stop.
pub(crate) struct Attached {
    pub(super) _subscription: Subscription,
    pub(super) _use: CacheUse,
    /// Set on drop: ends the resync thread.
    pub(super) resync_stop: Stop,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.resync_stop.set();
    }
}
