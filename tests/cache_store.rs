//! Caches with a store (guarantees E9, docs/store.md): a restart
//! reconciles exactly the keys created, changed or deleted while the
//! program was down; a delete found then reaches `map` with `None`;
//! `flush()` on a cache; bad input refused with nothing changed; a file of
//! the previous schema migrated. The crash cases (SIGKILL) are in
//! `cache_store_kill.rs`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, TempDir};
use parking_lot::Mutex;
use reconq::source::Item;
use reconq::{Action, Cache, Controller, PollingSource, SqliteStore, StoreError, Watch};

/// What the system holds: key -> (value, version).
type Items = BTreeMap<String, (u64, u64)>;

/// A source that lists `items` once (its later polls are an hour away),
/// with versions or without.
fn source(items: &Items, versions: bool) -> PollingSource<String, u64, u64> {
    let listed: Vec<Item<String, u64, u64>> = items
        .iter()
        .map(|(key, (value, version))| Item { key: key.clone(), obj: *value, version: versions.then_some(*version) })
        .collect();
    PollingSource::with_items(Duration::from_secs(3600), move || Ok::<_, String>(listed.clone())).unwrap()
}

/// What one run saw: the keys reconciled, and what `map` was given.
#[derive(Debug, Default)]
struct Run {
    reconciled: BTreeSet<String>,
    mapped: Vec<(String, Option<u64>)>,
}

/// Runs a controller watching a stored cache of `items` until every
/// change is reconciled and flushed, then stops it cleanly.
fn run(path: &Path, items: &Items, versions: bool) -> Run {
    let store = SqliteStore::open(path).unwrap();
    let cache = Cache::builder("items", source(items, versions)).store(&store).build().unwrap();
    let seen = Arc::new(Mutex::new(Run::default()));
    let (reconciled, mapped) = (Arc::clone(&seen), Arc::clone(&seen));
    let watch = Watch::with_map(move |key: &String, obj: Option<&u64>| {
        mapped.lock().mapped.push((key.clone(), obj.copied()));
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
    // The deletes a restart finds are enqueued by the time flush() returns.
    cache.flush().unwrap();
    assert!(handle.wait_idle(PATIENCE));
    cache.flush().unwrap();
    assert!(handle.stop_with_drain(PATIENCE));
    cache.stop();
    std::mem::take(&mut *seen.lock())
}

fn items(n: u64) -> Items {
    (0..n).map(|i| (format!("k{i:02}"), (i, 1))).collect()
}

/// Changes 2 keys, deletes 2, creates 2, leaves the rest.
fn change_while_down(items: &mut Items) -> BTreeSet<String> {
    for key in ["k00", "k01"] {
        let entry = items.get_mut(key).unwrap();
        *entry = (entry.0 + 100, entry.1 + 1);
    }
    items.remove("k02");
    items.remove("k03");
    items.insert("new0".into(), (7, 1));
    items.insert("new1".into(), (8, 1));
    ["k00", "k01", "k02", "k03", "new0", "new1"].into_iter().map(String::from).collect()
}

#[test]
fn a_restart_reconciles_exactly_what_changed_while_down() {
    let dir = TempDir::new();
    let path = dir.0.as_path().join("state.db");
    let mut system = items(20);
    assert_eq!(run(&path, &system, true).reconciled.len(), 20, "the first run reconciles every key");
    let changed = change_while_down(&mut system);
    let second = run(&path, &system, true);
    assert_eq!(second.reconciled, changed);
    // Deletes found at the restart reach map with None (no state is kept).
    let deletes: BTreeSet<(String, Option<u64>)> =
        second.mapped.iter().filter(|(key, _)| key == "k02" || key == "k03").cloned().collect();
    assert_eq!(deletes, BTreeSet::from([("k02".into(), None), ("k03".into(), None)]));
    assert_eq!(run(&path, &system, true).reconciled, BTreeSet::new(), "nothing changed: nothing reconciled");
}

#[test]
fn without_versions_every_listed_key_counts_as_changed_and_deletes_are_found() {
    let dir = TempDir::new();
    let path = dir.0.as_path().join("state.db");
    let mut system = items(10);
    assert_eq!(run(&path, &system, false).reconciled.len(), 10);
    change_while_down(&mut system);
    let second = run(&path, &system, false);
    let mut expected: BTreeSet<String> = system.keys().cloned().collect();
    expected.extend(["k02".to_owned(), "k03".to_owned()]);
    assert_eq!(second.reconciled, expected, "10 listed + 2 deleted");
}

#[test]
fn a_controller_without_the_cache_s_store_is_refused_at_start_with_nothing_changed() {
    let dir = TempDir::new();
    let store = SqliteStore::open(dir.0.as_path().join("a.db")).unwrap();
    let other = SqliteStore::open(dir.0.as_path().join("b.db")).unwrap();
    let cache = Cache::builder("items", source(&items(3), true)).store(&store).build().unwrap();
    let noop = |_: &String, _: &reconq::Context| Ok(Action::Done);
    for controller in [Controller::from_fn("none", noop), Controller::from_fn("other", noop).store(other.clone())] {
        let err = controller.watch_cache(&cache, Watch::new()).try_start().unwrap_err();
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<StoreError>());
        assert!(matches!(inner, Some(StoreError::Invalid(m)) if m.contains("\"items\"")), "{err}");
    }
    assert!(!cache.synced() && cache.stats().keys == 0, "the cache was not started");
    assert!(
        std::fs::read_dir(dir.0.as_path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".lock")),
        "no name was claimed"
    );
}

#[test]
fn cache_names_are_unique_among_a_file_s_caches() {
    let dir = TempDir::new();
    let store = SqliteStore::open(dir.0.as_path().join("a.db")).unwrap();
    let first = Cache::builder("items", source(&items(1), true)).store(&store).build().unwrap();
    // The same file opened again is the same file.
    let again = SqliteStore::open(dir.0.as_path().join("a.db")).unwrap();
    let err = Cache::builder("items", source(&items(1), true)).store(&again).build().unwrap_err();
    assert!(err.to_string().contains("unique"), "{err}");
    // Another name, or the same name in another file, is fine.
    Cache::builder("other", source(&items(1), true)).store(&store).build().unwrap();
    let elsewhere = SqliteStore::open(dir.0.as_path().join("b.db")).unwrap();
    Cache::builder("items", source(&items(1), true)).store(&elsewhere).build().unwrap();
    drop(first);
    Cache::builder("items", source(&items(1), true)).store(&store).build().unwrap();
}

#[test]
fn a_cache_s_flush_writes_its_rows_and_its_controllers_keys() {
    let dir = TempDir::new();
    let path = dir.0.as_path().join("state.db");
    // A long interval: only flush() can have written anything.
    let store = SqliteStore::open_with_flush_interval(&path, Duration::from_secs(3600)).unwrap();
    let cache = Cache::builder("items", source(&items(5), true)).store(&store).build().unwrap();
    let gate = Arc::new(Mutex::new(()));
    let held = gate.lock();
    let blocked = Arc::clone(&gate);
    let handle = Controller::from_fn("sync", move |_: &String, _| {
        drop(blocked.lock());
        Ok(Action::Done)
    })
    .store(store)
    .watch_cache(&cache, Watch::new())
    .start();
    assert!(cache.wait_synced(Some(PATIENCE)));
    cache.flush().unwrap();
    let rows = |table: &str| -> i64 {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0)).unwrap()
    };
    assert_eq!(rows("cache_keys"), 5, "the key set is on disk");
    assert!(rows("keys") >= 4, "with the keys its list enqueued (one may be running, kept as waiting)");
    drop(held);
    assert!(handle.wait_idle(PATIENCE));
    handle.flush().unwrap();
    assert_eq!(rows("keys"), 0);
    assert_eq!(rows("cache_keys"), 5);
    handle.stop();
}
