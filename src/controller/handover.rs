//! What a sharded controller hands over with a partition it gives up
//! (guarantees §17, C2), and reads back when it gains one.
//!
//! A partition given up leaves keys behind: those still pending in the
//! queue, and those refused while it was being given up (a worker drops a
//! key of a partition leaving, an enqueue refuses one). The next owner's
//! caches cannot bring them all back: a delete made before its caches
//! listed is in none of them (C1's tombstones hold only the deletes a
//! cache applied), and a key no cache maps to is in none at all. So the
//! keys travel with the partition: encoded here, written by sharding with
//! the delete of the partition's key, enqueued by the next owner.
//!
//! The encoding: a version byte, then for each key its priority (4 bytes,
//! big-endian) and its store encoding (`crate::key_encoding`, the same in
//! Rust and Python), at most [`MAX_HANDOVER_BYTES`] per partition.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::coordination::MAX_HANDOVER_BYTES;
use crate::key_encoding::StoreKey;
use crate::logs;
use crate::queue::Priority;
use crate::sync::Mutex;

/// The format of a hand-over.
const VERSION: u8 = 1;

/// The keys refused while their partition was being given up, by
/// partition, until it is given up (then they go with it) or another
/// replica holds it (then they are its business).
pub(crate) struct Refused<K>(Mutex<HashMap<u32, Vec<(K, Priority)>>>);

impl<K> Default for Refused<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K> Refused<K> {
    pub(crate) fn keep(&self, partition: u32, key: K, priority: Priority) {
        self.0.lock().entry(partition).or_default().push((key, priority));
    }

    /// Takes the keys kept for `partitions`.
    pub(crate) fn take(&self, partitions: &BTreeSet<u32>) -> Vec<(u32, K, Priority)> {
        let mut refused = self.0.lock();
        if refused.is_empty() {
            return Vec::new();
        }
        let taken = partitions.iter().filter_map(|&p| Some((p, refused.remove(&p)?)));
        taken.flat_map(|(p, keys)| keys.into_iter().map(move |(key, priority)| (p, key, priority))).collect()
    }
}

/// Encodes `keys` (each with its partition and priority) by partition;
/// a partition's keys past [`MAX_HANDOVER_BYTES`] are left out, counted
/// in one WARN.
pub(crate) fn encode<K: StoreKey + std::fmt::Debug>(
    controller: &str,
    keys: impl IntoIterator<Item = (u32, K, Priority)>,
) -> BTreeMap<u32, Vec<u8>> {
    let mut out: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut left_out: BTreeMap<u32, usize> = BTreeMap::new();
    let mut one = Vec::new();
    for (partition, key, priority) in keys {
        one.clear();
        one.extend_from_slice(&priority.to_be_bytes());
        key.encode(&mut one);
        let bytes = out.entry(partition).or_insert_with(|| vec![VERSION]);
        if bytes.len() + one.len() > MAX_HANDOVER_BYTES {
            *left_out.entry(partition).or_default() += 1;
            continue;
        }
        bytes.extend_from_slice(&one);
    }
    for (partition, count) in left_out {
        logs::handover_full(controller, partition, count, MAX_HANDOVER_BYTES);
    }
    out
}

/// The keys of one hand-over, with their priorities; what follows a key
/// that is not of this controller's shape (another program's, or a newer
/// format) is dropped, logged.
pub(crate) fn decode<K: StoreKey>(controller: &str, bytes: &[u8]) -> Vec<(K, Priority)> {
    let mut keys = Vec::new();
    let Some((&VERSION, mut rest)) = bytes.split_first() else {
        logs::handover_unreadable(controller, 0, bytes.len());
        return keys;
    };
    while !rest.is_empty() {
        let Some((priority, after)) = rest.split_first_chunk::<4>() else { break };
        let mut input = after;
        let Some(key) = K::decode(&mut input) else { break };
        keys.push((key, Priority::from_be_bytes(*priority)));
        rest = input;
    }
    if !rest.is_empty() {
        logs::handover_unreadable(controller, keys.len(), rest.len());
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_back_with_their_priorities_by_partition() {
        let keys = [(1, "a".to_string(), 0), (2, "b".to_string(), -100), (1, "c".to_string(), 7)];
        let encoded = encode("c", keys);
        assert_eq!(encoded.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(decode::<String>("c", &encoded[&1]), vec![("a".to_string(), 0), ("c".to_string(), 7)]);
        assert_eq!(decode::<String>("c", &encoded[&2]), vec![("b".to_string(), -100)]);
    }

    #[test]
    fn a_partition_keeps_what_fits_and_a_bad_tail_keeps_what_came_before() {
        let big = "x".repeat(100 * 1024);
        let encoded = encode("c", (0..10).map(|i| (0, format!("{i}{big}"), 0)));
        assert!(encoded[&0].len() <= MAX_HANDOVER_BYTES);
        assert_eq!(decode::<String>("c", &encoded[&0]).len(), 7);
        let mut torn = encode("c", [(0, "a".to_string(), 1)]).remove(&0).unwrap();
        torn.extend_from_slice(&[0, 0]);
        assert_eq!(decode::<String>("c", &torn), vec![("a".to_string(), 1)]);
        assert!(decode::<String>("c", &[]).is_empty());
        assert!(decode::<i64>("c", &encode("c", [(0, "a".to_string(), 1)])[&0]).is_empty());
    }
}
