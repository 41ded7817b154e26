//! The model turn loop, the one implementation behind a loop's iterations and its answers
//! to other loops' questions: send the conversation, record the response, run the tool calls
//! it asks for through the loop's [`CallPath`] (routes, lanes, receipts), append the results,
//! and go on until the model answers without calling a tool, a turn limit, a stop, a model
//! error, or a record that can no longer be written.
//!
//! What differs between the two is given by [`TurnRules`]: notices added before each
//! request (an iteration's inbox), calls refused without running (an answer may only read),
//! and whether the conversation is over after a turn's calls (`complete_task`).
//!
//! Calls of one response: consecutive calls that [`CallPath::concurrent`] allows run
//! together, the others one at a time in order; after a stop only the call in flight
//! finishes (a stop "now" cancels it too); after `complete_task` nothing more of the response runs; nothing more runs once
//! the record cannot be written (a receipt that could not be saved says so to the record, so
//! that every loop of the run stops before its next call).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::watch;

use td_base::sync::lock;
use td_llm::{
    Block, CallObserver, LlmClient, LlmError, LlmRequest, LlmResponse, Message, RetryNotice, Role,
};
use td_protocol::events::{EventKind, EventLog};
use td_toolkit::call_path::{CallPath, ReceiptNotSaved};
use td_toolkit::registry::CallOutcome;

use td_protocol::spend::Spend;

use crate::StopRequest;
use crate::budget::{Account, Hold};
use crate::transcript::{TranscriptEntry, TranscriptSink};

/// How a conversation's turns ended.
#[derive(Debug)]
pub(crate) enum TurnsEnd {
    /// The model answered without calling a tool; its text.
    EndTurn(Option<String>),
    /// [`TurnRules::finished`] said so after a turn's calls (`complete_task` ran).
    Finished,
    /// The turn limit was reached.
    MaxTurns,
    /// A stop was requested.
    Stopped,
    /// The model call failed.
    ModelError(LlmError),
    /// The run record (or a receipt) could not be written: nothing more may run.
    RecordUnwritable(String),
    /// The next model call does not fit a budget: why, and what to do.
    OverBudget(String),
}

/// What one kind of conversation adds to the shared turn loop.
pub(crate) trait TurnRules: Send + Sync {
    /// Before each request: adds what must reach the model at this turn (inbox items,
    /// file-change notices) to the last message.
    fn before_request(&mut self, _messages: &mut [Message]) {}

    /// Why the model may not call `name` in this conversation, if it may not: the call is
    /// answered with this text as an error and not run.
    fn refuse(&self, _name: &str) -> Option<String> {
        None
    }

    /// After a turn's calls: whether the conversation is over.
    fn finished(&mut self) -> bool {
        false
    }
}

/// One conversation of a loop with its model.
pub(crate) struct Turns<'a> {
    /// The loop's name (its transcript).
    pub loop_name: &'a str,
    /// The iteration (0 for answers to other loops).
    pub iteration: u32,
    /// Model calls before the conversation gives up.
    pub max_turns: u32,
    /// The model.
    pub llm: &'a dyn LlmClient,
    /// The loop's transcript (and the health of its run record).
    pub transcript: &'a dyn TranscriptSink,
    /// Where the calls run and their receipts go.
    pub calls: &'a CallPath,
    /// Says when the loop must stop (`None`: the conversation is not stopped).
    pub stop: Option<&'a watch::Receiver<StopRequest>>,
    /// Counts model calls as they are made, when given.
    pub model_calls: Option<&'a AtomicU32>,
    /// Where the retries of the model calls are recorded, when given.
    pub events: Option<&'a EventLog>,
    /// Where the calls are charged (reserved before, settled after), and the loop that is
    /// charged when it is not this one (the asker of a question).
    pub charge: Charge<'a>,
}

/// What a loop's model call reports on its way: each retry becomes a
/// [`EventKind::ModelRetried`] event, which the run record keeps and the live progress shows;
/// a streamed reply's growth goes to the transcript sink (the live progress only, never the
/// record).
///
/// Also what the head observes a worker host's loop's model calls with: it makes them.
pub struct CallEvents<'a> {
    loop_name: &'a str,
    events: Option<&'a EventLog>,
    transcript: &'a dyn TranscriptSink,
}

impl<'a> CallEvents<'a> {
    /// Reports loop `loop_name`'s call's retries to `events` (none kept without) and its
    /// streamed output's growth to `transcript`.
    pub fn new(
        loop_name: &'a str,
        events: Option<&'a EventLog>,
        transcript: &'a dyn TranscriptSink,
    ) -> Self {
        CallEvents {
            loop_name,
            events,
            transcript,
        }
    }
}

impl CallObserver for CallEvents<'_> {
    fn output_growing(&self, chars: u64) {
        self.transcript.output_growing(self.loop_name, chars);
    }

    fn retrying(&self, notice: &RetryNotice) {
        if let Some(events) = self.events {
            events.record(EventKind::ModelRetried {
                loop_name: self.loop_name.to_string(),
                attempt: notice.attempt,
                wait_ms: u64::try_from(notice.wait.as_millis()).unwrap_or(u64::MAX),
                status: notice.status,
                cause: notice.cause.clone(),
            });
        }
    }
}

/// Where a conversation's model calls are charged, and where what they spent adds up.
pub(crate) struct Charge<'a> {
    /// The account of the loop that pays.
    pub account: &'a Account,
    /// The paying loop, when it is not the one that calls (an answer's asker).
    pub charged_to: Option<&'a str>,
    /// What the conversation's calls spent, kept outside it (a timeout drops it).
    pub spent: &'a Mutex<Spend>,
}

impl Turns<'_> {
    fn stopped(&self) -> bool {
        self.stop.is_some_and(|s| s.borrow().requested())
    }

    /// Runs the conversation in `request` (which keeps growing turn by turn) to its end.
    pub(crate) async fn run<R: TurnRules>(
        &self,
        request: &mut LlmRequest,
        rules: &mut R,
    ) -> TurnsEnd {
        let mut sent = 0usize;
        for turn in 1..=self.max_turns {
            if self.stopped() {
                return TurnsEnd::Stopped;
            }
            if let Some(why) = self.transcript.unwritable() {
                return TurnsEnd::RecordUnwritable(why);
            }
            // Reserved before the turn's notices are drained from the inbox, so that a call
            // refused leaves them for the next iteration.
            let hold = match self.charge.account.reserve(request) {
                Ok(hold) => hold,
                Err(why) => return TurnsEnd::OverBudget(why),
            };
            rules.before_request(&mut request.messages);
            self.note(|| TranscriptEntry::Request {
                iteration: self.iteration,
                turn,
                purpose: request.purpose.clone(),
                new_messages: request.messages[sent..].to_vec(),
            });
            sent = request.messages.len();
            if let Some(count) = self.model_calls {
                count.fetch_add(1, Ordering::Relaxed);
            }
            let observer = CallEvents {
                loop_name: self.loop_name,
                events: self.events,
                transcript: self.transcript,
            };
            let call = self.llm.complete_observed(request, &observer);
            let response = match self.stop {
                Some(stop) => {
                    let mut stop = stop.clone();
                    tokio::select! {
                        r = call => r,
                        _ = stop.wait_for(|s| s.requested()) => return TurnsEnd::Stopped,
                    }
                }
                None => call.await,
            };
            let response = match response {
                Ok(r) => r,
                // A client whose budgets are checked elsewhere (a worker host's, by the
                // head) refused the call: a pause, as at the check above.
                Err(LlmError::OverBudget(why)) => return TurnsEnd::OverBudget(why),
                Err(e) => {
                    self.transcript.record(
                        self.loop_name,
                        TranscriptEntry::ModelError {
                            iteration: self.iteration,
                            error: e.to_string(),
                        },
                    );
                    return TurnsEnd::ModelError(e);
                }
            };
            self.note(|| TranscriptEntry::Response {
                iteration: self.iteration,
                turn,
                response: response.clone(),
            });
            self.settle(hold, turn, &response);
            if response.tool_calls.is_empty() {
                // The conversation ends here: nothing will send the reply back.
                return TurnsEnd::EndTurn(response.text);
            }
            request.messages.push(assistant_message(&response));
            // Boxed: only a turn with calls needs it, and inline it made every conversation's
            // future larger than the allocator's small sizes (an answer is boxed per query, and
            // a larger box is allocated and freed the slow way: bench query).
            let (results, stopped, unrecorded) =
                Box::pin(self.run_calls(turn, &response, rules)).await;
            request.messages.push(Message {
                role: Role::User,
                content: results,
            });
            if let Some(why) = unrecorded {
                return TurnsEnd::RecordUnwritable(why);
            }
            if rules.finished() {
                return TurnsEnd::Finished;
            }
            if stopped {
                return TurnsEnd::Stopped;
            }
        }
        TurnsEnd::MaxTurns
    }

    /// Settles a call's reservation to what it spent, and records that.
    fn settle(&self, hold: Hold, turn: u32, response: &LlmResponse) {
        let spend = hold.settle(&response.usage);
        lock(self.charge.spent).add(&spend);
        self.note(|| TranscriptEntry::Spent {
            iteration: self.iteration,
            turn,
            charged_to: self.charge.charged_to.map(str::to_string),
            spend,
        });
    }

    /// Records the entry `entry` makes, if the transcript keeps entries (building one copies
    /// messages and responses).
    fn note(&self, entry: impl FnOnce() -> TranscriptEntry) {
        if self.transcript.keeps_entries() {
            self.transcript.record(self.loop_name, entry());
        }
    }

    /// Runs the calls of one response (see the module doc). Returns the results, whether a
    /// stop came, and why the record could not be written, if so.
    async fn run_calls<R: TurnRules>(
        &self,
        turn: u32,
        response: &LlmResponse,
        rules: &R,
    ) -> (Vec<Block>, bool, Option<String>) {
        let calls = &response.tool_calls;
        let mut results: Vec<Option<(String, bool)>> = vec![None; calls.len()];
        let mut stopped = false;
        // The calls a stop "now" cancelled while they ran.
        let mut cancelled = 0..0;
        let mut unrecorded: Option<String> = None;
        let mut i = 0;
        while i < calls.len() {
            if self.stopped() {
                stopped = true;
                break;
            }
            if let Some(why) = unrecorded.clone().or_else(|| self.transcript.unwritable()) {
                unrecorded = Some(why);
                break;
            }
            if let Some(refusal) = rules.refuse(&calls[i].name) {
                results[i] = Some((refusal, true));
                i += 1;
                continue;
            }
            let mut j = i + 1;
            if self.calls.concurrent(&calls[i].name) {
                while j < calls.len()
                    && rules.refuse(&calls[j].name).is_none()
                    && self.calls.concurrent(&calls[j].name)
                {
                    j += 1;
                }
            }
            let batch = calls[i..j]
                .iter()
                .map(|c| self.calls.call(Some(&c.id), &c.name, c.input.clone()));
            let batch = futures::future::join_all(batch);
            // A stop "now" drops the calls in flight (see `StopRequest::Now`): what they had
            // not answered yet is answered as cancelled below.
            let called = match self.stop {
                Some(stop) => {
                    let mut stop = stop.clone();
                    tokio::select! {
                        called = batch => called,
                        _ = stop.wait_for(|s| *s == StopRequest::Now) => {
                            stopped = true;
                            cancelled = i..j;
                            break;
                        }
                    }
                }
                None => batch.await,
            };
            for (k, called) in called.into_iter().enumerate() {
                if let Err(e) = &called.saved
                    && unrecorded.is_none()
                {
                    unrecorded = Some(self.receipt_not_saved(e));
                }
                let CallOutcome {
                    content, is_error, ..
                } = called.outcome;
                results[i + k] = Some((content, is_error));
            }
            let completed = calls[i..j].iter().any(|c| c.name == "complete_task");
            i = j;
            if completed {
                break;
            }
        }
        let mut blocks = Vec::with_capacity(calls.len());
        for (k, (call, result)) in calls.iter().zip(results).enumerate() {
            let (content, is_error) = match (result, &unrecorded) {
                (Some(r), _) => r,
                (None, None) if cancelled.contains(&k) => (
                    "cancelled: the loop was stopped while this call ran".to_string(),
                    true,
                ),
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
            self.note(|| TranscriptEntry::ToolResult {
                iteration: self.iteration,
                turn,
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: content.clone(),
                is_error,
            });
            blocks.push(Block::ToolResult {
                tool_use_id: call.id.clone(),
                content,
                is_error,
            });
        }
        (blocks, stopped, unrecorded)
    }

    /// Why the record is now unwritable after a receipt could not be saved; tells the
    /// record, so that every loop of the run stops before its next call.
    fn receipt_not_saved(&self, e: &ReceiptNotSaved) -> String {
        receipt_not_saved(self.transcript, self.loop_name, e)
    }
}

/// The message for a receipt of `loop_name` that could not be saved, after telling the
/// record (which logs it and says which run) that it can no longer be written.
pub(crate) fn receipt_not_saved(
    transcript: &dyn TranscriptSink,
    loop_name: &str,
    e: &ReceiptNotSaved,
) -> String {
    let why = format!(
        "cannot append a receipt of loop `{loop_name}` to {}: {}",
        e.path.display(),
        e.source
    );
    transcript.write_failed(why.clone());
    why
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use td_llm::{LlmResponse, Purpose, StopReason, Usage};
    use td_toolkit::call_path::InCallerTask;
    use td_toolkit::context::ToolContext;
    use td_toolkit::registry::ToolSet;

    use super::*;
    use crate::budget::{Budgets, Carried, Limits, Pricing};
    use crate::transcript::MemoryTranscripts;

    /// Keeps the growth reported to it.
    #[derive(Default)]
    struct GrowthSeen(Mutex<Vec<(String, u64)>>);

    impl TranscriptSink for GrowthSeen {
        fn record(&self, _loop_name: &str, _entry: TranscriptEntry) {}

        fn output_growing(&self, loop_name: &str, chars: u64) {
            self.0.lock().unwrap().push((loop_name.to_string(), chars));
        }
    }

    /// The one observer of a call (iterations and answers alike) records retries as events
    /// and passes a streamed reply's growth to the transcript sink, never to the record.
    #[test]
    fn one_observer_records_retries_and_shows_growth() {
        let events = EventLog::in_memory();
        let sink = GrowthSeen::default();
        let observer = CallEvents {
            loop_name: "api",
            events: Some(&events),
            transcript: &sink,
        };
        observer.output_growing(12);
        observer.retrying(&RetryNotice {
            attempt: 2,
            wait: Duration::from_millis(1500),
            status: Some(503),
            cause: "busy".into(),
        });
        observer.output_growing(40);
        assert_eq!(
            *sink.0.lock().unwrap(),
            vec![("api".to_string(), 12), ("api".to_string(), 40)]
        );
        let kinds: Vec<_> = events.events().into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![EventKind::ModelRetried {
                loop_name: "api".into(),
                attempt: 2,
                wait_ms: 1500,
                status: Some(503),
                cause: "busy".into(),
            }]
        );
        // Without an event log (a caller that records none) growth still reaches the sink.
        let observer = CallEvents {
            loop_name: "b",
            events: None,
            transcript: &sink,
        };
        observer.output_growing(3);
        assert_eq!(sink.0.lock().unwrap().last(), Some(&("b".to_string(), 3)));
    }

    /// Ends its turn at once, reporting 100 input and 10 output tokens; counts its calls.
    struct Counting(AtomicU32);

    #[async_trait]
    impl LlmClient for Counting {
        async fn complete(&self, _: &LlmRequest) -> Result<LlmResponse, LlmError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(LlmResponse {
                text: Some("done".into()),
                tool_calls: Vec::new(),
                stop_reason: StopReason::EndTurn,
                usage: Usage {
                    input_tokens: 100,
                    output_tokens: 10,
                    ..Usage::default()
                },
            })
        }
    }

    /// Counts the notices it was asked to add.
    struct Notices(u32);

    impl TurnRules for Notices {
        fn before_request(&mut self, _: &mut [Message]) {
            self.0 += 1;
        }
    }

    fn request() -> LlmRequest {
        LlmRequest {
            loop_name: "b".into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages: vec![Message::user_text("go")],
            tools: Vec::new().into(),
        }
    }

    #[tokio::test]
    async fn a_call_that_does_not_fit_is_not_made_and_leaves_the_notices_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let calls = CallPath::new(
            Arc::new(ToolContext::new(dir.path(), "b").unwrap()),
            Arc::new(ToolSet::from_tools(Vec::new()).unwrap()),
            Arc::new(InCallerTask),
            None,
        );
        let budgets = Budgets::new(
            Limits {
                tokens: Some(700),
                ..Limits::default()
            },
            Pricing {
                model: "m".into(),
                price: None,
                max_output_tokens: 500,
            },
            Carried::default(),
        );
        let asker = budgets.account("a");
        let llm = Counting(AtomicU32::new(0));
        let transcripts = MemoryTranscripts::new();
        let spent = Mutex::new(Spend::default());
        let turns = Turns {
            loop_name: "b",
            iteration: 0,
            max_turns: 4,
            llm: &llm,
            transcript: &transcripts,
            calls: &calls,
            stop: None,
            model_calls: None,
            events: None,
            charge: Charge {
                account: &asker,
                charged_to: Some("a"),
                spent: &spent,
            },
        };
        // 506 tokens reserved per call (18 request bytes: 6 input tokens, and 500 output):
        // the first fits and spends 110 tokens.
        let mut notices = Notices(0);
        assert!(matches!(
            turns.run(&mut request(), &mut notices).await,
            TurnsEnd::EndTurn(Some(_))
        ));
        assert_eq!(notices.0, 1);
        assert_eq!(lock(&spent).tokens(), 110);
        // What it spent follows its response, charged to the asker.
        let entries = transcripts.of("b");
        assert!(
            matches!(
                &entries[2],
                TranscriptEntry::Spent { charged_to: Some(a), spend, .. }
                    if a == "a" && spend.tokens() == 110 && spend.unpriced_calls == 1
            ),
            "{entries:?}"
        );
        // 110 spent + 506 reserved fits 700 once more; 220 + 506 does not.
        let mut notices = Notices(0);
        assert!(matches!(
            turns.run(&mut request(), &mut notices).await,
            TurnsEnd::EndTurn(_)
        ));
        let mut notices = Notices(0);
        let end = turns.run(&mut request(), &mut notices).await;
        let TurnsEnd::OverBudget(why) = end else {
            panic!("{end:?}")
        };
        assert!(
            why.contains("the run has used 220 of its 700 budgeted tokens"),
            "{why}"
        );
        // Refused before the turn's notices were taken (they wait for the next iteration),
        // and never sent.
        assert_eq!(notices.0, 0);
        assert_eq!(llm.0.load(Ordering::Relaxed), 2);
        assert_eq!(budgets.run_spent().tokens(), 220);
    }

    /// Keeps no entries, and fails the test if it is handed one.
    struct KeepsNothing;

    impl TranscriptSink for KeepsNothing {
        fn record(&self, _loop_name: &str, entry: TranscriptEntry) {
            panic!("an entry was built for a sink that keeps none: {entry:?}");
        }

        fn keeps_entries(&self) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn a_sink_that_keeps_no_entries_is_handed_none_and_the_turns_run_alike() {
        let dir = tempfile::tempdir().unwrap();
        let calls = CallPath::new(
            Arc::new(ToolContext::new(dir.path(), "b").unwrap()),
            Arc::new(ToolSet::from_tools(Vec::new()).unwrap()),
            Arc::new(InCallerTask),
            None,
        );
        let budgets = Budgets::new(
            Limits::default(),
            Pricing {
                model: "m".into(),
                price: None,
                max_output_tokens: 500,
            },
            Carried::default(),
        );
        let account = budgets.account("b");
        let llm = Counting(AtomicU32::new(0));
        let spent = Mutex::new(Spend::default());
        let turns = Turns {
            loop_name: "b",
            iteration: 1,
            max_turns: 4,
            llm: &llm,
            transcript: &KeepsNothing,
            calls: &calls,
            stop: None,
            model_calls: None,
            events: None,
            charge: Charge {
                account: &account,
                charged_to: None,
                spent: &spent,
            },
        };
        let end = turns.run(&mut request(), &mut Notices(0)).await;
        assert!(
            matches!(end, TurnsEnd::EndTurn(Some(ref t)) if t == "done"),
            "{end:?}"
        );
        assert_eq!(lock(&spent).tokens(), 110, "what it spent is still counted");
        assert_eq!(budgets.run_spent().tokens(), 110);
    }

    /// Refuses every call as over a budget kept elsewhere (a worker host's head).
    struct Refusing;

    #[async_trait]
    impl LlmClient for Refusing {
        async fn complete(&self, _: &LlmRequest) -> Result<LlmResponse, LlmError> {
            Err(LlmError::OverBudget(
                "the run has used 900 of its 1000 budgeted tokens".into(),
            ))
        }
    }

    #[tokio::test]
    async fn a_client_that_says_over_budget_pauses_the_turns_rather_than_failing_them() {
        let dir = tempfile::tempdir().unwrap();
        let calls = CallPath::new(
            Arc::new(ToolContext::new(dir.path(), "b").unwrap()),
            Arc::new(ToolSet::from_tools(Vec::new()).unwrap()),
            Arc::new(InCallerTask),
            None,
        );
        let budgets = Budgets::unlimited();
        let account = budgets.account("b");
        let spent = Mutex::new(Spend::default());
        let transcript = crate::transcript::MemoryTranscripts::new();
        let turns = Turns {
            loop_name: "b",
            iteration: 1,
            max_turns: 4,
            llm: &Refusing,
            transcript: &transcript,
            calls: &calls,
            stop: None,
            model_calls: None,
            events: None,
            charge: Charge {
                account: &account,
                charged_to: None,
                spent: &spent,
            },
        };
        let end = turns.run(&mut request(), &mut Notices(0)).await;
        assert!(
            matches!(&end, TurnsEnd::OverBudget(why) if why.contains("900 of its 1000")),
            "{end:?}"
        );
        // Nothing held stays reserved, and no model error is recorded.
        assert!(
            !transcript
                .of("b")
                .iter()
                .any(|e| matches!(e, TranscriptEntry::ModelError { .. }))
        );
    }
}
