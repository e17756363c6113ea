//! Named periodic controllers, as Cilium's `pkg/controller` (guarantees §5).
//!
//! A [`Manager`] maps names to controllers. Each controller is one OS thread
//! (named `reconq-mgr-<name>`) that runs its `do` function until it succeeds,
//! then every `run_interval`, retrying failures with linear backoff. The
//! thread sleeps on a condvar between runs, so an idle controller uses no CPU
//! (G8), and a controller never runs concurrently with itself.

mod params;
mod status;
mod worker;

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Weak};

use crate::clock::{Clock, SystemClock};
use crate::coordination::Leading;
use crate::observe::fields::health_of;
use crate::observe::status::{EntryKind, PeriodicDetails, StatusEntry};
use crate::observe::{self, Observed};
use crate::sync::Mutex;
use crate::thread::{self, JoinHandle, ThreadWrapper, spawn_named};
use worker::Ctl;

pub use params::{ControllerParams, DEFAULT_ERROR_RETRY_BASE, DoError};
pub use status::{ControllerStatus, UnknownController};

/// A set of named periodic controllers.
///
/// `Manager` is a cheap handle: clones share the same controllers, and it is
/// `Send + Sync`, so `do` and `stop` functions may hold a clone to update or
/// trigger controllers (their own included).
///
/// **Dropping the last handle** removes every controller *without waiting*:
/// each thread finishes its current run, runs `stop` (after `do` ran at least
/// once) and exits in the background. Call [`remove_all_and_wait`] first to
/// block until they are gone. Not joining in `drop` keeps a drop from
/// blocking on a hung `do`, and lets the Python bindings drop a manager while
/// holding the interpreter lock that `stop` functions need.
///
/// A `do` or `stop` function that holds a `Manager` clone keeps the manager
/// (and so its controllers) alive until the controller is removed; hold a
/// [`WeakManager`] ([`Manager::downgrade`]) instead to let a drop stop them.
///
/// [`remove_all_and_wait`]: Manager::remove_all_and_wait
///
/// ```
/// use reconq::{ControllerParams, DoError, Manager};
/// use std::sync::mpsc;
/// use std::time::Duration;
///
/// let manager = Manager::new();
/// let (tx, rx) = mpsc::channel();
/// manager.update(
///     "sync-routes",
///     ControllerParams::new(move || -> Result<(), DoError> {
///         tx.send(()).ok();
///         Ok(())
///     })
///     .run_interval(Duration::from_secs(60)),
/// );
/// rx.recv_timeout(Duration::from_secs(10)).unwrap(); // the first run
/// manager.remove_all_and_wait();
/// ```
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

struct Inner {
    /// Lists the manager's controllers in metrics and status.
    _registration: observe::Registration,
    /// Shown in the global status ([`crate::status`]).
    name: String,
    registry: Mutex<Registry>,
    clock: Arc<dyn Clock>,
    wrapper: Option<ThreadWrapper>,
    log_errors: bool,
    /// Run `do` only while this process leads (guarantees §10).
    leader: Option<Arc<dyn Leading>>,
}

#[derive(Default)]
struct Registry {
    controllers: BTreeMap<String, Entry>,
    /// Threads of removed controllers, not yet joined (finishing their last
    /// run or their `stop`); `remove_all_and_wait` joins them too.
    retiring: Vec<JoinHandle<()>>,
}

struct Entry {
    ctl: Arc<Ctl>,
    thread: JoinHandle<()>,
}

/// A handle to a [`Manager`] that does not keep it alive, for `do` and
/// `stop` functions that update or trigger controllers of their own manager.
#[derive(Clone, Default)]
pub struct WeakManager {
    inner: Weak<Inner>,
}

impl WeakManager {
    /// The manager, unless every [`Manager`] handle has been dropped.
    pub fn upgrade(&self) -> Option<Manager> {
        self.inner.upgrade().map(|inner| Manager { inner })
    }
}

impl fmt::Debug for WeakManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakManager").field("alive", &(self.inner.strong_count() > 0)).finish()
    }
}

/// Builds a [`Manager`] with a non-default name, clock or thread wrapper.
#[must_use = "a builder does nothing until `.build()`"]
pub struct ManagerBuilder {
    name: String,
    clock: Arc<dyn Clock>,
    wrapper: Option<ThreadWrapper>,
    log_errors: bool,
    leader: Option<Arc<dyn Leading>>,
}

/// The name of a manager built without [`ManagerBuilder::name`].
pub const DEFAULT_MANAGER_NAME: &str = "manager";

impl ManagerBuilder {
    /// The name the global status ([`crate::status`]) shows the manager's
    /// controllers under (default `"manager"`). Names need not be unique.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The clock run times are measured on; the default is [`SystemClock`].
    /// With a [`FakeClock`](crate::FakeClock), controllers run when the test
    /// advances it.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs `do` functions only while this process leads `election`
    /// (guarantees §10), as controller-runtime's manager runs all its
    /// controllers under one election; the same election may serve
    /// [`Controller`](crate::Controller)s too. On a standby, due runs wait
    /// for leadership without CPU; each `do` gets the leadership's
    /// [`Context::fencing_token`](crate::Context::fencing_token), and is
    /// cancelled when leadership is lost. A controller removed before it
    /// ever ran, as on a standby, runs neither `do` nor `stop`. The
    /// campaign runs while the manager has controllers.
    #[cfg(feature = "etcd")]
    pub fn leader_election(mut self, election: crate::coordination::LeaderElection) -> Self {
        self.leader = Some(Arc::new(election));
        self
    }

    /// Runs the body of every controller thread inside `wrapper`.
    pub fn thread_wrapper(mut self, wrapper: ThreadWrapper) -> Self {
        self.wrapper = Some(wrapper);
        self
    }

    /// Whether a `do` that returns an error is logged (a WARN on target
    /// `reconq::manager`); panics always are. The Python bindings turn this
    /// off: they log exceptions themselves, with their tracebacks.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn log_errors(mut self, on: bool) -> Self {
        self.log_errors = on;
        self
    }

    /// The manager, registered for the status page and with no
    /// controllers yet.
    pub fn build(self) -> Manager {
        Manager {
            inner: Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
                _registration: observe::register(weak.clone()),
                name: self.name,
                registry: Mutex::new(Registry::default()),
                clock: self.clock,
                wrapper: self.wrapper,
                log_errors: self.log_errors,
                leader: self.leader,
            }),
        }
    }
}

impl Default for Manager {
    fn default() -> Self {
        Self::new()
    }
}

impl Manager {
    /// A manager on the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for a manager named other than [`DEFAULT_MANAGER_NAME`],
    /// on another clock (a [`FakeClock`](crate::FakeClock) in tests),
    /// behind a leader election, or with a thread wrapper.
    pub fn builder() -> ManagerBuilder {
        ManagerBuilder {
            name: DEFAULT_MANAGER_NAME.to_owned(),
            clock: Arc::new(SystemClock),
            wrapper: None,
            log_errors: true,
            leader: None,
        }
    }

    /// The manager's name (see [`ManagerBuilder::name`]).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Creates the controller `name` and runs its `do` at once, or, if it
    /// exists, replaces its parameters and runs the new `do` as soon as a run
    /// in progress has finished. Updates that arrive before that run starts
    /// collapse into one run. The replaced `stop` function is dropped unrun.
    /// Counts and errors carry over from the replaced parameters.
    ///
    /// # Panics
    /// If the controller's thread cannot be spawned; see
    /// [`try_update`](Self::try_update).
    pub fn update(&self, name: impl Into<String>, params: ControllerParams) {
        self.try_update(name, params).expect("reconq: failed to spawn a controller thread");
    }

    /// [`update`](Self::update), returning the error if the operating system
    /// refuses a new thread (nothing is changed then).
    pub fn try_update(&self, name: impl Into<String>, mut params: ControllerParams) -> io::Result<()> {
        let name = name.into();
        let mut reg = self.inner.registry.lock();
        while let Some(entry) = reg.controllers.get(&name) {
            let ctl = Arc::clone(&entry.ctl);
            drop(reg);
            // A `remove` between the lookup and here makes the controller
            // refuse the update (found by the shuttle model of update racing
            // remove: the new parameters were silently lost). The name has
            // left the registry by then: look again.
            match ctl.update(params) {
                Ok(()) => return Ok(()),
                Err(refused) => params = refused,
            }
            reg = self.inner.registry.lock();
        }
        let ctl = Ctl::new(
            name.clone(),
            self.inner.name.clone(),
            params,
            Arc::clone(&self.inner.clock),
            self.inner.log_errors,
            self.inner.leader.as_deref(),
        );
        let body = {
            let ctl = Arc::clone(&ctl);
            move || ctl.run()
        };
        let thread_name = format!("reconq-mgr-{}", name.replace('\0', "\u{fffd}"));
        let thread = spawn_named(thread_name, self.inner.wrapper.as_ref(), body)?;
        reg.controllers.insert(name, Entry { ctl, thread });
        Ok(())
    }

    /// Runs the controller's `do` now, or right after a run in progress
    /// (coalescing with other pending triggers and updates).
    pub fn trigger(&self, name: &str) -> Result<(), UnknownController> {
        let ctl = self.ctl(name)?;
        ctl.trigger();
        Ok(())
    }

    /// Removes the controller without waiting: in the background its thread
    /// finishes a run in progress (or runs `do` once if it never ran), runs
    /// `stop` and exits. A new controller of the same name may be created at
    /// once; it does not wait for the old one's thread.
    pub fn remove(&self, name: &str) -> Result<(), UnknownController> {
        let mut reg = self.inner.registry.lock();
        let entry = reg.controllers.remove(name).ok_or_else(|| unknown(name))?;
        entry.ctl.remove();
        reg.retiring.retain(|thread| !thread.is_finished());
        reg.retiring.push(entry.thread);
        Ok(())
    }

    /// Removes the controller and blocks until its thread has finished its
    /// run, run `stop` and exited. Called from the controller's own `do` or
    /// `stop`, it does not wait (that would deadlock).
    pub fn remove_and_wait(&self, name: &str) -> Result<(), UnknownController> {
        let entry = self.inner.registry.lock().controllers.remove(name).ok_or_else(|| unknown(name))?;
        entry.ctl.remove();
        join_all([entry.thread]);
        Ok(())
    }

    /// Removes every controller without waiting (see [`remove`](Self::remove)).
    pub fn remove_all(&self) {
        let mut reg = self.inner.registry.lock();
        let entries = std::mem::take(&mut reg.controllers);
        reg.retiring.retain(|thread| !thread.is_finished());
        for (_, entry) in entries {
            entry.ctl.remove();
            reg.retiring.push(entry.thread);
        }
    }

    /// Removes every controller and blocks until all their threads, and those
    /// of controllers removed earlier without waiting, have exited. The
    /// calling thread, if it is a controller's, is not waited for.
    pub fn remove_all_and_wait(&self) {
        let threads: Vec<JoinHandle<()>> = {
            let mut reg = self.inner.registry.lock();
            let entries = std::mem::take(&mut reg.controllers);
            let mut threads = std::mem::take(&mut reg.retiring);
            for (_, entry) in entries {
                entry.ctl.remove();
                threads.push(entry.thread);
            }
            threads
        };
        join_all(threads);
    }

    /// A snapshot of every controller, sorted by name.
    pub fn status(&self) -> Vec<ControllerStatus> {
        let reg = self.inner.registry.lock();
        reg.controllers.values().map(|entry| entry.ctl.status()).collect()
    }

    /// A snapshot of one controller.
    pub fn controller_status(&self, name: &str) -> Result<ControllerStatus, UnknownController> {
        Ok(self.ctl(name)?.status())
    }

    /// The controllers' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.inner.registry.lock().controllers.keys().cloned().collect()
    }

    /// Whether a controller of this name is registered (and not removed).
    pub fn contains(&self, name: &str) -> bool {
        self.inner.registry.lock().controllers.contains_key(name)
    }

    /// How many controllers there are (removed ones not counted).
    pub fn len(&self) -> usize {
        self.inner.registry.lock().controllers.len()
    }

    /// Whether no controller is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handle that does not keep the manager alive.
    pub fn downgrade(&self) -> WeakManager {
        WeakManager { inner: Arc::downgrade(&self.inner) }
    }

    fn ctl(&self, name: &str) -> Result<Arc<Ctl>, UnknownController> {
        let reg = self.inner.registry.lock();
        reg.controllers.get(name).map(|entry| Arc::clone(&entry.ctl)).ok_or_else(|| unknown(name))
    }
}

impl Observed for Inner {
    /// One entry per named controller. The registry lock is held only to
    /// copy the list; each controller's state lock only to read it.
    fn collect_status(&self, out: &mut Vec<StatusEntry>) {
        let ctls: Vec<Arc<Ctl>> = self.registry.lock().controllers.values().map(|e| Arc::clone(&e.ctl)).collect();
        for ctl in &ctls {
            let s = ctl.status();
            let kind = EntryKind::Periodic(PeriodicDetails {
                manager: self.name.clone(),
                running: s.running,
                leader: self.leader.as_ref().map(|election| election.status()),
                last_duration: s.last_duration,
                next_run_in: s.next_run_in,
            });
            out.push(StatusEntry::new(s.name, kind, health_of!(s)));
        }
    }
}

impl Drop for Inner {
    /// The last handle is gone: remove every controller, detaching threads.
    fn drop(&mut self) {
        for entry in self.registry.get_mut().controllers.values() {
            entry.ctl.remove();
        }
    }
}

impl fmt::Debug for Manager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manager")
            .field("name", &self.inner.name)
            .field("controllers", &self.names())
            .finish_non_exhaustive()
    }
}

fn unknown(name: &str) -> UnknownController {
    UnknownController { name: name.to_owned() }
}

/// Joins `threads`, skipping the calling thread (joining itself would hang).
fn join_all(threads: impl IntoIterator<Item = JoinHandle<()>>) {
    let me = thread::current().id();
    for handle in threads {
        if handle.thread().id() != me {
            // Controller threads catch panics from `do` and `stop`; a panic
            // here could only come from a thread wrapper, and has no owner.
            let _ = handle.join();
        }
    }
}
