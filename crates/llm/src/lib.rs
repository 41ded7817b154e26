//! The model side: the provider-neutral conversation types, the `LlmClient` trait, and the
//! providers. Only this module knows provider JSON; the engine speaks these types.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use td_protocol::tool_definition::ToolDefinition;

pub mod anthropic;
pub mod config;
pub mod endpoint;
pub mod http;
pub mod openai;
pub mod prices;
pub mod redacting;
pub mod scripted;
pub mod stream;

/// What the providers' tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{LlmRequest, Message, Purpose};

    /// An iteration request of loop `l` with `messages`, no system prompt and no tools.
    pub(crate) fn request(messages: Vec<Message>) -> LlmRequest {
        LlmRequest {
            loop_name: "l".into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages,
            tools: Vec::new().into(),
        }
    }
}

/// Why a model is called.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Purpose {
    /// A turn of the loop's own iteration.
    Iteration,
    /// A side call that answers another loop's question.
    QueryAnswer {
        /// The asking loop (shared with the query's route and records).
        from: Arc<str>,
        /// The question, verbatim (shared with the query's route and records).
        question: Arc<str>,
    },
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The loop (task, tool results, inbox).
    User,
    /// The model.
    Assistant,
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call made by the model.
    ToolUse {
        /// The call's id.
        id: String,
        /// Tool name.
        name: String,
        /// Tool input, shared with the [`ToolCall`] it was made from, the tool's call and
        /// its receipt: a call's input is never copied on its way.
        input: Arc<Value>,
    },
    /// The result of a tool call, sent back to the model.
    ToolResult {
        /// The id of the call it answers.
        tool_use_id: String,
        /// Result text.
        content: String,
        /// Whether it is an error.
        is_error: bool,
    },
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message with one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id (unique within the conversation).
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Tool input, shared (not copied) with the conversation's [`Block::ToolUse`], the
    /// tool's call and its receipt.
    pub input: Arc<Value>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its turn.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// It hit the output token limit.
    MaxTokens,
    /// Anything else the provider reported.
    Other(String),
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens billed at the full input price (for Anthropic: not read from or written
    /// to the cache; for OpenAI-compatible servers: the prompt tokens less the cached ones).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// The server reported no usage and these counts are estimated from the bytes sent and
    /// the characters received (about four a token; see [`stream`]), so that a call is never
    /// counted as free. Streamed replies of some servers (llama-cpp-python) carry no usage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A retry a provider is about to make: what failed and how long it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryNotice {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// How long the provider waits before the next attempt.
    pub wait: std::time::Duration,
    /// The HTTP status of the failed attempt, when the server answered.
    pub status: Option<u16>,
    /// Why the attempt failed, as the server or the transport said it (redacted).
    pub cause: String,
}

/// What a provider reports while one call is in flight; the engine turns it into events
/// and live progress. Every method has a default that ignores the report.
pub trait CallObserver: Send + Sync {
    /// The call failed and will be tried again.
    fn retrying(&self, _notice: &RetryNotice) {}

    /// A streamed reply has grown: `chars` characters of text and tool input so far.
    fn output_growing(&self, _chars: u64) {}
}

/// A [`CallObserver`] that ignores every report.
pub struct NoObserver;

impl CallObserver for NoObserver {}

/// A request to a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlmRequest {
    /// The loop on whose behalf the call is made (its exec id; shared with the loop, not
    /// copied per request).
    pub loop_name: Arc<str>,
    /// Iteration turn or query answer.
    pub purpose: Purpose,
    /// System prompt.
    pub system: String,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Tools the model may call. Shared: a loop sends the same definitions with every
    /// request, and copying their schemas each time cost more than the rest of a query.
    #[serde(serialize_with = "serialize_tools")]
    pub tools: Arc<[ToolDefinition]>,
}

fn serialize_tools<S: serde::Serializer>(
    tools: &Arc<[ToolDefinition]>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&**tools, serializer)
}

/// A model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmResponse {
    /// Text it said, if any.
    pub text: Option<String>,
    /// Tool calls it made, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Token usage.
    pub usage: Usage,
}

/// What can go wrong calling a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The network or the server failed (after retries).
    #[error("model transport error: {0}")]
    Transport(String),
    /// The provider answered with an error.
    #[error("model API error {status}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Provider's message.
        message: String,
    },
    /// The provider's reply could not be understood.
    #[error("model reply could not be parsed: {0}")]
    BadReply(String),
    /// A scripted provider has nothing for this request.
    #[error("script: {0}")]
    Script(String),
    /// The budget the call is charged to has no room for it, as a model client that
    /// checks budgets elsewhere says (a worker host's, whose calls the head makes and
    /// charges): the loop pauses as at its own budget check.
    #[error("{0}")]
    OverBudget(String),
}

/// A model provider.
#[async_trait]
pub trait LlmClient: Send + Sync {
    /// Sends one request and returns the model's answer. The request is borrowed: a loop
    /// keeps its conversation in one request and appends to it turn by turn, so a turn
    /// never copies the history it sends.
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError>;

    /// [`LlmClient::complete`], reporting retries and streamed output to `observer` as they
    /// happen. Providers that neither retry nor stream need not override it.
    async fn complete_observed(
        &self,
        request: &LlmRequest,
        _observer: &dyn CallObserver,
    ) -> Result<LlmResponse, LlmError> {
        self.complete(request).await
    }

    /// A resumed run tells the provider how many iteration requests a loop made in the
    /// iterations its record shows finished (an iteration cut short by a crash runs again
    /// from its start, so its requests are not counted). Network models need nothing; the
    /// scripted provider continues its script after them instead of replaying it from the
    /// start, and gives the cut-short iteration's replies again.
    fn resume(&self, _loop_name: &str, _responses_seen: usize) {}
}
