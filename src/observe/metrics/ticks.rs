//! The clock metrics measure durations on: the CPU's time-stamp counter,
//! read raw (one `rdtsc`, about 12 ns on the project's VM against 33 ns for
//! `Instant::now`) and converted to seconds only at scrape time, with the
//! calibration `quanta` makes against the OS clock.
//!
//! Where the counter is not usable (no invariant TSC, or another
//! architecture) the stamps come from `quanta`'s raw clock, which then is
//! the OS monotonic clock in nanoseconds.
//!
//! Durations are real time whatever clock a queue or controller schedules
//! on: a `FakeClock` moves due times, not these stamps.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

struct TickClock {
    clock: quanta::Clock,
    /// Seconds per raw tick.
    seconds_per_tick: f64,
}

static CLOCK: OnceLock<TickClock> = OnceLock::new();

/// Set once `quanta` is known to read the same counter as `rdtsc`, so
/// [`now`] can read it inline.
static RDTSC: AtomicBool = AtomicBool::new(false);

fn clock() -> &'static TickClock {
    CLOCK.get_or_init(|| {
        // Calibrates the counter against the OS clock once per process (a
        // millisecond or so; quanta caps it at 200 ms).
        let clock = quanta::Clock::new();
        const SPAN: u64 = 1 << 40;
        let seconds_per_tick = clock.delta_as_nanos(0, SPAN) as f64 / SPAN as f64 / 1e9;
        RDTSC.store(reads_tsc(&clock), Relaxed);
        TickClock { clock, seconds_per_tick }
    })
}

/// Whether `clock.raw()` is the time-stamp counter: a reading taken between
/// two `rdtsc`s falls between them (a nanosecond clock would not).
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn reads_tsc(clock: &quanta::Clock) -> bool {
    (0..3).any(|_| {
        // SAFETY: `rdtsc` exists on every x86_64 CPU with SSE2.
        let before = unsafe { core::arch::x86_64::_rdtsc() };
        let raw = clock.raw();
        let after = unsafe { core::arch::x86_64::_rdtsc() };
        before <= raw && raw <= after
    })
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn reads_tsc(_clock: &quanta::Clock) -> bool {
    false
}

/// Calibrates the clock now, so the first measurement does not pay for it.
pub(crate) fn init() {
    clock();
}

/// The current raw tick count, at most [`MAX_STAMP`]. Call [`init`] first
/// (a named queue and a controller do when built); before it, stamps come
/// from the slower path.
#[inline(always)]
pub(crate) fn now() -> u64 {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    if RDTSC.load(Relaxed) {
        // SAFETY: as in `reads_tsc`.
        return unsafe { core::arch::x86_64::_rdtsc() }.min(MAX_STAMP);
    }
    slow_now()
}

#[inline(never)]
fn slow_now() -> u64 {
    clock().clock.raw().min(MAX_STAMP)
}

/// The largest stamp: the top bit is never set (a counter would need a
/// century of uptime to reach it), so it can tag values that are no stamp.
pub(crate) const MAX_STAMP: u64 = (1 << 63) - 1;

/// `ticks` as seconds.
pub(crate) fn to_seconds(ticks: u128) -> f64 {
    ticks as f64 * clock().seconds_per_tick
}

/// The tick count nearest to `seconds` (saturating).
pub(crate) fn from_seconds(seconds: f64) -> u64 {
    (seconds / clock().seconds_per_tick) as u64
}

/// Ticks from `start` to `end`; 0 if the counter appears to have gone back
/// (counters of different cores may disagree by a few ticks).
#[inline(always)]
pub(crate) fn since(start: u64, end: u64) -> u64 {
    end.saturating_sub(start)
}

/// The real time since the stamp `start` (for turning a stored stamp into
/// a clock's time when someone asks for it).
pub(crate) fn elapsed_since(start: u64) -> Duration {
    Duration::from_secs_f64(to_seconds(u128::from(since(start, now()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn ticks_convert_to_real_seconds() {
        init();
        let (t0, i0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, i1) = (now(), Instant::now());
        let measured = to_seconds(u128::from(since(t0, t1)));
        let real = (i1 - i0).as_secs_f64();
        assert!((measured - real).abs() < real * 0.05 + 0.001, "ticks say {measured} s, Instant says {real} s");
        let ticks = from_seconds(0.5);
        assert!((to_seconds(u128::from(ticks)) - 0.5).abs() < 1e-6);
        // The inline path and quanta's agree.
        let (a, b, c) = (now(), slow_now(), now());
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }
}
