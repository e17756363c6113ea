//! When a container that grew for a burst gives its memory back: the one
//! rule the queue's slab, key index and ready FIFOs, the rate limiters'
//! failure counts and the controller's per-key memory share.

/// Containers this small keep their memory. Unit tests use a low bound, so
/// the code that shrinks (and, for the slab, renumbers) runs in them.
const KEEP_UP_TO: usize = if cfg!(test) { 16 } else { 1024 };

/// Whether a container holding `len` items in room for `capacity` should
/// shrink: it is large and at most an eighth full. Shrinking to about
/// `2 * len` then leaves room to grow fourfold before the rule holds again,
/// so a container that stays near one size never shrinks and regrows in
/// turn.
#[inline]
pub(crate) fn is_sparse(len: usize, capacity: usize) -> bool {
    capacity > KEEP_UP_TO && len * 8 < capacity
}
