//! W10 (docs/benchmarks.md): a controller watching a cache of an etcd prefix.
//!
//! * An etcd started here (loopback, temporary data directory) with 100,000
//!   keys under a prefix; the time from `start()` until the cache synced
//!   and every key was reconciled once (no-op reconcile, 2 workers).
//! * Then 20,000 puts of new keys from 4 other threads at full speed:
//!   changes applied per second (first put to the cache holding the last),
//!   and the latency from each put's response to the start of its key's
//!   reconcile, p50 / p99 (negative when the watch event beat the HTTP
//!   response: counted as 0).
//! * 20,000 changes put in 20 transactions (etcd's fsync per put bounds the
//!   first figure): changes the cache applies per second.
//! * The same latency for 5,000 puts paced at 1,000 a second (one thread).
//!
//!
//! W11: the same cache of the same keys with a store: a first run to a
//! clean stop, then 100 keys changed and 100 deleted in etcd, and a
//! restart: the time from `start()` until synced, and the reconciles the
//! restart runs (E9: the 200 changes, not every key). Twice, side by side:
//! a cache that keeps only its key set (the restart relists) and one that
//! keeps its objects too (`keep_objects`: the restart resumes the stream).
//!
//! `cargo bench --bench cache` (`W10_KEYS=20000` for a shorter run; `W11_ONLY=1`
//! for W11 alone). Rounds
//! are printed one per line; figures go to docs/benchmarks.md.
//! `W10_ETCD=http://127.0.0.1:PORT` times only the sync, against an etcd
//! already running there (the keys are loaded unless the prefix holds as
//! many): how two builds are compared on one etcd, alternating.

#[path = "common/cpu.rs"]
mod cpu;
use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use parking_lot::Mutex;
use reconq::{Action, Cache, Context, Controller, EtcdSource, ReconcileError, SqliteStore, Watch};

const PREFIX: &str = "/w10/";
/// Where etcd's range of the keys under `PREFIX` ends (its last byte + 1).
const PREFIX_END: &str = "/w100";
const LONG: Duration = Duration::from_secs(600);
/// Puts per transaction while loading (etcd started with this `--max-txn-ops`).
const BATCH: usize = 1000;

fn keys() -> usize {
    std::env::var("W10_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// etcd on free loopback ports, killed and its directory removed on drop
/// (unless it was running before: then only its endpoint).
struct Etcd {
    started: Option<(Child, PathBuf)>,
    endpoint: String,
}

impl Etcd {
    fn start() -> Self {
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("reconq-w10-{}-{client}", std::process::id()));
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "w10", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("w10={peer_url}")])
            .args(["--max-txn-ops", &BATCH.to_string(), "--quota-backend-bytes", "4294967296"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the etcd binary (Debian's etcd-server)");
        let etcd = Etcd { started: Some((child, dir)), endpoint };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ureq::get(format!("{}/health", etcd.endpoint))
            .call()
            .is_ok_and(|mut r| r.body_mut().read_to_string().is_ok_and(|b| b.contains("true")))
        {
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn call(&self, path: &str, body: &str) -> String {
        ureq::post(format!("{}/v3/{path}", self.endpoint)).send(body).unwrap().body_mut().read_to_string().unwrap()
    }

    /// How many keys are under `PREFIX`.
    fn count(&self) -> usize {
        let (key, end) = (b64(PREFIX), b64(PREFIX_END));
        let reply = self.call("kv/range", &format!(r#"{{"key":"{key}","range_end":"{end}","count_only":true}}"#));
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        reply["count"].as_str().map_or(0, |c| c.parse().unwrap())
    }

    fn put(&self, key: &str, value: &str) {
        self.call("kv/put", &format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(value)));
    }

    /// Puts `{PREFIX}{name}{i}` = `value` for every `i` in `0..n`, `BATCH`
    /// per transaction.
    fn load(&self, name: &str, n: usize, value: &str) {
        self.each(name, 0..n, |key| format!(r#"{{"requestPut":{{"key":"{key}","value":"{}"}}}}"#, b64(value)));
    }

    /// Deletes `{PREFIX}{name}{i}` for every `i` in `ids`.
    fn delete(&self, name: &str, ids: std::ops::Range<usize>) {
        self.each(name, ids, |key| format!(r#"{{"requestDeleteRange":{{"key":"{key}"}}}}"#));
    }

    /// Runs `op(key)` (base64) on `{PREFIX}{name}{i}` for every `i` in
    /// `ids`, `BATCH` per transaction.
    fn each(&self, name: &str, ids: std::ops::Range<usize>, op: impl Fn(&str) -> String) {
        let ids: Vec<usize> = ids.collect();
        for chunk in ids.chunks(BATCH) {
            let ops: Vec<String> = chunk.iter().map(|i| op(&b64(&format!("{PREFIX}{name}{i}")))).collect();
            self.call("kv/txn", &format!(r#"{{"success":[{}]}}"#, ops.join(",")));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some((child, dir)) = &mut self.started {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// When each key's first reconcile started.
type Starts = Arc<Mutex<HashMap<String, Instant>>>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Latencies from each put's response (`put_done`) to its key's reconcile.
fn latencies(put_done: &[(String, Instant)], starts: &Starts) -> (Duration, Duration) {
    let starts = starts.lock();
    let mut lat: Vec<Duration> =
        put_done.iter().map(|(key, done)| starts[key].saturating_duration_since(*done)).collect();
    lat.sort();
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

fn all_reconciled(put_done: &[(String, Instant)], starts: &Starts) -> bool {
    let starts = starts.lock();
    put_done.iter().all(|(key, _)| starts.contains_key(key))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Puts `keys` (each from its thread's list), recording each response time.
fn put_all(etcd: &Arc<Etcd>, threads: usize, keys: Vec<String>, pace: Option<Duration>) -> Vec<(String, Instant)> {
    let per = keys.len().div_ceil(threads);
    let handles: Vec<_> = keys
        .chunks(per)
        .map(|chunk| {
            let (etcd, chunk) = (Arc::clone(etcd), chunk.to_vec());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut done = Vec::with_capacity(chunk.len());
                for (i, key) in chunk.into_iter().enumerate() {
                    if let Some(pace) = pace {
                        let due = start + pace * i as u32;
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                    }
                    etcd.put(&format!("{PREFIX}{key}"), "v");
                    done.push((key, Instant::now()));
                }
                done
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench` probes harness=false targets with --list.
    }
    let n = keys();
    let running = std::env::var("W10_ETCD").ok();
    let etcd = Arc::new(match &running {
        Some(endpoint) => Etcd { started: None, endpoint: endpoint.clone() },
        None => Etcd::start(),
    });
    if running.is_none() || etcd.count() < n {
        let loading = Instant::now();
        etcd.load("k", n, "v");
        println!("W10: loaded {n} keys into etcd in {:.1} s", loading.elapsed().as_secs_f64());
    }

    if std::env::var_os("W11_ONLY").is_some() {
        return w11(&etcd, n);
    }

    // The cache alone, for comparison: what the controller side adds.
    let alone = Cache::builder("w10-alone", EtcdSource::new(&etcd.endpoint, PREFIX).unwrap()).build().unwrap();
    let listing = Instant::now();
    alone.start().unwrap();
    assert!(alone.wait_synced(Some(LONG)));
    println!("W10 sync: the cache alone synced {n} keys in {:.2} s", listing.elapsed().as_secs_f64());
    alone.stop();

    let source = EtcdSource::new(&etcd.endpoint, PREFIX).unwrap();
    let cache = Cache::builder("w10", source).build().unwrap();
    let starts: Starts = Arc::default();
    let record = Arc::clone(&starts);
    let controller = Controller::new("w10", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        record.lock().entry(key.clone()).or_insert_with(Instant::now);
        Ok(Action::Done)
    })
    .workers(2)
    .watch_cache(&cache, Watch::new());
    let started = Instant::now();
    let handle = controller.start();
    assert!(handle.wait_synced(Some(LONG)));
    let synced = started.elapsed();
    wait_until("every key reconciled", || handle.stats().successes >= n as u64);
    let reconciled = started.elapsed();
    println!(
        "W10 sync: {n} keys, start() to synced {:.2} s, to every key reconciled {:.2} s",
        synced.as_secs_f64(),
        reconciled.as_secs_f64()
    );
    if running.is_some() {
        assert!(handle.stop_with_drain(LONG));
        return;
    }

    let live = 20_000;
    let events_before = cache.stats().events;
    let keys: Vec<String> = (0..live).map(|i| format!("live{i}")).collect();
    let putting = Instant::now();
    let put_done = put_all(&etcd, 4, keys, None);
    let put_time = putting.elapsed();
    wait_until("every put applied", || cache.stats().events >= events_before + live as u64);
    let applied = putting.elapsed();
    wait_until("every put reconciled", || all_reconciled(&put_done, &starts));
    let (p50, p99) = latencies(&put_done, &starts);
    println!(
        "W10 live: {live} puts from 4 threads in {:.2} s ({:.0} puts/s), applied at {:.0} changes/s; \
         put response to reconcile start p50 {:.2} ms, p99 {:.2} ms",
        put_time.as_secs_f64(),
        live as f64 / put_time.as_secs_f64(),
        live as f64 / applied.as_secs_f64(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );

    // The cache's own pace: 20,000 changes in 20 transactions, so etcd's
    // fsyncs do not bound it (each changed key is one watch event).
    let events_before = cache.stats().events;
    let bursting = Instant::now();
    etcd.load("k", live, "changed");
    wait_until("every burst change applied", || cache.stats().events >= events_before + live as u64);
    println!(
        "W10 burst: {live} changes in {} transactions applied at {:.0} changes/s",
        live / BATCH,
        live as f64 / bursting.elapsed().as_secs_f64()
    );

    let paced = 5_000;
    let keys: Vec<String> = (0..paced).map(|i| format!("paced{i}")).collect();
    let put_done = put_all(&etcd, 1, keys, Some(Duration::from_millis(1)));
    wait_until("every paced put reconciled", || all_reconciled(&put_done, &starts));
    let (p50, p99) = latencies(&put_done, &starts);
    println!(
        "W10 paced: {paced} puts at 1,000/s; put response to reconcile start p50 {:.2} ms, p99 {:.2} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    assert!(handle.stop_with_drain(LONG));
    w11(&etcd, n);
}

/// One run of W11's controller watching its stored cache until its
/// reconciles are done; returns the time from `start()` to synced (wall
/// and this process's CPU) and to the reconciles done, and how many ran.
/// Stops cleanly (a drain, then the last flush).
fn w11_run(etcd: &Etcd, path: &std::path::Path, keep_objects: bool) -> ((Duration, Duration), Duration, u64) {
    let store = SqliteStore::open(path).unwrap();
    let source = EtcdSource::new(&etcd.endpoint, PREFIX).unwrap();
    let builder = Cache::builder("w11", source).store(&store);
    let cache = if keep_objects { builder.keep_objects() } else { builder }.build().unwrap();
    let controller =
        Controller::new("w11", |_: &String, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .workers(2)
            .store(store)
            .watch_cache(&cache, Watch::new());
    let (started, cpu) = (Instant::now(), cpu::process_cpu_time());
    let handle = controller.start();
    assert!(handle.wait_synced(Some(LONG)));
    let (synced, cpu) = (started.elapsed(), cpu::process_cpu_time() - cpu);
    // Every key the list (and the deletes a restart finds) enqueued is in
    // the queue once this returns: idle then means reconciled.
    cache.flush().unwrap();
    assert!(handle.wait_idle(LONG));
    let reconciled = started.elapsed();
    let ran = handle.stats().successes;
    assert!(handle.stop_with_drain(LONG));
    handle.flush().unwrap();
    ((synced, cpu), reconciled, ran)
}

/// W11 (docs/benchmarks.md): a restart after 100 changes and 100 deletes,
/// of a cache that relists and of one that resumes, side by side.
fn w11(etcd: &Etcd, n: usize) {
    let dir = std::env::temp_dir().join(format!("reconq-w11-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // `W11_KINDS=resumes` (or `relists`): one kind alone, for a profile.
    let only = std::env::var("W11_KINDS").ok();
    let kinds: Vec<_> = [("relists", false), ("resumes", true)]
        .into_iter()
        .filter(|(kind, _)| only.as_deref().is_none_or(|only| only.split(',').any(|o| o == *kind)))
        .collect();
    for &(kind, keep_objects) in &kinds {
        let ((synced, cpu), reconciled, listed) = w11_run(etcd, &dir.join(kind), keep_objects);
        println!(
            "W11 first run ({kind}): {listed} keys, start() to synced {:.2} s (CPU {:.2} s), to every key reconciled {:.2} s",
            synced.as_secs_f64(),
            cpu.as_secs_f64(),
            reconciled.as_secs_f64()
        );
    }
    etcd.load("k", 100, "w11-changed");
    etcd.delete("k", 100..200);
    for &(kind, keep_objects) in &kinds {
        let ((synced, cpu), reconciled, ran) = w11_run(etcd, &dir.join(kind), keep_objects);
        println!(
            "W11 restart ({kind}): {n} keys, 100 changed and 100 deleted while down: start() to synced {:.2} s \
             (CPU {:.2} s), {ran} reconciles (done at {:.2} s)",
            synced.as_secs_f64(),
            cpu.as_secs_f64(),
            reconciled.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
