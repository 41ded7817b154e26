//! `taskdaemon status` and `taskdaemon logs`: what a recorded run looks like to a person.
//! Pure functions from a run directory to text; the CLI only prints what they return.
//!
//! Both accept a project directory (its `.taskdaemon/runs` is used), a runs root, or a run
//! directory, and an optional run id; without one, the newest run is shown: the one that
//! started last (its recorded start time, not its name: `--run-dir` names are anyone's).
//!
//! A run recorded `running` whose process is gone is shown `interrupted` (see
//! [`super::owner`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, FixedOffset};
use td_base::text::head_tail;
use td_engine::transcript::TranscriptEntry;
use td_llm::{Block, Purpose, Role, StopReason};
use td_protocol::spend::Spend;

use super::record::{
    EVENTS_FILE, HeavySummary, LoopStatus, LoopSummary, RunStatus, RunSummary, duration_between,
    for_each_jsonl, is_run_dir, loop_names, read_summary, runs_root, transcript_path,
};

/// How many run ids an error message lists.
const LISTED_RUNS: usize = 10;

/// The runs under `root` (directories holding a `summary.json`, or the `events.jsonl` it can
/// be rebuilt from), oldest first by recorded start time (a run whose start cannot be read
/// counts as oldest), then by name.
pub fn list_runs(root: &Path) -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir(root).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "no runs: {} does not exist (`taskdaemon run` creates it)",
                root.display()
            )
        } else {
            format!("cannot list {}: {e}", root.display())
        }
    })?;
    let mut runs: Vec<(Option<DateTime<FixedOffset>>, String)> = entries
        .flatten()
        .filter(|e| is_run_dir(&e.path()))
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            Some((started_at(&e.path()), name))
        })
        .collect();
    runs.sort();
    Ok(runs.into_iter().map(|(_, name)| name).collect())
}

/// When the run in `dir` started: its summary's start, or else the time of its first event
/// (`run_started`; the summary may be missing or torn after a crash). `None` when neither
/// can be read.
fn started_at(dir: &Path) -> Option<DateTime<FixedOffset>> {
    let from_summary = read_summary(dir)
        .ok()
        .and_then(|s| DateTime::parse_from_rfc3339(&s.started_at).ok());
    from_summary.or_else(|| {
        use std::io::BufRead;
        let file = std::fs::File::open(dir.join(EVENTS_FILE)).ok()?;
        let mut first = String::new();
        // One line, and not more than an event's worth of it (a hostile file may have none).
        std::io::BufReader::new(std::io::Read::take(file, 64 * 1024))
            .read_line(&mut first)
            .ok()?;
        let event: serde_json::Value = serde_json::from_str(first.trim()).ok()?;
        DateTime::parse_from_rfc3339(event.get("time")?.as_str()?).ok()
    })
}

/// Finds the run directory meant by `path` (a project, a runs root or a run directory)
/// and `run` (a run id; the newest run when `None`).
pub fn resolve_run_dir(path: &Path, run: Option<&str>) -> Result<PathBuf, String> {
    let is_run = is_run_dir(path);
    if is_run && run.is_none_or(|id| path.file_name().is_some_and(|n| n == id)) {
        return Ok(path.to_path_buf());
    }
    let root = if is_run {
        // A run directory and another run's id: look beside it.
        path.parent().unwrap_or(path).to_path_buf()
    } else if runs_root(path).is_dir() {
        runs_root(path)
    } else {
        path.to_path_buf()
    };
    let runs = list_runs(&root)?;
    match run {
        Some(id) if runs.iter().any(|r| r == id) => Ok(root.join(id)),
        Some(id) => Err(format!(
            "no run `{id}` in {}; {}",
            root.display(),
            available(&runs)
        )),
        None => runs.last().map(|r| root.join(r)).ok_or_else(|| {
            format!(
                "no runs in {} yet: `taskdaemon run` records one there",
                root.display()
            )
        }),
    }
}

fn available(runs: &[String]) -> String {
    if runs.is_empty() {
        return "there are no runs there yet".to_string();
    }
    let shown = &runs[runs.len().saturating_sub(LISTED_RUNS)..];
    let older = runs.len() - shown.len();
    let mut text = format!("available runs (newest last): {}", shown.join(", "));
    if older > 0 {
        let _ = write!(text, " (and {older} older)");
    }
    text
}

/// What `status` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusOutput {
    /// For stdout: the table, or the summary as JSON.
    pub text: String,
    /// For stderr, a line each: how the summary was rebuilt when `summary.json` was missing
    /// or damaged, and the lines of the record that could not be read.
    pub notes: Vec<String>,
}

/// The status of a run: a table of its loops (name, type, status, iterations, validation,
/// branch, artifacts kept, duration, tokens, cost), or with `json` the run's `summary.json` as it is. A missing or damaged
/// `summary.json` is rebuilt from the run's events (and said so in the notes); nothing is
/// written.
pub fn status_command(path: &Path, run: Option<&str>, json: bool) -> Result<StatusOutput, String> {
    let dir = resolve_run_dir(path, run)?;
    let (mut summary, notes) = super::rebuild::load_summary(&dir)?;
    // The record says `running` until its process writes the end; if no process holds the
    // run, none will (it was killed or crashed).
    if summary.status == RunStatus::Running && !super::owner::is_owned(&dir) {
        summary.status = RunStatus::Interrupted;
    }
    let text = if json {
        serde_json::to_string_pretty(&summary)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| format!("cannot serialize the summary: {e}"))?
    } else {
        render_status(&summary, &super::record::now_rfc3339())
    };
    Ok(StatusOutput { text, notes })
}

/// The artifacts a run's loops kept (`status --artifacts`): a table of loop, kind, name,
/// bytes and path (relative to the run directory, named on the first line), then what was
/// not kept, a line each; with `json`, the same as a JSON array of `{loop, kind, name,
/// path, bytes}` (what was not kept is in `status --json`). Read from the summary (rebuilt
/// when it is missing or damaged, as for `status`).
pub fn artifacts_command(
    path: &Path,
    run: Option<&str>,
    json: bool,
) -> Result<StatusOutput, String> {
    let dir = resolve_run_dir(path, run)?;
    let (summary, notes) = super::rebuild::load_summary(&dir)?;
    let text = if json {
        let list: Vec<serde_json::Value> = summary
            .loops
            .values()
            .flat_map(|l| {
                l.artifacts.iter().map(|a| {
                    serde_json::json!({
                        "loop": l.name, "kind": a.kind, "name": a.name,
                        "path": a.path, "bytes": a.bytes,
                    })
                })
            })
            .collect();
        serde_json::to_string_pretty(&list)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| format!("cannot serialize the artifacts: {e}"))?
    } else {
        render_artifacts(&summary, &dir)
    };
    Ok(StatusOutput { text, notes })
}

/// The text of `status --artifacts` for the run in `dir`.
fn render_artifacts(summary: &RunSummary, dir: &Path) -> String {
    let mut out = format!(
        "run {}  artifacts under {}\n\n",
        summary.run_id,
        dir.display()
    );
    let rows: Vec<[String; 5]> = summary
        .loops
        .values()
        .flat_map(|l| {
            l.artifacts.iter().map(|a| {
                [
                    l.name.clone(),
                    a.kind.clone(),
                    a.name.clone(),
                    a.bytes.to_string(),
                    a.path.clone(),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no artifacts kept\n");
    } else {
        let header = ["LOOP", "KIND", "NAME", "BYTES", "PATH"].map(str::to_string);
        let mut widths = header.clone().map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let [l, k, n, b, p] = row;
            let _ = writeln!(
                out,
                "{l:<w0$}  {k:<w1$}  {n:<w2$}  {b:>w3$}  {p}",
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3]
            );
        }
    }
    let skipped: Vec<String> = summary
        .loops
        .values()
        .flat_map(|l| {
            l.artifacts_skipped
                .iter()
                .map(move |why| format!("not kept {}: {why}", l.name))
        })
        .collect();
    if !skipped.is_empty() {
        out.push('\n');
        for line in skipped {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// A loop's status as shown: a loop recorded `running` in a run whose process is gone is
/// `interrupted` like its run (nothing runs it any more).
fn loop_status(summary: &RunSummary, l: &LoopSummary) -> &'static str {
    if summary.status == RunStatus::Interrupted && l.status == LoopStatus::Running {
        RunStatus::Interrupted.as_str()
    } else {
        l.status.as_str()
    }
}

/// The status table of `summary`; `now` (RFC 3339) gives running loops their elapsed time.
pub fn render_status(summary: &RunSummary, now: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "run {}  {}  started {}",
        summary.run_id,
        summary.status.as_str(),
        summary.started_at
    );
    if let Some(end) = &summary.ended_at {
        let _ = write!(out, "  ended {end}");
        if let Some(ms) = duration_between(&summary.started_at, end) {
            let _ = write!(out, "  ({})", human_duration(ms));
        }
    }
    out.push('\n');
    if let Some(config) = &summary.config {
        let _ = writeln!(out, "config {config}");
    }
    if let Some(sandbox) = &summary.sandbox {
        for gap in &sandbox.missing {
            let _ = writeln!(out, "sandbox missing {gap}");
        }
    }
    out.push('\n');
    if summary.loops.is_empty() {
        out.push_str("no loops recorded yet\n");
        return out;
    }
    // A run with worker hosts shows where each loop runs (`head` for the head).
    let with_hosts =
        !summary.hosts.hosts.is_empty() || summary.loops.values().any(|l| l.host.is_some());
    let mut header = vec![
        "LOOP",
        "TYPE",
        "STATUS",
        "ITER",
        "VALIDATION",
        "BRANCH",
        "ARTIFACTS",
        "DURATION",
        "TOKENS",
        "COST",
    ];
    if with_hosts {
        header.push("HOST");
    }
    let rows: Vec<Vec<String>> = summary
        .loops
        .values()
        .map(|l| {
            let mut row = vec![
                l.name.clone(),
                dash(&l.loop_type),
                loop_status(summary, l).to_string(),
                l.iterations.to_string(),
                validation_cell(l),
                dash(l.branch.as_deref().unwrap_or("")),
                artifacts_cell(l),
                duration_cell(l, now),
                tokens_cell(&l.charged),
                cost_cell(l),
            ];
            if with_hosts {
                row.push(match (&l.host, l.status) {
                    (Some(h), _) => h.clone(),
                    (None, LoopStatus::Pending) => "-".to_string(),
                    (None, _) => td_cluster::protocol::HEAD_NAME.to_string(),
                });
            }
            row
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths.iter().copied()).enumerate() {
            // ITER, ARTIFACTS and TOKENS are numbers: right-aligned; the last column carries
            // no padding.
            if i == 3 || i == 6 || i == 8 {
                let _ = write!(text, "{cell:>w$}  ");
            } else if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<w$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    for row in &rows {
        line(row);
    }
    let mut notes = String::new();
    for l in summary.loops.values() {
        if let Some(reason) = &l.reason {
            let _ = writeln!(notes, "{} {}: {}", l.status.as_str(), l.name, reason);
        }
        if let Some(merge) = &l.merge {
            let into = merge.into.as_deref().unwrap_or("?");
            let what = if merge.merged {
                match &merge.commit {
                    Some(commit) => format!("merged into {into} as {commit}"),
                    None => format!("merged into {into}"),
                }
            } else {
                format!("not merged into {into}")
            };
            let detail = merge
                .detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            let _ = writeln!(notes, "merge {}: {what}{detail}", l.name);
        }
        if let Some(seed) = &l.warm {
            let _ = writeln!(notes, "warm {}: {}", l.name, warm_note(seed));
        }
        if let Some(heavy) = l.heavy.filter(|h| h.calls > 0) {
            let _ = writeln!(notes, "heavy {}: {}", l.name, heavy_note(&heavy));
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes);
    }
    let hosts =
        super::hosts::summary::render(&summary.hosts, summary.status == RunStatus::Interrupted);
    if !hosts.is_empty() {
        out.push('\n');
        out.push_str(&hosts);
    }
    out.push('\n');
    out.push_str(&totals(summary));
    out
}

/// What seeding the loop's worktree did: `target (1204 files, 310.5 MB, copy, 2.1s)`.
fn warm_note(seed: &td_protocol::events::WarmSeed) -> String {
    if seed.paths.is_empty() {
        let why = seed
            .skipped
            .first()
            .map(String::as_str)
            .unwrap_or("nothing to copy");
        return format!("nothing seeded ({why})");
    }
    let mut note = format!(
        "{} ({} files, {}, {}, {})",
        seed.paths.join(", "),
        seed.files,
        human_bytes(seed.bytes),
        seed.method,
        human_duration(seed.ms)
    );
    if seed.skipped_entries > 0 {
        let _ = write!(note, "; {} entries left out", seed.skipped_entries);
    }
    note
}

/// How the loop used the heavy lane: `waited 12s; build 1m 05s, test 40s (6 calls)`.
fn heavy_note(heavy: &HeavySummary) -> String {
    let mut ran = Vec::new();
    for (what, ms) in [
        ("build", heavy.build_ms),
        ("test", heavy.test_ms),
        ("validate", heavy.validate_ms),
    ] {
        if ms > 0 {
            ran.push(format!("{what} {}", human_duration(ms)));
        }
    }
    let ran = if ran.is_empty() {
        String::new()
    } else {
        format!("; {}", ran.join(", "))
    };
    format!(
        "waited {}{ran} ({} call{})",
        human_duration(heavy.waited_ms),
        heavy.calls,
        if heavy.calls == 1 { "" } else { "s" }
    )
}

/// `512 B`, `3.4 kB`, `310.5 MB`, `1.2 GB` (decimal units, as `du --si`).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

/// How many artifacts the loop kept (a plan's `.json` and `.md` count once), `-` for none.
fn artifacts_cell(l: &LoopSummary) -> String {
    match super::artifacts::Kept::count(&l.artifacts) {
        0 => "-".into(),
        n => n.to_string(),
    }
}

fn validation_cell(l: &LoopSummary) -> String {
    match l.validation {
        None => "-".into(),
        Some(v) => {
            let verdict = if v.passed { "passed" } else { "failed" };
            match v.exit_code {
                Some(code) => format!("{verdict} ({code})"),
                None => format!("{verdict} (no exit code)"),
            }
        }
    }
}

fn duration_cell(l: &LoopSummary, now: &str) -> String {
    let ms = match (&l.started_at, l.duration_ms) {
        (_, Some(ms)) => Some(ms),
        (Some(start), None) if l.status == LoopStatus::Running => duration_between(start, now),
        _ => None,
    };
    ms.map(human_duration).unwrap_or_else(|| "-".into())
}

/// Tokens of every kind, `-` for none.
fn tokens_cell(spend: &Spend) -> String {
    match spend.tokens() {
        0 => "-".into(),
        n => n.to_string(),
    }
}

/// What is charged to the loop, with what its answers to its questions cost when there is
/// any (`$0.6003 (answers $0.5003)`).
fn cost_cell(l: &LoopSummary) -> String {
    let mut cell = l.charged.cost_text();
    if !l.spent_on_answers.is_empty() {
        cell.push_str(&format!(" (answers {})", l.spent_on_answers.cost_text()));
    }
    cell
}

fn totals(summary: &RunSummary) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for l in summary.loops.values() {
        let shown = loop_status(summary, l);
        match counts.iter_mut().find(|(s, _)| *s == shown) {
            Some((_, n)) => *n += 1,
            None => counts.push((shown, 1)),
        }
    }
    counts.sort_by_key(|(s, _)| *s);
    let parts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let spend = &summary.spend;
    format!(
        "{} loop(s): {}; tokens {} in, {} out, {} cache read, {} cache write; cost {}\n",
        summary.loops.len(),
        parts.join(", "),
        spend.input_tokens,
        spend.output_tokens,
        spend.cache_read_tokens,
        spend.cache_write_tokens,
        spend.cost_text()
    )
}

/// `850ms`, `12s`, `1m 05s`, `2h 03m`.
pub fn human_duration(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0 => format!("{ms}ms"),
        1..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m {:02}s", secs / 60, secs % 60),
        _ => format!("{}h {:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// What `logs` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsOptions {
    /// Only this iteration (0: the loop's answers to other loops' queries).
    pub iteration: Option<u32>,
    /// Longest text shown for one message, tool input or result, in bytes (head and tail
    /// kept); `None` shows everything.
    pub max_content_bytes: Option<usize>,
    /// Show each iteration's system prompt (otherwise only its size).
    pub system: bool,
}

impl Default for LogsOptions {
    fn default() -> Self {
        LogsOptions {
            iteration: None,
            max_content_bytes: Some(2048),
            system: false,
        }
    }
}

/// A loop's transcript, readably: iteration headers, each request's new messages, each
/// response with its tool calls, tool results (✓ or ✗), validation results and model errors.
/// Lines that could not be read (a torn last line after a crash) are reported at the end.
pub fn logs_command(
    path: &Path,
    run: Option<&str>,
    loop_name: &str,
    options: &LogsOptions,
) -> Result<String, String> {
    let dir = resolve_run_dir(path, run)?;
    let summary = read_summary(&dir).ok();
    let known = loop_names(&dir, summary.as_ref());
    if !known.iter().any(|n| n == loop_name) {
        let list = if known.is_empty() {
            "it has no loops".to_string()
        } else {
            format!("its loops: {}", known.join(", "))
        };
        return Err(format!(
            "no loop `{loop_name}` in run {}; {list}",
            dir.display()
        ));
    }
    let transcript = transcript_path(&dir, loop_name)?;
    if !transcript.is_file() {
        return Ok(format!(
            "loop `{loop_name}` has no transcript yet: it made no model call in this run\n"
        ));
    }
    let mut view = LogView {
        options,
        out: String::new(),
        shown_results: HashMap::new(),
        call_names: HashMap::new(),
    };
    let mut bad = Vec::new();
    for_each_jsonl::<TranscriptEntry>(&transcript, |number, entry| match entry {
        Ok(entry) => {
            if options.iteration.is_none_or(|i| i == iteration_of(&entry)) {
                view.entry(&entry);
            }
        }
        Err(e) => bad.push((number, e)),
    })?;
    let mut out = view.out;
    if out.is_empty() {
        out = match options.iteration {
            Some(i) => format!("loop `{loop_name}` has nothing recorded for iteration {i}\n"),
            None => format!("loop `{loop_name}`'s transcript is empty\n"),
        };
    }
    if !bad.is_empty() {
        let _ = writeln!(
            out,
            "\n! {} line(s) of {} could not be read:",
            bad.len(),
            transcript.display()
        );
        for (number, e) in bad {
            let _ = writeln!(out, "  line {number}: {e}");
        }
    }
    Ok(out)
}

fn iteration_of(entry: &TranscriptEntry) -> u32 {
    match entry {
        TranscriptEntry::IterationStarted { iteration, .. }
        | TranscriptEntry::Request { iteration, .. }
        | TranscriptEntry::Response { iteration, .. }
        | TranscriptEntry::Spent { iteration, .. }
        | TranscriptEntry::ToolResult { iteration, .. }
        | TranscriptEntry::Validation { iteration, .. }
        | TranscriptEntry::ModelError { iteration, .. } => *iteration,
    }
}

struct LogView<'a> {
    options: &'a LogsOptions,
    out: String,
    /// Per iteration (query answers, iteration 0, interleave with the loop's own turns):
    /// ids of tool results already shown from their own entry, so that the next request
    /// (which carries the same results to the model) does not show them twice.
    shown_results: HashMap<u32, Vec<String>>,
    /// Per iteration: tool names by call id from the latest response, to name the results
    /// that a request carries.
    call_names: HashMap<u32, HashMap<String, String>>,
}

impl LogView<'_> {
    fn cut(&self, text: &str) -> String {
        match self.options.max_content_bytes {
            Some(max) => head_tail(text, max),
            None => text.to_string(),
        }
    }

    fn indented(&mut self, text: &str) {
        let text = self.cut(text);
        if text.is_empty() {
            self.out.push_str("    (empty)\n");
        }
        for line in text.lines() {
            let _ = writeln!(self.out, "    {line}");
        }
    }

    fn result(&mut self, ok: bool, name: &str, id: &str, content: &str) {
        let mark = if ok { '✓' } else { '✗' };
        let _ = writeln!(self.out, "{mark} {name} [{id}]");
        self.indented(content);
    }

    fn entry(&mut self, entry: &TranscriptEntry) {
        match entry {
            TranscriptEntry::IterationStarted { iteration, system } => {
                let _ = writeln!(self.out, "=== iteration {iteration} ===");
                if self.options.system {
                    self.out.push_str("system:\n");
                    self.indented(system);
                } else {
                    let _ = writeln!(self.out, "(system prompt: {} bytes)", system.len());
                }
            }
            TranscriptEntry::Request {
                iteration,
                turn,
                purpose,
                new_messages,
            } => {
                if let (Purpose::QueryAnswer { from, question }, 1) = (purpose, turn) {
                    let _ = writeln!(self.out, "=== answering a query from `{from}` ===");
                    self.out.push_str("question:\n");
                    self.indented(question);
                }
                let _ = writeln!(
                    self.out,
                    "--- {}: request ---",
                    turn_label(*iteration, *turn)
                );
                let shown = self.shown_results.remove(iteration).unwrap_or_default();
                for message in new_messages {
                    // The model's own messages were shown with its response.
                    if message.role == Role::Assistant {
                        continue;
                    }
                    for block in &message.content {
                        match block {
                            Block::Text { text } => {
                                self.out.push_str("user:\n");
                                self.indented(text);
                            }
                            Block::ToolResult {
                                tool_use_id,
                                content,
                                is_error,
                            } => {
                                if shown.contains(tool_use_id) {
                                    continue;
                                }
                                let name = self
                                    .call_names
                                    .get(iteration)
                                    .and_then(|names| names.get(tool_use_id))
                                    .cloned()
                                    .unwrap_or_else(|| "result".into());
                                self.result(!is_error, &name, tool_use_id, content);
                            }
                            Block::ToolUse { .. } => {}
                        }
                    }
                }
            }
            TranscriptEntry::Response {
                iteration,
                turn,
                response,
            } => {
                let stop = match &response.stop_reason {
                    StopReason::EndTurn => "end_turn",
                    StopReason::ToolUse => "tool_use",
                    StopReason::MaxTokens => "max_tokens",
                    StopReason::Other(s) => s.as_str(),
                };
                let _ = writeln!(
                    self.out,
                    "--- {}: response (stop: {stop}; tokens {} in, {} out) ---",
                    turn_label(*iteration, *turn),
                    response.usage.input_tokens,
                    response.usage.output_tokens
                );
                if let Some(text) = response.text.as_deref().filter(|t| !t.is_empty()) {
                    self.out.push_str("assistant:\n");
                    self.indented(text);
                }
                let names = self.call_names.entry(*iteration).or_default();
                names.clear();
                for call in &response.tool_calls {
                    names.insert(call.id.clone(), call.name.clone());
                }
                for call in &response.tool_calls {
                    let input = self.cut(&call.input.to_string());
                    let _ = writeln!(self.out, "→ {} [{}] {input}", call.name, call.id);
                }
            }
            TranscriptEntry::Spent {
                charged_to, spend, ..
            } => {
                let payer = match charged_to {
                    Some(asker) => format!(", charged to `{asker}`, who asked"),
                    None => String::new(),
                };
                let _ = writeln!(
                    self.out,
                    "(cost {}; cache {} read, {} written{payer})",
                    spend.cost_text(),
                    spend.cache_read_tokens,
                    spend.cache_write_tokens
                );
            }
            TranscriptEntry::ToolResult {
                iteration,
                call_id,
                name,
                content,
                is_error,
                ..
            } => {
                self.result(!is_error, name, call_id, content);
                self.shown_results
                    .entry(*iteration)
                    .or_default()
                    .push(call_id.clone());
            }
            TranscriptEntry::Validation {
                exit_code,
                passed,
                output,
                ..
            } => {
                let verdict = if *passed { "passed" } else { "failed" };
                let code = match exit_code {
                    Some(c) => format!("exit {c}"),
                    None => "no exit code: killed, timed out or no command".to_string(),
                };
                let _ = writeln!(self.out, "validation: {verdict} ({code})");
                self.indented(output);
            }
            TranscriptEntry::ModelError { iteration, error } => {
                let what = if *iteration == 0 {
                    "model error while answering a query"
                } else {
                    "model error"
                };
                let _ = writeln!(self.out, "✗ {what}: {error}");
            }
        }
    }
}

/// `turn 2`, or `answer turn 2` for a query answer (iteration 0), whose turns interleave
/// with the loop's own.
fn turn_label(iteration: u32, turn: u32) -> String {
    if iteration == 0 {
        format!("answer turn {turn}")
    } else {
        format!("turn {turn}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human_duration(850), "850ms");
        assert_eq!(human_duration(12_400), "12s");
        assert_eq!(human_duration(65_000), "1m 05s");
        assert_eq!(human_duration(7_380_000), "2h 03m");
    }

    #[test]
    fn availability_lists_the_newest_runs_only() {
        let runs: Vec<String> = (0..12).map(|i| format!("r{i:02}")).collect();
        let text = available(&runs);
        assert!(
            text.starts_with("available runs (newest last): r02, r03"),
            "{text}"
        );
        assert!(text.ends_with("r11 (and 2 older)"), "{text}");
        assert_eq!(available(&[]), "there are no runs there yet");
    }

    #[test]
    fn missing_protections_are_shown_a_line_each() {
        let protections = td_confine::Protections {
            landlock_abi: 0,
            seccomp: false,
            namespaces: true,
            needs_user_namespace: false,
        };
        let summary = RunSummary {
            run_id: "r1".into(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
            sandbox: Some(td_confine::SandboxReport {
                mode: td_confine::SandboxMode::BestEffort,
                missing: protections.missing(),
                protections,
            }),
            ..RunSummary::default()
        };
        let text = render_status(&summary, "2026-01-01T00:00:01.000Z");
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("sandbox missing "))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("sandbox missing landlock:"), "{text}");
        assert!(lines[1].starts_with("sandbox missing seccomp:"), "{text}");
    }

    #[test]
    fn warm_seeding_and_heavy_lane_use_are_a_line_each_per_loop() {
        let mut summary = RunSummary {
            run_id: "r1".into(),
            started_at: "2026-01-01T00:00:00.000Z".into(),
            ..RunSummary::default()
        };
        let mut warm = LoopSummary::pending("fast", "rust");
        warm.warm = Some(td_protocol::events::WarmSeed {
            paths: vec!["target".into()],
            files: 1204,
            bytes: 310_500_000,
            method: "copy".into(),
            ms: 2_100,
            skipped_entries: 2,
            ..Default::default()
        });
        warm.heavy = Some(HeavySummary {
            waited_ms: 12_000,
            build_ms: 65_000,
            test_ms: 40_000,
            validate_ms: 0,
            calls: 6,
        });
        let mut cold = LoopSummary::pending("cold", "rust");
        cold.warm = Some(td_protocol::events::WarmSeed {
            skipped: vec!["target: the base checkout has none".into()],
            method: "none".into(),
            ..Default::default()
        });
        cold.heavy = Some(HeavySummary {
            calls: 1,
            ..HeavySummary::default()
        });
        let quiet = LoopSummary::pending("quiet", "rust");
        for l in [warm, cold, quiet] {
            summary.loops.insert(l.name.clone(), l);
        }
        let text = render_status(&summary, "2026-01-01T00:00:01.000Z");
        let notes: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("warm ") || l.starts_with("heavy "))
            .collect();
        assert_eq!(
            notes,
            [
                "warm cold: nothing seeded (target: the base checkout has none)",
                "heavy cold: waited 0ms (1 call)",
                "warm fast: target (1204 files, 310.5 MB, copy, 2s); 2 entries left out",
                "heavy fast: waited 12s; build 1m 05s, test 40s (6 calls)",
            ],
            "{text}"
        );
        assert!(!text.contains("quiet:"), "{text}");
    }

    #[test]
    fn byte_counts_read_in_decimal_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(3_400), "3.4 kB");
        assert_eq!(human_bytes(1_200_000_000), "1.2 GB");
        assert_eq!(human_bytes(u64::MAX), "18446744.1 TB");
    }
}
