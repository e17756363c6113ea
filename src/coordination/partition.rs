//! Which partition a key belongs to (guarantees §11, H1).

use crate::key_encoding::{StoreKey, encode_key};

/// The partition of `key` among `partitions`: FNV-1a (64-bit) of the key's
/// store encoding (the documented byte form shared by Rust and Python, see
/// [`StoreKey`]), modulo `partitions`. The same in every process, on every
/// machine, in Rust and Python for keys of the same shape; pinned by tests.
///
/// # Panics
/// If `partitions` is 0.
pub fn partition_of<K: StoreKey>(key: &K, partitions: u32) -> u32 {
    assert!(partitions > 0, "partition_of: partitions must be at least 1");
    (fnv1a64(&encode_key(key)) % u64::from(partitions)) as u32
}

/// The partition of `key` among `partitions` when keys are partitioned by
/// `partition_by` (guarantees §17, C3): that of the key it names, so keys
/// naming the same value share a partition. The same as a sharded
/// controller's with [`Controller::partition_by`](crate::Controller::partition_by)
/// and as Python's `partition_of(key, partitions, partition_by=f)`. A
/// panic in `partition_by` propagates.
///
/// # Panics
/// If `partitions` is 0.
pub fn partition_of_by<K, P: StoreKey>(key: &K, partitions: u32, partition_by: impl FnOnce(&K) -> P) -> u32 {
    partition_of(&partition_by(key), partitions)
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned: changing these changes which replica owns which key.
    #[test]
    fn partitions_are_pinned() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        let pinned: Vec<u32> =
            ["", "a", "default/web", "ns/name-17"].iter().map(|k| partition_of(&k.to_string(), 64)).collect();
        let ints: Vec<u32> = [0i64, 1, 42, -7].iter().map(|k| partition_of(k, 64)).collect();
        let tuple = partition_of(&("default".to_string(), 3i64), 64);
        assert_eq!((pinned, ints, tuple), (vec![44, 26, 3, 20], vec![37, 50, 55, 43], 21));
    }

    /// Pinned, and the same in tests/python/test_sharding.py (C3): keys
    /// partitioned by their namespace, and tuples by their first element.
    #[test]
    fn partition_by_is_pinned() {
        let namespace = |k: &String| k.split('/').next().unwrap_or_default().to_string();
        let by_namespace: Vec<u32> = ["ns-a/web", "ns-a/db", "ns-b/web", "ns-b/cache"]
            .iter()
            .map(|k| partition_of_by(&k.to_string(), 64, namespace))
            .collect();
        let pipeline = |k: &(String, i64)| k.0.clone();
        let by_pipeline: Vec<u32> = [("etl", 1), ("etl", 2), ("report", 1)]
            .iter()
            .map(|&(p, step)| partition_of_by(&(p.to_string(), step), 64, pipeline))
            .collect();
        let ints = partition_of_by(&1234i64, 64, |k| k / 100);
        assert_eq!(by_namespace[0], by_namespace[1]);
        assert_eq!(by_namespace[2], by_namespace[3]);
        assert_eq!(by_pipeline[0], by_pipeline[1]);
        assert_eq!(by_namespace[0], partition_of(&"ns-a".to_string(), 64));
        assert_eq!((by_namespace, by_pipeline, ints), (vec![57, 57, 32, 32], vec![48, 48, 36], 49));
    }
}
