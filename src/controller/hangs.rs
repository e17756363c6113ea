//! Hang reports (which reconciles have run longer than the configured
//! threshold) and per-reconcile timeouts (cancel a reconcile at its
//! deadline), read from the workers' slots: on demand (`hanging`, stats,
//! status) and by the watchdog thread (`watchdog`), which calls [`watch`].

use std::fmt;
use std::time::{Duration, Instant};

use super::core::{ControllerKey, Core, Runtime};
use crate::logs;

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

/// One look of the watchdog thread at `core`'s running reconciles: logs the
/// new hangs, cancels those past `timeout`; when to look again, and the
/// time read.
pub(crate) fn watch<K: ControllerKey>(
    core: &Core<K>,
    rt: &Runtime<K>,
    threshold: Option<Duration>,
    timeout: Option<Duration>,
) -> (Option<Instant>, Instant) {
    let found = scan(rt, threshold, timeout);
    log_hangs(&core.name, &found.newly);
    (found.next, found.now)
}
