//! Hang reports (which reconciles have run longer than the configured
//! threshold) and per-reconcile timeouts (cancel a reconcile at its
//! deadline).
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

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::core::{ControllerKey, Core, Runtime};
use crate::clock::Clock;
use crate::logs;
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

/// The reconciles past the threshold, those not logged yet, and when the
/// next running one will cross the threshold or its timeout.
pub(crate) struct Scan<K> {
    pub(crate) hanging: Vec<(K, Duration)>,
    pub(crate) newly: Vec<(K, Duration)>,
    pub(crate) next: Option<Instant>,
    pub(crate) now: Instant,
}

/// Reads every worker slot; marks the hangs it returns in `newly` as
/// logged, and cancels the reconciles past `timeout` (marking them timed
/// out, which the worker counts as a failure when they return).
pub(crate) fn scan<K: ControllerKey>(
    rt: &Runtime<K>,
    threshold: Option<Duration>,
    timeout: Option<Duration>,
) -> Scan<K> {
    let now = rt.clock.now();
    let mut out = Scan { hanging: Vec::new(), newly: Vec::new(), next: None, now };
    let mut next: Option<Instant> = None;
    let mut wake_at = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
    for slot in &rt.slots {
        let mut running = slot.running.lock();
        let Some(run) = running.as_mut() else {
            continue;
        };
        let since = run.started.at(now);
        let elapsed = now.saturating_duration_since(since);
        if let Some(timeout) = timeout
            && !run.timed_out
        {
            if elapsed >= timeout {
                // Under the slot lock, as `cancel` does.
                run.timed_out = true;
                slot.signal.set();
            } else {
                wake_at(since + timeout);
            }
        }
        let Some(threshold) = threshold else { continue };
        if elapsed > threshold {
            out.hanging.push((run.key.clone(), elapsed));
            if !run.hang_logged {
                run.hang_logged = true;
                out.newly.push((run.key.clone(), elapsed));
            }
        } else {
            wake_at(since + threshold);
        }
    }
    out.next = next;
    out.hanging.sort_by_key(|h| std::cmp::Reverse(h.1));
    out
}

/// Logs each newly detected hang (call with no lock held).
pub(crate) fn log_hangs<K: fmt::Debug>(name: &str, newly: &[(K, Duration)]) {
    for (key, elapsed) in newly {
        logs::reconcile_hanging(name, key, *elapsed);
    }
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

    pub(crate) fn run<K: ControllerKey>(&self, core: &Core<K>) {
        let rt = core.rt.get().expect("the watchdog starts after the runtime");
        loop {
            // Idle before scanning: a reconcile registered after the scan
            // sees the flag and kicks us.
            self.idle.store(true, Ordering::SeqCst);
            let found = scan(rt, self.threshold, self.timeout);
            if found.next.is_some_and(|next| next <= found.now + self.shortest()) {
                self.idle.store(false, Ordering::SeqCst);
            }
            log_hangs(&core.name, &found.newly);
            let mut g = self.state.lock();
            if g.shutdown {
                return;
            }
            if g.kicked {
                g.kicked = false;
                continue;
            }
            match found.next {
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
