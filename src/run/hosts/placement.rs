//! Where a loop that is ready to start runs: on the head, on a joined host with a free slot,
//! or nowhere yet (it waits, and says for what).
//!
//! - A loop a placement rule names (`hosts.placement`, see `config::hosts`) runs only on the
//!   hosts of that rule (`head`: the head itself); it waits while none of them has a free
//!   slot ("waiting for host h1" while h1 has not joined).
//! - A loop no rule names runs where the most slots are free: the head (its free slots are
//!   what `concurrency.max-loops` leaves) or a joined host (its `slots` less the loops it
//!   runs); a tie goes to the head, then to the host first by name.
//! - A loop whose worktree is shared or is the repository itself works in the head's
//!   checkout: it always runs on the head (the config refuses a rule that leaves the head
//!   out for it).

use std::collections::BTreeMap;

use td_cluster::protocol::HEAD_NAME;

/// Where a loop runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// On the head.
    Head,
    /// On the joined host of this name.
    Host(String),
}

impl Site {
    /// The host's name, `None` for the head.
    pub fn host(&self) -> Option<&str> {
        match self {
            Site::Head => None,
            Site::Host(h) => Some(h),
        }
    }
}

/// The free slots at one moment: the head's, and each joined host's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Free {
    /// Loops the head may still start.
    pub head: usize,
    /// Joined hosts, by name: loops each may still start.
    pub hosts: BTreeMap<String, usize>,
}

impl Free {
    /// Takes one slot of `site` (after a loop was started there).
    pub fn take(&mut self, site: &Site) {
        match site {
            Site::Head => self.head = self.head.saturating_sub(1),
            Site::Host(h) => {
                if let Some(n) = self.hosts.get_mut(h) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    /// Whether no loop can start anywhere.
    pub fn none(&self) -> bool {
        self.head == 0 && self.hosts.values().all(|n| *n == 0)
    }
}

/// Where a loop runs now, or why it waits. `allowed`: the hosts of the rule that names it
/// (`None`: no rule does); `head_only`: it works in the head's checkout; `joined`: every
/// joined host with its slots (to tell a host that is busy from one that is not there).
pub fn choose(
    allowed: Option<&[String]>,
    head_only: bool,
    free: &Free,
    joined: &BTreeMap<String, u32>,
) -> Result<Site, String> {
    if head_only {
        return match free.head {
            0 => Err("waiting for a free slot on the head".to_string()),
            _ => Ok(Site::Head),
        };
    }
    let head_allowed = allowed.is_none_or(|hosts| hosts.iter().any(|h| h == HEAD_NAME));
    let mut best: Option<(usize, Site)> = None;
    if head_allowed && free.head > 0 {
        best = Some((free.head, Site::Head));
    }
    for (name, n) in &free.hosts {
        let ok = allowed.is_none_or(|hosts| hosts.iter().any(|h| h == name));
        if ok && *n > 0 && best.as_ref().is_none_or(|(m, _)| n > m) {
            best = Some((*n, Site::Host(name.clone())));
        }
    }
    if let Some((_, site)) = best {
        return Ok(site);
    }
    Err(match allowed {
        None => "waiting for a free slot".to_string(),
        Some(hosts) => {
            let words: Vec<String> = hosts
                .iter()
                .map(|h| {
                    if h == HEAD_NAME {
                        "a free slot on the head".to_string()
                    } else {
                        match joined.get(h) {
                            None => format!("host {h}"),
                            Some(slots) => format!("host {h} (all its {slots} slots are busy)"),
                        }
                    }
                })
                .collect();
            format!("waiting for {}", words.join(" or "))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(head: usize, hosts: &[(&str, usize)]) -> Free {
        Free {
            head,
            hosts: hosts.iter().map(|(h, n)| (h.to_string(), *n)).collect(),
        }
    }

    fn joined(hosts: &[(&str, u32)]) -> BTreeMap<String, u32> {
        hosts.iter().map(|(h, n)| (h.to_string(), *n)).collect()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_placed_loop_runs_on_its_hosts_only_and_says_what_it_waits_for() {
        let h1 = names(&["h1"]);
        let j = joined(&[("h1", 2), ("h2", 2)]);
        // Not joined: waits for it, however free the head and the others are.
        assert_eq!(
            choose(
                Some(&h1),
                false,
                &free(4, &[("h2", 2)]),
                &joined(&[("h2", 2)])
            ),
            Err("waiting for host h1".to_string())
        );
        // Joined, busy.
        assert_eq!(
            choose(Some(&h1), false, &free(4, &[("h1", 0), ("h2", 2)]), &j),
            Err("waiting for host h1 (all its 2 slots are busy)".to_string())
        );
        assert_eq!(
            choose(Some(&h1), false, &free(4, &[("h1", 1)]), &j),
            Ok(Site::Host("h1".into()))
        );
        // `head` keeps it local.
        let head = names(&["head"]);
        assert_eq!(
            choose(Some(&head), false, &free(1, &[("h1", 5)]), &j),
            Ok(Site::Head)
        );
        assert_eq!(
            choose(Some(&head), false, &free(0, &[("h1", 5)]), &j),
            Err("waiting for a free slot on the head".to_string())
        );
        let both = names(&["h3", "head"]);
        assert_eq!(
            choose(Some(&both), false, &free(0, &[]), &j),
            Err("waiting for host h3 or a free slot on the head".to_string())
        );
    }

    #[test]
    fn an_unplaced_loop_goes_where_most_slots_are_free_the_head_first_on_a_tie() {
        let j = joined(&[("h1", 3), ("h2", 3)]);
        assert_eq!(
            choose(None, false, &free(2, &[("h1", 2), ("h2", 2)]), &j),
            Ok(Site::Head)
        );
        assert_eq!(
            choose(None, false, &free(1, &[("h1", 2), ("h2", 3)]), &j),
            Ok(Site::Host("h2".into()))
        );
        assert_eq!(
            choose(None, false, &free(0, &[("h1", 1), ("h2", 1)]), &j),
            Ok(Site::Host("h1".into()))
        );
        assert_eq!(
            choose(None, false, &free(0, &[("h1", 0)]), &j),
            Err("waiting for a free slot".to_string())
        );
        // A loop in the head's checkout stays there.
        assert_eq!(
            choose(None, true, &free(1, &[("h1", 9)]), &j),
            Ok(Site::Head)
        );
        assert!(choose(None, true, &free(0, &[("h1", 9)]), &j).is_err());
    }

    #[test]
    fn taking_slots_fills_a_site() {
        let mut f = free(1, &[("h1", 1)]);
        assert!(!f.none());
        f.take(&Site::Head);
        f.take(&Site::Host("h1".into()));
        f.take(&Site::Host("h9".into()));
        assert!(f.none());
    }
}
