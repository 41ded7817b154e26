//! The scripted provider (`llm: {provider: scripted, script: PATH}`): replays a YAML script
//! keyed by loop name, so whole runs (tool calls, coordination, validation) can be driven
//! and tested offline and deterministically.
//!
//! The script format is a contract with outside tests (see BRIEF.md, "Scripted LLM
//! provider"); it may be extended, never changed:
//!
//! ```yaml
//! client:
//!   turns:                      # one model response each, consumed in order across iterations
//!     - say: "Asking the api loop"
//!       calls:                  # each item has exactly one key: the tool name → its input
//!         - query_loop: {target_exec_id: api, question: "Which port?"}
//!     - delay_ms: 1500          # extension: wait this long before giving this response
//!       calls:
//!         - complete_task: {summary: "client wired"}
//!   answers:                    # answers to other loops' questions; first match wins
//!     - when: "port"            # regex searched in the question; no `when` matches anything
//!       reply: "8080"
//!       delay_ms: 200           # extension: wait this long before answering
//! ```
//!
//! Extensions over the brief: `delay_ms` on a turn and on an answer (to exercise timeouts
//! and concurrency without a real model), and `usage` on a turn and on an answer (`{input_tokens,
//! output_tokens, cache_read_tokens, cache_write_tokens}`: the counts reported instead of
//! the estimate of about four characters per token, for accounting and budgets), and `panic`
//! on a turn (`- panic: "why"`: the client panics with that message when it reaches the
//! turn, which is consumed: fault injection, to see a loop actor restarted through the real
//! binary). A delayed turn is consumed when the request
//! arrives, not when the delay ends, so a request cancelled mid-delay (an LLM timeout) does
//! not replay the same slow turn forever.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use regex::Regex;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::{
    Block, LlmClient, LlmError, LlmRequest, LlmResponse, Purpose, StopReason, ToolCall, Usage,
};

/// Questions quoted in errors are cut to this many bytes (on a char boundary).
const QUOTE_LIMIT: usize = 200;

/// A provider that answers from a script instead of a model.
#[derive(Debug)]
pub struct ScriptedLlm {
    loops: BTreeMap<String, LoopScript>,
}

/// The script of one loop.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a loop's script: a map with `turns` and/or `answers`"
)]
struct LoopScript {
    /// Responses to iteration requests, in order.
    #[serde(default, deserialize_with = "null_as_empty")]
    turns: Vec<Turn>,
    /// Answers to other loops' questions; the first match wins.
    #[serde(default, deserialize_with = "null_as_empty")]
    answers: Vec<Answer>,
    /// Index of the next turn to give. A std Mutex is enough: it is never held across an
    /// await, and each loop has its own, so concurrent loops never wait on each other.
    #[serde(skip)]
    cursor: Mutex<usize>,
}

/// One scripted model response.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a turn: a map with optional `say`, `calls`, `delay_ms`, `usage` and `panic`"
)]
struct Turn {
    /// The text the model says.
    #[serde(default)]
    say: Option<String>,
    /// Tool calls, in order.
    #[serde(default, deserialize_with = "null_as_empty")]
    calls: Vec<ScriptedCall>,
    /// Milliseconds to wait before answering.
    #[serde(default)]
    delay_ms: u64,
    /// The usage to report instead of the estimate.
    #[serde(default)]
    usage: Option<ScriptUsage>,
    /// Panic with this message instead of answering (fault injection).
    #[serde(default)]
    panic: Option<String>,
}

/// Token counts a script reports for one response (extension: accounting and budgets are
/// tested offline with figures like a real provider's).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "usage: a map of input_tokens, output_tokens, cache_read_tokens, cache_write_tokens"
)]
struct ScriptUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_tokens: u64,
    #[serde(default)]
    cache_write_tokens: u64,
}

impl From<ScriptUsage> for Usage {
    fn from(u: ScriptUsage) -> Usage {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_read_tokens: u.cache_read_tokens,
            cache_write_tokens: u.cache_write_tokens,
            estimated: false,
        }
    }
}

/// One scripted tool call: `- tool_name: {input}`.
#[derive(Debug)]
struct ScriptedCall {
    name: String,
    /// Shared with every reply that makes this call: a reply's input is not a copy.
    input: Arc<Value>,
}

/// One scripted answer to a question from another loop.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an answer: a map with `reply` and optional `when` and `delay_ms`"
)]
struct Answer {
    /// Regex searched for in the question; `None` matches every question.
    #[serde(default, deserialize_with = "regex_field")]
    when: Option<Regex>,
    /// The answer text.
    reply: String,
    /// Milliseconds to wait before answering.
    #[serde(default)]
    delay_ms: u64,
    /// The usage to report instead of the estimate.
    #[serde(default)]
    usage: Option<ScriptUsage>,
}

/// Why a script cannot be used. (The I/O error is shown in the message, so it is not also
/// given as `source()`: a chain printer would say it twice.)
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The file cannot be read.
    #[error("cannot read {}: {error}", .path.display())]
    Unreadable {
        /// The script's path.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The text is not a valid script.
    #[error("{origin}{}: {reason}", at(.line_column))]
    Invalid {
        /// The file (or whatever the text came from).
        origin: String,
        /// Where in it (1-based line and column), when the parser knows.
        line_column: Option<(usize, usize)>,
        /// What is wrong, with the nearest valid key for a misspelt one.
        reason: String,
    },
}

/// `:line:column`, or nothing.
fn at(line_column: &Option<(usize, usize)>) -> String {
    line_column
        .map(|(line, column)| format!(":{line}:{column}"))
        .unwrap_or_default()
}

impl ScriptedLlm {
    /// Reads and checks the script at `path`.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|error| ScriptError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses a script; `origin` names the file in error messages, which give its line and
    /// column and, for a misspelt key, the nearest valid one.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ScriptError> {
        // An empty file (or one with only comments) is a script with no loops.
        let loops: Option<LoopMap> =
            serde_yaml_ng::from_str(text).map_err(|e| ScriptError::Invalid {
                origin: origin.to_string(),
                line_column: e.location().map(|l| (l.line(), l.column())),
                reason: td_base::suggest::serde_with_suggestion(&e.to_string()),
            })?;
        Ok(ScriptedLlm {
            loops: loops.map(|l| l.0).unwrap_or_default(),
        })
    }

    /// The names of the scripted loops, sorted.
    pub fn loop_names(&self) -> Vec<String> {
        self.loops.keys().cloned().collect()
    }

    /// How many turns `loop_name` has not yet given (0 for an unknown loop).
    pub fn turns_left(&self, loop_name: &str) -> usize {
        self.loops.get(loop_name).map_or(0, |script| {
            script.turns.len().saturating_sub(*lock(&script.cursor))
        })
    }

    fn script(&self, loop_name: &str) -> Result<&LoopScript, LlmError> {
        self.loops.get(loop_name).ok_or_else(|| {
            let known = if self.loops.is_empty() {
                "(none)".to_string()
            } else {
                self.loop_names().join(", ")
            };
            LlmError::Script(format!(
                "no script for loop '{loop_name}'; scripted loops: {known}"
            ))
        })
    }
}

impl LoopScript {
    /// Takes the next turn with its 1-based number, or `None` when all are given.
    fn take_turn(&self) -> Option<(usize, &Turn)> {
        let mut cursor = lock(&self.cursor);
        let turn = self.turns.get(*cursor)?;
        *cursor += 1;
        Some((*cursor, turn))
    }

    fn answer_for(&self, question: &str) -> Option<&Answer> {
        self.answers
            .iter()
            .find(|a| a.when.as_ref().is_none_or(|re| re.is_match(question)))
    }
}

#[async_trait]
impl LlmClient for ScriptedLlm {
    /// The cursor goes where the record says the loop's finished iterations left it (never
    /// ahead of it: a reply given in an iteration that did not finish is given again).
    fn resume(&self, loop_name: &str, responses_seen: usize) {
        if let Some(script) = self.loops.get(loop_name) {
            *lock(&script.cursor) = responses_seen.min(script.turns.len());
        }
    }

    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let script = self.script(&request.loop_name)?;
        let input_tokens = estimate_input_tokens(request);
        let (text, tool_calls, delay_ms, usage) = match &request.purpose {
            Purpose::Iteration => match script.take_turn() {
                // Out of turns: end the turn silently and let validation decide (the brief).
                None => (None, Vec::new(), 0, None),
                Some((number, turn)) => {
                    if let Some(message) = &turn.panic {
                        // Fault injection, asked for by the script: the loop's engine task
                        // panics here, as a bug in a model client would, so that a run can
                        // show its loop actor restarted. (The turn is consumed first, so the
                        // restarted loop goes on with the next one.)
                        panic!("scripted panic of loop '{}': {message}", request.loop_name);
                    }
                    let calls = turn
                        .calls
                        .iter()
                        .enumerate()
                        .map(|(i, call)| ToolCall {
                            id: format!("{}-{number}-{}", request.loop_name, i + 1),
                            name: call.name.clone(),
                            input: Arc::clone(&call.input),
                        })
                        .collect();
                    (turn.say.clone(), calls, turn.delay_ms, turn.usage)
                }
            },
            Purpose::QueryAnswer { question, .. } => match script.answer_for(question) {
                Some(answer) => (
                    Some(answer.reply.clone()),
                    Vec::new(),
                    answer.delay_ms,
                    answer.usage,
                ),
                None => {
                    let quoted = match td_base::text::truncate_to(question, QUOTE_LIMIT) {
                        Some(cut) => format!("{cut}…"),
                        None => question.to_string(),
                    };
                    return Err(LlmError::Script(format!(
                        "loop '{}' has no scripted answer matching the question \"{quoted}\"; \
                         add an entry to its `answers` (one without `when` matches any question)",
                        request.loop_name
                    )));
                }
            },
        };
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        let stop_reason = if tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        let usage = match usage {
            Some(scripted) => scripted.into(),
            None => Usage {
                input_tokens,
                output_tokens: estimate_output_tokens(text.as_deref(), &tool_calls),
                ..Default::default()
            },
        };
        Ok(LlmResponse {
            text,
            tool_calls,
            stop_reason,
            usage,
        })
    }
}

/// Locks a cursor; a poisoned lock still holds a valid index, so it is used as is.
fn lock(cursor: &Mutex<usize>) -> std::sync::MutexGuard<'_, usize> {
    cursor
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// About four characters per token, so budgets and token accounting work offline.
fn tokens_for_chars(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

fn estimate_input_tokens(request: &LlmRequest) -> u64 {
    let mut chars = request.system.chars().count();
    for block in request.messages.iter().flat_map(|m| &m.content) {
        chars += match block {
            Block::Text { text } => text.chars().count(),
            Block::ToolUse { name, input, .. } => {
                name.chars().count() + input.to_string().chars().count()
            }
            Block::ToolResult { content, .. } => content.chars().count(),
        };
    }
    tokens_for_chars(chars)
}

fn estimate_output_tokens(text: Option<&str>, calls: &[ToolCall]) -> u64 {
    let mut chars = text.map_or(0, |t| t.chars().count());
    for call in calls {
        chars += call.name.chars().count() + call.input.to_string().chars().count();
    }
    tokens_for_chars(chars)
}

/// Accepts `key:` with no value (YAML null) as an empty list.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// Compiles `when` while parsing, so a bad regex is reported with its line and its path
/// (loop name and answer index).
fn regex_field<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Regex>, D::Error> {
    let Some(pattern) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    Regex::new(&pattern).map(Some).map_err(|e| {
        // The regex crate's message spans lines (pattern, caret, reason); one line reads
        // better after a file:line:column prefix.
        let text = e.to_string();
        let last = text.lines().last().unwrap_or_default().trim();
        let reason = last.strip_prefix("error: ").unwrap_or(last);
        de::Error::custom(format!(
            "invalid regex `{pattern}` in `when`: {reason}; escape special characters with a backslash"
        ))
    })
}

/// The top level: loop name → script. Written by hand so a loop named twice is an error
/// instead of the second silently replacing the first.
struct LoopMap(BTreeMap<String, LoopScript>);

impl<'de> Deserialize<'de> for LoopMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LoopMapVisitor;
        impl<'de> Visitor<'de> for LoopMapVisitor {
            type Value = LoopMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map from loop name to {turns: [...], answers: [...]}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LoopMap, A::Error> {
                let mut loops = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    if loops.contains_key(&name) {
                        return Err(de::Error::custom(format!(
                            "loop '{name}' is scripted twice; merge its turns and answers into one entry"
                        )));
                    }
                    // `name:` with nothing after it is a loop with an empty script.
                    let script: Option<LoopScript> = map.next_value()?;
                    loops.insert(name, script.unwrap_or_default());
                }
                Ok(LoopMap(loops))
            }
        }
        deserializer.deserialize_map(LoopMapVisitor)
    }
}

impl<'de> Deserialize<'de> for ScriptedCall {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CallVisitor;
        impl<'de> Visitor<'de> for CallVisitor {
            type Value = ScriptedCall;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a call written as `- tool_name: {input}`")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ScriptedCall, E> {
                Err(E::custom(format!(
                    "a call is a map `- tool_name: {{input}}`; write `- {name}: {{}}` for a call without input"
                )))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ScriptedCall, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(
                        "a call needs exactly one key, the tool name (e.g. `- read_file: {path: src/main.rs}`); this one has none",
                    ));
                };
                let input: Option<Value> = map.next_value()?;
                let mut extra = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    extra.push(key);
                }
                if !extra.is_empty() {
                    let keys: Vec<String> = std::iter::once(&name)
                        .chain(&extra)
                        .map(|k| format!("`{k}`"))
                        .collect();
                    return Err(de::Error::custom(format!(
                        "a call needs exactly one key, the tool name, but this one has {}: {}; \
                         put each call in its own list item (`- tool: {{...}}`)",
                        keys.len(),
                        keys.join(", ")
                    )));
                }
                let input = match input {
                    None => Value::Object(Default::default()),
                    Some(v @ Value::Object(_)) => v,
                    Some(other) => {
                        return Err(de::Error::custom(format!(
                            "the input of call `{name}` must be a map of arguments (or empty), not {}",
                            json_kind(&other)
                        )));
                    }
                };
                Ok(ScriptedCall {
                    name,
                    input: Arc::new(input),
                })
            }
        }
        deserializer.deserialize_any(CallVisitor)
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Role};
    use serde_json::json;
    use std::sync::Arc;

    /// The example from BRIEF.md, "Scripted LLM provider", verbatim.
    const BRIEF_EXAMPLE: &str = r#"
client:
  turns:              # one model response each, consumed in order across iterations
    - say: "Asking the api loop"          # optional text
      calls:                              # tool calls of this response, in order
        - query_loop: {target_exec_id: api, question: "Which port?"}
    - calls:
        - write_file: {path: client.txt, content: "port 8080\n"}
        - complete_task: {summary: "client wired"}
    # a turn without calls ends the iteration (end of turn)
  answers:            # how this loop answers questions from others; first match wins
    - when: "port"    # regex on the question; an entry without `when` matches anything
      reply: "8080"
"#;

    fn iteration(loop_name: &str) -> LlmRequest {
        LlmRequest {
            loop_name: loop_name.into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages: Vec::new(),
            tools: Vec::new().into(),
        }
    }

    fn question(loop_name: &str, q: &str) -> LlmRequest {
        LlmRequest {
            purpose: Purpose::QueryAnswer {
                from: "other".into(),
                question: q.into(),
            },
            ..iteration(loop_name)
        }
    }

    fn script(text: &str) -> ScriptedLlm {
        ScriptedLlm::from_yaml(text, "s.yml").unwrap()
    }

    fn load_err(text: &str) -> String {
        ScriptedLlm::from_yaml(text, "s.yml")
            .unwrap_err()
            .to_string()
    }

    #[tokio::test]
    async fn the_brief_example_replays_in_order() {
        let llm = script(BRIEF_EXAMPLE);
        assert_eq!(llm.loop_names(), vec!["client"]);
        assert_eq!(llm.turns_left("client"), 2);

        let first = llm.complete(&iteration("client")).await.unwrap();
        assert_eq!(first.text.as_deref(), Some("Asking the api loop"));
        assert_eq!(first.stop_reason, StopReason::ToolUse);
        assert_eq!(
            first.tool_calls,
            vec![ToolCall {
                id: "client-1-1".into(),
                name: "query_loop".into(),
                input: json!({"target_exec_id": "api", "question": "Which port?"}).into(),
            }]
        );
        assert_eq!(llm.turns_left("client"), 1);

        let second = llm.complete(&iteration("client")).await.unwrap();
        assert_eq!(second.text, None);
        assert_eq!(second.stop_reason, StopReason::ToolUse);
        let ids: Vec<&str> = second.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["client-2-1", "client-2-2"]);
        assert_eq!(second.tool_calls[0].name, "write_file");
        assert_eq!(
            *second.tool_calls[0].input,
            json!({"path": "client.txt", "content": "port 8080\n"})
        );
        assert_eq!(
            *second.tool_calls[1].input,
            json!({"summary": "client wired"})
        );
        assert_eq!(llm.turns_left("client"), 0);

        let answer = llm
            .complete(&question("client", "Which port do you use?"))
            .await
            .unwrap();
        assert_eq!(answer.text.as_deref(), Some("8080"));
        assert!(answer.tool_calls.is_empty());
        assert_eq!(answer.stop_reason, StopReason::EndTurn);
    }

    #[tokio::test]
    async fn exhausted_turns_end_the_turn_with_nothing() {
        let llm = script("a:\n  turns:\n    - say: only\n");
        llm.complete(&iteration("a")).await.unwrap();
        for _ in 0..3 {
            let r = llm.complete(&iteration("a")).await.unwrap();
            assert_eq!(r.text, None);
            assert!(r.tool_calls.is_empty());
            assert_eq!(r.stop_reason, StopReason::EndTurn);
            assert_eq!(llm.turns_left("a"), 0);
        }
    }

    #[tokio::test]
    async fn a_turn_without_calls_ends_the_turn_and_null_input_is_empty() {
        let llm =
            script("a:\n  turns:\n    - say: thinking\n    - calls:\n        - complete_task:\n");
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("thinking"));
        assert_eq!(r.stop_reason, StopReason::EndTurn);
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(r.tool_calls[0].name, "complete_task");
        assert_eq!(*r.tool_calls[0].input, json!({}));
        assert_eq!(r.tool_calls[0].id, "a-2-1");
    }

    #[tokio::test]
    async fn a_panic_turn_panics_with_its_message_and_is_consumed() {
        let llm = std::sync::Arc::new(script(
            "a:\n  turns:\n    - panic: injected\n    - say: after\n",
        ));
        let first = {
            let llm = llm.clone();
            tokio::spawn(async move { llm.complete(&iteration("a")).await })
        };
        let err = first.await.unwrap_err();
        let message = err.into_panic();
        let message = message
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("?");
        assert_eq!(message, "scripted panic of loop 'a': injected");
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("after"));
    }

    #[tokio::test]
    async fn answers_do_not_consume_turns_and_first_match_wins() {
        let llm = script(
            "api:\n  turns:\n    - say: t1\n  answers:\n    - when: '^Which (port|host)\\?'\n      reply: first\n    - when: port\n      reply: second\n    - reply: fallback\n",
        );
        let ask = |q: &'static str| {
            let llm = &llm;
            async move { llm.complete(&question("api", q)).await }
        };
        assert_eq!(
            ask("Which port?").await.unwrap().text.as_deref(),
            Some("first")
        );
        // Regex search, not full match: "port" is found inside the question.
        assert_eq!(
            ask("the port, please").await.unwrap().text.as_deref(),
            Some("second")
        );
        assert_eq!(
            ask("anything else").await.unwrap().text.as_deref(),
            Some("fallback")
        );
        assert_eq!(llm.turns_left("api"), 1);
        let r = llm.complete(&iteration("api")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("t1"));
    }

    #[tokio::test]
    async fn an_unmatched_question_is_an_error_that_quotes_it() {
        let llm = script("api:\n  answers:\n    - when: port\n      reply: '8080'\n");
        let err = llm
            .complete(&question("api", "Which host?"))
            .await
            .unwrap_err();
        let LlmError::Script(msg) = err else {
            panic!("wrong error {err:?}")
        };
        assert!(msg.contains("loop 'api' has no scripted answer"), "{msg}");
        assert!(msg.contains("\"Which host?\""), "{msg}");

        // A long multi-byte question is cut on a char boundary.
        let long = "é".repeat(500);
        let err = llm.complete(&question("api", &long)).await.unwrap_err();
        let LlmError::Script(msg) = err else {
            panic!("wrong error {err:?}")
        };
        assert!(msg.contains(&format!("\"{}…\"", "é".repeat(100))), "{msg}");
        assert!(!msg.contains(&"é".repeat(101)), "{msg}");

        // A loop with no answers at all fails the same way.
        let llm = script("quiet:\n  turns: []\n");
        let err = llm.complete(&question("quiet", "hi")).await.unwrap_err();
        assert!(err.to_string().contains("no scripted answer"), "{err}");
    }

    #[tokio::test]
    async fn unknown_loops_are_named_with_the_scripted_ones() {
        let llm = script("b: {}\na:\n  turns: []\n");
        assert_eq!(llm.loop_names(), vec!["a", "b"]);
        let err = llm.complete(&iteration("zed")).await.unwrap_err();
        assert_eq!(
            err,
            LlmError::Script("no script for loop 'zed'; scripted loops: a, b".into())
        );
        let err = llm.complete(&question("zed", "q")).await.unwrap_err();
        assert!(matches!(err, LlmError::Script(_)));
        assert_eq!(llm.turns_left("zed"), 0);

        let empty = script("");
        assert!(empty.loop_names().is_empty());
        let err = empty.complete(&iteration("a")).await.unwrap_err();
        assert!(err.to_string().contains("scripted loops: (none)"), "{err}");
    }

    #[tokio::test]
    async fn usage_is_a_deterministic_estimate() {
        let llm = script("a:\n  turns:\n    - say: abcdefgh\n      calls:\n        - t: {}\n");
        let mut request = iteration("a");
        request.system = "x".repeat(10);
        request.messages = vec![
            Message::user_text("y".repeat(6)),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::ToolUse {
                        id: "1".into(),
                        name: "ab".into(),
                        input: json!({}).into(),
                    },
                    Block::ToolResult {
                        tool_use_id: "1".into(),
                        content: "zz".into(),
                        is_error: false,
                    },
                ],
            },
        ];
        let r = llm.complete(&request).await.unwrap();
        // 10 + 6 + (2 + 2) + 2 = 22 chars → 6 tokens; "abcdefgh" + "t" + "{}" = 11 → 3.
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 6,
                output_tokens: 3,
                ..Default::default()
            }
        );
    }

    #[tokio::test]
    async fn a_script_can_report_usage_like_a_provider() {
        let llm = script(
            "a:\n  turns:\n    - say: hi\n      usage: {input_tokens: 1000, output_tokens: 20, cache_read_tokens: 5}\n  answers:\n    - reply: r\n      usage: {cache_write_tokens: 7}\n",
        );
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(
            r.usage,
            Usage {
                input_tokens: 1000,
                output_tokens: 20,
                cache_read_tokens: 5,
                cache_write_tokens: 0,
                estimated: false,
            }
        );
        let r = llm.complete(&question("a", "q")).await.unwrap();
        assert_eq!(
            r.usage,
            Usage {
                cache_write_tokens: 7,
                ..Usage::default()
            }
        );
        let err = load_err("a:\n  turns:\n    - usage: {input_tokenz: 1}\n");
        assert!(err.contains("did you mean `input_tokens`"), "{err}");
    }

    #[test]
    fn unknown_keys_give_place_and_suggestion() {
        let err = load_err("client:\n  turns:\n    - cals:\n        - a: {}\n");
        assert!(err.starts_with("s.yml:3:"), "{err}");
        assert!(err.contains("unknown field `cals`"), "{err}");
        assert!(err.contains("did you mean `calls`"), "{err}");
        assert!(!err.contains(" at line "), "{err}");

        let err = load_err("client:\n  turn: []\n");
        assert!(err.starts_with("s.yml:2:"), "{err}");
        assert!(err.contains("did you mean `turns`"), "{err}");

        let err = load_err("api:\n  answers:\n    - when: x\n      replly: y\n");
        assert!(err.starts_with("s.yml:4:"), "{err}");
        assert!(err.contains("did you mean `reply`"), "{err}");
    }

    #[test]
    fn call_items_need_exactly_one_key() {
        let err = load_err(
            "client:\n  turns:\n    - calls:\n        - read_file: {path: a}\n        - write_file: {path: b}\n          complete_task: {}\n",
        );
        assert!(err.starts_with("s.yml:5:"), "{err}");
        assert!(err.contains("client.turns[0].calls[1]"), "{err}");
        assert!(
            err.contains("has 2: `write_file`, `complete_task`"),
            "{err}"
        );

        let err = load_err("client:\n  turns:\n    - calls:\n        - {}\n");
        assert!(err.starts_with("s.yml:4:"), "{err}");
        assert!(err.contains("this one has none"), "{err}");

        let err = load_err("client:\n  turns:\n    - calls:\n        - complete_task\n");
        assert!(err.contains("write `- complete_task: {}`"), "{err}");

        let err = load_err("client:\n  turns:\n    - calls:\n        - grep: [a, b]\n");
        assert!(err.contains("input of call `grep` must be a map"), "{err}");
        assert!(err.contains("not a list"), "{err}");
    }

    #[test]
    fn invalid_regex_names_loop_and_index() {
        let err =
            load_err("api:\n  answers:\n    - reply: ok\n    - when: '(port'\n      reply: x\n");
        assert!(err.starts_with("s.yml:4:"), "{err}");
        assert!(err.contains("api.answers[1]:"), "{err}");
        assert!(err.contains("unclosed group"), "{err}");
        assert!(err.contains("invalid regex `(port`"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn missing_reply_and_bad_values_are_refused() {
        let err = load_err("api:\n  answers:\n    - when: port\n");
        assert!(err.starts_with("s.yml:3:"), "{err}");
        assert!(err.contains("missing field `reply`"), "{err}");

        let err = load_err("a:\n  turns:\n    - delay_ms: -5\n");
        assert!(err.starts_with("s.yml:3:"), "{err}");

        let err = load_err("- a\n- b\n");
        assert!(err.contains("a map from loop name"), "{err}");

        let err = load_err("a: {}\nb: {}\na: {}\n");
        assert!(err.contains("loop 'a' is scripted twice"), "{err}");
    }

    #[test]
    fn empty_loop_entries_are_allowed() {
        assert!(script("# nothing scripted yet\n").loop_names().is_empty());
        let llm = script("a:\nb:\n  turns:\n  answers:\n");
        assert_eq!(llm.loop_names(), vec!["a", "b"]);
        assert_eq!(llm.turns_left("a"), 0);
        assert_eq!(llm.turns_left("b"), 0);
    }

    #[test]
    fn load_reads_files_and_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script.yml");
        std::fs::write(&path, BRIEF_EXAMPLE).unwrap();
        assert_eq!(ScriptedLlm::load(&path).unwrap().turns_left("client"), 2);

        std::fs::write(&path, "client:\n  answer: []\n").unwrap();
        assert!(matches!(
            ScriptedLlm::load(&path),
            Err(ScriptError::Invalid {
                line_column: Some((2, _)),
                ..
            })
        ));
        let err = ScriptedLlm::load(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:2:", path.display())), "{err}");
        assert!(err.contains("did you mean `answers`"), "{err}");

        let err = ScriptedLlm::load(&dir.path().join("missing.yml")).unwrap_err();
        assert!(
            matches!(&err, ScriptError::Unreadable { path, .. } if path.ends_with("missing.yml"))
        );
        let err = err.to_string();
        assert!(err.starts_with("cannot read "), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn delay_ms_waits_before_the_turn_and_the_answer() {
        let llm = script(
            "a:\n  turns:\n    - delay_ms: 5000\n      say: slow\n    - say: fast\n  answers:\n    - reply: later\n      delay_ms: 700\n",
        );
        let start = tokio::time::Instant::now();
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("slow"));
        assert_eq!(start.elapsed(), Duration::from_millis(5000));

        let start = tokio::time::Instant::now();
        llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);

        let start = tokio::time::Instant::now();
        let r = llm.complete(&question("a", "q")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("later"));
        assert_eq!(start.elapsed(), Duration::from_millis(700));
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_cancelled_during_its_delay_is_consumed() {
        let llm = script("a:\n  turns:\n    - delay_ms: 60000\n      say: slow\n    - say: next\n");
        let timed_out =
            tokio::time::timeout(Duration::from_secs(1), llm.complete(&iteration("a"))).await;
        assert!(timed_out.is_err());
        let r = llm.complete(&iteration("a")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("next"));
    }

    #[test]
    fn resume_continues_after_the_responses_already_given() {
        let llm = ScriptedLlm::from_yaml(
            "a:\n  turns:\n    - say: one\n    - say: two\n    - say: three\n",
            "s.yml",
        )
        .unwrap();
        llm.resume("a", 2);
        assert_eq!(llm.turns_left("a"), 1);
        llm.resume("a", 99);
        assert_eq!(llm.turns_left("a"), 0);
        llm.resume("nobody", 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_loops_keep_their_own_cursors() {
        let mut yaml = String::new();
        for name in ["a", "b", "c", "d"] {
            yaml.push_str(&format!("{name}:\n  turns:\n"));
            for n in 1..=25 {
                yaml.push_str(&format!("    - say: '{name}{n}'\n"));
            }
        }
        let llm = Arc::new(script(&yaml));
        let tasks: Vec<_> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|name| {
                let llm = Arc::clone(&llm);
                tokio::spawn(async move {
                    let mut said = Vec::new();
                    for _ in 0..25 {
                        let r = llm.complete(&iteration(name)).await.unwrap();
                        said.push(r.text.unwrap());
                        tokio::task::yield_now().await;
                    }
                    (name, said)
                })
            })
            .collect();
        for task in tasks {
            let (name, said) = task.await.unwrap();
            let expected: Vec<String> = (1..=25).map(|n| format!("{name}{n}")).collect();
            assert_eq!(said, expected);
            assert_eq!(llm.turns_left(name), 0);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_loop_does_not_hold_up_another() {
        let llm = Arc::new(script(
            "slow:\n  turns:\n    - delay_ms: 10000\n      say: s\nquick:\n  turns:\n    - say: q\n",
        ));
        let slow = tokio::spawn({
            let llm = Arc::clone(&llm);
            async move { llm.complete(&iteration("slow")).await }
        });
        tokio::task::yield_now().await;
        let start = tokio::time::Instant::now();
        let r = llm.complete(&iteration("quick")).await.unwrap();
        assert_eq!(r.text.as_deref(), Some("q"));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(slow.await.unwrap().unwrap().text.as_deref(), Some("s"));
    }
}
