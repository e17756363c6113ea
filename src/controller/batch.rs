//! Batches (guarantees §15, U3): while any is open, no key that becomes
//! ready is handed out; when the last one closes, they are scheduled
//! together, ancestors first (D1).
//!
//! The queue holds the keys (its dependencies' holds, turned on by the
//! first batch), rather than the gate: a gate's `Wait` would stop keys
//! that were ready before the batch too, and every controller would pay
//! for asking it. A controller that never batches pays nothing.

use std::sync::Arc;

use super::core::{ControllerKey, Core, Runtime};

/// Open batches (their number), kept from before start.
pub(crate) type OpenBatches = crate::sync::Mutex<usize>;

/// An open batch: dropping it closes it (see
/// [`ControllerHandle::batch`](super::ControllerHandle::batch)).
#[must_use = "the batch closes when this guard is dropped"]
pub struct Batch<K: ControllerKey> {
    core: Arc<Core<K>>,
    open: Arc<OpenBatches>,
}

impl<K: ControllerKey> Drop for Batch<K> {
    fn drop(&mut self) {
        self.core.close_batch(&self.open);
    }
}

impl<K: ControllerKey> std::fmt::Debug for Batch<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("controller", &self.core.name).finish()
    }
}

impl<K: ControllerKey> Core<K> {
    /// Opens a batch (counted in `batches`); the queue holds keys from the
    /// first one on.
    pub(crate) fn open_batch(self: &Arc<Self>, batches: &Arc<OpenBatches>) -> Batch<K> {
        let mut open = batches.lock();
        *open += 1;
        if *open == 1
            && let Some(rt) = self.rt.get()
        {
            rt.queue.open_batch(|| self.cancel_hook());
        }
        Batch { core: Arc::clone(self), open: Arc::clone(batches) }
    }

    /// Closes a batch; the last one out lets the queue schedule its keys.
    fn close_batch(&self, batches: &OpenBatches) {
        let mut open = batches.lock();
        *open -= 1;
        if *open == 0
            && let Some(rt) = self.rt.get()
        {
            rt.queue.close_batch();
        }
    }

    /// At start, before the runtime is visible: a batch opened before
    /// start holds the queue from its first key. The caller keeps
    /// `open` locked until the runtime is set.
    pub(crate) fn install_batch(self: &Arc<Self>, open: &usize, rt: &Runtime<K>) {
        if *open > 0 {
            rt.queue.open_batch(|| self.cancel_hook());
        }
    }
}
