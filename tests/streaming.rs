//! Streamed replies (server-sent events) of both network providers against a server each
//! test starts on 127.0.0.1, which writes its replies in pieces with pauses between them:
//! tool-call deltas split across network chunks (multi-byte characters cut in two), calls
//! interleaved by index, usage in the last chunk, a server that stalls mid-stream (the idle
//! timeout), failures before the first byte (retried), errors inside the stream (not
//! retried), and servers that do not stream (served without it, and remembered).
//!
//! The server is written here rather than reusing td-http's canned server: that one does
//! not read request bodies, and these tests check what each request asked for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use td_llm::anthropic::{AnthropicClient, AnthropicSettings};
use td_llm::config::{LlmConfig, build_client_with_env};
use td_llm::endpoint::EndpointSettings;
use td_llm::http::{ApiKey, HttpSettings};
use td_llm::openai::{OpenAiClient, OpenAiSettings};
use td_llm::stream::{StreamMode, StreamSettings};
use td_llm::{
    CallObserver, LlmClient, LlmError, LlmRequest, Message, Purpose, RetryNotice, StopReason,
    ToolCall, Usage,
};

// ---------------------------------------------------------------------------------------
// The server: one scripted reply per request, written piece by piece.
// ---------------------------------------------------------------------------------------

/// One scripted reply: a status, a content type, and the body in pieces, each written
/// after its pause. Without a content length: the body ends when the connection closes.
#[derive(Clone)]
struct Reply {
    status: u16,
    content_type: &'static str,
    /// Before the status line.
    head_delay: Duration,
    pieces: Vec<(Duration, Vec<u8>)>,
}

impl Reply {
    fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            content_type: "application/json",
            head_delay: Duration::ZERO,
            pieces: vec![(Duration::ZERO, body.to_string().into_bytes())],
        }
    }

    /// `text` as an event stream cut into pieces of `size` bytes (which cut multi-byte
    /// characters), `pause` apart.
    fn sse(text: &str, size: usize, pause: Duration) -> Self {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            head_delay: Duration::ZERO,
            pieces: text
                .as_bytes()
                .chunks(size)
                .map(|c| (pause, c.to_vec()))
                .collect(),
        }
    }

    /// Then stalls for `pause` before writing `rest`.
    fn then_stall(mut self, pause: Duration, rest: &str) -> Self {
        self.pieces.push((pause, rest.as_bytes().to_vec()));
        self
    }

    fn head_delay(mut self, delay: Duration) -> Self {
        self.head_delay = delay;
        self
    }
}

struct Server {
    base: String,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    bodies: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (r, b) = (replies.clone(), bodies.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, r.clone(), b.clone()));
            }
        });
        Server {
            base,
            replies,
            bodies,
            task,
        }
    }

    /// The request bodies received, in order.
    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    fn unused(&self) -> usize {
        self.replies.lock().unwrap().len()
    }
}

async fn serve(
    mut stream: TcpStream,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    bodies: Arc<Mutex<Vec<Value>>>,
) {
    let _ = stream.set_nodelay(true);
    let Some(body) = read_body(&mut stream).await else {
        return;
    };
    bodies
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    let reply = replies.lock().unwrap().pop_front().unwrap_or_else(|| {
        Reply::json(
            418,
            json!({"error": {"message": "test server: no reply scripted"}}),
        )
    });
    tokio::time::sleep(reply.head_delay).await;
    let head = format!(
        "HTTP/1.1 {} Scripted\r\ncontent-type: {}\r\nconnection: close\r\n\r\n",
        reply.status, reply.content_type
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    for (pause, piece) in &reply.pieces {
        tokio::time::sleep(*pause).await;
        if stream.write_all(piece).await.is_err() || stream.flush().await.is_err() {
            return;
        }
    }
    let _ = stream.shutdown().await;
}

async fn read_body(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(body)
}

// ---------------------------------------------------------------------------------------
// Clients, observers and the streams' text.
// ---------------------------------------------------------------------------------------

fn http(max_retries: u32, timeout: Duration) -> HttpSettings {
    HttpSettings {
        timeout,
        max_retries,
        retry_base: Duration::from_millis(1),
        ..HttpSettings::default()
    }
}

fn streaming(mode: StreamMode, idle_ms: u64) -> StreamSettings {
    StreamSettings {
        mode,
        idle_timeout: Duration::from_millis(idle_ms),
    }
}

fn anthropic(base: &str, http: HttpSettings, stream: StreamSettings) -> AnthropicClient {
    AnthropicClient::new(
        AnthropicSettings {
            endpoint: EndpointSettings::new(base, "claude-test"),
            max_tokens: 1000,
            api_key: ApiKey::new("sk-ant-stream-test", "test").unwrap(),
        },
        http,
        Arc::new(Semaphore::new(2)),
    )
    .unwrap()
    .with_streaming(stream)
}

fn openai(base: &str, http: HttpSettings, stream: StreamSettings) -> OpenAiClient {
    OpenAiClient::new(
        OpenAiSettings {
            endpoint: EndpointSettings::new(format!("{base}/v1"), "m"),
            max_tokens: None,
            api_key: None,
        },
        http,
        Arc::new(Semaphore::new(2)),
    )
    .unwrap()
    .with_streaming(stream)
}

/// An Anthropic client of `server`: `retries`, a 5 s timeout to the first byte, `mode`
/// with an idle timeout of `idle_ms`.
fn anthropic_of(server: &Server, retries: u32, mode: StreamMode, idle_ms: u64) -> AnthropicClient {
    anthropic(
        &server.base,
        http(retries, Duration::from_secs(5)),
        streaming(mode, idle_ms),
    )
}

/// An OpenAI-compatible client of `server`, set up as [`anthropic_of`] says.
fn openai_of(server: &Server, retries: u32, mode: StreamMode, idle_ms: u64) -> OpenAiClient {
    openai(
        &server.base,
        http(retries, Duration::from_secs(5)),
        streaming(mode, idle_ms),
    )
}

/// Asserts that the first request asked for a stream and the later ones did not: the
/// client remembered that its server does not stream.
fn assert_streamed_once(bodies: &[Value]) {
    assert_eq!(bodies[0]["stream"], json!(true));
    for later in &bodies[1..] {
        assert_eq!(later.get("stream"), None, "remembered: {later}");
        assert_eq!(later.get("stream_options"), None, "{later}");
    }
}

fn request() -> LlmRequest {
    LlmRequest {
        loop_name: "api".into(),
        purpose: Purpose::Iteration,
        system: "sys".into(),
        messages: vec![Message::user_text("write the file")],
        tools: Vec::new().into(),
    }
}

/// Records what a call reported.
#[derive(Default)]
struct Seen {
    growth: Mutex<Vec<u64>>,
    retries: Mutex<Vec<RetryNotice>>,
}

impl CallObserver for Seen {
    fn retrying(&self, notice: &RetryNotice) {
        self.retries.lock().unwrap().push(notice.clone());
    }

    fn output_growing(&self, chars: u64) {
        self.growth.lock().unwrap().push(chars);
    }
}

/// Tool input whose JSON text has escapes, `\u` sequences and multi-byte characters.
const ARGS: &str =
    r#"{"path":"docs/é.md","content":"naïve — 日本語 \"q\" \\ \u00e9\ud83d\ude00 😀\n"}"#;

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// An Anthropic stream: text, then a tool call whose input comes in `pieces`.
fn anthropic_stream(pieces: &[&str]) -> String {
    let mut out = String::new();
    let mut ev = |name: &str, data: Value| out.push_str(&sse(Some(name), &data));
    ev(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null,
        "usage": {"input_tokens": 20, "output_tokens": 1, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 30}}}),
    );
    ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    ev("ping", json!({"type": "ping"}));
    for t in ["Writing ", "the file…"] {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
        );
    }
    ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    ev(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "write_file", "input": {}}}),
    );
    for p in pieces {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}}),
        );
    }
    ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    );
    ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 77}}),
    );
    ev("message_stop", json!({"type": "message_stop"}));
    out
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

/// An OpenAI stream: text, two tool calls whose arguments interleave, usage, [DONE].
fn openai_stream(first: &[&str], second: &[&str]) -> String {
    let mut out = sse(
        None,
        &chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    );
    out.push_str(&sse(
        None,
        &chunk(json!({"content": "Two calls"}), Value::Null),
    ));
    let piece = |index: u64, head: Option<(&str, &str)>, args: &str| {
        let mut call = json!({"index": index, "function": {"arguments": args}});
        if let Some((id, name)) = head {
            call["id"] = json!(id);
            call["type"] = json!("function");
            call["function"]["name"] = json!(name);
        }
        sse(None, &chunk(json!({"tool_calls": [call]}), Value::Null))
    };
    out.push_str(&piece(0, Some(("call_a", "write_file")), ""));
    out.push_str(&piece(1, Some(("call_b", "grep")), ""));
    for i in 0..first.len().max(second.len()) {
        if let Some(p) = first.get(i) {
            out.push_str(&piece(0, None, p));
        }
        if let Some(p) = second.get(i) {
            out.push_str(&piece(1, None, p));
        }
    }
    out.push_str(&sse(None, &chunk(json!({}), json!("tool_calls"))));
    out.push_str(&sse(
        None,
        &json!({"id": "c1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 120, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 100}}}),
    ));
    out.push_str("data: [DONE]\n\n");
    out
}

/// `text` cut into pieces of 1 to 7 bytes (cutting multi-byte characters and escapes),
/// regrouped at character boundaries (a JSON string holds whole characters).
fn cuts(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 1;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
        size = size % 7 + 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Anthropic.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn anthropic_streams_text_and_a_tool_call_split_across_chunks() {
    let pieces = cuts(ARGS);
    assert!(pieces.len() > 20);
    let text = anthropic_stream(&pieces);
    // 5-byte network chunks cut multi-byte characters and events anywhere.
    let server = Server::start(vec![Reply::sse(&text, 5, Duration::from_micros(200))]).await;
    let client = anthropic_of(&server, 0, StreamMode::Auto, 2000);
    let seen = Seen::default();
    let reply = client.complete_observed(&request(), &seen).await.unwrap();
    assert_eq!(reply.text.as_deref(), Some("Writing the file…"));
    assert_eq!(
        reply.tool_calls,
        vec![ToolCall {
            id: "toolu_9".into(),
            name: "write_file".into(),
            input: serde_json::from_str(ARGS).unwrap(),
        }]
    );
    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 20,
            output_tokens: 77,
            cache_read_tokens: 500,
            cache_write_tokens: 30,
            estimated: false,
        }
    );
    let body = &server.bodies()[0];
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body.get("stream_options"), None);
    // Progress grew with each delta, up to every character of text and input.
    let growth = seen.growth.lock().unwrap().clone();
    let total = ("Writing the file…".chars().count() + ARGS.chars().count()) as u64;
    assert!(growth.len() > 20, "{growth:?}");
    assert!(growth.windows(2).all(|w| w[0] < w[1]), "{growth:?}");
    assert_eq!(growth.last(), Some(&total));
}

#[tokio::test]
async fn anthropic_stall_mid_stream_hits_the_idle_timeout_and_is_not_retried() {
    let text = anthropic_stream(&[ARGS]);
    let (head, tail) = text.split_at(text.len() / 2);
    let reply = Reply::sse(head, 4096, Duration::ZERO).then_stall(Duration::from_secs(5), tail);
    let server = Server::start(vec![reply.clone(), reply]).await;
    // Ten seconds for the first byte, 300 ms of silence at most after it.
    let client = anthropic(
        &server.base,
        http(1, Duration::from_secs(10)),
        streaming(StreamMode::On, 300),
    );
    let started = Instant::now();
    let err = client.complete(&request()).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("sent no output for 300 ms")),
        "{err:?}"
    );
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        server.bodies().len(),
        1,
        "a stream that began is not retried"
    );
}

#[tokio::test]
async fn anthropic_failures_before_the_first_byte_are_retried_and_reported() {
    let ok = Reply::sse(&anthropic_stream(&[ARGS]), 64, Duration::ZERO);
    let server = Server::start(vec![
        // Headers later than the 300 ms allowed for the first byte.
        ok.clone().head_delay(Duration::from_secs(3)),
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        ok,
    ])
    .await;
    let client = anthropic(
        &server.base,
        http(2, Duration::from_millis(300)),
        streaming(StreamMode::Auto, 2000),
    );
    let seen = Seen::default();
    let reply = client.complete_observed(&request(), &seen).await.unwrap();
    assert_eq!(reply.tool_calls.len(), 1);
    let retries = seen.retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert_eq!(retries[0].status, None);
    assert!(retries[0].cause.contains("within 300 ms"), "{retries:?}");
    assert_eq!(retries[1].status, Some(529));
    assert!(retries[1].cause.contains("Overloaded"), "{retries:?}");
    assert!(server.bodies().iter().all(|b| b["stream"] == json!(true)));
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_is_the_api_error() {
    let mut text = anthropic_stream(&[])
        .split("event: content_block_stop")
        .next()
        .unwrap()
        .to_string();
    text.push_str(&sse(
        Some("error"),
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let server = Server::start(vec![Reply::sse(&text, 4096, Duration::ZERO)]).await;
    let client = anthropic_of(&server, 3, StreamMode::Auto, 2000);
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Api { status: 529, message } if message.contains("overloaded_error: Overloaded")),
        "{err:?}"
    );
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test]
async fn anthropic_server_answering_json_is_served_and_not_asked_to_stream_again() {
    let whole = json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "plain"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 1}});
    let server = Server::start(vec![
        Reply::json(200, whole.clone()),
        Reply::json(200, whole),
    ])
    .await;
    let client = anthropic_of(&server, 0, StreamMode::Auto, 2000);
    for _ in 0..2 {
        let reply = client.complete(&request()).await.unwrap();
        assert_eq!(reply.text.as_deref(), Some("plain"));
    }
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    assert_streamed_once(&bodies);
}

// ---------------------------------------------------------------------------------------
// OpenAI-compatible.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn openai_streams_interleaved_tool_calls_split_across_chunks_with_usage() {
    let grep_args = r#"{"pattern":"ü+\\d","path":"."}"#;
    let text = openai_stream(&cuts(ARGS), &cuts(grep_args));
    let server = Server::start(vec![Reply::sse(&text, 3, Duration::from_micros(100))]).await;
    let client = openai_of(&server, 0, StreamMode::Auto, 2000);
    let seen = Seen::default();
    let reply = client.complete_observed(&request(), &seen).await.unwrap();
    assert_eq!(reply.text.as_deref(), Some("Two calls"));
    // The same calls as the whole reply with these arguments gives.
    let whole = td_llm::openai::parse_response(&json!({"choices": [{"message": {"content": "Two calls", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "write_file", "arguments": ARGS}},
        {"id": "call_b", "type": "function", "function": {"name": "grep", "arguments": grep_args}}
    ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 100}}}))
    .unwrap();
    assert_eq!(reply, whole);
    assert_eq!(
        *reply.tool_calls[1].input,
        json!({"pattern": "ü+\\d", "path": "."})
    );
    assert_eq!(
        reply.usage,
        Usage {
            input_tokens: 20,
            output_tokens: 40,
            cache_read_tokens: 100,
            cache_write_tokens: 0,
            estimated: false,
        }
    );
    let body = &server.bodies()[0];
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    let growth = seen.growth.lock().unwrap().clone();
    assert_eq!(
        growth.last(),
        Some(&(("Two calls".len() + ARGS.chars().count() + grep_args.chars().count()) as u64))
    );
}

#[tokio::test]
async fn openai_stall_mid_stream_hits_the_idle_timeout() {
    let text = openai_stream(&cuts(ARGS), &[]);
    let (head, tail) = text.split_at(text.len() / 2);
    let server = Server::start(vec![
        Reply::sse(head, 100, Duration::ZERO).then_stall(Duration::from_secs(5), tail),
    ])
    .await;
    let client = openai(
        &server.base,
        http(2, Duration::from_secs(10)),
        streaming(StreamMode::Auto, 250),
    );
    let started = Instant::now();
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("sent no output for 250 ms")),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test]
async fn openai_server_refusing_the_stream_field_is_asked_again_without_it_and_remembered() {
    let refusal = json!({"error": {"message": "Unrecognized request argument supplied: stream_options", "type": "invalid_request_error"}});
    let whole = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "plain"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}});
    let server = Server::start(vec![
        Reply::json(400, refusal.clone()),
        Reply::json(200, whole.clone()),
        Reply::json(200, whole.clone()),
    ])
    .await;
    let client = openai_of(&server, 0, StreamMode::Auto, 2000);
    for _ in 0..2 {
        let reply = client.complete(&request()).await.unwrap();
        assert_eq!(reply.text.as_deref(), Some("plain"));
    }
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 3);
    assert_streamed_once(&bodies);

    // `stream: on` reports the refusal, with what to change.
    let server = Server::start(vec![Reply::json(400, refusal), Reply::json(200, whole)]).await;
    let client = openai_of(&server, 0, StreamMode::On, 2000);
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Api { status: 400, message } if message.contains("set `stream: auto` or `stream: off`")),
        "{err:?}"
    );
    assert_eq!(server.unused(), 1);

    // Another 400 is not taken for a refusal of streaming.
    let server = Server::start(vec![Reply::json(
        400,
        json!({"error": {"message": "max_tokens is too large"}}),
    )])
    .await;
    let client = openai_of(&server, 0, StreamMode::Auto, 2000);
    let err = client.complete(&request()).await.unwrap_err();
    assert!(matches!(&err, LlmError::Api { status: 400, .. }), "{err:?}");
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test]
async fn openai_cut_and_malformed_streams_are_errors_not_panics() {
    let text = openai_stream(&cuts(ARGS), &[]);
    let cut = &text[..text.find("\"tool_calls\"}").unwrap_or(text.len() / 2)];
    let cut = &cut[..cut.rfind("\n\n").unwrap() + 2];
    let server = Server::start(vec![
        Reply::sse(cut, 50, Duration::ZERO),
        Reply::sse("data: {\"choices\": 7}\n\n", 50, Duration::ZERO),
        Reply::sse("data: not json\n\n", 50, Duration::ZERO),
        Reply::sse(&"x".repeat(3 * 1024 * 1024 + 10), 64 * 1024, Duration::ZERO),
    ])
    .await;
    let client = openai(
        &server.base,
        HttpSettings {
            max_body_bytes: 3 * 1024 * 1024,
            ..http(0, Duration::from_secs(5))
        },
        streaming(StreamMode::On, 2000),
    );
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("cut short")),
        "{err:?}"
    );
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::BadReply(m) if m.contains("`choices` that is not a list")),
        "{err:?}"
    );
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::BadReply(m) if m.contains("not JSON")),
        "{err:?}"
    );
    let err = client.complete(&request()).await.unwrap_err();
    assert!(
        matches!(&err, LlmError::BadReply(m) if m.contains("larger than 3145728 bytes")),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_config_streams_by_default_and_stream_off_does_not() {
    let text = openai_stream(&[ARGS], &["{}"]);
    let server = Server::start(vec![
        Reply::sse(&text, 4096, Duration::ZERO),
        Reply::json(
            200,
            json!({"choices": [{"message": {"content": "plain"}, "finish_reason": "stop"}]}),
        ),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = |extra: &str| -> LlmConfig {
        serde_yaml_ng::from_str(&format!(
            "provider: openai\nmodel: m\nbase-url: {}/v1\nmax-retries: 0\n{extra}",
            server.base
        ))
        .unwrap()
    };
    let semaphore = Arc::new(Semaphore::new(1));
    let auto =
        build_client_with_env(&config(""), dir.path(), semaphore.clone(), &|_| None).unwrap();
    let reply = auto.complete(&request()).await.unwrap();
    assert_eq!(reply.tool_calls.len(), 2);
    let off =
        build_client_with_env(&config("stream: off\n"), dir.path(), semaphore, &|_| None).unwrap();
    assert_eq!(
        off.complete(&request()).await.unwrap().text.as_deref(),
        Some("plain")
    );
    let bodies = server.bodies();
    assert_streamed_once(&bodies);
}

// ---------------------------------------------------------------------------------------
// Streams without usage, keep-alives without output, the retry policy before the stream.
// ---------------------------------------------------------------------------------------

/// An OpenAI stream as llama-cpp-python 0.3.36 sends it: no usage chunk, even when asked.
fn openai_stream_without_usage(text: &str) -> String {
    let mut out = sse(
        None,
        &chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    );
    out.push_str(&sse(None, &chunk(json!({"content": text}), Value::Null)));
    out.push_str(&sse(None, &chunk(json!({}), json!("stop"))));
    out.push_str("data: [DONE]\n\n");
    out
}

/// The usage estimated for a request the server saw as `seen` (stream fields removed) and
/// `chars` characters of output: bytes / 4 and chars / 4, rounded up, marked estimated.
fn estimate(seen: &Value, chars: u64) -> Usage {
    let mut body = seen.clone();
    let fields = body.as_object_mut().unwrap();
    fields.remove("stream");
    fields.remove("stream_options");
    Usage {
        input_tokens: (body.to_string().len() as u64).div_ceil(4),
        output_tokens: chars.div_ceil(4),
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        estimated: true,
    }
}

#[tokio::test]
async fn auto_estimates_a_stream_without_usage_and_then_asks_for_whole_replies() {
    let text = "Seventeen chars!!";
    let whole = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2}});
    let server = Server::start(vec![
        Reply::sse(&openai_stream_without_usage(text), 16, Duration::ZERO),
        Reply::json(200, whole),
    ])
    .await;
    let client = openai_of(&server, 0, StreamMode::Auto, 2000);
    let first = client.complete(&request()).await.unwrap();
    assert_eq!(first.text.as_deref(), Some(text));
    let bodies = server.bodies();
    let want = estimate(&bodies[0], text.chars().count() as u64);
    assert_eq!(first.usage, want);
    assert!(want.input_tokens > 0 && want.output_tokens == 5, "{want:?}");
    // Marked in what is recorded, so accounting can tell.
    assert_eq!(
        serde_json::to_value(first.usage).unwrap()["estimated"],
        json!(true)
    );

    let second = client.complete(&request()).await.unwrap();
    assert_eq!(second.text.as_deref(), Some("whole"));
    assert_eq!(second.usage.input_tokens, 30);
    assert!(!second.usage.estimated);
    assert!(
        serde_json::to_value(second.usage)
            .unwrap()
            .get("estimated")
            .is_none()
    );
    let bodies = server.bodies();
    assert_streamed_once(&bodies);
    assert_eq!(server.unused(), 0);
}

#[tokio::test]
async fn stream_on_estimates_every_stream_without_usage_and_keeps_streaming() {
    // An Anthropic-style server whose message_start and message_delta carry no usage.
    let mut text = String::new();
    for (name, data) in [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": []}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "naïve"}}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ] {
        text.push_str(&sse(Some(name), &data));
    }
    let reply = Reply::sse(&text, 7, Duration::ZERO);
    let server = Server::start(vec![reply.clone(), reply]).await;
    let client = anthropic_of(&server, 0, StreamMode::On, 2000);
    for call in 0..2 {
        let got = client.complete(&request()).await.unwrap();
        assert_eq!(got.text.as_deref(), Some("naïve"));
        let bodies = server.bodies();
        assert_eq!(bodies[call]["stream"], json!(true));
        assert_eq!(got.usage, estimate(&bodies[call], 5), "call {call}");
    }
}

#[tokio::test]
async fn keep_alives_without_output_do_not_hold_a_stream_open() {
    // Both APIs' keep-alives, every 50 ms for 6 s after the stream began: an Anthropic
    // `ping` event, an OpenAI-style comment line.
    let anthropic_start = sse(
        Some("message_start"),
        &json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
    );
    let ping = sse(Some("ping"), &json!({"type": "ping"}));
    let openai_start = sse(
        None,
        &chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    );
    let pinging = |start: &str, ping: &str| Reply {
        pieces: std::iter::once((Duration::ZERO, start.as_bytes().to_vec()))
            .chain((0..120).map(|_| (Duration::from_millis(50), ping.as_bytes().to_vec())))
            .collect(),
        ..Reply::sse("", 1, Duration::ZERO)
    };
    let server = Server::start(vec![
        pinging(&anthropic_start, &ping),
        pinging(&openai_start, ": keep-alive\n\n"),
    ])
    .await;
    let started = Instant::now();
    let err = anthropic_of(&server, 2, StreamMode::On, 400)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("sent no output for 400 ms") && m.contains("keep-alives do not count")),
        "{err:?}"
    );
    let err = openai_of(&server, 2, StreamMode::Auto, 400)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("sent no output for 400 ms")),
        "{err:?}"
    );
    // Each gave up after its 400 ms of pings, not after the 6 s the pings went on for.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        server.bodies().len(),
        2,
        "a stream that began is not retried"
    );
}

#[tokio::test]
async fn output_that_keeps_coming_outlasts_the_idle_timeout() {
    // 1.2 s of text in pieces 100 ms apart, against a 300 ms idle timeout.
    let mut text = sse(
        None,
        &chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    );
    let mut reply = Reply::sse(&text, 4096, Duration::ZERO);
    for _ in 0..12 {
        text = sse(None, &chunk(json!({"content": "ab"}), Value::Null));
        reply
            .pieces
            .push((Duration::from_millis(100), text.into_bytes()));
    }
    let end = format!(
        "{}data: [DONE]\n\n",
        sse(
            None,
            &json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 12}})
        )
    );
    reply.pieces.push((Duration::ZERO, end.into_bytes()));
    let server = Server::start(vec![reply]).await;
    let got = openai_of(&server, 0, StreamMode::On, 300)
        .complete(&request())
        .await
        .unwrap();
    assert_eq!(got.text.as_deref(), Some(&*"ab".repeat(12)));
    assert_eq!(got.usage.output_tokens, 12);
    assert!(!got.usage.estimated);
}

#[tokio::test]
async fn a_streaming_request_follows_the_one_retry_policy() {
    let same = json!({"error": {"message": "Model crashed on this prompt", "type": "internal_server_error"}});
    let server = Server::start(vec![
        Reply::json(500, same.clone()),
        Reply::json(500, same.clone()),
        Reply::json(500, same),
        Reply::json(200, json!({"unused": true})),
    ])
    .await;
    let client = openai_of(&server, 5, StreamMode::On, 2000);
    let seen = Seen::default();
    let err = client
        .complete_observed(&request(), &seen)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::Api { status: 500, message }
            if message.contains("Model crashed on this prompt") && message.contains("same error 3 times")),
        "{err:?}"
    );
    assert_eq!(
        server.bodies().len(),
        3,
        "the same 5xx is taken 3 times at most"
    );
    let retries = seen.retries.lock().unwrap().clone();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries.iter().all(|r| r.status == Some(500)));

    // A 4xx that does not name `stream` is final at once, streamed or not.
    let server = Server::start(vec![Reply::json(
        400,
        json!({"error": {"message": "max_tokens is too large"}}),
    )])
    .await;
    let seen = Seen::default();
    let err = openai_of(&server, 5, StreamMode::Auto, 2000)
        .complete_observed(&request(), &seen)
        .await
        .unwrap_err();
    assert!(matches!(&err, LlmError::Api { status: 400, .. }), "{err:?}");
    assert_eq!(server.bodies().len(), 1);
    assert!(seen.retries.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_event_stream_closed_before_its_first_event_is_served_without_streaming() {
    // llama-cpp-python 0.3 (chatml-function-calling) answers a streamed request with tools
    // by a 200 event stream that closes at once.
    let empty = Reply::sse("", 1, Duration::ZERO);
    let whole = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2}});
    let server = Server::start(vec![
        empty.clone(),
        Reply::json(200, whole.clone()),
        Reply::json(200, whole),
    ])
    .await;
    let client = openai_of(&server, 4, StreamMode::Auto, 2000);
    let seen = Seen::default();
    for _ in 0..2 {
        let got = client.complete_observed(&request(), &seen).await.unwrap();
        assert_eq!(got.text.as_deref(), Some("whole"));
        assert_eq!(got.usage.input_tokens, 30);
    }
    let bodies = server.bodies();
    assert_eq!(bodies.len(), 3, "not retried as a stream: {bodies:?}");
    assert_streamed_once(&bodies);
    assert!(seen.retries.lock().unwrap().is_empty());

    // `on` says what happened and what to set.
    let server = Server::start(vec![empty]).await;
    let err = openai_of(&server, 4, StreamMode::On, 2000)
        .complete(&request())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LlmError::Transport(m) if m.contains("before its first event") && m.contains("stream: auto")),
        "{err:?}"
    );
    assert_eq!(server.bodies().len(), 1);
}
