//! `EtcdSource` resumed in a new process (issue 36 item 2; docs/sources.md,
//! "How EtcdSource resumes"), on a real etcd: a source lists and gives the
//! state kept with the list's position; a NEW source restored there
//! replays exactly the changes made meanwhile, deletes included, then
//! says it caught up, at etcd's revision when it resumed. A compacted
//! position, or etcd wiped and written past it (E1), expires.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;

use std::collections::BTreeMap;

use common::{PATIENCE, wait_for};
use etcd::Etcd;
use reconq::EtcdSource;
use reconq::source::{Event, Source, SourceError, Stop};

const PREFIX: &str = "/resume/";

type TextEvent = Event<String, String, i64, i64>;

/// A source of `PREFIX`, values as text; a stream silent for `PATIENCE`
/// fails (instead of waiting for etcd's progress notifications).
fn source(etcd: &Etcd) -> EtcdSource<String> {
    let source = EtcdSource::new(etcd.endpoint.as_str(), PREFIX).unwrap().progress_timeout(PATIENCE).unwrap();
    source.decode(|v: &[u8]| String::from_utf8(v.to_vec()))
}

fn put(etcd: &Etcd, key: &str, value: &str) {
    etcd.put(&format!("{PREFIX}{key}"), value);
}

fn delete(etcd: &Etcd, key: &str) {
    etcd.delete(&format!("{PREFIX}{key}"));
}

/// What a process before the restart kept: a source's list of the prefix
/// now, its position, and the state the source gave for it.
struct Kept {
    position: i64,
    state: Vec<u8>,
    items: BTreeMap<String, String>,
}

fn listed(etcd: &Etcd) -> Kept {
    let mut source = source(etcd);
    let listing = source.list(&Stop::new()).unwrap();
    let state = source.resume_state().expect("an EtcdSource can resume")();
    let items = listing.items.into_iter().map(|item| (item.key, item.obj)).collect();
    Kept { position: listing.position.unwrap(), state, items }
}

/// A new source restored at what was `kept`.
fn restored(etcd: &Etcd, kept: &Kept) -> EtcdSource<String> {
    let mut source = source(etcd);
    assert!(source.restore(&kept.position, &kept.state), "the kept state reads back");
    source
}

/// The events of a stream of `source` from `from` up to its `CaughtUp`
/// (included).
fn until_caught_up(source: &mut EtcdSource<String>, from: i64) -> Vec<TextEvent> {
    let stop = Stop::new();
    let mut stream = source.changes(Some(&from), &stop).unwrap();
    let mut events = Vec::new();
    while !matches!(events.last(), Some(Event::CaughtUp { .. })) {
        events.push(stream.next().expect("the stream goes on").expect("no error"));
    }
    events
}

/// Why a stream of `source` from `from` fails, at its opening or its
/// first event.
fn failure(source: &mut EtcdSource<String>, from: i64) -> SourceError {
    let stop = Stop::new();
    match source.changes(Some(&from), &stop) {
        Err(e) => e,
        Ok(mut stream) => match stream.next() {
            Some(Err(e)) => e,
            other => panic!("expected an error, got {other:?}"),
        },
    }
}

/// `items` with `events` applied.
fn applied(mut items: BTreeMap<String, String>, events: &[TextEvent]) -> BTreeMap<String, String> {
    for event in events {
        match event {
            Event::Put { key, obj, .. } => drop(items.insert(key.clone(), obj.clone())),
            Event::Delete { key, .. } => drop(items.remove(key)),
            _ => {}
        }
    }
    items
}

#[test]
fn a_new_source_restored_at_a_kept_revision_replays_what_changed_then_is_caught_up_at_etcds_revision() {
    let etcd = Etcd::start();
    for key in ["a", "b", "c", "d"] {
        put(&etcd, key, key);
    }
    let kept = listed(&etcd);
    put(&etcd, "a", "changed");
    put(&etcd, "e", "new");
    delete(&etcd, "b");
    delete(&etcd, "c");
    // Created and deleted while down: nothing to reconcile.
    put(&etcd, "x", "gone");
    delete(&etcd, "x");
    etcd.bump("/elsewhere", 3);
    let resumed_at = etcd.revision();

    let mut source = restored(&etcd, &kept);
    let stop = Stop::new();
    let mut stream = source.changes(Some(&kept.position), &stop).unwrap();
    let mut next = || stream.next().expect("the stream goes on").expect("no error");
    let events: Vec<TextEvent> = std::iter::repeat_with(&mut next).take(5).collect();
    let position = |event: &TextEvent| match event {
        Event::Put { position, .. } | Event::Delete { position, .. } => *position,
        _ => None,
    };
    let put_event = |key: &str, value: &str| (key.to_owned(), Some(value.to_owned()));
    let changes: Vec<_> = events[..4]
        .iter()
        .map(|event| match event {
            Event::Put { key, obj, .. } => (key.clone(), Some(obj.clone())),
            Event::Delete { key, .. } => (key.clone(), None),
            other => panic!("{other:?} before the changes made while down"),
        })
        .collect();
    let deleted = |key: &str| (key.to_owned(), None);
    assert_eq!(changes, [put_event("a", "changed"), put_event("e", "new"), deleted("b"), deleted("c")]);
    assert!(events[..4].windows(2).all(|w| position(&w[0]) < position(&w[1])));
    assert_eq!(events[4], Event::CaughtUp { position: resumed_at });
    assert_eq!(applied(kept.items.clone(), &events), etcd.list(PREFIX), "etcd's state once caught up");

    // Then the stream goes on from there: x's create and delete, up to
    // the revision it caught up at, are not handed out.
    put(&etcd, "f", "after");
    match next() {
        Event::Put { key, position: Some(position), .. } => {
            assert_eq!(key, "f");
            assert!(position > resumed_at);
        }
        other => panic!("expected f's put, got {other:?}"),
    }
}

/// After a's change the prefix holds as many keys as etcd does now, yet
/// m's delete and z's create are still to come: the key changed last
/// since the kept revision (z, etcd's answer) says so.
#[test]
fn an_equal_count_before_the_key_changed_last_is_not_caught_up() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    put(&etcd, "m", "m");
    let kept = listed(&etcd);
    put(&etcd, "a", "changed");
    delete(&etcd, "m");
    put(&etcd, "z", "z");
    let events = until_caught_up(&mut restored(&etcd, &kept), kept.position);
    assert_eq!(events.len(), 4, "a's put, m's delete, z's put, then caught up: {events:?}");
    assert_eq!(events[3], Event::CaughtUp { position: etcd.revision() });
    assert_eq!(applied(kept.items, &events), etcd.list(PREFIX));
}

/// etcd sends a catch-up in batches of at most 1,000 revisions, each
/// headed with its revision now: more than that were written while down.
#[test]
fn a_catch_up_of_more_than_a_thousand_revisions_ends_once_all_are_sent() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    let kept = listed(&etcd);
    for i in 0..1200 {
        put(&etcd, &format!("k{i:04}"), "v");
    }
    for i in 0..100 {
        delete(&etcd, &format!("k{:04}", i * 3));
    }
    let events = until_caught_up(&mut restored(&etcd, &kept), kept.position);
    assert_eq!(events.len(), 1301, "1,200 puts, 100 deletes, then caught up");
    assert_eq!(events[1300], Event::CaughtUp { position: etcd.revision() });
    assert_eq!(applied(kept.items, &events), etcd.list(PREFIX));
}

/// The catch-up read starts at `restore`, so it overlaps what a restarted
/// cache does before it resumes (loading what it kept); the stream then
/// takes it, and reads no second one.
#[test]
fn the_catch_up_read_starts_at_restore() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    let kept = listed(&etcd);
    put(&etcd, "b", "b");
    let txns = || etcd.requests().get("Txn").copied().unwrap_or(0);
    let before = txns();
    let mut source = restored(&etcd, &kept);
    wait_for("the catch-up read", || txns() == before + 1);
    let events = until_caught_up(&mut source, kept.position);
    assert_eq!(events.len(), 2, "b's put, then caught up: {events:?}");
    assert_eq!(txns(), before + 2, "the check of the kept revision, and no second catch-up read");
}

#[test]
fn a_source_restored_where_nothing_changed_is_caught_up_at_once() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    let kept = listed(&etcd);
    etcd.bump("/elsewhere", 3);
    let events = until_caught_up(&mut restored(&etcd, &kept), kept.position);
    assert_eq!(events, [Event::CaughtUp { position: etcd.revision() }]);
}

/// A stream broken during its catch-up resumes it from the last position
/// it gave: the next stream catches up to where etcd is then.
#[test]
fn a_stream_broken_during_its_catch_up_catches_up_in_the_next() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    let kept = listed(&etcd);
    put(&etcd, "b", "b");
    delete(&etcd, "a");
    let mut source = restored(&etcd, &kept);
    let stop = Stop::new();
    let first = source.changes(Some(&kept.position), &stop).unwrap().next().unwrap().unwrap();
    let Event::Put { ref key, position: Some(at), .. } = first else { panic!("{first:?}") };
    assert_eq!(key, "b");
    put(&etcd, "c", "c");
    let events = until_caught_up(&mut source, at);
    assert_eq!(events.len(), 3, "a's delete, c's put, then caught up: {events:?}");
    assert_eq!(events[2], Event::CaughtUp { position: etcd.revision() });
    let items = applied(applied(kept.items, &[first]), &events);
    assert_eq!(items, etcd.list(PREFIX));
}

#[test]
fn a_compacted_revision_expires_a_restored_source() {
    let etcd = Etcd::start();
    put(&etcd, "a", "a");
    let kept = listed(&etcd);
    put(&etcd, "a", "changed");
    etcd.compact();
    let e = failure(&mut restored(&etcd, &kept), kept.position);
    assert!(e.is_expired(), "{e}");
}

/// E1 across a restart: etcd wiped, then written past the kept revision,
/// gives itself away in no reply's header; the fingerprint kept beside
/// the revision does.
#[test]
fn etcd_wiped_and_written_past_the_kept_revision_expires_a_restored_source() {
    let mut etcd = Etcd::start();
    for i in 0..10 {
        put(&etcd, &format!("old{i}"), "v");
    }
    let kept = listed(&etcd);
    etcd.wipe();
    for i in 0..3 {
        put(&etcd, &format!("new{i}"), "v");
    }
    etcd.bump("/elsewhere", 20);
    assert!(etcd.revision() > kept.position, "the new history is past the kept revision");
    let e = failure(&mut restored(&etcd, &kept), kept.position);
    assert!(e.is_expired() && e.message().contains("reset"), "{e}");
}
