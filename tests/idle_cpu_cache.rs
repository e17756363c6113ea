//! G8 for caches: an idle cache of an etcd prefix blocks on its watch
//! stream (no reads, no reopened watches, next to no CPU), and an idle
//! polling cache sleeps until its next poll; the etcd cache has a store
//! (E9) and a watching controller, whose flusher sleeps too. A binary of its own: it
//! measures the CPU time of the whole process.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the fault helpers serve other tests
mod etcd;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{PATIENCE, process_cpu_time, wait_for};
use etcd::Etcd;
use reconq::{Action, Cache, Context, Controller, EtcdSource, PollingSource, SqliteStore, Watch};

const WINDOW: Duration = Duration::from_secs(3);
const BUDGET: Duration = Duration::from_millis(50);

#[test]
fn g8_idle_caches_block_on_their_stream_and_ask_etcd_for_nothing() {
    let etcd = Etcd::start();
    for i in 0..100 {
        etcd.put(&format!("/idle/{i}"), "x");
    }
    let dir = common::TempDir::new();
    let store = SqliteStore::open(dir.db()).unwrap();
    let source = EtcdSource::new(&etcd.endpoint, "/idle/").unwrap();
    let cache = Cache::builder("idle-etcd", source).store(&store).build().unwrap();
    let controller = Controller::from_fn("idle", |_: &String, _: &Context| Ok(Action::Done))
        .store(store)
        .watch_cache(&cache, Watch::new())
        .start();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let polls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&polls);
    let polling = PollingSource::new(Duration::from_secs(3600), move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok::<_, String>(vec![(1u32, 1u32)])
    });
    let polled = Cache::builder("idle-polling", polling.unwrap()).build().unwrap();
    polled.start().unwrap();
    assert!(polled.wait_synced(Some(PATIENCE)));
    // The etcd cache's watch is open once it applied a change.
    etcd.put("/idle/last", "y");
    wait_for("the watch to deliver", || cache.len() == 101);
    cache.flush().unwrap();
    assert!(controller.wait_idle(PATIENCE));
    controller.flush().unwrap();

    let (asked_before, cpu_before, t0) = (etcd.requests(), process_cpu_time(), Instant::now());
    while t0.elapsed() < WINDOW {
        std::thread::sleep(WINDOW - t0.elapsed());
    }
    let (cpu, asked_after) = (process_cpu_time() - cpu_before, etcd.requests());
    let asked = |method: &str| asked_after.get(method).unwrap_or(&0) - asked_before.get(method).unwrap_or(&0);
    println!("idle etcd and polling caches, {WINDOW:?}: {cpu:?} CPU");
    for method in ["Range", "Txn", "Watch", "Put"] {
        assert_eq!(asked(method), 0, "{method} calls while idle: {asked_after:?}");
    }
    assert_eq!(polls.load(Ordering::SeqCst), 1, "only the first poll");
    assert!(cpu < BUDGET, "{cpu:?} of CPU in {WINDOW:?} idle");
    controller.stop();
    cache.stop();
    polled.stop();
}
