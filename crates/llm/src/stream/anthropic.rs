//! Assembles an Anthropic Messages stream into the reply the API would have sent whole.
//!
//! The events, in order: `message_start` (the message, with the prompt's usage and cache
//! counts), then per content block `content_block_start`, `content_block_delta`s
//! (`text_delta` text, `input_json_delta` pieces of a tool call's input JSON, split
//! anywhere) and `content_block_stop`; then `message_delta` (the stop reason and the final
//! usage, whose counts replace those of `message_start`) and `message_stop`. `ping` is a
//! keep-alive; `error` ends the call with the API error it carries. Block and delta types
//! this client does not use (thinking, citations, server tools) are skipped, and so are
//! event types it does not know, as the API's versioning policy asks.
//!
//! A stream that breaks these rules (a delta for a block never started, text for a tool
//! call, a tool input that is not JSON once assembled, no stop reason) is a `BadReply`
//! naming what was wrong; one that ends before `message_stop` is a transport failure.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Assembler, Step, add_chars, event_json};
use crate::http::{SseEvent, quote_json};
use crate::{LlmError, LlmResponse};

/// One content block being received.
#[derive(Debug)]
enum BlockState {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        /// The `input` of `content_block_start` (`{}`), used when no delta comes.
        start_input: Value,
        json: String,
    },
    /// A block type this client does not use.
    Skipped,
}

/// The state of one Anthropic stream.
#[derive(Debug, Default)]
pub struct AnthropicAssembler {
    started: bool,
    blocks: BTreeMap<u64, BlockState>,
    stop_reason: Option<Value>,
    usage: Map<String, Value>,
    chars: u64,
}

fn bad(what: impl std::fmt::Display) -> LlmError {
    LlmError::BadReply(format!("Anthropic stream {what}"))
}

/// The HTTP status an `error` event's type stands for (as the API documents them).
fn error_status(kind: &str) -> u16 {
    match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    }
}

impl AnthropicAssembler {
    fn index(data: &Value, kind: &str) -> Result<u64, LlmError> {
        data.get("index").and_then(Value::as_u64).ok_or_else(|| {
            bad(format_args!(
                "event {kind} has no block `index`: {}",
                quote_json(data)
            ))
        })
    }

    fn merge_usage(&mut self, usage: Option<&Value>) {
        if let Some(usage) = usage.and_then(Value::as_object) {
            for (k, v) in usage {
                if !v.is_null() {
                    self.usage.insert(k.clone(), v.clone());
                }
            }
        }
    }

    fn block_start(&mut self, data: &Value) -> Result<(), LlmError> {
        let index = Self::index(data, "content_block_start")?;
        let block = data
            .get("content_block")
            .filter(|b| b.is_object())
            .ok_or_else(|| {
                bad(format_args!(
                    "content_block_start has no `content_block`: {}",
                    quote_json(data)
                ))
            })?;
        let state = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                add_chars(&mut self.chars, text);
                BlockState::Text(text.to_string())
            }
            Some("tool_use") => {
                let field = |name: &str| {
                    crate::anthropic::text_field(block, name).ok_or_else(|| {
                        bad(format_args!(
                            "tool_use block {index} has no `{name}`: {}",
                            quote_json(data)
                        ))
                    })
                };
                BlockState::ToolUse {
                    id: field("id")?,
                    name: field("name")?,
                    start_input: block.get("input").cloned().unwrap_or_else(|| json!({})),
                    json: String::new(),
                }
            }
            _ => BlockState::Skipped,
        };
        if self.blocks.insert(index, state).is_some() {
            return Err(bad(format_args!("starts block {index} twice")));
        }
        Ok(())
    }

    fn block_delta(&mut self, data: &Value) -> Result<(), LlmError> {
        let index = Self::index(data, "content_block_delta")?;
        let block = self.blocks.get_mut(&index).ok_or_else(|| {
            bad(format_args!(
                "sends a delta for block {index}, which was never started"
            ))
        })?;
        let delta = data.get("delta").unwrap_or(&Value::Null);
        let piece = |field: &str| {
            delta.get(field).and_then(Value::as_str).ok_or_else(|| {
                bad(format_args!(
                    "delta for block {index} has no `{field}` text: {}",
                    quote_json(data)
                ))
            })
        };
        match (delta.get("type").and_then(Value::as_str), block) {
            (Some("text_delta"), BlockState::Text(text)) => {
                let piece = piece("text")?;
                text.push_str(piece);
                add_chars(&mut self.chars, piece);
            }
            (Some("input_json_delta"), BlockState::ToolUse { json, .. }) => {
                let piece = piece("partial_json")?;
                json.push_str(piece);
                add_chars(&mut self.chars, piece);
            }
            (
                Some(kind @ ("text_delta" | "input_json_delta")),
                BlockState::ToolUse { .. } | BlockState::Text(_),
            ) => {
                return Err(bad(format_args!(
                    "sends a {kind} for block {index}, which is of another type"
                )));
            }
            // Thinking, signatures, citations, and deltas of skipped blocks.
            _ => {}
        }
        Ok(())
    }
}

impl Assembler for AnthropicAssembler {
    fn feed(&mut self, event: &SseEvent) -> Result<Step, LlmError> {
        let data = event_json("Anthropic", event)?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        if !self.started && !matches!(kind, "message_start" | "ping" | "error") {
            return Err(bad(format_args!("sends {kind} before message_start")));
        }
        match kind {
            "ping" => {}
            "error" => {
                let error = data.get("error");
                let kind = error
                    .and_then(|e| e.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("error");
                let message = error
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("no message");
                return Err(LlmError::Api {
                    status: error_status(kind),
                    message: format!(
                        "{kind}: {} (sent in the middle of the event stream)",
                        td_base::secrets::redact(message)
                    ),
                });
            }
            "message_start" => {
                if self.started {
                    return Err(bad("sends message_start twice"));
                }
                self.started = true;
                self.merge_usage(data.pointer("/message/usage"));
            }
            "content_block_start" => self.block_start(&data)?,
            "content_block_delta" => self.block_delta(&data)?,
            "content_block_stop" => {
                let index = Self::index(&data, kind)?;
                if !self.blocks.contains_key(&index) {
                    return Err(bad(format_args!(
                        "stops block {index}, which was never started"
                    )));
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").filter(|r| !r.is_null()) {
                    self.stop_reason = Some(reason.clone());
                }
                self.merge_usage(data.get("usage"));
            }
            "message_stop" => return Ok(Step::Done),
            _ => {}
        }
        Ok(Step::More)
    }

    fn chars(&self) -> u64 {
        self.chars
    }

    fn has_usage(&self) -> bool {
        !self.usage.is_empty()
    }

    fn finish(self, done: bool) -> Result<LlmResponse, LlmError> {
        if !done {
            return Err(LlmError::Transport(
                "the Anthropic event stream ended before message_stop: the reply was cut short"
                    .to_string(),
            ));
        }
        let stop_reason = self
            .stop_reason
            .ok_or_else(|| bad("ended without a stop_reason (no message_delta carried one)"))?;
        let mut content = Vec::new();
        for (index, block) in self.blocks {
            match block {
                BlockState::Text(text) => content.push(json!({"type": "text", "text": text})),
                BlockState::ToolUse {
                    id,
                    name,
                    start_input,
                    json,
                } => {
                    let input = if json.trim().is_empty() {
                        start_input
                    } else {
                        serde_json::from_str(&json).map_err(|e| {
                            bad(format_args!(
                                "gave tool call {name} ({id}, block {index}) an input that is not JSON once assembled ({e}): {}",
                                quote_json(&Value::String(json.clone()))
                            ))
                        })?
                    };
                    content
                        .push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
                }
                BlockState::Skipped => {}
            }
        }
        crate::anthropic::parse_response(&json!({
            "content": content,
            "stop_reason": stop_reason,
            "usage": self.usage,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StopReason, ToolCall, Usage};

    fn ev(data: Value) -> SseEvent {
        SseEvent {
            event: data["type"].as_str().unwrap_or("message").to_string(),
            data: data.to_string(),
        }
    }

    fn run(events: &[Value]) -> Result<LlmResponse, LlmError> {
        let mut a = AnthropicAssembler::default();
        for e in events {
            if a.feed(&ev(e.clone()))? == Step::Done {
                return a.finish(true);
            }
        }
        a.finish(false)
    }

    fn start() -> Value {
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 40}}})
    }

    fn text_delta(index: u64, text: &str) -> Value {
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
    }

    fn json_delta(index: u64, piece: &str) -> Value {
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})
    }

    fn end(reason: &str) -> Vec<Value> {
        vec![
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": 57}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn text_and_tool_calls_are_assembled_with_usage_and_cache_counts() {
        let input = r#"{"path": "src/é—\"x\".rs", "n": [1, 2.5, null]}"#;
        let mut events = vec![
            start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            text_delta(0, "Hel"),
            text_delta(0, "lo ✓"),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}}),
        ];
        // Split inside the escape `\"` and between the bytes' characters.
        let (a, b) = input.split_at(20);
        events.extend([json_delta(2, a), json_delta(2, ""), json_delta(2, b)]);
        events.push(json!({"type": "content_block_stop", "index": 2}));
        events.push(json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "list", "input": {}}}));
        events.push(json!({"type": "content_block_stop", "index": 3}));
        events.push(json!({"type": "future_event", "x": 1}));
        events.extend(end("tool_use"));
        let r = run(&events).unwrap();
        assert_eq!(r.text.as_deref(), Some("Hello ✓"));
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "toolu_1".into(),
                    name: "read_file".into(),
                    input: serde_json::from_str(input).unwrap(),
                },
                ToolCall {
                    id: "toolu_2".into(),
                    name: "list".into(),
                    input: json!({}).into(),
                },
            ]
        );
        assert_eq!(r.stop_reason, StopReason::ToolUse);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 57,
                cache_read_tokens: 300,
                cache_write_tokens: 40,
                estimated: false,
            }
        );
    }

    #[test]
    fn the_input_is_the_same_whatever_the_split() {
        let input = r#"{"content":"naïve café — 日本語 \"q\" \\ \u00e9 😀","line":3}"#;
        let whole: Value = serde_json::from_str(input).unwrap();
        for (i, _) in input.char_indices().skip(1) {
            let (a, b) = input.split_at(i);
            let mut events = vec![
                start(),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "write_file", "input": {}}}),
                json_delta(0, a),
                json_delta(0, b),
                json!({"type": "content_block_stop", "index": 0}),
            ];
            events.extend(end("tool_use"));
            let r = run(&events).unwrap();
            assert_eq!(*r.tool_calls[0].input, whole, "split at byte {i}");
        }
    }

    #[test]
    fn characters_are_counted_as_they_come() {
        let mut a = AnthropicAssembler::default();
        a.feed(&ev(start())).unwrap();
        a.feed(&ev(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))).unwrap();
        a.feed(&ev(text_delta(0, "héllo"))).unwrap();
        assert_eq!(a.chars(), 5);
        a.feed(&ev(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}}}))).unwrap();
        a.feed(&ev(json_delta(1, "{\"a\":1}"))).unwrap();
        assert_eq!(a.chars(), 12);
    }

    #[test]
    fn an_error_event_is_the_api_error_it_carries() {
        let err = run(&[
            start(),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            LlmError::Api {
                status: 529,
                message: "overloaded_error: Overloaded (sent in the middle of the event stream)"
                    .into()
            }
        );
    }

    #[test]
    fn malformed_streams_are_bad_replies_and_cut_ones_transport_errors() {
        let tool = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}}});
        let text = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        let cases: Vec<(Vec<Value>, &str)> = vec![
            (vec![text_delta(0, "x")], "before message_start"),
            (vec![start(), start()], "message_start twice"),
            (vec![start(), text_delta(0, "x")], "never started"),
            (
                vec![start(), tool.clone(), text_delta(0, "x")],
                "of another type",
            ),
            (
                vec![start(), text.clone(), json_delta(0, "{")],
                "of another type",
            ),
            (vec![start(), text.clone(), text.clone()], "twice"),
            (
                vec![start(), json!({"type": "content_block_stop", "index": 4})],
                "never started",
            ),
            (
                vec![start(), json!({"type": "content_block_delta", "delta": {}})],
                "no block `index`",
            ),
            (
                vec![
                    start(),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "name": "n"}}),
                ],
                "no `id`",
            ),
            (
                vec![
                    start(),
                    tool.clone(),
                    json_delta(0, "{\"a\":"),
                    json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
                    json!({"type": "message_stop"}),
                ],
                "not JSON once assembled",
            ),
            (
                vec![start(), json!({"type": "message_stop"})],
                "without a stop_reason",
            ),
        ];
        for (events, want) in cases {
            let err = run(&events).unwrap_err();
            assert!(
                matches!(&err, LlmError::BadReply(m) if m.contains(want)),
                "{want}: {err:?}"
            );
        }
        let err = AnthropicAssembler::default()
            .feed(&SseEvent {
                event: "message_start".into(),
                data: "{not json".into(),
            })
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadReply(m) if m.contains("not JSON")),
            "{err:?}"
        );
        let err = run(&[start(), text, text_delta(0, "partial")]).unwrap_err();
        assert!(
            matches!(&err, LlmError::Transport(m) if m.contains("before message_stop")),
            "{err:?}"
        );
    }
}
