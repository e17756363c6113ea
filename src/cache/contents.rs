//! What a cache holds: the objects by key and the secondary indexes,
//! changed together (the caller holds one lock over both, so a reader
//! never sees them disagree, guarantees E8). Every change returns what it
//! changed, for the subscribers; nothing here logs or calls a subscriber.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// Keys come from the source, not from whoever sends requests: a fast
/// hash (the queue's) rather than SipHash.
pub(super) type Hasher = foldhash::fast::RandomState;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::Applied;
use super::dense_map::DenseMap;
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

/// What the cache holds for one key: nothing but the object and its
/// version, since a cache holds millions (docs/sources.md, "What a key
/// costs"); a key's index values live in `Contents::indexed`, only in a
/// cache that has indexes.
struct Entry<O, V> {
    obj: Arc<O>,
    version: Option<V>,
}

pub(super) struct Contents<K, O, V> {
    /// Packed, not a `HashMap`: the map is most of what a key costs.
    entries: DenseMap<K, Entry<O, V>>,
    index_fns: super::Indexes<K, O>,
    /// Per index: value → keys.
    indexes: Vec<HashMap<String, HashSet<K, Hasher>, Hasher>>,
    /// Per key held, per index (in the cache's order), the values it is
    /// under. Invariant: with indexes, exactly the keys of `entries`;
    /// without, empty.
    indexed: HashMap<K, Box<[Vec<String>]>, Hasher>,
}

impl<K: Clone + Eq + Hash, O: PartialEq, V: PartialEq> Contents<K, O, V> {
    pub(super) fn new(index_fns: super::Indexes<K, O>) -> Self {
        let indexes = index_fns.iter().map(|_| HashMap::default()).collect();
        Self { entries: DenseMap::default(), index_fns, indexes, indexed: HashMap::default() }
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
        self.insert(key, obj, version, None, failures)
    }

    /// `key` is gone: always a change, `old` `None` if it was not held (a
    /// delete of a key the cache never held still reaches the watchers,
    /// as client-go's `OnDelete`: guarantees E6).
    pub(super) fn delete(&mut self, key: K) -> Applied<K, O> {
        let old = self.remove(&key);
        Applied { key, old, new: None, listed: false }
    }

    /// The contents become `items` (a list): keys missing from it are
    /// deleted, keys listed with an equal object and version are no
    /// change (their entries are kept as they are), and of a key listed
    /// twice the last one counts. The deletes come first, then the puts
    /// in the order listed.
    ///
    /// One pass, three hash lookups per item: the entries held before
    /// are moved out, each item takes its key's old entry (kept if
    /// unchanged), and what is left of them is gone. The items are read
    /// from the last, so a key already in the new entries was listed
    /// again later.
    pub(super) fn replace(
        &mut self,
        items: Vec<Item<K, O, V>>,
        failures: &mut Vec<IndexFailure<K>>,
    ) -> Vec<Applied<K, O>> {
        let fresh = DenseMap::with_capacity(items.len());
        let mut before = std::mem::replace(&mut self.entries, fresh);
        let mut puts = Vec::new();
        for Item { key, obj, version } in items.into_iter().rev() {
            if self.entries.contains_key(&key) {
                continue;
            }
            match before.remove(&key) {
                Some(entry) if *entry.obj == obj && entry.version == version => {
                    self.entries.insert(key, entry);
                }
                previous => {
                    let old = previous.map(|entry| self.unindex(&key, entry.obj));
                    puts.push(self.insert(key, obj, version, old, failures));
                }
            }
        }
        let gone = before.into_iter().map(|(key, entry)| {
            let old = self.unindex(&key, entry.obj);
            Applied { key, old: Some(old), new: None, listed: false }
        });
        let mut changes: Vec<Applied<K, O>> = gone.collect();
        changes.extend(puts.into_iter().rev());
        for change in &mut changes {
            change.listed = true;
        }
        changes
    }

    /// Holds `items` in a cache that holds nothing yet (a restart's load),
    /// and returns the puts (`listed`) of those `wanted` says someone must
    /// hear of, each with its place in `items`: the rest cost no key clone
    /// and no change. Of a key given twice the last one counts.
    pub(super) fn load(
        &mut self,
        items: Vec<Item<K, O, V>>,
        failures: &mut Vec<IndexFailure<K>>,
        wanted: impl Fn(usize) -> bool,
    ) -> Vec<super::LoadedChange<K, O>> {
        debug_assert!(self.entries.is_empty(), "a load replaces nothing");
        self.entries.reserve(items.len());
        let mut puts = Vec::new();
        for (place, Item { key, obj, version }) in items.into_iter().enumerate() {
            let listed = wanted(place).then(|| key.clone());
            let (obj, old) = self.hold(key, obj, version, failures);
            if let Some(key) = listed {
                puts.push((place, Applied { key, old, new: Some(obj), listed: true }));
            }
        }
        puts
    }

    /// Holds `obj` under `key` and indexes it: the put, whose old object
    /// is the one it replaced, or else `old` (held before, out of the map:
    /// a list's previous entries).
    fn insert(
        &mut self,
        key: K,
        obj: O,
        version: Option<V>,
        old: Option<Arc<O>>,
        failures: &mut Vec<IndexFailure<K>>,
    ) -> Applied<K, O> {
        let (obj, replaced) = self.hold(key.clone(), obj, version, failures);
        Applied { key, old: replaced.or(old), new: Some(obj), listed: false }
    }

    /// Holds `obj` under `key` and indexes it: the object as held, and the
    /// one it replaced (out of every index). Without indexes that is one
    /// probe of the map, which is most of what a million-key load costs.
    fn hold(
        &mut self,
        key: K,
        obj: O,
        version: Option<V>,
        failures: &mut Vec<IndexFailure<K>>,
    ) -> (Arc<O>, Option<Arc<O>>) {
        let obj = Arc::new(obj);
        if self.index_fns.is_empty() {
            let replaced = self.entries.insert(key, Entry { obj: Arc::clone(&obj), version });
            return (obj, replaced.map(|entry| entry.obj));
        }
        // The old values out of the indexes before the new ones go in.
        let old = self.remove(&key);
        let indexed = self.index(&key, &obj, failures);
        self.indexed.insert(key.clone(), indexed);
        self.entries.insert(key, Entry { obj: Arc::clone(&obj), version });
        (obj, old)
    }

    /// Takes `key` out of the map and every index; its object if it was in.
    fn remove(&mut self, key: &K) -> Option<Arc<O>> {
        let entry = self.entries.remove(key)?;
        Some(self.unindex(key, entry.obj))
    }

    /// Takes `key` (whose object was `obj`, no longer in the map) out of
    /// every index; `obj`.
    fn unindex(&mut self, key: &K, obj: Arc<O>) -> Arc<O> {
        if self.index_fns.is_empty() {
            return obj; // no index: not even a lookup in the empty side map
        }
        let Some(indexed) = self.indexed.remove(key) else { return obj };
        for (index, values) in self.indexes.iter_mut().zip(&indexed) {
            for value in values {
                if let Some(keys) = index.get_mut(value) {
                    keys.remove(key);
                    if keys.is_empty() {
                        index.remove(value);
                    }
                }
            }
        }
        obj
    }

    /// Puts `key` in every index under the values its functions give.
    fn index(&mut self, key: &K, obj: &O, failures: &mut Vec<IndexFailure<K>>) -> Box<[Vec<String>]> {
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
        indexed.into_boxed_slice()
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
        let absent = c.delete(7);
        assert_eq!((absent.key, absent.old, absent.new), (7, None, None), "deleting an absent key: old None");
        assert_eq!(c.len(), 2);
    }

    /// A relist reads its items from the last: a key listed twice must
    /// still count as its last listing, compared with what was held.
    #[test]
    fn of_a_key_listed_twice_the_last_counts() {
        let item = |key, obj: &str, version| Item { key, obj: obj.to_owned(), version: Some(version) };
        let (mut c, mut failures) = (contents(), Vec::new());
        assert_eq!(c.replace(vec![item(1, "apple", 1), item(2, "avocado", 1)], &mut failures).len(), 2);
        let listed = vec![item(1, "banana", 2), item(2, "cherry", 2), item(1, "apple", 1), item(2, "date", 3)];
        let changes = c.replace(listed, &mut failures);
        let changed: Vec<(u32, Option<&str>, Option<&str>)> = changes
            .iter()
            .map(|a| (a.key, a.old.as_deref().map(String::as_str), a.new.as_deref().map(String::as_str)))
            .collect();
        assert_eq!(changed, [(2, Some("avocado"), Some("date"))], "1 is listed last as it was held");
        assert_eq!(c.get(&1).map(|o| o.as_str()), Some("apple"));
        assert_eq!(c.version(&2), Some(&3));
        assert_eq!(c.by_index("first", "a").unwrap(), [1]);
        assert_eq!(c.by_index("first", "d").unwrap(), [2]);
        assert_eq!(c.len(), 2);
    }
}
