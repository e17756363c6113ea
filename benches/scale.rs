//! Scale report: memory per key and cost per operation as the queue grows.
//!
//! For ready keys (10 k → 10 M) and delayed keys (10 k → 1 M), fills a queue,
//! then measures the resident memory the keys added and the mean cost of
//! `add` and of `get`+`done` at that size. O(1) add/get and O(log n) delayed
//! adds show up as flat (or slowly growing) per-operation costs; cache misses
//! show up as a step once the key map outgrows the caches. Finally checks
//! that memory returns after a million distinct keys pass through.
//!
//! Each case runs in a fresh child process, so memory freed by an earlier
//! case cannot be reused and hide a later case's cost.
//!
//! `cargo bench --bench scale` (about a minute; needs ~2 GB of memory).

use std::time::{Duration, Instant};

use reconq::WorkQueue;

/// Resident set size of this process, from `/proc/self/statm`.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("statm RSS field");
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn per_op(elapsed: Duration, ops: u64) -> Duration {
    elapsed / ops as u32
}

/// Keys added beyond the filled ones to time each operation.
const PROBES: u64 = 100_000;

fn ready_keys(size: u64) {
    let q = WorkQueue::<u64>::new();
    let before = rss_bytes();
    for key in 0..size {
        q.add(key);
    }
    let bytes_per_key = rss_bytes().saturating_sub(before) as f64 / size as f64;
    let started = Instant::now();
    for key in size..size + PROBES {
        q.add(key);
    }
    let add = per_op(started.elapsed(), PROBES);
    let started = Instant::now();
    for _ in 0..PROBES {
        let key = q.get().expect("filled");
        q.done(&key);
    }
    let get_done = per_op(started.elapsed(), PROBES);
    println!("ready   {size:>10} keys: {bytes_per_key:>6.1} B/key   add {add:>9.2?}   get+done {get_done:>9.2?}");
}

fn delayed_keys(size: u64) {
    let q = WorkQueue::<u64>::new();
    let hour = Duration::from_secs(3600);
    let before = rss_bytes();
    for key in 0..size {
        q.add_after(key, hour + Duration::from_nanos(key.wrapping_mul(0x9E37_79B9) % 1_000_000_000));
    }
    let bytes_per_key = rss_bytes().saturating_sub(before) as f64 / size as f64;
    let started = Instant::now();
    for key in size..size + PROBES {
        q.add_after(key, hour + Duration::from_nanos(key.wrapping_mul(0x9E37_79B9) % 1_000_000_000));
    }
    let add_after = per_op(started.elapsed(), PROBES);
    println!("delayed {size:>10} keys: {bytes_per_key:>6.1} B/key   add_after {add_after:>9.2?}");
}

/// A million distinct keys through add → get → done, in batches, then the
/// resident memory compared with before.
fn memory_returns() {
    let q = WorkQueue::<u64>::new();
    q.add(u64::MAX);
    let key = q.get().unwrap();
    q.done(&key);
    let before = rss_bytes();
    let mut peak = before;
    for batch in 0..10u64 {
        for key in batch * 100_000..(batch + 1) * 100_000 {
            q.add(key);
        }
        peak = peak.max(rss_bytes());
        while let Ok(key) = q.get_timeout(Duration::ZERO) {
            q.done(&key);
        }
    }
    let after = rss_bytes();
    // glibc keeps freed memory for reuse instead of returning it to the OS;
    // ask it to trim, so what remains is what the queue still holds.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let trimmed = rss_bytes();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "1M keys through the queue: RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB, after malloc_trim {:.1} MiB",
        mib(before),
        mib(peak),
        mib(after),
        mib(trimmed)
    );
}

/// A million distinct keys through a `Controller` whose reconciles fail,
/// requeue and retry (every per-key map the controller keeps is exercised),
/// then resident memory compared with before, after trimming.
fn controller_memory_returns() {
    use reconq::{Action, Context, Controller, ExponentialBackoff, ReconcileError};
    let reconcile = |key: &u64, ctx: &Context| -> Result<Action, ReconcileError> {
        match (key % 4, ctx.attempt()) {
            (1, 0) => Err(ReconcileError::new("transient")),
            (2, 0) => Ok(Action::Requeue),
            (3, 0) => Err(ReconcileError::retry_after(Duration::from_millis(1), "later")),
            _ => Ok(Action::Done),
        }
    };
    let handle = Controller::new("scale", reconcile)
        .workers(2)
        .rate_limiter(ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(10)))
        .start();
    handle.enqueue(u64::MAX);
    assert!(handle.wait_idle(Duration::from_secs(60)));
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let before = rss_bytes();
    let mut after = [0; 2];
    for (round, rss) in after.iter_mut().enumerate() {
        let first = round as u64 * 1_000_000;
        for batch in 0..10u64 {
            for key in first + batch * 100_000..first + (batch + 1) * 100_000 {
                handle.enqueue(key);
            }
            assert!(handle.wait_idle(Duration::from_secs(60)));
        }
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
        *rss = rss_bytes();
    }
    let stats = handle.stats();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "2 x 1M keys through a Controller ({} reconciles, {} failures, {} requeues): RSS before {:.1} MiB, after the first million {:.1} MiB, after the second {:.1} MiB (after malloc_trim)",
        stats.reconciles,
        stats.failures,
        stats.requeues,
        mib(before),
        mib(after[0]),
        mib(after[1])
    );
    assert!(handle.stop_with_drain(Duration::from_secs(10)));
    drop(handle);
    unsafe { libc::malloc_trim(0) };
    println!("  after stopping and dropping the controller: {:.1} MiB", mib(rss_bytes()));
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    match (args.next().as_deref(), args.next().and_then(|n| n.parse().ok())) {
        (Some("ready"), Some(size)) => ready_keys(size),
        (Some("delayed"), Some(size)) => delayed_keys(size),
        (Some("memory"), _) => memory_returns(),
        (Some("controller-memory"), _) => controller_memory_returns(),
        _ => {
            let cases = [10_000, 100_000, 1_000_000, 10_000_000]
                .map(|n| ("ready", n))
                .into_iter()
                .chain([10_000, 100_000, 1_000_000].map(|n| ("delayed", n)))
                .chain([("memory", 0), ("controller-memory", 0)]);
            let exe = std::env::current_exe().expect("own executable");
            for (case, size) in cases {
                let status = std::process::Command::new(&exe).arg(case).arg(size.to_string()).status();
                assert!(status.is_ok_and(|s| s.success()), "scale case {case} {size} failed");
            }
        }
    }
}
