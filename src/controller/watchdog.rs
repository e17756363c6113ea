//! The watchdog thread's timer, for hang reports and per-reconcile
//! timeouts (`hangs` looks at the running reconciles; this module knows
//! only when to look again).
//!
//! Reports are computed on demand from the workers' slots. The watchdog
//! thread exists to log each hang once even if nobody asks, and to cancel
//! each reconcile at its timeout: it sleeps on a condvar until the earliest
//! moment a running reconcile crosses the threshold or its timeout, and
//! with nothing running it sleeps untimed. One thread for every worker: no
//! thread or timer per reconcile, and no wake-up while nothing runs (G8).
//!
//! When must a worker starting a reconcile wake it? A new reconcile's first
//! deadline is its start plus the shorter of the two durations. A timed
//! sleep until no later than "scan time + that duration" is never cut short
//! by a new reconcile, so the watchdog marks itself `idle` (kick me) exactly
//! when it sleeps untimed or longer than that.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::sync::{AtomicBool, Condvar, Mutex};

pub(crate) struct Watchdog {
    /// The hanging threshold, if hangs are reported.
    threshold: Option<Duration>,
    /// The per-reconcile timeout, if any.
    timeout: Option<Duration>,
    state: Mutex<State>,
    cv: Condvar,
    /// The watchdog sleeps untimed, or past a new reconcile's first
    /// deadline: a worker starting a reconcile must wake it.
    idle: AtomicBool,
    real_time: bool,
    /// A fake clock's wake-up callback (see `Clock::subscribe`).
    _subscription: Option<Arc<dyn Fn() + Send + Sync>>,
}

#[derive(Default)]
struct State {
    kicked: bool,
    shutdown: bool,
}

impl Watchdog {
    /// A watchdog for `threshold`; with a fake clock it subscribes to time
    /// jumps so it re-checks when the clock moves.
    pub(crate) fn new(threshold: Option<Duration>, timeout: Option<Duration>, clock: &Arc<dyn Clock>) -> Arc<Self> {
        Arc::new_cyclic(|weak: &Weak<Self>| {
            let subscription = (!clock.is_real_time()).then(|| {
                let weak = weak.clone();
                let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    if let Some(w) = weak.upgrade() {
                        w.kick();
                    }
                });
                clock.subscribe(Arc::downgrade(&wake));
                wake
            });
            Self {
                threshold,
                timeout,
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                idle: AtomicBool::new(false),
                real_time: clock.is_real_time(),
                _subscription: subscription,
            }
        })
    }

    /// The shorter of the threshold and the timeout: how soon after it
    /// starts a reconcile may need the watchdog.
    fn shortest(&self) -> Duration {
        match (self.threshold, self.timeout) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(Duration::MAX),
        }
    }

    fn kick(&self) {
        let mut g = self.state.lock();
        g.kicked = true;
        self.cv.notify_one();
    }

    /// Called by a worker after registering a reconcile.
    pub(crate) fn kick_if_idle(&self) {
        if self.idle.load(Ordering::SeqCst) {
            self.kick();
        }
    }

    pub(crate) fn shut_down(&self) {
        let mut g = self.state.lock();
        g.shutdown = true;
        self.cv.notify_one();
    }

    /// Runs until shut down. `scan(threshold, timeout)` looks at the
    /// running reconciles (reporting hangs, cancelling those past their
    /// timeout) and says when the next one needs looking at, with the time
    /// it read.
    pub(crate) fn run(&self, mut scan: impl FnMut(Option<Duration>, Option<Duration>) -> (Option<Instant>, Instant)) {
        loop {
            // Idle before scanning: a reconcile registered after the scan
            // sees the flag and kicks us.
            self.idle.store(true, Ordering::SeqCst);
            let (next, now) = scan(self.threshold, self.timeout);
            if next.is_some_and(|next| next <= now + self.shortest()) {
                self.idle.store(false, Ordering::SeqCst);
            }
            let mut g = self.state.lock();
            if g.shutdown {
                return;
            }
            if g.kicked {
                g.kicked = false;
                continue;
            }
            match next {
                Some(at) if self.real_time => {
                    self.cv.wait_until(&mut g, at);
                }
                _ => self.cv.wait(&mut g),
            }
            g.kicked = false;
            if g.shutdown {
                return;
            }
        }
    }
}
