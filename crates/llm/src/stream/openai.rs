//! Assembles an OpenAI Chat Completions stream (`chat.completion.chunk` events, then
//! `data: [DONE]`) into the reply the API would have sent whole.
//!
//! Each chunk's `choices[0].delta` adds `content` text and `tool_calls` pieces keyed by
//! their `index`: the first piece of a call brings its `id` and `function.name`, later ones
//! pieces of `function.arguments`, a JSON text split anywhere (inside a string, an escape or
//! a `\u` sequence); the pieces are concatenated as they came, so the arguments are the same
//! text a whole reply carries. Calls of several indexes may interleave. `finish_reason`
//! comes with the last choice chunk; `usage` with a final chunk whose `choices` is empty
//! (requested with `stream_options: {"include_usage": true}`), or with the last choice chunk
//! (some servers). A chunk carrying `error` ends the call with that API error.
//!
//! Leniency, because compatible servers differ: a call piece without `index` continues the
//! last call unless it brings a new `id`; a repeated `id` or name is ignored; `arguments`
//! sent as an object is taken as its JSON text; a stream that ends after a `finish_reason`
//! without `[DONE]` is complete. A chunk that is not JSON or has the wrong shape is a
//! `BadReply`; a stream that ends before a `finish_reason` and `[DONE]` is a transport failure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Assembler, Step, add_chars, event_json};
use crate::http::{SseEvent, api_error_message, quote_json};
use crate::{LlmError, LlmResponse};

/// One tool call being received.
#[derive(Debug, Default)]
struct CallState {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// The state of one OpenAI-style stream.
#[derive(Debug, Default)]
pub struct OpenAiAssembler {
    /// The text so far; `None` until a chunk carries `content`.
    text: Option<String>,
    calls: BTreeMap<u64, CallState>,
    /// The index of the call the last piece went to.
    last_call: Option<u64>,
    finish_reason: Option<Value>,
    usage: Option<Value>,
    chars: u64,
}

fn bad(what: impl std::fmt::Display, chunk: &Value) -> LlmError {
    LlmError::BadReply(format!(
        "OpenAI-style stream chunk {what}: {}",
        quote_json(chunk)
    ))
}

impl OpenAiAssembler {
    fn content(&mut self, content: &Value, chunk: &Value) -> Result<(), LlmError> {
        let piece = match content {
            Value::Null => return Ok(()),
            Value::String(s) => s.clone(),
            // Content parts: their text parts are the text.
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
            _ => return Err(bad("has a `content` that is neither text nor parts", chunk)),
        };
        add_chars(&mut self.chars, &piece);
        self.text.get_or_insert_with(String::new).push_str(&piece);
        Ok(())
    }

    fn tool_calls(&mut self, calls: &Value, chunk: &Value) -> Result<(), LlmError> {
        let calls = match calls {
            Value::Null => return Ok(()),
            Value::Array(calls) => calls,
            _ => return Err(bad("has `tool_calls` that is not a list", chunk)),
        };
        for piece in calls {
            if !piece.is_object() {
                return Err(bad("has a tool call piece that is not an object", chunk));
            }
            let id = piece
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty());
            let index = match piece.get("index") {
                Some(i) => i
                    .as_u64()
                    .ok_or_else(|| bad("has a tool call `index` that is not a count", chunk))?,
                None => {
                    let continues = self.last_call.filter(|last| {
                        id.is_none() || self.calls.get(last).and_then(|c| c.id.as_deref()) == id
                    });
                    match continues {
                        Some(last) => last,
                        None => self
                            .calls
                            .keys()
                            .next_back()
                            .map_or(0, |k| k.saturating_add(1)),
                    }
                }
            };
            self.last_call = Some(index);
            let call = self.calls.entry(index).or_default();
            if call.id.is_none() {
                call.id = id.map(str::to_string);
            }
            let function = piece.get("function").unwrap_or(&Value::Null);
            if call.name.is_none() {
                call.name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .map(str::to_string);
            }
            match function.get("arguments") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => {
                    call.arguments.push_str(s);
                    add_chars(&mut self.chars, s);
                }
                Some(other @ Value::Object(_)) => {
                    let text = other.to_string();
                    call.arguments.push_str(&text);
                    add_chars(&mut self.chars, &text);
                }
                Some(_) => {
                    return Err(bad(
                        "has tool call `arguments` that are neither text nor an object",
                        chunk,
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Assembler for OpenAiAssembler {
    fn feed(&mut self, event: &SseEvent) -> Result<Step, LlmError> {
        if event.data.trim() == "[DONE]" {
            return Ok(Step::Done);
        }
        let chunk = event_json("OpenAI-style", event)?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            let status = chunk
                .pointer("/error/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .filter(|c| (400..600).contains(c))
                .unwrap_or(500);
            let code = reqwest::StatusCode::from_u16(status)
                .unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
            return Err(LlmError::Api {
                status,
                message: format!(
                    "{} (sent in the middle of the event stream)",
                    api_error_message(code, event.data.as_bytes())
                ),
            });
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let choices = match chunk.get("choices") {
            None | Some(Value::Null) => return Ok(Step::More),
            Some(Value::Array(choices)) => choices,
            Some(_) => return Err(bad("has `choices` that is not a list", &chunk)),
        };
        // One completion is asked for: only choice 0 counts.
        for choice in choices
            .iter()
            .filter(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        {
            if let Some(delta) = choice.get("delta").filter(|d| !d.is_null()) {
                if !delta.is_object() {
                    return Err(bad("has a `delta` that is not an object", &chunk));
                }
                if let Some(content) = delta.get("content") {
                    self.content(content, &chunk)?;
                }
                if let Some(calls) = delta.get("tool_calls") {
                    self.tool_calls(calls, &chunk)?;
                }
            }
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                self.finish_reason = Some(reason.clone());
            }
        }
        Ok(Step::More)
    }

    fn chars(&self) -> u64 {
        self.chars
    }

    fn has_usage(&self) -> bool {
        self.usage.is_some()
    }

    fn finish(self, done: bool) -> Result<LlmResponse, LlmError> {
        if !done && self.finish_reason.is_none() {
            return Err(LlmError::Transport(
                "the OpenAI-style event stream ended before a finish_reason and [DONE]: the reply was cut short"
                    .to_string(),
            ));
        }
        let calls: Vec<Value> = self
            .calls
            .into_values()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        let mut message = json!({"role": "assistant", "content": self.text});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        let mut reply = json!({
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        });
        if let Some(usage) = self.usage {
            reply["usage"] = usage;
        }
        crate::openai::parse_response(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StopReason, ToolCall, Usage};

    fn ev(data: Value) -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: data.to_string(),
        }
    }

    fn done() -> SseEvent {
        SseEvent {
            event: "message".into(),
            data: "[DONE]".into(),
        }
    }

    fn run(events: Vec<SseEvent>) -> Result<LlmResponse, LlmError> {
        let mut a = OpenAiAssembler::default();
        for e in &events {
            if a.feed(e)? == Step::Done {
                return a.finish(true);
            }
        }
        a.finish(false)
    }

    fn delta(delta: Value) -> SseEvent {
        ev(
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}),
        )
    }

    fn call_piece(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> SseEvent {
        let mut function = json!({"arguments": args});
        if let Some(name) = name {
            function["name"] = json!(name);
        }
        let mut piece = json!({"index": index, "function": function});
        if let Some(id) = id {
            piece["id"] = json!(id);
            piece["type"] = json!("function");
        }
        delta(json!({"tool_calls": [piece]}))
    }

    fn finish(reason: &str) -> SseEvent {
        ev(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
    }

    fn usage() -> SseEvent {
        ev(
            json!({"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 64}}}),
        )
    }

    #[test]
    fn text_usage_and_the_cached_count_are_assembled() {
        let r = run(vec![
            delta(json!({"role": "assistant", "content": ""})),
            delta(json!({"content": "Hel"})),
            delta(json!({"content": null})),
            delta(json!({"content": "lo ✓"})),
            finish("stop"),
            usage(),
            done(),
        ])
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("Hello ✓"));
        assert_eq!(r.stop_reason, StopReason::EndTurn);
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 36,
                output_tokens: 9,
                cache_read_tokens: 64,
                cache_write_tokens: 0,
                estimated: false,
            }
        );
    }

    #[test]
    fn interleaved_calls_are_assembled_by_index() {
        let r = run(vec![
            call_piece(0, Some("call_a"), Some("read_file"), ""),
            call_piece(1, Some("call_b"), Some("grep"), "{\"pat"),
            call_piece(0, None, None, "{\"path\":"),
            call_piece(1, None, None, "tern\":\"po"),
            call_piece(0, None, None, "\"a.rs\"}"),
            call_piece(1, None, None, "rt\"}"),
            finish("tool_calls"),
            usage(),
            done(),
        ])
        .unwrap();
        assert_eq!(
            r.tool_calls,
            vec![
                ToolCall {
                    id: "call_a".into(),
                    name: "read_file".into(),
                    input: json!({"path": "a.rs"}).into(),
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "grep".into(),
                    input: json!({"pattern": "port"}).into(),
                },
            ]
        );
        assert_eq!(r.stop_reason, StopReason::ToolUse);
    }

    #[test]
    fn arguments_split_anywhere_give_the_whole_replys_input() {
        // Escapes, a \u sequence, multi-byte characters and a surrogate pair.
        let args = r#"{"content":"naïve — 日本 \"q\" \\ \u00e9\ud83d\ude00 😀","n":1}"#;
        let whole = crate::openai::parse_response(&json!({"choices": [{"message": {"tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "write_file", "arguments": args}}
        ]}, "finish_reason": "tool_calls"}]}))
        .unwrap();
        for (i, _) in args.char_indices().skip(1) {
            let (a, b) = args.split_at(i);
            let r = run(vec![
                call_piece(0, Some("c"), Some("write_file"), a),
                call_piece(0, None, None, b),
                finish("tool_calls"),
                done(),
            ])
            .unwrap();
            assert_eq!(r.tool_calls, whole.tool_calls, "split at byte {i}");
        }
    }

    #[test]
    fn pieces_without_an_index_continue_the_last_call_unless_a_new_id_comes() {
        let piece = |id: Option<&str>, name: Option<&str>, args: &str| {
            let mut p = json!({"function": {"arguments": args}});
            if let Some(id) = id {
                p["id"] = json!(id);
            }
            if let Some(name) = name {
                p["function"]["name"] = json!(name);
            }
            delta(json!({"tool_calls": [p]}))
        };
        let r = run(vec![
            piece(Some("a"), Some("x"), "{\"k\":"),
            piece(None, None, "1}"),
            piece(Some("b"), Some("y"), "{}"),
            piece(Some("b"), Some("y"), ""),
            finish("tool_calls"),
        ])
        .unwrap();
        let got: Vec<_> = r
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), (*c.input).clone()))
            .collect();
        assert_eq!(
            got,
            vec![("a", "x", json!({"k": 1})), ("b", "y", json!({}))]
        );
    }

    #[test]
    fn characters_are_counted_as_they_come() {
        let mut a = OpenAiAssembler::default();
        a.feed(&delta(json!({"content": "héllo"}))).unwrap();
        assert_eq!(a.chars(), 5);
        a.feed(&call_piece(0, Some("c"), Some("n"), "{}")).unwrap();
        assert_eq!(a.chars(), 7);
    }

    #[test]
    fn an_error_chunk_is_an_api_error() {
        let err = run(vec![
            delta(json!({"content": "x"})),
            ev(json!({"error": {"message": "model crashed", "type": "server_error", "code": 503}})),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            LlmError::Api {
                status: 503,
                message: "server_error: model crashed (sent in the middle of the event stream)"
                    .into()
            }
        );
    }

    #[test]
    fn malformed_streams_are_bad_replies_and_cut_ones_transport_errors() {
        let cases = vec![
            (
                ev(json!({"choices": {"index": 0}})),
                "`choices` that is not a list",
            ),
            (delta(json!("text")), "`delta` that is not an object"),
            (delta(json!({"content": 5})), "neither text nor parts"),
            (delta(json!({"tool_calls": {"index": 0}})), "not a list"),
            (delta(json!({"tool_calls": [5]})), "not an object"),
            (delta(json!({"tool_calls": [{"index": -1}]})), "not a count"),
            (
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": 5}}]})),
                "neither text nor an object",
            ),
        ];
        for (event, want) in cases {
            let err = run(vec![event, done()]).unwrap_err();
            assert!(
                matches!(&err, LlmError::BadReply(m) if m.contains(want)),
                "{want}: {err:?}"
            );
        }
        let err = run(vec![SseEvent {
            event: "message".into(),
            data: "{oops".into(),
        }])
        .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadReply(m) if m.contains("not JSON")),
            "{err:?}"
        );
        // A call without a name is refused by the reply parser, as in a whole reply.
        let err = run(vec![
            call_piece(0, Some("c"), None, "{}"),
            finish("tool_calls"),
            done(),
        ])
        .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadReply(m) if m.contains("without a function name")),
            "{err:?}"
        );
        let err = run(vec![delta(json!({"content": "cut"}))]).unwrap_err();
        assert!(
            matches!(&err, LlmError::Transport(m) if m.contains("cut short")),
            "{err:?}"
        );
        // Ended after a finish_reason without [DONE]: complete.
        let r = run(vec![delta(json!({"content": "ok"})), finish("length")]).unwrap();
        assert_eq!(r.stop_reason, StopReason::MaxTokens);
    }
}
