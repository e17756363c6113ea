//! `Controller::run_until_signal` (issue 27 item 5): SIGTERM drains as in
//! Python's `run()`, a second signal stops at once, a signal the host
//! program handles itself is left alone. Real signals to a child process
//! (this test binary run again, one test, with `CHILD_ENV` naming the
//! scenario); every check is on what the child printed, in order.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::PATIENCE;
use reconq::{Action, Context, Controller, ReconcileError};

const CHILD_ENV: &str = "RECONQ_RUN_UNTIL_SIGNAL_CHILD";

/// The child's logs go to stdout, one line each, so the parent can follow.
fn log_to_stdout() {
    tracing_subscriber::fmt().with_writer(std::io::stdout).with_target(false).init();
}

fn say(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", line.as_ref()).unwrap();
    out.flush().unwrap();
}

/// A child: the test binary running `test` alone with the scenario set.
struct Parent {
    child: Child,
    out: BufReader<ChildStdout>,
    lines: Vec<String>,
}

impl Parent {
    fn spawn(test: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Self { child, out, lines: Vec::new() }
    }

    /// Reads until a line containing `text`; fails if the child exits first.
    fn wait_for_line(&mut self, text: &str) {
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited before printing {text:?}: {:#?}", self.lines);
            self.lines.push(line.trim_end().to_owned());
            if line.contains(text) {
                return;
            }
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, signal) }, 0);
    }

    fn send_line(&mut self, line: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    /// Reads the rest and waits for the exit; returns every line.
    fn finish(mut self) -> Vec<String> {
        for line in (&mut self.out).lines() {
            self.lines.push(line.unwrap());
        }
        let deadline = std::time::Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(std::time::Instant::now() < deadline, "the child hung: {:#?}", self.lines);
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the child failed ({status}): {:#?}", self.lines);
        self.lines
    }
}

fn index_of(lines: &[String], text: &str) -> usize {
    lines.iter().position(|l| l.contains(text)).unwrap_or_else(|| panic!("no line {text:?} in {lines:#?}"))
}

#[test]
fn sigterm_drains_and_run_returns_normally() {
    if std::env::var_os(CHILD_ENV).is_some() {
        log_to_stdout();
        let done = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&done);
        let controller = Controller::new("drain", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
            if key == "first" {
                say("ready");
                // Released by the parent once the drain has begun.
                std::io::stdin().lock().read_line(&mut String::new()).unwrap();
            }
            seen.lock().unwrap().push(key.clone());
            Ok(Action::Done)
        });
        let handle = controller.handle();
        for key in ["first", "0", "1", "2"] {
            handle.enqueue(key.to_owned());
        }
        controller.run_until_signal(None).unwrap();
        say(format!("returned stopped={} {:?}", handle.is_stopped(), done.lock().unwrap()));
        return;
    }
    let mut child = Parent::spawn("sigterm_drains_and_run_returns_normally");
    child.wait_for_line("ready");
    child.signal(libc::SIGTERM);
    child.wait_for_line("stopping on a signal, draining (a second signal stops at once)");
    child.send_line("go");
    let lines = child.finish();
    assert!(lines.iter().any(|l| l == r#"returned stopped=true ["first", "0", "1", "2"]"#), "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("second signal;")), "{lines:#?}");
}

#[test]
fn a_second_signal_stops_at_once() {
    if std::env::var_os(CHILD_ENV).is_some() {
        log_to_stdout();
        let controller = Controller::new("forced", |_: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
            say("ready");
            say(format!("reconcile cancelled: {}", ctx.wait_cancelled(PATIENCE * 3)));
            Ok(Action::Done)
        });
        controller.handle().enqueue(1);
        controller.run_until_signal(None).unwrap();
        say("returned");
        return;
    }
    let mut child = Parent::spawn("a_second_signal_stops_at_once");
    child.wait_for_line("ready");
    child.signal(libc::SIGTERM);
    child.wait_for_line("stopping on a signal");
    child.signal(libc::SIGINT);
    let lines = child.finish();
    index_of(&lines, "second signal; stopped at once (running reconciles were cancelled and returned)");
    assert!(index_of(&lines, "reconcile cancelled: true") < index_of(&lines, "returned"), "{lines:#?}");
}

/// The disposition of `signal` now.
fn disposition(signal: libc::c_int) -> libc::sighandler_t {
    // SAFETY: reads the current action only.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(signal, std::ptr::null(), &mut current), 0);
        current.sa_sigaction
    }
}

#[test]
fn a_signal_the_program_handles_is_left_alone_and_handlers_are_restored() {
    if std::env::var_os(CHILD_ENV).is_some() {
        log_to_stdout();
        // The program ignores SIGTERM: that stays so; SIGINT still drains.
        // SAFETY: setting a signal to ignored.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        let controller = Controller::new("host", |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
            say("ready");
            Ok(Action::Done)
        });
        controller.handle().enqueue(1);
        controller.run_until_signal(Some(PATIENCE)).unwrap();
        say(format!(
            "returned; SIGTERM ignored: {}, SIGINT default: {}",
            disposition(libc::SIGTERM) == libc::SIG_IGN,
            disposition(libc::SIGINT) == libc::SIG_DFL
        ));
        return;
    }
    let mut child = Parent::spawn("a_signal_the_program_handles_is_left_alone_and_handlers_are_restored");
    child.wait_for_line("ready");
    child.signal(libc::SIGTERM); // ignored: not a first signal
    child.signal(libc::SIGINT); // the first signal
    let lines = child.finish();
    assert_eq!(lines.iter().filter(|l| l.contains("stopping on a signal")).count(), 1, "{lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("second signal;")), "{lines:#?}");
    index_of(&lines, "returned; SIGTERM ignored: true, SIGINT default: true");
}
