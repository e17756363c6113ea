//! Sharding on a real etcd (guarantees §11), replicas in one process: H2
//! balance after joins and leaves, H3 only owned keys reconciled (others
//! dropped and counted, gained partitions resynced), H4 a partition changes
//! hands only after its reconciles returned, and the faults. Crashes and
//! pauses of whole processes are in tests/python/test_sharding_chaos.py.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;
#[path = "common/faulty_proxy.rs"]
#[allow(dead_code)] // no call is stalled here
mod faulty_proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{PATIENCE, wait_for, wait_for_within};
use etcd::Etcd;
use faulty_proxy::FaultyProxy;
use parking_lot::Mutex;
use reconq::{
    Action, Cache, Context, Controller, ControllerHandle, KeyStatus, PollingSource, ReconcileError, Sharding, Watch,
    partition_of,
};

const TTL: Duration = Duration::from_secs(2);
const PARTITIONS: u32 = 8;
const KEYS: u32 = 64;

fn sharding(etcd: &Etcd, name: &str, identity: &str) -> Sharding {
    Sharding::new(&etcd.endpoint, name).partitions(PARTITIONS).ttl(TTL).identity(identity)
}

/// Reconciles of every replica: (replica, key, token).
type Record = Arc<Mutex<Vec<(String, u32, u64)>>>;

fn replica(etcd: &Etcd, name: &str, who: &str, record: &Record) -> ControllerHandle<u32> {
    unstarted_replica(sharding(etcd, name, who), name, who, record).resync(|| 0..KEYS).start()
}

/// Replica `who` of group `name` under `sharding`, recording its
/// reconciles, with no resync.
fn unstarted_replica(sharding: Sharding, name: &str, who: &str, record: &Record) -> Controller<u32> {
    let (record, who_owned) = (Arc::clone(record), who.to_owned());
    Controller::new(format!("{name}-{who}"), move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        record.lock().push((who_owned.clone(), *key, ctx.fencing_token().unwrap()));
        Ok(Action::Done)
    })
    .workers(2)
    .sharding(sharding)
}

/// A replica of the C2 tests: a lease of 10 s, which a loaded machine
/// does not let lapse (a lapsed lease is a crash, which hands nothing
/// over); partitions still move at once, given up or revoked.
fn c2_replica(etcd: &Etcd, name: &str, who: &str, record: &Record) -> ControllerHandle<u32> {
    let sharding = sharding(etcd, name, who).ttl(Duration::from_secs(10));
    unstarted_replica(sharding, name, who, record).start()
}

/// Every replica owns ⌊P/N⌋ or ⌈P/N⌉ partitions and together all of them.
fn balanced(replicas: &[&ControllerHandle<u32>]) -> bool {
    let owned: Vec<BTreeSet<u32>> = replicas.iter().map(|r| r.owned_partitions()).collect();
    let n = replicas.len() as u32;
    let all: BTreeSet<u32> = owned.iter().flatten().copied().collect();
    let sizes_ok = owned.iter().all(|o| (PARTITIONS / n..=PARTITIONS.div_ceil(n)).contains(&(o.len() as u32)));
    sizes_ok
        && all.len() == PARTITIONS as usize
        && owned.iter().map(BTreeSet::len).sum::<usize>() == PARTITIONS as usize
}

/// Replica "a" of group `name`, once it owns every partition.
fn sole_replica(etcd: &Etcd, name: &str, record: &Record) -> ControllerHandle<u32> {
    let a = replica(etcd, name, "a", record);
    wait_for("a to own everything", || a.owned_partitions().len() == PARTITIONS as usize);
    a
}

/// Enqueues every key in every one of `replicas` (as every Kubernetes
/// replica watches every object) and returns the reconciles that followed.
fn every_key_to_every_replica(replicas: &[&ControllerHandle<u32>], record: &Record) -> Vec<(String, u32, u64)> {
    record.lock().clear();
    for r in replicas {
        for key in 0..KEYS {
            r.enqueue(key);
        }
    }
    for r in replicas {
        assert!(r.wait_idle(PATIENCE));
    }
    record.lock().clone()
}

#[test]
fn replicas_split_the_partitions_and_each_key_runs_on_its_owner_only() {
    let etcd = Etcd::start();
    let record = Record::default();
    let a = sole_replica(&etcd, "h2", &record);
    let b = replica(&etcd, "h2", "b", &record);
    let c = replica(&etcd, "h2", "c", &record);
    wait_for("three-way balance", || balanced(&[&a, &b, &c]));

    // Every replica sees every key: each keeps its own and drops the rest.
    let runs = every_key_to_every_replica(&[&a, &b, &c], &record);
    let owners: BTreeMap<&str, BTreeSet<u32>> =
        [("a", a.owned_partitions()), ("b", b.owned_partitions()), ("c", c.owned_partitions())].into();
    for (who, key, _) in &runs {
        assert!(owners[who.as_str()].contains(&partition_of(key, PARTITIONS)), "H3: {who} ran {key}, not its own");
    }
    let keys: BTreeSet<u32> = runs.iter().map(|(_, k, _)| *k).collect();
    assert_eq!(keys.len(), KEYS as usize, "every key reconciled by its owner");
    let dropped: u64 = [&a, &b, &c].iter().map(|r| r.stats().not_owned).sum();
    assert_eq!(dropped, 2 * u64::from(KEYS), "each key dropped by the two replicas that do not own it");

    // A clean leave: its partitions go to the others, whose resync
    // enqueues their keys.
    record.lock().clear();
    c.stop();
    assert!(c.join_timeout(PATIENCE));
    wait_for("two-way balance after a leave", || balanced(&[&a, &b]));
    wait_for("the moved keys reconciled by their new owners", || {
        let moved: BTreeSet<u32> = record.lock().iter().map(|(_, k, _)| *k).collect();
        (0..KEYS).filter(|k| owners["c"].contains(&partition_of(k, PARTITIONS))).all(|k| moved.contains(&k))
    });
    a.stop();
    b.stop();
}

/// Keys `0..KEYS` of `partitions`: odd ones enqueued in `h` to run in 2 s,
/// even ones in an hour.
fn delay_keys_of(h: &ControllerHandle<u32>, partitions: &BTreeSet<u32>) -> BTreeSet<u32> {
    let keys: BTreeSet<u32> = (0..KEYS).filter(|k| partitions.contains(&partition_of(k, PARTITIONS))).collect();
    for &key in &keys {
        let delay = if key % 2 == 1 { Duration::from_secs(2) } else { Duration::from_secs(3600) };
        h.enqueue_after(key, delay);
    }
    keys
}

/// C2 seen at the next owner `who`: it reconciled the odd keys of `keys`
/// (due in 2 s), and holds the even ones waiting still (due in an hour:
/// the delay travelled with them), reconciled by no one.
fn handed_over_with_their_delays(who: &ControllerHandle<u32>, name: &str, keys: &BTreeSet<u32>, record: &Record) {
    let (soon, later): (BTreeSet<u32>, BTreeSet<u32>) = keys.iter().partition(|&&k| k % 2 == 1);
    assert!(!soon.is_empty() && !later.is_empty());
    wait_for(&format!("{name} to reconcile the keys due in 2 s"), || {
        let ran: BTreeSet<u32> = record.lock().iter().filter(|(w, _, _)| w == name).map(|(_, k, _)| *k).collect();
        soon.is_subset(&ran)
    });
    let half_an_hour = Instant::now() + Duration::from_secs(1800);
    let waiting_long =
        |key: &u32| matches!(who.inspect(key).state, KeyStatus::Waiting { until } if until > half_an_hour);
    wait_for(&format!("{name} to hold the keys due in an hour"), || later.iter().all(waiting_long));
    assert!(record.lock().iter().all(|(_, k, _)| !later.contains(k)), "a key due in an hour ran");
}

/// C2: keys pending when their partition moves (waiting for a due time)
/// go with the hand-over, with what remains of their delays: the next
/// owner reconciles each when it is due, with no cache or `resync` to
/// bring them back.
#[test]
fn c2_keys_pending_when_their_partition_moves_are_handed_over() {
    let etcd = Etcd::start();
    let record = Record::default();
    let (a, keys) = sole_c2_replica_with_pending_keys(&etcd, "c2", &record);
    let b = c2_replica(&etcd, "c2", "b", &record);
    handed_over_with_their_delays(&b, "b", &moved_to(&a, &b, keys), &record);
    a.stop();
    b.stop();
}

/// Replica "a" of group `name`, once it owns every partition, and the
/// keys [`delay_keys_of`] enqueued in it.
fn sole_c2_replica_with_pending_keys(
    etcd: &Etcd,
    name: &str,
    record: &Record,
) -> (ControllerHandle<u32>, BTreeSet<u32>) {
    let a = c2_replica(etcd, name, "a", record);
    wait_for("a to own everything", || a.owned_partitions().len() == PARTITIONS as usize);
    let keys = delay_keys_of(&a, &a.owned_partitions());
    (a, keys)
}

/// Of `keys`, those whose partitions moved from `a` to `b` once the two
/// balanced.
fn moved_to(a: &ControllerHandle<u32>, b: &ControllerHandle<u32>, keys: BTreeSet<u32>) -> BTreeSet<u32> {
    wait_for("two-way balance", || balanced(&[a, b]));
    keys.into_iter().filter(|k| b.owned_partitions().contains(&partition_of(k, PARTITIONS))).collect()
}

/// C2 through a failed read: the next owner's first reads of the
/// hand-overs fail (etcd answers 503), and the keys still arrive, with
/// their delays, from a read retried at a later look at the group.
#[test]
fn c2_a_failed_read_of_the_hand_overs_is_retried() {
    use base64::Engine as _;
    let etcd = Etcd::start();
    let record = Record::default();
    let (a, keys) = sole_c2_replica_with_pending_keys(&etcd, "c2-read", &record);
    let prefix = base64::engine::general_purpose::STANDARD.encode("/reconq/shard/c2-read/handover/");
    let read_of_the_hand_overs = format!("\"key\":\"{prefix}\"");
    let proxy = FaultyProxy::start(&etcd.endpoint, 2, move |body| {
        String::from_utf8_lossy(body).contains(&read_of_the_hand_overs)
    });
    let sharding = Sharding::new(&proxy.endpoint, "c2-read").partitions(PARTITIONS).ttl(Duration::from_secs(10));
    let b = unstarted_replica(sharding.identity("b"), "c2-read", "b", &record).start();
    handed_over_with_their_delays(&b, "b", &moved_to(&a, &b, keys), &record);
    assert!(proxy.failed() >= 1, "no read of the hand-overs failed: the test tested nothing");
    wait_for("the hand-overs read to be deleted", || etcd.list("/reconq/shard/c2-read/handover/").is_empty());
    a.stop();
    b.stop();
}

/// C2 at a clean stop, at once or draining: the keys pending on the
/// replica stopping go with its partitions, with their delays.
#[test]
fn c2_a_clean_stop_hands_its_pending_keys_over() {
    pending_keys_handed_over_at_a_stop("c2-stop", |a| a.stop());
}

#[test]
fn c2_a_draining_stop_hands_its_pending_keys_over() {
    pending_keys_handed_over_at_a_stop("c2-drain", |a| assert!(a.stop_with_drain(PATIENCE)));
}

fn pending_keys_handed_over_at_a_stop(group: &str, stop: impl FnOnce(&ControllerHandle<u32>)) {
    let etcd = Etcd::start();
    let record = Record::default();
    let a = c2_replica(&etcd, group, "a", &record);
    let b = c2_replica(&etcd, group, "b", &record);
    wait_for("two-way balance", || balanced(&[&a, &b]));
    let keys = delay_keys_of(&a, &a.owned_partitions());
    stop(&a);
    assert!(a.join_timeout(PATIENCE));
    handed_over_with_their_delays(&b, "b", &keys, &record);
    b.stop();
}

/// C1 across a join: a replica whose watched caches have not synced is
/// not a member yet, so no partition moves to it before its caches can
/// see the deletes made from then on (a delete before its first list is
/// the old owner's to reconcile or hand over).
#[test]
fn a_replica_joins_only_once_its_caches_synced() {
    let etcd = Etcd::start();
    let record = Record::default();
    let a = sole_replica(&etcd, "join", &record);
    let listable = Arc::new(AtomicBool::new(false));
    let source = PollingSource::new(Duration::from_millis(20), {
        let listable = Arc::clone(&listable);
        move || match listable.load(Ordering::SeqCst) {
            true => Ok(Vec::<(u32, u32)>::new()),
            false => Err("not listable yet"),
        }
    })
    .unwrap();
    let cache = Cache::builder("join-items", source).build().unwrap();
    let b =
        unstarted_replica(sharding(&etcd, "join", "b"), "join", "b", &record).watch_cache(&cache, Watch::new()).start();
    // c, started after b with nothing to sync, joins; b does not.
    let c = replica(&etcd, "join", "c", &record);
    wait_for("a and c to split the partitions", || balanced(&[&a, &c]));
    assert!(b.owned_partitions().is_empty());
    listable.store(true, Ordering::SeqCst);
    wait_for("three-way balance once b's cache synced", || balanced(&[&a, &b, &c]));
    for r in [&a, &b, &c] {
        r.stop();
    }
}

#[test]
fn a_partition_changes_hands_only_after_its_reconcile_returned() {
    let etcd = Etcd::start();
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let record = Record::default();
    let rec = Arc::clone(&record);
    let a = Controller::new("h4-a", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        rec.lock().push(("a".into(), *key, ctx.fencing_token().unwrap()));
        release_rx.recv().ok();
        Ok(Action::Done)
    })
    .workers(PARTITIONS as usize)
    .sharding(sharding(&etcd, "h4", "a"))
    .start();
    wait_for("a to own everything", || a.owned_partitions().len() == PARTITIONS as usize);
    // One running key in every partition.
    let keys: BTreeMap<u32, u32> = (0..1000).map(|k| (partition_of(&k, PARTITIONS), k)).collect();
    for key in keys.values() {
        a.enqueue(*key);
    }
    wait_for("a reconcile per partition", || a.stats().processing == PARTITIONS as usize);

    let b = replica(&etcd, "h4", "b", &record);
    // a gives half up, but none of them while its reconcile runs: b owns
    // nothing until they return (a's grace cancels them, but they wait).
    std::thread::sleep(TTL);
    assert!(b.owned_partitions().is_empty(), "H4: b owns {:?} while a's reconciles run", b.owned_partitions());
    assert_eq!(a.owned_partitions().len(), PARTITIONS as usize / 2, "a stopped handing out the half it gives up");
    for _ in 0..PARTITIONS {
        release_tx.send(()).unwrap();
    }
    wait_for("two-way balance", || balanced(&[&a, &b]));
    wait_for("b to reconcile its keys", || record.lock().iter().any(|(who, _, _)| who == "b"));
    let runs = record.lock().clone();
    let a_tokens: BTreeMap<u32, u64> =
        runs.iter().filter(|(w, _, _)| w == "a").map(|(_, k, t)| (partition_of(k, PARTITIONS), *t)).collect();
    for (_, key, token) in runs.iter().filter(|(w, _, _)| w == "b") {
        let p = partition_of(key, PARTITIONS);
        assert!(*token > a_tokens[&p], "H4: partition {p}'s token grows with its new owner");
    }
    a.stop();
    b.stop();
}

/// H4 across a reset of etcd's history (its data directory wiped): the
/// replicas drop their partitions once they see it and claim them again
/// with tokens above every token of the old history, never a key
/// reconciled by two replicas at once.
#[test]
fn after_etcd_is_wiped_every_partition_token_exceeds_every_old_one() {
    let mut etcd = Etcd::start_with_history();
    let running: Arc<Mutex<BTreeMap<u32, String>>> = Arc::default();
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let record = Record::default();
    let replica = |who: &'static str| {
        let (running, overlaps, record) = (Arc::clone(&running), Arc::clone(&overlaps), Arc::clone(&record));
        Controller::new(format!("reset-{who}"), move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
            if let Some(other) = running.lock().insert(*key, who.to_owned()) {
                overlaps.lock().push((*key, other, who));
            }
            record.lock().push((who.to_owned(), *key, ctx.fencing_token().unwrap()));
            std::thread::sleep(Duration::from_millis(2));
            running.lock().remove(key);
            // Not so often that the workers are always busy: with keys at
            // two priorities (0 from start, -100 from a gain's resync, and
            // hand-overs keep a key's priority), a saturated queue would
            // run only the higher ones (strict priorities), and a key of
            // a partition gained after the wipe could wait for ever.
            Ok(Action::RequeueAfter(Duration::from_millis(50)))
        })
        .workers(2)
        .sharding(sharding(&etcd, "reset", who))
        .resync(|| 0..KEYS)
        .start()
    };
    let (a, b) = (replica("a"), replica("b"));
    wait_for("two-way balance", || balanced(&[&a, &b]));
    let old = record.lock().iter().map(|(_, _, t)| *t).max();
    wait_for("reconciles of every key", || record.lock().len() >= 2 * KEYS as usize);
    let old = record.lock().iter().map(|(_, _, t)| *t).max().max(old).unwrap();
    assert!(old > 50);

    etcd.wipe();
    let seen = record.lock().len();
    wait_for("two-way balance again", || balanced(&[&a, &b]) && record.lock().len() > seen);
    let newer = |(_, _, t): &(String, u32, u64)| *t > old;
    wait_for("every key reconciled under a new token", || {
        let keys: BTreeSet<u32> = record.lock()[seen..].iter().filter(|r| newer(r)).map(|(_, k, _)| *k).collect();
        keys.len() == KEYS as usize
    });
    let runs = record.lock()[seen..].to_vec();
    // Reconciles under old tokens may only have begun before the reset was seen.
    let mut tokens: BTreeMap<u32, u64> = BTreeMap::new();
    for (who, key, token) in &runs {
        let highest = tokens.entry(partition_of(key, PARTITIONS)).or_default();
        assert!(*token >= *highest, "H4: {who} ran {key} under {token} after {highest}");
        *highest = *token;
    }
    assert_eq!(*overlaps.lock(), [], "H4: never a key reconciled by two replicas at once");
    a.stop();
    b.stop();
}

/// Partitions claimed below the fencing floor (by a replica that joined
/// after a reset of etcd it could not see, or before an operator raised
/// the floor) are handed over and claimed again above it once the group
/// changes.
#[test]
fn partitions_claimed_below_the_fencing_floor_are_claimed_again_above_it() {
    let etcd = Etcd::start();
    let record = Record::default();
    let a = sole_replica(&etcd, "below", &record);
    etcd.put("/reconq/fencing-floor", "1000000");
    let b = replica(&etcd, "below", "b", &record);
    wait_for("two-way balance", || balanced(&[&a, &b]));
    let runs = every_key_to_every_replica(&[&a, &b], &record);
    assert_eq!(runs.iter().map(|(_, k, _)| *k).collect::<BTreeSet<u32>>().len(), KEYS as usize);
    assert!(runs.iter().all(|(_, _, token)| *token > 1_000_000), "{runs:?}");
    a.stop();
    b.stop();
}

/// Claiming many partitions neither starves the keep-alive nor starts
/// over (a lost lease drops them all): a lone replica comes to own every
/// one of 4,096 partitions, and of 65,536 (the most a group may have).
#[test]
fn a_replica_owns_thousands_of_partitions() {
    let etcd = Etcd::start();
    for (partitions, patience) in [(4096, PATIENCE), (65_536, PATIENCE * 9)] {
        let name = format!("many-{partitions}");
        // etcd's default TTL, as a user would run it.
        let sh = Sharding::new(&etcd.endpoint, &name).partitions(partitions).ttl(Duration::from_secs(5)).identity("a");
        let h = Controller::new(name, |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .sharding(sh)
            .start();
        wait_for_within(&format!("all {partitions} partitions owned"), patience, || {
            h.owned_partitions().len() == partitions as usize
        });
        h.stop();
        assert!(h.join_timeout(PATIENCE));
    }
}

#[test]
fn bad_input_is_an_error_and_an_unreachable_etcd_owns_nothing() {
    for bad in ["127.0.0.1:2379", "http://nohost"] {
        assert!(Sharding::try_new(bad, "x").is_err(), "{bad}");
    }
    assert!(Sharding::try_new(["http://127.0.0.1:1"], "a/b").is_err(), "no '/' in a name");
    let sh = Sharding::new(etcd::unreachable_endpoint(), "x");
    assert!(sh.clone().try_partitions(0).is_err());
    let too_many = sh.clone().try_partitions(65_537).unwrap_err().to_string();
    assert!(too_many.contains("partitions") && too_many.contains("65536"), "{too_many}");
    assert!(sh.clone().try_partitions(65_536).is_ok());
    assert!(sh.clone().try_ttl(Duration::from_secs(1)).is_err());
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sh.partitions(0))).is_err(), "the builder panics");

    let sh = Sharding::new(etcd::unreachable_endpoint(), "down");
    let h = Controller::new("down-shard", |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
        panic!("a replica that owns nothing reconciles nothing")
    })
    .sharding(sh.clone())
    .start();
    wait_for("the error to show", || h.stats().shards.is_some_and(|s| s.last_error.is_some()));
    h.enqueue(1);
    assert!(h.owned_partitions().is_empty());
    assert_eq!(h.stats().not_owned, 1);
    // One controller per membership.
    let second =
        Controller::new("second", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
            .sharding(sh)
            .try_start();
    assert_eq!(second.err().map(|e| e.kind()), Some(std::io::ErrorKind::InvalidInput));
    h.stop();
    assert!(h.join_timeout(PATIENCE));
}

/// The pipeline of key `k` in the C3 tests: keys 0-7 are one, 8-15 the
/// next, and so on.
fn pipeline(key: &u32) -> u32 {
    key / 8
}

/// C3: keys naming one `partition_by` value share a partition, so each
/// pipeline runs on one replica, the one owning `partition_of_by`'s
/// partition; its edges are accepted, an edge between pipelines of
/// different partitions is refused (C4) on a started controller too.
#[test]
fn c3_keys_naming_one_partition_by_value_run_on_one_replica() {
    let etcd = Etcd::start();
    let record = Record::default();
    let pipelined = |who: &str| {
        let (record, who_owned) = (Arc::clone(&record), who.to_owned());
        Controller::new(format!("c3-{who}"), move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
            record.lock().push((who_owned.clone(), *key, ctx.fencing_token().unwrap()));
            Ok(Action::Done)
        })
        .workers(2)
        .sharding(sharding(&etcd, "c3", who))
        .partition_by(pipeline)
        .resync(|| 0..KEYS)
        .start()
    };
    let (a, b) = (pipelined("a"), pipelined("b"));
    wait_for("two-way balance", || balanced(&[&a, &b]));
    for r in [&a, &b] {
        for key in (0..KEYS).filter(|k| k % 8 != 0) {
            r.set_dependencies(&key, [key - key % 8]).expect("a pipeline stays in its partition");
        }
    }
    let runs = every_key_to_every_replica(&[&a, &b], &record);
    let owners: BTreeMap<&str, BTreeSet<u32>> = [("a", a.owned_partitions()), ("b", b.owned_partitions())].into();
    let mut ran_on: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for (who, key, _) in &runs {
        let partition = reconq::partition_of_by(key, PARTITIONS, pipeline);
        assert!(owners[who.as_str()].contains(&partition), "C3: {who} ran {key} of partition {partition}");
        ran_on.entry(pipeline(key)).or_default().insert(who.as_str());
    }
    assert_eq!(ran_on.len() as u32, KEYS / 8, "every pipeline ran");
    assert!(ran_on.values().all(|replicas| replicas.len() == 1), "each pipeline on one replica: {ran_on:?}");

    // C4 on a started controller: pipelines 0 and 1 in different partitions.
    let (first, other) = (
        0u32,
        (1..KEYS / 8).map(|p| p * 8).find(|k| {
            reconq::partition_of_by(k, PARTITIONS, pipeline) != reconq::partition_of_by(&0, PARTITIONS, pipeline)
        }),
    );
    let other = other.expect("pipelines in two partitions");
    let refused = a.set_dependencies(&first, [other]);
    assert!(matches!(refused, Err(reconq::DependencyError::CrossPartition(_))), "{refused:?}");
    assert!(a.dependencies(&first).is_empty(), "nothing changed");
    a.stop();
    b.stop();
}

/// A controller that is sharded over 8 partitions on an etcd that is
/// never reached (C4 is checked without it).
fn unstarted(name: &str) -> Controller<u32> {
    Controller::new(name, |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
}

/// Two keys of different partitions, and one in the first one's.
fn keys_across_partitions() -> (u32, u32, u32) {
    let a = 0u32;
    let other = (1..).find(|k| partition_of(k, PARTITIONS) != partition_of(&a, PARTITIONS)).unwrap();
    let same = (1..).find(|k| partition_of(k, PARTITIONS) == partition_of(&a, PARTITIONS)).unwrap();
    (a, other, same)
}

/// C4: with sharding, an edge across partitions is an error naming the
/// key, the parent and both partitions, and changes nothing (before
/// start: the partition count is known); one within a partition is kept.
#[test]
fn c4_an_edge_across_partitions_is_refused_and_changes_nothing() {
    let (key, other, same) = keys_across_partitions();
    let c = unstarted("c4").sharding(Sharding::new(etcd::unreachable_endpoint(), "c4").partitions(PARTITIONS));
    let h = c.handle();
    let Err(reconq::DependencyError::CrossPartition(e)) = h.set_dependencies(&key, [same, other]) else {
        panic!("an edge across partitions is refused");
    };
    let (pk, po) = (partition_of(&key, PARTITIONS), partition_of(&other, PARTITIONS));
    assert_eq!((e.key, e.parent, e.key_partition, e.parent_partition), (key, other, pk, po));
    let message = e.to_string();
    for part in [format!("{key} (partition {pk})"), format!("{other} (partition {po})")] {
        assert!(message.contains(&part), "{message} names {part}");
    }
    assert!(h.dependencies(&key).is_empty(), "not even the parent in the same partition");
    h.set_dependencies(&key, [same]).expect("an edge within a partition");
    assert_eq!(h.dependencies(&key), [same]);

    // With partition_by naming one value for both, the edge holds.
    let c = unstarted("c4-by")
        .sharding(Sharding::new(etcd::unreachable_endpoint(), "c4-by").partitions(PARTITIONS))
        .partition_by(|_: &u32| "one pipeline".to_string());
    c.handle().set_dependencies(&key, [other]).expect("one partition_by value, one partition");
    drop(c);
}

/// C4 at start: an edge set before the controller was given its sharding
/// fails `try_start` with an error naming the pair, with nothing started.
#[test]
fn c4_an_edge_set_before_sharding_fails_start_naming_the_pair() {
    let (key, other, _) = keys_across_partitions();
    let c = unstarted("c4-start");
    c.handle().set_dependencies(&key, [other]).expect("no sharding yet: any edge");
    let started =
        c.sharding(Sharding::new(etcd::unreachable_endpoint(), "c4-start").partitions(PARTITIONS)).try_start();
    let Err(e) = started else { panic!("an edge across partitions fails start") };
    assert!(matches!(e, reconq::StartError::CrossPartition(_)), "{e:?}");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let message = e.to_string();
    for part in [format!("{key} (partition"), format!("{other} (partition")] {
        assert!(message.contains(&part), "{message} names {part}");
    }
}

/// A `partition_by` that never answers the same twice (the user's code
/// may not be pure): each reconcile is finished in the partition it was
/// admitted under, so every partition's count of reconciles in flight
/// stays true and the replica still hands its partitions over at once.
#[test]
fn a_partition_by_that_changes_its_answer_keeps_hand_overs_intact() {
    let etcd = Etcd::start();
    let record = Record::default();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (rec, calls_by) = (Arc::clone(&record), Arc::clone(&calls));
    let a = Controller::new("c3-impure-a", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        rec.lock().push(("a".to_owned(), *key, ctx.fencing_token().unwrap()));
        Ok(Action::Done)
    })
    .workers(2)
    .sharding(sharding(&etcd, "c3-impure", "a"))
    .partition_by(move |_: &u32| calls_by.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    .start();
    wait_for("a to own everything", || a.owned_partitions().len() == PARTITIONS as usize);
    for key in 0..KEYS {
        a.enqueue(key);
    }
    assert!(a.wait_idle(PATIENCE));
    assert_eq!(a.stats().successes, u64::from(KEYS), "{:?}", a.stats());
    // A second replica gets half the partitions within the TTL's reach:
    // a's reconciles of them were all counted out.
    let b = replica(&etcd, "c3-impure", "b", &record);
    wait_for("two-way balance", || balanced(&[&a, &b]));
    a.stop();
    b.stop();
}
