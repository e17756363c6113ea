//! `parallelize`: every piece exactly once, chunking, early stop, panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use reconq::{ParallelizeOptions, parallelize, parallelize_with};

fn visits(pieces: usize, workers: usize, chunk_size: usize) -> Vec<usize> {
    let seen: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
    parallelize_with(workers, pieces, &ParallelizeOptions::new().chunk_size(chunk_size), |p| {
        seen[p].fetch_add(1, Ordering::Relaxed);
    });
    seen.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn every_piece_is_visited_exactly_once() {
    for (pieces, workers, chunk) in
        [(1000, 10, 1), (1000, 10, 10), (1000, 10, 100), (999, 10, 13), (5, 10, 0), (1, 1, 1)]
    {
        let seen = visits(pieces, workers, chunk);
        assert!(seen.iter().all(|&n| n == 1), "pieces={pieces} workers={workers} chunk={chunk}: {seen:?}");
    }
}

#[test]
fn plain_parallelize_visits_every_piece() {
    let sum = AtomicUsize::new(0);
    let count = AtomicUsize::new(0);
    parallelize(7, 1000, |p| {
        sum.fetch_add(p, Ordering::Relaxed);
        count.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(count.into_inner(), 1000);
    assert_eq!(sum.into_inner(), 999 * 1000 / 2);
}

#[test]
fn nothing_to_do() {
    let calls = AtomicUsize::new(0);
    parallelize(0, 100, |_| {
        calls.fetch_add(1, Ordering::Relaxed);
    });
    parallelize(4, 0, |_| {
        calls.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(calls.into_inner(), 0);
}

#[test]
fn one_worker_runs_in_order_on_the_caller() {
    let order = Mutex::new(Vec::new());
    let caller = thread::current().id();
    parallelize_with(1, 50, &ParallelizeOptions::new().chunk_size(7), |p| {
        assert_eq!(thread::current().id(), caller);
        order.lock().unwrap().push(p);
    });
    assert_eq!(order.into_inner().unwrap(), (0..50).collect::<Vec<_>>());
}

#[test]
fn stop_flag_set_beforehand_skips_everything() {
    let stop = AtomicBool::new(true);
    let calls = AtomicUsize::new(0);
    parallelize_with(4, 100, &ParallelizeOptions::new().stop_flag(&stop), |_| {
        calls.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(calls.into_inner(), 0);
}

#[test]
fn early_stop_skips_the_remaining_pieces() {
    // One worker: the check before each piece stops it exactly after piece 99.
    let stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    parallelize_with(1, 10_000, &ParallelizeOptions::new().chunk_size(64).stop_flag(&stop), |p| {
        calls.fetch_add(1, Ordering::Relaxed);
        if p == 99 {
            stop.store(true, Ordering::Release);
        }
    });
    assert_eq!(calls.into_inner(), 100);

    // Several workers: each finishes at most the piece it is in.
    let stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    let workers = 8;
    parallelize_with(workers, 100_000, &ParallelizeOptions::new().stop_flag(&stop), |_| {
        if calls.fetch_add(1, Ordering::Relaxed) + 1 == 500 {
            stop.store(true, Ordering::Release);
        }
    });
    let calls = calls.into_inner();
    assert!((500..500 + workers).contains(&calls), "{calls} pieces ran");
}

#[test]
fn stop_closure_is_checked_before_each_piece() {
    let calls = AtomicUsize::new(0);
    let stop = || calls.load(Ordering::Relaxed) >= 10;
    parallelize_with(1, 1000, &ParallelizeOptions::new().stop_when(&stop), |_| {
        calls.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(calls.into_inner(), 10);
}

#[test]
fn panics_propagate_to_the_caller() {
    let run = |workers: usize, pieces: usize| {
        let calls = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            parallelize(workers, pieces, |p| {
                calls.fetch_add(1, Ordering::Relaxed);
                if p == 10 {
                    panic!("piece 10");
                }
                // Slow pieces, so that the panic (whose hook may take a while
                // to print a backtrace) lands long before the pieces run out.
                thread::sleep(Duration::from_millis(1));
            })
        }));
        let panic = result.expect_err("the panic reaches the caller");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"piece 10"));
        calls.into_inner()
    };
    assert_eq!(run(1, 1000), 11, "one worker stops at the panic");
    let calls = run(4, 20_000);
    assert!(calls < 20_000, "the other workers stopped taking pieces ({calls} ran)");
}
