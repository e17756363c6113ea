//! A cache with a store (guarantees E9, docs/store.md): what it needs to
//! have its key set kept by the controllers it feeds. The rows themselves
//! are each watching controller's (`store::cache_rows`), written by that
//! controller's flusher with its pending keys; the cache brings the
//! encodings of its keys, versions and positions, the file its controllers
//! must use, its name held unique in that file, and `flush()` over their
//! flushers.

use std::path::{Path, PathBuf};
use std::sync::Weak;

use crate::source::Source;
use crate::store::{CacheName, Flush};
use crate::sync::Mutex;

/// How a stored cache's keys, versions and positions are kept (the key
/// encoding; a version or position that cannot be kept is `None`).
pub(crate) struct Codec<S: Source> {
    pub(crate) key: fn(&S::Key) -> Vec<u8>,
    pub(crate) decode: fn(&[u8]) -> Option<S::Key>,
    pub(crate) version: fn(&S::Version) -> Option<Vec<u8>>,
    pub(crate) position: fn(&S::Position) -> Option<Vec<u8>>,
}

impl<S: Source> Clone for Codec<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: Source> Copy for Codec<S> {}

pub(crate) struct Stored<S: Source> {
    /// The store file (canonical): a watching controller's must be it.
    file: PathBuf,
    /// Holds the cache's name in that file until it stops (a stopped
    /// cache never runs again).
    name: Mutex<Option<CacheName>>,
    pub(crate) codec: Codec<S>,
    /// The flushers of the controllers it feeds: its `flush()` is theirs.
    flushers: Mutex<Vec<Weak<dyn Flush>>>,
}

impl<S: Source> Stored<S> {
    /// Reserves `name` in `file` (canonical); an error if a live cache of
    /// this process has it.
    pub(crate) fn new(file: PathBuf, name: &str, codec: Codec<S>) -> Result<Self, String> {
        let held = CacheName::reserve(&file, name).map_err(|e| e.to_string())?;
        Ok(Self { file, name: Mutex::new(Some(held)), codec, flushers: Mutex::new(Vec::new()) })
    }

    pub(crate) fn file(&self) -> &Path {
        &self.file
    }

    /// The cache stopped: another cache may take its name.
    pub(crate) fn release_name(&self) {
        self.name.lock().take();
    }

    /// A watching controller's flusher, from now on part of `flush()`.
    pub(crate) fn add_flusher(&self, flusher: Weak<dyn Flush>) {
        let mut flushers = self.flushers.lock();
        flushers.retain(|f| f.strong_count() > 0);
        flushers.push(flusher);
    }

    /// The flushers of the controllers it feeds, alive.
    pub(crate) fn flushers(&self) -> Vec<std::sync::Arc<dyn Flush>> {
        self.flushers.lock().iter().filter_map(Weak::upgrade).collect()
    }
}
