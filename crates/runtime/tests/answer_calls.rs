//! Tool calls a loop makes while answering another loop's question take the same path as
//! its own calls: they run in the tool lanes (under the lanes' limits) and leave receipts in
//! the answering loop's receipt log.
//!
//! Real actors (runtime, coordinator, loop actor, lanes); the answering loop's model is a
//! stub that makes one call of a read-only probe tool, then answers with what it read. The
//! probe blocks until the test lets it go, so the test can look at the lanes while it runs.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use td_llm::{Block, LlmClient, LlmError, LlmRequest, LlmResponse, Purpose, StopReason, ToolCall};
use td_protocol::events::EventLog;
use td_runtime::coordinator::CoordinatorPort;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::tool_lanes::LaneSizes;
use td_toolkit::call_path::ToolJob;
use td_toolkit::catalog::Lane;
use td_toolkit::context::ToolContext;
use td_toolkit::coordination::Coordination;
use td_toolkit::error::ToolResult;
use td_toolkit::receipts::{Receipt, ReceiptLog};
use td_toolkit::registry::ToolSet;
use td_toolkit::tool::{Tool, ToolOutput};

mod common;

/// Failure guard: nothing here should take more than a moment.
const GUARD: Duration = Duration::from_secs(20);

/// A read-only tool (no catalog entry, so it runs in the no-net lane) that counts its starts
/// and waits for a permit before it answers.
struct Peek {
    started: Arc<AtomicUsize>,
    permits: Arc<Semaphore>,
}

#[async_trait]
impl Tool for Peek {
    fn name(&self) -> &'static str {
        "peek"
    }
    fn description(&self) -> &'static str {
        "Looks at something (test tool)."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "additionalProperties": false})
    }
    fn read_only(&self) -> bool {
        true
    }
    async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
        self.started.fetch_add(1, Ordering::SeqCst);
        // A closed semaphore would mean the test ended; answer anyway.
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
        Ok(ToolOutput::text("peeked"))
    }
}

/// The answering loop's model: calls `peek` once, then answers with the result it got.
struct PeekThenAnswer;

#[async_trait]
impl LlmClient for PeekThenAnswer {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        if !matches!(request.purpose, Purpose::QueryAnswer { .. }) {
            return Err(LlmError::Script("this model only answers questions".into()));
        }
        let result = request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .find_map(|b| match b {
                Block::ToolResult { content, .. } => Some(content.clone()),
                _ => None,
            });
        Ok(match result {
            None => LlmResponse {
                text: None,
                tool_calls: vec![ToolCall {
                    id: "answer-call-1".into(),
                    name: "peek".into(),
                    input: json!({}).into(),
                }],
                stop_reason: StopReason::ToolUse,
                usage: Default::default(),
            },
            Some(seen) => LlmResponse {
                text: Some(format!("I saw: {seen}")),
                tool_calls: Vec::new(),
                stop_reason: StopReason::EndTurn,
                usage: Default::default(),
            },
        })
    }
}

fn read_receipts(path: &Path) -> Vec<Receipt> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !cond().await {
        assert!(started.elapsed() < GUARD, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_time_calls_wait_for_a_lane_worker_and_leave_receipts() {
    let dir = tempfile::tempdir().unwrap();
    let worktree = dir.path().join("b");
    std::fs::create_dir_all(&worktree).unwrap();
    let events = Arc::new(EventLog::in_memory());
    let config = RuntimeConfig {
        lanes: LaneSizes {
            no_net: 1,
            net: 1,
            heavy: 1,
        },
        watch_files: false,
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::start(config, events.clone()).await.unwrap();

    let started = Arc::new(AtomicUsize::new(0));
    let permits = Arc::new(Semaphore::new(0));
    let peek: Arc<dyn Tool> = Arc::new(Peek {
        started: started.clone(),
        permits: permits.clone(),
    });
    let tools = Arc::new(ToolSet::from_tools(vec![peek]).unwrap());
    let ctx = Arc::new(rt.context(&worktree, "b").unwrap());
    let log_path = dir.path().join("b-receipts.jsonl");
    let receipts = Arc::new(ReceiptLog::open(&log_path).unwrap());
    let mut spec = common::loop_spec(
        &rt,
        &events,
        ctx.clone(),
        "b",
        tools.clone(),
        Arc::new(PeekThenAnswer),
    );
    spec.config.task = "Knows what peek shows".into();
    spec.receipts = Some(receipts);
    // The run's gate is never opened: loop `b` only answers.
    rt.spawn_loop(spec).await.unwrap();
    rt.flush().await;

    // The no-net lane's only worker is busy with a call of b's own.
    let own = tokio::spawn({
        let lanes = rt.lanes.clone();
        let (ctx, tools) = (ctx.clone(), tools.clone());
        async move {
            let job = ToolJob {
                ctx,
                tools,
                call_id: Some("own-call".into()),
                name: "peek".into(),
                input: json!({}).into(),
            };
            lanes.run(Lane::NoNet, job).await
        }
    });
    until("b's own call to take the worker", async || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;

    let port = CoordinatorPort::new(rt.coordinator.clone());
    let asked = tokio::spawn(async move {
        port.query(&"a".into(), "b", "What does peek show?", GUARD)
            .await
    });
    // The answer's call waits for the worker, like any call of b's.
    until(
        "the answer's call to queue in the no-net lane",
        async || {
            rt.lanes
                .load(Lane::NoNet)
                .await
                .is_some_and(|l| l.busy == 1 && l.queued == 1)
        },
    )
    .await;
    assert_eq!(started.load(Ordering::SeqCst), 1, "it ran beside the lane");

    permits.add_permits(1);
    until("the answer's call to start in the worker", async || {
        started.load(Ordering::SeqCst) == 2
    })
    .await;
    let load = rt.lanes.load(Lane::NoNet).await.unwrap();
    assert_eq!((load.busy, load.queued), (1, 0), "{load:?}");
    permits.add_permits(1);

    let answer = tokio::time::timeout(GUARD, asked).await.unwrap().unwrap();
    assert_eq!(answer.unwrap(), "I saw: peeked");
    let own = tokio::time::timeout(GUARD, own).await.unwrap().unwrap();
    assert_eq!(own.content, "peeked");

    // The answer's call left its receipt in b's log (b's own call above was made straight
    // through the lanes, as a test, so it has none).
    let receipts = read_receipts(&log_path);
    let answer_receipts: Vec<&Receipt> = receipts
        .iter()
        .filter(|r| r.call_id.as_deref() == Some("answer-call-1"))
        .collect();
    assert_eq!(answer_receipts.len(), 1, "{receipts:#?}");
    let r = answer_receipts[0];
    assert_eq!((r.tool.as_ref(), &*r.exec_id), ("peek", "b"));
    assert!(!r.is_error, "{r:?}");
    assert_eq!(r.schema_valid, Some(true));
    rt.shutdown().await;
}
