//! Soak: a `Controller` under continuous mixed load for minutes, reporting
//! throughput and memory over time, then checking that nothing was lost,
//! nothing ran twice at once, and memory came back.
//!
//! ```text
//! RECONQ_SOAK_SECS=300 cargo test --release --test soak -- --nocapture
//! ```
//!
//! Without `RECONQ_SOAK_SECS` it runs a short version (about 3 s of load, on
//! 50,000 distinct keys) so CI exercises the same code and checks. Other
//! knobs: `RECONQ_SOAK_DISTINCT` (distinct keys that must pass through after
//! the baseline; default 1,000,000 in soak mode), `RECONQ_SOAK_EVERY`
//! (seconds between report lines; default 10, 1 in the short version).
//!
//! The load: 8 producers and 8 workers. Each producer enqueues keys from a
//! fixed set of 10,000 hot keys (each enqueue bumps the key's version first)
//! and, every other operation, a fresh distinct key from a stream that never
//! repeats. Reconciles fail, panic, requeue, requeue after a delay, ask for a
//! retry after a delay or fail permanently, by a hash of the key and attempt
//! (a key's third retry always succeeds), so every per-key structure of the
//! controller (queue slots, delay heap, limiter memory, attempts, parked set)
//! fills and empties. Producers hold the backlog under 50,000 ready keys.
//!
//! Checks at the end:
//! * no reconcile of a key started while another of the same key ran (G2);
//! * no lost update (G3): once idle, every hot key's last reconcile saw its
//!   final version, and every distinct key reached a final result;
//! * memory: resident memory measured once the controller is idle and
//!   glibc has trimmed its free lists (`malloc_trim`), after a warm-up that
//!   already streamed distinct keys (so the baseline includes the engine's
//!   steady-state high-water marks and the allocator's arenas, not an empty
//!   process), and again after at least the distinct-key target passed
//!   through, must be within 10% of each other. The soak's own bookkeeping
//!   (6.2 MiB) is preallocated before the baseline and never grows. The
//!   heap, counted exactly by a counting global allocator (bytes allocated
//!   and not freed), must be back within 10% too: that is the leak check,
//!   independent of the allocator.
//!
//! The allocator: with glibc's default *dynamic* mmap threshold, freeing a
//! large block (a hash table outgrown by the backlog) raises the threshold,
//! and with it the trim threshold (up to 64 MiB), so later large blocks come
//! from the per-thread arenas and the memory they free stays in each arena's
//! top chunk, which `malloc_trim` does not release outside the main arena.
//! RSS then ratchets up to the allocator's high-water mark (about 50-60 MiB
//! here, against a heap of under 7 MiB) while the heap returns exactly. The
//! soak therefore fixes the threshold at glibc's initial 128 KiB
//! (`mallopt(M_MMAP_THRESHOLD)`, what `MALLOC_MMAP_THRESHOLD_=131072` does
//! for any program), which turns the dynamic rule off.
//! `RECONQ_SOAK_GLIBC_DEFAULTS=1` keeps glibc's defaults: the RSS figures are
//! then printed but only the heap is checked.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

use reconq::{Action, Context, Controller, ControllerHandle, ExponentialBackoff, ReconcileError};

/// Counts the bytes the process has allocated and not freed, so the report
/// can tell memory the program holds from memory the allocator keeps.
struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as u64, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as u64, Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as u64, Relaxed);
        LIVE.fetch_sub(layout.size() as u64, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PRODUCERS: usize = 8;
const WORKERS: usize = 8;
const HOT_KEYS: u64 = 10_000;
/// Distinct keys are `DISTINCT_BASE + id`, id counting up from 0.
const DISTINCT_BASE: u64 = 1 << 40;
/// Tracking slots for distinct keys in flight (id % RING); a slot is reused
/// only once its previous key reached a final result.
const RING: u64 = 1 << 18;
const MAX_BACKLOG: usize = 50_000;
/// A distinct key not final this long after it was issued is lost.
const PATIENCE: Duration = Duration::from_secs(60);

/// Per-key bookkeeping, preallocated.
#[derive(Default)]
struct Track {
    /// Bumped before each enqueue.
    version: AtomicU32,
    /// The version the last reconcile to start saw.
    seen: AtomicU32,
    busy: AtomicBool,
    /// Reconciles started.
    runs: AtomicU32,
    /// Distinct keys: the id using this slot (u64::MAX: none yet).
    owner: AtomicU64,
    /// Distinct keys: its last reconcile succeeded or failed permanently.
    settled: AtomicBool,
}

struct Book {
    hot: Vec<Track>,
    ring: Vec<Track>,
    overlaps: AtomicU64,
    /// Reconciles of a distinct key after it settled (or of a retired one).
    stray: AtomicU64,
    /// Distinct keys that never settled (found when their slot was needed).
    lost: AtomicU64,
    next_distinct: AtomicU64,
    enqueues: AtomicU64,
}

impl Book {
    fn new() -> Self {
        let slots = |n: u64| {
            (0..n)
                .map(|_| {
                    let t = Track::default();
                    t.owner.store(u64::MAX, SeqCst);
                    t
                })
                .collect::<Vec<_>>()
        };
        Self {
            hot: slots(HOT_KEYS),
            ring: slots(RING),
            overlaps: AtomicU64::new(0),
            stray: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            next_distinct: AtomicU64::new(0),
            enqueues: AtomicU64::new(0),
        }
    }

    fn bytes(&self) -> u64 {
        ((self.hot.capacity() + self.ring.capacity()) * std::mem::size_of::<Track>()) as u64
    }

    fn track(&self, key: u64) -> (&Track, Option<u64>) {
        if key < DISTINCT_BASE {
            (&self.hot[key as usize], None)
        } else {
            let id = key - DISTINCT_BASE;
            (&self.ring[(id % RING) as usize], Some(id))
        }
    }
}

/// What a reconcile does, by a hash of the key, its attempt and how many
/// times this key's slot has been reconciled.
fn reconcile(book: &Book, key: &u64, ctx: &Context) -> Result<Action, ReconcileError> {
    let (track, distinct) = book.track(*key);
    if let Some(id) = distinct
        && (track.owner.load(SeqCst) != id || track.settled.load(SeqCst))
    {
        book.stray.fetch_add(1, SeqCst);
    }
    if track.busy.swap(true, SeqCst) {
        book.overlaps.fetch_add(1, SeqCst);
    }
    let seen = track.version.load(SeqCst);
    track.seen.store(seen, SeqCst);
    // `RequeueAfter` resets the attempt count: without the run count, a key
    // that rolled it once would roll it forever.
    let runs = track.runs.fetch_add(1, SeqCst);
    let roll = foldhash::fast::FixedState::with_seed(7).hash_one((key, ctx.attempt(), runs)) % 1000;
    let result = if ctx.attempt() >= 3 {
        Ok(Action::Done)
    } else {
        match roll {
            0..700 => Ok(Action::Done),
            700..800 => Err(ReconcileError::new("transient")),
            800..860 => Ok(Action::Requeue),
            860..920 => Ok(Action::RequeueAfter(Duration::from_micros(roll * 2))),
            920..970 => Err(ReconcileError::retry_after(Duration::from_micros(500), "later")),
            970..990 => Err(ReconcileError::permanent("bad input")),
            _ => {
                track.busy.store(false, SeqCst);
                panic!("reconcile panicked");
            }
        }
    };
    track.busy.store(false, SeqCst);
    let settles = matches!(result, Ok(Action::Done)) || result.as_ref().is_err_and(|e| e.is_permanent());
    if distinct.is_some() && settles {
        track.settled.store(true, SeqCst);
    }
    result
}

fn enqueue_hot(book: &Book, handle: &ControllerHandle<u64>, key: u64) {
    book.hot[key as usize].version.fetch_add(1, SeqCst);
    handle.enqueue(key);
    book.enqueues.fetch_add(1, SeqCst);
}

/// Issues the next distinct key, first waiting for the previous user of its
/// tracking slot to settle.
fn enqueue_distinct(book: &Book, handle: &ControllerHandle<u64>, stop: &AtomicBool) {
    let id = book.next_distinct.fetch_add(1, SeqCst);
    let track = &book.ring[(id % RING) as usize];
    let since = Instant::now();
    while track.owner.load(SeqCst) != u64::MAX && !track.settled.load(SeqCst) {
        if stop.load(SeqCst) {
            return; // the phase is over; this id is never issued
        }
        if since.elapsed() > PATIENCE {
            book.lost.fetch_add(1, SeqCst);
            stop.store(true, SeqCst);
            return;
        }
        thread::sleep(Duration::from_micros(100));
    }
    track.settled.store(false, SeqCst);
    track.seen.store(0, SeqCst);
    track.runs.store(0, SeqCst);
    track.version.store(1, SeqCst);
    track.owner.store(id, SeqCst);
    handle.enqueue(DISTINCT_BASE + id);
    book.enqueues.fetch_add(1, SeqCst);
}

/// Runs the producers until `until` says stop (checked every 256 ops).
fn produce(book: &Arc<Book>, handle: &ControllerHandle<u64>, stop: &Arc<AtomicBool>) -> Vec<thread::JoinHandle<()>> {
    (0..PRODUCERS)
        .map(|p| {
            let (book, handle, stop) = (Arc::clone(book), handle.clone(), Arc::clone(stop));
            thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ p as u64;
                while !stop.load(SeqCst) {
                    for i in 0..256 {
                        if i % 2 == 0 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            enqueue_hot(&book, &handle, x % HOT_KEYS);
                        } else {
                            enqueue_distinct(&book, &handle, &stop);
                        }
                    }
                    while handle.stats().depth > MAX_BACKLOG && !stop.load(SeqCst) {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect()
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("statm RSS field");
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// RSS once glibc has returned its free memory to the OS.
fn trimmed_rss() -> u64 {
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    rss_bytes()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// One phase of load: producers run until `secs` have passed and at least
/// `distinct` more distinct keys were issued, printing a line every `every`.
fn load_phase(
    book: &Arc<Book>,
    handle: &ControllerHandle<u64>,
    secs: f64,
    distinct: u64,
    every: Duration,
    t0: Instant,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let first_id = book.next_distinct.load(SeqCst);
    let producers = produce(book, handle, &stop);
    let started = Instant::now();
    let mut last = (Instant::now(), handle.stats().reconciles, book.enqueues.load(SeqCst));
    loop {
        thread::sleep(
            every.min(Duration::from_secs_f64(secs).saturating_sub(started.elapsed())).max(Duration::from_millis(50)),
        );
        let now = Instant::now();
        let stats = handle.stats();
        let enqueues = book.enqueues.load(SeqCst);
        let issued = book.next_distinct.load(SeqCst);
        let dt = (now - last.0).as_secs_f64();
        println!(
            "{:7.1} {:>12.0} {:>11.0} {:>8.1} {:>8.1} {:>7} {:>7} {:>6} {:>7} {:>11}",
            (now - t0).as_secs_f64(),
            (stats.reconciles - last.1) as f64 / dt,
            (enqueues - last.2) as f64 / dt,
            mib(rss_bytes()),
            mib(LIVE.load(Relaxed)),
            threads(),
            stats.depth,
            stats.processing,
            stats.waiting,
            issued,
        );
        last = (now, stats.reconciles, enqueues);
        let done = started.elapsed().as_secs_f64() >= secs && issued - first_id >= distinct;
        if done || stop.load(SeqCst) {
            break;
        }
    }
    stop.store(true, SeqCst);
    for p in producers {
        p.join().unwrap();
    }
}

#[test]
fn soak() {
    let soak_secs = env_u64("RECONQ_SOAK_SECS");
    let (secs, distinct, every) = match soak_secs {
        Some(secs) => (
            secs as f64,
            env_u64("RECONQ_SOAK_DISTINCT").unwrap_or(1_000_000),
            env_u64("RECONQ_SOAK_EVERY").unwrap_or(10),
        ),
        None => (3.0, env_u64("RECONQ_SOAK_DISTINCT").unwrap_or(50_000), env_u64("RECONQ_SOAK_EVERY").unwrap_or(1)),
    };
    let every = Duration::from_secs(every);
    let warmup = (secs / 10.0).clamp(1.0, 30.0);
    let glibc_defaults = std::env::var_os("RECONQ_SOAK_GLIBC_DEFAULTS").is_some();
    if !glibc_defaults {
        // A fixed mmap threshold (glibc's own initial value) instead of the
        // dynamic one: see the module docs.
        // SAFETY: mallopt has no preconditions; called before any thread.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
    }
    // Panics are part of the load; keep their messages off the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"reconcile panicked") {
            default_hook(info);
        }
    }));

    let book = Arc::new(Book::new());
    let b = Arc::clone(&book);
    let handle = Controller::new("soak", move |key: &u64, ctx: &Context| reconcile(&b, key, ctx))
        .workers(WORKERS)
        .rate_limiter(ExponentialBackoff::new(Duration::from_millis(1), Duration::from_millis(50)))
        .start();
    let t0 = Instant::now();
    println!(
        "soak: {secs:.0} s (+{warmup:.0} s warm-up), {PRODUCERS} producers x {WORKERS} workers, {HOT_KEYS} hot keys + \
         >= {distinct} distinct keys; bookkeeping {:.1} MiB preallocated",
        mib(book.bytes())
    );
    println!(
        "{:>7} {:>12} {:>11} {:>8} {:>8} {:>7} {:>7} {:>6} {:>7} {:>11}",
        "t", "reconciles/s", "enqueues/s", "RSS MiB", "heap MiB", "threads", "depth", "proc", "waiting", "distinct"
    );

    load_phase(&book, &handle, warmup, 0, every, t0);
    assert!(handle.wait_idle(Duration::from_secs(120)), "not idle after the warm-up");
    let rss_before = trimmed_rss();
    let distinct_before = book.next_distinct.load(SeqCst);
    let stats_before = handle.stats();
    let heap_before = LIVE.load(Relaxed);
    println!(
        "--- baseline after warm-up (idle, trimmed): RSS {:.1} MiB, heap {:.1} MiB, {distinct_before} distinct keys so far",
        mib(rss_before),
        mib(heap_before)
    );

    load_phase(&book, &handle, secs, distinct, every, t0);
    let idle = handle.wait_idle(Duration::from_secs(120));
    let rss_untrimmed = rss_bytes();
    let rss_after = trimmed_rss();
    let heap_after = LIVE.load(Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    let stats = handle.stats();
    let distinct_after = book.next_distinct.load(SeqCst);

    // Lost updates: every hot key's last reconcile saw its last version,
    // every distinct key settled.
    let lost_hot = book.hot.iter().filter(|t| t.seen.load(SeqCst) != t.version.load(SeqCst)).count();
    let unsettled = book
        .ring
        .iter()
        .filter(|t| t.owner.load(SeqCst) != u64::MAX && (!t.settled.load(SeqCst) || t.seen.load(SeqCst) != 1))
        .count();
    let lost = lost_hot as u64 + unsettled as u64 + book.lost.load(SeqCst);
    let overlaps = book.overlaps.load(SeqCst);
    let stray = book.stray.load(SeqCst);
    assert!(handle.stop_with_drain(Duration::from_secs(60)), "workers did not finish");

    let growth = |after: u64, before: u64| after as f64 / before as f64 - 1.0;
    let (rss_change, heap_change) = (growth(rss_after, rss_before), growth(heap_after, heap_before));
    let bookkeeping = book.bytes();
    println!("--- summary ---");
    println!(
        "elapsed {elapsed:.1} s; enqueues {}; distinct keys {distinct_after} ({} after the baseline); reconciles {} \
         ({:.0}/s over the whole run, {} after the baseline): successes {}, failures {} (panics {}), requeues {}, \
         parked at end {}",
        book.enqueues.load(SeqCst),
        distinct_after - distinct_before,
        stats.reconciles,
        stats.reconciles as f64 / elapsed,
        stats.reconciles - stats_before.reconciles,
        stats.successes,
        stats.failures,
        stats.panics,
        stats.requeues,
        stats.parked,
    );
    println!(
        "RSS (idle, trimmed) before {:.1} MiB, after {:.1} MiB ({:+.1}%; {:.1} MiB untrimmed); of which the soak's own \
         preallocated bookkeeping {:.1} MiB",
        mib(rss_before),
        mib(rss_after),
        rss_change * 100.0,
        mib(rss_untrimmed),
        mib(bookkeeping),
    );
    println!(
        "heap (bytes allocated and not freed) before {:.2} MiB, after {:.2} MiB ({:+.1}%)",
        mib(heap_before),
        mib(heap_after),
        heap_change * 100.0
    );
    println!(
        "idle at end: {idle}; lost updates: {lost} (hot {lost_hot}, distinct unsettled {unsettled}, given up {}); \
         concurrent reconciles of a key: {overlaps}; reconciles of settled distinct keys: {stray}",
        book.lost.load(SeqCst)
    );
    assert!(idle, "the controller never went idle");
    assert_eq!(overlaps, 0, "a key was reconciled by two workers at once (G2)");
    assert_eq!(lost, 0, "updates were lost (G3)");
    assert_eq!(stray, 0, "a settled distinct key was reconciled again");
    assert!(distinct_after - distinct_before >= distinct, "fewer distinct keys than asked for");
    assert!(heap_change <= 0.10, "the heap grew by {:.1}% over the distinct keys", heap_change * 100.0);
    if glibc_defaults {
        println!("glibc's default (dynamic) thresholds: the RSS criterion is reported, not checked");
    } else {
        assert!(rss_change <= 0.10, "RSS grew by {:.1}% (more than 10%) over the distinct keys", rss_change * 100.0);
    }
}
