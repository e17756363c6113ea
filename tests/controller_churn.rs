//! Thousands of controllers started and stopped in a loop: every thread is
//! joined, so the process's thread count returns to where it started. Kept
//! in its own test binary because it counts the whole process's threads.

mod common;

use std::time::Duration;

use reconq::{Action, Context, Controller, ReconcileError};

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").expect("Linux /proc").count()
}

#[test]
fn thousands_of_controllers_leave_no_threads_behind() {
    let before = thread_count();
    for round in 0..2000u64 {
        let handle =
            Controller::new("churn", |_: &u64, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
                .workers(2)
                .hanging_threshold(Duration::from_secs(60))
                .start();
        handle.enqueue(round);
        handle.add_trigger(round + 1, |_: &reconq::StopSignal| {});
        assert!(handle.wait_idle(common::PATIENCE));
        assert!(handle.stop_with_drain(common::PATIENCE), "round {round}: workers did not finish");
    }
    common::wait_for("threads to exit", || thread_count() <= before);
}
