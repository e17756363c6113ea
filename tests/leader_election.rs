//! Leader election on a real etcd (guarantees §10): L1 one leader, L2
//! fencing tokens, L3 losing leadership before the lease can expire, L4
//! hand-over on stop, and the faults (bad input, etcd unreachable).

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;

use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, wait_for};
use etcd::Etcd;
use parking_lot::Mutex;
use reconq::{
    Action, Context, Controller, ControllerHandle, ControllerParams, DoError, LeaderElection, Manager, ReconcileError,
};

const TTL: Duration = Duration::from_secs(2);

fn election(etcd: &Etcd, name: &str, identity: &str) -> LeaderElection {
    LeaderElection::new(&etcd.endpoint, name).ttl(TTL).identity(identity)
}

#[test]
fn one_leader_and_a_standby_that_takes_over_at_once_on_stop() {
    let etcd = Etcd::start();
    let (a, b) = (election(&etcd, "l1", "a"), election(&etcd, "l1", "b"));
    a.start();
    b.start();
    wait_for("a leader", || a.is_leader() || b.is_leader());
    let (leader, standby) = if a.is_leader() { (&a, &b) } else { (&b, &a) };
    assert!(!standby.is_leader(), "L1: one leader");
    let first = leader.fencing_token().unwrap();
    wait_for("the standby to see the leader", || standby.leader().as_deref() == leader.leader().as_deref());

    leader.stop();
    assert!(!leader.is_leader());
    wait_for("the standby to take over", || standby.is_leader());
    let second = standby.fencing_token().unwrap();
    assert!(second > first, "L2: tokens increase ({first} then {second})");
    standby.stop();
}

/// The reconciles of a controller, as a fenced store would see them.
#[derive(Default)]
struct Record {
    /// Reconciles running now, by process.
    running: std::collections::HashMap<String, usize>,
    /// Reconciles that started while another process had one running.
    overlaps: usize,
    highest_token: u64,
    stale: usize,
    done: Vec<(String, u32)>,
}

/// A controller that records its reconciles in `record`; each key runs
/// again after `again` if given.
fn recording_controller(
    election: LeaderElection,
    record: &Arc<Mutex<Record>>,
    who: &str,
    again: Option<Duration>,
) -> ControllerHandle<u32> {
    let (record, who) = (Arc::clone(record), who.to_owned());
    Controller::new("leader-ctl", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        let token = ctx.fencing_token().expect("a token under leader election");
        {
            let mut r = record.lock();
            let others = r.running.iter().any(|(w, n)| *w != who && *n > 0);
            r.overlaps += usize::from(others);
            *r.running.entry(who.clone()).or_default() += 1;
            r.stale += usize::from(token < r.highest_token);
            r.highest_token = r.highest_token.max(token);
        }
        std::thread::yield_now();
        let mut r = record.lock();
        *r.running.get_mut(&who).unwrap() -= 1;
        r.done.push((who.clone(), *key));
        Ok(again.map_or(Action::Done, Action::RequeueAfter))
    })
    .workers(2)
    .leader_election(election)
    .start()
}

/// One process: its controller and its election.
type Process = (ControllerHandle<u32>, LeaderElection);

/// Processes "a" and "b" under election `name`, each with a recording
/// controller (see [`recording_controller`]) and keys `0..keys` enqueued;
/// returns, with their record, once one of them leads.
fn two_recording_processes(
    etcd: &Etcd,
    name: &str,
    keys: u32,
    again: Option<Duration>,
) -> (Arc<Mutex<Record>>, Process, Process) {
    let record = Arc::new(Mutex::new(Record::default()));
    let process = |who| {
        let election = election(etcd, name, who);
        let controller = recording_controller(election.clone(), &record, who, again);
        for key in 0..keys {
            controller.enqueue(key);
        }
        (controller, election)
    };
    let ((a, ea), (b, eb)) = (process("a"), process("b"));
    wait_for("a leader", || ea.is_leader() || eb.is_leader());
    (record, (a, ea), (b, eb))
}

#[test]
fn only_the_leaders_controller_reconciles_and_the_standby_is_warm() {
    let etcd = Etcd::start();
    let (record, (a, ea), (b, eb)) = two_recording_processes(&etcd, "l1-ctl", 20, None);
    let (leader, leader_election, standby, standby_election, standby_name) =
        if ea.is_leader() { (&a, &ea, &b, &eb, "b") } else { (&b, &eb, &a, &ea, "a") };
    assert!(leader.wait_idle(PATIENCE));
    assert_eq!(standby.stats().reconciles, 0, "L1: the standby reconciles nothing");
    assert_eq!(standby.stats().depth, 20, "the standby's queue is warm");

    // The leader goes: the standby takes over and reconciles its queue.
    assert!(leader.stop_with_drain(PATIENCE));
    leader_election.stop();
    wait_for("the standby to lead", || standby_election.is_leader());
    assert!(standby.wait_idle(PATIENCE));
    let r = record.lock();
    assert_eq!((r.overlaps, r.stale), (0, 0), "never two processes at once, never a stale token");
    assert_eq!(r.done.iter().filter(|(who, _)| who == standby_name).count(), 20);
    drop(r);
    standby.stop();
    standby_election.stop();
}

/// L1 and L2 across a reset of etcd's history (its data directory wiped,
/// revisions starting over): the leader steps down once it sees the reset,
/// and the next leadership's token exceeds every token used before, with
/// never two processes reconciling at once nor a token going back.
#[test]
fn after_etcd_is_wiped_no_two_leaders_and_the_next_token_exceeds_every_old_one() {
    let mut etcd = Etcd::start_with_history();
    let (record, (a, ea), (b, eb)) = two_recording_processes(&etcd, "reset", 4, Some(Duration::from_millis(5)));
    let old = ea.fencing_token().or(eb.fencing_token()).unwrap();
    assert!(old > 50);
    wait_for("reconciles under the first leadership", || record.lock().done.len() >= 20);

    etcd.wipe();
    let newer = || [&ea, &eb].iter().any(|e| e.fencing_token().is_some_and(|t| t > old));
    wait_for("a leader with a token above every old one", newer);
    let done = record.lock().done.len();
    wait_for("reconciles under the new leadership", || record.lock().done.len() >= done + 20);
    let r = record.lock();
    assert_eq!((r.overlaps, r.stale), (0, 0), "never two processes at once, never a token going back");
    assert!(r.highest_token > old);
    drop(r);
    for (h, e) in [(a, ea), (b, eb)] {
        h.stop();
        e.stop();
    }
}

/// What an operator does after resetting etcd with no replica alive to
/// see it (docs/guarantees.md §10): set the fencing floor by hand; every
/// token lies above it. A floor that is not a number is an error, shown,
/// and nobody leads.
#[test]
fn a_fencing_floor_set_by_hand_lifts_every_token_and_a_bad_one_is_shown() {
    let etcd = Etcd::start();
    etcd.put("/reconq/fencing-floor", "lots");
    let le = election(&etcd, "floor", "a");
    le.start();
    wait_for("the bad floor shown", || le.last_error().is_some_and(|e| e.contains("/reconq/fencing-floor")));
    assert!(!le.is_leader());
    etcd.put("/reconq/fencing-floor", "1000000");
    wait_for("leadership", || le.is_leader());
    assert!(le.fencing_token().unwrap() > 1_000_000);
    le.stop();
}

/// A fencing floor below one read before went with a reset of etcd's
/// history that no reply's revision gave away (the new history had passed
/// every revision this process saw: W14's chaos run found a replica
/// campaigning under a floor of 0 after a second wipe). The floor only
/// rises within one history, so that is a reset too: the next campaign
/// raises the floor again, and its token lies above every token before.
#[test]
fn a_fencing_floor_below_one_read_before_is_a_reset_and_the_next_token_lies_above_it() {
    let etcd = Etcd::start();
    etcd.put("/reconq/fencing-floor", "1000000");
    let (ea, eb) = (election(&etcd, "lowered", "a"), election(&etcd, "lowered", "b"));
    ea.start();
    wait_for("a to lead", || ea.is_leader());
    let old = ea.fencing_token().unwrap();
    eb.start();
    wait_for("b to see a lead (it read the floor)", || eb.leader().as_deref() == Some("a"));
    etcd.delete("/reconq/fencing-floor");
    ea.stop();
    wait_for("b to lead", || eb.is_leader());
    let token = eb.fencing_token().unwrap();
    assert!(token > old, "b leads with token {token}, not above a's {old}");
    eb.stop();
}

/// A leadership won below the fencing floor (by a process that started
/// after a reset of etcd it could not see, or before an operator raised the
/// floor) is ended by the next process that campaigns: it revokes that
/// leader's lease, waits a TTL (no two leaders), and the next token lies
/// above the floor.
#[test]
fn a_leadership_below_the_fencing_floor_is_ended_by_the_next_campaign() {
    let etcd = Etcd::start();
    let (ea, eb) = (election(&etcd, "below", "a"), election(&etcd, "below", "b"));
    ea.start();
    wait_for("a to lead", || ea.is_leader());
    let low = ea.fencing_token().unwrap();
    etcd.put("/reconq/fencing-floor", "1000000");
    eb.start();
    wait_for("a's leadership to end", || ea.fencing_token() != Some(low));
    wait_for("a leader above the floor", || {
        [&ea, &eb].iter().any(|e| e.fencing_token().is_some_and(|t| t > 1_000_000))
    });
    ea.stop();
    eb.stop();
}

#[test]
fn a_leader_that_cannot_renew_cancels_its_reconciles_before_the_lease_can_expire() {
    let etcd = Etcd::start();
    let le = election(&etcd, "l3", "a");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let started_under = Arc::new(Mutex::new(None));
    let (seen_by_reconcile, started) = (Arc::clone(&seen), Arc::clone(&started_under));
    let h = Controller::new("l3-ctl", move |key: &u32, ctx: &Context| -> Result<Action, ReconcileError> {
        // Key 1 runs until its leadership is lost; later keys return at once.
        if *key == 1 {
            *started.lock() = Some(ctx.fencing_token());
        }
        let cancelled = *key == 1 && ctx.wait_cancelled(PATIENCE);
        seen_by_reconcile.lock().push((ctx.fencing_token(), cancelled));
        Ok(Action::Done)
    })
    .leader_election(le.clone())
    .start();
    h.enqueue(1);
    // The token is read from the reconcile, not from the election: on a
    // loaded machine a late renewal may lapse the leadership for a moment
    // between two lines of this test.
    wait_for("the reconcile to start as leader", || started_under.lock().is_some());
    let token = started_under.lock().unwrap().expect("a reconcile runs only under a token");

    etcd.pause(); // renewals now hang and time out
    wait_for("leadership to be given up", || !le.is_leader());
    wait_for("the running reconcile to be cancelled", || !seen.lock().is_empty());
    assert_eq!(seen.lock()[0], (Some(token), true), "L3: cancelled under its old token");
    h.enqueue(2);
    etcd.resume();
    // Campaigns again (the old lease may still exist until it expires).
    assert!(h.wait_idle(PATIENCE));
    let (new_token, cancelled) = seen.lock()[1];
    assert!(!cancelled);
    assert!(new_token.is_some_and(|t| t > token), "key 2 ran under a new leadership only: {new_token:?} after {token}");
    h.stop();
    le.stop();
}

#[test]
fn bad_input_is_an_error() {
    for bad in ["127.0.0.1:2379", "http://nohost", "https://a:1"] {
        assert!(LeaderElection::try_new(bad, "x").is_err(), "{bad}");
    }
    assert!(LeaderElection::try_new(Vec::<String>::new(), "x").is_err());
    assert!(LeaderElection::try_new(["http://127.0.0.1:1"], "").is_err());
    let le = LeaderElection::new("http://127.0.0.1:1", "x");
    assert!(le.clone().try_ttl(Duration::from_millis(1999)).is_err(), "etcd's minimum lease is 2 s");
    let panicked = std::panic::catch_unwind(|| LeaderElection::new("127.0.0.1:2379", "x"));
    assert!(panicked.is_err(), "the builder form panics on what try_new refuses");
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| le.ttl(Duration::from_secs(1)))).is_err());
}

#[test]
fn etcd_unreachable_is_a_standby_with_the_error_shown() {
    let le = LeaderElection::new(etcd::unreachable_endpoint(), "down");
    let h = Controller::new("down-ctl", |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
        panic!("a standby never reconciles")
    })
    .leader_election(le.clone())
    .start();
    h.enqueue(1);
    wait_for("the error to show", || le.last_error().is_some());
    assert!(!le.is_leader());
    assert_eq!(master_status("down").as_deref(), Some("0"));
    let shown = h.stats().leader.unwrap();
    assert!(!shown.is_leader() && shown.last_error.is_some(), "{shown:?}");
    assert_eq!(h.stats().reconciles, 0);
    h.stop();
    assert!(h.join_timeout(PATIENCE), "workers waiting for leadership exit on stop");
    le.stop();
}

/// The election's side in metrics, `stats()` and the global status.
fn master_status(name: &str) -> Option<String> {
    let needle = format!("leader_election_master_status{{name=\"{name}\"}} ");
    reconq::metrics::render().lines().find_map(|line| line.strip_prefix(&needle).map(str::to_owned))
}

#[test]
fn stats_status_and_the_metric_show_who_leads() {
    let etcd = Etcd::start();
    let (ea, eb) = (election(&etcd, "l-status", "a"), election(&etcd, "l-status", "b"));
    let noop = |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let a = Controller::new("status-a", noop).leader_election(ea.clone()).start();
    wait_for("a to lead", || ea.is_leader());
    let b = Controller::new("status-b", noop).leader_election(eb.clone()).start();
    wait_for("b to see a lead", || eb.leader().as_deref() == Some("a"));

    let (sa, sb) = (a.stats().leader.unwrap(), b.stats().leader.unwrap());
    assert!(sa.is_leader() && !sb.is_leader());
    assert_eq!(sa.fencing_token, ea.fencing_token());
    assert_eq!((sa.leader.as_deref(), sb.leader.as_deref()), (Some("a"), Some("a")));
    let states: Vec<_> = reconq::status::snapshot()
        .into_iter()
        .filter(|e| e.name.starts_with("status-"))
        .map(|e| (e.name.clone(), e.state().to_owned()))
        .collect();
    assert_eq!(states, [("status-a".to_owned(), "running".to_owned()), ("status-b".to_owned(), "standby".to_owned())]);
    // Both elections of this process share the series: 1 while one leads.
    assert_eq!(master_status("l-status").as_deref(), Some("1"));
    a.stop();
    b.stop();
}

#[test]
fn a_stopped_controller_gives_leadership_up_once_its_reconciles_returned() {
    let etcd = Etcd::start();
    let (ea, eb) = (election(&etcd, "l4-ctl", "a"), election(&etcd, "l4-ctl", "b"));
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let a = Controller::new("l4-a", move |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
        release_rx.recv().ok();
        Ok(Action::Done)
    })
    .leader_election(ea.clone())
    .start();
    wait_for("a to lead", || ea.is_leader());
    let b = Controller::new("l4-b", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .leader_election(eb.clone())
        .start();
    a.enqueue(1);
    wait_for("a's reconcile to run", || a.stats().processing == 1);

    // Stop without waiting: the reconcile still runs, so leadership stays.
    a.stop();
    std::thread::sleep(TTL);
    assert!(ea.is_leader() && !eb.is_leader(), "L4 never hands over while a reconcile of ours runs");
    release_tx.send(()).unwrap();
    assert!(a.join_timeout(PATIENCE));
    // No `ea.stop()`: the controller was its only user.
    wait_for("b to take over", || eb.is_leader());
    assert!(!ea.is_leader());
    b.stop();
}

#[test]
fn a_manager_runs_do_only_while_leading_with_the_token() {
    let etcd = Etcd::start();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let manager = |who: &'static str, election: LeaderElection| {
        let m = Manager::builder().name(format!("mgr-{who}")).leader_election(election).build();
        let runs = Arc::clone(&runs);
        m.update(
            "sync",
            ControllerParams::with_context(move |ctx: &Context| -> Result<(), DoError> {
                runs.lock().push((who, ctx.fencing_token()));
                Ok(())
            })
            .run_interval(Duration::from_millis(50)),
        );
        m
    };
    let (ea, eb) = (election(&etcd, "l-mgr", "a"), election(&etcd, "l-mgr", "b"));
    let a = manager("a", ea.clone());
    wait_for("a to lead and run", || runs.lock().len() >= 2);
    let b = manager("b", eb.clone());
    wait_for("b to see a lead", || eb.leader().as_deref() == Some("a"));
    let entry = reconq::status::snapshot().into_iter().find(|e| e.qualified_name() == "mgr-b/sync").unwrap();
    assert_eq!(entry.state(), "standby");
    let token = ea.fencing_token().unwrap();
    wait_for("a few more runs", || runs.lock().len() >= 5);

    // The manager's controllers go: the campaign has no user left.
    a.remove_all_and_wait();
    wait_for("b to lead and run", || runs.lock().iter().any(|(who, _)| *who == "b"));
    let runs = runs.lock().clone();
    let split = runs.iter().position(|(who, _)| *who == "b").unwrap();
    assert!(runs[..split].iter().all(|r| *r == ("a", Some(token))), "L1/L2: only a, with its token: {runs:?}");
    let b_token = eb.fencing_token().unwrap();
    assert!(b_token > token);
    assert!(runs[split..].iter().all(|r| *r == ("b", Some(b_token))), "only b after a left: {runs:?}");
    b.remove_all_and_wait();
}

#[test]
fn a_standby_managers_controller_removed_runs_neither_do_nor_stop() {
    let etcd = Etcd::start();
    let ea = election(&etcd, "l-mgr-rm", "a");
    ea.start();
    wait_for("a to lead", || ea.is_leader());
    let eb = election(&etcd, "l-mgr-rm", "b");
    let m = Manager::builder().leader_election(eb.clone()).build();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let (ran_do, ran_stop) = (Arc::clone(&ran), Arc::clone(&ran));
    m.update(
        "never",
        ControllerParams::new(move || -> Result<(), DoError> {
            ran_do.lock().push("do");
            Ok(())
        })
        .stop(move || ran_stop.lock().push("stop")),
    );
    wait_for("b to see a lead", || eb.leader().as_deref() == Some("a"));
    m.remove_and_wait("never").unwrap();
    assert!(ran.lock().is_empty(), "{:?}", ran.lock());
    ea.stop();
}

const EXIT_CHILD_ENV: &str = "RECONQ_ON_LOST_EXIT_ENDPOINT";

/// L3 with `OnLost::Exit`: a leader cut off from etcd ends its process with
/// status 1, as controller-runtime does (run in a child process).
#[test]
fn on_lost_exit_ends_the_process_with_status_1() {
    if let Ok(endpoint) = std::env::var(EXIT_CHILD_ENV) {
        let le = LeaderElection::new(endpoint, "l3-exit").ttl(TTL).on_lost(reconq::OnLost::Exit);
        let _h =
            Controller::new("l3-exit", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
                .leader_election(le.clone())
                .start();
        wait_for("leadership", || le.is_leader());
        println!("leading");
        std::thread::sleep(PATIENCE * 3); // the exit comes first
        return;
    }
    use std::io::BufRead;
    let etcd = Etcd::start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "on_lost_exit_ends_the_process_with_status_1", "--nocapture", "--test-threads=1"])
        .env(EXIT_CHILD_ENV, &etcd.endpoint)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("leading") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited before leading");
    }
    etcd.pause();
    let deadline = std::time::Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the child did not exit on losing leadership");
        std::thread::sleep(Duration::from_millis(20));
    };
    etcd.resume();
    assert_eq!(status.code(), Some(1));
}
