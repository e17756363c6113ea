//! Cache names are unique among the caches of a store file (E9): the rows
//! a controller keeps of the caches it watches are named by the cache, so
//! two live caches of one name in one file would share them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::StoreError;

/// Each live cache's file (canonical) and name.
static NAMES: Mutex<Vec<(PathBuf, String, Weak<()>)>> = Mutex::new(Vec::new());

/// Holds a cache's name in its file until dropped.
pub(crate) struct CacheName {
    _alive: Arc<()>,
}

impl CacheName {
    /// Reserves `name` in the file at `canonical`; an error naming both if
    /// a live cache of this process has it.
    pub(crate) fn reserve(canonical: &Path, name: &str) -> Result<Self, StoreError> {
        let mut names = NAMES.lock();
        names.retain(|(_, _, alive)| alive.strong_count() > 0);
        if names.iter().any(|(file, held, _)| file == canonical && held == name) {
            return Err(StoreError::Invalid(format!(
                "Cache: name {name:?} is already used by another cache of store {}: cache names are unique \
                 among a file's caches",
                canonical.display()
            )));
        }
        let alive = Arc::new(());
        names.push((canonical.to_path_buf(), name.to_owned(), Arc::downgrade(&alive)));
        Ok(Self { _alive: alive })
    }
}
