//! `Controller::try_start` when the OS refuses a worker thread: a clean
//! error, nothing left running, the controller stopped. The refusal comes
//! from a real limit: the address-space limit (`RLIMIT_AS`) is lowered so
//! that four worker stacks fit but not 5,000.
//!
//! The limit is process-wide, so the test runs in a child process of its
//! own, set up so that only thread stacks can hit it (issue 32, item 9: run
//! among the other tests of a plain build, it once aborted the whole binary
//! with "Fatal glibc error: failed to register TLS destructor: out of
//! memory", 1 run in 46). Every stack is 128 MiB (`RUST_MIN_STACK`, read
//! once per process, hence the child), and the limit leaves room for four
//! of them plus 64 MiB: the spawn that fails finds less than one stack
//! left, but never less than 64 MiB minus a few pages, so the threads
//! already made always get their thread-local data. One malloc arena
//! (`MALLOC_ARENA_MAX=1`, read by glibc at exec) keeps glibc from reserving
//! 64 MiB of address space for each new thread's arena out of that room.

mod common;

use std::time::Duration;

use reconq::{Action, Controller, ReconcileError};

const STACK: u64 = 128 * 1024 * 1024;
const SLACK: u64 = 64 * 1024 * 1024;

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
    let stack = STACK.to_string();
    common::run_test_in_child(
        "a_start_the_os_refuses_is_an_error_with_nothing_left_running",
        &[("RUST_MIN_STACK", &stack), ("MALLOC_ARENA_MAX", "1")],
        start_refused,
    );
}

/// In the child.
fn start_refused() {
    let controller =
        Controller::from_fn("huge", |_key: &u32, _ctx| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .workers(5000);
    let handle = controller.handle();
    handle.enqueue(1);
    let before = threads();
    common::set_soft_limit(libc::RLIMIT_AS, vm_size() + 4 * STACK + SLACK);
    let started = controller.try_start();
    common::set_soft_limit(libc::RLIMIT_AS, libc::RLIM_INFINITY);

    let error = started.expect_err("5,000 stacks of 128 MiB do not fit in 576 MiB");
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
