//! [`EtcdSource`]: the keys under a prefix of etcd (docs/sources.md). The list
//! is read in pages at one revision; the watch starts at the next one and
//! asks for progress notifications, so a stream that falls silent (no
//! event and no progress notification within the progress timeout) is
//! taken as broken and resumed, instead of waiting forever (kopf's
//! "silently stalled" streams). A compacted revision, or a reply from a
//! reset history (its revision or raft term below one seen before:
//! `src/etcd/history.rs`), expires the position: the cache relists.
//!
//! A reset whose new history is already past the cache's revision gives
//! itself away in no header, so every watch opens only after checking
//! that the prefix held at the revision it starts from what the cache
//! holds (a [`Fingerprint`] of the list and the changes since, compared
//! in one request: `src/etcd/fingerprint.rs`). Once per (re)connect, never
//! while a watch runs, so an idle cache still only blocks on its stream.

use std::collections::VecDeque;
use std::fmt;
use std::net::Shutdown;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use super::{Changes, Event, Item, Listing, Source, SourceError, Stop};
use crate::coordination::{Endpoints, check_endpoints};
use crate::error::InvalidArgument;
use crate::etcd::{EtcdClient, EtcdError, Fingerprint, Page, RawKeyValue, WatchItem, read_ahead};
use crate::logs;
use crate::sync::Mutex;

/// Keys read per call of the list by default, at most.
const DEFAULT_PAGE_SIZE: usize = 250_000;

/// The pages a list aims at. Few, because etcd 3.4 walks every key from a
/// page's start to the prefix's end for each page (to count them): a
/// list of n keys in k pages costs it n·k/2 index visits on top of
/// building the JSON of n keys, which costs it about 50 times more a key
/// (measured: 1,000,000 keys in pages of 10,000 cost etcd more than twice
/// the CPU of one call; docs/benchmarks.md, W14). In 8 pages that is
/// about 7%, and the pages read ahead still overlap etcd's work with
/// ours.
const LIST_PAGES: usize = 8;

/// Keys of a page at least, however few pages that makes: below this a
/// call's own cost counts more than the walk.
const MIN_PAGE: usize = 10_000;

/// Keys of the first page at most, before the size of a key is known:
/// few, so even keys of etcd's largest values (1.5 MB unless
/// `--max-request-bytes` says otherwise) fit one reply. A first page of
/// any size costs etcd the same walk over the prefix.
const FIRST_PAGE: usize = 10;

/// How much larger a page may be than the one before: the size of a key
/// is known from a sample of the page before, so it grows in steps
/// (10, 1,000, then the rest) rather than trusting 10 keys for 100,000.
const PAGE_GROWTH: usize = 100;

/// The size of the gateway's reply a page after the first aims at, so
/// large values come in more pages instead of one reply too large to
/// read (64 MB at most) or to build within the page's timeout.
const PAGE_BYTES: usize = 16 << 20;

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
    /// checked before a watch resumes there. Behind a lock because the
    /// stream, which borrows the source, keeps it up to date.
    fingerprint: Mutex<Fingerprint>,
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
            fingerprint: Mutex::default(),
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

    /// Keys read per call of the list at most (positive; default
    /// 250,000). The first page holds at most 10, the next ones an eighth
    /// of the prefix's keys (10,000 at least) but at most 16 MB of the
    /// gateway's JSON each (by the size of the keys and values read so
    /// far) and 100 times the page before, so pages of large values stay
    /// small without setting this.
    pub fn page_size(mut self, keys: usize) -> Result<Self, InvalidArgument> {
        if keys == 0 {
            return Err(InvalidArgument::new("EtcdSource: page_size must be positive, got 0"));
        }
        self.page_size = keys;
        Ok(self)
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

    /// The next of the watched changes `pending` (`None` when there is
    /// none): what it is for the cache, if anything, once taken into the
    /// fingerprint. The changes of one revision come in one message of
    /// the watch, so `pending` holds the rest of its revision.
    fn next_change(&self, pending: &mut VecDeque<(bool, RawKeyValue)>) -> Option<Option<Event<K, O, i64, i64>>> {
        let (deleted, kv) = pending.pop_front()?;
        let last = pending.front().is_none_or(|(_, next)| next.mod_revision != kv.mod_revision);
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

/// The keys of the page after `page`, for a prefix of `keys` keys: about
/// a [`LIST_PAGES`]th of them but [`MIN_PAGE`] at least, and about
/// [`PAGE_BYTES`] of the gateway's JSON at the size of `page`'s keys
/// (base64 is 4/3 of the bytes; the revisions and field names about 100
/// bytes more per key), at most [`PAGE_GROWTH`] times `page`'s and
/// `page_size`, at least one.
fn next_page_size(page: &Page, keys: usize, page_size: usize) -> usize {
    let by_count = keys.div_ceil(LIST_PAGES).max(MIN_PAGE);
    let json: usize = page.kvs.iter().map(|kv| (kv.key.len() + kv.value.len()) * 4 / 3 + 100).sum();
    let by_bytes = (PAGE_BYTES * page.kvs.len()).checked_div(json).unwrap_or(usize::MAX);
    let growth = page.kvs.len().max(1).saturating_mul(PAGE_GROWTH);
    by_count.min(by_bytes).min(growth).min(page_size).max(1)
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
        let page_size = self.page_size;
        let pages = self
            .client
            .pages(&self.prefix, page_size.min(FIRST_PAGE), move |page, keys| next_page_size(page, keys, page_size));
        let whole = read_ahead(pages, |page| {
            if stop.is_set() {
                return ControlFlow::Break(());
            }
            revision = page.revision;
            // Every key left, the first page's count: one allocation.
            items.reserve(page.count);
            for kv in &page.kvs {
                fingerprint.listed(kv);
                if let Some((key, obj)) = self.put(kv) {
                    items.push(Item { key, obj, version: Some(kv.mod_revision) });
                }
            }
            ControlFlow::Continue(())
        })
        .map_err(source_error)?;
        if !whole {
            return Err(SourceError::new("stopped"));
        }
        fingerprint.listed_at(revision);
        *self.fingerprint.get_mut() = fingerprint;
        Ok(Listing { items, position: Some(revision) })
    }

    fn changes(&mut self, from: Option<&i64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let from = *from.ok_or_else(|| SourceError::expired("etcd: no revision to watch from"))?;
        let fingerprint = self.fingerprint.get_mut();
        // A position the fingerprint does not describe (none since the
        // process started) cannot be checked: there is nothing to compare.
        if fingerprint.revision() == Some(from) {
            self.client.check_prefix(&self.prefix, fingerprint).map_err(source_error)?;
        }
        let mut stream = self.client.watch_prefix(&self.prefix, from, self.progress_timeout).map_err(source_error)?;
        let closer = stream.closer().map_err(|e| SourceError::new(format!("etcd watch: {e}")))?;
        let hook = stop.on_set(move || {
            let _ = closer.shutdown(Shutdown::Both);
        });
        let stop = stop.clone();
        let this = &*self;
        let mut pending: VecDeque<(bool, RawKeyValue)> = VecDeque::new();
        Ok(Box::new(std::iter::from_fn(move || {
            let _unblocks_the_read = &hook;
            loop {
                if stop.is_set() {
                    return None;
                }
                match this.next_change(&mut pending) {
                    Some(Some(event)) => return Some(Ok(event)),
                    Some(None) => continue,
                    None => {}
                }
                match stream.next() {
                    Ok(WatchItem::Events(events)) => pending.extend(events),
                    Ok(WatchItem::Progress(revision)) => {
                        this.fingerprint.lock().moved_to(revision);
                        return Some(Ok(Event::Bookmark { position: revision }));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &[u8], value: &str, mod_revision: i64) -> RawKeyValue {
        RawKeyValue { key: [b"/p/", key].concat(), value: value.as_bytes().to_vec(), create_revision: 1, mod_revision }
    }

    fn page(kvs: Vec<RawKeyValue>) -> Page {
        Page { count: kvs.len(), kvs, more: true, revision: 1 }
    }

    #[test]
    fn pages_hold_an_eighth_of_the_keys_and_at_most_sixteen_megabytes() {
        let small = |n: usize| page((0..n).map(|i| kv(format!("k{i}").as_bytes(), "v", 1)).collect());
        assert_eq!(next_page_size(&small(2000), 1_000_000, 250_000), 125_000, "an eighth of the keys");
        assert_eq!(next_page_size(&small(1000), 20_000, 250_000), 10_000, "10,000 at least");
        assert_eq!(next_page_size(&small(1000), 1_000_000, 5), 5, "page_size at most");
        assert_eq!(next_page_size(&small(10), 1_000_000, 250_000), 1_000, "100 times the page before");
        let big = "x".repeat(30_000);
        let large = page((0..10).map(|i| kv(format!("k{i}").as_bytes(), &big, 1)).collect());
        assert_eq!(next_page_size(&large, 1_000_000, 250_000), 418, "16 MiB in keys of 40,106 bytes of JSON");
        let huge = page(vec![kv(b"k", &"x".repeat(40 << 20), 1)]);
        assert_eq!(next_page_size(&huge, 1_000_000, 250_000), 1, "at least one");
        assert_eq!(next_page_size(&page(Vec::new()), 1_000_000, 250_000), 100, "an empty page: no size known");
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
        let mut pending = VecDeque::from(batch);
        let events: Vec<_> = std::iter::from_fn(|| source.next_change(&mut pending)).flatten().collect();
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
}
