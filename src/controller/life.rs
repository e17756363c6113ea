//! A controller's life, in one place: its state (not started, running,
//! stopping, stopped), the threads it waits for, and the hooks features
//! register to hear of a stop, so a new feature subscribes instead of
//! being named in the stop path.
//!
//! Three events, each happening once:
//! * [`Event::Stop`]: the first stop request (store: wake the flusher;
//!   coordination: wake standby workers; watchdog: shut down; triggers:
//!   signal them).
//! * [`Event::Stopped`]: a stop was requested and every worker has exited or
//!   was given up on at a drain's deadline (store: its final flush).
//! * [`Event::WorkersExited`]: a stop was requested and every worker has
//!   really exited, so no reconcile of ours runs any more (coordination:
//!   give up our seat). Never while an abandoned reconcile still runs.
//!
//! Lock order: the state lock is a leaf except that a wait's predicate may
//! take `Core::pending` (`wait_idle` before start). The hook list's lock is
//! a leaf. Hooks run with no lock of this module held, on the thread that
//! made their event happen (or on the registering thread if it already
//! had), in the order registered. Hooks of different events may run on
//! different threads, in either order: each is correct whatever ran before.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::observe::status::RunState;
use crate::sync::{AtomicBool, Condvar, Mutex};
use crate::thread::JoinHandle;

/// Where a controller is in its life; standby is not a phase of its own
/// (it is a running controller whose gate says wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Phase {
    /// Built, or starting: keys enqueued wait in `pending`.
    #[default]
    NotStarted,
    /// Started, and the keys enqueued before start are in the queue.
    Running,
    /// A stop was requested; some worker has not exited.
    Stopping,
    /// A stop was requested and every worker has exited (or was detached at
    /// a drain's deadline).
    Stopped,
}

impl Phase {
    pub(crate) fn stop_requested(self) -> bool {
        matches!(self, Phase::Stopping | Phase::Stopped)
    }

    /// The public name of this phase (`Running` may be shown as standby
    /// by the caller, which knows the gate).
    pub(crate) fn run_state(self) -> RunState {
        match self {
            Phase::NotStarted => RunState::NotStarted,
            Phase::Running => RunState::Running,
            Phase::Stopping => RunState::Stopping,
            Phase::Stopped => RunState::Stopped,
        }
    }
}

/// What a stop's waiters look at.
#[derive(Debug, Default)]
pub(crate) struct Life {
    pub(crate) phase: Phase,
    pub(crate) live_workers: usize,
    pub(crate) live_aux: usize,
    /// A drain's deadline passed with workers still running: the controller
    /// counts as stopped without them.
    pub(crate) abandoned: bool,
}

impl Life {
    /// The events this state has reached.
    fn reached(&self) -> [bool; EVENTS] {
        let stop = self.phase.stop_requested();
        [stop, stop && (self.live_workers == 0 || self.abandoned), stop && self.live_workers == 0]
    }

    /// Stopping becomes stopped once the workers are gone or given up on.
    fn settle(&mut self) {
        if self.phase == Phase::Stopping && (self.live_workers == 0 || self.abandoned) {
            self.phase = Phase::Stopped;
        }
    }
}

/// Something a stop makes happen (see the module's notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Stop = 0,
    Stopped = 1,
    WorkersExited = 2,
}

const EVENTS: usize = 3;
const ALL_EVENTS: [Event; EVENTS] = [Event::Stop, Event::Stopped, Event::WorkersExited];

type Hook = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Hooks {
    /// The event's hooks have been taken to run: later ones run at once.
    fired: [bool; EVENTS],
    waiting: [Vec<Hook>; EVENTS],
}

/// A controller's state, the threads a stop waits for, and its hooks.
pub(crate) struct Lifecycle {
    life: Mutex<Life>,
    changed: Condvar,
    /// Mirrors a stop request for lock-free checks.
    stopping: AtomicBool,
    /// Every in-flight and future reconcile is cancelled (read by each
    /// worker at each hand-out: a plain field, no call).
    pub(crate) cancel_all: AtomicBool,
    hooks: Mutex<Hooks>,
    worker_threads: Mutex<Vec<JoinHandle<()>>>,
    aux_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Dropped at stop, which wakes channel watches blocked in `select!`.
    stop_tx: Mutex<Option<crossbeam_channel::Sender<()>>>,
    stop_rx: crossbeam_channel::Receiver<()>,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        Self {
            life: Mutex::new(Life::default()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            cancel_all: AtomicBool::new(false),
            hooks: Mutex::new(Hooks::default()),
            worker_threads: Mutex::new(Vec::new()),
            aux_threads: Mutex::new(Vec::new()),
            stop_tx: Mutex::new(Some(stop_tx)),
            stop_rx,
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.life.lock().phase
    }

    /// Whether a stop was requested, without a lock.
    #[inline]
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Disconnects at stop (for `select!` in channel watches).
    pub(crate) fn stop_channel(&self) -> crossbeam_channel::Receiver<()> {
        self.stop_rx.clone()
    }

    /// Runs `hook` when `event` happens, or now if it has.
    pub(crate) fn on(&self, event: Event, hook: impl FnOnce() + Send + 'static) {
        let mut hooks = self.hooks.lock();
        if hooks.fired[event as usize] {
            drop(hooks);
            hook();
        } else {
            hooks.waiting[event as usize].push(Box::new(hook));
        }
    }

    /// Changes the state under the lock, wakes the waiters, then runs the
    /// hooks of every event the change reached (outside the lock).
    fn change<T>(&self, change: impl FnOnce(&mut Life) -> T) -> T {
        let (result, reached) = {
            let mut life = self.life.lock();
            let result = change(&mut life);
            life.settle();
            if life.phase.stop_requested() {
                self.stopping.store(true, Ordering::SeqCst);
            }
            self.changed.notify_all();
            (result, life.reached())
        };
        for event in ALL_EVENTS {
            if reached[event as usize] {
                self.fire(event);
            }
        }
        result
    }

    fn fire(&self, event: Event) {
        let hooks = {
            let mut hooks = self.hooks.lock();
            if hooks.fired[event as usize] {
                return;
            }
            hooks.fired[event as usize] = true;
            std::mem::take(&mut hooks.waiting[event as usize])
        };
        for hook in hooks {
            hook();
        }
    }

    /// Marks the stop requested (running the stop's hooks); returns whether
    /// this call did it.
    pub(crate) fn request_stop(&self) -> bool {
        let first = self.change(|life| {
            let first = !life.phase.stop_requested();
            if first {
                life.phase = Phase::Stopping;
            }
            first
        });
        if first {
            self.stop_tx.lock().take();
        }
        first
    }

    /// `workers` are about to be spawned; `Err` (and nothing counted) if a
    /// stop came first.
    pub(crate) fn workers_starting(&self, workers: usize) -> Result<(), ()> {
        self.change(|life| {
            if life.phase.stop_requested() {
                return Err(());
            }
            life.live_workers = workers;
            Ok(())
        })
    }

    /// The keys enqueued before start are in the queue: running, unless a
    /// stop came meanwhile.
    pub(crate) fn started(&self) {
        self.change(|life| {
            if life.phase == Phase::NotStarted {
                life.phase = Phase::Running;
            }
        });
    }

    /// `n` counted workers will never run (their spawn failed) or have
    /// exited.
    pub(crate) fn workers_gone(&self, n: usize) {
        self.change(|life| life.live_workers -= n);
    }

    /// A drain's deadline passed with workers running: stopped without them.
    pub(crate) fn abandon(&self) {
        self.change(|life| life.abandoned = true);
    }

    /// An auxiliary thread (trigger, watch, watchdog, flusher) exited.
    pub(crate) fn aux_gone(&self) {
        self.change(|life| life.live_aux -= 1);
    }

    /// Counts the auxiliary thread `spawn` makes in `live_aux` until it
    /// reports its exit ([`aux_gone`](Self::aux_gone)), and keeps its handle
    /// to be joined; nothing is counted if the spawn fails.
    pub(crate) fn spawn_aux(&self, spawn: impl FnOnce() -> io::Result<JoinHandle<()>>) -> io::Result<()> {
        self.change(|life| life.live_aux += 1);
        let mut threads = self.aux_threads.lock();
        threads.retain(|t| !t.is_finished());
        match spawn() {
            Ok(thread) => {
                threads.push(thread);
                Ok(())
            }
            Err(e) => {
                drop(threads);
                self.aux_gone();
                Err(e)
            }
        }
    }

    /// Reads the state under its lock.
    pub(crate) fn read<T>(&self, read: impl FnOnce(&Life) -> T) -> T {
        read(&self.life.lock())
    }

    /// Blocks until `done` holds or `deadline` (`None`: no limit) passes;
    /// returns whether it holds.
    pub(crate) fn wait_until(&self, deadline: Option<Instant>, mut done: impl FnMut(&Life) -> bool) -> bool {
        let mut life = self.life.lock();
        while !done(&life) {
            match deadline {
                Some(deadline) => {
                    if self.changed.wait_until(&mut life, deadline).timed_out() {
                        return done(&life);
                    }
                }
                None => self.changed.wait(&mut life),
            }
        }
        true
    }

    /// Keeps a worker thread's handle, to be joined once it has exited.
    pub(crate) fn keep_worker(&self, thread: JoinHandle<()>) {
        self.worker_threads.lock().push(thread);
    }

    /// Joins the worker threads; call only once they have all exited.
    pub(crate) fn join_workers(&self) {
        join_all(&self.worker_threads);
    }

    /// Joins the auxiliary threads; call only once they have all exited.
    pub(crate) fn join_aux(&self) {
        join_all(&self.aux_threads);
    }

    /// Waits until `deadline` for a stopped controller's threads (workers,
    /// triggers, watches, watchdog) to exit, and joins them; returns whether
    /// all had. False while the controller runs.
    pub(crate) fn join(&self, deadline: Instant) -> bool {
        let all_exited = self.wait_until(Some(deadline), |life| {
            life.phase.stop_requested() && life.live_workers == 0 && life.live_aux == 0
        });
        if all_exited {
            self.join_workers();
            self.join_aux();
        }
        all_exited
    }
}

fn join_all(threads: &Mutex<Vec<JoinHandle<()>>>) {
    let threads = std::mem::take(&mut *threads.lock());
    for thread in threads {
        let _ = thread.join();
    }
}
