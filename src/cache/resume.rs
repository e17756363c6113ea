//! A stored cache that keeps its objects (E9,
//! [`CacheBuilder::keep_objects`](super::CacheBuilder::keep_objects)), of
//! a source that can resume in a later process
//! ([`Source::resume_state`]): what the cache's thread marks in its
//! snapshot for each list and event, and, at a restart, the snapshot read
//! back as the contents the resumed stream starts from.
//!
//! The marks are computed before the change is applied (the object moves
//! into the contents) and given to the snapshot after it is applied and
//! *before* it is delivered (see `store::cache_snapshot` for why).

use std::collections::HashMap;
use std::sync::Arc;

use super::stored::{Codec, ObjectCodec, Stored};
use crate::source::{Item, Listing, ListingOf, ResumeState, Source, in_scope};
use crate::store::{CacheSnapshot, KeptAt, KeyRows, SnapshotRow};

/// A key's snapshot row, encoded.
pub(super) type Row = (Vec<u8>, SnapshotRow);
/// A position and the source's state there, encoded.
pub(super) type At = KeptAt;
/// A whole list's rows, by encoded key.
pub(super) type ListRows = HashMap<Vec<u8>, SnapshotRow>;

pub(super) struct Keeping<S: Source> {
    snapshot: Arc<CacheSnapshot>,
    state: ResumeState,
    codec: Codec<S>,
    objects: ObjectCodec<S::Object>,
}

impl<S: Source> Keeping<S> {
    /// `Some` for a cache that keeps its objects, of a source that can
    /// resume.
    pub(super) fn new(stored: Option<&Stored<S>>, source: &S) -> Option<Self> {
        let stored = stored?;
        let snapshot = stored.snapshot.clone()?;
        let objects = stored.codec.object.clone()?;
        let state = source.resume_state()?;
        Some(Self { snapshot, state, codec: stored.codec.clone(), objects })
    }

    pub(super) fn snapshot(&self) -> &CacheSnapshot {
        &self.snapshot
    }

    /// The row of `key` holding `obj` at `version`; `None`: the object
    /// cannot be kept.
    pub(super) fn put(&self, key: &S::Key, obj: &S::Object, version: Option<&S::Version>) -> Option<Row> {
        let value = (self.objects.encode)(obj)?;
        let version = version.and_then(self.codec.version);
        Some(((self.codec.key)(key), Some((version, value))))
    }

    /// The row of `key` deleted.
    pub(super) fn delete(&self, key: &S::Key) -> Row {
        ((self.codec.key)(key), None)
    }

    /// `position` with the source's state now; `None`: the position
    /// cannot be kept.
    pub(super) fn at(&self, position: &S::Position) -> Option<At> {
        Some(((self.codec.position)(position)?, (self.state)()))
    }

    /// The rows of a whole list; `None`: an object cannot be kept.
    pub(super) fn list(&self, listing: &ListingOf<S>) -> Option<(ListRows, Option<At>)> {
        let rows: Option<HashMap<_, _>> =
            listing.items.iter().map(|item| self.put(&item.key, &item.obj, item.version.as_ref())).collect();
        let at = match &listing.position {
            Some(position) => Some(self.at(position)?),
            None => None,
        };
        Some((rows?, at))
    }

    /// The position the store kept for cache `name` and the source's
    /// state there; `Err`: why there is none to resume from.
    pub(super) fn kept_at(&self, name: &str) -> Result<(S::Position, Vec<u8>), String> {
        let (position, state) = self.codec.file.snapshot_at(name)?.ok_or("no snapshot kept")?;
        let position = (self.codec.position_from)(&position).ok_or("a position this source cannot read")?;
        Ok((position, state))
    }

    /// The contents the store kept for cache `name`, as a list at
    /// `position`, with each item's key and version as the file keeps
    /// them; `Err`: why they cannot be read back.
    pub(super) fn kept_contents(&self, name: &str, position: S::Position) -> Result<Loaded<S>, String> {
        let mut items = Vec::new();
        let mut rows = KeyRows::default();
        in_scope(self.objects.scope.as_ref(), || {
            self.codec.file.snapshot_rows(name, &mut |(key, version, value)| {
                let unreadable = || format!("a row this cache cannot read (key {key:02x?})");
                let decoded = match version {
                    Some(version) => Some((self.codec.version_from)(version).ok_or_else(unreadable)?),
                    None => None,
                };
                let obj = (self.objects.decode)(value).ok_or_else(unreadable)?;
                items.push(Item { key: (self.codec.decode)(key).ok_or_else(unreadable)?, obj, version: decoded });
                rows.push(key, version);
                Ok(())
            })
        })?;
        Ok(Loaded { listing: Listing { items, position: Some(position) }, rows })
    }
}

/// What a restart read back: the contents as a list, and the rows they
/// came from.
pub(super) struct Loaded<S: Source> {
    pub(super) listing: ListingOf<S>,
    /// The encoded key and version of each loaded item, in the items'
    /// order (the file's: by key), for the subscribers that can tell
    /// which of them they were told of ([`Told`](super::Told)).
    pub(super) rows: KeyRows,
}
