//! The daemon: root supervisor of a run, and `Runtime`, the handle that starts and drives
//! it.
//!
//! ```text
//! Daemon (root supervisor)
//! ├── Coordinator      registry of live loops; routes queries, shares, alerts
//! ├── Watcher          one notify watcher over all worktrees
//! ├── ToolLanes        a supervised pool of ToolWorker actors per lane (no-net, net, heavy)
//! └── LoopActor × N    one per loop; its engine and answerers run in tasks it owns
//! ```
//!
//! A loop actor that panics (in its handlers or in its engine) is restarted by the daemon,
//! at most [`MAX_LOOP_RESTARTS`] times per loop: the new actor keeps the loop's inbox and
//! progress notes and goes on at the iteration after the last one started, as a resumed run
//! would, and the restart is a `loop_restarted` event. Past the limit the loop fails with the
//! panic's message. Queries waiting on the panicked actor fail at once (the coordinator
//! monitors it). The daemon itself keeps running.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::sync::{mpsc, watch};

use crate::coordinator::{
    CoordMsg, Coordinator, CoordinatorArgs, CoordinatorLimits, CoordinatorPort,
};
use crate::coordinator_handle::CoordinatorHandle;
use crate::loop_actor::{LoopActor, LoopSpec, LoopStart};
use crate::messages::LoopMsg;
use crate::remote_loop::RemoteLoop;
use crate::tool_lanes::{LaneSizes, LanesError, ToolLanes};
use crate::upstream::Upstream;
use crate::watcher::{Watcher, WatcherMsg};
use td_base::sync::lock;
use td_engine::LoopEnd;
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolError;

/// What can go wrong starting or driving a runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// An actor of the runtime itself did not start (`what`: the daemon, the coordinator,
    /// the file watcher).
    #[error("{what} could not start: {reason}")]
    Start {
        /// Which actor.
        what: &'static str,
        /// What ractor said.
        reason: String,
    },
    /// The tool lanes did not start.
    #[error(transparent)]
    Lanes(#[from] LanesError),
    /// A loop of that name is running already.
    #[error("a loop named '{0}' is already running")]
    LoopExists(String),
    /// A loop actor did not start.
    #[error("loop {name} could not start: {reason}")]
    LoopStart {
        /// The loop.
        name: String,
        /// What ractor said.
        reason: String,
    },
    /// The daemon actor is gone (the runtime is shutting down).
    #[error("the daemon is not running: {0}")]
    DaemonGone(String),
    /// The daemon did not answer a request about a loop.
    #[error("the daemon did not answer for loop {0}")]
    NoAnswer(String),
    /// No loop of that name was started.
    #[error("no loop named '{0}'")]
    NoSuchLoop(String),
    /// The loop's actor has stopped.
    #[error("loop '{0}' has already stopped")]
    AlreadyStopped(String),
}

fn start_failed(what: &'static str) -> impl FnOnce(ractor::SpawnErr) -> RuntimeError {
    move |e| RuntimeError::Start {
        what,
        reason: e.to_string(),
    }
}

/// How many times one loop's actor is restarted after a panic before the loop fails. A
/// panic that repeats at every iteration is a bug, not bad luck: three more tries bound
/// what it costs.
pub const MAX_LOOP_RESTARTS: u32 = 3;

/// The live actor of each loop, by loop name, and the loops asked to stop: shared by the
/// daemon (which replaces a restarted loop's actor) and the [`Runtime`] (which stops them).
#[derive(Default)]
struct Live {
    actors: BTreeMap<String, ActorRef<LoopMsg>>,
    /// Loops a stop was asked of: a restart after it is told to stop too, so a panic
    /// between the request and the loop's end does not undo it.
    stopping: BTreeSet<String>,
}

type LiveLoops = Arc<Mutex<Live>>;

/// Messages of the daemon.
pub enum DaemonMsg {
    /// Start a loop actor under the daemon's supervision.
    SpawnLoop {
        /// The loop.
        spec: Box<LoopSpec>,
        /// The file watcher serving the loop, told of a restarted loop's new actor.
        watcher: Option<ActorRef<WatcherMsg>>,
        /// Its actor, or why it could not start.
        reply: RpcReplyPort<Result<ActorRef<LoopMsg>, RuntimeError>>,
    },
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for DaemonMsg {}

/// A loop the daemon supervises.
struct Supervised {
    spec: LoopSpec,
    inbox: Arc<td_engine::Inbox>,
    progress: Arc<td_engine::ProgressNotes>,
    restarts: u32,
    watcher: Option<ActorRef<WatcherMsg>>,
}

/// The daemon's state: which child is which loop.
pub struct DaemonState {
    loops: HashMap<ActorId, Supervised>,
    events: Arc<EventLog>,
    live: LiveLoops,
    /// The last iteration each loop started (from the events), where a restart goes on.
    started: Arc<Mutex<HashMap<String, u32>>>,
}

/// Arguments of the daemon.
pub struct DaemonArgs {
    events: Arc<EventLog>,
    live: LiveLoops,
}

/// The root supervisor.
pub struct Daemon;

impl Actor for Daemon {
    type Msg = DaemonMsg;
    type State = DaemonState;
    type Arguments = DaemonArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<DaemonMsg>,
        args: DaemonArgs,
    ) -> Result<DaemonState, ActorProcessingErr> {
        let started = Arc::new(Mutex::new(HashMap::new()));
        let seen = started.clone();
        args.events.subscribe(move |e| {
            if let EventKind::IterationStarted {
                loop_name,
                iteration,
            } = &e.kind
            {
                lock(&seen).insert(loop_name.clone(), *iteration);
            }
        });
        Ok(DaemonState {
            loops: HashMap::new(),
            events: args.events,
            live: args.live,
            started,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<DaemonMsg>,
        message: DaemonMsg,
        state: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            DaemonMsg::SpawnLoop {
                spec,
                watcher,
                reply,
            } => {
                let start = LoopStart::first(*spec);
                let supervised = Supervised {
                    spec: start.spec.clone(),
                    inbox: start.inbox.clone(),
                    progress: start.progress.clone(),
                    restarts: 0,
                    watcher,
                };
                let name = supervised.spec.config.name.clone();
                let result = Actor::spawn_linked(None, LoopActor, start, myself.get_cell())
                    .await
                    .map(|(actor, _)| actor)
                    .map_err(|e| RuntimeError::LoopStart {
                        name: name.clone(),
                        reason: e.to_string(),
                    });
                if let Ok(actor) = &result {
                    state.loops.insert(actor.get_id(), supervised);
                    lock(&state.live).actors.insert(name, actor.clone());
                }
                let _ = reply.send(result);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<DaemonMsg>,
        event: SupervisionEvent,
        state: &mut DaemonState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some(loop_) = state.loops.remove(&cell.get_id()) {
                    let name = loop_.spec.config.name.clone();
                    let last = lock(&state.started).get(&name).copied();
                    if let Err((loop_, why)) =
                        restart(&myself, state, loop_, last, &err.to_string()).await
                    {
                        // The loop's own `finish` never ran: report its end here.
                        let reason = format!("the loop actor crashed: {why}");
                        state.events.record(EventKind::LoopFailed {
                            loop_name: name.clone(),
                            reason: reason.clone(),
                        });
                        if let Some(tx) = &loop_.spec.ended {
                            let iterations = last.unwrap_or(0);
                            let _ = tx.send((name, LoopEnd::Failed { iterations, reason }));
                        }
                    }
                } else {
                    tracing::error!("a runtime actor failed: {err}");
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                state.loops.remove(&cell.get_id());
            }
            _ => {}
        }
        // Never stop the daemon because a child ended: loops end all the time.
        Ok(())
    }
}

/// Starts a new actor for a loop whose actor panicked with `reason`, at the iteration after
/// `last` (the last one it started). When the loop used up its restarts, or the new actor
/// does not start, gives the loop back with why it was not restarted.
async fn restart(
    myself: &ActorRef<DaemonMsg>,
    state: &mut DaemonState,
    mut loop_: Supervised,
    last: Option<u32>,
    reason: &str,
) -> Result<(), (Box<Supervised>, String)> {
    let name = loop_.spec.config.name.clone();
    if loop_.restarts >= MAX_LOOP_RESTARTS {
        let why = format!("{reason} (restarted {MAX_LOOP_RESTARTS} times already, the limit)");
        return Err((Box::new(loop_), why));
    }
    loop_.restarts += 1;
    if let Some(last) = last {
        // The iteration the panic cut counts as run, as after a crash and resume.
        loop_.spec.config.first_iteration = loop_
            .spec
            .config
            .first_iteration
            .max(last.saturating_add(1));
    }
    state.events.record(EventKind::LoopRestarted {
        loop_name: name.clone(),
        restarts: loop_.restarts,
        reason: reason.to_string(),
    });
    let start = LoopStart {
        spec: loop_.spec.clone(),
        inbox: loop_.inbox.clone(),
        progress: loop_.progress.clone(),
        restarted: true,
    };
    let actor = match Actor::spawn_linked(None, LoopActor, start, myself.get_cell()).await {
        Ok((actor, _)) => actor,
        Err(e) => {
            let why = format!("{reason}; its restart failed: {e}");
            return Err((Box::new(loop_), why));
        }
    };
    if let Some(w) = &loop_.watcher {
        // The watcher's notices go to the new actor.
        let _ = w.cast(WatcherMsg::Unwatch {
            loop_name: name.clone(),
        });
        let _ = w.cast(WatcherMsg::Watch {
            loop_name: name.clone(),
            ctx: loop_.spec.ctx.clone(),
            target: actor.clone(),
            reply: None,
        });
    }
    let stopping = {
        let mut live = lock(&state.live);
        live.actors.insert(name.clone(), actor.clone());
        live.stopping.contains(&name)
    };
    if stopping {
        let _ = actor.cast(LoopMsg::Stop);
    }
    state.loops.insert(actor.get_id(), loop_);
    Ok(())
}

/// Settings of a runtime.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Workers per tool lane.
    pub lanes: LaneSizes,
    /// Coordinator limits.
    pub limits: CoordinatorLimits,
    /// Whether to watch worktrees for outside changes.
    pub watch_files: bool,
    /// A worker host's runtime: the head's coordinator, where all its loops' coordination
    /// goes (the head routes, limits and records it; this runtime routes nothing itself).
    /// `None` on the head and on a single machine.
    pub upstream: Option<Arc<dyn Upstream>>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            lanes: LaneSizes::default(),
            limits: CoordinatorLimits::default(),
            watch_files: true,
            upstream: None,
        }
    }
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("lanes", &self.lanes)
            .field("limits", &self.limits)
            .field("watch_files", &self.watch_files)
            .field("upstream", &self.upstream.is_some())
            .finish()
    }
}

/// A running actor tree and the handles to drive it.
pub struct Runtime {
    daemon: ActorRef<DaemonMsg>,
    /// The coordinator.
    pub coordinator: ActorRef<CoordMsg>,
    watcher: Option<ActorRef<WatcherMsg>>,
    /// The tool lanes.
    pub lanes: ToolLanes,
    /// The run's events.
    pub events: Arc<EventLog>,
    ended_tx: mpsc::UnboundedSender<(String, LoopEnd)>,
    ended_rx: mpsc::UnboundedReceiver<(String, LoopEnd)>,
    loops: LiveLoops,
    gate: watch::Sender<bool>,
}

impl Runtime {
    /// Starts the daemon, coordinator, watcher and lanes.
    pub async fn start(config: RuntimeConfig, events: Arc<EventLog>) -> Result<Self, RuntimeError> {
        let loops = LiveLoops::default();
        let args = DaemonArgs {
            events: events.clone(),
            live: loops.clone(),
        };
        let (daemon, _) = Actor::spawn(None, Daemon, args)
            .await
            .map_err(start_failed("the daemon"))?;
        let cell: ActorCell = daemon.get_cell();
        let (coordinator, _) = Actor::spawn_linked(
            None,
            Coordinator,
            CoordinatorArgs {
                limits: config.limits,
                events: events.clone(),
                upstream: config.upstream,
            },
            cell.clone(),
        )
        .await
        .map_err(start_failed("the coordinator"))?;
        let watcher = if config.watch_files {
            let (w, _) = Actor::spawn_linked(None, Watcher, (), cell.clone())
                .await
                .map_err(start_failed("the file watcher"))?;
            Some(w)
        } else {
            None
        };
        let lanes =
            ToolLanes::start_recording(config.lanes, Some(cell), Some(events.clone())).await?;
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        Ok(Self {
            daemon,
            coordinator,
            watcher,
            lanes,
            events,
            ended_tx,
            ended_rx,
            loops,
            gate: watch::channel(false).0,
        })
    }

    /// A tool context for a loop of this run: sandboxed to `worktree`, connected to the
    /// coordinator. Add commands and catalog with its `with_*` methods.
    pub fn context(&self, worktree: &Path, name: &str) -> Result<ToolContext, ToolError> {
        Ok(ToolContext::new(worktree, name)?
            .with_coordination(Arc::new(CoordinatorPort::new(self.coordinator.clone()))))
    }

    /// Starts a loop actor. Its engine begins once [`Runtime::release`] was called (at once
    /// when it already was). Its end is reported by [`Runtime::next_end`].
    pub async fn spawn_loop(&mut self, mut spec: LoopSpec) -> Result<(), RuntimeError> {
        let name = spec.config.name.clone();
        if lock(&self.loops).actors.contains_key(&name) {
            return Err(RuntimeError::LoopExists(name));
        }
        spec.ended = Some(self.ended_tx.clone());
        spec.gate = Some(self.gate.subscribe());
        let ctx = spec.ctx.clone();
        let actor = self
            .daemon
            .call(
                |reply| DaemonMsg::SpawnLoop {
                    spec: Box::new(spec),
                    watcher: self.watcher.clone(),
                    reply,
                },
                None,
            )
            .await
            .map_err(|e| RuntimeError::DaemonGone(e.to_string()))?
            .success_or(RuntimeError::NoAnswer(name.clone()))??;
        if let Some(w) = &self.watcher {
            let _ = w.cast(WatcherMsg::Watch {
                loop_name: name.clone(),
                ctx,
                target: actor.clone(),
                reply: None,
            });
        }
        Ok(())
    }

    /// Lets every loop spawned so far (and every later one) begin iterating. The coordinator
    /// is flushed first, so the "loop started" alerts of all registered loops are already in
    /// their recipients' inboxes when the first model turn happens.
    pub async fn release(&self) {
        self.flush().await;
        self.gate.send_replace(true);
    }

    /// Returns once the coordinator has handled every message sent to it before this call
    /// (e.g. the system alerts of loops that just ended); on a host, once the head was told
    /// everything the coordinator queued for it before.
    pub async fn flush(&self) {
        let _ = self.coordinator.call(CoordMsg::Flush, None).await;
    }

    /// A cloneable handle on this runtime's coordinator for what crosses processes (the
    /// methods below, for a host agent that runs beside the runtime's owner).
    pub fn handle(&self) -> CoordinatorHandle {
        CoordinatorHandle::new(self.coordinator.clone())
    }

    /// Head side: see [`CoordinatorHandle::register_remote`].
    pub async fn register_remote(
        &self,
        name: &str,
        loop_type: &str,
        task: &str,
        subscriptions: Option<Vec<String>>,
        link: Arc<dyn RemoteLoop>,
    ) -> Result<(), RuntimeError> {
        self.handle()
            .register_remote(name, loop_type, task, subscriptions, link)
            .await
    }

    /// Head side: see [`CoordinatorHandle::drop_remote`].
    pub async fn drop_remote(&self, name: &str, reason: &str) -> bool {
        self.handle().drop_remote(name, reason).await
    }

    /// Host side: see [`CoordinatorHandle::deliver_local`].
    pub async fn deliver_local(
        &self,
        name: &str,
        delivery: Option<u64>,
        item: Arc<InboxItem>,
    ) -> bool {
        self.handle().deliver_local(name, delivery, item).await
    }

    /// Host side: see [`CoordinatorHandle::answer_local`].
    pub async fn answer_local(
        &self,
        name: &str,
        from: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        self.handle()
            .answer_local(name, from, question, timeout)
            .await
    }

    /// The worktree roots of the loops the file watcher serves now (empty when watching is
    /// off).
    pub async fn watched_roots(&self) -> Vec<PathBuf> {
        let Some(w) = &self.watcher else {
            return Vec::new();
        };
        match w.call(WatcherMsg::WatchedRoots, None).await {
            Ok(ractor::rpc::CallResult::Success(roots)) => roots,
            _ => Vec::new(),
        }
    }

    /// Asks a loop to stop after its tool call in flight.
    pub fn stop_loop(&self, name: &str) -> Result<(), RuntimeError> {
        self.ask_stop(name, LoopMsg::Stop)
    }

    /// Asks a loop to stop now: its tool calls (or validation) in flight are cancelled (a
    /// command's process group killed), the iteration ends stopped, and the loop ends as
    /// stopped with its actor kept, as after [`Runtime::stop_loop`] (see `LoopMsg::StopNow`).
    pub fn stop_loop_now(&self, name: &str) -> Result<(), RuntimeError> {
        self.ask_stop(name, LoopMsg::StopNow)
    }

    fn ask_stop(&self, name: &str, message: LoopMsg) -> Result<(), RuntimeError> {
        // Noted and looked up under one lock: a restart either happened already (the new
        // actor is told here) or sees the note (and tells it).
        let actor = {
            let mut live = lock(&self.loops);
            let actor = live
                .actors
                .get(name)
                .cloned()
                .ok_or_else(|| RuntimeError::NoSuchLoop(name.to_string()))?;
            live.stopping.insert(name.to_string());
            actor
        };
        actor
            .cast(message)
            .map_err(|_| RuntimeError::AlreadyStopped(name.to_string()))
    }

    /// Stops a loop at once, without waiting for its tool call in flight: its engine is
    /// aborted, and a command it was running is killed with its process group (the worker
    /// drops the abandoned call). The loop ends as stopped.
    pub fn kill_loop(&self, name: &str) -> Result<(), RuntimeError> {
        let actor = self.live(name)?;
        actor.stop(Some("stopped at once (second Ctrl-C)".to_string()));
        Ok(())
    }

    /// The live actor of loop `name` (the latest one, after a restart).
    fn live(&self, name: &str) -> Result<ActorRef<LoopMsg>, RuntimeError> {
        lock(&self.loops)
            .actors
            .get(name)
            .cloned()
            .ok_or_else(|| RuntimeError::NoSuchLoop(name.to_string()))
    }

    /// Lets a loop that ended run again: its actor (kept after its end to answer other
    /// loops' queries) is stopped and forgotten, so that [`Runtime::spawn_loop`] can start
    /// a new one under the same name (the merge queue hands a completed loop's work back to
    /// it). The coordinator's entry goes to the new actor when it registers.
    pub fn retire_loop(&self, name: &str) -> Result<(), RuntimeError> {
        let actor = {
            let mut live = lock(&self.loops);
            live.stopping.remove(name);
            live.actors
                .remove(name)
                .ok_or_else(|| RuntimeError::NoSuchLoop(name.to_string()))?
        };
        actor.stop(Some("ended; started again".to_string()));
        Ok(())
    }

    /// The next loop to end, or `None` after `timeout`.
    pub async fn next_end(&mut self, timeout: Duration) -> Option<(String, LoopEnd)> {
        let (name, end) = tokio::time::timeout(timeout, self.ended_rx.recv())
            .await
            .ok()
            .flatten()?;
        // An ended loop edits nothing more and ignores changes; its worktree's watch (and the
        // context the watcher holds for it) is released now rather than when the run ends,
        // so a long run with many loops does not keep every finished loop's inotify watches.
        // The actor itself stays until the run ends: it still answers other loops' queries.
        self.unwatch(&name);
        Some((name, end))
    }

    fn unwatch(&self, name: &str) {
        if let Some(w) = &self.watcher {
            let _ = w.cast(WatcherMsg::Unwatch {
                loop_name: name.to_string(),
            });
        }
    }

    /// Waits until every loop in `names` has ended (or `timeout` passes) and returns the ends
    /// seen, by loop name.
    pub async fn wait_for(
        &mut self,
        names: &[&str],
        timeout: Duration,
    ) -> BTreeMap<String, LoopEnd> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut ends = BTreeMap::new();
        while names.iter().any(|n| !ends.contains_key(*n)) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_end(left).await {
                Some((name, end)) => {
                    ends.insert(name, end);
                }
                None => break,
            }
        }
        ends
    }

    /// Stops every loop and every runtime actor.
    pub async fn shutdown(self) {
        let loops = lock(&self.loops).actors.clone();
        for (name, actor) in &loops {
            self.unwatch(name);
            actor.stop(Some("run ended".to_string()));
        }
        // Waited for: a call still running in a worker (only after a forced stop) is dropped
        // as its worker is killed, and that kills a command's process group before the
        // process can exit and leave it behind.
        self.lanes.stop_and_wait().await;
        if let Some(w) = &self.watcher {
            w.stop(None);
        }
        self.coordinator.stop(None);
        self.daemon.stop(None);
    }
}
