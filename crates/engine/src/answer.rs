//! Answering another loop's question: a side conversation with the loop's model that sees
//! the loop's task and progress, run by the shared turn loop ([`crate::turns`]) with the
//! loop's own call path, so that its tool calls take the loop's lanes (and their limits) and
//! leave receipts in the loop's log like any call of its own. Only read-only tools of worker
//! lanes are offered (and allowed): an answer reads, it never changes the worktree, and it
//! never waits on a third loop.

use std::sync::{Arc, OnceLock};

use td_llm::{LlmClient, LlmError, LlmRequest, Message, Purpose};
use td_protocol::tool_definition::ToolDefinition;
use td_toolkit::call_path::CallPath;

use crate::prompt;
use crate::transcript::TranscriptSink;
use crate::turns::{TurnRules, Turns, TurnsEnd};
use crate::{EngineConfig, Progress};

/// Model turns an answer may take before it gives up.
const MAX_ANSWER_TURNS: u32 = 4;

/// Why a loop could not answer a question.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The model call failed.
    #[error(transparent)]
    Model(#[from] LlmError),
    /// The model kept calling tools.
    #[error("no answer after {MAX_ANSWER_TURNS} model turns of tool use")]
    TooManyTurns,
    /// The run record (or a receipt of the answer's calls) could not be written.
    #[error("the run record could not be written ({0})")]
    RecordUnwritable(String),
}

/// What a loop needs to answer other loops' questions: built once per loop and shared by
/// every answer in progress, so that answering a question copies nothing per loop (its
/// settings, its tool definitions) and only renders the prompt and calls the model.
pub struct Answerer {
    /// The loop's name, type and task: all of its settings an answer uses.
    name: String,
    loop_type: String,
    task: String,
    /// The loop's calls (context, tools, routes, lanes, receipts), shared with its engine.
    calls: Arc<CallPath>,
    llm: Arc<dyn LlmClient>,
    progress: Arc<Progress>,
    transcript: Arc<dyn TranscriptSink>,
    /// The tools an answer may use, looked up at the first question (loops of one type
    /// share them).
    read_only: OnceLock<Arc<[ToolDefinition]>>,
}

impl Answerer {
    /// The answerer of the loop with these settings, calls, model, progress notes and
    /// transcript.
    pub fn new(
        config: &EngineConfig,
        calls: Arc<CallPath>,
        llm: Arc<dyn LlmClient>,
        progress: Arc<Progress>,
        transcript: Arc<dyn TranscriptSink>,
    ) -> Self {
        Self {
            name: config.name.clone(),
            loop_type: config.loop_type.clone(),
            task: config.task.clone(),
            calls,
            llm,
            progress,
            transcript,
            read_only: OnceLock::new(),
        }
    }

    /// The read-only tools of worker lanes: all an answer may use.
    fn read_only(&self) -> &Arc<[ToolDefinition]> {
        self.read_only.get_or_init(|| {
            self.calls
                .tools()
                .shared_subset(|n| self.calls.concurrent(n))
        })
    }

    /// Answers another loop's question with a side model call that sees this loop's task
    /// and progress; the model may use the read-only tools on this loop's worktree.
    pub async fn answer(&self, from: &str, question: &str) -> Result<String, AnswerError> {
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
        let turns = Turns {
            loop_name: &self.name,
            iteration: 0,
            max_turns: MAX_ANSWER_TURNS,
            llm: self.llm.as_ref(),
            transcript: self.transcript.as_ref(),
            calls: &self.calls,
            // An answer ends with its asker's deadline, or when this loop leaves the run
            // (the coordinator drops it); a stop of this loop's iteration does not end it.
            stop: None,
            model_calls: None,
        };
        let mut rules = AnswerRules { read_only };
        match turns.run(&mut request, &mut rules).await {
            TurnsEnd::EndTurn(text) => Ok(text.unwrap_or_default()),
            TurnsEnd::ModelError(e) => Err(e.into()),
            TurnsEnd::RecordUnwritable(why) => Err(AnswerError::RecordUnwritable(why)),
            // An answer is given no stop and its rules never finish it, so running out of
            // turns is the only other end.
            TurnsEnd::MaxTurns | TurnsEnd::Stopped | TurnsEnd::Finished => {
                Err(AnswerError::TooManyTurns)
            }
        }
    }
}

/// What an answer adds to the turn loop: only the tools it was offered may run.
struct AnswerRules {
    read_only: Arc<[ToolDefinition]>,
}

impl TurnRules for AnswerRules {
    fn refuse(&self, name: &str) -> Option<String> {
        (!self.read_only.iter().any(|d| d.name == name)).then(|| {
            format!(
                "'{name}' is not available while answering a question: only read-only tools are"
            )
        })
    }
}
