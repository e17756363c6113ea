//! The global set of live observed objects.
//!
//! Objects register a `Weak` reference, so the registry never keeps anything
//! alive: a queue or controller dropped by its owner simply stops being
//! reported. Dead entries are pruned on every visit and whenever the list has
//! doubled since the last prune, so creating and dropping thousands of
//! controllers leaves the registry small.
//!
//! The lock is held only to copy the list out (never while calling into an
//! observed object), so observers can never deadlock with the engine, and a
//! `fork()` can only catch it held for a few instructions.
//!
//! After a `fork()`, the child forgets the parent's objects the first time
//! it takes the lock: their threads exist only in the parent, and a lock of
//! theirs held at the fork would stay held in the child forever. If the
//! registry's own lock was held at the fork, [`after_fork_in_child`] (called
//! by the Python bindings' at-fork hook) swaps in a fresh registry.

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, MutexGuard};

use super::status::StatusEntry;

use super::metrics::MetricFamilies;

/// Something that contributes to metrics and status.
pub(crate) trait Observed: Send + Sync {
    /// Appends this object's rows to the global status
    /// ([`status::snapshot`](super::status::snapshot)). Called with no
    /// registry lock held; must not call user code under its own locks.
    fn collect_status(&self, _out: &mut Vec<StatusEntry>) {}
    /// Adds this object's current metrics to `out`. Called at scrape time,
    /// with the registry unlocked.
    fn collect_metrics(&self, _out: &mut MetricFamilies) {}
    /// Adds a line to `out` for each thread of this object that died while
    /// it should run ([`probes::liveness_problems`](super::probes::liveness_problems)).
    fn check_live(&self, _out: &mut Vec<String>) {}
    /// Adds a line to `out` for each reason this object is not ready
    /// ([`probes::readiness_problems`](super::probes::readiness_problems)).
    /// By default, what its status rows say (see
    /// [`StatusEntry::not_ready`]); a component with more to wait for
    /// than its rows show says so here.
    fn check_ready(&self, out: &mut Vec<String>) {
        let mut entries = Vec::new();
        self.collect_status(&mut entries);
        out.extend(entries.iter().filter_map(StatusEntry::not_ready));
    }
}

struct Registry {
    entries: Vec<Weak<dyn Observed>>,
    /// Length right after the last prune.
    pruned_len: usize,
    /// The process the entries were registered in (0: none yet).
    pid: u32,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { entries: Vec::new(), pruned_len: 0, pid: 0 });

/// Replaces [`REGISTRY`] in a child forked while its lock was held (leaked,
/// never freed, so references to it stay valid).
static REPLACEMENT: AtomicPtr<Mutex<Registry>> = AtomicPtr::new(ptr::null_mut());

fn registry_lock() -> &'static Mutex<Registry> {
    let replacement = REPLACEMENT.load(Ordering::Acquire);
    if replacement.is_null() {
        &REGISTRY
    } else {
        // SAFETY: a published replacement is leaked, so it lives forever.
        unsafe { &*replacement }
    }
}

/// The locked registry, holding only this process's objects.
fn lock() -> MutexGuard<'static, Registry> {
    let mut registry = registry_lock().lock();
    let pid = std::process::id();
    if registry.pid != pid {
        // Forked: the parent's objects are not ours to report.
        registry.entries.clear();
        registry.pruned_len = 0;
        registry.pid = pid;
    }
    registry
}

/// Call in a child process right after `fork()`, while it has one thread: if
/// another thread of the parent held the registry's lock at the fork, starts
/// a fresh registry (the old one is leaked, never touched again).
#[cfg_attr(not(feature = "python"), allow(dead_code))]
pub(crate) fn after_fork_in_child() {
    if registry_lock().try_lock().is_none() {
        let fresh = Box::leak(Box::new(Mutex::new(Registry { entries: Vec::new(), pruned_len: 0, pid: 0 })));
        REPLACEMENT.store(fresh, Ordering::Release);
    }
}

/// Keeps an object registered; dropping it unregisters the object eagerly
/// (otherwise the dead `Weak` is pruned later).
pub(crate) struct Registration {
    target: Weak<dyn Observed>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registry = lock();
        registry.entries.retain(|entry| !Weak::ptr_eq(entry, &self.target));
        registry.pruned_len = registry.entries.len();
    }
}

/// Registers `object` until the returned [`Registration`] is dropped or the
/// object is.
pub(crate) fn register(object: Weak<dyn Observed>) -> Registration {
    let mut registry = lock();
    if registry.entries.len() >= 2 * registry.pruned_len.max(8) {
        registry.entries.retain(|entry| entry.strong_count() > 0);
        registry.pruned_len = registry.entries.len();
    }
    registry.entries.push(Weak::clone(&object));
    Registration { target: object }
}

/// Calls `f` on every live registered object, in registration order, with
/// the registry unlocked.
pub(crate) fn visit(mut f: impl FnMut(&dyn Observed)) {
    let live: Vec<Arc<dyn Observed>> = {
        let mut registry = lock();
        registry.entries.retain(|entry| entry.strong_count() > 0);
        registry.pruned_len = registry.entries.len();
        registry.entries.iter().filter_map(Weak::upgrade).collect()
    };
    for object in &live {
        f(&**object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Probe;
    impl Observed for Probe {}

    /// The registry is global: these tests count its entries, so they must
    /// not run at the same time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn count_probes() -> usize {
        let mut n = 0;
        visit(|_| n += 1);
        n
    }

    #[test]
    fn registration_follows_the_object_and_the_guard() {
        let _serial = SERIAL.lock();
        let before = count_probes();
        let a: Arc<dyn Observed> = Arc::new(Probe);
        let b: Arc<dyn Observed> = Arc::new(Probe);
        let reg_a = register(Arc::downgrade(&a));
        let _reg_b = register(Arc::downgrade(&b));
        assert_eq!(count_probes(), before + 2);
        drop(reg_a);
        assert_eq!(count_probes(), before + 1, "dropping the registration unregisters");
        drop(b);
        assert_eq!(count_probes(), before, "a dropped object is not visited");
        drop(a);
    }

    #[test]
    fn churn_does_not_grow_the_registry() {
        let _serial = SERIAL.lock();
        for _ in 0..10_000 {
            let probe: Arc<dyn Observed> = Arc::new(Probe);
            let registration = register(Arc::downgrade(&probe));
            std::mem::forget(registration); // only the Weak's death unregisters
        }
        let len = lock().entries.len();
        assert!(len < 1_000, "dead entries were not pruned: {len}");
    }
}
