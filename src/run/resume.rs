//! What a resumed run needs from the record of the run it continues: each loop's status,
//! the iteration to go on with, its progress notes, the inbox items it was sent but never
//! shown, and how many model responses it already had. Everything comes from the record's
//! files (`summary.json`, `events.jsonl`, transcripts); torn or invalid lines are skipped and
//! reported.

use std::collections::BTreeMap;
use std::path::Path;

use crate::actors::messages::InboxItem;
use crate::engine::transcript::TranscriptEntry;
use crate::events::EventKind;
use crate::run::record::{LoopStatus, read_events, read_summary, read_transcript};

/// How one loop stood when its run stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoopResume {
    /// Its status in the summary.
    pub status: LoopStatus,
    /// The iteration to run next.
    pub next_iteration: u32,
    /// Notes of its earlier iterations, in order.
    pub progress: Vec<String>,
    /// Shares and alerts delivered to it that its model never saw, in delivery order.
    pub unseen_inbox: Vec<InboxItem>,
    /// Iteration responses its model already gave (the scripted provider skips them).
    pub responses: usize,
}

/// The state of a run to resume.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    /// The run id.
    pub run_id: String,
    /// The config file recorded in the summary.
    pub config: Option<String>,
    /// Per loop.
    pub loops: BTreeMap<String, LoopResume>,
    /// The last event number written.
    pub last_seq: u64,
    /// What was wrong in the files (torn lines...), one line each.
    pub warnings: Vec<String>,
}

/// Reads the record in `run_dir`.
pub fn restore(run_dir: &Path) -> Result<Restored, String> {
    let summary = read_summary(run_dir)?;
    let events = read_events(run_dir)?;
    let mut out = Restored {
        run_id: summary.run_id.clone(),
        config: summary.config.clone(),
        ..Restored::default()
    };
    for (line, why) in &events.bad_lines {
        out.warnings
            .push(format!("events.jsonl line {line}: {why} (skipped)"));
    }
    let mut delivered: BTreeMap<String, Vec<InboxItem>> = BTreeMap::new();
    let mut shown: BTreeMap<String, usize> = BTreeMap::new();
    for name in summary.loops.keys() {
        out.loops.insert(
            name.clone(),
            LoopResume {
                status: summary.loops[name].status,
                next_iteration: 1,
                ..LoopResume::default()
            },
        );
    }
    for event in &events.items {
        out.last_seq = out.last_seq.max(event.seq);
        match &event.kind {
            EventKind::IterationEnded {
                loop_name,
                iteration,
                ..
            } => {
                if let Some(l) = out.loops.get_mut(loop_name) {
                    l.next_iteration = l.next_iteration.max(iteration + 1);
                }
            }
            EventKind::ProgressNoted {
                loop_name, note, ..
            } => {
                if let Some(l) = out.loops.get_mut(loop_name) {
                    l.progress.push(note.clone());
                }
            }
            EventKind::Shared {
                from,
                to,
                data_type,
                data,
                error: None,
            } => delivered
                .entry(to.clone())
                .or_default()
                .push(InboxItem::Share {
                    from: from.clone(),
                    data_type: data_type.clone(),
                    data: data.clone(),
                }),
            EventKind::Alert {
                from,
                event_type,
                message,
                data,
                recipients,
                error: None,
            } => {
                for to in recipients {
                    delivered
                        .entry(to.clone())
                        .or_default()
                        .push(InboxItem::Alert {
                            from: from.clone(),
                            event_type: event_type.clone(),
                            message: message.clone(),
                            data: data.clone(),
                            // Not in the event log: such alerts are shown one by one.
                            about: None,
                        });
                }
            }
            EventKind::InboxShown { loop_name, items } => {
                *shown.entry(loop_name.clone()).or_default() += items;
            }
            _ => {}
        }
    }
    for (name, l) in out.loops.iter_mut() {
        let items = delivered.remove(name).unwrap_or_default();
        let seen = shown.get(name).copied().unwrap_or(0).min(items.len());
        l.unseen_inbox = items.into_iter().skip(seen).collect();
        let has_transcript = crate::run::record::transcript_path(run_dir, name)
            .map(|p| p.exists())
            .unwrap_or(false);
        match read_transcript(run_dir, name) {
            _ if !has_transcript => {}
            Ok(t) => {
                l.responses = t
                    .items
                    .iter()
                    .filter(|e| matches!(e, TranscriptEntry::Response { iteration, .. } if *iteration > 0))
                    .count();
                for (line, why) in &t.bad_lines {
                    out.warnings.push(format!(
                        "loops/{name}/transcript.jsonl line {line}: {why} (skipped)"
                    ));
                }
            }
            Err(e) => out.warnings.push(e),
        }
        if let Ok(r) =
            crate::receipts::read_log(&run_dir.join("loops").join(name).join("receipts.jsonl"))
        {
            for (line, why) in &r.bad_lines {
                out.warnings.push(format!(
                    "loops/{name}/receipts.jsonl line {line}: {why} (skipped)"
                ));
            }
        }
    }
    Ok(out)
}
