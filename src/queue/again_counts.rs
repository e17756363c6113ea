//! Keys being processed that are marked to be ready again at `done`,
//! counted by the priority they will come back with: part of the metrics'
//! depth (client-go counts them), which `workqueue_depth` splits by
//! priority as controller-runtime's priority queue does.
//!
//! A handful of priorities at most in practice (usually only 0), so a short
//! vector searched linearly; it is touched only when a key being processed
//! is added again, raised, or finished, never by a plain add or `get`.

use super::ready::Priority;

#[derive(Default)]
pub(crate) struct AgainCounts {
    /// `(priority, keys)`, no entry with 0 keys.
    counts: Vec<(Priority, usize)>,
    total: usize,
}

impl AgainCounts {
    /// One more key, coming back at `prio`.
    pub(crate) fn add(&mut self, prio: Priority) {
        self.total += 1;
        match self.counts.iter_mut().find(|(p, _)| *p == prio) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((prio, 1)),
        }
    }

    /// One key fewer at `prio` (it was finished, or dropped).
    pub(crate) fn remove(&mut self, prio: Priority) {
        let at = self.counts.iter().position(|(p, _)| *p == prio).expect("a key counted at its priority");
        self.total -= 1;
        self.counts[at].1 -= 1;
        if self.counts[at].1 == 0 {
            self.counts.swap_remove(at);
        }
    }

    /// A key's priority changed from `from` to `to`.
    pub(crate) fn moved(&mut self, from: Priority, to: Priority) {
        if from != to {
            self.remove(from);
            self.add(to);
        }
    }

    pub(crate) fn clear(&mut self) {
        self.counts.clear();
        self.total = 0;
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// `(priority, keys)` pairs, in no particular order.
    pub(crate) fn by_priority(&self) -> &[(Priority, usize)] {
        &self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_adds_moves_and_removes() {
        let mut c = AgainCounts::default();
        c.add(0);
        c.add(0);
        c.add(5);
        c.moved(0, 5);
        c.moved(5, 5);
        let mut seen = c.by_priority().to_vec();
        seen.sort_unstable();
        assert_eq!(seen, [(0, 1), (5, 2)]);
        assert_eq!(c.total(), 3);
        c.remove(0);
        assert_eq!(c.by_priority(), [(5, 2)]);
        c.clear();
        assert_eq!((c.total(), c.by_priority().len()), (0, 0));
    }
}
