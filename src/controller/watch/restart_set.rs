//! A stored controller's restart difference for one cache (E9): the rows it
//! kept of the cache at its last run, each taken out as the cache's
//! contents reach the controller; the keys still in when the cache has
//! delivered all it holds were deleted while the controller was down.
//!
//! A restart that loads the cache from its store compares first the
//! loaded rows with the kept ones, both in key order (their tables' primary
//! keys), in one merge: a million unchanged keys cost a comparison of
//! bytes each, with no hash table and no allocation. The keys a list or the
//! stream delivers after that are looked up by key, in a table built at
//! the first such lookup from the rows still in (few after a resume: the
//! keys changed or deleted while down; all of them after a relist).

use std::collections::HashMap;

use crate::store::KeyRows;

/// Kept keys (encoded) and their versions (encoded; `None`: none kept, so
/// the key counts as changed). The keys come from the program's own file:
/// a fast hash rather than SipHash.
type ByKey = HashMap<Vec<u8>, Option<Vec<u8>>, foldhash::fast::RandomState>;

pub(super) struct RestartSet {
    /// The kept rows, in key order; dropped once `by_key` holds the rest.
    rows: KeyRows,
    /// Per row of `rows`: out of the difference (told of at load).
    out: Vec<bool>,
    /// The rows still in, by key, from the first lookup by key on: from
    /// then on the only record.
    by_key: Option<ByKey>,
}

impl RestartSet {
    /// `rows`: what the store kept, in key order.
    pub(super) fn new(rows: KeyRows) -> Self {
        let out = vec![false; rows.len()];
        Self { rows, out, by_key: None }
    }

    /// Of the rows a restart `loaded` (in key order), which are kept here
    /// at exactly the same version: those are unchanged since the last
    /// run, and out of the difference. A row without a version on either
    /// side counts as changed.
    pub(super) fn told_of(&mut self, loaded: &KeyRows) -> Vec<bool> {
        let in_order = |rows: &KeyRows| rows.iter().is_sorted_by(|a, b| a.0 < b.0);
        if self.by_key.is_some() || !in_order(loaded) || !in_order(&self.rows) {
            // Not the load's two files read in order: answered by key, as
            // correct and slower.
            return loaded.iter().map(|(key, version)| version.is_some() && self.take_if_at(key, version)).collect();
        }
        let (out, mut kept) = (&mut self.out, self.rows.iter().enumerate().peekable());
        loaded
            .iter()
            .map(|(key, version)| {
                while kept.next_if(|(_, (kept_key, _))| *kept_key < key).is_some() {}
                let Some(&(place, (kept_key, kept_version))) = kept.peek() else { return false };
                let told = kept_key == key && version.is_some() && kept_version == version && !out[place];
                out[place] |= told;
                told
            })
            .collect()
    }

    /// Takes `key` out if it is kept at `version`.
    fn take_if_at(&mut self, key: &[u8], version: Option<&[u8]>) -> bool {
        let by_key = self.by_key();
        let told = by_key.get(key).is_some_and(|kept| kept.as_deref() == version);
        if told {
            by_key.remove(key);
        }
        told
    }

    /// Takes `key` out: its kept version (inner `None`: none kept), or
    /// `None` if it is not in.
    pub(super) fn remove(&mut self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.by_key().remove(key)
    }

    /// The keys still in: deleted while the controller was down.
    pub(super) fn into_keys(self) -> Vec<Vec<u8>> {
        match self.by_key {
            Some(by_key) => by_key.into_keys().collect(),
            None => {
                self.rows.iter().zip(&self.out).filter(|(_, out)| !**out).map(|((key, _), _)| key.to_vec()).collect()
            }
        }
    }

    fn by_key(&mut self) -> &mut ByKey {
        let (rows, out) = (&mut self.rows, &self.out);
        self.by_key.get_or_insert_with(|| {
            let left = out.iter().filter(|out| !**out).count();
            let mut by_key = ByKey::with_capacity_and_hasher(left, Default::default());
            let rows = std::mem::take(rows);
            let rows_in = rows.iter().zip(out).filter(|(_, out)| !**out).map(|(row, _)| row);
            by_key.extend(rows_in.map(|(key, version)| (key.to_vec(), version.map(<[u8]>::to_vec))));
            by_key
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rows: &[(&str, Option<&str>)]) -> KeyRows {
        let mut kept = KeyRows::default();
        for (key, version) in rows {
            kept.push(key.as_bytes(), version.map(str::as_bytes));
        }
        kept
    }

    fn sorted(keys: Vec<Vec<u8>>) -> Vec<String> {
        let mut keys: Vec<String> = keys.into_iter().map(|k| String::from_utf8(k).unwrap()).collect();
        keys.sort();
        keys
    }

    const KEPT: [(&str, Option<&str>); 5] =
        [("a", Some("1")), ("b", Some("1")), ("c", None), ("d", Some("1")), ("f", Some("2"))];

    #[test]
    fn a_merge_tells_exactly_the_rows_kept_at_the_same_version() {
        let mut set = RestartSet::new(rows(&KEPT));
        let loaded = rows(&[
            ("a", Some("1")),  // unchanged
            ("b", Some("2")),  // changed
            ("c", Some("1")),  // kept without a version: changed
            ("cc", Some("1")), // new
            ("d", None),       // loaded without a version: changed
            ("f", Some("2")),  // unchanged; "e"-less gap before it
        ]);
        assert_eq!(set.told_of(&loaded), [true, false, false, false, false, true]);
        assert_eq!(set.remove(b"b"), Some(Some(b"1".to_vec())), "a changed row stays in, for its delivery");
        assert_eq!(set.remove(b"a"), None, "a told row is out");
        assert_eq!(sorted(set.into_keys()), ["c", "d"]);
    }

    #[test]
    fn loaded_rows_out_of_order_are_told_by_key_with_the_same_answers() {
        let mut set = RestartSet::new(rows(&KEPT));
        let loaded = rows(&[("f", Some("2")), ("a", Some("1")), ("b", Some("2")), ("zz", Some("1"))]);
        assert_eq!(set.told_of(&loaded), [true, true, false, false]);
        assert_eq!(sorted(set.into_keys()), ["b", "c", "d"]);
    }

    #[test]
    fn without_a_load_every_kept_key_is_in_until_removed() {
        let mut set = RestartSet::new(rows(&KEPT));
        assert_eq!(set.remove(b"c"), Some(None));
        assert_eq!(set.remove(b"x"), None);
        assert_eq!(sorted(set.into_keys()), ["a", "b", "d", "f"]);
        assert_eq!(sorted(RestartSet::new(rows(&KEPT)).into_keys()), ["a", "b", "c", "d", "f"]);
    }

    #[test]
    fn a_row_told_once_is_not_told_again() {
        let mut set = RestartSet::new(rows(&KEPT));
        let loaded = rows(&[("a", Some("1"))]);
        assert_eq!(set.told_of(&loaded), [true]);
        assert_eq!(set.told_of(&loaded), [false], "out after the first answer");
    }
}
