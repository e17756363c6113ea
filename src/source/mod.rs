//! Sources (docs/sources.md): a system that holds the desired state, seen as a
//! list and a stream of changes with resumable positions, the shape of
//! client-go's `ListerWatcher` and kube-rs's `watcher`. A [`Cache`]
//! applies them; a source only says what the system holds and what
//! changed.
//!
//! - [`Source::list`] gives every item and, if the system has positions,
//!   the position of that list.
//! - [`Source::changes`] gives the changes after a position, as a
//!   blocking iterator of [`Event`]s, until it ends: an error that
//!   [`is_expired`](SourceError::is_expired) means the position is gone
//!   (relist), any other error or the end of the iterator is a break (the
//!   cache resumes from the last position it applied).
//! - A source whose list has no position is relisted after every break.
//!
//! Two are built in: [`PollingSource`] (a list function called every
//! interval, its differences turned into puts and deletes) and
//! `EtcdSource` (the `etcd` feature: a prefix of etcd, a paged list at
//! one revision, then a watch from the next revision).
//!
//! [`Cache`]: crate::Cache

#[cfg(feature = "etcd")]
mod etcd;
mod polling;
mod stop;

use std::fmt;
use std::hash::Hash;

#[cfg(feature = "etcd")]
pub use self::etcd::EtcdSource;
pub use self::polling::PollingSource;
pub use self::stop::{Stop, StopHook};

/// One change from a source's stream.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event<K, O, P, V> {
    /// `key` now holds `obj`. `position` (if any) is where the stream is
    /// once this is applied; `version` (if any) identifies this state of
    /// the key (etcd: its `mod_revision`).
    Put {
        /// The key that changed.
        key: K,
        /// Its new state.
        obj: O,
        /// Where the stream is once this is applied.
        position: Option<P>,
        /// This state's version.
        version: Option<V>,
    },
    /// `key` is gone.
    Delete {
        /// The key deleted.
        key: K,
        /// Where the stream is once this is applied.
        position: Option<P>,
    },
    /// Nothing changed up to `position` (etcd: a progress notification):
    /// a later resume starts there.
    Bookmark {
        /// Where the stream is.
        position: P,
    },
    /// The stream of a source restored at a kept position
    /// ([`Source::restore`]) has sent every change up to `position`, where
    /// the system was when the stream resumed: the restarted cache holds
    /// the system's state as of then, and is synced once it applied this
    /// (Kubernetes' watch-list ends its initial events with a bookmark
    /// the same way). A stream that was not restored never sends it.
    CaughtUp {
        /// Where the system was when the stream resumed.
        position: P,
    },
}

/// One item of a list.
///
/// Exhaustive, like [`Listing`]: a [`Source`] builds them by literal.
#[derive(Debug, Clone, PartialEq)]
pub struct Item<K, O, V> {
    /// The key.
    pub key: K,
    /// Its state.
    pub obj: O,
    /// What identifies this state of the key, if the source has versions
    /// (etcd: its `mod_revision`); a cache with a store compares it at a
    /// restart (guarantees E9).
    pub version: Option<V>,
}

impl<K, O, V> From<(K, O)> for Item<K, O, V> {
    fn from((key, obj): (K, O)) -> Self {
        Self { key, obj, version: None }
    }
}

impl<K, O, V> From<(K, O, V)> for Item<K, O, V> {
    fn from((key, obj, version): (K, O, V)) -> Self {
        Self { key, obj, version: Some(version) }
    }
}

/// What [`Source::list`] returns: every item (a key listed twice: the
/// last one counts) and the position of the list (`None`: the source has
/// no positions, and is relisted after every break).
#[derive(Debug, Clone, PartialEq)]
pub struct Listing<K, O, P, V> {
    /// Every item the source holds.
    pub items: Vec<Item<K, O, V>>,
    /// Where the stream resumes after this list.
    pub position: Option<P>,
}

/// The event type of source `S`.
pub type EventOf<S> = Event<<S as Source>::Key, <S as Source>::Object, <S as Source>::Position, <S as Source>::Version>;
/// The listing type of source `S`.
pub type ListingOf<S> =
    Listing<<S as Source>::Key, <S as Source>::Object, <S as Source>::Position, <S as Source>::Version>;
/// The stream [`Source::changes`] returns: events until an error or the end.
pub type Changes<'a, S> = Box<dyn Iterator<Item = Result<EventOf<S>, SourceError>> + 'a>;

/// A system a [`Cache`](crate::Cache) keeps a copy of. The cache calls
/// both methods on its own thread, one at a time; both may block (that
/// is how an idle cache uses no CPU), and both should return soon after
/// `stop` is set.
pub trait Source: Send + 'static {
    /// What names an item.
    type Key: Clone + Eq + Hash + fmt::Debug + Send + Sync + 'static;
    /// An item's state. Compared on a relist: an item listed again equal
    /// (and with an equal version) is not a change.
    type Object: PartialEq + Send + Sync + 'static;
    /// Where a stream is: a list's position, and each event's. Compared
    /// to tell a bookmark that moves the stream from one that does not.
    type Position: Clone + PartialEq + fmt::Debug + Send + Sync + 'static;
    /// What identifies one state of an item (kept for each key).
    type Version: Clone + PartialEq + fmt::Debug + Send + Sync + 'static;

    /// Every item the system holds now, and the position of this list.
    fn list(&mut self, stop: &Stop) -> Result<ListingOf<Self>, SourceError>;

    /// The changes after `from` (the last position the cache applied;
    /// `None` for a source without positions, right after its list), as
    /// they happen. The iterator blocks for the next one; it ends with an
    /// error (expired: relist; otherwise a break) or by returning `None`
    /// (a break, or `stop` was set).
    fn changes(&mut self, from: Option<&Self::Position>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError>;

    /// How to keep what this source needs, beside a position, to resume
    /// from it in a later process (etcd: its fingerprint of the prefix at
    /// that position, guarantees E1): a function the cache calls right
    /// after it applied a list or an event with a position (so it must
    /// describe the last position the source gave, and must not block).
    /// `None` (the default): this source cannot resume after a restart,
    /// and a restarted cache with a store relists (E9).
    fn resume_state(&self) -> Option<ResumeState> {
        None
    }

    /// A restarted cache holds what the system held at `position`, which
    /// [`resume_state`](Self::resume_state) described as `state` then.
    /// `true`: the next [`changes`](Self::changes) from `position`
    /// resumes there and sends [`Event::CaughtUp`] once it has sent every
    /// change up to where the system is at that call; `false` (the
    /// default, or a `state` this source cannot read): the cache relists.
    fn restore(&mut self, position: &Self::Position, state: &[u8]) -> bool {
        let _ = (position, state);
        false
    }
}

/// What [`Source::resume_state`] gives: the source's state at its last
/// position, as bytes kept in the store beside that position.
pub type ResumeState = std::sync::Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// What a batch of calls into a user's code runs inside: `scope(batch)`
/// calls `batch` once, having set up what each call would otherwise set
/// up on its own. The Python binding attaches to the interpreter once per
/// batch (an `EtcdSource`'s `decode` for a page of a list or a restart's
/// kept values, a watch's `map` and `predicate` for a run of changes): a
/// call that attached by itself waited, whenever a Python thread was
/// running, for a hand-off of the GIL (up to the 5 ms switch interval),
/// which made a list of 5,000 keys take 3.2 s instead of 0.05 s beside
/// one busy Python thread, and 13.7 s with a Python `map`. Holding it for
/// a batch is fair still: the interpreter hands the GIL over between the
/// calls' own bytecodes. Inside a scope no engine lock may be taken: a
/// thread holding one may be waiting for what the scope holds.
pub(crate) type BatchScope = std::sync::Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

/// Runs `batch` inside `scope`, if there is one, and gives its result.
pub(crate) fn in_scope<R>(scope: Option<&BatchScope>, batch: impl FnOnce() -> R) -> R {
    let Some(scope) = scope else { return batch() };
    let (mut batch, mut result) = (Some(batch), None);
    scope(&mut || result = batch.take().map(|batch| batch()));
    result.expect("a scope runs its batch")
}

/// Why a list or a stream failed. An expired one means the position is
/// gone (etcd: compacted, or etcd's history was reset): the cache relists
/// (guarantees E3); any other is a break, and the stream is resumed from
/// the last position applied, after a back-off (E4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    message: String,
    expired: bool,
}

impl SourceError {
    /// A failure: the cache resumes from its last position after a
    /// back-off (or relists, for a source without positions).
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), expired: false }
    }

    /// The position asked for is gone: the cache relists.
    pub fn expired(message: impl Into<String>) -> Self {
        Self { message: message.into(), expired: true }
    }

    /// Whether the position is gone (relist).
    pub fn is_expired(&self) -> bool {
        self.expired
    }

    /// What failed, as the cache logs it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SourceError {}
