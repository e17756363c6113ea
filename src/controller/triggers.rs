//! Consul-style triggers and watches: threads that enqueue keys.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use super::core::{ControllerKey, Core, When};
use super::handle::ControllerHandle;
use crate::context::StopSignal;
use crate::sync::Mutex;
use crate::{logs, panics};

type Hasher = foldhash::fast::RandomState;

/// What a trigger function returns: whether its key should be enqueued.
/// `()` always enqueues, `bool` says so, a `Result` enqueues on `Ok` (an
/// `Err` is "the trigger failed": nothing is enqueued). A trigger whose
/// stop signal was set never enqueues, whatever it returns.
pub trait TriggerOutcome {
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

impl<K: ControllerKey> ControllerHandle<K> {
    /// Runs `trigger(&stop)` on its own thread and enqueues `key` when it
    /// returns, unless it panicked, returned "don't" (see
    /// [`TriggerOutcome`]), or `stop` was set meanwhile. `stop` is set by
    /// [`remove_trigger`](Self::remove_trigger), by a later trigger for the
    /// same key (which replaces this one), and by stopping the controller;
    /// a long-running trigger should wait on it
    /// (`stop.wait_timeout(..)`) rather than sleep. Ignored once stopped.
    pub fn add_trigger<F, R>(&self, key: K, trigger: F)
    where
        F: FnOnce(&StopSignal) -> R + Send + 'static,
        R: TriggerOutcome,
    {
        if self.core.life.is_stopping() {
            return;
        }
        let signal = StopSignal::new();
        let (id, replaced) = {
            let mut triggers = self.features.triggers.lock();
            let id = triggers.next_id;
            triggers.next_id += 1;
            (id, triggers.map.insert(key.clone(), (id, signal.clone())))
        };
        if let Some((_, old)) = replaced {
            old.set();
        }
        // A stop that drained the map before our insert missed this one.
        if self.core.life.is_stopping() {
            signal.set();
        }
        let name = format!("reconq-{}-trigger", self.core.name);
        let registry = Arc::clone(&self.features.triggers);
        self.core.spawn_aux(name, move |core| {
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

    /// Signals the trigger for `key` (it will not enqueue); returns whether
    /// there was one.
    pub fn remove_trigger(&self, key: &K) -> bool {
        let removed = self.features.triggers.lock().map.remove(key);
        match removed {
            Some((_, signal)) => {
                signal.set();
                true
            }
            None => false,
        }
    }

    /// Consumes `events` on its own thread and enqueues every key
    /// `transform(event)` returns (any `IntoIterator`: a `Vec`, an
    /// `Option`, `std::iter::once(k)`...). The thread ends when the iterator
    /// does, or at the first event after the controller stops; an iterator
    /// that blocks forever keeps it alive (it is detached at a drain's
    /// deadline). For a `crossbeam_channel::Receiver`, prefer
    /// [`watch_channel`](Self::watch_channel), which a stop interrupts.
    /// A panic in `transform` is logged and the event skipped.
    pub fn watch<I, E, F, R>(&self, events: I, mut transform: F)
    where
        I: IntoIterator<Item = E>,
        I::IntoIter: Send + 'static,
        F: FnMut(E) -> R + Send + 'static,
        R: IntoIterator<Item = K>,
    {
        let events = events.into_iter();
        let name = format!("reconq-{}-watch", self.core.name);
        self.core.spawn_aux(name, move |core| {
            for event in events {
                if core.life.is_stopping() {
                    break;
                }
                enqueue_all(core, &mut transform, event);
            }
        });
    }

    /// Like [`watch`](Self::watch) for a channel, but interruptible: the
    /// thread ends when every sender is dropped or the controller stops,
    /// whichever comes first.
    pub fn watch_channel<E, F, R>(&self, events: crossbeam_channel::Receiver<E>, mut transform: F)
    where
        E: Send + 'static,
        F: FnMut(E) -> R + Send + 'static,
        R: IntoIterator<Item = K>,
    {
        let name = format!("reconq-{}-watch", self.core.name);
        self.core.spawn_aux(name, move |core| {
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
