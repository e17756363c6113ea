//! `Controller::try_start` when the OS refuses a worker thread: a clean
//! error, nothing left running, the controller stopped. The refusal comes
//! from a real limit: the address-space limit (`RLIMIT_AS`) is lowered so
//! a few dozen 2 MiB thread stacks fit but not 5,000. It is process-wide,
//! so this binary holds a single test.

mod common;

use std::time::Duration;

use reconq::{Action, Controller, ReconcileError};

/// This process's virtual size, in bytes.
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_start_the_os_refuses_is_an_error_with_nothing_left_running() {
    let controller =
        Controller::from_fn("huge", |_key: &u32, _ctx| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .workers(5000);
    let handle = controller.handle();
    handle.enqueue(1);
    let before = threads();
    common::set_soft_limit(libc::RLIMIT_AS, vm_size() + 128 * 1024 * 1024);
    let started = controller.try_start();
    common::set_soft_limit(libc::RLIMIT_AS, libc::RLIM_INFINITY);

    let error = started.expect_err("5,000 stacks do not fit in 128 MiB");
    let message = error.to_string();
    assert!(message.starts_with("cannot spawn worker thread "), "{message}");
    assert!(message.contains(" of 5000: "), "{message}");
    assert!(handle.is_stopped(), "the controller is stopped");
    assert!(handle.join_timeout(Duration::from_secs(10)));
    assert_eq!(threads(), before, "every worker spawned was joined");
    handle.enqueue(2);
    assert_eq!(handle.stats().depth, 0, "enqueues are ignored");

    // The process is fine: a small controller starts and works.
    let small = Controller::from_fn("small", |_key: &u32, _ctx| Ok(Action::Done)).workers(2).start();
    small.enqueue(1);
    assert!(small.wait_idle(common::PATIENCE));
    small.stop();
}
