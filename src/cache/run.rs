//! The cache's thread: list, then apply the stream; resume after a break,
//! relist when the position expired (E3), back off after failures (E4).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Instant, SystemTime};

use super::backoff::{Backoff, RESET_AFTER};
use super::resume::{At, Keeping, Loaded, Row};
use super::{Applied, Inner};
use crate::logs;
use crate::source::{Event, EventOf, ListingOf, Source, SourceError, in_scope};

/// How the last stream ended, for the back-off rule: a plain expiry or
/// end of stream waits only when it repeats with nothing new applied
/// since (no change and no new position: a stream that gives a bookmark
/// at the position it started from and ends, a natural "nothing yet",
/// would otherwise be called again at once, forever).
#[derive(PartialEq)]
enum LastEnd {
    Other,
    PlainWithNothingNew,
}

impl<S: Source> Inner<S> {
    /// The thread's body: runs until the cache stops.
    pub(super) fn keep(self: Arc<Self>, mut source: S) {
        let mut backoff = Backoff::new(self.first_backoff);
        let mut keeping = Keeping::new(self.stored.as_ref(), &source);
        // A restart that resumes starts from the kept contents, as from a
        // list (so a later list is a relist).
        let resumed = keeping.as_ref().is_some_and(|keeping| self.resume(&mut source, keeping));
        let mut listed = resumed;
        let mut need_list = !resumed;
        let mut last_end = LastEnd::Other;
        while !self.stop.is_set() {
            if need_list {
                match source.list(&self.stop) {
                    Ok(listing) if !self.stop.is_set() => {
                        self.apply_list(listing, listed, &mut keeping);
                        listed = true;
                    }
                    Ok(_) => return,
                    Err(e) => {
                        if !self.stop.is_set() {
                            self.failed(&e, &mut backoff);
                        }
                        continue;
                    }
                }
            }
            let position = self.state.read().position.clone();
            let started = Instant::now();
            // Whether an event changed the contents or the position.
            let mut progressed = false;
            let end = match source.changes(position.as_ref(), &self.stop) {
                Err(e) => Some(e),
                Ok(mut stream) => loop {
                    match stream.next() {
                        None => break None,
                        Some(Ok(_)) if self.stop.is_set() => break None,
                        Some(Ok(event)) => progressed |= self.apply_event(event, &mut keeping),
                        Some(Err(e)) => break Some(e),
                    }
                },
            };
            if self.stop.is_set() {
                return;
            }
            if started.elapsed() >= RESET_AFTER {
                backoff.reset();
            }
            // A source without positions relists after every break.
            need_list = position.is_none() || end.as_ref().is_some_and(SourceError::is_expired);
            let plain = end.as_ref().is_none_or(SourceError::is_expired);
            let repeated = !progressed && last_end == LastEnd::PlainWithNothingNew;
            last_end = if plain && !progressed { LastEnd::PlainWithNothingNew } else { LastEnd::Other };
            match end {
                Some(e) if plain && !repeated => logs::cache_expired(&self.name, e.message()),
                None if !repeated => {}
                Some(e) => self.failed(&e, &mut backoff),
                None => self.failed(
                    &SourceError::new("the change stream ended again with no change and no new position"),
                    &mut backoff,
                ),
            }
        }
    }

    /// Counts and logs a failure, then waits the back-off (or until the
    /// cache stops).
    fn failed(&self, e: &SourceError, backoff: &mut Backoff) {
        let wait = backoff.wait();
        let c = &self.counters;
        c.errors.fetch_add(1, Relaxed);
        c.consecutive_failures.fetch_add(1, Relaxed);
        *c.last_error.lock() = Some((e.message().to_owned(), SystemTime::now()));
        logs::cache_failed(&self.name, e.message(), e.is_expired(), wait);
        self.stop.wait_timeout(wait);
    }

    fn succeeded(&self) {
        if self.counters.consecutive_failures.load(Relaxed) != 0 {
            self.counters.consecutive_failures.store(0, Relaxed);
        }
    }

    /// Loads the contents the store kept and prepares `source` to resume
    /// from their position; returns whether it will (else the cache
    /// lists). Not synced yet: the resumed stream's `CaughtUp` syncs it.
    /// The source hears of the position first, so its catch-up (etcd: a
    /// read of what changed since) overlaps the load of the rows.
    fn resume(&self, source: &mut S, keeping: &Keeping<S>) -> bool {
        let restored = keeping.kept_at(&self.name).and_then(|(position, state)| {
            if source.restore(&position, &state) {
                Ok(position)
            } else {
                Err("the source cannot resume from the kept position".to_owned())
            }
        });
        match restored.and_then(|position| keeping.kept_contents(&self.name, position)) {
            Ok(loaded) => {
                logs::cache_resumed(&self.name, loaded.listing.items.len());
                self.counters.resumed.store(true, Relaxed);
                let _delivering = self.delivery.lock();
                self.loaded.store(true, std::sync::atomic::Ordering::Release);
                self.load_contents(loaded);
                true
            }
            Err(why) => {
                logs::cache_not_resumed(&self.name, &why);
                false
            }
        }
    }

    /// Replaces the contents with `listing`; the first list syncs the
    /// cache once its changes are delivered.
    fn apply_list(&self, listing: ListingOf<S>, relist: bool, keeping: &mut Option<Keeping<S>>) {
        // Through the synced hooks: a stored cache's watches find the
        // deletes of a restart there, and `flush()` waits for them.
        let _delivering = self.delivery.lock();
        let kept = keeping.as_ref().map(|keeping| keeping.list(&listing));
        if relist {
            self.counters.relists.fetch_add(1, Relaxed);
        }
        self.succeeded();
        self.replace_contents_then(listing, || match kept {
            Some(Some((rows, at))) => keeping.as_ref().map_or((), |k| k.snapshot().replace(rows, at)),
            Some(None) => self.stop_keeping(keeping, "an object or a position it cannot keep"),
            None => {}
        });
        self.became_synced();
    }

    /// Holds the contents a restart loaded (the cache holds nothing yet),
    /// and delivers them as a list: to each subscriber, the keys it was
    /// not told of at the last run at the same version.
    fn load_contents(&self, Loaded { listing, rows }: Loaded<S>) {
        // Subscribing waits for the delivery lock (held): these are all
        // the subscribers until the load is delivered.
        let subscribers = Arc::clone(&self.state.read().subscribers);
        let told: Vec<Option<Vec<bool>>> = subscribers.iter().map(|s| s.told_of(&rows)).collect();
        drop(rows);
        let unheard = |place: usize| told.iter().any(|told| told.as_ref().is_none_or(|told| !told[place]));
        let mut failures = Vec::new();
        let changes = {
            let mut state = self.state.write();
            let contents = &mut state.contents;
            let changes = in_scope(self.list_scope.as_ref(), || contents.load(listing.items, &mut failures, unheard));
            state.position = listing.position;
            changes
        };
        self.index_failed(failures);
        self.deliver_loaded(&subscribers, &changes, &told);
    }

    /// Replaces the contents with `listing` and delivers the changes,
    /// running `applied` after the contents changed and before anyone
    /// hears of it.
    fn replace_contents_then(&self, listing: ListingOf<S>, applied: impl FnOnce()) {
        let mut failures = Vec::new();
        let (changes, subscribers) = {
            let mut state = self.state.write();
            let contents = &mut state.contents;
            let changes = in_scope(self.list_scope.as_ref(), || contents.replace(listing.items, &mut failures));
            state.position = listing.position;
            (changes, Arc::clone(&state.subscribers))
        };
        applied();
        self.index_failed(failures);
        self.deliver(&subscribers, &changes);
        // Gone before anyone hears of the sync: a list's changes (one for
        // each key, holding it and its object) are not kept past it.
        drop(changes);
    }

    /// The cache holds the source's state (a list, or a resumed stream
    /// caught up): synced, once; runs the synced hooks.
    fn became_synced(&self) {
        let hooks = {
            let mut synced = self.synced.lock();
            if *synced {
                return;
            }
            *synced = true;
            self.synced_cv.notify_all();
            std::mem::take(&mut *self.synced_hooks.lock())
        };
        for hook in hooks {
            hook();
        }
    }

    /// The snapshot cannot be kept (`why`): the file forgets it, and this
    /// run keeps no more.
    fn stop_keeping(&self, keeping: &mut Option<Keeping<S>>, why: &str) {
        if let Some(keeping) = keeping.take() {
            keeping.snapshot().forget();
            logs::cache_snapshot_dropped(&self.name, why);
        }
    }

    /// Applies `event`; returns whether it changed the contents (a put,
    /// or a delete of a key held) or the position. A resumed stream's
    /// `CaughtUp` syncs the cache.
    fn apply_event(&self, event: EventOf<S>, keeping: &mut Option<Keeping<S>>) -> bool {
        let delivering = self.delivery.lock();
        let caught_up = matches!(event, Event::CaughtUp { .. });
        // Before the object moves into the contents.
        let kept = keeping.as_ref().map(|keeping| kept(keeping, &event));
        let mut failures = Vec::new();
        let progressed;
        let (change, subscribers) = {
            let mut state = self.state.write();
            let (change, position) = match event {
                Event::Put { key, obj, position, version } => {
                    self.counters.puts.fetch_add(1, Relaxed);
                    (Some(state.contents.put(key, obj, version, &mut failures)), position)
                }
                Event::Delete { key, position } => {
                    self.counters.deletes.fetch_add(1, Relaxed);
                    (Some(state.contents.delete(key)), position)
                }
                Event::Bookmark { position } | Event::CaughtUp { position } => {
                    self.counters.bookmarks.fetch_add(1, Relaxed);
                    (None, Some(position))
                }
            };
            // A delete of a key not held changes nothing. Positions are
            // compared only when nothing else changed.
            let changed = change.as_ref().is_some_and(|c| c.old.is_some() || c.new.is_some());
            progressed = changed || position.as_ref().is_some_and(|p| state.position.as_ref() != Some(p));
            if position.is_some() {
                state.position = position;
            }
            (change, Arc::clone(&state.subscribers))
        };
        match (kept, keeping.as_ref()) {
            (Some(Some((row, at))), Some(keeping)) => keeping.snapshot().mark(row, at),
            (Some(None), _) => self.stop_keeping(keeping, "an object or a position it cannot keep"),
            _ => {}
        }
        self.succeeded();
        let changes: Vec<Applied<S::Key, S::Object>> = change.into_iter().collect();
        self.index_failed(failures);
        self.deliver(&subscribers, &changes);
        drop(delivering);
        if caught_up {
            self.caught_up();
        }
        progressed
    }

    /// A resumed stream caught up: synced once every subscriber that came
    /// after the load has heard what it held (its catch-up delivered), so
    /// the synced hooks (a restart's deletes, E9; the synced gate, E5) run
    /// after each has heard the whole state at `CaughtUp`. A subscriber
    /// added between the wait and the sync replays exactly that state
    /// (nothing is applied meanwhile).
    fn caught_up(&self) {
        self.catch_ups.wait_delivered();
        let _delivering = self.delivery.lock();
        self.became_synced();
    }
}

/// What the snapshot keeps of `event`: a key's row and the position with
/// the source's state there; `None`: something it cannot keep.
fn kept<S: Source>(keeping: &Keeping<S>, event: &EventOf<S>) -> Option<(Option<Row>, Option<At>)> {
    let (row, position) = match event {
        Event::Put { key, obj, position, version } => {
            (Some(keeping.put(key, obj, version.as_ref())?), position.as_ref())
        }
        Event::Delete { key, position } => (Some(keeping.delete(key)), position.as_ref()),
        Event::Bookmark { position } | Event::CaughtUp { position } => (None, Some(position)),
    };
    let at = match position {
        Some(position) => Some(keeping.at(position)?),
        None => None,
    };
    Some((row, at))
}
