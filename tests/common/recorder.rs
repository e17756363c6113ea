//! What the C6 combination tests (tests/combinations.rs,
//! tests/combinations_replicas.rs) share: a reconcile that records its
//! runs and blocks keys at gates, a polled system with its cache, and
//! small helpers. Each binary uses a subset.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use reconq::source::PollingSource;
use reconq::*;

use super::common::{PATIENCE, TempDir, ms, secs, wait_for};

/// One start or end of a reconcile, as the reconcile saw it.
#[derive(Clone, Debug)]
pub struct Run {
    pub start: bool,
    pub key: String,
    pub priority: i32,
    pub attempt: u32,
    pub token: Option<u64>,
    /// What the watched cache held for the key when the run began.
    pub cached: Option<u64>,
}

pub type Polled = PollingSource<String, u64>;

/// What a key's next reconciles return, in turn.
pub type Scripted = VecDeque<Result<Action, ReconcileError>>;

/// A reconcile that records its runs, blocks keys whose gate is closed
/// until the test opens it or the run is cancelled, and returns what the
/// test scripted for the key (then `Ok(Done)`).
#[derive(Clone, Default)]
pub struct Recorder {
    pub log: Arc<Mutex<Vec<Run>>>,
    /// key → open? Keys not listed do not block.
    pub gates: Arc<(Mutex<HashMap<String, bool>>, Condvar)>,
    pub results: Arc<Mutex<HashMap<String, Scripted>>>,
    pub cache: Arc<OnceLock<Cache<Polled>>>,
}

impl Recorder {
    pub fn close(&self, key: &str) {
        self.gates.0.lock().insert(key.into(), false);
    }

    pub fn open(&self, key: &str) {
        self.gates.0.lock().insert(key.into(), true);
        self.gates.1.notify_all();
    }

    pub fn then(&self, key: &str, result: Result<Action, ReconcileError>) {
        self.results.lock().entry(key.into()).or_default().push_back(result);
    }

    pub fn record(&self, start: bool, key: &str, ctx: &Context) {
        let cached = self.cache.get().and_then(|cache| cache.get(&key.to_string()).as_deref().copied());
        let (priority, attempt, token) = (ctx.priority(), ctx.attempt(), ctx.fencing_token());
        self.log.lock().push(Run { start, key: key.into(), priority, attempt, token, cached });
    }

    pub fn reconcile(&self, key: &String, ctx: &Context) -> Result<Action, ReconcileError> {
        self.record(true, key, ctx);
        {
            let (gates, changed) = &*self.gates;
            let mut gates = gates.lock();
            while gates.get(key) == Some(&false) && !ctx.is_cancelled() {
                changed.wait_for(&mut gates, ms(5));
            }
        }
        let result = self.results.lock().get_mut(key).and_then(VecDeque::pop_front).unwrap_or(Ok(Action::Done));
        self.record(false, key, ctx);
        result
    }

    pub fn controller(&self, name: &str, workers: usize) -> Controller<String> {
        let me = self.clone();
        Controller::new(name, move |key: &String, ctx: &Context| me.reconcile(key, ctx))
            .workers(workers)
            .rate_limiter(ExponentialBackoff::new(secs(1), secs(1)))
    }

    pub fn runs(&self) -> Vec<Run> {
        self.log.lock().clone()
    }

    pub fn starts(&self, key: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.start && r.key == key).collect()
    }

    pub fn started(&self, key: &str) -> usize {
        self.starts(key).len()
    }

    pub fn running(&self, key: &str) -> bool {
        let runs = self.runs();
        let of = |start: bool| runs.iter().filter(|r| r.start == start && r.key == key).count();
        of(true) > of(false)
    }

    /// Index in the log of the `n`-th (from 0) start or end of `key`.
    pub fn at(&self, start: bool, key: &str, n: usize) -> usize {
        let runs = self.runs();
        runs.iter()
            .enumerate()
            .filter(|(_, r)| r.start == start && r.key == key)
            .nth(n)
            .unwrap_or_else(|| panic!("no {} #{n} of {key} in {runs:?}", if start { "start" } else { "end" }))
            .0
    }

    /// Keys in the order they started.
    pub fn order(&self) -> Vec<String> {
        self.runs().into_iter().filter(|r| r.start).map(|r| r.key).collect()
    }

    /// The most runs of keys starting with `prefix` at once.
    pub fn most_at_once(&self, prefix: &str) -> usize {
        let (mut now, mut most) = (0usize, 0usize);
        for run in self.runs().iter().filter(|r| r.key.starts_with(prefix)) {
            if run.start {
                now += 1;
                most = most.max(now);
            } else {
                now -= 1;
            }
        }
        most
    }

    /// Enqueues `key` at `priority` with its gate closed, and waits until it runs.
    pub fn run_blocked(&self, h: &ControllerHandle<String>, key: &str, priority: i32) {
        self.close(key);
        h.enqueue_with_priority(s(key), priority);
        wait_for(&format!("{key} running"), || self.running(key));
    }
}

pub fn s(k: &str) -> String {
    k.to_string()
}

pub fn idle(h: &ControllerHandle<String>) {
    assert!(h.wait_idle(PATIENCE), "the controller became idle: {:?}", h.stats());
}

pub fn waiting(h: &ControllerHandle<String>, key: &str) -> bool {
    matches!(h.inspect(&s(key)).state, KeyStatus::Waiting { .. })
}

/// Keys starting with 'g' form one group, every other key its own.
#[allow(clippy::ptr_arg)] // a group function of `Controller<String>` takes `&String`
pub fn by_initial(key: &String) -> String {
    if key.starts_with('g') { s("g") } else { key.clone() }
}

pub fn open_store(dir: &TempDir) -> SqliteStore {
    SqliteStore::open_with_flush_interval(dir.db(), Duration::from_secs(3600)).unwrap()
}

pub fn stop(h: &ControllerHandle<String>) {
    h.stop();
    assert!(h.join_timeout(PATIENCE));
}

/// A system of `key → value` polled every 10 ms, its cache (also read by
/// `recorder`'s reconciles) and what to change it with.
#[derive(Clone, Default)]
pub struct System(pub Arc<Mutex<BTreeMap<String, u64>>>);

impl System {
    pub fn put(&self, key: &str, value: u64) {
        self.0.lock().insert(key.into(), value);
    }

    pub fn cache(&self, name: &str, recorder: &Recorder) -> Cache<Polled> {
        let items = Arc::clone(&self.0);
        let source = PollingSource::new(ms(10), move || Ok::<_, String>(items.lock().clone())).unwrap();
        let cache = Cache::builder(name, source).build().unwrap();
        assert!(recorder.cache.set(cache.clone()).is_ok());
        cache
    }
}

/// `Watch::with_map`: object `key` enqueues the keys its name lists,
/// split on '+' ("g1+g2" enqueues g1 and g2).
pub fn split_map() -> Watch<Polled, String> {
    Watch::with_map(|key: &String, _: Option<&u64>| key.split('+').map(s).collect::<Vec<_>>())
}
