//! Caches (docs/sources.md): a local copy of what a [`Source`] holds, kept by
//! one thread per cache that lists, then applies the change stream,
//! resumes it after a break, relists when its position expires (a relist
//! is a diff: keys missing from the new list are deletes, unchanged keys
//! no change), and backs off after failures (E4). Readers (`get`, `keys`,
//! `by_index`) take a read lock over the objects and the indexes together,
//! so an index never disagrees with the objects (E8).
//!
//! Subscribers are how controllers hear of changes: each applied change
//! (key, old, new, whether from a list) is passed to every subscriber on
//! the cache's thread, in the order applied, after the cache's lock is
//! released (so a subscriber may read the cache). A cache runs while
//! started ([`Cache::start`]) or used ([`Cache::acquire`], counted).
//!
//! A cache of a list function, polled (an `EtcdSource`, with the `etcd`
//! feature, is built and cached the same way):
//!
//! ```
//! use std::time::Duration;
//! use reconq::{Cache, PollingSource};
//!
//! let source = PollingSource::new(Duration::from_secs(30), || {
//!     Ok::<_, String>(vec![("a".to_string(), 1u64), ("b".to_string(), 22)])
//! })
//! .unwrap();
//! let cache = Cache::builder("sizes", source)
//!     .index("by-size", |_key, size: &u64| vec![size.to_string()])
//!     .build()
//!     .unwrap();
//! cache.start().unwrap();
//! assert!(cache.wait_synced(Some(Duration::from_secs(30))));
//! assert_eq!(cache.by_index("by-size", "22").unwrap(), ["b"]);
//! println!("{:?} of {} keys", cache.get(&"a".to_string()), cache.len());
//! cache.stop();
//! ```

mod backoff;
mod contents;
mod dense_map;
mod observe;
mod resume;
mod run;
mod stored;
mod subscribers;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{ReentrantMutex, RwLock};

use self::contents::{Contents, IndexFailure, IndexFn};
pub(crate) use self::stored::Codec;
#[cfg(feature = "python")]
pub(crate) use self::stored::ReadKept;
use self::stored::Stored;
pub(crate) use self::subscribers::RunCall;
use self::subscribers::{CatchUps, Subscriber};
use crate::context::StopSignal;
use crate::error::InvalidArgument;
use crate::logs;
use crate::source::{BatchScope, Source, Stop};
use crate::store::KeyRows;
use crate::sync::{Condvar, Mutex};
use crate::thread::{self, JoinHandle, ThreadWrapper};

/// A change a cache applied, as its subscribers get it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Applied<K, O> {
    /// The key that changed.
    pub key: K,
    /// What the cache held before (`None`: the key is new, or deleted
    /// without the cache ever holding it).
    pub old: Option<Arc<O>>,
    /// What it holds now (`None`: deleted).
    pub new: Option<Arc<O>>,
    /// Whether the change came from a list or relist (or was replayed to
    /// a new subscriber) rather than from the live stream.
    pub listed: bool,
}

/// A subscriber that is still catching up keeps its own copy of a change.
impl<K: Clone, O> Clone for Applied<K, O> {
    fn clone(&self) -> Self {
        Self { key: self.key.clone(), old: self.old.clone(), new: self.new.clone(), listed: self.listed }
    }
}

pub(crate) type SyncedHook = Box<dyn FnOnce() + Send>;
/// What a subscriber was told at the last run, for a restart that loads
/// the cache from its store: of the loaded rows (keys and versions encoded
/// as the store keeps them, in key order), by place, whether it heard of
/// that key at exactly that version: then it does not hear of it again.
/// A stored controller's restart difference (E9), bytes against bytes in
/// one merge, so a million unchanged keys cost no change each.
pub(crate) type Told = Box<dyn Fn(&KeyRows) -> Vec<bool> + Send + Sync>;
/// The subscribers, as the cache's thread takes them.
type Subscribers<K, O> = [Arc<Subscriber<K, O>>];
/// A key a restart loaded, to deliver, with its place among the loaded
/// rows.
type LoadedChange<K, O> = (usize, Applied<K, O>);
/// Index functions by name, in the order given.
type Indexes<K, O> = Vec<(String, IndexFn<K, O>)>;

/// Why a cache cannot start.
#[derive(Debug)]
#[non_exhaustive]
pub enum CacheError {
    /// It was stopped: a stopped cache never runs again.
    Stopped {
        /// The cache's name.
        cache: String,
    },
    /// The OS refused its thread.
    Thread(io::Error),
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::Stopped { cache } => write!(f, "cache {cache:?} is stopped and cannot start again"),
            CacheError::Thread(e) => write!(f, "cache thread: {e}"),
        }
    }
}

impl std::error::Error for CacheError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CacheError::Thread(e) => Some(e),
            CacheError::Stopped { .. } => None,
        }
    }
}

/// [`Cache::by_index`] was given a name no index has.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownIndex {
    /// The name asked for.
    pub index: String,
}

impl fmt::Display for UnknownIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown index {:?}", self.index)
    }
}

impl std::error::Error for UnknownIndex {}

/// What [`Cache::stats`] reports.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CacheStats<P> {
    /// The cache's name (as given to its builder).
    pub name: String,
    /// The first list has been applied.
    pub synced: bool,
    /// Keys held now.
    pub keys: usize,
    /// The position of the last list or event applied.
    pub position: Option<P>,
    /// Lists after the first (the position expired, or the source has no
    /// positions).
    pub relists: u64,
    /// This run started from the contents its store kept and resumed the
    /// source's stream there instead of listing (E9,
    /// [`CacheBuilder::keep_objects`]).
    pub resumed: bool,
    /// Stream events applied (puts, deletes, bookmarks).
    pub events: u64,
    /// Failures of the source (each logged as a WARNING).
    pub errors: u64,
    /// The message of the last failure, kept after the source recovers
    /// (`errors` says whether there were more).
    pub last_error: Option<String>,
    /// When [`last_error`](Self::last_error) happened (wall clock).
    pub last_error_time: Option<SystemTime>,
}

/// A cache of source `S`, cheap to clone (clones share it).
pub struct Cache<S: Source> {
    inner: Arc<Inner<S>>,
}

impl<S: Source> Clone for Cache<S> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

/// Builds a [`Cache`]: its name and indexes.
#[must_use = "a builder does nothing until `.build()`"]
pub struct CacheBuilder<S: Source> {
    name: String,
    source: S,
    indexes: Indexes<S::Key, S::Object>,
    first_backoff: Duration,
    thread_wrapper: Option<ThreadWrapper>,
    /// `store`: the file (canonical) and how keys, versions and positions
    /// are kept.
    store: Option<(std::path::PathBuf, Codec<S>)>,
    /// `digest`: what `store` keeps of an object the source gave no
    /// version for.
    digest: Option<stored::Digest<S::Object>>,
    /// `keep_objects`: how `store` keeps objects whole.
    objects: Option<stored::ObjectCodec<S::Object>>,
    /// What a list's index calls and object comparisons run inside.
    list_scope: Option<BatchScope>,
}

#[cfg(feature = "store")]
impl<S: Source> CacheBuilder<S>
where
    S::Key: crate::key_encoding::StoreKey,
    S::Version: crate::key_encoding::Keepable,
    S::Position: crate::key_encoding::Keepable,
{
    /// Keeps the cache's key set, each key's version and its position in
    /// `store` (guarantees E9), so a restart reconciles only what changed
    /// while the program was down: each controller that watches the cache
    /// keeps them with its own pending keys, in the same transaction, and
    /// must use the same file (else its `try_start` fails with
    /// [`StoreError::Invalid`](crate::StoreError::Invalid)). After a
    /// restart, the cache's first list is compared with what each
    /// controller kept: only keys created, deleted, or changed (their
    /// version differs, or the source gives none and there is no
    /// [`digest`](Self::digest)) are delivered to it. A
    /// delete found this way reaches `map` and `predicate` with `None` (the
    /// cache keeps versions, not objects). Cache names are unique among a
    /// file's caches: [`build`](Self::build) refuses a second live one.
    pub fn store(mut self, store: &crate::store::SqliteStore) -> Self {
        let codec = Codec {
            key: crate::key_encoding::encode_key::<S::Key>,
            decode: crate::key_encoding::decode_key::<S::Key>,
            version: <S::Version as crate::key_encoding::Keepable>::kept_bytes,
            position: <S::Position as crate::key_encoding::Keepable>::kept_bytes,
            digest: None,
            version_from: <S::Version as crate::key_encoding::Keepable>::from_kept_bytes,
            position_from: <S::Position as crate::key_encoding::Keepable>::from_kept_bytes,
            object: None,
            file: Arc::new(store.clone()),
        };
        self.store = Some((store.canonical_path().to_path_buf(), codec));
        self
    }

    /// With [`store`](Self::store): keeps each object whole too, with the
    /// source's position and its state there, so that a restart loads
    /// them from the file and resumes the source's stream from the kept
    /// position instead of listing everything again (E9; a source that
    /// can, as `EtcdSource`, says so with
    /// [`Source::resume_state`]). It relists only when the position
    /// expired (etcd compacted it, or its history was reset). Each change
    /// then writes its object to the file as well (docs/store.md: what it
    /// costs). An object that [`KeptObject::kept_object`] cannot keep
    /// makes the cache forget its snapshot: its next restart relists.
    ///
    /// [`KeptObject::kept_object`]: crate::key_encoding::KeptObject::kept_object
    pub fn keep_objects(self) -> Self
    where
        S::Object: crate::key_encoding::KeptObject,
    {
        use crate::key_encoding::KeptObject;
        self.keep_objects_read_by(Arc::new(S::Object::from_kept_object), None)
    }

    /// [`keep_objects`](Self::keep_objects), reading a kept object back
    /// with `read` instead of [`KeptObject::from_kept_object`], all of a
    /// restart's inside `scope` (the Python binding: an etcd value decoded
    /// by the source's `decode`, under one hold of the GIL).
    ///
    /// [`KeptObject::from_kept_object`]: crate::key_encoding::KeptObject::from_kept_object
    pub(crate) fn keep_objects_read_by(
        mut self,
        read: Arc<stored::ReadKept<S::Object>>,
        scope: Option<crate::source::BatchScope>,
    ) -> Self
    where
        S::Object: crate::key_encoding::KeptObject,
    {
        use crate::key_encoding::KeptObject;
        self.objects = Some(stored::ObjectCodec { encode: S::Object::kept_object, decode: read, scope });
        self
    }

    /// With [`store`](Self::store), for a source that gives no versions
    /// (a [`PollingSource`](crate::PollingSource) of `(key, object)`
    /// pairs, a [`Source`] whose items and puts carry none): keeps a
    /// digest of each such object instead, so a restart delivers only the
    /// keys whose object changed (E9) rather than every key.
    /// `canonical(obj)` gives bytes that stand for the object: equal
    /// objects must give equal bytes (a serialization with a fixed order,
    /// say), and objects whose change matters different ones; the store
    /// keeps a 128-bit XXH3 of them, not the bytes. `None`: this object
    /// cannot be digested, and its key counts as changed at every restart.
    /// A key the source gives a version for keeps the version, as without
    /// this. XXH3 is not a cryptographic hash: where whoever writes the
    /// source might craft a collision to hide a change made while the
    /// program was down, give versions.
    pub fn digest(mut self, canonical: impl Fn(&S::Object) -> Option<Vec<u8>> + Send + Sync + 'static) -> Self {
        self.digest = Some(Arc::new(move |obj: &S::Object| canonical(obj).as_deref().map(stored::digest_of)));
        self
    }
}

impl<S: Source> CacheBuilder<S> {
    /// Adds index `name`: `index(key, obj)` gives the values the key is
    /// found under with [`Cache::by_index`]. A panic is logged and leaves
    /// that key out of that index.
    pub fn index(
        mut self,
        name: impl Into<String>,
        index: impl Fn(&S::Key, &S::Object) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.indexes.push((name.into(), Arc::new(index)));
        self
    }

    /// Runs the cache's thread inside `wrapper`, as a controller's
    /// (`Controller::thread_wrapper`): the Python binding attaches it to
    /// the interpreter once for its life, since its source calls Python.
    pub fn thread_wrapper(mut self, wrapper: ThreadWrapper) -> Self {
        self.thread_wrapper = Some(wrapper);
        self
    }

    /// A list's (or a restart's load's) index functions and comparisons
    /// of objects run inside `scope`, all at once (the Python binding: one
    /// hold of the GIL, when they call Python).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn lists_in(mut self, scope: BatchScope) -> Self {
        self.list_scope = Some(scope);
        self
    }

    /// Tests wait less than E4's 0.8 s after a failure.
    #[cfg(test)]
    fn first_backoff(mut self, first: Duration) -> Self {
        self.first_backoff = first;
        self
    }

    /// The cache, not started. An empty name or two indexes of one name
    /// are refused.
    pub fn build(self) -> Result<Cache<S>, InvalidArgument> {
        if self.name.is_empty() {
            return Err(InvalidArgument::new("Cache: name must not be empty"));
        }
        for (i, (name, _)) in self.indexes.iter().enumerate() {
            if self.indexes[..i].iter().any(|(other, _)| other == name) {
                return Err(InvalidArgument::new(format!("Cache: indexes: {name:?} given twice")));
            }
        }
        let stored = match self.store {
            Some((file, codec)) => {
                let codec = Codec { digest: self.digest, object: self.objects, ..codec };
                Some(Stored::new(file, &self.name, codec).map_err(InvalidArgument::new)?)
            }
            None => None,
        };
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<S>>| Inner {
            _registration: crate::observe::register(weak.clone()),
            name: self.name,
            state: RwLock::new(State {
                contents: Contents::new(self.indexes),
                position: None,
                subscribers: Arc::new([]),
                next_subscriber: 0,
            }),
            delivery: ReentrantMutex::new(()),
            life: Mutex::new(Life { source: Some(self.source), ..Life::default() }),
            synced: Mutex::new(false),
            synced_cv: Condvar::new(),
            synced_hooks: Mutex::new(Vec::new()),
            loaded: AtomicBool::new(false),
            stop: Stop::new(),
            catch_ups: CatchUps::default(),
            exited: StopSignal::new(),
            counters: Counters::default(),
            first_backoff: self.first_backoff,
            thread_wrapper: self.thread_wrapper,
            list_scope: self.list_scope,
            stored,
        });
        Ok(Cache { inner })
    }
}

struct State<S: Source> {
    contents: Contents<S::Key, S::Object, S::Version>,
    position: Option<S::Position>,
    /// Replaced, never changed in place: the cache's thread takes the
    /// list with the change it applied, under the same lock.
    subscribers: Arc<Subscribers<S::Key, S::Object>>,
    next_subscriber: u64,
}

struct Life<S> {
    /// Until the thread takes it.
    source: Option<S>,
    thread: Option<JoinHandle<()>>,
    /// `start()` was called: the cache runs until `stop()`.
    kept: bool,
    /// Live [`CacheUse`]s.
    users: usize,
    stopped: bool,
}

impl<S> Default for Life<S> {
    fn default() -> Self {
        Self { source: None, thread: None, kept: false, users: 0, stopped: false }
    }
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    deletes: AtomicU64,
    bookmarks: AtomicU64,
    relists: AtomicU64,
    resumed: AtomicBool,
    errors: AtomicU64,
    /// Failures since the last list or event applied.
    consecutive_failures: AtomicU64,
    last_error: Mutex<Option<(String, SystemTime)>>,
}

struct Inner<S: Source> {
    /// Reports the status entry and metrics.
    _registration: crate::observe::Registration,
    name: String,
    state: RwLock<State<S>>,
    /// Held while a change is applied and delivered to subscribers, so a
    /// subscriber added meanwhile catches up on exactly what was held
    /// before the changes it hears, and `flush()` sees every change applied
    /// before it delivered (or waiting for a catch-up). Re-entrant: a
    /// subscriber may subscribe.
    delivery: ReentrantMutex<()>,
    life: Mutex<Life<S>>,
    synced: Mutex<bool>,
    synced_cv: Condvar,
    /// Run once, when the first list has reached the subscribers (taken
    /// under `synced`'s lock, then this one's).
    synced_hooks: Mutex<Vec<SyncedHook>>,
    /// The contents were loaded from the store (a restart that resumes):
    /// the cache holds keys before it syncs (at the resumed stream's
    /// `CaughtUp`), and a subscriber added meanwhile catches up on them.
    /// Set under the delivery lock, before the loaded keys are delivered.
    loaded: AtomicBool,
    stop: Stop,
    /// The threads delivering new subscribers' catch-ups.
    catch_ups: CatchUps,
    /// Set when the cache's thread is done with the source (also when it
    /// unwinds): what a stop with a deadline waits for, since a source
    /// blocked where it cannot see `stop` cannot be joined in time.
    exited: StopSignal,
    counters: Counters,
    first_backoff: Duration,
    thread_wrapper: Option<ThreadWrapper>,
    /// What a list's index calls and object comparisons run inside.
    list_scope: Option<BatchScope>,
    /// `store=` (E9).
    stored: Option<Stored<S>>,
}

impl<S: Source> Cache<S> {
    /// A builder for a cache named `name` (unique names make its status
    /// entry, metrics and log lines tell it apart) of `source`.
    pub fn builder(name: impl Into<String>, source: S) -> CacheBuilder<S> {
        CacheBuilder {
            name: name.into(),
            source,
            indexes: Vec::new(),
            first_backoff: backoff::FIRST,
            thread_wrapper: None,
            store: None,
            digest: None,
            objects: None,
            list_scope: None,
        }
    }

    /// The name given to [`Cache::builder`]: in logs, metrics and status.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The last state seen of `key`; `None` when absent.
    pub fn get(&self, key: &S::Key) -> Option<Arc<S::Object>> {
        self.inner.state.read().contents.get(key).cloned()
    }

    /// [`get`](Self::get) if the cache's lock can be had at once; `None`
    /// while it is held for a change. The Python binding reads with the
    /// GIL held this way, and waits for the lock without the GIL only
    /// when it must.
    #[cfg(feature = "python")]
    pub(crate) fn try_get(&self, key: &S::Key) -> Option<Option<Arc<S::Object>>> {
        Some(self.inner.state.try_read()?.contents.get(key).cloned())
    }

    /// The version the source gave with `key`'s last state, if any.
    pub fn version(&self, key: &S::Key) -> Option<S::Version> {
        self.inner.state.read().contents.version(key).cloned()
    }

    /// Whether the last state seen has `key` (cheaper than
    /// [`get`](Self::get): no clone of the `Arc`).
    pub fn contains(&self, key: &S::Key) -> bool {
        self.inner.state.read().contents.get(key).is_some()
    }

    /// Every key held now, in no particular order (a copy: the cache goes
    /// on changing).
    pub fn keys(&self) -> Vec<S::Key> {
        self.inner.state.read().contents.keys().cloned().collect()
    }

    /// How many keys are held now.
    pub fn len(&self) -> usize {
        self.inner.state.read().contents.len()
    }

    /// Whether no key is held (before the first list, or a source with
    /// nothing in it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys index `index` put under `value` (no scan of the cache).
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<S::Key>, UnknownIndex> {
        let state = self.inner.state.read();
        state.contents.by_index(index, value).ok_or_else(|| UnknownIndex { index: index.to_owned() })
    }

    /// The position of the last list or event applied.
    pub fn position(&self) -> Option<S::Position> {
        self.inner.state.read().position.clone()
    }

    /// Whether the first list has been applied (and delivered to the
    /// subscribers).
    pub fn synced(&self) -> bool {
        *self.inner.synced.lock()
    }

    /// Waits until [`synced`](Self::synced) (`None`: no time limit);
    /// returns whether it is. Returns `false` at once once stopped unsynced.
    pub fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut synced = self.inner.synced.lock();
        while !*synced && !self.inner.stop.is_set() {
            match deadline {
                Some(deadline) => {
                    if self.inner.synced_cv.wait_until(&mut synced, deadline).timed_out() {
                        break;
                    }
                }
                None => self.inner.synced_cv.wait(&mut synced),
            }
        }
        *synced
    }

    /// Whether [`stop`](Self::stop) was called (it cannot run again).
    pub(crate) fn is_stopped(&self) -> bool {
        self.inner.life.lock().stopped
    }

    /// Runs `hook` once the cache is [`synced`](Self::synced): on the
    /// cache's thread right after its first list reached the subscribers,
    /// or here at once if it already has. Never if the cache stops
    /// unsynced. How a controller's synced gate (E5) opens without a
    /// thread waiting.
    pub(crate) fn on_synced(&self, hook: impl FnOnce() + Send + 'static) {
        self.inner.on_synced(Box::new(hook));
    }

    /// Calls `subscriber` with every change applied from now on, on the
    /// cache's thread (keep it short: the cache applies nothing while it
    /// runs). A cache that has synced first catches it up: every key held
    /// now (`listed`, `old` `None`), on a catch-up thread of the cache, then
    /// the changes applied meanwhile, in order, nothing missed (this call
    /// returns at once, and the cache goes on with its other subscribers).
    /// Dropping the returned guard unsubscribes. A panic is logged and
    /// ignored.
    ///
    /// # Errors
    /// The OS refused the catch-up thread ([`CacheError::Thread`]); then
    /// nothing is subscribed.
    pub fn subscribe(
        &self,
        subscriber: impl Fn(&Applied<S::Key, S::Object>) + Send + Sync + 'static,
    ) -> Result<Subscription, CacheError> {
        self.subscribe_then(subscriber, None, None, None)
    }

    /// [`subscribe`](Self::subscribe), then `caught_up` once the subscriber
    /// has heard the cache's first list, or its catch-up and the changes
    /// applied meanwhile: on the cache's thread as it syncs, or on the
    /// catch-up thread before the subscriber hears anything more. Never if
    /// the cache stops first or the subscription ends. How a watch knows
    /// its controller has every key the cache holds (E5, E9). `run`: what
    /// takes changes a run at a time instead, if anything. `told`: what
    /// it was told at the last run ([`Told`]).
    pub(crate) fn subscribe_then(
        &self,
        subscriber: impl Fn(&Applied<S::Key, S::Object>) + Send + Sync + 'static,
        run: Option<RunCall<S::Key, S::Object>>,
        caught_up: Option<SyncedHook>,
        told: Option<Told>,
    ) -> Result<Subscription, CacheError> {
        let id = self.inner.subscribe(Box::new(subscriber), run, caught_up, told)?;
        let cache: Weak<dyn Unsubscribe> = Arc::downgrade(&self.inner) as Weak<dyn Unsubscribe>;
        Ok(Subscription { cache, id })
    }

    /// Starts the cache's thread (if not running) and keeps it running
    /// until [`stop`](Self::stop). A stopped cache cannot start again.
    pub fn start(&self) -> Result<(), CacheError> {
        let mut life = self.inner.life.lock();
        self.inner.run(&mut life)?;
        life.kept = true;
        Ok(())
    }

    /// Starts the cache if it is not running, and keeps it running while
    /// the returned guard (or another) lives: when the last guard goes,
    /// a cache never [`start`](Self::start)ed is stopped without waiting
    /// for its thread. How
    /// controllers share a cache.
    pub fn acquire(&self) -> Result<CacheUse, CacheError> {
        let mut life = self.inner.life.lock();
        self.inner.run(&mut life)?;
        life.users += 1;
        Ok(CacheUse { cache: Arc::clone(&self.inner) as Arc<dyn Release> })
    }

    /// Stops the cache for good: its stream is interrupted and its threads
    /// (its own and its catch-ups) joined, but the caller's own (a
    /// subscriber may stop it). No
    /// subscriber is called after it returns (from another thread).
    /// Idempotent. It waits as long as the source takes to heed its
    /// [`Stop`]; [`stop_timeout`](Self::stop_timeout) does not.
    pub fn stop(&self) {
        self.inner.request_stop();
        self.inner.wait_exited(None);
    }

    /// [`stop`](Self::stop), waiting at most `timeout` (real time) for the
    /// thread; returns whether it exited. If not (a source blocked where
    /// it does not look at its [`Stop`]), the thread is left to exit when
    /// the source returns: it applies and delivers nothing more.
    pub fn stop_timeout(&self, timeout: Duration) -> bool {
        self.inner.request_stop();
        self.inner.wait_exited(Some(crate::clock::deadline_after(Instant::now(), timeout)))
    }

    /// Waits until `deadline` (`None`: no limit) for a stopped cache's
    /// thread to exit; returns whether it has (true if it never ran).
    pub(crate) fn wait_exited(&self, deadline: Option<Instant>) -> bool {
        self.inner.wait_exited(deadline)
    }

    /// A snapshot of the cache's counters and its last error.
    pub fn stats(&self) -> CacheStats<S::Position> {
        self.inner.stats()
    }

    /// Blocks until every change the cache applied before the call is on
    /// disk with the enqueues it caused: each watching controller's
    /// pending keys and its copy of the cache's key set, versions and
    /// position (guarantees E9). This is the point to advance a position
    /// kept outside from: after a crash, every change applied before it
    /// is either reconciled or kept as handled. Without a store
    /// (`CacheBuilder::store`, feature `store`), or with no controller watching, it
    /// returns `Ok` at once (nothing is kept).
    ///
    /// # Errors
    /// A write failed: the [`StoreError`](crate::StoreError) inside the
    /// `io::Error`; its rows stay pending and the next flush writes them.
    pub fn flush(&self) -> io::Result<()> {
        let pending = self.ask_flush();
        pending.wait(None).expect("waited without a deadline").map_err(io::Error::from)
    }

    /// Asks for the writes [`flush`](Self::flush) waits for, once every
    /// change applied so far has been delivered: by the catch-ups (a change
    /// waiting in a backlog has not reached its subscriber) and by the
    /// cache's thread (the delivery lock).
    pub(crate) fn ask_flush(&self) -> crate::store::PendingFlush {
        self.inner.catch_ups.wait_delivered();
        let _delivered = self.inner.delivery.lock();
        crate::store::PendingFlush::ask(self.inner.stored.as_ref().map(Stored::flushers).unwrap_or_default())
    }

    /// The store file (canonical) of a cache with a store.
    pub(crate) fn stored_file(&self) -> Option<&std::path::Path> {
        self.inner.stored.as_ref().map(Stored::file)
    }

    /// How a cache with a store keeps its keys, versions and positions.
    pub(crate) fn codec(&self) -> Option<Codec<S>> {
        self.inner.stored.as_ref().map(|stored| stored.codec.clone())
    }

    /// What the cache keeps of its own contents (E9), if it keeps its
    /// objects: its watching controllers' flushers write it.
    pub(crate) fn snapshot(&self) -> Option<Arc<crate::store::CacheSnapshot>> {
        self.inner.stored.as_ref()?.snapshot.clone()
    }

    /// A watching controller's flusher joins `flush()`.
    pub(crate) fn add_flusher(&self, flusher: Weak<dyn crate::store::Flush>) {
        if let Some(stored) = &self.inner.stored {
            stored.add_flusher(flusher);
        }
    }

    /// `key`'s version as a stored cache keeps it, or its object's digest
    /// when the source gave no version and the cache has a
    /// [`digest`](CacheBuilder::digest) (`None`: neither, or one that
    /// cannot be kept); on the cache's thread while it delivers, that of
    /// the change being delivered.
    pub(crate) fn kept_version(&self, key: &S::Key) -> Option<Vec<u8>> {
        let codec = &self.inner.stored.as_ref()?.codec;
        let state = self.inner.state.read();
        if let Some(version) = state.contents.version(key) {
            return (codec.version)(version);
        }
        let digest = codec.digest.as_ref()?;
        let obj = state.contents.get(key).cloned()?;
        // The digest may call into Python: not under the cache's lock.
        drop(state);
        digest(&obj)
    }

    /// The cache's position as a stored cache keeps it.
    pub(crate) fn kept_position(&self) -> Option<Vec<u8>> {
        let codec = &self.inner.stored.as_ref()?.codec;
        self.inner.state.read().position.as_ref().and_then(codec.position)
    }

    /// A handle that does not keep the cache alive (for what the cache
    /// itself holds, as its subscribers).
    pub(crate) fn downgrade(&self) -> WeakCache<S> {
        WeakCache(Arc::downgrade(&self.inner))
    }
}

/// See [`Cache::downgrade`].
pub(crate) struct WeakCache<S: Source>(Weak<Inner<S>>);

impl<S: Source> WeakCache<S> {
    pub(crate) fn upgrade(&self) -> Option<Cache<S>> {
        self.0.upgrade().map(|inner| Cache { inner })
    }
}

impl<S: Source> fmt::Debug for Cache<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("name", &self.inner.name).finish_non_exhaustive()
    }
}

/// Keeps a cache subscribed; dropping it unsubscribes.
#[must_use = "dropping the subscription unsubscribes"]
pub struct Subscription {
    cache: Weak<dyn Unsubscribe>,
    id: u64,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").field("id", &self.id).finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache.unsubscribe(self.id);
        }
    }
}

trait Unsubscribe: Send + Sync {
    fn unsubscribe(&self, id: u64);
}

impl<S: Source> Unsubscribe for Inner<S> {
    fn unsubscribe(&self, id: u64) {
        Inner::unsubscribe(self, id);
    }
}

/// Keeps a cache running (see [`Cache::acquire`]).
#[must_use = "dropping the guard may stop the cache"]
pub struct CacheUse {
    cache: Arc<dyn Release>,
}

impl fmt::Debug for CacheUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheUse").finish_non_exhaustive()
    }
}

impl Drop for CacheUse {
    fn drop(&mut self) {
        self.cache.release();
    }
}

trait Release: Send + Sync {
    fn release(&self);
}

impl<S: Source> Release for Inner<S> {
    fn release(&self) {
        let last = {
            let mut life = self.life.lock();
            life.users -= 1;
            life.users == 0 && !life.kept
        };
        if last {
            // Not joined: the controller whose watch this was waits for the
            // thread within its stop's deadline, so a source that does not
            // heed its stop cannot hold that stop (or leadership) forever.
            self.request_stop();
        }
    }
}

/// Sets its signal when dropped: when the cache's thread is done with its
/// source, also if it unwinds.
struct SetOnDrop(StopSignal);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

impl<S: Source> Inner<S> {
    /// Spawns the thread unless it runs; refuses once stopped.
    fn run(self: &Arc<Self>, life: &mut Life<S>) -> Result<(), CacheError> {
        if life.stopped {
            return Err(CacheError::Stopped { cache: self.name.clone() });
        }
        let Some(source) = life.source.take() else { return Ok(()) };
        let inner = Arc::clone(self);
        let exited = SetOnDrop(self.exited.clone());
        match thread::spawn_named(format!("reconq-cache-{}", self.name), self.thread_wrapper.as_ref(), move || {
            let _exited = exited;
            inner.keep(source);
        }) {
            Ok(handle) => {
                life.thread = Some(handle);
                Ok(())
            }
            Err(e) => Err(CacheError::Thread(e)),
        }
    }

    /// Stops the cache for good without waiting for its thread: marks it
    /// stopped, sets the source's [`Stop`] and wakes `wait_synced`. Only
    /// the first call does anything.
    fn request_stop(&self) {
        {
            let mut life = self.life.lock();
            if life.stopped {
                return;
            }
            life.stopped = true;
            if life.source.take().is_some() {
                // Never started: no thread will set it.
                self.exited.set();
            }
        }
        if let Some(stored) = &self.stored {
            stored.release_name();
        }
        // Never to run: they may hold clones of this cache.
        let never_run = std::mem::take(&mut *self.synced_hooks.lock());
        drop(never_run);
        self.stop.set();
        {
            let _synced = self.synced.lock();
            self.synced_cv.notify_all();
        }
    }

    /// Waits until `deadline` (`None`: no limit) for the thread to exit,
    /// and joins it; returns whether it has exited (true if it never
    /// ran). False at once on the cache's own thread (a subscriber that
    /// stops the cache): it cannot wait for itself.
    fn wait_exited(&self, deadline: Option<Instant>) -> bool {
        let on_own_thread = {
            let life = self.life.lock();
            life.thread.as_ref().is_some_and(|t| t.thread().id() == thread::current().id())
        };
        if on_own_thread {
            return false;
        }
        let exited = match deadline {
            None => {
                self.exited.wait();
                true
            }
            Some(deadline) => self.exited.wait_timeout(deadline.saturating_duration_since(Instant::now())),
        };
        if exited && let Some(thread) = self.life.lock().thread.take() {
            let _ = thread.join();
        }
        self.catch_ups.close_and_join();
        exited
    }

    /// Runs `hook` once synced: now if it is, else with the synced hooks
    /// (see [`Cache::on_synced`]).
    fn on_synced(&self, hook: SyncedHook) {
        let synced = self.synced.lock();
        if *synced {
            drop(synced);
            hook();
        } else {
            self.synced_hooks.lock().push(hook);
        }
    }

    /// Logs what index functions failed at (after the cache's lock).
    fn index_failed(&self, failures: Vec<IndexFailure<S::Key>>) {
        for failure in failures {
            logs::cache_index_failed(&self.name, &failure.index, &failure.key, &failure.error);
        }
    }
}
