//! What [`Manager::status`](super::Manager::status) reports, and the error for
//! a name the manager does not know.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::observe::fields::{Field, Visit, Walk, health_of};

/// A snapshot of one named controller, as Cilium's controller status.
///
/// Times are wall-clock ([`SystemTime`]); durations are measured on the
/// manager's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControllerStatus {
    /// The name the controller was added under.
    pub name: String,
    /// Runs that returned `Ok` or an exit reason.
    pub successes: u64,
    /// Runs that returned an error or panicked.
    pub failures: u64,
    /// Failures since the last success.
    pub consecutive_failures: u64,
    /// The last error (or exit reason); cleared by a success.
    pub last_error: Option<String>,
    /// When `last_error` was recorded; cleared by a success.
    pub last_error_time: Option<SystemTime>,
    /// When the last success ended.
    pub last_success_time: Option<SystemTime>,
    /// How long the last finished run took.
    pub last_duration: Option<Duration>,
    /// Whether `do` is running now.
    pub running: bool,
    /// How long until the next run: `Some(ZERO)` when a run is due or
    /// requested, `None` when the controller waits for an update or trigger
    /// (or is running: its next time is set when the run ends).
    pub next_run_in: Option<Duration>,
}

/// `Manager.status()` in Python: `name`, the `Health` fields, then
/// `last_duration`, `running` and `next_run_in`.
impl Walk for ControllerStatus {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("name", Field::text(&self.name))?;
        health_of!(self).walk(v)?;
        v.field("last_duration", Field::Seconds(self.last_duration))?;
        v.field("running", Field::Flag(self.running))?;
        v.field("next_run_in", Field::Seconds(self.next_run_in))
    }
}

/// The manager has no controller of this name.
///
/// Exhaustive: the name is all it says; tests compare it with a literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownController {
    /// The name asked for.
    pub name: String,
}

impl fmt::Display for UnknownController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown controller {:?}", self.name)
    }
}

impl std::error::Error for UnknownController {}
