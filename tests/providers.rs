//! The network providers (Anthropic Messages, OpenAI Chat Completions) against HTTP servers
//! that each test starts on 127.0.0.1: nothing here reaches any other address.
//!
//! Request and reply bodies are recorded in `tests/fixtures/providers/<provider>/`, written
//! from the public API references. The server checks method, path and headers, and each
//! request body must equal its recording (compared as JSON values). Error paths cover what
//! is retried (429 with `retry-after`, 5xx, refused connections, timeouts), what is not
//! (other 4xx, unreadable replies), the run-wide in-flight limit and the body cap.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use td_llm::anthropic::{AnthropicClient, AnthropicSettings};
use td_llm::config::{LlmConfig, build_client, build_client_with_env};
use td_llm::endpoint::EndpointSettings;
use td_llm::http::{ApiKey, HttpSettings, HttpTransport};
use td_llm::openai::{OpenAiClient, OpenAiSettings};
use td_llm::{
    Block, LlmClient, LlmError, LlmRequest, LlmResponse, Message, NoObserver, Purpose, Role,
    StopReason, ToolCall, Usage,
};
use td_protocol::tool_definition::ToolDefinition;

// ---------------------------------------------------------------------------------------
// A minimal HTTP/1.1 server: one scripted reply per request, in order; it records every
// request and the peak number of requests it was working on at once.
// ---------------------------------------------------------------------------------------

/// One scripted reply.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    delay: Duration,
    /// No Content-Length: the body ends when the connection closes.
    close_delimited: bool,
}

impl Reply {
    fn json(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
            close_delimited: false,
        }
    }

    fn fixture(status: u16, path: &str) -> Self {
        Reply::json(status, fixture_text(path))
    }

    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn close_delimited(mut self) -> Self {
        self.close_delimited = true;
        self
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    /// Lower-case names.
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    at: Instant,
}

impl Seen {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct State {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
    active: AtomicUsize,
    peak: AtomicUsize,
}

struct TestServer {
    base: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    async fn start(replies: Vec<Reply>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        state.replies.lock().unwrap().extend(replies);
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        TestServer { base, state, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    fn peak(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: TcpStream, state: Arc<State>) {
    let Ok(seen) = read_request(&mut stream).await else {
        return;
    };
    let now = state.active.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak.fetch_max(now, Ordering::SeqCst);
    state.seen.lock().unwrap().push(seen);
    let reply = state
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| {
            Reply::json(
                418,
                r#"{"error":{"message":"test server: no reply scripted for this request"}}"#,
            )
        });
    tokio::time::sleep(reply.delay).await;
    // Counted as finished before the reply is written: a client under an in-flight limit
    // can only send its next request after reading this reply.
    state.active.fetch_sub(1, Ordering::SeqCst);
    let mut head = format!(
        "HTTP/1.1 {} Scripted\r\ncontent-type: application/json\r\nconnection: close\r\n",
        reply.status
    );
    if !reply.close_delimited {
        head.push_str(&format!("content-length: {}\r\n", reply.body.len()));
    }
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&reply.body).await;
    let _ = stream.shutdown().await;
}

async fn read_request(stream: &mut TcpStream) -> std::io::Result<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split_whitespace();
    let method = request_line.next().unwrap_or_default().to_string();
    let path = request_line.next().unwrap_or_default().to_string();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Seen {
        method,
        path,
        headers,
        body,
        at: Instant::now(),
    })
}

// ---------------------------------------------------------------------------------------
// The conversation shared by both providers' recordings.
// ---------------------------------------------------------------------------------------

const ANTHROPIC_KEY: &str = "sk-ant-test-4f9c2e1b7a";
const OPENAI_KEY: &str = "sk-test-openai-8d3a55c0";

const SYSTEM: &str = "You are the `api` loop of a TaskDaemon run. Work in your git worktree with the tools; call complete_task when the task is done.";
const HELLO: &str = "Say hello in one short sentence.";
const TASK: &str = "Find where the HTTP port is configured and read that file.";
const LONG: &str = "Explain the module layout of this crate in detail.";
const GREP_OUT: &str = "src/main.rs:12:    let port = 8080;";
const READ_ERR: &str = "config/server.toml: no such file; list_directory shows which files exist";
const INBOX: &str = "[message from loop client: which port will the api listen on?]";

fn fixture_text(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/providers")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn fixture(path: &str) -> Value {
    serde_json::from_str(&fixture_text(path)).unwrap()
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "read_file".into(),
            description: "Read a text file of the worktree.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path relative to the worktree."}},
                "required": ["path"],
                "additionalProperties": false
            }),
        },
        ToolDefinition {
            name: "grep".into(),
            description: "Search file contents with a regular expression.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regex to search for."},
                    "path": {"type": "string", "description": "Directory to search; default: the worktree root."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        },
    ]
}

fn request(messages: Vec<Message>, with_tools: bool) -> LlmRequest {
    LlmRequest {
        loop_name: "api".into(),
        purpose: Purpose::Iteration,
        system: SYSTEM.into(),
        messages,
        tools: if with_tools {
            tools().into()
        } else {
            Vec::new().into()
        },
    }
}

/// The conversation after the model's two calls: its message as the engine records it,
/// then one good and one failed result, then an inbox note.
fn results_request(calls: &LlmResponse) -> LlmRequest {
    let mut assistant = Vec::new();
    if let Some(text) = &calls.text {
        assistant.push(Block::Text { text: text.clone() });
    }
    for call in &calls.tool_calls {
        assistant.push(Block::ToolUse {
            id: call.id.clone(),
            name: call.name.clone(),
            input: call.input.clone(),
        });
    }
    request(
        vec![
            Message::user_text(TASK),
            Message {
                role: Role::Assistant,
                content: assistant,
            },
            Message {
                role: Role::User,
                content: vec![
                    Block::ToolResult {
                        tool_use_id: calls.tool_calls[0].id.clone(),
                        content: GREP_OUT.into(),
                        is_error: false,
                    },
                    Block::ToolResult {
                        tool_use_id: calls.tool_calls[1].id.clone(),
                        content: READ_ERR.into(),
                        is_error: true,
                    },
                    Block::Text { text: INBOX.into() },
                ],
            },
        ],
        true,
    )
}

fn http(max_retries: u32, retry_base_ms: u64) -> HttpSettings {
    HttpSettings {
        timeout: Duration::from_secs(10),
        max_retries,
        retry_base: Duration::from_millis(retry_base_ms),
        ..HttpSettings::default()
    }
}

fn permits(n: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(n))
}

/// An Anthropic client without prompt caching: the recordings show the mapping, and
/// [`anthropic_prompt_cache_breakpoints_follow_the_conversation`] adds the breakpoints.
fn anthropic(base: &str, http: HttpSettings, in_flight: Arc<Semaphore>) -> AnthropicClient {
    anthropic_cached(base, http, in_flight).with_prompt_cache(false)
}

/// An Anthropic client as configured by default (prompt caching on).
fn anthropic_cached(base: &str, http: HttpSettings, in_flight: Arc<Semaphore>) -> AnthropicClient {
    AnthropicClient::new(
        AnthropicSettings {
            endpoint: EndpointSettings::new(base, "claude-sonnet-4-5"),
            max_tokens: 1024,
            api_key: ApiKey::new(ANTHROPIC_KEY, "test").unwrap(),
        },
        http,
        in_flight,
    )
    .unwrap()
}

fn openai(
    base: &str,
    key: Option<&str>,
    http: HttpSettings,
    in_flight: Arc<Semaphore>,
) -> OpenAiClient {
    OpenAiClient::new(
        OpenAiSettings {
            endpoint: EndpointSettings::new(format!("{base}/v1"), "gpt-4.1"),
            max_tokens: Some(1024),
            api_key: key.map(|k| ApiKey::new(k, "test").unwrap()),
        },
        http,
        in_flight,
    )
    .unwrap()
}

fn assert_anthropic_call(seen: &Seen, recorded: &str) {
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("authorization"), None);
    assert_eq!(seen.json(), fixture(recorded), "request body vs {recorded}");
}

/// `arguments` is JSON inside a string; compared as JSON so that key order does not matter.
fn normalize_arguments(mut body: Value) -> Value {
    if let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) {
        for call in messages
            .iter_mut()
            .filter_map(|m| m.get_mut("tool_calls").and_then(Value::as_array_mut))
            .flatten()
        {
            let args = &mut call["function"]["arguments"];
            if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                *args = parsed;
            }
        }
    }
    body
}

fn assert_openai_call(seen: &Seen, key: Option<&str>, recorded: &str) {
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/v1/chat/completions");
    let bearer = key.map(|k| format!("Bearer {k}"));
    assert_eq!(seen.header("authorization"), bearer.as_deref());
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("x-api-key"), None);
    assert_eq!(
        normalize_arguments(seen.json()),
        normalize_arguments(fixture(recorded)),
        "request body vs {recorded}"
    );
}

fn assert_api_error(err: LlmError, status: u16, contains: &[&str]) {
    match &err {
        LlmError::Api { status: s, message } => {
            assert_eq!(*s, status, "{err}");
            for part in contains {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
        other => panic!("expected an API error {status}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Anthropic: the recorded exchanges.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn anthropic_text_reply() {
    let server = TestServer::start(vec![Reply::fixture(200, "anthropic/text.response.json")]).await;
    let client = anthropic(&server.base, http(0, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(
        reply,
        LlmResponse {
            text: Some("Hello! I'm ready to work on the api task.".into()),
            tool_calls: vec![],
            stop_reason: StopReason::EndTurn,
            usage: Usage {
                input_tokens: 48,
                output_tokens: 14,
                ..Default::default()
            },
        }
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    assert_anthropic_call(&seen[0], "anthropic/text.request.json");
}

#[tokio::test]
async fn anthropic_two_tool_calls_and_their_results_round_trip() {
    let server = TestServer::start(vec![
        Reply::fixture(200, "anthropic/tool_calls.response.json"),
        Reply::fixture(200, "anthropic/tool_results.response.json"),
    ])
    .await;
    let client = anthropic(&server.base, http(0, 1), permits(4));
    let calls = client
        .complete(&request(vec![Message::user_text(TASK)], true))
        .await
        .unwrap();
    assert_eq!(
        calls.text.as_deref(),
        Some("I'll search for the port setting and read the config file.")
    );
    assert_eq!(
        calls.tool_calls,
        vec![
            ToolCall {
                id: "toolu_01A09q90qw90lq917835lq9".into(),
                name: "grep".into(),
                input: json!({"pattern": "port\\s*=", "path": "src"}).into(),
            },
            ToolCall {
                id: "toolu_01B7sXpM4kQe2TgH6cVn8rLw".into(),
                name: "read_file".into(),
                input: json!({"path": "config/server.toml"}).into(),
            },
        ]
    );
    assert_eq!(calls.stop_reason, StopReason::ToolUse);
    assert_eq!(
        calls.usage,
        Usage {
            input_tokens: 612,
            output_tokens: 131,
            ..Default::default()
        }
    );

    let done = client.complete(&results_request(&calls)).await.unwrap();
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    assert!(done.tool_calls.is_empty());
    assert!(done.text.unwrap().contains("src/main.rs at line 12"));

    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_anthropic_call(&seen[0], "anthropic/tool_calls.request.json");
    assert_anthropic_call(&seen[1], "anthropic/tool_results.request.json");
}

/// `recorded` as sent with prompt caching: the system prompt as a one-block list, and a
/// breakpoint on the last tool, the system block and each block at `blocks` (message,
/// block).
fn with_breakpoints(mut recorded: Value, blocks: &[(usize, usize)]) -> Value {
    let mark = json!({"type": "ephemeral"});
    let system = recorded["system"].take();
    recorded["system"] = json!([{"type": "text", "text": system, "cache_control": mark}]);
    if let Some(last) = recorded
        .get_mut("tools")
        .and_then(Value::as_array_mut)
        .and_then(|t| t.last_mut())
    {
        last["cache_control"] = mark.clone();
    }
    for &(m, b) in blocks {
        recorded["messages"][m]["content"][b]["cache_control"] = mark.clone();
    }
    recorded
}

#[tokio::test]
async fn anthropic_prompt_cache_breakpoints_follow_the_conversation() {
    let server = TestServer::start(vec![
        Reply::fixture(200, "anthropic/tool_calls.response.json"),
        Reply::fixture(200, "anthropic/tool_results.response.json"),
    ])
    .await;
    let client = anthropic_cached(&server.base, http(0, 1), permits(4));
    let calls = client
        .complete(&request(vec![Message::user_text(TASK)], true))
        .await
        .unwrap();
    client.complete(&results_request(&calls)).await.unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    // First turn: tools, system, the task. Second: the same three (the task is where the
    // first request ended) and the last block of the results.
    assert_eq!(
        seen[0].json(),
        with_breakpoints(fixture("anthropic/tool_calls.request.json"), &[(0, 0)])
    );
    assert_eq!(
        seen[1].json(),
        with_breakpoints(
            fixture("anthropic/tool_results.request.json"),
            &[(0, 0), (2, 2)]
        )
    );
    let marks = |s: &Seen| {
        String::from_utf8_lossy(&s.body)
            .matches("cache_control")
            .count()
    };
    assert_eq!((marks(&seen[0]), marks(&seen[1])), (3, 4));
}

#[tokio::test]
async fn anthropic_max_tokens_stop() {
    let server = TestServer::start(vec![Reply::fixture(
        200,
        "anthropic/max_tokens.response.json",
    )])
    .await;
    let client = anthropic(&server.base, http(0, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(LONG)], false))
        .await
        .unwrap();
    assert_eq!(reply.stop_reason, StopReason::MaxTokens);
    assert_eq!(reply.usage.output_tokens, 1024);
    assert!(reply.text.unwrap().ends_with("hold pure helpers that"));
    assert_anthropic_call(&server.seen()[0], "anthropic/max_tokens.request.json");
}

// ---------------------------------------------------------------------------------------
// OpenAI-compatible: the recorded exchanges.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn openai_text_reply() {
    let server = TestServer::start(vec![Reply::fixture(200, "openai/text.response.json")]).await;
    let client = openai(&server.base, Some(OPENAI_KEY), http(0, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(
        reply,
        LlmResponse {
            text: Some("Hello! I'm ready to work on the api task.".into()),
            tool_calls: vec![],
            stop_reason: StopReason::EndTurn,
            usage: Usage {
                input_tokens: 41,
                output_tokens: 12,
                ..Default::default()
            },
        }
    );
    assert_openai_call(
        &server.seen()[0],
        Some(OPENAI_KEY),
        "openai/text.request.json",
    );
}

#[tokio::test]
async fn openai_two_tool_calls_and_their_results_round_trip() {
    let server = TestServer::start(vec![
        Reply::fixture(200, "openai/tool_calls.response.json"),
        Reply::fixture(200, "openai/tool_results.response.json"),
    ])
    .await;
    let client = openai(&server.base, Some(OPENAI_KEY), http(0, 1), permits(4));
    let calls = client
        .complete(&request(vec![Message::user_text(TASK)], true))
        .await
        .unwrap();
    assert_eq!(
        calls.tool_calls,
        vec![
            ToolCall {
                id: "call_Rk8sVb2LqW7nXe4TpY9mZc1D".into(),
                name: "grep".into(),
                input: json!({"pattern": "port\\s*=", "path": "src"}).into(),
            },
            ToolCall {
                id: "call_J3hTq6NwP0aFv5LsK8xYb2Ue".into(),
                name: "read_file".into(),
                input: json!({"path": "config/server.toml"}).into(),
            },
        ]
    );
    assert_eq!(calls.stop_reason, StopReason::ToolUse);
    assert_eq!(
        calls.usage,
        Usage {
            input_tokens: 187,
            output_tokens: 58,
            ..Default::default()
        }
    );

    let done = client.complete(&results_request(&calls)).await.unwrap();
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    assert!(done.text.unwrap().contains("src/main.rs at line 12"));

    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert_openai_call(&seen[0], Some(OPENAI_KEY), "openai/tool_calls.request.json");
    assert_openai_call(
        &seen[1],
        Some(OPENAI_KEY),
        "openai/tool_results.request.json",
    );
}

#[tokio::test]
async fn openai_max_tokens_stop_and_no_key_means_no_authorization() {
    let server =
        TestServer::start(vec![Reply::fixture(200, "openai/max_tokens.response.json")]).await;
    let client = openai(&server.base, None, http(0, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(LONG)], false))
        .await
        .unwrap();
    assert_eq!(reply.stop_reason, StopReason::MaxTokens);
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 45,
            output_tokens: 1024,
            ..Default::default()
        }
    );
    assert_openai_call(&server.seen()[0], None, "openai/max_tokens.request.json");
}

#[tokio::test]
async fn openai_invalid_arguments_become_a_string_input_that_validation_rejects() {
    let server = TestServer::start(vec![Reply::fixture(
        200,
        "openai/invalid_arguments.response.json",
    )])
    .await;
    let client = openai(&server.base, None, http(0, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(TASK)], true))
        .await
        .expect("invalid arguments must not fail the call");
    assert_eq!(
        reply.tool_calls,
        vec![ToolCall {
            id: "call_0".into(),
            name: "read_file".into(),
            input: Value::String("{\"path\": \"src/main.rs\"".into()).into(),
        }]
    );
    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    // This server sent no usage: zeros, not a failure.
    assert_eq!(reply.usage, Usage::default());
    // The registry refuses the input before the tool runs, so the model gets an error
    // result and can send valid JSON next turn.
    let err = td_tools::all_tools()
        .validate("read_file", &reply.tool_calls[0].input)
        .unwrap_err();
    assert!(err.to_string().contains("object"), "{err}");
    // Sent back in the history as a JSON string, which every server can parse.
    let next = request(
        vec![Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: "call_0".into(),
                name: "read_file".into(),
                input: reply.tool_calls[0].input.clone(),
            }],
        }],
        false,
    );
    let body = client.request_body(&next);
    let args = body["messages"][1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(args).unwrap(),
        json!("{\"path\": \"src/main.rs\"")
    );
}

// ---------------------------------------------------------------------------------------
// Errors and retries.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_400_is_not_retried_and_carries_the_message() {
    let server = TestServer::start(vec![
        Reply::fixture(400, "anthropic/error_400.json"),
        Reply::fixture(400, "openai/error_400.json"),
    ])
    .await;
    let a = anthropic(&server.base, http(4, 1), permits(4));
    let err = a
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert_api_error(
        err,
        400,
        &[
            "invalid_request_error: messages.0.content.0.text: text content blocks must be non-empty",
        ],
    );
    assert_eq!(server.seen().len(), 1, "a 400 must not be retried");

    let o = openai(&server.base, None, http(4, 1), permits(4));
    let err = o
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert_api_error(
        err,
        400,
        &["invalid_request_error: Invalid 'messages[2].tool_call_id'"],
    );
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn a_401_is_not_retried_and_points_at_the_key() {
    let server = TestServer::start(vec![
        Reply::fixture(401, "anthropic/error_401.json"),
        Reply::fixture(401, "openai/error_401.json"),
    ])
    .await;
    let a = anthropic(&server.base, http(4, 1), permits(4));
    let err = a
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains(ANTHROPIC_KEY));
    assert_api_error(
        err,
        401,
        &["authentication_error: invalid x-api-key", "api-key-env"],
    );
    let o = openai(&server.base, Some(OPENAI_KEY), http(4, 1), permits(4));
    let err = o
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains(OPENAI_KEY));
    assert_api_error(err, 401, &["Incorrect API key provided", "api-key-file"]);
    assert_eq!(server.seen().len(), 2, "a 401 must not be retried");
}

#[tokio::test]
async fn a_429_waits_as_retry_after_says_then_succeeds() {
    // A zero backoff base: any wait seen comes from the header.
    let server = TestServer::start(vec![
        Reply::fixture(429, "anthropic/error_429.json").header("retry-after", "1"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let client = anthropic(&server.base, http(4, 0), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_millis(2500),
        "waited {waited:?}"
    );
    assert_anthropic_call(&seen[1], "anthropic/text.request.json");
}

#[tokio::test]
async fn a_429_with_retry_after_ms_is_honoured_for_openai() {
    let server = TestServer::start(vec![
        Reply::fixture(429, "openai/error_429.json").header("retry-after-ms", "300"),
        Reply::fixture(200, "openai/text.response.json"),
    ])
    .await;
    let client = openai(&server.base, Some(OPENAI_KEY), http(4, 0), permits(4));
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1000),
        "waited {waited:?}"
    );
}

#[tokio::test]
async fn a_retry_after_beyond_the_limit_fails_at_once() {
    let server = TestServer::start(vec![
        Reply::fixture(429, "anthropic/error_429.json").header("retry-after", "3600"),
    ])
    .await;
    let client = anthropic(&server.base, http(4, 0), permits(4));
    let started = Instant::now();
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_api_error(err, 429, &["rate_limit_error", "asked to wait 3600 s"]);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_500_then_a_529_then_success() {
    let server = TestServer::start(vec![
        Reply::fixture(500, "anthropic/error_500.json"),
        Reply::fixture(529, "anthropic/error_529.json"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let client = anthropic(&server.base, http(4, 1), permits(4));
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(
        reply.text.as_deref(),
        Some("Hello! I'm ready to work on the api task.")
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_anthropic_call(s, "anthropic/text.request.json");
    }
}

#[tokio::test]
async fn openai_server_errors_are_retried_too() {
    let server = TestServer::start(vec![
        Reply::fixture(500, "openai/error_500.json"),
        Reply::json(503, "upstream connect error"),
        Reply::fixture(200, "openai/text.response.json"),
    ])
    .await;
    let client = openai(&server.base, None, http(4, 1), permits(4));
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn exhausted_retries_name_the_attempts() {
    let server = TestServer::start(vec![
        Reply::fixture(529, "anthropic/error_529.json"),
        Reply::fixture(529, "anthropic/error_529.json"),
        Reply::fixture(529, "anthropic/error_529.json"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let client = anthropic(&server.base, http(2, 1), permits(4));
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert_api_error(
        err,
        529,
        &["overloaded_error: Overloaded", "gave up after 3 attempts"],
    );
    assert_eq!(server.seen().len(), 3);
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error_after_retries() {
    // A port that was free a moment ago and has no listener now.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let client = anthropic(&base, http(2, 1), permits(4));
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    match &err {
        LlmError::Transport(m) => {
            assert!(m.contains(&base), "{m}");
            assert!(m.contains("gave up after 3 attempts"), "{m}");
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    let o = openai(&base, None, http(0, 1), permits(4));
    let err = o
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("gave up after 1 attempt")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_slow_server_times_out_and_is_retried() {
    let server = TestServer::start(vec![
        Reply::fixture(200, "anthropic/text.response.json").delay(Duration::from_secs(3)),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let settings = HttpSettings {
        timeout: Duration::from_millis(200),
        ..http(1, 1)
    };
    let client = anthropic(&server.base, settings, permits(4));
    let started = Instant::now();
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn malformed_replies_are_bad_replies_and_not_retried() {
    let server = TestServer::start(vec![
        Reply::json(200, "{\"content\": [ oops"),
        Reply::json(200, "{\"id\": \"chatcmpl-1\", \"choices\": []}"),
    ])
    .await;
    let a = anthropic(&server.base, http(4, 1), permits(4));
    let err = a
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::BadReply(m) if m.contains("not JSON") && m.contains("oops")),
        "{err:?}"
    );
    assert_eq!(server.seen().len(), 1);
    let o = openai(&server.base, None, http(4, 1), permits(4));
    let err = o
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::BadReply(m) if m.contains("no `choices`")),
        "{err:?}"
    );
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn reply_bodies_are_capped_with_or_without_a_length() {
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(4096));
    let server = TestServer::start(vec![
        Reply::json(200, big.clone()),
        Reply::json(200, big.clone()).close_delimited(),
        Reply::json(200, "{\"ok\": true}").close_delimited(),
    ])
    .await;
    let settings = HttpSettings {
        max_body_bytes: 1024,
        ..http(3, 1)
    };
    let transport = HttpTransport::new(
        &format!("{}/x", server.base),
        HeaderMap::new(),
        settings,
        permits(1),
    )
    .unwrap();
    for _ in 0..2 {
        let err = transport
            .post_json(&json!({}), &NoObserver)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadReply(m) if m.contains("larger than 1024 bytes")),
            "{err:?}"
        );
    }
    assert_eq!(
        transport.post_json(&json!({}), &NoObserver).await.unwrap(),
        json!({"ok": true})
    );
    assert_eq!(server.seen().len(), 3, "an oversized reply is not retried");
}

// ---------------------------------------------------------------------------------------
// The run-wide in-flight limit.
// ---------------------------------------------------------------------------------------

async fn peak_with(limit: usize) -> (usize, Duration) {
    let slow = Duration::from_millis(300);
    let server = TestServer::start(vec![
        Reply::fixture(200, "anthropic/text.response.json").delay(slow),
        Reply::fixture(200, "openai/text.response.json").delay(slow),
    ])
    .await;
    // Two clients of different providers share the run's semaphore.
    let in_flight = permits(limit);
    let a = anthropic(&server.base, http(0, 1), in_flight.clone());
    let o = openai(&server.base, None, http(0, 1), in_flight);
    let started = Instant::now();
    let hello = request(vec![Message::user_text(HELLO)], false);
    let (ra, ro) = tokio::join!(a.complete(&hello), o.complete(&hello));
    // Replies are scripted in arrival order, which the race decides: either provider may
    // get the other's body. Only the transport's behaviour matters here.
    let _ = (ra, ro);
    assert_eq!(server.seen().len(), 2);
    (server.peak(), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permit_means_calls_never_overlap() {
    let (peak, took) = peak_with(1).await;
    assert_eq!(peak, 1);
    assert!(took >= Duration::from_millis(600), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_let_two_calls_overlap() {
    // The control for the test above: the server does see overlap when it is allowed.
    let (peak, _) = peak_with(2).await;
    assert_eq!(peak, 2);
}

// ---------------------------------------------------------------------------------------
// Keys never reach the logs.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn keys_never_reach_the_logs() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = TestServer::start(vec![
        Reply::fixture(429, "anthropic/error_429.json").header("retry-after", "0"),
        Reply::fixture(401, "anthropic/error_401.json"),
        Reply::fixture(500, "openai/error_500.json"),
        Reply::fixture(200, "openai/text.response.json"),
    ])
    .await;
    let a = anthropic(&server.base, http(4, 1), permits(4));
    let err = a
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    tracing::error!(error = %err, client = ?a, "call failed");
    let o = openai(&server.base, Some(OPENAI_KEY), http(4, 1), permits(4));
    let ok = o
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await;
    tracing::info!(client = ?o, ok = ok.is_ok(), "call done");

    let seen = server.seen();
    assert_eq!(seen[0].header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(
        seen[3].header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("retrying"), "{logs}");
    assert!(
        logs.contains("call failed") && logs.contains("call done"),
        "{logs}"
    );
    assert!(!logs.contains(ANTHROPIC_KEY), "{logs}");
    assert!(!logs.contains(OPENAI_KEY), "{logs}");
}

// ---------------------------------------------------------------------------------------
// From the `llm:` section to a working client.
// ---------------------------------------------------------------------------------------

fn config(yaml: &str) -> LlmConfig {
    /// The part of taskdaemon.yml this module owns.
    #[derive(serde::Deserialize)]
    struct File {
        llm: LlmConfig,
    }
    serde_yaml_ng::from_str::<File>(yaml).unwrap().llm
}

#[tokio::test]
async fn an_anthropic_config_drives_model_limits_temperature_key_file_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("secrets")).unwrap();
    std::fs::write(
        dir.path().join("secrets/anthropic.key"),
        format!("{ANTHROPIC_KEY}\n"),
    )
    .unwrap();
    let server = TestServer::start(vec![
        Reply::fixture(500, "anthropic/error_500.json"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let cfg = config(&format!(
        "llm:\n  provider: anthropic\n  model: claude-haiku-4-5\n  base-url: {}/\n  \
         api-key-file: secrets/anthropic.key\n  max-tokens: 256\n  temperature: 0.2\n  \
         max-retries: 1\n  retry-base-ms: 1\n  timeout-ms: 5000\n",
        server.base
    ));
    let client = build_client(&cfg, dir.path(), permits(1)).unwrap();
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    let seen = server.seen();
    assert_eq!(seen.len(), 2, "max-retries: 1 allows one retry");
    assert_eq!(seen[1].path, "/v1/messages");
    assert_eq!(seen[1].header("x-api-key"), Some(ANTHROPIC_KEY));
    // Prompt caching is on unless the config says `prompt-cache: off` (no tools here).
    let mut expected = with_breakpoints(fixture("anthropic/text.request.json"), &[(0, 0)]);
    expected["model"] = json!("claude-haiku-4-5");
    expected["max_tokens"] = json!(256);
    expected["temperature"] = json!(0.2);
    // The default `stream: auto` asks for a stream (this server answers JSON).
    expected["stream"] = json!(true);
    assert_eq!(seen[1].json(), expected);

    // prompt-cache: off → no breakpoints.
    let server = TestServer::start(vec![Reply::fixture(200, "anthropic/text.response.json")]).await;
    let cfg = config(&format!(
        "llm:\n  provider: anthropic\n  model: claude-sonnet-4-5\n  base-url: {}\n  \
         api-key-file: secrets/anthropic.key\n  max-tokens: 1024\n  prompt-cache: off\n",
        server.base
    ));
    let client = build_client(&cfg, dir.path(), permits(1)).unwrap();
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    let mut expected = fixture("anthropic/text.request.json");
    expected["stream"] = json!(true);
    assert_eq!(server.seen()[0].json(), expected);

    // max-retries: 0 → one attempt only.
    let server = TestServer::start(vec![
        Reply::fixture(500, "anthropic/error_500.json"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let cfg = config(&format!(
        "llm:\n  provider: anthropic\n  model: m\n  base-url: {}\n  api-key-file: secrets/anthropic.key\n  max-retries: 0\n",
        server.base
    ));
    let client = build_client(&cfg, dir.path(), permits(1)).unwrap();
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert_api_error(
        err,
        500,
        &["api_error: Internal server error", "after 1 attempt"],
    );
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn retry_base_ms_sets_the_backoff() {
    // Five retries at the default 500 ms base would wait 7.75 s on average (up to 15.5 s);
    // at 1 ms they take milliseconds.
    // Each body differs: a body that repeats is tried at most three times.
    let replies = |n| {
        (0..n)
            .map(|i| Reply::json(503, format!("busy {i}")))
            .collect::<Vec<_>>()
    };
    let server = TestServer::start(replies(6)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&format!(
        "llm:\n  provider: openai\n  model: m\n  base-url: {}/v1\n  max-retries: 5\n  retry-base-ms: 1\n",
        server.base
    ));
    let client = build_client_with_env(&cfg, dir.path(), permits(1), &|_| None).unwrap();
    let started = Instant::now();
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_api_error(err, 503, &["busy 5", "gave up after 6 attempts"]);
    assert_eq!(server.seen().len(), 6);
}

#[tokio::test]
async fn timeout_ms_bounds_each_attempt() {
    let server = TestServer::start(vec![
        Reply::fixture(200, "openai/text.response.json").delay(Duration::from_secs(3)),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&format!(
        "llm:\n  provider: openai\n  model: m\n  base-url: {}/v1\n  max-retries: 0\n  timeout-ms: 150\n",
        server.base
    ));
    let client = build_client_with_env(&cfg, dir.path(), permits(1), &|_| None).unwrap();
    let started = Instant::now();
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("within 150 ms")),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_openai_config_with_a_key_variable_and_a_base_path() {
    let server = TestServer::start(vec![Reply::fixture(200, "openai/text.response.json")]).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&format!(
        "llm:\n  provider: openai\n  model: gpt-4.1\n  base-url: {}/v1\n  api-key-env: TD_TEST_OPENROUTER_KEY\n  max-tokens: 1024\n",
        server.base
    ));
    let env = |name: &str| (name == "TD_TEST_OPENROUTER_KEY").then(|| OPENAI_KEY.to_string());
    let client = build_client_with_env(&cfg, dir.path(), permits(1), &env).unwrap();
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    // The default `stream: auto` asks for a stream (this server answers JSON); the rest of
    // the body is the recorded one.
    let mut seen = server.seen()[0].clone();
    let mut body = seen.json();
    let fields = body.as_object_mut().unwrap();
    assert_eq!(fields.remove("stream"), Some(json!(true)));
    assert_eq!(
        fields.remove("stream_options"),
        Some(json!({"include_usage": true}))
    );
    seen.body = serde_json::to_vec(&body).unwrap();
    assert_openai_call(&seen, Some(OPENAI_KEY), "openai/text.request.json");
}

#[tokio::test]
async fn the_scripted_provider_stays_the_offline_default() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.yml"),
        "api:\n  turns:\n    - say: scripted hello\n",
    )
    .unwrap();
    let cfg = config("llm:\n  script: script.yml\n");
    let client = build_client(&cfg, dir.path(), permits(1)).unwrap();
    let reply = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(reply.text.as_deref(), Some("scripted hello"));
}

// ---------------------------------------------------------------------------------------
// What real servers need (issue 14): `tool_choice`, the content of a calls-only assistant
// turn, the retry policy, and retries reported while they happen.
// ---------------------------------------------------------------------------------------

/// A client built from `llm:` keys (besides provider, model and base-url) for `server`.
fn configured(provider: &str, server: &TestServer, keys: &str) -> Arc<dyn LlmClient> {
    let base = match provider {
        "openai" => format!("{}/v1", server.base),
        _ => server.base.clone(),
    };
    let cfg = config(&format!(
        "llm:\n  provider: {provider}\n  model: m\n  base-url: {base}\n  retry-base-ms: 1\n{keys}"
    ));
    let env = |name: &str| (name == "ANTHROPIC_API_KEY").then(|| ANTHROPIC_KEY.to_string());
    build_client_with_env(&cfg, Path::new("."), permits(1), &env).unwrap()
}

#[tokio::test]
async fn tools_are_sent_with_tool_choice_auto_unless_configured_otherwise() {
    // llama-cpp-python's server ignores the tools of a request without `tool_choice`.
    let ok = |provider: &str| {
        Reply::fixture(
            200,
            if provider == "openai" {
                "openai/text.response.json"
            } else {
                "anthropic/text.response.json"
            },
        )
    };
    for (provider, keys, want) in [
        ("openai", "", Some(json!("auto"))),
        ("openai", "  tool-choice: auto\n", Some(json!("auto"))),
        (
            "openai",
            "  tool-choice: required\n",
            Some(json!("required")),
        ),
        ("openai", "  tool-choice: none\n", Some(json!("none"))),
        ("openai", "  tool-choice: omit\n", None),
        ("anthropic", "", Some(json!({"type": "auto"}))),
        (
            "anthropic",
            "  tool-choice: required\n",
            Some(json!({"type": "any"})),
        ),
        (
            "anthropic",
            "  tool-choice: none\n",
            Some(json!({"type": "none"})),
        ),
        ("anthropic", "  tool-choice: omit\n", None),
    ] {
        let server = TestServer::start(vec![ok(provider), ok(provider)]).await;
        let client = configured(provider, &server, keys);
        client
            .complete(&request(vec![Message::user_text(TASK)], true))
            .await
            .unwrap();
        // Without tools there is nothing to choose from: OpenAI refuses `tool_choice` then.
        client
            .complete(&request(vec![Message::user_text(HELLO)], false))
            .await
            .unwrap();
        let seen = server.seen();
        assert_eq!(
            seen[0].json().get("tool_choice"),
            want.as_ref(),
            "{provider} {keys:?}"
        );
        assert_eq!(
            seen[1].json().get("tool_choice"),
            None,
            "{provider} {keys:?}"
        );
    }
}

#[tokio::test]
async fn an_assistant_turn_of_only_tool_calls_carries_empty_text() {
    // llama-cpp-python's server answers 500 both to `"content": null` and to a message
    // without `content`; `""` is what every server tried accepts.
    let server = TestServer::start(vec![Reply::fixture(200, "openai/text.response.json")]).await;
    let client = configured("openai", &server, "");
    client
        .complete(&request(
            vec![
                Message::user_text(TASK),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "call_1".into(),
                        name: "grep".into(),
                        input: json!({"pattern": "port"}).into(),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        tool_use_id: "call_1".into(),
                        content: GREP_OUT.into(),
                        is_error: false,
                    }],
                },
            ],
            true,
        ))
        .await
        .unwrap();
    let body = server.seen()[0].json();
    let assistant = &body["messages"][2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant.get("content"), Some(&json!("")), "{assistant}");
    assert_eq!(assistant["tool_calls"][0]["id"], "call_1");
}

/// llama-cpp-python's answer to a request it cannot validate: a 500.
const LLAMA_500: &str = r#"{"error":{"message":"'dict object' has no attribute 'content'","type":"internal_server_error","param":null,"code":null}}"#;

#[tokio::test]
async fn a_5xx_that_repeats_its_body_is_tried_three_times_and_its_text_shown() {
    let server = TestServer::start((0..6).map(|_| Reply::json(500, LLAMA_500)).collect()).await;
    let client = openai(&server.base, None, http(5, 1), permits(1));
    let err = client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap_err();
    assert_eq!(server.seen().len(), 3, "the first attempt and two retries");
    assert_api_error(
        err,
        500,
        &[
            "internal_server_error: 'dict object' has no attribute 'content'",
            "the same error 3 times",
        ],
    );

    // Errors that differ are each allowed their own repeats, within `max-retries`.
    let server = TestServer::start(vec![
        Reply::json(503, "upstream connect error"),
        Reply::json(500, LLAMA_500),
        Reply::json(503, "upstream connect error"),
        Reply::json(500, LLAMA_500),
        Reply::fixture(200, "openai/text.response.json"),
    ])
    .await;
    let client = openai(&server.base, None, http(5, 1), permits(1));
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(server.seen().len(), 5);
}

#[tokio::test]
async fn a_4xx_is_final_except_timeouts_conflicts_and_rate_limits() {
    for status in [400, 404, 413, 422] {
        let server = TestServer::start(vec![
            Reply::json(status, r#"{"error":{"message":"your request"}}"#),
            Reply::fixture(200, "openai/text.response.json"),
        ])
        .await;
        let client = openai(&server.base, None, http(4, 1), permits(1));
        let err = client
            .complete(&request(vec![Message::user_text(HELLO)], false))
            .await
            .unwrap_err();
        assert_api_error(err, status, &["your request"]);
        assert_eq!(server.seen().len(), 1, "{status} must not be retried");
    }
    // 408 (the server gave up waiting), 409 (a conflict with the server's state) and 429
    // (rate limit) say nothing about the request itself: the same request may pass later.
    let server = TestServer::start(vec![
        Reply::json(408, r#"{"error":{"message":"request timeout"}}"#),
        Reply::json(409, r#"{"error":{"message":"conflict"}}"#),
        Reply::fixture(429, "openai/error_429.json").header("retry-after-ms", "1"),
        Reply::fixture(200, "openai/text.response.json"),
    ])
    .await;
    let client = openai(&server.base, None, http(4, 1), permits(1));
    client
        .complete(&request(vec![Message::user_text(HELLO)], false))
        .await
        .unwrap();
    assert_eq!(server.seen().len(), 4);
}

/// Keeps what a provider reports.
#[derive(Default)]
struct Notices(Mutex<Vec<td_llm::RetryNotice>>);

impl td_llm::CallObserver for Notices {
    fn retrying(&self, notice: &td_llm::RetryNotice) {
        self.0.lock().unwrap().push(notice.clone());
    }
}

#[tokio::test]
async fn every_retry_is_reported_with_its_attempt_wait_status_and_cause() {
    let server = TestServer::start(vec![
        Reply::fixture(529, "anthropic/error_529.json"),
        Reply::fixture(429, "anthropic/error_429.json").header("retry-after", "0.2"),
        Reply::fixture(200, "anthropic/text.response.json"),
    ])
    .await;
    let client = configured("anthropic", &server, "");
    let notices = Notices::default();
    client
        .complete_observed(&request(vec![Message::user_text(HELLO)], false), &notices)
        .await
        .unwrap();
    let seen = notices.0.into_inner().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].attempt, 1);
    assert_eq!(seen[0].status, Some(529));
    assert!(
        seen[0].cause.contains("overloaded_error: Overloaded"),
        "{seen:?}"
    );
    assert!(seen[0].wait <= Duration::from_millis(1), "{seen:?}");
    assert_eq!(seen[1].attempt, 2);
    assert_eq!(seen[1].status, Some(429));
    assert_eq!(seen[1].wait, Duration::from_millis(200));

    // A refused connection has no status; its cause says what failed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let client = openai(&base, None, http(1, 1), permits(1));
    let notices = Notices::default();
    client
        .complete_observed(&request(vec![Message::user_text(HELLO)], false), &notices)
        .await
        .unwrap_err();
    let seen = notices.0.into_inner().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].status, None);
    assert!(seen[0].cause.contains(&base), "{seen:?}");
}
