//! A loop actor that panics is restarted by the daemon and goes on at its next iteration,
//! up to [`MAX_LOOP_RESTARTS`] times; each restart is a `loop_restarted` event. Past the
//! limit the loop fails with the panic's message.
//!
//! Real actors (runtime, coordinator, loop actor, lanes). The panic comes from the loop's
//! model client, which runs inside the loop actor's engine (not a tool: a panicking tool is
//! caught by the tool registry and becomes an error result).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use td_engine::LoopEnd;
use td_llm::{Block, LlmClient, LlmError, LlmRequest, LlmResponse, StopReason, ToolCall};
use td_protocol::events::{EventKind, EventLog};
use td_runtime::daemon::{MAX_LOOP_RESTARTS, Runtime, RuntimeConfig};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::registry::ToolSet;
use td_toolkit::tool::{Tool, ToolOutput};

mod common;

/// Failure guard: nothing here should take more than a moment.
const GUARD: Duration = Duration::from_secs(20);

/// `complete_task` as the engine knows it: records the summary.
struct Complete;

#[async_trait]
impl Tool for Complete {
    fn name(&self) -> &'static str {
        "complete_task"
    }
    fn description(&self) -> &'static str {
        "Says the task is done (test tool)."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn execute(&self, _input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        ctx.mark_completed("done after a restart");
        Ok(ToolOutput::text("completed"))
    }
}

/// A model client with a bug: its first `panics` calls panic; after that it calls
/// `complete_task` and then ends its turn. With `hold`, its first call after the panics
/// says it started (`hold.0`) and waits for a permit (`hold.1`) before it answers.
struct PanicsFirst {
    panics: u32,
    calls: AtomicU32,
    hold: Option<(Arc<Semaphore>, Arc<Semaphore>)>,
}

#[async_trait]
impl LlmClient for PanicsFirst {
    async fn complete(&self, request: &LlmRequest) -> Result<LlmResponse, LlmError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some((entered, release)) = self.hold.as_ref().filter(|_| call == self.panics) {
            entered.add_permits(1);
            // A closed semaphore would mean the test ended; answer anyway.
            if let Ok(permit) = release.acquire().await {
                permit.forget();
            }
        }
        if call < self.panics {
            panic!("model adapter bug #{call}");
        }
        let answered = request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .any(|b| matches!(b, Block::ToolResult { .. }));
        Ok(if answered {
            LlmResponse {
                text: Some("done".into()),
                tool_calls: Vec::new(),
                stop_reason: StopReason::EndTurn,
                usage: Default::default(),
            }
        } else {
            LlmResponse {
                text: None,
                tool_calls: vec![ToolCall {
                    id: "call-1".into(),
                    name: "complete_task".into(),
                    input: json!({}).into(),
                }],
                stop_reason: StopReason::ToolUse,
                usage: Default::default(),
            }
        })
    }
}

/// Runs loop `p` whose model panics on its first `panics` calls; returns its end and the
/// run's events.
async fn run_panicking(panics: u32) -> (LoopEnd, Vec<EventKind>) {
    run(panics, false).await
}

/// [`run_panicking`]; with `stop_after`, the loop is asked to stop (through the runtime)
/// while its first model call after the panics is under way.
async fn run(panics: u32, stop_after: bool) -> (LoopEnd, Vec<EventKind>) {
    let dir = tempfile::tempdir().unwrap();
    let worktree = dir.path().join("p");
    std::fs::create_dir_all(&worktree).unwrap();
    let events = Arc::new(EventLog::in_memory());
    let config = RuntimeConfig {
        watch_files: false,
        ..RuntimeConfig::default()
    };
    let mut rt = Runtime::start(config, events.clone()).await.unwrap();
    let ctx = Arc::new(rt.context(&worktree, "p").unwrap());
    let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Complete)];
    let (entered, release) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let llm = Arc::new(PanicsFirst {
        panics,
        calls: AtomicU32::new(0),
        hold: stop_after.then(|| (entered.clone(), release.clone())),
    });
    let tools = Arc::new(ToolSet::from_tools(tools).unwrap());
    let mut spec = common::loop_spec(&rt, &events, ctx, "p", tools, llm);
    spec.config.task = "Survive a panic".into();
    spec.config.max_iterations = 10;
    spec.config.max_turns = 4;
    rt.spawn_loop(spec).await.unwrap();
    rt.release().await;
    if stop_after {
        let in_call = tokio::time::timeout(GUARD, entered.acquire()).await;
        assert!(
            matches!(in_call, Ok(Ok(_))),
            "the first model call never began"
        );
        // The model call is never let go: only the stop can end it.
        rt.stop_loop("p")
            .expect("the runtime stops the restarted actor");
    }
    let mut ends = rt.wait_for(&["p"], GUARD).await;
    let end = ends.remove("p").expect("loop p did not end");
    rt.shutdown().await;
    (end, events.events().into_iter().map(|e| e.kind).collect())
}

fn restarts(events: &[EventKind]) -> Vec<(u32, String)> {
    events
        .iter()
        .filter_map(|k| match k {
            EventKind::LoopRestarted {
                loop_name,
                restarts,
                reason,
            } if loop_name == "p" => Some((*restarts, reason.clone())),
            _ => None,
        })
        .collect()
}

fn iterations_started(events: &[EventKind]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|k| match k {
            EventKind::IterationStarted { iteration, .. } => Some(*iteration),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_loop_actor_is_restarted_at_its_next_iteration_and_completes() {
    let (end, events) = run_panicking(1).await;
    assert!(
        matches!(&end, LoopEnd::Completed { iterations: 2, summary: Some(s) } if s == "done after a restart"),
        "{end:?}\n{events:#?}"
    );
    let restarts = restarts(&events);
    assert_eq!(restarts.len(), 1, "{events:#?}");
    assert_eq!(restarts[0].0, 1);
    assert!(
        restarts[0].1.contains("model adapter bug #0"),
        "{restarts:?}"
    );
    // Iteration 1 was cut by the panic; the restarted actor went on with iteration 2.
    assert_eq!(iterations_started(&events), vec![1, 2]);
    // A restart is not a new start: one `loop_started`, no failure.
    let started = events
        .iter()
        .filter(|k| matches!(k, EventKind::LoopStarted { .. }))
        .count();
    assert_eq!(started, 1, "{events:#?}");
    assert!(
        !events
            .iter()
            .any(|k| matches!(k, EventKind::LoopFailed { .. })),
        "{events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_restart_limit_the_loop_fails_with_the_panic_message() {
    let (end, events) = run_panicking(MAX_LOOP_RESTARTS + 1).await;
    let LoopEnd::Failed { reason, .. } = &end else {
        panic!("expected a failure, got {end:?}");
    };
    let last = format!("model adapter bug #{MAX_LOOP_RESTARTS}");
    assert!(reason.contains(&last), "{reason}");
    let counts: Vec<u32> = restarts(&events).into_iter().map(|(n, _)| n).collect();
    assert_eq!(counts, (1..=MAX_LOOP_RESTARTS).collect::<Vec<_>>());
    assert!(
        events
            .iter()
            .any(|k| matches!(k, EventKind::LoopFailed { reason: r, .. } if r.contains(&last))),
        "{events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_loop_is_stopped_through_the_runtime_like_any_other() {
    let (end, events) = run(1, true).await;
    assert!(
        matches!(end, LoopEnd::Stopped { .. }),
        "{end:?}\n{events:#?}"
    );
    assert_eq!(restarts(&events).len(), 1, "{events:#?}");
    // The stop reached the restarted actor in its iteration 2, which ended there.
    assert_eq!(iterations_started(&events), vec![1, 2]);
}
