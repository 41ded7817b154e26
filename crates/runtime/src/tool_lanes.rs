//! Tool lanes: one supervised pool of `ToolWorker` actors per worker lane (no-net, net,
//! heavy), and [`ToolLanes`], the handle that runs a call in the lane its caller's route
//! names (the [`LaneRunner`] of a run: see `td_toolkit::call_path`).
//!
//! Invariants:
//! - A lane never runs more calls at once than it has workers; calls beyond that wait in
//!   the lane's queue (`lane_queue`): in the no-net and net lanes they start in the order
//!   they arrived; in the heavy lane by expected cost with aging (earliest deadline first:
//!   a call's deadline is its arrival plus `min(2 × its expected duration, 5 min)`, the
//!   expected duration learnt from the same loop's recent calls of the same tool and
//!   input), so a short build passes long ones and no call is passed by calls arriving
//!   after its deadline.
//! - The heavy lane tells the run's events (when started with them) how each call waited
//!   and ran: `heavy_queued` when a call found every worker busy, `heavy_started` when such
//!   a call got one, `heavy_ended` (waited and ran milliseconds) for every call.
//! - Each call is answered exactly once through its `ReplySlot`, which the pool and the
//!   worker running the call share: the worker answers with its outcome as soon as the tool
//!   returns (the caller does not wait for another hop through the pool), and tells the pool
//!   it is idle; if the worker died instead, the pool answers with an error outcome (and
//!   receipt) that says so, starts a replacement worker and keeps serving. When the pool
//!   stops, its share of every slot goes with it and the waiting callers learn that the
//!   lane stopped.
//! - The pool's handler never awaits a tool: it dispatches and returns, so it stays free to
//!   take new calls and supervision events while workers run.
//! - A caller that stops waiting (its iteration timed out, its loop was stopped, the asker
//!   of the question it was answering gave up) cancels its call: a call still queued is
//!   skipped, and a call already running is dropped by its worker within
//!   `tool_worker::ABANDON_POLL`, 50 ms (a command's process group is killed with it), so
//!   abandoned work does not hold a worker.
//! - Only lane tools come here: the lanes take a [`Lane`], and coordination tools have a
//!   route, not a lane (they run in the calling loop's task: a worker must never wait on
//!   another loop).
//!
//! The registry inside the worker applies schema validation, the catalog timeout and the
//! output cap, so an unknown tool, invalid input or a timeout is an ordinary outcome here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::lane_queue::{CostKey, Entry, LaneQueue, Order};
use crate::reply_slot::ReplySlot;
use crate::tool_worker::{ToolWorker, WorkerIdle, WorkerMsg, WorkerState};
use td_protocol::events::{EventKind, EventLog};
use td_toolkit::call_path::{LaneRunner, ToolJob};
use td_toolkit::catalog::Lane;
use td_toolkit::error::ToolError;
use td_toolkit::registry::CallOutcome;

/// Why the tool lanes could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LanesError {
    /// A lane was given no workers.
    #[error(
        "lane size '{}' must be at least 1 (got 0): a lane without workers would never run its tools",
        .0.as_str()
    )]
    NoWorkers(Lane),
    /// A pool actor did not start.
    #[error("could not start the {} tool lane: {reason}", .lane.as_str())]
    Start {
        /// The lane.
        lane: Lane,
        /// What ractor said.
        reason: String,
    },
}

/// Worker counts per lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LaneSizes {
    /// Workers for local tools without network (files, search, isolated commands).
    pub no_net: usize,
    /// Workers for tools that may use the network (web tools, plain commands).
    pub net: usize,
    /// Workers for builds, tests and validation; by default one per CPU the process may
    /// use ([`default_heavy_workers`]), so that many loops don't start more compilers than
    /// the machine can run at once (each build is itself parallel).
    pub heavy: usize,
}

impl Default for LaneSizes {
    fn default() -> Self {
        Self {
            // The no-net and net lanes mostly wait on files and the network, not on CPUs:
            // their sizes bound open files and connections, so they stay fixed.
            no_net: 8,
            net: 4,
            heavy: default_heavy_workers(),
        }
    }
}

/// The heavy lane's default size: the number of CPUs this process may use
/// (`std::thread::available_parallelism`, which honours CPU affinity and cgroup quotas), at
/// least 1 (also when the count is unknown).
pub fn default_heavy_workers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl LaneSizes {
    /// The worker count of `lane`.
    pub fn workers(&self, lane: Lane) -> usize {
        match lane {
            Lane::NoNet => self.no_net,
            Lane::Net => self.net,
            Lane::Heavy => self.heavy,
        }
    }

    /// Refuses a lane without workers: its calls would wait forever.
    pub fn validate(&self) -> Result<(), LanesError> {
        match Lane::ALL.into_iter().find(|&lane| self.workers(lane) == 0) {
            Some(lane) => Err(LanesError::NoWorkers(lane)),
            None => Ok(()),
        }
    }
}

/// How busy one lane is right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LaneLoad {
    /// Workers of the lane.
    pub workers: usize,
    /// Workers running a call.
    pub busy: usize,
    /// Calls waiting for a worker.
    pub queued: usize,
}

/// Handle to the tool lanes; cheap to clone, shared by every loop of a run.
#[derive(Debug, Clone)]
pub struct ToolLanes {
    no_net: LaneHandle,
    net: LaneHandle,
    heavy: LaneHandle,
}

#[derive(Debug, Clone)]
struct LaneHandle {
    pool: ActorRef<PoolMsg>,
    restarts: Arc<AtomicU64>,
}

impl ToolLanes {
    /// Spawns one pool actor per worker lane (no-net, net, heavy), each linked to `supervisor`
    /// when given. A lane size of 0 is an error.
    pub async fn start(
        sizes: LaneSizes,
        supervisor: Option<ActorCell>,
    ) -> Result<Self, LanesError> {
        Self::start_recording(sizes, supervisor, None).await
    }

    /// Like [`ToolLanes::start`]; the heavy lane records how its calls waited and ran in
    /// `events` (`heavy_queued`, `heavy_started`, `heavy_ended`), when given.
    pub async fn start_recording(
        sizes: LaneSizes,
        supervisor: Option<ActorCell>,
        events: Option<Arc<EventLog>>,
    ) -> Result<Self, LanesError> {
        sizes.validate()?;
        let mut started: Vec<LaneHandle> = Vec::with_capacity(Lane::ALL.len());
        let spawn = |lane| {
            // Only the heavy lane's waits are worth a record: the others are short.
            let events = (lane == Lane::Heavy).then(|| events.clone()).flatten();
            spawn_pool(lane, sizes.workers(lane), supervisor.clone(), events)
        };
        let stop_started = |started: &[LaneHandle]| started.iter().for_each(|h| h.pool.stop(None));
        for lane in Lane::ALL {
            match spawn(lane).await {
                Ok(handle) => started.push(handle),
                Err(e) => {
                    stop_started(&started);
                    return Err(e);
                }
            }
        }
        let [no_net, net, heavy]: [LaneHandle; 3] = started
            .try_into()
            .unwrap_or_else(|_| unreachable!("one pool was started per lane"));
        Ok(Self { no_net, net, heavy })
    }

    fn handle(&self, lane: Lane) -> &LaneHandle {
        match lane {
            Lane::NoNet => &self.no_net,
            Lane::Net => &self.net,
            Lane::Heavy => &self.heavy,
        }
    }

    /// Runs one call in a worker of `lane` and returns its outcome.
    pub async fn run(&self, lane: Lane, job: ToolJob) -> CallOutcome {
        let handle = self.handle(lane);
        let sent = Instant::now();
        let job = Arc::new(job);
        let (tx, rx) = oneshot::channel();
        let message = PoolMsg::Run {
            job: Arc::clone(&job),
            reply: ReplySlot::new(tx),
        };
        if handle.pool.send_message(message).is_err() {
            return fail(&job, lane_down(&job.name, lane, false), sent.elapsed());
        }
        match rx.await {
            Ok(outcome) => outcome,
            // Every holder of the slot dropped it unanswered: the lane stopped or failed.
            Err(_) => fail(&job, lane_down(&job.name, lane, true), sent.elapsed()),
        }
    }

    /// Restarts so far per lane (for tests and status).
    pub fn restarts(&self, lane: Lane) -> u64 {
        self.handle(lane).restarts.load(Ordering::Relaxed)
    }

    /// How busy `lane` is; `None` when the lane is not running.
    pub async fn load(&self, lane: Lane) -> Option<LaneLoad> {
        let handle = self.handle(lane);
        let (tx, rx) = oneshot::channel();
        handle.pool.send_message(PoolMsg::Load(tx.into())).ok()?;
        rx.await.ok()
    }

    /// Stops the pools and their workers. Calls still queued or running are answered with an
    /// error outcome saying the lane stopped.
    pub fn stop(&self) {
        for h in [&self.no_net, &self.net, &self.heavy] {
            h.pool.stop(Some("tool lanes stopped".to_string()));
        }
    }

    /// Like [`ToolLanes::stop`], and waits until the pools have stopped (their workers are
    /// killed as the pools exit).
    pub async fn stop_and_wait(&self) {
        self.stop();
        for h in [&self.no_net, &self.net, &self.heavy] {
            // An error only means the pool had stopped already.
            let _ = h.pool.stop_and_wait(None, None).await;
        }
    }
}

async fn spawn_pool(
    lane: Lane,
    size: usize,
    supervisor: Option<ActorCell>,
    events: Option<Arc<EventLog>>,
) -> Result<LaneHandle, LanesError> {
    let restarts = Arc::new(AtomicU64::new(0));
    let args = PoolArgs {
        lane,
        size,
        restarts: Arc::clone(&restarts),
        events,
    };
    let spawned = match supervisor {
        Some(sup) => Actor::spawn_linked(None, LanePool, args, sup).await,
        None => Actor::spawn(None, LanePool, args).await,
    };
    let (pool, _) = spawned.map_err(|e| LanesError::Start {
        lane,
        reason: e.to_string(),
    })?;
    Ok(LaneHandle { pool, restarts })
}

/// An error outcome (with its receipt) for a call that produced no result of its own.
fn fail(job: &ToolJob, error: ToolError, latency: Duration) -> CallOutcome {
    job.tools.failed_outcome(
        &job.ctx,
        job.call_id.as_deref(),
        &job.name,
        Arc::clone(&job.input),
        error,
        latency,
    )
}

fn lane_down(name: &str, lane: Lane, accepted: bool) -> ToolError {
    let message = if accepted {
        format!(
            "the {} tool lane stopped before '{name}' finished (TaskDaemon is shutting down, or the lane failed). The call may not have run, or may have run only in part: check its effects (read the files again) before you retry it.",
            lane.as_str()
        )
    } else {
        format!(
            "the {} tool lane is not running (TaskDaemon is shutting down, or the lane failed), so '{name}' was not run. Retry later or continue without it.",
            lane.as_str()
        )
    };
    ToolError::Unavailable { message }
}

/// Messages a lane pool handles.
pub(crate) enum PoolMsg {
    /// Run a call; the outcome goes to `reply`.
    Run {
        /// The call.
        job: Arc<ToolJob>,
        /// Where the outcome goes.
        reply: ReplySlot,
    },
    /// A worker answered its call and waits for the next one.
    Idle(WorkerIdle),
    /// Report the lane's load.
    Load(RpcReplyPort<LaneLoad>),
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for PoolMsg {}

// What lets a worker report to its pool without knowing the pool's messages (ractor's
// `DerivedActorRef`): the worker depends on the pool for nothing.
impl From<WorkerIdle> for PoolMsg {
    fn from(idle: WorkerIdle) -> Self {
        PoolMsg::Idle(idle)
    }
}

impl TryFrom<PoolMsg> for WorkerIdle {
    type Error = PoolMsg;

    fn try_from(message: PoolMsg) -> Result<Self, PoolMsg> {
        match message {
            PoolMsg::Idle(idle) => Ok(idle),
            other => Err(other),
        }
    }
}

/// The pool actor of one lane.
pub(crate) struct LanePool;

pub(crate) struct PoolArgs {
    lane: Lane,
    size: usize,
    restarts: Arc<AtomicU64>,
    events: Option<Arc<EventLog>>,
}

pub(crate) struct PoolState {
    lane: Lane,
    slots: Vec<Slot>,
    /// Slots whose worker waits for a call; used as a stack so the warmest worker goes next.
    idle: Vec<usize>,
    queue: LaneQueue<Pending>,
    restarts: Arc<AtomicU64>,
    /// Where the lane records its calls' waits and runs (the heavy lane of a run).
    events: Option<Arc<EventLog>>,
}

struct Slot {
    worker: ActorRef<WorkerMsg>,
    running: Option<Running>,
}

struct Pending {
    job: Arc<ToolJob>,
    reply: ReplySlot,
    /// Whether `heavy_queued` was recorded for it (then `heavy_started` is too).
    announced: bool,
}

struct Running {
    pending: Pending,
    key: CostKey,
    waited: Duration,
    started: Instant,
}

/// Whole milliseconds of `d`, for the record.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn spawn_worker(
    pool: &ActorRef<PoolMsg>,
    slot: usize,
) -> Result<ActorRef<WorkerMsg>, ActorProcessingErr> {
    let state = WorkerState {
        pool: pool.get_derived(),
        slot,
    };
    let (worker, _) = Actor::spawn_linked(None, ToolWorker, state, pool.get_cell()).await?;
    Ok(worker)
}

impl PoolState {
    /// Queues a call and hands out what idle workers can take; a heavy call that found no
    /// worker is recorded as waiting.
    fn enqueue(&mut self, job: Arc<ToolJob>, reply: ReplySlot) {
        let key = self
            .queue
            .key(job.ctx.exec_id(), &job.name, &job.input.to_string());
        let pending = Pending {
            job,
            reply,
            announced: false,
        };
        self.queue.push(key, pending, Instant::now());
        self.dispatch();
        if let Some(events) = &self.events {
            for entry in self.queue.entries_mut() {
                let pending = &mut entry.item;
                if !pending.announced {
                    pending.announced = true;
                    events.record(EventKind::HeavyQueued {
                        loop_name: pending.job.ctx.exec_id().to_string(),
                        tool: pending.job.name.clone(),
                    });
                }
            }
        }
    }

    /// Hands queued calls to idle workers, in the queue's order.
    fn dispatch(&mut self) {
        while !self.queue.is_empty() {
            let Some(slot) = self.idle.pop() else {
                return;
            };
            let Some(entry) = self.queue.pop() else {
                self.idle.push(slot);
                return;
            };
            let waited = entry.arrived.elapsed();
            if entry.item.reply.abandoned() {
                // Its caller gave up before the call started: don't spend a worker on it.
                self.ended(&entry.item.job, waited, Duration::ZERO, true);
                self.idle.push(slot);
                continue;
            }
            let run = WorkerMsg::Run {
                job: Arc::clone(&entry.item.job),
                reply: entry.item.reply.clone(),
            };
            if self.slots[slot].worker.send_message(run).is_err() {
                // The worker died while idle; its supervision event will replace it (and
                // put the slot back to work). The call keeps its place in the queue.
                self.queue.put_back(entry);
                continue;
            }
            let Entry { item, key, .. } = entry;
            if item.announced
                && let Some(events) = &self.events
            {
                events.record(EventKind::HeavyStarted {
                    loop_name: item.job.ctx.exec_id().to_string(),
                    tool: item.job.name.clone(),
                    waited_ms: millis(waited),
                });
            }
            self.slots[slot].running = Some(Running {
                pending: item,
                key,
                waited,
                started: Instant::now(),
            });
        }
    }

    /// A worker reported its call done: learns the call's cost (when the tool returned on
    /// its own) and records how it waited and ran.
    fn done(&mut self, running: Running, finished: bool) {
        let ran = running.started.elapsed();
        if finished {
            self.queue.finished(running.key, ran);
        }
        self.ended(&running.pending.job, running.waited, ran, !finished);
    }

    /// Records `heavy_ended` (in the heavy lane of a run).
    fn ended(&self, job: &ToolJob, waited: Duration, ran: Duration, cancelled: bool) {
        if let Some(events) = &self.events {
            events.record(EventKind::HeavyEnded {
                loop_name: job.ctx.exec_id().to_string(),
                tool: job.name.clone(),
                waited_ms: millis(waited),
                ran_ms: millis(ran),
                cancelled,
            });
        }
    }

    fn load(&self) -> LaneLoad {
        LaneLoad {
            workers: self.slots.len(),
            busy: self.slots.iter().filter(|s| s.running.is_some()).count(),
            queued: self.queue.len(),
        }
    }

    /// Replaces the worker `who` after it died (`how` says how), answering the call it was
    /// running. Returns an error when no replacement can be started, which fails the pool.
    async fn replace(
        &mut self,
        myself: &ActorRef<PoolMsg>,
        who: ActorId,
        how: String,
    ) -> Result<(), ActorProcessingErr> {
        let Some(slot) = self.slots.iter().position(|s| s.worker.get_id() == who) else {
            return Ok(());
        };
        self.idle.retain(|&s| s != slot);
        let running = self.slots[slot].running.take();
        let lane = self.lane.as_str();
        let respawned = spawn_worker(myself, slot).await;
        let restarted = respawned.is_ok();
        if restarted {
            // Counted before the crashed call is answered, so whoever hears of the crash
            // also sees the restart.
            self.restarts.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(Running {
            pending,
            started,
            waited,
            ..
        }) = running
        {
            self.ended(&pending.job, waited, started.elapsed(), false);
            let job = &pending.job;
            tracing::warn!(lane, tool = %job.name, exec_id = job.ctx.exec_id(), "tool worker {how}");
            let (what, hint) = if restarted {
                (
                    "was restarted",
                    "Retry the call; if it fails the same way again, try other arguments or another approach.",
                )
            } else {
                (
                    "could not be restarted",
                    "The lane is shutting down; continue without this tool.",
                )
            };
            let error = ToolError::failed(
                format!("tool {}", job.name),
                format!("the {lane} lane worker running it {how} and {what}"),
                hint,
            );
            pending.reply.answer(fail(job, error, started.elapsed()));
        } else {
            tracing::warn!(lane, "idle tool worker {how}");
        }
        let worker = respawned.map_err(|e| {
            ActorProcessingErr::from(format!(
                "the {lane} tool lane could not replace a worker: {e}"
            ))
        })?;
        self.slots[slot].worker = worker;
        self.idle.push(slot);
        self.dispatch();
        Ok(())
    }
}

impl Actor for LanePool {
    type Msg = PoolMsg;
    type State = PoolState;
    type Arguments = PoolArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PoolMsg>,
        args: PoolArgs,
    ) -> Result<PoolState, ActorProcessingErr> {
        let mut slots = Vec::with_capacity(args.size);
        for slot in 0..args.size {
            match spawn_worker(&myself, slot).await {
                Ok(worker) => slots.push(Slot {
                    worker,
                    running: None,
                }),
                Err(e) => {
                    for s in &slots {
                        s.worker.stop(None);
                    }
                    return Err(e);
                }
            }
        }
        Ok(PoolState {
            lane: args.lane,
            // Reversed so that slot 0 is the first to be popped.
            idle: (0..args.size).rev().collect(),
            slots,
            queue: LaneQueue::new(match args.lane {
                Lane::Heavy => Order::Cost,
                Lane::NoNet | Lane::Net => Order::Arrival,
            }),
            restarts: args.restarts,
            events: args.events,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<PoolMsg>,
        message: PoolMsg,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            PoolMsg::Run { job, reply } => state.enqueue(job, reply),
            PoolMsg::Idle(WorkerIdle {
                slot,
                worker,
                finished,
            }) => {
                let Some(s) = state.slots.get_mut(slot) else {
                    return Ok(());
                };
                // A report from a worker this slot no longer has: that worker was replaced.
                if s.worker.get_id() != worker {
                    return Ok(());
                }
                if let Some(running) = s.running.take() {
                    state.done(running, finished);
                    state.idle.push(slot);
                    state.dispatch();
                }
            }
            PoolMsg::Load(reply) => {
                let _ = reply.send(state.load());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<PoolMsg>,
        event: SupervisionEvent,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                state
                    .replace(&myself, cell.get_id(), format!("crashed (panic: {err})"))
                    .await
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let how = match reason {
                    Some(r) => format!("was stopped ({r})"),
                    None => "was stopped".to_string(),
                };
                state.replace(&myself, cell.get_id(), how).await
            }
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl LaneRunner for ToolLanes {
    async fn run(&self, lane: Lane, job: ToolJob) -> CallOutcome {
        ToolLanes::run(self, lane, job).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use ractor::ActorStatus;
    use serde_json::json;

    use super::*;
    use serde_json::Value;
    use td_protocol::events::EventKind;
    use td_toolkit::catalog::{Catalog, ToolSpecOverride};
    use td_toolkit::context::ToolContext;
    use td_toolkit::registry::ToolSet;
    use td_toolkit::tool::{Tool, ToolOutput};

    /// What the probe tools saw, shared by every probe of a set.
    #[derive(Default)]
    struct Stats {
        running: AtomicUsize,
        max_running: AtomicUsize,
        finished: AtomicUsize,
        started: Mutex<Vec<u64>>,
    }

    impl Stats {
        fn started(&self) -> Vec<u64> {
            self.started.lock().unwrap().clone()
        }
    }

    /// Decrements the running count however `execute` ends (panics included).
    struct RunningGuard<'a>(&'a AtomicUsize);

    impl Drop for RunningGuard<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A test tool under a catalog name (the name decides the lane): it records its start,
    /// sleeps `sleep_ms`, panics when asked, and answers "done <id>".
    struct Probe {
        name: &'static str,
        stats: Arc<Stats>,
    }

    #[async_trait]
    impl Tool for Probe {
        fn name(&self) -> &'static str {
            self.name
        }
        fn description(&self) -> &'static str {
            "test probe"
        }
        fn input_schema(&self) -> Value {
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "description": "call id"},
                    "sleep_ms": {"type": "integer", "minimum": 0, "description": "default 0"},
                    "panic": {"type": "boolean", "description": "default false"}
                },
                "required": ["id"],
                "additionalProperties": false
            })
        }
        async fn execute(
            &self,
            input: Value,
            _ctx: &ToolContext,
        ) -> td_toolkit::error::ToolResult<ToolOutput> {
            let id = input["id"].as_u64().unwrap_or_default();
            self.stats.started.lock().unwrap().push(id);
            let now = self.stats.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.stats.max_running.fetch_max(now, Ordering::SeqCst);
            let _guard = RunningGuard(&self.stats.running);
            let sleep_ms = input["sleep_ms"].as_u64().unwrap_or(0);
            if sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            }
            if input["panic"].as_bool().unwrap_or(false) {
                panic!("probe {id} exploded");
            }
            self.stats.finished.fetch_add(1, Ordering::SeqCst);
            Ok(ToolOutput::text(format!("done {id}")))
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        stats: Arc<Stats>,
    }

    impl Fixture {
        fn new() -> Self {
            Self::with_catalog(Catalog::default())
        }

        fn with_catalog(catalog: Catalog) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let ctx = ToolContext::new(dir.path(), "tester")
                .unwrap()
                .with_catalog(Arc::new(catalog));
            let stats = Arc::new(Stats::default());
            // One probe per lane: no-net, net, heavy.
            let probes = ["read_file", "web_fetch", "build"]
                .into_iter()
                .map(|name| {
                    Arc::new(Probe {
                        name,
                        stats: Arc::clone(&stats),
                    }) as Arc<dyn Tool>
                })
                .collect();
            Self {
                _dir: dir,
                ctx: Arc::new(ctx),
                tools: Arc::new(ToolSet::from_tools(probes).unwrap()),
                stats,
            }
        }

        fn job(&self, name: &str, input: Value) -> ToolJob {
            ToolJob {
                ctx: Arc::clone(&self.ctx),
                tools: Arc::clone(&self.tools),
                call_id: None,
                name: name.to_string(),
                input: input.into(),
            }
        }
    }

    /// Runs `job` in the lane its tool's route names, as a caller's call path does.
    async fn run(lanes: &ToolLanes, job: ToolJob) -> CallOutcome {
        let lane = job.ctx.spec(&job.name).lane.lane().expect("a lane tool");
        lanes.run(lane, job).await
    }

    fn sizes(no_net: usize, net: usize, heavy: usize) -> LaneSizes {
        LaneSizes { no_net, net, heavy }
    }

    /// Waits (up to 5 s) until `cond` holds.
    async fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Fails the test instead of hanging when a lane never answers.
    async fn within<F: std::future::Future>(fut: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .expect("the lanes did not answer in time")
    }

    async fn wait_for_load(lanes: &ToolLanes, lane: Lane, busy: usize, queued: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let load = lanes.load(lane).await.unwrap();
            if load.busy == busy && load.queued == queued {
                return;
            }
            assert!(Instant::now() < deadline, "lane load stuck at {load:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn sizes_default_parse_and_validate() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert!(cpus >= 1);
        assert_eq!(LaneSizes::default(), sizes(8, 4, cpus));
        let partial: LaneSizes = serde_json::from_str(r#"{"no-net": 3}"#).unwrap();
        assert_eq!(partial, sizes(3, 4, cpus));
        // An explicit size wins over the machine's.
        let explicit: LaneSizes = serde_json::from_str(r#"{"heavy": 7}"#).unwrap();
        assert_eq!(explicit, sizes(8, 4, 7));
        let err = serde_json::from_str::<LaneSizes>(r#"{"workers": 3}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
        assert!(serde_json::from_str::<LaneSizes>(r#"{"no_net": 3}"#).is_err());
        assert_eq!(LaneSizes::default().workers(Lane::Heavy), cpus);
        assert!(LaneSizes::default().validate().is_ok());
        let err = sizes(1, 0, 1).validate().unwrap_err();
        assert_eq!(err, LanesError::NoWorkers(Lane::Net));
        assert!(
            err.to_string()
                .starts_with("lane size 'net' must be at least 1 (got 0)"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_zero_sized_lane_is_refused_at_start() {
        let err = ToolLanes::start(sizes(2, 2, 0), None).await.unwrap_err();
        assert_eq!(err, LanesError::NoWorkers(Lane::Heavy));
    }

    #[tokio::test]
    async fn calls_run_and_keep_their_receipt_fields() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(LaneSizes::default(), None).await.unwrap();
        for name in ["read_file", "web_fetch", "build"] {
            let mut job = fx.job(name, json!({"id": 5}));
            job.call_id = Some("call-5".to_string());
            let out = run(&lanes, job).await;
            assert!(!out.is_error, "{name}: {}", out.content);
            assert_eq!(out.content, "done 5");
            assert_eq!(out.receipt.tool, name);
            assert_eq!(out.receipt.call_id.as_deref(), Some("call-5"));
            assert_eq!(*out.receipt.input, json!({"id": 5}));
        }
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn heavy_lane_runs_at_most_its_size_at_once() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(8, 4, 2), None).await.unwrap();
        let calls =
            (0..6).map(|id| run(&lanes, fx.job("build", json!({"id": id, "sleep_ms": 60}))));
        let outs = within(futures::future::join_all(calls)).await;
        assert!(outs.iter().all(|o| !o.is_error));
        assert_eq!(fx.stats.max_running.load(Ordering::SeqCst), 2);
        assert_eq!(fx.stats.finished.load(Ordering::SeqCst), 6);
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn the_lane_comes_from_the_calling_context_catalog() {
        // Default catalog: read_file is no-net, so four calls overlap in a lane of 8.
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(8, 4, 1), None).await.unwrap();
        let calls = (0..4).map(|id| {
            run(
                &lanes,
                fx.job("read_file", json!({"id": id, "sleep_ms": 60})),
            )
        });
        within(futures::future::join_all(calls)).await;
        assert_eq!(fx.stats.max_running.load(Ordering::SeqCst), 4);

        // Overridden: read_file is heavy, so the single heavy worker runs them one by one.
        let mut catalog = Catalog::default();
        let mut o = BTreeMap::new();
        o.insert(
            "read_file".to_string(),
            ToolSpecOverride {
                lane: Some(Lane::Heavy),
                ..Default::default()
            },
        );
        catalog.apply_overrides(&o).unwrap();
        let fx = Fixture::with_catalog(catalog);
        let calls = (0..4).map(|id| {
            run(
                &lanes,
                fx.job("read_file", json!({"id": id, "sleep_ms": 30})),
            )
        });
        let outs = within(futures::future::join_all(calls)).await;
        assert!(outs.iter().all(|o| !o.is_error));
        assert_eq!(fx.stats.max_running.load(Ordering::SeqCst), 1);
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn queued_calls_start_in_arrival_order() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(8, 4, 1), None).await.unwrap();
        let mut calls: Vec<_> = (0..20)
            .map(|id| {
                Box::pin(run(
                    &lanes,
                    fx.job("build", json!({"id": id, "sleep_ms": 2})),
                ))
            })
            .collect();
        // Poll each call once, in order, so they reach the lane in that order.
        for call in &mut calls {
            assert!(futures::poll!(call.as_mut()).is_pending());
        }
        let outs = within(futures::future::join_all(calls)).await;
        for (id, out) in outs.iter().enumerate() {
            assert_eq!(out.content, format!("done {id}"));
        }
        assert_eq!(fx.stats.started(), (0..20).collect::<Vec<u64>>());
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn the_heavy_lane_runs_short_calls_before_a_long_one_that_queued_first() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(8, 4, 1), None).await.unwrap();
        let long = json!({"id": 1, "sleep_ms": 150});
        let short = [
            json!({"id": 2, "sleep_ms": 1}),
            json!({"id": 3, "sleep_ms": 1}),
        ];
        // The lane learns what each kind of call costs.
        for input in [&long, &short[0], &short[1]] {
            within(run(&lanes, fx.job("build", input.clone()))).await;
        }
        // A long call holds the only worker; the long-history call queues first, then the
        // two short ones.
        let blocker = tokio::spawn({
            let lanes = lanes.clone();
            let job = fx.job("build", json!({"id": 9, "sleep_ms": 100}));
            async move { run(&lanes, job).await }
        });
        wait_for_load(&lanes, Lane::Heavy, 1, 0).await;
        let mut calls: Vec<_> = [&long, &short[0], &short[1]]
            .into_iter()
            .map(|input| Box::pin(run(&lanes, fx.job("build", input.clone()))))
            .collect();
        for call in &mut calls {
            assert!(futures::poll!(call.as_mut()).is_pending());
        }
        within(futures::future::join_all(calls)).await;
        assert_eq!(blocker.await.unwrap().content, "done 9");
        let started = fx.stats.started();
        assert_eq!(started[..4], [1, 2, 3, 9]);
        // The two short ones (in the order of their learnt costs), then the long one.
        let mut short_first = started[4..6].to_vec();
        short_first.sort_unstable();
        assert_eq!((short_first, started[6]), (vec![2, 3], 1), "{started:?}");
        // The other lanes keep their arrival order whatever the calls cost.
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(1, 1, 1), None).await.unwrap();
        let long = json!({"id": 1, "sleep_ms": 150});
        let short = json!({"id": 2, "sleep_ms": 1});
        for input in [&long, &short] {
            within(run(&lanes, fx.job("read_file", input.clone()))).await;
        }
        let mut calls: Vec<_> = [json!({"id": 9, "sleep_ms": 100}), long, short]
            .into_iter()
            .map(|input| Box::pin(run(&lanes, fx.job("read_file", input))))
            .collect();
        for call in &mut calls {
            assert!(futures::poll!(call.as_mut()).is_pending());
        }
        within(futures::future::join_all(calls)).await;
        assert_eq!(fx.stats.started(), vec![1, 2, 9, 1, 2]);
        lanes.stop_and_wait().await;
    }

    /// The `(event, tool, waited_ms, ran_ms, cancelled)` of the heavy-lane events in `log`.
    fn heavy_events(log: &EventLog) -> Vec<(&'static str, String, u64, u64, bool)> {
        log.events()
            .into_iter()
            .filter_map(|e| match e.kind {
                EventKind::HeavyQueued { tool, .. } => Some(("queued", tool, 0, 0, false)),
                EventKind::HeavyStarted {
                    tool, waited_ms, ..
                } => Some(("started", tool, waited_ms, 0, false)),
                EventKind::HeavyEnded {
                    tool,
                    waited_ms,
                    ran_ms,
                    cancelled,
                    ..
                } => Some(("ended", tool, waited_ms, ran_ms, cancelled)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn the_heavy_lane_records_how_its_calls_waited_and_ran() {
        let fx = Fixture::new();
        let log = Arc::new(EventLog::in_memory());
        let lanes = ToolLanes::start_recording(sizes(1, 1, 1), None, Some(Arc::clone(&log)))
            .await
            .unwrap();
        // Calls of the other lanes are not recorded.
        within(run(&lanes, fx.job("read_file", json!({"id": 0})))).await;
        assert!(log.events().is_empty(), "{:?}", log.events());
        let first = tokio::spawn({
            let lanes = lanes.clone();
            let job = fx.job("build", json!({"id": 1, "sleep_ms": 200}));
            async move { run(&lanes, job).await }
        });
        wait_for_load(&lanes, Lane::Heavy, 1, 0).await;
        // This one's caller gives up while it waits: recorded as cancelled, never ran.
        let gave_up = run(&lanes, fx.job("build", json!({"id": 2})));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), gave_up)
                .await
                .is_err()
        );
        let second = within(run(
            &lanes,
            fx.job("build", json!({"id": 3, "sleep_ms": 30})),
        ))
        .await;
        assert_eq!(second.content, "done 3");
        assert_eq!(first.await.unwrap().content, "done 1");
        let seen = heavy_events(&log);
        let names: Vec<_> = seen.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            ["queued", "queued", "ended", "ended", "started", "ended"],
            "{seen:?}"
        );
        // The first ran at once for its 200 ms.
        let (_, _, waited, ran, cancelled) = &seen[2];
        assert!(
            *waited < 50 && (200..2_000).contains(ran) && !cancelled,
            "{seen:?}"
        );
        // The abandoned one waited, never ran.
        let (_, _, waited, ran, cancelled) = &seen[3];
        assert!(*cancelled && *ran == 0 && *waited > 0, "{seen:?}");
        // The third waited for the first (started ~20 ms into it), then ran its 30 ms.
        let (_, _, started_after, _, _) = &seen[4];
        let (_, _, waited, ran, cancelled) = &seen[5];
        assert_eq!(started_after, waited);
        assert!((100..2_000).contains(waited), "{seen:?}");
        assert!((30..2_000).contains(ran) && !cancelled, "{seen:?}");
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn a_panicking_tool_fails_its_call_and_the_worker_is_replaced() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(2, 1, 1), None).await.unwrap();
        let input = json!({"id": 7, "panic": true});
        let mut job = fx.job("read_file", input.clone());
        job.call_id = Some("c1".to_string());
        let out = within(run(&lanes, job)).await;
        assert!(out.is_error);
        for part in [
            "crashed",
            "probe 7 exploded",
            "was restarted",
            "Retry the call",
        ] {
            assert!(
                out.content.contains(part),
                "missing {part:?}: {}",
                out.content
            );
        }
        assert_eq!(out.receipt.error_kind.as_deref(), Some("failed"));
        assert_eq!(out.receipt.tool, "read_file");
        assert_eq!(out.receipt.call_id.as_deref(), Some("c1"));
        assert_eq!(*out.receipt.input, input);
        assert_eq!(lanes.restarts(Lane::NoNet), 1);
        assert_eq!(lanes.restarts(Lane::Net), 0);
        for id in 0..10 {
            let out = within(run(&lanes, fx.job("read_file", json!({"id": id})))).await;
            assert_eq!(out.content, format!("done {id}"));
        }
        wait_for_load(&lanes, Lane::NoNet, 0, 0).await;
        assert_eq!(lanes.load(Lane::NoNet).await.unwrap().workers, 2);
        lanes.stop_and_wait().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lane_whose_every_worker_crashed_keeps_serving() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(3, 1, 1), None).await.unwrap();
        // Three overlapping panics take all three workers; three good calls wait behind them.
        let crashing = (0..3).map(|id| {
            run(
                &lanes,
                fx.job(
                    "read_file",
                    json!({"id": id, "sleep_ms": 40, "panic": true}),
                ),
            )
        });
        let good = (10..13).map(|id| run(&lanes, fx.job("read_file", json!({"id": id}))));
        let (crashed, served) = within(futures::future::join(
            futures::future::join_all(crashing),
            futures::future::join_all(good),
        ))
        .await;
        assert!(
            crashed
                .iter()
                .all(|o| o.is_error && o.content.contains("crashed"))
        );
        for (out, id) in served.iter().zip(10..) {
            assert_eq!(out.content, format!("done {id}"));
        }
        assert_eq!(lanes.restarts(Lane::NoNet), 3);
        let more = (20..40).map(|id| run(&lanes, fx.job("read_file", json!({"id": id}))));
        assert!(
            within(futures::future::join_all(more))
                .await
                .iter()
                .all(|o| !o.is_error)
        );
        assert_eq!(lanes.load(Lane::NoNet).await.unwrap().workers, 3);
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn invalid_input_unknown_tools_and_timeouts_are_plain_outcomes() {
        let mut catalog = Catalog::default();
        let mut o = BTreeMap::new();
        o.insert(
            "web_fetch".to_string(),
            ToolSpecOverride {
                timeout_ms: Some(50),
                ..Default::default()
            },
        );
        catalog.apply_overrides(&o).unwrap();
        let fx = Fixture::with_catalog(catalog);
        let lanes = ToolLanes::start(sizes(1, 1, 1), None).await.unwrap();
        let out = run(&lanes, fx.job("read_file", json!({"id": "x"}))).await;
        assert_eq!(out.receipt.error_kind.as_deref(), Some("invalid_arguments"));
        let out = run(&lanes, fx.job("grep", json!({}))).await;
        assert_eq!(out.receipt.error_kind.as_deref(), Some("unknown_tool"));
        let out = run(
            &lanes,
            fx.job("web_fetch", json!({"id": 1, "sleep_ms": 10_000})),
        )
        .await;
        assert_eq!(out.receipt.error_kind.as_deref(), Some("timeout"));
        assert_eq!(lanes.restarts(Lane::NoNet) + lanes.restarts(Lane::Net), 0);
        let out = run(&lanes, fx.job("web_fetch", json!({"id": 2}))).await;
        assert_eq!(out.content, "done 2");
        lanes.stop_and_wait().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_small_calls_through_a_lane_of_eight_are_all_answered() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(8, 1, 1), None).await.unwrap();
        let calls = (0..1000).map(|id| run(&lanes, fx.job("read_file", json!({"id": id}))));
        let outs = within(futures::future::join_all(calls)).await;
        for (id, out) in outs.iter().enumerate() {
            assert_eq!(out.content, format!("done {id}"));
        }
        assert!(fx.stats.max_running.load(Ordering::SeqCst) <= 8);
        assert_eq!(fx.stats.finished.load(Ordering::SeqCst), 1000);
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn a_running_call_whose_caller_gave_up_is_cancelled_and_released() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(1, 1, 1), None).await.unwrap();
        let call = run(&lanes, fx.job("build", json!({"id": 1, "sleep_ms": 5_000})));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), call)
                .await
                .is_err()
        );
        // The worker drops the call soon after its caller left (a command would be killed),
        // long before the tool would have finished on its own.
        wait_for_load(&lanes, Lane::Heavy, 0, 0).await;
        assert_eq!(fx.stats.finished.load(Ordering::SeqCst), 0);
        // Neither the pool nor the worker keeps any part of the job.
        eventually("the job to be released", || {
            Arc::strong_count(&fx.ctx) == 1 && Arc::strong_count(&fx.tools) == 1
        })
        .await;
        wait_for_load(&lanes, Lane::Heavy, 0, 0).await;
        let out = run(&lanes, fx.job("build", json!({"id": 2}))).await;
        assert_eq!(out.content, "done 2");
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn a_queued_call_whose_caller_gave_up_is_skipped() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(1, 1, 1), None).await.unwrap();
        let first = tokio::spawn({
            let lanes = lanes.clone();
            let job = fx.job("build", json!({"id": 1, "sleep_ms": 400}));
            async move { run(&lanes, job).await }
        });
        wait_for_load(&lanes, Lane::Heavy, 1, 0).await;
        let queued = run(&lanes, fx.job("build", json!({"id": 2})));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), queued)
                .await
                .is_err()
        );
        assert_eq!(first.await.unwrap().content, "done 1");
        let out = run(&lanes, fx.job("build", json!({"id": 3}))).await;
        assert_eq!(out.content, "done 3");
        assert_eq!(fx.stats.started(), vec![1, 3]);
        lanes.stop_and_wait().await;
    }

    #[tokio::test]
    async fn stop_ends_the_actors_and_answers_pending_calls() {
        let fx = Fixture::new();
        let lanes = ToolLanes::start(sizes(2, 2, 1), None).await.unwrap();
        let mut cells: Vec<ActorCell> = Vec::new();
        for h in [&lanes.no_net, &lanes.net, &lanes.heavy] {
            cells.push(h.pool.get_cell());
            cells.extend(h.pool.get_children());
        }
        assert_eq!(cells.len(), 3 + 5);
        let running = tokio::spawn({
            let lanes = lanes.clone();
            let job = fx.job("build", json!({"id": 1, "sleep_ms": 10_000}));
            async move { run(&lanes, job).await }
        });
        wait_for_load(&lanes, Lane::Heavy, 1, 0).await;
        let queued = tokio::spawn({
            let lanes = lanes.clone();
            let job = fx.job("build", json!({"id": 2}));
            async move { run(&lanes, job).await }
        });
        wait_for_load(&lanes, Lane::Heavy, 1, 1).await;

        lanes.stop();
        for out in [running.await.unwrap(), queued.await.unwrap()] {
            assert!(out.is_error);
            assert!(out.content.contains("stopped before"), "{}", out.content);
        }
        eventually("every lane actor to stop", || {
            cells.iter().all(|c| c.get_status() == ActorStatus::Stopped)
        })
        .await;
        assert_eq!(fx.stats.finished.load(Ordering::SeqCst), 0);
        let out = run(&lanes, fx.job("read_file", json!({"id": 3}))).await;
        assert!(out.is_error);
        assert!(out.content.contains("not running"), "{}", out.content);
        assert_eq!(lanes.load(Lane::NoNet).await, None);
    }

    struct Supervisor;

    impl Actor for Supervisor {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<()>,
            _args: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle_supervisor_evt(
            &self,
            _myself: ActorRef<()>,
            _event: SupervisionEvent,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn pools_are_linked_to_the_given_supervisor() {
        let fx = Fixture::new();
        let (sup, _) = Actor::spawn(None, Supervisor, ()).await.unwrap();
        let lanes = ToolLanes::start(sizes(1, 1, 1), Some(sup.get_cell()))
            .await
            .unwrap();
        let mut children: Vec<ActorId> = sup.get_children().iter().map(|c| c.get_id()).collect();
        let mut pools: Vec<ActorId> = [&lanes.no_net, &lanes.net, &lanes.heavy]
            .iter()
            .map(|h| h.pool.get_id())
            .collect();
        children.sort();
        pools.sort();
        assert_eq!(children, pools);
        // Stopping the supervisor takes the lanes down with it.
        sup.stop_and_wait(None, None).await.unwrap();
        eventually("the pools to stop", || {
            [&lanes.no_net, &lanes.net, &lanes.heavy]
                .iter()
                .all(|h| h.pool.get_status() == ActorStatus::Stopped)
        })
        .await;
        let out = run(&lanes, fx.job("read_file", json!({"id": 1}))).await;
        assert!(out.content.contains("not running"), "{}", out.content);
    }
}
