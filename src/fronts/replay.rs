//! `taskdaemon replay verify`: checks a receipt log, then re-runs its trusted calls, in
//! order, on a copy of the worktree as it was before them, and reports every call whose
//! output hash differs.
//!
//! Nothing in a log is run before it is checked ([`td_toolkit::receipts::check`]): a receipt
//! whose input does not hash to its `input_hash`, or that the receipt chain does not vouch
//! for (edited, inserted, repeated, out of order, after a dropped receipt), is refused and
//! named, never run. A log whose chain cannot be checked (no chain, or no key) is not run
//! either unless `--unverified` says so, and it is never reported as verified.
//!
//! The calls that do run get the same confinement as a loop's or a `tool exec` session's
//! ([`crate::fronts::policy`]): every command goes through `run_in_worktree`, the launcher
//! and the sandbox of `-c CONFIG` (or the defaults), may write only inside the copy and its
//! private temp dir, and sees neither the environment's secrets nor the chain key. The
//! original worktree is never touched. Calls that cannot be reproduced offline — the
//! coordination tools (they need the other loops of a run) and the network tools — are
//! reported as skipped, never silently counted as matching.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::fronts::policy::SessionPolicy;
use td_toolkit::catalog::{Lane, Route};
use td_toolkit::context::{LoopCommands, ToolContext};
use td_toolkit::receipts::chain::{ChainKey, RUN_KEY_FILE, key_path_for_log};
use td_toolkit::receipts::check::{ChainState, LogCheck, LogEntry, check, read_entries};
use td_toolkit::receipts::session::{
    SESSION_RECEIPT_FILE, SessionRead, read_session, session_path_for_log,
};
use td_toolkit::receipts::{Receipt, SideEffect};
use td_toolkit::registry::ToolSet;

/// What `replay verify` was asked to do.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The receipts log.
    pub log: PathBuf,
    /// The worktree as it was before the recorded calls.
    pub worktree: PathBuf,
    /// The chain key (default: found beside the log or in its run directory).
    pub chain_key: Option<PathBuf>,
    /// The session receipt (default: found beside the log).
    pub session: Option<PathBuf>,
    /// Check without a session receipt.
    pub no_session: bool,
    /// Replay the calls of a log whose chain cannot be checked.
    pub unverified: bool,
    /// Catalog, sandbox and web access of the replay.
    pub policy: SessionPolicy,
}

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
    /// Not replayed because it cannot be reproduced offline, with the reason.
    Skipped {
        /// Why.
        reason: String,
    },
    /// Not replayed because the receipt cannot be trusted, with the reason.
    Refused {
        /// Why.
        reason: String,
    },
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CallReport {
    /// 1-based position in the log.
    pub index: usize,
    /// Its `seq` in the chain, when chained.
    pub seq: Option<u64>,
    /// Receipt id.
    pub id: String,
    /// Tool name.
    pub tool: String,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: CallVerdict,
}

/// What was found about the chain and the session receipt.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    /// The key the chain was checked with.
    pub key: Option<String>,
    /// Why there is no key, when there is none.
    pub key_problem: Option<String>,
    /// The session receipt the end of the chain was checked against.
    pub session: Option<String>,
    /// Why there is none, when there is none and one was expected.
    pub session_problem: Option<String>,
    /// The check itself.
    #[serde(flatten)]
    pub check: LogCheck,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// Calls in the log.
    pub calls: usize,
    /// Calls whose output matched.
    pub same: usize,
    /// Calls whose output differed.
    pub differ: usize,
    /// Calls not replayed because they cannot be reproduced offline.
    pub skipped: usize,
    /// Calls not replayed because their receipt cannot be trusted.
    pub refused: usize,
    /// Lines of the log that could not be read (line number, error).
    pub unreadable_lines: Vec<(usize, String)>,
    /// The integrity check of the log.
    pub chain: ChainReport,
    /// Per-call results.
    pub results: Vec<CallReport>,
}

impl ReplayReport {
    /// True when the chain verified (up to a session receipt, unless told there is none),
    /// nothing was refused or differs, and every line was readable.
    pub fn ok(&self) -> bool {
        self.differ == 0
            && self.refused == 0
            && self.unreadable_lines.is_empty()
            && self.chain.check.state == ChainState::Verified
            && self.chain.session_problem.is_none()
    }
}

/// Why a recorded call is not replayed, if it cannot be reproduced offline.
fn skip_reason(receipt: &Receipt, policy: &SessionPolicy) -> Option<String> {
    match policy.catalog.spec(&receipt.tool).lane {
        Route::Coordinator => Some("coordination tool: needs the other loops of a run".into()),
        Route::Lane(Lane::Net) if receipt.tool != "run_command" => {
            Some("network tool: its answer depends on the outside world".into())
        }
        _ => None,
    }
}

/// The configured commands of build/test/validate, as recorded in the receipts that are
/// trusted (an untrusted receipt must not choose what a trusted one runs).
fn recorded_commands(receipts: &[&Receipt]) -> BTreeMap<String, LoopCommands> {
    let mut by_exec: BTreeMap<String, LoopCommands> = BTreeMap::new();
    for r in receipts {
        let Some(command) = r.side_effects.iter().find_map(|e| match e {
            SideEffect::CommandRun { command, .. } => Some(command.clone()),
            _ => None,
        }) else {
            continue;
        };
        let cmds = by_exec.entry(r.exec_id.to_string()).or_default();
        let slot = match r.tool.as_ref() {
            "build" => &mut cmds.build,
            "test" => &mut cmds.test,
            "validate" => &mut cmds.validate,
            _ => continue,
        };
        slot.get_or_insert(command);
    }
    by_exec
}

/// The chain key of `log`: `--chain-key`, else `LOG.key`, else the run directory's key for
/// a log at `<run-dir>/loops/<name>/receipts.jsonl`. `Err` only for an explicit key that
/// cannot be read; `Ok(Err(why))` when none was found.
fn find_key(options: &VerifyOptions) -> Result<Result<ChainKey, String>, String> {
    if let Some(path) = &options.chain_key {
        return ChainKey::load(path).map(Ok).map_err(|e| e.to_string());
    }
    let mut looked = vec![key_path_for_log(&options.log)];
    if let Some(run_dir) = run_dir_of(&options.log) {
        looked.push(run_dir.join(RUN_KEY_FILE));
    }
    for path in &looked {
        if path.exists() {
            return Ok(ChainKey::load(path).map_err(|e| e.to_string()));
        }
    }
    Ok(Err(format!(
        "no chain key found (looked for {}); pass --chain-key FILE",
        looked
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    )))
}

/// The run directory of a log at `<run-dir>/loops/<name>/receipts.jsonl`.
fn run_dir_of(log: &Path) -> Option<PathBuf> {
    let loop_dir = log.parent()?;
    let loops = loop_dir.parent()?;
    (loops.file_name()? == crate::run::record::LOOPS_DIR)
        .then(|| loops.parent().map(Path::to_path_buf))?
}

/// The session receipt: `--session`, else `LOG.RECEIPT.json`, else `RECEIPT.json` beside a
/// run's log. `Err` only for an explicit one that cannot be read; `Ok(Err(why))` when none
/// was found (and one was expected).
fn find_session(
    options: &VerifyOptions,
    key: Option<&ChainKey>,
) -> Result<Result<Option<SessionRead>, String>, String> {
    if let Some(path) = &options.session {
        return read_session(path, key)
            .map(|s| Ok(Some(s)))
            .map_err(|e| e.to_string());
    }
    if options.no_session {
        return Ok(Ok(None));
    }
    let mut looked = vec![session_path_for_log(&options.log)];
    if run_dir_of(&options.log).is_some() {
        looked.push(options.log.with_file_name(SESSION_RECEIPT_FILE));
    }
    for path in &looked {
        if path.exists() {
            return Ok(read_session(path, key).map(Some).map_err(|e| e.to_string()));
        }
    }
    Ok(Err(format!(
        "no session receipt found (looked for {}), so receipts dropped from the end of the log would go unnoticed; pass --session FILE, or --no-session for a session that never ended",
        looked
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    )))
}

/// Checks `options.log`, then replays its trusted calls on a copy of `options.worktree`.
pub async fn verify(options: &VerifyOptions) -> Result<ReplayReport, String> {
    let log = &options.log;
    let read = read_entries(log).map_err(|e| e.to_string())?;
    let (key, key_problem) = match find_key(options)? {
        Ok(key) => (Some(key), None),
        Err(why) => (None, Some(why)),
    };
    let (session, session_problem) = match find_session(options, key.as_ref())? {
        Ok(session) => (session, None),
        Err(why) => (None, Some(why)),
    };
    let checked = check(&read.entries, key.as_ref(), session.as_ref());
    let blanket = matches!(checked.state, ChainState::Unchained | ChainState::NoKey);
    let trusted = |i: usize| {
        checked.distrust[i].is_none()
            || (options.unverified && blanket && !checked.input_tampered[i])
    };

    let mut policy = options.policy.clone();
    if let Some(key) = &key
        && let Ok(real) = key.path().canonicalize()
        && let Err(why) = td_confine::hide_from_commands(&mut policy.sandbox, &real)
    {
        eprintln!("taskdaemon: warning: {why}");
    }
    let scratch = tempfile::Builder::new()
        .prefix("taskdaemon-replay-")
        .tempdir()
        .map_err(|e| format!("cannot create a scratch directory: {e}"))?;
    let copy = scratch.path().join("worktree");
    let keep_out: Vec<PathBuf> = key
        .iter()
        .filter_map(|k| k.path().canonicalize().ok())
        .collect();
    td_base::tree_copy::copy_tree_except(&options.worktree, &copy, &keep_out)
        .map_err(|e| format!("cannot copy worktree {}: {e}", options.worktree.display()))?;

    // The tools the session had (a call of another tool is answered with their list), when
    // an authentic session receipt says which.
    let tools = match session
        .as_ref()
        .filter(|s| s.authentic == Some(true))
        .and_then(|s| s.receipt.tool_set.as_ref())
    {
        Some(names) => td_tools::tool_set(names).map_err(|e| e.to_string())?,
        None => td_tools::all_tools(),
    };
    let trusted_receipts: Vec<&Receipt> = read
        .entries
        .iter()
        .enumerate()
        .filter(|(i, _)| trusted(*i))
        .map(|(_, e)| &e.receipt)
        .collect();
    let commands = recorded_commands(&trusted_receipts);
    let mut contexts: BTreeMap<String, ToolContext> = BTreeMap::new();
    let mut report = ReplayReport {
        calls: read.entries.len(),
        same: 0,
        differ: 0,
        skipped: 0,
        refused: 0,
        unreadable_lines: read.bad_lines.clone(),
        chain: ChainReport {
            key: key.as_ref().map(|k| k.path().display().to_string()),
            key_problem,
            session: session.as_ref().map(|s| s.path.display().to_string()),
            session_problem,
            check: checked.clone(),
        },
        results: Vec::new(),
    };
    for (i, entry) in read.entries.iter().enumerate() {
        let receipt = &entry.receipt;
        let verdict = if !trusted(i) {
            report.refused += 1;
            CallVerdict::Refused {
                reason: checked.distrust[i].clone().unwrap_or_default(),
            }
        } else if let Some(reason) = skip_reason(receipt, &policy) {
            report.skipped += 1;
            CallVerdict::Skipped { reason }
        } else {
            let ctx = match contexts.get(&*receipt.exec_id) {
                Some(ctx) => ctx,
                None => {
                    let ctx = policy
                        .context(&copy, receipt.exec_id.to_string())?
                        .with_commands(
                            commands.get(&*receipt.exec_id).cloned().unwrap_or_default(),
                        );
                    contexts.entry(receipt.exec_id.to_string()).or_insert(ctx)
                }
            };
            replay_one(&tools, ctx, entry, &mut report).await
        };
        report.results.push(CallReport {
            index: entry.index,
            seq: receipt.seq,
            id: receipt.id.to_string(),
            tool: receipt.tool.to_string(),
            verdict,
        });
    }
    Ok(report)
}

/// Runs one trusted call and compares its output hash.
async fn replay_one(
    tools: &ToolSet,
    ctx: &ToolContext,
    entry: &LogEntry,
    report: &mut ReplayReport,
) -> CallVerdict {
    let receipt = &entry.receipt;
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
            expected: receipt.output_hash.to_string(),
            actual: outcome.receipt.into_receipt().output_hash.to_string(),
            excerpt: td_base::text::head_tail(&outcome.content, 400),
        }
    }
}

/// `taskdaemon replay verify`: prints the report; exit 0 when the log verified and every
/// replayed call matched, 1 otherwise.
pub async fn verify_command(options: &VerifyOptions, json: bool) -> Result<ExitCode, String> {
    let report = verify(options).await?;
    if json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{}", td_base::secrets::redact_json(&text));
    } else {
        print!("{}", td_base::secrets::redact(&render(&report)));
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The first line about the chain.
fn render_chain(chain: &ChainReport) -> String {
    let check = &chain.check;
    let mut out = match check.state {
        ChainState::Verified => match &check.head {
            Some((seq, _)) => format!(
                "chain: verified, {} receipt(s), seq 1..{seq}\n",
                check.receipts
            ),
            None => "chain: verified, no receipts\n".to_string(),
        },
        ChainState::Broken => format!(
            "chain: BROKEN, {} problem(s) found; the receipts named are not replayed\n",
            check.findings.len()
        ),
        ChainState::Unchained => "chain: UNCHAINED: the log has no receipt chain (written before chains, or without a key), so nothing shows it is unchanged; NOT verified\n".to_string(),
        ChainState::NoKey => format!(
            "chain: NOT CHECKED: {}; NOT verified\n",
            chain
                .key_problem
                .as_deref()
                .unwrap_or("the chain key is missing")
        ),
    };
    match (&chain.session, &chain.session_problem) {
        (Some(path), _) => out.push_str(&format!("session receipt: {path}\n")),
        (None, Some(problem)) => out.push_str(&format!("session receipt: MISSING: {problem}\n")),
        (None, None) => out.push_str(
            "session receipt: none (--no-session): receipts dropped from the end of the log are not detected\n",
        ),
    }
    out
}

/// The human-readable report.
pub fn render(report: &ReplayReport) -> String {
    let mut out = render_chain(&report.chain);
    out.push_str(&format!(
        "replayed {} call(s): {} identical, {} differ, {} skipped, {} refused\n",
        report.calls, report.same, report.differ, report.skipped, report.refused
    ));
    for (line, err) in &report.unreadable_lines {
        out.push_str(&format!("unreadable log line {line}: {err}\n"));
    }
    for finding in &report.chain.check.findings {
        out.push_str(&format!("{finding}\n"));
    }
    for note in &report.chain.check.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    let blanket = matches!(
        report.chain.check.state,
        ChainState::Unchained | ChainState::NoKey
    );
    if blanket && report.refused > 0 {
        out.push_str(&format!(
            "not replayed: {} call(s), because the chain could not be checked (--unverified replays them anyway)\n",
            report.refused
        ));
    }
    for r in &report.results {
        let seq = r.seq.map(|s| format!("seq {s}, ")).unwrap_or_default();
        match &r.verdict {
            CallVerdict::Same => {}
            CallVerdict::Differs {
                expected,
                actual,
                excerpt,
            } => {
                out.push_str(&format!(
                    "DIFFERS #{} {} ({seq}id {}): expected {expected}, got {actual}\n",
                    r.index, r.tool, r.id
                ));
                for l in excerpt.lines().take(8) {
                    out.push_str(&format!("    | {l}\n"));
                }
            }
            CallVerdict::Skipped { reason } => {
                out.push_str(&format!("skipped #{} {}: {reason}\n", r.index, r.tool));
            }
            CallVerdict::Refused { reason } => {
                if !blanket {
                    out.push_str(&format!(
                        "REFUSED #{} {} ({seq}id {}): not replayed: {reason}\n",
                        r.index, r.tool, r.id
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use td_toolkit::receipts::ReceiptLog;

    fn options(log: &Path, wt: &Path) -> VerifyOptions {
        VerifyOptions {
            log: log.to_path_buf(),
            worktree: wt.to_path_buf(),
            chain_key: None,
            session: None,
            no_session: false,
            unverified: false,
            policy: SessionPolicy::default(),
        }
    }

    #[tokio::test]
    async fn unknown_tool_calls_replay_identically_and_coordination_is_skipped() {
        // Both recorded outcomes are produced by the registry itself (no real tool runs),
        // so this pins the comparison and skip logic independently of any tool.
        let d = tempfile::tempdir().unwrap();
        let wt = d.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        let ctx = ToolContext::new(&wt, "loop-a").unwrap();
        let tools = td_tools::all_tools();
        let log_path = d.path().join("r.jsonl");
        let mut settings = td_confine::SandboxSettings::default();
        let session = crate::fronts::receipt_session::ReceiptSession::open(
            &log_path,
            None,
            &wt,
            "loop-a",
            &mut settings,
        )
        .unwrap();
        let log = session.log();
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
        let mut other = a.receipt.into_receipt();
        other.output_hash = "sha256:0".into();
        log.append(&other).unwrap();

        let report = verify(&options(&log_path, &wt)).await.unwrap();
        assert_eq!(
            report
                .chain
                .session_problem
                .as_deref()
                .map(|p| p.contains("--no-session")),
            Some(true)
        );
        assert!(!report.ok());
        session.close().unwrap();
        let report = verify(&options(&log_path, &wt)).await.unwrap();
        assert_eq!(report.chain.check.state, ChainState::Verified);
        assert_eq!(report.calls, 3);
        assert_eq!(report.same, 1);
        assert_eq!(report.skipped, 1);
        assert_eq!(report.differ, 1);
        assert!(!report.ok());
        let text = render(&report);
        assert!(
            text.contains("DIFFERS #3 no_such_tool (seq 3, id "),
            "{text}"
        );
        assert!(text.contains("skipped #2 query_loop"), "{text}");
    }

    #[tokio::test]
    async fn an_unchained_log_is_not_run_unless_asked_and_never_verified() {
        let d = tempfile::tempdir().unwrap();
        let wt = d.path().join("wt");
        std::fs::create_dir_all(&wt).unwrap();
        let ctx = ToolContext::new(&wt, "e").unwrap();
        let log_path = d.path().join("old.jsonl");
        let log = ReceiptLog::open(&log_path).unwrap();
        let a = td_tools::all_tools()
            .call(&ctx, None, "no_such_tool", json!({}))
            .await;
        log.append(&a.receipt).unwrap();
        let mut opts = options(&log_path, &wt);
        opts.no_session = true;
        let report = verify(&opts).await.unwrap();
        assert_eq!(report.chain.check.state, ChainState::Unchained);
        assert_eq!((report.refused, report.same), (1, 0));
        assert!(!report.ok());
        assert!(render(&report).contains("UNCHAINED"), "{}", render(&report));
        opts.unverified = true;
        let report = verify(&opts).await.unwrap();
        assert_eq!((report.refused, report.same), (0, 1));
        assert!(!report.ok(), "an unchained log is never verified");
    }
}
