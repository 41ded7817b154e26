//! Live progress of a run: one line per loop (status, iteration/max, elapsed, what is charged
//! to it so far, current tool, last coordination message), redrawn in place on a terminal; plain log lines otherwise;
//! JSON event lines with `--json`.
//!
//! Everything written is redacted ([`td_base::secrets`]) as it is written, and text cut short
//! for a row is redacted before the cut, so that no piece of a secret is shown.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// What is charged to the loop so far (its calls, and answers to its questions).
    charged: Spend,
}

/// The progress display; also a transcript sink (to learn each loop's current tool).
pub struct ProgressDisplay {
    mode: ProgressMode,
    rows: Mutex<BTreeMap<String, Row>>,
    drawn: Mutex<usize>,
    inner: Arc<dyn TranscriptSink>,
    out: Mutex<Box<dyn Write + Send>>,
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
            out: Mutex::new(out),
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
                EventKind::LoopStarted { loop_name, .. } => {
                    let r = row(rows, loop_name);
                    r.status = "running".into();
                    r.started = Some(Instant::now());
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
                EventKind::LoopStopped { loop_name } => {
                    let r = row(rows, loop_name);
                    r.status = "stopped".into();
                    r.ended = Some(Instant::now());
                    plain = Some(format!("{loop_name}: stopped"));
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
                EventKind::FileChanged { loop_name, path } => {
                    row(rows, loop_name).last = format!("{path} changed on disk");
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

    /// Writes a line that is already redacted.
    fn write_line(&self, line: &str) {
        let mut out = lock(&self.out);
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
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
            let tool = if r.status == "running" && !r.tool.is_empty() {
                format!(" [{}]", r.tool)
            } else {
                String::new()
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
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

impl TranscriptSink for ProgressDisplay {
    fn record(&self, loop_name: &str, entry: TranscriptEntry) {
        if let TranscriptEntry::Response {
            iteration,
            response,
            ..
        } = &entry
            && *iteration > 0
        {
            let tool = response
                .tool_calls
                .last()
                .map(|c| c.name.clone())
                .unwrap_or_default();
            lock(&self.rows)
                .entry(loop_name.to_string())
                .or_default()
                .tool = tool;
            self.redraw();
        }
        if let TranscriptEntry::Spent {
            charged_to, spend, ..
        } = &entry
        {
            let payer = charged_to.as_deref().unwrap_or(loop_name);
            lock(&self.rows)
                .entry(payer.to_string())
                .or_default()
                .charged
                .add(spend);
            self.redraw();
        }
        self.inner.record(loop_name, entry);
    }

    fn unwritable(&self) -> Option<String> {
        self.inner.unwritable()
    }

    fn write_failed(&self, what: String) {
        self.inner.write_failed(what);
    }
}

fn sep(note: &str) -> String {
    if note.is_empty() {
        String::new()
    } else {
        format!(": {note}")
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

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            lock(&self.0).extend_from_slice(b);
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
            },
        ));
        p.on_event(&event(
            2,
            EventKind::IterationStarted {
                loop_name: "api".into(),
                iteration: 2,
            },
        ));
        p.record(
            "api",
            TranscriptEntry::Response {
                iteration: 2,
                turn: 1,
                response: LlmResponse {
                    text: None,
                    tool_calls: vec![ToolCall {
                        id: "1".into(),
                        name: "grep".into(),
                        input: serde_json::json!({}),
                    }],
                    stop_reason: StopReason::ToolUse,
                    usage: Usage::default(),
                },
            },
        );
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
    fn plain_mode_prints_log_lines() {
        let (_p, buf) = show(ProgressMode::Plain);
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
                    question,
                },
            ));
            p.on_event(&event(
                5,
                EventKind::LoopFailed {
                    loop_name: "api".into(),
                    reason: "model API error 401: bad key sk-progress-test-p5p5p5".into(),
                },
            ));
            let text = buf.text();
            assert!(!text.contains("sk-progress"), "{mode:?}: {text}");
            assert!(!text.contains("sk-prog"), "{mode:?}: {text}");
            assert!(
                text.contains("[REDACTED:TEST_PROGRESS_KEY]"),
                "{mode:?}: {text}"
            );
        }
    }

    #[test]
    fn json_mode_streams_events() {
        let (_p, buf) = show(ProgressMode::Json);
        let events: Vec<serde_json::Value> = buf
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2]["event"], "query_asked");
    }
}
