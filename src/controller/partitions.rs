//! Which partition a controller's key belongs to (guarantees §11 H1, §17
//! C3): sharding's partition count, and the controller's `partition_by`
//! if it has one. The sharding gate, the keys listed when partitions are
//! gained, and C4's check of new edges all ask this one place, so they
//! always agree.
//!
//! `partition_by` is the user's code (Python's may raise, or return what
//! is not a key): a failure is an ERROR naming the key, and the key is
//! partitioned by itself. Repeated failures are logged at the 1st, 2nd,
//! 4th, 8th, ... one (as `logs::failure_loudness` spaces a key's repeated
//! errors), so a function failing for every key cannot flood the log.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::coordination::partition_of;
use crate::key_encoding::StoreKey;
use crate::logs;

/// A fallible `partition_by`: the partition (among the given count) of the
/// key it names, or why it could not name one.
pub(crate) type PartitionByFn<K> = dyn Fn(&K, u32) -> Result<u32, String> + Send + Sync;

/// How a controller maps its keys to partitions. Its count is set by
/// `sharding`; without it there are no partitions to keep edges within.
pub(crate) struct Partitioner<K> {
    controller: Arc<str>,
    /// Sharding's partition count; `None` while the controller has none.
    partitions: Option<u32>,
    /// `partition_of` for the key type (whose store encoding is known only
    /// where sharding is configured).
    itself: fn(&K, u32) -> u32,
    by: Option<Arc<PartitionByFn<K>>>,
    /// Failures of `by` so far (shared by the partitioner's rebuilds).
    failures: Arc<AtomicU64>,
}

impl<K> Clone for Partitioner<K> {
    fn clone(&self) -> Self {
        Self {
            controller: Arc::clone(&self.controller),
            partitions: self.partitions,
            itself: self.itself,
            by: self.by.clone(),
            failures: Arc::clone(&self.failures),
        }
    }
}

/// With sharding, an edge whose parent lies in another partition than its
/// key (C4): it could never hold, since no replica sees both.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CrossPartitionError<K> {
    /// The key whose parents were set.
    pub key: K,
    /// Its first parent in another partition.
    pub parent: K,
    /// The key's partition.
    pub key_partition: u32,
    /// The parent's partition.
    pub parent_partition: u32,
}

impl<K: fmt::Debug> fmt::Display for CrossPartitionError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the parent {:?} (partition {}) of {:?} (partition {}) lies in another partition: with sharding, an \
             edge must stay within one partition (give both keys the same partition_by value)",
            logs::Short(&self.parent),
            self.parent_partition,
            logs::Short(&self.key),
            self.key_partition
        )
    }
}

impl<K: fmt::Debug> std::error::Error for CrossPartitionError<K> {}

impl<K: StoreKey + fmt::Debug> Partitioner<K> {
    /// Keys partitioned by themselves, no partition count yet.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding makes one
    pub(crate) fn new(controller: &str) -> Self {
        Self {
            controller: Arc::from(controller),
            partitions: None,
            itself: partition_of::<K>,
            by: None,
            failures: Arc::default(),
        }
    }
}

impl<K: fmt::Debug> Partitioner<K> {
    /// Sharding's partition count.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding sets it
    pub(crate) fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// Partitions keys by what `by` names.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding's partition_by sets it
    pub(crate) fn with_partition_by(mut self, by: Arc<PartitionByFn<K>>) -> Self {
        self.by = Some(by);
        self
    }

    /// Whether a `partition_by` was given.
    pub(crate) fn has_partition_by(&self) -> bool {
        self.by.is_some()
    }

    /// Whether sharding set a partition count.
    pub(crate) fn is_sharded(&self) -> bool {
        self.partitions.is_some()
    }

    /// `key`'s partition (call with no engine lock held: `by` may take the
    /// GIL, and a failure logs).
    ///
    /// # Panics
    /// Without a partition count (the caller checks [`is_sharded`](Self::is_sharded)).
    pub(crate) fn of(&self, key: &K) -> u32 {
        let partitions = self.partitions.expect("partitions are asked of a sharded controller");
        let Some(by) = &self.by else { return (self.itself)(key, partitions) };
        by(key, partitions).unwrap_or_else(|error| {
            let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
            if failures.is_power_of_two() {
                logs::partition_by_failed(&self.controller, key, &error, failures);
            }
            (self.itself)(key, partitions)
        })
    }

    /// C4: the first of `parents` in another partition than `key`, if the
    /// controller is sharded.
    pub(crate) fn check_edges(&self, key: &K, parents: &[K]) -> Result<(), CrossPartitionError<K>>
    where
        K: Clone,
    {
        if !self.is_sharded() || parents.is_empty() {
            return Ok(());
        }
        let key_partition = self.of(key);
        for parent in parents {
            let parent_partition = self.of(parent);
            if parent_partition != key_partition {
                return Err(CrossPartitionError {
                    key: key.clone(),
                    parent: parent.clone(),
                    key_partition,
                    parent_partition,
                });
            }
        }
        Ok(())
    }
}
