//! The claim a live controller holds on its name in a store file (S3).
//!
//! One side file per name, `<db>.<hex name>.lock`, locked with `flock`. The
//! kernel drops the lock when its holder's descriptor closes, including
//! when the process dies, so a crashed holder never blocks a restart. An
//! `flock` belongs to the open file description, so a second claim from
//! the same process conflicts too.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::StoreError;

/// Held while a controller owns its name; released on drop.
#[derive(Debug)]
#[must_use = "dropping the claim releases the name"]
pub struct StoreClaim {
    _file: File,
}

fn lock_path(db: &Path, name: &str) -> PathBuf {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let mut path = db.as_os_str().to_owned();
    path.push(format!(".{hex}.lock"));
    PathBuf::from(path)
}

impl StoreClaim {
    /// Claims `name` in the store at `db`, or fails with
    /// [`StoreError::Locked`] if a live holder has it.
    pub(crate) fn acquire(db: &Path, name: &str) -> Result<Self, StoreError> {
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(lock_path(db, name))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Self { _file: file });
        }
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock {
            Err(StoreError::Locked(name.to_string()))
        } else {
            Err(StoreError::Io(err))
        }
    }
}
