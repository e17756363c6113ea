//! [`Controller::run_until_signal`]: `run()` that stops on Ctrl-C or
//! SIGTERM, with the rules of Python's `Controller.run()` (guarantees §13):
//! the first signal drains, a second one stops at once.

use std::io;
use std::time::Duration;

use crossbeam_channel::{bounded, select};

use super::core::ControllerKey;
use super::{Controller, ControllerHandle};
use crate::logs;
use crate::signals;

/// After a second signal, how long to wait for the cancelled reconciles to
/// return before returning anyway (Python's `run()` waits as long).
const SECOND_SIGNAL_GRACE: Duration = Duration::from_secs(1);

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
            let _ = drained_tx.send(drainer.stop_with_drain_report(stop_timeout.unwrap_or(Duration::MAX)));
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

/// The second signal: cancels the running reconciles and waits a moment
/// for them.
fn stop_at_once<K: ControllerKey>(handle: &ControllerHandle<K>) {
    handle.stop();
    let returned = handle.wait_stopped(Some(SECOND_SIGNAL_GRACE));
    logs::second_signal(handle.name(), returned);
}
