//! Helpers shared by the integration tests (queue and controller). Each
//! test binary uses a subset.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use reconq::{
    Action, Context, Controller, ControllerHandle, ExponentialBackoff, FakeClock, GetError, RateLimiter,
    ReconcileError, Reconciler, WorkQueue,
};

/// Generous bound for anything that must eventually happen: long enough to
/// never fire on a loaded machine, short enough to fail instead of hang.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// User + system CPU time of this process so far.
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A queue on a fake clock (default limiter) and the clock driving it.
pub fn fake_queue<K>() -> (WorkQueue<K>, FakeClock)
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
{
    let clock = FakeClock::new();
    (WorkQueue::builder().clock(clock.clone()).build(), clock)
}

/// A queue on a fake clock with the given limiter.
pub fn fake_queue_with<K, L>(limiter: L) -> (WorkQueue<K>, FakeClock)
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
    L: RateLimiter<K> + 'static,
{
    let clock = FakeClock::new();
    (WorkQueue::builder().clock(clock.clone()).rate_limiter(limiter).build(), clock)
}

/// Runs `f` on a new thread; its result arrives on the returned channel.
pub fn spawn_with_result<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// The value `rx` delivers within [`PATIENCE`], or a panic naming `what`.
pub fn expect_within<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("{what}: nothing within {PATIENCE:?} ({e})"))
}

/// What a `get_timeout(1 s)` on another thread returns from `q`, with
/// `clock` moved on 2 s at a time until the getter's deadline (1 s after
/// whenever it started waiting) has passed.
pub fn get_timeout_on_fake_clock<K>(q: &WorkQueue<K>, clock: &FakeClock) -> Result<K, GetError>
where
    K: Eq + std::hash::Hash + Clone + Send + 'static,
{
    let q = q.clone();
    let rx = spawn_with_result(move || q.get_timeout(secs(1)));
    loop {
        clock.advance(secs(2));
        if let Ok(r) = rx.recv_timeout(ms(20)) {
            return r;
        }
    }
}

/// Polls `cond` until it holds, panicking after [`PATIENCE`].
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    wait_for_within(what, PATIENCE, cond);
}

/// Polls `cond` until it holds, panicking after `patience`.
pub fn wait_for_within(what: &str, patience: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(ms(1));
    }
}

/// Sets the soft limit of `resource` (`libc::RLIMIT_*`) for this whole
/// process to `soft`, capped at the hard limit (`RLIM_INFINITY` lifts it
/// back to the hard limit).
pub fn set_soft_limit(resource: libc::__rlimit_resource_t, soft: libc::rlim_t) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        assert_eq!(libc::getrlimit(resource, &mut limit), 0);
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(resource, &limit), 0);
    }
}

/// Set in a child that [`run_test_in_child`] started: the test it runs.
const TEST_CHILD_ENV: &str = "RECONQ_TEST_CHILD";

/// Runs test `test` of this binary in a child process of its own, with
/// `env` set from its start (what the C library and Rust's runtime read
/// once, such as `MALLOC_ARENA_MAX` and `RUST_MIN_STACK`): in that child,
/// runs `child` and says it returned; here, asserts that the child
/// succeeded and said so (a child that ran no test would succeed too). For
/// a test that sets a process-wide limit, which must reach neither the
/// other tests nor the harness.
pub fn run_test_in_child(test: &str, env: &[(&str, &str)], child: impl FnOnce()) {
    let returned = format!("{test}: the child returned");
    if std::env::var(TEST_CHILD_ENV).as_deref() == Ok(test) {
        child();
        println!("{returned}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(TEST_CHILD_ENV, test)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains(&returned), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// A gate that reconciles wait at until the test lets them through, one
/// [`release`](Self::release) each, in the order they arrived; the test
/// can wait for them to arrive. A reconcile not let through within
/// [`PATIENCE`] panics (the test would otherwise hang).
#[derive(Clone, Default)]
pub struct Gate(Arc<(Mutex<GateCounts>, Condvar)>);

#[derive(Default)]
struct GateCounts {
    arrived: usize,
    released: usize,
}

impl Gate {
    pub fn new() -> Self {
        Self::default()
    }

    /// A reconcile that waits at this gate, then succeeds.
    pub fn reconcile<K>(&self) -> impl Fn(&K, &Context) -> Result<Action, ReconcileError> + Send + Sync + 'static {
        let gate = self.clone();
        move |_key: &K, _: &Context| {
            gate.pass();
            Ok(Action::Done)
        }
    }

    /// Arrives at the gate and returns once let through.
    pub fn pass(&self) {
        let ticket = self.update(|counts| {
            counts.arrived += 1;
            counts.arrived - 1
        });
        self.wait_until("the gate to let a reconcile through", |counts| counts.released > ticket);
    }

    /// Returns once `n` reconciles in all have arrived.
    pub fn wait_arrivals(&self, n: usize) {
        self.wait_until(&format!("{n} reconciles at the gate"), |counts| counts.arrived >= n);
    }

    /// Lets the next reconcile through (now, or when it arrives).
    pub fn release(&self) {
        self.update(|counts| counts.released += 1);
    }

    fn update<T>(&self, change: impl FnOnce(&mut GateCounts) -> T) -> T {
        let (counts, changed) = &*self.0;
        let out = change(&mut counts.lock());
        changed.notify_all();
        out
    }

    fn wait_until(&self, what: &str, cond: impl Fn(&GateCounts) -> bool) {
        let (counts, changed) = &*self.0;
        let deadline = Instant::now() + PATIENCE;
        let mut counts = counts.lock();
        while !cond(&counts) {
            assert!(
                !changed.wait_until(&mut counts, deadline).timed_out() || cond(&counts),
                "timed out waiting for {what}"
            );
        }
    }
}

/// A started controller named `name` whose key "child" depends on
/// "parent", caught with the parent held (guarantees §14): the child's
/// reconcile is at the returned gate and was cancelled (D3) when the
/// parent was enqueued, so the parent waits for it to return. Three
/// releases finish it: the child's cancelled run (superseded), the
/// parent's, and the child's again (D2).
pub fn parent_held_by_cancelled_child(name: &str) -> (ControllerHandle<String>, Gate) {
    let gate = Gate::new();
    let h = Controller::new(name, gate.reconcile::<String>()).workers(2).start();
    h.set_dependencies(&"child".to_string(), ["parent".to_string()]).unwrap();
    h.enqueue("child".to_string());
    gate.wait_arrivals(1);
    h.enqueue("parent".to_string());
    (h, gate)
}

/// `n` successive `when(key)` answers of `limiter`.
pub fn whens<K, L: RateLimiter<K> + ?Sized>(limiter: &L, key: &K, n: usize) -> Vec<Duration> {
    (0..n).map(|_| limiter.when(key)).collect()
}

/// What a scripted reconcile does on one call.
#[derive(Clone)]
pub enum Step {
    Done,
    Requeue,
    RequeueAfter(Duration),
    Fail(&'static str),
    RetryAfter(Duration, &'static str),
    Permanent(&'static str),
    Panic(&'static str),
}

/// A reconciler that plays a script (then `Done`) and records each call's
/// key and attempt.
#[derive(Clone, Default)]
pub struct Script {
    pub steps: Arc<Mutex<VecDeque<Step>>>,
    pub calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self { steps: Arc::new(Mutex::new(steps.into_iter().collect())), ..Default::default() }
    }

    pub fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().clone()
    }

    pub fn attempts(&self) -> Vec<u32> {
        self.calls.lock().iter().map(|c| c.1).collect()
    }

    pub fn ncalls(&self) -> usize {
        self.calls.lock().len()
    }
}

impl Reconciler<String> for Script {
    fn reconcile(&self, key: &String, ctx: &Context) -> Result<Action, ReconcileError> {
        self.calls.lock().push((key.clone(), ctx.attempt()));
        let step = self.steps.lock().pop_front().unwrap_or(Step::Done);
        match step {
            Step::Done => Ok(Action::Done),
            Step::Requeue => Ok(Action::Requeue),
            Step::RequeueAfter(d) => Ok(Action::RequeueAfter(d)),
            Step::Fail(m) => Err(m.into()),
            Step::RetryAfter(d, m) => Err(ReconcileError::retry_after(d, m)),
            Step::Permanent(m) => Err(ReconcileError::permanent(m)),
            Step::Panic(m) => panic!("{m}"),
        }
    }
}

/// A controller on a fake clock with `ExponentialBackoff(1 s, 1000 s)`.
pub fn fake_controller(script: &Script, clock: &FakeClock) -> ControllerHandle<String> {
    Controller::new("test", script.clone())
        .clock(clock.clone())
        .rate_limiter(ExponentialBackoff::new(secs(1), secs(1000)))
        .start()
}

static DIRS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed at drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let n = DIRS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("reconq-store-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
    pub fn db(&self) -> std::path::PathBuf {
        self.0.join("state.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
