//! The loop actor: one per loop. It owns the loop's `ToolContext`, inbox and progress, runs
//! the iteration engine in a task of its own (so its mailbox stays open while the loop
//! works), and meanwhile takes deliveries, file-change notices, queries and stop requests.
//!
//! The loop's tool calls, its engine's and those of its answers alike, take one
//! [`CallPath`]: the routes of its tools, the tool lanes, and its receipt log.
//!
//! Queries to the loop are answered by its [`Answerer`] (a side model call with the loop's
//! task and progress), which the actor hands to the coordinator when it registers: each
//! answer runs in the asking loop's task, concurrently with this loop's iteration (two loops
//! that ask each other at the same moment both get answers), and the coordinator cancels
//! them when this loop leaves the run, so a query still waiting on it fails at once instead
//! of hanging. When the actor stops, the engine task it started is aborted.

use std::sync::Arc;

use futures::FutureExt as _;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::coordinator::{CoordMsg, SYSTEM_SENDER};
use crate::messages::LoopMsg;
use td_engine::budget::Budgets;
use td_engine::transcript::TranscriptSink;
use td_engine::{Answerer, Engine, EngineConfig, Inbox, LoopEnd, ProgressNotes, StopRequest};
use td_llm::LlmClient;
use td_protocol::events::{EventKind, EventLog};
use td_toolkit::call_path::{CallPath, LaneRunner};
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::ReceiptLog;
use td_toolkit::registry::ToolSet;

/// Everything a loop actor needs to run one loop.
#[derive(Clone)]
pub struct LoopSpec {
    /// Engine settings (name, type, task, limits, templates).
    pub config: EngineConfig,
    /// The loop's private tool context (connected to the coordinator).
    pub ctx: Arc<ToolContext>,
    /// The tools its model sees.
    pub tools: Arc<ToolSet>,
    /// The tool set of the loop's validation step (`validate`; the engine calls it through
    /// its `validation` call path).
    pub validation_tools: Arc<ToolSet>,
    /// The model.
    pub llm: Arc<dyn LlmClient>,
    /// Where lane tools run (the tool lanes in a run).
    pub runner: Arc<dyn LaneRunner>,
    /// The run's coordinator.
    pub coordinator: ActorRef<CoordMsg>,
    /// The run's events.
    pub events: Arc<EventLog>,
    /// The loop's transcript.
    pub transcript: Arc<dyn TranscriptSink>,
    /// The loop's receipts, if kept (also of the calls its answers make).
    pub receipts: Option<Arc<ReceiptLog>>,
    /// Alert event types the loop hears; `None` = every loop's `broadcast_alert` and no
    /// system alert (a peer's start or end is heard only when subscribed to).
    pub subscriptions: Option<Vec<String>>,
    /// Told once when the loop ends.
    pub ended: Option<mpsc::UnboundedSender<(String, LoopEnd)>>,
    /// When given, the engine waits until it reads `true` before its first iteration: a run
    /// registers all its loops first, so every loop starts knowing its peers.
    pub gate: Option<watch::Receiver<bool>>,
    /// Items delivered before a crash and never shown (a resumed run), with their numbers.
    pub initial_inbox: Vec<td_protocol::inbox::Delivered>,
    /// Progress notes of earlier iterations (a resumed run).
    pub initial_progress: Vec<String>,
    /// The loop was announced by an earlier process of this run (a resumed run whose record
    /// has its `loop_started`): it goes on without a second `loop_started` event or alert.
    pub announced: bool,
    /// The run's budgets: the loop's calls are charged to its account there (opened by
    /// whoever starts the loop; without one, to the run's alone), its answers to the askers'.
    pub budgets: Arc<Budgets>,
}

/// How a loop actor starts: its spec, and the inbox and progress notes that outlive the
/// actor (a restarted actor goes on with the items and notes of the one that panicked).
pub struct LoopStart {
    pub(crate) spec: LoopSpec,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) progress: Arc<ProgressNotes>,
    /// The loop was announced already (a restart after a panic, or a loop of a resumed run
    /// that had started): no `loop_started` again.
    pub(crate) restarted: bool,
}

impl LoopStart {
    /// The first start of a loop: inbox and notes from the spec (a resumed run's).
    pub(crate) fn first(spec: LoopSpec) -> Self {
        let inbox = Arc::new(Inbox::default());
        for delivered in &spec.initial_inbox {
            inbox.push(delivered.delivery, Arc::new(delivered.item.clone()));
        }
        let progress = Arc::new(ProgressNotes::default());
        for note in &spec.initial_progress {
            progress.push(note.clone());
        }
        let restarted = spec.announced;
        Self {
            spec,
            inbox,
            restarted,
            progress,
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Aborts its task when dropped, so that no task outlives the actor that started it (also
/// when the actor fails and `post_stop` is skipped).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The state of a loop actor.
pub struct LoopState {
    spec: LoopSpec,
    /// The loop's calls, shared by its engine and its answerer.
    calls: Arc<CallPath>,
    inbox: Arc<Inbox>,
    progress: Arc<ProgressNotes>,
    stop: watch::Sender<StopRequest>,
    engine: Option<AbortOnDrop>,
    end: Option<LoopEnd>,
}

/// The loop actor.
pub struct LoopActor;

impl Actor for LoopActor {
    type Msg = LoopMsg;
    type State = LoopState;
    type Arguments = LoopStart;

    async fn pre_start(
        &self,
        myself: ActorRef<LoopMsg>,
        start: LoopStart,
    ) -> Result<LoopState, ActorProcessingErr> {
        let LoopStart {
            spec,
            inbox,
            progress,
            restarted,
        } = start;
        let name = spec.config.name.clone();
        let calls = Arc::new(CallPath::new(
            spec.ctx.clone(),
            spec.tools.clone(),
            spec.runner.clone(),
            spec.receipts.clone(),
        ));
        let answerer = Arc::new(
            Answerer::new(
                &spec.config,
                calls.clone(),
                spec.llm.clone(),
                progress.clone(),
                spec.transcript.clone(),
                spec.budgets.clone(),
            )
            .with_events(spec.events.clone()),
        );
        spec.coordinator
            .call(
                |reply| CoordMsg::Register {
                    name: name.clone(),
                    loop_type: spec.config.loop_type.clone(),
                    task: spec.config.task.clone(),
                    subscriptions: spec.subscriptions.clone(),
                    actor: myself.clone(),
                    inbox: inbox.clone(),
                    answerer,
                    reply,
                },
                None,
            )
            .await
            .map_err(|e| format!("loop {name}: cannot register with the coordinator: {e}"))?
            .success_or(format!(
                "loop {name}: the coordinator stopped before registering it"
            ))?
            .map_err(|why| format!("loop {name}: cannot register: {why}"))?;
        // A restarted loop was announced when it first started (its restart is an event of
        // the daemon's).
        if !restarted {
            spec.events.record(EventKind::LoopStarted {
                loop_name: name.clone(),
                loop_type: spec.config.loop_type.clone(),
                host: None,
            });
            system_alert(
                &spec.coordinator,
                &name,
                "loop_started",
                format!("loop `{name}` started: {}", first_line(&spec.config.task)),
            );
        }
        let (stop, _) = watch::channel(StopRequest::None);
        Ok(LoopState {
            spec,
            calls,
            inbox,
            progress,
            stop,
            engine: None,
            end: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<LoopMsg>,
        state: &mut LoopState,
    ) -> Result<(), ActorProcessingErr> {
        let spec = &state.spec;
        let engine = Engine {
            config: spec.config.clone(),
            calls: state.calls.clone(),
            validation: CallPath::new(
                spec.ctx.clone(),
                spec.validation_tools.clone(),
                spec.runner.clone(),
                spec.receipts.clone(),
            ),
            llm: spec.llm.clone(),
            inbox: state.inbox.clone(),
            progress: state.progress.clone(),
            events: spec.events.clone(),
            transcript: spec.transcript.clone(),
            stop: state.stop.subscribe(),
            account: spec.budgets.account(&spec.config.name),
        };
        let gate = spec.gate.clone();
        let task = tokio::spawn(async move {
            if let Some(mut gate) = gate
                && gate.wait_for(|open| *open).await.is_err()
            {
                // The run went away before opening the gate.
                let _ = myself.cast(LoopMsg::EngineDone(LoopEnd::Stopped {
                    iterations: 0,
                    reason: None,
                }));
                return;
            }
            // A panic in the engine (a model client's or the engine's own bug) would end
            // this task silently and leave the loop waiting forever: it fails the actor
            // instead, which the daemon restarts.
            let msg = match std::panic::AssertUnwindSafe(engine.run())
                .catch_unwind()
                .await
            {
                Ok(end) => LoopMsg::EngineDone(end),
                Err(payload) => LoopMsg::EnginePanicked(panic_message(payload.as_ref())),
            };
            let _ = myself.cast(msg);
        });
        state.engine = Some(AbortOnDrop(task));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<LoopMsg>,
        message: LoopMsg,
        state: &mut LoopState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            LoopMsg::FileChanged(path) => {
                // An ended loop edits nothing more: a change is no news to it.
                if state.end.is_some() {
                    return Ok(());
                }
                // Comparing reads the whole file. A large one is read off the async threads,
                // which run every other loop's messages; a small one takes less time than
                // handing it to a blocking thread (~0.1 ms).
                const READ_INLINE_MAX: u64 = 256 * 1024;
                let ctx = Arc::clone(&state.spec.ctx);
                let small = std::fs::metadata(&path).is_ok_and(|m| m.len() <= READ_INLINE_MAX);
                let dropped = if small {
                    Ok(ctx.note_outside_change(&path))
                } else {
                    let checked = path.clone();
                    tokio::task::spawn_blocking(move || ctx.note_outside_change(&checked)).await
                };
                match dropped {
                    Ok(true) => state.spec.events.record(EventKind::FileChanged {
                        loop_name: state.spec.config.name.clone(),
                        path: state.spec.ctx.display(&path),
                    }),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        "loop {}: checking '{}' for an outside change failed: {e}",
                        state.spec.config.name,
                        path.display()
                    ),
                }
            }
            LoopMsg::Stop => ask_stop(&myself, state, StopRequest::AfterCall),
            LoopMsg::StopNow => ask_stop(&myself, state, StopRequest::Now),
            LoopMsg::EnginePanicked(message) => {
                state.engine = None;
                return Err(format!("panicked: {message}").into());
            }
            LoopMsg::EngineDone(end) => {
                finish(state, &end);
                let stopped = matches!(end, LoopEnd::Stopped { .. });
                state.end = Some(end);
                state.engine = None;
                if stopped || state.stop.borrow().requested() {
                    myself.stop(Some("stop requested".to_string()));
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<LoopMsg>,
        state: &mut LoopState,
    ) -> Result<(), ActorProcessingErr> {
        // Dropping the handle aborts the engine if it is still running. (Answers in progress
        // are aborted by the coordinator when it sees this actor end.)
        if state.engine.take().is_some() && state.end.is_none() {
            let end = LoopEnd::Stopped {
                iterations: 0,
                reason: None,
            };
            finish(state, &end);
            state.end = Some(end);
        }
        Ok(())
    }
}

/// Passes a stop request to the engine, never weakening one made before (a stop "now" stays
/// one when a plain stop follows); an ended loop's actor stops at once.
fn ask_stop(myself: &ActorRef<LoopMsg>, state: &LoopState, asked: StopRequest) {
    state.stop.send_if_modified(|current| {
        let stronger = asked > *current;
        if stronger {
            *current = asked;
        }
        stronger
    });
    if state.end.is_some() {
        myself.stop(Some("stop requested".to_string()));
    }
}

/// Records the end of a loop everywhere it matters: events, coordinator status, a system
/// alert to the other loops, and the run's `ended` channel.
fn finish(state: &LoopState, end: &LoopEnd) {
    let spec = &state.spec;
    let name = spec.config.name.clone();
    let (kind, alert) = match end {
        LoopEnd::Completed {
            iterations,
            summary,
        } => (
            EventKind::LoopCompleted {
                loop_name: name.clone(),
                iterations: *iterations,
                summary: summary.clone(),
            },
            Some((
                "loop_completed",
                match summary {
                    Some(s) => format!("loop `{name}` completed: {s}"),
                    None => format!("loop `{name}` completed"),
                },
            )),
        ),
        LoopEnd::Failed { reason, .. } => (
            EventKind::LoopFailed {
                loop_name: name.clone(),
                reason: reason.clone(),
            },
            Some(("loop_failed", format!("loop `{name}` failed: {reason}"))),
        ),
        LoopEnd::Paused { reason, .. } => (
            EventKind::LoopPaused {
                loop_name: name.clone(),
                reason: reason.clone(),
            },
            Some(("loop_paused", format!("loop `{name}` paused: {reason}"))),
        ),
        LoopEnd::Stopped { .. } => (
            EventKind::LoopStopped {
                loop_name: name.clone(),
            },
            None,
        ),
    };
    spec.events.record(kind);
    let _ = spec.coordinator.cast(CoordMsg::SetStatus {
        name: name.clone(),
        status: end.status().to_string(),
    });
    if let Some((event_type, message)) = alert {
        system_alert(&spec.coordinator, &name, event_type, message);
    }
    let unread = state.inbox.len();
    if unread > 0 {
        spec.events.record(EventKind::InboxUnread {
            loop_name: name.clone(),
            items: unread,
        });
    }
    if let Some(tx) = &spec.ended {
        let _ = tx.send((name, end.clone()));
    }
}

fn system_alert(coordinator: &ActorRef<CoordMsg>, about: &str, event_type: &str, message: String) {
    let _ = coordinator.cast(CoordMsg::Alert {
        from: SYSTEM_SENDER.to_string(),
        event_type: event_type.to_string(),
        message,
        data: None,
        about: Some(about.to_string()),
        reply: None,
    });
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}
