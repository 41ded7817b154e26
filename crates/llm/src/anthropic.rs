//! The Anthropic Messages API provider (`POST {base_url}/v1/messages`; streamed as
//! [`crate::stream`] says):
//! maps the provider-neutral conversation to Anthropic's JSON and back.
//!
//! Mapping notes:
//! - the system prompt goes in the top-level `system` field (omitted when empty);
//! - blocks map one to one (`text`, `tool_use`, `tool_result` with `is_error` when true);
//!   empty text blocks are dropped and so are messages left with no block, because the API
//!   rejects both;
//! - when tools are sent, `tool_choice` is sent too (`{"type": "auto"}` unless configured,
//!   see [`ToolChoice`]; `required` is the API's `any`);
//! - reply text blocks are joined with a newline; block types this client does not use
//!   (thinking, server tools) are skipped;
//! - `usage.input_tokens` counts every prompt token the call consumed: Anthropic reports
//!   cache reads and cache writes apart from `input_tokens`, so they are added in.

use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use td_protocol::tool_definition::ToolDefinition;

use super::endpoint::{ApiClient, EndpointSettings, ToolChoice, WireFormat, token_count};
use super::http::{ApiKey, HttpSettings, HttpTransport, SetupError, quote_json};
use super::stream::anthropic::AnthropicAssembler;
use super::{Block, LlmError, LlmRequest, LlmResponse, Role, StopReason, ToolCall, Usage};

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Where the API lives unless configured otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// What an Anthropic client needs besides HTTP settings.
#[derive(Debug, Clone)]
pub struct AnthropicSettings {
    /// Model (e.g. `claude-sonnet-4-5`), temperature, `tool_choice`, and the API root
    /// without `/v1/messages`.
    pub endpoint: EndpointSettings,
    /// Output token limit of each call (the API requires one).
    pub max_tokens: u32,
    /// The key sent as `x-api-key`.
    pub api_key: ApiKey,
}

/// A client of the Anthropic Messages API.
pub type AnthropicClient = ApiClient<AnthropicFormat>;

/// The Messages API JSON of one configured endpoint.
#[derive(Debug)]
pub struct AnthropicFormat {
    max_tokens: u32,
}

impl AnthropicClient {
    /// A client whose calls share `in_flight` with every other client of the run.
    pub fn new(
        settings: AnthropicSettings,
        http: HttpSettings,
        in_flight: Arc<Semaphore>,
    ) -> Result<Self, SetupError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("x-api-key"),
            settings.api_key.header_value("")?,
        );
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        let url = format!(
            "{}/v1/messages",
            settings.endpoint.base_url.trim_end_matches('/')
        );
        let format = AnthropicFormat {
            max_tokens: settings.max_tokens,
        };
        Ok(ApiClient::with_format(
            HttpTransport::new(&url, headers, http, in_flight)?,
            settings.endpoint,
            format,
        ))
    }
}

impl WireFormat for AnthropicFormat {
    fn add_request(&self, request: &LlmRequest, body: &mut Map<String, Value>) {
        body.insert("max_tokens".into(), json!(self.max_tokens));
        if !request.system.is_empty() {
            body.insert("system".into(), json!(request.system));
        }
        let messages: Vec<Value> = request
            .messages
            .iter()
            .filter_map(|m| {
                let content: Vec<Value> = m.content.iter().filter_map(block_json).collect();
                if content.is_empty() {
                    return None;
                }
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                Some(json!({"role": role, "content": content}))
            })
            .collect();
        body.insert("messages".into(), Value::Array(messages));
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request.tools.iter().map(tool_json).collect();
            body.insert("tools".into(), Value::Array(tools));
        }
    }

    /// `auto` is the API's default; it is sent anyway, so that compatible servers that
    /// default otherwise behave the same.
    fn tool_choice(choice: ToolChoice) -> Option<Value> {
        let kind = match choice {
            ToolChoice::Auto => "auto",
            ToolChoice::Required => "any",
            ToolChoice::None => "none",
            ToolChoice::Omit => return None,
        };
        Some(json!({"type": kind}))
    }

    fn parse_response(reply: &Value) -> Result<LlmResponse, LlmError> {
        parse_response(reply)
    }

    type Assembler = AnthropicAssembler;

    fn add_stream_fields(body: &mut Map<String, Value>) {
        body.insert("stream".into(), json!(true));
    }
}

/// A tool definition as the Messages API takes it: `{name, description, input_schema}`.
/// Requests send it, and `taskdaemon tools list --format anthropic` prints it.
pub fn tool_json(tool: &ToolDefinition) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
    })
}

fn block_json(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({"type": "text", "text": text}),
        Block::ToolUse { id, name, input } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            let mut v =
                json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": content});
            if *is_error {
                v["is_error"] = Value::Bool(true);
            }
            v
        }
    })
}

/// The text field `name` of a content block (a tool call's `id` or `name`).
pub(crate) fn text_field(block: &Value, name: &str) -> Option<String> {
    block.get(name).and_then(Value::as_str).map(str::to_string)
}

/// Reads a Messages API reply.
pub fn parse_response(body: &Value) -> Result<LlmResponse, LlmError> {
    let bad =
        |what: &str| LlmError::BadReply(format!("Anthropic reply {what}: {}", quote_json(body)));
    let blocks = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("has no `content` list"))?;
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("has a text block without `text`"))?;
                if !text.is_empty() {
                    texts.push(text);
                }
            }
            Some("tool_use") => {
                let field = |name: &str| {
                    text_field(block, name)
                        .ok_or_else(|| bad(&format!("has a tool_use block without `{name}`")))
                };
                tool_calls.push(ToolCall {
                    id: field("id")?,
                    name: field("name")?,
                    input: block.get("input").cloned().unwrap_or_else(|| json!({})),
                });
            }
            _ => {}
        }
    }
    let stop_reason = match body.get("stop_reason").and_then(Value::as_str) {
        Some("end_turn") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
        None => return Err(bad("has no `stop_reason`")),
    };
    let count = |name: &str| token_count(body, &format!("/usage/{name}"));
    Ok(LlmResponse {
        text: (!texts.is_empty()).then(|| texts.join("\n")),
        tool_calls,
        stop_reason,
        usage: Usage {
            input_tokens: count("input_tokens"),
            output_tokens: count("output_tokens"),
            cache_read_tokens: count("cache_read_input_tokens"),
            cache_write_tokens: count("cache_creation_input_tokens"),
            estimated: false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;
    use crate::test_support::request;
    use td_protocol::tool_definition::ToolDefinition;

    fn client(temperature: Option<f64>) -> AnthropicClient {
        AnthropicClient::new(
            AnthropicSettings {
                endpoint: EndpointSettings {
                    temperature,
                    ..EndpointSettings::new("http://127.0.0.1:9/", "claude-test")
                },
                max_tokens: 100,
                api_key: ApiKey::new("sk-ant-unit", "test").unwrap(),
            },
            HttpSettings::default(),
            Arc::new(Semaphore::new(1)),
        )
        .unwrap()
    }

    #[test]
    fn the_url_ignores_a_trailing_slash_and_debug_hides_the_key() {
        let c = client(None);
        let shown = format!("{c:?}");
        assert!(shown.contains("http://127.0.0.1:9/v1/messages"), "{shown}");
        assert!(!shown.contains("sk-ant-unit"), "{shown}");
    }

    #[test]
    fn empty_system_text_and_messages_are_left_out() {
        let c = client(Some(0.5));
        let body = c.request_body(&request(vec![
            Message {
                role: Role::Assistant,
                content: vec![Block::Text {
                    text: String::new(),
                }],
            },
            Message::user_text("hi"),
        ]));
        assert_eq!(
            body,
            json!({
                "model": "claude-test",
                "max_tokens": 100,
                "temperature": 0.5,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
            })
        );
    }

    #[test]
    fn tools_and_error_results_are_mapped() {
        let c = client(None);
        let mut req = request(vec![Message {
            role: Role::User,
            content: vec![
                Block::ToolResult {
                    tool_use_id: "a".into(),
                    content: "ok".into(),
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "b".into(),
                    content: "bad".into(),
                    is_error: true,
                },
            ],
        }]);
        req.tools = vec![ToolDefinition {
            name: "t".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        }]
        .into();
        let body = c.request_body(&req);
        assert_eq!(
            body["messages"][0]["content"],
            json!([
                {"type": "tool_result", "tool_use_id": "a", "content": "ok"},
                {"type": "tool_result", "tool_use_id": "b", "content": "bad", "is_error": true}
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{"name": "t", "description": "d", "input_schema": {"type": "object"}}])
        );
        assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    }

    #[test]
    fn replies_are_parsed() {
        let reply = json!({
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "one"},
                {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "x"}},
                {"type": "text", "text": "two"}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 1}
        });
        let r = parse_response(&reply).unwrap();
        assert_eq!(r.text.as_deref(), Some("one\ntwo"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "toolu_1".into(),
                name: "grep".into(),
                input: json!({"pattern": "x"})
            }]
        );
        assert_eq!(r.stop_reason, StopReason::ToolUse);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_tokens: 100,
                cache_write_tokens: 1,
                estimated: false,
            }
        );
    }

    #[test]
    fn stop_reasons_are_mapped() {
        for (wire, want) in [
            ("end_turn", StopReason::EndTurn),
            ("tool_use", StopReason::ToolUse),
            ("max_tokens", StopReason::MaxTokens),
            ("stop_sequence", StopReason::Other("stop_sequence".into())),
            ("refusal", StopReason::Other("refusal".into())),
        ] {
            let r = parse_response(&json!({"content": [], "stop_reason": wire})).unwrap();
            assert_eq!(r.stop_reason, want);
            assert_eq!(r.text, None);
            assert_eq!(r.usage, Usage::default());
        }
    }

    #[test]
    fn malformed_replies_are_bad_replies() {
        for reply in [
            json!({"stop_reason": "end_turn"}),
            json!({"content": [{"type": "text"}], "stop_reason": "end_turn"}),
            json!({"content": [{"type": "tool_use", "name": "x", "input": {}}], "stop_reason": "tool_use"}),
            json!({"content": []}),
        ] {
            let err = parse_response(&reply).unwrap_err();
            assert!(matches!(err, LlmError::BadReply(_)), "{err:?}");
        }
    }
}
