//! What a loop's transcript records: each model request (the messages new since the last
//! one), each response and what it spent, each tool result, inbox notices, validation and
//! answered queries.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use td_base::sync::lock;
use td_llm::{LlmResponse, Message, Purpose};
use td_protocol::spend::Spend;

/// One transcript line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "entry", rename_all = "snake_case")]
pub enum TranscriptEntry {
    /// An iteration began with a fresh context.
    IterationStarted {
        /// 1-based iteration.
        iteration: u32,
        /// The system prompt.
        system: String,
    },
    /// A request to the model: the messages added since the previous request.
    Request {
        /// 1-based iteration (0 for query answers).
        iteration: u32,
        /// 1-based turn within the iteration.
        turn: u32,
        /// Why the model was called.
        purpose: Purpose,
        /// Messages new since the last request of this conversation.
        new_messages: Vec<Message>,
    },
    /// The model's answer.
    Response {
        /// 1-based iteration (0 for query answers).
        iteration: u32,
        /// 1-based turn.
        turn: u32,
        /// The response.
        response: LlmResponse,
    },
    /// What the model call just answered spent (right after its response).
    Spent {
        /// 1-based iteration (0 for query answers).
        iteration: u32,
        /// 1-based turn.
        turn: u32,
        /// The loop the call is charged to when it is not this one: the loop whose question
        /// this call answers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        charged_to: Option<String>,
        /// Tokens and cost.
        spend: Spend,
    },
    /// A tool call's result as the model saw it.
    ToolResult {
        /// 1-based iteration.
        iteration: u32,
        /// 1-based turn.
        turn: u32,
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Result text.
        content: String,
        /// Whether it was an error.
        is_error: bool,
    },
    /// The validation command ran.
    Validation {
        /// 1-based iteration.
        iteration: u32,
        /// Exit code (`None`: killed, timed out, or no command).
        exit_code: Option<i32>,
        /// Whether it passed.
        passed: bool,
        /// Its output (head and tail).
        output: String,
    },
    /// The model's call failed.
    ModelError {
        /// 1-based iteration (0 for query answers).
        iteration: u32,
        /// The error.
        error: String,
    },
}

/// Where transcripts go: for a loop's engine, the record of its run.
pub trait TranscriptSink: Send + Sync {
    /// Records one entry of `loop_name`'s transcript.
    fn record(&self, loop_name: &str, entry: TranscriptEntry);

    /// Records `entries` of `loop_name`'s transcript in order, as [`TranscriptSink::record`]
    /// of each would. A sink writing a file may write them at once (a host's records batch
    /// on the head: one write for the batch, not one per entry).
    fn record_all(&self, loop_name: &str, entries: Vec<TranscriptEntry>) {
        for entry in entries {
            self.record(loop_name, entry);
        }
    }

    /// Whether the entries given to [`TranscriptSink::record`] are kept. A sink that
    /// discards them ([`NoTranscript`]) says no, and the turn loop then does not build them
    /// (a request's new messages and each response are copied into their entries).
    fn keeps_entries(&self) -> bool {
        true
    }

    /// Why the record behind this sink can no longer be written, once a write to it failed
    /// (`None` while every write went through, and for sinks that cannot fail). The engine
    /// stops a loop before its next model or tool call when this says so: work whose record
    /// cannot be kept is not done.
    fn unwritable(&self) -> Option<String> {
        None
    }

    /// Reports a write of the same record made elsewhere (a loop's receipt) that failed, so
    /// that [`TranscriptSink::unwritable`] says so from now on.
    fn write_failed(&self, _what: String) {}

    /// A reply streaming in for `loop_name` has grown to `chars` characters of text and tool
    /// input. For live progress only: nothing of it goes into the record. Called for every
    /// chunk of a stream, so a sink that acts on it must be cheap (and throttle what it shows).
    fn output_growing(&self, _loop_name: &str, _chars: u64) {}
}

/// Keeps every transcript in memory (tests, scenario snapshots).
#[derive(Debug, Default)]
pub struct MemoryTranscripts {
    by_loop: Mutex<BTreeMap<String, Vec<TranscriptEntry>>>,
}

impl MemoryTranscripts {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The entries of one loop.
    pub fn of(&self, loop_name: &str) -> Vec<TranscriptEntry> {
        lock(&self.by_loop)
            .get(loop_name)
            .cloned()
            .unwrap_or_default()
    }
}

impl TranscriptSink for MemoryTranscripts {
    fn record(&self, loop_name: &str, entry: TranscriptEntry) {
        lock(&self.by_loop)
            .entry(loop_name.to_string())
            .or_default()
            .push(entry);
    }
}

/// Discards transcripts.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTranscript;

impl TranscriptSink for NoTranscript {
    fn record(&self, _loop_name: &str, _entry: TranscriptEntry) {}

    fn keeps_entries(&self) -> bool {
        false
    }
}
