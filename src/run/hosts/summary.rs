//! The worker hosts of a run as `summary.json` keeps them: each host that joined (where
//! from, its slots and workdir, joined, lost or left, and why) and the connections the head
//! refused. A view of the `host_*` events, made by [`apply`] live and when a summary is
//! rebuilt from the events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use td_protocol::events::EventKind;

/// How many refusals the summary keeps (the newest); `refused_total` counts them all.
pub const REFUSALS_KEPT: usize = 10;

/// Where a host stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostStatus {
    /// Joined, and answering the head's heartbeats.
    #[default]
    Joined,
    /// Its connection closed, or it stopped answering.
    Lost,
    /// It left (its user stopped it, or the run ended).
    Left,
}

impl HostStatus {
    /// The lowercase name used in `summary.json` and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            HostStatus::Joined => "joined",
            HostStatus::Lost => "lost",
            HostStatus::Left => "left",
        }
    }
}

/// One host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostSummary {
    /// Its name.
    pub name: String,
    /// Where it connected from.
    pub address: String,
    /// Loops it runs at once.
    pub slots: u32,
    /// Where it keeps its worktrees.
    pub workdir: String,
    /// Its taskdaemon version.
    pub version: String,
    /// Where it stands.
    pub status: HostStatus,
    /// When it joined (the last time, when it joined again).
    pub joined_at: String,
    /// When it was lost or left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it was lost or left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A connection the head refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RefusedHost {
    /// Where it came from.
    pub address: String,
    /// The name it asked for, when it got that far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Why.
    pub reason: String,
    /// When.
    pub at: String,
}

/// The hosts of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostsSummary {
    /// Every host that joined, by name.
    pub hosts: BTreeMap<String, HostSummary>,
    /// The newest [`REFUSALS_KEPT`] refusals, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedHost>,
    /// Every refusal of the run.
    #[serde(skip_serializing_if = "is_zero")]
    pub refused_total: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl HostsSummary {
    /// Whether no host ever joined or was refused (then `summary.json` leaves it out).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.refused_total == 0
    }
}

/// How a `host_*` event at `time` changes `hosts`; whether it changed anything (other
/// events change nothing).
pub fn apply(hosts: &mut HostsSummary, time: &str, kind: &EventKind) -> bool {
    match kind {
        EventKind::HostJoined {
            host,
            address,
            slots,
            workdir,
            version,
        } => {
            hosts.hosts.insert(
                host.clone(),
                HostSummary {
                    name: host.clone(),
                    address: address.clone(),
                    slots: *slots,
                    workdir: workdir.clone(),
                    version: version.clone(),
                    status: HostStatus::Joined,
                    joined_at: time.to_string(),
                    ended_at: None,
                    reason: None,
                },
            );
        }
        EventKind::HostLost { host, reason, .. } | EventKind::HostLeft { host, reason } => {
            let Some(h) = hosts.hosts.get_mut(host) else {
                return false;
            };
            h.status = if matches!(kind, EventKind::HostLost { .. }) {
                HostStatus::Lost
            } else {
                HostStatus::Left
            };
            h.ended_at = Some(time.to_string());
            h.reason = Some(reason.clone());
        }
        EventKind::HostRefused {
            address,
            host,
            reason,
        } => {
            hosts.refused_total = hosts.refused_total.saturating_add(1);
            hosts.refused.push(RefusedHost {
                address: address.clone(),
                host: host.clone(),
                reason: reason.clone(),
                at: time.to_string(),
            });
            if hosts.refused.len() > REFUSALS_KEPT {
                hosts.refused.remove(0);
            }
        }
        _ => return false,
    }
    true
}

/// The hosts as `status` shows them: a table (host, address, slots, status, joined at,
/// work directory), why each lost or left host went, and the refusals kept. Empty when no
/// host ever joined or was refused. `interrupted`: the run's process is gone, so hosts
/// recorded joined are shown `interrupted` (they lost their head with it).
pub fn render(hosts: &HostsSummary, interrupted: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if hosts.is_empty() {
        return out;
    }
    let header = ["HOST", "ADDRESS", "SLOTS", "STATUS", "JOINED", "WORKDIR"].map(str::to_string);
    let rows: Vec<[String; 6]> = hosts
        .hosts
        .values()
        .map(|h| {
            let status = if interrupted && h.status == HostStatus::Joined {
                "interrupted"
            } else {
                h.status.as_str()
            };
            [
                h.name.clone(),
                h.address.clone(),
                h.slots.to_string(),
                status.to_string(),
                h.joined_at.clone(),
                h.workdir.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        let mut widths = header.clone().map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let mut line = String::new();
            for (cell, w) in row.iter().zip(widths) {
                let _ = write!(line, "{cell:<w$}  ");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    for h in hosts.hosts.values() {
        if let Some(reason) = &h.reason {
            let at = h.ended_at.as_deref().unwrap_or("?");
            let _ = writeln!(out, "{} {} at {at}: {reason}", h.status.as_str(), h.name);
        }
    }
    for r in &hosts.refused {
        let who = r
            .host
            .as_ref()
            .map(|h| format!(" (as {h})"))
            .unwrap_or_default();
        let _ = writeln!(out, "refused {}{who} at {}: {}", r.address, r.at, r.reason);
    }
    let shown = hosts.refused.len() as u64;
    if hosts.refused_total > shown {
        let _ = writeln!(
            out,
            "({} refusals in all; the newest {shown} are shown)",
            hosts.refused_total
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_show_as_a_table_with_their_ends_and_the_refusals() {
        let mut h = HostsSummary::default();
        assert_eq!(render(&h, false), "");
        apply(&mut h, "t1", &joined("b1"));
        apply(&mut h, "t2", &joined("b2"));
        apply(
            &mut h,
            "t3",
            &EventKind::HostLost {
                host: "b2".into(),
                address: "10.0.0.2:5000".into(),
                reason: "its connection closed".into(),
            },
        );
        apply(
            &mut h,
            "t4",
            &EventKind::HostRefused {
                address: "10.0.0.9:1".into(),
                host: Some("b1".into()),
                reason: "already joined".into(),
            },
        );
        let text = render(&h, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            vec![
                "HOST  ADDRESS        SLOTS  STATUS  JOINED  WORKDIR",
                "b1    10.0.0.2:5000  2      joined  t1      /w",
                "b2    10.0.0.2:5000  2      lost    t2      /w",
                "lost b2 at t3: its connection closed",
                "refused 10.0.0.9:1 (as b1) at t4: already joined",
            ],
            "{text}"
        );
        // A run whose process is gone has no joined hosts.
        assert!(render(&h, true).contains("b1    10.0.0.2:5000  2      interrupted"));
    }

    fn joined(host: &str) -> EventKind {
        EventKind::HostJoined {
            host: host.into(),
            address: "10.0.0.2:5000".into(),
            slots: 2,
            workdir: "/w".into(),
            version: "0.1.0".into(),
        }
    }

    #[test]
    fn a_host_joins_is_lost_and_joins_again() {
        let mut h = HostsSummary::default();
        assert!(h.is_empty());
        assert!(apply(&mut h, "t1", &joined("b1")));
        assert_eq!(h.hosts["b1"].status, HostStatus::Joined);
        assert!(apply(
            &mut h,
            "t2",
            &EventKind::HostLost {
                host: "b1".into(),
                address: "10.0.0.2:5000".into(),
                reason: "its connection closed".into()
            }
        ));
        assert_eq!(h.hosts["b1"].status, HostStatus::Lost);
        assert_eq!(h.hosts["b1"].ended_at.as_deref(), Some("t2"));
        assert!(apply(&mut h, "t3", &joined("b1")));
        assert_eq!(h.hosts["b1"].status, HostStatus::Joined);
        assert_eq!(h.hosts["b1"].reason, None);
        // A host the record never saw join changes nothing.
        assert!(!apply(
            &mut h,
            "t4",
            &EventKind::HostLeft {
                host: "ghost".into(),
                reason: "x".into()
            }
        ));
        assert!(!h.hosts.contains_key("ghost"));
        assert!(!apply(
            &mut h,
            "t5",
            &EventKind::LoopStopped {
                loop_name: "a".into()
            }
        ));
    }

    #[test]
    fn refusals_are_counted_and_the_newest_kept() {
        let mut h = HostsSummary::default();
        for i in 0..(REFUSALS_KEPT + 5) {
            apply(
                &mut h,
                &format!("t{i}"),
                &EventKind::HostRefused {
                    address: format!("10.0.0.9:{i}"),
                    host: None,
                    reason: "it did not prove the shared secret".into(),
                },
            );
        }
        assert_eq!(h.refused_total, (REFUSALS_KEPT + 5) as u64);
        assert_eq!(h.refused.len(), REFUSALS_KEPT);
        assert_eq!(h.refused[0].at, "t5");
        assert!(!h.is_empty());
    }
}
