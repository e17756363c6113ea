//! The Rust surface of the contract (guarantees §2–§3), spelled exactly as the
//! contract writes it. If a name or signature drifts, this file stops
//! compiling; the assertions check the behaviour the contract attaches.

mod common;

use reconq::*;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn glob_import_keeps_std_result() {
    // `use reconq::*` must not shadow `Result` with a one-parameter alias.
    let ok: Result<u8, String> = Ok(1);
    assert_eq!(ok, Ok(1));
}

#[test]
fn queue_surface() {
    let q: WorkQueue<u64> = WorkQueue::new();
    q.add(1);
    q.add_after(2, ms(0));
    q.add_rate_limited(3);
    q.forget(&3);
    assert_eq!(q.num_requeues(&3), 0);
    assert!(!q.is_empty());
    assert_eq!(q.len(), 2, "3 waits for its backoff; 1 and 2 are ready");
    let k = q.get().unwrap();
    q.done(&k);
    assert_eq!(q.get_timeout(ms(10)), Ok(2));
    q.done(&2);
    q.shut_down();
    assert!(q.is_shutting_down());
    assert_eq!(q.get_timeout(ms(10)), Err(GetError::ShutDown));
    assert_eq!(q.get(), None);
    let err: &dyn std::error::Error = &GetError::Timeout;
    assert!(!err.to_string().is_empty());

    let q = WorkQueue::with_rate_limiter(ExponentialBackoff::new(ms(1), ms(10)));
    q.add("a");
    q.shut_down_with_drain();
}

#[test]
fn limiter_surface() {
    let exp = ExponentialBackoff::new(ms(5), Duration::from_secs(1000));
    assert_eq!(RateLimiter::<&str>::when(&exp, &"k"), ms(5));
    let fast_slow = FastSlow::new(ms(5), Duration::from_secs(10), 3);
    assert_eq!(RateLimiter::<&str>::num_requeues(&fast_slow, &"k"), 0);
    let bucket = TokenBucket::new(10.0, 2);
    let waits: Vec<Duration> = (0..4).map(|_| RateLimiter::<&str>::when(&bucket, &"k")).collect();
    assert_eq!(waits[..2], [Duration::ZERO, Duration::ZERO]);
    assert!(waits[2] > ms(90) && waits[2] <= ms(100), "{waits:?}");
    assert!(waits[3] > ms(190) && waits[3] <= ms(200), "{waits:?}");
    let max_of: MaxOf<&str> = MaxOf::new(vec![Box::new(exp), Box::new(fast_slow)]);
    assert_eq!(max_of.when(&"k"), ms(10), "exp has seen k once: 10 ms; fast_slow: 5 ms");
    let capped = WithMaxWait::new(max_of, ms(7));
    assert_eq!(capped.when(&"k"), ms(7));
    capped.forget(&"k");
    assert_eq!(capped.num_requeues(&"k"), 0);
    let default = default_rate_limiter::<u64>();
    assert_eq!(default.when(&1), ms(5));
    let _: WorkQueue<u64> = WorkQueue::with_rate_limiter(default);
}

struct Fails;

impl Reconciler<u64> for Fails {
    fn reconcile(&self, key: &u64, ctx: &Context) -> Result<Action, ReconcileError> {
        if *key == 0 && ctx.attempt() == 0 {
            // `?` on any error gives a plain retryable error.
            "not a number".parse::<u32>()?;
        }
        match key {
            1 => Err(ReconcileError::permanent("bad key")),
            2 if ctx.attempt() == 0 => Err(ReconcileError::retry_after(ms(1), String::from("later"))),
            3 if ctx.attempt() == 0 => Err(ReconcileError::new(std::io::Error::other("io"))),
            _ => Ok(Action::Done),
        }
    }
}

#[test]
fn controller_surface() {
    let handle =
        Controller::new("surface", Fails).workers(4).rate_limiter(ExponentialBackoff::new(ms(1), ms(10))).start();
    let other = handle.clone();
    std::thread::spawn(move || other.enqueue(0)).join().unwrap();
    handle.enqueue(1);
    handle.enqueue_after(2, ms(1));
    handle.enqueue_at(3, Instant::now());
    assert!(handle.wait_idle(Duration::from_secs(20)));
    let stats: Stats = handle.stats();
    let counts: [u64; 4] = [stats.reconciles, stats.successes, stats.failures, stats.requeues];
    assert_eq!(counts, [7, 3, 4, 0]);
    let sizes: [usize; 3] = [stats.depth, stats.processing, stats.waiting];
    assert_eq!(sizes, [0, 0, 0]);
    handle.stop();
    assert!(handle.stop_with_drain(Duration::from_secs(5)));
}

#[test]
fn closure_reconciler_and_run() {
    let controller = Controller::new("closure", |_key: &String, _ctx: &Context| -> Result<Action, std::io::Error> {
        Ok(Action::RequeueAfter(Duration::from_secs(3600)))
    });
    let handle = controller.handle();
    handle.enqueue("k".to_string());
    let stopper = handle.clone();
    let runner = std::thread::spawn(move || controller.run());
    // A resync is a success: the work was done.
    common::wait_for("the reconcile to ask for a resync", || handle.stats().successes == 1);
    assert_eq!(handle.stats().requeues, 0);
    assert_eq!(handle.stats().waiting, 1);
    stopper.stop();
    runner.join().unwrap();
}

/// The cause an error wraps, as `source()` gives it: the `io::Error`'s
/// message, or `None`.
fn cause(error: &dyn std::error::Error) -> Option<String> {
    let source = error.source()?;
    Some(source.downcast_ref::<std::io::Error>().expect("the cause is the io::Error wrapped").to_string())
}

#[test]
fn errors_that_wrap_an_io_error_return_it_from_source() {
    let refused = || std::io::Error::other("resource temporarily unavailable");
    assert_eq!(cause(&StoreError::Io(refused())).as_deref(), Some("resource temporarily unavailable"));
    assert_eq!(cause(&CacheError::Thread(refused())).as_deref(), Some("resource temporarily unavailable"));
    assert_eq!(cause(&WatchError::Thread(refused())).as_deref(), Some("resource temporarily unavailable"));
    // Variants that wrap nothing have no source.
    assert_eq!(cause(&StoreError::Locked("orders".into())), None);
    assert_eq!(cause(&CacheError::Stopped { cache: "pods".into() }), None);
    assert_eq!(cause(&WatchError::StoreMismatch("another file".into())), None);
}

#[test]
fn start_error_chains_to_the_io_error_at_the_bottom() {
    let error = StartError::Store(StoreError::Io(std::io::Error::other("disk full")));
    let store = std::error::Error::source(&error).expect("a start error's source is the store error");
    assert!(store.is::<StoreError>());
    assert_eq!(cause(store).as_deref(), Some("disk full"));
}
