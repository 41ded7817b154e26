//! The run record: what `taskdaemon run` leaves on disk, and the tolerant readers (over
//! [`td_base::jsonl`]) that `status`, `logs` and outside tests use to read it back.
//!
//! Layout of a run directory (`.taskdaemon/runs/<run-id>/`, or `--run-dir DIR`):
//!
//! ```text
//! summary.json                    RunSummary: per loop status, iterations, validation, timings
//! events.jsonl                    one Event per line: loop lifecycle, every coordination message
//! loops/<name>/transcript.jsonl   one TranscriptEntry per line: requests, responses, tool results
//! loops/<name>/receipts.jsonl     one Receipt per tool call, chained (receipts::chain)
//! loops/<name>/RECEIPT.json       the loop's session receipt, written when it ends
//! loops/<name>/artifacts/         its plans, specs and phases, copied when it ends (run/artifacts.rs)
//! loops/<name>/artifacts-skipped.txt  what of them was not copied, and why
//! receipt-chain.key               the run's receipt chain key (0600, hidden from commands)
//! ```
//!
//! The JSONL files are append-only and written while the run goes: each line is one write on
//! an append-mode handle, so a crash leaves at most a torn last line, which every reader here
//! reports instead of failing on; a write that fails (a full disk) is cut back off the file,
//! so it leaves no torn line at all. `summary.json` is replaced whole (temporary file, synced,
//! renamed, directory synced), so a reader sees the previous or the next version, never half
//! of one; it is a view of the events and transcripts, and [`crate::run::rebuild`] makes it
//! again from them when it is missing or damaged. Nothing here keeps events or transcripts in
//! memory: only the summary (one entry per loop) and one open handle per file.
//!
//! What reaches the disk before the run relies on it (see [`td_base::record_io`]): every
//! receipt (a side effect that already happened), and the events that mark where a resumed
//! run goes on — the run's start, each finished iteration's progress note, each loop's end,
//! block and merge — each synced as it is written, with every line before it (one file, in
//! order). An iteration counts as finished for a resume only with such a line (a passing
//! iteration by its loop's `loop_completed` or the `iteration_ended` before it): a power loss
//! loses at most iterations that had not finished, which a resumed run runs again anyway.
//! Transcripts are the log of what was said; a resume does not count on them, so they are
//! synced only at the run's end. `summary.json` is written durably by a thread of its own
//! after each change, a little behind the change ([`crate::run::summary_file`]).
//!
//! Fail closed: the first write that fails makes the record [`RunRecord::unwritable`], which
//! loops check before each model or tool call (through
//! [`TranscriptSink::unwritable`]), so no work goes on unrecorded.
//!
//! Every line and every summary is passed through [`td_base::secrets::redact_json`] right
//! before it is written: whatever a value held, no known secret reaches the disk.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::run::session_receipts::{RunChain, tally_for, tool_set_of};
use crate::run::summary_file::{Failures, SummaryFile};
use td_base::sync::lock;
use td_engine::LoopEnd;
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_llm::Usage;
use td_protocol::events::{Event, EventKind};
use td_protocol::spend::Spend;
use td_toolkit::receipts::{Receipt, ReceiptLog, ToolCounts};

/// The run's summary file, replaced atomically on every change.
pub const SUMMARY_FILE: &str = "summary.json";
/// The run's event log.
pub const EVENTS_FILE: &str = "events.jsonl";
/// The directory holding one subdirectory per loop.
pub const LOOPS_DIR: &str = "loops";
/// A loop's transcript, inside `loops/<name>/`.
pub const TRANSCRIPT_FILE: &str = "transcript.jsonl";
/// A loop's receipts, inside `loops/<name>/`.
pub const RECEIPTS_FILE: &str = "receipts.jsonl";
/// The version written into `summary.json`; readers of other versions know to look twice.
pub const SUMMARY_VERSION: u32 = 1;

/// Where a project's runs live: `<project>/.taskdaemon/runs`.
pub fn runs_root(project: &Path) -> PathBuf {
    project.join(".taskdaemon").join("runs")
}

/// A fresh run id, `YYYYMMDD-HHMMSS-xxxx` (UTC time, then 4 random hex digits), so that
/// sorting run ids by name sorts runs by start time.
pub fn new_run_id() -> String {
    // The last bytes of a v7 UUID are random (the first ones hold the time and a counter).
    let random = uuid::Uuid::now_v7();
    let bytes = random.as_bytes();
    format!(
        "{}-{:02x}{:02x}",
        chrono::Utc::now().format("%Y%m%d-%H%M%S"),
        bytes[14],
        bytes[15]
    )
}

/// Now, in the format events use (RFC 3339, UTC, milliseconds).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Milliseconds from `start` to `end` (RFC 3339 times); `None` when either does not parse.
pub fn duration_between(start: &str, end: &str) -> Option<u64> {
    let start = chrono::DateTime::parse_from_rfc3339(start).ok()?;
    let end = chrono::DateTime::parse_from_rfc3339(end).ok()?;
    Some(u64::try_from((end - start).num_milliseconds()).unwrap_or(0))
}

/// Where a loop stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopStatus {
    /// Known from the config, not started yet.
    #[default]
    Pending,
    /// Its actor is running iterations.
    Running,
    /// Validation passed.
    Completed,
    /// It gave up (max iterations, model errors...).
    Failed,
    /// It waits on something it cannot get (a dependency that failed, say).
    Blocked,
    /// It was stopped on request.
    Stopped,
    /// It reached a hard limit of its budget or the run's; `run --resume` with a raised
    /// budget goes on with it.
    Paused,
}

impl LoopStatus {
    /// The lowercase name used in `summary.json` and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            LoopStatus::Pending => "pending",
            LoopStatus::Running => "running",
            LoopStatus::Completed => "completed",
            LoopStatus::Failed => "failed",
            LoopStatus::Blocked => "blocked",
            LoopStatus::Stopped => "stopped",
            LoopStatus::Paused => "paused",
        }
    }

    /// Whether the loop will not run again in this run (a stopped or paused loop may in a
    /// resumed one).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            LoopStatus::Completed | LoopStatus::Failed | LoopStatus::Stopped | LoopStatus::Paused
        )
    }
}

/// Where the whole run stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Still going (or it crashed: `ended_at` is then missing too).
    #[default]
    Running,
    /// Every loop completed.
    Completed,
    /// At least one loop failed or was blocked.
    Failed,
    /// The run was stopped before its loops finished.
    Stopped,
    /// A budget paused loops (none failed); `run --resume` with a raised budget goes on.
    Paused,
    /// Never written by a run: what `status` shows for a run recorded `running` whose
    /// process is gone (killed, crashed: no process holds its `owner.lock`); `run --resume`
    /// goes on.
    Interrupted,
}

impl RunStatus {
    /// The lowercase name used in `summary.json` and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
            RunStatus::Paused => "paused",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// The last validation result of a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationSummary {
    /// Exit code (`None`: killed, timed out, or no command ran).
    pub exit_code: Option<i32>,
    /// Whether it passed.
    pub passed: bool,
}

/// What happened when a loop's branch was merged back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MergeSummary {
    /// Whether the merge went through.
    pub merged: bool,
    /// The branch merged into.
    pub into: Option<String>,
    /// The resulting commit, when merged.
    pub commit: Option<String>,
    /// Why not, or what else to know (conflicting paths...).
    pub detail: Option<String>,
    /// Times the merge queue handed the loop's work back to it.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub attempts: u32,
}

impl MergeSummary {
    /// Not merged into `into`, for `why`, after `attempts` hand backs.
    pub fn not_merged(into: &str, why: &str, attempts: u32) -> MergeSummary {
        MergeSummary {
            merged: false,
            into: Some(into.to_string()),
            commit: None,
            detail: Some(why.to_string()),
            attempts,
        }
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// How a loop used the heavy lane: the sums of its `heavy_ended` events (its own calls and
/// the merge queue's validations of its work, which run under its name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeavySummary {
    /// Time its calls waited for a worker, in milliseconds.
    pub waited_ms: u64,
    /// Time its `build` calls ran, in milliseconds.
    pub build_ms: u64,
    /// Time its `test` calls ran, in milliseconds.
    pub test_ms: u64,
    /// Time its `validate` calls (validations included) ran, in milliseconds.
    pub validate_ms: u64,
    /// Its calls in the heavy lane (any tool routed there, cancelled ones too).
    pub calls: u64,
}

impl HeavySummary {
    /// Adds one ended call of `tool`.
    pub fn add(&mut self, tool: &str, waited_ms: u64, ran_ms: u64) {
        self.waited_ms = self.waited_ms.saturating_add(waited_ms);
        // Other tools routed to the lane (a `run_command` moved there) count their wait only.
        let ran = match tool {
            "build" => Some(&mut self.build_ms),
            "test" => Some(&mut self.test_ms),
            "validate" => Some(&mut self.validate_ms),
            _ => None,
        };
        if let Some(ran) = ran {
            *ran = ran.saturating_add(ran_ms);
        }
        self.calls = self.calls.saturating_add(1);
    }
}

/// One loop's entry in `summary.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopSummary {
    /// Loop name (its exec id).
    pub name: String,
    /// Loop type.
    pub loop_type: String,
    /// Where it stands.
    pub status: LoopStatus,
    /// Iterations run so far.
    pub iterations: u32,
    /// The latest validation result.
    pub validation: Option<ValidationSummary>,
    /// Its git branch.
    pub branch: Option<String>,
    /// Its worktree directory (on the head; a loop on a host works in a worktree there).
    pub worktree: Option<String>,
    /// The worker host it (last) ran on; `None`: the head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// When it (last) started (RFC 3339).
    pub started_at: Option<String>,
    /// When it ended (RFC 3339).
    pub ended_at: Option<String>,
    /// `ended_at - started_at`.
    pub duration_ms: Option<u64>,
    /// The model's completion summary.
    pub summary: Option<String>,
    /// Why it failed, was blocked or was stopped.
    pub reason: Option<String>,
    /// Tokens of every model call charged to it: its iterations' and the answers other
    /// loops gave to its questions (the tokens of [`LoopSummary::charged`]).
    pub usage: Usage,
    /// What its iterations' model calls spent.
    #[serde(skip_serializing_if = "Spend::is_empty")]
    pub spend: Spend,
    /// What other loops' answers to its questions spent: charged to it.
    #[serde(skip_serializing_if = "Spend::is_empty")]
    pub spent_on_answers: Spend,
    /// What its answers to other loops' questions spent: charged to the askers, not to it.
    #[serde(skip_serializing_if = "Spend::is_empty")]
    pub answers_for_others: Spend,
    /// Everything charged to it (`spend` + `spent_on_answers`): what its budget counts.
    #[serde(skip_serializing_if = "Spend::is_empty")]
    pub charged: Spend,
    /// The time its iterations took, in milliseconds (what its wall-time budget counts).
    #[serde(skip_serializing_if = "is_zero")]
    pub wall_ms: u64,
    /// Merge of its branch, when one was attempted.
    pub merge: Option<MergeSummary>,
    /// How long its calls waited for the heavy lane and ran there, once it made one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heavy: Option<HeavySummary>,
    /// Per tool: calls, errors and inputs the schema refused, counted from the receipts as
    /// they are appended (written with the next summary update, at the latest when the loop
    /// ends).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolCounts>,
    /// Its artifacts kept in the record when it (last) ended (see `run/artifacts.rs`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<crate::run::artifacts::KeptArtifact>,
    /// What of its artifact folder was not kept, and why, one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts_skipped: Vec<String>,
    /// How its new worktree was seeded with build state (`warm:`; see `run::warm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<td_protocol::events::WarmSeed>,
}

impl LoopSummary {
    /// A pending loop.
    pub fn pending(name: &str, loop_type: &str) -> Self {
        LoopSummary {
            name: name.to_string(),
            loop_type: loop_type.to_string(),
            ..Self::default()
        }
    }

    /// Marks the loop ended at `time` and computes its duration.
    pub fn mark_ended(&mut self, time: &str) {
        self.ended_at = Some(time.to_string());
        self.duration_ms = self
            .started_at
            .as_deref()
            .and_then(|start| duration_between(start, time));
    }

    /// Records how the engine ended the loop (status, iterations, summary or reason).
    pub fn apply_end(&mut self, end: &LoopEnd) {
        match end {
            LoopEnd::Completed {
                iterations,
                summary,
            } => {
                self.status = LoopStatus::Completed;
                self.iterations = *iterations;
                self.summary = summary.clone();
            }
            LoopEnd::Failed { iterations, reason } => {
                self.status = LoopStatus::Failed;
                self.iterations = *iterations;
                self.reason = Some(reason.clone());
            }
            LoopEnd::Paused { iterations, reason } => {
                self.status = LoopStatus::Paused;
                self.iterations = self.iterations.max(*iterations);
                self.reason = Some(reason.clone());
            }
            LoopEnd::Stopped { iterations, reason } => {
                self.status = LoopStatus::Stopped;
                // A loop stopped by force reports 0: the iterations already recorded stand.
                self.iterations = self.iterations.max(*iterations);
                if reason.is_some() {
                    self.reason = reason.clone();
                }
            }
        }
    }
}

/// The content of `summary.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSummary {
    /// Format version ([`SUMMARY_VERSION`]).
    pub version: u32,
    /// The run id (the directory name under `.taskdaemon/runs/`).
    pub run_id: String,
    /// The config file the run came from.
    pub config: Option<String>,
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// When it finished (missing while running, or after a crash).
    pub ended_at: Option<String>,
    /// Where it stands.
    pub status: RunStatus,
    /// Every loop, by name.
    pub loops: BTreeMap<String, LoopSummary>,
    /// How the run's commands are confined, and what this machine lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<td_confine::SandboxReport>,
    /// The commit whose `.gitattributes` the daemon's own git reads (see
    /// [`EventKind::RunStarted`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes_from: Option<String>,
    /// What every model call of the run spent.
    #[serde(skip_serializing_if = "Spend::is_empty")]
    pub spend: Spend,
    /// The worker hosts that joined the run's head, and the connections it refused.
    #[serde(skip_serializing_if = "crate::run::hosts::summary::HostsSummary::is_empty")]
    pub hosts: crate::run::hosts::summary::HostsSummary,
}

impl RunSummary {
    /// The status the loops imply: failed if any failed or is blocked, completed if all
    /// completed, paused if a budget paused some (and the others completed or were paused
    /// too), stopped otherwise (some loops never finished).
    pub fn status_from_loops(&self) -> RunStatus {
        let statuses = || self.loops.values().map(|l| l.status);
        if statuses().any(|s| matches!(s, LoopStatus::Failed | LoopStatus::Blocked)) {
            RunStatus::Failed
        } else if statuses().all(|s| s == LoopStatus::Completed) {
            RunStatus::Completed
        } else if statuses().all(|s| matches!(s, LoopStatus::Completed | LoopStatus::Paused)) {
            RunStatus::Paused
        } else {
            RunStatus::Stopped
        }
    }

    /// The summary of loop `name`, made pending if the record has not named it before (a
    /// damaged or partial record may mention a loop first anywhere).
    fn loop_entry(&mut self, name: &str) -> &mut LoopSummary {
        let entry = self
            .loops
            .entry(name.to_string())
            .or_insert_with(|| LoopSummary::pending(name, ""));
        entry.name = name.to_string();
        entry
    }

    /// Adds one model call's `spend` made by loop `loop_name`: to the loop that asked the
    /// question it answers when `charged_to` names one (`answers_for_others` of the
    /// answerer, `spent_on_answers` of the asker), to the loop itself otherwise; and to the
    /// run's. The one rule for the live record and a rebuilt summary.
    pub fn add_spend(&mut self, loop_name: &str, charged_to: Option<&str>, spend: &Spend) {
        self.spend.add(spend);
        let payer = match charged_to {
            Some(asker) if asker != loop_name => {
                self.loop_entry(loop_name).answers_for_others.add(spend);
                let asker = self.loop_entry(asker);
                asker.spent_on_answers.add(spend);
                asker
            }
            _ => {
                let own = self.loop_entry(loop_name);
                own.spend.add(spend);
                own
            }
        };
        payer.charged.add(spend);
        payer.usage = Usage {
            input_tokens: payer.charged.input_tokens,
            output_tokens: payer.charged.output_tokens,
            cache_read_tokens: payer.charged.cache_read_tokens,
            cache_write_tokens: payer.charged.cache_write_tokens,
            // Some of the counts are estimates when one of the calls' were.
            estimated: payer.charged.estimated_calls > 0,
        };
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the run is, for [`RunRecord::create`].
#[derive(Debug, Clone, Default)]
pub struct RunMeta {
    /// The config file the run came from.
    pub config: Option<String>,
    /// Loops known at the start, `(name, loop type)`; each is recorded as pending.
    pub loops: Vec<(String, String)>,
    /// How commands are confined.
    pub sandbox: Option<td_confine::SandboxReport>,
}

/// A run being recorded. Cheap to clone: clones share the same files.
///
/// Besides what callers write through [`RunRecord::update_loop`], the record keeps the
/// summary in step with what it sees: loop lifecycle events (started, iteration ended,
/// completed, failed, stopped) update status, iterations, validation and timings, and every
/// model response adds its token usage.
#[derive(Clone)]
pub struct RunRecord {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RunRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunRecord")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

struct Inner {
    dir: PathBuf,
    events: Mutex<File>,
    summary: SummaryFile,
    transcripts: Mutex<HashMap<String, Arc<Mutex<File>>>>,
    receipts: Mutex<HashMap<String, Arc<ReceiptLog>>>,
    /// The writes that failed: after the first, the record is unwritable.
    failures: Arc<Failures>,
    chain: RunChain,
}

impl RunRecord {
    /// Starts the record of a new run in `dir` (created if needed; it may exist, but must not
    /// already hold a run) and writes the initial summary.
    pub fn create(dir: &Path, run_id: &str, meta: RunMeta) -> Result<RunRecord, String> {
        if dir.join(SUMMARY_FILE).exists() {
            return Err(format!(
                "{} already holds a run (it has a {SUMMARY_FILE}); choose another directory, or resume that run",
                dir.display()
            ));
        }
        let loops_dir = dir.join(LOOPS_DIR);
        std::fs::create_dir_all(&loops_dir)
            .map_err(|e| format!("cannot create the run directory {}: {e}", dir.display()))?;
        let mut summary = RunSummary {
            version: SUMMARY_VERSION,
            run_id: run_id.to_string(),
            config: meta.config,
            started_at: now_rfc3339(),
            sandbox: meta.sandbox,
            ..RunSummary::default()
        };
        for (name, loop_type) in &meta.loops {
            let loop_dir = loop_dir(dir, name)?;
            std::fs::create_dir_all(&loop_dir)
                .map_err(|e| format!("cannot create {}: {e}", loop_dir.display()))?;
            summary
                .loops
                .insert(name.clone(), LoopSummary::pending(name, loop_type));
        }
        let events = open_append(&dir.join(EVENTS_FILE))?;
        let record = Self::from_parts(dir, events, summary)?;
        // The new directories and files exist after a power loss too.
        for d in meta
            .loops
            .iter()
            .filter_map(|(name, _)| loop_dir(dir, name).ok())
            .chain([loops_dir, dir.to_path_buf()])
            .chain(dir.parent().map(Path::to_path_buf))
        {
            td_base::record_io::sync_dir(&d)
                .map_err(|e| format!("cannot sync the directory {}: {e}", d.display()))?;
        }
        Ok(record)
    }

    /// Reopens the record of an earlier run to go on with it: the summary is read back (or
    /// rebuilt from the events when it is missing or damaged, see
    /// [`crate::run::rebuild::load_summary`]) and the record reopened with it as
    /// [`RunRecord::reopen`] does.
    pub fn open_existing(dir: &Path) -> Result<RunRecord, String> {
        let (summary, _) = crate::run::rebuild::load_summary(dir)?;
        Self::reopen(dir, summary)
    }

    /// Reopens the record of an earlier run with `summary` (what `--resume` made of it),
    /// marked running again; later lines are appended after what is there (a torn last line
    /// is closed off first so that the next line starts clean).
    pub fn reopen(dir: &Path, mut summary: RunSummary) -> Result<RunRecord, String> {
        summary.status = RunStatus::Running;
        summary.ended_at = None;
        let events = open_append(&dir.join(EVENTS_FILE))?;
        Self::from_parts(dir, events, summary)
    }

    /// The record over `events`, with `summary` written now and kept written.
    fn from_parts(dir: &Path, events: File, summary: RunSummary) -> Result<Self, String> {
        let failures = Arc::new(Failures::new(dir));
        let summary = SummaryFile::start(dir, summary, failures.clone())?;
        Ok(RunRecord {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                events: Mutex::new(events),
                summary,
                transcripts: Mutex::new(HashMap::new()),
                receipts: Mutex::new(HashMap::new()),
                failures,
                chain: RunChain::new(dir),
            }),
        })
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// A copy of the current summary (`summary.json` follows it a little behind; see
    /// [`RunRecord::flush`]).
    pub fn summary(&self) -> RunSummary {
        self.inner.summary.get()
    }

    /// A copy of one loop's summary entry (without copying every loop's).
    pub fn loop_summary(&self, loop_name: &str) -> Option<LoopSummary> {
        self.inner.summary.read(|s| s.loops.get(loop_name).cloned())
    }

    /// Waits until `summary.json` holds every change made so far; the error of its last
    /// write, if that failed.
    pub fn flush(&self) -> Result<(), String> {
        self.inner.summary.flush()
    }

    /// How many writes failed so far (the first is logged loudly, the rest quietly).
    pub fn write_errors(&self) -> u64 {
        self.inner.failures.count()
    }

    /// What the first failed write of the record was, once one failed: from then on loops
    /// must not go on (nothing they did could be recorded), and the run must say so.
    pub fn unwritable(&self) -> Option<String> {
        self.inner.failures.first()
    }

    /// Reports a write of this run's record made elsewhere (a loop's receipt) that failed.
    pub fn note_failure(&self, what: String) {
        self.inner.write_failed(what);
    }

    /// Starts a batch of events recorded by this thread (a host's records batch): until
    /// [`EventsBatch::end`], the events a resume relies on are written without a sync each,
    /// and the batch syncs `events.jsonl` once at its end. A batch of a host could otherwise
    /// hold thousands of them, each an `fdatasync` made under the event log's lock, which
    /// every loop of the run waits on to record anything.
    pub fn events_batch(&self) -> EventsBatch<'_> {
        BATCH_OWES_SYNC.with(|owes| owes.set(Some(false)));
        EventsBatch {
            record: self,
            ended: false,
        }
    }

    /// A listener for [`td_protocol::events::EventLog::subscribe`] that appends every event to
    /// `events.jsonl` and keeps the summary in step with loop lifecycle events.
    pub fn events_listener(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let inner = self.inner.clone();
        move |event: &Event| inner.on_event(event)
    }

    /// The receipt log of `loop_name` (`loops/<name>/receipts.jsonl`), opened once and shared.
    pub fn receipts_for(&self, loop_name: &str) -> Result<Arc<ReceiptLog>, String> {
        let mut logs = lock(&self.inner.receipts);
        if let Some(log) = logs.get(loop_name) {
            return Ok(log.clone());
        }
        let dir = loop_dir(&self.inner.dir, loop_name)?;
        let path = dir.join(RECEIPTS_FILE);
        close_torn_line(&path)?;
        let log = ReceiptLog::open_chained(&path, self.chain_key()?)
            .map(Arc::new)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        sync_new_dir(&self.inner.dir, &dir)?;
        self.count_receipts_of(loop_name, &log);
        logs.insert(loop_name.to_string(), log.clone());
        Ok(log)
    }

    /// The run's receipt chain key, made in the run directory the first time it is asked
    /// for (the orchestrator asks before any loop starts, so that commands never see it).
    pub fn chain_key(&self) -> Result<Arc<td_toolkit::receipts::chain::ChainKey>, String> {
        self.inner.chain.key()
    }

    /// Keeps the per-tool counts of `loop_name` in step with its log: what the log holds
    /// now (a resumed loop's earlier calls too), then every receipt appended.
    fn count_receipts_of(&self, loop_name: &str, log: &ReceiptLog) {
        let counts = log.tally().tools;
        self.inner
            .update_loop(loop_name, |entry| entry.tools = counts);
        // Weak: the log is held by the record, and must not keep the record alive.
        let inner = Arc::downgrade(&self.inner);
        let name = loop_name.to_string();
        log.observe(Box::new(move |receipt, _line| {
            if let Some(inner) = inner.upgrade() {
                inner.summary.change(|summary| {
                    let Some(entry) = summary.loops.get_mut(&name) else {
                        return false;
                    };
                    entry
                        .tools
                        .entry(ToolCounts::key(receipt).to_string())
                        .or_default()
                        .add(receipt);
                    true
                });
            }
        }));
    }

    /// Closes the record of a loop that ended: writes its session receipt
    /// (`loops/<name>/RECEIPT.json`) from its log and its summary entry (the summary, with
    /// the loop's final tool counts, is written behind as always).
    pub fn close_loop(&self, loop_name: &str) -> Result<(), String> {
        // One entry, not the whole summary: every loop's end would copy every loop's entry.
        let (run_id, entry) = self
            .inner
            .summary
            .read(|s| (s.run_id.clone(), s.loops.get(loop_name).cloned()));
        let entry = entry.unwrap_or_else(|| LoopSummary::pending(loop_name, ""));
        let dir = loop_dir(&self.inner.dir, loop_name)?;
        let open = lock(&self.inner.receipts).get(loop_name).cloned();
        let tally = tally_for(open.as_ref(), &dir.join(RECEIPTS_FILE), self.chain_key()?)?;
        self.inner
            .chain
            .close(&run_id, &dir, &entry, &tally, tool_set_of(open.as_ref()))
    }

    /// Closes every loop that ended but whose record this process has not closed and that
    /// has no session receipt yet (loops that never started, loops blocked by others, loops
    /// that ended in an earlier process before their receipt was written).
    pub fn close_ended_loops(&self) -> Result<(), String> {
        let summary = self.summary();
        for (name, entry) in &summary.loops {
            let ended = !matches!(entry.status, LoopStatus::Pending | LoopStatus::Running);
            let written = loop_dir(&self.inner.dir, name)?
                .join(td_toolkit::receipts::session::SESSION_RECEIPT_FILE)
                .exists();
            if ended && !self.inner.chain.is_closed(name) && !written {
                self.close_loop(name)?;
            }
        }
        Ok(())
    }

    /// Changes one loop's summary (adding it, pending, when it is new); `summary.json` is
    /// rewritten behind (see [`RunRecord::flush`]). The entry keeps `name` as its name
    /// whatever `change` does. `change` must not record events: it runs under the summary's
    /// lock. An error when the record can no longer be written.
    pub fn update_loop(
        &self,
        name: &str,
        change: impl FnOnce(&mut LoopSummary),
    ) -> Result<(), String> {
        self.inner.update_loop(name, change);
        match self.unwritable() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Marks the run finished with `status` and writes the final summary, after syncing
    /// what is left of the transcripts and events.
    pub fn finish(&self, status: RunStatus) -> Result<(), String> {
        let inner = &self.inner;
        let transcripts: Vec<_> = lock(&inner.transcripts).values().cloned().collect();
        let synced = transcripts
            .iter()
            .try_for_each(|f| lock(f).sync_data())
            .and_then(|()| lock(&inner.events).sync_data())
            .map_err(|e| format!("cannot sync the run record: {e}"));
        inner.summary.change(|summary| {
            summary.status = status;
            summary.ended_at = Some(now_rfc3339());
            true
        });
        // A failed write of the summary is recorded by its writer.
        let written = inner.summary.flush();
        synced
            .inspect_err(|e| inner.write_failed(e.clone()))
            .and(written)
    }
}

impl Inner {
    fn update_loop(&self, name: &str, change: impl FnOnce(&mut LoopSummary)) {
        self.summary.change(|summary| {
            let entry = summary
                .loops
                .entry(name.to_string())
                .or_insert_with(|| LoopSummary::pending(name, ""));
            change(entry);
            entry.name = name.to_string();
            true
        });
    }

    fn write_failed(&self, what: String) {
        self.failures.record(what);
    }

    fn on_event(&self, event: &Event) {
        let sync = resume_relies_on(&event.kind) && !EventsBatch::owes_sync();
        if let Err(e) = append_line(&self.events, event, sync) {
            self.write_failed(format!("cannot append to {EVENTS_FILE}: {e}"));
        }
        self.summary.change(|summary| apply_event(summary, event));
    }

    fn transcript_file(&self, loop_name: &str) -> Result<Arc<Mutex<File>>, String> {
        let mut files = lock(&self.transcripts);
        if let Some(f) = files.get(loop_name) {
            return Ok(f.clone());
        }
        let dir = loop_dir(&self.dir, loop_name)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let file = Arc::new(Mutex::new(open_append(&dir.join(TRANSCRIPT_FILE))?));
        sync_new_dir(&self.dir, &dir)?;
        files.insert(loop_name.to_string(), file.clone());
        Ok(file)
    }
}

thread_local! {
    /// `Some` while this thread records an [`EventsBatch`]: whether an event of it needs
    /// the sync the batch makes at its end.
    static BATCH_OWES_SYNC: Cell<Option<bool>> = const { Cell::new(None) };
}

/// A batch of events recorded by one thread ([`RunRecord::events_batch`]); ended, it syncs
/// `events.jsonl` once if any of its events needed a sync. Dropped without
/// [`EventsBatch::end`], it syncs all the same (a failure is then only noted in the record).
pub struct EventsBatch<'a> {
    record: &'a RunRecord,
    ended: bool,
}

impl EventsBatch<'_> {
    /// Whether this thread is in a batch; if so, notes that the batch owes a sync.
    fn owes_sync() -> bool {
        BATCH_OWES_SYNC.with(|owes| match owes.get() {
            Some(_) => {
                owes.set(Some(true));
                true
            }
            None => false,
        })
    }

    /// Ends the batch: once this returns `Ok`, every event of it is on the disk (and every
    /// line before it).
    pub fn end(mut self) -> Result<(), String> {
        self.ended = true;
        self.sync()
    }

    fn sync(&self) -> Result<(), String> {
        let owed = BATCH_OWES_SYNC.with(|owes| owes.take()).unwrap_or(false);
        if !owed {
            return Ok(());
        }
        let synced = lock(&self.record.inner.events).sync_data();
        synced.map_err(|e| {
            let why = format!("cannot sync {EVENTS_FILE}: {e}");
            self.record.inner.write_failed(why.clone());
            why
        })
    }
}

impl Drop for EventsBatch<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.sync();
        }
    }
}

/// Whether a resumed run goes on from this event, so that it must be on the disk before the
/// run goes on (and with it every line before it). An `iteration_ended` is always followed
/// by one of these (the failing iteration's progress note, or the loop's end), which a
/// resume waits for before it counts the iteration as finished.
fn resume_relies_on(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::RunStarted { .. }
            | EventKind::ProgressNoted { .. }
            | EventKind::LoopCompleted { .. }
            | EventKind::LoopFailed { .. }
            | EventKind::LoopStopped { .. }
            | EventKind::LoopPaused { .. }
            | EventKind::LoopBlocked { .. }
            | EventKind::LoopMerged { .. }
            | EventKind::MergeHandedBack { .. }
    )
}

/// Syncs `dir` (a loop's directory that now holds a new file) and the directories above it
/// up to the run directory, so that the new file is found after a power loss.
fn sync_new_dir(run_dir: &Path, dir: &Path) -> Result<(), String> {
    for d in [dir, &run_dir.join(LOOPS_DIR)] {
        td_base::record_io::sync_dir(d)
            .map_err(|e| format!("cannot sync the directory {}: {e}", d.display()))?;
    }
    Ok(())
}

/// How `event` changes a run's summary: the one rule for the live record and for a summary
/// rebuilt from the events. Returns whether it changed anything.
pub(crate) fn apply_event(summary: &mut RunSummary, event: &Event) -> bool {
    // The date's text, made only for the events that keep one (most do not).
    let time = || event.time.text().into_owned();
    match &event.kind {
        EventKind::RunStarted {
            run_id,
            config,
            loops,
            sandbox,
            attributes_from,
        } => {
            summary.version = SUMMARY_VERSION;
            if attributes_from.is_some() {
                summary.attributes_from = attributes_from.clone();
            }
            summary.run_id = run_id.clone();
            summary.config = config.clone();
            summary.started_at = time();
            if sandbox.is_some() {
                summary.sandbox = sandbox.clone();
            }
            for planned in loops {
                let s = summary.loop_entry(&planned.name);
                if s.loop_type.is_empty() {
                    s.loop_type = planned.loop_type.clone();
                }
            }
        }
        EventKind::WorktreeSeeded { loop_name, seed } => {
            summary.loop_entry(loop_name).warm = Some(seed.clone());
        }
        EventKind::LoopStarted {
            loop_name,
            loop_type,
            host,
        } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Running;
            s.loop_type = loop_type.clone();
            s.host = host.clone();
            s.started_at = Some(time());
            s.ended_at = None;
            s.duration_ms = None;
        }
        EventKind::IterationEnded {
            loop_name,
            iteration,
            validation_exit,
            validation_passed,
            wall_ms,
            ..
        } => {
            let s = summary.loop_entry(loop_name);
            s.iterations = s.iterations.max(*iteration);
            s.wall_ms = s.wall_ms.saturating_add(wall_ms.unwrap_or(0));
            if let Some(passed) = validation_passed {
                s.validation = Some(ValidationSummary {
                    exit_code: *validation_exit,
                    passed: *passed,
                });
            }
        }
        EventKind::LoopCompleted {
            loop_name,
            iterations,
            summary: text,
        } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Completed;
            s.iterations = *iterations;
            s.summary = text.clone();
            s.mark_ended(&time());
        }
        EventKind::LoopFailed { loop_name, reason } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Failed;
            s.reason = Some(reason.clone());
            s.mark_ended(&time());
        }
        EventKind::LoopStopped { loop_name } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Stopped;
            s.mark_ended(&time());
        }
        EventKind::LoopPaused { loop_name, reason } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Paused;
            s.reason = Some(reason.clone());
            s.mark_ended(&time());
        }
        EventKind::LoopBlocked { loop_name, reason } => {
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Blocked;
            s.reason = Some(reason.clone());
        }
        EventKind::LoopMerged {
            loop_name,
            into,
            commit,
        } => {
            let s = summary.loop_entry(loop_name);
            let attempts = s.merge.as_ref().map_or(0, |m| m.attempts);
            s.merge = Some(MergeSummary {
                merged: true,
                into: Some(into.clone()),
                commit: Some(commit.clone()),
                detail: None,
                attempts,
            });
        }
        EventKind::MergeHandedBack {
            loop_name,
            into,
            attempt,
            reason,
            ..
        } => {
            // The loop runs again at its next iteration: not ended, not blocked.
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Running;
            s.reason = None;
            s.ended_at = None;
            s.duration_ms = None;
            s.merge = Some(MergeSummary::not_merged(into, reason, *attempt));
        }
        EventKind::LoopMoved {
            loop_name, to_host, ..
        } => {
            // It runs again, elsewhere (its host is also what a rebuilt summary shows).
            let s = summary.loop_entry(loop_name);
            s.status = LoopStatus::Running;
            s.reason = None;
            s.ended_at = None;
            s.duration_ms = None;
            s.host = (to_host != td_cluster::protocol::HEAD_NAME).then(|| to_host.clone());
        }
        EventKind::HeavyEnded {
            loop_name,
            tool,
            waited_ms,
            ran_ms,
            ..
        } => {
            // Only a loop of the run: an event naming another makes no entry of its own.
            let Some(s) = summary.loops.get_mut(loop_name) else {
                return false;
            };
            s.heavy
                .get_or_insert_default()
                .add(tool, *waited_ms, *ran_ms);
        }
        kind @ (EventKind::HostJoined { .. }
        | EventKind::HostLost { .. }
        | EventKind::HostLeft { .. }
        | EventKind::HostRefused { .. }) => {
            return crate::run::hosts::summary::apply(&mut summary.hosts, &time(), kind);
        }
        _ => return false,
    }
    true
}

impl TranscriptSink for RunRecord {
    fn unwritable(&self) -> Option<String> {
        RunRecord::unwritable(self)
    }

    fn write_failed(&self, what: String) {
        self.note_failure(what);
    }

    fn record(&self, loop_name: &str, entry: TranscriptEntry) {
        self.record_entries(loop_name, std::slice::from_ref(&entry));
    }

    /// The entries' lines in one write (a host's records batch: a `write` per batch, not per
    /// line), each redacted as [`append_line`] redacts one.
    fn record_all(&self, loop_name: &str, entries: Vec<TranscriptEntry>) {
        self.record_entries(loop_name, &entries);
    }
}

impl RunRecord {
    /// Appends `entries` to `loop_name`'s transcript with one write and adds what they spent
    /// to the summary (a slice: a local loop's single entry needs no vector of its own).
    fn record_entries(&self, loop_name: &str, entries: &[TranscriptEntry]) {
        let inner = &self.inner;
        match inner.transcript_file(loop_name) {
            // The map's lock is released here: loops write their own files in parallel.
            Ok(file) => {
                if let Err(e) = append_lines(&file, entries, false) {
                    inner.write_failed(format!(
                        "cannot append to the transcript of loop `{loop_name}`: {e}"
                    ));
                }
            }
            Err(e) => inner.write_failed(e),
        }
        for entry in entries {
            if let TranscriptEntry::Spent {
                charged_to, spend, ..
            } = entry
            {
                inner.summary.change(|summary| {
                    summary.add_spend(loop_name, charged_to.as_deref(), spend);
                    true
                });
            }
        }
    }
}

/// `dir/loops/<name>`, refusing names that are not a single plain path component (a loop
/// name must never place files outside the run directory).
pub fn loop_dir(run_dir: &Path, loop_name: &str) -> Result<PathBuf, String> {
    let plain = !loop_name.is_empty()
        && loop_name != "."
        && loop_name != ".."
        && !loop_name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if !plain {
        return Err(format!(
            "loop name {loop_name:?} cannot name a directory: use letters, digits, '-', '_' or '.' without slashes"
        ));
    }
    Ok(run_dir.join(LOOPS_DIR).join(loop_name))
}

/// Opens `path` for appending, creating it, after closing off a torn last line.
fn open_append(path: &Path) -> Result<File, String> {
    close_torn_line(path)?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

/// Ends a file that does not end with a newline (a line torn by a crash) with one, so that
/// the next line appended to it parses. The torn line itself stays, and readers report it.
fn close_torn_line(path: &Path) -> Result<(), String> {
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    end_with_newline(&mut file)
        .map_err(|e| format!("cannot repair the last line of {}: {e}", path.display()))
}

fn end_with_newline(file: &mut File) -> std::io::Result<()> {
    if file.seek(SeekFrom::End(0))? == 0 {
        return Ok(());
    }
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    if last[0] != b'\n' {
        file.write_all(b"\n")?;
    }
    Ok(())
}

/// Appends `value` as one JSON line with a single write, secrets redacted; with `sync`, it
/// is on the disk when this returns. A failed write leaves nothing of the line behind.
fn append_line(file: &Mutex<File>, value: &impl Serialize, sync: bool) -> std::io::Result<()> {
    append_lines(file, std::slice::from_ref(value), sync)
}

/// Appends `values` as JSON lines, each redacted, with a single write (all or none); with
/// `sync`, they are on the disk when this returns.
fn append_lines<T: Serialize>(file: &Mutex<File>, values: &[T], sync: bool) -> std::io::Result<()> {
    if values.is_empty() {
        return Ok(());
    }
    let mut lines = String::new();
    for value in values {
        let line = serde_json::to_string(value).map_err(std::io::Error::other)?;
        lines.push_str(&td_base::secrets::redact_json(&line));
        lines.push('\n');
    }
    td_base::record_io::append(&mut lock(file), lines.as_bytes(), sync)
}

pub use td_base::jsonl::JsonlRead;

/// [`td_base::jsonl::for_each`] (the one tolerant JSONL reader) with this crate's string
/// errors.
pub fn for_each_jsonl<T: DeserializeOwned>(
    path: &Path,
    each: impl FnMut(usize, Result<T, td_base::jsonl::BadLine>),
) -> Result<(), String> {
    td_base::jsonl::for_each(path, each).map_err(|e| e.to_string())
}

/// [`td_base::jsonl::read`] with this crate's string errors.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<JsonlRead<T>, String> {
    td_base::jsonl::read(path).map_err(|e| e.to_string())
}

/// Reads a run's `events.jsonl`.
pub fn read_events(run_dir: &Path) -> Result<JsonlRead<Event>, String> {
    read_jsonl(&run_dir.join(EVENTS_FILE))
}

/// The path of a loop's transcript in a run.
pub fn transcript_path(run_dir: &Path, loop_name: &str) -> Result<PathBuf, String> {
    Ok(loop_dir(run_dir, loop_name)?.join(TRANSCRIPT_FILE))
}

/// Reads a loop's `transcript.jsonl`.
pub fn read_transcript(
    run_dir: &Path,
    loop_name: &str,
) -> Result<JsonlRead<TranscriptEntry>, String> {
    read_jsonl(&transcript_path(run_dir, loop_name)?)
}

/// Reads a loop's `receipts.jsonl`.
pub fn read_receipts(run_dir: &Path, loop_name: &str) -> Result<JsonlRead<Receipt>, String> {
    read_jsonl(&loop_dir(run_dir, loop_name)?.join(RECEIPTS_FILE))
}

/// Reads a run's `summary.json`.
pub fn read_summary(run_dir: &Path) -> Result<RunSummary, String> {
    let path = run_dir.join(SUMMARY_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{} is not a run directory: it has no {SUMMARY_FILE}",
                run_dir.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    serde_json::from_slice(&text)
        .map_err(|e| format!("{} is not a run summary: {e}", path.display()))
}

/// Whether `dir` holds a run record: its summary, or (the summary lost) its events.
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join(SUMMARY_FILE).is_file() || dir.join(EVENTS_FILE).is_file()
}

/// The loops of a run: those in its summary and those with a directory under `loops/`,
/// sorted.
pub fn loop_names(run_dir: &Path, summary: Option<&RunSummary>) -> Vec<String> {
    let mut names: Vec<String> = summary
        .map(|s| s.loops.keys().cloned().collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir(run_dir.join(LOOPS_DIR)) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir())
                && let Some(name) = entry.file_name().to_str()
            {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's records batch syncs `events.jsonl` once, at its end, for all the events a
    /// resume relies on (second review of the hosts, #4): within it they are written
    /// unsynced and the batch owes the sync; events without that need owe nothing; the batch
    /// is this thread's only, and ends when ended or dropped.
    #[test]
    fn a_batch_of_events_owes_one_sync_and_is_its_threads_only() {
        let dir = tempfile::tempdir().unwrap();
        let record = RunRecord::create(dir.path(), "r", RunMeta::default()).unwrap();
        let log = td_protocol::events::EventLog::new();
        log.subscribe(record.events_listener());
        let owed = || BATCH_OWES_SYNC.with(|o| o.get());
        let note = |i: u32| EventKind::ProgressNoted {
            loop_name: "a".into(),
            iteration: i,
            note: format!("n{i}"),
        };
        let batch = record.events_batch();
        log.record(EventKind::IterationStarted {
            loop_name: "a".into(),
            iteration: 1,
        });
        assert_eq!(owed(), Some(false), "an event without a sync owes none");
        for i in 1..=3 {
            log.record(note(i));
        }
        assert_eq!(owed(), Some(true));
        // Another thread's events are not the batch's.
        std::thread::scope(|s| {
            s.spawn(|| {
                log.record(note(9));
                assert_eq!(BATCH_OWES_SYNC.with(|o| o.get()), None);
            });
        });
        assert_eq!(batch.end(), Ok(()));
        assert_eq!(owed(), None);
        let read = read_events(dir.path()).unwrap();
        let notes = read
            .items
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ProgressNoted { .. }))
            .count();
        assert_eq!(notes, 4);
        // Dropped unended, it still ends.
        {
            let _batch = record.events_batch();
            log.record(note(4));
            assert_eq!(owed(), Some(true));
        }
        assert_eq!(owed(), None);
        log.record(note(5));
        assert_eq!(owed(), None);
        assert_eq!(record.write_errors(), 0);
    }

    #[test]
    fn run_ids_have_the_documented_shape() {
        let id = new_run_id();
        let re = regex::Regex::new(r"^\d{8}-\d{6}-[0-9a-f]{4}$").unwrap();
        assert!(re.is_match(&id), "{id}");
    }

    #[test]
    fn loop_names_that_would_escape_are_refused() {
        let run = Path::new("/r");
        for bad in ["", ".", "..", "a/b", "../x", "a\\b", "a\0b", "a\nb"] {
            assert!(loop_dir(run, bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            loop_dir(run, "api-v2.x").unwrap(),
            Path::new("/r/loops/api-v2.x")
        );
    }

    #[test]
    fn durations_are_computed_from_rfc3339_times() {
        assert_eq!(
            duration_between("2025-01-01T00:00:00.000Z", "2025-01-01T00:01:05.250Z"),
            Some(65_250)
        );
        assert_eq!(duration_between("garbage", "2025-01-01T00:00:00Z"), None);
        // A clock that went backwards gives zero, not a wrapped huge number.
        assert_eq!(
            duration_between("2025-01-01T00:00:01Z", "2025-01-01T00:00:00Z"),
            Some(0)
        );
    }

    #[test]
    fn a_rebuilt_summary_keeps_the_commit_whose_attributes_the_run_reads() {
        let mut summary = RunSummary::default();
        let commit = "ab".repeat(20);
        let started = |attributes_from: Option<String>| Event {
            seq: 1,
            time: "2025-01-01T00:00:00Z".into(),
            kind: EventKind::RunStarted {
                run_id: "r".into(),
                config: None,
                loops: Vec::new(),
                sandbox: None,
                attributes_from,
            },
        };
        apply_event(&mut summary, &started(Some(commit.clone())));
        assert_eq!(summary.attributes_from.as_deref(), Some(commit.as_str()));
        // A record of before the field (none) leaves it as it was.
        apply_event(&mut summary, &started(None));
        assert_eq!(summary.attributes_from.as_deref(), Some(commit.as_str()));
        let written = serde_json::to_value(&summary).unwrap();
        assert_eq!(written["attributes_from"], commit.as_str());
    }

    #[test]
    fn a_rebuilt_summary_shows_where_each_loop_started_and_moved() {
        let mut summary = RunSummary::default();
        let event = |seq, kind| Event {
            seq,
            time: "2025-01-01T00:00:00Z".into(),
            kind,
        };
        let started = |name: &str, host: Option<&str>| EventKind::LoopStarted {
            loop_name: name.into(),
            loop_type: "code".into(),
            host: host.map(str::to_string),
        };
        assert!(apply_event(&mut summary, &event(1, started("local", None))));
        assert!(apply_event(
            &mut summary,
            &event(2, started("remote", Some("h1")))
        ));
        assert_eq!(summary.loops["local"].host, None);
        assert_eq!(summary.loops["remote"].host.as_deref(), Some("h1"));
        let moved = |to: &str| EventKind::LoopMoved {
            loop_name: "remote".into(),
            from_host: "h1".into(),
            to_host: to.into(),
            reason: "its host h1 was lost".into(),
            iteration: 2,
            moves: 1,
        };
        assert!(apply_event(&mut summary, &event(3, moved("h2"))));
        assert_eq!(summary.loops["remote"].host.as_deref(), Some("h2"));
        assert!(apply_event(
            &mut summary,
            &event(4, moved(td_cluster::protocol::HEAD_NAME))
        ));
        assert_eq!(summary.loops["remote"].host, None);
    }

    #[test]
    fn run_status_follows_the_loops() {
        let mut s = RunSummary::default();
        for (name, status) in [("a", LoopStatus::Completed), ("b", LoopStatus::Completed)] {
            let mut l = LoopSummary::pending(name, "t");
            l.status = status;
            s.loops.insert(name.into(), l);
        }
        assert_eq!(s.status_from_loops(), RunStatus::Completed);
        s.loops.get_mut("b").unwrap().status = LoopStatus::Stopped;
        assert_eq!(s.status_from_loops(), RunStatus::Stopped);
        s.loops.get_mut("a").unwrap().status = LoopStatus::Blocked;
        assert_eq!(s.status_from_loops(), RunStatus::Failed);
    }

    #[test]
    fn heavy_lane_times_add_up_per_loop_and_tool() {
        let mut summary = RunSummary::default();
        summary
            .loops
            .insert("a".into(), LoopSummary::pending("a", "t"));
        let ended = |loop_name: &str, tool: &str, waited_ms, ran_ms| Event {
            seq: 1,
            time: "2025-01-01T00:00:00Z".into(),
            kind: EventKind::HeavyEnded {
                loop_name: loop_name.into(),
                tool: tool.into(),
                waited_ms,
                ran_ms,
                cancelled: false,
            },
        };
        for (tool, waited, ran) in [
            ("build", 100, 2_000),
            ("build", 0, 500),
            ("test", 50, 700),
            ("validate", 0, 300),
            ("run_command", 10, 9_000),
            ("test", u64::MAX, u64::MAX),
        ] {
            assert!(apply_event(&mut summary, &ended("a", tool, waited, ran)));
        }
        assert_eq!(
            summary.loops["a"].heavy,
            Some(HeavySummary {
                waited_ms: u64::MAX,
                build_ms: 2_500,
                test_ms: u64::MAX,
                validate_ms: 300,
                calls: 6,
            })
        );
        let json = serde_json::to_value(&summary.loops["a"]).unwrap();
        assert_eq!(json["heavy"]["build_ms"], 2_500);
        assert_eq!(json["heavy"]["calls"], 6);
        // A loop that never used the lane has no `heavy`; an event naming no loop of the
        // run makes none.
        assert!(!apply_event(&mut summary, &ended("ghost", "build", 1, 1)));
        assert!(!summary.loops.contains_key("ghost"));
        let quiet = serde_json::to_value(LoopSummary::pending("b", "t")).unwrap();
        assert!(quiet.get("heavy").is_none(), "{quiet}");
    }

    #[test]
    fn apply_end_records_each_kind_of_end() {
        let mut l = LoopSummary::pending("a", "t");
        l.apply_end(&LoopEnd::Failed {
            iterations: 3,
            reason: "max iterations".into(),
        });
        assert_eq!(
            (l.status, l.iterations, l.reason.as_deref()),
            (LoopStatus::Failed, 3, Some("max iterations"))
        );
        l.apply_end(&LoopEnd::Completed {
            iterations: 4,
            summary: Some("done".into()),
        });
        assert_eq!(
            (l.status, l.iterations, l.summary.as_deref()),
            (LoopStatus::Completed, 4, Some("done"))
        );
        l.apply_end(&LoopEnd::Stopped {
            iterations: 5,
            reason: None,
        });
        assert_eq!((l.status, l.iterations), (LoopStatus::Stopped, 5));
        l.apply_end(&LoopEnd::Stopped {
            iterations: 5,
            reason: Some("the run record could not be written".into()),
        });
        assert_eq!(
            l.reason.as_deref(),
            Some("the run record could not be written")
        );
    }
}
