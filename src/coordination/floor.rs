//! The fencing floor (guarantees §10 L2, §11 H4): fencing tokens are
//! etcd's create revisions, which restart near 1 when etcd's history is
//! reset (its data wiped, or restored from an older snapshot). So a token
//! is `floor + create revision`, where the floor is a number kept in etcd
//! under [`FLOOR_KEY`] (absent: 0), read in the same transaction that
//! creates the key. The floor only ever rises, so tokens of one history
//! still strictly increase; a process that sees the history reset raises
//! it to the highest token it could have seen in the old one, so tokens of
//! the new history exceed those. An operator who resets etcd with no
//! replica alive to see it sets the floor by hand (docs/guarantees.md).

use crate::etcd::{EtcdClient, EtcdError, KeyValue, Reset};

/// The key that holds the floor: one for every group on the cluster, so
/// an operator sets one number after a reset. A decimal number.
pub(super) const FLOOR_KEY: &str = "/reconq/fencing-floor";

/// The floor `kv` (the floor key as read, if it exists) holds.
fn floor_of(kv: Option<&KeyValue>) -> Result<u64, EtcdError> {
    let Some(kv) = kv else { return Ok(0) };
    let text = String::from_utf8_lossy(&kv.value);
    text.trim().parse().map_err(|_| EtcdError::invalid(format!("{FLOOR_KEY} holds {text:?}, not a whole number")))
}

/// The floor `kv` holds, read in a reply at `revision`, taken in against
/// `seen`, the highest floor this process read before (raised to it).
/// The floor only rises within one history, so a floor below `seen` (or
/// none) went with a reset of etcd's history: that is a reset (pending in
/// `client` from now on), even when no reply's revision gave it away (the
/// new history had passed every revision this process saw). Otherwise a
/// process that saw no revision go back would campaign under a floor of
/// 0, below tokens of the old history.
pub(super) fn note(
    client: &EtcdClient,
    seen: &mut u64,
    kv: Option<&KeyValue>,
    revision: i64,
) -> Result<u64, EtcdError> {
    let floor = floor_of(kv)?;
    if floor < *seen {
        let why = format!("{FLOOR_KEY} holds {floor}, below the {seen} read before");
        return Err(client.found_reset(revision, &why));
    }
    *seen = floor;
    Ok(floor)
}

/// The fencing token of a key created at `create_revision` under `floor`.
pub(super) fn token(floor: u64, create_revision: i64) -> u64 {
    floor.saturating_add(create_revision.max(0) as u64)
}

/// The floor that puts the tokens of the new history above every token of
/// the one that was `reset`, as far as this process saw it (`floor`: the
/// highest floor it read there): every token of the old history was at
/// most its floor plus its highest revision.
fn floor_after(reset: Reset, floor: u64) -> u64 {
    token(floor, reset.highest_revision)
}

/// Raises the floor in etcd to at least `at_least` (never lowers it);
/// returns the floor it holds now.
pub(super) fn raise(client: &EtcdClient, at_least: u64) -> Result<u64, EtcdError> {
    loop {
        let kv = client.get(FLOOR_KEY)?;
        let floor = floor_of(kv.as_ref())?;
        if floor >= at_least {
            return Ok(floor);
        }
        let changed = kv.map_or(0, |kv| kv.mod_revision);
        if client.put_if_unchanged(FLOOR_KEY, at_least.to_string().as_bytes(), changed)? {
            return Ok(at_least);
        }
    }
}

/// After `reset` (seen with `floor` the highest floor read before it):
/// `report`s it (the message and the floor it is raising to), accepts it,
/// and raises the floor past every token of the old history, calling
/// `failed` (which waits, and says whether to give up) after each failure.
/// Returns the floor etcd holds, or `None` if it gave up.
pub(super) fn recover(
    client: &EtcdClient,
    reset: Reset,
    floor: u64,
    report: impl FnOnce(String, u64),
    mut failed: impl FnMut(&EtcdError) -> bool,
) -> Option<u64> {
    let mut at_least = floor_after(reset, floor);
    report(EtcdError::from(reset).to_string(), at_least);
    client.accept_reset();
    loop {
        match raise(client, at_least) {
            Ok(floor) => return Some(floor),
            // Reset again meanwhile: the tokens of the history in between,
            // if any, were at most its highest revision above this floor.
            Err(e) if e.reset().is_some() => {
                client.accept_reset();
                at_least = e.reset().map_or(at_least, |again| floor_after(again, at_least));
            }
            Err(e) => {
                if failed(&e) {
                    return None;
                }
            }
        }
    }
}
