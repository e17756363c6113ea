//! [`EtcdSource`]: the keys under a prefix of etcd (docs/sources.md). The list
//! is read in pages at one revision, over etcd's gRPC (`src/etcd/paged.rs`);
//! the watch starts at the next one and asks for progress notifications,
//! so a stream that falls silent (no event and no progress notification
//! within the progress timeout) is taken as broken and resumed, instead of
//! waiting forever (kopf's "silently stalled" streams). A compacted
//! revision, or a reply from a reset history (its revision or raft term
//! below one seen before: `src/etcd/history.rs`), expires the position:
//! the cache relists.
//!
//! A reset whose new history is already past the cache's revision gives
//! itself away in no header, so every watch opens only after checking
//! that the prefix held at the revision it starts from what the cache
//! holds (a [`Fingerprint`] of the list and the changes since, compared
//! in one request: `src/etcd/fingerprint.rs`). Once per (re)connect, never
//! while a watch runs, so an idle cache still only blocks on its stream.
//!
//! A restarted cache resumes from the revision it kept
//! ([`Source::restore`]), with the fingerprint kept beside it
//! ([`Source::resume_state`]): checked the same way, then the watch
//! replays what changed meanwhile, deletes included, and says when the
//! cache holds what the prefix held when it resumed ([`Event::CaughtUp`],
//! `src/etcd/catch_up.rs`).

use std::collections::VecDeque;
use std::fmt;
use std::net::Shutdown;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::{BatchScope, Changes, Event, Item, Listing, ResumeState, Source, SourceError, Stop, in_scope};
use crate::coordination::{Endpoints, check_endpoints};
use crate::error::InvalidArgument;
use crate::etcd::{CatchUp, CatchUpRead, EtcdClient, EtcdError, Fingerprint, RawKeyValue, WatchItem, read_ahead};
use crate::logs;
use crate::sync::Mutex;

/// Keys read per call of the list by default, at most: no bound by
/// count, the pages are bounded by bytes (`src/etcd/paged.rs`).
const DEFAULT_PAGE_SIZE: usize = usize::MAX;

/// etcd's default `--experimental-watch-progress-notify-interval` (10
/// min) and a minute of slack.
const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_secs(11 * 60);

type Decode<O> = Arc<dyn Fn(&[u8]) -> Result<O, String> + Send + Sync>;

/// The keys under `prefix` in etcd. Keys are the etcd key without the
/// prefix, as a `String` (keys that are not UTF-8 are logged and skipped)
/// or through [`keys`](Self::keys); objects are the values, as bytes or
/// through [`decode`](Self::decode); the version of a key is its
/// `mod_revision`; the position is etcd's revision.
pub struct EtcdSource<O = Vec<u8>, K = String> {
    client: EtcdClient,
    prefix: String,
    /// The key, without the prefix, as the cache names it.
    key: Decode<K>,
    decode: Decode<O>,
    progress_timeout: Duration,
    page_size: usize,
    /// What the prefix held at the last position handed to the cache,
    /// checked before a watch resumes there, and kept beside that position
    /// for a resume in a later process. Behind a lock because the stream,
    /// which borrows the source, keeps it up to date, and the cache's
    /// [`ResumeState`] reads it.
    fingerprint: Arc<Mutex<Fingerprint>>,
    /// Restored at a kept position and not caught up yet: each stream
    /// opened reads where it will be ([`CatchUp`]). A list ends it, or the
    /// stream's [`Event::CaughtUp`].
    restored: AtomicBool,
    /// The first stream's catch-up, read from `restore` on.
    early_catch_up: Mutex<Option<CatchUpRead>>,
    /// What a page's decodes run inside (see [`BatchScope`]).
    decode_scope: Option<BatchScope>,
}

/// What a stream of changes keeps between the events it hands out.
#[derive(Debug, Default)]
struct StreamState {
    /// Changes read and not handed out yet: the rest of a revision's at
    /// least (one message of the watch holds whole revisions).
    pending: VecDeque<(bool, RawKeyValue)>,
    /// A restored stream's catch-up, until it is over.
    catch_up: Option<CatchUp>,
    /// `R` of the catch-up this stream ended: the changes up to it still
    /// to come net to nothing (`src/etcd/catch_up.rs`) and are not handed
    /// out, so the position never goes back.
    caught_up_at: Option<i64>,
    /// The last position handed out (the stream's `from` at first): a
    /// progress notification before it is not.
    position: i64,
}

impl EtcdSource<Vec<u8>> {
    /// The keys under `prefix` (not empty) of the etcd cluster at
    /// `endpoints` (`http://host:port`, one or several).
    pub fn new(endpoints: impl Endpoints, prefix: impl Into<String>) -> Result<Self, InvalidArgument> {
        let endpoints = check_endpoints(&endpoints, "EtcdSource")?;
        let prefix = prefix.into();
        if prefix.is_empty() {
            return Err(InvalidArgument::new("EtcdSource: prefix must not be empty"));
        }
        Ok(Self {
            client: EtcdClient::new(endpoints),
            prefix,
            key: Arc::new(|bytes: &[u8]| {
                String::from_utf8(bytes.to_vec()).map_err(|_| "the key is not UTF-8".to_owned())
            }),
            decode: Arc::new(|bytes: &[u8]| Ok(bytes.to_vec())),
            progress_timeout: DEFAULT_PROGRESS_TIMEOUT,
            page_size: DEFAULT_PAGE_SIZE,
            fingerprint: Arc::default(),
            restored: AtomicBool::new(false),
            early_catch_up: Mutex::default(),
            decode_scope: None,
        })
    }
}

impl<O, K> EtcdSource<O, K> {
    /// Objects are `decode(value)`; a value it fails on is logged and
    /// that change skipped (the cache keeps what it had for the key).
    pub fn decode<P, E: fmt::Display>(
        self,
        decode: impl Fn(&[u8]) -> Result<P, E> + Send + Sync + 'static,
    ) -> EtcdSource<P, K> {
        EtcdSource {
            client: self.client,
            prefix: self.prefix,
            key: self.key,
            decode: Arc::new(move |bytes: &[u8]| decode(bytes).map_err(|e| e.to_string())),
            progress_timeout: self.progress_timeout,
            page_size: self.page_size,
            fingerprint: self.fingerprint,
            restored: self.restored,
            early_catch_up: self.early_catch_up,
            decode_scope: self.decode_scope,
        }
    }

    /// Keys are `key(etcd key without the prefix)` instead of a `String`
    /// (the Python binding keeps keys that are not UTF-8 as bytes); a key
    /// it fails on is logged and that change skipped, as with `decode`.
    pub fn keys<L, E: fmt::Display>(
        self,
        key: impl Fn(&[u8]) -> Result<L, E> + Send + Sync + 'static,
    ) -> EtcdSource<O, L> {
        EtcdSource {
            client: self.client,
            prefix: self.prefix,
            key: Arc::new(move |bytes: &[u8]| key(bytes).map_err(|e| e.to_string())),
            decode: self.decode,
            progress_timeout: self.progress_timeout,
            page_size: self.page_size,
            fingerprint: self.fingerprint,
            restored: self.restored,
            early_catch_up: self.early_catch_up,
            decode_scope: self.decode_scope,
        }
    }

    /// How long a watch may go without an event or a progress
    /// notification before it is taken as stalled and resumed (positive;
    /// default 11 min). It must exceed etcd's
    /// `--experimental-watch-progress-notify-interval` (10 min unless set):
    /// lower both to notice a silent stream sooner.
    pub fn progress_timeout(mut self, timeout: Duration) -> Result<Self, InvalidArgument> {
        if timeout.is_zero() {
            return Err(InvalidArgument::new("EtcdSource: progress_timeout must be positive, got 0 s"));
        }
        self.progress_timeout = timeout;
        Ok(self)
    }

    /// Keys read per call of the list at most (positive; default: no
    /// bound). The first page holds at most 10 keys, the next ones as
    /// many as fit 64 MiB of etcd's reply at the size of the keys read so
    /// far, so pages of large values stay small without setting this.
    pub fn page_size(mut self, keys: usize) -> Result<Self, InvalidArgument> {
        if keys == 0 {
            return Err(InvalidArgument::new("EtcdSource: page_size must be positive, got 0"));
        }
        self.page_size = keys;
        Ok(self)
    }

    /// Decodes each page of a list inside `scope`, once for the page
    /// (the Python binding: one hold of the GIL, not one per value).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn decode_in(mut self, scope: BatchScope) -> Self {
        self.decode_scope = Some(scope);
        self
    }

    /// The key without the prefix, or why it is skipped.
    fn key(&self, kv: &RawKeyValue) -> Result<K, String> {
        (self.key)(kv.key.strip_prefix(self.prefix.as_bytes()).unwrap_or(&kv.key))
    }

    /// `Some` of what `read` makes of `kv`, or `None` (logged) if it fails.
    fn skipping<T>(&self, kv: &RawKeyValue, read: impl FnOnce() -> Result<T, String>) -> Option<T> {
        read().map_err(|why| logs::source_skipped(&self.prefix, &String::from_utf8_lossy(&kv.key), &why)).ok()
    }

    /// A put's key and object, or `None` (logged) if either cannot be had.
    fn put(&self, kv: &RawKeyValue) -> Option<(K, O)> {
        self.skipping(kv, || Ok((self.key(kv)?, (self.decode)(&kv.value)?)))
    }

    /// The next event of a stream (`None` when no change is pending): the
    /// end of its catch-up once reached, or its next change, if any is
    /// pending after the catch-up's end.
    fn next_event(&self, state: &mut StreamState) -> Option<Option<Event<K, O, i64, i64>>> {
        if let Some(catch_up) = state.catch_up {
            let next = state.pending.front().map(|(_, kv)| kv.mod_revision);
            let mut fingerprint = self.fingerprint.lock();
            if catch_up.reached(&fingerprint, next) {
                // The prefix at R is the state it describes (the same keys,
                // and as many): it describes R too, the cache keeps it there.
                fingerprint.moved_to(catch_up.revision());
                self.restored.store(false, Relaxed);
                state.catch_up = None;
                state.caught_up_at = Some(catch_up.revision());
                state.position = catch_up.revision();
                return Some(Some(Event::CaughtUp { position: catch_up.revision() }));
            }
        }
        // Up to the R of a catch-up that ended: they net to nothing.
        let up_to = state.caught_up_at.unwrap_or(i64::MIN);
        while state.pending.front().is_some_and(|(_, kv)| kv.mod_revision <= up_to) {
            state.pending.pop_front();
        }
        self.next_change(state)
    }

    /// Where a restored stream from `from` is caught up: as read from
    /// `restore` on (waiting for that read if need be), or read again now
    /// (that read failed, or came from before a reset). Either wait ends
    /// at a stop: etcd may take `READ_TIMEOUT` to answer.
    fn catch_up(&mut self, from: i64, stop: &Stop) -> Result<CatchUp, SourceError> {
        let stopped = || stop.is_set();
        let early = self.early_catch_up.get_mut().take().and_then(|read| read.wait(stopped));
        let read = match early {
            // Read before `from` was checked: a revision below it would
            // come from a history reset since, which the check saw.
            Some(Ok(catch_up)) if catch_up.revision() >= from => Some(Ok(catch_up)),
            _ if stopped() => None,
            _ => match CatchUpRead::start(&self.client, &self.prefix, from) {
                Some(read) => read.wait(stopped),
                None => Some(self.client.catch_up(&self.prefix, from)),
            },
        };
        read.ok_or_else(|| SourceError::new("stopped"))?.map_err(source_error)
    }

    /// What a progress notification at `revision` is for the cache: a
    /// bookmark (one at the stream's position too: it keeps a quiet stream
    /// alive), unless the stream is catching up (it may then come before
    /// the changes it covers: etcd#15220, fixed in 3.4.24 and 3.5.8) or it
    /// would move the position back.
    fn progress(&self, state: &mut StreamState, revision: i64) -> Option<Event<K, O, i64, i64>> {
        if state.catch_up.is_some() || revision < state.position {
            return None;
        }
        state.position = revision;
        self.fingerprint.lock().moved_to(revision);
        Some(Event::Bookmark { position: revision })
    }

    /// The next of a stream's pending changes (`None` when there is
    /// none): what it is for the cache, if anything, once taken into the
    /// fingerprint and the stream's position. The changes of one revision
    /// come in one message of the watch, so the rest of its revision is
    /// pending.
    fn next_change(&self, state: &mut StreamState) -> Option<Option<Event<K, O, i64, i64>>> {
        let pending = &mut state.pending;
        let (deleted, kv) = pending.pop_front()?;
        let last = pending.front().is_none_or(|(_, next)| next.mod_revision != kv.mod_revision);
        if last {
            state.position = kv.mod_revision;
        }
        self.fingerprint.lock().changed(deleted, &kv, last);
        Some(self.event(deleted, kv, last))
    }

    /// What a watched change is for the cache. Only the last change of a
    /// revision carries it as a position (`last`): a resume after it must
    /// not skip the others of that transaction. A change that cannot be
    /// had (logged) is a bookmark there.
    fn event(&self, deleted: bool, kv: RawKeyValue, last: bool) -> Option<Event<K, O, i64, i64>> {
        let revision = kv.mod_revision;
        let position = last.then_some(revision);
        let event = if deleted {
            self.skipping(&kv, || self.key(&kv)).map(|key| Event::Delete { key, position })
        } else {
            self.put(&kv).map(|(key, obj)| Event::Put { key, obj, position, version: Some(revision) })
        };
        event.or_else(|| position.map(|position| Event::Bookmark { position }))
    }
}

/// Compaction and a reset of etcd's history expire the position.
fn source_error(e: EtcdError) -> SourceError {
    if e.reset().is_some() || e.compacted().is_some() {
        SourceError::expired(e.to_string())
    } else {
        SourceError::new(e.to_string())
    }
}

impl<O, K> fmt::Debug for EtcdSource<O, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSource")
            .field("endpoints", &self.client.endpoints())
            .field("prefix", &self.prefix)
            .field("progress_timeout", &self.progress_timeout)
            .field("page_size", &self.page_size)
            .finish()
    }
}

impl<O, K> Source for EtcdSource<O, K>
where
    O: PartialEq + Send + Sync + 'static,
    K: Clone + Eq + std::hash::Hash + fmt::Debug + Send + Sync + 'static,
{
    type Key = K;
    type Object = O;
    type Position = i64;
    type Version = i64;

    fn list(&mut self, stop: &Stop) -> Result<Listing<K, O, i64, i64>, SourceError> {
        // A list reads the new history whole: what the old one said goes.
        self.client.accept_reset();
        let mut items = Vec::new();
        let mut fingerprint = Fingerprint::default();
        let mut revision = 0;
        let stopped = stop.clone();
        let pages = self.client.pages(&self.prefix, self.page_size, Arc::new(move || stopped.is_set()));
        let whole = read_ahead(pages, |page| {
            if stop.is_set() {
                return ControlFlow::Break(());
            }
            revision = page.revision;
            // Every key left, the first page's count: one allocation.
            items.reserve(page.count);
            in_scope(self.decode_scope.as_ref(), || {
                for kv in &page.kvs {
                    fingerprint.listed(kv);
                    if let Some((key, obj)) = self.put(kv) {
                        items.push(Item { key, obj, version: Some(kv.mod_revision) });
                    }
                }
            });
            ControlFlow::Continue(())
        })
        .map_err(source_error)?;
        if !whole {
            return Err(SourceError::new("stopped"));
        }
        fingerprint.listed_at(revision);
        *self.fingerprint.lock() = fingerprint;
        self.restored.store(false, Relaxed);
        *self.early_catch_up.get_mut() = None;
        Ok(Listing { items, position: Some(revision) })
    }

    fn changes(&mut self, from: Option<&i64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let from = *from.ok_or_else(|| SourceError::expired("etcd: no revision to watch from"))?;
        let fingerprint = self.fingerprint.lock().clone();
        // A position the fingerprint does not describe (none since the
        // process started) cannot be checked: there is nothing to compare.
        let described = fingerprint.revision() == Some(from);
        if described {
            self.client.check_prefix(&self.prefix, &fingerprint).map_err(source_error)?;
        }
        let catch_up = if self.restored.load(Relaxed) {
            // The catch-up counts the keys from the fingerprint's count at
            // `from`: with none there, it could not tell when it is over.
            if !described {
                let restored = fingerprint.revision().unwrap_or(0);
                return Err(SourceError::expired(format!(
                    "etcd: a resume from revision {from} cannot tell when it caught up: the state restored is at {restored}"
                )));
            }
            Some(self.catch_up(from, stop)?)
        } else {
            None
        };
        let mut stream = self.client.watch_prefix(&self.prefix, from, self.progress_timeout).map_err(source_error)?;
        let closer = stream.closer().map_err(|e| SourceError::new(format!("etcd watch: {e}")))?;
        let hook = stop.on_set(move || {
            let _ = closer.shutdown(Shutdown::Both);
        });
        let stop = stop.clone();
        let this = &*self;
        let mut state = StreamState { catch_up, position: from, ..StreamState::default() };
        Ok(Box::new(std::iter::from_fn(move || {
            let _unblocks_the_read = &hook;
            loop {
                if stop.is_set() {
                    return None;
                }
                match this.next_event(&mut state) {
                    Some(Some(event)) => return Some(Ok(event)),
                    Some(None) => continue,
                    None => {}
                }
                match stream.next() {
                    Ok(WatchItem::Events(events)) => state.pending.extend(events),
                    Ok(WatchItem::Progress(revision)) => {
                        if let Some(bookmark) = this.progress(&mut state, revision) {
                            return Some(Ok(bookmark));
                        }
                    }
                    Ok(WatchItem::Quiet) => {
                        let quiet = this.progress_timeout;
                        return Some(Err(SourceError::new(format!(
                            "etcd watch: no event and no progress notification for {quiet:?}; resuming"
                        ))));
                    }
                    Err(_) if stop.is_set() => return None,
                    Err(e) => return Some(Err(source_error(e))),
                }
            }
        })))
    }

    fn resume_state(&self) -> Option<ResumeState> {
        let fingerprint = Arc::clone(&self.fingerprint);
        Some(Arc::new(move || fingerprint.lock().kept()))
    }

    fn restore(&mut self, position: &i64, state: &[u8]) -> bool {
        let Some(fingerprint) = Fingerprint::from_kept(*position, state) else { return false };
        *self.fingerprint.lock() = fingerprint;
        self.restored.store(true, Relaxed);
        *self.early_catch_up.get_mut() = CatchUpRead::start(&self.client, &self.prefix, *position);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &[u8], value: &str, mod_revision: i64) -> RawKeyValue {
        let (key, value) = ([b"/p/", key].concat().into(), value.as_bytes().to_vec().into());
        RawKeyValue { key, value, create_revision: 1, mod_revision }
    }

    /// A resume after any event must not skip the rest of its transaction:
    /// only the last change of a revision is a position, and a change that
    /// cannot be had still moves the position (as a bookmark).
    #[test]
    fn only_the_last_change_of_a_revision_is_a_position() {
        let source = EtcdSource::new("http://127.0.0.1:1", "/p/").unwrap();
        let source = source.decode(|v: &[u8]| std::str::from_utf8(v).map(str::to_owned));
        let batch = vec![
            (false, kv(b"a", "1", 7)),
            (true, kv(b"b", "", 7)),
            (false, kv(b"c", "3", 8)),
            (false, kv(b"\xff", "4", 9)),
        ];
        let mut state = StreamState { pending: VecDeque::from(batch), ..StreamState::default() };
        let events: Vec<_> = std::iter::from_fn(|| source.next_change(&mut state)).flatten().collect();
        assert_eq!(
            events,
            [
                Event::Put { key: "a".into(), obj: "1".into(), position: None, version: Some(7) },
                Event::Delete { key: "b".into(), position: Some(7) },
                Event::Put { key: "c".into(), obj: "3".into(), position: Some(8), version: Some(8) },
                Event::Bookmark { position: 9 },
            ]
        );
    }

    type TextEvent = Event<String, String, i64, i64>;

    /// A put of `key` = `value` at `revision`, of a key created at `created`.
    fn put(key: &str, value: &str, created: i64, revision: i64) -> (bool, RawKeyValue) {
        let key = format!("/p/{key}").into_bytes().into();
        (false, RawKeyValue { key, value: value.to_owned().into(), create_revision: created, mod_revision: revision })
    }

    /// A delete of `key` at `revision`.
    fn delete(key: &str, revision: i64) -> (bool, RawKeyValue) {
        let key = format!("/p/{key}").into_bytes().into();
        (true, RawKeyValue { key, value: Default::default(), create_revision: 0, mod_revision: revision })
    }

    /// A source of `/p/` restored at revision `from`, where it held `keys`.
    fn restored(from: i64, keys: &[&str]) -> EtcdSource<String> {
        let mut fingerprint = Fingerprint::default();
        for key in keys {
            fingerprint.listed(&put(key, "v", 2, 2).1);
        }
        fingerprint.listed_at(from);
        let source = EtcdSource::new("http://127.0.0.1:1", "/p/").unwrap();
        let mut source = source.decode(|v: &[u8]| std::str::from_utf8(v).map(str::to_owned));
        assert!(source.restore(&from, &fingerprint.kept()));
        source
    }

    /// What a stream resumed after `from` and catching up to `catch_up`
    /// hands out when the watch sends `messages`, one after the other
    /// (looking once before the first, as a stream does); and its state.
    fn catching_up(
        source: &EtcdSource<String>,
        from: i64,
        catch_up: CatchUp,
        messages: Vec<Vec<(bool, RawKeyValue)>>,
    ) -> (Vec<TextEvent>, StreamState) {
        let mut state = StreamState { catch_up: Some(catch_up), position: from, ..StreamState::default() };
        let mut events = Vec::new();
        for message in std::iter::once(Vec::new()).chain(messages) {
            state.pending.extend(message);
            while let Some(event) = source.next_event(&mut state) {
                events.extend(event);
            }
        }
        (events, state)
    }

    fn put_event(key: &str, value: &str, position: Option<i64>, version: i64) -> TextEvent {
        Event::Put { key: key.into(), obj: value.into(), position, version: Some(version) }
    }

    /// The state the cache keeps after the last event, read back at `position`.
    fn kept_at(source: &EtcdSource<String>, position: i64) -> Option<Fingerprint> {
        Fingerprint::from_kept(position, &source.resume_state().unwrap()())
    }

    #[test]
    fn a_restored_stream_with_nothing_to_catch_up_is_caught_up_at_once() {
        let source = restored(10, &["a", "b", "c"]);
        // Etcd is at 12 (writes elsewhere); the prefix is as it was at 10.
        let (events, _) = catching_up(&source, 10, CatchUp::at(12, 3, 10), vec![vec![put("z", "1", 13, 13)]]);
        assert_eq!(events, [Event::CaughtUp { position: 12 }, put_event("z", "1", Some(13), 13)]);
        assert!(!source.restored.load(Relaxed), "a later stream has no catch-up");
    }

    #[test]
    fn a_restored_stream_is_caught_up_once_every_key_changed_since_was_sent() {
        let source = restored(10, &["a", "b", "c"]);
        // d and e created at 11 (one transaction), a changed at 12.
        let messages = vec![vec![put("d", "4", 11, 11), put("e", "5", 11, 11)], vec![put("a", "2", 2, 12)]];
        let (events, _) = catching_up(&source, 10, CatchUp::at(12, 5, 12), messages);
        let expected = [
            put_event("d", "4", None, 11),
            put_event("e", "5", Some(11), 11),
            put_event("a", "2", Some(12), 12),
            Event::CaughtUp { position: 12 },
        ];
        assert_eq!(events, expected);
        let kept = kept_at(&source, 12).expect("the state kept at the end describes R");
        assert_eq!(kept.count(), 5);
    }

    #[test]
    fn a_restored_stream_is_caught_up_once_it_holds_as_many_keys_as_etcd() {
        let source = restored(10, &["a", "b", "c"]);
        // a and b deleted: no key present at R changed, only the count says.
        let messages = vec![vec![delete("a", 11)], vec![delete("b", 12)]];
        let (events, _) = catching_up(&source, 10, CatchUp::at(15, 1, 10), messages);
        let expected = [
            Event::Delete { key: "a".into(), position: Some(11) },
            Event::Delete { key: "b".into(), position: Some(12) },
            Event::CaughtUp { position: 15 },
        ];
        assert_eq!(events, expected);
        assert_eq!(kept_at(&source, 15).map(|f| f.count()), Some(1));
    }

    /// A key created and deleted while the reader was down: the reader
    /// holds etcd's state at R before it hears of it, and what comes of
    /// it after, up to R, nets to nothing and is not handed out (nor a
    /// progress notification there: the position never goes back).
    #[test]
    fn changes_up_to_r_after_the_catch_up_net_to_nothing_and_are_skipped() {
        let source = restored(10, &["a", "b", "c"]);
        let messages = vec![vec![put("x", "1", 11, 11)], vec![delete("x", 12)], vec![put("a", "2", 2, 13)]];
        let (events, mut state) = catching_up(&source, 10, CatchUp::at(12, 3, 10), messages);
        assert_eq!(events, [Event::CaughtUp { position: 12 }, put_event("a", "2", Some(13), 13)]);
        assert_eq!(source.progress(&mut state, 12), None);
        assert_eq!(source.progress(&mut state, 13), Some(Event::Bookmark { position: 13 }), "a quiet stream's");
    }

    #[test]
    fn a_change_past_r_ends_the_catch_up_before_it() {
        let source = restored(10, &["a", "b", "c"]);
        // A count etcd's R never reaches in this stream: the change after
        // R says every change up to R was sent all the same.
        let messages = vec![vec![put("d", "4", 11, 11), put("a", "2", 2, 13)]];
        let (events, _) = catching_up(&source, 10, CatchUp::at(12, 9, 11), messages);
        let expected =
            [put_event("d", "4", Some(11), 11), Event::CaughtUp { position: 12 }, put_event("a", "2", Some(13), 13)];
        assert_eq!(events, expected);
    }

    #[test]
    fn a_progress_notification_during_a_catch_up_is_no_position() {
        let source = restored(10, &["a"]);
        let (events, mut state) = catching_up(&source, 10, CatchUp::at(12, 2, 12), Vec::new());
        assert_eq!(events, []);
        assert_eq!(source.progress(&mut state, 20), None, "etcd#15220: it may come before the changes it covers");
        assert_eq!(kept_at(&source, 10).map(|f| f.count()), Some(1), "still at the restored position");
    }

    /// etcd#15220: a progress notification may come before a change of its
    /// revision. Outside a catch-up it is a bookmark, and the change still
    /// reaches the cache.
    #[test]
    fn a_change_after_a_progress_notification_of_its_revision_is_handed_out() {
        let source = restored(10, &["a"]);
        let mut state = StreamState { position: 10, ..StreamState::default() };
        assert_eq!(source.progress(&mut state, 12), Some(Event::Bookmark { position: 12 }));
        state.pending.push_back(put("b", "2", 12, 12));
        assert_eq!(source.next_event(&mut state), Some(Some(put_event("b", "2", Some(12), 12))));
    }

    #[test]
    fn a_kept_state_restores_at_its_position_only_and_garbage_does_not() {
        let source = restored(10, &["a", "b"]);
        let kept = source.resume_state().unwrap()();
        let mut fresh = EtcdSource::new("http://127.0.0.1:1", "/p/").unwrap();
        assert!(!fresh.restore(&11, &kept), "another position");
        assert!(!fresh.restore(&10, b"garbage"));
        assert!(!fresh.restore(&10, &[]));
        assert!(!fresh.restore(&10, &kept[..kept.len() - 1]), "cut short");
        assert!(!fresh.restored.load(Relaxed));
        assert!(fresh.restore(&10, &kept));
        assert!(fresh.restored.load(Relaxed));
        assert_eq!(kept_at(&source, 10).as_ref(), Some(&*fresh.fingerprint.lock()));
    }
}
