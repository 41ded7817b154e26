//! Live progress of a run: one line per loop (status, iteration/max, elapsed, what is charged
//! to it so far, current tool, last coordination message), redrawn in place on a terminal;
//! plain log lines otherwise; JSON event lines with `--json`.
//!
//! Everything written is redacted ([`td_base::secrets`]) as it is written, and text cut short
//! for a row is redacted before the cut, so that no piece of a secret is shown.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use td_base::sync::lock;
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_protocol::events::{Event, EventKind};
use td_protocol::spend::Spend;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Lines redrawn in place (a terminal).
    Live,
    /// One log line per notable event (not a terminal).
    Plain,
    /// Every event as a JSON line.
    Json,
}

#[derive(Debug, Clone, Default)]
struct Row {
    status: String,
    iteration: u32,
    max_iterations: u32,
    tool: String,
    started: Option<Instant>,
    ended: Option<Instant>,
    last: String,
    /// Characters of the reply streaming in now, if one is.
    streaming: Option<u64>,
    /// What is charged to the loop so far (its calls, and answers to its questions).
    charged: Spend,
    /// Since when its call (the tool named) waits for a worker of the heavy lane.
    heavy_wait: Option<(Instant, String)>,
}

/// Growth of a streamed reply redraws the live table at most this often.
const GROWTH_REDRAW: Duration = Duration::from_millis(250);

/// How often the live table is redrawn without an event.
const TICK: Duration = Duration::from_secs(1);

/// Log and JSON lines in a burst go out together at most this often (one `write` for all of
/// them, not one per line: a stream of cross-host queries makes thousands a second); a line
/// after a quiet spell goes out at once.
const LINE_FLUSH: Duration = Duration::from_millis(50);

/// Stops [`ProgressDisplay::start_background`]'s task when dropped, and writes out what it
/// had not yet written.
pub struct BackgroundGuard {
    task: tokio::task::JoinHandle<()>,
    display: std::sync::Weak<ProgressDisplay>,
}

impl Drop for BackgroundGuard {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(display) = self.display.upgrade() {
            // No task flushes any more: a line from now on goes out at once.
            display
                .unbuffered
                .store(true, std::sync::atomic::Ordering::Relaxed);
            display.flush();
        }
    }
}

/// Where the display writes, buffered.
struct Output {
    writer: std::io::BufWriter<Box<dyn Write + Send>>,
    /// When the buffer was last written out; `None` before the first line.
    flushed: Option<Instant>,
}

impl Output {
    fn flush(&mut self) {
        let _ = self.writer.flush();
        self.flushed = Some(Instant::now());
    }
}

/// The progress display; also a transcript sink (to learn each loop's current tool).
pub struct ProgressDisplay {
    mode: ProgressMode,
    rows: Mutex<BTreeMap<String, Row>>,
    drawn: Mutex<usize>,
    inner: Arc<dyn TranscriptSink>,
    out: Mutex<Output>,
    /// When growth of a streamed reply last redrew the table.
    growth_drawn: Mutex<Option<Instant>>,
    /// Set once the background task is gone: every line is written out at once.
    unbuffered: std::sync::atomic::AtomicBool,
}

impl ProgressDisplay {
    /// A display on stdout for `loops` (name, max iterations) that forwards transcripts to
    /// `inner`.
    pub fn new(
        mode: ProgressMode,
        loops: &[(String, u32)],
        inner: Arc<dyn TranscriptSink>,
    ) -> Self {
        Self::with_writer(mode, loops, inner, Box::new(std::io::stdout()))
    }

    /// The same, writing to `out`.
    pub fn with_writer(
        mode: ProgressMode,
        loops: &[(String, u32)],
        inner: Arc<dyn TranscriptSink>,
        out: Box<dyn Write + Send>,
    ) -> Self {
        let rows = loops
            .iter()
            .map(|(n, max)| {
                (
                    n.clone(),
                    Row {
                        status: "pending".into(),
                        max_iterations: *max,
                        ..Row::default()
                    },
                )
            })
            .collect();
        Self {
            mode,
            rows: Mutex::new(rows),
            drawn: Mutex::new(0),
            inner,
            out: Mutex::new(Output {
                writer: std::io::BufWriter::new(out),
                flushed: None,
            }),
            growth_drawn: Mutex::new(None),
            unbuffered: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Sets a loop's status from outside the event stream (blocked, merge results...).
    pub fn set_status(&self, name: &str, status: &str, note: &str) {
        {
            let mut rows = lock(&self.rows);
            let row = rows.entry(name.to_string()).or_default();
            row.status = status.to_string();
            if !note.is_empty() {
                row.last = note.to_string();
            }
            if row.ended.is_none() {
                row.ended = Some(Instant::now());
            }
        }
        if self.mode == ProgressMode::Plain {
            self.print_line(&format!("{name}: {status}{}", sep(note)));
        }
        self.redraw();
    }

    /// Starts the display's background task: it writes out buffered lines (every
    /// [`LINE_FLUSH`]) and, in live mode, redraws the table once a second while a loop runs,
    /// so that elapsed times and heavy-lane waits count up between events (which may be
    /// minutes apart during a long build). The task ends when the guard drops, which writes
    /// out what is left.
    pub fn start_background(self: &Arc<Self>) -> BackgroundGuard {
        let display = Arc::downgrade(self);
        let task = tokio::spawn({
            let display = display.clone();
            async move {
                let mut every = tokio::time::interval(LINE_FLUSH);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every.tick().await;
                // Ticks since the last redraw (counted, not timed: the test's clock is tokio's).
                let mut ticks: u32 = 0;
                let ticks_per_redraw = TICK.as_millis() / LINE_FLUSH.as_millis();
                loop {
                    every.tick().await;
                    let Some(display) = display.upgrade() else {
                        return;
                    };
                    display.flush();
                    ticks = ticks.saturating_add(1);
                    if display.mode == ProgressMode::Live && u128::from(ticks) >= ticks_per_redraw {
                        ticks = 0;
                        let running = lock(&display.rows).values().any(|r| r.status == "running");
                        if running {
                            display.redraw();
                        }
                    }
                }
            }
        });
        BackgroundGuard { task, display }
    }

    /// Writes out the lines not yet written.
    pub fn flush(&self) {
        let mut out = lock(&self.out);
        if !out.writer.buffer().is_empty() {
            out.flush();
        }
    }

    /// Takes one run event.
    pub fn on_event(&self, event: &Event) {
        if self.mode == ProgressMode::Json {
            if let Ok(line) = serde_json::to_string(event) {
                self.write_line(&td_base::secrets::redact_json(&line));
            }
            return;
        }
        let mut plain: Option<String> = None;
        {
            let mut rows = lock(&self.rows);
            let rows = &mut *rows;
            fn row<'a>(rows: &'a mut BTreeMap<String, Row>, name: &str) -> &'a mut Row {
                rows.entry(name.to_string()).or_default()
            }
            match &event.kind {
                EventKind::WorktreeSeeded { loop_name, seed } => {
                    let text = crate::run::warm::describe(seed);
                    row(rows, loop_name).last = text.clone();
                    plain = Some(format!("{loop_name}: {text}"));
                }
                EventKind::LoopStarted { loop_name, .. } => {
                    let r = row(rows, loop_name);
                    r.status = "running".into();
                    r.started = Some(Instant::now());
                    // A loop that waited for a host was shown pending with a time of its own.
                    r.ended = None;
                    plain = Some(format!("{loop_name}: started"));
                }
                EventKind::IterationStarted {
                    loop_name,
                    iteration,
                } => row(rows, loop_name).iteration = *iteration,
                EventKind::IterationEnded {
                    loop_name,
                    iteration,
                    ended_by,
                    validation_exit,
                    validation_passed,
                    spend,
                    ..
                } => {
                    let v = match (validation_passed, validation_exit) {
                        (Some(true), _) => "validation passed".to_string(),
                        (Some(false), Some(code)) => format!("validation failed (exit {code})"),
                        (Some(false), None) => "not complete".to_string(),
                        (None, _) => String::new(),
                    };
                    row(rows, loop_name).last = format!("iteration {iteration}: {ended_by} {v}");
                    let spent = match spend {
                        Some(s) if s.model_calls > 0 => format!(
                            " ({} model call(s), {} tokens, {})",
                            s.model_calls,
                            s.tokens(),
                            s.cost_text()
                        ),
                        _ => String::new(),
                    };
                    plain = Some(format!(
                        "{loop_name}: iteration {iteration} ended by {ended_by}{}{spent}",
                        sep(&v)
                    ));
                }
                EventKind::LoopCompleted {
                    loop_name, summary, ..
                } => {
                    let r = row(rows, loop_name);
                    r.status = "completed".into();
                    r.ended = Some(Instant::now());
                    r.tool.clear();
                    plain = Some(format!(
                        "{loop_name}: completed{}",
                        sep(summary.as_deref().unwrap_or(""))
                    ));
                }
                EventKind::LoopFailed { loop_name, reason } => {
                    let r = row(rows, loop_name);
                    r.status = "failed".into();
                    r.ended = Some(Instant::now());
                    r.last = reason.lines().next().unwrap_or("").to_string();
                    plain = Some(format!("{loop_name}: failed: {reason}"));
                }
                EventKind::LoopPaused { loop_name, reason } => {
                    let r = row(rows, loop_name);
                    r.status = "paused".into();
                    r.ended = Some(Instant::now());
                    r.tool.clear();
                    r.last = reason.clone();
                    plain = Some(format!("{loop_name}: paused: {reason}"));
                }
                EventKind::LoopRestarted {
                    loop_name,
                    restarts,
                    reason,
                } => {
                    let first = reason.lines().next().unwrap_or("");
                    row(rows, loop_name).last = format!("restarted after a panic: {first}");
                    plain = Some(format!(
                        "{loop_name}: restarted after a panic (restart {restarts}): {reason}"
                    ));
                }
                EventKind::LoopStopped { loop_name } => {
                    let r = row(rows, loop_name);
                    r.status = "stopped".into();
                    r.ended = Some(Instant::now());
                    plain = Some(format!("{loop_name}: stopped"));
                }
                EventKind::StopRequested { loop_name, by } => {
                    plain = Some(match loop_name {
                        Some(name) => {
                            row(rows, name).last = format!("stop asked by the {by}");
                            format!("{name}: stop asked by the {by}")
                        }
                        None => format!("run: stop asked by the {by}"),
                    });
                }
                EventKind::QueryAsked {
                    from, to, question, ..
                } => {
                    row(rows, from).last = format!("asked {to}: {}", short(question));
                    plain = Some(format!("{from} -> {to}: query: {}", short(question)));
                }
                EventKind::QueryAnswered {
                    from, to, reply, ..
                } => {
                    row(rows, from).last = format!("{to} answered: {}", short(reply));
                    plain = Some(format!("{to} -> {from}: answer: {}", short(reply)));
                }
                EventKind::QueryFailed {
                    from, to, error, ..
                } => {
                    row(rows, from).last = format!("query to {to} failed");
                    plain = Some(format!("{from} -> {to}: query failed: {}", short(error)));
                }
                EventKind::Shared {
                    from,
                    to,
                    data_type,
                    error,
                    ..
                } => {
                    row(rows, from).last = format!("shared {data_type} with {to}");
                    plain = Some(match error {
                        None => format!("{from} -> {to}: shared {data_type}"),
                        Some(e) => format!("{from} -> {to}: share refused: {}", short(e)),
                    });
                }
                EventKind::Alert {
                    from,
                    event_type,
                    message,
                    recipients,
                    ..
                } => {
                    if from != "taskdaemon" {
                        row(rows, from).last = format!("alert {event_type}");
                    }
                    plain = Some(format!(
                        "{from}: alert {event_type} to {} loop(s): {}",
                        recipients.len(),
                        short(message)
                    ));
                }
                EventKind::ConflictPredicted { loops, files } => {
                    let files = short(&files.join(", "));
                    for (me, other) in [(0, 1), (1, 0)] {
                        if let (Some(me), Some(other)) = (loops.get(me), loops.get(other)) {
                            row(rows, me).last = format!("will conflict with {other}: {files}");
                        }
                    }
                    plain = Some(format!(
                        "{}: predicted merge conflict in {files} (both told)",
                        loops.join(" and ")
                    ));
                }
                EventKind::FileChanged { loop_name, path } => {
                    row(rows, loop_name).last = format!("{path} changed on disk");
                }
                EventKind::HeavyQueued { loop_name, tool } => {
                    row(rows, loop_name).heavy_wait = Some((Instant::now(), tool.clone()));
                }
                EventKind::HeavyStarted {
                    loop_name,
                    tool,
                    waited_ms,
                } => {
                    row(rows, loop_name).heavy_wait = None;
                    plain = Some(format!(
                        "{loop_name}: {tool} waited {} for the heavy lane",
                        human_ms(*waited_ms)
                    ));
                }
                EventKind::HeavyEnded { loop_name, .. } => {
                    row(rows, loop_name).heavy_wait = None;
                }
                EventKind::ModelRetried {
                    loop_name,
                    attempt,
                    wait_ms,
                    status,
                    cause,
                } => {
                    let failed = match status {
                        Some(status) => short(&format!("HTTP {status}: {cause}")),
                        None => short(cause),
                    };
                    let wait = format!("{:.1} s", Duration::from_millis(*wait_ms).as_secs_f64());
                    let r = row(rows, loop_name);
                    // Back to `running` once the call answers (see `record`).
                    if r.status == "running" {
                        r.status = RETRYING.into();
                    }
                    // The wait first: the row's note is cut to its width.
                    r.last = format!("retry in {wait} after {failed}");
                    plain = Some(format!(
                        "{loop_name}: retrying the model call (attempt {attempt} failed: {failed}) in {wait}"
                    ));
                }
                _ => {}
            }
        }
        if self.mode == ProgressMode::Plain {
            if let Some(line) = plain {
                self.print_line(&line);
            }
        } else {
            self.redraw();
        }
    }

    fn print_line(&self, line: &str) {
        self.write_line(&td_base::secrets::redact(line));
    }

    /// Writes a line that is already redacted: at once after a quiet spell, else with the
    /// next flush (see [`LINE_FLUSH`]).
    fn write_line(&self, line: &str) {
        let mut out = lock(&self.out);
        let _ = writeln!(out.writer, "{line}");
        if self.unbuffered.load(std::sync::atomic::Ordering::Relaxed)
            || out.flushed.is_none_or(|at| at.elapsed() >= LINE_FLUSH)
        {
            out.flush();
        }
    }

    /// Redraws the live table in place.
    fn redraw(&self) {
        if self.mode != ProgressMode::Live {
            return;
        }
        let rows = lock(&self.rows);
        let mut drawn = lock(&self.drawn);
        let mut text = String::new();
        if *drawn > 0 {
            text.push_str(&format!("\x1b[{}A", *drawn));
        }
        let width = rows.keys().map(|k| k.len()).max().unwrap_or(4).max(4);
        for (name, r) in rows.iter() {
            let elapsed = match (r.started, r.ended) {
                (Some(s), Some(e)) => e.duration_since(s).as_secs(),
                (Some(s), None) => s.elapsed().as_secs(),
                _ => 0,
            };
            let tool = match (&r.heavy_wait, r.streaming) {
                (Some((since, tool)), _) if r.status == "running" => format!(
                    " [{tool}: waiting for the heavy lane {}s]",
                    since.elapsed().as_secs()
                ),
                (_, Some(chars)) if r.status == "running" => format!(" [reply: {chars} chars]"),
                _ if r.status == "running" && !r.tool.is_empty() => format!(" [{}]", r.tool),
                _ => String::new(),
            };
            let cost = if r.charged.model_calls > 0 {
                format!(" {}", r.charged.cost_text())
            } else {
                String::new()
            };
            text.push_str(&format!(
                "\x1b[2K{name:<width$}  {:<9} {:>2}/{:<2} {:>4}s{cost}{tool}  {}\n",
                r.status,
                r.iteration,
                r.max_iterations,
                elapsed,
                short(&r.last),
            ));
        }
        *drawn = rows.len();
        let text = td_base::secrets::redact(&text);
        let mut out = lock(&self.out);
        let _ = out.writer.write_all(text.as_bytes());
        out.flush();
    }
}

impl ProgressDisplay {
    /// What a transcript entry changes in the live table (its tool, its retry state, what it
    /// charged), before the entry is recorded.
    fn show(&self, loop_name: &str, entry: &TranscriptEntry) {
        if let Some(row) = lock(&self.rows).get_mut(loop_name) {
            // A reply streams in only between a request and its response (or error).
            row.streaming = None;
            // A model call that answered, or failed for good, is no longer being retried.
            if matches!(
                entry,
                TranscriptEntry::Response { .. } | TranscriptEntry::ModelError { .. }
            ) && row.status == RETRYING
            {
                row.status = "running".into();
            }
        }
        if let TranscriptEntry::Response {
            iteration,
            response,
            ..
        } = entry
            && *iteration > 0
        {
            let tool = response
                .tool_calls
                .last()
                .map(|c| c.name.clone())
                .unwrap_or_default();
            {
                let mut rows = lock(&self.rows);
                let row = rows.entry(loop_name.to_string()).or_default();
                row.tool = tool;
                row.streaming = None;
            }
            self.redraw();
        }
        if let TranscriptEntry::Spent {
            charged_to, spend, ..
        } = entry
        {
            let payer = charged_to.as_deref().unwrap_or(loop_name);
            lock(&self.rows)
                .entry(payer.to_string())
                .or_default()
                .charged
                .add(spend);
            self.redraw();
        }
    }
}

impl TranscriptSink for ProgressDisplay {
    fn record(&self, loop_name: &str, entry: TranscriptEntry) {
        self.show(loop_name, &entry);
        self.inner.record(loop_name, entry);
    }

    fn record_all(&self, loop_name: &str, entries: Vec<TranscriptEntry>) {
        for entry in &entries {
            self.show(loop_name, entry);
        }
        self.inner.record_all(loop_name, entries);
    }

    /// Shows the reply growing in the live table (redrawn at most every
    /// [`GROWTH_REDRAW`]); plain and JSON modes show nothing of it, and it is never an event.
    fn output_growing(&self, loop_name: &str, chars: u64) {
        if self.mode != ProgressMode::Live {
            return;
        }
        if let Some(row) = lock(&self.rows).get_mut(loop_name) {
            row.streaming = Some(chars);
        }
        let due = {
            let mut drawn = lock(&self.growth_drawn);
            let due = drawn.is_none_or(|at| at.elapsed() >= GROWTH_REDRAW);
            if due {
                *drawn = Some(Instant::now());
            }
            due
        };
        if due {
            self.redraw();
        }
    }

    fn unwritable(&self) -> Option<String> {
        self.inner.unwritable()
    }

    fn write_failed(&self, what: String) {
        self.inner.write_failed(what);
    }
}

/// The status of a running loop whose model call failed and is about to be tried again.
const RETRYING: &str = "retrying";

fn sep(note: &str) -> String {
    if note.is_empty() {
        String::new()
    } else {
        format!(": {note}")
    }
}

/// `850 ms`, `12.3 s`.
fn human_ms(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", Duration::from_millis(ms).as_secs_f64())
    }
}

/// The first line of `text`, redacted, cut to 60 bytes.
fn short(text: &str) -> String {
    let text = td_base::secrets::redact(text);
    let line = text.lines().next().unwrap_or("");
    match td_base::text::truncate_to(line, 60) {
        Some(cut) => format!("{cut}…"),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use td_engine::transcript::NoTranscript;
    use td_llm::{LlmResponse, StopReason, ToolCall, Usage};

    /// What the display wrote, and in how many `write` calls.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>, Arc<std::sync::atomic::AtomicUsize>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(b);
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8_lossy(&lock(&self.0)).into_owned()
        }
        fn writes(&self) -> usize {
            self.1.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            time: "t".into(),
            kind,
        }
    }

    fn show(mode: ProgressMode) -> (ProgressDisplay, Buf) {
        let buf = Buf::default();
        let p = ProgressDisplay::with_writer(
            mode,
            &[("api".into(), 3), ("client".into(), 5)],
            Arc::new(NoTranscript),
            Box::new(buf.clone()),
        );
        p.on_event(&event(
            1,
            EventKind::LoopStarted {
                loop_name: "api".into(),
                loop_type: "code".into(),
                host: None,
            },
        ));
        p.on_event(&event(
            2,
            EventKind::IterationStarted {
                loop_name: "api".into(),
                iteration: 2,
            },
        ));
        p.record("api", response(1, Some("grep")));
        p.on_event(&event(
            3,
            EventKind::QueryAsked {
                id: 1,
                from: "api".into(),
                to: "client".into(),
                question: "Which port?".into(),
            },
        ));
        p.set_status("client", "blocked", "its dependency `x` did not complete");
        (p, buf)
    }

    /// The model's reply at `turn` of iteration 2: a call of `tool`, or the text "done".
    fn response(turn: u32, tool: Option<&str>) -> TranscriptEntry {
        let tool_calls: Vec<ToolCall> = tool
            .map(|name| ToolCall {
                id: turn.to_string(),
                name: name.into(),
                input: serde_json::json!({}).into(),
            })
            .into_iter()
            .collect();
        TranscriptEntry::Response {
            iteration: 2,
            turn,
            response: LlmResponse {
                text: tool.is_none().then(|| "done".into()),
                stop_reason: if tool_calls.is_empty() {
                    StopReason::EndTurn
                } else {
                    StopReason::ToolUse
                },
                tool_calls,
                usage: Usage::default(),
            },
        }
    }

    #[test]
    fn live_mode_redraws_one_line_per_loop_in_place() {
        let (_p, buf) = show(ProgressMode::Live);
        let text = buf.text();
        assert!(
            text.contains("\x1b[2A"),
            "moves the cursor back over its 2 lines: {text:?}"
        );
        let last_frame = text.rsplit("\x1b[2A").next().unwrap();
        let lines: Vec<&str> = last_frame.lines().collect();
        assert_eq!(lines.len(), 2, "{last_frame:?}");
        assert!(
            lines[0].contains("api") && lines[0].contains("running") && lines[0].contains(" 2/3")
        );
        assert!(
            lines[0].contains("[grep]") && lines[0].contains("asked client: Which port?"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("client")
                && lines[1].contains("blocked")
                && lines[1].contains("did not complete")
        );
    }

    #[test]
    fn a_call_waiting_for_the_heavy_lane_is_shown_until_it_gets_a_worker() {
        let (p, buf) = show(ProgressMode::Live);
        let last_line = |buf: &Buf| {
            let text = buf.text();
            let frame = text.rsplit("\x1b[2A").next().unwrap().to_string();
            frame.lines().next().unwrap().to_string()
        };
        let queued = EventKind::HeavyQueued {
            loop_name: "api".into(),
            tool: "build".into(),
        };
        p.on_event(&event(4, queued.clone()));
        let line = last_line(&buf);
        assert!(
            line.contains("[build: waiting for the heavy lane 0s]") && !line.contains("[grep]"),
            "{line}"
        );
        p.on_event(&event(
            5,
            EventKind::HeavyStarted {
                loop_name: "api".into(),
                tool: "build".into(),
                waited_ms: 12_300,
            },
        ));
        let line = last_line(&buf);
        assert!(!line.contains("waiting"), "{line}");
        p.on_event(&event(6, queued));
        p.on_event(&event(
            7,
            EventKind::HeavyEnded {
                loop_name: "api".into(),
                tool: "build".into(),
                waited_ms: 40,
                ran_ms: 0,
                cancelled: true,
            },
        ));
        assert!(!last_line(&buf).contains("waiting"));

        let (p, buf) = show(ProgressMode::Plain);
        p.on_event(&event(
            4,
            EventKind::HeavyStarted {
                loop_name: "api".into(),
                tool: "test".into(),
                waited_ms: 12_300,
            },
        ));
        p.flush();
        assert!(
            buf.text()
                .contains("api: test waited 12.3 s for the heavy lane\n"),
            "{}",
            buf.text()
        );
    }

    #[test]
    fn a_streamed_reply_is_shown_growing_throttled_and_never_as_a_line() {
        let (p, buf) = show(ProgressMode::Live);
        let frames = |buf: &Buf| buf.text().matches("\x1b[2A").count();
        let before = frames(&buf);
        p.output_growing("api", 120);
        let text = buf.text();
        let last = text.rsplit("\x1b[2A").next().unwrap();
        assert!(last.contains("[reply: 120 chars]"), "{last:?}");
        // More growth within the throttle window updates the row without redrawing.
        p.output_growing("api", 480);
        assert_eq!(frames(&buf), before + 1);
        std::thread::sleep(GROWTH_REDRAW);
        p.output_growing("api", 900);
        assert_eq!(frames(&buf), before + 2);
        assert!(buf.text().contains("[reply: 900 chars]"));
        // The response replaces it with its last tool.
        p.record("api", response(2, Some("read_file")));
        let text = buf.text();
        let last = text.rsplit("\x1b[2A").next().unwrap();
        assert!(
            last.contains("[read_file]") && !last.contains("reply:"),
            "{last:?}"
        );

        for mode in [ProgressMode::Plain, ProgressMode::Json] {
            let (p, buf) = show(mode);
            let before = buf.text();
            p.output_growing("api", 50);
            assert_eq!(buf.text(), before, "{mode:?}");
        }
    }

    #[test]
    fn plain_mode_prints_log_lines() {
        let (p, buf) = show(ProgressMode::Plain);
        p.flush();
        let text = buf.text();
        assert!(!text.contains('\x1b'));
        assert!(text.contains("api: started\n"));
        assert!(text.contains("api -> client: query: Which port?\n"));
        assert!(text.contains("client: blocked: its dependency `x` did not complete\n"));
    }

    #[test]
    fn secrets_are_redacted_in_every_mode_also_where_text_is_cut() {
        td_base::secrets::register("TEST_PROGRESS_KEY", "sk-progress-test-p5p5p5");
        for mode in [ProgressMode::Live, ProgressMode::Plain, ProgressMode::Json] {
            let (p, buf) = show(mode);
            // The key straddles the 60-byte cut of a row's note.
            let question = format!("{}sk-progress-test-p5p5p5 and more", "q".repeat(50));
            p.on_event(&event(
                4,
                EventKind::QueryAsked {
                    id: 2,
                    from: "api".into(),
                    to: "client".into(),
                    question: question.into(),
                },
            ));
            p.on_event(&event(
                5,
                EventKind::LoopFailed {
                    loop_name: "api".into(),
                    reason: "model API error 401: bad key sk-progress-test-p5p5p5".into(),
                },
            ));
            p.flush();
            let text = buf.text();
            assert!(!text.contains("sk-progress"), "{mode:?}: {text}");
            assert!(!text.contains("sk-prog"), "{mode:?}: {text}");
            assert!(
                text.contains("[REDACTED:TEST_PROGRESS_KEY]"),
                "{mode:?}: {text}"
            );
        }
    }

    fn retried(seq: u64, status: Option<u16>) -> Event {
        event(
            seq,
            EventKind::ModelRetried {
                loop_name: "api".into(),
                attempt: 2,
                wait_ms: 1500,
                status,
                cause: "overloaded_error: Overloaded".into(),
            },
        )
    }

    #[test]
    fn a_retrying_model_call_shows_until_the_call_answers() {
        let (p, buf) = show(ProgressMode::Live);
        p.on_event(&retried(4, Some(529)));
        let frame = |text: String| text.rsplit("\x1b[2A").next().unwrap().to_string();
        let api = frame(buf.text()).lines().next().unwrap().to_string();
        assert!(api.contains("retrying"), "{api}");
        assert!(
            api.contains("retry in 1.5 s after HTTP 529: overloaded_error: Overl"),
            "{api}"
        );
        p.record("api", response(2, None));
        let api = frame(buf.text()).lines().next().unwrap().to_string();
        assert!(
            api.contains("running") && !api.contains("retrying"),
            "{api}"
        );
        // A loop that is not running (stopped meanwhile) keeps its status.
        p.set_status("api", "stopped", "");
        p.on_event(&retried(5, None));
        let api = frame(buf.text()).lines().next().unwrap().to_string();
        assert!(api.contains("stopped"), "{api}");
    }

    #[test]
    fn plain_mode_says_why_a_model_call_is_retried() {
        let (p, buf) = show(ProgressMode::Plain);
        p.on_event(&retried(4, Some(529)));
        p.on_event(&retried(5, None));
        p.flush();
        let text = buf.text();
        assert!(
            text.contains(
                "api: retrying the model call (attempt 2 failed: HTTP 529: overloaded_error: Overloaded) in 1.5 s\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "api: retrying the model call (attempt 2 failed: overloaded_error: Overloaded) in 1.5 s\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn json_mode_streams_events() {
        let (p, buf) = show(ProgressMode::Json);
        p.flush();
        let events: Vec<serde_json::Value> = buf
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2]["event"], "query_asked");
    }

    #[tokio::test(start_paused = true)]
    async fn the_live_table_counts_up_between_events_while_a_loop_runs() {
        let (p, buf) = show(ProgressMode::Live);
        let p = Arc::new(p);
        let frames = |buf: &Buf| buf.text().matches("\x1b[2A").count();
        let guard = p.start_background();
        let before = frames(&buf);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let ticked = frames(&buf);
        assert!(ticked >= before + 3, "{before} -> {ticked}");
        // Nothing runs: no redraw.
        p.set_status("api", "completed", "");
        let after_end = frames(&buf);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(frames(&buf), after_end);
        // Dropping the guard ends the task.
        drop(guard);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        p.set_status("api", "running", "");
        let restarted = frames(&buf);
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(frames(&buf), restarted);
    }

    fn line(seq: u64, n: u64) -> Event {
        event(
            seq,
            EventKind::IterationStarted {
                loop_name: format!("loop-{n}"),
                iteration: 1,
            },
        )
    }

    fn failed(seq: u64, name: &str) -> Event {
        event(
            seq,
            EventKind::LoopFailed {
                loop_name: name.into(),
                reason: "why".into(),
            },
        )
    }

    #[test]
    fn a_burst_of_lines_goes_out_in_one_write_and_a_line_after_a_quiet_spell_at_once() {
        for mode in [ProgressMode::Plain, ProgressMode::Json] {
            let buf = Buf::default();
            let p = ProgressDisplay::with_writer(
                mode,
                &[],
                Arc::new(NoTranscript),
                Box::new(buf.clone()),
            );
            p.on_event(&failed(1, "first"));
            assert!(
                buf.text().contains("first"),
                "{mode:?}: the first line at once"
            );
            assert_eq!(buf.writes(), 1);
            for n in 0..200 {
                p.on_event(&failed(2 + n, &format!("burst-{n}")));
            }
            // One write for the burst; a slow machine may cut it once or twice.
            assert!(buf.writes() <= 3, "{mode:?}: {} writes", buf.writes());
            p.flush();
            let text = buf.text();
            assert!(
                (0..200).all(|n| text.contains(&format!("burst-{n}\""))
                    || text.contains(&format!("burst-{n}: failed"))),
                "{mode:?}: {text}"
            );
            std::thread::sleep(LINE_FLUSH + Duration::from_millis(10));
            p.on_event(&failed(300, "after-a-pause"));
            assert!(buf.text().contains("after-a-pause"), "{mode:?}");
            // Events that print nothing write nothing.
            let writes = buf.writes();
            p.on_event(&line(301, 1));
            p.flush();
            assert_eq!(
                buf.writes(),
                writes + usize::from(mode == ProgressMode::Json)
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn held_lines_go_out_with_the_next_tick_and_when_the_run_ends() {
        let buf = Buf::default();
        let p = Arc::new(ProgressDisplay::with_writer(
            ProgressMode::Plain,
            &[],
            Arc::new(NoTranscript),
            Box::new(buf.clone()),
        ));
        let guard = p.start_background();
        p.on_event(&failed(1, "one"));
        p.on_event(&failed(2, "two"));
        assert!(!buf.text().contains("two"), "held: {}", buf.text());
        tokio::time::sleep(LINE_FLUSH * 2).await;
        assert!(buf.text().contains("two: failed"), "{}", buf.text());
        p.on_event(&failed(3, "three"));
        assert!(!buf.text().contains("three"), "held: {}", buf.text());
        drop(guard);
        assert!(buf.text().contains("three: failed"), "{}", buf.text());
        // With no task to flush them, later lines go out at once.
        p.on_event(&failed(4, "four"));
        p.on_event(&failed(5, "five"));
        assert!(buf.text().contains("five: failed"), "{}", buf.text());
    }
}
