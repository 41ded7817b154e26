//! The Ralph iteration engine: each iteration starts from a fresh context (task, progress
//! notes from earlier iterations, inbox), runs model turns with tool calls until the model
//! ends its turn, calls `complete_task` or reaches the turn limit, then runs the validation
//! command. Exit code equal to the success code completes the loop; otherwise the validation
//! output becomes a progress note for the next iteration.
//!
//! The engine knows nothing about actors: tools run through a `ToolRunner` (the tool lanes in
//! a run, a direct call in tests), inbox items come from a shared `Inbox`, and a stop request
//! arrives on a watch channel. Independent read-only calls of one response run concurrently;
//! calls that write run in order; a stop takes effect after the call in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

use td_base::sync::lock;
use td_base::text::head_tail;
use td_llm::{Block, LlmClient, LlmRequest, LlmResponse, Message, Purpose, Role};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_protocol::tool_definition::ToolDefinition;
use td_toolkit::catalog::Lane;
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::{ReceiptLog, SideEffect};
use td_toolkit::registry::{CallOutcome, ToolSet};

pub mod prompt;
pub mod transcript;

use transcript::{TranscriptEntry, TranscriptSink};

/// How a loop ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum LoopEnd {
    /// Validation passed.
    Completed {
        /// Iterations used.
        iterations: u32,
        /// The model's completion summary, if any.
        summary: Option<String>,
    },
    /// Gave up (max iterations, model errors...).
    Failed {
        /// Iterations used.
        iterations: u32,
        /// Why.
        reason: String,
    },
    /// Stopped on request, or because its record could not be written.
    Stopped {
        /// Iterations used.
        iterations: u32,
        /// Why, when the loop stopped itself (its record could not be written); `None` when
        /// it was asked to stop.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl LoopEnd {
    /// `completed`, `failed` or `stopped`.
    pub fn status(&self) -> &'static str {
        match self {
            LoopEnd::Completed { .. } => "completed",
            LoopEnd::Failed { .. } => "failed",
            LoopEnd::Stopped { .. } => "stopped",
        }
    }
}

/// Runs one tool call somewhere (a lane worker, or directly).
#[async_trait]
pub trait ToolRunner: Send + Sync {
    /// Runs the call and returns its outcome.
    async fn run(
        &self,
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        call_id: Option<String>,
        name: String,
        input: Value,
    ) -> CallOutcome;
}

/// Runs calls in the caller's task (tests, and coordination tools).
#[derive(Debug, Default, Clone, Copy)]
pub struct DirectRunner;

#[async_trait]
impl ToolRunner for DirectRunner {
    async fn run(
        &self,
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        call_id: Option<String>,
        name: String,
        input: Value,
    ) -> CallOutcome {
        tools.call(&ctx, call_id.as_deref(), &name, input).await
    }
}

/// Items waiting for the loop's next model turn.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Shared: an alert goes to every loop, and one copy per recipient made the inboxes of
    /// a 1,000-loop run hold a million copies of the "loop started" alerts.
    items: Mutex<VecDeque<Arc<InboxItem>>>,
}

impl Inbox {
    /// Adds an item.
    pub fn push(&self, item: Arc<InboxItem>) {
        lock(&self.items).push_back(item);
    }

    /// Takes every waiting item (each is shown exactly once).
    pub fn drain(&self) -> Vec<Arc<InboxItem>> {
        lock(&self.items).drain(..).collect()
    }

    /// How many items wait.
    pub fn len(&self) -> usize {
        lock(&self.items).len()
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Notes carried from one iteration to the next (and shown to query answerers).
#[derive(Debug, Default)]
pub struct ProgressNotes {
    notes: Mutex<Vec<String>>,
}

impl ProgressNotes {
    /// Adds a note.
    pub fn push(&self, note: String) {
        lock(&self.notes).push(note);
    }

    /// All notes so far.
    pub fn notes(&self) -> Vec<String> {
        lock(&self.notes).clone()
    }

    /// Calls `f` with the notes so far, without copying them (keep `f` short: it runs under
    /// the notes' lock).
    pub fn with_notes<R>(&self, f: impl FnOnce(&[String]) -> R) -> R {
        f(&lock(&self.notes))
    }
}

/// The per-loop settings of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Loop name (exec id).
    pub name: String,
    /// Loop type.
    pub loop_type: String,
    /// The task text.
    pub task: String,
    /// Iterations before the loop fails.
    pub max_iterations: u32,
    /// Model turns per iteration.
    pub max_turns: u32,
    /// Limit of one iteration's model turns (validation not included).
    pub iteration_timeout: Option<Duration>,
    /// Exit code of the validation command that means success.
    pub success_code: i32,
    /// System prompt template.
    pub system_template: String,
    /// First-message template of each iteration.
    pub iteration_template: String,
    /// Names of the other loops of the run (for the prompt).
    pub peers: Vec<String>,
    /// The number of the first iteration to run (greater than 1 when a run is resumed).
    pub first_iteration: u32,
}

/// Everything one loop's engine works with.
pub struct Engine {
    /// Settings.
    pub config: EngineConfig,
    /// The loop's tool context (private to the loop).
    pub ctx: Arc<ToolContext>,
    /// The tools its model sees.
    pub tools: Arc<ToolSet>,
    /// The tool the loop's validation step calls (`validate`), chosen by whoever builds the
    /// engine: the engine knows tools only through the toolkit's `ToolSet`.
    pub validation_tools: Arc<ToolSet>,
    /// The model.
    pub llm: Arc<dyn LlmClient>,
    /// Where tool calls run.
    pub runner: Arc<dyn ToolRunner>,
    /// Waiting shares and alerts.
    pub inbox: Arc<Inbox>,
    /// Notes across iterations.
    pub progress: Arc<ProgressNotes>,
    /// The run's events.
    pub events: Arc<EventLog>,
    /// The loop's transcript.
    pub transcript: Arc<dyn TranscriptSink>,
    /// The loop's receipts, if kept.
    pub receipts: Option<Arc<ReceiptLog>>,
    /// Becomes `true` when the loop must stop.
    pub stop: watch::Receiver<bool>,
}

/// Why an iteration's model turns ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TurnsEnded {
    EndTurn,
    CompleteTask,
    MaxTurns,
    Timeout,
    Stopped,
    ModelError(String),
    /// The run record (or a receipt) could not be written: nothing more may run.
    RecordUnwritable(String),
}

impl TurnsEnded {
    fn label(&self) -> &'static str {
        match self {
            TurnsEnded::EndTurn => "end_turn",
            TurnsEnded::CompleteTask => "complete_task",
            TurnsEnded::MaxTurns => "max_turns",
            TurnsEnded::Timeout => "iteration_timeout",
            TurnsEnded::Stopped => "stopped",
            TurnsEnded::ModelError(_) => "model_error",
            TurnsEnded::RecordUnwritable(_) => "record_unwritable",
        }
    }
}

impl Engine {
    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Why the loop's record can no longer be written, once it cannot.
    fn record_failure(&self) -> Option<String> {
        self.transcript.unwritable()
    }

    /// How a loop ends whose record could not be written (`why`): stopped, so that a
    /// resumed run goes on with it, with what to do.
    fn halt(&self, iterations: u32, why: &str) -> LoopEnd {
        LoopEnd::Stopped {
            iterations,
            reason: Some(format!(
                "the run record could not be written ({why}); the loop stopped before its \
                 next model or tool call. Free space (or fix the disk), then continue the run \
                 with `taskdaemon run --resume`"
            )),
        }
    }

    /// Runs iterations until the loop completes, fails or is stopped.
    pub async fn run(self) -> LoopEnd {
        let validation_tools = self.validation_tools.clone();
        let mut last_failure = String::from("no iteration ran");
        let first = self.config.first_iteration.max(1);
        for iteration in first..=self.config.max_iterations {
            if self.stopped() {
                return LoopEnd::Stopped {
                    iterations: iteration - 1,
                    reason: None,
                };
            }
            if let Some(why) = self.record_failure() {
                return self.halt(iteration - 1, &why);
            }
            self.events.record(EventKind::IterationStarted {
                loop_name: self.config.name.clone(),
                iteration,
            });
            // Counted outside the iteration's future, which a timeout drops.
            let calls = AtomicU32::new(0);
            let (ended, completion) = match self.config.iteration_timeout {
                Some(limit) => tokio::time::timeout(limit, self.iterate(iteration, &calls))
                    .await
                    .unwrap_or((TurnsEnded::Timeout, self.ctx.take_completion())),
                None => self.iterate(iteration, &calls).await,
            };
            let calls = calls.load(Ordering::Relaxed);
            if ended == TurnsEnded::Stopped {
                self.record_iteration_end(iteration, &ended, calls, None, None);
                return LoopEnd::Stopped {
                    iterations: iteration,
                    reason: None,
                };
            }
            // No validation command runs unrecorded either.
            let unwritable = match &ended {
                TurnsEnded::RecordUnwritable(why) => Some(why.clone()),
                _ => self.record_failure(),
            };
            if let Some(why) = unwritable {
                self.record_iteration_end(
                    iteration,
                    &TurnsEnded::RecordUnwritable(why.clone()),
                    calls,
                    None,
                    None,
                );
                return self.halt(iteration, &why);
            }
            if let TurnsEnded::ModelError(e) = &ended {
                self.record_iteration_end(iteration, &ended, calls, None, None);
                return LoopEnd::Failed {
                    iterations: iteration,
                    reason: format!("the model call failed: {e}"),
                };
            }
            let (passed, exit, output, unrecorded) = self
                .validate(iteration, &validation_tools, completion.is_some())
                .await;
            self.record_iteration_end(iteration, &ended, calls, exit, Some(passed));
            if passed {
                return LoopEnd::Completed {
                    iterations: iteration,
                    summary: completion,
                };
            }
            let mut note = format!("Iteration {iteration} ended by {}", ended.label());
            if completion.is_some() {
                note.push_str("; you called complete_task, but validation did not pass, so the task is NOT complete");
            }
            match exit {
                Some(code) => note.push_str(&format!(
                    "; validation failed with exit code {code}:\n{output}"
                )),
                None if self.ctx.commands().validate.is_none() => {
                    note.push_str("; complete_task was not called")
                }
                None => note.push_str(&format!("; validation did not finish:\n{output}")),
            }
            last_failure = note.clone();
            self.events.record(EventKind::ProgressNoted {
                loop_name: self.config.name.clone(),
                iteration,
                note: note.clone(),
            });
            self.progress.push(note);
            if let Some(why) = unrecorded {
                return self.halt(iteration, &why);
            }
        }
        LoopEnd::Failed {
            iterations: self.config.max_iterations,
            reason: format!(
                "reached the maximum of {} iterations without passing validation. Last: {last_failure}",
                self.config.max_iterations
            ),
        }
    }

    fn record_iteration_end(
        &self,
        iteration: u32,
        ended: &TurnsEnded,
        model_calls: u32,
        exit: Option<i32>,
        passed: Option<bool>,
    ) {
        self.events.record(EventKind::IterationEnded {
            loop_name: self.config.name.clone(),
            iteration,
            ended_by: ended.label().to_string(),
            validation_exit: exit,
            validation_passed: passed,
            model_calls: Some(model_calls),
        });
    }

    /// Runs the validation command (in the heavy lane); without one, passing means the
    /// model called `complete_task`. Last: why its receipt could not be written, if so.
    async fn validate(
        &self,
        iteration: u32,
        validation_tools: &Arc<ToolSet>,
        completed: bool,
    ) -> (bool, Option<i32>, String, Option<String>) {
        if self.ctx.commands().validate.is_none() {
            return (completed, None, String::new(), None);
        }
        let outcome = self
            .runner
            .run(
                self.ctx.clone(),
                validation_tools.clone(),
                None,
                "validate".to_string(),
                json!({}),
            )
            .await;
        let unrecorded = self.keep_receipt(&outcome);
        let exit = outcome.receipt.side_effects.iter().find_map(|e| match e {
            SideEffect::CommandRun { exit_code, .. } => *exit_code,
            _ => None,
        });
        let passed = exit == Some(self.config.success_code);
        let output = head_tail(&outcome.content, 4_000);
        self.transcript.record(
            &self.config.name,
            TranscriptEntry::Validation {
                iteration,
                exit_code: exit,
                passed,
                output: output.clone(),
            },
        );
        (passed, exit, output, unrecorded)
    }

    /// Appends the call's receipt; when it cannot be written, says why (and tells the
    /// record, so that every loop of the run stops before its next call).
    fn keep_receipt(&self, outcome: &CallOutcome) -> Option<String> {
        let log = self.receipts.as_ref()?;
        let e = log.append(&outcome.receipt).err()?;
        let why = format!(
            "cannot append a receipt of loop `{}` to {}: {e}",
            self.config.name,
            log.path().display()
        );
        // The record logs it (it says which run), and every loop stops at its next call.
        self.transcript.write_failed(why.clone());
        Some(why)
    }

    fn render(&self, template: &str, iteration: u32) -> Result<String, String> {
        let commands = self.ctx.commands();
        prompt::render(
            template,
            &json!({
                "loop_name": self.config.name,
                "loop_type": self.config.loop_type,
                "task": self.config.task,
                "progress": self.progress.notes(),
                "iteration": iteration,
                "max_iterations": self.config.max_iterations,
                "has_validation": commands.validate.is_some(),
                "validation": commands.validate.clone().unwrap_or_default(),
                "peers": self.config.peers,
            }),
        )
    }

    /// One iteration's model turns. Returns why they ended and the completion summary;
    /// counts its model calls in `calls` (each as it is made).
    async fn iterate(&self, iteration: u32, calls: &AtomicU32) -> (TurnsEnded, Option<String>) {
        let system = match self.render(&self.config.system_template, iteration) {
            Ok(s) => s,
            Err(e) => return (TurnsEnded::ModelError(e), None),
        };
        let first = match self.render(&self.config.iteration_template, iteration) {
            Ok(s) => s,
            Err(e) => return (TurnsEnded::ModelError(e), None),
        };
        self.transcript.record(
            &self.config.name,
            TranscriptEntry::IterationStarted {
                iteration,
                system: system.clone(),
            },
        );
        // One request for the whole iteration: each turn appends to its conversation.
        let mut request = LlmRequest {
            loop_name: self.config.name.clone(),
            purpose: Purpose::Iteration,
            system,
            messages: vec![Message::user_text(first)],
            tools: self.tools.shared_definitions(),
        };
        let mut sent = 0usize;
        for turn in 1..=self.config.max_turns {
            if self.stopped() {
                return (TurnsEnded::Stopped, self.ctx.take_completion());
            }
            if let Some(why) = self.record_failure() {
                return (
                    TurnsEnded::RecordUnwritable(why),
                    self.ctx.take_completion(),
                );
            }
            self.attach_notices(&mut request.messages);
            self.transcript.record(
                &self.config.name,
                TranscriptEntry::Request {
                    iteration,
                    turn,
                    purpose: Purpose::Iteration,
                    new_messages: request.messages[sent..].to_vec(),
                },
            );
            sent = request.messages.len();
            let mut stop = self.stop.clone();
            calls.fetch_add(1, Ordering::Relaxed);
            let response = tokio::select! {
                r = self.llm.complete(&request) => r,
                _ = stop.wait_for(|s| *s) => return (TurnsEnded::Stopped, self.ctx.take_completion()),
            };
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    self.transcript.record(
                        &self.config.name,
                        TranscriptEntry::ModelError {
                            iteration,
                            error: e.to_string(),
                        },
                    );
                    return (TurnsEnded::ModelError(e.to_string()), None);
                }
            };
            self.transcript.record(
                &self.config.name,
                TranscriptEntry::Response {
                    iteration,
                    turn,
                    response: response.clone(),
                },
            );
            request.messages.push(assistant_message(&response));
            if response.tool_calls.is_empty() {
                return (TurnsEnded::EndTurn, self.ctx.take_completion());
            }
            let (results, stopped, unrecorded) = self.run_calls(iteration, turn, &response).await;
            request.messages.push(Message {
                role: Role::User,
                content: results,
            });
            if let Some(why) = unrecorded {
                return (
                    TurnsEnded::RecordUnwritable(why),
                    self.ctx.take_completion(),
                );
            }
            if let Some(summary) = self.ctx.take_completion() {
                return (TurnsEnded::CompleteTask, Some(summary));
            }
            if stopped {
                return (TurnsEnded::Stopped, None);
            }
        }
        (TurnsEnded::MaxTurns, self.ctx.take_completion())
    }

    /// Adds waiting inbox items and file-change notices to the last user message, clearly
    /// marked, exactly once.
    fn attach_notices(&self, messages: &mut [Message]) {
        let items = self.inbox.drain();
        let changed = self.ctx.take_changed_since_read();
        if items.is_empty() && changed.is_empty() {
            return;
        }
        let mut text = String::new();
        if !items.is_empty() {
            text.push_str(&format!(
                "[inbox: {} new message(s) from other loops]\n",
                items.len()
            ));
            for line in render_items(&items) {
                text.push_str(&line);
                text.push('\n');
            }
            self.events.record(EventKind::InboxShown {
                loop_name: self.config.name.clone(),
                items: items.len(),
            });
        }
        if !changed.is_empty() {
            let paths: Vec<String> = changed.iter().map(|p| self.ctx.display(p)).collect();
            text.push_str(&format!(
                "[files changed on disk since you read them; read them again before editing: {}]\n",
                paths.join(", ")
            ));
        }
        if let Some(last) = messages.last_mut() {
            last.content.push(Block::Text {
                text: text.trim_end().to_string(),
            });
        }
    }

    /// Runs the calls of one response: consecutive read-only calls concurrently, others in
    /// order; stops after the call in flight when a stop arrives, and after complete_task;
    /// runs nothing more once the record cannot be written. Returns the results, whether a
    /// stop came, and why the record could not be written, if so.
    async fn run_calls(
        &self,
        iteration: u32,
        turn: u32,
        response: &LlmResponse,
    ) -> (Vec<Block>, bool, Option<String>) {
        let calls = &response.tool_calls;
        let mut results: Vec<Option<CallOutcome>> = vec![None; calls.len()];
        let mut stopped = false;
        let mut unrecorded: Option<String> = None;
        let mut i = 0;
        while i < calls.len() {
            if self.stopped() {
                stopped = true;
                break;
            }
            if let Some(why) = unrecorded.clone().or_else(|| self.record_failure()) {
                unrecorded = Some(why);
                break;
            }
            let mut j = i + 1;
            if self.concurrent_ok(&calls[i].name) {
                while j < calls.len() && self.concurrent_ok(&calls[j].name) {
                    j += 1;
                }
            }
            let batch = calls[i..j].iter().map(|c| self.run_one(c));
            let outcomes = futures::future::join_all(batch).await;
            for (k, (outcome, failed)) in outcomes.into_iter().enumerate() {
                results[i + k] = Some(outcome);
                if unrecorded.is_none() {
                    unrecorded = failed;
                }
            }
            let completed = calls[i..j].iter().any(|c| c.name == "complete_task");
            i = j;
            if completed {
                break;
            }
        }
        let mut blocks = Vec::with_capacity(calls.len());
        for (call, outcome) in calls.iter().zip(results) {
            let (content, is_error) = match (outcome, &unrecorded) {
                (Some(o), _) => (o.content, o.is_error),
                (None, Some(why)) => (
                    format!("not run: the run record could not be written ({why})"),
                    true,
                ),
                (None, None) if stopped => (
                    "not run: the loop was stopped before this call".to_string(),
                    true,
                ),
                (None, None) => (
                    "not run: complete_task ended the iteration before this call".to_string(),
                    true,
                ),
            };
            self.transcript.record(
                &self.config.name,
                TranscriptEntry::ToolResult {
                    iteration,
                    turn,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: content.clone(),
                    is_error,
                },
            );
            blocks.push(Block::ToolResult {
                tool_use_id: call.id.clone(),
                content,
                is_error,
            });
        }
        (blocks, stopped, unrecorded)
    }

    fn concurrent_ok(&self, name: &str) -> bool {
        self.tools.get(name).is_some_and(|t| t.read_only())
            && self.ctx.spec(name).lane != Lane::Coordinator
    }

    /// Runs one call and keeps its receipt; the second value says why the receipt could
    /// not be written, if so.
    async fn run_one(&self, call: &td_llm::ToolCall) -> (CallOutcome, Option<String>) {
        let outcome = if self.ctx.spec(&call.name).lane == Lane::Coordinator
            || self.tools.get(&call.name).is_none()
        {
            // Coordination tools talk to the coordinator, not to a worker lane; unknown names
            // are answered by the registry without running anything.
            DirectRunner
                .run(
                    self.ctx.clone(),
                    self.tools.clone(),
                    Some(call.id.clone()),
                    call.name.clone(),
                    call.input.clone(),
                )
                .await
        } else {
            self.runner
                .run(
                    self.ctx.clone(),
                    self.tools.clone(),
                    Some(call.id.clone()),
                    call.name.clone(),
                    call.input.clone(),
                )
                .await
        };
        let unrecorded = self.keep_receipt(&outcome);
        (outcome, unrecorded)
    }
}

fn assistant_message(response: &LlmResponse) -> Message {
    let mut content = Vec::new();
    if let Some(text) = &response.text {
        content.push(Block::Text { text: text.clone() });
    }
    for call in &response.tool_calls {
        content.push(Block::ToolUse {
            id: call.id.clone(),
            name: call.name.clone(),
            input: call.input.clone(),
        });
    }
    Message {
        role: Role::Assistant,
        content,
    }
}

/// Past this many system alerts of one kind in one turn (say, 1,000 loops starting), they
/// are shown as one line naming the loops: a line each would open a prompt with a thousand
/// lines the model has no use for (it can ask any loop with query_loop).
pub const COALESCE_ABOVE: usize = 5;

/// Inbox items as the model sees them, a line each in order, except that system alerts of
/// one kind that are more than [`COALESCE_ABOVE`] are one line, where the first of them was.
pub fn render_items(items: &[Arc<InboxItem>]) -> Vec<String> {
    let mut about: HashMap<&str, Vec<&str>> = HashMap::new();
    for item in items {
        if let InboxItem::Alert {
            event_type,
            about: Some(name),
            ..
        } = item.as_ref()
        {
            about.entry(event_type).or_default().push(name);
        }
    }
    about.retain(|_, names| names.len() > COALESCE_ABOVE);
    let mut lines = Vec::with_capacity(items.len());
    for item in items {
        match item.as_ref() {
            InboxItem::Alert {
                from,
                event_type,
                about: Some(_),
                ..
            } if about.contains_key(event_type.as_str()) => {
                // The first of its kind takes the whole group (an empty list marks it
                // shown); the rest are in it.
                let names = about.get_mut(event_type.as_str()).map(std::mem::take);
                if let Some(names) = names.filter(|n| !n.is_empty()) {
                    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
                    lines.push(format!(
                        "- alert from `{from}` ({event_type}) for {} loops: {}. (Many at once, so \
                         one line; ask a loop with query_loop for its details.)",
                        names.len(),
                        names.join(", ")
                    ));
                }
            }
            _ => lines.push(render_item(item)),
        }
    }
    lines
}

/// One inbox item as the model sees it.
pub fn render_item(item: &InboxItem) -> String {
    match item {
        InboxItem::Share {
            from,
            data_type,
            data,
        } => format!("- share from `{from}` ({data_type}): {data}"),
        InboxItem::Alert {
            from,
            event_type,
            message,
            data,
            ..
        } => match data {
            Some(d) => format!("- alert from `{from}` ({event_type}): {message} {d}"),
            None => format!("- alert from `{from}` ({event_type}): {message}"),
        },
    }
}

/// What a loop needs to answer other loops' questions: built once per loop and shared by
/// every answer in progress, so that answering a question copies nothing per loop (its
/// settings, its tool definitions) and only renders the prompt and calls the model.
pub struct Answerer {
    /// The loop's name, type and task: all of its settings an answer uses.
    name: String,
    loop_type: String,
    task: String,
    ctx: Arc<ToolContext>,
    tools: Arc<ToolSet>,
    llm: Arc<dyn LlmClient>,
    progress: Arc<ProgressNotes>,
    transcript: Arc<dyn TranscriptSink>,
    /// The read-only, non-coordination tools of the loop (all an answer may use); looked up
    /// at the first question (loops of one type share them).
    read_only: OnceLock<Arc<[ToolDefinition]>>,
}

impl Answerer {
    /// The answerer of the loop with these settings, context, tools, model, progress notes
    /// and transcript.
    pub fn new(
        config: &EngineConfig,
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        llm: Arc<dyn LlmClient>,
        progress: Arc<ProgressNotes>,
        transcript: Arc<dyn TranscriptSink>,
    ) -> Self {
        Self {
            name: config.name.clone(),
            loop_type: config.loop_type.clone(),
            task: config.task.clone(),
            ctx,
            tools,
            llm,
            progress,
            transcript,
            read_only: OnceLock::new(),
        }
    }

    fn read_only(&self) -> &Arc<[ToolDefinition]> {
        self.read_only.get_or_init(|| {
            self.tools.shared_subset(|name| {
                self.tools.get(name).is_some_and(|t| t.read_only())
                    && self.ctx.spec(name).lane != Lane::Coordinator
            })
        })
    }

    /// Answers another loop's question with a side model call that sees this loop's task
    /// and progress; the model may use the read-only tools on this loop's worktree.
    pub async fn answer(&self, from: &str, question: &str) -> Result<String, String> {
        const MAX_ANSWER_TURNS: u32 = 4;
        let system = self.progress.with_notes(|notes| {
            prompt::answer_system(&self.name, &self.loop_type, from, &self.task, notes)
        });
        let read_only = self.read_only().clone();
        let mut request = LlmRequest {
            loop_name: self.name.clone(),
            purpose: Purpose::QueryAnswer {
                from: from.to_string(),
                question: question.to_string(),
            },
            system,
            messages: vec![Message::user_text(format!(
                "Question from loop `{from}`:\n{question}"
            ))],
            tools: read_only.clone(),
        };
        let mut sent = 0;
        for turn in 1..=MAX_ANSWER_TURNS {
            self.transcript.record(
                &self.name,
                TranscriptEntry::Request {
                    iteration: 0,
                    turn,
                    purpose: request.purpose.clone(),
                    new_messages: request.messages[sent..].to_vec(),
                },
            );
            sent = request.messages.len();
            let response = self
                .llm
                .complete(&request)
                .await
                .map_err(|e| e.to_string())?;
            self.transcript.record(
                &self.name,
                TranscriptEntry::Response {
                    iteration: 0,
                    turn,
                    response: response.clone(),
                },
            );
            if response.tool_calls.is_empty() {
                return Ok(response.text.unwrap_or_default());
            }
            request.messages.push(assistant_message(&response));
            let mut results = Vec::new();
            for call in &response.tool_calls {
                let allowed = read_only.iter().any(|d| d.name == call.name);
                let (content, is_error) = if allowed {
                    let o = self
                        .tools
                        .call(&self.ctx, Some(&call.id), &call.name, call.input.clone())
                        .await;
                    (o.content, o.is_error)
                } else {
                    (
                        format!(
                            "'{}' is not available while answering a question: only read-only tools are",
                            call.name
                        ),
                        true,
                    )
                };
                results.push(Block::ToolResult {
                    tool_use_id: call.id.clone(),
                    content,
                    is_error,
                });
            }
            request.messages.push(Message {
                role: Role::User,
                content: results,
            });
        }
        Err(format!(
            "no answer after {MAX_ANSWER_TURNS} model turns of tool use"
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn system(event_type: &str, name: &str) -> Arc<InboxItem> {
        Arc::new(InboxItem::Alert {
            from: "taskdaemon".into(),
            event_type: event_type.into(),
            message: format!("loop `{name}` {event_type}: its task"),
            data: None,
            about: Some(name.into()),
        })
    }

    #[test]
    fn up_to_the_limit_every_alert_has_its_own_line() {
        let few: Vec<_> = (0..COALESCE_ABOVE)
            .map(|i| system("loop_started", &format!("l{i}")))
            .collect();
        let each: Vec<String> = few.iter().map(|i| render_item(i)).collect();
        assert_eq!(render_items(&few), each);
        assert!(
            each[0].contains("loop `l0` loop_started: its task"),
            "{each:?}"
        );
    }

    #[test]
    fn many_system_alerts_of_one_kind_are_one_line_where_the_first_was() {
        let share = Arc::new(InboxItem::Share {
            from: "api".into(),
            data_type: "port".into(),
            data: json!(8080),
        });
        // A loop's own alert of the same type is not a system alert: never folded.
        let own = Arc::new(InboxItem::Alert {
            from: "api".into(),
            event_type: "loop_started".into(),
            message: "custom".into(),
            data: None,
            about: None,
        });
        let done = system("loop_completed", "l9");
        let mut items = vec![share.clone()];
        items.extend((0..7).map(|i| system("loop_started", &format!("l{i}"))));
        items.insert(3, own.clone());
        items.push(done.clone());

        let lines = render_items(&items);
        assert_eq!(
            lines,
            vec![
                render_item(&share),
                "- alert from `taskdaemon` (loop_started) for 7 loops: `l0`, `l1`, `l2`, `l3`, \
                 `l4`, `l5`, `l6`. (Many at once, so one line; ask a loop with query_loop for \
                 its details.)"
                    .to_string(),
                render_item(&own),
                render_item(&done),
            ]
        );
    }
}
