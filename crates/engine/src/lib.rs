//! The Ralph iteration engine: each iteration starts from a fresh context (task, progress
//! notes from earlier iterations, inbox), runs model turns with tool calls until the model
//! ends its turn, calls `complete_task` or reaches the turn limit, then runs the validation
//! command. Exit code equal to the success code completes the loop; otherwise the validation
//! output becomes a progress note for the next iteration.
//!
//! The engine knows nothing about actors: tool calls take the loop's
//! [`CallPath`] (routes, the tool lanes in a run, receipts),
//! inbox items come from a shared `Inbox`, and a stop request arrives on a watch channel. The
//! model turns of an iteration and of an answer to another loop's question are one loop
//! (the `turns` module): independent read-only calls of one response run concurrently; calls that
//! write run in order; a stop takes effect after the call in flight, a stop "now"
//! ([`StopRequest::Now`]) cancels the calls in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use td_base::sync::lock;
use td_base::text::head_tail;
use td_llm::{Block, LlmClient, LlmRequest, Message, Purpose};
use td_protocol::events::{EventKind, EventLog};
use td_protocol::inbox::InboxItem;
use td_protocol::spend::Spend;
use td_toolkit::call_path::CallPath;
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::SideEffect;

mod answer;

/// What a loop was asked about stopping, on its stop channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum StopRequest {
    /// Go on.
    #[default]
    None,
    /// Stop after the tool calls in flight (the first Ctrl-C or SIGTERM of a run).
    AfterCall,
    /// Stop now: the tool calls in flight are cancelled (dropped: a queued call is skipped,
    /// a running command's process group is killed) and answered to the model as cancelled
    /// (a stop asked for from the dashboard, where a loop stuck in a long command is the
    /// usual reason to stop it).
    Now,
}

impl StopRequest {
    /// Whether any stop was asked for.
    pub fn requested(self) -> bool {
        self != StopRequest::None
    }
}
pub mod budget;
pub mod prompt;
pub mod transcript;
mod turns;

pub use answer::{AnswerError, Answerer, MAX_ANSWER_TURNS};
use budget::Account;
use transcript::{TranscriptEntry, TranscriptSink};
pub use turns::CallEvents;
use turns::{Charge, TurnRules, Turns, TurnsEnd};

/// What an iteration's model calls came to, for its `iteration_ended` event.
struct IterationCounts {
    model_calls: u32,
    spend: Spend,
    started: Instant,
}

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
    /// Paused at a hard limit of its budget or the run's: its state is kept, and a resumed
    /// run with a raised budget goes on with it.
    Paused {
        /// Iterations used (the one cut short by the limit included: it runs again).
        iterations: u32,
        /// Which limit, and what to do.
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
    /// `completed`, `failed`, `paused` or `stopped`.
    pub fn status(&self) -> &'static str {
        match self {
            LoopEnd::Completed { .. } => "completed",
            LoopEnd::Failed { .. } => "failed",
            LoopEnd::Paused { .. } => "paused",
            LoopEnd::Stopped { .. } => "stopped",
        }
    }
}

/// Items waiting for the loop's next model turn.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Shared: an alert goes to every loop, and one copy per recipient made the inboxes of
    /// a 1,000-loop run hold a million copies of the "loop started" alerts.
    /// Each with its delivery number (`td_protocol::inbox::Delivered`), when it has one.
    items: Mutex<VecDeque<(Option<u64>, Arc<InboxItem>)>>,
}

impl Inbox {
    /// Adds an item, with its delivery number when it has one.
    pub fn push(&self, delivery: Option<u64>, item: Arc<InboxItem>) {
        lock(&self.items).push_back((delivery, item));
    }

    /// Takes every waiting item with its delivery number (each is shown exactly once).
    pub fn drain(&self) -> Vec<(Option<u64>, Arc<InboxItem>)> {
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
    /// The calls of the tools its model sees: the loop's private context, its tools, their
    /// routes, the lanes and the loop's receipts. Shared with the loop's [`Answerer`].
    pub calls: Arc<CallPath>,
    /// The calls of the loop's validation step (`validate`, from a tool set chosen by
    /// whoever builds the engine: the engine knows tools only through the toolkit), with the
    /// same context, lanes and receipts.
    pub validation: CallPath,
    /// The model.
    pub llm: Arc<dyn LlmClient>,
    /// Waiting shares and alerts.
    pub inbox: Arc<Inbox>,
    /// Notes across iterations.
    pub progress: Arc<ProgressNotes>,
    /// The run's events.
    pub events: Arc<EventLog>,
    /// The loop's transcript.
    pub transcript: Arc<dyn TranscriptSink>,
    /// Becomes a [`StopRequest`] other than `None` when the loop must stop.
    pub stop: watch::Receiver<StopRequest>,
    /// Where its model calls are charged (its budget and the run's).
    pub account: Account,
}

/// Why an iteration's model turns ended (its `ended_by` in the events).
#[derive(Debug, Clone, PartialEq, Eq)]
enum IterationEnd {
    EndTurn,
    CompleteTask,
    MaxTurns,
    Timeout,
    Stopped,
    ModelError(String),
    /// The run record (or a receipt) could not be written: nothing more may run.
    RecordUnwritable(String),
    /// A hard limit of a budget was reached: the loop pauses.
    Paused(String),
}

impl IterationEnd {
    fn label(&self) -> &'static str {
        match self {
            IterationEnd::EndTurn => "end_turn",
            IterationEnd::CompleteTask => "complete_task",
            IterationEnd::MaxTurns => "max_turns",
            IterationEnd::Timeout => "iteration_timeout",
            IterationEnd::Stopped => "stopped",
            IterationEnd::ModelError(_) => "model_error",
            IterationEnd::RecordUnwritable(_) => "record_unwritable",
            IterationEnd::Paused(_) => "paused",
        }
    }
}

impl Engine {
    fn ctx(&self) -> &Arc<ToolContext> {
        self.calls.ctx()
    }

    fn stopped(&self) -> bool {
        self.stop.borrow().requested()
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
            if let Err(reason) = self.account.start_iteration() {
                return LoopEnd::Paused {
                    iterations: iteration - 1,
                    reason,
                };
            }
            self.events.record(EventKind::IterationStarted {
                loop_name: self.config.name.clone(),
                iteration,
            });
            // Counted outside the iteration's future, which a timeout drops.
            let calls = AtomicU32::new(0);
            let spent = Mutex::new(Spend::default());
            let started = Instant::now();
            let (ended, completion) = match self.config.iteration_timeout {
                Some(limit) => tokio::time::timeout(limit, self.iterate(iteration, &calls, &spent))
                    .await
                    .unwrap_or((IterationEnd::Timeout, self.ctx().take_completion())),
                None => self.iterate(iteration, &calls, &spent).await,
            };
            let calls = IterationCounts {
                model_calls: calls.load(Ordering::Relaxed),
                spend: *lock(&spent),
                started,
            };
            if ended == IterationEnd::Stopped {
                self.record_iteration_end(iteration, &ended, &calls, None, None);
                return LoopEnd::Stopped {
                    iterations: iteration,
                    reason: None,
                };
            }
            if let IterationEnd::Paused(reason) = &ended {
                // Like a stop: no validation, and a resumed run runs the iteration again.
                self.record_iteration_end(iteration, &ended, &calls, None, None);
                return LoopEnd::Paused {
                    iterations: iteration,
                    reason: reason.clone(),
                };
            }
            // No validation command runs unrecorded either.
            let unwritable = match &ended {
                IterationEnd::RecordUnwritable(why) => Some(why.clone()),
                _ => self.record_failure(),
            };
            if let Some(why) = unwritable {
                self.record_iteration_end(
                    iteration,
                    &IterationEnd::RecordUnwritable(why.clone()),
                    &calls,
                    None,
                    None,
                );
                return self.halt(iteration, &why);
            }
            if let IterationEnd::ModelError(e) = &ended {
                self.record_iteration_end(iteration, &ended, &calls, None, None);
                return LoopEnd::Failed {
                    iterations: iteration,
                    reason: format!("the model call failed: {e}"),
                };
            }
            // A stop "now" cancels a validation in flight too: the iteration ends stopped,
            // unvalidated, and a resumed run runs it again.
            let validated = {
                let mut stop = self.stop.clone();
                tokio::select! {
                    v = self.validate(iteration, completion.is_some()) => Some(v),
                    _ = stop.wait_for(|s| *s == StopRequest::Now) => None,
                }
            };
            let Some((passed, exit, output, unrecorded)) = validated else {
                self.record_iteration_end(iteration, &IterationEnd::Stopped, &calls, None, None);
                return LoopEnd::Stopped {
                    iterations: iteration,
                    reason: None,
                };
            };
            self.record_iteration_end(iteration, &ended, &calls, exit, Some(passed));
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
                None if self.ctx().commands().validate.is_none() => {
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
        ended: &IterationEnd,
        counts: &IterationCounts,
        exit: Option<i32>,
        passed: Option<bool>,
    ) {
        self.events.record(EventKind::IterationEnded {
            loop_name: self.config.name.clone(),
            iteration,
            ended_by: ended.label().to_string(),
            validation_exit: exit,
            validation_passed: passed,
            model_calls: Some(counts.model_calls),
            spend: Some(counts.spend),
            wall_ms: Some(u64::try_from(counts.started.elapsed().as_millis()).unwrap_or(u64::MAX)),
        });
    }

    /// Runs the validation command (in the heavy lane); without one, passing means the
    /// model called `complete_task`. Last: why its receipt could not be written, if so.
    async fn validate(
        &self,
        iteration: u32,
        completed: bool,
    ) -> (bool, Option<i32>, String, Option<String>) {
        if self.ctx().commands().validate.is_none() {
            return (completed, None, String::new(), None);
        }
        let called = self.validation.call(None, "validate", json!({})).await;
        let unrecorded = called
            .saved
            .as_ref()
            .err()
            .map(|e| turns::receipt_not_saved(self.transcript.as_ref(), &self.config.name, e));
        let outcome = called.outcome;
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

    /// Renders `template` with the loop's variables: for the system prompt (`system`) only
    /// those that are the same for every iteration (see [`prompt::ITERATION_VARIABLES`]).
    fn render(
        &self,
        template: &str,
        iteration: u32,
        system: bool,
    ) -> Result<String, prompt::PromptError> {
        let commands = self.ctx().commands();
        let progress = self.progress.notes();
        // Only the iteration's first message sees them (the system prompt cannot: see
        // `prompt::ITERATION_VARIABLES`), so only it pays for the listing.
        let artifacts = if system {
            Vec::new()
        } else {
            td_toolkit::artifact_files::present(self.ctx().files())
        };
        let vars = prompt::PromptVars {
            loop_name: &self.config.name,
            loop_type: &self.config.loop_type,
            task: &self.config.task,
            validation: commands.validate.as_deref(),
            peers: &self.config.peers,
            progress: &progress,
            iteration,
            max_iterations: self.config.max_iterations,
            artifacts: &artifacts,
        };
        if system {
            prompt::render(template, &vars.system())
        } else {
            prompt::render(template, &vars.iteration())
        }
    }

    /// One iteration's model turns. Returns why they ended and the completion summary;
    /// counts its model calls in `calls` (each as it is made).
    async fn iterate(
        &self,
        iteration: u32,
        calls: &AtomicU32,
        spent: &Mutex<Spend>,
    ) -> (IterationEnd, Option<String>) {
        let system = match self.render(&self.config.system_template, iteration, true) {
            Ok(s) => s,
            Err(e) => return (IterationEnd::ModelError(e.to_string()), None),
        };
        let first = match self.render(&self.config.iteration_template, iteration, false) {
            Ok(s) => s,
            Err(e) => return (IterationEnd::ModelError(e.to_string()), None),
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
            loop_name: Arc::from(self.config.name.as_str()),
            purpose: Purpose::Iteration,
            system,
            messages: vec![Message::user_text(first)],
            tools: self.calls.tools().shared_definitions(),
        };
        let turns = Turns {
            loop_name: &self.config.name,
            iteration,
            max_turns: self.config.max_turns,
            llm: self.llm.as_ref(),
            transcript: self.transcript.as_ref(),
            calls: &self.calls,
            stop: Some(&self.stop),
            model_calls: Some(calls),
            events: Some(&self.events),
            charge: Charge {
                account: &self.account,
                charged_to: None,
                spent,
            },
        };
        let mut rules = IterationRules {
            engine: self,
            completion: None,
        };
        let end = turns.run(&mut request, &mut rules).await;
        let completion = rules.completion.take();
        let ended = match end {
            TurnsEnd::EndTurn(_) => IterationEnd::EndTurn,
            TurnsEnd::Finished => IterationEnd::CompleteTask,
            TurnsEnd::MaxTurns => IterationEnd::MaxTurns,
            TurnsEnd::Stopped => IterationEnd::Stopped,
            TurnsEnd::RecordUnwritable(why) => IterationEnd::RecordUnwritable(why),
            TurnsEnd::OverBudget(why) => IterationEnd::Paused(why),
            TurnsEnd::ModelError(e) => return (IterationEnd::ModelError(e.to_string()), None),
        };
        (ended, completion.or_else(|| self.ctx().take_completion()))
    }

    /// Adds waiting inbox items and file-change notices to the last user message, clearly
    /// marked, exactly once; and, past a budget's soft threshold, what is left of it. All of
    /// it goes at the end of the conversation, after the part a prompt cache can keep.
    fn attach_notices(&self, messages: &mut [Message]) {
        let (numbers, items): (Vec<Option<u64>>, Vec<Arc<InboxItem>>) =
            self.inbox.drain().into_iter().unzip();
        let changed = self.ctx().take_changed_since_read();
        let budget = self.account.notice();
        if items.is_empty() && changed.is_empty() && budget.is_none() {
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
            // Which items were shown, by number: a resumed or moved loop is not shown them
            // again, whatever order the record holds them in. (They arrive in number
            // order; sorted all the same, as the record's ranges must be.)
            let mut numbers: Vec<u64> = numbers.into_iter().flatten().collect();
            numbers.sort_unstable();
            numbers.dedup();
            self.events.record(EventKind::InboxShown {
                loop_name: self.config.name.clone(),
                items: items.len(),
                deliveries: td_protocol::delivery::ranges(numbers),
            });
        }
        if !changed.is_empty() {
            let paths: Vec<String> = changed.iter().map(|p| self.ctx().display(p)).collect();
            text.push_str(&format!(
                "[files changed on disk since you read them; read them again before editing: {}]\n",
                paths.join(", ")
            ));
        }
        if let Some(budget) = budget {
            text.push_str(&budget);
            text.push('\n');
        }
        if let Some(last) = messages.last_mut() {
            last.content.push(Block::Text {
                text: text.trim_end().to_string(),
            });
        }
    }
}

/// What an iteration adds to the turn loop: the inbox and file-change notices before each
/// request, and its end once the model called `complete_task`.
struct IterationRules<'a> {
    engine: &'a Engine,
    /// The summary `complete_task` left, once taken.
    completion: Option<String>,
}

impl TurnRules for IterationRules<'_> {
    fn before_request(&mut self, messages: &mut [Message]) {
        self.engine.attach_notices(messages);
    }

    fn finished(&mut self) -> bool {
        self.completion = self.engine.ctx().take_completion();
        self.completion.is_some()
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
