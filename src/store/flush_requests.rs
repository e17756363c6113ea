//! Waiting for a flush (`flush()` on a controller): a caller takes a
//! ticket and wakes the flusher; the flusher answers every ticket taken
//! before it took the keys it writes, with that write's outcome.
//!
//! Invariant (what makes `flush()` mean "everything changed before the
//! call is on disk"): the flusher reads the newest ticket *before* it
//! takes every mark (`DirtySet::take`), so a write answers ticket `t` only
//! if its take began after `t` was asked, hence after every mark the
//! caller made before asking (see `dirty`'s invariant). Callers that ask
//! while one write runs share the next one.
//!
//! Nothing here is on the enqueue or reconcile path: a controller whose
//! users never flush pays nothing for it (W6). Whatever thread writes a
//! file's rows answers its tickets, so a cache whose rows that same
//! flusher writes can hand out tickets from the same `FlushRequests`.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::StoreError;

#[derive(Default)]
pub(crate) struct FlushRequests {
    state: Mutex<State>,
    answered: Condvar,
}

#[derive(Default)]
struct State {
    /// The newest ticket handed out (0: none yet).
    asked: u64,
    /// Every ticket up to this one has its answer.
    answered: u64,
    /// Every ticket up to this one was answered by a write that succeeded,
    /// or by a later one (which wrote what a failed write left marked):
    /// its changes are on disk.
    written: u64,
    /// The error of the last write that failed, for the tickets above
    /// `written`.
    error: Option<StoreError>,
    /// Set by the final flush at stop, with its outcome: nothing changes
    /// any more, so every later ticket is answered at once, as it was.
    closed: Option<bool>,
}

impl FlushRequests {
    /// A new ticket: its answer covers every change marked before this call.
    pub(crate) fn ask(&self) -> u64 {
        let mut state = self.state.lock();
        state.asked += 1;
        let ticket = state.asked;
        if let Some(succeeded) = state.closed {
            state.answered = ticket;
            if succeeded {
                state.written = ticket;
            }
        }
        ticket
    }

    /// Blocks until `ticket` is answered (`Some`), or `timeout` passed
    /// (`None`; `None` waits without a limit).
    pub(crate) fn wait(&self, ticket: u64, timeout: Option<Duration>) -> Option<Result<(), StoreError>> {
        let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        let mut state = self.state.lock();
        while state.answered < ticket {
            match deadline {
                None => self.answered.wait(&mut state),
                Some(deadline) => {
                    if self.answered.wait_until(&mut state, deadline).timed_out() && state.answered < ticket {
                        return None;
                    }
                }
            }
        }
        if ticket <= state.written {
            return Some(Ok(()));
        }
        let error = state.error.as_ref().expect("a ticket answered above `written` has its write's error");
        Some(Err(error.duplicate()))
    }

    /// For the flusher: the newest ticket not answered yet, if any. Read it
    /// before taking the keys whose write answers it.
    pub(crate) fn unanswered(&self) -> Option<u64> {
        let state = self.state.lock();
        (state.asked > state.answered).then_some(state.asked)
    }

    /// For the flusher: a write taken after ticket `upto` was asked ended
    /// with `outcome`; `last` for the final flush at stop.
    pub(crate) fn answer(&self, upto: u64, outcome: Result<(), StoreError>, last: bool) {
        let succeeded = outcome.is_ok();
        let mut state = self.state.lock();
        state.answered = state.answered.max(upto);
        match outcome {
            Ok(()) => state.written = state.written.max(upto),
            Err(error) => state.error = Some(error),
        }
        if last {
            // Tickets asked since the final take are answered by it too:
            // no change can come after it.
            state.answered = state.asked;
            if succeeded {
                state.written = state.asked;
            }
            state.closed = Some(succeeded);
        }
        drop(state);
        self.answered.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_full() -> StoreError {
        StoreError::Io(std::io::Error::other("disk full"))
    }

    fn answered(requests: &FlushRequests, ticket: u64) -> Option<Result<(), String>> {
        requests.wait(ticket, Some(Duration::ZERO)).map(|outcome| outcome.map_err(|e| e.to_string()))
    }

    #[test]
    fn a_write_answers_the_tickets_asked_before_its_take_only() {
        let requests = FlushRequests::default();
        let (first, second) = (requests.ask(), requests.ask());
        let upto = requests.unanswered().unwrap();
        let late = requests.ask();
        requests.answer(upto, Ok(()), false);
        assert_eq!((answered(&requests, first), answered(&requests, second)), (Some(Ok(())), Some(Ok(()))));
        assert_eq!(answered(&requests, late), None, "asked after the take: the next write answers it");
        assert_eq!(requests.unanswered(), Some(late));
    }

    #[test]
    fn a_failed_write_answers_with_its_error_until_a_later_write_succeeds() {
        let requests = FlushRequests::default();
        let failed = requests.ask();
        requests.answer(requests.unanswered().unwrap(), Err(disk_full()), false);
        assert_eq!(answered(&requests, failed), Some(Err("store I/O error: disk full".into())));
        let next = requests.ask();
        requests.answer(requests.unanswered().unwrap(), Ok(()), false);
        // The later write had the failed keys (marked again): all written.
        assert_eq!((answered(&requests, failed), answered(&requests, next)), (Some(Ok(())), Some(Ok(()))));
    }

    #[test]
    fn after_the_final_flush_every_ticket_gets_its_outcome_at_once() {
        let requests = FlushRequests::default();
        let before = requests.ask();
        requests.answer(0, Err(disk_full()), true);
        assert!(matches!(answered(&requests, before), Some(Err(_))));
        assert!(matches!(answered(&requests, requests.ask()), Some(Err(_))));
        let clean = FlushRequests::default();
        clean.answer(0, Ok(()), true);
        assert_eq!(answered(&clean, clean.ask()), Some(Ok(())));
    }
}
