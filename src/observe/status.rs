//! The global status: every live [`Controller`](crate::Controller) and every
//! named controller of every live [`Manager`](crate::Manager), in one list,
//! like Cilium's `cilium status --all-controllers`.
//!
//! ```
//! use std::time::Duration;
//! use reconq::{Action, Context, Controller, ReconcileError, status};
//!
//! let handle = Controller::new("status-doc", |_: &u32, _: &Context| -> Result<Action, ReconcileError> {
//!     Err(ReconcileError::permanent("bad spec"))
//! })
//! .start();
//! handle.enqueue(7);
//! assert!(handle.wait_idle(Duration::from_secs(10)));
//!
//! let entries = status::snapshot();
//! let mine = entries.iter().find(|e| e.name == "status-doc").unwrap();
//! assert_eq!((mine.successes, mine.failures, mine.consecutive_failures), (0, 1, 1));
//! assert_eq!(mine.last_error.as_deref(), Some("bad spec"));
//! println!("{}", status::format_table(&entries));
//! assert!(handle.stop_with_drain(Duration::from_secs(10)));
//! ```
//!
//! Objects are found through a registry of weak references: a controller or
//! manager is listed from its creation until it is dropped. Taking a
//! snapshot locks each object briefly, one at a time; hanging keys are
//! cloned under their worker's slot lock (as
//! [`ControllerHandle::hanging`](crate::ControllerHandle::hanging) does) and
//! formatted with `Debug` after every lock is released.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::fields::{Field, Health, Visit, Walk, with_health};
use super::reports::{LeaderStatus, ShardStatus, StoreStats};
use super::visit;

pub use super::probes::{liveness_problems, readiness_problems};
pub use super::status_json::to_json;

/// One row of the global status: a [`Controller`](crate::Controller), or one
/// named controller of a [`Manager`](crate::Manager).
///
/// Exhaustive, like [`ControllerDetails`] and [`PeriodicDetails`]: a
/// program's tests build entries by literal to check what it makes of a
/// status (its own page, probes); a new field is a breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEntry {
    /// The controller's name (for a periodic controller, its name within
    /// its manager, see [`PeriodicDetails::manager`]).
    pub name: String,
    /// What kind of controller, with the fields only that kind has.
    pub kind: EntryKind,
    /// Reconciles that returned `Ok(Action::Done)`; for a periodic
    /// controller, runs of `do` that succeeded (or exited).
    pub successes: u64,
    /// Reconciles that returned an error or panicked; runs of `do` that
    /// failed.
    pub failures: u64,
    /// Failures since the last success, as Cilium counts them: for a
    /// controller, across all its keys (a success of any key resets it;
    /// requeues leave it alone).
    pub consecutive_failures: u64,
    /// The last failure's message. A controller keeps it after later
    /// successes (as [`Stats::last_error`](crate::Stats::last_error)); a
    /// periodic controller clears it on success (as Cilium does).
    pub last_error: Option<String>,
    /// When `last_error` was recorded.
    pub last_error_time: Option<SystemTime>,
    /// When the last success happened.
    pub last_success_time: Option<SystemTime>,
}

/// The two kinds of [`StatusEntry`].
// Unboxed although a controller's details are the largest: a snapshot
// holds one entry per live object, taken rarely, and `EntryKind::Controller
// (ControllerDetails { .. })` stays the public way to build and match one.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A [`Controller`](crate::Controller): a pool of workers reconciling
    /// keys from a queue.
    Controller(ControllerDetails),
    /// A named periodic controller of a [`Manager`](crate::Manager).
    Periodic(PeriodicDetails),
    /// A [`Cache`](crate::Cache): `successes` counts the events it
    /// applied, `failures` its source's failures.
    Cache(CacheDetails),
}

impl EntryKind {
    /// `"controller"`, `"periodic"` or `"cache"`.
    pub fn label(&self) -> &'static str {
        match self {
            EntryKind::Controller(_) => "controller",
            EntryKind::Periodic(_) => "periodic",
            EntryKind::Cache(_) => "cache",
        }
    }

    fn rank(&self) -> u8 {
        match self {
            EntryKind::Controller(_) => 0,
            EntryKind::Periodic(_) => 1,
            EntryKind::Cache(_) => 2,
        }
    }
}

/// What only a [`Cache`](crate::Cache)'s entry has.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheDetails {
    /// The cache's thread: not started, running, stopping or stopped
    /// ([`state`](Self::state) adds "syncing").
    pub state: RunState,
    /// The first list has been applied.
    pub synced: bool,
    /// Keys held now.
    pub keys: usize,
    /// The position of the last list or event applied (`Debug`-formatted).
    pub position: Option<String>,
    /// Lists after the first.
    pub relists: u64,
}

impl CacheDetails {
    /// `"syncing"` for a running cache not synced yet, else its
    /// [`RunState`].
    pub fn state(&self) -> &'static str {
        if self.state == RunState::Running && !self.synced { "syncing" } else { self.state.as_str() }
    }
}

/// What only a [`Controller`](crate::Controller)'s entry has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerDetails {
    /// Where the controller is in its life.
    pub state: RunState,
    /// Worker threads (configured, before start).
    pub workers: usize,
    /// Reconcile calls that returned (or panicked).
    pub reconciles: u64,
    /// Calls that returned `Ok(Action::Requeue)` (`Ok(Action::RequeueAfter(_))`
    /// counts as a success, see [`Stats::requeues`](crate::Stats::requeues)).
    pub requeues: u64,
    /// Failures that were panics.
    pub panics: u64,
    /// Keys ready to be reconciled (before start: keys enqueued so far).
    pub depth: usize,
    /// Keys being reconciled.
    pub processing: usize,
    /// Keys waiting for a due time (retries, delayed enqueues).
    pub waiting: usize,
    /// Keys in the parked set (failed permanently).
    pub parked: usize,
    /// The configured hanging threshold, if any.
    pub hanging_threshold: Option<Duration>,
    /// Reconciles running longer than the threshold, longest first (empty
    /// without a threshold).
    pub hanging: Vec<HangingKey>,
    /// With a store: its pending keys, last flush and last flush error (a
    /// failing flush shows here and in `stats()`).
    pub store: Option<StoreStats>,
    /// With leader election, once started (see [`StatusEntry::state`]:
    /// a running standby shows as `"standby"`).
    pub leader: Option<LeaderStatus>,
    /// With sharding, once started.
    pub shards: Option<ShardStatus>,
    /// Keys dropped because another replica owns them.
    pub not_owned: u64,
    /// Ready keys held by a pending ancestor or waiting for cancelled
    /// descendants (guarantees §14); counted in `depth` too.
    pub held: usize,
    /// Reconciles cancelled because an ancestor became pending (D3),
    /// counted in `reconciles` too.
    pub superseded: u64,
}

/// Where a [`Controller`](crate::Controller) is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunState {
    /// Built, not started yet (keys enqueued wait for the start).
    NotStarted,
    /// Started and reconciling (with leader election: leading).
    Running,
    /// Running with leader election, not leading: its queue stays warm,
    /// nothing is reconciled.
    Standby,
    /// A stop was requested; some worker has not exited yet.
    Stopping,
    /// Every worker has exited (or was detached at a drain's deadline).
    Stopped,
}

impl RunState {
    /// `"not started"`, `"running"`, `"standby"`, `"stopping"` or `"stopped"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunState::NotStarted => "not started",
            RunState::Running => "running",
            RunState::Standby => "standby",
            RunState::Stopping => "stopping",
            RunState::Stopped => "stopped",
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What only a periodic controller's entry has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodicDetails {
    /// The name of the [`Manager`](crate::Manager) it belongs to (see
    /// [`ManagerBuilder::name`](crate::ManagerBuilder::name)).
    pub manager: String,
    /// Whether `do` is running now.
    pub running: bool,
    /// The manager's leader election, if it has one.
    pub leader: Option<LeaderStatus>,
    /// How long the last finished run took.
    pub last_duration: Option<Duration>,
    /// How long until the next run (`Some(ZERO)`: due or requested), or
    /// `None` when it waits for an update or trigger, or is running.
    pub next_run_in: Option<Duration>,
}

impl PeriodicDetails {
    /// `"running"`, `"standby"` (its manager's election is led by another
    /// process), `"scheduled"` (a next run is due at a known time) or
    /// `"idle"` (waiting for an update or trigger).
    pub fn state(&self) -> &'static str {
        if self.running {
            "running"
        } else if is_standby(self.leader.as_ref()) {
            "standby"
        } else if self.next_run_in.is_some() {
            "scheduled"
        } else {
            "idle"
        }
    }
}

/// Runs with leader election and does not lead: it keeps its queue warm
/// but reconciles nothing (a controller's [`RunState::Standby`]).
pub(crate) fn is_standby(leader: Option<&LeaderStatus>) -> bool {
    leader.is_some_and(|l| !l.is_leader())
}

/// A reconcile running longer than its controller's hanging threshold.
#[derive(Clone)]
pub struct HangingKey {
    /// The key, formatted with `Debug`.
    pub key: String,
    /// How long the reconcile has been running (on the controller's clock).
    pub running: Duration,
    value: Arc<dyn Any + Send + Sync>,
}

impl HangingKey {
    pub(crate) fn new<K: fmt::Debug + Send + Sync + 'static>(key: K, running: Duration) -> Self {
        Self { key: format!("{key:?}"), running, value: Arc::new(key) }
    }

    /// The key itself, if the controller's keys are `K`s.
    pub fn downcast_ref<K: 'static>(&self) -> Option<&K> {
        self.value.downcast_ref()
    }
}

impl fmt::Debug for HangingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HangingKey").field("key", &self.key).field("running", &self.running).finish()
    }
}

/// Compares the `Debug` rendering of the keys and the running times.
impl PartialEq for HangingKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.running == other.running
    }
}

impl Eq for HangingKey {}

impl StatusEntry {
    /// An entry of `kind` whose health fields are `health`'s: how every
    /// kind builds its entry.
    pub(crate) fn new(name: String, kind: EntryKind, health: Health) -> Self {
        with_health!(StatusEntry { name, kind }, health)
    }

    /// The controller-only fields, if this is a controller.
    pub fn controller(&self) -> Option<&ControllerDetails> {
        match &self.kind {
            EntryKind::Controller(details) => Some(details),
            _ => None,
        }
    }

    /// The periodic-only fields, if this is a periodic controller.
    pub fn periodic(&self) -> Option<&PeriodicDetails> {
        match &self.kind {
            EntryKind::Periodic(details) => Some(details),
            _ => None,
        }
    }

    /// The cache-only fields, if this is a cache.
    pub fn cache(&self) -> Option<&CacheDetails> {
        match &self.kind {
            EntryKind::Cache(details) => Some(details),
            _ => None,
        }
    }

    /// The state as the table shows it: a [`RunState`] for a controller,
    /// [`PeriodicDetails::state`] for a periodic controller.
    pub fn state(&self) -> &'static str {
        match &self.kind {
            EntryKind::Controller(details) => details.state.as_str(),
            EntryKind::Periodic(details) => details.state(),
            EntryKind::Cache(details) => details.state(),
        }
    }

    /// Why this row keeps the process from being ready, if it does: a
    /// controller not running (not started yet, stopping or stopped), or
    /// one whose leader election or sharding has not yet learnt who leads
    /// or who the members are; a cache not running or not synced yet
    /// (what it holds is not yet what its source holds). A standby that
    /// knows its leader is ready: it is doing what it should.
    pub fn not_ready(&self) -> Option<String> {
        let who = format!("{} {:?}", self.kind.label(), self.qualified_name());
        let (leader, shards) = match &self.kind {
            EntryKind::Controller(c) if !matches!(c.state, RunState::Running | RunState::Standby) => {
                return Some(format!("{who}: {}", c.state));
            }
            EntryKind::Controller(c) => (c.leader.as_ref(), c.shards.as_ref()),
            EntryKind::Periodic(p) => (p.leader.as_ref(), None),
            EntryKind::Cache(c) => {
                let ready = c.state == RunState::Running && c.synced;
                return (!ready).then(|| format!("{who}: {}", c.state()));
            }
        };
        let etcd_error = |error: &Option<String>| error.as_ref().map(|e| format!(" (etcd: {e})")).unwrap_or_default();
        if let Some(l) = leader.filter(|l| !l.is_leader() && l.leader.is_none()) {
            return Some(format!("{who}: leader of election {:?} unknown{}", l.name, etcd_error(&l.last_error)));
        }
        if let Some(s) = shards.filter(|s| s.members == 0) {
            return Some(format!("{who}: members of sharding {:?} unknown{}", s.name, etcd_error(&s.last_error)));
        }
        None
    }

    /// `manager/name` for a periodic controller, the name otherwise.
    pub fn qualified_name(&self) -> String {
        match &self.kind {
            EntryKind::Periodic(details) => format!("{}/{}", details.manager, self.name),
            _ => self.name.clone(),
        }
    }

    fn order(&self, other: &Self) -> Ordering {
        let manager = |e: &Self| e.periodic().map(|p| p.manager.clone());
        (self.kind.rank(), &self.name)
            .cmp(&(other.kind.rank(), &other.name))
            .then_with(|| manager(self).cmp(&manager(other)))
    }
}

/// Every live controller, every named controller of every live manager
/// and every live cache, sorted by kind (controllers, periodic, caches),
/// then name (then manager name; entries
/// equal in all three keep their creation order).
pub fn snapshot() -> Vec<StatusEntry> {
    let mut entries = Vec::new();
    visit(|object| object.collect_status(&mut entries));
    entries.sort_by(StatusEntry::order);
    entries
}

/// The widest last-error message the table shows, in characters.
const MESSAGE_WIDTH: usize = 60;
/// The widest hanging key the table shows, in characters.
const KEY_WIDTH: usize = 32;
/// How many hanging keys a row lists.
const KEYS_SHOWN: usize = 3;

/// An aligned text table of `entries`, one row each, under a summary line,
/// in the manner of `cilium status --all-controllers`:
///
/// ```text
/// reconq status: 1 controller, 2 periodic; 2 failing, 1 hanging
/// NAME                KIND        STATE      SUCCESS  FAIL  CONSEC  DEPTH  PROC  WAIT  LAST SUCCESS  LAST ERROR  MESSAGE                                       HANGING
/// status-demo         controller  running    3        4     3       0      1     1     0.2s ago      0.1s ago    ConnectionError: db-0 refused the connection  "stuck" 0.2s
/// status-demo/gc      periodic    scheduled  0        3     3       -      -     -     never         0.1s ago    OSError: disk /var is full                    -
/// status-demo/resync  periodic    scheduled  1        0     0       -      -     -     0.2s ago      never       -                                             -
/// ```
///
/// Periodic controllers are named `manager/name`. Ages are measured against
/// the wall clock now. Messages show their first line, cut to 60 characters;
/// at most three hanging keys are listed (`Debug`-formatted, cut to 32
/// characters), then how many more.
pub fn format_table(entries: &[StatusEntry]) -> String {
    format_table_at(entries, SystemTime::now())
}

pub(crate) fn format_table_at(entries: &[StatusEntry], now: SystemTime) -> String {
    let mut out = String::new();
    let controllers = entries.iter().filter(|e| e.controller().is_some()).count();
    let periodic = entries.iter().filter(|e| e.periodic().is_some()).count();
    let caches = entries.len() - controllers - periodic;
    let failing = entries.iter().filter(|e| e.consecutive_failures > 0).count();
    let hanging = entries.iter().filter(|e| e.controller().is_some_and(|c| !c.hanging.is_empty())).count();
    let caches = match caches {
        0 => String::new(),
        1 => ", 1 cache".to_owned(),
        n => format!(", {n} caches"),
    };
    let _ = writeln!(
        out,
        "reconq status: {controllers} controller{}, {periodic} periodic{caches}; {failing} failing, {hanging} hanging",
        if controllers == 1 { "" } else { "s" }
    );
    if entries.is_empty() {
        return out;
    }
    let mut rows: Vec<Vec<String>> = vec![COLUMNS.iter().map(|(header, _)| (*header).to_owned()).collect()];
    for entry in entries {
        let mut row = Row { now, cells: Default::default() };
        let Ok(()) = entry.walk(&mut row);
        let mut cells = row.cells.map(|cell| cell.unwrap_or_else(|| "-".to_owned()));
        cells[NAME] = entry.qualified_name();
        cells[MESSAGE] = message(entry).map_or_else(|| "-".to_owned(), |m| truncate(first_line(&m), MESSAGE_WIDTH));
        rows.push(cells.into());
    }
    let mut widths = [0usize; COLUMNS.len()];
    // Names and messages may hold tabs or newlines: never in a cell.
    for cell in rows.iter_mut().flatten() {
        if cell.chars().any(char::is_control) {
            *cell = without_control(cell);
        }
    }
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The table's columns: each header, and the field of the entry's walk
/// that fills it (`-` in a row without that field). NAME (with a periodic
/// controller's manager) and MESSAGE (with what stands in the way of a
/// controller's store or coordination) are made from the whole entry.
const COLUMNS: [(&str, Option<&str>); 13] = [
    ("NAME", None),
    ("KIND", Some("kind")),
    ("STATE", Some("state")),
    ("SUCCESS", Some("successes")),
    ("FAIL", Some("failures")),
    ("CONSEC", Some("consecutive_failures")),
    ("DEPTH", Some("depth")),
    ("PROC", Some("processing")),
    ("WAIT", Some("waiting")),
    ("LAST SUCCESS", Some("last_success_time")),
    ("LAST ERROR", Some("last_error_time")),
    ("MESSAGE", None),
    ("HANGING", Some("hanging")),
];
const NAME: usize = 0;
const MESSAGE: usize = 11;

/// One row of the table, filled by walking its entry.
struct Row {
    now: SystemTime,
    cells: [Option<String>; COLUMNS.len()],
}

impl Visit for Row {
    type Error = std::convert::Infallible;

    fn field(&mut self, name: &'static str, value: Field<'_>) -> Result<(), Self::Error> {
        if let Some(column) = COLUMNS.iter().position(|(_, field)| *field == Some(name)) {
            self.cells[column] = Some(cell(value, self.now));
        }
        Ok(())
    }
}

/// A field as the table shows it: times as ages, durations short.
fn cell(value: Field<'_>, now: SystemTime) -> String {
    match value {
        Field::Count(n) => n.to_string(),
        Field::MaybeCount(n) => n.map_or_else(|| "-".into(), |n| n.to_string()),
        Field::Flag(flag) => flag.to_string(),
        Field::Text(text) => text.unwrap_or("-").to_owned(),
        Field::Time(at) => age_cell(at, now),
        Field::Seconds(d) => d.map_or_else(|| "-".into(), format_duration),
        Field::Hanging(keys) => hanging_cell(keys),
        Field::ByPriority(ready) => {
            ready.iter().map(|(priority, n)| format!("{priority}: {n}")).collect::<Vec<_>>().join(", ")
        }
    }
}

/// The MESSAGE cell: the last reconcile error, else what stands in the
/// way of a controller's store or coordination (a failing flush, etcd out
/// of reach), so the table shows those too.
fn message(entry: &StatusEntry) -> Option<String> {
    if let Some(error) = &entry.last_error {
        return Some(error.clone());
    }
    let c = entry.controller()?;
    let store = c.store.as_ref().and_then(|s| s.error.as_ref()).map(|e| format!("store: {e}"));
    let leader = c.leader.as_ref().and_then(|l| l.last_error.as_ref()).map(|e| format!("etcd: {e}"));
    let shards = c.shards.as_ref().and_then(|s| s.last_error.as_ref()).map(|e| format!("etcd: {e}"));
    store.or(leader).or(shards)
}

fn age_cell(at: Option<SystemTime>, now: SystemTime) -> String {
    match at {
        None => "never".into(),
        Some(at) => format!("{} ago", format_duration(now.duration_since(at).unwrap_or(Duration::ZERO))),
    }
}

fn hanging_cell(hanging: &[HangingKey]) -> String {
    if hanging.is_empty() {
        return "-".into();
    }
    let mut cell: Vec<String> = hanging
        .iter()
        .take(KEYS_SHOWN)
        .map(|h| format!("{} {}", truncate(&h.key, KEY_WIDTH), format_duration(h.running)))
        .collect();
    if hanging.len() > KEYS_SHOWN {
        cell.push(format!("+{} more", hanging.len() - KEYS_SHOWN));
    }
    cell.join(", ")
}

/// A short human duration: `0.4s`, `12s`, `5m3s`, `2h5m`, `3d4h`.
fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..10 => format!("{:.1}s", d.as_secs_f64()),
        10..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// The first line, with ` ...` if there were more.
fn first_line(text: &str) -> std::borrow::Cow<'_, str> {
    let text = text.trim();
    match text.split_once('\n') {
        None => text.into(),
        Some((first, _)) => format!("{} ...", first.trim_end()).into(),
    }
}

/// Control characters (tabs, newlines) as spaces.
fn without_control(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// At most `width` characters, the last three `...` if cut; control
/// characters become spaces so columns stay aligned.
fn truncate(text: impl AsRef<str>, width: usize) -> String {
    let clean = without_control(text.as_ref());
    if clean.chars().count() <= width {
        return clean;
    }
    let mut cut: String = clean.chars().take(width.saturating_sub(3)).collect();
    cut.push_str("...");
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        let cases = [
            (Duration::from_millis(400), "0.4s"),
            (Duration::from_millis(9_960), "10.0s"),
            (Duration::from_secs(12), "12s"),
            (Duration::from_secs(303), "5m3s"),
            (Duration::from_secs(7_500), "2h5m"),
            (Duration::from_secs(3 * 86_400 + 4 * 3_600 + 5), "3d4h"),
        ];
        for (d, text) in cases {
            assert_eq!(format_duration(d), text);
        }
    }

    #[test]
    fn messages_are_cut_to_one_line() {
        assert_eq!(truncate(first_line("boom\n  at line 3"), 60), "boom ...");
        assert_eq!(truncate("a\tb", 10), "a b");
        let long = "x".repeat(100);
        let cut = truncate(&long, 60);
        assert_eq!(cut.chars().count(), 60);
        assert!(cut.ends_with("..."));
        assert_eq!(truncate("é".repeat(61), 60).chars().count(), 60, "counts characters, not bytes");
    }

    #[test]
    fn hanging_cell_lists_three_keys_then_a_count() {
        let keys: Vec<HangingKey> = (0..5).map(|i| HangingKey::new(format!("k{i}"), Duration::from_secs(2))).collect();
        assert_eq!(hanging_cell(&keys[..1]), "\"k0\" 2.0s");
        assert_eq!(hanging_cell(&keys), "\"k0\" 2.0s, \"k1\" 2.0s, \"k2\" 2.0s, +2 more");
        assert_eq!(hanging_cell(&[]), "-");
        assert_eq!(keys[0].downcast_ref::<String>().map(String::as_str), Some("k0"));
        assert_eq!(keys[0].downcast_ref::<u32>(), None);
    }

    /// Periodic controller `name` of manager "m", not running and never
    /// run, with `leader` as its election's status.
    fn idle_periodic(name: &str, leader: Option<crate::observe::reports::LeaderStatus>) -> StatusEntry {
        StatusEntry {
            name: name.into(),
            kind: EntryKind::Periodic(PeriodicDetails {
                manager: "m".into(),
                running: false,
                leader,
                last_duration: None,
                next_run_in: None,
            }),
            successes: 0,
            failures: 0,
            consecutive_failures: 0,
            last_error: None,
            last_error_time: None,
            last_success_time: None,
        }
    }

    #[test]
    fn control_characters_never_break_a_row() {
        let entry = StatusEntry {
            failures: 1,
            consecutive_failures: 1,
            last_error: Some("bad\r\tthing".into()),
            last_error_time: Some(SystemTime::UNIX_EPOCH),
            ..idle_periodic("two\nlines\tname", None)
        };
        let table = format_table_at(&[entry], SystemTime::UNIX_EPOCH + Duration::from_secs(90));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[2].starts_with("m/two lines name  periodic  idle "), "{table}");
        assert!(lines[2].contains("1m30s ago") && lines[2].contains("bad  thing"), "{table}");
    }

    #[test]
    fn readiness_needs_a_running_controller_that_knows_its_leader() {
        let leader = |token: Option<u64>, leader: Option<&str>| crate::observe::reports::LeaderStatus {
            name: "e".into(),
            fencing_token: token,
            leader: leader.map(str::to_owned),
            last_error: leader.is_none().then(|| "connection refused".to_owned()),
        };
        let periodic = |status: Option<crate::observe::reports::LeaderStatus>| idle_periodic("gc", status);
        assert_eq!(periodic(None).not_ready(), None, "no election: nothing to wait for");
        assert_eq!(periodic(Some(leader(Some(3), Some("me")))).not_ready(), None, "the leader");
        assert_eq!(periodic(Some(leader(None, Some("other")))).not_ready(), None, "a standby that knows its leader");
        assert_eq!(
            periodic(Some(leader(None, None))).not_ready().as_deref(),
            Some("periodic \"m/gc\": leader of election \"e\" unknown (etcd: connection refused)")
        );
    }

    #[test]
    fn readiness_needs_a_running_cache_that_synced() {
        let cache = |state: RunState, synced: bool| StatusEntry {
            kind: EntryKind::Cache(CacheDetails { state, synced, keys: 0, position: None, relists: 0 }),
            ..idle_periodic("pods", None)
        };
        assert_eq!(cache(RunState::Running, true).not_ready(), None);
        let not_ready = |state, synced| cache(state, synced).not_ready();
        assert_eq!(not_ready(RunState::NotStarted, false).as_deref(), Some("cache \"pods\": not started"));
        assert_eq!(not_ready(RunState::Running, false).as_deref(), Some("cache \"pods\": syncing"));
        assert_eq!(not_ready(RunState::Stopped, true).as_deref(), Some("cache \"pods\": stopped"));
    }

    #[test]
    fn an_empty_table_is_a_summary_line() {
        assert_eq!(format_table(&[]), "reconq status: 0 controllers, 0 periodic; 0 failing, 0 hanging\n");
    }
}
