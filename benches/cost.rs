//! `cargo bench --bench cost`: what Anthropic prompt caching saves a long loop.
//!
//! A `code` loop (its real system prompt and tool definitions, its real tools on a scratch
//! worktree) runs 10 iterations of 5 model turns through the real engine and the real
//! Anthropic client, against a server on 127.0.0.1 that speaks the Messages API and plays
//! the model: turns 1–4 make realistic tool calls (`read_file`, `grep`, `write_file`, then
//! `read_file` and `glob` together; each result a few hundred bytes), turn 5 ends the
//! iteration without a call; the validation command fails, so its note joins the next
//! iteration's first message. The loop runs twice in the same process: with prompt caching
//! (the default) and with `prompt-cache: off`.
//!
//! From the request bodies the server received, billed input is computed under Anthropic's
//! published caching rules (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching):
//! - the cache is keyed on the exact prefix, in the order tools, system, messages, up to a
//!   block that carries `cache_control`; a request reads the longest prefix that an earlier
//!   request wrote, checking each of its breakpoints and the 20 blocks before each;
//! - a hit costs 0.1x the base input price, the part from the hit to the last breakpoint is
//!   written at 1.25x, what follows the last breakpoint costs 1x; entries live 5 minutes
//!   after their last use (the bench takes seconds);
//! - a prefix shorter than 1,024 tokens (Sonnet and Opus; Haiku's minimum is 2,048) is not
//!   cached: its breakpoint is ignored;
//! - tokens are approximated as bytes / 4 (rounded up) of each block's JSON as sent, without
//!   its `cache_control`; the few bytes outside the blocks (`model`, `max_tokens`) are left
//!   out on both sides.
//!
//! Also measured, on the cached run: the share of each request's bytes (the same
//! concatenation of blocks) that is a byte-identical prefix of the request before it — for a
//! turn after an iteration's first, the previous turn's request; for an iteration's first,
//! the previous iteration's first.
//!
//! Targets: billed input with caching / without ≤ 0.3; identical prefix ≥ 95% for every
//! request after an iteration's first.

mod common;

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Report;
use common::actors::{print_machine, unlimited_runtime};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use td_engine::transcript::NoTranscript;
use td_engine::{EngineConfig, LoopEnd, prompt};
use td_llm::anthropic::{AnthropicClient, AnthropicSettings};
use td_llm::endpoint::EndpointSettings;
use td_llm::http::{ApiKey, HttpSettings};
use td_protocol::events::EventLog;
use td_runtime::loop_actor::LoopSpec;
use td_toolkit::catalog::default_tool_set;
use td_toolkit::context::LoopCommands;

const ITERATIONS: u32 = 10;
const TURNS: usize = 5;
const TASK: &str = "Add a `subtract` function to src/lib.rs next to `add`, with a doc \
comment and a unit test, and keep the crate's style (see NOTES.md).";
/// Anthropic's minimum cacheable prompt for Sonnet and Opus, in tokens.
const MIN_CACHEABLE_TOKENS: u64 = 1024;
/// How many blocks before a breakpoint the API checks for an earlier entry.
const LOOKBACK_BLOCKS: usize = 20;
const CACHE_TTL: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------
// The model: a server that answers the Messages API with a script of tool calls.
// ---------------------------------------------------------------------------------------

/// The reply to the request of `turn` (1-based) in iteration `iteration` (1-based).
fn model_reply(iteration: u64, turn: usize, ids: &AtomicU64) -> Value {
    let id = || format!("toolu_{:04}", ids.fetch_add(1, Ordering::Relaxed));
    let (text, calls): (String, Vec<Value>) = match turn {
        1 => (
            "I'll start by reading the library and the notes.".into(),
            vec![json!({"type": "tool_use", "id": id(), "name": "read_file",
                        "input": {"path": "src/lib.rs"}})],
        ),
        2 => (
            "Let me see where `add` is used.".into(),
            vec![json!({"type": "tool_use", "id": id(), "name": "grep",
                        "input": {"pattern": "add\\(", "path": "."}})],
        ),
        3 => (
            "Writing down the plan for this iteration.".into(),
            vec![json!({"type": "tool_use", "id": id(), "name": "write_file",
                        "input": {"path": format!("plan/iteration-{iteration}.md"),
                                  "content": format!(
                                      "# Iteration {iteration}\n\n1. Add `subtract(a, b)` \
                                       beside `add`.\n2. Document it like `add`.\n3. Test \
                                       it with 5 - 3 == 2 and 0 - 0 == 0.\n4. Run the \
                                       validation command.\n")}})],
        ),
        4 => (
            "Checking the notes and the other sources.".into(),
            vec![
                json!({"type": "tool_use", "id": id(), "name": "read_file",
                       "input": {"path": "NOTES.md"}}),
                json!({"type": "tool_use", "id": id(), "name": "glob",
                       "input": {"pattern": "**/*.rs"}}),
            ],
        ),
        _ => (
            format!(
                "Iteration {iteration}: I read the code and wrote the plan; the next step is \
                 the edit itself."
            ),
            Vec::new(),
        ),
    };
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(calls);
    json!({
        "id": format!("msg_{iteration}_{turn}"),
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop,
        "usage": {"input_tokens": 0, "output_tokens": 60}
    })
}

/// The request bodies received, in order.
type Bodies = Arc<Mutex<Vec<Vec<u8>>>>;

/// What the server counts: tool-call ids given out and iterations begun.
#[derive(Default)]
struct Counters {
    ids: AtomicU64,
    iterations: AtomicU64,
}

async fn serve(mut stream: TcpStream, bodies: Bodies, counters: Arc<Counters>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let request: Value = serde_json::from_slice(&body).expect("request body is JSON");
    // A request of turn t holds 1 + 2 (t - 1) messages; a one-message request begins an
    // iteration.
    let messages = request["messages"].as_array().map_or(0, Vec::len);
    let turn = messages.div_ceil(2).max(1);
    if turn == 1 {
        counters.iterations.fetch_add(1, Ordering::Relaxed);
    }
    let iteration = counters.iterations.load(Ordering::Relaxed);
    bodies.lock().expect("bodies").push(body);
    let reply = model_reply(iteration, turn, &counters.ids).to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reply.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Starts the model server; returns its base URL and what it receives.
async fn start_server() -> (String, Bodies) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let bodies: Bodies = Arc::default();
    let counters = Arc::new(Counters::default());
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, kept.clone(), counters.clone()));
        }
    });
    (base, bodies)
}

// ---------------------------------------------------------------------------------------
// The loop.
// ---------------------------------------------------------------------------------------

fn seed_worktree(wt: &Path) {
    std::fs::create_dir_all(wt.join("src")).expect("worktree");
    std::fs::write(
        wt.join("src/lib.rs"),
        "//! Small arithmetic helpers used by the examples.\n\n\
         /// Adds two numbers; wraps around on overflow like the rest of the crate.\n\
         pub fn add(a: u32, b: u32) -> u32 {\n    a.wrapping_add(b)\n}\n\n\
         /// Multiplies two numbers (wrapping).\n\
         pub fn mul(a: u32, b: u32) -> u32 {\n    a.wrapping_mul(b)\n}\n\n\
         #[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn add_adds() {\n\
                 assert_eq!(add(2, 3), 5);\n        assert_eq!(add(u32::MAX, 1), 0);\n    }\n}\n",
    )
    .expect("seed");
    std::fs::write(
        wt.join("src/main.rs"),
        "fn main() {\n    let total = demo::add(2, 3);\n    println!(\"2 + 3 = {total}\");\n    \
         println!(\"2 * 3 = {}\", demo::mul(2, 3));\n    println!(\"add again: {}\", \
         demo::add(total, 1));\n}\n",
    )
    .expect("seed");
    std::fs::write(
        wt.join("NOTES.md"),
        "# Notes\n\nEvery public function has a one-line doc comment saying what it does and \
         how it treats overflow. Arithmetic wraps (`wrapping_*`), never panics. Each function \
         has a test in the `tests` module of its file, named `<function>_<verb>s`. Keep the \
         functions in the order add, subtract, mul, div.\n",
    )
    .expect("seed");
}

/// Runs the loop against a fresh server with caching `on`; returns the request bodies sent.
async fn run_loop(on: bool) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let wt = dir.path().canonicalize().expect("canonical").join("solo");
    seed_worktree(&wt);
    let (base, bodies) = start_server().await;
    let llm = AnthropicClient::new(
        AnthropicSettings {
            endpoint: EndpointSettings::new(base, "claude-sonnet-4-5"),
            max_tokens: 8192,
            api_key: ApiKey::new("sk-ant-bench-key", "bench").expect("key"),
        },
        HttpSettings::default(),
        Arc::new(Semaphore::new(4)),
    )
    .expect("client")
    .with_prompt_cache(on);
    let events = Arc::new(EventLog::new());
    let mut rt = unlimited_runtime(false, events.clone()).await;
    let ctx = rt
        .context(&wt, "solo")
        .expect("context")
        .with_commands(LoopCommands {
            validate: Some("test -f DONE".into()),
            ..LoopCommands::default()
        });
    let names = default_tool_set("code").expect("code is a built-in loop type");
    let spec = LoopSpec {
        config: EngineConfig {
            name: "solo".into(),
            loop_type: "code".into(),
            task: TASK.into(),
            max_iterations: ITERATIONS,
            max_turns: 80,
            iteration_timeout: None,
            success_code: 0,
            system_template: prompt::DEFAULT_SYSTEM.into(),
            iteration_template: prompt::DEFAULT_ITERATION.into(),
            peers: vec!["docs".into(), "client".into()],
            first_iteration: 1,
        },
        ctx: Arc::new(ctx),
        tools: Arc::new(td_tools::tool_set(&names).expect("built-in tools")),
        validation_tools: Arc::new(td_tools::tool_set(&["validate"]).expect("built-in tools")),
        llm: Arc::new(llm),
        budgets: td_engine::budget::Budgets::unlimited(),
        runner: Arc::new(rt.lanes.clone()),
        coordinator: rt.coordinator.clone(),
        events,
        transcript: Arc::new(NoTranscript),
        receipts: None,
        subscriptions: Some(Vec::new()),
        ended: None,
        gate: None,
        initial_inbox: Vec::new(),
        initial_progress: Vec::new(),
        announced: false,
    };
    rt.spawn_loop(spec).await.expect("spawn");
    rt.release().await;
    let ends = rt.wait_for(&["solo"], Duration::from_secs(600)).await;
    match ends.get("solo") {
        Some(LoopEnd::Failed { iterations, .. }) if *iterations == ITERATIONS => {}
        other => panic!("the loop should fail after {ITERATIONS} iterations: {other:?}"),
    }
    rt.shutdown().await;
    let sent = bodies.lock().expect("bodies").clone();
    assert_eq!(
        sent.len(),
        ITERATIONS as usize * TURNS,
        "requests sent (caching {on})"
    );
    sent
}

// ---------------------------------------------------------------------------------------
// Billing under Anthropic's caching rules.
// ---------------------------------------------------------------------------------------

/// One block of a request in cache order, as bytes without its `cache_control`.
struct Segment {
    bytes: String,
    breakpoint: bool,
}

fn segments(body: &[u8]) -> Vec<Segment> {
    let v: Value = serde_json::from_slice(body).expect("JSON body");
    let mut out = Vec::new();
    let mut push = |prefix: &str, block: &Value| {
        let mut block = block.clone();
        let breakpoint = block
            .as_object_mut()
            .is_some_and(|o| o.remove("cache_control").is_some());
        out.push(Segment {
            bytes: format!("{prefix}{block}"),
            breakpoint,
        });
    };
    for tool in v["tools"].as_array().into_iter().flatten() {
        push("tool:", tool);
    }
    match &v["system"] {
        Value::String(s) => push("system:", &json!({"type": "text", "text": s})),
        Value::Array(blocks) => blocks.iter().for_each(|b| push("system:", b)),
        _ => {}
    }
    for m in v["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("?");
        for block in m["content"].as_array().into_iter().flatten() {
            push(&format!("{role}:"), block);
        }
    }
    out
}

fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// Billed input of one request sequence, in tokens, split as Anthropic bills it.
#[derive(Debug, Default, Clone, Copy)]
struct Bill {
    uncached: u64,
    written: u64,
    read: u64,
}

impl Bill {
    /// In base-price tokens: 1x, 1.25x, 0.1x.
    fn billed(&self) -> f64 {
        self.uncached as f64 + 1.25 * self.written as f64 + 0.1 * self.read as f64
    }
}

/// Bills `requests` in order with one cache shared by all of them.
fn bill(requests: &[Vec<u8>]) -> Bill {
    let mut cache: HashMap<u64, Instant> = HashMap::new();
    let mut total = Bill::default();
    for body in requests {
        let segs = segments(body);
        // Cumulative tokens and prefix hashes after each block.
        let mut cum = Vec::with_capacity(segs.len());
        let mut hashes = Vec::with_capacity(segs.len());
        let mut hasher = DefaultHasher::new();
        let mut sum = 0u64;
        for s in &segs {
            s.bytes.hash(&mut hasher);
            hashes.push(hasher.finish());
            sum += tokens(s.bytes.len());
            cum.push(sum);
        }
        let now = Instant::now();
        cache.retain(|_, at| now.duration_since(*at) < CACHE_TTL);
        // Breakpoints whose prefix is long enough to be cached at all.
        let points: Vec<usize> = (0..segs.len())
            .filter(|&i| segs[i].breakpoint && cum[i] >= MIN_CACHEABLE_TOKENS)
            .collect();
        // The longest prefix cached before: at a breakpoint or up to 20 blocks before one.
        let hit = points
            .iter()
            .flat_map(|&b| (b.saturating_sub(LOOKBACK_BLOCKS)..=b).rev())
            .filter(|&i| cache.contains_key(&hashes[i]))
            .max();
        let read = hit.map_or(0, |i| cum[i]);
        let last = points.last().copied();
        let written = match (last, hit) {
            (Some(l), Some(h)) if l > h => cum[l] - cum[h],
            (Some(l), None) => cum[l],
            _ => 0,
        };
        if let Some(h) = hit {
            cache.insert(hashes[h], now);
        }
        for &b in &points {
            if hit.is_none_or(|h| b > h) {
                cache.insert(hashes[b], now);
            }
        }
        total.read += read;
        total.written += written;
        total.uncached += sum - read - written;
    }
    total
}

/// The bytes of a request in cache order (the blocks concatenated).
fn stream(body: &[u8]) -> String {
    segments(body).into_iter().map(|s| s.bytes).collect()
}

/// The share (0–1) of `b` that is a byte-identical prefix of `a`.
fn shared_prefix(a: &str, b: &str) -> f64 {
    let same = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    same as f64 / b.len().max(1) as f64
}

fn main() {
    print_machine("cost");
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let cached = rt.block_on(run_loop(true));
    let uncached = rt.block_on(run_loop(false));

    let first: Value = serde_json::from_slice(&cached[0]).expect("JSON");
    let tool_bytes = serde_json::to_string(&first["tools"]).map_or(0, |s| s.len());
    let system_bytes = serde_json::to_string(&first["system"]).map_or(0, |s| s.len());
    let request_bytes: Vec<usize> = cached.iter().map(Vec::len).collect();
    println!(
        "# {} requests per run; tool definitions {tool_bytes} B, system prompt {system_bytes} B; \
         requests {}–{} B",
        cached.len(),
        request_bytes.iter().min().unwrap_or(&0),
        request_bytes.iter().max().unwrap_or(&0)
    );

    let on = bill(&cached);
    let off = bill(&uncached);
    let mut report = Report::new("cost");
    let ratio = on.billed() / off.billed();
    report.row(
        "billed input tokens, caching on vs off",
        "tokens",
        on.billed(),
        Some(off.billed()),
        "ratio <= 0.3",
        Some(ratio <= 0.3),
    );
    report.row(
        "caching on: tokens read from the cache",
        "tokens",
        on.read as f64,
        None,
        "(reported)",
        None,
    );
    report.row(
        "caching on: tokens written to the cache",
        "tokens",
        on.written as f64,
        None,
        "(reported)",
        None,
    );
    report.row(
        "caching on: tokens billed uncached",
        "tokens",
        on.uncached as f64,
        None,
        "(reported)",
        None,
    );
    report.row(
        "caching off: cache reads + writes (must be 0)",
        "tokens",
        (off.read + off.written) as f64,
        None,
        "== 0",
        Some(off.read + off.written == 0),
    );

    let streams: Vec<String> = cached.iter().map(|b| stream(b)).collect();
    let mut later_turns = Vec::new();
    let mut iteration_firsts = Vec::new();
    // Requests after an iteration's first that begin with every byte of the one before:
    // nothing sent earlier changed, the request only grew.
    let mut whole = 0usize;
    for (i, s) in streams.iter().enumerate() {
        if i % TURNS != 0 {
            whole += usize::from(s.starts_with(streams[i - 1].as_str()));
            later_turns.push(shared_prefix(&streams[i - 1], s));
        } else if i >= TURNS {
            iteration_firsts.push(shared_prefix(&streams[i - TURNS], s));
        }
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min) * 100.0;
    let later = min(&later_turns);
    report.row(
        "identical prefix, turns 2-5 vs previous turn (min)",
        "%",
        later,
        None,
        ">= 95",
        Some(later >= 95.0),
    );
    report.row(
        "turns 2-5 that begin with all of the previous request",
        "requests",
        whole as f64,
        Some(later_turns.len() as f64),
        "all",
        Some(whole == later_turns.len()),
    );
    report.row(
        "identical prefix, iteration's first vs previous iteration's first (min)",
        "%",
        min(&iteration_firsts),
        None,
        "(reported)",
        None,
    );
    report.finish();
}
