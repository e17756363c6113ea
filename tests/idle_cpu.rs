//! G8: an idle queue, and an idle controller with every scheduling option on
//! (priorities, groups with a limit, a hang threshold and a timeout, whose
//! watchdog must sleep untimed while nothing runs), use no CPU. This binary
//! holds a single test because it
//! measures the CPU time of the whole process (`getrusage(RUSAGE_SELF)`), and
//! tests in one binary run in parallel threads of one process.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{ms, process_cpu_time, secs};
use reconq::{Action, Context, Controller, ReconcileError, WorkQueue};

/// CPU time the process uses during `window` while 4 threads are blocked in
/// `get()` on `q`. The threads are released by shutting the queue down.
fn cpu_while_idle(q: &WorkQueue<u32>, window: Duration) -> Duration {
    let start = Arc::new(Barrier::new(5));
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let (q, start) = (q.clone(), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                q.get()
            })
        })
        .collect();
    start.wait();
    // Let the getters reach their condvar wait; any CPU they spend getting
    // there is microseconds and falls well inside the budget anyway.
    thread::sleep(ms(100));
    let before = process_cpu_time();
    let t0 = Instant::now();
    while t0.elapsed() < window {
        thread::sleep(window - t0.elapsed());
    }
    let used = process_cpu_time() - before;
    q.shut_down();
    for g in getters {
        assert_eq!(g.join().unwrap(), None);
    }
    used
}

#[test]
fn g8_idle_getters_use_no_cpu_with_an_empty_queue_or_a_far_delayed_key() {
    const BUDGET: Duration = Duration::from_millis(50);

    let empty = WorkQueue::new();
    let used = cpu_while_idle(&empty, secs(1));
    assert!(used < BUDGET, "empty queue: {used:?} of CPU in 1 s idle");

    let delayed = WorkQueue::new();
    delayed.add_after(1, secs(600));
    let used = cpu_while_idle(&delayed, secs(1));
    assert!(used < BUDGET, "key due in 10 min: {used:?} of CPU in 1 s idle");

    let scheduled =
        Controller::new("idle", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .workers(4)
            .group(|k: &u32| k % 3)
            .max_in_flight_per_group(1)
            .hanging_threshold(secs(1))
            .timeout(secs(5))
            .start();
    for k in 0..100 {
        scheduled.enqueue_with_priority(k, (k % 4) as i32);
    }
    assert!(scheduled.wait_idle(secs(20)));
    thread::sleep(ms(100));
    let before = process_cpu_time();
    thread::sleep(secs(1));
    let used = process_cpu_time() - before;
    scheduled.stop();
    assert!(used < BUDGET, "idle controller with priorities, groups, hang threshold and timeout: {used:?} in 1 s");
}
