//! The one walk over a status shape's fields, that every renderer follows:
//! the text table ([`format_table`](super::status::format_table)), the
//! JSON of `GET /status` ([`to_json`](super::status::to_json)), and
//! Python's `status()` entries, `Controller.stats()` and `Manager.status()`
//! dicts. A shape lists its fields once, in its walk, with the names the
//! renderers show; a renderer knows only the kinds of [`Field`]. A new
//! field is then two edits: the field in its shape, and its line in that
//! shape's walk (and, for Python, its line in the stub `_native.pyi`).
//!
//! The walks of the shapes defined here ([`StatusEntry`], [`Health`] and
//! the store, leader and shard reports) are below; `Stats` and the
//! manager's `ControllerStatus` walk themselves beside their definitions.
//! The public shapes keep their fields flat (they are public API, built
//! by literal in tests): [`health_of!`] and [`with_health!`] are the one
//! place that maps them to and from [`Health`].

use std::time::{Duration, SystemTime};

use super::reports::{LeaderStatus, ShardStatus, StoreStats};
use super::status::{EntryKind, HangingKey, StatusEntry};

/// A field's value, as the renderers tell values apart.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field<'a> {
    Count(u64),
    /// A number that may be absent (a fencing token).
    MaybeCount(Option<u64>),
    Flag(bool),
    Text(Option<&'a str>),
    /// A wall-clock time, shown as Unix seconds (or as an age in the table).
    Time(Option<SystemTime>),
    /// A duration, shown as seconds.
    Seconds(Option<Duration>),
    /// Reconciles running too long: each key with how long it has run.
    Hanging(&'a [HangingKey]),
    /// Ready keys per priority, highest first.
    #[cfg_attr(not(feature = "python"), allow(dead_code))] // only in `stats()`
    ByPriority(&'a [(i32, usize)]),
}

impl<'a> Field<'a> {
    /// A count of things (queue sizes, threads).
    pub(crate) fn size(n: usize) -> Self {
        Field::Count(n as u64)
    }

    pub(crate) fn text(text: &'a str) -> Self {
        Field::Text(Some(text))
    }

    pub(crate) fn maybe_text(text: &'a Option<String>) -> Self {
        Field::Text(text.as_deref())
    }
}

/// A renderer: receives each field of a shape, in the walk's order.
pub(crate) trait Visit {
    type Error;
    fn field(&mut self, name: &'static str, value: Field<'_>) -> Result<(), Self::Error>;
}

/// A shape whose fields can be walked.
pub(crate) trait Walk {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error>;
}

/// How a controller, a periodic controller or a cache has fared: the
/// health fields every status entry (and `Manager::status`) shows, with
/// the names and meanings documented on [`StatusEntry`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Health {
    pub(crate) successes: u64,
    pub(crate) failures: u64,
    pub(crate) consecutive_failures: u64,
    pub(crate) last_error: Option<String>,
    pub(crate) last_error_time: Option<SystemTime>,
    pub(crate) last_success_time: Option<SystemTime>,
}

/// The [`Health`] of a public shape that keeps the health fields flat,
/// under the same names: [`StatusEntry`] and the manager's
/// `ControllerStatus` (their fields are public API).
macro_rules! health_of {
    ($shape:expr) => {
        $crate::observe::fields::Health {
            successes: $shape.successes,
            failures: $shape.failures,
            consecutive_failures: $shape.consecutive_failures,
            last_error: $shape.last_error.clone(),
            last_error_time: $shape.last_error_time,
            last_success_time: $shape.last_success_time,
        }
    };
}
pub(crate) use health_of;

/// The public shape `$shape { $field, .. }` with its flat health fields
/// taken from the [`Health`] `$health` (the inverse of [`health_of!`]).
macro_rules! with_health {
    ($shape:ident { $($field:ident $(: $value:expr)?),* $(,)? }, $health:expr) => {{
        let health: $crate::observe::fields::Health = $health;
        $shape {
            $($field $(: $value)?,)*
            successes: health.successes,
            failures: health.failures,
            consecutive_failures: health.consecutive_failures,
            last_error: health.last_error,
            last_error_time: health.last_error_time,
            last_success_time: health.last_success_time,
        }
    }};
}
pub(crate) use with_health;

impl Walk for Health {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("successes", Field::Count(self.successes))?;
        v.field("failures", Field::Count(self.failures))?;
        v.field("consecutive_failures", Field::Count(self.consecutive_failures))?;
        v.field("last_error", Field::maybe_text(&self.last_error))?;
        v.field("last_error_time", Field::Time(self.last_error_time))?;
        v.field("last_success_time", Field::Time(self.last_success_time))
    }
}

/// `kind`, `name` (and a periodic controller's `manager`), `state`, the
/// [`Health`] fields, then the kind's own fields.
impl Walk for StatusEntry {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("kind", Field::text(self.kind.label()))?;
        v.field("name", Field::text(&self.name))?;
        if let EntryKind::Periodic(p) = &self.kind {
            v.field("manager", Field::text(&p.manager))?;
        }
        v.field("state", Field::text(self.state()))?;
        health_of!(self).walk(v)?;
        match &self.kind {
            EntryKind::Controller(c) => {
                v.field("workers", Field::size(c.workers))?;
                v.field("reconciles", Field::Count(c.reconciles))?;
                v.field("requeues", Field::Count(c.requeues))?;
                v.field("panics", Field::Count(c.panics))?;
                v.field("depth", Field::size(c.depth))?;
                v.field("processing", Field::size(c.processing))?;
                v.field("waiting", Field::size(c.waiting))?;
                v.field("parked", Field::size(c.parked))?;
                v.field("held", Field::size(c.held))?;
                v.field("superseded", Field::Count(c.superseded))?;
                v.field("hanging_threshold", Field::Seconds(c.hanging_threshold))?;
                v.field("hanging", Field::Hanging(&c.hanging))?;
                walk_scale_out(v, c.store.as_ref(), c.leader.as_ref(), c.shards.as_ref(), c.not_owned)
            }
            EntryKind::Periodic(p) => {
                v.field("running", Field::Flag(p.running))?;
                v.field("last_duration", Field::Seconds(p.last_duration))?;
                v.field("next_run_in", Field::Seconds(p.next_run_in))?;
                p.leader.as_ref().map_or(Ok(()), |leader| leader.walk(v))
            }
            EntryKind::Cache(c) => {
                v.field("synced", Field::Flag(c.synced))?;
                v.field("keys", Field::size(c.keys))?;
                v.field("position", Field::maybe_text(&c.position))?;
                v.field("relists", Field::Count(c.relists))
            }
        }
    }
}

/// The store, leader-election and sharding fields of a controller's
/// status entry and `stats()`: each only when the controller uses it
/// (`not_owned` with sharding).
pub(crate) fn walk_scale_out<V: Visit>(
    v: &mut V,
    store: Option<&StoreStats>,
    leader: Option<&LeaderStatus>,
    shards: Option<&ShardStatus>,
    not_owned: u64,
) -> Result<(), V::Error> {
    if let Some(store) = store {
        store.walk(v)?;
    }
    if let Some(leader) = leader {
        leader.walk(v)?;
    }
    if let Some(shards) = shards {
        v.field("not_owned", Field::Count(not_owned))?;
        shards.walk(v)?;
    }
    Ok(())
}

/// `store_pending`, `last_flush_time` and `store_error` (guarantees §9).
impl Walk for StoreStats {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("store_pending", Field::size(self.pending))?;
        v.field("last_flush_time", Field::Time(self.last_flush_time))?;
        v.field("store_error", Field::maybe_text(&self.error))
    }
}

/// `is_leader`, `leader`, `fencing_token` and `leader_error` (guarantees §10).
impl Walk for LeaderStatus {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("is_leader", Field::Flag(self.is_leader()))?;
        v.field("leader", Field::maybe_text(&self.leader))?;
        v.field("fencing_token", Field::MaybeCount(self.fencing_token))?;
        v.field("leader_error", Field::maybe_text(&self.last_error))
    }
}

/// `owned_partitions` (a count), `members` and `shard_error` (guarantees §11).
impl Walk for ShardStatus {
    fn walk<V: Visit>(&self, v: &mut V) -> Result<(), V::Error> {
        v.field("owned_partitions", Field::size(self.owned.len()))?;
        v.field("members", Field::size(self.members))?;
        v.field("shard_error", Field::maybe_text(&self.last_error))
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;
    use crate::observe::status::{CacheDetails, PeriodicDetails, RunState};

    /// The names a walk visits, in order.
    struct Names(Vec<&'static str>);

    impl Visit for Names {
        type Error = Infallible;

        fn field(&mut self, name: &'static str, _: Field<'_>) -> Result<(), Infallible> {
            self.0.push(name);
            Ok(())
        }
    }

    fn names(shape: &impl Walk) -> Vec<&'static str> {
        let mut names = Names(Vec::new());
        let Ok(()) = shape.walk(&mut names);
        names.0
    }

    const HEALTH: [&str; 6] =
        ["successes", "failures", "consecutive_failures", "last_error", "last_error_time", "last_success_time"];

    #[test]
    fn every_kind_walks_its_header_the_health_then_its_own_fields() {
        let leader = LeaderStatus { name: "e".into(), fencing_token: Some(1), leader: None, last_error: None };
        let periodic = StatusEntry::new(
            "gc".into(),
            EntryKind::Periodic(PeriodicDetails {
                manager: "m".into(),
                running: false,
                leader: Some(leader),
                last_duration: None,
                next_run_in: None,
            }),
            Health::default(),
        );
        let own = ["running", "last_duration", "next_run_in", "is_leader", "leader", "fencing_token", "leader_error"];
        let expected: Vec<&str> = ["kind", "name", "manager", "state"].into_iter().chain(HEALTH).chain(own).collect();
        assert_eq!(names(&periodic), expected);

        let details = CacheDetails { state: RunState::Running, synced: true, keys: 0, position: None, relists: 0 };
        let cache = StatusEntry::new("pods".into(), EntryKind::Cache(details), Health::default());
        let own = ["synced", "keys", "position", "relists"];
        let expected: Vec<&str> = ["kind", "name", "state"].into_iter().chain(HEALTH).chain(own).collect();
        assert_eq!(names(&cache), expected);
    }

    #[test]
    fn a_public_shape_maps_to_and_from_health() {
        let health = Health {
            successes: 1,
            failures: 2,
            consecutive_failures: 3,
            last_error: Some("boom".into()),
            last_error_time: Some(SystemTime::UNIX_EPOCH),
            last_success_time: None,
        };
        let details = CacheDetails { state: RunState::Running, synced: true, keys: 0, position: None, relists: 0 };
        let entry = StatusEntry::new("pods".into(), EntryKind::Cache(details), health.clone());
        assert_eq!((entry.successes, entry.failures, entry.consecutive_failures), (1, 2, 3));
        assert_eq!(health_of!(entry), health);
    }
}
