//! `summary.json` made again from `events.jsonl` and the loops' transcripts, for when it is
//! missing or damaged (a full disk, a power loss, a hand): the summary is only a view of
//! those files, kept by the same rule ([`apply_event`]) the live record uses.
//!
//! What the events say is all there: the run id, config, start time and sandbox report (the
//! run's first event, `run_started`), each loop's type, status, iterations, last validation,
//! start and end times, completion summary or reason, merge; tokens and cost from the
//! transcripts' `spent` entries (an answer's charged to the loop that asked), the per-tool counts from the receipt logs, the artifacts each loop kept from its copies in
//! `loops/<loop>/artifacts/` (and `artifacts-skipped.txt`). What only the orchestrator wrote into the summary is not: each loop's branch
//! and worktree, why a loop failed before it started, and the warning of a stage that completed without an artifact. A record of a run older than
//! `run_started` takes its run id from its directory name.

use std::path::Path;

use crate::run::record::{
    EVENTS_FILE, LoopStatus, LoopSummary, RECEIPTS_FILE, RunStatus, RunSummary, SUMMARY_FILE,
    SUMMARY_VERSION, apply_event, for_each_jsonl, loop_dir, loop_names, read_summary,
    transcript_path,
};
use td_engine::transcript::TranscriptEntry;
use td_protocol::events::Event;
use td_toolkit::receipts::{Receipt, ToolCounts};

/// The run's summary: `summary.json` when it reads, otherwise rebuilt from the events, with
/// what was done said in the notes (one line each, for stderr): why the file could not be
/// used, and the lines of the events and transcripts that could not be read. An error when
/// neither is there.
pub fn load_summary(run_dir: &Path) -> Result<(RunSummary, Vec<String>), String> {
    let why = match read_summary(run_dir) {
        Ok(summary) => return Ok((summary, Vec::new())),
        Err(e) => e,
    };
    if !run_dir.join(EVENTS_FILE).is_file() {
        return Err(why);
    }
    let problem = if run_dir.join(SUMMARY_FILE).exists() {
        format!("{SUMMARY_FILE} cannot be used ({why})")
    } else {
        format!("{SUMMARY_FILE} is missing")
    };
    let (summary, mut notes) = rebuild(run_dir)?;
    notes.insert(
        0,
        format!(
            "{problem}: rebuilt from {EVENTS_FILE} and the loops' transcripts (branches and \
             worktrees are not in them)"
        ),
    );
    Ok((summary, notes))
}

/// The summary that the events and transcripts of `run_dir` say, and the lines that could
/// not be read (one note each).
pub fn rebuild(run_dir: &Path) -> Result<(RunSummary, Vec<String>), String> {
    let mut summary = RunSummary {
        version: SUMMARY_VERSION,
        run_id: run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        ..RunSummary::default()
    };
    let mut notes = Vec::new();
    let mut first_time: Option<String> = None;
    let mut last_time: Option<String> = None;
    for_each_jsonl::<Event>(&run_dir.join(EVENTS_FILE), |line, event| match event {
        Ok(event) => {
            first_time.get_or_insert_with(|| event.time.to_string());
            last_time = Some(event.time.to_string());
            apply_event(&mut summary, &event);
        }
        Err(why) => notes.push(format!("{EVENTS_FILE} line {line}: {why} (skipped)")),
    })?;
    if summary.started_at.is_empty() {
        summary.started_at = first_time.unwrap_or_default();
    }
    for name in loop_names(run_dir, Some(&summary)) {
        let Ok(path) = transcript_path(run_dir, &name) else {
            continue;
        };
        let entry = summary
            .loops
            .entry(name.clone())
            .or_insert_with(|| LoopSummary::pending(&name, ""));
        let kept = crate::run::artifacts::kept_in_record(run_dir, &name);
        entry.artifacts = kept.files;
        entry.artifacts_skipped = kept.skipped;
        if let Ok(dir) = loop_dir(run_dir, &name)
            && dir.join(RECEIPTS_FILE).is_file()
        {
            entry.tools.clear();
            for_each_jsonl::<Receipt>(&dir.join(RECEIPTS_FILE), |line, item| match item {
                Ok(receipt) => entry
                    .tools
                    .entry(ToolCounts::key(&receipt).to_string())
                    .or_default()
                    .add(&receipt),
                Err(why) => notes.push(format!(
                    "loops/{name}/{RECEIPTS_FILE} line {line}: {why} (skipped)"
                )),
            })?;
        }
        if !path.is_file() {
            continue;
        }
        for_each_jsonl::<TranscriptEntry>(&path, |line, item| match item {
            Ok(TranscriptEntry::Spent {
                charged_to, spend, ..
            }) => summary.add_spend(&name, charged_to.as_deref(), &spend),
            Ok(_) => {}
            Err(why) => notes.push(format!(
                "loops/{name}/transcript.jsonl line {line}: {why} (skipped)"
            )),
        })?;
    }
    // The end of the run is not an event: a run whose loops all ended ended (about) with its
    // last event; otherwise it was still going, or crashed, as a summary would say then.
    let ended = |l: &LoopSummary| l.status.is_final() || l.status == LoopStatus::Blocked;
    if !summary.loops.is_empty() && summary.loops.values().all(ended) {
        summary.status = summary.status_from_loops();
        summary.ended_at = last_time;
    } else {
        summary.status = RunStatus::Running;
    }
    Ok((summary, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_restart_in_the_events_is_read_and_the_loop_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            r#"{"seq":1,"time":"2026-01-01T00:00:00Z","event":"loop_started","loop_name":"p","loop_type":"code"}"#,
            r#"{"seq":2,"time":"2026-01-01T00:00:01Z","event":"loop_restarted","loop_name":"p","restarts":1,"reason":"panicked: bug"}"#,
            r#"{"seq":3,"time":"2026-01-01T00:00:02Z","event":"loop_completed","loop_name":"p","iterations":2,"summary":"done"}"#,
        ];
        std::fs::write(dir.path().join(EVENTS_FILE), lines.join("\n") + "\n").unwrap();
        let (summary, notes) = rebuild(dir.path()).unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(summary.loops["p"].status, LoopStatus::Completed);
    }

    #[test]
    fn the_artifacts_a_loop_kept_are_listed_again_from_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let line = r#"{"seq":1,"time":"2026-01-01T00:00:00Z","event":"loop_completed","loop_name":"p","iterations":1,"summary":"planned"}"#;
        std::fs::write(dir.path().join(EVENTS_FILE), format!("{line}\n")).unwrap();
        let kept = dir.path().join("loops/p/artifacts");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("plan-x.md"), "# X\n").unwrap();
        std::fs::write(kept.join("stray.txt"), "not listed").unwrap();
        std::fs::write(
            dir.path().join("loops/p/artifacts-skipped.txt"),
            "plan-y.md: a symlink (not followed)\n",
        )
        .unwrap();
        let (summary, _) = rebuild(dir.path()).unwrap();
        let p = &summary.loops["p"];
        assert_eq!(p.artifacts.len(), 1, "{:?}", p.artifacts);
        assert_eq!(p.artifacts[0].path, "loops/p/artifacts/plan-x.md");
        assert_eq!(p.artifacts[0].bytes, 4);
        assert_eq!(p.artifacts_skipped, ["plan-y.md: a symlink (not followed)"]);
    }
}
