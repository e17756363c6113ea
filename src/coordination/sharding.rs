//! Sharding across replicas on etcd (guarantees §11): the keys' partitions
//! split evenly among live replicas, each reconciling only its own, with
//! no sharder component: replicas coordinate through etcd alone.
//!
//! Each replica keeps a lease and a member key under it
//! (`/reconq/shard/<name>/members/<identity>`). A partition is owned by
//! holding `/reconq/shard/<name>/partitions/<p>` with one's lease, created
//! only if absent (up to [`MAX_TXN_OPS`] of them in one transaction); its
//! create revision above the fencing floor (`floor.rs`) is the partition's
//! fencing token, so tokens strictly increase with each owner. One thread
//! per replica watches the prefix (no polling) and, on every change,
//! targets ⌊P/N⌋ or ⌈P/N⌉ partitions (by its rank among the sorted member
//! identities): it claims free ones and gives extras up. Another keeps the
//! lease alive, so neither claiming thousands of partitions nor a slow
//! `resync` can make it late.
//!
//! Giving a partition up (H4): it is first marked releasing, so its keys
//! are no longer handed out; once the reconciles of its keys have returned
//! (cancelled after [`RELEASE_GRACE`]) the key is deleted, only if still
//! ours, and in the same transaction the keys still pending for it (in
//! the queue, or refused while it was being given up) are written to
//! `/reconq/shard/<name>/handover/<p>`; the next owner claims it, enqueues
//! those and resyncs its keys (C2). A clean stop, once no reconcile runs,
//! gives up its partitions that have keys pending the same way, then
//! revokes its lease. A crashed owner's partitions free themselves when
//! its lease expires. As with leader
//! election, a replica acts on its partitions only until its renew
//! deadline (two thirds of the TTL after its last renewal was sent), so
//! one cut off from etcd stops before its lease can expire on the server.
//!
//! A reply from a reset history (etcd wiped, or restored from an older
//! snapshot) stops every reconcile at once (the client refuses every call
//! until the reset is accepted, and a replica with a reset pending owns
//! nothing); the replica drops its partitions, raises the fencing floor,
//! and joins again after a TTL, by when every owner of the old history has
//! passed its renew deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::ShardStatus;
use super::floor::{self, FLOOR_KEY};
use super::lease::{LeaseKeeper, Renewal};
use super::settings::{
    DEFAULT_TTL, Endpoints, FIRST_BACKOFF, check_endpoints_and_name, check_ttl, default_identity, next_backoff,
    renew_deadline,
};
use crate::error::InvalidArgument;
use crate::etcd::{Created, EtcdClient, EtcdError, KeyValue, MAX_TXN_OPS, Reset, Watch};
use crate::logs;
use crate::observe::metrics::MetricFamilies;
use crate::observe::{self, Observed};
use crate::sync::{Condvar, Mutex};
use crate::thread::spawn_named;

/// The default number of partitions.
const DEFAULT_PARTITIONS: u32 = 64;
/// The most partitions a group may have. Each is a key in etcd that every
/// replica reads (without values) on every change to the group: 65,536
/// keys make a read of a few megabytes, which a busy etcd sends within
/// seconds, and a lone replica claims them all in tens of seconds (batches
/// of [`MAX_TXN_OPS`]). More would make each change cost more than a TTL.
const MAX_PARTITIONS: u32 = 65_536;
/// How long the reconciles of a partition being given up may run on
/// before they are cancelled.
const RELEASE_GRACE: Duration = Duration::from_secs(2);
/// The most bytes of pending keys one partition hands over (C2): a
/// transaction carries one, and etcd refuses requests over 1.5 MiB by
/// default (base64 in the JSON gateway makes a third more).
pub(crate) const MAX_HANDOVER_BYTES: usize = 768 * 1024;
/// How often a replica giving partitions up looks whether their
/// reconciles have returned (only while it gives some up).
const RELEASE_POLL: Duration = Duration::from_millis(20);

/// Membership in a sharded group of replicas: which partitions of the key
/// space this process reconciles. Pass it to one controller
/// ([`Controller::sharding`](crate::Controller::sharding)), which starts it.
/// Cheap to clone; clones share one membership.
#[derive(Clone)]
#[must_use = "a Sharding does nothing until given to a controller (`Controller::sharding`)"]
pub struct Sharding {
    inner: Arc<Shards>,
}

struct Shards {
    /// Reports the owned-partitions gauge.
    _registration: observe::Registration,
    name: String,
    prefix: String,
    identity: String,
    ttl: Duration,
    partitions: u32,
    client: EtcdClient,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// A controller uses it: settings are fixed.
    attached: bool,
    /// The controller stopped (or never will use it again).
    stopped: bool,
    /// Not a member yet: the controller's caches have not synced (see
    /// [`Sharding::join_once_synced`]).
    held_back: bool,
    lease: Option<i64>,
    /// When the last successful keep-alive (or the grant) was sent.
    renewed: Option<Instant>,
    owned: BTreeMap<u32, Owned>,
    /// Live replicas, as last seen.
    members: usize,
    last_error: Option<String>,
    /// The highest fencing floor read (see `floor.rs`).
    floor: u64,
    /// Partitions gained whose hand-overs (C2) were not read yet: a read
    /// that failed is tried again at the next look at the group.
    unread_handovers: BTreeSet<u32>,
    hooks: Option<Arc<dyn ShardHooks>>,
}

struct Owned {
    token: u64,
    /// The create revision of its key (ours while it is this).
    created: i64,
    /// Being given up: its keys are no longer handed out; since when.
    releasing: Option<Instant>,
    /// The reconciles of its keys still running were cancelled.
    cancelled: bool,
    /// Reconciles of its keys running now, under this token.
    in_flight: usize,
}

/// What sharding calls into its controller (on its own thread, with no
/// lock of its held).
pub(crate) trait ShardHooks: Send + Sync {
    /// These partitions were claimed: enqueue their keys (C1). Called
    /// once they are ours (`owns` says so): a key refused before the call
    /// was refused before they were ours.
    fn gained(&self, partitions: &BTreeSet<u32>);
    /// Enqueue the keys the last owners of partitions gained handed over
    /// (each what [`hand_over`](Self::hand_over) gave them, C2), read
    /// after the gain.
    fn handed_over(&self, handed_over: &[Vec<u8>]);
    /// These partitions are about to be given up, their reconciles
    /// returned: the keys still pending for each (encoded, at most
    /// [`MAX_HANDOVER_BYTES`] per partition; none for a partition with
    /// none), written for their next owner with the give-up.
    fn hand_over(&self, partitions: &BTreeSet<u32>) -> BTreeMap<u32, Vec<u8>>;
    /// These partitions have an owner other than us, as last read (C2:
    /// stored keys kept aside for them may go).
    fn owned_elsewhere(&self, partitions: &BTreeSet<u32>);
    /// Cancel the running reconciles of keys in these partitions.
    fn cancel(&self, partitions: &BTreeSet<u32>);
}

impl Sharding {
    /// Membership of the group `name` on the etcd members at `endpoints`
    /// (`http://host:port`, one or a list), with 64 partitions, a 5 s TTL
    /// and the host name and process id as identity.
    ///
    /// # Panics
    /// A malformed endpoint, no endpoint, or an empty name (or one with
    /// `/`); [`try_new`](Self::try_new) returns the error instead.
    pub fn new(endpoints: impl Endpoints, name: &str) -> Self {
        Self::try_new(endpoints, name).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`new`](Self::new), with bad input as an error.
    ///
    /// # Errors
    /// A malformed endpoint, no endpoint, or an empty name (or one with `/`).
    pub fn try_new(endpoints: impl Endpoints, name: &str) -> Result<Self, InvalidArgument> {
        let endpoints = check_endpoints_and_name(&endpoints, name, "sharding")?;
        Ok(Self::build(name.to_owned(), endpoints, default_identity(), DEFAULT_TTL, DEFAULT_PARTITIONS))
    }

    fn build(name: String, endpoints: Vec<String>, identity: String, ttl: Duration, partitions: u32) -> Self {
        let inner = Arc::new_cyclic(|weak: &Weak<Shards>| Shards {
            _registration: observe::register(weak.clone()),
            prefix: format!("/reconq/shard/{name}/"),
            name,
            identity,
            ttl,
            partitions,
            client: EtcdClient::new(endpoints),
            state: Mutex::default(),
            cv: Condvar::new(),
        });
        Self { inner }
    }

    fn rebuild(self, identity: String, ttl: Duration, partitions: u32) -> Self {
        let s = &self.inner;
        assert!(!s.state.lock().attached, "sharding {:?}: configure it before its controller starts", s.name);
        Self::build(s.name.clone(), s.client.endpoints().to_vec(), identity, ttl, partitions)
    }

    /// How many partitions the key space is split into (default 64, at most
    /// 65,536: each is a key in etcd that every replica reads on every
    /// change to the group). Every replica of a group must use the same
    /// number.
    ///
    /// # Panics
    /// Zero partitions or more than 65,536;
    /// [`try_partitions`](Self::try_partitions) returns the error instead.
    pub fn partitions(self, partitions: u32) -> Self {
        self.try_partitions(partitions).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`partitions`](Self::partitions), with bad input as an error.
    ///
    /// # Errors
    /// Zero partitions or more than 65,536.
    pub fn try_partitions(self, partitions: u32) -> Result<Self, InvalidArgument> {
        if !(1..=MAX_PARTITIONS).contains(&partitions) {
            return Err(InvalidArgument::new(format!(
                "partitions must be between 1 and {MAX_PARTITIONS} (each is a key in etcd that every replica \
                 reads on every change to the group), got {partitions}"
            )));
        }
        let (identity, ttl) = (self.inner.identity.clone(), self.inner.ttl);
        Ok(self.rebuild(identity, ttl, partitions))
    }

    /// The lease's time to live (default 5 s, at least 2 s): a crashed
    /// replica's partitions move after about `ttl`.
    ///
    /// # Panics
    /// `ttl` under 2 s; [`try_ttl`](Self::try_ttl) returns the error instead.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.try_ttl(ttl).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ttl`](Self::ttl), with bad input as an error.
    ///
    /// # Errors
    /// `ttl` under 2 s.
    pub fn try_ttl(self, ttl: Duration) -> Result<Self, InvalidArgument> {
        let ttl = check_ttl(ttl)?;
        let (identity, partitions) = (self.inner.identity.clone(), self.inner.partitions);
        Ok(self.rebuild(identity, ttl, partitions))
    }

    /// How this process is named in the group (default host-pid); unique
    /// among live replicas.
    pub fn identity(self, identity: impl Into<String>) -> Self {
        let (ttl, partitions) = (self.inner.ttl, self.inner.partitions);
        self.rebuild(identity.into(), ttl, partitions)
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of partitions.
    pub fn partition_count(&self) -> u32 {
        self.inner.partitions
    }

    /// Whether `partition` is ours but being given up: a key of it
    /// refused now goes with the hand-over (C2).
    pub(crate) fn giving_up(&self, partition: u32) -> bool {
        let st = self.inner.state.lock();
        st.owned.get(&partition).is_some_and(|o| o.releasing.is_some())
    }

    /// The partitions this process owns now (and may reconcile keys of).
    pub fn owned_partitions(&self) -> BTreeSet<u32> {
        let st = self.inner.state.lock();
        if !self.inner.live(&st) {
            return BTreeSet::new();
        }
        st.owned.iter().filter(|(_, o)| o.releasing.is_none()).map(|(&p, _)| p).collect()
    }

    /// Everything above in one snapshot.
    pub fn status(&self) -> ShardStatus {
        let owned = self.owned_partitions();
        let st = self.inner.state.lock();
        ShardStatus {
            name: self.inner.name.clone(),
            partitions: self.inner.partitions,
            owned,
            members: st.members,
            last_error: st.last_error.clone(),
        }
    }

    /// Whether `partition` is ours to keep keys of: claimed and not being
    /// given up. A late renewal does not make it another's: only losing
    /// the lease does (then its keys are refused at [`admit`](Self::admit)
    /// and its next owner enqueues them, C1). Refusing them while the
    /// renewal is late would lose them if the renewal then succeeds.
    pub(crate) fn owns(&self, partition: u32) -> bool {
        let st = self.inner.state.lock();
        st.owned.get(&partition).is_some_and(|o| o.releasing.is_none())
    }

    /// Lets a reconcile of a key in `partition` run, counted in flight
    /// until [`finished`](Self::finished), if the partition is ours and
    /// our lease is live.
    pub(crate) fn admit(&self, partition: u32) -> ShardAdmission {
        let mut st = self.inner.state.lock();
        let live = self.inner.live(&st);
        let Some(owned) = st.owned.get_mut(&partition).filter(|o| o.releasing.is_none()) else {
            return ShardAdmission::NotOurs;
        };
        if !live {
            return ShardAdmission::Later;
        }
        owned.in_flight += 1;
        ShardAdmission::Run(owned.token)
    }

    /// Blocks while our lease's renewal is late and we still hold
    /// partitions: until it is renewed or lost (either notifies), or
    /// `give_up()` after a [`wake`](Self::wake). `false` if it gave up.
    pub(crate) fn wait_live(&self, give_up: &dyn Fn() -> bool) -> bool {
        let mut st = self.inner.state.lock();
        loop {
            if give_up() {
                return false;
            }
            if st.owned.is_empty() || self.inner.live(&st) {
                return true;
            }
            self.inner.cv.wait(&mut st);
        }
    }

    /// Wakes the threads in [`wait_live`](Self::wait_live) (a controller
    /// stopping).
    pub(crate) fn wake(&self) {
        let _st = self.inner.state.lock();
        self.inner.cv.notify_all();
    }

    /// A reconcile [`admit`](Self::admit)ted under `token` returned.
    pub(crate) fn finished(&self, partition: u32, token: u64) {
        let mut st = self.inner.state.lock();
        if let Some(owned) = st.owned.get_mut(&partition).filter(|o| o.token == token) {
            owned.in_flight -= 1;
            if owned.in_flight == 0 && owned.releasing.is_some() {
                self.inner.cv.notify_all();
            }
        }
    }

    /// Keeps this replica out of the group until
    /// [`caches_synced`](Self::caches_synced): asked at start, before
    /// [`attach`](Self::attach), by a controller that watches caches.
    ///
    /// Why (C1 across a join): a gain reconciles the deletes a replica's
    /// caches applied while it did not own their keys, so a delete made
    /// before its caches' first list is not among them. A replica that
    /// joins only once its caches synced makes the owners give partitions
    /// up after that list: every delete before it was theirs to reconcile
    /// (or to hand over), every delete after it reaches this replica's
    /// caches.
    pub(crate) fn join_once_synced(&self) {
        self.inner.state.lock().held_back = true;
    }

    /// The controller's caches synced: the membership thread may join.
    pub(crate) fn caches_synced(&self) {
        let mut st = self.inner.state.lock();
        st.held_back = false;
        self.inner.cv.notify_all();
    }

    /// The controller starts: it gets `hooks` called, and the membership
    /// runs until the returned seat is dropped.
    ///
    /// # Errors
    /// Another controller uses it already.
    pub(crate) fn attach(&self, hooks: Arc<dyn ShardHooks>) -> std::io::Result<ShardSeat> {
        let mut st = self.inner.state.lock();
        if st.attached {
            let message = format!("sharding {:?} serves one controller; make one per controller", self.inner.name);
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, message));
        }
        st.attached = true;
        st.hooks = Some(hooks);
        let shards = Arc::clone(&self.inner);
        spawn_named(format!("reconq-shard-{}", self.inner.name), None, move || shards.run())?;
        Ok(ShardSeat { sharding: self.clone() })
    }
}

/// Hooks for the shuttle models (`tests/shuttle_controller.rs`): a
/// membership that never talks to etcd; the model claims and gives
/// partitions up, the latter through the same steps as a real hand-over.
#[cfg(feature = "shuttle")]
#[doc(hidden)]
impl Sharding {
    pub fn model(name: &str, partitions: u32) -> Self {
        let sharding = Self::new("http://127.0.0.1:1", name).partitions(partitions);
        {
            let mut st = sharding.inner.state.lock();
            // Stopped: its membership thread exits at once.
            st.stopped = true;
            st.renewed = Some(Instant::now() + Duration::from_secs(3600));
        }
        sharding
    }

    pub fn model_claim(&self, partition: u32, token: u64) {
        let owned = Owned { token, created: token as i64, releasing: None, cancelled: false, in_flight: 0 };
        self.inner.state.lock().owned.insert(partition, owned);
    }

    /// Gives `partition` up and returns once its key could be deleted.
    pub fn model_give_up(&self, partition: u32) {
        let s = &self.inner;
        if let Some(o) = s.state.lock().owned.get_mut(&partition) {
            o.releasing = Some(Instant::now());
        }
        loop {
            if s.hand_overs_due().0.iter().any(|&(p, _)| p == partition) {
                // The etcd delete would happen here, with no lock held.
                s.forget(partition);
                return;
            }
            let mut st = s.state.lock();
            if st.owned.get(&partition).is_some_and(|o| o.in_flight > 0) {
                s.cv.wait(&mut st);
            }
        }
    }
}

/// What [`Sharding::admit`] says of a key's partition.
pub(crate) enum ShardAdmission {
    /// Ours and live: run under this fencing token.
    Run(u64),
    /// Ours, but our lease's renewal is late: keep the key and wait
    /// ([`Sharding::wait_live`]) until the lease is renewed or lost.
    Later,
    /// Not ours (or being given up): its owner reconciles it.
    NotOurs,
}

/// A controller's use of its [`Sharding`], dropped once no worker of it is
/// left: the lease is revoked, which deletes the member key and every
/// partition key at once, so the others take them over without waiting
/// for a TTL (and never while a reconcile of ours runs).
pub(crate) struct ShardSeat {
    sharding: Sharding,
}

impl Drop for ShardSeat {
    fn drop(&mut self) {
        let s = &self.sharding.inner;
        let (lease, owned, hooks) = {
            let mut st = s.state.lock();
            st.stopped = true;
            let owned: Vec<(u32, i64)> =
                std::mem::take(&mut st.owned).into_iter().map(|(p, o)| (p, o.created)).collect();
            s.cv.notify_all();
            (st.lease.take(), owned, st.hooks.take())
        };
        if let Some(lease) = lease {
            if let Some(hooks) = hooks {
                s.hand_over_at_stop(&owned, &*hooks);
            }
            let _ = s.client.revoke(lease);
        }
    }
}

impl Shards {
    /// Whether our partitions are ours to act on: the lease renewed within
    /// its deadline, and no reset of etcd's history seen and not yet dealt
    /// with (the membership thread then drops them).
    fn live(&self, st: &State) -> bool {
        st.renewed.is_some_and(|r| r.elapsed() < renew_deadline(self.ttl)) && self.client.pending_reset().is_none()
    }

    /// Whether the membership thread should leave [`serve`](Self::serve):
    /// stopped, the lease lost (or replaced), or a reset to deal with.
    fn interrupted(&self, lease: i64) -> bool {
        let st = self.state.lock();
        st.stopped || st.lease != Some(lease) || self.client.pending_reset().is_some()
    }

    fn stopped(&self) -> bool {
        self.state.lock().stopped
    }

    fn member_key(&self) -> String {
        format!("{}members/{}", self.prefix, self.identity)
    }

    fn partition_key(&self, partition: u32) -> String {
        format!("{}partitions/{partition}", self.prefix)
    }

    fn handover_prefix(&self) -> String {
        format!("{}handover/", self.prefix)
    }

    /// Sleeps `d` or until stopped; returns whether stopped.
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut st = self.state.lock();
        while !st.stopped {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        st.stopped
    }

    /// A call failed: log, show and wait the back-off; returns whether
    /// stopped. A reset of etcd's history is left at once to the
    /// membership thread's loop.
    fn failed(&self, what: &str, error: &EtcdError, backoff: &mut Duration) -> bool {
        if error.reset().is_some() {
            return self.stopped();
        }
        let message = format!("{what}: {error}");
        logs::sharding_error(&self.name, &message, *backoff);
        self.state.lock().last_error = Some(message);
        let stopped = self.sleep(*backoff);
        *backoff = next_backoff(*backoff);
        stopped
    }

    /// The membership thread: join with a fresh lease, then keep it and
    /// rebalance on every change, until stopped.
    fn run(self: Arc<Self>) {
        if !self.wait_to_join() {
            return;
        }
        let mut backoff = FIRST_BACKOFF;
        while !self.stopped() {
            if let Some(reset) = self.client.pending_reset() {
                if self.recover_from_reset(reset, &mut backoff) {
                    return;
                }
                continue;
            }
            let sent = Instant::now();
            let lease = match self.client.grant(self.ttl) {
                Ok(lease) => lease,
                Err(e) => {
                    if self.failed("granting a lease", &e, &mut backoff) {
                        return;
                    }
                    continue;
                }
            };
            if let Err(e) = self.client.put(&self.member_key(), self.identity.as_bytes(), lease) {
                let _ = self.client.revoke(lease);
                if self.failed("joining", &e, &mut backoff) {
                    return;
                }
                continue;
            }
            {
                let mut st = self.state.lock();
                if st.stopped {
                    drop(st);
                    let _ = self.client.revoke(lease);
                    return;
                }
                st.lease = Some(lease);
                st.renewed = Some(sent);
                st.last_error = None;
                self.cv.notify_all();
            }
            backoff = FIRST_BACKOFF;
            let keeper = Arc::clone(&self);
            if let Err(e) = spawn_named(format!("reconq-shard-lease-{}", self.name), None, move || {
                keeper.keep_alive(lease, sent);
            }) {
                let e = EtcdError::invalid(format!("cannot spawn the keep-alive thread: {e}"));
                self.lose_everything("no keep-alive thread");
                let _ = self.client.revoke(lease);
                if self.failed("joining", &e, &mut backoff) {
                    return;
                }
                continue;
            }
            self.serve(lease);
        }
    }

    /// Waits while held back (see [`Sharding::join_once_synced`]);
    /// whether it may join (`false`: stopped first).
    fn wait_to_join(&self) -> bool {
        let mut st = self.state.lock();
        while st.held_back && !st.stopped {
            self.cv.wait(&mut st);
        }
        !st.stopped
    }

    /// etcd's history was reset (guarantees §11 H4): drop every partition
    /// (cancelling their reconciles), raise the floor past every token this
    /// replica saw, then wait a TTL, by when every owner of the old history
    /// has passed its renew deadline; returns whether stopped.
    fn recover_from_reset(&self, reset: Reset, backoff: &mut Duration) -> bool {
        self.lose_everything("etcd's history was reset");
        let seen = self.state.lock().floor;
        let report = |message: String, target| {
            logs::sharding_reset(&self.name, &message, target);
            self.state.lock().last_error = Some(message);
        };
        let failed = |e: &EtcdError| self.failed("raising the fencing floor", e, backoff);
        let Some(floor) = floor::recover(&self.client, reset, seen, report, failed) else { return true };
        self.state.lock().floor = floor;
        self.sleep(self.ttl)
    }

    /// Keeps `lease` (granted by a call sent at `granted`) alive, on a
    /// thread of its own, until stopped, lost, or replaced.
    fn keep_alive(&self, lease: i64, granted: Instant) {
        let mut keeper = LeaseKeeper::new(lease, self.ttl, granted);
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.stopped || st.lease != Some(lease) {
                        return;
                    }
                    if self.cv.wait_until(&mut st, keeper.due()).timed_out() {
                        break;
                    }
                }
            }
            match keeper.renew(&self.client) {
                Renewal::Renewed(sent) => {
                    let mut st = self.state.lock();
                    if st.lease == Some(lease) {
                        st.renewed = Some(sent);
                        st.last_error = None;
                        // Workers waiting out a late renewal go on.
                        self.cv.notify_all();
                    }
                }
                // Stop at once; the membership thread does the rest.
                Renewal::Failed(e) if e.reset().is_some() => {
                    self.lose_everything("etcd's history was reset");
                    self.cv.notify_all();
                    return;
                }
                Renewal::Failed(e) => self.note_error("renewing the lease", &e),
                Renewal::Lost(why) => {
                    self.lose_everything(why);
                    self.cv.notify_all();
                    return;
                }
            }
        }
    }

    fn note_error(&self, what: &str, e: &EtcdError) {
        self.state.lock().last_error = Some(format!("{what}: {e}"));
    }

    /// Takes in the fencing floor as read in a reply at `revision`: the
    /// floor it holds ([`floor::note`]).
    fn note_floor(&self, kv: Option<&KeyValue>, revision: i64) -> Result<u64, EtcdError> {
        floor::note(&self.client, &mut self.state.lock().floor, kv, revision)
    }

    /// Keeps the partitions balanced under `lease` until the lease is lost
    /// (then everything held under it is dropped), a reset of etcd's
    /// history is seen, or stopped.
    fn serve(&self, lease: i64) {
        // How long a quiet watch stays open before the thread looks whether
        // it was interrupted (the keep-alive thread renews meanwhile).
        let poll = self.ttl / 3;
        // The group as last read, and whether it may have changed since.
        let mut seen: Option<i64> = None;
        let mut stale = true;
        loop {
            if self.interrupted(lease) {
                return;
            }
            if stale {
                match self.client.range_prefix(&self.prefix, FLOOR_KEY) {
                    Ok(group) => {
                        (seen, stale) = (Some(group.revision), false);
                        if let Err(e) = self.note_floor(group.read.as_ref(), group.revision) {
                            self.note_error("reading the fencing floor", &e);
                        }
                        let floor_changed = group.read.as_ref().map_or(0, |floor| floor.mod_revision);
                        self.rebalance(&group.kvs, lease, floor_changed);
                    }
                    Err(e) => self.note_error("reading the group", &e),
                }
            } else if self.releasing() {
                self.finish_hand_overs();
            }
            // Wait for a change or (while giving partitions up) their
            // reconciles to return. An idle replica asks etcd for nothing
            // but its keep-alives and this watch.
            let wait = if self.releasing() { RELEASE_POLL } else { poll };
            match seen {
                Some(revision) => {
                    match self.client.watch(Watch::Prefix(&self.prefix), revision, wait, || self.interrupted(lease)) {
                        // A hand-over whose read failed is asked again
                        // at each poll until read.
                        Ok(changed) => stale |= changed || self.unread_handovers(),
                        Err(e) => {
                            self.note_error("watching the group", &e);
                            (seen, stale) = (None, true);
                            self.sleep(RELEASE_POLL * 10);
                        }
                    }
                }
                None => {
                    stale = true;
                    self.sleep(RELEASE_POLL * 10);
                }
            }
        }
    }

    fn unread_handovers(&self) -> bool {
        !self.state.lock().unread_handovers.is_empty()
    }

    fn releasing(&self) -> bool {
        self.state.lock().owned.values().any(|o| o.releasing.is_some())
    }

    /// One look at the group (`kvs`: every member and partition key):
    /// forget partitions that are no longer ours, finish hand-overs whose
    /// reconciles returned, give extras up and claim free ones.
    fn rebalance(&self, kvs: &[KeyValue], lease: i64, floor_changed: i64) {
        let members_prefix = format!("{}members/", self.prefix);
        let partitions_prefix = format!("{}partitions/", self.prefix);
        let mut members: Vec<&str> = kvs.iter().filter_map(|kv| kv.key.strip_prefix(&members_prefix)).collect();
        members.sort_unstable();
        let holders: BTreeMap<u32, &KeyValue> =
            kvs.iter().filter_map(|kv| Some((kv.key.strip_prefix(&partitions_prefix)?.parse().ok()?, kv))).collect();

        // Ours in our books but not in etcd (deleted, or our lease was
        // replaced): gone, without a hand-over.
        let vanished: BTreeSet<u32> = {
            let st = self.state.lock();
            st.owned
                .iter()
                .filter(|(p, o)| holders.get(p).is_none_or(|kv| kv.create_revision != o.created))
                .map(|(&p, _)| p)
                .collect()
        };
        if !vanished.is_empty() {
            self.drop_partitions(&vanished, "their keys were deleted");
        }
        self.finish_hand_overs();
        self.tell_owned_elsewhere(&holders);

        let Some(rank) = members.iter().position(|m| *m == self.identity) else {
            return; // our member key is not visible yet
        };
        let n = members.len() as u32;
        let target = (self.partitions / n + u32::from((rank as u32) < self.partitions % n)) as usize;
        let (held, extras) = {
            let mut st = self.state.lock();
            st.members = members.len();
            // Claimed before the fencing floor last rose (after a reset of
            // etcd this replica did not see, having joined after it; or an
            // operator set the floor): their tokens may lie below tokens of
            // the old history. Handed over like extras, to be claimed again
            // (by whoever should own them) above the floor.
            let kept = |o: &Owned| o.releasing.is_none() && o.created >= floor_changed;
            let below_floor = st.owned.iter().filter(|(_, o)| o.releasing.is_none() && !kept(o)).map(|(&p, _)| p);
            let mut extras: Vec<u32> = below_floor.collect();
            let held = st.owned.values().filter(|o| kept(o)).count();
            let kept_ones = st.owned.iter().rev().filter(|(_, o)| kept(o)).map(|(&p, _)| p);
            extras.extend(kept_ones.take(held.saturating_sub(target)));
            let now = Instant::now();
            for p in &extras {
                if let Some(o) = st.owned.get_mut(p) {
                    o.releasing = Some(now);
                }
            }
            (held, extras)
        };
        if !extras.is_empty() {
            logs::partitions_moved(&self.name, "giving partitions up", &extras.iter().copied().collect());
            self.finish_hand_overs();
        }
        let wanted = target.saturating_sub(held);
        if wanted == 0 {
            // Hand-overs whose read failed are asked again.
            return self.tell_gained(&BTreeSet::new());
        }
        let free: Vec<u32> = (0..self.partitions).filter(|p| !holders.contains_key(p)).take(wanted).collect();
        let mut gained = BTreeSet::new();
        for batch in free.chunks(MAX_TXN_OPS) {
            if self.interrupted(lease) || !self.claim(batch, lease, &mut gained) {
                break;
            }
        }
        if !gained.is_empty() {
            logs::partitions_moved(&self.name, "claimed partitions", &gained);
        }
        self.tell_gained(&gained);
    }

    /// Tells the controller of the partitions `gained` (C1), then reads
    /// the hand-overs (C2) of every partition gained whose hand-over was
    /// not read yet, has the controller enqueue their keys, and deletes
    /// them. The one giving a partition up wrote its hand-over with the
    /// delete of the partition's key, so it is there before any claim can
    /// be. The gain does not wait for the read (etcd may be slow to send
    /// large hand-overs); a read that fails is logged, shown and tried
    /// again at each look at the group.
    fn tell_gained(&self, gained: &BTreeSet<u32>) {
        let (unread, hooks) = {
            let mut st = self.state.lock();
            let State { unread_handovers, owned, .. } = &mut *st;
            unread_handovers.extend(gained);
            unread_handovers.retain(|p| owned.contains_key(p));
            (unread_handovers.clone(), st.hooks.clone())
        };
        let Some(hooks) = hooks else { return };
        if !gained.is_empty() {
            hooks.gained(gained);
        }
        if unread.is_empty() {
            return;
        }
        let handovers = match self.handovers(&unread) {
            Ok(handovers) => {
                self.state.lock().unread_handovers.retain(|p| !unread.contains(p));
                handovers
            }
            Err(e) => return self.note_error("reading the keys handed over", &e),
        };
        if handovers.is_empty() {
            return;
        }
        let handed_over: Vec<Vec<u8>> = handovers.iter().map(|kv| kv.value.clone()).collect();
        hooks.handed_over(&handed_over);
        // Once enqueued: a crash before this enqueues them again at the
        // next owner, a duplicate reconcile and no loss.
        let done: Vec<(String, i64)> = handovers.into_iter().map(|kv| (kv.key, kv.mod_revision)).collect();
        for batch in done.chunks(MAX_TXN_OPS) {
            if let Err(e) = self.client.delete_if_unchanged(batch) {
                self.note_error("deleting the keys handed over", &e);
            }
        }
    }

    /// The hand-overs waiting for `partitions`.
    fn handovers(&self, partitions: &BTreeSet<u32>) -> Result<Vec<KeyValue>, EtcdError> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let prefix = self.handover_prefix();
        let ours = |kv: &KeyValue| {
            kv.key.strip_prefix(&prefix).and_then(|p| p.parse().ok()).is_some_and(|p| partitions.contains(&p))
        };
        Ok(self.client.range_values(&prefix)?.into_iter().filter(ours).collect())
    }

    /// Tells the controller which partitions others hold (`holders`: every
    /// partition key read).
    fn tell_owned_elsewhere(&self, holders: &BTreeMap<u32, &KeyValue>) {
        let (elsewhere, hooks) = {
            let st = self.state.lock();
            let elsewhere: BTreeSet<u32> = holders.keys().filter(|p| !st.owned.contains_key(p)).copied().collect();
            (elsewhere, st.hooks.clone())
        };
        if let (false, Some(hooks)) = (elsewhere.is_empty(), hooks) {
            hooks.owned_elsewhere(&elsewhere);
        }
    }

    /// Claims `batch` (free when last read) in one transaction, adding them
    /// to `gained`; returns whether it did (a partition taken meanwhile
    /// fails the whole batch: the watch then says the group changed).
    fn claim(&self, batch: &[u32], lease: i64, gained: &mut BTreeSet<u32>) -> bool {
        let keys: Vec<String> = batch.iter().map(|&p| self.partition_key(p)).collect();
        match self.client.create_if_absent(&keys, self.identity.as_bytes(), lease, FLOOR_KEY) {
            Ok(Created::Created { revision, read }) => {
                // A floor that is not a number: give the batch back at once,
                // never admitting a key of it.
                let (token, releasing) = match self.note_floor(read.as_ref(), revision) {
                    Ok(floor) => (floor::token(floor, revision), None),
                    Err(e) => {
                        self.note_error("claiming partitions", &e);
                        (0, Some(Instant::now()))
                    }
                };
                let mut st = self.state.lock();
                // Lost meanwhile: the keys go with the lease.
                if st.lease != Some(lease) {
                    return false;
                }
                for &p in batch {
                    st.owned.insert(p, Owned { token, created: revision, releasing, cancelled: false, in_flight: 0 });
                }
                if releasing.is_none() {
                    gained.extend(batch);
                }
                releasing.is_none()
            }
            Ok(Created::Taken { .. }) => false,
            Err(e) => {
                self.note_error("claiming partitions", &e);
                false
            }
        }
    }

    /// Deletes the keys of partitions being given up whose reconciles have
    /// all returned; cancels those still running past the grace.
    fn finish_hand_overs(&self) {
        let (done, overdue) = self.hand_overs_due();
        let hooks = self.state.lock().hooks.clone();
        if let (false, Some(hooks)) = (overdue.is_empty(), &hooks) {
            hooks.cancel(&overdue);
        }
        if done.is_empty() {
            return;
        }
        let partitions: BTreeSet<u32> = done.iter().map(|&(p, _)| p).collect();
        let handed_over = hooks.map(|hooks| hooks.hand_over(&partitions)).unwrap_or_default();
        // Those with keys to hand over one to a transaction (see
        // `MAX_HANDOVER_BYTES`), the others together.
        let (with_keys, without): (Vec<_>, Vec<_>) = done.iter().partition(|(p, _)| handed_over.contains_key(p));
        for one in &with_keys {
            self.give_up(std::slice::from_ref(one), &handed_over);
        }
        for batch in without.chunks(MAX_TXN_OPS) {
            self.give_up(batch, &handed_over);
        }
    }

    /// Deletes the keys of `batch` (partitions and their keys' create
    /// revisions) in one transaction, each only while still ours: a key
    /// recreated by someone else (our lease expired meanwhile) is theirs.
    /// With them, writes what each hands over (`handed_over`). If one is
    /// not ours any more, the others go one by one. Whether etcd answered.
    fn give_up(&self, batch: &[(u32, i64)], handed_over: &BTreeMap<u32, Vec<u8>>) -> bool {
        let keys: Vec<(String, i64)> = batch.iter().map(|&(p, created)| (self.partition_key(p), created)).collect();
        let puts: Vec<(String, Vec<u8>)> = batch
            .iter()
            .filter_map(|(p, _)| Some((format!("{}{p}", self.handover_prefix()), handed_over.get(p)?.clone())))
            .collect();
        match self.client.delete_if_created(&keys, &puts) {
            Ok(true) => batch.iter().for_each(|&(p, _)| self.forget(p)),
            Ok(false) if batch.len() > 1 => {
                // Each is tried, whatever the others' answers.
                let unanswered = batch.iter().filter(|one| !self.give_up(std::slice::from_ref(*one), handed_over));
                return unanswered.count() == 0;
            }
            // Not ours any more: gone already.
            Ok(false) => self.forget(batch[0].0),
            Err(e) => {
                self.note_error("giving partitions up", &e);
                return false;
            }
        }
        true
    }

    /// A clean stop (C2), once no reconcile of ours runs: the partitions
    /// `owned` with keys pending are given up one by one with their
    /// hand-overs; the rest go with the lease, revoked next. The first
    /// call that fails ends it (an unreachable etcd must not hold the stop
    /// once per partition): the partitions left free themselves with the
    /// lease, as after a crash.
    fn hand_over_at_stop(&self, owned: &[(u32, i64)], hooks: &dyn ShardHooks) {
        let partitions: BTreeSet<u32> = owned.iter().map(|&(p, _)| p).collect();
        let handed_over = hooks.hand_over(&partitions);
        for one in owned.iter().filter(|(p, _)| handed_over.contains_key(p)) {
            let one = std::slice::from_ref(one);
            // Once more after a failure: a busy etcd can miss one call's deadline.
            if !self.give_up(one, &handed_over) && !self.give_up(one, &handed_over) {
                return;
            }
        }
    }

    /// Of the partitions being given up: those whose reconciles have all
    /// returned, with their keys' create revisions (their keys may be
    /// deleted now: being given up, no new reconcile of them is admitted),
    /// and those whose reconciles run past the grace, to cancel (once).
    fn hand_overs_due(&self) -> (Vec<(u32, i64)>, BTreeSet<u32>) {
        let mut st = self.state.lock();
        let done = st
            .owned
            .iter()
            .filter(|(_, o)| o.releasing.is_some() && o.in_flight == 0)
            .map(|(&p, o)| (p, o.created))
            .collect();
        let mut overdue = BTreeSet::new();
        for (&p, o) in st.owned.iter_mut() {
            if o.releasing.is_some_and(|since| since.elapsed() >= RELEASE_GRACE) && o.in_flight > 0 && !o.cancelled {
                o.cancelled = true;
                overdue.insert(p);
            }
        }
        (done, overdue)
    }

    /// The partition's key is gone: it is no longer ours at all.
    fn forget(&self, partition: u32) {
        self.state.lock().owned.remove(&partition);
    }

    /// Partitions lost without a hand-over: no longer ours, their running
    /// reconciles cancelled.
    fn drop_partitions(&self, partitions: &BTreeSet<u32>, why: &str) {
        let hooks = {
            let mut st = self.state.lock();
            for p in partitions {
                st.owned.remove(p);
            }
            // Workers waiting out a late renewal find their keys not ours.
            self.cv.notify_all();
            st.hooks.clone()
        };
        logs::partitions_lost(&self.name, why, partitions);
        if let Some(hooks) = hooks {
            hooks.cancel(partitions);
        }
    }

    /// The lease is gone: so is every partition held under it.
    fn lose_everything(&self, why: &str) {
        let all: BTreeSet<u32> = {
            let mut st = self.state.lock();
            st.lease = None;
            st.renewed = None;
            st.owned.keys().copied().collect()
        };
        if !all.is_empty() {
            self.drop_partitions(&all, why);
        }
    }
}

impl Observed for Shards {
    fn collect_metrics(&self, out: &mut MetricFamilies) {
        let owned = {
            let st = self.state.lock();
            if self.live(&st) { st.owned.values().filter(|o| o.releasing.is_none()).count() } else { 0 }
        };
        out.gauge(
            "reconq_shard_owned_partitions",
            "Partitions of the sharded group 'name' this process owns now.",
            &[("name", &self.name)],
            owned as f64,
        );
    }
}

impl fmt::Debug for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sharding")
            .field("name", &self.inner.name)
            .field("identity", &self.inner.identity)
            .field("partitions", &self.inner.partitions)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sharding holding partition 3 (token 7), last renewed `ago`.
    fn holding_since(ago: Duration) -> Sharding {
        let sharding = Sharding::new("http://127.0.0.1:1", "t").partitions(8);
        let mut st = sharding.inner.state.lock();
        st.renewed = Some(Instant::now() - ago);
        st.owned.insert(3, Owned { token: 7, created: 1, releasing: None, cancelled: false, in_flight: 0 });
        drop(st);
        sharding
    }

    /// A renewal late but not lost (a keep-alive answered just past the
    /// deadline on a loaded machine) keeps the partition's keys: they are
    /// still ours at enqueue and wait at hand-out, instead of being
    /// dropped as another replica's while no other replica owns them.
    #[test]
    fn a_late_renewal_keeps_the_keys_of_partitions_still_ours() {
        let fresh = holding_since(Duration::ZERO);
        assert!(matches!(fresh.admit(3), ShardAdmission::Run(7)));
        assert!(matches!(fresh.admit(4), ShardAdmission::NotOurs));

        let late = holding_since(Duration::from_secs(4)); // TTL 5 s: deadline 3.33 s
        assert!(late.owns(3), "a late renewal does not make the partition another's");
        assert!(!late.owns(4));
        assert!(matches!(late.admit(3), ShardAdmission::Later));
        assert!(late.owned_partitions().is_empty(), "no partition is reported ours to act on");

        // A worker waits until the renewal succeeds (or the stop gives up).
        let waiter = {
            let late = late.clone();
            std::thread::spawn(move || late.wait_live(&|| false))
        };
        std::thread::sleep(Duration::from_millis(50)); // let it block (not asserted on)
        {
            let mut st = late.inner.state.lock();
            st.renewed = Some(Instant::now());
            late.inner.cv.notify_all();
        }
        assert!(waiter.join().unwrap(), "renewed: the worker goes on");
        assert!(matches!(late.admit(3), ShardAdmission::Run(7)));
        assert!(!holding_since(Duration::from_secs(4)).wait_live(&|| true), "a stop gives up the wait");
    }
}
