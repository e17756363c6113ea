//! Leader election on etcd (guarantees §10), etcd's own election recipe:
//! a lease kept alive every `ttl / 3`; a campaign is one transaction that
//! creates the election key, attached to the lease, only if it is absent;
//! standbys watch the key and campaign again the moment it is deleted (no
//! polling). The fencing token is the key's create revision above the
//! fencing floor (`floor.rs`): each new leadership creates the key anew, so
//! tokens strictly increase, across a reset of etcd's history too.
//!
//! A reply from a reset history (etcd wiped, or restored from an older
//! snapshot) makes a leader step down at once, as a lost lease does; every
//! process that sees it raises the floor and waits a TTL before it
//! campaigns again, by when any leader of the old history has stopped (its
//! renew deadline has passed: it cannot renew in the new history).
//!
//! Safety does not rest on the campaign thread being timely. A leader
//! counts itself leader only until `renewed + renew_deadline`, measured
//! from when its last successful keep-alive was *sent* (the server's lease
//! runs from when it was received, later), and the renew deadline is
//! shorter than the TTL. Workers ask [`LeaderElection::token`] before
//! every reconcile, so a process paused past its lease (SIGSTOP, a long
//! GC-like stall) finds its leadership gone the moment it runs again,
//! before it can start a reconcile with the old token.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::floor::{self, FLOOR_KEY};
use super::lease::{LeaseKeeper, Renewal};
use super::settings::{
    DEFAULT_TTL, Endpoints, FIRST_BACKOFF, check_endpoints_and_name, check_ttl, default_identity, next_backoff,
    renew_deadline,
};
use super::{LeaderSeat, LeaderStatus, Leading};
use crate::error::InvalidArgument;
use crate::etcd::{Created, EtcdClient, EtcdError, KeyValue, Reset, Watch};
use crate::logs;
use crate::observe::metrics::MetricFamilies;
use crate::observe::{self, Observed};
use crate::sync::{Condvar, Mutex};
use crate::thread::{JoinHandle, spawn_named};

/// What a leader that loses its leadership does (guarantees §10, L3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Become a standby and campaign again (the default).
    #[default]
    Standby,
    /// End the process with status 1, as controller-runtime does.
    Exit,
}

/// How long a standby's quiet watch stays open before it is reopened (to
/// notice that the campaign was stopped): the only wake-up of an idle
/// standby.
const WATCH_REOPEN: Duration = Duration::from_secs(60);

/// A campaign for leadership of `name` among every process that runs one
/// with the same name and endpoints. Cheap to clone: clones share one
/// campaign, so one election can serve several controllers.
#[derive(Clone)]
#[must_use = "a LeaderElection does nothing until given to a controller (`Controller::leader_election`)"]
pub struct LeaderElection {
    inner: Arc<Election>,
}

struct Election {
    /// Reports `leader_election_master_status` once per election, however
    /// many controllers share it.
    _registration: observe::Registration,
    name: String,
    key: String,
    identity: String,
    ttl: Duration,
    on_lost: OnLost,
    client: EtcdClient,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    /// Configured for good: settings can no longer change.
    started: bool,
    /// [`LeaderElection::stop`] was called: the campaign never runs again.
    stopped: bool,
    /// [`LeaderElection::start`] was called: campaign until `stop`, even
    /// with no controller using it.
    kept: bool,
    /// Controllers and managers using it now ([`Seat`]s).
    users: usize,
    /// A campaign thread runs and has not decided to exit. Set and cleared
    /// under this lock together with the decision, so a user joining while
    /// the thread winds down starts a new one rather than finding none.
    campaigning: bool,
    /// The campaign thread may hold a lease (from before it asks for one
    /// until it has revoked it or lost it): `stop` waits for this to clear,
    /// so leadership is given up when `stop` returns, but never for a
    /// standby blocked in its watch.
    lease_held: bool,
    leading: Option<Leadership>,
    /// Who leads, as last seen (their identity).
    leader: Option<String>,
    last_error: Option<String>,
    /// The highest fencing floor read (see `floor.rs`).
    floor: u64,
    /// Called (outside the lock) when leadership is lost.
    on_lost: Vec<Weak<dyn Fn() + Send + Sync>>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Clone, Copy)]
struct Leadership {
    token: u64,
    /// When the last successful keep-alive (or the campaign) was sent.
    renewed: Instant,
}

impl LeaderElection {
    /// A campaign for `name` on the etcd members at `endpoints`
    /// (`http://host:port`, one or a list), with a 5 s TTL and the host
    /// name and process id as identity. Nothing happens until it is
    /// started, by the first controller that uses it or [`start`](Self::start).
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
        let endpoints = check_endpoints_and_name(&endpoints, name, "leader election")?;
        Ok(Self::build(name.to_owned(), endpoints, default_identity(), DEFAULT_TTL, OnLost::Standby))
    }

    fn build(name: String, endpoints: Vec<String>, identity: String, ttl: Duration, on_lost: OnLost) -> Self {
        let key = format!("/reconq/election/{name}");
        let client = EtcdClient::new(endpoints);
        let inner = Arc::new_cyclic(|weak: &Weak<Election>| Election {
            _registration: observe::register(weak.clone()),
            name,
            key,
            identity,
            ttl,
            on_lost,
            client,
            state: Mutex::default(),
            cv: Condvar::new(),
        });
        Self { inner }
    }

    /// The lease's time to live (default 5 s, at least 2 s: etcd's
    /// minimum). A crashed leader is replaced within about `ttl`.
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
        Ok(self.rebuild(|e| e.ttl = ttl))
    }

    /// How this process is named in the election (default host-pid).
    pub fn identity(self, identity: impl Into<String>) -> Self {
        let identity = identity.into();
        self.rebuild(|e| e.identity = identity)
    }

    /// What a leader that loses leadership does (default
    /// [`OnLost::Standby`]).
    pub fn on_lost(self, on_lost: OnLost) -> Self {
        self.rebuild(|e| e.on_lost = on_lost)
    }

    /// Settings can change only before the campaign starts and while no
    /// clone shares it.
    fn rebuild(self, change: impl FnOnce(&mut Settings)) -> Self {
        let e = &self.inner;
        assert!(!e.state.lock().started, "leader election {:?}: configure it before it starts", e.name);
        let mut settings = Settings { identity: e.identity.clone(), ttl: e.ttl, on_lost: e.on_lost };
        change(&mut settings);
        Self::build(e.name.clone(), e.client.endpoints().to_vec(), settings.identity, settings.ttl, settings.on_lost)
    }

    /// Starts campaigning, on a thread of its own, until [`stop`](Self::stop)
    /// (later calls do nothing). Controllers and managers that use the
    /// election start it themselves and give leadership up when the last
    /// of them stops; call this only to campaign without them.
    pub fn start(&self) {
        let mut st = self.inner.state.lock();
        st.kept = true;
        self.inner.campaign(&mut st);
    }

    /// Ends the campaign for good: a leader revokes its lease, so a standby
    /// takes over at once (L4). Returns once no lease of ours is left
    /// (bounded by etcd's call timeouts); a standby's thread, blocked in
    /// its watch, exits by itself when the watch next wakes.
    pub fn stop(&self) {
        let mut st = self.inner.state.lock();
        st.stopped = true;
        self.inner.cv.notify_all();
        while st.lease_held {
            self.inner.cv.wait(&mut st);
        }
        let thread = st.thread.take_if(|thread| thread.is_finished());
        drop(st);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    /// A controller or manager starts using the election: it campaigns
    /// until every [`Seat`] is dropped (or [`stop`](Self::stop)), and
    /// `on_lost` is called (with no lock held) each time leadership is lost
    /// while the seat lives.
    pub(crate) fn join(&self, on_lost: impl Fn() + Send + Sync + 'static) -> Seat {
        let on_lost: Arc<dyn Fn() + Send + Sync> = Arc::new(on_lost);
        let mut st = self.inner.state.lock();
        st.users += 1;
        st.on_lost.push(Arc::downgrade(&on_lost));
        self.inner.campaign(&mut st);
        Seat { election: self.clone(), _on_lost: on_lost }
    }

    /// Whether this process leads now (and its leadership has not run past
    /// its renew deadline).
    pub fn is_leader(&self) -> bool {
        self.token().is_some()
    }

    /// The fencing token of the current leadership, if this process leads:
    /// etcd's create revision of the election key above the fencing floor,
    /// strictly increasing with each new leadership (L2).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token()
    }

    /// Who leads, as last seen: their identity.
    pub fn leader(&self) -> Option<String> {
        self.inner.state.lock().leader.clone()
    }

    /// The last error talking to etcd, if the last attempt failed.
    pub fn last_error(&self) -> Option<String> {
        self.inner.state.lock().last_error.clone()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Everything above in one consistent snapshot, for status and stats.
    pub fn status(&self) -> LeaderStatus {
        let st = self.inner.state.lock();
        LeaderStatus {
            name: self.inner.name.clone(),
            fencing_token: self.inner.live_token(&st),
            leader: st.leader.clone(),
            last_error: st.last_error.clone(),
        }
    }

    pub(crate) fn token(&self) -> Option<u64> {
        self.inner.live_token(&self.inner.state.lock())
    }

    /// Blocks until this process leads (returns its token) or `give_up()`
    /// turns true (returns `None`); [`wake`](Self::wake) makes it look.
    pub(crate) fn wait_token(&self, give_up: impl Fn() -> bool) -> Option<u64> {
        let mut st = self.inner.state.lock();
        loop {
            if give_up() {
                return None;
            }
            if let Some(token) = self.inner.live_token(&st) {
                return Some(token);
            }
            self.inner.cv.wait(&mut st);
        }
    }

    /// Wakes the threads in [`wait_token`](Self::wait_token) (a controller
    /// stopping).
    pub(crate) fn wake(&self) {
        let _st = self.inner.state.lock();
        self.inner.cv.notify_all();
    }
}

/// Hooks for the shuttle models (`tests/shuttle_controller.rs`): an election
/// that never talks to etcd, won and lost when the model says so.
#[cfg(feature = "shuttle")]
#[doc(hidden)]
impl LeaderElection {
    pub fn model(name: &str) -> Self {
        let election = Self::new("http://127.0.0.1:1", name);
        // Stopped: no campaign thread; `model_win` and `model_lose` decide.
        election.inner.state.lock().stopped = true;
        election
    }

    /// Leads with `token` (renewed in the far future: no clock decides
    /// anything in a model).
    pub fn model_win(&self, token: u64) {
        let mut st = self.inner.state.lock();
        st.leading = Some(Leadership { token, renewed: Instant::now() + Duration::from_secs(3600) });
        self.inner.cv.notify_all();
    }

    /// Loses leadership as a failed renewal does.
    pub fn model_lose(&self) {
        let token = self.inner.state.lock().leading.map_or(0, |l| l.token);
        self.inner.lose(token, "lost in a model");
    }

    /// How many controllers or managers hold a seat (have not left).
    pub fn model_seats(&self) -> usize {
        self.inner.state.lock().users
    }
}

/// One controller's or manager's use of a [`LeaderElection`]. Dropped
/// once nothing of its user can reconcile any more (every worker exited):
/// when the last seat goes, a leader revokes its lease, so a standby takes
/// over at once (L4) without ever overlapping a reconcile of ours.
pub(crate) struct Seat {
    election: LeaderElection,
    /// The election holds it weakly: it is called while the seat lives.
    _on_lost: Arc<dyn Fn() + Send + Sync>,
}

impl Leading for LeaderElection {
    fn join(&self, on_lost: Box<dyn Fn() + Send + Sync>) -> Box<dyn LeaderSeat> {
        Box::new(LeaderElection::join(self, on_lost))
    }

    fn status(&self) -> LeaderStatus {
        LeaderElection::status(self)
    }
}

impl LeaderSeat for Seat {
    fn token(&self) -> Option<u64> {
        self.election.token()
    }

    fn wait_token(&self, give_up: &dyn Fn() -> bool) {
        self.election.wait_token(give_up);
    }

    fn wake(&self) {
        self.election.wake();
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let e = &self.election.inner;
        let mut st = e.state.lock();
        st.users -= 1;
        e.cv.notify_all();
    }
}

struct Settings {
    identity: String,
    ttl: Duration,
    on_lost: OnLost,
}

impl Election {
    /// The token of a leadership still within its renew deadline, with no
    /// reset of etcd's history seen and not yet dealt with (the campaign
    /// thread then steps down).
    fn live_token(&self, st: &State) -> Option<u64> {
        let reset = self.client.pending_reset().is_some();
        st.leading.filter(|l| !reset && l.renewed.elapsed() < self.renew_deadline()).map(|l| l.token)
    }

    /// The leader stops counting itself leader this long after its last
    /// successful renewal was sent (see [`renew_deadline`]).
    fn renew_deadline(&self) -> Duration {
        renew_deadline(self.ttl)
    }

    /// Whether the campaign should go on: not stopped, and started by
    /// [`LeaderElection::start`] or in use.
    fn wanted(st: &State) -> bool {
        !st.stopped && (st.kept || st.users > 0)
    }

    fn set_lease_held(&self, held: bool) {
        let mut st = self.state.lock();
        st.lease_held = held;
        self.cv.notify_all();
    }

    fn unwanted(&self) -> bool {
        !Self::wanted(&self.state.lock())
    }

    /// Starts the campaign thread unless one runs (or it is stopped).
    fn campaign(self: &Arc<Self>, st: &mut State) {
        st.started = true;
        if st.campaigning || !Self::wanted(st) {
            return;
        }
        let election = Arc::clone(self);
        match spawn_named(format!("reconq-election-{}", self.name), None, move || election.run()) {
            Ok(thread) => {
                st.campaigning = true;
                // A thread that wound down earlier has finished its revoke.
                st.thread = Some(thread);
            }
            Err(e) => st.last_error = Some(format!("cannot spawn the election thread: {e}")),
        }
    }

    /// Sleeps `d` or until no longer wanted; returns whether unwanted.
    fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut st = self.state.lock();
        while Self::wanted(&st) {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        !Self::wanted(&st)
    }

    /// A call failed: log, show and wait the back-off; returns whether
    /// unwanted. A reset of etcd's history is left at once to the
    /// campaign's loop ([`recover_from_reset`](Self::recover_from_reset)).
    fn failed(&self, what: &str, error: &EtcdError, backoff: &mut Duration) -> bool {
        if error.reset().is_some() {
            return self.unwanted();
        }
        let message = format!("{what}: {error}");
        logs::election_error(&self.name, &message, *backoff);
        self.state.lock().last_error = Some(message);
        let unwanted = self.sleep(*backoff);
        *backoff = next_backoff(*backoff);
        unwanted
    }

    /// The campaign thread: campaigns until no longer wanted, then exits,
    /// unless a user joined meanwhile (decided under the state lock, see
    /// `State::campaigning`).
    fn run(self: Arc<Self>) {
        loop {
            self.campaign_while_wanted();
            let mut st = self.state.lock();
            if !Self::wanted(&st) {
                st.campaigning = false;
                return;
            }
        }
    }

    /// Campaign, lead or watch, until no longer wanted.
    fn campaign_while_wanted(&self) {
        let mut backoff = FIRST_BACKOFF;
        while !self.unwanted() {
            if let Some(reset) = self.client.pending_reset() {
                if self.recover_from_reset(reset, &mut backoff) {
                    break;
                }
                continue;
            }
            self.set_lease_held(true);
            let sent = Instant::now();
            let lease = match self.client.grant(self.ttl) {
                Ok(lease) => lease,
                Err(e) => {
                    self.set_lease_held(false);
                    if self.failed("granting a lease", &e, &mut backoff) {
                        break;
                    }
                    continue;
                }
            };
            let created = self.client.create_if_absent(
                std::slice::from_ref(&self.key),
                self.identity.as_bytes(),
                lease,
                FLOOR_KEY,
            );
            match created {
                Ok(Created::Created { revision, read }) => match self.note_floor(read.as_ref(), revision) {
                    Ok(floor) => {
                        backoff = FIRST_BACKOFF;
                        self.lead(lease, floor::token(floor, revision), sent);
                    }
                    Err(e) => {
                        let _ = self.client.revoke(lease);
                        self.set_lease_held(false);
                        if self.failed("campaigning", &e, &mut backoff) {
                            break;
                        }
                    }
                },
                Ok(Created::Taken { holders, revision, read }) => {
                    backoff = FIRST_BACKOFF;
                    // Not ours: give the lease back and watch for the key's
                    // deletion (by its holder's stop, or its lease expiring).
                    let _ = self.client.revoke(lease);
                    self.set_lease_held(false);
                    let floor_error = self.note_floor(read.as_ref(), revision).err().map(|e| e.to_string());
                    {
                        let mut st = self.state.lock();
                        st.leader = holders.first().map(|holder| String::from_utf8_lossy(&holder.value).into_owned());
                        st.last_error = floor_error;
                    }
                    let floor_changed = read.as_ref().map_or(0, |floor| floor.mod_revision);
                    match holders.first().filter(|holder| holder.create_revision < floor_changed) {
                        Some(holder) => {
                            if self.end_below_floor(holder, &mut backoff) {
                                break;
                            }
                        }
                        None => self.watch_until_free(revision, &mut backoff),
                    }
                }
                Err(e) => {
                    let _ = self.client.revoke(lease);
                    self.set_lease_held(false);
                    if self.failed("campaigning", &e, &mut backoff) {
                        break;
                    }
                }
            }
        }
    }

    /// Takes in the fencing floor as read with the election key, in a
    /// reply at `revision`: the floor it holds ([`floor::note`]).
    fn note_floor(&self, kv: Option<&KeyValue>, revision: i64) -> Result<u64, EtcdError> {
        floor::note(&self.client, &mut self.state.lock().floor, kv, revision)
    }

    /// etcd's history was reset (guarantees §10 L2): a leader has stepped
    /// down already (its renewal failed with the reset). Raise the floor
    /// past every token this process saw, then wait a TTL, by when any
    /// leader of the old history has passed its renew deadline; returns
    /// whether unwanted.
    fn recover_from_reset(&self, reset: Reset, backoff: &mut Duration) -> bool {
        let seen = self.state.lock().floor;
        let report = |message: String, target| {
            logs::election_reset(&self.name, &message, target);
            self.state.lock().last_error = Some(message);
        };
        let failed = |e: &EtcdError| self.failed("raising the fencing floor", e, backoff);
        let Some(floor) = floor::recover(&self.client, reset, seen, report, failed) else { return true };
        self.state.lock().floor = floor;
        self.sleep(self.ttl)
    }

    /// The leader `holder` campaigned before the fencing floor last rose
    /// (after a reset of etcd's history it could not see, having started
    /// after it; or an operator set the floor): its token may lie below
    /// tokens of the old history. End its leadership by revoking its lease
    /// (its next keep-alive finds it gone, L3), then wait a TTL, by when it
    /// has passed its renew deadline, before campaigning (L1). Returns
    /// whether unwanted.
    fn end_below_floor(&self, holder: &KeyValue, backoff: &mut Duration) -> bool {
        logs::election_below_floor(&self.name, &String::from_utf8_lossy(&holder.value), holder.create_revision);
        match self.client.revoke(holder.lease) {
            Ok(()) => self.sleep(self.ttl),
            Err(e) => self.failed("ending a leadership below the fencing floor", &e, backoff),
        }
    }

    /// Waits until the election key is deleted after `revision`, or no
    /// longer wanted: one watch stream, which etcd answers the moment the
    /// key goes (no polling). A quiet stream is reopened every
    /// [`WATCH_REOPEN`], only to notice a stop.
    fn watch_until_free(&self, revision: i64, backoff: &mut Duration) {
        loop {
            match self.client.watch(Watch::Deletion(&self.key), revision, WATCH_REOPEN, || self.unwanted()) {
                Ok(true) => return,
                Ok(false) if self.unwanted() => return,
                Ok(false) => {}
                // Campaign again (after the back-off): the key may be gone.
                Err(e) => {
                    self.failed("watching the leader", &e, backoff);
                    return;
                }
            }
        }
    }

    /// Leads until the lease cannot be renewed in time or no longer wanted.
    fn lead(&self, lease: i64, token: u64, sent: Instant) {
        {
            let mut st = self.state.lock();
            st.leading = Some(Leadership { token, renewed: sent });
            st.leader = Some(self.identity.clone());
            st.last_error = None;
            self.cv.notify_all();
        }
        logs::election_won(&self.name, &self.identity, token);
        let mut keeper = LeaseKeeper::new(lease, self.ttl, sent);
        loop {
            if self.sleep(keeper.due().saturating_duration_since(Instant::now())) {
                // Stopped, or the last user left: give leadership up at once (L4).
                self.state.lock().leading = None;
                let _ = self.client.revoke(lease);
                self.set_lease_held(false);
                return;
            }
            match keeper.renew(&self.client) {
                Renewal::Renewed(sent) => {
                    let mut st = self.state.lock();
                    if let Some(l) = &mut st.leading {
                        l.renewed = sent;
                    }
                    // Workers that found the leadership lapsed while this
                    // answer was on its way wait for it.
                    self.cv.notify_all();
                }
                // Step down at once: the campaign's loop recovers.
                Renewal::Failed(e) if e.reset().is_some() => {
                    self.lose(token, "etcd's history was reset");
                    return;
                }
                Renewal::Failed(e) => self.state.lock().last_error = Some(format!("renewing the lease: {e}")),
                Renewal::Lost(why) => {
                    self.lose(token, why);
                    return;
                }
            }
        }
    }

    /// Leadership is gone: stop counting as leader, cancel what runs under
    /// it, then stand by or exit.
    fn lose(&self, token: u64, why: &str) {
        let callbacks: Vec<_> = {
            let mut st = self.state.lock();
            st.leading = None;
            st.leader = None;
            // Expired, or out of reach: nothing left to revoke.
            st.lease_held = false;
            self.cv.notify_all();
            st.on_lost.retain(|f| f.strong_count() > 0);
            st.on_lost.iter().filter_map(Weak::upgrade).collect()
        };
        logs::election_lost(&self.name, token, why);
        for f in callbacks {
            f();
        }
        if self.on_lost == OnLost::Exit {
            std::process::exit(1);
        }
    }
}

impl Observed for Election {
    fn collect_metrics(&self, out: &mut MetricFamilies) {
        let leading = self.live_token(&self.state.lock()).is_some();
        // Elections of one name in one process (tests) share the series:
        // 1 if any of them leads.
        out.gauge_max(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            &[("name", &self.name)],
            f64::from(u8::from(leading)),
        );
    }
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("name", &self.inner.name)
            .field("identity", &self.inner.identity)
            .field("ttl", &self.inner.ttl)
            .field("is_leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leading_since(ago: Duration) -> LeaderElection {
        let election = LeaderElection::new("http://127.0.0.1:1", "t");
        election.inner.state.lock().leading = Some(Leadership { token: 7, renewed: Instant::now() - ago });
        election
    }

    /// The safety of a paused process rests on this, not on the campaign
    /// thread noticing in time (it may be the one paused): a leadership
    /// past its renew deadline hands out no token.
    #[test]
    fn a_leadership_past_its_renew_deadline_has_no_token() {
        let fresh = leading_since(Duration::ZERO);
        assert_eq!((fresh.fencing_token(), fresh.is_leader()), (Some(7), true));
        let lapsed = leading_since(Duration::from_secs(4)); // TTL 5 s: deadline 3.33 s
        assert_eq!((lapsed.fencing_token(), lapsed.is_leader()), (None, false));
        assert_eq!(lapsed.wait_token(|| true), None);
        assert!(!lapsed.status().is_leader());
    }
}
