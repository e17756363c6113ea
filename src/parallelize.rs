//! Running independent CPU-bound pieces of work on several threads, as
//! client-go's `workqueue.ParallelizeUntil`.
//!
//! The pieces `0..pieces` are cut into chunks of `chunk_size` consecutive
//! pieces; up to `workers` tasks take chunks in order until none is left.
//! Before each piece a task checks the stop condition and, once it holds,
//! takes no more pieces.
//!
//! The tasks run on rayon's global thread pool (one task inline when only one
//! is needed). That pool is for **CPU-bound pieces only**: a piece that
//! blocks (on I/O, a lock held long, a sleep) holds one of rayon's few
//! threads and slows every other user of the pool. reconq never runs its
//! blocking workers (controllers, reconcilers) on rayon; they have their own
//! OS threads. Parallelism is at most `min(workers, chunks, rayon's pool
//! size)`, which is the number of CPUs unless configured otherwise.
//!
//! **Panics** in `f` propagate to the caller once every task has stopped; the
//! other tasks take no further pieces after a panic.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Options for [`parallelize_with`]: the chunk size and a stop condition.
#[derive(Clone, Copy, Default)]
#[must_use = "options do nothing until given to `parallelize_with`"]
pub struct ParallelizeOptions<'a> {
    chunk_size: usize,
    stop: Stop<'a>,
}

#[derive(Clone, Copy, Default)]
enum Stop<'a> {
    #[default]
    Never,
    Flag(&'a AtomicBool),
    When(&'a (dyn Fn() -> bool + Sync)),
}

impl<'a> ParallelizeOptions<'a> {
    /// Chunks of one piece, no stop condition.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many consecutive pieces a task takes at a time; 0 is taken as 1.
    /// Larger chunks cost less coordination for tiny pieces.
    pub fn chunk_size(mut self, chunk_size: usize) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// Stops taking pieces once `flag` is true (read before each piece).
    pub fn stop_flag(mut self, flag: &'a AtomicBool) -> Self {
        self.stop = Stop::Flag(flag);
        self
    }

    /// Stops taking pieces once `stop()` returns true (asked before each
    /// piece, from any of the tasks).
    pub fn stop_when(mut self, stop: &'a (dyn Fn() -> bool + Sync)) -> Self {
        self.stop = Stop::When(stop);
        self
    }

    fn stopped(&self) -> bool {
        match self.stop {
            Stop::Never => false,
            Stop::Flag(flag) => flag.load(Ordering::Acquire),
            Stop::When(stop) => stop(),
        }
    }
}

impl std::fmt::Debug for ParallelizeOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stop = match self.stop {
            Stop::Never => "never",
            Stop::Flag(_) => "flag",
            Stop::When(_) => "closure",
        };
        f.debug_struct("ParallelizeOptions").field("chunk_size", &self.chunk_size).field("stop", &stop).finish()
    }
}

/// Calls `f(piece)` for every piece in `0..pieces`, on up to `workers`
/// threads, and returns when all are done. `workers == 0` or `pieces == 0`
/// does nothing.
///
/// The pieces `0..pieces` are cut into chunks of consecutive pieces (one
/// piece each here; see [`parallelize_with`]); up to `workers` tasks take
/// chunks in order until none is left.
///
/// **Threads.** The tasks run on rayon's global thread pool (one task runs
/// inline on the caller when only one is needed), so parallelism is at most
/// `min(workers, chunks, rayon's pool size)`. That pool is for **CPU-bound
/// pieces only**: a piece that blocks (I/O, a sleep, a lock held long) holds
/// one of rayon's few threads. reconq never runs its blocking workers
/// (controllers, reconcilers) on rayon; they have their own OS threads.
///
/// **Panics** in `f` propagate to the caller once every task has stopped;
/// after a panic the other tasks take no further pieces.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// let sum = AtomicU64::new(0);
/// reconq::parallelize(4, 100, |piece| {
///     sum.fetch_add(piece as u64, Ordering::Relaxed);
/// });
/// assert_eq!(sum.into_inner(), 4950);
/// ```
pub fn parallelize(workers: usize, pieces: usize, f: impl Fn(usize) + Sync) {
    parallelize_with(workers, pieces, &ParallelizeOptions::new(), f);
}

/// [`parallelize`] (same threads, same panics) with a chunk size and a stop condition checked before each
/// piece: once it holds, the remaining pieces are skipped.
///
/// ```
/// use reconq::{ParallelizeOptions, parallelize_with};
/// use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
///
/// let found = AtomicBool::new(false);
/// let visited = AtomicUsize::new(0);
/// parallelize_with(1, 1000, &ParallelizeOptions::new().chunk_size(10).stop_flag(&found), |piece| {
///     visited.fetch_add(1, Ordering::Relaxed);
///     if piece == 41 {
///         found.store(true, Ordering::Release);
///     }
/// });
/// assert_eq!(visited.into_inner(), 42);
/// ```
pub fn parallelize_with(workers: usize, pieces: usize, options: &ParallelizeOptions<'_>, f: impl Fn(usize) + Sync) {
    if workers == 0 || pieces == 0 {
        return;
    }
    let chunk_size = options.chunk_size.max(1);
    let chunks = pieces.div_ceil(chunk_size);
    let tasks = workers.min(chunks);
    let next_chunk = AtomicUsize::new(0);
    let panicked = AtomicBool::new(false);

    let work = || {
        loop {
            let chunk = next_chunk.fetch_add(1, Ordering::Relaxed);
            if chunk >= chunks {
                return;
            }
            let start = chunk * chunk_size;
            let end = pieces.min(start + chunk_size);
            for piece in start..end {
                if panicked.load(Ordering::Relaxed) || options.stopped() {
                    return;
                }
                f(piece);
            }
        }
    };
    let task = || {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(work)) {
            panicked.store(true, Ordering::Relaxed);
            resume_unwind(panic);
        }
    };

    if tasks == 1 {
        task();
    } else {
        // `scope` waits for every spawned task, then re-raises the first
        // panic; the scope body itself is the last task.
        rayon::scope(|scope| {
            for _ in 1..tasks {
                scope.spawn(|_| task());
            }
            task();
        });
    }
}
