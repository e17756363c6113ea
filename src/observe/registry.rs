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

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::metrics::MetricFamilies;

/// Something that contributes to metrics and status.
pub(crate) trait Observed: Send + Sync {
    /// Adds this object's current metrics to `out`. Called at scrape time,
    /// with the registry unlocked.
    fn collect_metrics(&self, _out: &mut MetricFamilies) {}
}

struct Registry {
    entries: Vec<Weak<dyn Observed>>,
    /// Length right after the last prune.
    pruned_len: usize,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { entries: Vec::new(), pruned_len: 0 });

/// Keeps an object registered; dropping it unregisters the object eagerly
/// (otherwise the dead `Weak` is pruned later).
pub(crate) struct Registration {
    target: Weak<dyn Observed>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut registry = REGISTRY.lock();
        registry.entries.retain(|entry| !Weak::ptr_eq(entry, &self.target));
        registry.pruned_len = registry.entries.len();
    }
}

/// Registers `object` until the returned [`Registration`] is dropped or the
/// object is.
pub(crate) fn register(object: Weak<dyn Observed>) -> Registration {
    let mut registry = REGISTRY.lock();
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
        let mut registry = REGISTRY.lock();
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
        let len = REGISTRY.lock().entries.len();
        assert!(len < 1_000, "dead entries were not pruned: {len}");
    }
}
