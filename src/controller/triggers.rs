//! Consul-style triggers and watches: threads that enqueue keys.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::core::{ControllerKey, Core, When};
use crate::context::StopSignal;
use crate::sync::Mutex;
use crate::{logs, panics};

type Hasher = foldhash::fast::RandomState;

/// What a trigger function returns: whether its key should be enqueued.
/// `()` always enqueues, `bool` says so, a `Result` enqueues on `Ok` (an
/// `Err` is "the trigger failed": nothing is enqueued). A trigger whose
/// stop signal was set never enqueues, whatever it returns.
pub trait TriggerOutcome {
    /// Whether the trigger's key is enqueued.
    fn should_enqueue(&self) -> bool;
}

impl TriggerOutcome for () {
    fn should_enqueue(&self) -> bool {
        true
    }
}

impl TriggerOutcome for bool {
    fn should_enqueue(&self) -> bool {
        *self
    }
}

impl<T, E> TriggerOutcome for Result<T, E> {
    fn should_enqueue(&self) -> bool {
        self.is_ok()
    }
}

/// The live triggers, one per key, each with an id so a finished trigger
/// removes only its own entry.
pub(crate) struct Triggers<K> {
    map: HashMap<K, (u64, StopSignal), Hasher>,
    next_id: u64,
}

impl<K> Default for Triggers<K> {
    fn default() -> Self {
        Self { map: HashMap::with_hasher(Hasher::default()), next_id: 0 }
    }
}

/// Signals every trigger of `triggers` (the controller is stopping).
pub(crate) fn stop_all<K>(triggers: &Mutex<Triggers<K>>) {
    let signals: Vec<StopSignal> = triggers.lock().map.drain().map(|(_, (_, s))| s).collect();
    for signal in signals {
        signal.set();
    }
}

/// Runs `trigger` on its own thread for `key`, in `registry` (replacing
/// and signalling the trigger `key` had); enqueues `key` when it returns
/// (see `ControllerHandle::add_trigger`).
pub(crate) fn add<K, F, R>(core: &Arc<Core<K>>, registry: &Arc<Mutex<Triggers<K>>>, key: K, trigger: F)
where
    K: ControllerKey,
    F: FnOnce(&StopSignal) -> R + Send + 'static,
    R: TriggerOutcome,
{
    if core.life.is_stopping() {
        return;
    }
    let signal = StopSignal::new();
    let (id, replaced) = {
        let mut triggers = registry.lock();
        let id = triggers.next_id;
        triggers.next_id += 1;
        (id, triggers.map.insert(key.clone(), (id, signal.clone())))
    };
    if let Some((_, old)) = replaced {
        old.set();
    }
    // A stop that drained the map before our insert missed this one.
    if core.life.is_stopping() {
        signal.set();
    }
    let name = format!("reconq-{}-trigger", core.name);
    let registry = Arc::clone(registry);
    core.spawn_aux(name, move |core| {
        let result = catch_unwind(AssertUnwindSafe(|| trigger(&signal)));
        {
            let mut triggers = registry.lock();
            if triggers.map.get(&key).is_some_and(|(live, _)| *live == id) {
                triggers.map.remove(&key);
            }
        }
        match result {
            Ok(outcome) => {
                if outcome.should_enqueue() && !signal.is_set() {
                    core.route(key, When::Event, 0);
                }
            }
            Err(payload) => {
                let message = panics::message(&*payload);
                logs::trigger_panicked(&core.name, &key, &message);
            }
        }
    });
}

/// Signals the trigger for `key` in `registry`; whether there was one.
pub(crate) fn remove<K: ControllerKey>(registry: &Mutex<Triggers<K>>, key: &K) -> bool {
    let removed = registry.lock().map.remove(key);
    match removed {
        Some((_, signal)) => {
            signal.set();
            true
        }
        None => false,
    }
}

/// Consumes `events` on its own thread, enqueueing what `transform` gives
/// (see `ControllerHandle::watch`).
pub(crate) fn watch<K, I, E, F, R>(core: &Arc<Core<K>>, events: I, mut transform: F)
where
    K: ControllerKey,
    I: IntoIterator<Item = E>,
    I::IntoIter: Send + 'static,
    F: FnMut(E) -> R + Send + 'static,
    R: IntoIterator<Item = K>,
{
    let events = events.into_iter();
    let name = format!("reconq-{}-watch", core.name);
    core.spawn_aux(name, move |core| {
        for event in events {
            if core.life.is_stopping() {
                break;
            }
            enqueue_all(core, &mut transform, event);
        }
    });
}

/// [`watch`] for a channel, interrupted by the stop (see
/// `ControllerHandle::watch_channel`).
pub(crate) fn watch_channel<K, E, F, R>(core: &Arc<Core<K>>, events: crossbeam_channel::Receiver<E>, mut transform: F)
where
    K: ControllerKey,
    E: Send + 'static,
    F: FnMut(E) -> R + Send + 'static,
    R: IntoIterator<Item = K>,
{
    let name = format!("reconq-{}-watch", core.name);
    core.spawn_aux(name, move |core| {
        let stop = core.life.stop_channel();
        loop {
            crossbeam_channel::select! {
                recv(events) -> event => match event {
                    Ok(event) => enqueue_all(core, &mut transform, event),
                    Err(_) => break,
                },
                recv(stop) -> _ => break,
            }
        }
    });
}

fn enqueue_all<K, E, F, R>(core: &Core<K>, transform: &mut F, event: E)
where
    K: ControllerKey,
    F: FnMut(E) -> R,
    R: IntoIterator<Item = K>,
{
    match catch_unwind(AssertUnwindSafe(|| transform(event).into_iter().collect::<Vec<K>>())) {
        Ok(keys) => {
            for key in keys {
                core.route(key, When::Event, 0);
            }
        }
        Err(payload) => {
            let message = panics::message(&*payload);
            logs::watch_transform_panicked(&core.name, &message);
        }
    }
}
