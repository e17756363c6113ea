//! The ready set: which ready key is handed out next (G4, guarantees §8 P1–P5).
//!
//! [`QueueState`](super::state::QueueState) decides *whether* a key is ready
//! (its slot); this module decides *in which order* ready keys leave. The
//! interface is four calls: [`push`](ReadySet::push) a key that became
//! ready, [`raise`](ReadySet::raise) the priority of one already in,
//! [`pop`](ReadySet::pop) the next one, and [`finished`](ReadySet::finished)
//! when a handed-out key of a group is done (for the per-group limit).
//!
//! * **Levels.** Keys wait in one level per priority, highest handed out
//!   first. Priority 0 has its own field; a queue whose keys all have
//!   priority 0 (every queue that never uses priorities) pops it directly:
//!   one `is_empty` check on the map of other levels, then a plain FIFO pop.
//! * **Raises leave stale entries.** Raising a key pushes it at its new level
//!   and counts the entry left at the old one in `stale`; a pop that meets a
//!   counted entry drops it. A key's stale entries at a level are always older
//!   than its live one there (it can only be ready at that level again after
//!   it left the set), so the oldest entries are the stale ones. No queue
//!   that never raises pays more than an `is_empty` check for this.
//! * **Fair levels** (a queue built with groups): each level keeps one FIFO
//!   per group and a ring of the groups that have keys, served round-robin
//!   (P4). A group at its in-flight limit (P5) is taken out of the ring of
//!   every level where it is met and recorded in `Groups::blocked`; when one
//!   of its keys finishes, it goes back into those rings. Its keys wait
//!   without a worker: [`available`](ReadySet::available) does not count
//!   them, so no getter is woken for them.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;

use super::slab::FREED;
use crate::shrink::is_sparse;

type Hasher = foldhash::fast::RandomState;

/// Stale entries per (key, level, group). The group is part of it because a
/// key can come back in another group (the group function is asked again
/// when it re-enters the queue), into another FIFO of the same level.
type Stale<K> = HashMap<(K, Priority, GroupId), u32, Hasher>;

/// A key's priority: higher is handed out first.
pub type Priority = i32;

/// A group, as the queue sees it: an id the controller interned. Queues
/// without groups put every key in group 0.
pub(crate) type GroupId = u32;

pub(crate) struct ReadySet<K> {
    /// Priority 0: the only level of a queue that never uses priorities.
    zero: Level<K>,
    /// Every other priority with live keys.
    others: BTreeMap<Priority, Level<K>>,
    /// Live keys (not counting stale entries).
    live: usize,
    /// Entries left behind by raises.
    stale: Stale<K>,
    /// In-flight counts and blocked groups, for a fair set.
    groups: Option<Groups>,
}

/// One FIFO: a whole level of a plain set, one group's keys in a fair one.
struct Fifo<K> {
    keys: VecDeque<K>,
    /// Entries that are not stale.
    live: usize,
}

enum Level<K> {
    Plain(Fifo<K>),
    Fair(FairLevel<K>),
}

struct FairLevel<K> {
    fifos: HashMap<GroupId, GroupFifo<K>, Hasher>,
    /// Groups served in turn; each group with live keys here is either in
    /// the ring (`in_ring`) or blocked (`blocked`), never both.
    ring: VecDeque<GroupId>,
    live: usize,
}

struct GroupFifo<K> {
    fifo: Fifo<K>,
    in_ring: bool,
    blocked: bool,
}

/// What a fair set knows about groups across levels.
struct Groups {
    /// At most this many keys of one group in flight (`usize::MAX`: no limit).
    limit: usize,
    in_flight: HashMap<GroupId, usize, Hasher>,
    /// Full groups, and the levels where their keys wait.
    blocked: HashMap<GroupId, Vec<Priority>, Hasher>,
    /// Live keys in blocked group FIFOs.
    blocked_keys: usize,
}

impl Groups {
    fn is_full(&self, group: GroupId) -> bool {
        self.in_flight.get(&group).is_some_and(|&n| n >= self.limit)
    }
}

impl<K> Fifo<K> {
    fn new() -> Self {
        Self { keys: VecDeque::new(), live: 0 }
    }

    #[inline]
    fn push(&mut self, key: K) {
        self.keys.push_back(key);
        self.live += 1;
    }

    /// Puts `key` right after the last entry `earlier` says goes first
    /// (scanning from the back: a key released soon after it became
    /// ready meets few entries).
    fn insert_by(&mut self, key: K, earlier: impl Fn(&K) -> bool) {
        // Most often the last entry goes first (D2's children are released
        // right after they became ready): a push.
        if self.keys.back().is_none_or(&earlier) {
            return self.push(key);
        }
        let at = self.keys.iter().rposition(earlier).map_or(0, |i| i + 1);
        self.keys.insert(at, key);
        self.live += 1;
    }
}

impl<K: Eq + Hash + Clone> Fifo<K> {
    /// The oldest live key, dropping the stale entries before it.
    #[inline]
    fn pop(&mut self, prio: Priority, group: GroupId, stale: &mut Stale<K>) -> Option<K> {
        while let Some(key) = self.keys.pop_front() {
            if !stale.is_empty() && take_stale(stale, key.clone(), prio, group) {
                continue;
            }
            self.live -= 1;
            if is_sparse(self.keys.len(), self.keys.capacity()) {
                self.keys.shrink_to(self.keys.len() * 2);
            }
            return Some(key);
        }
        None
    }

    /// Forgets the stale entries of a FIFO with no live key left.
    fn retire(&mut self, prio: Priority, group: GroupId, stale: &mut Stale<K>) {
        debug_assert_eq!(self.live, 0);
        for key in self.keys.drain(..) {
            take_stale(stale, key, prio, group);
        }
        self.keys.shrink_to_fit();
    }
}

/// Whether `(key, prio)` had a stale entry (and counts one fewer).
fn take_stale<K: Eq + Hash>(stale: &mut Stale<K>, key: K, prio: Priority, group: GroupId) -> bool {
    match stale.entry((key, prio, group)) {
        Entry::Occupied(mut n) => {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
            true
        }
        Entry::Vacant(_) => false,
    }
}

impl<K: Eq + Hash + Clone> Level<K> {
    fn new(fair: bool) -> Self {
        if fair {
            Level::Fair(FairLevel { fifos: HashMap::default(), ring: VecDeque::new(), live: 0 })
        } else {
            Level::Plain(Fifo::new())
        }
    }

    fn live(&self) -> usize {
        match self {
            Level::Plain(fifo) => fifo.live,
            Level::Fair(fair) => fair.live,
        }
    }

    #[inline]
    fn push(&mut self, key: K, prio: Priority, group: GroupId, groups: &mut Option<Groups>) {
        self.put(key, prio, group, groups, Fifo::push);
    }

    /// Adds a key as [`push`](Self::push) does, `place` putting it in its
    /// FIFO.
    #[inline]
    fn put(
        &mut self,
        key: K,
        prio: Priority,
        group: GroupId,
        groups: &mut Option<Groups>,
        place: impl FnOnce(&mut Fifo<K>, K),
    ) {
        match self {
            Level::Plain(fifo) => place(fifo, key),
            Level::Fair(fair) => {
                let groups = groups.as_mut().expect("a fair level belongs to a fair set");
                fair.live += 1;
                let gf = fair.fifos.entry(group).or_insert_with(|| GroupFifo {
                    fifo: Fifo::new(),
                    in_ring: false,
                    blocked: false,
                });
                place(&mut gf.fifo, key);
                if gf.blocked {
                    groups.blocked_keys += 1;
                } else if !gf.in_ring {
                    if groups.is_full(group) {
                        gf.blocked = true;
                        groups.blocked_keys += gf.fifo.live;
                        groups.blocked.entry(group).or_default().push(prio);
                    } else {
                        gf.in_ring = true;
                        fair.ring.push_back(group);
                    }
                }
            }
        }
    }

    /// Un-counts a live key that was raised out of this level (its entry
    /// stays, counted stale by the caller).
    fn unlive(&mut self, group: GroupId, groups: &mut Option<Groups>) {
        match self {
            Level::Plain(fifo) => fifo.live -= 1,
            Level::Fair(fair) => {
                fair.live -= 1;
                let gf = fair.fifos.get_mut(&group).expect("a live key has its group's FIFO");
                gf.fifo.live -= 1;
                if gf.blocked {
                    groups.as_mut().expect("fair").blocked_keys -= 1;
                }
            }
        }
    }

    fn pop(&mut self, prio: Priority, stale: &mut Stale<K>, groups: &mut Option<Groups>) -> Option<(K, GroupId)> {
        match self {
            Level::Plain(fifo) => fifo.pop(prio, 0, stale).map(|key| (key, 0)),
            Level::Fair(fair) => {
                let groups = groups.as_mut().expect("a fair level belongs to a fair set");
                while let Some(group) = fair.ring.pop_front() {
                    let Entry::Occupied(mut entry) = fair.fifos.entry(group) else {
                        unreachable!("a group in the ring has a FIFO")
                    };
                    let gf = entry.get_mut();
                    gf.in_ring = false;
                    if gf.fifo.live == 0 {
                        // Its keys were raised away.
                        entry.remove().fifo.retire(prio, group, stale);
                        continue;
                    }
                    if groups.is_full(group) {
                        gf.blocked = true;
                        groups.blocked_keys += gf.fifo.live;
                        groups.blocked.entry(group).or_default().push(prio);
                        continue;
                    }
                    let key = gf.fifo.pop(prio, group, stale).expect("live > 0");
                    fair.live -= 1;
                    if gf.fifo.live > 0 {
                        gf.in_ring = true;
                        fair.ring.push_back(group);
                    } else {
                        entry.remove().fifo.retire(prio, group, stale);
                    }
                    return Some((key, group));
                }
                None
            }
        }
    }

    /// Puts `group` back in the ring after it got room (P5).
    fn unblock(&mut self, group: GroupId, prio: Priority, stale: &mut Stale<K>) -> usize {
        let Level::Fair(fair) = self else { return 0 };
        let Entry::Occupied(mut entry) = fair.fifos.entry(group) else { return 0 };
        let gf = entry.get_mut();
        if !gf.blocked {
            return 0;
        }
        gf.blocked = false;
        let live = gf.fifo.live;
        if live == 0 {
            entry.remove().fifo.retire(prio, group, stale);
        } else {
            gf.in_ring = true;
            fair.ring.push_back(group);
        }
        live
    }

    /// Whether a pop here can give a key.
    fn can_pop(&self) -> bool {
        match self {
            Level::Plain(fifo) => fifo.live > 0,
            Level::Fair(fair) => !fair.ring.is_empty(),
        }
    }

    /// Every live key, emptying the level.
    fn drain_into(&mut self, prio: Priority, stale: &mut Stale<K>, out: &mut Vec<K>) {
        let mut take = |fifo: &mut Fifo<K>, group: GroupId| {
            while let Some(key) = fifo.pop(prio, group, stale) {
                out.push(key);
            }
            fifo.retire(prio, group, stale);
        };
        match self {
            Level::Plain(fifo) => take(fifo, 0),
            Level::Fair(fair) => {
                for (group, gf) in &mut fair.fifos {
                    take(&mut gf.fifo, *group);
                }
                fair.fifos = HashMap::default();
                fair.ring = VecDeque::new();
                fair.live = 0;
            }
        }
    }

    /// Forgets the stale entries of a level with no live key left.
    fn retire_all(&mut self, prio: Priority, stale: &mut Stale<K>) {
        let mut sink = Vec::new();
        self.drain_into(prio, stale, &mut sink);
        debug_assert!(sink.is_empty(), "only empty levels are retired");
    }
}

impl<K: Eq + Hash + Clone> ReadySet<K> {
    /// A set without groups: every level is one FIFO.
    pub(crate) fn new() -> Self {
        Self { zero: Level::new(false), others: BTreeMap::new(), live: 0, stale: HashMap::default(), groups: None }
    }

    /// A set that serves groups round-robin, with at most `limit` keys of
    /// one group in flight (`None`: no limit).
    pub(crate) fn fair(limit: Option<usize>) -> Self {
        Self {
            zero: Level::new(true),
            others: BTreeMap::new(),
            live: 0,
            stale: HashMap::default(),
            groups: Some(Groups {
                limit: limit.unwrap_or(usize::MAX),
                in_flight: HashMap::default(),
                blocked: HashMap::default(),
                blocked_keys: 0,
            }),
        }
    }

    /// A key became ready with priority `prio` in `group`.
    #[inline]
    pub(crate) fn push(&mut self, key: K, prio: Priority, group: GroupId) {
        self.live += 1;
        if prio == 0 {
            // The common case, kept inline: a plain FIFO at priority 0.
            if let Level::Plain(fifo) = &mut self.zero {
                return fifo.push(key);
            }
            return self.zero.push(key, 0, group, &mut self.groups);
        }
        let fair = self.groups.is_some();
        let level = self.others.entry(prio).or_insert_with(|| Level::new(fair));
        level.push(key, prio, group, &mut self.groups);
    }

    /// A key became ready with priority `prio` in `group`, at the place
    /// `earlier` gives it: right after the last entry of its FIFO that
    /// `earlier` says goes first (a key its dependencies held, released
    /// at its place by the time it became ready).
    pub(crate) fn insert_by(&mut self, key: K, prio: Priority, group: GroupId, earlier: impl Fn(&K) -> bool) {
        self.live += 1;
        let fair = self.groups.is_some();
        let level =
            if prio == 0 { &mut self.zero } else { self.others.entry(prio).or_insert_with(|| Level::new(fair)) };
        level.put(key, prio, group, &mut self.groups, |fifo, key| fifo.insert_by(key, earlier));
    }

    /// A ready key at priority `from` now has the higher priority `to` (P2).
    pub(crate) fn raise(&mut self, key: K, from: Priority, to: Priority, group: GroupId) {
        debug_assert!(to > from);
        self.remove(key.clone(), from, group);
        self.push(key, to, group);
    }

    /// Takes a ready key out (its entry stays, counted stale): a raise, or
    /// a key its dependencies now hold (`crate::graph`).
    pub(crate) fn remove(&mut self, key: K, prio: Priority, group: GroupId) {
        let level = if prio == 0 { &mut self.zero } else { self.others.get_mut(&prio).expect("a ready key's level") };
        level.unlive(group, &mut self.groups);
        *self.stale.entry((key, prio, group)).or_insert(0) += 1;
        self.retire_if_empty(prio);
        self.live -= 1;
    }

    /// Hands out the next key: highest priority first, FIFO within one
    /// (round-robin across groups in a fair set), skipping full groups.
    /// Returns the key, its priority and its group.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(K, Priority, GroupId)> {
        if self.others.is_empty() && self.groups.is_none() {
            // The fast path: a plain FIFO.
            let Level::Plain(fifo) = &mut self.zero else { unreachable!("a set without groups has plain levels") };
            let key = fifo.pop(0, 0, &mut self.stale)?;
            self.live -= 1;
            return Some((key, 0, 0));
        }
        self.pop_slow()
    }

    /// The entry the fast path of [`pop`](Self::pop) meets `n`-th from now
    /// (0: next; it may be stale), if the set is a plain FIFO; `None`
    /// otherwise. A hint for prefetching only.
    #[inline]
    pub(crate) fn peek(&self, n: usize) -> Option<K>
    where
        K: Copy,
    {
        match &self.zero {
            Level::Plain(fifo) if self.others.is_empty() => fifo.keys.get(n).copied(),
            _ => None,
        }
    }

    fn pop_slow(&mut self) -> Option<(K, Priority, GroupId)> {
        let mut below: Option<Priority> = None;
        loop {
            let higher = match below {
                Some(b) => self.others.range(..b).next_back().map(|(p, _)| *p),
                None => self.others.last_key_value().map(|(p, _)| *p),
            };
            let zero_next = below.is_none_or(|b| b > 0) && self.zero.can_pop();
            let prio = match higher {
                Some(p) if p > 0 || !zero_next => p,
                _ if zero_next => 0,
                _ => return None,
            };
            below = Some(prio);
            let level = if prio == 0 { &mut self.zero } else { self.others.get_mut(&prio).expect("listed") };
            if !level.can_pop() {
                continue;
            }
            if let Some((key, group)) = level.pop(prio, &mut self.stale, &mut self.groups) {
                self.live -= 1;
                self.retire_if_empty(prio);
                if let Some(groups) = &mut self.groups {
                    *groups.in_flight.entry(group).or_insert(0) += 1;
                }
                return Some((key, prio, group));
            }
            self.retire_if_empty(prio);
        }
    }

    /// A key of `group` handed out by [`pop`](Self::pop) is done: the group
    /// has room again if it was full.
    #[inline]
    pub(crate) fn finished(&mut self, group: GroupId) {
        if self.groups.is_some() {
            self.finished_in_group(group);
        }
    }

    fn finished_in_group(&mut self, group: GroupId) {
        let Some(groups) = &mut self.groups else { return };
        let Entry::Occupied(mut n) = groups.in_flight.entry(group) else { return };
        let was_full = *n.get() >= groups.limit;
        *n.get_mut() -= 1;
        if *n.get() == 0 {
            n.remove();
        }
        if !was_full {
            return;
        }
        let Some(levels) = groups.blocked.remove(&group) else { return };
        for prio in levels {
            let level = if prio == 0 { Some(&mut self.zero) } else { self.others.get_mut(&prio) };
            if let Some(level) = level {
                let unblocked = level.unblock(group, prio, &mut self.stale);
                self.groups.as_mut().expect("fair").blocked_keys -= unblocked;
                self.retire_if_empty(prio);
            }
        }
    }

    /// Drops a level other than 0 once it has no live key.
    fn retire_if_empty(&mut self, prio: Priority) {
        if prio == 0 {
            if self.zero.live() == 0 && !self.stale.is_empty() {
                self.zero.retire_all(0, &mut self.stale);
            }
            return;
        }
        if let Some(level) = self.others.get_mut(&prio)
            && level.live() == 0
        {
            level.retire_all(prio, &mut self.stale);
            self.others.remove(&prio);
        }
    }

    /// Ready keys.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Ready keys a getter could take now: not those of a group known to be
    /// full.
    pub(crate) fn available(&self) -> usize {
        self.live - self.groups.as_ref().map_or(0, |g| g.blocked_keys)
    }

    pub(crate) fn has_groups(&self) -> bool {
        self.groups.is_some()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every ready key, emptying the set (in-flight counts stay: those keys
    /// are still processing).
    pub(crate) fn drain(&mut self) -> Vec<K> {
        let mut out = Vec::with_capacity(self.live);
        self.zero.drain_into(0, &mut self.stale, &mut out);
        for (prio, mut level) in std::mem::take(&mut self.others) {
            level.drain_into(prio, &mut self.stale, &mut out);
        }
        if let Some(groups) = &mut self.groups {
            groups.blocked.clear();
            groups.blocked_keys = 0;
        }
        debug_assert!(self.stale.is_empty());
        self.stale = HashMap::default();
        self.live = 0;
        out
    }

    /// Ready keys per priority, highest first.
    pub(crate) fn by_priority(&self) -> Vec<(Priority, usize)> {
        let mut out: Vec<(Priority, usize)> =
            self.others.iter().rev().map(|(p, level)| (*p, level.live())).filter(|(_, n)| *n > 0).collect();
        if self.zero.live() > 0 {
            let at = out.iter().position(|(p, _)| *p < 0).unwrap_or(out.len());
            out.insert(at, (0, self.zero.live()));
        }
        out
    }

    /// Keys in flight per group (empty without groups).
    pub(crate) fn in_flight_by_group(&self) -> Vec<(GroupId, usize)> {
        let Some(groups) = &self.groups else { return Vec::new() };
        let mut out: Vec<(GroupId, usize)> = groups.in_flight.iter().map(|(g, n)| (*g, *n)).collect();
        out.sort_unstable();
        out
    }
}

impl ReadySet<u32> {
    /// Maps every key, live or stale, through `remap` (`slab.rs`'s
    /// compaction). Stale entries of keys that left map to `FREED`; they
    /// stay counted one for one, so they are still dropped at their turn.
    pub(crate) fn remap(&mut self, remap: &[u32]) {
        let new = |key: u32| if key == FREED { FREED } else { remap[key as usize] };
        let map = |key: &mut u32| *key = new(*key);
        for level in std::iter::once(&mut self.zero).chain(self.others.values_mut()) {
            match level {
                Level::Plain(fifo) => fifo.keys.iter_mut().for_each(map),
                Level::Fair(fair) => fair.fifos.values_mut().for_each(|gf| gf.fifo.keys.iter_mut().for_each(map)),
            }
        }
        let mut stale = Stale::default();
        for ((key, prio, group), n) in self.stale.drain() {
            *stale.entry((new(key), prio, group)).or_insert(0) += n;
        }
        self.stale = stale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pops<K: Eq + Hash + Clone>(set: &mut ReadySet<K>) -> Vec<K> {
        std::iter::from_fn(|| set.pop().map(|(k, _, _)| k)).collect()
    }

    #[test]
    fn highest_priority_first_fifo_within() {
        let mut s = ReadySet::new();
        s.push("a", 0, 0);
        s.push("b", 5, 0);
        s.push("c", -1, 0);
        s.push("d", 5, 0);
        s.push("e", 0, 0);
        assert_eq!(s.by_priority(), vec![(5, 2), (0, 2), (-1, 1)]);
        assert_eq!(pops(&mut s), vec!["b", "d", "a", "e", "c"]);
        assert!(s.is_empty() && s.others.is_empty());
    }

    #[test]
    fn a_raised_key_leaves_its_old_place() {
        let mut s = ReadySet::new();
        for k in ["a", "b", "c"] {
            s.push(k, 0, 0);
        }
        s.raise("b", 0, 3, 0);
        assert_eq!(s.len(), 3);
        assert_eq!(pops(&mut s), vec!["b", "a", "c"]);
        assert!(s.stale.is_empty(), "the stale entry was dropped at its turn");
        // Ready again at its old level after leaving: the stale entry (if
        // any) never makes it jump the queue.
        s.push("x", 0, 0);
        s.push("b", 0, 0);
        s.raise("x", 0, 1, 0);
        s.push("y", 1, 0);
        assert_eq!(s.pop(), Some(("x", 1, 0)));
        s.push("x", 0, 0);
        assert_eq!(pops(&mut s), vec!["y", "b", "x"]);
        assert!(s.stale.is_empty() && s.others.is_empty());
    }

    #[test]
    fn groups_take_turns_within_a_priority() {
        let mut s = ReadySet::fair(None);
        for i in 0..5 {
            s.push(("a", i), 0, 1);
        }
        s.push(("b", 0), 0, 2);
        s.push(("c", 0), 0, 3);
        s.push(("hi", 0), 1, 1);
        let order: Vec<_> = pops(&mut s);
        assert_eq!(order, vec![("hi", 0), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 4)]);
        assert_eq!(s.in_flight_by_group(), vec![(1, 6), (2, 1), (3, 1)]);
    }

    #[test]
    fn a_full_group_waits_and_others_go_ahead() {
        let mut s = ReadySet::fair(Some(1));
        s.push("a1", 0, 1);
        s.push("a2", 0, 1);
        s.push("a3", 5, 1);
        s.push("b1", 0, 2);
        assert_eq!(s.pop(), Some(("a3", 5, 1)));
        assert_eq!(s.pop(), Some(("b1", 0, 2)), "group 1 is full: a1 waits");
        assert_eq!(s.available(), 0, "a1 and a2 do not count as takeable");
        assert_eq!(s.len(), 2);
        assert_eq!(s.pop(), None);
        s.push("a4", 0, 1);
        assert_eq!(s.available(), 0, "a key joining a full group waits too");
        s.finished(1);
        assert_eq!(s.available(), 3);
        assert_eq!(s.pop(), Some(("a1", 0, 1)));
        assert_eq!(s.pop(), None);
        s.finished(2);
        s.finished(1);
        assert_eq!(pops(&mut s), vec!["a2"]);
        s.finished(1);
        assert_eq!(pops(&mut s), vec!["a4"]);
    }

    #[test]
    fn raising_out_of_a_blocked_group_keeps_counts() {
        let mut s = ReadySet::fair(Some(1));
        s.push("a1", 0, 1);
        assert_eq!(s.pop(), Some(("a1", 0, 1)));
        s.push("a2", 0, 1);
        s.push("a3", 0, 1);
        s.pop();
        assert_eq!(s.available(), 0);
        s.raise("a3", 0, 2, 1);
        assert_eq!(s.available(), 0);
        s.finished(1);
        assert_eq!(s.available(), 2);
        assert_eq!(pops(&mut s), vec!["a3"]);
        s.finished(1);
        assert_eq!(pops(&mut s), vec!["a2"]);
        assert!(s.stale.is_empty());
    }

    #[test]
    fn drain_returns_every_live_key_once() {
        let mut s = ReadySet::fair(Some(1));
        s.push("a", 0, 1);
        s.push("b", 0, 1);
        s.push("c", 2, 2);
        s.raise("b", 0, 1, 1);
        s.pop();
        let mut keys = s.drain();
        keys.sort();
        assert_eq!(keys, vec!["a", "b"]);
        assert!(s.is_empty() && s.stale.is_empty() && s.available() == 0);
    }
}
