//! Durable state on embedded SQLite (guarantees §9): a controller's
//! pending, delayed and parked keys, failure counts and priorities survive
//! a stop, a restart and a crash.
//!
//! * `link` is the seam to the controller (always compiled): marks, views,
//!   restore, flusher, status.
//! * `cache_snapshot` (always compiled) is what a cache keeps of its own
//!   contents to resume after a restart (E9): marked by the cache, written
//!   by its controllers' flushers.
//! * `key_rows` (always compiled) holds the encoded keys and versions a
//!   restart reads back, a million in one buffer.
//!
//! With the `store` feature (on by default), the SQLite implementation:
//! * `lock` is the claim a live controller holds on its name (S3).
//! * `db` is the SQLite file: schema version, validation, batched writes.
//! * `dirty` is the set of keys changed since the last flush.
//! * `cache_rows` is what a controller keeps of the caches it watches
//!   (E9), written with its keys.
//! * `cache_names` keeps cache names unique among a file's caches.
//! * `flush_requests` answers `flush()` callers once a write covers them.
//! * `persist` is its side of the seam: restore, flusher, status.
//! * `open_files` lists the store files this process has open, so a second
//!   SQLite library in the process (Python's `sqlite3`) can be refused.

mod cache_names;
#[cfg(feature = "store")]
mod cache_rows;
// Marked by the cache side (always compiled); taken and written only by
// the store's flushers.
#[cfg_attr(not(feature = "store"), allow(dead_code))]
mod cache_snapshot;
#[cfg(feature = "store")]
mod db;
#[cfg(feature = "store")]
mod dirty;
#[cfg(feature = "store")]
mod flush_requests;
mod key_rows;
mod link;
#[cfg(feature = "store")]
mod lock;
#[cfg(feature = "store")]
mod open_files;
#[cfg(feature = "store")]
mod persist;

pub use crate::observe::reports::StoreStats;
pub(crate) use cache_names::CacheName;
pub(crate) use cache_snapshot::{CacheSnapshot, KeptAt, SnapshotFile, SnapshotRow};
#[cfg(feature = "store")]
pub use db::{SCHEMA_VERSION, SqliteStore, StoredKey, StoredState};
pub(crate) use key_rows::KeyRows;
pub(crate) use link::{AfterWrite, Flush, KeptChange, KeySource, KeyView, PendingFlush, StoreLink};
#[cfg(feature = "store")]
pub use lock::StoreClaim;
#[cfg(feature = "python")]
pub(crate) use open_files::is_open_in_this_process;
#[cfg(feature = "store")]
pub(crate) use persist::Persister;

use std::fmt;
use std::io;

/// Why a store could not be opened, claimed or written.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// Another live controller holds this name in this file (S3).
    Locked(String),
    /// Not a SQLite database, a newer schema, or a bad argument; nothing
    /// was changed.
    Invalid(String),
    /// The file system refused (unwritable location, disk full, ...).
    Io(io::Error),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Locked(name) => write!(f, "store name {name:?} is held by another live controller"),
            StoreError::Invalid(message) => f.write_str(message),
            StoreError::Io(err) => write!(f, "store I/O error: {err}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io(e) => Some(e),
            StoreError::Locked(_) | StoreError::Invalid(_) => None,
        }
    }
}

impl StoreError {
    /// The `io::ErrorKind` it has inside an `io::Error`.
    pub(crate) fn kind(&self) -> io::ErrorKind {
        match self {
            StoreError::Locked(_) => io::ErrorKind::WouldBlock,
            StoreError::Invalid(_) => io::ErrorKind::InvalidData,
            StoreError::Io(e) => e.kind(),
        }
    }

    /// A copy for each caller one failed write answers (`io::Error` is not
    /// `Clone`: the copy keeps its kind and its message).
    #[cfg(feature = "store")]
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            StoreError::Locked(name) => StoreError::Locked(name.clone()),
            StoreError::Invalid(message) => StoreError::Invalid(message.clone()),
            StoreError::Io(err) => StoreError::Io(io::Error::new(err.kind(), err.to_string())),
        }
    }
}

/// For [`StartError`](crate::StartError)'s conversion and `flush()`: the
/// `StoreError` stays inside (`get_ref()` + `downcast_ref`).
impl From<StoreError> for io::Error {
    fn from(err: StoreError) -> Self {
        io::Error::new(err.kind(), err)
    }
}

impl From<io::Error> for StoreError {
    fn from(err: io::Error) -> Self {
        StoreError::Io(err)
    }
}
