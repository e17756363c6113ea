//! The wait after a source failed (E4, docs/sources.md), client-go's reflector's:
//! 0.8 s doubling up to 30 s, each wait drawn from [d, 2d) (jitter 1.0),
//! back to 0.8 s once a stream has run 2 minutes without failing.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

pub(super) const FIRST: Duration = Duration::from_millis(800);
const MAX: Duration = Duration::from_secs(30);
/// A stream that ran this long without failing resets the back-off.
pub(super) const RESET_AFTER: Duration = Duration::from_secs(120);

pub(super) struct Backoff {
    /// The first `d` (tests shorten it).
    first: Duration,
    /// `d` of the next wait.
    next: Duration,
    /// splitmix64 state, seeded at random: caches that fail together
    /// (their source went down) spread their retries.
    seed: u64,
}

impl Backoff {
    pub(super) fn new(first: Duration) -> Self {
        Self { first, next: first, seed: RandomState::new().hash_one(std::thread::current().id()) }
    }

    pub(super) fn reset(&mut self) {
        self.next = self.first;
    }

    /// The next wait, in [d, 2d); `d` doubles (at most 30 s).
    pub(super) fn wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(MAX);
        d + d.mul_f64(self.random())
    }

    /// A number in [0, 1).
    fn random(&mut self) -> f64 {
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_thirty_seconds_each_drawn_from_d_to_2d_and_reset() {
        let mut b = Backoff::new(FIRST);
        let mut d = FIRST;
        for _ in 0..12 {
            let wait = b.wait();
            assert!(wait >= d && wait < d * 2, "{wait:?} outside [{d:?}, {:?})", d * 2);
            d = (d * 2).min(MAX);
        }
        assert_eq!(d, MAX);
        b.reset();
        assert!(b.wait() < FIRST * 2);
    }
}
