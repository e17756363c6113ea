//! Replicas with caches, stores and pipelines on a real etcd (guarantees
//! §17): a gained partition is reconciled from the watched caches (C1),
//! deletes included (tombstones, `map` given `None`), with `partition_by`,
//! the gained keys in one batch so dependencies order them; a restarted
//! replica's stored keys wait for their partition's owner (C2); a standby
//! leader keeps its caches and reconciles what they hold pending (C5).
//! Replicas run in one process here; the SIGKILL of an owner is in
//! tests/python/test_sharding_cache.py.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TempDir, wait_for};
use etcd::Etcd;
use parking_lot::Mutex;
use reconq::{
    Action, Cache, Context, Controller, ControllerHandle, EtcdSource, LeaderElection, ReconcileError, Sharding,
    SqliteStore, Watch, partition_of,
};

const PREFIX: &str = "/objects/";
const PARTITIONS: u32 = 4;
const TTL: Duration = Duration::from_secs(2);

/// What every replica reconciled: (replica, key, the cache's value then, when).
type Record = Arc<Mutex<Vec<(String, String, Option<String>, Instant)>>>;

fn cache(etcd: &Etcd) -> Cache<EtcdSource<String>> {
    let source = EtcdSource::new(&etcd.endpoint, PREFIX).unwrap().decode(|v: &[u8]| String::from_utf8(v.to_vec()));
    Cache::builder("objects", source).build().unwrap()
}

fn sharding(etcd: &Etcd, group: &str, who: &str) -> Sharding {
    Sharding::new(&etcd.endpoint, group).partitions(PARTITIONS).ttl(TTL).identity(who)
}

/// A replica `who` of `group` watching its own cache of `PREFIX` through
/// `watch`, recording what it reconciled.
fn replica(
    etcd: &Etcd,
    group: &str,
    who: &str,
    record: &Record,
    configure: impl FnOnce(Controller<String>, &Cache<EtcdSource<String>>) -> Controller<String>,
) -> ControllerHandle<String> {
    let cache = cache(etcd);
    let (record, reader, who_owned) = (Arc::clone(record), cache.clone(), who.to_owned());
    let controller = Controller::new(format!("{group}-{who}"), move |key: &String, _: &Context| {
        let value = reader.get(key).as_deref().cloned();
        record.lock().push((who_owned.clone(), key.clone(), value, Instant::now()));
        Ok::<_, ReconcileError>(Action::Done)
    })
    .workers(2)
    .sharding(sharding(etcd, group, who));
    configure(controller, &cache).start()
}

fn plain_watch(controller: Controller<String>, cache: &Cache<EtcdSource<String>>) -> Controller<String> {
    controller.watch_cache(cache, Watch::new())
}

/// Whether `who` reconciled `key` after `since`, seeing `value`.
fn reconciled_after(record: &Record, who: &str, key: &str, value: Option<&str>, since: Instant) -> bool {
    record.lock().iter().any(|(w, k, v, at)| w == who && k == key && v.as_deref() == value && *at >= since)
}

fn both_own_two(a: &ControllerHandle<String>, b: &ControllerHandle<String>) -> bool {
    a.owned_partitions().len() == 2 && b.owned_partitions().len() == 2
}

/// Keys `k0`.. until both replicas' partitions have at least `per` keys.
fn keys_of(a: &BTreeSet<u32>, per: usize, by: impl Fn(&String) -> String) -> (Vec<String>, Vec<String>) {
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    for i in 0.. {
        let key = format!("k{i}");
        let side = if a.contains(&partition_of(&by(&key), PARTITIONS)) { &mut mine } else { &mut theirs };
        if side.len() < per {
            side.push(key);
        }
        if mine.len() == per && theirs.len() == per {
            break;
        }
    }
    (mine, theirs)
}

/// The user's report (issue 34): two replicas each watching a cache of
/// the same prefix; every key put reached both caches, and only its owner
/// kept it. Once the owner of some keys is gone, the survivor gains its
/// partitions and reconciles those keys, at the state the cache holds.
#[test]
fn c1_a_replica_gaining_partitions_reconciles_the_keys_its_cache_holds() {
    let etcd = Etcd::start();
    let record = Record::default();
    let a = replica(&etcd, "c1", "a", &record, plain_watch);
    let b = replica(&etcd, "c1", "b", &record, plain_watch);
    wait_for("two partitions each", || both_own_two(&a, &b));
    let (of_a, of_b) = keys_of(&a.owned_partitions(), 3, String::clone);
    for key in of_a.iter().chain(&of_b) {
        etcd.put(&format!("{PREFIX}{key}"), "v1");
    }
    wait_for("each key reconciled by its owner", || {
        of_a.iter().all(|k| reconciled_after(&record, "a", k, Some("v1"), Instant::now() - Duration::from_secs(600)))
    });
    // Changes that reach b's cache while a owns their keys: b drops them.
    for key in &of_a {
        etcd.put(&format!("{PREFIX}{key}"), "v2");
    }
    wait_for("a reconciled the changes", || {
        of_a.iter().all(|k| reconciled_after(&record, "a", k, Some("v2"), Instant::now() - Duration::from_secs(600)))
    });
    assert!(b.stats().not_owned > 0, "b saw a's keys and dropped them");
    let stopped = Instant::now();
    a.stop();
    assert!(a.join_timeout(Duration::from_secs(30)));
    wait_for("b owns every partition", || b.owned_partitions().len() == PARTITIONS as usize);
    wait_for("b reconciled every key a owned", || {
        of_a.iter().all(|k| reconciled_after(&record, "b", k, Some("v2"), stopped))
    });
    b.stop();
}

/// A delete that reached b while a owned the key: b keeps its tombstone,
/// and reconciles the key (its `map` given `None`) once it gains it.
#[test]
fn c1_a_delete_applied_while_not_owning_is_reconciled_by_the_next_owner() {
    let etcd = Etcd::start();
    let record = Record::default();
    // Every call of b's map: (key, whether it was given None, when).
    let deletes_mapped: Arc<Mutex<Vec<(String, bool, Instant)>>> = Arc::default();
    let mapped = Arc::clone(&deletes_mapped);
    let a = replica(&etcd, "tomb", "a", &record, plain_watch);
    let b = replica(&etcd, "tomb", "b", &record, move |controller, cache| {
        controller.watch_cache(
            cache,
            Watch::with_map(move |key: &String, obj: Option<&String>| {
                mapped.lock().push((key.clone(), obj.is_none(), Instant::now()));
                [key.clone()]
            }),
        )
    });
    wait_for("two partitions each", || both_own_two(&a, &b));
    let (of_a, _) = keys_of(&a.owned_partitions(), 2, String::clone);
    for key in &of_a {
        etcd.put(&format!("{PREFIX}{key}"), "v1");
    }
    let gone = &of_a[0];
    wait_for("a reconciled the puts", || {
        of_a.iter().all(|k| reconciled_after(&record, "a", k, Some("v1"), Instant::now() - Duration::from_secs(600)))
    });
    let deleted = Instant::now();
    etcd.delete(&format!("{PREFIX}{gone}"));
    wait_for("a reconciled the delete", || reconciled_after(&record, "a", gone, None, deleted));
    // b's cache applied it (a live delete maps the last state held).
    wait_for("b's cache applied it", || deletes_mapped.lock().iter().any(|(k, _, at)| k == gone && *at >= deleted));
    let stopped = Instant::now();
    a.stop();
    assert!(a.join_timeout(Duration::from_secs(30)));
    wait_for("b reconciled the deleted key", || reconciled_after(&record, "b", gone, None, stopped));
    assert!(
        deletes_mapped.lock().iter().any(|(k, none, at)| k == gone && *none && *at >= stopped),
        "the gain maps the tombstone with None"
    );
    b.stop();
}

/// `partition_by` decides which keys a gain enqueues, and the gained keys
/// come in one batch: a pipeline (parent `p/0`, then `p/1`, then `p/2`,
/// sharing a partition through `partition_by`) runs parents first on the
/// replica that gains it.
#[test]
fn c1_gained_keys_follow_partition_by_and_run_parents_first() {
    let etcd = Etcd::start();
    let record = Record::default();
    let pipeline = |key: &String| key.split('/').next().unwrap_or_default().to_owned();
    let with_pipelines = move |controller: Controller<String>, cache: &Cache<EtcdSource<String>>| {
        controller.partition_by(pipeline).watch_cache(cache, Watch::new())
    };
    let a = replica(&etcd, "dag", "a", &record, with_pipelines);
    let b = replica(&etcd, "dag", "b", &record, with_pipelines);
    wait_for("two partitions each", || both_own_two(&a, &b));
    let (prefixes_of_a, _) = keys_of(&a.owned_partitions(), 4, String::clone);
    let stages = |p: &String| (0..3).map(|i| format!("{p}/{i}")).collect::<Vec<_>>();
    for p in &prefixes_of_a {
        let keys = stages(p);
        for (i, key) in keys.iter().enumerate().skip(1) {
            for replica in [&a, &b] {
                replica.set_dependencies(key, [keys[i - 1].clone()]).unwrap();
            }
        }
        for key in &keys {
            etcd.put(&format!("{PREFIX}{key}"), "v1");
        }
    }
    wait_for("a reconciled its pipelines", || {
        prefixes_of_a
            .iter()
            .flat_map(stages)
            .all(|k| reconciled_after(&record, "a", &k, Some("v1"), Instant::now() - Duration::from_secs(600)))
    });
    let stopped = Instant::now();
    a.stop();
    assert!(a.join_timeout(Duration::from_secs(30)));
    wait_for("b reconciled every stage", || {
        prefixes_of_a.iter().flat_map(stages).all(|k| reconciled_after(&record, "b", &k, Some("v1"), stopped))
    });
    let runs: Vec<String> =
        record.lock().iter().filter(|(w, _, _, at)| w == "b" && *at >= stopped).map(|(_, k, _, _)| k.clone()).collect();
    for p in &prefixes_of_a {
        let first = |key: &String| runs.iter().position(|k| k == key).unwrap();
        let order: Vec<usize> = stages(p).iter().map(first).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{p}: stages ran out of order: {runs:?}");
    }
    b.stop();
}

/// C2 with a store: keys stored pending come back at a restart, and wait
/// for their partition to be claimed instead of being dropped as another
/// replica's before the first claim.
#[test]
fn c2_stored_keys_wait_for_their_partition_after_a_restart() {
    let etcd = Etcd::start();
    let dir = TempDir::new();
    let calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let start = |block: bool| {
        let calls = Arc::clone(&calls);
        Controller::new("stored", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
            calls.lock().push(key.clone());
            if block && key == "block" {
                while !ctx.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                return Err("cancelled".into());
            }
            Ok(Action::Done)
        })
        .workers(1)
        .store(SqliteStore::open(dir.db()).unwrap())
        .sharding(sharding(&etcd, "stored", "only"))
        .start()
    };
    let first = start(true);
    wait_for("every partition claimed", || first.owned_partitions().len() == PARTITIONS as usize);
    first.enqueue("block".to_string());
    wait_for("the one worker is busy", || calls.lock().contains(&"block".to_string()));
    let waiting: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    for key in &waiting {
        first.enqueue(key.clone());
    }
    first.stop();
    assert!(first.join_timeout(Duration::from_secs(30)));
    calls.lock().clear();

    let again = start(false);
    wait_for("every stored key reconciled after the restart", || {
        let calls = calls.lock();
        waiting.iter().chain([&"block".to_string()]).all(|k| calls.contains(k))
    });
    again.stop();
}

/// C5: a standby keeps its cache synced and its queue; on taking over it
/// reconciles every key changed while the leader held them, at the state
/// its cache holds (E2 across the hand-over).
#[test]
fn c5_a_standby_reconciles_what_its_cache_holds_pending_on_taking_over() {
    let etcd = Etcd::start();
    let record = Record::default();
    let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let elected = |who: &str, blocking: bool| {
        let cache = cache(&etcd);
        let (record, reader, who_owned, release) =
            (Arc::clone(&record), cache.clone(), who.to_owned(), Arc::clone(&release));
        let handle = Controller::new(format!("c5-{who}"), move |key: &String, ctx: &Context| {
            let value = reader.get(key).as_deref().cloned();
            // The leader holds its reconciles until the test lets go.
            while blocking && !release.load(std::sync::atomic::Ordering::SeqCst) && !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            record.lock().push((who_owned.clone(), key.clone(), value, Instant::now()));
            Ok::<_, ReconcileError>(Action::Done)
        })
        .workers(2)
        .leader_election(LeaderElection::new(&etcd.endpoint, "c5").ttl(TTL).identity(who))
        .watch_cache(&cache, Watch::new())
        .start();
        (handle, cache)
    };
    let (a, _) = elected("a", true);
    wait_for("a leads", || a.stats().leader.is_some_and(|l| l.is_leader()));
    let (b, b_cache) = elected("b", false);
    assert!(b.wait_synced(Some(Duration::from_secs(30))), "a standby's cache syncs");
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    for key in &keys {
        etcd.put(&format!("{PREFIX}{key}"), "v1");
    }
    for key in &keys {
        etcd.put(&format!("{PREFIX}{key}"), "v2");
    }
    wait_for("b's cache holds the last puts", || {
        keys.iter().all(|k| b_cache.get(k).as_deref().map(String::as_str) == Some("v2"))
    });
    let stopped = Instant::now();
    a.stop();
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(a.join_timeout(Duration::from_secs(30)));
    wait_for("b reconciled every key at its last state", || {
        keys.iter().all(|k| reconciled_after(&record, "b", k, Some("v2"), stopped))
    });
    b.stop();
}
