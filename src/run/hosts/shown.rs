//! What a host may say its loop showed (`inbox_shown`), checked as its records arrive: a
//! resumed or moved loop is shown again exactly the items whose delivery numbers no
//! finished iteration showed (`run/resume.rs`), so a host that claims numbers it was never
//! sent, or shows them out of order, could hide items from the loop's next placement or
//! show them twice. The head keeps, per placement, the numbers it sent the loop and has not
//! seen shown (its first inbox's, then each delivery's, in the order they went: ascending),
//! and how many items without a number its first inbox had. Each `inbox_shown` must name
//! numbers from those, above every number shown before (a loop's inbox is shown in the
//! order it filled), and its other items must be among the unnumbered ones left: the check
//! is cumulative over the placement, not per event.

use std::collections::VecDeque;

use td_protocol::inbox::Delivered;

/// The inbox items of one placement of a host's loop, as far as the head knows them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostInbox {
    /// Items without a delivery number in its first inbox, not shown yet.
    unnumbered: usize,
    /// Delivery numbers sent to it and not shown yet, ascending.
    sent: VecDeque<u64>,
    /// The highest number it showed (0: none).
    last_shown: u64,
}

/// Why an `inbox_shown` cannot be taken: the field, its value, and what bounds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// `items` or `deliveries`.
    pub field: &'static str,
    /// What it said.
    pub value: String,
    /// What it may say at most, in words.
    pub bound: String,
}

impl HostInbox {
    /// A placement that starts with `initial` in its inbox (a resumed or moved loop's items
    /// not yet shown, in the order it is sent them).
    pub fn new(initial: &[Delivered]) -> HostInbox {
        let mut inbox = HostInbox::default();
        for item in initial {
            match item.delivery {
                Some(n) => inbox.sent(n),
                None => inbox.unnumbered = inbox.unnumbered.saturating_add(1),
            }
        }
        inbox
    }

    /// Delivery number `n` is on its way to the loop. Numbers go out ascending (the head's
    /// coordinator gives them in order and delivers them in order); one that does not is
    /// not kept, so showing it is refused.
    pub fn sent(&mut self, n: u64) {
        if n > self.last_shown && self.sent.back().is_none_or(|last| n > *last) {
            self.sent.push_back(n);
        }
    }

    /// Takes an `inbox_shown` of `items` items, the numbered ones `deliveries` (ascending
    /// inclusive ranges); nothing changes when it is refused.
    pub fn take(&mut self, items: usize, deliveries: &[[u64; 2]]) -> Result<(), Refused> {
        let mut next = self.clone();
        let mut numbered = 0usize;
        for &[lo, hi] in deliveries {
            let refused = |bound: String| Refused {
                field: "deliveries",
                value: format!("[{lo}, {hi}]"),
                bound,
            };
            if lo > hi || lo <= next.last_shown {
                return Err(refused(format!(
                    "ascending numbers above the last it showed ({})",
                    next.last_shown
                )));
            }
            // Numbers sent and passed over are never shown later: the inbox shows in order.
            while next.sent.front().is_some_and(|n| *n < lo) {
                next.sent.pop_front();
            }
            // Each number of the range, in turn, must be the next one sent (bounded by what
            // was sent, whatever the range says).
            let mut expected = lo;
            loop {
                if next.sent.front() != Some(&expected) {
                    return Err(refused(format!(
                        "the numbers delivered to it and not shown yet (it was not sent {expected})"
                    )));
                }
                next.sent.pop_front();
                numbered = numbered.saturating_add(1);
                if expected == hi {
                    break;
                }
                expected = expected.saturating_add(1);
            }
            next.last_shown = hi;
        }
        let unnumbered = items.checked_sub(numbered).ok_or_else(|| Refused {
            field: "items",
            value: items.to_string(),
            bound: format!("at least the {numbered} numbered items it names"),
        })?;
        next.unnumbered = next
            .unnumbered
            .checked_sub(unnumbered)
            .ok_or_else(|| Refused {
                field: "items",
                value: items.to_string(),
                bound: format!(
                    "the items delivered to it ({numbered} numbered, and {} without a number not shown yet)",
                    self.unnumbered
                ),
            })?;
        *self = next;
        Ok(())
    }

    /// Makes what `checked` took (a copy of this inbox that took a batch's `inbox_shown`
    /// events) this inbox's, keeping the numbers sent since the copy was made.
    pub fn commit(&mut self, checked: &HostInbox) {
        self.unnumbered = checked.unnumbered;
        self.last_shown = self.last_shown.max(checked.last_shown);
        while self.sent.front().is_some_and(|n| *n <= self.last_shown) {
            self.sent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_protocol::inbox::InboxItem;

    fn item(delivery: Option<u64>) -> Delivered {
        Delivered {
            delivery,
            item: InboxItem::Share {
                from: "a".into(),
                data_type: "t".into(),
                data: serde_json::Value::Null,
            },
        }
    }

    #[test]
    fn shown_numbers_must_be_sent_ascending_and_shown_once_over_the_whole_placement() {
        // A moved loop: one item without a number and number 2 restored; 5, 6, 7 sent since.
        let mut inbox = HostInbox::new(&[item(None), item(Some(2))]);
        for n in [5, 6, 7] {
            inbox.sent(n);
        }
        inbox.take(2, &[[2, 2]]).unwrap();
        // Not sent, sent but shown already, not ascending, a range past what was sent.
        for (items, ranges) in [
            (1, vec![[3, 3]]),
            (1, vec![[2, 2]]),
            (2, vec![[6, 6], [5, 5]]),
            (2, vec![[6, 5]]),
            (3, vec![[5, 8]]),
            (1, vec![[5, u64::MAX]]),
        ] {
            let before = inbox.clone();
            let refused = inbox.take(items, &ranges).unwrap_err();
            assert_eq!(refused.field, "deliveries", "{ranges:?}: {refused:?}");
            assert_eq!(inbox, before, "a refused event changes nothing");
        }
        // More items than numbers and unnumbered ones left: the count is cumulative.
        assert_eq!(inbox.take(2, &[[5, 5]]).unwrap_err().field, "items");
        assert_eq!(inbox.take(0, &[[5, 5]]).unwrap_err().field, "items");
        inbox.take(1, &[[5, 5]]).unwrap();
        // 6 passed over (never shown now), 7 shown; 6 cannot be shown after.
        inbox.take(1, &[[7, 7]]).unwrap();
        assert_eq!(inbox.take(1, &[[6, 6]]).unwrap_err().field, "deliveries");
        inbox.sent(8);
        inbox.sent(8);
        inbox.sent(9);
        inbox.take(2, &[[8, 9]]).unwrap();
        // An old number sent again is not kept.
        inbox.sent(4);
        assert_eq!(inbox.take(1, &[[4, 4]]).unwrap_err().field, "deliveries");
    }

    #[test]
    fn a_batch_checked_on_a_copy_keeps_the_numbers_sent_meanwhile() {
        let mut live = HostInbox::new(&[item(None)]);
        live.sent(1);
        live.sent(2);
        let mut copy = live.clone();
        copy.take(2, &[[1, 1]]).unwrap();
        live.sent(3);
        live.commit(&copy);
        assert_eq!(live.unnumbered, 0);
        assert_eq!(live.sent, VecDeque::from([2, 3]));
        live.take(2, &[[2, 3]]).unwrap();
    }
}
