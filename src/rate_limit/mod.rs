//! Rate limiters: how long a key waits before its next try (guarantees §2).
//!
//! A limiter answers [`when`](RateLimiter::when) each time a key is re-queued
//! with [`WorkQueue::add_rate_limited`](crate::WorkQueue::add_rate_limited),
//! and [`forget`](RateLimiter::forget) clears what it remembers of the key
//! (after a success). The set mirrors client-go's `workqueue` limiters,
//! including their exact sequences, so controllers ported from Go keep their
//! timing.

mod combinators;
mod failure_counts;
mod per_key;
mod token_bucket;

use std::sync::Arc;
use std::time::Duration;

pub use combinators::{MaxOf, WithMaxWait};
pub use per_key::{ExponentialBackoff, FastSlow};
pub use token_bucket::TokenBucket;

/// Decides how long a key waits before it is retried.
///
/// Implementations are shared between workers, so they synchronise
/// internally. Bring your own by implementing the three methods.
pub trait RateLimiter<K>: Send + Sync {
    /// How long `key` should wait now. Each call counts as one more requeue.
    fn when(&self, key: &K) -> Duration;
    /// Forgets `key`'s history: it is treated as new from now on.
    fn forget(&self, key: &K);
    /// How many times [`when`](Self::when) was asked for `key` since it was
    /// last forgotten.
    fn num_requeues(&self, key: &K) -> u32;
}

/// A limiter behind a smart pointer is the limiter it points to.
macro_rules! forward_rate_limiter {
    ($($pointer:ident),*) => {$(
        impl<K, L: RateLimiter<K> + ?Sized> RateLimiter<K> for $pointer<L> {
            fn when(&self, key: &K) -> Duration {
                (**self).when(key)
            }
            fn forget(&self, key: &K) {
                (**self).forget(key)
            }
            fn num_requeues(&self, key: &K) -> u32 {
                (**self).num_requeues(key)
            }
        }
    )*};
}

forward_rate_limiter!(Box, Arc);

/// client-go's default controller limiter: per-key exponential backoff from
/// 5 ms to 1000 s, and at most 10 retries a second overall (burst 100).
pub fn default_rate_limiter<K>() -> MaxOf<K>
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
{
    MaxOf::new(vec![
        Box::new(ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(1000))),
        Box::new(TokenBucket::new(10.0, 100)),
    ])
}
