//! A cache with a store (guarantees E9, docs/store.md): what it needs to
//! have its key set kept by the controllers it feeds. The rows themselves
//! are each watching controller's (`store::cache_rows`), written by that
//! controller's flusher with its pending keys; the cache brings the
//! encodings of its keys, versions and positions (or, for a source without
//! versions, digests of its objects), the file its controllers must use,
//! its name held unique in that file, and `flush()` over their flushers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use crate::source::{BatchScope, Source};
use crate::store::{CacheName, CacheSnapshot, Flush, SnapshotFile};
use crate::sync::Mutex;

/// What a stored cache keeps of an object in place of a version (see
/// [`digest_of`]); `None`: this object cannot be digested.
pub(crate) type Digest<O> = Arc<dyn Fn(&O) -> Option<Vec<u8>> + Send + Sync>;

/// How a stored cache's keys, versions and positions are kept (the key
/// encoding; a version or position that cannot be kept is `None`).
pub(crate) struct Codec<S: Source> {
    pub(crate) key: fn(&S::Key) -> Vec<u8>,
    pub(crate) decode: fn(&[u8]) -> Option<S::Key>,
    pub(crate) version: fn(&S::Version) -> Option<Vec<u8>>,
    pub(crate) position: fn(&S::Position) -> Option<Vec<u8>>,
    /// Kept instead of the version of a key the source gave none
    /// (`CacheBuilder::digest`): without it such a key counts as changed
    /// at every restart.
    pub(crate) digest: Option<Digest<S::Object>>,
    /// How versions and positions read back (a restart that resumes).
    pub(crate) version_from: fn(&[u8]) -> Option<S::Version>,
    pub(crate) position_from: fn(&[u8]) -> Option<S::Position>,
    /// How objects are kept (`CacheBuilder::keep_objects`); `None`: they
    /// are not, and a restart relists.
    pub(crate) object: Option<ObjectCodec<S::Object>>,
    /// The file a restart reads the snapshot back from.
    pub(crate) file: Arc<dyn SnapshotFile>,
}

impl<S: Source> Clone for Codec<S> {
    fn clone(&self) -> Self {
        let Self { key, decode, version, position, ref digest, version_from, position_from, ref object, ref file } =
            *self;
        Self {
            key,
            decode,
            version,
            position,
            digest: digest.clone(),
            version_from,
            position_from,
            object: object.clone(),
            file: file.clone(),
        }
    }
}

/// How a stored cache keeps its objects whole: to bytes (`None`: this one
/// cannot be) and back (a closure: reading back may need what the source
/// was given, as a Python `decode`), the objects of a restart all read
/// back inside `scope`, if any.
pub(crate) struct ObjectCodec<O> {
    pub(crate) encode: fn(&O) -> Option<Vec<u8>>,
    pub(crate) decode: Arc<ReadKept<O>>,
    pub(crate) scope: Option<BatchScope>,
}

/// Reads a kept object back (`None`: it cannot be).
pub(crate) type ReadKept<O> = dyn Fn(&[u8]) -> Option<O> + Send + Sync;

impl<O> Clone for ObjectCodec<O> {
    fn clone(&self) -> Self {
        Self { encode: self.encode, decode: Arc::clone(&self.decode), scope: self.scope.clone() }
    }
}

/// Marks a digest's bytes: no key encoding starts with it, so a digest
/// never equals a kept version (a key listed with a version at one run
/// and without at the next counts as changed).
#[cfg(feature = "store")]
const TAG_DIGEST: u8 = 0x80;

/// What a stored cache keeps for an object whose canonical bytes are
/// `canonical`: a 128-bit XXH3 of them, tagged. XXH3's output is fixed by
/// its specification, so a digest kept by one run compares with the next
/// (std's and foldhash's hashers are seeded per process or release).
#[cfg(feature = "store")]
pub(crate) fn digest_of(canonical: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(17);
    kept.push(TAG_DIGEST);
    kept.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(canonical).to_be_bytes());
    kept
}

pub(crate) struct Stored<S: Source> {
    /// The store file (canonical): a watching controller's must be it.
    file: PathBuf,
    /// Holds the cache's name in that file until it stops (a stopped
    /// cache never runs again).
    name: Mutex<Option<CacheName>>,
    pub(crate) codec: Codec<S>,
    /// The flushers of the controllers it feeds: its `flush()` is theirs.
    flushers: Mutex<Vec<Weak<dyn Flush>>>,
    /// What it keeps of its own contents to resume after a restart, if it
    /// keeps its objects (written by those flushers).
    pub(crate) snapshot: Option<Arc<CacheSnapshot>>,
}

impl<S: Source> Stored<S> {
    /// Reserves `name` in `file` (canonical); an error if a live cache of
    /// this process has it.
    pub(crate) fn new(file: PathBuf, name: &str, codec: Codec<S>) -> Result<Self, String> {
        let held = CacheName::reserve(&file, name).map_err(|e| e.to_string())?;
        let snapshot = codec.object.is_some().then(|| Arc::new(CacheSnapshot::new(name)));
        Ok(Self { file, name: Mutex::new(Some(held)), codec, flushers: Mutex::new(Vec::new()), snapshot })
    }

    pub(crate) fn file(&self) -> &Path {
        &self.file
    }

    /// The cache stopped: another cache may take its name.
    pub(crate) fn release_name(&self) {
        self.name.lock().take();
    }

    /// A watching controller's flusher, from now on part of `flush()`.
    pub(crate) fn add_flusher(&self, flusher: Weak<dyn Flush>) {
        let mut flushers = self.flushers.lock();
        flushers.retain(|f| f.strong_count() > 0);
        flushers.push(flusher);
    }

    /// The flushers of the controllers it feeds, alive.
    pub(crate) fn flushers(&self) -> Vec<std::sync::Arc<dyn Flush>> {
        self.flushers.lock().iter().filter_map(Weak::upgrade).collect()
    }
}
