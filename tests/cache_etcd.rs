//! Caches of an etcd prefix on a real etcd (docs/sources.md): convergence
//! (E1) across etcd restarted with its data and wiped (also when the new
//! history is past the cache's revision before the cache looks), a compaction past
//! the cache's revision, deletes made while the stream was down (E2, E3),
//! a cache started before etcd, and a stream gone silent. Every check
//! compares the cache with etcd's own listing, after waiting for it.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;
#[path = "common/proxy.rs"]
mod proxy;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, wait_for};
use etcd::Etcd;
use parking_lot::Mutex;
use proxy::Proxy;
use reconq::{Applied, Cache, EtcdSource, PollingSource, Subscription};

const PREFIX: &str = "/items/";

type Heard = Arc<Mutex<Vec<(String, Option<String>, bool)>>>;

/// `source` with its values read as UTF-8 text.
fn as_text(source: EtcdSource) -> EtcdSource<String> {
    source.decode(|v: &[u8]| String::from_utf8(v.to_vec()))
}

/// A started cache of `PREFIX` at `endpoint`, and what its subscriber
/// heard: (key, new value, listed).
fn cache_of(endpoint: &str, name: &str) -> (Cache<EtcdSource<String>>, Heard, Subscription) {
    started(Cache::builder(name, as_text(EtcdSource::new(endpoint, PREFIX).unwrap())).build().unwrap())
}

/// `keys` put (each its own value), a synced cache of them behind a
/// proxy, then the proxy cut: returns once the cache noticed the break.
fn cut_off(etcd: &Etcd, keys: &[&str], name: &str) -> (Proxy, Cache<EtcdSource<String>>, Heard, Subscription) {
    for key in keys {
        etcd.put(&format!("{PREFIX}{key}"), key);
    }
    let proxy = Proxy::to(&etcd.endpoint);
    let (cache, heard, subscription) = cache_of(&proxy.endpoint, name);
    assert!(cache.wait_synced(Some(PATIENCE)));
    proxy.cut();
    wait_for("the break noticed", || cache.stats().errors >= 1);
    (proxy, cache, heard, subscription)
}

fn started(cache: Cache<EtcdSource<String>>) -> (Cache<EtcdSource<String>>, Heard, Subscription) {
    let heard: Heard = Arc::default();
    let log = Arc::clone(&heard);
    let subscription = cache
        .subscribe(move |a: &Applied<String, String>| {
            log.lock().push((a.key.clone(), a.new.as_deref().cloned(), a.listed));
        })
        .unwrap();
    cache.start().unwrap();
    (cache, heard, subscription)
}

fn contents(cache: &Cache<EtcdSource<String>>) -> BTreeMap<String, String> {
    cache.keys().into_iter().filter_map(|k| cache.get(&k).map(|v| (k, (*v).clone()))).collect()
}

fn wait_converged(cache: &Cache<EtcdSource<String>>, etcd: &Etcd) {
    wait_for("the cache to hold what etcd holds", || contents(cache) == etcd.list(PREFIX));
}

/// Whether `key`'s deletion was heard, from the stream (`listed` false)
/// or from a relist (true).
fn heard_deleted(heard: &Heard, key: &str, listed: bool) -> bool {
    heard.lock().iter().any(|(k, new, l)| k == key && new.is_none() && *l == listed)
}

#[test]
fn a_cache_lists_in_pages_then_follows_puts_and_deletes_with_versions_and_positions() {
    let etcd = Etcd::start();
    for i in 0..23 {
        etcd.put(&format!("{PREFIX}k{i:02}"), &format!("v{i}"));
    }
    etcd.put("/other/x", "not ours");
    let source = as_text(EtcdSource::new(&etcd.endpoint, PREFIX).unwrap().page_size(5).unwrap());
    let (cache, heard, _s) = started(Cache::builder("paged", source).build().unwrap());
    assert!(cache.wait_synced(Some(PATIENCE)));
    assert_eq!(contents(&cache), etcd.list(PREFIX));
    assert_eq!(cache.len(), 23);
    assert_eq!(cache.position(), Some(etcd.revision()));
    assert_eq!(heard.lock().len(), 23, "the first list is heard, as listed");

    etcd.put(&format!("{PREFIX}k00"), "changed");
    etcd.delete(&format!("{PREFIX}k01"));
    etcd.put("/other/y", "not ours either");
    wait_converged(&cache, &etcd);
    assert!(heard_deleted(&heard, "k01", false));
    let revision = etcd.revision();
    assert_eq!(cache.version(&"k00".to_owned()), Some(revision - 2), "the version is the mod_revision");
    let stats = cache.stats();
    assert_eq!((stats.relists, stats.errors, stats.synced), (0, 0, true));
    cache.stop();
}

/// The list is read over gRPC in pages bounded by bytes (64 MiB): after a
/// first page of 10 keys, 1,100 keys of 40 KB (44 MB of reply, more than
/// the gateway's page of JSON was allowed) come in one more page.
#[test]
fn a_prefix_of_large_values_is_listed_in_one_page_after_the_first() {
    let etcd = Etcd::start();
    let value = |i: usize| format!("{i:05}{}", "x".repeat(40_000));
    let kvs: Vec<(String, String)> = (0..1100).map(|i| (format!("{PREFIX}k{i:04}"), value(i))).collect();
    etcd.put_all(&kvs, 20);
    let ranges_before = etcd.requests().get("Range").copied().unwrap_or(0);
    let (cache, _heard, _s) = cache_of(&etcd.endpoint, "large");
    assert!(cache.wait_synced(Some(PATIENCE)), "{:?}", cache.stats().last_error);
    assert_eq!(cache.len(), 1100);
    let pages = etcd.requests()["Range"] - ranges_before;
    assert_eq!(pages, 2, "10 keys, then the 1,090 left");
    for i in [0, 999, 1000, 1099] {
        assert_eq!(cache.get(&format!("k{i:04}")).as_deref(), Some(&value(i)));
    }
    assert_eq!(cache.stats().errors, 0);
    cache.stop();
}

/// Where the first list of a cache waits while a test breaks something:
/// its decode of the first key, once that key's page was read (the pages
/// are read two ahead of it, so the third page after it is read after the
/// gate opens).
struct Gate {
    reached: crossbeam_channel::Receiver<()>,
    open: crossbeam_channel::Sender<()>,
}

/// A started cache of `PREFIX` at `endpoint` listing in pages of 2 keys,
/// and the [`Gate`] its first list waits at.
fn gated_cache(endpoint: &str, name: &str) -> (Cache<EtcdSource<String>>, Gate, Subscription) {
    let (reached_tx, reached) = crossbeam_channel::bounded(1);
    let (open, open_rx) = crossbeam_channel::bounded::<()>(1);
    let first = std::sync::atomic::AtomicBool::new(true);
    let source = EtcdSource::new(endpoint, PREFIX).unwrap().page_size(2).unwrap().decode(move |v: &[u8]| {
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            reached_tx.send(()).unwrap();
            open_rx.recv_timeout(PATIENCE).unwrap();
        }
        String::from_utf8(v.to_vec())
    });
    let (cache, _heard, subscription) = started(Cache::builder(name, source).build().unwrap());
    (cache, Gate { reached, open }, subscription)
}

/// 30 keys under `PREFIX`: 15 pages of 2.
fn put_thirty(etcd: &Etcd) {
    let kvs: Vec<(String, String)> = (0..30).map(|i| (format!("{PREFIX}k{i:02}"), format!("v{i}"))).collect();
    etcd.put_all(&kvs, 30);
}

#[test]
fn a_compaction_between_the_pages_of_a_list_fails_it_and_the_cache_lists_again() {
    let etcd = Etcd::start();
    put_thirty(&etcd);
    let (cache, gate, _s) = gated_cache(&etcd.endpoint, "compacted");
    gate.reached.recv_timeout(PATIENCE).unwrap();
    // The list reads at the revision of its first page: compacted now.
    etcd.put("/other/x", "moves the revision on");
    etcd.compact();
    gate.open.send(()).unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)), "{:?}", cache.stats().last_error);
    assert_eq!(contents(&cache), etcd.list(PREFIX));
    let stats = cache.stats();
    assert_eq!(stats.errors, 1, "{stats:?}");
    let why = stats.last_error.unwrap();
    assert!(why.contains("required revision has been compacted") && why.contains("OUT_OF_RANGE"), "{why}");
    cache.stop();
}

/// A link that forwards nothing more in the middle of a list: the page
/// times out (never a hang), and the list is read again on a new
/// connection.
#[test]
fn a_link_frozen_in_the_middle_of_a_list_fails_the_page_and_the_cache_lists_again() {
    let etcd = Etcd::start();
    put_thirty(&etcd);
    let proxy = Proxy::to(&etcd.endpoint);
    let (cache, gate, _s) = gated_cache(&proxy.endpoint, "frozen");
    gate.reached.recv_timeout(PATIENCE).unwrap();
    proxy.freeze();
    gate.open.send(()).unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)), "{:?}", cache.stats().last_error);
    assert_eq!(contents(&cache), etcd.list(PREFIX));
    let stats = cache.stats();
    assert_eq!(stats.errors, 1, "{stats:?}");
    assert!(stats.last_error.unwrap().contains("Timeout was reached"));
    cache.stop();
}

/// Connections cut in the middle of a list, and refused for a while:
/// the list fails and is retried until etcd can be reached again.
#[test]
fn connections_cut_in_the_middle_of_a_list_fail_it_and_the_cache_lists_again_once_they_work() {
    let etcd = Etcd::start();
    put_thirty(&etcd);
    let proxy = Proxy::to(&etcd.endpoint);
    let (cache, gate, _s) = gated_cache(&proxy.endpoint, "cut");
    gate.reached.recv_timeout(PATIENCE).unwrap();
    proxy.cut();
    gate.open.send(()).unwrap();
    wait_for("the cut noticed", || cache.stats().errors >= 1);
    assert!(!cache.stats().synced);
    proxy.heal();
    assert!(cache.wait_synced(Some(PATIENCE)), "{:?}", cache.stats().last_error);
    assert_eq!(contents(&cache), etcd.list(PREFIX));
    cache.stop();
}

#[test]
fn etcd_restarted_with_its_data_under_a_running_cache_is_resumed_not_relisted() {
    let mut etcd = Etcd::start();
    etcd.put(&format!("{PREFIX}a"), "1");
    let (cache, _heard, _s) = cache_of(&etcd.endpoint, "restarted");
    assert!(cache.wait_synced(Some(PATIENCE)));
    etcd.kill();
    wait_for("the break noticed", || cache.stats().errors >= 1);
    etcd.revive();
    etcd.put(&format!("{PREFIX}b"), "2");
    etcd.delete(&format!("{PREFIX}a"));
    wait_converged(&cache, &etcd);
    assert_eq!(cache.stats().relists, 0, "E3: resumed from the last revision");
    cache.stop();
}

#[test]
fn etcd_wiped_under_a_running_cache_is_relisted_and_every_old_key_deleted() {
    // The new history starts below every revision the cache has seen.
    let mut etcd = Etcd::start_with_history();
    for i in 0..5 {
        etcd.put(&format!("{PREFIX}old{i}"), "x");
    }
    let (cache, heard, _s) = cache_of(&etcd.endpoint, "wiped");
    assert!(cache.wait_synced(Some(PATIENCE)));
    etcd.wipe();
    etcd.put(&format!("{PREFIX}new"), "y");
    wait_converged(&cache, &etcd);
    assert!((0..5).all(|i| heard_deleted(&heard, &format!("old{i}"), true)), "deleted by the relist");
    assert!(cache.stats().relists >= 1);
    assert!(cache.position().unwrap() < 50, "the position is the new history's");
    cache.stop();
}

/// Puts 1,000 keys under `PREFIX` in transactions of 100: etcd is at
/// revision 11 after them.
fn put_a_thousand(etcd: &Etcd) {
    let kvs: Vec<(String, String)> = (0..1000).map(|i| (format!("{PREFIX}old{i:04}"), format!("v{i}"))).collect();
    etcd.put_all(&kvs, 100);
    assert_eq!(etcd.revision(), 11);
}

/// Refills a wiped etcd with 100 keys (in one transaction) and makes 61
/// writes elsewhere: the new history is past `revision`, where the cache
/// stood in the old one.
fn refill_past(etcd: &Etcd, revision: i64) {
    let kvs: Vec<(String, String)> = (0..100).map(|i| (format!("{PREFIX}new{i:03}"), format!("n{i}"))).collect();
    etcd.put_all(&kvs, 100);
    etcd.bump("/elsewhere", 61);
    assert!(etcd.revision() > revision, "the new history is past the cache's revision");
}

/// E1: the new history gives itself away in no reply's header (a wiped
/// single member keeps its ids and starts again at raft term 2, and its
/// revision is past the cache's when the cache looks again); the prefix
/// at the cache's revision does.
#[test]
fn etcd_wiped_and_written_past_the_cache_revision_while_cut_off_is_relisted() {
    let mut etcd = Etcd::start();
    put_a_thousand(&etcd);
    let (proxy, cache, heard, _s) = cut_off(&etcd, &[], "wiped-past");
    assert_eq!(cache.position(), Some(11));
    etcd.wipe();
    refill_past(&etcd, 11);
    proxy.heal();
    wait_converged(&cache, &etcd);
    assert_eq!(cache.len(), 100);
    assert!(heard_deleted(&heard, "old0999", true), "deleted by the relist");
    assert!(cache.stats().relists >= 1);
    cache.stop();
}

/// As above with no proxy: the cache's retries are spaced out (its third
/// failure waits at least 3.2 s), and etcd is wiped and written past its
/// revision meanwhile.
#[test]
fn etcd_wiped_and_written_past_the_cache_revision_while_the_cache_backs_off_is_relisted() {
    let mut etcd = Etcd::start();
    put_a_thousand(&etcd);
    let (cache, _heard, _s) = cache_of(&etcd.endpoint, "wiped-past-direct");
    assert!(cache.wait_synced(Some(PATIENCE)));
    etcd.kill();
    wait_for("three failures", || cache.stats().errors >= 3);
    etcd.wipe();
    refill_past(&etcd, 11);
    wait_converged(&cache, &etcd);
    assert!(cache.stats().relists >= 1);
    cache.stop();
}

#[test]
fn deletes_made_while_the_stream_was_down_arrive_as_deletes_without_a_relist() {
    let etcd = Etcd::start();
    let (proxy, cache, heard, _s) = cut_off(&etcd, &["a", "b", "c"], "cut");
    etcd.delete(&format!("{PREFIX}a"));
    etcd.delete(&format!("{PREFIX}b"));
    etcd.put(&format!("{PREFIX}d"), "d");
    proxy.heal();
    wait_converged(&cache, &etcd);
    assert!(heard_deleted(&heard, "a", false) && heard_deleted(&heard, "b", false), "E2: from the resumed stream");
    assert_eq!(cache.stats().relists, 0, "E3");
    cache.stop();
}

#[test]
fn a_compaction_past_the_cache_revision_relists_and_keys_gone_meanwhile_are_deletes() {
    let etcd = Etcd::start();
    let (proxy, cache, heard, _s) = cut_off(&etcd, &["a", "b"], "compacted");
    etcd.delete(&format!("{PREFIX}a"));
    etcd.put(&format!("{PREFIX}b"), "changed");
    etcd.put(&format!("{PREFIX}c"), "c");
    etcd.compact();
    proxy.heal();
    wait_converged(&cache, &etcd);
    assert!(heard_deleted(&heard, "a", true), "E2: deleted by the relist");
    assert_eq!(cache.stats().relists, 1, "E3: the compacted revision expired");
    cache.stop();
}

#[test]
fn a_cache_started_before_etcd_syncs_once_etcd_is_up_and_shows_why_it_waits() {
    let mut etcd = Etcd::start();
    etcd.put(&format!("{PREFIX}a"), "1");
    etcd.kill();
    let (cache, _heard, _s) = cache_of(&etcd.endpoint, "early");
    wait_for("a failure", || cache.stats().errors >= 1);
    assert!(!cache.synced());
    let entry = reconq::status::snapshot().into_iter().find(|e| e.name == "early").unwrap();
    assert_eq!(entry.state(), "syncing");
    assert!(entry.last_error.as_deref().is_some_and(|e| e.contains(&etcd.endpoint)), "{entry:?}");
    etcd.revive();
    assert!(cache.wait_synced(Some(PATIENCE)));
    wait_converged(&cache, &etcd);
    cache.stop();
}

#[test]
fn a_silent_stream_is_taken_as_stalled_and_resumed_while_progress_notifications_keep_a_quiet_one() {
    let etcd = Etcd::start_with(&["--experimental-watch-progress-notify-interval", "200ms"]);
    let proxy = Proxy::to(&etcd.endpoint);
    let source = EtcdSource::new(&proxy.endpoint, PREFIX).unwrap().progress_timeout(Duration::from_secs(2)).unwrap();
    let source = as_text(source);
    let (cache, _heard, _s) = started(Cache::builder("silent", source).build().unwrap());
    assert!(cache.wait_synced(Some(PATIENCE)));
    // Quiet for longer than the timeout, kept alive by progress notifications.
    wait_for("4 s of progress notifications", || cache.stats().events >= 20);
    assert_eq!(cache.stats().errors, 0, "a quiet stream with progress notifications is no failure");

    proxy.freeze();
    etcd.put(&format!("{PREFIX}a"), "1");
    wait_converged(&cache, &etcd);
    let stats = cache.stats();
    assert!(stats.last_error.unwrap().contains("no event and no progress notification"));
    assert_eq!(stats.relists, 0, "resumed, not relisted");
    cache.stop();
}

#[test]
fn values_the_decode_function_refuses_are_skipped_and_the_rest_cached() {
    let etcd = Etcd::start();
    etcd.put(&format!("{PREFIX}n"), "7");
    etcd.put(&format!("{PREFIX}bad"), "seven");
    let source = EtcdSource::new(&etcd.endpoint, PREFIX).unwrap().decode(|v: &[u8]| {
        std::str::from_utf8(v).map_err(|e| e.to_string())?.parse::<u32>().map_err(|e| e.to_string())
    });
    let cache = Cache::builder("decoded", source).build().unwrap();
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    etcd.put(&format!("{PREFIX}m"), "8");
    etcd.put(&format!("{PREFIX}n"), "nine");
    wait_for("the good put", || cache.contains(&"m".to_owned()));
    assert_eq!(cache.keys().len(), 2);
    assert_eq!(cache.get(&"n".to_owned()).as_deref(), Some(&7), "a refused value leaves the last good one");
    cache.stop();
}

#[test]
fn bad_input_is_refused_naming_the_argument() {
    let bad = |result: Result<(), reconq::InvalidArgument>, word: &str| {
        let e = result.unwrap_err().to_string();
        assert!(e.contains(word), "{e:?} does not name {word}");
    };
    bad(EtcdSource::new("127.0.0.1:2379", PREFIX).map(drop), "http://");
    bad(EtcdSource::new("http://localhost", PREFIX).map(drop), "port");
    bad(EtcdSource::new(Vec::<String>::new(), PREFIX).map(drop), "endpoint");
    bad(EtcdSource::new("http://127.0.0.1:2379", "").map(drop), "prefix");
    let source = || EtcdSource::new("http://127.0.0.1:2379", PREFIX).unwrap();
    bad(source().progress_timeout(Duration::ZERO).map(drop), "progress_timeout");
    bad(source().page_size(0).map(drop), "page_size");
    bad(PollingSource::new(Duration::ZERO, || Ok::<_, String>(vec![(1, 1)])).map(drop), "interval");
}

/// Whether a thread of this process is named `name` (as Linux keeps it:
/// its first 15 bytes).
fn thread_named(name: &str) -> bool {
    let name = &name[..name.len().min(15)];
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .any(|task| std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim_end() == name))
}

/// A stop while a page of the list is in flight and etcd does not answer
/// (SIGSTOP) ends the cache within about a second (libcurl's progress
/// callback asks the stop), not once the page timed out: 6 s for a first
/// page, 105 s for a page of a million keys.
#[test]
fn a_stop_during_a_page_etcd_does_not_answer_ends_the_list() {
    let etcd = Etcd::start();
    etcd.put(&format!("{PREFIX}a"), "a");
    etcd.pause();
    let (cache, _heard, _subscription) = cache_of(&etcd.endpoint, "stalled");
    wait_for("the list's page in flight", || thread_named("reconq-etcd-pages"));
    let stopped = cache.stop_timeout(Duration::from_secs(4));
    etcd.resume();
    assert!(stopped, "the cache's thread still waited for the page after 4 s");
}
