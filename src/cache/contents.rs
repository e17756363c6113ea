//! What a cache holds: the objects by key and the secondary indexes,
//! changed together (the caller holds one lock over both, so a reader
//! never sees them disagree, guarantees E8). Every change returns what it
//! changed, for the subscribers; nothing here logs or calls a subscriber.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::Applied;
use crate::panics;
use crate::source::Item;

/// An index function: the values a key is found under.
pub(super) type IndexFn<K, O> = Arc<dyn Fn(&K, &O) -> Vec<String> + Send + Sync>;

/// An index function that panicked for a key: the key is left out of
/// that index (logged by the caller, after the lock).
#[derive(Debug)]
pub(super) struct IndexFailure<K> {
    pub(super) index: String,
    pub(super) key: K,
    pub(super) error: String,
}

struct Entry<O, V> {
    obj: Arc<O>,
    version: Option<V>,
    /// Per index (in the cache's order), the values the key is under.
    indexed: Vec<Vec<String>>,
}

pub(super) struct Contents<K, O, V> {
    entries: HashMap<K, Entry<O, V>>,
    index_fns: super::Indexes<K, O>,
    /// Per index: value → keys.
    indexes: Vec<HashMap<String, HashSet<K>>>,
}

impl<K: Clone + Eq + Hash, O: PartialEq, V: PartialEq> Contents<K, O, V> {
    pub(super) fn new(index_fns: super::Indexes<K, O>) -> Self {
        let indexes = index_fns.iter().map(|_| HashMap::new()).collect();
        Self { entries: HashMap::new(), index_fns, indexes }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get(&self, key: &K) -> Option<&Arc<O>> {
        self.entries.get(key).map(|e| &e.obj)
    }

    pub(super) fn version(&self, key: &K) -> Option<&V> {
        self.entries.get(key)?.version.as_ref()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    pub(super) fn objects(&self) -> impl Iterator<Item = (&K, &Arc<O>)> {
        self.entries.iter().map(|(k, e)| (k, &e.obj))
    }

    /// The keys under `value` in index `name`; `None` for an unknown index.
    pub(super) fn by_index(&self, name: &str, value: &str) -> Option<Vec<K>> {
        let i = self.index_fns.iter().position(|(n, _)| n == name)?;
        Some(self.indexes[i].get(value).map(|keys| keys.iter().cloned().collect()).unwrap_or_default())
    }

    /// `key` now holds `obj`: always a change (a live put is applied as
    /// sent; the controller's predicate decides whether it matters).
    pub(super) fn put(
        &mut self,
        key: K,
        obj: O,
        version: Option<V>,
        failures: &mut Vec<IndexFailure<K>>,
    ) -> Applied<K, O> {
        let obj = Arc::new(obj);
        let old = self.remove(&key);
        let indexed = self.index(&key, &obj, failures);
        self.entries.insert(key.clone(), Entry { obj: Arc::clone(&obj), version, indexed });
        Applied { key, old, new: Some(obj), listed: false }
    }

    /// `key` is gone: a change if it was there.
    pub(super) fn delete(&mut self, key: K) -> Option<Applied<K, O>> {
        let old = self.remove(&key)?;
        Some(Applied { key, old: Some(old), new: None, listed: false })
    }

    /// The contents become `items` (a list): keys missing from it are
    /// deleted, keys listed with an equal object and version are no
    /// change.
    pub(super) fn replace(
        &mut self,
        items: Vec<Item<K, O, V>>,
        failures: &mut Vec<IndexFailure<K>>,
    ) -> Vec<Applied<K, O>> {
        let mut listed: HashMap<K, (O, Option<V>)> = HashMap::with_capacity(items.len());
        for item in items {
            listed.insert(item.key, (item.obj, item.version));
        }
        let gone: Vec<K> = self.entries.keys().filter(|k| !listed.contains_key(k)).cloned().collect();
        let mut changes: Vec<Applied<K, O>> = gone.into_iter().filter_map(|key| self.delete(key)).collect();
        for (key, (obj, version)) in listed {
            let unchanged = self.entries.get(&key).is_some_and(|e| *e.obj == obj && e.version == version);
            if !unchanged {
                changes.push(self.put(key, obj, version, failures));
            }
        }
        for change in &mut changes {
            change.listed = true;
        }
        changes
    }

    /// Takes `key` out of the map and every index; its object if it was in.
    fn remove(&mut self, key: &K) -> Option<Arc<O>> {
        let entry = self.entries.remove(key)?;
        for (index, values) in self.indexes.iter_mut().zip(&entry.indexed) {
            for value in values {
                if let Some(keys) = index.get_mut(value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        index.remove(value);
                    }
                }
            }
        }
        Some(entry.obj)
    }

    /// Puts `key` in every index under the values its functions give.
    fn index(&mut self, key: &K, obj: &O, failures: &mut Vec<IndexFailure<K>>) -> Vec<Vec<String>> {
        let mut indexed = Vec::with_capacity(self.index_fns.len());
        for ((name, index_fn), index) in self.index_fns.iter().zip(&mut self.indexes) {
            let mut values = match catch_unwind(AssertUnwindSafe(|| index_fn(key, obj))) {
                Ok(values) => values,
                Err(panic) => {
                    let error = panics::message(&*panic);
                    failures.push(IndexFailure { index: name.clone(), key: key.clone(), error });
                    Vec::new()
                }
            };
            values.sort_unstable();
            values.dedup();
            for value in &values {
                index.entry(value.clone()).or_default().insert(key.clone());
            }
            indexed.push(values);
        }
        indexed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents() -> Contents<u32, String, u64> {
        let by_first: IndexFn<u32, String> =
            Arc::new(|_, obj: &String| obj.chars().take(1).map(String::from).collect());
        let panicky: IndexFn<u32, String> = Arc::new(|key, _| {
            assert!(*key != 13, "unlucky");
            vec!["all".into()]
        });
        Contents::new(vec![("first".into(), by_first), ("all".into(), panicky)])
    }

    #[test]
    fn indexes_follow_puts_deletes_and_relists() {
        let mut c = contents();
        let mut failures = Vec::new();
        c.put(1, "apple".into(), Some(1), &mut failures);
        c.put(2, "avocado".into(), Some(1), &mut failures);
        c.put(13, "banana".into(), None, &mut failures);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!((failures[0].index.as_str(), failures[0].key), ("all", 13));
        let sorted = |mut v: Vec<u32>| {
            v.sort();
            v
        };
        assert_eq!(sorted(c.by_index("first", "a").unwrap()), [1, 2]);
        assert_eq!(sorted(c.by_index("all", "all").unwrap()), [1, 2], "13 left out of the index that failed");
        assert_eq!(c.by_index("nope", "a"), None);
        c.put(2, "cherry".into(), Some(2), &mut failures);
        assert_eq!(c.by_index("first", "a").unwrap(), [1]);

        let listed = vec![
            Item { key: 1, obj: "apple".to_owned(), version: Some(1) },
            Item { key: 13, obj: "blueberry".to_owned(), version: None },
        ];
        let changes = c.replace(listed, &mut failures);
        let mut changed: Vec<(u32, bool)> = changes.iter().map(|a| (a.key, a.new.is_some())).collect();
        changed.sort();
        assert_eq!(changed, [(2, false), (13, true)], "1 is unchanged, 2 is gone");
        assert!(changes.iter().all(|a| a.listed));
        assert_eq!(c.by_index("first", "c").unwrap(), Vec::<u32>::new());
        assert_eq!(c.by_index("first", "b").unwrap(), [13]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.delete(7).map(|a| a.key), None, "deleting an absent key is no change");
    }
}
