//! The event log of a run: loop lifecycle and every coordination message, each with a
//! sequence number. Sinks (the run record's `events.jsonl`, live progress, tests) subscribe.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use td_base::sync::lock;

use crate::spend::Spend;

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// A new run began: what a summary needs that no later event says, so that
    /// `summary.json` can be rebuilt from the events alone. The first event of a run.
    RunStarted {
        /// The run id.
        run_id: String,
        /// The config file the run came from.
        config: Option<String>,
        /// The loops the run was started with, in config order.
        loops: Vec<PlannedLoop>,
        /// How the run's commands are confined.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<td_confine::SandboxReport>,
        /// The commit whose `.gitattributes` the daemon's own git reads (the repository's
        /// HEAD when the run first started; `td_git::attributes::trust`); kept by a resumed
        /// run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attributes_from: Option<String>,
    },
    /// A loop's new worktree was seeded with build state from the base checkout (`warm:`),
    /// before the loop started.
    WorktreeSeeded {
        /// Loop name (the first loop of a shared worktree's group).
        loop_name: String,
        /// What was copied, how, and what was not.
        seed: WarmSeed,
    },
    /// A loop actor started.
    LoopStarted {
        /// Loop name.
        loop_name: String,
        /// Loop type.
        loop_type: String,
        /// The worker host it runs on, written by the head when it takes the host's record
        /// (absent: it runs on the head); a summary rebuilt from events alone shows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
    },
    /// An iteration began.
    IterationStarted {
        /// Loop name.
        loop_name: String,
        /// 1-based iteration number.
        iteration: u32,
    },
    /// An iteration ended and its validation ran (if any).
    IterationEnded {
        /// Loop name.
        loop_name: String,
        /// 1-based iteration number.
        iteration: u32,
        /// Why the model's turns ended (end_turn, complete_task, max_turns, stopped, error).
        ended_by: String,
        /// Validation exit code (`None` when no validation ran).
        validation_exit: Option<i32>,
        /// Whether validation passed.
        validation_passed: Option<bool>,
        /// The model calls the iteration made (its requests, answered or not): where a
        /// resumed scripted run goes on in its script, once the iteration counts as finished.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model_calls: Option<u32>,
        /// What the iteration's own model calls spent (answers to its questions are charged
        /// to it apart: see the transcripts' `spent` entries).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spend: Option<Spend>,
        /// How long the iteration took, validation included, in milliseconds (what a
        /// loop's wall-time budget counts).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wall_ms: Option<u64>,
    },
    /// The loop completed.
    LoopCompleted {
        /// Loop name.
        loop_name: String,
        /// Iterations used.
        iterations: u32,
        /// The model's completion summary, if it gave one.
        summary: Option<String>,
    },
    /// The loop failed.
    LoopFailed {
        /// Loop name.
        loop_name: String,
        /// Why.
        reason: String,
    },
    /// The loop cannot go on: a dependency did not complete, or merging its branch
    /// conflicted or was refused.
    LoopBlocked {
        /// Loop name.
        loop_name: String,
        /// Why.
        reason: String,
    },
    /// A completed loop's work landed in its integration target (its base branch with
    /// `merge: true`, otherwise the run's integration branch) after the merge queue merged
    /// and validated it.
    LoopMerged {
        /// Loop name.
        loop_name: String,
        /// The integration target.
        into: String,
        /// The target's new tip.
        commit: String,
    },
    /// The merge queue gave a completed loop's work back to it: its branch conflicted with
    /// its integration target, still held conflict markers, or the merged tree failed a
    /// validation. The target's head was merged into the loop's worktree and the loop runs
    /// again at its next iteration (it is running again).
    MergeHandedBack {
        /// Loop name.
        loop_name: String,
        /// The integration target.
        into: String,
        /// Hand backs of this loop so far, this one included (from 1).
        attempt: u32,
        /// What went wrong, in one line.
        reason: String,
        /// The files it is about (conflicting or holding markers; empty for a validation).
        files: Vec<String>,
    },
    /// The loop reached a hard limit of its budget (or the run's) and was paused: its
    /// worktree, branch and progress notes are kept, and `taskdaemon run --resume` with a
    /// raised budget goes on with it.
    LoopPaused {
        /// Loop name.
        loop_name: String,
        /// Which limit, and what to do.
        reason: String,
    },
    /// The loop was stopped on request.
    LoopStopped {
        /// Loop name.
        loop_name: String,
    },
    /// A stop was asked of the run through its control socket (the dashboard's stop
    /// buttons), before the daemon acted on it: the loop's `loop_stopped`, or for the whole
    /// run the same ends as after SIGTERM, follow.
    StopRequested {
        /// The loop to stop; `None`: the whole run.
        loop_name: Option<String>,
        /// Who asked (`dashboard`).
        by: String,
    },
    /// The loop's actor panicked and the daemon started it again; it goes on at its next
    /// iteration. Past the run's restart limit the loop fails instead (`loop_failed`).
    LoopRestarted {
        /// Loop name.
        loop_name: String,
        /// Restarts of this loop so far in the run, this one included (from 1).
        restarts: u32,
        /// The panic's message.
        reason: String,
    },
    /// A loop whose worker host was lost (or left) while it ran started again on another
    /// placement, from the last commit of its branch the head held and the iteration after
    /// the last one the head recorded as finished (its notes, counters and spend carried
    /// forward, as `run --resume` would): no second `loop_started`.
    LoopMoved {
        /// Loop name.
        loop_name: String,
        /// The host it was lost with.
        from_host: String,
        /// Where it runs now (a host's name, or `head`).
        to_host: String,
        /// Why it moved (its host was lost or left, and why).
        reason: String,
        /// The iteration it goes on with.
        iteration: u32,
        /// Its moves in this run so far, this one included (from 1).
        moves: u32,
    },
    /// The loop's actor is gone and was unregistered.
    LoopUnregistered {
        /// Loop name.
        loop_name: String,
    },
    /// A query was sent.
    QueryAsked {
        /// Query id (unique in the run).
        id: u64,
        /// Asking loop.
        from: Arc<str>,
        /// Target loop.
        to: Arc<str>,
        /// The question.
        question: Arc<str>,
    },
    /// A query was answered.
    QueryAnswered {
        /// Query id.
        id: u64,
        /// Asking loop.
        from: Arc<str>,
        /// Answering loop.
        to: Arc<str>,
        /// The reply.
        reply: String,
        /// What the answer's model calls spent: made by the answering loop, charged to the
        /// asking one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spend: Option<Spend>,
    },
    /// A query failed (unknown target, timeout, target stopped...).
    QueryFailed {
        /// Query id.
        id: u64,
        /// Asking loop.
        from: Arc<str>,
        /// Target loop.
        to: Arc<str>,
        /// Why.
        error: String,
        /// What the answer's model calls spent before it failed, charged to the asking loop.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spend: Option<Spend>,
    },
    /// Data was shared with one target (one event per target).
    Shared {
        /// Sender.
        from: String,
        /// Target.
        to: String,
        /// Kind of data.
        data_type: String,
        /// The data.
        data: Value,
        /// `None` when delivered, otherwise why not.
        error: Option<String>,
        /// Its delivery number for `to` (see [`crate::inbox::Delivered`]); absent in
        /// records older than delivery numbers and for a share refused before delivery.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delivery: Option<u64>,
    },
    /// An alert was broadcast.
    Alert {
        /// Sender (`taskdaemon` for system alerts).
        from: String,
        /// Event type.
        event_type: String,
        /// Message.
        message: String,
        /// Optional data sent with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
        /// Loops that received it, sorted.
        recipients: Vec<String>,
        /// Error when the alert was refused.
        error: Option<String>,
        /// Its delivery number for each recipient (see [`crate::inbox::Delivered`]); empty
        /// in records older than delivery numbers and for alerts recorded outside the
        /// coordinator (a merge queue's hand back, shown by count as those were).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        deliveries: BTreeMap<String, u64>,
    },
    /// A note carried into the loop's next iteration (what resume restores).
    ProgressNoted {
        /// Loop name.
        loop_name: String,
        /// The iteration that wrote it.
        iteration: u32,
        /// The note.
        note: String,
    },
    /// Inbox items were shown to a loop's model.
    InboxShown {
        /// Loop name.
        loop_name: String,
        /// How many items.
        items: usize,
        /// The delivery numbers of the items shown, as ascending inclusive ranges
        /// (`[[4, 6], [9, 9]]`): what a resumed or moved loop is not shown again. Items
        /// without a number (`items` less those in the ranges) count by the old rule: the
        /// first so many unnumbered items delivered.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deliveries: Vec<[u64; 2]>,
    },
    /// A loop ended with items in its inbox that its model never saw.
    InboxUnread {
        /// Loop name.
        loop_name: String,
        /// How many items.
        items: usize,
    },
    /// A model call of a loop failed and is tried again (its iteration's or one answering
    /// another loop's question).
    ModelRetried {
        /// Loop name.
        loop_name: String,
        /// The attempt that failed (1-based).
        attempt: u32,
        /// How long the provider waits before the next attempt, in milliseconds.
        wait_ms: u64,
        /// The HTTP status of the failed attempt; absent when the server did not answer
        /// (refused connection, timeout).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// Why it failed, as the server or the transport said it (redacted).
        #[serde(default)]
        cause: String,
    },
    /// Two running loops' work will conflict when merged: their worktrees, compared with
    /// `git merge-tree` (nothing checked out), change the same lines of these files. Both
    /// loops were told (a `conflict_predicted` system alert each); recorded once per new
    /// set of files for the pair.
    ConflictPredicted {
        /// The two loops, sorted.
        loops: Vec<String>,
        /// The conflicting paths, sorted.
        files: Vec<String>,
    },
    /// A loop's call in the heavy lane (build, test, validation) found every worker busy
    /// and waits in the lane's queue.
    HeavyQueued {
        /// Loop name.
        loop_name: String,
        /// The tool called.
        tool: String,
    },
    /// A call that had waited in the heavy lane's queue got a worker.
    HeavyStarted {
        /// Loop name.
        loop_name: String,
        /// The tool called.
        tool: String,
        /// How long it waited, in milliseconds.
        waited_ms: u64,
    },
    /// A loop's call in the heavy lane ended: how long it waited for a worker and how long
    /// it ran (what `summary.json`'s per-loop `heavy` adds up).
    HeavyEnded {
        /// Loop name.
        loop_name: String,
        /// The tool called.
        tool: String,
        /// How long it waited for a worker, in milliseconds.
        waited_ms: u64,
        /// How long it ran in its worker, in milliseconds (0 when it never started).
        ran_ms: u64,
        /// Its caller gave up before it ended (queued or running), so it did not finish.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cancelled: bool,
    },
    /// A file a loop had read changed underneath it; its stamp was dropped.
    FileChanged {
        /// Loop name.
        loop_name: String,
        /// Worktree-relative path.
        path: String,
    },
    /// A worker host joined the run's head (`taskdaemon host --join`): it proved the
    /// shared secret and the head took its name.
    HostJoined {
        /// The host's name.
        host: String,
        /// Where it connected from (`ip:port`).
        address: String,
        /// Loops it runs at once.
        slots: u32,
        /// Where it keeps its worktrees, on the host.
        workdir: String,
        /// Its taskdaemon version.
        version: String,
    },
    /// A joined host was lost: its connection closed, or it did not answer the head's
    /// heartbeat within `hosts.lost-after-ms`.
    HostLost {
        /// The host's name.
        host: String,
        /// Where it was connected from.
        address: String,
        /// Why, in words.
        reason: String,
    },
    /// A joined host left: its user stopped it, or the run ended.
    HostLeft {
        /// The host's name.
        host: String,
        /// Why, in words.
        reason: String,
    },
    /// A connection to the head did not become a host: it did not prove the shared secret,
    /// did not join in time, or asked for a name the head refused.
    HostRefused {
        /// Where it came from (`ip:port`).
        address: String,
        /// The name it asked for, when it got that far.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        /// Why, in words.
        reason: String,
    },
}

/// What seeding a loop's worktree did (see [`EventKind::WorktreeSeeded`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WarmSeed {
    /// The paths copied, relative to the repository root.
    pub paths: Vec<String>,
    /// What was not copied and why, one line each (paths the base has not, entries left
    /// out of a copied tree: the first ones by name).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Every entry left out of the copied trees (FIFOs, sockets, devices, too deep).
    pub skipped_entries: u64,
    /// Regular files copied.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Symlinks copied as symlinks (never followed).
    pub symlinks: u64,
    /// `reflink`, `copy`, `reflink+copy` or `none`.
    pub method: String,
    /// How long the copy took, in milliseconds.
    pub ms: u64,
}

/// A loop a run was started with (see [`EventKind::RunStarted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedLoop {
    /// Loop name.
    pub name: String,
    /// Loop type.
    pub loop_type: String,
}

/// The largest event number a record may hold and be continued from: 2^53 − 1, the largest
/// integer that every JSON reader (a JavaScript dashboard too) keeps exactly. A resumed run
/// refuses a record with a larger one rather than number events past what readers can tell
/// apart; from here, 2^64 − 2^53 events remain before the counter could wrap.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// Why an event log cannot be made as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventLogError {
    /// A record's last event number is past [`MAX_SEQ`], so its numbering cannot go on.
    #[error("event number {last_seq} is past the largest a run may reach ({MAX_SEQ})")]
    SeqPastMax {
        /// The record's last event number.
        last_seq: u64,
    },
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the run, from 1.
    pub seq: u64,
    /// When (written as RFC 3339 with milliseconds, UTC).
    pub time: EventTime,
    /// What.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// When an event happened. An event made here keeps the wall clock's value and is written
/// as text (RFC 3339 with milliseconds, UTC, as [`td_base::time::timestamp_at`]) only where
/// it is written: most events of a busy run are made on a loop's path (a query makes two),
/// and a text per event was an allocation there. An event read from a record keeps its text
/// as it was written.
#[derive(Debug, Clone)]
pub struct EventTime(When);

#[derive(Debug, Clone)]
enum When {
    At(std::time::SystemTime),
    Text(String),
}

impl EventTime {
    /// The wall clock now.
    pub fn now() -> Self {
        EventTime(When::At(std::time::SystemTime::now()))
    }

    /// The wall-clock time of `instant` (see [`td_base::time::wall_time_of`]): an event of
    /// something whose instant was read already costs no clock read.
    pub fn of(instant: std::time::Instant) -> Self {
        EventTime(When::At(td_base::time::wall_time_of(instant)))
    }

    /// The text the record has (or will have).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match &self.0 {
            When::At(at) => std::borrow::Cow::Owned(td_base::time::timestamp_at(*at)),
            When::Text(text) => std::borrow::Cow::Borrowed(text),
        }
    }
}

impl From<String> for EventTime {
    fn from(text: String) -> Self {
        EventTime(When::Text(text))
    }
}

impl From<&str> for EventTime {
    fn from(text: &str) -> Self {
        EventTime(When::Text(text.to_string()))
    }
}

/// Two times are equal when their texts are: what a record tells apart.
impl PartialEq for EventTime {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl std::fmt::Display for EventTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            When::At(at) => td_base::time::with_timestamp_at(*at, |text| f.write_str(text)),
            When::Text(text) => f.write_str(text),
        }
    }
}

impl Serialize for EventTime {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            When::At(at) => {
                td_base::time::with_timestamp_at(*at, |text| serializer.serialize_str(text))
            }
            When::Text(text) => serializer.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for EventTime {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(EventTime::from)
    }
}

type Listener = Box<dyn Fn(&Event) + Send + Sync>;

/// The run's event log: numbers events and hands them to its listeners.
#[derive(Default)]
pub struct EventLog {
    seq: AtomicU64,
    listeners: Mutex<Vec<Listener>>,
    memory: Option<Mutex<Vec<Event>>>,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl EventLog {
    /// A log that keeps no events itself (listeners do).
    pub fn new() -> Self {
        Self::default()
    }

    /// A log that also keeps every event in memory (tests, small runs).
    pub fn in_memory() -> Self {
        Self {
            memory: Some(Mutex::new(Vec::new())),
            ..Self::default()
        }
    }

    /// Adds a listener called with every later event, in order.
    pub fn subscribe(&self, listener: impl Fn(&Event) + Send + Sync + 'static) {
        lock(&self.listeners).push(Box::new(listener));
    }

    /// A log whose next event gets number `last_seq + 1` (a resumed run continues its
    /// numbering); an error when `last_seq` is past [`MAX_SEQ`].
    pub fn continuing_after(last_seq: u64) -> Result<Self, EventLogError> {
        if last_seq > MAX_SEQ {
            return Err(EventLogError::SeqPastMax { last_seq });
        }
        let log = Self::new();
        log.seq.store(last_seq, Ordering::SeqCst);
        Ok(log)
    }

    /// Records an event, dated now.
    pub fn record(&self, kind: EventKind) {
        self.record_dated(kind, EventTime::now());
    }

    /// Records an event of something that happened at `instant` (read already: no clock
    /// read for the date).
    pub fn record_at(&self, kind: EventKind, instant: std::time::Instant) {
        self.record_dated(kind, EventTime::of(instant));
    }

    fn record_dated(&self, kind: EventKind, time: EventTime) {
        // Numbering and delivery happen under one lock so listeners see events in seq order.
        let listeners = lock(&self.listeners);
        // Never wraps: a log starts at most at MAX_SEQ, and 2^64 − 2^53 events are out of
        // reach; should the counter still run out, the last number repeats.
        let seq = self.seq.load(Ordering::SeqCst).saturating_add(1);
        self.seq.store(seq, Ordering::SeqCst);
        let event = Event { seq, time, kind };
        for l in listeners.iter() {
            l(&event);
        }
        if let Some(m) = &self.memory {
            lock(m).push(event);
        }
    }

    /// Events kept in memory (empty unless built with `in_memory`).
    pub fn events(&self) -> Vec<Event> {
        self.memory
            .as_ref()
            .map(|m| lock(m).clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn numbering_goes_on_after_a_resumed_log_and_refuses_what_cannot_go_on() {
        let log = EventLog::continuing_after(MAX_SEQ - 1).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        log.subscribe(move |e| lock(&s).push(e.seq));
        log.record(EventKind::LoopStopped {
            loop_name: "a".into(),
        });
        assert_eq!(*lock(&seen), vec![MAX_SEQ]);
        for past in [MAX_SEQ + 1, u64::MAX] {
            let e = EventLog::continuing_after(past).unwrap_err();
            assert_eq!(e, EventLogError::SeqPastMax { last_seq: past });
            assert_eq!(
                e.to_string(),
                format!("event number {past} is past the largest a run may reach ({MAX_SEQ})")
            );
        }
        // The counter itself never wraps, whatever it holds.
        let log = EventLog::new();
        log.seq.store(u64::MAX, Ordering::SeqCst);
        log.record(EventKind::LoopStopped {
            loop_name: "a".into(),
        });
        assert_eq!(log.seq.load(Ordering::SeqCst), u64::MAX);
    }

    #[test]
    fn a_loop_restart_has_a_stable_wire_form() {
        let line = r#"{"seq":4,"time":"t","event":"loop_restarted","loop_name":"a","restarts":1,"reason":"panicked: bug"}"#;
        let event: Event = serde_json::from_str(line).unwrap();
        assert_eq!(
            event.kind,
            EventKind::LoopRestarted {
                loop_name: "a".into(),
                restarts: 1,
                reason: "panicked: bug".into(),
            }
        );
        assert_eq!(serde_json::to_string(&event).unwrap(), line);
    }

    #[test]
    fn a_stop_request_has_a_stable_wire_form() {
        let log = EventLog::in_memory();
        log.record(EventKind::StopRequested {
            loop_name: Some("a".into()),
            by: "dashboard".into(),
        });
        log.record(EventKind::StopRequested {
            loop_name: None,
            by: "dashboard".into(),
        });
        let lines: Vec<Value> = log
            .events()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        assert_eq!(lines[0]["event"], "stop_requested");
        assert_eq!(lines[0]["loop_name"], "a");
        assert_eq!(lines[0]["by"], "dashboard");
        assert_eq!(lines[1]["loop_name"], Value::Null);
        let back: Event = serde_json::from_value(lines[1].clone()).unwrap();
        assert_eq!(back.kind, log.events()[1].kind);
    }

    #[test]
    fn heavy_lane_events_have_a_stable_wire_form() {
        let line = r#"{"seq":9,"time":"t","event":"heavy_ended","loop_name":"a","tool":"build","waited_ms":1200,"ran_ms":3400}"#;
        let event: Event = serde_json::from_str(line).unwrap();
        assert_eq!(
            event.kind,
            EventKind::HeavyEnded {
                loop_name: "a".into(),
                tool: "build".into(),
                waited_ms: 1200,
                ran_ms: 3400,
                cancelled: false,
            }
        );
        assert_eq!(serde_json::to_string(&event).unwrap(), line);
        let cancelled = r#"{"seq":9,"time":"t","event":"heavy_ended","loop_name":"a","tool":"test","waited_ms":5,"ran_ms":0,"cancelled":true}"#;
        let event: Event = serde_json::from_str(cancelled).unwrap();
        assert_eq!(serde_json::to_string(&event).unwrap(), cancelled);
        let queued =
            r#"{"seq":3,"time":"t","event":"heavy_queued","loop_name":"a","tool":"validate"}"#;
        let event: Event = serde_json::from_str(queued).unwrap();
        assert_eq!(serde_json::to_string(&event).unwrap(), queued);
        let started = r#"{"seq":4,"time":"t","event":"heavy_started","loop_name":"a","tool":"validate","waited_ms":7}"#;
        let event: Event = serde_json::from_str(started).unwrap();
        assert_eq!(serde_json::to_string(&event).unwrap(), started);
    }

    #[test]
    fn a_loop_started_names_its_host_only_when_it_runs_on_one() {
        let on_head =
            r#"{"seq":1,"time":"t","event":"loop_started","loop_name":"a","loop_type":"code"}"#;
        let event: Event = serde_json::from_str(on_head).unwrap();
        assert!(matches!(
            &event.kind,
            EventKind::LoopStarted { host: None, .. }
        ));
        assert_eq!(serde_json::to_string(&event).unwrap(), on_head);
        let on_host = r#"{"seq":2,"time":"t","event":"loop_started","loop_name":"b","loop_type":"code","host":"h1"}"#;
        let event: Event = serde_json::from_str(on_host).unwrap();
        assert!(matches!(&event.kind, EventKind::LoopStarted { host: Some(h), .. } if h == "h1"));
        assert_eq!(serde_json::to_string(&event).unwrap(), on_host);
    }

    #[test]
    fn host_events_have_a_stable_wire_form() {
        for line in [
            r#"{"seq":2,"time":"t","event":"host_joined","host":"b1","address":"10.0.0.2:4100","slots":2,"workdir":"/w","version":"0.1.0"}"#,
            r#"{"seq":3,"time":"t","event":"host_lost","host":"b1","address":"10.0.0.2:4100","reason":"its connection closed"}"#,
            r#"{"seq":4,"time":"t","event":"host_left","host":"b1","reason":"the run ended"}"#,
            r#"{"seq":5,"time":"t","event":"host_refused","address":"10.0.0.3:4100","reason":"it did not prove the shared secret"}"#,
            r#"{"seq":6,"time":"t","event":"host_refused","address":"10.0.0.3:4100","host":"b1","reason":"already joined"}"#,
        ] {
            let event: Event = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&event).unwrap(), line);
        }
    }

    #[test]
    fn a_model_retry_reads_without_its_optional_fields() {
        let event: Event = serde_json::from_str(
            r#"{"seq":3,"time":"t","event":"model_retried","loop_name":"a","attempt":2,"wait_ms":40}"#,
        )
        .unwrap();
        assert_eq!(
            event.kind,
            EventKind::ModelRetried {
                loop_name: "a".into(),
                attempt: 2,
                wait_ms: 40,
                status: None,
                cause: String::new(),
            }
        );
        let json = serde_json::to_value(&event).unwrap();
        assert!(json.get("status").is_none(), "{json}");
    }

    #[test]
    fn events_are_numbered_and_delivered_in_order() {
        let log = EventLog::in_memory();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        log.subscribe(move |e| lock(&s).push(e.seq));
        for name in ["a", "b"] {
            log.record(EventKind::LoopStopped {
                loop_name: name.into(),
            });
        }
        assert_eq!(*lock(&seen), vec![1, 2]);
        let events = log.events();
        assert_eq!(events.len(), 2);
        let json = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(json["event"], "loop_stopped");
        assert_eq!(json["loop_name"], "a");
    }
}
