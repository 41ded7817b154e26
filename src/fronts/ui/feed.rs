//! The dashboard's one follower of a run record, shared by every browser: it reads
//! `events.jsonl` and the loops' `transcript.jsonl` as lines are appended (woken by inotify
//! through `notify`, or by a poll where inotify does not see changes, such as a network
//! file system) and fans what it read out to every open stream (a tokio broadcast).
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
/// How often the follower checks whether the run is still owned (and, with inotify, looks
/// at every file whatever it was told).
const TICK: Duration = Duration::from_millis(500);
/// How long the follower lets a burst of reported writes gather before it reads.
const COALESCE: Duration = Duration::from_millis(10);
/// Items a stream may fall behind before it reads from the file again.
const BACKLOG: usize = 4096;

/// What wakes the follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// inotify (through `notify`): a change is read as it is reported.
    Notify,
    /// A poll of every file's length at this interval.
    Poll(Duration),
}

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
    tools: BTreeMap<String, (Option<String>, String)>,
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
    pub fn start(run_dir: &Path, follow: Follow) -> Feed {
        let (tx, _) = broadcast::channel(BACKLOG);
        let shared = Arc::new(Shared {
            run_dir: run_dir.to_path_buf(),
            state: Mutex::new(State::default()),
            tx,
            stop: AtomicBool::new(false),
        });
        let mut follower = Follower::new(shared.clone());
        follower.read_all(true);
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ui-feed".into())
            .spawn(move || follower.run(follow));
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
                .iter()
                .filter(|(_, (tool, _))| tool.is_some())
                .map(|(name, (tool, time))| Item::Tool {
                    loop_name: name.clone(),
                    tool: tool.clone(),
                    time: time.clone(),
                })
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
        lock(&self.shared.state)
            .tools
            .get(name)
            .and_then(|(tool, _)| tool.clone())
    }
}

/// What the follower knows of one transcript.
#[derive(Default)]
struct Transcript {
    offset: u64,
    /// How far its receipt log was read.
    receipts_offset: u64,
    /// Calls of the last response without a result yet: (id, tool).
    pending: Vec<(String, String)>,
}

struct Follower {
    shared: Arc<Shared>,
    events_offset: u64,
    transcripts: BTreeMap<String, Transcript>,
    dirty: BTreeSet<String>,
    /// When the loop directories were last listed.
    listed: Option<Instant>,
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
            events_offset: 0,
            transcripts: BTreeMap::new(),
            dirty: BTreeSet::new(),
            listed: None,
            tools_stale: false,
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.shared.run_dir.clone()
    }

    fn run(mut self, follow: Follow) {
        let (ntx, nrx) = std::sync::mpsc::channel::<notify::Result<notify::Event>>();
        let mut watcher = match follow {
            Follow::Notify => {
                match notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
                    // An error wakes it too: it then reads everything.
                    if e.as_ref().map_or(true, is_change) {
                        let _ = ntx.send(e);
                    }
                }) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        tracing::warn!(
                            "dashboard: inotify is not available ({e}); polling instead"
                        );
                        None
                    }
                }
            }
            Follow::Poll(_) => None,
        };
        let poll = match (follow, &watcher) {
            (Follow::Poll(every), _) => Some(every),
            (Follow::Notify, None) => Some(Duration::from_millis(50)),
            (Follow::Notify, Some(_)) => None,
        };
        let run_dir = self.run_dir();
        let loops_dir = run_dir.join(LOOPS_DIR);
        let mut loops_watched = false;
        if let Some(w) = watcher.as_mut() {
            use notify::Watcher;
            if let Err(e) = w.watch(&run_dir, notify::RecursiveMode::NonRecursive) {
                tracing::warn!("dashboard: cannot watch {}: {e}", run_dir.display());
            }
        }
        let mut last_tick = Instant::now();
        loop {
            if self.shared.stop.load(Ordering::Relaxed) {
                return;
            }
            match poll {
                Some(every) => {
                    std::thread::sleep(every);
                    self.mark_all_transcripts();
                }
                None => {
                    if let Ok(first) = nrx.recv_timeout(TICK) {
                        // Writes come in bursts (a response, its spend, its results): one
                        // read for the burst, well within the 50 ms an event may take.
                        std::thread::sleep(COALESCE);
                        self.note(first, &run_dir, &loops_dir);
                        while let Ok(more) = nrx.try_recv() {
                            self.note(more, &run_dir, &loops_dir);
                        }
                    }
                }
            }
            // The loops' directories are watched only while a browser is connected: every
            // write into a watched directory costs the writing daemon an inotify event, and
            // the follower a wake-up, for transcripts nobody reads then (see `follow_tools`).
            if let Some(w) = watcher.as_mut() {
                use notify::Watcher;
                let watching = self.shared.tx.receiver_count() > 0;
                if watching && !loops_watched && loops_dir.is_dir() {
                    loops_watched = w
                        .watch(&loops_dir, notify::RecursiveMode::Recursive)
                        .is_ok();
                    // What was written before the watch.
                    self.mark_all_transcripts();
                } else if !watching && loops_watched {
                    let _ = w.unwatch(&loops_dir);
                    loops_watched = false;
                }
            }
            self.read_events();
            self.follow_tools();
            if last_tick.elapsed() >= TICK {
                last_tick = Instant::now();
                // What inotify cannot have told: lines written into a new loop directory
                // before its watch was added. One stat per transcript.
                if poll.is_none() {
                    self.mark_all_transcripts();
                    self.follow_tools();
                }
                if !crate::run::owner::is_owned(&run_dir) {
                    // The owner is gone: everything it wrote is there to read.
                    self.read_all(false);
                    let mut state = lock(&self.shared.state);
                    state.ended = true;
                    let _ = self.shared.tx.send(Arc::new(Item::End));
                    return;
                }
            }
        }
    }

    /// Reads every line there is now (`starting`: transcripts only from their tails).
    fn read_all(&mut self, starting: bool) {
        self.read_events();
        for name in self.loop_dirs() {
            self.transcripts.entry(name.clone()).or_insert_with(|| {
                let mut t = Transcript::default();
                if starting {
                    let dir = self.shared.run_dir.join(LOOPS_DIR).join(&name);
                    t.offset = tail_start(&dir.join(TRANSCRIPT_FILE));
                    t.receipts_offset = tail_start(&dir.join(RECEIPTS_FILE));
                }
                t
            });
            self.dirty.insert(name);
        }
        self.follow_tools();
    }

    /// The loop directories under `loops/` (plain names only).
    fn loop_dirs(&self) -> Vec<String> {
        let mut names = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.shared.run_dir.join(LOOPS_DIR)) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(name) = entry.file_name().to_str()
                    && crate::run::record::loop_dir(&self.shared.run_dir, name).is_ok()
                {
                    names.push(name.to_string());
                }
            }
        }
        names
    }

    /// Marks every transcript to be read. The loop directories are listed again at most
    /// once a [`TICK`] (loops are added rarely; a poll every few milliseconds would list
    /// them thousands of times).
    fn mark_all_transcripts(&mut self) {
        if self.listed.is_none_or(|at| at.elapsed() >= TICK) {
            self.listed = Some(Instant::now());
            for name in self.loop_dirs() {
                self.transcripts.entry(name).or_default();
            }
        }
        self.dirty.extend(self.transcripts.keys().cloned());
    }

    /// Takes note of what inotify reported.
    fn note(&mut self, event: notify::Result<notify::Event>, run_dir: &Path, loops_dir: &Path) {
        let Ok(event) = event else {
            // An overflowed queue or a watch error: read everything.
            self.mark_all_transcripts();
            return;
        };
        if event.need_rescan() {
            self.mark_all_transcripts();
        }
        if !is_change(&event) {
            return;
        }
        for path in &event.paths {
            if path.parent() == Some(run_dir) {
                continue; // events.jsonl is read every time
            }
            // A loop's directory (made, or a watch lost) or its transcript; its receipts
            // and artifacts are not followed.
            let Ok(rel) = path.strip_prefix(loops_dir) else {
                continue;
            };
            let mut parts = rel.components();
            let (Some(std::path::Component::Normal(name)), file) = (parts.next(), parts.next())
            else {
                continue;
            };
            let transcript = match file {
                None => true,
                Some(f) => {
                    (f.as_os_str() == TRANSCRIPT_FILE || f.as_os_str() == RECEIPTS_FILE)
                        && parts.next().is_none()
                }
            };
            if transcript && let Some(name) = name.to_str() {
                self.dirty.insert(name.to_string());
            }
        }
    }

    /// Publishes the complete event lines appended since the last read.
    fn read_events(&mut self) {
        let path = self.shared.run_dir.join(EVENTS_FILE);
        if std::fs::metadata(&path).map_or(true, |m| m.len() <= self.events_offset) {
            return;
        }
        let Ok(mut file) = std::fs::File::open(&path) else {
            return;
        };
        if file.seek(SeekFrom::Start(self.events_offset)).is_err() {
            return;
        }
        let mut reader = BufReader::new(file);
        let mut offset = self.events_offset;
        while let Ok(Some(line)) = read_line(&mut reader, MAX_LINE) {
            if !line.complete {
                break; // torn: read again when it is whole
            }
            let start = offset;
            offset = offset.saturating_add(line.consumed());
            let parsed = event_item(&line, start, offset);
            let mut state = lock(&self.shared.state);
            state.events_end = offset;
            if let Some((item, names)) = parsed {
                state.loops.extend(names);
                let _ = self.shared.tx.send(Arc::new(item));
            }
        }
        self.events_offset = offset;
    }

    /// Keeps the loops' current tools while a browser is connected. With none, the
    /// transcripts and receipt logs (most of what a run writes) are not read at all, so that
    /// a dashboard nobody looks at costs the run next to nothing; when one connects again,
    /// each transcript is read from its tail, as at start.
    fn follow_tools(&mut self) {
        if self.shared.tx.receiver_count() == 0 {
            self.dirty.clear();
            self.tools_stale = true;
            return;
        }
        if self.tools_stale {
            self.tools_stale = false;
            // Every loop there is now (some may have started meanwhile), each from its tail.
            self.listed = None;
            self.mark_all_transcripts();
            let loops_dir = self.shared.run_dir.join(LOOPS_DIR);
            for (name, t) in &mut self.transcripts {
                let dir = loops_dir.join(name);
                t.offset = tail_start(&dir.join(TRANSCRIPT_FILE));
                t.receipts_offset = tail_start(&dir.join(RECEIPTS_FILE));
                t.pending.clear();
            }
        }
        self.read_dirty();
    }

    /// Reads the transcripts marked as changed.
    fn read_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for name in dirty {
            self.read_transcript(&name);
        }
    }

    fn read_transcript(&mut self, name: &str) {
        if crate::run::record::loop_dir(&self.shared.run_dir, name).is_err() {
            return;
        }
        let dir = self.shared.run_dir.join(LOOPS_DIR).join(name);
        let t = self.transcripts.entry(name.to_string()).or_default();
        let mut offset = t.offset;
        for_new_lines(&dir.join(TRANSCRIPT_FILE), &mut offset, |bytes| {
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
                    t.pending = entry
                        .response
                        .map(|r| r.tool_calls.into_iter().map(|c| (c.id, c.name)).collect())
                        .unwrap_or_default();
                }
                "tool_result" => {
                    if let Some(id) = entry.call_id {
                        t.pending.retain(|(call, _)| *call != id);
                    }
                }
                "iteration_started" | "model_error" => t.pending.clear(),
                _ => {}
            }
        });
        t.offset = offset;
        let mut offset = t.receipts_offset;
        for_new_lines(&dir.join(RECEIPTS_FILE), &mut offset, |bytes| {
            if let Some(id) = receipt_call_id(bytes) {
                t.pending.retain(|(call, _)| call.as_bytes() != id);
            }
        });
        t.receipts_offset = offset;
        let now = t.pending.first().map(|(_, tool)| tool.clone());
        let mut state = lock(&self.shared.state);
        let known = state.tools.get(name).map(|(tool, _)| tool.clone());
        // A loop never seen with a tool that still has none is no news.
        let changed = match &known {
            Some(known) => *known != now,
            None => now.is_some(),
        };
        if changed {
            let time = td_base::time::timestamp_now();
            state
                .tools
                .insert(name.to_string(), (now.clone(), time.clone()));
            let _ = self.shared.tx.send(Arc::new(Item::Tool {
                loop_name: name.to_string(),
                tool: now,
                time,
            }));
        }
    }
}

/// Whether an inotify report may mean new lines. Opens and closes do not (a write is
/// reported as a modification too), and the follower's own reads of `events.jsonl` and the
/// transcripts cause them: taken for changes, every read would wake it for another read, a
/// busy loop that doubled the daemon's CPU in a 1,000-loop run (benches/ui.rs).
fn is_change(event: &notify::Event) -> bool {
    !matches!(event.kind, notify::EventKind::Access(_))
}

/// Calls `each` with every complete line of `path` after `offset`, and moves `offset` past
/// them; a file that did not grow costs one stat.
fn for_new_lines(path: &Path, offset: &mut u64, mut each: impl FnMut(&[u8])) {
    if std::fs::metadata(path).map_or(true, |m| m.len() <= *offset) {
        return;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        return;
    };
    if file.seek(SeekFrom::Start(*offset)).is_err() {
        return;
    }
    let mut reader = BufReader::new(file);
    while let Ok(Some(line)) = read_line(&mut reader, MAX_LINE) {
        if !line.complete {
            break;
        }
        *offset = offset.saturating_add(line.consumed());
        each(&line.bytes);
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

/// The item of an event line between `start` and `end`, and the loop names it tells of;
/// `None` for a line that is not an event (skipped, as `status` skips it).
pub fn event_item(line: &Line, start: u64, end: u64) -> Option<(Item, Vec<String>)> {
    if line.bytes.is_empty() {
        return None;
    }
    let value: Value = serde_json::from_slice(&line.bytes).ok()?;
    let seq = value.get("seq")?.as_u64()?;
    let mut names = Vec::new();
    if let Some(name) = value.get("loop_name").and_then(Value::as_str) {
        names.push(name.to_string());
    }
    if value.get("event").and_then(Value::as_str) == Some("run_started")
        && let Some(loops) = value.get("loops").and_then(Value::as_array)
    {
        names.extend(
            loops
                .iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str))
                .map(str::to_string),
        );
    }
    let text = match std::str::from_utf8(&line.bytes) {
        Ok(text) if !text.contains('\r') => text.to_string(),
        _ => serde_json::to_string(&value).ok()?,
    };
    let data: Arc<str> = Arc::from(td_base::secrets::redact_json(&text).as_ref());
    Some((
        Item::Event {
            start,
            end,
            seq,
            data,
        },
        names,
    ))
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
        let (item, names) = event_item(
            &line(r#"{"seq":1,"time":"t","event":"run_started","run_id":"r","config":null,"loops":[{"name":"a","loop_type":"code"},{"name":"b","loop_type":"code"}]}"#),
            0,
            10,
        )
        .unwrap();
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
        let (item, _) = event_item(&line("{\"seq\":2,\r\"loop_name\":\"a\"}"), 10, 20).unwrap();
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

    #[test]
    fn the_followers_own_reads_do_not_wake_it() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        let loops = run.join("loops");
        let shared = shared_at(&run);
        let mut f = Follower::new(shared);
        let transcript = loops.join("a/transcript.jsonl");
        // Opening and closing a transcript to read it is reported by inotify too: taken for
        // a change, every read would cause another one, and the follower would spin.
        for kind in [
            notify::EventKind::Access(notify::event::AccessKind::Open(
                notify::event::AccessMode::Read,
            )),
            notify::EventKind::Access(notify::event::AccessKind::Close(
                notify::event::AccessMode::Read,
            )),
        ] {
            let event = notify::Event::new(kind).add_path(transcript.clone());
            assert!(!is_change(&event), "{kind:?} wakes the follower");
            f.note(Ok(event), &run, &loops);
            assert!(f.dirty.is_empty(), "{kind:?} marked the loop changed");
        }
        let written = notify::Event::new(notify::EventKind::Modify(
            notify::event::ModifyKind::Data(notify::event::DataChange::Any),
        ))
        .add_path(transcript);
        assert!(is_change(&written));
        f.note(Ok(written), &run, &loops);
        assert!(f.dirty.contains("a"), "a write is a change");
    }

    #[test]
    fn transcripts_are_read_only_while_a_browser_is_connected() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        std::fs::create_dir_all(run.join("loops/a")).unwrap();
        let shared = shared_at(&run);
        let mut f = Follower::new(shared.clone());
        let response = |id: &str, tool: &str| {
            format!(
                r#"{{"entry":"response","iteration":1,"turn":1,"response":{{"text":null,"tool_calls":[{{"id":"{id}","name":"{tool}","input":{{}}}}],"stop_reason":"tool_use","usage":{{}}}}}}"#
            )
        };
        let transcript = run.join("loops/a/transcript.jsonl");
        std::fs::write(&transcript, response("c1", "build") + "\n").unwrap();
        // Nobody watches: nothing is read.
        f.mark_all_transcripts();
        f.follow_tools();
        assert_eq!(f.transcripts["a"].offset, 0);
        assert_eq!(feed_shared_tool(&shared, "a"), None);
        // More is written meanwhile; a browser connects: the tail is read, the loop's tool is
        // the one in flight now.
        let mut text = std::fs::read_to_string(&transcript).unwrap();
        text.push_str(&(response("c2", "test") + "\n"));
        std::fs::write(&transcript, &text).unwrap();
        let mut rx = shared.tx.subscribe();
        f.follow_tools();
        assert_eq!(f.transcripts["a"].offset, text.len() as u64);
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
        f.mark_all_transcripts();
        f.follow_tools();
        assert_eq!(f.transcripts["a"].offset, text.len() as u64);
    }

    /// A run directory with loop `a` and an empty event log, its follower, and a browser's
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
        std::fs::write(run.join(EVENTS_FILE), "").unwrap();
        let shared = shared_at(run);
        let rx = shared.tx.subscribe();
        let follower = Follower::new(shared.clone());
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
        lock(&shared.state)
            .tools
            .get(name)
            .and_then(|(tool, _)| tool.clone())
    }
}
