//! The dashboard's one follower of a run record, shared by every browser: it reads
//! `events.jsonl` as lines are appended and, while a browser is connected, the running
//! loops' `transcript.jsonl` and `receipts.jsonl`, and fans what it read out to every open
//! stream (a tokio broadcast).
//!
//! It polls: one `fstat` of the held event log every [`DEFAULT_POLL`] (or what
//! `TASKDAEMON_UI_POLL_MS` says), and of each running loop's held files every
//! [`TOOL_POLL`]. inotify was tried first: it reported every write of 1,000 loops (and of
//! the summary beside the event log), each report a wake-up of a watcher thread and of this
//! one, which cost more CPU than the polls (`benches/ui.rs`), and it does not see another
//! machine's writes on a network file system, where a poll does.
//!
//! A stream that joins gets the byte offset up to which events were published and a
//! receiver for what comes after, under one lock, so that it reads the earlier lines from
//! the file itself and misses or repeats none; a stream that falls behind the broadcast
//! joins again from where it was. A finished run and a live one are the same code: the
//! follower ends (and says `End`) once no process owns the run and everything was read.
//!
//! From the transcripts and receipt logs it keeps each loop's current tool: the calls of
//! the loop's last model response (in its transcript) whose receipt has not been written
//! yet (the first of them is the one named; the transcript gets a response's results only
//! once all its calls ended, the receipt log each call as it ends); its answers to other
//! loops (iteration 0) are not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::broadcast;

use super::lines::{Line, read_line};
use crate::run::record::{EVENTS_FILE, LOOPS_DIR, RECEIPTS_FILE, TRANSCRIPT_FILE};
use td_base::sync::lock;

/// Longest line of the record the dashboard reads; a longer one is skipped.
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// How much of a transcript's end is read when the follower starts, for the current tool.
const TRANSCRIPT_TAIL: u64 = 256 * 1024;
/// How often the follower checks whether the run is still owned.
const TICK: Duration = Duration::from_millis(500);
/// How often the event log is looked at unless told otherwise: an event reaches the page
/// this much later at most (the page's target is 200 ms).
pub const DEFAULT_POLL: Duration = Duration::from_millis(20);
/// How often the running loops' transcripts are looked at while a browser is connected
/// (their current tool is at most this late).
const TOOL_POLL: Duration = Duration::from_millis(100);
/// Items a stream may fall behind before it reads from the file again.
const BACKLOG: usize = 4096;

/// One thing the follower publishes.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// A line of `events.jsonl`: where it starts and ends in the file (after its newline),
    /// its number, and its JSON (the line as written, or re-serialized when it held a
    /// carriage return, which server-sent events would take for a line break).
    Event {
        /// Offset of its first byte.
        start: u64,
        /// Offset after its newline.
        end: u64,
        /// Its `seq`.
        seq: u64,
        /// Its JSON, one line.
        data: Arc<str>,
    },
    /// A loop's current tool changed.
    Tool {
        /// The loop.
        loop_name: String,
        /// The tool it waits on, if any.
        tool: Option<String>,
        /// When this was seen (RFC 3339).
        time: String,
        /// The three as the JSON every stream sends (made once, redacted).
        data: Arc<str>,
    },
    /// The run is not live and every line was published.
    End,
}

/// What a stream joining the feed starts from.
pub struct Join {
    /// Everything published after `events_end`.
    pub rx: broadcast::Receiver<Arc<Item>>,
    /// Events up to this offset of `events.jsonl` were published: the stream reads them
    /// from the file.
    pub events_end: u64,
    /// The loops' current tools (those with one), as `Item::Tool`s.
    pub tools: Vec<Item>,
    /// Whether the follower ended (nothing more will come).
    pub ended: bool,
}

#[derive(Default)]
struct State {
    events_end: u64,
    ended: bool,
    /// Each loop's last published tool item (an [`Item::Tool`]).
    tools: BTreeMap<String, Arc<Item>>,
    loops: BTreeSet<String>,
}

struct Shared {
    run_dir: PathBuf,
    state: Mutex<State>,
    tx: broadcast::Sender<Arc<Item>>,
    stop: AtomicBool,
}

/// The follower of one run directory; cloned into every handler. The follower thread ends
/// when the run is over or the last clone is dropped.
#[derive(Clone)]
pub struct Feed {
    shared: Arc<Shared>,
    _guard: Arc<StopOnDrop>,
}

struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

impl Feed {
    /// Reads what the record holds now (so that loop names are known before the first
    /// request), then follows it on a thread of its own.
    pub fn start(run_dir: &Path, poll: Duration) -> Feed {
        let (tx, _) = broadcast::channel(BACKLOG);
        let shared = Arc::new(Shared {
            run_dir: run_dir.to_path_buf(),
            state: Mutex::new(State::default()),
            tx,
            stop: AtomicBool::new(false),
        });
        let mut follower = Follower::new(shared.clone());
        follower.read_all();
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ui-feed".into())
            .spawn(move || follower.run(poll));
        if let Err(e) = spawned {
            tracing::warn!("dashboard: cannot start the record follower: {e}");
            let mut state = lock(&thread_shared.state);
            state.ended = true;
        }
        Feed {
            _guard: Arc::new(StopOnDrop(shared.clone())),
            shared,
        }
    }

    /// The run directory followed.
    pub fn run_dir(&self) -> &Path {
        &self.shared.run_dir
    }

    /// Joins the stream of items (see [`Join`]).
    pub fn join(&self) -> Join {
        let state = lock(&self.shared.state);
        Join {
            rx: self.shared.tx.subscribe(),
            events_end: state.events_end,
            tools: state
                .tools
                .values()
                .filter(|item| matches!(&***item, Item::Tool { tool: Some(_), .. }))
                .map(|item| (**item).clone())
                .collect(),
            ended: state.ended,
        }
    }

    /// Whether the run has a loop of this exact name (named by an event).
    pub fn has_loop(&self, name: &str) -> bool {
        lock(&self.shared.state).loops.contains(name)
    }

    /// The current tool of a loop, if it waits on one.
    pub fn tool_of(&self, name: &str) -> Option<String> {
        match lock(&self.shared.state).tools.get(name).map(|item| &**item) {
            Some(Item::Tool { tool, .. }) => tool.clone(),
            _ => None,
        }
    }
}

/// What the follower knows of one running loop's transcript and receipt log.
#[derive(Default)]
struct Transcript {
    /// The transcript, held open while the loop runs (a poll is then one `fstat`, not a
    /// path lookup); `None` until it exists.
    file: Option<std::fs::File>,
    offset: u64,
    /// The receipt log, the same way.
    receipts: Option<std::fs::File>,
    /// How far its receipt log was read.
    receipts_offset: u64,
    /// Calls of the last response without a result yet: (id, tool).
    pending: Vec<(String, String)>,
}

struct Follower {
    shared: Arc<Shared>,
    /// The event log, held open once it exists.
    events: Option<std::fs::File>,
    events_offset: u64,
    /// The loops running now (by the events), and what is known of their transcripts.
    running: BTreeMap<String, Transcript>,
    /// Loops that ended since the last read of the transcripts: their tool is cleared.
    ended: BTreeSet<String>,
    /// When the running loops' files were last looked at.
    polled: Option<Instant>,
    /// The transcripts were not followed (no browser was connected): their offsets and calls
    /// in flight are out of date.
    tools_stale: bool,
}

/// The parts of a transcript line the current tool needs.
#[derive(Deserialize)]
struct TranscriptLine {
    entry: String,
    /// 0 for the loop's answers to other loops' questions, which run beside its own work.
    #[serde(default)]
    iteration: Option<u64>,
    #[serde(default)]
    response: Option<ResponsePart>,
    #[serde(default)]
    call_id: Option<String>,
}

#[derive(Deserialize)]
struct ResponsePart {
    #[serde(default)]
    tool_calls: Vec<CallPart>,
}

#[derive(Deserialize)]
struct CallPart {
    id: String,
    name: String,
}

impl Follower {
    fn new(shared: Arc<Shared>) -> Follower {
        Follower {
            shared,
            events: None,
            events_offset: 0,
            running: BTreeMap::new(),
            ended: BTreeSet::new(),
            polled: None,
            tools_stale: true,
        }
    }

    fn run(mut self, poll: Duration) {
        let run_dir = self.shared.run_dir.clone();
        let mut last_tick = Instant::now();
        loop {
            if self.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(poll);
            self.read_events();
            self.follow_tools();
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                if !crate::run::owner::is_owned(&run_dir) {
                    // The owner is gone: everything it wrote is there to read.
                    self.read_all();
                    let mut state = lock(&self.shared.state);
                    state.ended = true;
                    let _ = self.shared.tx.send(Arc::new(Item::End));
                    return;
                }
            }
        }
    }

    /// Whether a browser is connected (only then are the transcripts read).
    fn watched(&self) -> bool {
        self.shared.tx.receiver_count() > 0
    }

    /// Reads every line there is now.
    fn read_all(&mut self) {
        self.read_events();
        self.polled = None;
        self.follow_tools();
    }

    /// Publishes the complete event lines appended since the last read, and keeps the set
    /// of running loops.
    fn read_events(&mut self) {
        let mut offset = self.events_offset;
        let path = self.shared.run_dir.join(EVENTS_FILE);
        let mut events = self.events.take();
        read_new_lines(&mut events, &path, &mut offset, |line, start, end| {
            let parsed = event_item(line, start, end);
            if let Some(parsed) = &parsed {
                self.note_lifecycle(parsed);
            }
            // The offset and the item under one lock: a stream joining now reads up to the
            // offset from the file and takes the rest from the broadcast, missing none.
            let mut state = lock(&self.shared.state);
            state.events_end = end;
            if let Some(parsed) = parsed {
                state.loops.extend(parsed.loops);
                let _ = self.shared.tx.send(Arc::new(parsed.item));
            }
        });
        self.events = events;
        self.events_offset = offset;
    }

    /// Keeps [`Follower::running`] by the event: a loop runs from its start (or restart)
    /// until it completes, fails, is blocked, paused, stopped or unregistered.
    fn note_lifecycle(&mut self, parsed: &EventLine) {
        let Some(name) = parsed.loop_name.as_deref() else {
            return;
        };
        const STARTS: [&str; 3] = ["loop_started", "loop_restarted", "iteration_started"];
        const ENDS: [&str; 6] = [
            "loop_completed",
            "loop_failed",
            "loop_blocked",
            "loop_paused",
            "loop_stopped",
            "loop_unregistered",
        ];
        let event = parsed.event.as_str();
        if STARTS.contains(&event)
            && !self.running.contains_key(name)
            && crate::run::record::loop_dir(&self.shared.run_dir, name).is_ok()
        {
            // A loop that starts now is read from its first line; one found running when
            // the follower starts, from its tail (see `follow_tools`).
            self.running.insert(name.to_string(), Transcript::default());
            self.ended.remove(name);
        } else if ENDS.contains(&event) && self.running.remove(name).is_some() {
            self.ended.insert(name.to_string());
        }
    }

    /// Keeps the running loops' current tools while a browser is connected: every
    /// [`TOOL_POLL`], one `fstat` per held file, and the new lines of those that grew. With
    /// no browser the transcripts and receipt logs (most of what a run writes) are not read
    /// at all, so that a dashboard nobody looks at costs the run next to nothing; when one
    /// connects again, each is read from its tail, as at start.
    fn follow_tools(&mut self) {
        if !self.watched() {
            self.tools_stale = true;
            return;
        }
        for name in std::mem::take(&mut self.ended) {
            self.publish_tool(&name, None);
        }
        if self.tools_stale {
            self.tools_stale = false;
            self.polled = None;
            let loops_dir = self.shared.run_dir.join(LOOPS_DIR);
            for (name, t) in &mut self.running {
                let dir = loops_dir.join(name);
                *t = Transcript {
                    offset: tail_start(&dir.join(TRANSCRIPT_FILE)),
                    receipts_offset: tail_start(&dir.join(RECEIPTS_FILE)),
                    ..Transcript::default()
                };
            }
        }
        if self.polled.is_some_and(|at| at.elapsed() < TOOL_POLL) {
            return;
        }
        self.polled = Some(Instant::now());
        let names: Vec<String> = self.running.keys().cloned().collect();
        for name in names {
            self.read_transcript(&name);
        }
    }

    /// Reads what was appended to a running loop's transcript and receipt log, and
    /// publishes its current tool when it changed.
    fn read_transcript(&mut self, name: &str) {
        let Some(t) = self.running.get_mut(name) else {
            return;
        };
        let dir = self.shared.run_dir.join(LOOPS_DIR).join(name);
        let mut pending = std::mem::take(&mut t.pending);
        read_new_lines(
            &mut t.file,
            &dir.join(TRANSCRIPT_FILE),
            &mut t.offset,
            |line, _, _| {
                let bytes = &line.bytes[..];
                // Most of a transcript's bytes are requests (the messages sent) and spends:
                // known by their tag, which comes first, they are skipped without parsing.
                if skipped_kind(bytes) {
                    return;
                }
                let Ok(entry) = serde_json::from_slice::<TranscriptLine>(bytes) else {
                    return;
                };
                // An answer to another loop runs beside the loop's own call in flight: it is
                // not what the loop is doing.
                if entry.iteration == Some(0) {
                    return;
                }
                match entry.entry.as_str() {
                    "response" => {
                        pending = entry
                            .response
                            .map(|r| r.tool_calls.into_iter().map(|c| (c.id, c.name)).collect())
                            .unwrap_or_default();
                    }
                    "tool_result" => {
                        if let Some(id) = entry.call_id {
                            pending.retain(|(call, _)| *call != id);
                        }
                    }
                    "iteration_started" | "model_error" => pending.clear(),
                    _ => {}
                }
            },
        );
        // A receipt only ends a call in flight: with none, its log is not even looked at
        // (it is read from where it was left once a call is in flight again).
        if pending.is_empty() {
            t.pending = pending;
            self.publish_tool(name, None);
            return;
        }
        read_new_lines(
            &mut t.receipts,
            &dir.join(RECEIPTS_FILE),
            &mut t.receipts_offset,
            |line, _, _| {
                if let Some(id) = receipt_call_id(&line.bytes) {
                    pending.retain(|(call, _)| call.as_bytes() != id);
                }
            },
        );
        let now = pending.first().map(|(_, tool)| tool.clone());
        t.pending = pending;
        self.publish_tool(name, now);
    }

    /// Publishes a loop's current tool if it is news.
    fn publish_tool(&self, name: &str, now: Option<String>) {
        let mut state = lock(&self.shared.state);
        let changed = match state.tools.get(name).map(|item| &**item) {
            Some(Item::Tool { tool, .. }) => *tool != now,
            // A loop never seen with a tool that still has none is no news.
            _ => now.is_some(),
        };
        if changed {
            let item = Arc::new(tool_item(name, now));
            state.tools.insert(name.to_string(), item.clone());
            let _ = self.shared.tx.send(item);
        }
    }
}

/// The item saying that `name`'s current tool is now `tool`, its JSON made (and redacted)
/// once for every stream.
fn tool_item(name: &str, tool: Option<String>) -> Item {
    let time = td_base::time::timestamp_now();
    let json = serde_json::json!({"loop_name": name, "tool": tool, "time": time}).to_string();
    let data = Arc::from(td_base::secrets::redact_json(&json).as_ref());
    Item::Tool {
        loop_name: name.to_string(),
        tool,
        time,
        data,
    }
}

/// Calls `each` with every complete line of the file at `path` after `offset` (with where
/// it starts and where the next begins), and moves `offset` past them. The file is opened
/// into `held` the first time it exists and kept open, so that a file that did not grow
/// costs one `fstat`. A file that shrank (replaced) is read again from its tail.
fn read_new_lines(
    held: &mut Option<std::fs::File>,
    path: &Path,
    offset: &mut u64,
    mut each: impl FnMut(&Line, u64, u64),
) {
    if held.is_none() {
        *held = std::fs::File::open(path).ok();
    }
    let Some(file) = held.as_mut() else {
        return;
    };
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(_) => return,
    };
    if len < *offset {
        *offset = tail_start(path);
    }
    if len <= *offset || file.seek(SeekFrom::Start(*offset)).is_err() {
        return;
    }
    let mut reader = BufReader::new(file);
    while let Ok(Some(line)) = read_line(&mut reader, MAX_LINE) {
        if !line.complete {
            break; // torn: read again when it is whole
        }
        let start = *offset;
        *offset = offset.saturating_add(line.consumed());
        each(&line, start, *offset);
    }
}

/// The call id of a receipt line, from its first field (`{"call_id":"...",`: receipts are
/// written with sorted keys); `None` for a receipt without one or a line written otherwise.
fn receipt_call_id(line: &[u8]) -> Option<&[u8]> {
    let rest = line.strip_prefix(b"{\"call_id\":\"")?;
    let end = rest.iter().position(|b| *b == b'"' || *b == b'\\')?;
    (rest.get(end) == Some(&b'"')).then(|| &rest[..end])
}

/// Whether a transcript line is of a kind the current tool does not depend on, by its
/// leading tag (`{"entry":"request",...`, as the record writes it); a line written any other
/// way is parsed.
fn skipped_kind(line: &[u8]) -> bool {
    const TAG: &[u8] = b"{\"entry\":\"";
    let Some(rest) = line.strip_prefix(TAG) else {
        return false;
    };
    [&b"request\""[..], b"spent\"", b"validation\""]
        .iter()
        .any(|kind| rest.starts_with(kind))
}

/// Where reading a transcript's tail starts: the line after the last [`TRANSCRIPT_TAIL`]
/// bytes' first newline (0 for a short file).
fn tail_start(path: &Path) -> u64 {
    let Ok(mut file) = std::fs::File::open(path) else {
        return 0;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(TRANSCRIPT_TAIL);
    if from == 0 || file.seek(SeekFrom::Start(from)).is_err() {
        return 0;
    }
    let mut reader = BufReader::new(file);
    match read_line(&mut reader, 0) {
        Ok(Some(line)) if line.complete => from.saturating_add(line.consumed()),
        _ => len,
    }
}

/// An event line, read: what is published, and what the follower keeps of it.
pub struct EventLine {
    /// What is published.
    pub item: Item,
    /// The loop names it tells of (its loop; the loops of `run_started`).
    pub loops: Vec<String>,
    /// Its `loop_name`, if it has one.
    pub loop_name: Option<String>,
    /// Its `event` (empty when it has none).
    pub event: String,
}

/// The event line between `start` and `end`; `None` for a line that is not an event
/// (skipped, as `status` skips it).
pub fn event_item(line: &Line, start: u64, end: u64) -> Option<EventLine> {
    // An object (a derived struct would take an array too); its other fields are skipped
    // unread: a full parse of every event into a map was most of the follower's work.
    if line.bytes.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let head: EventHead = serde_json::from_slice(&line.bytes).ok()?;
    let loop_name = head.loop_name.and_then(|v| match v {
        Value::String(name) => Some(name),
        _ => None,
    });
    let event = match head.event {
        Some(Value::String(event)) => event,
        _ => String::new(),
    };
    let mut loops: Vec<String> = loop_name.iter().cloned().collect();
    if event == "run_started"
        && let Some(Value::Array(listed)) = head.loops
    {
        loops.extend(
            listed
                .iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str))
                .map(str::to_string),
        );
    }
    let text = match std::str::from_utf8(&line.bytes) {
        Ok(text) if !text.contains('\r') => td_base::secrets::redact_json(text),
        // A carriage return would end an SSE line: written again without it.
        _ => {
            let value: Value = serde_json::from_slice(&line.bytes).ok()?;
            let text = serde_json::to_string(&value).ok()?;
            std::borrow::Cow::Owned(td_base::secrets::redact_json(&text).into_owned())
        }
    };
    Some(EventLine {
        item: Item::Event {
            start,
            end,
            seq: head.seq,
            data: Arc::from(text.as_ref()),
        },
        loops,
        loop_name,
        event,
    })
}

/// The fields of an event line the follower reads.
#[derive(Deserialize)]
struct EventHead {
    seq: u64,
    #[serde(default)]
    event: Option<Value>,
    #[serde(default)]
    loop_name: Option<Value>,
    /// `run_started`'s loops.
    #[serde(default)]
    loops: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Line {
        Line {
            bytes: text.as_bytes().to_vec(),
            len: text.len() as u64,
            complete: true,
        }
    }

    #[test]
    fn event_lines_become_items_and_name_their_loops() {
        let EventLine {
            item,
            loops: names,
            loop_name,
            event,
        } = event_item(
            &line(r#"{"seq":1,"time":"t","event":"run_started","run_id":"r","config":null,"loops":[{"name":"a","loop_type":"code"},{"name":"b","loop_type":"code"}]}"#),
            0,
            10,
        )
        .unwrap();
        assert_eq!((loop_name, event.as_str()), (None, "run_started"));
        assert!(matches!(
            item,
            Item::Event {
                seq: 1,
                start: 0,
                end: 10,
                ..
            }
        ));
        assert_eq!(names, ["a", "b"]);
        // A carriage return would end an SSE line: the JSON is written again without it.
        let EventLine {
            item, loop_name, ..
        } = event_item(&line("{\"seq\":2,\r\"loop_name\":\"a\"}"), 10, 20).unwrap();
        assert_eq!(loop_name.as_deref(), Some("a"));
        let Item::Event { data, .. } = item else {
            panic!("not an event")
        };
        assert!(!data.contains('\r'), "{data}");
        for bad in ["", "not json", r#"{"seq":"x"}"#, r#"{"no":"seq"}"#, "[1]"] {
            assert!(event_item(&line(bad), 0, 1).is_none(), "{bad}");
        }
    }

    #[test]
    fn requests_and_spends_are_known_by_their_tag() {
        assert!(skipped_kind(br#"{"entry":"request","iteration":1}"#));
        assert!(skipped_kind(br#"{"entry":"spent","iteration":1}"#));
        assert!(!skipped_kind(br#"{"entry":"response","iteration":1}"#));
        assert!(!skipped_kind(br#"{"entry":"tool_result"}"#));
        assert!(!skipped_kind(br#"{"iteration":1,"entry":"request"}"#));
    }

    #[test]
    fn the_current_tool_follows_responses_and_results() {
        let (dir, _shared, mut rx, mut f) = one_loop_run();
        let run = dir.path();
        let transcript = run.join("loops/a/transcript.jsonl");
        let append = |text: &str| {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&transcript)
                .unwrap();
            file.write_all(text.as_bytes()).unwrap();
        };
        append(
            r#"{"entry":"response","iteration":1,"turn":1,"response":{"text":null,"tool_calls":[{"id":"c1","name":"run_command","input":{}},{"id":"c2","name":"read_file","input":{}}],"stop_reason":"tool_use","usage":{}}}"#,
        );
        append("\n");
        f.read_transcript("a");
        let tool = |rx: &mut broadcast::Receiver<Arc<Item>>| match &*rx.try_recv().unwrap() {
            Item::Tool { tool, .. } => tool.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(tool(&mut rx).as_deref(), Some("run_command"));
        // The loop answers another loop meanwhile: its own call is still in flight.
        append(
            r#"{"entry":"response","iteration":0,"turn":1,"response":{"text":"8080","tool_calls":[],"stop_reason":"end_turn","usage":{}}}"#,
        );
        append("\n");
        f.read_transcript("a");
        assert!(rx.try_recv().is_err());
        // A torn line waits until it is whole.
        append(r#"{"entry":"tool_result","iteration":1,"turn":1,"call_id":"c1","#);
        f.read_transcript("a");
        assert!(rx.try_recv().is_err());
        append("\"name\":\"run_command\",\"content\":\"\",\"is_error\":false}\n");
        f.read_transcript("a");
        assert_eq!(tool(&mut rx).as_deref(), Some("read_file"));
        // The receipt log tells of a call's end before the transcript does.
        std::fs::write(
            run.join("loops/a/receipts.jsonl"),
            "{\"call_id\":\"c2\",\"tool\":\"read_file\"}\n",
        )
        .unwrap();
        f.read_transcript("a");
        assert_eq!(tool(&mut rx), None);
        append(
            r#"{"entry":"tool_result","iteration":1,"turn":1,"call_id":"c2","name":"read_file","content":"","is_error":false}"#,
        );
        append("\n");
        f.read_transcript("a");
        assert!(rx.try_recv().is_err());
        assert_eq!(
            receipt_call_id(br#"{"call_id":"x-1","a":1}"#),
            Some(&b"x-1"[..])
        );
        assert_eq!(receipt_call_id(br#"{"call_id":null,"a":1}"#), None);
        assert_eq!(receipt_call_id(br#"{"a":1,"call_id":"x"}"#), None);
    }

    #[test]
    fn an_answer_to_another_loop_leaves_the_tool_in_flight() {
        let (dir, feed_shared, mut rx, mut f) = one_loop_run();
        let run = dir.path();
        let lines = [
            r#"{"entry":"response","iteration":1,"turn":1,"response":{"text":null,"tool_calls":[{"id":"c1","name":"run_command","input":{}}],"stop_reason":"tool_use","usage":{}}}"#,
            // While its command runs, the loop answers another loop's question (iteration 0):
            // the answer's response has no tool call, and the command is still in flight.
            r#"{"entry":"request","iteration":0,"turn":1,"purpose":{"kind":"query_answer","from":"b","question":"q"},"new_messages":[]}"#,
            r#"{"entry":"response","iteration":0,"turn":1,"response":{"text":"8080","tool_calls":[],"stop_reason":"end_turn","usage":{}}}"#,
            r#"{"entry":"model_error","iteration":0,"error":"an answer failed"}"#,
        ];
        std::fs::write(
            run.join("loops/a/transcript.jsonl"),
            lines.join("\n") + "\n",
        )
        .unwrap();
        f.read_transcript("a");
        match &*rx.try_recv().unwrap() {
            Item::Tool { tool, .. } => assert_eq!(tool.as_deref(), Some("run_command")),
            other => panic!("{other:?}"),
        }
        assert!(rx.try_recv().is_err(), "nothing else changed");
        assert_eq!(
            feed_shared_tool(&feed_shared, "a").as_deref(),
            Some("run_command")
        );
    }

    fn response(id: &str, tool: &str) -> String {
        format!(
            r#"{{"entry":"response","iteration":1,"turn":1,"response":{{"text":null,"tool_calls":[{{"id":"{id}","name":"{tool}","input":{{}}}}],"stop_reason":"tool_use","usage":{{}}}}}}"#
        )
    }

    fn append_event(run: &Path, seq: u64, event: &str, name: &str) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(run.join(EVENTS_FILE))
            .unwrap();
        writeln!(
            file,
            r#"{{"seq":{seq},"time":"t","event":"{event}","loop_name":"{name}"}}"#
        )
        .unwrap();
    }

    #[test]
    fn transcripts_are_read_only_while_a_browser_is_connected() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        std::fs::create_dir_all(run.join("loops/a")).unwrap();
        append_event(&run, 1, "loop_started", "a");
        let shared = shared_at(&run);
        let mut f = Follower::new(shared.clone());
        f.read_all();
        let transcript = run.join("loops/a/transcript.jsonl");
        std::fs::write(&transcript, response("c1", "build") + "\n").unwrap();
        // Nobody watches: nothing is read.
        f.polled = None;
        f.follow_tools();
        assert_eq!(f.running["a"].offset, 0);
        assert!(f.running["a"].file.is_none(), "nothing was opened");
        assert_eq!(feed_shared_tool(&shared, "a"), None);
        // More is written meanwhile; a browser connects: the tail is read, the loop's tool is
        // the one in flight now.
        let mut text = std::fs::read_to_string(&transcript).unwrap();
        text.push_str(&(response("c2", "test") + "\n"));
        std::fs::write(&transcript, &text).unwrap();
        let mut rx = shared.tx.subscribe();
        f.follow_tools();
        assert_eq!(f.running["a"].offset, text.len() as u64);
        match &*rx.try_recv().unwrap() {
            Item::Tool { tool, .. } => assert_eq!(tool.as_deref(), Some("test")),
            other => panic!("{other:?}"),
        }
        // It leaves: reading stops again.
        drop(rx);
        std::fs::write(
            &transcript,
            text.clone() + &response("c3", "validate") + "\n",
        )
        .unwrap();
        f.polled = None;
        f.follow_tools();
        assert_eq!(f.running["a"].offset, text.len() as u64);
    }

    #[test]
    fn only_running_loops_are_polled_and_an_ended_one_has_no_tool() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        for name in ["a", "b"] {
            std::fs::create_dir_all(run.join("loops").join(name)).unwrap();
            std::fs::write(
                run.join("loops").join(name).join(TRANSCRIPT_FILE),
                response("c1", "build") + "\n",
            )
            .unwrap();
        }
        append_event(&run, 1, "loop_started", "a");
        append_event(&run, 2, "loop_started", "b");
        append_event(&run, 3, "loop_completed", "b");
        let shared = shared_at(&run);
        let mut rx = shared.tx.subscribe();
        let mut f = Follower::new(shared.clone());
        f.tools_stale = false; // both started while the browser was there: read from the start
        f.read_all();
        // `b` ended: it is not followed, and its files are not held.
        assert_eq!(f.running.keys().collect::<Vec<_>>(), ["a"]);
        assert!(f.running["a"].file.is_some(), "a's transcript is held open");
        let mut tools = Vec::new();
        while let Ok(item) = rx.try_recv() {
            if let Item::Tool {
                loop_name, tool, ..
            } = &*item
            {
                tools.push((loop_name.clone(), tool.clone()));
            }
        }
        assert_eq!(tools, [("a".to_string(), Some("build".to_string()))]);
        // `a` ends while its call is in flight: its tool is cleared, once.
        append_event(&run, 4, "loop_failed", "a");
        f.read_events();
        f.follow_tools();
        assert!(f.running.is_empty());
        let mut cleared = Vec::new();
        while let Ok(item) = rx.try_recv() {
            if let Item::Tool {
                loop_name, tool, ..
            } = &*item
            {
                cleared.push((loop_name.clone(), tool.clone()));
            }
        }
        assert_eq!(cleared, [("a".to_string(), None)]);
        assert_eq!(feed_shared_tool(&shared, "a"), None);
        // A restarted loop is followed again.
        append_event(&run, 5, "loop_restarted", "a");
        f.read_events();
        assert!(f.running.contains_key("a"));
    }

    /// A run directory with loop `a` running (by its event log), its follower, and a browser's
    /// receiver (so that the follower reads the transcripts).
    fn one_loop_run() -> (
        tempfile::TempDir,
        Arc<Shared>,
        broadcast::Receiver<Arc<Item>>,
        Follower,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        std::fs::create_dir_all(run.join("loops/a")).unwrap();
        append_event(run, 1, "loop_started", "a");
        let shared = shared_at(run);
        let mut follower = Follower::new(shared.clone());
        follower.read_events();
        let rx = shared.tx.subscribe();
        (dir, shared, rx, follower)
    }

    /// The follower's shared state for a run directory, as `Feed::start` makes it.
    fn shared_at(run: &Path) -> Arc<Shared> {
        Arc::new(Shared {
            run_dir: run.to_path_buf(),
            state: Mutex::new(State::default()),
            tx: broadcast::channel(16).0,
            stop: AtomicBool::new(false),
        })
    }

    fn feed_shared_tool(shared: &Shared, name: &str) -> Option<String> {
        match lock(&shared.state).tools.get(name).map(|item| &**item) {
            Some(Item::Tool { tool, .. }) => tool.clone(),
            _ => None,
        }
    }
}
