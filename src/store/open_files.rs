//! The store files this process holds open.
//!
//! SQLite coordinates connections through POSIX advisory locks, which never
//! conflict within one process; one SQLite library makes up for that with
//! its own bookkeeping, but a second copy of the library in the same
//! process (Python's `sqlite3` beside the one built into reconq) knows
//! nothing of it. Such a copy opening a store file takes locks that all
//! succeed: it rebuilds or truncates the shared WAL index under our
//! connection (SIGBUS in an engine thread), checkpoints and deletes the
//! WAL on close, and reads half-written pages ("database disk image is
//! malformed"): <https://sqlite.org/howtocorrupt.html> §2.2. Another process
//! is safe. The Python binding refuses the stdlib's `sqlite3.connect` on a
//! file listed here (an audit hook: `python::store`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Each open store's file (canonical) and a token alive while it is open.
static OPEN: Mutex<Vec<(PathBuf, Weak<()>)>> = Mutex::new(Vec::new());

/// Listed while held (by the store's connection).
pub(crate) struct OpenFile {
    _alive: Arc<()>,
}

/// Lists `path` (an existing file) as open until the result is dropped.
pub(crate) fn register(path: &Path) -> OpenFile {
    let alive = Arc::new(());
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut open = OPEN.lock();
    open.retain(|(_, token)| token.strong_count() > 0);
    open.push((canonical, Arc::downgrade(&alive)));
    OpenFile { _alive: alive }
}

/// Whether `path` names a store file this process holds open.
#[cfg(feature = "python")]
pub(crate) fn is_open_in_this_process(path: &Path) -> bool {
    let Ok(canonical) = std::fs::canonicalize(path) else { return false };
    OPEN.lock().iter().any(|(open, token)| *open == canonical && token.strong_count() > 0)
}
