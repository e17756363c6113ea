//! W12 (docs/benchmarks.md): dependencies between keys (guarantees §14).
//!
//! * A tree of 100,000 keys (fan-out 10: key `k`'s parent is `(k - 1) / 10`)
//!   set with `set_dependencies`, no-op reconcile, 4 workers: the time from
//!   enqueuing the root until the controller is idle (every key reconciled
//!   once, each handed out by its parent's completion, D2), against the same
//!   100,000 keys enqueued without dependencies on another controller
//!   (enqueues included in the time). The two alternate round by round in
//!   one run, so the ratio of their medians compares like with like.
//! * A chain of 10,000 keys (`k` after `k - 1`), same controller options:
//!   keys reconciled per second after the first is enqueued (one key ready
//!   at a time, so this is the latency of one completion handing out the
//!   next).
//!
//! * D5, `set_dependencies` of many parents on one key, only with
//!   `W12_PARENTS=10000,100000,1000000` (then nothing else runs): the time
//!   to set that many parents before start, and to replace them after
//!   start by as many others, half of them the same, while the queue lock
//!   is held (the figures of issue 32, item 7).
//!
//! `cargo bench --bench dependencies` (`W12_ROUNDS=3` for fewer rounds).
//! Rounds are printed one per line, then the medians; figures go to
//! docs/benchmarks.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reconq::{Action, Context, Controller, ControllerHandle, ReconcileError};

const TREE_KEYS: u64 = 100_000;
const FAN_OUT: u64 = 10;
const CHAIN_KEYS: u64 = 10_000;
const WORKERS: usize = 4;
const LONG: Duration = Duration::from_secs(600);

fn rounds() -> usize {
    std::env::var("W12_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(7)
}

/// A started controller with a no-op reconcile that counts its calls.
fn counting(name: &str) -> (ControllerHandle<u64>, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&calls);
    let handle = Controller::new(name, move |_: &u64, _: &Context| -> Result<Action, ReconcileError> {
        c.fetch_add(1, Ordering::Relaxed);
        Ok(Action::Done)
    })
    .workers(WORKERS)
    .start();
    (handle, calls)
}

/// A controller whose keys `1..keys` each depend on `parent(k)`.
fn with_graph(name: &str, keys: u64, parent: impl Fn(u64) -> u64) -> (ControllerHandle<u64>, Arc<AtomicU64>) {
    let (handle, calls) = counting(name);
    for k in 1..keys {
        handle.set_dependencies(&k, [parent(k)]).expect("a tree has no cycle");
    }
    (handle, calls)
}

/// Enqueues `roots`, waits until idle; the time taken, after checking that
/// `expected` reconciles ran.
fn run(handle: &ControllerHandle<u64>, calls: &AtomicU64, roots: impl Iterator<Item = u64>, expected: u64) -> Duration {
    calls.store(0, Ordering::Relaxed);
    let start = Instant::now();
    for k in roots {
        handle.enqueue(k);
    }
    assert!(handle.wait_idle(LONG), "idle within {LONG:?}");
    let took = start.elapsed();
    assert_eq!(calls.load(Ordering::Relaxed), expected, "every key reconciled once");
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rate(keys: u64, took: Duration) -> f64 {
    keys as f64 / took.as_secs_f64()
}

/// The `W12_PARENTS` counts, if set.
fn parent_counts() -> Option<Vec<u64>> {
    let counts = std::env::var("W12_PARENTS").ok()?;
    Some(counts.split(',').map(|n| n.trim().parse().expect("W12_PARENTS: counts separated by commas")).collect())
}

/// D5: sets `parents` parents on key 0 before start, then replaces them
/// after start by as many, half of them the same.
fn many_parents(parents: u64) {
    let c =
        Controller::new("w12_parents", |_: &u64, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) });
    let set = Instant::now();
    c.handle().set_dependencies(&0, 1..=parents).expect("no cycle");
    let set = set.elapsed();
    let handle = c.start();
    let replace = Instant::now();
    handle.set_dependencies(&0, parents / 2 + 1..=parents / 2 + parents).expect("no cycle");
    let replace = replace.elapsed();
    assert_eq!(handle.dependencies(&0).len() as u64, parents);
    handle.stop();
    println!("{parents} parents: set before start {set:.2?}, replaced after start {replace:.2?}");
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    if let Some(counts) = parent_counts() {
        counts.into_iter().for_each(many_parents);
        return;
    }
    let rounds = rounds();
    let set_up = Instant::now();
    let (tree, tree_calls) = with_graph("w12_tree", TREE_KEYS, |k| (k - 1) / FAN_OUT);
    println!("tree of {TREE_KEYS} keys set up in {:.2?}", set_up.elapsed());
    let (flat, flat_calls) = counting("w12_flat");
    let (mut tree_times, mut flat_times) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let t = run(&tree, &tree_calls, std::iter::once(0), TREE_KEYS);
        let f = run(&flat, &flat_calls, 0..TREE_KEYS, TREE_KEYS);
        println!(
            "round {round}: tree {t:.2?} ({:.0} keys/s), without dependencies {f:.2?} ({:.0} keys/s), ratio {:.2}",
            rate(TREE_KEYS, t),
            rate(TREE_KEYS, f),
            f.as_secs_f64() / t.as_secs_f64()
        );
        tree_times.push(t);
        flat_times.push(f);
    }
    tree.stop();
    flat.stop();
    let (t, f) = (median(tree_times), median(flat_times));
    println!(
        "tree median {t:.2?} ({:.0} keys/s), without dependencies {f:.2?} ({:.0} keys/s): \
         tree / without = {:.2} of the throughput (goal 0.5)",
        rate(TREE_KEYS, t),
        rate(TREE_KEYS, f),
        f.as_secs_f64() / t.as_secs_f64()
    );

    let (chain, chain_calls) = with_graph("w12_chain", CHAIN_KEYS, |k| k - 1);
    let chain_times: Vec<Duration> = (1..=rounds)
        .map(|round| {
            let c = run(&chain, &chain_calls, std::iter::once(0), CHAIN_KEYS);
            println!("chain round {round}: {c:.2?} ({:.0} keys/s)", rate(CHAIN_KEYS, c));
            c
        })
        .collect();
    chain.stop();
    let c = median(chain_times);
    println!("chain median {c:.2?}: {:.0} keys/s (goal 100,000)", rate(CHAIN_KEYS, c));
}
