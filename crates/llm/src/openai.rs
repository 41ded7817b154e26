//! The OpenAI Chat Completions provider (`POST {base_url}/chat/completions`; streamed as
//! [`crate::stream`] says): maps the provider-neutral conversation to that JSON and back.
//! Other servers speak the same API (Ollama at `http://localhost:11434/v1`, vLLM,
//! OpenRouter); the ones tested against here are llama-cpp-python's server and mock-myna
//! (`tests/interop.rs`).
//!
//! Mapping notes:
//! - the system prompt is the first message (role `system`), left out when empty;
//! - an assistant message carries its text as `content` and its calls as `tool_calls` whose
//!   `arguments` is the input serialized as JSON text (an input kept as raw text, see below,
//!   goes back as a JSON string literal, so servers that parse the history, like vLLM's chat
//!   templates, still can);
//! - an assistant message that only calls tools (or says nothing) has `"content": ""`. The
//!   API reference allows `content` to be null or absent beside `tool_calls`, but
//!   llama-cpp-python's server (0.3) answers HTTP 500 to both (its request model wants a
//!   string, its chat templates read `message.content`), while `""` is accepted by it, by
//!   mock-myna and by the reference's own type (a string);
//! - when tools are sent, `tool_choice` is sent too (`"auto"` unless configured, see
//!   [`ToolChoice`]): llama-cpp-python's server drops the tools of a request without it;
//! - each tool result becomes a `tool` message with its `tool_call_id`, placed before any
//!   text of the same user message, because the API wants results right after the calls.
//!   The API has no error flag, so an error result's content starts with `ERROR: `;
//! - `Authorization: Bearer` is sent only when a key is configured (local servers need none);
//! - the output limit is sent as `max_completion_tokens` to api.openai.com (its newer
//!   models refuse `max_tokens`) and as `max_tokens` elsewhere (what Ollama, vLLM and
//!   llama.cpp understand), and only when configured.
//!
//! Reply leniency, because compatible servers differ:
//! - **invalid `arguments` JSON does not fail the call**: the tool call is kept with the raw
//!   text as a JSON *string* input. Schema validation then rejects it (tool inputs are
//!   objects) and the model gets an error result naming the problem, which it can fix on its
//!   next turn; failing the whole call would instead lose the turn with no feedback;
//! - `arguments` given as an object (some servers) is used as is; empty or missing means `{}`;
//! - a call without an id gets `call_<n>` (its position), so results can still refer to it;
//! - `finish_reason: "stop"` with tool calls (older Ollama) counts as tool use;
//! - missing `usage` counts as zero tokens.

use std::sync::Arc;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use td_protocol::tool_definition::ToolDefinition;

use super::endpoint::{ApiClient, EndpointSettings, ToolChoice, WireFormat, token_count};
use super::http::{ApiKey, HttpSettings, HttpTransport, SetupError, quote_json};
use super::stream::openai::OpenAiAssembler;
use super::{Block, LlmError, LlmRequest, LlmResponse, Role, StopReason, ToolCall, Usage};

/// Where the API lives unless configured otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// Prefix of a failed tool result's content (the API has no error flag).
pub const ERROR_PREFIX: &str = "ERROR: ";

/// What an OpenAI-compatible client needs besides HTTP settings.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// Model, temperature, `tool_choice`, and the API root without `/chat/completions`,
    /// e.g. `https://api.openai.com/v1` or `http://localhost:11434/v1`.
    pub endpoint: EndpointSettings,
    /// Output token limit; the server's default when `None`.
    pub max_tokens: Option<u32>,
    /// Sent as `Authorization: Bearer`; nothing is sent when `None`.
    pub api_key: Option<ApiKey>,
}

/// A client of an OpenAI-compatible Chat Completions endpoint.
pub type OpenAiClient = ApiClient<OpenAiFormat>;

/// The Chat Completions JSON of one configured endpoint.
#[derive(Debug)]
pub struct OpenAiFormat {
    max_tokens: Option<u32>,
    /// The name of the output-limit field this endpoint understands.
    max_tokens_field: &'static str,
}

impl OpenAiClient {
    /// A client whose calls share `in_flight` with every other client of the run.
    pub fn new(
        settings: OpenAiSettings,
        http: HttpSettings,
        in_flight: Arc<Semaphore>,
    ) -> Result<Self, SetupError> {
        let mut headers = HeaderMap::new();
        if let Some(key) = &settings.api_key {
            headers.insert(AUTHORIZATION, key.header_value("Bearer ")?);
        }
        let url = format!(
            "{}/chat/completions",
            settings.endpoint.base_url.trim_end_matches('/')
        );
        let transport = HttpTransport::new(&url, headers, http, in_flight)?;
        let official = transport
            .url()
            .host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case("api.openai.com"));
        let format = OpenAiFormat {
            max_tokens: settings.max_tokens,
            max_tokens_field: if official {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
        };
        Ok(ApiClient::with_format(transport, settings.endpoint, format))
    }
}

impl WireFormat for OpenAiFormat {
    fn add_request(&self, request: &LlmRequest, body: &mut Map<String, Value>) {
        let mut messages = Vec::new();
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": request.system}));
        }
        for message in &request.messages {
            push_message(&mut messages, message.role, &message.content);
        }
        body.insert("messages".into(), Value::Array(messages));
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request.tools.iter().map(tool_json).collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some(n) = self.max_tokens {
            body.insert(self.max_tokens_field.into(), json!(n));
        }
    }

    fn tool_choice(choice: ToolChoice) -> Option<Value> {
        match choice {
            ToolChoice::Auto => Some(json!("auto")),
            ToolChoice::Required => Some(json!("required")),
            ToolChoice::None => Some(json!("none")),
            ToolChoice::Omit => None,
        }
    }

    fn parse_response(reply: &Value) -> Result<LlmResponse, LlmError> {
        parse_response(reply)
    }

    type Assembler = OpenAiAssembler;

    fn add_stream_fields(body: &mut Map<String, Value>) {
        body.insert("stream".into(), json!(true));
        // Without it OpenAI sends no usage in a stream (some servers send none even so:
        // see crate::stream).
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
}

/// A tool definition as Chat Completions takes it:
/// `{type: "function", function: {name, description, parameters}}`. Requests send it, and
/// `taskdaemon tools list --format openai` prints it.
pub fn tool_json(tool: &ToolDefinition) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.input_schema,
        }
    })
}

/// Appends the wire messages of one conversation message.
fn push_message(out: &mut Vec<Value>, role: Role, blocks: &[Block]) {
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block {
            Block::Text { text } => texts.push(text.as_str()),
            Block::ToolUse { id, name, input } => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let content = if *is_error {
                    format!("{ERROR_PREFIX}{content}")
                } else {
                    content.clone()
                };
                out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}));
            }
        }
    }
    let text = (!texts.is_empty()).then(|| texts.join("\n"));
    match role {
        // A turn where the model said nothing still takes its place in the history.
        Role::Assistant => out.push(assistant_json(text.unwrap_or_default(), calls)),
        Role::User => {
            if let Some(text) = text {
                out.push(json!({"role": "user", "content": text}));
            }
            // Calls only come from the model; should one ever sit in a user message, it is
            // still sent (as the assistant's) rather than silently dropped.
            if !calls.is_empty() {
                out.push(assistant_json(String::new(), calls));
            }
        }
    }
}

/// An assistant message: `content` is always a string, `""` when the model only called
/// tools (see the module notes: servers answer 500 to null or absent content).
fn assistant_json(text: String, calls: Vec<Value>) -> Value {
    let mut m = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// Reads a Chat Completions reply.
pub fn parse_response(body: &Value) -> Result<LlmResponse, LlmError> {
    let bad =
        |what: &str| LlmError::BadReply(format!("OpenAI-style reply {what}: {}", quote_json(body)));
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| bad("has no `choices`"))?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| bad("has no `choices[0].message`"))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers answer with content parts; their text parts are the text.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(_) => return Err(bad("has a `content` that is neither text nor parts")),
    }
    .filter(|t| !t.is_empty());
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or_else(|| bad("has `tool_calls` that is not a list"))?;
        for (i, call) in calls.iter().enumerate() {
            let function = call
                .get("function")
                .ok_or_else(|| bad("has a tool call without `function`"))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad("has a tool call without a function name"))?;
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{}", i + 1), str::to_string);
            tool_calls.push(ToolCall {
                id,
                name: name.to_string(),
                input: arguments(function.get("arguments")).into(),
            });
        }
    }
    let stop_reason = match choice.get("finish_reason").and_then(Value::as_str) {
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("stop") | None if !tool_calls.is_empty() => StopReason::ToolUse,
        Some("stop") => StopReason::EndTurn,
        Some("length") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => StopReason::EndTurn,
    };
    let count = |name: &str| token_count(body, &format!("/usage/{name}"));
    let cached = count("prompt_tokens_details/cached_tokens");
    Ok(LlmResponse {
        text,
        tool_calls,
        stop_reason,
        usage: Usage {
            // `prompt_tokens` counts the cached ones too; they are billed apart.
            input_tokens: count("prompt_tokens").saturating_sub(cached),
            output_tokens: count("completion_tokens"),
            cache_read_tokens: cached,
            cache_write_tokens: 0,
            estimated: false,
        },
    })
}

/// A call's input from its `arguments` (see the module notes on leniency).
fn arguments(raw: Option<&Value>) -> Value {
    match raw {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(other) => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::test_support::request;

    fn client(base_url: &str, max_tokens: Option<u32>) -> OpenAiClient {
        OpenAiClient::new(
            OpenAiSettings {
                endpoint: EndpointSettings::new(base_url, "m"),
                max_tokens,
                api_key: Some(ApiKey::new("sk-openai-unit", "test").unwrap()),
            },
            HttpSettings::default(),
            Arc::new(Semaphore::new(1)),
        )
        .unwrap()
    }

    #[test]
    fn the_output_limit_field_depends_on_the_server() {
        let req = request(vec![Message::user_text("hi")]);
        let official = client("https://api.openai.com/v1/", Some(7)).request_body(&req);
        assert_eq!(official["max_completion_tokens"], json!(7));
        assert!(official.get("max_tokens").is_none());
        let local = client("http://localhost:11434/v1", Some(7)).request_body(&req);
        assert_eq!(local["max_tokens"], json!(7));
        assert!(local.get("max_completion_tokens").is_none());
        let unset = client("http://localhost:11434/v1", None).request_body(&req);
        assert_eq!(
            unset,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        );
        let shown = format!("{:?}", client("http://localhost:11434/v1", None));
        assert!(
            shown.contains("localhost:11434/v1/chat/completions"),
            "{shown}"
        );
        assert!(!shown.contains("sk-openai-unit"), "{shown}");
    }

    #[test]
    fn results_come_before_text_and_silent_turns_are_kept() {
        let body = client("http://h/v1", None).request_body(&request(vec![
            Message {
                role: Role::Assistant,
                content: vec![],
            },
            Message {
                role: Role::User,
                content: vec![
                    Block::Text {
                        text: "note".into(),
                    },
                    Block::ToolResult {
                        tool_use_id: "c1".into(),
                        content: "boom".into(),
                        is_error: true,
                    },
                    Block::ToolUse {
                        id: "odd".into(),
                        name: "t".into(),
                        input: json!({}).into(),
                    },
                ],
            },
        ]));
        assert_eq!(
            body["messages"],
            json!([
                {"role": "assistant", "content": ""},
                {"role": "tool", "tool_call_id": "c1", "content": "ERROR: boom"},
                {"role": "user", "content": "note"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "odd", "type": "function", "function": {"name": "t", "arguments": "{}"}}
                ]}
            ])
        );
    }

    #[test]
    fn arguments_are_parsed_leniently() {
        assert_eq!(arguments(Some(&json!("{\"a\":1}"))), json!({"a": 1}));
        assert_eq!(arguments(Some(&json!("{\"a\":"))), json!("{\"a\":"));
        assert_eq!(arguments(Some(&json!({"a": 1}))), json!({"a": 1}));
        assert_eq!(arguments(Some(&json!(""))), json!({}));
        assert_eq!(arguments(Some(&Value::Null)), json!({}));
        assert_eq!(arguments(None), json!({}));
    }

    #[test]
    fn replies_from_lenient_servers_are_understood() {
        // Older Ollama: no ids, object arguments, "stop" although it called tools, no usage.
        let reply = json!({"choices": [{"message": {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "grep", "arguments": {"pattern": "x"}}}]},
            "finish_reason": "stop"}]});
        let r = parse_response(&reply).unwrap();
        assert_eq!(r.text, None);
        assert_eq!(r.tool_calls[0].id, "call_1");
        assert_eq!(*r.tool_calls[0].input, json!({"pattern": "x"}));
        assert_eq!(r.stop_reason, StopReason::ToolUse);
        assert_eq!(r.usage, Usage::default());

        let parts = json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            "finish_reason": "content_filter"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 2}}});
        let r = parse_response(&parts).unwrap();
        assert_eq!(r.text.as_deref(), Some("a\nb"));
        assert_eq!(r.stop_reason, StopReason::Other("content_filter".into()));
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 1,
                output_tokens: 4,
                cache_read_tokens: 2,
                cache_write_tokens: 0,
                estimated: false,
            }
        );
    }

    #[test]
    fn finish_reasons_are_mapped() {
        for (wire, want) in [
            (json!("stop"), StopReason::EndTurn),
            (json!("tool_calls"), StopReason::ToolUse),
            (json!("length"), StopReason::MaxTokens),
            (Value::Null, StopReason::EndTurn),
        ] {
            let reply = json!({"choices": [{"message": {"content": "x"}, "finish_reason": wire}]});
            assert_eq!(parse_response(&reply).unwrap().stop_reason, want);
        }
    }

    #[test]
    fn malformed_replies_are_bad_replies() {
        for reply in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{"finish_reason": "stop"}]}),
            json!({"choices": [{"message": {"content": 5}}]}),
            json!({"choices": [{"message": {"tool_calls": {"id": "x"}}}]}),
            json!({"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]}),
            json!({"choices": [{"message": {"tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}}]}),
        ] {
            let err = parse_response(&reply).unwrap_err();
            assert!(matches!(err, LlmError::BadReply(_)), "{reply}: {err:?}");
        }
    }
}
