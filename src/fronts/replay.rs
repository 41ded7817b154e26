//! `taskdaemon replay verify`: re-runs the calls of a receipt log, in order, on a copy of the
//! worktree as it was before them, and reports every call whose output hash differs.
//!
//! The original worktree is never touched. Calls that cannot be reproduced offline — the
//! coordination tools (they need the other loops of a run) and the network tools — are
//! reported as skipped, never silently counted as matching.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::catalog::{Catalog, Lane};
use crate::context::{LoopCommands, ToolContext};
use crate::receipts::{Receipt, SideEffect, read_log};
use crate::registry::ToolSet;

/// How one recorded call compared on replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CallVerdict {
    /// Same output hash.
    Same,
    /// Different output; `excerpt` is the start of what the replay produced.
    Differs {
        /// Hash in the log.
        expected: String,
        /// Hash on replay.
        actual: String,
        /// Start of the replayed output.
        excerpt: String,
    },
    /// Not replayed, with the reason.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CallReport {
    /// 1-based position in the log.
    pub index: usize,
    /// Receipt id.
    pub id: String,
    /// Tool name.
    pub tool: String,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: CallVerdict,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ReplayReport {
    /// Calls in the log.
    pub calls: usize,
    /// Calls whose output matched.
    pub same: usize,
    /// Calls whose output differed.
    pub differ: usize,
    /// Calls not replayed.
    pub skipped: usize,
    /// Lines of the log that could not be read (line number, error).
    pub unreadable_lines: Vec<(usize, String)>,
    /// Per-call results.
    pub results: Vec<CallReport>,
}

impl ReplayReport {
    /// True when nothing differs and every line was readable.
    pub fn ok(&self) -> bool {
        self.differ == 0 && self.unreadable_lines.is_empty()
    }
}

/// Why a recorded call is not replayed, if it is not.
fn skip_reason(receipt: &Receipt, catalog: &Catalog) -> Option<String> {
    match catalog.spec(&receipt.tool).lane {
        Lane::Coordinator => Some("coordination tool: needs the other loops of a run".into()),
        Lane::Net if receipt.tool != "run_command" => {
            Some("network tool: its answer depends on the outside world".into())
        }
        _ => None,
    }
}

/// The configured commands of build/test/validate, as recorded in their receipts.
fn recorded_commands(receipts: &[Receipt]) -> BTreeMap<String, LoopCommands> {
    let mut by_exec: BTreeMap<String, LoopCommands> = BTreeMap::new();
    for r in receipts {
        let Some(command) = r.side_effects.iter().find_map(|e| match e {
            SideEffect::CommandRun { command, .. } => Some(command.clone()),
            _ => None,
        }) else {
            continue;
        };
        let cmds = by_exec.entry(r.exec_id.clone()).or_default();
        let slot = match r.tool.as_str() {
            "build" => &mut cmds.build,
            "test" => &mut cmds.test,
            "validate" => &mut cmds.validate,
            _ => continue,
        };
        slot.get_or_insert(command);
    }
    by_exec
}

/// Replays `log` on a copy of `worktree` and compares output hashes.
pub async fn verify(log: &Path, worktree: &Path) -> Result<ReplayReport, String> {
    let read = read_log(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("taskdaemon-replay-")
        .tempdir()
        .map_err(|e| format!("cannot create a scratch directory: {e}"))?;
    let copy = scratch.path().join("worktree");
    copy_tree(worktree, &copy)
        .map_err(|e| format!("cannot copy worktree {}: {e}", worktree.display()))?;

    let tools = ToolSet::all();
    let catalog = Catalog::default();
    let commands = recorded_commands(&read.receipts);
    let mut contexts: BTreeMap<String, ToolContext> = BTreeMap::new();
    let mut report = ReplayReport {
        calls: read.receipts.len(),
        unreadable_lines: read.bad_lines.clone(),
        ..ReplayReport::default()
    };
    for (i, receipt) in read.receipts.iter().enumerate() {
        let verdict = if let Some(reason) = skip_reason(receipt, &catalog) {
            report.skipped += 1;
            CallVerdict::Skipped { reason }
        } else {
            if !contexts.contains_key(&receipt.exec_id) {
                let ctx = ToolContext::new(&copy, receipt.exec_id.clone())
                    .map_err(|e| e.to_string())?
                    .with_commands(commands.get(&receipt.exec_id).cloned().unwrap_or_default());
                contexts.insert(receipt.exec_id.clone(), ctx);
            }
            let ctx = &contexts[&receipt.exec_id];
            let outcome = tools
                .call(
                    ctx,
                    receipt.call_id.as_deref(),
                    &receipt.tool,
                    receipt.input.clone(),
                )
                .await;
            if outcome.receipt.output_hash == receipt.output_hash {
                report.same += 1;
                CallVerdict::Same
            } else {
                report.differ += 1;
                CallVerdict::Differs {
                    expected: receipt.output_hash.clone(),
                    actual: outcome.receipt.output_hash,
                    excerpt: crate::text::head_tail(&outcome.content, 400),
                }
            }
        };
        report.results.push(CallReport {
            index: i + 1,
            id: receipt.id.clone(),
            tool: receipt.tool.clone(),
            verdict,
        });
    }
    Ok(report)
}

/// `taskdaemon replay verify`: prints the report; exit 0 when everything matched, 1 when a
/// call differs or a line was unreadable.
pub async fn verify_command(log: &Path, worktree: &Path, json: bool) -> Result<ExitCode, String> {
    let report = verify(log, worktree).await?;
    if json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{}", crate::secrets::redact_json(&text));
    } else {
        print!("{}", crate::secrets::redact(&render(&report)));
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The human-readable report.
pub fn render(report: &ReplayReport) -> String {
    let mut out = format!(
        "replayed {} call(s): {} identical, {} differ, {} skipped\n",
        report.calls, report.same, report.differ, report.skipped
    );
    for (line, err) in &report.unreadable_lines {
        out.push_str(&format!("unreadable log line {line}: {err}\n"));
    }
    for r in &report.results {
        match &r.verdict {
            CallVerdict::Same => {}
            CallVerdict::Differs {
                expected,
                actual,
                excerpt,
            } => {
                out.push_str(&format!(
                    "DIFFERS #{} {} ({}): expected {expected}, got {actual}\n",
                    r.index, r.tool, r.id
                ));
                for l in excerpt.lines().take(8) {
                    out.push_str(&format!("    | {l}\n"));
                }
            }
            CallVerdict::Skipped { reason } => {
                out.push_str(&format!("skipped #{} {}: {reason}\n", r.index, r.tool));
            }
        }
    }
    out
}

/// Copies a directory tree, keeping symlinks as symlinks (never following them out).
pub(crate) fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    let mut stack: Vec<(PathBuf, PathBuf)> = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((src, dst)) = stack.pop() {
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let target = dst.join(entry.file_name());
            if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
            } else if kind.is_dir() {
                std::fs::create_dir_all(&target)?;
                stack.push((entry.path(), target));
            } else {
                std::fs::copy(entry.path(), &target)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receipts::ReceiptLog;
    use serde_json::json;

    #[test]
    fn copy_tree_keeps_symlinks_and_content() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::write(a.join("sub/f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", a.join("l")).unwrap();
        copy_tree(&a, &d.path().join("b")).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("b/sub/f")).unwrap(),
            "x"
        );
        assert_eq!(
            std::fs::read_link(d.path().join("b/l")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
    }

    #[tokio::test]
    async fn unknown_tool_calls_replay_identically_and_coordination_is_skipped() {
        // Both recorded outcomes are produced by the registry itself (no real tool runs),
        // so this pins the comparison and skip logic independently of any tool.
        let d = tempfile::tempdir().unwrap();
        let wt = d.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        let ctx = ToolContext::new(&wt, "loop-a").unwrap();
        let tools = ToolSet::all();
        let log_path = d.path().join("r.jsonl");
        let log = ReceiptLog::open(&log_path).unwrap();
        let a = tools.call(&ctx, Some("1"), "no_such_tool", json!({})).await;
        log.append(&a.receipt).unwrap();
        let b = tools
            .call(
                &ctx,
                Some("2"),
                "query_loop",
                json!({"target_exec_id": "b", "question": "q"}),
            )
            .await;
        log.append(&b.receipt).unwrap();
        let mut tampered = a.receipt.clone();
        tampered.output_hash = "sha256:0".into();
        log.append(&tampered).unwrap();

        let report = verify(&log_path, &wt).await.unwrap();
        assert_eq!(report.calls, 3);
        assert_eq!(report.same, 1);
        assert_eq!(report.skipped, 1);
        assert_eq!(report.differ, 1);
        assert!(!report.ok());
        let text = render(&report);
        assert!(text.contains("DIFFERS #3 no_such_tool"), "{text}");
        assert!(text.contains("skipped #2 query_loop"), "{text}");
    }
}
