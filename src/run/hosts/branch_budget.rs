//! The bytes of branch bundles (checkpoints and ends) that hosts may send the head for one
//! loop, counted over the whole run: a loop moved from host to host goes on with what its
//! earlier placements spent, so that hosts cannot fill the head's repository by getting a
//! loop moved (each placement had a budget of its own before).

use std::collections::BTreeMap;
use std::sync::Mutex;

use td_base::sync::lock;

/// Bytes received per loop, against one limit per loop.
#[derive(Debug)]
pub struct BranchBudgets {
    limit: u64,
    sent: Mutex<BTreeMap<String, u64>>,
}

impl BranchBudgets {
    /// Budgets of `limit` bytes per loop.
    pub fn new(limit: u64) -> BranchBudgets {
        BranchBudgets {
            limit,
            sent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Counts `bytes` more of loop `name`'s bundles; refused, and nothing counted, when
    /// that would pass the limit.
    pub fn charge(&self, name: &str, bytes: u64) -> Result<(), String> {
        let mut sent = lock(&self.sent);
        let before = sent.get(name).copied().unwrap_or(0);
        let after = before
            .checked_add(bytes)
            .filter(|t| *t <= self.limit)
            .ok_or_else(|| {
                format!(
                    "loop {name}'s checkpoints and branches are larger than the {} bytes its hosts may send in all (it sent {before} so far, in this placement and any before it)",
                    self.limit
                )
            })?;
        sent.insert(name.to_string(), after);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loops_bundles_share_one_budget_over_all_its_placements() {
        let budgets = BranchBudgets::new(100);
        budgets.charge("m", 60).unwrap();
        // Another loop has its own.
        budgets.charge("n", 100).unwrap();
        // m moved: its next placement goes on from 60, not from 0.
        let why = budgets.charge("m", 41).unwrap_err();
        assert!(why.contains("it sent 60 so far"), "{why}");
        budgets.charge("m", 40).unwrap();
        assert!(budgets.charge("m", 1).is_err());
        assert!(budgets.charge("m", u64::MAX).is_err());
        budgets.charge("m", 0).unwrap();
    }
}
