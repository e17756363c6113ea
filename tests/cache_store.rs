//! Caches with a store (guarantees E9, docs/store.md): a restart
//! reconciles exactly the keys created, changed or deleted while the
//! program was down; a delete found then reaches `map` with `None`;
//! `flush()` on a cache; bad input refused with nothing changed; a file of
//! the previous schema migrated; a SIGKILL right after `Cache::flush()`.
//! The SIGKILL rounds against a fenced record are Python's
//! (`tests/python/test_cache_restart.py`).

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, TempDir};
use parking_lot::Mutex;
use reconq::source::Item;
use reconq::{
    Action, Cache, Context, Controller, ControllerHandle, EtcdSource, PollingSource, ReconcileError, Source,
    SqliteStore, StoreError, Watch,
};

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

/// What one run saw: the keys reconciled, the keys `map` was given with
/// whether it had an object, and whether `predicate` had (old, new).
#[derive(Debug, Default)]
struct Run {
    reconciled: BTreeSet<String>,
    mapped: BTreeSet<(String, bool)>,
    predicated: BTreeSet<(bool, bool)>,
}

/// Runs a controller watching a stored cache of `items` until every
/// change is reconciled and flushed, then stops it cleanly.
fn run(path: &Path, items: &Items, versions: bool) -> Run {
    run_source(path, source(items, versions))
}

fn run_source<S>(path: &Path, source: S) -> Run
where
    S: Source<Key = String>,
    S::Version: reconq::Keepable,
    S::Position: reconq::Keepable,
{
    run_built(path, |store| Cache::builder("items", source).store(store).build().unwrap())
}

/// [`run`] with the stored cache `build` makes.
fn run_built<S: Source<Key = String>>(path: &Path, build: impl FnOnce(&SqliteStore) -> Cache<S>) -> Run {
    let store = SqliteStore::open(path).unwrap();
    let cache = build(&store);
    let seen = Arc::new(Mutex::new(Run::default()));
    let (reconciled, mapped, predicated) = (Arc::clone(&seen), Arc::clone(&seen), Arc::clone(&seen));
    let watch = Watch::with_map(move |key: &String, obj: Option<&S::Object>| {
        mapped.lock().mapped.insert((key.clone(), obj.is_some()));
        [key.clone()]
    })
    .predicate(move |old: Option<&S::Object>, new: Option<&S::Object>| {
        predicated.lock().predicated.insert((old.is_some(), new.is_some()));
        true
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

/// Starts controller "sync" with `store`, watching `cache`; returns once
/// the cache synced and what its list enqueued is on disk.
fn start_watching(
    store: SqliteStore,
    cache: &Cache<PollingSource<String, u64, u64>>,
    reconcile: impl Fn(&String, &Context) -> Result<Action, ReconcileError> + Send + Sync + 'static,
) -> ControllerHandle<String> {
    let handle = Controller::from_fn("sync", reconcile).store(store).watch_cache(cache, Watch::new()).start();
    assert!(cache.wait_synced(Some(PATIENCE)));
    cache.flush().unwrap();
    handle
}

/// The rows of `table` in the file at `path` (read by another connection).
fn rows(path: &Path, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0)).unwrap()
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
    // Deletes found at the restart reach map and predicate with None (no
    // state is kept); changed keys reach them as creates.
    let deletes: BTreeSet<(String, bool)> =
        second.mapped.iter().filter(|(key, _)| key == "k02" || key == "k03").cloned().collect();
    assert_eq!(deletes, BTreeSet::from([("k02".into(), false), ("k03".into(), false)]));
    assert_eq!(second.predicated, BTreeSet::from([(false, false), (false, true)]));
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

/// A source without versions: a `PollingSource` of `(key, value)` pairs,
/// listed once.
fn unversioned(items: &Items) -> PollingSource<String, u64> {
    let listed: Vec<(String, u64)> = items.iter().map(|(key, (value, _))| (key.clone(), *value)).collect();
    PollingSource::new(Duration::from_secs(3600), move || Ok::<_, String>(listed.clone())).unwrap()
}

/// A run over [`unversioned`] with `CacheBuilder::digest`, whose
/// canonical bytes are the value's, except for 13, which has none.
fn run_digested(path: &Path, items: &Items) -> Run {
    run_built(path, |store| {
        let canonical = |value: &u64| (*value != 13).then(|| value.to_be_bytes().to_vec());
        Cache::builder("items", unversioned(items)).store(store).digest(canonical).build().unwrap()
    })
}

#[test]
fn without_versions_a_digest_of_each_object_is_compared_at_a_restart() {
    let dir = TempDir::new();
    let path = dir.0.as_path().join("state.db");
    let mut system = items(20);
    assert_eq!(run_digested(&path, &system).reconciled.len(), 20, "the first run reconciles every key");
    for key in ["k00", "k01"] {
        system.get_mut(key).unwrap().0 += 100;
    }
    system.remove("k02");
    let second = run_digested(&path, &system);
    let expected: BTreeSet<String> = ["k00", "k01", "k02", "k13"].map(String::from).into();
    assert_eq!(second.reconciled, expected, "2 changed, 1 deleted, and k13 (no digest) as always");
    assert!(second.mapped.contains(&("k02".to_owned(), false)), "the delete found at the restart");
    let third = run_digested(&path, &system);
    assert_eq!(third.reconciled, BTreeSet::from(["k13".to_owned()]), "nothing changed: only k13");
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
    // After start, watch_cache refuses it, and the controller goes on.
    let running = Controller::from_fn("running", noop).store(other).start();
    let err = running.watch_cache(&cache, Watch::new()).unwrap_err();
    assert!(matches!(err, reconq::WatchError::StoreMismatch(_)), "{err}");
    assert!(!cache.synced() && running.wait_synced(Some(Duration::ZERO)), "nothing was attached");
    running.stop();
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
    let handle = start_watching(store, &cache, move |_, _| {
        drop(blocked.lock());
        Ok(Action::Done)
    });
    let rows = |table: &str| rows(&path, table);
    assert_eq!(rows("cache_keys"), 5, "the key set is on disk");
    assert!(rows("keys") >= 4, "with the keys its list enqueued (one may be running, kept as waiting)");
    drop(held);
    assert!(handle.wait_idle(PATIENCE));
    handle.flush().unwrap();
    assert_eq!(rows("keys"), 0);
    assert_eq!(rows("cache_keys"), 5);
    handle.stop();
}

/// Schema 1 exactly as the previous release wrote it.
const SCHEMA_V1: &str = "
CREATE TABLE keys (
    controller TEXT NOT NULL,
    key BLOB NOT NULL,
    state INTEGER NOT NULL,
    due_unix_ms INTEGER,
    error TEXT,
    failures INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    PRIMARY KEY (controller, key)
) WITHOUT ROWID;
PRAGMA user_version = 1;
";

#[test]
fn a_file_of_schema_1_is_migrated_and_keeps_its_keys() {
    let dir = TempDir::new();
    let path = dir.db();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA_V1).unwrap();
        let insert = "INSERT INTO keys VALUES ('sync', ?1, 0, NULL, NULL, 2, 5)";
        for key in ["a", "b"] {
            conn.execute(insert, [reconq::encode_key(&key.to_string())]).unwrap();
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.load("sync").unwrap().len(), 2, "the keys of schema 1 are read");
    // A controller restores them, and a stored cache keeps its key set.
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let reconciled = Arc::clone(&seen);
    let cache = Cache::builder("items", source(&items(3), true)).store(&store).build().unwrap();
    let handle = start_watching(store, &cache, move |key, ctx| {
        reconciled.lock().insert((key.clone(), ctx.attempt()));
        Ok(Action::Done)
    });
    assert!(handle.wait_idle(PATIENCE));
    let expected: BTreeSet<(String, u32)> =
        [("a", 2), ("b", 2), ("k00", 0), ("k01", 0), ("k02", 0)].map(|(k, a)| (k.to_owned(), a)).into();
    assert_eq!(*seen.lock(), expected, "failure counts continue from schema 1's rows");
    handle.stop();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0)).unwrap();
    assert_eq!(version, reconq::SCHEMA_VERSION);
    assert_eq!(rows(&path, "cache_keys"), 3);
}

#[test]
fn an_etcd_cache_restart_reconciles_exactly_what_changed() {
    let etcd = etcd::Etcd::start();
    for i in 0..20 {
        etcd.put(&format!("/kept/k{i:02}"), &i.to_string());
    }
    let dir = TempDir::new();
    let source = || EtcdSource::new(&etcd.endpoint, "/kept/").unwrap();
    assert_eq!(run_source(&dir.db(), source()).reconciled.len(), 20);
    etcd.put("/kept/k00", "changed");
    etcd.put("/kept/k01", "1"); // the same value, a new mod_revision: changed
    etcd.delete("/kept/k02");
    etcd.put("/kept/new", "x");
    let second = run_source(&dir.db(), source());
    let expected: BTreeSet<String> = ["k00", "k01", "k02", "new"].map(String::from).into();
    assert_eq!(second.reconciled, expected);
    assert!(second.mapped.contains(&("k02".to_owned(), false)));
    assert_eq!(run_source(&dir.db(), source()).reconciled, BTreeSet::new());
}

/// Two controllers watch one stored cache; at the restart the second
/// starts only after the cache synced (it gets the replay). Each keeps
/// its own copy of the key set, so each reconciles exactly the changes.
#[test]
fn each_watching_controller_gets_exactly_the_changes_even_when_it_attaches_after_the_sync() {
    let dir = TempDir::new();
    let mut system = items(10);
    let run_both = |system: &Items| -> [BTreeSet<String>; 2] {
        let store = SqliteStore::open(dir.db()).unwrap();
        let cache = Cache::builder("items", source(system, true)).store(&store).build().unwrap();
        cache.start().unwrap();
        assert!(cache.wait_synced(Some(PATIENCE)));
        let seen: [Arc<Mutex<BTreeSet<String>>>; 2] = Default::default();
        let handles: Vec<_> = ["first", "second"]
            .iter()
            .zip(&seen)
            .map(|(name, seen)| {
                let seen = Arc::clone(seen);
                let reconcile = move |key: &String, _: &Context| {
                    seen.lock().insert(key.clone());
                    Ok(Action::Done)
                };
                let handle = Controller::from_fn(*name, reconcile)
                    .store(store.clone())
                    .watch_cache(&cache, Watch::new())
                    .start();
                cache.flush().unwrap();
                assert!(handle.wait_idle(PATIENCE));
                handle
            })
            .collect();
        cache.flush().unwrap();
        for handle in handles {
            assert!(handle.stop_with_drain(PATIENCE));
        }
        cache.stop();
        seen.map(|seen| std::mem::take(&mut *seen.lock()))
    };
    let all: BTreeSet<String> = system.keys().cloned().collect();
    assert_eq!(run_both(&system), [all.clone(), all]);
    let changed = change_while_down(&mut system);
    assert_eq!(run_both(&system), [changed.clone(), changed]);
}

/// Set in the child of the SIGKILL test: its store file.
const FLUSH_CHILD_ENV: &str = "RECONQ_CACHE_FLUSH_CHILD";

/// The child: a stored cache of 50 keys and a controller whose reconciles
/// never return (every key stays pending); flushes an hour apart, so only
/// `cache.flush()` can have written anything when it says "flushed".
fn flush_child(path: &Path) {
    use std::io::Write;
    let store = SqliteStore::open_with_flush_interval(path, Duration::from_secs(3600)).unwrap();
    let cache = Cache::builder("items", source(&items(50), true)).store(&store).build().unwrap();
    let _handle = start_watching(store, &cache, |_, _| {
        std::thread::park();
        Ok(Action::Done)
    });
    std::io::stdout().write_all(b"flushed\n").unwrap();
    std::thread::park();
}

#[test]
fn sigkill_right_after_cache_flush_keeps_everything_applied_before() {
    use std::io::BufRead;
    if let Ok(path) = std::env::var(FLUSH_CHILD_ENV) {
        return flush_child(Path::new(&path));
    }
    let dir = TempDir::new();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sigkill_right_after_cache_flush_keeps_everything_applied_before", "--nocapture"])
        .env(FLUSH_CHILD_ENV, dir.db())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("flushed") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited early");
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let again = run(&dir.db(), &items(50), true);
    assert!(again.mapped.is_empty(), "the kept key set survived: nothing delivered again: {:?}", again.mapped);
    assert_eq!(again.reconciled.len(), 50, "every pending key came back");
}

/// The encoding of a `String` key in the file (docs/store.md, "Key
/// encoding"): tag 1, u32 BE length, UTF-8.
fn encoded(key: &str) -> Vec<u8> {
    let mut out = vec![1];
    out.extend((key.len() as u32).to_be_bytes());
    out.extend(key.as_bytes());
    out
}

/// Issue 32 (E9, deletes after a crash): no reconcile of a create starts
/// before the controller's copy of the key set holds that key on disk, so
/// a crash right after it cannot lose the key's delete. The store's flush
/// interval is an hour, so only the create's own write can have put the
/// row there; each reconcile reads the file (another connection) as it
/// starts. Creates of the first list and live ones (later polls) alike.
#[test]
fn a_create_is_reconciled_only_once_its_key_is_in_the_file() {
    let dir = TempDir::new();
    let path = dir.0.join("state.db");
    let live: Arc<Mutex<Vec<(String, u64)>>> =
        Arc::new(Mutex::new((0..10).map(|i| (format!("first{i}"), i)).collect()));
    let listed = Arc::clone(&live);
    let source = PollingSource::with_items(Duration::from_millis(20), move || {
        let items =
            listed.lock().iter().map(|(key, obj)| Item { key: key.clone(), obj: *obj, version: Some(1u64) }).collect();
        Ok::<Vec<_>, String>(items)
    })
    .unwrap();
    let store = SqliteStore::open_with_flush_interval(&path, Duration::from_secs(3600)).unwrap();
    let cache = Cache::builder("items", source).store(&store).build().unwrap();
    // key -> whether its row was in the file when its reconcile started.
    let seen: Arc<Mutex<BTreeMap<String, bool>>> = Arc::default();
    let (record, file) = (Arc::clone(&seen), path.clone());
    let handle = Controller::from_fn("sync", move |key: &String, _| {
        let conn = rusqlite::Connection::open(&file).unwrap();
        let rows: i64 =
            conn.query_row("SELECT count(*) FROM cache_keys WHERE key = ?1", [encoded(key)], |row| row.get(0)).unwrap();
        record.lock().insert(key.clone(), rows == 1);
        Ok(Action::Done)
    })
    .store(store)
    .watch_cache(&cache, Watch::new())
    .start();
    assert!(cache.wait_synced(Some(PATIENCE)));
    for i in 0..10 {
        live.lock().push((format!("live{i}"), i));
        std::thread::sleep(Duration::from_millis(5)); // spread over polls, not a wait
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    while seen.lock().len() < 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen = std::mem::take(&mut *seen.lock());
    assert!(handle.stop_with_drain(PATIENCE));
    cache.stop();
    assert_eq!(seen.len(), 20, "every create reconciled: {seen:?}");
    let early: Vec<_> = seen.iter().filter(|(_, in_file)| !**in_file).map(|(key, _)| key).collect();
    assert!(early.is_empty(), "reconciled before its key was in the file: {early:?}");
}
