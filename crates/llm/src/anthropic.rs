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
//! - `usage.input_tokens` is what Anthropic bills at the full input price; cache reads and
//!   cache writes are counted apart (`cache_read_tokens`, `cache_write_tokens`).
//!
//! Prompt caching (on unless `prompt-cache: off`): `cache_control: {"type": "ephemeral"}`
//! breakpoints mark the last tool definition, the system prompt, the end of the conversation
//! the previous request of this conversation sent, and the conversation's last block —
//! Anthropic's limit is four. The API caches the prefix up to a breakpoint in the order
//! tools, system, messages, so later turns read the definitions, the system prompt and the
//! conversation so far from the cache (at a tenth of the input price) instead of paying for
//! them again, and a new iteration reads the definitions and system prompt that every
//! iteration of the loop sends unchanged. The breakpoint on the previous request's end is
//! what makes that read certain: the API looks back only about 20 blocks from a breakpoint
//! for an earlier cache entry, and one turn with many tool calls adds more blocks than that.

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

/// The most `cache_control` breakpoints one request may carry (Anthropic refuses more).
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// A client of the Anthropic Messages API.
pub type AnthropicClient = ApiClient<AnthropicFormat>;

/// The Messages API JSON of one configured endpoint.
#[derive(Debug)]
pub struct AnthropicFormat {
    max_tokens: u32,
    /// Whether requests carry prompt-cache breakpoints (see the module doc).
    prompt_cache: bool,
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
            prompt_cache: true,
        };
        Ok(ApiClient::with_format(
            HttpTransport::new(&url, headers, http, in_flight)?,
            settings.endpoint,
            format,
        ))
    }
}

impl AnthropicClient {
    /// The same client with prompt caching on or off (on by default).
    pub fn with_prompt_cache(mut self, on: bool) -> Self {
        self.format.prompt_cache = on;
        self
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

    /// The breakpoints go in last, once every other key is in the body.
    fn finish_body(&self, body: &mut Map<String, Value>) {
        if self.prompt_cache {
            mark_cache_breakpoints(body);
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

/// Adds the prompt-cache breakpoints to a request body built without them (see the module
/// doc): the last tool, the system prompt (which becomes a one-block list, the form that
/// takes a `cache_control`), the last block of the message before the last assistant message
/// (where the previous request of the conversation ended: a conversation only grows, and
/// each request ends with the user message answering the assistant message before it), and
/// the last block of the last message. At most [`MAX_CACHE_BREAKPOINTS`].
fn mark_cache_breakpoints(body: &mut Map<String, Value>) {
    let mut marked = 0usize;
    let mut mark = |block: &mut Value| {
        if marked < MAX_CACHE_BREAKPOINTS
            && let Some(obj) = block.as_object_mut()
        {
            obj.insert("cache_control".into(), json!({"type": "ephemeral"}));
            marked += 1;
        }
    };
    if let Some(last) = body
        .get_mut("tools")
        .and_then(Value::as_array_mut)
        .and_then(|tools| tools.last_mut())
    {
        mark(last);
    }
    if let Some(system) = body.get_mut("system")
        && let Some(text) = system.as_str()
    {
        let mut block = json!({"type": "text", "text": text});
        mark(&mut block);
        *system = Value::Array(vec![block]);
    }
    let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
        return;
    };
    let last = messages.len().checked_sub(1);
    let previous_end = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .and_then(|i| i.checked_sub(1));
    // One breakpoint each for the tools, the system prompt and these two: never more than
    // four. (When both indexes are the same message it is marked once.)
    for index in [previous_end, last].into_iter().flatten() {
        if let Some(block) = messages
            .get_mut(index)
            .and_then(|m| m.get_mut("content"))
            .and_then(Value::as_array_mut)
            .and_then(|blocks| blocks.last_mut())
            && block.get("cache_control").is_none()
        {
            mark(block);
        }
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
                    input: block
                        .get("input")
                        .cloned()
                        .unwrap_or_else(|| json!({}))
                        .into(),
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

    /// A client without prompt caching: the mapping tests compare whole bodies.
    fn client(temperature: Option<f64>) -> AnthropicClient {
        cached_client(temperature).with_prompt_cache(false)
    }

    /// A client as configured by default (prompt caching on).
    fn cached_client(temperature: Option<f64>) -> AnthropicClient {
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

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition {
            name: name.into(),
            description: format!("the {name} tool"),
            input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }
    }

    fn assistant(blocks: Vec<Block>) -> Message {
        Message {
            role: Role::Assistant,
            content: blocks,
        }
    }

    fn results(ids: &[&str]) -> Message {
        Message {
            role: Role::User,
            content: ids
                .iter()
                .map(|id| Block::ToolResult {
                    tool_use_id: (*id).into(),
                    content: format!("result of {id}"),
                    is_error: false,
                })
                .collect(),
        }
    }

    fn call(id: &str) -> Block {
        Block::ToolUse {
            id: id.into(),
            name: "read_file".into(),
            input: json!({"path": "a"}).into(),
        }
    }

    /// Every JSON pointer of the body where a `cache_control` is.
    fn breakpoints(value: &Value, at: String, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    if k == "cache_control" {
                        assert_eq!(v, &json!({"type": "ephemeral"}), "at {at}");
                        found.push(at.clone());
                    } else {
                        breakpoints(v, format!("{at}/{k}"), found);
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    breakpoints(v, format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }

    fn breakpoints_of(body: &Value) -> Vec<String> {
        let mut found = Vec::new();
        breakpoints(body, String::new(), &mut found);
        found.sort();
        found
    }

    #[test]
    fn breakpoints_mark_the_last_tool_the_system_the_previous_end_and_the_last_block() {
        let mut req = request(vec![
            Message::user_text("task"),
            assistant(vec![
                Block::Text {
                    text: "looking".into(),
                },
                call("a"),
                call("b"),
            ]),
            Message {
                role: Role::User,
                content: vec![
                    Block::ToolResult {
                        tool_use_id: "a".into(),
                        content: "one".into(),
                        is_error: false,
                    },
                    Block::ToolResult {
                        tool_use_id: "b".into(),
                        content: "two".into(),
                        is_error: true,
                    },
                    Block::Text {
                        text: "[inbox: 1 new message(s)]".into(),
                    },
                ],
            },
        ]);
        req.system = "You are a loop.".into();
        req.tools = vec![tool("read_file"), tool("grep"), tool("edit_file")].into();
        let body = cached_client(None).request_body(&req);
        assert_eq!(
            breakpoints_of(&body),
            [
                "/messages/0/content/0",
                "/messages/2/content/2",
                "/system/0",
                "/tools/2",
            ]
        );
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "You are a loop.",
                    "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(
            body["messages"][2]["content"][2],
            json!({"type": "text", "text": "[inbox: 1 new message(s)]",
                   "cache_control": {"type": "ephemeral"}})
        );
        // Removing the breakpoints gives the body sent without caching: they add, never
        // change, content.
        let mut stripped = body.clone();
        strip(&mut stripped);
        let mut plain = client(None).request_body(&req);
        plain["system"] = json!([{"type": "text", "text": "You are a loop."}]);
        assert_eq!(stripped, plain);
    }

    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("cache_control");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }

    #[test]
    fn the_first_turn_has_three_breakpoints_and_none_without_tools_or_system() {
        let mut req = request(vec![Message::user_text("task")]);
        req.system = "sys".into();
        req.tools = vec![tool("read_file")].into();
        let body = cached_client(None).request_body(&req);
        assert_eq!(
            breakpoints_of(&body),
            ["/messages/0/content/0", "/system/0", "/tools/0"]
        );
        let bare = cached_client(None).request_body(&request(vec![Message::user_text("hi")]));
        assert_eq!(breakpoints_of(&bare), ["/messages/0/content/0"]);
        assert!(bare.get("system").is_none() && bare.get("tools").is_none());
    }

    #[test]
    fn no_conversation_carries_more_than_four_breakpoints() {
        for turns in 0..12usize {
            for (with_system, with_tools) in [(true, true), (true, false), (false, true)] {
                let mut messages = vec![Message::user_text("task")];
                for t in 0..turns {
                    let ids: Vec<String> = (0..=t % 4).map(|i| format!("c{t}_{i}")).collect();
                    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                    messages.push(assistant(ids.iter().map(|id| call(id)).collect()));
                    messages.push(results(&ids));
                    if t % 3 == 2 {
                        // An empty message the API would refuse is left out, and the
                        // breakpoints go where the sent conversation ends.
                        messages.push(assistant(vec![Block::Text {
                            text: String::new(),
                        }]));
                    }
                }
                let mut req = request(messages);
                if with_system {
                    req.system = "sys".into();
                }
                if with_tools {
                    req.tools = vec![tool("a"), tool("b")].into();
                }
                let body = cached_client(None).request_body(&req);
                let found = breakpoints_of(&body);
                assert!(found.len() <= MAX_CACHE_BREAKPOINTS, "{turns}: {found:?}");
                let sent = body["messages"].as_array().unwrap();
                let last = sent.len() - 1;
                let last_block = sent[last]["content"].as_array().unwrap().len() - 1;
                assert!(
                    found.contains(&format!("/messages/{last}/content/{last_block}")),
                    "{turns}: {found:?}"
                );
                if turns > 0 {
                    // The previous request ended two messages before this one's end.
                    let prev = sent[last - 2]["content"].as_array().unwrap().len() - 1;
                    assert!(
                        found.contains(&format!("/messages/{}/content/{prev}", last - 2)),
                        "{turns}: {found:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn prompt_cache_off_sends_no_breakpoint() {
        let mut req = request(vec![
            Message::user_text("task"),
            assistant(vec![call("a")]),
            results(&["a"]),
        ]);
        req.system = "sys".into();
        req.tools = vec![tool("read_file")].into();
        let body = client(None).request_body(&req);
        assert_eq!(breakpoints_of(&body), Vec::<String>::new());
        assert!(!body.to_string().contains("cache_control"));
        assert_eq!(body["system"], json!("sys"));
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
                input: json!({"pattern": "x"}).into()
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
