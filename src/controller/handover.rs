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
//! A key waiting for a due time travels with what remains of its delay
//! (a retry's back-off, a `requeue_after`), so the next owner does not run
//! it early; its failure count stays behind.
//!
//! The encoding: a version byte, then for each key its priority (4 bytes,
//! big-endian), the milliseconds left until it is due (8 bytes,
//! big-endian; 0: ready) and its store encoding (`crate::key_encoding`,
//! the same in Rust and Python), at most [`MAX_HANDOVER_BYTES`] per
//! partition.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::coordination::MAX_HANDOVER_BYTES;
use crate::key_encoding::StoreKey;
use crate::logs;
use crate::queue::{Priority, View};
use crate::sync::Mutex;

/// The format of a hand-over.
const VERSION: u8 = 1;

/// The keys refused while their partition was being given up, or dropped
/// by a stop, by partition, each with what it was (its due time and
/// priority), until the partition is given up (then they go with it) or
/// another replica holds it (then they are its business).
pub(crate) struct Refused<K>(Mutex<HashMap<u32, Vec<(K, View)>>>);

impl<K> Default for Refused<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K> Refused<K> {
    pub(crate) fn keep(&self, partition: u32, key: K, view: View) {
        self.0.lock().entry(partition).or_default().push((key, view));
    }

    /// Drops the keys kept for `partitions`.
    pub(crate) fn forget(&self, partitions: &BTreeSet<u32>) {
        let mut refused = self.0.lock();
        partitions.iter().for_each(|p| drop(refused.remove(p)));
    }

    /// The keys kept for `partitions`, to hand over `now`. Copied, not
    /// taken: a give-up that fails is tried again with them, and they go
    /// once another replica holds the partition
    /// ([`forget`](Self::forget)).
    pub(crate) fn to_hand_over(&self, partitions: &BTreeSet<u32>, now: Instant) -> Vec<(u32, Handed<K>)>
    where
        K: Clone,
    {
        let refused = self.0.lock();
        if refused.is_empty() {
            return Vec::new();
        }
        let kept = partitions.iter().filter_map(|&p| Some((p, refused.get(&p)?)));
        kept.flat_map(|(p, keys)| keys.iter().map(move |(key, view)| (p, handed(key.clone(), *view, now)))).collect()
    }
}

/// `key`, which is `view` (its due time and priority), handed over `now`.
pub(crate) fn handed<K>(key: K, (due, priority): View, now: Instant) -> Handed<K> {
    (key, priority, due.map_or(Duration::ZERO, |due| due.saturating_duration_since(now)))
}

/// A key handed over: its priority, and how long until it is due
/// (zero: ready).
pub(crate) type Handed<K> = (K, Priority, Duration);

/// Encodes `keys` (each with its partition) by partition; a partition's
/// keys past [`MAX_HANDOVER_BYTES`] are left out, counted in one WARN.
pub(crate) fn encode<K: StoreKey>(
    controller: &str,
    keys: impl IntoIterator<Item = (u32, Handed<K>)>,
) -> BTreeMap<u32, Vec<u8>> {
    let mut out: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut left_out: BTreeMap<u32, usize> = BTreeMap::new();
    let mut one = Vec::new();
    for (partition, (key, priority, delay)) in keys {
        one.clear();
        one.extend_from_slice(&priority.to_be_bytes());
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        one.extend_from_slice(&millis.to_be_bytes());
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

/// The keys of one hand-over; what follows a key that is not of this
/// controller's shape (another program's, or a newer format) is dropped,
/// logged.
pub(crate) fn decode<K: StoreKey>(controller: &str, bytes: &[u8]) -> Vec<Handed<K>> {
    let mut keys = Vec::new();
    let Some((&VERSION, mut rest)) = bytes.split_first() else {
        logs::handover_unreadable(controller, 0, bytes.len());
        return keys;
    };
    while !rest.is_empty() {
        let Some((priority, after)) = rest.split_first_chunk::<4>() else { break };
        let Some((millis, mut input)) = after.split_first_chunk::<8>() else { break };
        let Some(key) = K::decode(&mut input) else { break };
        let delay = Duration::from_millis(u64::from_be_bytes(*millis));
        keys.push((key, Priority::from_be_bytes(*priority), delay));
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

    fn one(partition: u32, key: &str, priority: Priority, millis: u64) -> (u32, Handed<String>) {
        (partition, (key.to_string(), priority, Duration::from_millis(millis)))
    }

    #[test]
    fn keys_come_back_with_their_priorities_and_delays_by_partition() {
        let encoded = encode("c", [one(1, "a", 0, 0), one(2, "b", -100, 3_600_000), one(1, "c", 7, 5)]);
        assert_eq!(encoded.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(decode::<String>("c", &encoded[&1]), vec![one(1, "a", 0, 0).1, one(1, "c", 7, 5).1]);
        assert_eq!(decode::<String>("c", &encoded[&2]), vec![one(2, "b", -100, 3_600_000).1]);
    }

    #[test]
    fn a_partition_keeps_what_fits_and_a_bad_tail_keeps_what_came_before() {
        let big = "x".repeat(100 * 1024);
        let encoded = encode("c", (0..10).map(|i| one(0, &format!("{i}{big}"), 0, 0)));
        assert!(encoded[&0].len() <= MAX_HANDOVER_BYTES);
        assert_eq!(decode::<String>("c", &encoded[&0]).len(), 7);
        let mut torn = encode("c", [one(0, "a", 1, 0)]).remove(&0).unwrap();
        torn.extend_from_slice(&[0, 0]);
        assert_eq!(decode::<String>("c", &torn), vec![one(0, "a", 1, 0).1]);
        assert!(decode::<String>("c", &[]).is_empty());
        assert!(decode::<i64>("c", &encode("c", [one(0, "a", 1, 0)])[&0]).is_empty());
    }
}
