//! Loops taken back from a lost host, and started again elsewhere as `run --resume` would
//! start them: from the last commit of their branch the head holds (the host sends each
//! failed iteration's work before its progress note: `host_loops/checkpoint.rs`), with the
//! iteration after the last one the head recorded as finished, their progress notes, the
//! shares and alerts delivered to them that no finished iteration showed (by delivery
//! number: the record's order of items is the order their deliveries settled, not the
//! order the loop got them; the head hands a lost loop over only once every share and
//! alert delivered to it is recorded, `RemoteLoops::host_gone`), their counters and spend
//! carried forward, all read back from the run's record ([`crate::run::resume::restore`]). The loop waits `pending` until placement finds it a
//! host with a free slot (or the head, when placement allows it), as a new loop does; one
//! whose rule names only the lost host waits for that host to join again. When it starts,
//! `loop_moved` says from where to where, why, and with which iteration; there is no
//! second `loop_started`.
//!
//! A loop moved [`MAX_MOVES`] times already that loses its host again ends interrupted (a
//! loop that takes down whatever host runs it should not take the run's time forever), and
//! so does one lost after the run was asked to stop or while its record cannot be written:
//! `run --resume` goes on with those.
//!
//! A loop whose end is in the record already (its host was lost after sending its last
//! records and before its `Ended`) is not moved: it ends as recorded ([`Back::Ended`]).
//! Its work is on the head too: a host sends its loop's last work as a checkpoint before
//! the events that end the loop (`host_loops/checkpoint.rs`), and the head takes a
//! checkpoint before it takes the records after it, so the head never holds an end whose
//! work it does not hold. A loop whose events cannot be read back ends failed with why.

use std::collections::BTreeMap;
use std::path::Path;

use td_engine::LoopEnd;
use td_protocol::events::EventKind;

use crate::run::record::LoopStatus;

use crate::run::hosts::remote::Lost;
use crate::run::resume::LoopResume;

/// How many times one loop may be moved from a lost host in a run; lost once more, it ends
/// interrupted.
pub const MAX_MOVES: u32 = 3;

/// What becomes of a loop taken back from its lost host.
#[derive(Debug, Clone, PartialEq)]
pub enum Back {
    /// It starts again elsewhere with this.
    Moved(LoopResume),
    /// Its end is in the record (with its work on the head): it ends so.
    Ended(LoopEnd),
}

/// The loops of a run taken back from lost hosts.
#[derive(Debug, Default)]
pub struct Moves {
    /// Taken back and not started again yet: the host each was lost with, and why.
    waiting: BTreeMap<String, Lost>,
    /// Moves of each loop so far (counted when it is taken back).
    count: BTreeMap<String, u32>,
}

impl Moves {
    /// Takes loop `name` back from its lost host, after `iterations` iterations: what it
    /// starts again with, read from the record in `run_dir`, or the end recorded for it; or
    /// why it ends interrupted instead (`stopping`: the run was asked to stop or cannot
    /// write its record). The record is read on a blocking thread: it may be long, and the
    /// run's loop (control requests, other ends) must not wait on it.
    pub async fn take_back(
        &mut self,
        name: &str,
        lost: &Lost,
        iterations: u32,
        run_dir: &Path,
        stopping: bool,
    ) -> Result<Back, String> {
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
        let dir = run_dir.to_path_buf();
        let restored = tokio::task::spawn_blocking(move || crate::run::resume::restore(&dir))
            .await
            .unwrap_or_else(|e| Err(format!("reading it back stopped: {e}")))
            .map_err(|e| interrupted(&format!("its record cannot be read back: {e}")))?;
        let mut resume = restored
            .loops
            .get(name)
            .cloned()
            .ok_or_else(|| interrupted("it is not in the record"))?;
        if let Some(why) = resume.damaged.clone() {
            return Ok(Back::Ended(LoopEnd::Failed {
                iterations,
                reason: why,
            }));
        }
        match resume.finished {
            // Its end is in the record (its host was lost right after sending it), and its
            // work is on the head (sent before that end): it ends as recorded.
            Some(LoopStatus::Completed) => {
                return Ok(Back::Ended(LoopEnd::Completed {
                    iterations,
                    summary: resume.ended_with,
                }));
            }
            Some(LoopStatus::Failed) => {
                return Ok(Back::Ended(LoopEnd::Failed {
                    iterations,
                    reason: resume
                        .ended_with
                        .unwrap_or_else(|| format!("it failed on its host ({})", lost.reason)),
                }));
            }
            Some(_) => return Err(interrupted("its end is in the record already")),
            None => {}
        }
        // Announced when the head said so (a host's own alerts are refused).
        resume.announced = lost.announced;
        self.count.insert(name.to_string(), moves.saturating_add(1));
        self.waiting.insert(name.to_string(), lost.clone());
        Ok(Back::Moved(resume))
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
            announced: true,
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
                summary: Some("m done".into()),
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

    #[tokio::test]
    async fn a_lost_loop_goes_on_after_its_last_finished_iteration_and_is_moved_at_most_three_times()
     {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path(), false);
        let mut moves = Moves::default();
        for n in 1..=MAX_MOVES {
            let Back::Moved(resume) = moves
                .take_back("m", &lost(), 3, dir.path(), false)
                .await
                .unwrap()
            else {
                panic!("not moved");
            };
            assert_eq!(resume.next_iteration, 3);
            assert_eq!(resume.progress, vec!["one".to_string(), "two".to_string()]);
            assert!(resume.announced && resume.finished.is_none());
            let unannounced = Lost {
                announced: false,
                ..lost()
            };
            let Back::Moved(r) = Moves::default()
                .take_back("m", &unannounced, 3, dir.path(), false)
                .await
                .unwrap()
            else {
                panic!("not moved");
            };
            assert!(!r.announced, "the head never announced it");
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
            .take_back("m", &lost(), 3, dir.path(), false)
            .await
            .unwrap_err();
        assert!(why.contains("moved 3 times already"), "{why}");
        assert!(
            why.starts_with("interrupted: its host h1 was lost"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_loop_lost_while_the_run_stops_or_after_its_recorded_end_is_not_moved() {
        let dir = tempfile::tempdir().unwrap();
        record(dir.path(), false);
        let mut moves = Moves::default();
        let why = moves
            .take_back("m", &lost(), 3, dir.path(), true)
            .await
            .unwrap_err();
        assert!(why.contains("the run was stopping"), "{why}");
        assert_eq!(moves.never_restarted("m"), None);
        let ended = tempfile::tempdir().unwrap();
        record(ended.path(), true);
        // Its end is recorded (and its work sent before it): it ends so, not moved.
        let back = moves.take_back("m", &lost(), 3, ended.path(), false).await;
        assert_eq!(
            back,
            Ok(Back::Ended(LoopEnd::Completed {
                iterations: 3,
                summary: Some("m done".into())
            }))
        );
        assert_eq!(moves.never_restarted("m"), None);
        // Its events cannot be read back (a number no run goes on from): it fails alone.
        let damaged = tempfile::tempdir().unwrap();
        record(damaged.path(), false);
        let mut text = std::fs::read_to_string(damaged.path().join(EVENTS_FILE)).unwrap();
        text.push_str(&format!(
            "{}\n",
            serde_json::to_string(&Event {
                seq: 9,
                time: "2026-01-01T00:00:00.000Z".into(),
                kind: EventKind::ProgressNoted {
                    loop_name: "m".into(),
                    iteration: u32::MAX,
                    note: "x".into(),
                },
            })
            .unwrap()
        ));
        std::fs::write(damaged.path().join(EVENTS_FILE), text).unwrap();
        let Ok(Back::Ended(LoopEnd::Failed { iterations, reason })) = moves
            .take_back("m", &lost(), 3, damaged.path(), false)
            .await
        else {
            panic!("a damaged loop was not ended failed");
        };
        assert_eq!(iterations, 3);
        assert!(reason.contains("field `iteration`"), "{reason}");
        // Taken back and never started: the run's end says so.
        moves
            .take_back("m", &lost(), 3, dir.path(), false)
            .await
            .unwrap();
        assert!(
            moves
                .never_restarted("m")
                .unwrap()
                .contains("waiting to start again elsewhere")
        );
    }
}
