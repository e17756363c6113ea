//! 8 producers × 8 workers over 10,000 keys through the full `Controller`,
//! checking the two guarantees users depend on most:
//!
//! * G2: a key is never reconciled by two workers at once (a per-key
//!   in-flight flag that must be clear whenever a reconcile starts);
//! * G3: no update is lost: each producer bumps the key's version *before*
//!   enqueueing it, and each reconcile records the version it saw when it
//!   started; once idle, every key's last reconcile saw its final version.
//!
//! CI runs 200,000 operations; `RECONQ_STRESS_OPS=1000000` runs the full
//! size of the reliability issue.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;
use std::time::Duration;

use reconq::{Action, Context, Controller, ReconcileError};

const KEYS: usize = 10_000;
const PRODUCERS: usize = 8;
const WORKERS: usize = 8;

struct Keys {
    version: Vec<AtomicU64>,
    seen: Vec<AtomicU64>,
    in_flight: Vec<AtomicBool>,
    overlaps: AtomicU64,
}

fn ops() -> usize {
    std::env::var("RECONQ_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

#[test]
fn no_lost_update_and_no_concurrent_reconcile_of_a_key() {
    let keys = Arc::new(Keys {
        version: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        seen: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
        in_flight: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
        overlaps: AtomicU64::new(0),
    });
    let k = Arc::clone(&keys);
    let reconcile = move |key: &usize, _ctx: &Context| -> Result<Action, ReconcileError> {
        if k.in_flight[*key].swap(true, SeqCst) {
            k.overlaps.fetch_add(1, SeqCst);
        }
        k.seen[*key].store(k.version[*key].load(SeqCst), SeqCst);
        k.in_flight[*key].store(false, SeqCst);
        Ok(Action::Done)
    };
    let handle = Controller::new("stress", reconcile).workers(WORKERS).start();

    let per_producer = ops() / PRODUCERS;
    thread::scope(|s| {
        for p in 0..PRODUCERS {
            let (handle, keys) = (&handle, &keys);
            s.spawn(move || {
                // A different stride per producer spreads them over the keys.
                let stride = 2 * p + 1;
                for i in 0..per_producer {
                    let key = (i * stride + p) % KEYS;
                    keys.version[key].fetch_add(1, SeqCst);
                    handle.enqueue(key);
                }
            });
        }
    });

    assert!(handle.wait_idle(Duration::from_secs(120)), "the controller never went idle");
    assert_eq!(keys.overlaps.load(SeqCst), 0, "a key was reconciled by two workers at once (G2)");
    let lost: Vec<usize> =
        (0..KEYS).filter(|&key| keys.seen[key].load(SeqCst) != keys.version[key].load(SeqCst)).collect();
    assert!(
        lost.is_empty(),
        "{} keys' last updates were never reconciled (G3), e.g. {:?}",
        lost.len(),
        &lost[..5.min(lost.len())]
    );
    let stats = handle.stats();
    assert_eq!(stats.failures, 0);
    assert!(stats.reconciles as usize <= per_producer * PRODUCERS, "dedup never adds reconciles");
    assert!(handle.stop_with_drain(common::PATIENCE));
}
