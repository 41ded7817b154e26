//! Delivery numbers (see [`crate::inbox::Delivered`]) as the record keeps them: the numbers
//! an `inbox_shown` event showed, as ascending inclusive ranges, and the set of numbers a
//! loop's finished iterations showed, which a resumed or moved loop is not shown again.

use std::collections::BTreeMap;

/// `numbers` (ascending) as inclusive ranges: `[3, 4, 5, 9]` is `[[3, 5], [9, 9]]`.
pub fn ranges(numbers: impl IntoIterator<Item = u64>) -> Vec<[u64; 2]> {
    let mut out: Vec<[u64; 2]> = Vec::new();
    for n in numbers {
        match out.last_mut() {
            Some(last) if last[1].checked_add(1) == Some(n) => last[1] = n,
            _ => out.push([n, n]),
        }
    }
    out
}

/// A set of delivery numbers kept as disjoint ranges, so that a record's hostile range
/// (`[1, 2^53]`) costs one entry, not 2^53.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumberSet {
    /// Start of each range → its end (inclusive); ranges neither overlap nor touch.
    ranges: BTreeMap<u64, u64>,
}

impl NumberSet {
    /// Adds `lo..=hi` (nothing when `lo > hi`).
    pub fn insert(&mut self, lo: u64, hi: u64) {
        if lo > hi {
            return;
        }
        let (mut lo, mut hi) = (lo, hi);
        // A range that starts before `lo` and reaches it (or ends just before it).
        if let Some((&start, &end)) = self.ranges.range(..lo).next_back()
            && end.saturating_add(1) >= lo
        {
            self.ranges.remove(&start);
            lo = start;
            hi = hi.max(end);
        }
        // Ranges that start inside `lo..=hi`, or just after it.
        let within: Vec<(u64, u64)> = self
            .ranges
            .range(lo..=hi.saturating_add(1))
            .map(|(s, e)| (*s, *e))
            .collect();
        for (start, end) in within {
            self.ranges.remove(&start);
            hi = hi.max(end);
        }
        self.ranges.insert(lo, hi);
    }

    /// Whether `n` is in the set.
    pub fn contains(&self, n: u64) -> bool {
        self.ranges
            .range(..=n)
            .next_back()
            .is_some_and(|(_, end)| *end >= n)
    }

    /// The largest number in the set.
    pub fn max(&self) -> Option<u64> {
        self.ranges.values().next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_become_ranges_and_ranges_merge_in_a_set() {
        assert_eq!(ranges([3, 4, 5, 9, 11, 12]), vec![[3, 5], [9, 9], [11, 12]]);
        assert_eq!(ranges([]), Vec::<[u64; 2]>::new());
        assert_eq!(
            ranges([u64::MAX - 1, u64::MAX]),
            vec![[u64::MAX - 1, u64::MAX]]
        );
        let mut set = NumberSet::default();
        set.insert(5, 6);
        set.insert(9, 9);
        assert!(set.contains(5) && set.contains(6) && set.contains(9));
        assert!(!set.contains(4) && !set.contains(7) && !set.contains(8));
        // Touching and overlapping ranges merge into one.
        set.insert(7, 8);
        set.insert(1, 5);
        assert_eq!(set.ranges.len(), 1, "{set:?}");
        assert!((1..=9).all(|n| set.contains(n)));
        assert_eq!(set.max(), Some(9));
        // An empty range adds nothing; a huge one is one entry.
        set.insert(20, 19);
        set.insert(100, u64::MAX);
        assert_eq!(set.ranges.len(), 2);
        assert!(set.contains(u64::MAX) && !set.contains(50));
    }
}
