//! A controller watching a cache of a real etcd (docs/sources.md): every
//! put and delete is reconciled after the cache holds it, reading that
//! state or a newer one (E2), across a stream cut (deletes made meanwhile
//! arrive from the resumed stream) and a compaction past the cache's
//! revision (they arrive from the relist); a controller started before
//! etcd hands out nothing until the cache synced (E5).

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;
#[path = "common/proxy.rs"]
mod proxy;

use std::sync::Arc;

use common::{PATIENCE, wait_for};
use etcd::Etcd;
use parking_lot::Mutex;
use proxy::Proxy;
use reconq::{Action, Cache, Context, Controller, ControllerHandle, EtcdSource, Watch};

const PREFIX: &str = "/watched/";

/// (key, the cache's value when reconciled, the cache synced then).
type Seen = Arc<Mutex<Vec<(String, Option<String>, bool)>>>;

/// A controller watching a cache of `PREFIX` at `endpoint`.
fn watching(endpoint: &str, name: &str) -> (Cache<EtcdSource<String>>, ControllerHandle<String>, Seen) {
    let source = EtcdSource::new(endpoint, PREFIX).unwrap().decode(|v: &[u8]| String::from_utf8(v.to_vec()));
    let cache = Cache::builder(name, source).build().unwrap();
    let seen: Seen = Arc::default();
    let (log, reader) = (Arc::clone(&seen), cache.clone());
    let handle = Controller::from_fn(name, move |key: &String, _: &Context| {
        log.lock().push((key.clone(), reader.get(key).as_deref().cloned(), reader.synced()));
        Ok(Action::Done)
    })
    .watch_cache(&cache, Watch::new())
    .start();
    (cache, handle, seen)
}

fn saw(seen: &Seen, key: &str, value: Option<&str>) -> bool {
    seen.lock().iter().any(|(k, v, _)| k == key && v.as_deref() == value)
}

#[test]
fn every_etcd_change_is_reconciled_across_a_cut_and_a_compaction() {
    let etcd = Etcd::start();
    for key in ["a", "b", "c"] {
        etcd.put(&format!("{PREFIX}{key}"), "1");
    }
    let proxy = Proxy::to(&etcd.endpoint);
    let (cache, handle, seen) = watching(&proxy.endpoint, "etcd-e2");
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("the listed keys", || ["a", "b", "c"].iter().all(|k| saw(&seen, k, Some("1"))));
    etcd.put(&format!("{PREFIX}a"), "2");
    wait_for("a live change", || saw(&seen, "a", Some("2")));

    proxy.cut();
    wait_for("the cut noticed", || cache.stats().errors >= 1);
    etcd.delete(&format!("{PREFIX}b"));
    proxy.heal();
    wait_for("the delete made while cut off, from the resumed stream", || saw(&seen, "b", None));
    assert_eq!(cache.stats().relists, 0);

    proxy.cut();
    wait_for("the second cut noticed", || cache.stats().errors >= 2);
    etcd.delete(&format!("{PREFIX}c"));
    etcd.put(&format!("{PREFIX}d"), "1");
    etcd.compact();
    proxy.heal();
    wait_for("the delete and the put, from the relist", || saw(&seen, "c", None) && saw(&seen, "d", Some("1")));
    assert_eq!(cache.stats().relists, 1);
    handle.stop();
}

#[test]
fn a_controller_started_before_etcd_hands_out_nothing_until_the_cache_synced() {
    let mut etcd = Etcd::start();
    etcd.put(&format!("{PREFIX}a"), "1");
    etcd.kill();
    let (cache, handle, seen) = watching(&etcd.endpoint, "etcd-e5");
    handle.enqueue("early".to_string());
    wait_for("a failure", || cache.stats().errors >= 1);
    assert!(!handle.wait_synced(Some(std::time::Duration::ZERO)));
    etcd.revive();
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("both keys", || saw(&seen, "a", Some("1")) && saw(&seen, "early", None));
    assert!(seen.lock().iter().all(|(.., synced)| *synced), "a reconcile before sync");
    handle.stop();
}
