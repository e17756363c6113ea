//! A restart that resumes (guarantees E9, issue 36 item 2): a stored cache
//! that keeps its objects (`CacheBuilder::keep_objects`) loads them from
//! the file at a restart and resumes etcd's stream from the kept revision
//! instead of listing; it relists only when that revision was compacted.
//! Either way the restart reconciles exactly the keys changed while down,
//! a delete among them reaches `map` with the object the cache held, and
//! the cache ends up holding etcd's own listing. The SIGKILL rounds are
//! Python's (`tests/python/test_cache_resume.py`).

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;
#[path = "common/faulty_proxy.rs"]
#[allow(dead_code)] // only the stalling proxy serves here
mod faulty_proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, TempDir, wait_for};
use etcd::Etcd;
use faulty_proxy::FaultyProxy;
use parking_lot::Mutex;
use reconq::{Action, Cache, CacheStats, Controller, EtcdSource, SqliteStore, Watch};

const PREFIX: &str = "/resume/";

/// What one run saw and ended with.
#[derive(Debug, Default)]
struct Run {
    reconciled: BTreeSet<String>,
    /// Deletes given to `map`, each with whether it had the object held.
    deleted: BTreeSet<(String, bool)>,
    /// The cache's contents when it stopped.
    held: BTreeMap<String, String>,
    stats: Option<CacheStats<i64>>,
}

/// Runs a controller watching a stored cache of `PREFIX` (objects kept
/// when `keep`) until every change is reconciled and written, then stops
/// it cleanly.
fn run(etcd: &Etcd, path: &Path, keep: bool) -> Run {
    let store = SqliteStore::open(path).unwrap();
    let source = EtcdSource::new(etcd.endpoint.as_str(), PREFIX).unwrap();
    let builder = Cache::builder("kept", source).store(&store);
    let cache = if keep { builder.keep_objects() } else { builder }.build().unwrap();
    let seen = Arc::new(Mutex::new(Run::default()));
    let (reconciled, mapped) = (Arc::clone(&seen), Arc::clone(&seen));
    let reader = cache.clone();
    let watch = Watch::with_map(move |key: &String, obj: Option<&Vec<u8>>| {
        if reader.get(key).is_none() {
            mapped.lock().deleted.insert((key.clone(), obj.is_some()));
        }
        [key.clone()]
    });
    let handle = Controller::from_fn("sync", move |key: &String, _| {
        reconciled.lock().reconciled.insert(key.clone());
        Ok(Action::Done)
    })
    .store(store)
    .watch_cache(&cache, watch)
    .start();
    assert!(cache.wait_synced(Some(PATIENCE)));
    cache.flush().unwrap();
    assert!(handle.wait_idle(PATIENCE));
    cache.flush().unwrap();
    assert!(handle.stop_with_drain(PATIENCE));
    let mut run = std::mem::take(&mut *seen.lock());
    run.held = cache.keys().into_iter().map(|key| (key.clone(), text(&cache.get(&key).unwrap()))).collect();
    run.stats = Some(cache.stats());
    cache.stop();
    run
}

fn text(value: &[u8]) -> String {
    String::from_utf8(value.to_vec()).unwrap()
}

fn seeded(n: usize) -> Etcd {
    let etcd = Etcd::start();
    for i in 0..n {
        etcd.put(&format!("{PREFIX}k{i:02}"), &i.to_string());
    }
    etcd
}

/// Changes a key, deletes 2, creates 1, and puts one again with the same
/// value; returns the keys whose state changed. The put of the same value
/// is no change once the cache holds the object (E6's default predicate
/// compares objects, as for a live put): a relist that started empty
/// counted it as one.
fn change_while_down(etcd: &Etcd) -> BTreeSet<String> {
    etcd.put(&format!("{PREFIX}k00"), "changed");
    etcd.put(&format!("{PREFIX}k01"), "1");
    etcd.delete(&format!("{PREFIX}k02"));
    etcd.delete(&format!("{PREFIX}k03"));
    etcd.put(&format!("{PREFIX}new"), "x");
    ["k00", "k02", "k03", "new"].map(String::from).into()
}

fn resumed(run: &Run) -> (bool, u64) {
    let stats = run.stats.as_ref().unwrap();
    (stats.resumed, stats.relists)
}

#[test]
fn a_restart_resumes_from_the_kept_revision_and_reconciles_exactly_what_changed() {
    let etcd = seeded(20);
    let dir = TempDir::new();
    let first = run(&etcd, &dir.db(), true);
    assert_eq!((first.reconciled.len(), resumed(&first)), (20, (false, 0)), "the first run lists");
    let changed = change_while_down(&etcd);
    let second = run(&etcd, &dir.db(), true);
    assert_eq!(resumed(&second), (true, 0), "resumed, no relist");
    assert_eq!(second.reconciled, changed);
    let deleted: BTreeSet<(String, bool)> = [("k02".to_owned(), true), ("k03".to_owned(), true)].into();
    assert_eq!(second.deleted, deleted, "a delete while down reaches map with the object held");
    assert_eq!(second.held, etcd.list(PREFIX));
    let third = run(&etcd, &dir.db(), true);
    assert_eq!((&third.reconciled, resumed(&third)), (&BTreeSet::new(), (true, 0)), "nothing changed, nothing run");
    assert_eq!(third.held, etcd.list(PREFIX));
}

#[test]
fn a_compaction_while_down_takes_the_relist_path_with_exactly_the_changes() {
    let etcd = seeded(20);
    let dir = TempDir::new();
    run(&etcd, &dir.db(), true);
    let changed = change_while_down(&etcd);
    etcd.compact();
    let second = run(&etcd, &dir.db(), true);
    assert_eq!(resumed(&second), (true, 1), "loaded, then relisted: the revision was compacted");
    assert_eq!(second.reconciled, changed);
    assert_eq!(second.held, etcd.list(PREFIX));
    let third = run(&etcd, &dir.db(), true);
    assert_eq!((&third.reconciled, resumed(&third)), (&BTreeSet::new(), (true, 0)), "the relist was kept");
}

#[test]
fn a_cache_that_does_not_keep_its_objects_relists_as_before() {
    let etcd = seeded(20);
    let dir = TempDir::new();
    run(&etcd, &dir.db(), false);
    let mut changed = change_while_down(&etcd);
    let second = run(&etcd, &dir.db(), false);
    assert_eq!(resumed(&second), (false, 0), "listed");
    changed.insert("k01".to_owned()); // its version differs from the kept one
    assert_eq!(second.reconciled, changed);
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let values: i64 = conn.query_row("SELECT count(*) FROM cache_values", [], |row| row.get(0)).unwrap();
    assert_eq!(values, 0, "no object kept");
}

/// A resume's catch-up read (where the stream will be caught up) waits up
/// to 30 s for a busy etcd; a stop must not. The read started at the
/// restore fails (503), so the cache reads again when the watch opens, and
/// etcd never answers that read: the stop ends the wait.
#[test]
fn a_stop_during_a_resume_s_second_catch_up_read_does_not_wait_for_etcd() {
    let etcd = seeded(5);
    let dir = TempDir::new();
    run(&etcd, &dir.db(), true);
    let catch_up_read = |body: &[u8]| String::from_utf8_lossy(body).contains("min_mod_revision");
    let proxy = FaultyProxy::stalling(&etcd.endpoint, 1, catch_up_read);
    let store = SqliteStore::open(dir.db()).unwrap();
    let source = EtcdSource::new(proxy.endpoint.as_str(), PREFIX).unwrap();
    let cache = Cache::builder("kept", source).store(&store).keep_objects().build().unwrap();
    cache.start().unwrap();
    wait_for("the second catch-up read held", || proxy.stalled() == 1);
    assert_eq!(proxy.failed(), 1, "the first read failed");
    assert!(cache.stop_timeout(Duration::from_secs(4)), "the stop waited for etcd's answer");
}
