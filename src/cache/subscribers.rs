//! Who hears of a cache's changes: its subscribers, each called with every
//! change the cache applies, in order, on the cache's thread.
//!
//! A subscriber that comes to a synced cache first gets its *catch-up*:
//! every key the cache holds then (`listed`, `old` `None`). That may take
//! long (a controller's `map` for each key), so it runs on a catch-up
//! thread of the cache, never on the caller's (a controller's `start()` or
//! `watch_cache()` returns at once, as client-go's `AddEventHandler`) nor
//! on the cache's own (its other subscribers would wait). The changes the
//! cache applies meanwhile wait for that subscriber in its backlog, in the
//! order applied, and follow the catch-up on the same thread: none is
//! missed, and no earlier state reaches it after a later one. Once the
//! backlog is empty the subscriber is live: the cache's thread calls it.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Applied, CacheError, Inner, SyncedHook, Told};
use crate::source::Source;
use crate::store::KeyRows;
use crate::sync::{AtomicBool, Condvar, Mutex};
use crate::thread::{self, JoinHandle, ThreadWrapper};
use crate::{logs, panics};

/// What a subscriber is: called with each change.
pub(super) type Call<K, O> = Box<dyn Fn(&Applied<K, O>) + Send + Sync>;

/// What a subscriber that takes its changes a run at a time is called
/// with instead: changes in a row, in order, at most [`RUN`] of them.
pub(crate) type RunCall<K, O> = Box<dyn Fn(&[Applied<K, O>]) + Send + Sync>;

/// The changes a [`RunCall`] is given at most: a stop is looked at between
/// two runs, and a panic loses the rest of its run.
const RUN: usize = 256;

/// One subscriber, as the cache keeps it.
pub(super) struct Subscriber<K, O> {
    pub(super) id: u64,
    call: Call<K, O>,
    /// Called instead of `call` with runs of changes, if given (a watch
    /// whose handlers are Python answers a run under one hold of the GIL).
    run: Option<RunCall<K, O>>,
    /// What it was told at the last run: the keys of a restart's load it
    /// does not hear of.
    told: Option<Told>,
    /// `Some` until its catch-up is delivered: the changes applied since
    /// it subscribed, in order. Once `None` (live), never `Some` again, and
    /// only the cache's thread calls it.
    backlog: Mutex<Option<Vec<Applied<K, O>>>>,
    /// Unsubscribed: its catch-up ends.
    ended: AtomicBool,
}

impl<K: Clone, O> Subscriber<K, O> {
    /// Takes what waited in the backlog; when it is empty, `None`, and the
    /// subscriber goes live if `go_live`.
    fn take_backlog(&self, go_live: bool) -> Option<Vec<Applied<K, O>>> {
        let mut backlog = self.backlog.lock();
        let waiting = backlog.as_mut()?;
        if !waiting.is_empty() {
            return Some(std::mem::take(waiting));
        }
        if go_live {
            *backlog = None;
        }
        None
    }

    /// On the cache's thread: keeps `change` for after the catch-up, if
    /// one is on its way; `false` when live (call it now).
    fn waits(&self, change: &Applied<K, O>) -> bool {
        match &mut *self.backlog.lock() {
            Some(backlog) => {
                backlog.push(change.clone());
                true
            }
            None => false,
        }
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Of a restart's loaded `rows`, those it was told of at the last run
    /// (by place); `None`: it cannot tell, and hears of every one. Asked
    /// once, before any is delivered: a subscriber may forget what it
    /// answered for.
    pub(super) fn told_of(&self, rows: &KeyRows) -> Option<Vec<bool>> {
        let told = self.told.as_ref()?(rows);
        assert_eq!(told.len(), rows.len(), "an answer for each loaded row");
        Some(told)
    }
}

/// The catch-up threads of a cache: its `stop()` joins them (no subscriber
/// is called after it returns), its `flush()` waits for them (a change
/// waiting in a backlog has not reached that subscriber yet).
#[derive(Default)]
pub(super) struct CatchUps {
    threads: Mutex<Threads>,
    delivered: Condvar,
}

#[derive(Default)]
struct Threads {
    running: Vec<CatchUp>,
    /// The cache stopped: no catch-up starts any more.
    closed: bool,
}

struct CatchUp {
    thread: JoinHandle<()>,
    /// Its catch-up and backlog are delivered (or given up): it only has
    /// to exit.
    delivered: bool,
}

impl CatchUps {
    /// Runs `body` on a new catch-up thread (nothing once the cache
    /// stopped: it calls no subscriber any more).
    fn spawn(
        &self,
        name: String,
        wrapper: Option<&ThreadWrapper>,
        body: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        // Held until the handle is kept: the thread marks itself delivered
        // under this lock, so it finds its entry.
        let mut threads = self.threads.lock();
        if threads.closed {
            return Ok(());
        }
        threads.running.retain(|c| !c.thread.is_finished());
        let thread = thread::spawn_named(name, wrapper, body)?;
        threads.running.push(CatchUp { thread, delivered: false });
        Ok(())
    }

    /// The calling catch-up thread delivered all it had to.
    fn mark_delivered(&self) {
        let me = thread::current().id();
        let mut threads = self.threads.lock();
        for catch_up in threads.running.iter_mut().filter(|c| c.thread.thread().id() == me) {
            catch_up.delivered = true;
        }
        self.delivered.notify_all();
    }

    /// Waits until every catch-up but the caller's own (a subscriber may
    /// flush) has delivered all it had to.
    pub(super) fn wait_delivered(&self) {
        let me = thread::current().id();
        let mut threads = self.threads.lock();
        while threads.running.iter().any(|c| !c.delivered && c.thread.thread().id() != me) {
            self.delivered.wait(&mut threads);
        }
    }

    /// At the cache's stop (its stop flag set): no catch-up starts any
    /// more, and those running are joined, but the caller's own.
    pub(super) fn close_and_join(&self) {
        let running = {
            let mut threads = self.threads.lock();
            threads.closed = true;
            std::mem::take(&mut threads.running)
        };
        let me = thread::current().id();
        for catch_up in running {
            if catch_up.thread.thread().id() != me {
                let _ = catch_up.thread.join();
            }
        }
    }
}

/// Marks a catch-up thread delivered however its body ends.
struct Delivered<'a>(&'a CatchUps);

impl Drop for Delivered<'_> {
    fn drop(&mut self) {
        self.0.mark_delivered();
    }
}

impl<S: Source> Inner<S> {
    /// Adds a subscriber (see [`Cache::subscribe`](super::Cache::subscribe)):
    /// live at once if the cache holds nothing yet (not synced, nothing
    /// loaded; `caught_up` runs when it syncs), else live after its
    /// catch-up, on a catch-up thread that runs `caught_up` between the two
    /// (the changes applied meanwhile still wait) or, for a cache that
    /// loaded its contents and has not synced yet, when it syncs. Its id,
    /// to unsubscribe.
    pub(super) fn subscribe(
        self: &Arc<Self>,
        call: Call<S::Key, S::Object>,
        run: Option<RunCall<S::Key, S::Object>>,
        caught_up: Option<SyncedHook>,
        told: Option<Told>,
    ) -> Result<u64, CacheError> {
        // No change is applied or delivered meanwhile, so the catch-up and
        // the backlog meet exactly, and `synced` holds still.
        let _delivering = self.delivery.lock();
        // Only a list or a resumed stream's CaughtUp syncs a cache, and
        // events come after the first list or the load: an unsynced cache
        // that loaded nothing holds nothing to catch up on.
        let synced = *self.synced.lock();
        let holds = synced || self.loaded.load(Ordering::Acquire);
        let (subscriber, replay, catching_up) = {
            let mut state = self.state.write();
            let replay: Vec<Applied<S::Key, S::Object>> = if holds {
                let held = state.contents.objects();
                held.map(|(key, obj)| Applied { key: key.clone(), old: None, new: Some(Arc::clone(obj)), listed: true })
                    .collect()
            } else {
                Vec::new()
            };
            let catching_up = !replay.is_empty() || (holds && caught_up.is_some());
            let id = state.next_subscriber;
            state.next_subscriber += 1;
            let subscriber = Arc::new(Subscriber {
                id,
                call,
                run,
                told,
                backlog: Mutex::new(catching_up.then(Vec::new)),
                ended: AtomicBool::new(false),
            });
            let mut subscribers = state.subscribers.to_vec();
            subscribers.push(Arc::clone(&subscriber));
            state.subscribers = subscribers.into();
            (subscriber, replay, catching_up)
        };
        let id = subscriber.id;
        if !holds {
            if let Some(hook) = caught_up {
                self.synced_hooks.lock().push(hook);
            }
            return Ok(id);
        }
        if !catching_up {
            return Ok(id);
        }
        let inner = Arc::clone(self);
        let name = format!("reconq-cache-{}-catch-up", self.name);
        let spawned = self.catch_ups.spawn(name, self.thread_wrapper.as_ref(), move || {
            let _delivered = Delivered(&inner.catch_ups);
            inner.catch_up(&subscriber, replay, caught_up);
        });
        spawned.map(|()| id).map_err(|e| {
            self.unsubscribe(id);
            CacheError::Thread(e)
        })
    }

    /// The catch-up thread's body: `replay`, then the backlog until it is
    /// empty, `caught_up` (once synced: a cache that loaded its contents
    /// runs it when its resumed stream caught up, and waits for its
    /// catch-ups to deliver before it syncs), and the backlog again until
    /// the subscriber goes live. Given up when the cache stops or the
    /// subscriber goes.
    fn catch_up(
        &self,
        subscriber: &Subscriber<S::Key, S::Object>,
        replay: Vec<Applied<S::Key, S::Object>>,
        caught_up: Option<SyncedHook>,
    ) {
        if !(self.deliver_to(subscriber, &replay) && self.drain(subscriber, false)) {
            return;
        }
        drop(replay); // the objects held then: not kept while the backlog drains
        if let Some(hook) = caught_up {
            self.on_synced(hook);
        }
        self.drain(subscriber, true);
    }

    /// Delivers the backlog until it is empty (then live if `go_live`);
    /// `false` if given up.
    fn drain(&self, subscriber: &Subscriber<S::Key, S::Object>, go_live: bool) -> bool {
        while let Some(changes) = subscriber.take_backlog(go_live) {
            if !self.deliver_to(subscriber, &changes) {
                return false;
            }
        }
        true
    }

    /// Calls one subscriber with `changes` on a catch-up thread; `false`
    /// (given up) once the cache stops or the subscriber goes.
    fn deliver_to(&self, subscriber: &Subscriber<S::Key, S::Object>, changes: &[Applied<S::Key, S::Object>]) -> bool {
        for run in changes.chunks(RUN) {
            if self.stop.is_set() || subscriber.ended.load(Ordering::Relaxed) {
                return false;
            }
            self.call_run(subscriber, run);
        }
        true
    }

    /// Calls one subscriber with `run` (at most [`RUN`] changes in a row):
    /// all at once if it takes runs, else change by change.
    fn call_run(&self, subscriber: &Subscriber<S::Key, S::Object>, run: &[Applied<S::Key, S::Object>]) {
        let (Some(call_run), Some(first)) = (&subscriber.run, run.first()) else {
            return run.iter().for_each(|change| self.call(subscriber, change));
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| call_run(run))) {
            logs::cache_subscriber_panicked(&self.name, &first.key, &panics::message(&*panic));
        }
    }

    /// Calls one subscriber, catching (and logging) a panic.
    fn call(&self, subscriber: &Subscriber<S::Key, S::Object>, change: &Applied<S::Key, S::Object>) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| (subscriber.call)(change))) {
            logs::cache_subscriber_panicked(&self.name, &change.key, &panics::message(&*panic));
        }
    }

    /// On the cache's thread: passes `changes` to `subscribers` (taken
    /// with them, under the lock that applied them), unless the cache
    /// stopped meanwhile; to one still catching up, through its backlog.
    pub(super) fn deliver(
        &self,
        subscribers: &super::Subscribers<S::Key, S::Object>,
        changes: &[Applied<S::Key, S::Object>],
    ) {
        if changes.is_empty() || subscribers.is_empty() {
            return;
        }
        let _delivering = self.delivery.lock();
        for run in changes.chunks(RUN) {
            if self.stop.is_set() {
                return;
            }
            for subscriber in subscribers {
                // One catching up keeps them for after it; once live, it
                // stays live.
                let kept = run.iter().take_while(|change| subscriber.waits(change)).count();
                self.call_run(subscriber, &run[kept..]);
            }
        }
    }

    /// On the cache's thread: passes a restart's loaded keys (`changes`,
    /// each with its place among the loaded rows) to `subscribers`, each
    /// but the rows `told` says it heard at the last run
    /// ([`Subscriber::told_of`], in the subscribers' order).
    pub(super) fn deliver_loaded(
        &self,
        subscribers: &super::Subscribers<S::Key, S::Object>,
        changes: &[super::LoadedChange<S::Key, S::Object>],
        told: &[Option<Vec<bool>>],
    ) {
        let _delivering = self.delivery.lock();
        for (subscriber, told) in subscribers.iter().zip(told) {
            let unheard = changes.iter().filter(|(place, _)| told.as_ref().is_none_or(|told| !told[*place]));
            for (_, change) in unheard {
                if self.stop.is_set() {
                    return;
                }
                if !subscriber.waits(change) {
                    self.call(subscriber, change);
                }
            }
        }
    }

    /// Takes subscriber `id` out; a catch-up of it ends.
    pub(super) fn unsubscribe(&self, id: u64) {
        let gone = {
            let mut state = self.state.write();
            let (gone, kept): (Vec<_>, Vec<_>) = state.subscribers.iter().cloned().partition(|s| s.id == id);
            state.subscribers = kept.into();
            gone
        };
        // After the lock: ending is a synchronisation point of its own
        // (under shuttle, a switch to another thread).
        for subscriber in gone {
            subscriber.end();
        }
    }
}
