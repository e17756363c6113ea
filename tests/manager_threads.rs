//! Controller threads exit when removed. Alone in its test binary so no other
//! test's threads change the process's thread count.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use reconq::{ControllerParams, FakeClock, Manager};

fn thread_count() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line["Threads:".len()..].trim().parse().unwrap()
}

#[test]
fn thread_count_returns_to_baseline() {
    let baseline = thread_count();
    let m = Manager::builder().clock(FakeClock::new()).build();
    for i in 0..8 {
        m.update(format!("c{i}"), ControllerParams::new(|| Ok(())).run_interval(Duration::from_secs(1)));
    }
    assert_eq!(thread_count(), baseline + 8, "one thread per controller");
    m.remove("c0").unwrap();
    m.remove_all_and_wait();
    // A joined thread has finished, but the kernel may still count it for a
    // moment (join returns when the thread clears its tid, before its task
    // is reaped): allow that moment, not the time a thread takes to exit.
    wait_for_threads(
        baseline,
        Duration::from_secs(1),
        "remove_all_and_wait joins every thread, earlier removals included",
    );

    // Dropping the manager detaches its threads; they still exit.
    let m = Manager::new();
    for i in 0..4 {
        m.update(format!("d{i}"), ControllerParams::new(|| Ok(())));
    }
    drop(m);
    wait_for_threads(baseline, Duration::from_secs(20), "detached threads did not exit");
}

/// Waits up to `within` for the process to have `expected` threads.
fn wait_for_threads(expected: usize, within: Duration, failure: &str) {
    let deadline = Instant::now() + within;
    while thread_count() != expected {
        assert!(Instant::now() < deadline, "{failure}: {} threads, expected {expected}", thread_count());
        std::thread::sleep(Duration::from_millis(1));
    }
}
