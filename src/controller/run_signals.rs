//! [`Controller::run_until_signal`]: `run()` that stops on Ctrl-C or
//! SIGTERM (guarantees §13): the first signal drains, a second one stops at
//! once. What each signal does is decided in [`on_signal`], for Python's
//! `Controller.run()` too.

use std::io;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select};

use super::Controller;
use super::core::ControllerKey;
use super::handle::ControllerHandle;
use crate::logs;
use crate::signals;

/// What a first and a second signal do to a run: the one place that
/// decides it, for [`Controller::run_until_signal`] and for Python's
/// `Controller.run()`. Each of them only waits its own way (threads and
/// channels here; slices between which Python's handlers raise
/// `KeyboardInterrupt` there) and says what happened in its own log lines.
pub(crate) mod on_signal {
    use std::time::{Duration, Instant};

    use super::{ControllerHandle, ControllerKey};
    use crate::clock::deadline_after;
    use crate::controller::stopping::StopOptions;

    /// After a second signal, how long a run waits for the cancelled
    /// reconciles to return before it returns anyway.
    const SECOND_SIGNAL_GRACE: Duration = Duration::from_secs(1);

    /// The first signal: a drain, for at most `stop_timeout` (`None`: until
    /// the reconciles return).
    pub(crate) fn first(stop_timeout: Option<Duration>) -> StopOptions {
        StopOptions { drain: true, timeout: stop_timeout, aux_grace: None }
    }

    /// A second signal, during the drain: stops at once (the running
    /// reconciles are cancelled; stopping twice is fine), and returns until
    /// when to wait for them to return.
    pub(crate) fn second<K: ControllerKey>(handle: &ControllerHandle<K>) -> Instant {
        handle.stop();
        deadline_after(Instant::now(), SECOND_SIGNAL_GRACE)
    }
}

impl<K: ControllerKey> Controller<K> {
    /// [`start`](Self::start), then blocks until the controller is stopped
    /// by a handle, or by a signal: SIGINT (Ctrl-C) or SIGTERM (the stop
    /// signal of systemd, Docker and Kubernetes) drains it as
    /// [`stop_with_drain_report`](ControllerHandle::stop_with_drain_report)
    /// does, for at most `stop_timeout` (`None`: until the reconciles
    /// return); a second signal during the drain stops at once (running
    /// reconciles are cancelled, then given a second to return). Either
    /// way it returns normally, having logged a WARN for the signal and for
    /// what it left running.
    ///
    /// Only signals whose disposition is the default are taken over, and
    /// only while this runs: a handler of the host program (or an ignored
    /// signal) is left alone, so such a program stops the controller itself.
    /// Several controllers may run this at once, in threads of their own:
    /// each signal reaches all of them.
    ///
    /// # Errors
    /// The controller could not start ([`try_start`](Self::try_start)), or
    /// the signal handlers could not be set up (no pipe, no thread); then
    /// nothing runs.
    pub fn run_until_signal(self, stop_timeout: Option<Duration>) -> io::Result<()> {
        // Subscribed first, so a signal during the start counts.
        let subscription = signals::subscribe()?;
        let handle = self.try_start()?;
        let (stopped_tx, stopped) = bounded(1);
        let waiter = handle.clone();
        std::thread::Builder::new().name(format!("reconq-{}-run", handle.name())).spawn(move || {
            waiter.wait_stopped(None);
            let _ = stopped_tx.send(());
        })?;
        select! {
            recv(stopped) -> _ => {
                handle.join_timeout(Duration::ZERO);
                return Ok(());
            }
            recv(subscription.signals) -> _ => {}
        }
        logs::signal_draining(handle.name());
        let (drained_tx, drained) = bounded(1);
        let drainer = handle.clone();
        std::thread::Builder::new().name(format!("reconq-{}-drain", handle.name())).spawn(move || {
            let mut stopping = drainer.stop_with(on_signal::first(stop_timeout));
            let report = loop {
                if let Some(report) = stopping.wait(Duration::MAX) {
                    break report;
                }
            };
            let _ = drained_tx.send(report);
        })?;
        select! {
            recv(drained) -> report => {
                if let Ok(report) = report
                    && !report.finished
                {
                    logs::signal_stop_timeout_passed(handle.name(), &report.unfinished);
                }
            }
            recv(subscription.signals) -> _ => stop_at_once(&handle),
        }
        Ok(())
    }
}

/// The second signal: stops at once and waits a moment for the cancelled
/// reconciles.
fn stop_at_once<K: ControllerKey>(handle: &ControllerHandle<K>) {
    let until = on_signal::second(handle);
    let returned = handle.wait_stopped(Some(until.saturating_duration_since(Instant::now())));
    logs::second_signal(handle.name(), returned);
}
