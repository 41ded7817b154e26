//! Answering another loop's question: a side conversation with the loop's model that sees
//! the loop's task and progress, run by the shared turn loop ([`crate::turns`]) with the
//! loop's own call path, so that its tool calls take the loop's lanes (and their limits) and
//! leave receipts in the loop's log like any call of its own. Only read-only tools of worker
//! lanes are offered (and allowed): an answer reads, it never changes the worktree, and it
//! never waits on a third loop.

use std::sync::{Arc, Mutex, OnceLock};

use td_llm::{LlmClient, LlmError, LlmRequest, Message, Purpose};
use td_protocol::events::EventLog;
use td_protocol::spend::Spend;
use td_protocol::tool_definition::ToolDefinition;
use td_toolkit::call_path::CallPath;

use crate::budget::Budgets;
use crate::prompt;
use crate::transcript::TranscriptSink;
use crate::turns::{Charge, TurnRules, Turns, TurnsEnd};
use crate::{EngineConfig, ProgressNotes};

/// Model turns an answer may take before it gives up (also the most model calls the head
/// takes for a host loop's answer to one question: a host's word on what it answers is not
/// trusted).
pub const MAX_ANSWER_TURNS: u32 = 4;

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
    /// The asking loop's budget (which pays for the answer) or the run's has no room for it.
    #[error("{0}")]
    OverBudget(String),
}

/// What a loop needs to answer other loops' questions: built once per loop and shared by
/// every answer in progress, so that answering a question copies nothing per loop (its
/// settings, its tool definitions) and only renders the prompt and calls the model.
pub struct Answerer {
    /// The loop's name (shared with each answer's model request), type and task: all of its
    /// settings an answer uses.
    name: Arc<str>,
    loop_type: String,
    task: String,
    /// The loop's calls (context, tools, routes, lanes, receipts), shared with its engine.
    calls: Arc<CallPath>,
    llm: Arc<dyn LlmClient>,
    progress: Arc<ProgressNotes>,
    transcript: Arc<dyn TranscriptSink>,
    /// The run's budgets: an answer is charged to the loop that asked.
    budgets: Arc<Budgets>,
    /// The tools an answer may use, looked up at the first question (loops of one type
    /// share them).
    read_only: OnceLock<Arc<[ToolDefinition]>>,
    /// Where the retries of an answer's model calls are recorded.
    events: Option<Arc<EventLog>>,
}

impl Answerer {
    /// The answerer of the loop with these settings, calls, model, progress notes and
    /// transcript; its answers are charged to the askers' accounts in `budgets`.
    pub fn new(
        config: &EngineConfig,
        calls: Arc<CallPath>,
        llm: Arc<dyn LlmClient>,
        progress: Arc<ProgressNotes>,
        transcript: Arc<dyn TranscriptSink>,
        budgets: Arc<Budgets>,
    ) -> Self {
        Self {
            name: Arc::from(config.name.as_str()),
            loop_type: config.loop_type.clone(),
            task: config.task.clone(),
            calls,
            llm,
            progress,
            transcript,
            budgets,
            read_only: OnceLock::new(),
            events: None,
        }
    }

    /// The same answerer, recording the retries of its model calls in `events`.
    pub fn with_events(mut self, events: Arc<EventLog>) -> Self {
        self.events = Some(events);
        self
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
    /// and progress; the model may use the read-only tools on this loop's worktree. Its
    /// model calls are charged to `from`, the loop that asked.
    pub async fn answer(&self, from: &str, question: &str) -> Result<String, AnswerError> {
        self.answer_counting(
            &Arc::from(from),
            &Arc::from(question),
            &Mutex::new(Spend::default()),
        )
        .await
    }

    /// [`Answerer::answer`], adding what its model calls spend to `spent` as they are
    /// answered (so that an answer given up on still says what it cost).
    pub async fn answer_counting(
        &self,
        from: &Arc<str>,
        question: &Arc<str>,
        spent: &Mutex<Spend>,
    ) -> Result<String, AnswerError> {
        let account = self.budgets.account(from);
        let system = self.progress.with_notes(|notes| {
            prompt::answer_system(&self.name, &self.loop_type, from, &self.task, notes)
        });
        let read_only = self.read_only().clone();
        let mut request = LlmRequest {
            loop_name: Arc::clone(&self.name),
            purpose: Purpose::QueryAnswer {
                from: Arc::clone(from),
                question: Arc::clone(question),
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
            events: self.events.as_deref(),
            charge: Charge {
                account: &account,
                charged_to: Some(from),
                spent,
            },
        };
        let mut rules = AnswerRules { read_only };
        match turns.run(&mut request, &mut rules).await {
            TurnsEnd::EndTurn(text) => Ok(text.unwrap_or_default()),
            TurnsEnd::ModelError(e) => Err(e.into()),
            TurnsEnd::RecordUnwritable(why) => Err(AnswerError::RecordUnwritable(why)),
            TurnsEnd::OverBudget(why) => Err(AnswerError::OverBudget(why)),
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::{Value, json};

    use super::*;
    use crate::transcript::{MemoryTranscripts, TranscriptEntry};
    use td_llm::{Block, LlmResponse, StopReason, ToolCall};
    use td_toolkit::call_path::InCallerTask;
    use td_toolkit::context::ToolContext;
    use td_toolkit::error::ToolResult;
    use td_toolkit::receipts::{Receipt, ReceiptLog};
    use td_toolkit::registry::ToolSet;
    use td_toolkit::tool::{Tool, ToolOutput};

    /// The settings of loop `b`: all an answer uses of them is its name, type and task.
    fn config() -> EngineConfig {
        EngineConfig {
            name: "b".into(),
            loop_type: "ralph".into(),
            task: "t".into(),
            max_iterations: 1,
            max_turns: 1,
            iteration_timeout: None,
            success_code: 0,
            system_template: String::new(),
            iteration_template: String::new(),
            peers: Vec::new(),
            first_iteration: 1,
        }
    }

    /// A test tool under a catalog name; `read_only` says whether answers may use it.
    struct Probe(&'static str, bool);

    #[async_trait]
    impl Tool for Probe {
        fn name(&self) -> &'static str {
            self.0
        }
        fn description(&self) -> &'static str {
            "test tool"
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object"})
        }
        fn read_only(&self) -> bool {
            self.1
        }
        async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
            Ok(ToolOutput::text(format!("{} ran", self.0)))
        }
    }

    /// Calls every tool named in `calls` in its first response, then answers with the
    /// results it got; keeps the tool lists it was offered.
    struct CallThenAnswer {
        calls: Vec<&'static str>,
        offered: Mutex<Vec<Vec<String>>>,
    }

    #[async_trait]
    impl LlmClient for CallThenAnswer {
        async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.offered
                .lock()
                .unwrap()
                .push(request.tools.iter().map(|d| d.name.clone()).collect());
            let results: Vec<String> = request
                .messages
                .iter()
                .flat_map(|m| &m.content)
                .filter_map(|b| match b {
                    Block::ToolResult {
                        content, is_error, ..
                    } => Some(format!("{content} (error: {is_error})")),
                    _ => None,
                })
                .collect();
            let tool_calls = if results.is_empty() {
                self.calls
                    .iter()
                    .enumerate()
                    .map(|(i, name)| ToolCall {
                        id: format!("c{i}"),
                        name: name.to_string(),
                        input: json!({}).into(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            Ok(LlmResponse {
                text: (!results.is_empty()).then(|| results.join("; ")),
                tool_calls,
                stop_reason: StopReason::EndTurn,
                usage: Default::default(),
            })
        }
    }

    #[tokio::test]
    async fn answers_use_read_only_lane_tools_only_and_keep_their_receipts() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "b").unwrap();
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(Probe("read_file", true)),
            Arc::new(Probe("write_file", false)),
            // Read-only, but it waits on other loops: an answer never does.
            Arc::new(Probe("list_loops", true)),
        ];
        let log = dir.path().join("receipts.jsonl");
        let calls = Arc::new(CallPath::new(
            Arc::new(ctx),
            Arc::new(ToolSet::from_tools(tools).unwrap()),
            Arc::new(InCallerTask),
            Some(Arc::new(ReceiptLog::open(&log).unwrap())),
        ));
        let llm = Arc::new(CallThenAnswer {
            calls: vec!["read_file", "write_file", "list_loops"],
            offered: Mutex::new(Vec::new()),
        });
        let transcripts = Arc::new(MemoryTranscripts::new());
        let config = config();
        let answerer = Answerer::new(
            &config,
            calls,
            llm.clone(),
            Arc::new(ProgressNotes::default()),
            transcripts.clone(),
            Budgets::unlimited(),
        );
        let answer = answerer.answer("a", "what is there?").await.unwrap();
        let refused = "only read-only tools are (error: true)";
        assert_eq!(
            answer,
            format!(
                "read_file ran (error: false); \
                 'write_file' is not available while answering a question: {refused}; \
                 'list_loops' is not available while answering a question: {refused}"
            )
        );
        assert_eq!(*llm.offered.lock().unwrap(), vec![vec!["read_file"]; 2]);
        // Only the call that ran has a receipt, in the answering loop's log.
        let receipts: Vec<Receipt> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(receipts.len(), 1, "{receipts:?}");
        assert_eq!(receipts[0].tool, "read_file");
        assert_eq!(receipts[0].call_id.as_deref(), Some("c0"));
        // Its results are in the loop's transcript, as an answer's (iteration 0).
        let results: Vec<(u32, String)> = transcripts
            .of("b")
            .into_iter()
            .filter_map(|e| match e {
                TranscriptEntry::ToolResult {
                    iteration, name, ..
                } => Some((iteration, name)),
                _ => None,
            })
            .collect();
        assert_eq!(
            results,
            [
                (0, "read_file".to_string()),
                (0, "write_file".to_string()),
                (0, "list_loops".to_string())
            ]
        );
    }

    #[tokio::test]
    async fn an_answer_that_keeps_calling_tools_gives_up() {
        struct Forever;
        #[async_trait]
        impl LlmClient for Forever {
            async fn complete(&self, _: &LlmRequest) -> Result<LlmResponse, LlmError> {
                Ok(LlmResponse {
                    text: None,
                    tool_calls: vec![ToolCall {
                        id: "x".into(),
                        name: "read_file".into(),
                        input: json!({}).into(),
                    }],
                    stop_reason: StopReason::ToolUse,
                    usage: Default::default(),
                })
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "b").unwrap();
        let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Probe("read_file", true))];
        let calls = Arc::new(CallPath::new(
            Arc::new(ctx),
            Arc::new(ToolSet::from_tools(tools).unwrap()),
            Arc::new(InCallerTask),
            None,
        ));
        let config = config();
        let answerer = Answerer::new(
            &config,
            calls,
            Arc::new(Forever),
            Arc::new(ProgressNotes::default()),
            Arc::new(crate::transcript::NoTranscript),
            Budgets::unlimited(),
        );
        let err = answerer.answer("a", "q").await.unwrap_err();
        assert!(matches!(err, AnswerError::TooManyTurns), "{err:?}");
        assert_eq!(err.to_string(), "no answer after 4 model turns of tool use");
    }

    /// Reports one retry and a streamed reply's growth of each call, then answers.
    struct RetriesOnce;

    #[async_trait]
    impl LlmClient for RetriesOnce {
        async fn complete(&self, _: &LlmRequest) -> Result<LlmResponse, LlmError> {
            Err(LlmError::Script("only observed calls are made".into()))
        }

        async fn complete_observed(
            &self,
            _: &LlmRequest,
            observer: &dyn td_llm::CallObserver,
        ) -> Result<LlmResponse, LlmError> {
            observer.retrying(&td_llm::RetryNotice {
                attempt: 1,
                wait: std::time::Duration::from_millis(250),
                status: Some(529),
                cause: "overloaded".into(),
            });
            observer.output_growing(9);
            Ok(LlmResponse {
                text: Some("port 8080".into()),
                tool_calls: Vec::new(),
                stop_reason: StopReason::EndTurn,
                usage: Default::default(),
            })
        }
    }

    /// Keeps the growth of streamed replies reported to it.
    #[derive(Default)]
    struct GrowthSeen(Mutex<Vec<(String, u64)>>);

    impl crate::transcript::TranscriptSink for GrowthSeen {
        fn record(&self, _: &str, _: crate::transcript::TranscriptEntry) {}

        fn output_growing(&self, loop_name: &str, chars: u64) {
            self.0.lock().unwrap().push((loop_name.to_string(), chars));
        }
    }

    #[tokio::test]
    async fn the_retries_of_an_answer_are_events_of_the_answering_loop() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "b").unwrap();
        let calls = Arc::new(CallPath::new(
            Arc::new(ctx),
            Arc::new(ToolSet::from_tools(Vec::new()).unwrap()),
            Arc::new(InCallerTask),
            None,
        ));
        let config = config();
        let events = Arc::new(EventLog::in_memory());
        let growth = Arc::new(GrowthSeen::default());
        let answerer = Answerer::new(
            &config,
            calls,
            Arc::new(RetriesOnce),
            Arc::new(ProgressNotes::default()),
            growth.clone(),
            Budgets::unlimited(),
        )
        .with_events(events.clone());
        assert_eq!(answerer.answer("a", "port?").await.unwrap(), "port 8080");
        // The answer's reply growing is shown on the answering loop's row.
        assert_eq!(*growth.0.lock().unwrap(), vec![("b".to_string(), 9)]);
        let kinds: Vec<_> = events.events().into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![td_protocol::events::EventKind::ModelRetried {
                loop_name: "b".into(),
                attempt: 1,
                wait_ms: 250,
                status: Some(529),
                cause: "overloaded".into(),
            }]
        );
    }
}
