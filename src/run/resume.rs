//! What a resumed run needs from the record of the run it continues: which loops ran to
//! their end (never run again), the iteration each other loop goes on with, its progress
//! notes, the inbox items it was sent but never saw in an iteration that finished, and how
//! many model calls its finished iterations made. Everything comes from the record's files
//! (`summary.json` — rebuilt from the events when it is missing or damaged —,
//! `events.jsonl`, transcripts); torn or invalid lines are skipped and reported.
//!
//! Events are the log of what happened; the summary is a view of them that can lag (its
//! rewrite failed on a full disk) or lead (an event append failed). A loop counts as having
//! run to its end when either says so, so that no resume runs finished work again.
//!
//! An iteration counts as finished once its validation ran and what follows from it is
//! recorded: a passing one's `iteration_ended` (the loop completed), a failing one's
//! progress note (written, and synced, right after its `iteration_ended`). One that was cut
//! short — a crash, a stop, a record that could not be written — runs again from its start:
//! its model calls are made again (a scripted run gives the same replies again: its position
//! is the sum of the finished iterations' `model_calls`), and the inbox items it showed are
//! shown again.
//!
//! Which shares and alerts a loop saw goes by their delivery numbers (the head numbers
//! each delivery to a loop when it decides it, `td_protocol::inbox::Delivered`): an item is
//! recorded when all its remote deliveries settle, so the record's order of a loop's items
//! is not the order the loop got them in, and counting "the first so many were shown" lost
//! one and showed another twice. A loop goes on with the numbered items whose numbers no
//! finished iteration's `inbox_shown` names, in number order; items without a number (a
//! record older than numbers, a merge queue's hand back) still go by count, before them.
//! Its next deliveries are numbered after the highest number of its record.
//!
//! Numbers read from the record are checked before anything is computed from them: an event
//! number past [`MAX_SEQ`] refuses the record with the file, line and field; a loop's number
//! it could not go on from (an iteration with no next one, counts that do not add up) fails
//! that loop alone, with the file, line and field ([`LoopResume::damaged`]): one loop's bad
//! line (a hostile host's, say) does not keep the run's other loops from resuming or moving.

use std::collections::BTreeMap;
use std::path::Path;

use crate::run::record::{
    EVENTS_FILE, LoopStatus, LoopSummary, RunSummary, for_each_jsonl, transcript_path,
};
use td_engine::transcript::TranscriptEntry;
use td_protocol::delivery::NumberSet;
use td_protocol::events::{Event, EventKind, MAX_SEQ};
use td_protocol::inbox::{Delivered, InboxItem};

/// How one loop stood when its run stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoopResume {
    /// The status it keeps when it ran to its end (completed, failed, or blocked when its
    /// merge was): such a loop is never run again. `None`: it goes on.
    pub finished: Option<LoopStatus>,
    /// The iteration to run next: the one after the last finished iteration.
    pub next_iteration: u32,
    /// Notes of its finished iterations, in order.
    pub progress: Vec<String>,
    /// Shares and alerts delivered to it that its model never saw in a finished iteration:
    /// those without a delivery number first (a record older than numbers: the first so
    /// many of them count as shown), then those whose numbers no finished iteration showed,
    /// in number order, whatever order the record holds them in (an item is recorded when
    /// all its remote deliveries settle).
    pub unseen_inbox: Vec<Delivered>,
    /// The highest delivery number its record gave it (delivered or shown): its next
    /// deliveries are numbered after it.
    pub last_delivery: u64,
    /// Model calls of its finished iterations (a scripted provider skips that many turns:
    /// the next iteration asks for the reply after them).
    pub responses: usize,
    /// Whether its `loop_started` is in the record: it goes on without being announced again.
    pub announced: bool,
    /// Why its events cannot be continued (a number no run could go on from: a damaged
    /// record, or what a hostile host sent before the head checked it): it ends failed with
    /// this, and the run's other loops go on.
    pub damaged: Option<String>,
    /// The words of its recorded end, when it has one: its completion summary or why it
    /// failed (a loop whose host was lost right after sending its end ends with them).
    pub ended_with: Option<String>,
}

/// The state of a run to resume.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    /// The run id.
    pub run_id: String,
    /// The config file recorded in the summary.
    pub config: Option<String>,
    /// The summary to go on with: read or rebuilt, with the loops that ran to their end
    /// marked so.
    pub summary: RunSummary,
    /// Per loop.
    pub loops: BTreeMap<String, LoopResume>,
    /// The last event number written.
    pub last_seq: u64,
    /// What was wrong in the files (torn lines, a rebuilt summary...), one line each.
    pub warnings: Vec<String>,
}

/// What the events say about one loop while they are read.
struct Seen {
    /// The end the events show last (completed, failed, blocked after completing).
    ended: Option<LoopStatus>,
    next_iteration: u32,
    progress: Vec<String>,
    /// Items without a delivery number shown in finished iterations, and in the iteration
    /// going on (counted: the first so many such items delivered).
    shown: usize,
    shown_pending: usize,
    /// Delivery numbers shown in finished iterations, and in the iteration going on.
    shown_numbers: NumberSet,
    numbers_pending: Vec<[u64; 2]>,
    /// The highest delivery number seen (delivered, refused after numbering, or shown).
    last_delivery: u64,
    delivered: Vec<Delivered>,
    /// A failing iteration waiting for its progress note: (number, model calls).
    awaiting_note: Option<(u32, Option<u32>)>,
    /// Model calls of the finished iterations; `None` once one of them did not say (a
    /// record older than `model_calls`: the transcript is counted instead).
    model_calls: Option<usize>,
    /// A `loop_started` event was seen.
    started: bool,
    /// Its last end was followed by a hand back of the merge queue: it goes on.
    handed_back: bool,
    /// The summary of its last completion, or why it last failed.
    ended_with: Option<String>,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            ended: None,
            next_iteration: 0,
            progress: Vec::new(),
            shown: 0,
            shown_pending: 0,
            shown_numbers: NumberSet::default(),
            numbers_pending: Vec::new(),
            last_delivery: 0,
            delivered: Vec::new(),
            awaiting_note: None,
            model_calls: Some(0),
            started: false,
            handed_back: false,
            ended_with: None,
        }
    }
}

impl Seen {
    /// Iteration `n`, which made `calls` model calls, finished.
    fn finish(&mut self, n: u32, calls: Option<u32>) -> Result<(), String> {
        let next = n
            .checked_add(1)
            .ok_or_else(|| format!("field `iteration` is {n}: no iteration can follow it"))?;
        self.next_iteration = self.next_iteration.max(next);
        self.shown = self.shown.checked_add(self.shown_pending).ok_or_else(|| {
            "field `items` of the inbox_shown events before it adds up past any count".to_string()
        })?;
        self.shown_pending = 0;
        for [lo, hi] in self.numbers_pending.drain(..) {
            self.shown_numbers.insert(lo, hi);
        }
        self.awaiting_note = None;
        self.model_calls = match (self.model_calls, calls) {
            (Some(sum), Some(c)) => Some(sum.checked_add(c as usize).ok_or_else(|| {
                format!("field `model_calls` is {c}: with the calls before, past any count")
            })?),
            _ => None,
        };
        Ok(())
    }
}

impl Seen {
    /// Delivery number `n` (of field `field`) was given to this loop.
    fn numbered(&mut self, n: Option<u64>, field: &str) -> Result<(), String> {
        match n {
            Some(n) if n > MAX_SEQ => Err(format!(
                "field `{field}` has delivery number {n}, past the largest a run may reach ({MAX_SEQ})"
            )),
            Some(n) => {
                self.last_delivery = self.last_delivery.max(n);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// What of `delivered` a loop goes on with: the items without a number past the first
/// `shown` of them (the count rule of records older than numbers), then the numbered ones
/// whose numbers are not in `numbers`, in number order (a number recorded twice counts
/// once).
fn unseen(delivered: Vec<Delivered>, shown: usize, numbers: &NumberSet) -> Vec<Delivered> {
    let mut unnumbered = Vec::new();
    let mut numbered = BTreeMap::new();
    for item in delivered {
        match item.delivery {
            None => unnumbered.push(item),
            Some(n) if !numbers.contains(n) => {
                numbered.entry(n).or_insert(item);
            }
            Some(_) => {}
        }
    }
    unnumbered
        .into_iter()
        .skip(shown)
        .chain(numbered.into_values())
        .collect()
}

/// Reads the record in `run_dir`; an error when it cannot be continued.
pub fn restore(run_dir: &Path) -> Result<Restored, String> {
    let (mut summary, mut warnings) = crate::run::rebuild::load_summary(run_dir)?;
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut last_seq = 0u64;
    let mut refused: Option<String> = None;
    // The first line of each loop whose numbers cannot go on, and why.
    let mut damaged: BTreeMap<String, String> = BTreeMap::new();
    for_each_jsonl::<Event>(&run_dir.join(EVENTS_FILE), |line, event| {
        if refused.is_some() {
            return;
        }
        match event {
            Ok(event) => {
                let Err(why) = take_event(&mut seen, &mut last_seq, &event) else {
                    return;
                };
                let place = format!("{} line {line}", run_dir.join(EVENTS_FILE).display());
                match numbered_loop(&event.kind) {
                    Some(name) if event.seq <= MAX_SEQ => {
                        damaged.entry(name.to_string()).or_insert_with(|| {
                            format!(
                                "{place}: {why}; loop {name} cannot be continued from this record \
                                 (a damaged or edited file, or a number its host should not have \
                                 sent): it ends failed; restore the line to run it again"
                            )
                        });
                    }
                    _ => {
                        refused = Some(format!(
                            "{place}: {why}; this record cannot be continued (a damaged or \
                             edited file?): restore the line or start a new run"
                        ));
                    }
                }
            }
            Err(why) => warnings.push(format!("{EVENTS_FILE} line {line}: {why} (skipped)")),
        }
    })?;
    if let Some(why) = refused {
        return Err(why);
    }
    let mut loops = BTreeMap::new();
    let names: Vec<String> = summary.loops.keys().chain(seen.keys()).cloned().collect();
    for name in names {
        if loops.contains_key(&name) {
            continue;
        }
        let events = seen.remove(&name).unwrap_or_default();
        let announced = events.started;
        let ended_with = events.ended_with.clone();
        let entry = summary
            .loops
            .entry(name.clone())
            .or_insert_with(|| LoopSummary::pending(&name, ""));
        let broken = damaged.remove(&name);
        let finished = if let Some(why) = &broken {
            warnings.push(why.clone());
            entry.reason = Some(why.clone());
            Some(LoopStatus::Failed)
        } else if events.handed_back {
            None
        } else {
            finished(entry, events.ended)
        };
        if let Some(status) = finished {
            // The summary may lag behind the events: it says what resume goes by.
            entry.status = status;
        }
        let next_iteration = events.next_iteration.max(1);
        let counted = replies_used(run_dir, &name, next_iteration, &mut warnings);
        let responses = events.model_calls.unwrap_or(counted);
        let last_delivery = events.last_delivery;
        let unseen_inbox = unseen(events.delivered, events.shown, &events.shown_numbers);
        report_bad_receipts(run_dir, &name, &mut warnings);
        loops.insert(
            name,
            LoopResume {
                finished,
                next_iteration,
                progress: events.progress,
                unseen_inbox,
                last_delivery,
                responses,
                announced,
                damaged: broken,
                ended_with,
            },
        );
    }
    Ok(Restored {
        run_id: summary.run_id.clone(),
        config: summary.config.clone(),
        summary,
        loops,
        last_seq,
        warnings,
    })
}

/// The end a loop ran to, from its summary entry and its events; `None` when it goes on.
/// Either source suffices: the summary lags when its rewrite failed, the events when an
/// append failed. Blocked wins over completed (a loop is blocked after it completed, when
/// its merge was refused), and the events' end over the summary's otherwise.
fn finished(summary: &LoopSummary, events: Option<LoopStatus>) -> Option<LoopStatus> {
    let from_summary = match summary.status {
        LoopStatus::Completed | LoopStatus::Failed => Some(summary.status),
        // Only a loop that completed has a merge; blocked without one, it never ran.
        LoopStatus::Blocked if summary.merge.is_some() => Some(LoopStatus::Blocked),
        _ => None,
    };
    match (from_summary, events) {
        (Some(LoopStatus::Blocked), Some(_)) | (Some(_), Some(LoopStatus::Blocked)) => {
            Some(LoopStatus::Blocked)
        }
        (_, Some(e)) => Some(e),
        (s, None) => s,
    }
}

/// The loop whose numbers `kind` carries (the events [`take_event`] may refuse for one
/// loop): a refusal of it fails that loop only.
fn numbered_loop(kind: &EventKind) -> Option<&str> {
    match kind {
        EventKind::IterationEnded { loop_name, .. }
        | EventKind::ProgressNoted { loop_name, .. }
        | EventKind::InboxShown { loop_name, .. }
        | EventKind::Shared { to: loop_name, .. } => Some(loop_name),
        // The recipient whose number is refused.
        EventKind::Alert { deliveries, .. } => deliveries
            .iter()
            .find(|(_, n)| **n > MAX_SEQ)
            .map(|(name, _)| name.as_str()),
        _ => None,
    }
}

/// Takes one event into `seen`, checking every number a resumed run computes with.
fn take_event(
    seen: &mut BTreeMap<String, Seen>,
    last_seq: &mut u64,
    event: &Event,
) -> Result<(), String> {
    if event.seq > MAX_SEQ {
        return Err(format!(
            "field `seq` is {}, past the largest event number a run may reach ({MAX_SEQ})",
            event.seq
        ));
    }
    *last_seq = (*last_seq).max(event.seq);
    fn of<'a>(seen: &'a mut BTreeMap<String, Seen>, name: &str) -> &'a mut Seen {
        seen.entry(name.to_string()).or_default()
    }
    match &event.kind {
        EventKind::LoopStarted { loop_name, .. } => of(seen, loop_name).started = true,
        EventKind::IterationEnded {
            loop_name,
            iteration,
            validation_passed,
            model_calls,
            ..
        } => {
            let l = of(seen, loop_name);
            match validation_passed {
                // Cut short: it runs again, and shows again what it showed.
                None => {
                    l.shown_pending = 0;
                    l.numbers_pending.clear();
                    l.awaiting_note = None;
                }
                // The engine completes a loop as soon as its validation passes.
                Some(true) => {
                    l.finish(*iteration, *model_calls)?;
                    l.ended = Some(LoopStatus::Completed);
                }
                // Finished once its note is recorded too.
                Some(false) => l.awaiting_note = Some((*iteration, *model_calls)),
            }
        }
        EventKind::ProgressNoted {
            loop_name,
            iteration,
            note,
        } => {
            let l = of(seen, loop_name);
            let calls = match l.awaiting_note {
                Some((n, calls)) if n == *iteration => calls,
                // Its iteration's end is not there (a torn line): the transcript counts.
                _ => None,
            };
            l.finish(*iteration, calls)?;
            l.progress.push(note.clone());
        }
        EventKind::LoopCompleted {
            loop_name, summary, ..
        } => {
            let l = of(seen, loop_name);
            l.ended = Some(LoopStatus::Completed);
            l.handed_back = false;
            l.ended_with = summary.clone();
        }
        EventKind::MergeHandedBack { loop_name, .. } => {
            // Its work went back to it: it runs its next iteration, whatever a summary
            // written before the hand back says.
            let l = of(seen, loop_name);
            l.ended = None;
            l.handed_back = true;
        }
        EventKind::LoopFailed { loop_name, reason } => {
            let l = of(seen, loop_name);
            l.ended = Some(LoopStatus::Failed);
            l.ended_with = Some(reason.clone());
        }
        EventKind::LoopBlocked { loop_name, .. } => {
            let l = of(seen, loop_name);
            // Blocked before it ran (a dependency failed): it may run now.
            if l.ended == Some(LoopStatus::Completed) {
                l.ended = Some(LoopStatus::Blocked);
            }
        }
        EventKind::Shared {
            from,
            to,
            data_type,
            data,
            error,
            delivery,
        } => {
            let l = of(seen, to);
            l.numbered(*delivery, "delivery")?;
            if error.is_none() {
                l.delivered.push(Delivered {
                    delivery: *delivery,
                    item: InboxItem::Share {
                        from: from.clone(),
                        data_type: data_type.clone(),
                        data: data.clone(),
                    },
                });
            }
        }
        EventKind::Alert {
            from,
            event_type,
            message,
            data,
            recipients,
            error,
            deliveries,
        } => {
            for (to, n) in deliveries {
                of(seen, to).numbered(Some(*n), "deliveries")?;
            }
            if error.is_none() {
                for to in recipients {
                    of(seen, to).delivered.push(Delivered {
                        delivery: deliveries.get(to).copied(),
                        item: InboxItem::Alert {
                            from: from.clone(),
                            event_type: event_type.clone(),
                            message: message.clone(),
                            data: data.clone(),
                            // Not in the event log: such alerts are shown one by one.
                            about: None,
                        },
                    });
                }
            }
        }
        EventKind::InboxShown {
            loop_name,
            items,
            deliveries,
        } => {
            let l = of(seen, loop_name);
            let mut numbered = 0u64;
            for &[lo, hi] in deliveries {
                if lo > hi || hi > MAX_SEQ {
                    return Err(format!(
                        "field `deliveries` has [{lo}, {hi}], not a range of delivery numbers \
                         (at most {MAX_SEQ})"
                    ));
                }
                l.numbered(Some(hi), "deliveries")?;
                numbered = numbered.saturating_add(hi - lo + 1);
            }
            let unnumbered = u64::try_from(*items)
                .ok()
                .and_then(|items| items.checked_sub(numbered))
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    format!("field `items` is {items}: fewer than the {numbered} numbered items it shows")
                })?;
            l.shown_pending = l.shown_pending.checked_add(unnumbered).ok_or_else(|| {
                format!("field `items` is {items}: with the items shown before, past any count")
            })?;
            l.numbers_pending.extend_from_slice(deliveries);
        }
        _ => {}
    }
    Ok(())
}

/// The iteration replies the finished iterations (those before `next_iteration`) of
/// `name` used: for each, the replies of its last attempt in the transcript (an iteration
/// cut short and run again appears twice; only the attempt that finished counts).
fn replies_used(
    run_dir: &Path,
    name: &str,
    next_iteration: u32,
    warnings: &mut Vec<String>,
) -> usize {
    let Ok(path) = transcript_path(run_dir, name) else {
        return 0;
    };
    if !path.is_file() {
        return 0;
    }
    let mut attempt: BTreeMap<u32, usize> = BTreeMap::new();
    let read = for_each_jsonl::<TranscriptEntry>(&path, |line, entry| match entry {
        Ok(TranscriptEntry::IterationStarted { iteration, .. }) => {
            attempt.insert(iteration, 0);
        }
        Ok(TranscriptEntry::Response { iteration, .. }) if iteration > 0 => {
            let n = attempt.entry(iteration).or_default();
            *n = n.saturating_add(1);
        }
        Ok(_) => {}
        Err(why) => warnings.push(format!(
            "loops/{name}/transcript.jsonl line {line}: {why} (skipped)"
        )),
    });
    if let Err(e) = read {
        warnings.push(e);
    }
    attempt
        .range(..next_iteration)
        .fold(0usize, |sum, (_, n)| sum.saturating_add(*n))
}

fn report_bad_receipts(run_dir: &Path, name: &str, warnings: &mut Vec<String>) {
    let Ok(dir) = crate::run::record::loop_dir(run_dir, name) else {
        return;
    };
    if let Ok(r) = td_toolkit::receipts::read_log(&dir.join(crate::run::record::RECEIPTS_FILE)) {
        for (line, why) in &r.bad_lines {
            warnings.push(format!(
                "loops/{name}/receipts.jsonl line {line}: {why} (skipped)"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::MergeSummary;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            time: "2026-01-01T00:00:00.000Z".into(),
            kind,
        }
    }

    fn ended(iteration: u32, passed: Option<bool>) -> EventKind {
        EventKind::IterationEnded {
            loop_name: "a".into(),
            iteration,
            ended_by: "end_turn".into(),
            validation_exit: None,
            validation_passed: passed,
            model_calls: Some(1),
            spend: None,
            wall_ms: None,
        }
    }

    fn shown(items: usize) -> EventKind {
        EventKind::InboxShown {
            loop_name: "a".into(),
            items,
            deliveries: Vec::new(),
        }
    }

    #[test]
    fn either_the_summary_or_the_events_can_say_a_loop_ended() {
        let mut l = LoopSummary::pending("a", "t");
        assert_eq!(finished(&l, None), None);
        assert_eq!(
            finished(&l, Some(LoopStatus::Completed)),
            Some(LoopStatus::Completed)
        );
        l.status = LoopStatus::Running;
        assert_eq!(
            finished(&l, Some(LoopStatus::Failed)),
            Some(LoopStatus::Failed)
        );
        l.status = LoopStatus::Completed;
        assert_eq!(finished(&l, None), Some(LoopStatus::Completed));
        assert_eq!(
            finished(&l, Some(LoopStatus::Blocked)),
            Some(LoopStatus::Blocked)
        );
        // Blocked before it ran (no merge): it may run; blocked by its merge: it ran.
        l.status = LoopStatus::Blocked;
        assert_eq!(finished(&l, None), None);
        l.merge = Some(MergeSummary::default());
        assert_eq!(finished(&l, None), Some(LoopStatus::Blocked));
        assert_eq!(
            finished(&l, Some(LoopStatus::Completed)),
            Some(LoopStatus::Blocked)
        );
        l.status = LoopStatus::Stopped;
        l.merge = None;
        assert_eq!(finished(&l, None), None);
    }

    fn noted(iteration: u32) -> EventKind {
        EventKind::ProgressNoted {
            loop_name: "a".into(),
            iteration,
            note: format!("note {iteration}"),
        }
    }

    #[test]
    fn only_finished_iterations_count() {
        let mut seen = BTreeMap::new();
        let mut last = 0;
        for (seq, kind) in [
            (1, shown(2)),
            (2, ended(1, Some(false))),
            (3, noted(1)),
            (4, shown(1)),
            // Cut short: what it showed is shown again, and it runs again.
            (5, ended(2, None)),
            (6, shown(3)),
            // Its validation failed but its note is not there: not finished either.
            (7, ended(2, Some(false))),
        ] {
            take_event(&mut seen, &mut last, &event(seq, kind)).unwrap();
        }
        let a = &seen["a"];
        assert_eq!((a.next_iteration, a.shown, a.shown_pending), (2, 2, 3));
        assert_eq!((a.ended, a.model_calls), (None, Some(1)));
        assert_eq!(a.progress, ["note 1"]);
        assert_eq!(last, 7);
        take_event(&mut seen, &mut last, &event(8, noted(2))).unwrap();
        take_event(&mut seen, &mut last, &event(9, ended(3, Some(true)))).unwrap();
        let a = &seen["a"];
        assert_eq!((a.next_iteration, a.shown, a.model_calls), (4, 5, Some(3)));
        assert_eq!(a.ended, Some(LoopStatus::Completed));
        assert_eq!(a.progress, ["note 1", "note 2"]);
    }

    fn seen_handed_back() -> EventKind {
        EventKind::MergeHandedBack {
            loop_name: "a".into(),
            into: "main".into(),
            attempt: 1,
            reason: "conflict".into(),
            files: vec!["x".into()],
        }
    }

    #[test]
    fn a_loop_handed_back_by_the_merge_queue_goes_on() {
        let mut seen = BTreeMap::new();
        let mut last = 0;
        let handed = seen_handed_back();
        let completed = EventKind::LoopCompleted {
            loop_name: "a".into(),
            iterations: 1,
            summary: None,
        };
        for (seq, kind) in [
            (1, ended(1, Some(true))),
            (2, completed.clone()),
            (3, handed),
        ] {
            take_event(&mut seen, &mut last, &event(seq, kind)).unwrap();
        }
        let a = &seen["a"];
        assert_eq!((a.ended, a.handed_back, a.next_iteration), (None, true, 2));
        // Read back from a record (its summary rebuilt from the events): it goes on at its
        // next iteration, running.
        let dir = tempfile::tempdir().unwrap();
        let started = EventKind::RunStarted {
            run_id: "r1".into(),
            config: None,
            loops: vec![td_protocol::events::PlannedLoop {
                name: "a".into(),
                loop_type: "code".into(),
            }],
            sandbox: None,
            attributes_from: None,
        };
        let lines: Vec<String> = [
            started,
            ended(1, Some(true)),
            completed.clone(),
            seen_handed_back(),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, k)| serde_json::to_string(&event(i as u64 + 1, k)).unwrap())
        .collect();
        std::fs::write(dir.path().join(EVENTS_FILE), lines.join("\n") + "\n").unwrap();
        let restored = restore(dir.path()).unwrap();
        assert_eq!(restored.loops["a"].finished, None);
        assert_eq!(restored.loops["a"].next_iteration, 2);
        assert_eq!(restored.summary.loops["a"].status, LoopStatus::Running);
        assert_eq!(
            restored.summary.loops["a"]
                .merge
                .as_ref()
                .map(|m| m.attempts),
            Some(1)
        );
        // A summary that lags (written before the hand back: completed) does not end it.
        let mut lagging = restored.summary.clone();
        if let Some(l) = lagging.loops.get_mut("a") {
            l.status = LoopStatus::Completed;
            l.merge = None;
        }
        std::fs::write(
            dir.path().join(crate::run::record::SUMMARY_FILE),
            serde_json::to_string(&lagging).unwrap(),
        )
        .unwrap();
        let restored = restore(dir.path()).unwrap();
        assert_eq!(
            restored.loops["a"].finished, None,
            "{:?}",
            restored.warnings
        );
        // Completed again after it: finished.
        take_event(&mut seen, &mut last, &event(4, ended(2, Some(true)))).unwrap();
        take_event(&mut seen, &mut last, &event(5, completed)).unwrap();
        let a = &seen["a"];
        assert_eq!(
            (a.ended, a.handed_back),
            (Some(LoopStatus::Completed), false)
        );
    }

    /// A loop whose events cannot be continued (a hostile host's numbers in an older
    /// record) fails alone, with why: the run and its other loops read back.
    #[test]
    fn a_loop_whose_numbers_cannot_go_on_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let other = |kind: EventKind| -> EventKind {
            let mut v = serde_json::to_value(kind).unwrap();
            v["loop_name"] = "b".into();
            serde_json::from_value(v).unwrap()
        };
        let lines: Vec<String> = [
            noted(1),
            other(noted(1)),
            noted(u32::MAX),
            shown(usize::MAX),
            shown(usize::MAX),
            other(noted(2)),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, k)| serde_json::to_string(&event(i as u64 + 1, k)).unwrap())
        .collect();
        std::fs::write(dir.path().join(EVENTS_FILE), lines.join("\n") + "\n").unwrap();
        let restored = restore(dir.path()).unwrap();
        let b = &restored.loops["b"];
        assert_eq!((b.finished, b.next_iteration), (None, 3));
        assert_eq!(b.damaged, None);
        let a = &restored.loops["a"];
        assert_eq!(a.finished, Some(LoopStatus::Failed));
        let why = a.damaged.clone().unwrap();
        assert!(
            why.contains("line 3") && why.contains("field `iteration`"),
            "{why}"
        );
        assert_eq!(restored.summary.loops["a"].status, LoopStatus::Failed);
        assert_eq!(
            restored.summary.loops["a"].reason.as_deref(),
            Some(why.as_str())
        );
        assert!(
            restored
                .warnings
                .iter()
                .any(|w| w.contains("field `iteration`"))
        );
        assert_eq!(restored.last_seq, 6);
    }

    fn share(data: &str, delivery: Option<u64>) -> EventKind {
        EventKind::Shared {
            from: "b".into(),
            to: "a".into(),
            data_type: "note".into(),
            data: data.into(),
            error: None,
            delivery,
        }
    }

    fn alert(message: &str, delivery: Option<u64>) -> EventKind {
        EventKind::Alert {
            from: "b".into(),
            event_type: "note".into(),
            message: message.into(),
            data: None,
            recipients: vec!["a".into()],
            error: None,
            deliveries: delivery.map(|n| ("a".to_string(), n)).into_iter().collect(),
        }
    }

    fn shown_numbers(items: usize, deliveries: Vec<[u64; 2]>) -> EventKind {
        EventKind::InboxShown {
            loop_name: "a".into(),
            items,
            deliveries,
        }
    }

    /// Restores loop `a` from `kinds` written as a record's events.
    fn restored_a(kinds: Vec<EventKind>) -> LoopResume {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = kinds
            .into_iter()
            .enumerate()
            .map(|(i, k)| serde_json::to_string(&event(i as u64 + 1, k)).unwrap())
            .collect();
        std::fs::write(dir.path().join(EVENTS_FILE), lines.join("\n") + "\n").unwrap();
        restore(dir.path()).unwrap().loops["a"].clone()
    }

    /// What an item's text is, to compare what a loop goes on with.
    fn texts(items: &[Delivered]) -> Vec<(Option<u64>, String)> {
        items
            .iter()
            .map(|d| match &d.item {
                InboxItem::Share { data, .. } => (d.delivery, data.to_string()),
                InboxItem::Alert { message, .. } => (d.delivery, message.clone()),
            })
            .collect()
    }

    /// Issue 18: items are recorded when they settle, not in the order a loop got them. The
    /// loop was delivered X (1), Y (2), Z (3); its finished iteration 1 showed X; the
    /// record holds Y, then X, then Z; its iteration 2, cut short, showed Z. It goes on with
    /// Y and Z, in that order; X never again.
    #[test]
    fn a_loop_goes_on_with_the_numbers_it_did_not_show_in_number_order() {
        let a = restored_a(vec![
            shown_numbers(1, vec![[1, 1]]),
            share("Y", Some(2)),
            ended(1, Some(false)),
            noted(1),
            alert("X", Some(1)),
            alert("Z", Some(3)),
            shown_numbers(1, vec![[3, 3]]),
        ]);
        assert_eq!(
            texts(&a.unseen_inbox),
            [(Some(2), "\"Y\"".to_string()), (Some(3), "Z".to_string())]
        );
        assert_eq!((a.next_iteration, a.last_delivery), (2, 3));
        // Once an iteration that showed Y and Z finishes, nothing is left.
        let a = restored_a(vec![
            shown_numbers(1, vec![[1, 1]]),
            share("Y", Some(2)),
            ended(1, Some(false)),
            noted(1),
            alert("X", Some(1)),
            alert("Z", Some(3)),
            shown_numbers(2, vec![[2, 3]]),
            noted(2),
        ]);
        assert!(a.unseen_inbox.is_empty(), "{:?}", a.unseen_inbox);
        // A number shown in an iteration cut short, whose item never reached the record
        // (its settle was cut by the crash), is still not given again.
        let a = restored_a(vec![share("Y", Some(2)), shown_numbers(1, vec![[5, 5]])]);
        assert_eq!(a.last_delivery, 5);
        assert_eq!(texts(&a.unseen_inbox), [(Some(2), "\"Y\"".to_string())]);
    }

    /// A record older than delivery numbers goes by count, as it did: the first so many
    /// items delivered are the ones shown. Items without a number (such a record's, a merge
    /// queue's hand back) go first, then the numbered ones.
    #[test]
    fn a_record_without_numbers_goes_by_count() {
        let a = restored_a(vec![
            share("one", None),
            share("two", None),
            shown(1),
            noted(1),
            alert("three", None),
        ]);
        assert_eq!(
            texts(&a.unseen_inbox),
            [(None, "\"two\"".to_string()), (None, "three".to_string())]
        );
        assert_eq!(a.last_delivery, 0);
        // Resumed by a newer version: numbered items after, shown by number, the rest by
        // count (an `inbox_shown` of 2 items naming one number showed one without).
        let a = restored_a(vec![
            share("one", None),
            share("two", None),
            shown(1),
            noted(1),
            share("four", Some(1)),
            share("five", Some(2)),
            shown_numbers(2, vec![[2, 2]]),
            noted(2),
        ]);
        assert_eq!(texts(&a.unseen_inbox), [(Some(1), "\"four\"".to_string())]);
    }

    #[test]
    fn delivery_numbers_that_cannot_be_are_refused_by_field_for_that_loop() {
        for (kind, field) in [
            (share("x", Some(MAX_SEQ + 1)), "delivery"),
            (alert("x", Some(u64::MAX)), "deliveries"),
            (shown_numbers(1, vec![[3, 2]]), "deliveries"),
            (shown_numbers(1, vec![[1, MAX_SEQ + 1]]), "deliveries"),
            (shown_numbers(1, vec![[1, 2]]), "items"),
        ] {
            assert_eq!(numbered_loop(&kind), Some("a"), "{kind:?}");
            let e = take_event(&mut BTreeMap::new(), &mut 0, &event(1, kind)).unwrap_err();
            assert!(e.contains(&format!("field `{field}`")), "{e}");
        }
        // Read back: that loop fails alone, saying which line and field.
        let a = restored_a(vec![noted(1), shown_numbers(1, vec![[1, 2]]), noted(2)]);
        assert_eq!(a.finished, Some(LoopStatus::Failed));
        assert!(
            a.damaged.as_deref().unwrap_or("").contains("field `items`"),
            "{a:?}"
        );
    }

    #[test]
    fn numbers_that_cannot_go_on_are_refused_by_field() {
        let mut seen = BTreeMap::new();
        let mut last = 0;
        let e = take_event(&mut seen, &mut last, &event(MAX_SEQ + 1, shown(0))).unwrap_err();
        assert!(e.contains("field `seq`"), "{e}");
        take_event(&mut seen, &mut last, &event(MAX_SEQ, shown(0))).unwrap();
        assert_eq!(last, MAX_SEQ);
        let e =
            take_event(&mut seen, &mut last, &event(1, ended(u32::MAX, Some(true)))).unwrap_err();
        assert!(e.contains("field `iteration`"), "{e}");
        take_event(
            &mut seen,
            &mut last,
            &event(2, ended(u32::MAX - 1, Some(true))),
        )
        .unwrap();
        assert_eq!(seen["a"].next_iteration, u32::MAX);
        let e = take_event(&mut seen, &mut last, &event(3, noted(u32::MAX))).unwrap_err();
        assert!(e.contains("field `iteration`"), "{e}");
        take_event(&mut seen, &mut last, &event(3, shown(usize::MAX))).unwrap();
        let e = take_event(&mut seen, &mut last, &event(4, shown(1))).unwrap_err();
        assert!(e.contains("field `items`"), "{e}");
    }
}
