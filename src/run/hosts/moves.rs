//! Loops taken back from a lost host, and started again elsewhere as `run --resume` would
//! start them: from the last commit of their branch the head holds (the host sends each
//! failed iteration's work before its progress note: `host_loops/checkpoint.rs`), with the
//! iteration after the last one the head recorded as finished, their progress notes, the
//! shares and alerts delivered to them that no finished iteration showed, their counters
//! and spend carried forward, all read back from the run's record
//! ([`crate::run::resume::restore`]). The loop waits `pending` until placement finds it a
//! host with a free slot (or the head, when placement allows it), as a new loop does; one
//! whose rule names only the lost host waits for that host to join again. When it starts,
//! `loop_moved` says from where to where, why, and with which iteration; there is no
//! second `loop_started`.
//!
//! A loop moved [`MAX_MOVES`] times already that loses its host again ends interrupted (a
//! loop that takes down whatever host runs it should not take the run's time forever), and
//! so does one lost after the run was asked to stop or while its record cannot be written:
//! `run --resume` goes on with those.

use std::collections::BTreeMap;
use std::path::Path;

use td_protocol::events::EventKind;

use crate::run::hosts::remote::Lost;
use crate::run::resume::LoopResume;

/// How many times one loop may be moved from a lost host in a run; lost once more, it ends
/// interrupted.
pub const MAX_MOVES: u32 = 3;

/// The loops of a run taken back from lost hosts.
#[derive(Debug, Default)]
pub struct Moves {
    /// Taken back and not started again yet: the host each was lost with, and why.
    waiting: BTreeMap<String, Lost>,
    /// Moves of each loop so far (counted when it is taken back).
    count: BTreeMap<String, u32>,
}

impl Moves {
    /// Takes loop `name` back from its lost host: what it starts again with, read from the
    /// record in `run_dir`; or why it ends interrupted instead (`stopping`: the run was
    /// asked to stop or cannot write its record).
    pub fn take_back(
        &mut self,
        name: &str,
        lost: &Lost,
        run_dir: &Path,
        stopping: bool,
    ) -> Result<LoopResume, String> {
        let interrupted = |more: &str| {
            format!(
                "interrupted: {} ({more}); `run --resume` runs it again from its last commit",
                lost.reason
            )
        };
        if stopping {
            return Err(interrupted("the run was stopping, so it was not moved"));
        }
        let moves = self.count.get(name).copied().unwrap_or(0);
        if moves >= MAX_MOVES {
            return Err(interrupted(&format!(
                "it was moved {moves} times already, the most a run moves a loop"
            )));
        }
        // Its events, transcript and receipts up to the last batch the head took are in the
        // record: what a resumed run would go on with.
        let restored = crate::run::resume::restore(run_dir)
            .map_err(|e| interrupted(&format!("its record cannot be read back: {e}")))?;
        let mut resume = restored
            .loops
            .get(name)
            .cloned()
            .ok_or_else(|| interrupted("it is not in the record"))?;
        if resume.finished.is_some() {
            // Its end is in the record (its host was lost right after sending it): not run
            // again, and not moved.
            return Err(interrupted("its end is in the record already"));
        }
        resume.announced = true;
        self.count.insert(name.to_string(), moves.saturating_add(1));
        self.waiting.insert(name.to_string(), lost.clone());
        Ok(resume)
    }

    /// Loop `name` started at `to` (a host, or `head`) with `iteration`: the `loop_moved`
    /// event when it was taken back from a lost host, `None` otherwise.
    pub fn started(&mut self, name: &str, to: &str, iteration: u32) -> Option<EventKind> {
        let lost = self.waiting.remove(name)?;
        Some(EventKind::LoopMoved {
            loop_name: name.to_string(),
            from_host: lost.host,
            to_host: to.to_string(),
            reason: lost.reason,
            iteration,
            moves: self.count.get(name).copied().unwrap_or(1),
        })
    }

    /// The host loop `name` was taken back from, while it waits to start again.
    pub fn moving(&self, name: &str) -> Option<&Lost> {
        self.waiting.get(name)
    }

    /// Why loop `name`, taken back from a lost host, had not started again when the run
    /// ended; `None` for a loop that was not.
    pub fn never_restarted(&self, name: &str) -> Option<String> {
        self.waiting.get(name).map(|lost| {
            format!(
                "interrupted: {}; it was waiting to start again elsewhere when the run ended (`run --resume` goes on with it)",
                lost.reason
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::EVENTS_FILE;
    use td_protocol::events::Event;

    fn lost() -> Lost {
        Lost {
            host: "h1".into(),
            reason: "its host h1 was lost: its connection closed".into(),
        }
    }

    /// A run directory whose record says loop `m` finished iterations 1 and 2 (notes) and
    /// was cut in iteration 3.
    fn record(dir: &Path, ended: bool) {
        let mut events = vec![
            EventKind::LoopStarted {
                loop_name: "m".into(),
                loop_type: "ralph".into(),
                host: None,
            },
            EventKind::ProgressNoted {
                loop_name: "m".into(),
                iteration: 1,
                note: "one".into(),
            },
            EventKind::ProgressNoted {
                loop_name: "m".into(),
                iteration: 2,
                note: "two".into(),
            },
            EventKind::IterationStarted {
                loop_name: "m".into(),
                iteration: 3,
            },
        ];
        if ended {
            events.push(EventKind::LoopCompleted {
                loop_name: "m".into(),
                iterations: 3,
                summary: None,
            });
        }
        let text: String = events
            .into_iter()
            .enumerate()
            .map(|(i, kind)| {
                let event = Event {
                    seq: i as u64 + 1,
                    time: "2026-01-01T00:00:00.000Z".into(),
                    kind,
                };
                format!("{}\n", serde_json::to_string(&event).unwrap())
            })
            .collect();
        // No summary.json: it is rebuilt from the events, as a resume does.
        std::fs::write(dir.join(EVENTS_FILE), text).unwrap();
    }

    #[test]
    fn a_lost_loop_goes_on_after_its_last_finished_iteration_and_is_moved_at_most_three_times() {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path(), false);
        let mut moves = Moves::default();
        for n in 1..=MAX_MOVES {
            let resume = moves.take_back("m", &lost(), dir.path(), false).unwrap();
            assert_eq!(resume.next_iteration, 3);
            assert_eq!(resume.progress, vec!["one".to_string(), "two".to_string()]);
            assert!(resume.announced && resume.finished.is_none());
            let event = moves.started("m", "h2", 3).unwrap();
            assert_eq!(
                event,
                EventKind::LoopMoved {
                    loop_name: "m".into(),
                    from_host: "h1".into(),
                    to_host: "h2".into(),
                    reason: lost().reason,
                    iteration: 3,
                    moves: n,
                }
            );
            // Started once: no second event.
            assert_eq!(moves.started("m", "h2", 3), None);
        }
        let why = moves
            .take_back("m", &lost(), dir.path(), false)
            .unwrap_err();
        assert!(why.contains("moved 3 times already"), "{why}");
        assert!(
            why.starts_with("interrupted: its host h1 was lost"),
            "{why}"
        );
    }

    #[test]
    fn a_loop_lost_while_the_run_stops_or_after_its_end_is_not_moved() {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path(), false);
        let mut moves = Moves::default();
        let why = moves.take_back("m", &lost(), dir.path(), true).unwrap_err();
        assert!(why.contains("the run was stopping"), "{why}");
        assert_eq!(moves.never_restarted("m"), None);
        let ended = tempfile::tempdir().unwrap();
        record(ended.path(), true);
        let why = moves
            .take_back("m", &lost(), ended.path(), false)
            .unwrap_err();
        assert!(why.contains("its end is in the record"), "{why}");
        // Taken back and never started: the run's end says so.
        moves.take_back("m", &lost(), dir.path(), false).unwrap();
        assert!(
            moves
                .never_restarted("m")
                .unwrap()
                .contains("waiting to start again elsewhere")
        );
    }
}
