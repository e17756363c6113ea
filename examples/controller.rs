//! A small controller you can copy: keeps a "desired" map and an "actual"
//! map in sync, with a flaky backend, a periodic resync, and a watch that
//! feeds change events.
//!
//! Run with `cargo run --example controller`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reconq::{Action, Context, Controller, ExponentialBackoff, ReconcileError};

#[derive(Default)]
struct World {
    desired: HashMap<String, u32>,
    actual: HashMap<String, u32>,
    calls: u32,
}

fn main() {
    let world = Arc::new(Mutex::new(World::default()));

    let w = Arc::clone(&world);
    let reconcile = move |name: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        if ctx.is_cancelled() {
            return Err(ReconcileError::new("cancelled"));
        }
        let mut world = w.lock();
        world.calls += 1;
        // A flaky backend: every third call fails and is retried with backoff.
        if world.calls % 3 == 0 {
            return Err(format!("backend unavailable (attempt {})", ctx.attempt()).into());
        }
        match world.desired.get(name).copied() {
            Some(_) if name.starts_with("bad") => Err(ReconcileError::permanent("invalid name")),
            Some(want) => {
                world.actual.insert(name.clone(), want);
                // Check again in a minute, like a periodic resync.
                Ok(Action::RequeueAfter(Duration::from_secs(60)))
            }
            None => {
                world.actual.remove(name);
                Ok(Action::Done)
            }
        }
    };

    let handle = Controller::new("example", reconcile)
        .workers(4)
        .rate_limiter(ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(10)))
        .hanging_threshold(Duration::from_secs(30))
        .start();

    // Change events arrive on a channel; the watch turns each into a key.
    let (events, rx) = crossbeam_channel::unbounded::<(String, Option<u32>)>();
    let w = Arc::clone(&world);
    handle.watch_channel(rx, move |(name, value)| {
        let mut world = w.lock();
        match value {
            Some(v) => world.desired.insert(name.clone(), v),
            None => world.desired.remove(&name),
        };
        [name]
    });
    for i in 0..20 {
        events.send((format!("item-{i}"), Some(i))).unwrap();
    }
    events.send(("item-3".into(), None)).unwrap();
    events.send(("bad-item".into(), Some(1))).unwrap();

    // Wait until every change has been applied (the resyncs keep the queue
    // busy, so poll the state instead of waiting for idle).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let done = {
            let world = world.lock();
            world.desired.iter().filter(|(k, _)| !k.starts_with("bad")).all(|(k, v)| world.actual.get(k) == Some(v))
                && !world.actual.contains_key("item-3")
        };
        if (done && handle.parked().len() == 1) || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let stats = handle.stats();
    println!("parked keys: {:?}", handle.parked());
    println!("info for bad-item: {:?}", handle.inspect(&"bad-item".to_string()));
    println!(
        "reconciles={} successes={} failures={} requeues={} waiting={} last_error={:?}",
        stats.reconciles, stats.successes, stats.failures, stats.requeues, stats.waiting, stats.last_error
    );
    let finished = handle.stop_with_drain(Duration::from_secs(5));
    println!("stopped cleanly: {finished}");
}
