//! The head's side of the loops that run on worker hosts: it starts each one on its host
//! ([`ToHost::StartLoop`]), answers what the host asks about it, and hands its end to the
//! run as a local loop's end is handed over.
//!
//! What a host asks ([`FromHost`]), and what the head does:
//! - the base commit: a bundle of it without what the host's mirror has
//!   (`td_git::transfer::bundle_commits`), fetched in chunks below the frame cap;
//! - model calls: the host has no keys; the head calls its own client, with the loop's
//!   tools as the head knows them (a host cannot add tools), after reserving the call in the
//!   loop's account (its budget and the run's) exactly as a local call is, and settles it
//!   with the usage; a call that does not fit is answered `OverBudget` (the loop pauses);
//! - records: events (re-numbered into the run's event log), transcript entries and receipts
//!   (chained here with the run's key, which never leaves the head), each checked to be this
//!   loop's, appended to the same files a local loop's go to; batches are numbered so that a
//!   retried batch is not appended twice;
//! - coordination: the host's runtime forwards its loops' registrations, queries, shares,
//!   alerts and listings ([`FromHost::Coord`]); the head's coordinator knows each such loop
//!   as a remote loop ([`HostLink`]: deliveries and questions go back as
//!   [`ToHost::Deliver`] and [`ToHost::Answer`]) and routes, limits and records everything
//!   as for its own loops; a lost host's loops leave it at once with the reason;
//! - its work after each failed iteration ([`FromHost::Checkpoint`]): the commits since the
//!   last tip the head took, taken as its end's are and the loop's head worktree moved
//!   there, so that the head always holds the work of the iterations it recorded finished;
//! - its end: the branch bundle (from the last tip the head took), taken into a ref of its
//!   own (`take_branch`: one head, descending from that tip, nothing else), then the loop's
//!   head worktree is moved to it, so that `finish_loop` and the merge queue go on as for a
//!   local loop. A bundle that is refused leaves the repository as it was and the loop
//!   failed with the reason.
//!
//! Every request carries the attempt id of the loop's placement ([`StartLoop::attempt`]):
//! one that is not the loop's current placement is refused before anything is done, so a
//! host cut off while its loop moved elsewhere (or joined again since) cannot write into
//! the moved loop's record, charge its budget, or answer and register as it. When a host
//! is lost or leaves, its loops come out as [`RemoteEnd`]s with [`RemoteEnd::lost`] set:
//! the run moves them elsewhere (`run/hosts/moves.rs`) or ends them interrupted.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::base_lfs::BaseLfs;
use super::model_wire::Incoming;
use td_base::sync::lock;
use td_cluster::protocol::{
    BranchBundle, CompleteAnswer, CoordRequest, FromHost, RawJson, StartLoop, ToHost,
};
use td_cluster::{HostAsker, HostRequest};
use td_engine::LoopEnd;
use td_engine::budget::Budgets;
use td_engine::transcript::{TranscriptEntry, TranscriptSink};
use td_git::transfer::lfs::{LfsIntake, LfsPointer, LfsReceived};
use td_git::worktree::{Repo, Worktree};
use td_llm::{LlmClient, LlmError, LlmRequest, Purpose};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_protocol::spend::Spend;

use super::EventAbout;
use td_protocol::tool_definition::ToolDefinition;
use td_runtime::coordinator::{CoordMsg, CoordinatorPort, SYSTEM_SENDER};
use td_runtime::coordinator_handle::CoordinatorHandle;
use td_runtime::remote_loop::{REMOTE_DELIVERY_TIMEOUT, RemoteLoop};
use td_runtime::upstream::QUERY_GRACE;
use td_toolkit::coordination::Coordination;
use td_toolkit::error::ToolError;
use td_toolkit::receipts::Receipt;

use crate::run::hosts::branch_budget::BranchBudgets;
use crate::run::hosts::shown::HostInbox;
use crate::run::record::RunRecord;

/// The largest branch bundle a host may send back for one loop, and the most bytes of
/// bundles (checkpoints and ends) its hosts may send for it over the run, all its
/// placements together (`run/hosts/branch_budget.rs`).
pub const MAX_BRANCH_BYTES: u64 = 512 * 1024 * 1024;

/// How long a host may take to accept a loop (its checks, not its setup).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stop request may take to reach a host's loop.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a loop stopped at once (a second Ctrl-C) may take to end on its host before the
/// head takes it for stopped without its host's word (and without its last work).
const STOP_NOW_GRACE: Duration = Duration::from_secs(15);

/// A remote loop's end, for the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteEnd {
    /// The loop.
    pub name: String,
    /// How it ended (failed with the reason when its work could not be taken; stopped,
    /// interrupted, when its host was lost).
    pub end: LoopEnd,
    /// Set when it did not end but its host was lost or left: the run may start it again
    /// elsewhere from the work and records the head holds (else `end` stands).
    pub lost: Option<Lost>,
}

/// A loop taken back from its host.
#[derive(Debug, Clone, PartialEq)]
pub struct Lost {
    /// The host.
    pub host: String,
    /// Why, in words ("its host h1 was lost: no answer to the head's heartbeat...").
    pub reason: String,
    /// Whether the head announced its start to the run's loops (it is not announced again
    /// where it goes on).
    pub announced: bool,
}

/// What the head needs to serve its hosts' loops.
pub struct HeadSide {
    /// The run's model client.
    pub llm: Arc<dyn LlmClient>,
    /// The run's budgets.
    pub budgets: Arc<Budgets>,
    /// The run's events.
    pub events: Arc<EventLog>,
    /// The run's record (receipts).
    pub record: Arc<RunRecord>,
    /// Where transcripts go (the progress display, which writes the record's).
    pub transcript: Arc<dyn TranscriptSink>,
    /// The run's repository.
    pub repo: Repo,
    /// Where bundles are kept while they travel (in the run directory).
    pub dir: PathBuf,
    /// The run's coordinator.
    pub coordinator: ractor::ActorRef<CoordMsg>,
    /// The most bytes of records one placement of a loop may send (`hosts.max-record-bytes`):
    /// past it its next batch is refused, and its host stops it saying why, so that a host
    /// cannot fill the head's disk.
    pub max_record_bytes: u64,
    /// The commit whose `.gitattributes` the hosts' own git reads (the run's, trusted on the
    /// head: `td_git::attributes::trust`); `None` for none.
    pub attributes_from: Option<String>,
}

/// The longest a lost host's loops wait, before they are handed to the run, for a records
/// batch of theirs claimed before the loss to be appended.
const RECORDS_SETTLE: Duration = Duration::from_secs(5);

/// The longest a lost host's loops wait, before they are handed to the run, for the shares
/// and alerts delivered to them to be recorded (each delivery is bounded by
/// [`REMOTE_DELIVERY_TIMEOUT`]).
const DELIVERIES_SETTLE: Duration = REMOTE_DELIVERY_TIMEOUT.saturating_add(Duration::from_secs(5));

/// The longest a lost host's loops wait, before they are handed to the run, for a checkpoint
/// of theirs being taken (a bundle of up to [`MAX_BRANCH_BYTES`] indexed and checked):
/// past it the checkpoint is given up and the loop moves from its last one.
const CHECKPOINT_SETTLE: Duration = Duration::from_secs(60);

/// The longest a host's loop may wait for an answer (its own timeout is shorter).
const MAX_QUERY_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most bytes of a host loop's answer that reach the asker (the coordinator's default
/// payload limit): a longer one keeps its head and tail, with a note of what was left out.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// The questions the head has put to loops on hosts and not yet had answered: (the loop
/// asked, the asking loop, the question), and where each such query outstanding counts what
/// its answer spends (oldest first). Only while one is, a model call of the loop for that
/// answer is charged to the asker, and its spend is counted to the oldest of them (the
/// same question asked twice at once cannot tell its calls apart: each call is counted
/// once, never twice). When the last of them stops waiting, the answer's model call in
/// flight on the head is given up, as a local answer's is dropped at its asker's timeout.
type Outstanding = Arc<Mutex<BTreeMap<(String, String, String), Pending>>>;

/// The askers of one question outstanding.
struct Pending {
    /// Where each asker's query counts its answer's spend, oldest first.
    askers: Vec<Arc<Mutex<Spend>>>,
    /// Dropped with the entry, when the last asker stops waiting: a model call subscribed
    /// to it sees it closed and gives up.
    waiting: tokio::sync::watch::Sender<()>,
    /// Model calls its host made for the answer, charged to the askers: at most
    /// [`td_engine::MAX_ANSWER_TURNS`] an asker, as a local answer makes (the host names
    /// the question, and could otherwise charge an asker any number of calls).
    calls: u32,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            askers: Vec::new(),
            waiting: tokio::sync::watch::Sender::new(()),
            calls: 0,
        }
    }
}

/// One question outstanding in [`Outstanding`], for as long as this lives (an answer, an
/// error, or the asker's future dropped).
struct Asking {
    outstanding: Outstanding,
    key: (String, String, String),
    spent: Arc<Mutex<Spend>>,
}

impl Asking {
    fn new(
        outstanding: &Outstanding,
        key: (String, String, String),
        spent: &Arc<Mutex<Spend>>,
    ) -> Asking {
        lock(outstanding)
            .entry(key.clone())
            .or_default()
            .askers
            .push(spent.clone());
        Asking {
            outstanding: outstanding.clone(),
            key,
            spent: spent.clone(),
        }
    }
}

impl Drop for Asking {
    fn drop(&mut self) {
        let mut map = lock(&self.outstanding);
        if let Some(pending) = map.get_mut(&self.key) {
            pending.askers.retain(|s| !Arc::ptr_eq(s, &self.spent));
            if pending.askers.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

/// A loop on a host, as the head's coordinator reaches it.
struct HostLink {
    asker: HostAsker,
    host: String,
    name: String,
    outstanding: Outstanding,
    /// Its inbox as the head knows it ([`Entry::inbox`]).
    inbox: Arc<Mutex<HostInbox>>,
}

#[async_trait::async_trait]
impl RemoteLoop for HostLink {
    async fn deliver(&self, delivery: u64, item: Arc<InboxItem>) -> bool {
        let Ok(item) = serde_json::to_value(&*item) else {
            return false;
        };
        let request = ToHost::Deliver {
            loop_name: self.name.clone(),
            item,
            delivery: Some(delivery),
        };
        // Counted as sent before it goes: the loop may show it before its host answers.
        lock(&self.inbox).sent(delivery);
        self.asker
            .ask::<bool>(&self.host, &request, REMOTE_DELIVERY_TIMEOUT)
            .await
            .unwrap_or(false)
    }

    async fn answer(
        &self,
        from: &str,
        question: &str,
        timeout: Duration,
        spent: &Arc<Mutex<Spend>>,
    ) -> Result<String, ToolError> {
        // The head makes this answer's model calls (`RemoteLoops::complete`), and counts
        // each one's spend into `spent` while this question is outstanding.
        let _asking = Asking::new(
            &self.outstanding,
            (self.name.clone(), from.to_string(), question.to_string()),
            spent,
        );
        let request = ToHost::Answer {
            loop_name: self.name.clone(),
            from: from.to_string(),
            question: question.to_string(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let asked = self
            .asker
            .ask::<String>(&self.host, &request, timeout.saturating_add(QUERY_GRACE))
            .await;
        // A host's answer is text the head did not see made: held to the cap.
        asked
            .map(|text| td_base::text::head_tail(&text, MAX_ANSWER_BYTES))
            .map_err(|e| ToolError::Unavailable {
            message: match e {
                // The loop's own words (it ended, it timed out...).
                td_cluster::wire::AskError::Refused(why) => why,
                // The session to its host closed under the question: the host is lost.
                td_cluster::wire::AskError::Gone(why) => format!(
                    "loop {}'s host {} was lost or cut off while it answered ({why}); ask again later or ask another loop",
                    self.name, self.host
                ),
                other => format!("loop {} on host {}: {other}", self.name, self.host),
            },
        })
    }
}

/// What a remote loop's model calls are offered, by purpose (the head calls the model
/// with its own copy: a host's request carries no tool definitions).
#[derive(Clone)]
struct ModelTools {
    /// An iteration's: the loop's tools.
    iteration: Arc<[ToolDefinition]>,
    /// An answer's: only those an answer may use, as for a loop of the head's.
    answer: Arc<[ToolDefinition]>,
}

impl ModelTools {
    fn for_purpose(&self, purpose: &Purpose) -> Arc<[ToolDefinition]> {
        match purpose {
            Purpose::Iteration => self.iteration.clone(),
            Purpose::QueryAnswer { .. } => self.answer.clone(),
        }
    }
}

/// One loop on a host.
struct Entry {
    host: String,
    /// Its placement: requests of another attempt are refused.
    attempt: u64,
    /// The last commit of its branch the head holds (its base, then each checkpoint's tip):
    /// the host's next bundle is made from it.
    base: String,
    worktree: Arc<Worktree>,
    tools: ModelTools,
    /// The last batch of records appended.
    batch: u64,
    /// Bytes of records (events, transcript entries, receipts, as sent) taken of it in
    /// this placement: at most [`HeadSide::max_record_bytes`].
    record_bytes: u64,
    /// Iterations it started (from its events).
    iterations: u32,
    /// Bytes of its branch bundle received so far.
    branch_bytes: u64,
    /// The last iteration whose checkpoint was taken: a host sends one per iteration, in
    /// order, for an iteration the head saw start.
    checkpointed: u32,
    /// Its inbox in this placement (its first inbox included), as the head knows it: what
    /// its `inbox_shown` events may say it showed.
    inbox: Arc<Mutex<HostInbox>>,
    /// Model calls its host asked of the head in this placement: what its
    /// `iteration_ended` events may say an iteration made at most.
    requests: u32,
    /// Lines written on stderr for events its host may not send ([`left_out_line`]).
    left_out_lines: u32,
    /// Set when the run asks its host to stop it: the head gives up the loop's iteration
    /// call in flight then, as a head loop's engine does (an answer's calls go on: its
    /// asker still waits, as for a head loop stopping). Dropped with the entry (the loop
    /// placed again), which gives up every call of this placement.
    stopping: tokio::sync::watch::Sender<bool>,
    /// Its host's answer to its start: `None` until it came, then whether it took the loop.
    /// A stop goes to the host only once it took the loop: it answers a stop of a loop it
    /// does not know (yet) with "no loop runs here", and that stop would be lost.
    accepted: tokio::sync::watch::Sender<Option<bool>>,
    /// A run limit its iterations passed: its next model call is refused with it.
    over: Option<String>,
    /// Why its records can no longer be appended: every later batch is refused with it
    /// (the host then stops the loop), so that no batch is taken twice or half.
    broken: Option<String>,
    /// Its end was handed to the run (or its host was lost).
    done: bool,
    /// The first line of its task (for the alert that it started).
    task_line: String,
    /// A records batch of it is being taken (claimed before any work).
    taking: bool,
    /// Its base bundle is being made (claimed before any work): a host asks once, and
    /// again only after a timeout; more at once would each start git on the head and
    /// write the same file.
    preparing: bool,
    /// Its end is being taken (claimed before any work): a second `Ended` is not.
    ending: bool,
    /// Its host was lost while a checkpoint of it was taken, and the move stopped waiting
    /// for it ([`CHECKPOINT_SETTLE`]): that checkpoint lands no more.
    abandoned: bool,
    /// A checkpoint of it is landing: its bundle was taken and checked, and its worktree on
    /// the head is being fast-forwarded to it. Claimed under the same lock as `abandoned`,
    /// so that a checkpoint either lands whole before its loop moves (the move waits for
    /// it) or not at all; never after the move read the worktree.
    landing: bool,
    /// Model calls of its current iteration the head settled.
    calls: u32,
    /// Model calls of its answers the head settled.
    answer_calls: u32,
    /// Its start was announced to the run's loops (by the head: a host's system alerts are
    /// refused), now or by an earlier process.
    announced: bool,
}

/// The loops running on hosts.
pub struct RemoteLoops {
    side: HeadSide,
    loops: Mutex<BTreeMap<String, Entry>>,
    ends: mpsc::UnboundedSender<RemoteEnd>,
    asker: OnceLock<HostAsker>,
    /// The questions put to these loops and not yet answered.
    outstanding: Outstanding,
    /// The last attempt id given to a placement.
    attempts: AtomicU64,
    /// Per loop, held while a checkpoint of it is taken into the repository: a lost host's
    /// loops are handed to the run only after theirs, so that a move starts from the commit
    /// taken (a loop's lock holds up only its own move, not other hosts' loops).
    taking_branch: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The bundle bytes each loop's hosts sent, over all its placements.
    sent: Arc<BranchBudgets>,
    /// The LFS objects of loops' bases, which hosts fetch, and the reads of every chunk
    /// hosts fetch.
    base_lfs: BaseLfs,
}

/// How the head starts a loop on a host.
pub struct Placed {
    /// The host.
    pub host: String,
    /// What the host is sent.
    pub start: StartLoop,
    /// The loop's worktree on the head (its branch is the loop's record of its work).
    pub worktree: Arc<Worktree>,
    /// The tools its model sees, as the head defines them.
    pub tools: Arc<[ToolDefinition]>,
    /// The tools an answer of it may use (the read-only lane tools under the run's catalog,
    /// as its host's answerer allows): all an answer's model call is offered.
    pub answer_tools: Arc<[ToolDefinition]>,
    /// For a loop taken back from a lost host, its `loop_moved` event: recorded when the
    /// host accepts it; a host that refuses it (or does not answer) is then taken as a loss
    /// of it, and the run moves it again (within `moves::MAX_MOVES`) instead of failing it.
    pub moved: Option<EventKind>,
}

/// How many lines a loop's host may cause on the head's stderr with events it may not send
/// (one a batch); past it they are left out without one (a host must not fill the
/// terminal of the head's user).
const LEFT_OUT_LINES: u32 = 10;

/// An event kind a host sent, as the head's stderr shows it: its first 60 characters,
/// escaped (no control character or escape sequence of a host reaches the terminal).
fn shown_kind(kind: &str) -> String {
    let head: String = kind.chars().take(60).collect();
    head.escape_debug().to_string()
}

/// How many kinds of such events one line names (the rest are counted).
const LEFT_OUT_KINDS: usize = 8;

/// The stderr line saying which events of loop `name` its host sent that only the head
/// records (each kind, and how many) were left out of a batch; `None` once `said` lines
/// were written for the loop.
fn left_out_line(name: &str, left_out: &BTreeMap<String, usize>, said: u32) -> Option<String> {
    if said >= LEFT_OUT_LINES {
        return None;
    }
    let mut kinds: Vec<String> = left_out
        .iter()
        .take(LEFT_OUT_KINDS)
        .map(|(kind, n)| match n {
            1 => format!("`{kind}`"),
            n => format!("`{kind}` ×{n}"),
        })
        .collect();
    if left_out.len() > LEFT_OUT_KINDS {
        kinds.push(format!(
            "and {} other kinds",
            left_out.len() - LEFT_OUT_KINDS
        ));
    }
    let last = if said + 1 == LEFT_OUT_LINES {
        "; further such events of this loop are left out without a line"
    } else {
        ""
    };
    Some(format!(
        "taskdaemon: loop {name}: its host sent {} event(s) which only the head records; left out{last}",
        kinds.join(", ")
    ))
}

/// The events a loop's engine and runtime record on a host, and its worktree's seeding there
/// (`worktree_seeded`: the worktree is the host's), the only ones the head takes from one:
/// what the head decides about a loop (blocked, merged, handed back, stopped by a request)
/// and the coordinator's events are the head's to record.
const HOST_EVENTS: &[&str] = &[
    "loop_started",
    "iteration_started",
    "iteration_ended",
    "loop_completed",
    "loop_failed",
    "loop_paused",
    "loop_stopped",
    "loop_restarted",
    "loop_unregistered",
    "progress_noted",
    "inbox_shown",
    "inbox_unread",
    "model_retried",
    "heavy_queued",
    "heavy_started",
    "heavy_ended",
    "file_changed",
    "worktree_seeded",
];

impl RemoteLoops {
    /// The head's side, and where remote loops' ends come out.
    pub fn new(side: HeadSide) -> (Arc<RemoteLoops>, mpsc::UnboundedReceiver<RemoteEnd>) {
        // Parts of LFS objects hosts were sending to an earlier process of this run.
        td_git::transfer::lfs::sweep_parts(&side.dir);
        let (ends, rx) = mpsc::unbounded_channel();
        (
            Arc::new(RemoteLoops {
                side,
                loops: Mutex::new(BTreeMap::new()),
                ends,
                asker: OnceLock::new(),
                outstanding: Arc::new(Mutex::new(BTreeMap::new())),
                attempts: AtomicU64::new(0),
                taking_branch: Mutex::new(BTreeMap::new()),
                sent: Arc::new(BranchBudgets::new(MAX_BRANCH_BYTES)),
                base_lfs: BaseLfs::default(),
            }),
            rx,
        )
    }

    /// Gives the handle that asks hosts (once the head listens).
    pub fn set_asker(&self, asker: HostAsker) {
        let _ = self.asker.set(asker);
    }

    fn asker(&self) -> Result<&HostAsker, String> {
        self.asker
            .get()
            .ok_or_else(|| "the head does not listen for hosts".to_string())
    }

    /// The loops running on each host.
    pub fn running(&self) -> BTreeMap<String, String> {
        lock(&self.loops)
            .iter()
            .filter(|(_, e)| !e.done)
            .map(|(n, e)| (n.clone(), e.host.clone()))
            .collect()
    }

    /// Starts `placed` on its host, without waiting for the host to accept it (a host that
    /// does not answer must not hold the run's other loops for [`START_TIMEOUT`]): a host
    /// that refuses it or does not answer ends it, failed with why, as its host's end would.
    pub fn start(self: &Arc<Self>, mut placed: Placed) -> Result<(), String> {
        let name = placed.start.loop_name.clone();
        let host = placed.host.clone();
        let asker = self.asker()?.clone();
        // A fresh attempt for each placement: what an earlier one sends is refused.
        let attempt = self
            .attempts
            .fetch_add(1, Ordering::SeqCst)
            .saturating_add(1);
        placed.start.attempt = attempt;
        placed.start.attributes_from = self.side.attributes_from.clone();
        lock(&self.loops).insert(
            name.clone(),
            Entry {
                host: host.clone(),
                attempt,
                base: placed.start.base_commit.clone(),
                worktree: placed.worktree,
                tools: ModelTools {
                    iteration: placed.tools,
                    answer: placed.answer_tools,
                },
                batch: 0,
                record_bytes: 0,
                iterations: placed.start.first_iteration.saturating_sub(1),
                branch_bytes: 0,
                checkpointed: placed.start.first_iteration.saturating_sub(1),
                inbox: Arc::new(Mutex::new(HostInbox::new(&first_inbox(
                    &placed.start.initial_inbox,
                )))),
                requests: 0,
                stopping: tokio::sync::watch::Sender::new(false),
                accepted: tokio::sync::watch::Sender::new(None),
                left_out_lines: 0,
                over: None,
                broken: None,
                done: false,
                taking: false,
                preparing: false,
                ending: false,
                abandoned: false,
                landing: false,
                calls: 0,
                answer_calls: 0,
                task_line: placed.start.task.lines().next().unwrap_or("").to_string(),
                announced: placed.start.announced,
            },
        );
        let _ = std::fs::remove_file(self.branch_file(&name));
        let me = self.clone();
        let moved = placed.moved;
        tokio::spawn(async move {
            let asked = asker
                .ask::<()>(
                    &host,
                    &ToHost::StartLoop(Box::new(placed.start)),
                    START_TIMEOUT,
                )
                .await;
            if let Some(entry) = lock(&me.loops).get(&name).filter(|e| e.attempt == attempt) {
                entry.accepted.send_replace(Some(asked.is_ok()));
            }
            let e = match asked {
                Ok(()) => {
                    if let Some(event) = moved {
                        me.side.events.record(event);
                    }
                    return;
                }
                Err(e) => e,
            };
            let mut loops = lock(&me.loops);
            if let Some(entry) = loops.get_mut(&name)
                && !entry.done
                && entry.attempt == attempt
            {
                entry.done = true;
                let why = format!("host {host} did not start it: {e}");
                // A moved loop goes on elsewhere as after a loss; a new one fails.
                let (end, lost) = match moved {
                    Some(_) => (
                        LoopEnd::Stopped {
                            iterations: entry.iterations,
                            reason: Some(format!("interrupted: {why}")),
                        },
                        Some(Lost {
                            host: host.clone(),
                            reason: why,
                            announced: entry.announced,
                        }),
                    ),
                    None => (
                        LoopEnd::Failed {
                            iterations: entry.iterations,
                            reason: why,
                        },
                        None,
                    ),
                };
                let _ = me.ends.send(RemoteEnd { name, end, lost });
            }
        });
        Ok(())
    }

    /// Asks the host of loop `name` to stop it (at once: `now`); a host that does not
    /// answer is lost soon, and its loops with it. A loop stopped at once that has not ended
    /// within [`STOP_NOW_GRACE`] is taken for stopped, so that a host that answers its
    /// heartbeats but not for its loop cannot keep the run from ending.
    pub fn stop(self: &Arc<Self>, name: &str, now: bool) {
        let Some((host, attempt, mut accepted)) = lock(&self.loops)
            .get(name)
            .filter(|e| !e.done)
            .map(|e| (e.host.clone(), e.attempt, e.accepted.subscribe()))
        else {
            return;
        };
        let Ok(asker) = self.asker().cloned() else {
            return;
        };
        let request = ToHost::StopLoop {
            loop_name: name.to_string(),
            now,
        };
        let name = name.to_string();
        {
            let (me, host, name) = (self.clone(), host.clone(), name.clone());
            tokio::spawn(async move {
                // Not before its host took the loop (a refused start ends it without a
                // stop); closed: the entry went (the loop placed again, or its host lost).
                match accepted.wait_for(Option::is_some).await.map(|a| *a) {
                    Ok(Some(true)) => {}
                    _ => return,
                }
                let taken = asker.ask::<()>(&host, &request, STOP_TIMEOUT).await;
                // Its iteration's model call in flight here is given up once its host took
                // the stop (a host told before then would take the give-up for a model
                // error).
                if taken.is_ok()
                    && let Some(entry) = lock(&me.loops).get(&name).filter(|e| e.attempt == attempt)
                {
                    entry.stopping.send_replace(true);
                }
            });
        }
        if !now {
            return;
        }
        // The grace runs from the stop, whether or not its host has answered the start yet.
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(STOP_NOW_GRACE).await;
            let why = format!(
                "its host {host} did not stop it within {} s of the stop",
                STOP_NOW_GRACE.as_secs()
            );
            let taken = {
                let mut loops = lock(&me.loops);
                match loops.get_mut(&name) {
                    // Not a later placement of it, which this stop did not ask.
                    Some(entry) if !entry.done && entry.attempt == attempt => {
                        entry.done = true;
                        let _ = me.ends.send(RemoteEnd {
                            name: name.clone(),
                            end: LoopEnd::Stopped {
                                iterations: entry.iterations,
                                reason: Some(format!(
                                    "{why}; what it did since its last records is not in the run"
                                )),
                            },
                            lost: None,
                        });
                        true
                    }
                    _ => false,
                }
            };
            if taken {
                // It leaves the coordinator as a lost host's loop does: questions waiting on
                // it fail now, with why.
                CoordinatorHandle::new(me.side.coordinator.clone())
                    .drop_remote(&name, &why)
                    .await;
            }
        });
    }

    /// Whether loop `name` runs on a host.
    pub fn is_remote(&self, name: &str) -> bool {
        lock(&self.loops).get(name).is_some_and(|e| !e.done)
    }

    /// Host `host` is gone (`how`: "was lost", "left"): its loops leave the coordinator at
    /// once (questions waiting on them fail with why) and come out as ends with
    /// [`RemoteEnd::lost`] set, after any checkpoint being taken: the run moves them
    /// elsewhere from the work and records the head holds, or ends them interrupted.
    pub fn host_gone(self: &Arc<Self>, host: &str, how: &str, reason: &str) {
        let why = format!("its host {host} {how}: {reason}");
        let mut gone = Vec::new();
        let mut attempts = Vec::new();
        {
            let mut loops = lock(&self.loops);
            for (name, entry) in loops.iter_mut() {
                // A loop whose end the head has (its Ended claimed, its branch whole) is
                // taken as it ended: its work is here, whatever became of its host since.
                if entry.host != host || entry.done || entry.ending {
                    continue;
                }
                entry.done = true;
                attempts.push(entry.attempt);
                gone.push(RemoteEnd {
                    name: name.clone(),
                    end: LoopEnd::Stopped {
                        iterations: entry.iterations,
                        reason: Some(format!(
                            "interrupted: its host {host} {how} ({reason}); `run --resume` runs it again"
                        )),
                    },
                    lost: Some(Lost {
                        host: host.to_string(),
                        reason: why.clone(),
                        announced: entry.announced,
                    }),
                });
            }
        }
        if gone.is_empty() {
            return;
        }
        let handle = CoordinatorHandle::new(self.side.coordinator.clone());
        let ends = self.ends.clone();
        let taking: Vec<_> = gone.iter().map(|e| self.branch_lock(&e.name)).collect();
        let me = self.clone();
        let left = format!(
            "{why}; it goes on elsewhere when the run can move it: ask it again once it runs"
        );
        tokio::spawn(async move {
            for end in &gone {
                handle.drop_remote(&end.name, &left).await;
            }
            // A checkpoint of theirs being taken lands first: the move starts from it. One
            // still being taken after CHECKPOINT_SETTLE (a git that hangs) is given up: it
            // lands no more, and the move starts from the last checkpoint taken.
            let held = held_after(&taking, tokio::time::Instant::now() + CHECKPOINT_SETTLE).await;
            for i in held {
                if let (Some(end), Some(attempt)) = (gone.get(i), attempts.get(i))
                    && !me.abandon_checkpoint(&end.name, *attempt)
                    && let Some(lock) = taking.get(i)
                {
                    // Landing already (taken and checked; a local fast-forward left): the
                    // move starts from it once it is in the worktree, never before.
                    let _landed = lock.clone().lock_owned().await;
                }
            }
            // And a records batch claimed before the loss: the move reads the record back,
            // and nothing of the earlier placement is written after it.
            let names: Vec<String> = gone.iter().map(|e| e.name.clone()).collect();
            me.records_settled(&names).await;
            // And every share and alert they were delivered (one is recorded once all its
            // remote deliveries settle, up to 10 s later): the move shows them once, read
            // back from the record.
            for name in &names {
                if !handle.settled(name, DELIVERIES_SETTLE).await {
                    eprintln!(
                        "taskdaemon: loop {name}: a share or alert delivered to it was not recorded within {} s; it goes on without it",
                        DELIVERIES_SETTLE.as_secs()
                    );
                }
            }
            for end in gone {
                let _ = ends.send(end);
            }
        });
    }

    /// The checkpoint of loop `name`'s placement `attempt` being taken is given up (its
    /// host was lost, and it took longer than [`CHECKPOINT_SETTLE`]): it lands no more.
    /// `false` when it is landing already ([`Entry::landing`]): then it is not given up,
    /// and the move waits for it.
    fn abandon_checkpoint(&self, name: &str, attempt: u64) -> bool {
        if let Some(entry) = lock(&self.loops)
            .get_mut(name)
            .filter(|e| e.attempt == attempt)
        {
            if entry.landing {
                eprintln!(
                    "taskdaemon: loop {name}: its host was lost while its work was taken; that work is landing in its worktree on the head, and it moves from there once it has"
                );
                return false;
            }
            entry.abandoned = true;
        }
        eprintln!(
            "taskdaemon: loop {name}: its host was lost while its work was taken, which took over {} s; it moves from its last checkpoint",
            CHECKPOINT_SETTLE.as_secs()
        );
        true
    }

    /// Waits until no records batch of `names` is being taken (a batch is appended in one
    /// go, without awaiting: this is short), at most [`RECORDS_SETTLE`].
    async fn records_settled(&self, names: &[String]) {
        let started = std::time::Instant::now();
        loop {
            let busy: Vec<String> = {
                let loops = lock(&self.loops);
                names
                    .iter()
                    .filter(|n| loops.get(*n).is_some_and(|e| e.taking))
                    .cloned()
                    .collect()
            };
            if busy.is_empty() {
                return;
            }
            if started.elapsed() >= RECORDS_SETTLE {
                // The batch still lands, after the move read the record: its lines are kept,
                // its bookkeeping stays with its own placement ([`RemoteLoops::placement`]).
                eprintln!(
                    "taskdaemon: loop(s) {}: a records batch of the lost host was still being appended after {} s; the loop moves now, and that batch's lines land in the record after its last checkpoint",
                    busy.join(", "),
                    RECORDS_SETTLE.as_secs()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The lock held while a checkpoint of loop `name` is taken.
    fn branch_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.taking_branch)
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    fn base_file(&self, name: &str) -> PathBuf {
        self.side.dir.join(format!("{name}.base.bundle"))
    }

    fn branch_file(&self, name: &str) -> PathBuf {
        self.side.dir.join(format!("{name}.branch.bundle"))
    }

    /// Answers one request of a host.
    pub async fn handle(self: Arc<Self>, request: HostRequest) {
        let HostRequest {
            host,
            attempt,
            request,
            reply,
        } = request;
        let name = match &request {
            FromHost::PrepareBase { loop_name, .. }
            | FromHost::BaseChunk { loop_name, .. }
            | FromHost::BaseLfs { loop_name, .. }
            | FromHost::BaseLfsChunk { loop_name, .. }
            | FromHost::Complete { loop_name, .. }
            | FromHost::Records { loop_name, .. }
            | FromHost::BranchChunk { loop_name, .. }
            | FromHost::LfsChunk { loop_name, .. }
            | FromHost::Checkpoint { loop_name, .. }
            | FromHost::Coord { loop_name, .. }
            | FromHost::Ended { loop_name, .. } => loop_name.clone(),
        };
        // What the host's runtime says about a loop's leaving may come after its end; nothing
        // else does (review #6: an ended loop's host cannot ask, share or register as it).
        let late_ok = matches!(
            request,
            FromHost::Coord {
                request: CoordRequest::Unregister | CoordRequest::SetStatus { .. },
                ..
            }
        );
        // Only the loop's current placement speaks for it: a host cut off while its loop
        // moved (or joined again since) is refused before anything is done.
        let known = lock(&self.loops)
            .get(&name)
            .filter(|e| e.host == host && e.attempt == attempt && (!e.done || late_ok))
            .map(|e| (e.base.clone(), e.tools.clone()));
        let Some((base, tools)) = known else {
            reply.send(Err::<(), _>(format!(
                "loop {name} does not run on host {host} as attempt {attempt} (any more)"
            )));
            return;
        };
        match request {
            FromHost::PrepareBase { have, .. } => {
                let claimed = self.placement(&name, attempt, |entry| {
                    !std::mem::replace(&mut entry.preparing, true)
                });
                match claimed {
                    Some(true) => {}
                    Some(false) => {
                        return reply.send(Err::<(), _>(format!(
                            "loop {name}'s base is being prepared for an earlier request; ask again once it is answered"
                        )));
                    }
                    None => {
                        return reply.send(Err::<(), _>(format!(
                            "loop {name} does not run on host {host} as attempt {attempt} (any more)"
                        )));
                    }
                }
                let made = self.prepare_base(&name, &base, &have).await;
                self.placement(&name, attempt, |entry| entry.preparing = false);
                reply.send(made);
            }
            FromHost::BaseChunk { offset, .. } => {
                reply.send(self.base_lfs.read(&self.base_file(&name), offset).await);
            }
            FromHost::BaseLfs { after, .. } => {
                let names =
                    self.base_lfs
                        .names(&self.side.repo, &name, attempt, &base, after.as_deref());
                reply.send(names.await);
            }
            FromHost::BaseLfsChunk { oid, offset, .. } => {
                reply.send(self.base_lfs.chunk(&name, attempt, &oid, offset).await);
            }
            FromHost::Complete { request, .. } => {
                reply.send(Ok::<_, String>(
                    self.complete(&name, attempt, tools, request).await,
                ));
            }
            FromHost::Records {
                batch,
                events,
                transcript,
                receipts,
                ..
            } => {
                // Appending syncs the batch's receipts (fdatasync: 0.1 to several ms): not on the
                // runtime's workers, which carry the other hosts' requests meanwhile (a
                // query's hops waited behind it: benches/hosts.rs).
                let this = Arc::clone(&self);
                let taken = tokio::task::spawn_blocking(move || {
                    this.records(&name, attempt, batch, events, transcript, receipts)
                })
                .await
                .unwrap_or_else(|e| Err(format!("the head's records task failed: {e}")));
                reply.send(taken)
            }
            FromHost::BranchChunk { offset, data, .. } => {
                reply.send(self.branch_chunk(&name, offset, &data));
            }
            FromHost::LfsChunk {
                oid,
                size,
                offset,
                data,
                ..
            } => {
                let pointer = LfsPointer { oid, size };
                let sender = format!("{name}.{attempt}");
                reply.send(self.lfs_chunk(&name, &sender, pointer, offset, data).await);
            }
            FromHost::Checkpoint {
                iteration, branch, ..
            } => {
                let taken = self
                    .checkpoint(&name, attempt, &base, iteration, branch)
                    .await;
                reply.send(taken);
            }
            FromHost::Coord { request, .. } => {
                if matches!(request, CoordRequest::Register { .. }) {
                    // It runs: its host fetched its base's LFS objects before it started it.
                    self.base_lfs.forget(&name, attempt);
                }
                self.coord(&host, &name, request, reply).await
            }
            FromHost::Ended {
                end,
                branch,
                problem,
                ..
            } => {
                // Claimed before any work: a second Ended (sent again, or at once) does not
                // take the branch again.
                // Checked again under the lock: its host may have been lost since the first
                // check, and the loop handed to the run to move.
                let first = lock(&self.loops).get_mut(&name).is_some_and(|e| {
                    !e.done && e.attempt == attempt && !std::mem::replace(&mut e.ending, true)
                });
                // Answered first: what the head does with the loop's end is the head's.
                reply.send(Ok::<(), String>(()));
                if !first {
                    return;
                }
                let end = self.take_end(&name, &base, end, branch, problem).await;
                // Its actor on the host is gone: questions to it get the ended-loop error.
                CoordinatorHandle::new(self.side.coordinator.clone())
                    .unregister_remote(&name)
                    .await;
                let alert = end_alert(&name, &end);
                let handed = {
                    let mut loops = lock(&self.loops);
                    match loops.get_mut(&name) {
                        Some(entry) if !entry.done => {
                            entry.done = true;
                            let _ = self.ends.send(RemoteEnd {
                                name: name.clone(),
                                end,
                                lost: None,
                            });
                            true
                        }
                        _ => false,
                    }
                };
                // Its end is announced by the head, as a local loop's is by its actor.
                if let (true, Some((event_type, message))) = (handed, alert) {
                    let _ = CoordinatorHandle::new(self.side.coordinator.clone())
                        .alert(SYSTEM_SENDER, event_type, &message, None, Some(&name))
                        .await;
                }
            }
        }
    }

    /// Makes loop `name`'s base bundle (its commits from `base` the host does not `have`):
    /// its size, or `None` when the host has them all.
    async fn prepare_base(
        &self,
        name: &str,
        base: &str,
        have: &[String],
    ) -> Result<Option<u64>, String> {
        std::fs::create_dir_all(&self.side.dir)
            .map_err(|e| format!("cannot make {}: {e}", self.side.dir.display()))?;
        let file = self.base_file(name);
        td_git::transfer::bundle_commits(&self.side.repo, base, have, &file)
            .await
            .map(|info| info.map(|i| i.bytes))
            .map_err(|e| e.to_string())
    }

    /// What the host's runtime tells or asks the coordinator about its loop `name`.
    async fn coord(
        &self,
        host: &str,
        name: &str,
        request: CoordRequest,
        reply: td_cluster::wire::Reply,
    ) {
        let handle = CoordinatorHandle::new(self.side.coordinator.clone());
        let port = CoordinatorPort::new(self.side.coordinator.clone());
        let text = |e: ToolError| e.to_string();
        match request {
            CoordRequest::Register {
                loop_type,
                task,
                subscriptions,
            } => {
                let asker = match self.asker() {
                    Ok(a) => a.clone(),
                    Err(e) => return reply.send(Err::<(), _>(e)),
                };
                let Some(inbox) = lock(&self.loops).get(name).map(|e| e.inbox.clone()) else {
                    return reply.send(Err::<(), _>(format!("no loop {name}")));
                };
                let link = Arc::new(HostLink {
                    asker,
                    host: host.to_string(),
                    name: name.to_string(),
                    outstanding: self.outstanding.clone(),
                    inbox,
                });
                let done = handle
                    .register_remote(name, &loop_type, &task, subscriptions, link)
                    .await;
                let ok = done.is_ok();
                reply.send(done.map_err(|e| e.to_string()));
                // Its start is announced by the head, once.
                let announce = match lock(&self.loops).get_mut(name) {
                    Some(entry) if ok && !entry.announced => {
                        entry.announced = true;
                        Some(entry.task_line.clone())
                    }
                    _ => None,
                };
                if let Some(line) = announce {
                    let message = format!("loop `{name}` started: {line}");
                    let _ = handle
                        .alert(SYSTEM_SENDER, "loop_started", &message, None, Some(name))
                        .await;
                }
            }
            CoordRequest::SetStatus { status } => {
                handle.set_remote_status(name, &status);
                reply.send(Ok(()));
            }
            CoordRequest::Query {
                target,
                question,
                timeout_ms,
            } => {
                let timeout = Duration::from_millis(timeout_ms).min(MAX_QUERY_TIMEOUT);
                let answer = port
                    .query(&Arc::from(name), &target, &question, timeout)
                    .await;
                reply.send(answer.map_err(text));
            }
            CoordRequest::Share {
                targets,
                data_type,
                data,
            } => {
                let delivered = port.share(name, &targets, &data_type, data).await;
                reply.send(delivered.map_err(text));
            }
            CoordRequest::Alert {
                system,
                event_type,
                message,
                data,
            } => {
                if system {
                    // System alerts pass every rate limit: only the head sends them (a
                    // host loop's start and end are announced by the head itself).
                    return reply.send(Err::<usize, _>(format!(
                        "a host does not send system alerts (`{}`); the head announces its loops' start and end itself",
                        td_base::text::head_tail(&event_type, 60)
                    )));
                }
                let reached = handle.alert(name, &event_type, &message, data, None).await;
                reply.send(reached.map_err(text));
            }
            CoordRequest::List => reply.send(port.list_loops(name).await.map_err(text)),
            CoordRequest::Unregister => {
                handle.unregister_remote(name).await;
                reply.send(Ok(()));
            }
        }
    }

    /// One model call of loop `name`'s placement `attempt`, charged as a local one is. (A
    /// call of an earlier placement still in flight when the loop is placed again counts
    /// nothing of the new one's.)
    async fn complete(
        &self,
        name: &str,
        attempt: u64,
        tools: ModelTools,
        request: RawJson,
    ) -> CompleteAnswer {
        let failed = |message: String| CompleteAnswer::Failed {
            kind: "bad_request".into(),
            status: None,
            message,
        };
        let wire: Incoming = match request.parse() {
            Ok(w) => w,
            Err(e) => return failed(format!("the head cannot read this model request: {e}")),
        };
        let Some(mut stopping) = lock(&self.loops)
            .get_mut(name)
            .filter(|entry| entry.attempt == attempt)
            .map(|entry| {
                entry.requests = entry.requests.saturating_add(1);
                entry.stopping.subscribe()
            })
        else {
            return failed(format!(
                "loop {name} does not run on this host as attempt {attempt} (any more)"
            ));
        };
        if wire.loop_name != name {
            return failed(format!(
                "a model request of loop {} came as loop {name}'s",
                wire.loop_name
            ));
        }
        // An iteration's call is charged to the loop, an answer's to the loop that asked
        // (as the head charges its own loops' answers), but only while the head has that
        // question outstanding to this loop: the host names the asker, and otherwise could
        // charge any loop, or one unknown and so without limits.
        let asked = match &wire.purpose {
            Purpose::Iteration => None,
            Purpose::QueryAnswer { from, question } => {
                if &**from == name {
                    return failed(format!("loop {name} cannot answer its own question"));
                }
                let key = (name.to_string(), from.to_string(), question.to_string());
                let mut outstanding = lock(&self.outstanding);
                match outstanding.get_mut(&key) {
                    Some(pending) if !pending.askers.is_empty() => {
                        let most = u32::try_from(pending.askers.len())
                            .unwrap_or(u32::MAX)
                            .saturating_mul(td_engine::MAX_ANSWER_TURNS);
                        if pending.calls >= most {
                            return failed(format!(
                                "loop {name}'s answer to loop {from} made {} model calls, the most an answer makes ({} a question asked); it gets no more",
                                pending.calls,
                                td_engine::MAX_ANSWER_TURNS
                            ));
                        }
                        pending.calls = pending.calls.saturating_add(1);
                        pending.askers.first().map(|spent| {
                            (from.to_string(), spent.clone(), pending.waiting.subscribe())
                        })
                    }
                    _ => None,
                }
            }
        };
        // Where the answer's spend is counted for its query's record, and whether its
        // askers still wait.
        let (asked, query_spent, mut asker_waits) = match asked {
            Some((from, spent, waits)) => (Some(from), Some(spent), Some(waits)),
            None => (None, None, None),
        };
        // Whom an answer's call is charged to, for the transcript (`None`: the loop itself).
        let answering = asked.clone();
        let payer = match asked {
            Some(from) => from,
            None => {
                if let Some(why) = lock(&self.loops)
                    .get(name)
                    .filter(|e| e.attempt == attempt)
                    .and_then(|e| e.over.clone())
                {
                    return CompleteAnswer::OverBudget { reason: why };
                }
                name.to_string()
            }
        };
        let request = LlmRequest {
            loop_name: Arc::from(name),
            tools: tools.for_purpose(&wire.purpose),
            purpose: wire.purpose,
            system: wire.system,
            messages: wire.messages,
        };
        let account = self.side.budgets.account(&payer);
        let hold = match account.reserve(&request) {
            Ok(h) => h,
            Err(why) => return CompleteAnswer::OverBudget { reason: why },
        };
        // Its retries are recorded, and its streamed output shown, as a head loop's are.
        let observer =
            td_engine::CallEvents::new(name, Some(&self.side.events), &*self.side.transcript);
        let iteration = matches!(request.purpose, Purpose::Iteration);
        let given_up = async {
            // Closed: the entry is gone (the loop placed again).
            let _ = stopping.wait_for(|stop| *stop && iteration).await;
        };
        let asker_left = async {
            match asker_waits.as_mut() {
                // Closed when the last asker of the question stopped waiting.
                Some(waits) => while waits.changed().await.is_ok() {},
                None => std::future::pending().await,
            }
        };
        let called = tokio::select! {
            called = self.side.llm.complete_observed(&request, &observer) => called,
            () = asker_left => {
                // Not settled or charged: nobody waits for this answer any more.
                return CompleteAnswer::Failed {
                    kind: "transport".into(),
                    status: None,
                    message: format!(
                        "the loop that asked loop {name} stopped waiting for its answer: the answer's model call was given up"
                    ),
                };
            }
            () = given_up => {
                // Not settled: the hold is released, as a head loop's call dropped at its
                // stop is.
                return CompleteAnswer::Failed {
                    kind: td_cluster::protocol::GIVEN_UP_STOPPING.to_string(),
                    status: None,
                    message: format!("loop {name} is stopping: its model call was given up"),
                };
            }
        };
        match called {
            Ok(response) => {
                let spend = hold.settle(&response.usage);
                if let Some(query) = &query_spent {
                    lock(query).add(&spend);
                }
                self.spent(name, attempt, answering, spend);
                match RawJson::to(&response) {
                    Ok(response) => CompleteAnswer::Response { response },
                    Err(e) => failed(format!("cannot write the response: {e}")),
                }
            }
            Err(e) => {
                let (kind, status, message) = match e {
                    LlmError::Transport(m) => ("transport", None, m),
                    LlmError::Api { status, message } => ("api", Some(status), message),
                    LlmError::BadReply(m) => ("bad_reply", None, m),
                    LlmError::Script(m) => ("script", None, m),
                    LlmError::OverBudget(m) => return CompleteAnswer::OverBudget { reason: m },
                };
                CompleteAnswer::Failed {
                    kind: kind.to_string(),
                    status,
                    message,
                }
            }
        }
    }

    /// Appends one batch of loop `name`'s records, all of it or none (a batch that does not
    /// read is refused whole, and the host marks its loop with the reason).
    fn records(
        &self,
        name: &str,
        attempt: u64,
        batch: u64,
        events: Vec<RawJson>,
        transcript: Vec<RawJson>,
        receipts: Vec<RawJson>,
    ) -> Result<(), String> {
        // Claimed under the lock before any work: the same batch sent again meanwhile (a
        // retry racing its first send) is not appended twice.
        let host = {
            let mut loops = lock(&self.loops);
            let entry = loops
                .get_mut(name)
                .ok_or_else(|| format!("no loop {name}"))?;
            // Checked again under the lock: its host may have been lost since the request's
            // first check, and the loop handed to the run, which reads its record back.
            if entry.done || entry.attempt != attempt {
                return Err(format!(
                    "loop {name} no longer runs as attempt {attempt}: batch {batch} is not taken"
                ));
            }
            if let Some(why) = entry.broken.clone() {
                return Err(why);
            }
            if entry.taking {
                return Err(format!(
                    "a records batch of loop {name} is being taken; send batch {batch} again once it is answered"
                ));
            }
            let last = entry.batch;
            if batch <= last {
                // A retry of a batch whose answer was lost: appended already.
                return Ok(());
            }
            if Some(batch) != last.checked_add(1) {
                return Err(format!(
                    "records batch {batch} of loop {name} came after batch {last}"
                ));
            }
            let bytes = events
                .iter()
                .chain(&transcript)
                .chain(&receipts)
                .fold(0u64, |sum, r| {
                    sum.saturating_add(u64::try_from(r.get().len()).unwrap_or(u64::MAX))
                });
            let total = entry.record_bytes.saturating_add(bytes);
            if total > self.side.max_record_bytes {
                // Its record takes no more of it: this batch and every later one refused.
                let why = format!(
                    "loop {name}'s records would pass {} bytes in this placement, the most the run takes of one (hosts.max-record-bytes): raise it to let such a loop go on",
                    self.side.max_record_bytes
                );
                entry.broken = Some(why.clone());
                return Err(why);
            }
            entry.record_bytes = total;
            entry.taking = true;
            entry.host.clone()
        };
        let taken = self.take_records(&host, name, attempt, batch, events, transcript, receipts);
        // Only this placement's claim is let go: the loop may have moved meanwhile (its host
        // lost while this batch was taken), and the new placement's entry is its own.
        self.placement(name, attempt, |entry| entry.taking = false);
        taken
    }

    /// Changes loop `name`'s entry under the lock while it is placement `attempt`: `None`
    /// (and nothing changed) once the loop moved (an entry of another attempt replaced it) or
    /// ended. A records batch still being taken when its host was lost writes its
    /// bookkeeping through this, never into the next placement's entry.
    fn placement<T>(
        &self,
        name: &str,
        attempt: u64,
        change: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        lock(&self.loops)
            .get_mut(name)
            .filter(|e| e.attempt == attempt)
            .map(change)
    }

    /// [`RemoteLoops::records`] once the batch is claimed.
    #[allow(clippy::too_many_arguments)]
    fn take_records(
        &self,
        host: &str,
        name: &str,
        attempt: u64,
        batch: u64,
        events: Vec<RawJson>,
        transcript: Vec<RawJson>,
        receipts: Vec<RawJson>,
    ) -> Result<(), String> {
        let known = lock(&self.loops)
            .get(name)
            .filter(|e| e.attempt == attempt)
            .map(|e| Known {
                iterations: e.iterations,
                inbox: lock(&e.inbox).clone(),
                live_inbox: e.inbox.clone(),
                requests: e.requests,
            });
        let known = known.ok_or_else(|| {
            format!("loop {name} no longer runs as attempt {attempt}: batch {batch} is not taken")
        })?;
        let mut kinds = Vec::with_capacity(events.len());
        let mut left_out: BTreeMap<String, usize> = BTreeMap::new();
        for event in events {
            // Whose it is and its kind are read and checked before the rest (from the text:
            // no tree of it is built).
            let cannot =
                |e: serde_json::Error| format!("an event of loop {name} cannot be read: {e}");
            let about: EventAbout = serde_json::from_str(event.get()).map_err(cannot)?;
            if about.loop_name.as_deref() != Some(name) {
                return Err(format!(
                    "an event in loop {name}'s records is not its own: {}",
                    td_base::text::head_tail(event.get(), 200)
                ));
            }
            if !HOST_EVENTS.contains(&&*about.event) {
                // Not the host's to say; left out, and said (not silently).
                *left_out.entry(shown_kind(&about.event)).or_default() += 1;
                continue;
            }
            kinds.push(event.parse::<EventKind>().map_err(cannot)?);
        }
        if !left_out.is_empty() {
            let said = lock(&self.loops).get_mut(name).map_or(0, |e| {
                let said = e.left_out_lines;
                e.left_out_lines = said.saturating_add(1);
                said
            });
            if let Some(line) = left_out_line(name, &left_out, said) {
                eprintln!("{line}");
            }
        }
        let live_inbox = known.live_inbox.clone();
        let shown = known.check(name, &kinds)?;
        let mut entries = Vec::with_capacity(transcript.len());
        for entry in transcript {
            let entry = entry
                .parse::<TranscriptEntry>()
                .map_err(|e| format!("a transcript entry of loop {name} cannot be read: {e}"))?;
            // What a call spent is what the head settled, and it writes that itself (the
            // record's spend, the askers' charges and a resume's carry-over are read from
            // these): a host's own word on it is left out.
            if matches!(entry, TranscriptEntry::Spent { .. }) {
                continue;
            }
            entries.push(entry);
        }
        let mut taken = Vec::with_capacity(receipts.len());
        for receipt in receipts {
            let mut receipt = receipt
                .parse::<Receipt>()
                .map_err(|e| format!("a receipt of loop {name} cannot be read: {e}"))?;
            if &*receipt.exec_id != name {
                return Err(format!(
                    "a receipt in loop {name}'s records is loop {}'s",
                    receipt.exec_id
                ));
            }
            // Chained again here, under the run's key.
            receipt.seq = None;
            receipt.chain = None;
            taken.push(receipt);
        }
        let log = if taken.is_empty() {
            None
        } else {
            Some(self.side.record.receipts_for(name)?)
        };
        // The events a resume relies on (progress notes, ends) are synced once for the
        // batch, not each under the event log's lock (which every loop waits on).
        let batch_sync = self.side.record.events_batch();
        for mut kind in kinds {
            match &mut kind {
                EventKind::IterationStarted { .. } => self.iteration_started(name, attempt),
                // Where it runs is the head's to say (a rebuilt summary reads it here).
                EventKind::LoopStarted { host: said, .. } => *said = Some(host.to_string()),
                _ => {}
            }
            self.side.events.record(kind);
        }
        // On the disk before the host hears the batch was taken; a failed sync is the
        // record's failure (noted), as a failed write of one event is.
        let _ = batch_sync.end();
        // One write for the batch's transcript lines (a `statx` and a `write` per line
        // before).
        self.side.transcript.record_all(name, entries);
        // From here on the batch is taken, whatever fails: a retry must not append it again.
        self.placement(name, attempt, |entry| entry.batch = batch);
        lock(&live_inbox).commit(&shown);
        // One write and one sync for the batch's receipts (all or none), before the batch
        // is answered: each is on the disk when its host hears the batch was taken.
        if let Some(log) = log
            && let Err(e) = log.append_all(&taken)
        {
            let why = format!("the head cannot append to loop {name}'s receipts: {e}");
            self.side.record.note_failure(why.clone());
            self.placement(name, attempt, |entry| entry.broken = Some(why.clone()));
            return Err(why);
        }
        Ok(())
    }

    /// Writes in loop `name`'s transcript what one of its model calls (of placement
    /// `attempt`) spent, as the head settled it: an iteration's call (numbered by the
    /// iterations and calls the head has seen of it: its records may come a little behind
    /// its calls), or (`charged_to`) an answer's, charged to the asker, numbered as a local
    /// answer's (iteration 0).
    fn spent(&self, name: &str, attempt: u64, charged_to: Option<String>, spend: Spend) {
        let (iteration, turn) = {
            let mut loops = lock(&self.loops);
            let entry = loops.get_mut(name).filter(|e| e.attempt == attempt);
            match (entry, &charged_to) {
                (Some(entry), None) => {
                    entry.calls = entry.calls.saturating_add(1);
                    (entry.iterations.max(1), entry.calls)
                }
                (Some(entry), Some(_)) => {
                    entry.answer_calls = entry.answer_calls.saturating_add(1);
                    (0, entry.answer_calls)
                }
                (None, _) => (0, 0),
            }
        };
        self.side.transcript.record(
            name,
            TranscriptEntry::Spent {
                iteration,
                turn,
                charged_to,
                spend,
            },
        );
    }

    /// Counts a new iteration of loop `name` in its account and the run's, as a local
    /// loop's start does; past a limit, its next model call is refused with it.
    fn iteration_started(&self, name: &str, attempt: u64) {
        // Counted in its account whichever placement it was: the iteration ran (a batch of
        // an earlier placement may come in late); its entry only if it is still this one.
        let counted = self.side.budgets.account(name).start_iteration();
        self.placement(name, attempt, |entry| {
            entry.iterations = entry.iterations.saturating_add(1);
            entry.calls = 0;
            if let Err(why) = counted {
                entry.over.get_or_insert(why);
            }
        });
    }

    /// Appends a chunk of loop `name`'s branch bundle; chunks come in order, and the whole
    /// stays within [`MAX_BRANCH_BYTES`].
    fn branch_chunk(&self, name: &str, offset: u64, data: &str) -> Result<(), String> {
        let bytes =
            hex::decode(data).map_err(|e| format!("a chunk of the branch is not hex: {e}"))?;
        let mut loops = lock(&self.loops);
        let entry = loops
            .get_mut(name)
            .ok_or_else(|| format!("no loop {name}"))?;
        if entry.ending {
            // Its bundle is being taken as it is.
            return Err(format!(
                "loop {name} ended; its branch is taken as it was sent"
            ));
        }
        if offset < entry.branch_bytes
            && offset.saturating_add(bytes.len() as u64) <= entry.branch_bytes
        {
            // A retry of a chunk written already.
            return Ok(());
        }
        if offset != entry.branch_bytes {
            return Err(format!(
                "a chunk of loop {name}'s branch at {offset} came after {} bytes",
                entry.branch_bytes
            ));
        }
        let total = offset
            .checked_add(bytes.len() as u64)
            .filter(|t| *t <= MAX_BRANCH_BYTES)
            .ok_or_else(|| {
                format!("loop {name}'s branch is larger than the {MAX_BRANCH_BYTES} bytes taken")
            })?;
        // All its bundles (checkpoints and ends, of every placement of it) together stay
        // within it, so that hosts cannot fill the head's repository.
        self.sent.charge(name, bytes.len() as u64)?;
        std::fs::create_dir_all(&self.side.dir)
            .map_err(|e| format!("cannot make {}: {e}", self.side.dir.display()))?;
        let path = self.branch_file(name);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        file.write_all(&bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        entry.branch_bytes = total;
        Ok(())
    }

    /// Takes a chunk of a git-lfs object loop `name`'s branch points at, sent by its
    /// placement `sender` (see [`td_git::transfer::lfs`]): the bytes written counted with its
    /// branch's against [`MAX_BRANCH_BYTES`], put together beside its bundles, and moved into
    /// the repository's LFS storage once whole and its bytes hash to its id. `None` once the
    /// head holds the object; else the offset to send from.
    async fn lfs_chunk(
        &self,
        name: &str,
        sender: &str,
        pointer: LfsPointer,
        offset: u64,
        data: String,
    ) -> Result<Option<u64>, String> {
        let bytes =
            hex::decode(&data).map_err(|e| format!("a chunk of an LFS object is not hex: {e}"))?;
        let ending = lock(&self.loops).get(name).map(|e| e.ending);
        match ending {
            None => return Err(format!("no loop {name}")),
            Some(true) => {
                return Err(format!(
                    "loop {name} ended; its branch is taken as it was sent"
                ));
            }
            Some(false) => {}
        }
        let intake = LfsIntake::open(&self.side.repo, &self.side.dir)
            .await
            .map_err(|e| format!("the head cannot take LFS objects: {e}"))?;
        let (owner, sender) = (name.to_string(), sender.to_string());
        let sent = self.sent.clone();
        // The last chunk hashes the whole object (up to MAX_BRANCH_BYTES): not on the
        // runtime's workers.
        tokio::task::spawn_blocking(move || {
            // Together with its bundles, so that hosts cannot fill the head's disk.
            let charge = |n| sent.charge(&owner, n);
            intake.take_chunk(&sender, &pointer, offset, &bytes, charge)
        })
        .await
        .unwrap_or_else(|e| Err(format!("the head's LFS task failed: {e}")))
        .map(|received| match received {
            LfsReceived::Held => None,
            LfsReceived::Partly(next) => Some(next),
        })
    }

    /// Takes iteration `iteration`'s work of loop `name` (placement `attempt`): the bundle
    /// its host sent in chunks, from `base` (the last tip the head took), into the loop's
    /// ref, and its head worktree moved there; from then on its next bundle is made from
    /// this tip. A retry of a checkpoint taken already is answered without taking it again.
    async fn checkpoint(
        &self,
        name: &str,
        attempt: u64,
        base: &str,
        iteration: u32,
        branch: BranchBundle,
    ) -> Result<(), String> {
        if branch.tip == base {
            // Taken already (its answer was lost), or nothing new.
            return Ok(());
        }
        let _taking = self.branch_lock(name).lock_owned().await;
        // Its host may have been lost meanwhile: a loop handed to the run for a move starts
        // from what the head held then, and nothing of this attempt lands after.
        let file = self.branch_file(name);
        let reset = |me: &Self| {
            // This placement's only: one given up by a move (`host_gone`) leaves the bundle
            // the loop's next placement may be sending alone.
            if let Some(entry) = lock(&me.loops)
                .get_mut(name)
                .filter(|e| e.attempt == attempt)
            {
                let _ = std::fs::remove_file(&file);
                entry.branch_bytes = 0;
            }
        };
        let known = {
            let loops = lock(&self.loops);
            let Some(entry) = loops
                .get(name)
                .filter(|e| e.attempt == attempt && !e.done && !e.ending)
            else {
                return Err(format!("loop {name} no longer runs as attempt {attempt}"));
            };
            // One checkpoint per iteration, in order, of an iteration the head saw start:
            // a host cannot fill the head's repository with checkpoints at will.
            if iteration <= entry.checkpointed || iteration > entry.iterations {
                Err(format!(
                    "a checkpoint of loop {name} for iteration {iteration} is refused: the head takes one per iteration it saw start, after iteration {} (checkpointed) and up to iteration {} (started)",
                    entry.checkpointed, entry.iterations
                ))
            } else {
                Ok((entry.branch_bytes, entry.worktree.clone()))
            }
        };
        let (received, worktree) = match known {
            Ok(k) => k,
            Err(why) => {
                reset(self);
                return Err(why);
            }
        };
        if received != branch.bytes {
            reset(self);
            return Err(format!(
                "its host said the work of iteration {iteration} has {} bytes and sent {received}; send it again",
                branch.bytes
            ));
        }
        let into = format!("refs/taskdaemon/hosts/{name}");
        let taken =
            td_git::transfer::take_branch(&self.side.repo, &file, base, &into, MAX_BRANCH_BYTES)
                .await;
        reset(self);
        let tip =
            taken.map_err(|e| format!("the work of iteration {iteration} was refused: {e}"))?;
        if tip != branch.tip {
            return Err(format!(
                "its host said the work of iteration {iteration} ends at {} and sent {tip}",
                branch.tip
            ));
        }
        // Its host may have been lost meanwhile and the move have stopped waiting for this
        // (`host_gone`): then it lands no more, in the worktree or the loop's next placement.
        // Otherwise it is claimed as landing, and from here it is not given up: the move
        // waits for the fast-forward, so that it starts from the worktree as it will stay.
        let claimed = lock(&self.loops)
            .get_mut(name)
            .filter(|e| e.attempt == attempt && !e.abandoned)
            .map(|e| e.landing = true)
            .is_some();
        if !claimed {
            return Err(format!(
                "loop {name}'s host was lost while the work of iteration {iteration} was taken; it moves from its last checkpoint"
            ));
        }
        let landed = fast_forward(worktree.path(), &tip).await;
        if let Some(entry) = lock(&self.loops)
            .get_mut(name)
            .filter(|e| e.attempt == attempt)
        {
            entry.landing = false;
            if landed.is_ok() {
                entry.base = tip;
                entry.checkpointed = iteration;
            }
        }
        landed.map_err(|why| {
            format!("its worktree on the head cannot take the work of iteration {iteration}: {why}")
        })
    }

    /// The end of loop `name` as the run takes it: its branch taken into the repository and
    /// its worktree moved there, or failed with why that could not be.
    async fn take_end(
        &self,
        name: &str,
        base: &str,
        end: Value,
        branch: Option<BranchBundle>,
        problem: Option<String>,
    ) -> LoopEnd {
        let iterations = lock(&self.loops).get(name).map_or(0, |e| e.iterations);
        let fail = |reason: String| LoopEnd::Failed { iterations, reason };
        let end: LoopEnd = match serde_json::from_value(end) {
            Ok(e) => e,
            Err(e) => return fail(format!("its host sent an end that cannot be read: {e}")),
        };
        if let Some(problem) = problem {
            return fail(format!("its host could not send its work back: {problem}"));
        }
        let Some(branch) = branch else {
            // Nothing committed: its worktree on the head is at its base already.
            return end;
        };
        let received = lock(&self.loops).get(name).map_or(0, |e| e.branch_bytes);
        if received != branch.bytes {
            return fail(format!(
                "its host said its branch has {} bytes and sent {received}",
                branch.bytes
            ));
        }
        let file = self.branch_file(name);
        let into = format!("refs/taskdaemon/hosts/{name}");
        let taken =
            td_git::transfer::take_branch(&self.side.repo, &file, base, &into, MAX_BRANCH_BYTES)
                .await;
        let _ = std::fs::remove_file(&file);
        let tip = match taken {
            Ok(tip) => tip,
            Err(e) => return fail(format!("its host's branch was refused: {e}")),
        };
        if tip != branch.tip {
            return fail(format!(
                "its host said its branch ends at {} and sent {tip}",
                branch.tip
            ));
        }
        let Some(worktree) = lock(&self.loops).get(name).map(|e| e.worktree.clone()) else {
            return fail("it is no longer known".to_string());
        };
        if let Err(why) = fast_forward(worktree.path(), &tip).await {
            return fail(format!(
                "its worktree on the head cannot take its work: {why}"
            ));
        }
        end
    }
}

/// What the head knows of a loop's placement when a records batch of it comes: a host's
/// event numbers are checked against it before anything of the batch is recorded, so that
/// no number in the record is one a resume or a move could not go on from
/// (`run/resume.rs`), nor one that hides items from the loop when it moves.
#[derive(Debug, Clone)]
struct Known {
    /// Iterations the head saw start (from its `iteration_started` events).
    iterations: u32,
    /// Its inbox, copied when the batch arrived: the batch's `inbox_shown` events are
    /// taken on it, and it is made the loop's once the batch is.
    inbox: HostInbox,
    /// The loop's inbox.
    live_inbox: Arc<Mutex<HostInbox>>,
    /// Model calls its host asked of the head.
    requests: u32,
}

impl Known {
    /// Whether `kinds`, in order, can follow what the head knows; why not, by field. The
    /// inbox as the batch's `inbox_shown` events leave it, to be made the loop's.
    fn check(mut self, name: &str, kinds: &[EventKind]) -> Result<HostInbox, String> {
        let refuse = |event: &str, field: &str, value: String, bound: String| {
            Err(format!(
                "loop {name}'s `{event}` has field `{field}` {value}, past {bound}; the batch is refused"
            ))
        };
        // The highest iteration number started so far (never going down).
        let mut last = self.iterations;
        for kind in kinds {
            match kind {
                EventKind::IterationStarted { iteration, .. } => {
                    let next = self.iterations.saturating_add(1);
                    if *iteration > next || *iteration < last {
                        return refuse(
                            "iteration_started",
                            "iteration",
                            iteration.to_string(),
                            format!(
                                "the next iteration the head expects ({last} to {next}: it saw {} start)",
                                self.iterations
                            ),
                        );
                    }
                    last = *iteration;
                    self.iterations = next;
                }
                EventKind::IterationEnded {
                    iteration,
                    model_calls,
                    ..
                } => {
                    if *iteration > last {
                        return refuse(
                            "iteration_ended",
                            "iteration",
                            iteration.to_string(),
                            format!("the iterations started ({last})"),
                        );
                    }
                    if model_calls.is_some_and(|c| c > self.requests) {
                        return refuse(
                            "iteration_ended",
                            "model_calls",
                            format!("{model_calls:?}"),
                            format!("the model calls its host asked ({})", self.requests),
                        );
                    }
                }
                EventKind::ProgressNoted { iteration, .. } if *iteration > last => {
                    return refuse(
                        "progress_noted",
                        "iteration",
                        iteration.to_string(),
                        format!("the iterations started ({last})"),
                    );
                }
                EventKind::InboxShown {
                    items, deliveries, ..
                } => {
                    if let Err(why) = self.inbox.take(*items, deliveries) {
                        return refuse("inbox_shown", why.field, why.value, why.bound);
                    }
                }
                _ => {}
            }
        }
        Ok(self.inbox)
    }
}

/// Waits for each of `locks` until `deadline`: the indexes of those still held then.
async fn held_after(
    locks: &[Arc<tokio::sync::Mutex<()>>],
    deadline: tokio::time::Instant,
) -> Vec<usize> {
    let mut held = Vec::new();
    for (i, lock) in locks.iter().enumerate() {
        if tokio::time::timeout_at(deadline, lock.clone().lock_owned())
            .await
            .is_err()
        {
            held.push(i);
        }
    }
    held
}

/// The items of a `StartLoop`'s first inbox, with their delivery numbers (the head wrote
/// them; one it cannot read counts as an item without a number).
fn first_inbox(values: &[Value]) -> Vec<td_protocol::inbox::Delivered> {
    values
        .iter()
        .map(|v| {
            serde_json::from_value(v.clone()).unwrap_or(td_protocol::inbox::Delivered {
                delivery: None,
                item: InboxItem::Share {
                    from: String::new(),
                    data_type: String::new(),
                    data: Value::Null,
                },
            })
        })
        .collect()
}

/// The system alert of a loop's end, as a local loop's actor sends it (none when stopped).
pub(crate) fn end_alert(name: &str, end: &LoopEnd) -> Option<(&'static str, String)> {
    match end {
        LoopEnd::Completed {
            summary: Some(s), ..
        } => Some(("loop_completed", format!("loop `{name}` completed: {s}"))),
        LoopEnd::Completed { summary: None, .. } => {
            Some(("loop_completed", format!("loop `{name}` completed")))
        }
        LoopEnd::Failed { reason, .. } => {
            Some(("loop_failed", format!("loop `{name}` failed: {reason}")))
        }
        LoopEnd::Paused { reason, .. } => {
            Some(("loop_paused", format!("loop `{name}` paused: {reason}")))
        }
        LoopEnd::Stopped { .. } => None,
    }
}

/// Moves the worktree at `dir` (on its loop's branch, at the base) to `tip`, which descends
/// from it: `git merge --ff-only`, hardened as every git command of the daemon is.
async fn fast_forward(dir: &Path, tip: &str) -> Result<(), String> {
    let mut command = tokio::process::Command::from(td_git::daemon_git::command(dir));
    command
        .args(["merge", "--ff-only", "--no-edit", tip])
        .stdin(std::process::Stdio::null());
    let out = command
        .output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The run's command confinement as a host applies it: `mode`, `read`, `unix-sockets` and
/// `env` of the config's `sandbox:` (its form in taskdaemon.yml, the shorthand string
/// too). Its paths (`writable`, `readable`, `hide`) name the head's machine and stay here;
/// a host protects its own work directory and hides its own secret file.
pub fn sandbox_policy(config: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
    let doc: Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", config.display()))?;
    Ok(policy_of(doc.get("sandbox")))
}

fn policy_of(sandbox: Option<&Value>) -> Value {
    match sandbox {
        Some(Value::String(mode)) => Value::String(mode.clone()),
        Some(Value::Object(map)) => Value::Object(
            map.iter()
                .filter(|(k, _)| matches!(k.as_str(), "mode" | "read" | "unix-sockets" | "env"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => Value::Object(serde_json::Map::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_gets_the_sandbox_policy_without_the_heads_paths() {
        let full = serde_json::json!({
            "mode": "required", "read": "strict", "unix-sockets": "refuse",
            "env": {"pass": ["LANG"]}, "writable": ["/home/me/.cargo"], "hide": ["/home/me/.aws"],
            "readable": ["/opt"]
        });
        let policy = policy_of(Some(&full));
        assert_eq!(
            policy,
            serde_json::json!({
                "mode": "required", "read": "strict", "unix-sockets": "refuse",
                "env": {"pass": ["LANG"]}
            })
        );
        let settings: td_confine::SandboxSettings = serde_json::from_value(policy).unwrap();
        assert!(settings.writable.is_empty() && settings.hide.is_empty());
        assert_eq!(settings.mode, td_confine::SandboxMode::Required);
        let short: td_confine::SandboxSettings =
            serde_json::from_value(policy_of(Some(&Value::String("required".into())))).unwrap();
        assert_eq!(short.mode, td_confine::SandboxMode::Required);
        let none: td_confine::SandboxSettings = serde_json::from_value(policy_of(None)).unwrap();
        assert_eq!(none, td_confine::SandboxSettings::default());
    }

    /// A lost host's checkpoint that never ends does not hold its loop's move: the wait
    /// ends at its deadline, naming the checkpoints still being taken.
    #[tokio::test]
    async fn the_wait_for_a_lost_hosts_checkpoints_ends_at_its_deadline() {
        let (free, held, released) = (
            Arc::new(tokio::sync::Mutex::new(())),
            Arc::new(tokio::sync::Mutex::new(())),
            Arc::new(tokio::sync::Mutex::new(())),
        );
        let _hung = held.clone().lock_owned().await;
        let soon = released.clone().lock_owned().await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(soon);
        });
        let started = tokio::time::Instant::now();
        let still = held_after(
            &[free, held, released],
            started + Duration::from_millis(300),
        )
        .await;
        assert_eq!(still, vec![1]);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[test]
    fn events_a_host_may_not_send_are_said_once_a_batch_and_only_so_often() {
        let left_out: BTreeMap<String, usize> = [
            ("loop_blocked".to_string(), 3),
            ("loop_merged".to_string(), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            left_out_line("a", &left_out, 0).unwrap(),
            "taskdaemon: loop a: its host sent `loop_blocked` ×3, `loop_merged` event(s) which only the head records; left out"
        );
        let last = left_out_line("a", &left_out, LEFT_OUT_LINES - 1).unwrap();
        assert!(
            last.ends_with("; further such events of this loop are left out without a line"),
            "{last}"
        );
        assert_eq!(left_out_line("a", &left_out, LEFT_OUT_LINES), None);
        let many: BTreeMap<String, usize> = (0..20).map(|i| (format!("k{i:02}"), 1)).collect();
        let line = left_out_line("a", &many, 0).unwrap();
        assert!(
            line.contains("`k07`, and 12 other kinds event(s)"),
            "{line}"
        );
        assert!(!line.contains("k08"), "{line}");
        assert_eq!(shown_kind("loop_blocked"), "loop_blocked");
        let hostile = shown_kind(&format!("\u{1b}[2J\nfake{}", "x".repeat(100)));
        assert!(!hostile.chars().any(char::is_control), "{hostile}");
        assert!(hostile.starts_with("\\u{1b}[2J\\nfake"), "{hostile}");
        // Whose an event is and its kind are read from the text, escapes and all.
        let about: EventAbout =
            serde_json::from_str(r#"{"event":"loop_\u0062locked","x":[1],"loop_name":"a"}"#)
                .unwrap();
        assert_eq!(
            (&*about.event, about.loop_name.as_deref()),
            ("loop_blocked", Some("a"))
        );
        let about: EventAbout = serde_json::from_str(r#"{"event":"progress_noted"}"#).unwrap();
        assert_eq!(about.loop_name, None);
        assert!(serde_json::from_str::<EventAbout>(r#"{"event":5}"#).is_err());
    }
}
