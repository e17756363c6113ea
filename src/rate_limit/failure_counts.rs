//! Per-key failure counters shared by the per-key limiters.

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;

use crate::shrink::is_sparse;

/// Maps each key to the number of `when` calls since it was last forgotten.
/// Forgotten keys are removed, and the map is shrunk when it empties out, so
/// its size follows the keys currently failing.
pub(crate) struct FailureCounts<K> {
    counts: Mutex<HashMap<K, u32, foldhash::fast::RandomState>>,
}

impl<K: Eq + Hash + Clone> FailureCounts<K> {
    pub(crate) fn new() -> Self {
        Self { counts: Mutex::new(HashMap::default()) }
    }

    /// Counts one more failure of `key` and returns how many it had before.
    pub(crate) fn record(&self, key: &K) -> u32 {
        let mut counts = self.counts.lock();
        if let Some(count) = counts.get_mut(key) {
            let before = *count;
            *count = count.saturating_add(1);
            before
        } else {
            counts.insert(key.clone(), 1);
            0
        }
    }

    pub(crate) fn forget(&self, key: &K) {
        let mut counts = self.counts.lock();
        if counts.remove(key).is_some() && is_sparse(counts.len(), counts.capacity()) {
            let len = counts.len();
            counts.shrink_to(len * 2);
        }
    }

    pub(crate) fn get(&self, key: &K) -> u32 {
        self.counts.lock().get(key).copied().unwrap_or(0)
    }
}
