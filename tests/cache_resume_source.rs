//! A restart that resumes (guarantees E9, issue 36 item 2), against a
//! source of this file: a system with a history of revisions that can be
//! compacted, a resume state, `restore`, and `CaughtUp` once a restored
//! stream has replayed everything up to where the system was. Each round
//! is an in-process restart: everything dropped, then built again on the
//! same store file. Checked: no list call on a resume, exactly the keys
//! changed while down reconciled, a delete while down reaching `map` with
//! the object held, the contents equal to the system's; a compaction
//! while down taking the relist path; two controllers on one resumed
//! cache, one of them attached between the load and `CaughtUp`; a cache
//! whose objects cannot be kept relisting as before. The etcd rounds are
//! `tests/cache_resume.rs`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{PATIENCE, TempDir, wait_for};
use parking_lot::Mutex;
use reconq::source::{Changes, Event, Item, Listing, ListingOf, ResumeState, Stop};
use reconq::{
    Action, Cache, CacheStats, Controller, ControllerHandle, KeptObject, Source, SourceError, SqliteStore, Watch,
};

/// What the system holds, and every change with its revision.
#[derive(Default)]
struct History {
    revision: i64,
    /// key -> (value, revision of its last change)
    items: BTreeMap<String, (Value, i64)>,
    /// (revision, key, value; `None`: deleted)
    log: Vec<(i64, String, Option<Value>)>,
    /// Changes at or before this revision are gone: a stream from before
    /// it is expired.
    compacted: i64,
    lists: usize,
}

impl History {
    fn put(&mut self, key: &str, value: &str) {
        self.revision += 1;
        let value = Value(value.as_bytes().to_vec());
        self.items.insert(key.to_owned(), (value.clone(), self.revision));
        self.log.push((self.revision, key.to_owned(), Some(value)));
    }

    fn delete(&mut self, key: &str) {
        self.revision += 1;
        self.items.remove(key);
        self.log.push((self.revision, key.to_owned(), None));
    }

    fn compact(&mut self) {
        self.compacted = self.revision;
    }

    fn listing(&self) -> BTreeMap<String, Value> {
        self.items.iter().map(|(key, (value, _))| (key.clone(), value.clone())).collect()
    }
}

/// An object; one whose bytes start with `!` cannot be kept.
#[derive(Debug, Clone, PartialEq)]
struct Value(Vec<u8>);

impl KeptObject for Value {
    fn kept_object(&self) -> Option<Vec<u8>> {
        (self.0.first() != Some(&b'!')).then(|| self.0.clone())
    }

    fn from_kept_object(bytes: &[u8]) -> Option<Self> {
        Some(Value(bytes.to_vec()))
    }
}

type System = Arc<Mutex<History>>;

/// The resume state this source keeps beside a position.
const STATE: &[u8] = b"history-v1";

struct HistorySource {
    system: System,
    /// `restore` was called: the next stream ends its replay with
    /// `CaughtUp`.
    restored: bool,
    /// `CaughtUp` waits until this is set (a test attaches a controller
    /// between the load and the sync).
    release: Arc<AtomicBool>,
}

impl Source for HistorySource {
    type Key = String;
    type Object = Value;
    type Position = i64;
    type Version = i64;

    fn list(&mut self, _stop: &Stop) -> Result<ListingOf<Self>, SourceError> {
        let mut history = self.system.lock();
        history.lists += 1;
        let items = history
            .items
            .iter()
            .map(|(key, (value, revision))| Item { key: key.clone(), obj: value.clone(), version: Some(*revision) })
            .collect();
        Ok(Listing { items, position: Some(history.revision) })
    }

    fn changes(&mut self, from: Option<&i64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let from = *from.expect("a source with positions");
        let history = self.system.lock();
        if from < history.compacted {
            return Err(SourceError::expired(format!("revision {from} compacted")));
        }
        let mut events: Vec<Event<String, Value, i64, i64>> = history
            .log
            .iter()
            .filter(|(revision, ..)| *revision > from)
            .map(|(revision, key, value)| match value {
                Some(obj) => Event::Put {
                    key: key.clone(),
                    obj: obj.clone(),
                    position: Some(*revision),
                    version: Some(*revision),
                },
                None => Event::Delete { key: key.clone(), position: Some(*revision) },
            })
            .collect();
        let now = history.revision;
        drop(history);
        let caught_up = std::mem::take(&mut self.restored);
        let (release, stop) = (Arc::clone(&self.release), stop.clone());
        let mut held = caught_up.then_some(Event::CaughtUp { position: now });
        events.reverse();
        Ok(Box::new(std::iter::from_fn(move || {
            if let Some(event) = events.pop() {
                return Some(Ok(event));
            }
            if held.is_some() {
                while !release.load(Ordering::Acquire) {
                    if stop.wait_timeout(Duration::from_millis(5)) {
                        return None;
                    }
                }
                return held.take().map(Ok);
            }
            // Quiet until the cache stops.
            while !stop.wait_timeout(Duration::from_secs(1)) {}
            None
        })))
    }

    fn resume_state(&self) -> Option<ResumeState> {
        Some(Arc::new(|| STATE.to_vec()))
    }

    fn restore(&mut self, _position: &i64, state: &[u8]) -> bool {
        self.restored = state == STATE;
        self.restored
    }
}

/// What one run saw and ended with.
#[derive(Debug, Default)]
struct Run {
    /// Per controller: the keys it reconciled.
    reconciled: Vec<BTreeSet<String>>,
    /// Per controller: the deletes `map` was given, each with the object
    /// it was given (the one held before).
    deleted: Vec<BTreeMap<String, Option<Vec<u8>>>>,
    held: BTreeMap<String, Value>,
    stats: Option<CacheStats<i64>>,
    lists: usize,
}

/// How a run is set up.
#[derive(Clone, Copy)]
struct Setup {
    controllers: usize,
    /// The second controller attaches after the cache loaded its
    /// snapshot and before its stream caught up (a resume only).
    late_second: bool,
    /// `CacheBuilder::keep_objects`.
    keep: bool,
}

const ONE: Setup = Setup { controllers: 1, late_second: false, keep: true };

/// Starts a controller watching `cache`; records what it sees in slot
/// `slot` of `seen`.
fn controller(
    store: &SqliteStore,
    cache: &Cache<HistorySource>,
    seen: &Arc<Mutex<Run>>,
    slot: usize,
) -> ControllerHandle<String> {
    let (reconciled, mapped, reader) = (Arc::clone(seen), Arc::clone(seen), cache.clone());
    let watch = Watch::with_map(move |key: &String, obj: Option<&Value>| {
        if reader.get(key).is_none() {
            mapped.lock().deleted[slot].insert(key.clone(), obj.map(|v| v.0.clone()));
        }
        [key.clone()]
    });
    Controller::from_fn(format!("sync{slot}"), move |key: &String, _| {
        reconciled.lock().reconciled[slot].insert(key.clone());
        Ok(Action::Done)
    })
    .store(store.clone())
    .watch_cache(cache, watch)
    .start()
}

/// One run of the program: a stored cache that keeps its objects, its
/// controllers, until every change is reconciled and written; then
/// everything stopped and dropped.
fn run(system: &System, path: &Path, setup: Setup) -> Run {
    let store = SqliteStore::open(path).unwrap();
    let release = Arc::new(AtomicBool::new(!setup.late_second));
    let source = HistorySource { system: Arc::clone(system), restored: false, release: Arc::clone(&release) };
    let builder = Cache::builder("history", source).store(&store);
    let cache = if setup.keep { builder.keep_objects() } else { builder }.build().unwrap();
    let seen = Arc::new(Mutex::new(Run {
        reconciled: vec![BTreeSet::new(); setup.controllers],
        deleted: vec![BTreeMap::new(); setup.controllers],
        ..Run::default()
    }));
    let mut handles = vec![controller(&store, &cache, &seen, 0)];
    if setup.late_second {
        wait_for("the cache loaded its snapshot", || !cache.is_empty());
        assert!(!cache.synced(), "not synced before CaughtUp");
    }
    handles.extend((1..setup.controllers).map(|slot| controller(&store, &cache, &seen, slot)));
    release.store(true, Ordering::Release);
    assert!(cache.wait_synced(Some(PATIENCE)));
    cache.flush().unwrap();
    for handle in &handles {
        assert!(handle.wait_idle(PATIENCE));
    }
    cache.flush().unwrap();
    for handle in handles {
        assert!(handle.stop_with_drain(PATIENCE));
    }
    let mut run = std::mem::take(&mut *seen.lock());
    run.held = cache.keys().into_iter().map(|key| (key.clone(), cache.get(&key).unwrap().as_ref().clone())).collect();
    run.stats = Some(cache.stats());
    cache.stop();
    run.lists = system.lock().lists;
    run
}

fn seeded(n: usize) -> System {
    let mut history = History::default();
    for i in 0..n {
        history.put(&format!("k{i:02}"), &i.to_string());
    }
    Arc::new(Mutex::new(history))
}

/// Changes a key, deletes two, creates one; returns the keys changed.
fn change_while_down(system: &System) -> BTreeSet<String> {
    let mut history = system.lock();
    history.put("k00", "changed");
    history.delete("k02");
    history.delete("k03");
    history.put("new", "x");
    ["k00", "k02", "k03", "new"].map(String::from).into()
}

/// The deletes of `change_while_down`, each with the object held before.
fn deletes_with_objects() -> BTreeMap<String, Option<Vec<u8>>> {
    [("k02".to_owned(), Some(b"2".to_vec())), ("k03".to_owned(), Some(b"3".to_vec()))].into()
}

fn resumed(run: &Run) -> (bool, u64) {
    let stats = run.stats.as_ref().unwrap();
    (stats.resumed, stats.relists)
}

#[test]
fn a_restart_resumes_without_a_list_and_reconciles_exactly_the_changes() {
    let system = seeded(12);
    let dir = TempDir::new();
    let first = run(&system, &dir.db(), ONE);
    assert_eq!((first.reconciled[0].len(), first.lists, resumed(&first)), (12, 1, (false, 0)));
    let changed = change_while_down(&system);
    let second = run(&system, &dir.db(), ONE);
    assert_eq!(second.lists, 1, "no list call at the resume");
    assert_eq!(resumed(&second), (true, 0));
    assert_eq!(second.reconciled[0], changed);
    assert_eq!(second.deleted[0], deletes_with_objects(), "a delete while down arrives with the object held");
    assert_eq!(second.held, system.lock().listing());
    let third = run(&system, &dir.db(), ONE);
    assert_eq!((&third.reconciled[0], third.lists, resumed(&third)), (&BTreeSet::new(), 1, (true, 0)));
}

#[test]
fn a_compaction_while_down_relists_and_reconciles_exactly_the_changes() {
    let system = seeded(12);
    let dir = TempDir::new();
    run(&system, &dir.db(), ONE);
    let changed = change_while_down(&system);
    system.lock().compact();
    let second = run(&system, &dir.db(), ONE);
    assert_eq!((second.lists, resumed(&second)), (2, (true, 1)), "loaded, then relisted");
    assert_eq!(second.reconciled[0], changed);
    assert_eq!(second.deleted[0], deletes_with_objects(), "the relist's deletes carry the loaded object");
    assert_eq!(second.held, system.lock().listing());
    // The relist was kept: the next restart resumes from it.
    system.lock().put("k04", "again");
    let third = run(&system, &dir.db(), ONE);
    assert_eq!((third.lists, resumed(&third)), (2, (true, 0)));
    assert_eq!(third.reconciled[0], ["k04".to_owned()].into());
}

#[test]
fn two_controllers_on_one_resumed_cache_each_get_exactly_the_changes() {
    let system = seeded(12);
    let dir = TempDir::new();
    let two = Setup { controllers: 2, ..ONE };
    run(&system, &dir.db(), two);
    let changed = change_while_down(&system);
    // The second attaches after the load, before CaughtUp: it catches up
    // on the loaded keys, and its restart difference is its own.
    let second = run(&system, &dir.db(), Setup { late_second: true, ..two });
    assert_eq!((second.lists, resumed(&second)), (1, (true, 0)));
    for slot in 0..2 {
        assert_eq!(second.reconciled[slot], changed, "controller {slot}");
    }
    assert_eq!(second.deleted[0], deletes_with_objects());
    // The late one may attach after the stream replayed the deletes: then
    // its restart difference finds them, without the object.
    let late: BTreeSet<&String> = second.deleted[1].keys().collect();
    assert_eq!(late, deletes_with_objects().keys().collect());
    assert_eq!(second.held, system.lock().listing());
}

#[test]
fn a_cache_whose_objects_cannot_be_kept_relists_as_before() {
    let system = seeded(12);
    system.lock().put("k05", "!not kept");
    let dir = TempDir::new();
    run(&system, &dir.db(), ONE);
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let kept: i64 = conn.query_row("SELECT count(*) FROM cache_snapshots", [], |row| row.get(0)).unwrap();
    assert_eq!(kept, 0, "no snapshot kept");
    let changed = change_while_down(&system);
    let second = run(&system, &dir.db(), ONE);
    assert_eq!((second.lists, resumed(&second)), (2, (false, 0)), "listed");
    assert_eq!(second.reconciled[0], changed, "the kept key set still gives exactly the changes");
    assert_eq!(second.held, system.lock().listing());
}

#[test]
fn a_resume_delivers_each_loaded_key_the_controller_kept_otherwise() {
    let system = seeded(12);
    let dir = TempDir::new();
    run(&system, &dir.db(), ONE);
    // The controller's rows, made to differ from the snapshot the cache
    // loads: another version, no version kept, and no row at all.
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    let key = |k: &str| reconq::encode_key(&k.to_owned());
    let edit = |sql: &str, k: &str| assert_eq!(conn.execute(sql, [key(k)]).unwrap(), 1, "{sql} {k}");
    edit("UPDATE cache_keys SET version = X'00' WHERE key = ?1", "k01");
    edit("UPDATE cache_keys SET version = NULL WHERE key = ?1", "k04");
    edit("DELETE FROM cache_keys WHERE key = ?1", "k07");
    drop(conn);
    let second = run(&system, &dir.db(), ONE);
    assert_eq!((second.lists, resumed(&second)), (1, (true, 0)));
    assert_eq!(second.reconciled[0], ["k01", "k04", "k07"].map(String::from).into(), "those three, and no other");
    let third = run(&system, &dir.db(), ONE);
    assert_eq!(third.reconciled[0], BTreeSet::new(), "their rows were kept again");
}

/// What keeping the objects costs on disk, and what a restart reads: not
/// a check (run it by name with `--ignored --nocapture`; the figures are
/// in docs/store.md).
#[test]
#[ignore]
fn measure_what_keeping_objects_costs() {
    const KEYS: usize = 100_000;
    for keep in [false, true] {
        let system = seeded(KEYS);
        let dir = TempDir::new();
        let setup = Setup { keep, ..ONE };
        let started = std::time::Instant::now();
        run(&system, &dir.db(), setup);
        let first = started.elapsed();
        let size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
        let after_first = size(&dir.db());
        system.lock().put("k00", "changed");
        let started = std::time::Instant::now();
        let second = run(&system, &dir.db(), setup);
        println!(
            "keep_objects={keep}: {KEYS} keys, file {after_first} B after the first run ({} B a key); first run {first:?}, \
             restart after one change {:?} (lists {}, resumed {:?})",
            after_first / KEYS as u64,
            started.elapsed(),
            second.lists,
            resumed(&second),
        );
    }
}
