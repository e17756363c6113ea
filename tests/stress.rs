//! Many producers and workers on a shared key space, checking G2 (never two
//! workers on one key) and G3 (every add is followed by a hand-out that
//! started after it) as invariants, so the result does not depend on timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;

use reconq::WorkQueue;

const PRODUCERS: usize = 8;
const WORKERS: usize = 8;
const KEYS: usize = 1000;
const ADDS_PER_PRODUCER: usize = 40_000;

struct Tracker {
    /// One logical clock orders adds and hand-outs.
    clock: AtomicU64,
    /// Per key: the clock reading taken just before its latest add.
    last_add: Vec<AtomicU64>,
    /// Per key: the clock reading taken just after its latest hand-out.
    last_handout: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    handouts: AtomicU64,
    /// G2 violations, counted rather than panicking so the drain still ends.
    overlaps: AtomicU64,
}

impl Tracker {
    fn new() -> Self {
        let zeros = || (0..KEYS).map(|_| AtomicU64::new(0)).collect();
        Self {
            clock: AtomicU64::new(1),
            last_add: zeros(),
            last_handout: zeros(),
            busy: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            handouts: AtomicU64::new(0),
            overlaps: AtomicU64::new(0),
        }
    }

    fn before_add(&self, k: usize) {
        let t = self.clock.fetch_add(1, SeqCst);
        self.last_add[k].fetch_max(t, SeqCst);
    }

    /// Called as soon as a worker got `k`: it must not be busy elsewhere (G2).
    fn handed_out(&self, k: usize) {
        let t = self.clock.fetch_add(1, SeqCst);
        if self.busy[k].swap(true, SeqCst) {
            self.overlaps.fetch_add(1, SeqCst);
        }
        self.last_handout[k].fetch_max(t, SeqCst);
        self.handouts.fetch_add(1, SeqCst);
    }

    /// Called just before `done(k)`.
    fn finishing(&self, k: usize) {
        self.busy[k].store(false, SeqCst);
    }

    /// G3: for every key added, some hand-out came after its last add.
    fn check_no_lost_update(&self) {
        for k in 0..KEYS {
            let added = self.last_add[k].load(SeqCst);
            let handed = self.last_handout[k].load(SeqCst);
            assert!(added == 0 || handed > added, "G3: key {k} last added at {added}, last handed out at {handed}");
        }
    }
}

/// Runs the producers and `WORKERS` copies of `worker`, then drains.
fn run(worker: fn(&WorkQueue<usize>, &Tracker)) {
    let q = WorkQueue::<usize>::new();
    let tracker = Arc::new(Tracker::new());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (q, t) = (q.clone(), Arc::clone(&tracker));
            thread::spawn(move || worker(&q, &t))
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (q, t) = (q.clone(), Arc::clone(&tracker));
            thread::spawn(move || {
                // A cheap deterministic scramble so producers collide on keys.
                let mut x = (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for _ in 0..ADDS_PER_PRODUCER {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % KEYS as u64) as usize;
                    t.before_add(k);
                    q.add(k);
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    q.shut_down_with_drain();
    for w in workers {
        w.join().expect("a worker panicked (see its assertion above)");
    }
    let overlaps = tracker.overlaps.load(SeqCst);
    assert_eq!(overlaps, 0, "G2: a key was handed to two workers at once {overlaps} times");
    assert_eq!(q.counts(), Default::default());
    tracker.check_no_lost_update();
    let handouts = tracker.handouts.load(SeqCst);
    assert!(handouts >= KEYS as u64, "only {handouts} hand-outs");
}

#[test]
fn stress_get_done_keeps_exclusivity_and_loses_no_update() {
    run(|q, t| {
        while let Some(k) = q.get() {
            t.handed_out(k);
            t.finishing(k);
            q.done(&k);
        }
    });
}

#[test]
fn stress_done_and_get_keeps_exclusivity_and_loses_no_update() {
    run(|q, t| {
        let mut next = q.get();
        while let Some(k) = next {
            t.handed_out(k);
            t.finishing(k);
            next = q.done_and_get(&k);
        }
    });
}
