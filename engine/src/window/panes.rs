//! A key's panes in the pane-based window operator (`aligned.rs`): per pane start, the
//! accumulator of the key's records in that pane.

use std::collections::VecDeque;

/// A key's live panes, ordered by start: the newest inline in the key's map entry (in-order
/// input adds to it without chasing a pointer), older ones (those windows still need) in a
/// deque. Invariant: no newest pane, no older ones.
pub(crate) struct PaneList<A> {
    newest: Option<(i64, A)>,
    older: VecDeque<(i64, A)>,
}

impl<A> Default for PaneList<A> {
    fn default() -> Self {
        PaneList {
            newest: None,
            older: VecDeque::new(),
        }
    }
}

impl<A> PaneList<A> {
    /// The accumulator of the pane at `start`, created with `make` if there is none yet
    /// (`true`: created).
    #[inline]
    pub(crate) fn get_mut_or_insert_with(
        &mut self,
        start: i64,
        make: impl FnOnce() -> A,
    ) -> (&mut A, bool) {
        match self.newest.as_ref().map(|(newest, _)| *newest) {
            Some(newest) if newest == start => {
                return (&mut self.newest.as_mut().expect("checked").1, false);
            }
            Some(newest) if newest > start => {}
            Some(_) => {
                let previous = self.newest.replace((start, make())).expect("checked");
                self.older.push_back(previous);
                return (&mut self.newest.as_mut().expect("set").1, true);
            }
            None => {
                let (_, acc) = self.newest.insert((start, make()));
                return (acc, true);
            }
        }
        // Older than the newest pane (out-of-order input): in the deque, searched from the
        // back, where the recent ones are.
        let at = match self.older.iter().rposition(|(s, _)| *s <= start) {
            Some(i) if self.older[i].0 == start => return (&mut self.older[i].1, false),
            found => found.map_or(0, |i| i + 1),
        };
        self.older.insert(at, (start, make()));
        (&mut self.older[at].1, true)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &(i64, A)> {
        self.older.iter().chain(self.newest.iter())
    }

    /// The accumulators of the panes starting in `[from, to)`, oldest first: O(log n) to find
    /// the first (the watermark trails the input, so there may be many panes after them).
    pub(crate) fn range(&self, from: i64, to: i64) -> impl Iterator<Item = &A> {
        // In order, the firing window is the oldest: no search (its cache misses cost more
        // than comparing the front).
        let first = match self.older.front() {
            Some((start, _)) if *start < from => {
                self.older.partition_point(|(start, _)| *start < from)
            }
            _ => 0,
        };
        self.older
            .range(first..)
            .chain(self.newest.iter())
            .take_while(move |(start, _)| *start < to)
            .filter(move |(start, _)| *start >= from)
            .map(|(_, acc)| acc)
    }

    /// Drops the panes that start before `start` (the oldest: O(dropped)).
    pub(crate) fn drop_before(&mut self, start: i64) {
        self.drop_while(|pane| pane.0 < start);
    }

    /// Drops the oldest panes while `gone` holds for them (`gone` must hold for a prefix).
    pub(crate) fn drop_while(&mut self, mut gone: impl FnMut(&(i64, A)) -> bool) {
        while self.older.front().is_some_and(&mut gone) {
            self.older.pop_front();
        }
        if self.newest.as_ref().is_some_and(gone) {
            self.newest = self.older.pop_back();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.newest.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pane_lists_stay_ordered_with_the_newest_inline() {
        let mut list = PaneList::default();
        for start in [20, 10, 30, 20, 0] {
            let (acc, _) = list.get_mut_or_insert_with(start, || 0u32);
            *acc += 1;
        }
        let panes: Vec<(i64, u32)> = list.iter().copied().collect();
        assert_eq!(panes, vec![(0, 1), (10, 1), (20, 2), (30, 1)]);
        assert_eq!(list.newest, Some((30, 1)), "the newest inline");
        assert_eq!(list.range(5, 30).copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(list.range(15, 31).copied().collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(list.range(25, 30).count(), 0);
        list.drop_before(20);
        assert_eq!(
            list.iter().copied().collect::<Vec<_>>(),
            vec![(20, 2), (30, 1)]
        );
        assert!(
            !list.get_mut_or_insert_with(30, || 9).1,
            "found, not created"
        );
        list.drop_before(25);
        assert_eq!(list.iter().copied().collect::<Vec<_>>(), vec![(30, 1)]);
        assert!(list.older.is_empty());
        list.drop_while(|_| true);
        assert!(list.is_empty());
    }
}
