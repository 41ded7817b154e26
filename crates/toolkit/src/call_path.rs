//! The path of one tool call from a caller that keeps receipts (a loop's iterations and
//! its answers to other loops, `tool exec`, MCP): the route the catalog names, the run
//! through the registry, and the receipt saved. It is the one place that routes a call and
//! the one place that saves its receipt, so that no caller can skip either.
//!
//! - Route ([`Catalog::route`](crate::catalog::Catalog::route), decided once per tool of
//!   the set when the path is made): a lane tool runs in a worker of its lane through the
//!   [`LaneRunner`] (the tool lanes in a run); a coordination tool runs in the caller's task
//!   and talks to the coordinator (it must never hold a worker while it waits for another
//!   loop); a name the set does not have is answered by the registry in the caller's task,
//!   without running anything.
//! - Run: [`ToolSet::call`] (lookup, schema, timeout, panic guard, output cap, receipt),
//!   wherever the route says.
//! - Receipt: appended to the caller's log, if it keeps one. A receipt that cannot be
//!   written is reported with the outcome ([`Called::saved`]); what that means (a loop stops,
//!   a session closes) is the caller's to decide, since the call already ran.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::catalog::{Lane, Route, ToolSpec};
use crate::context::ToolContext;
use crate::receipts::ReceiptLog;
use crate::registry::{CallOutcome, ToolSet};

/// One tool call to run in a worker lane.
#[derive(Debug)]
pub struct ToolJob {
    /// The calling loop's context (worktree, read stamps, catalog).
    pub ctx: Arc<ToolContext>,
    /// The caller's tool set.
    pub tools: Arc<ToolSet>,
    /// The model's id for this call, kept in the receipt.
    pub call_id: Option<String>,
    /// Tool name.
    pub name: String,
    /// The tool's input, as the model gave it (shared with the conversation and the receipt).
    pub input: Arc<Value>,
}

/// Runs calls in worker lanes: the tool lanes of a run (`td_runtime::tool_lanes`), or
/// [`InCallerTask`] where there are none.
#[async_trait]
pub trait LaneRunner: Send + Sync {
    /// Runs `job` in a worker of `lane` and returns its outcome (and receipt), also when it
    /// could not run (the lane stopped, the worker died): every call gets exactly one.
    async fn run(&self, lane: Lane, job: ToolJob) -> CallOutcome;
}

/// Runs "lane" calls in the caller's task, without workers: `tool exec`, MCP and tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct InCallerTask;

#[async_trait]
impl LaneRunner for InCallerTask {
    async fn run(&self, _lane: Lane, job: ToolJob) -> CallOutcome {
        job.tools
            .call(&job.ctx, job.call_id.as_deref(), &job.name, job.input)
            .await
    }
}

/// A receipt that could not be appended to its log.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct ReceiptNotSaved {
    /// The log.
    pub path: PathBuf,
    /// Why the append failed.
    #[source]
    pub source: std::io::Error,
}

/// What a call gave: its outcome, and whether its receipt was saved.
#[derive(Debug)]
pub struct Called {
    /// The outcome the model (or client) sees, with its receipt.
    pub outcome: CallOutcome,
    /// `Err` when the caller keeps receipts and this one could not be written.
    pub saved: Result<(), ReceiptNotSaved>,
}

/// The call path of one caller: its context and tools, the route of each tool, where lane
/// calls run, and where receipts go. Cheap to share (`Arc`): a loop's iterations and its
/// answers to other loops use one.
pub struct CallPath {
    ctx: Arc<ToolContext>,
    tools: Arc<ToolSet>,
    /// The catalog entry (route, limits) of every tool of the set, looked up once (names
    /// are the tools' own). A set has a few dozen tools at most: a scan finds one faster
    /// than hashing its name.
    specs: Vec<(&'static str, ToolSpec)>,
    runner: Arc<dyn LaneRunner>,
    receipts: Option<Arc<ReceiptLog>>,
}

impl std::fmt::Debug for CallPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallPath")
            .field("exec_id", &self.ctx.exec_id())
            .field("tools", &self.tools)
            .field("receipts", &self.receipts.as_ref().map(|r| r.path()))
            .finish()
    }
}

impl CallPath {
    /// The path of calls of `tools` in `ctx`: lane calls go to `runner`, receipts to
    /// `receipts` (none kept when `None`). Routes come from the context's catalog.
    pub fn new(
        ctx: Arc<ToolContext>,
        tools: Arc<ToolSet>,
        runner: Arc<dyn LaneRunner>,
        receipts: Option<Arc<ReceiptLog>>,
    ) -> Self {
        let specs = tools
            .names()
            .iter()
            .filter_map(|name| tools.get(name))
            .map(|tool| (tool.name(), ctx.spec(tool.name())))
            .collect();
        Self {
            ctx,
            tools,
            specs,
            runner,
            receipts,
        }
    }

    /// The caller's context.
    pub fn ctx(&self) -> &Arc<ToolContext> {
        &self.ctx
    }

    /// The caller's tools.
    pub fn tools(&self) -> &Arc<ToolSet> {
        &self.tools
    }

    /// Where the receipts go, if they are kept.
    pub fn receipts(&self) -> Option<&Arc<ReceiptLog>> {
        self.receipts.as_ref()
    }

    /// Where calls of `name` go; `None` when the set has no such tool.
    pub fn route(&self, name: &str) -> Option<Route> {
        self.spec(name).map(|spec| spec.lane)
    }

    /// The catalog entry of `name`; `None` when the set has no such tool.
    fn spec(&self, name: &str) -> Option<ToolSpec> {
        self.specs
            .iter()
            .find(|(tool, _)| *tool == name)
            .map(|&(_, spec)| spec)
    }

    /// Whether calls of `name` may run beside other such calls of one model response: a
    /// read-only tool of a worker lane. (Coordination tools wait on other loops, so they
    /// run alone, in order.)
    pub fn concurrent(&self, name: &str) -> bool {
        self.tools.concurrent_on(name, self.route(name))
    }

    /// Runs one call where its route says and saves its receipt.
    pub async fn call(
        &self,
        call_id: Option<&str>,
        name: &str,
        input: impl Into<Arc<Value>>,
    ) -> Called {
        let input = input.into();
        let outcome = match self.spec(name) {
            Some(ToolSpec {
                lane: Route::Lane(lane),
                ..
            }) => {
                let job = ToolJob {
                    ctx: Arc::clone(&self.ctx),
                    tools: Arc::clone(&self.tools),
                    call_id: call_id.map(str::to_string),
                    name: name.to_string(),
                    input,
                };
                self.runner.run(lane, job).await
            }
            // Coordination tools wait on other loops: a worker must never be held for that.
            Some(spec) => {
                self.tools
                    .call_specified(&self.ctx, spec, call_id, name, input)
                    .await
            }
            // Unknown names are answered by the registry without running anything.
            None => self.tools.call(&self.ctx, call_id, name, input).await,
        };
        let saved = self.save(&outcome);
        Called { outcome, saved }
    }

    /// Appends the outcome's receipt to the log, if receipts are kept: the one place they
    /// are saved.
    fn save(&self, outcome: &CallOutcome) -> Result<(), ReceiptNotSaved> {
        let Some(log) = &self.receipts else {
            return Ok(());
        };
        log.append(&outcome.receipt)
            .map_err(|source| ReceiptNotSaved {
                path: log.path().to_path_buf(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::test_support::FnTool;
    use crate::tool::{Tool, ToolOutput};

    /// A tool under a catalog name (the name decides the route) that answers its name.
    fn named(name: &'static str, read_only: bool) -> impl Tool {
        FnTool {
            name,
            schema: json!({"type": "object"}),
            read_only,
            run: move |_: Value| async move { Ok(ToolOutput::text(format!("ran {name}"))) },
        }
    }

    /// Records which lane each call was sent to, then runs it in the caller's task.
    #[derive(Default)]
    struct Recording(Mutex<Vec<(Lane, String)>>);

    #[async_trait]
    impl LaneRunner for Recording {
        async fn run(&self, lane: Lane, job: ToolJob) -> CallOutcome {
            self.0.lock().unwrap().push((lane, job.name.clone()));
            InCallerTask.run(lane, job).await
        }
    }

    fn path(
        dir: &std::path::Path,
        runner: Arc<Recording>,
        receipts: Option<Arc<ReceiptLog>>,
    ) -> CallPath {
        let ctx = ToolContext::new(dir, "caller").unwrap();
        let tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(named("read_file", true)),
            Arc::new(named("write_file", false)),
            Arc::new(named("build", true)),
            Arc::new(named("list_loops", true)),
        ];
        CallPath::new(
            Arc::new(ctx),
            Arc::new(ToolSet::from_tools(tools).unwrap()),
            runner,
            receipts,
        )
    }

    #[tokio::test]
    async fn lane_tools_go_to_their_lane_and_the_others_stay_in_the_callers_task() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Arc::new(Recording::default());
        let calls = path(dir.path(), runner.clone(), None);
        assert_eq!(calls.route("build"), Some(Route::Lane(Lane::Heavy)));
        assert_eq!(calls.route("list_loops"), Some(Route::Coordinator));
        assert_eq!(calls.route("grep"), None);
        for name in ["read_file", "build", "list_loops", "write_file", "grep"] {
            let called = calls.call(Some("c"), name, json!({})).await;
            assert!(called.saved.is_ok());
            if name == "grep" {
                assert_eq!(
                    called.outcome.receipt.error_kind.as_deref(),
                    Some("unknown_tool")
                );
            } else {
                assert_eq!(called.outcome.content, format!("ran {name}"));
            }
        }
        assert_eq!(
            *runner.0.lock().unwrap(),
            [
                (Lane::NoNet, "read_file".to_string()),
                (Lane::Heavy, "build".to_string()),
                (Lane::NoNet, "write_file".to_string()),
            ]
        );
        assert!(calls.concurrent("read_file"));
        assert!(!calls.concurrent("write_file"), "it writes");
        assert!(!calls.concurrent("list_loops"), "it waits on other loops");
        assert!(!calls.concurrent("grep"), "not in the set");
    }

    #[tokio::test]
    async fn a_receipt_is_made_when_it_is_saved_or_read_and_not_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("receipts.jsonl");
        let log = Arc::new(ReceiptLog::open(&log_path).unwrap());
        let kept = path(dir.path(), Arc::default(), Some(log));
        let not_kept = path(dir.path(), Arc::default(), None);
        for name in ["read_file", "list_loops", "nope"] {
            let saved = kept.call(Some("k"), name, json!({"a": 1})).await.outcome;
            assert!(saved.receipt.is_made(), "{name}: written to the log");
            let unsaved = not_kept
                .call(Some("n"), name, json!({"a": 1}))
                .await
                .outcome;
            assert!(!unsaved.receipt.is_made(), "{name}: nobody read it");
            // Read later, it is the receipt the log got, but for its id, time and call id.
            let (saved, unsaved) = (saved.receipt.into_receipt(), unsaved.receipt.into_receipt());
            assert_ne!(saved.id, unsaved.id);
            assert_eq!(
                crate::receipts::Receipt {
                    id: saved.id.clone(),
                    time: saved.time.clone(),
                    call_id: saved.call_id.clone(),
                    latency_ms: saved.latency_ms,
                    latency_us: saved.latency_us,
                    ..unsaved
                },
                saved
            );
        }
        let written = std::fs::read_to_string(&log_path).unwrap();
        assert_eq!(written.lines().count(), 3);
    }

    #[tokio::test]
    async fn every_call_leaves_its_receipt_and_a_failed_save_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("receipts.jsonl");
        let log = Arc::new(ReceiptLog::open(&log_path).unwrap());
        let calls = path(dir.path(), Arc::default(), Some(log));
        calls
            .call(Some("1"), "read_file", json!({}))
            .await
            .saved
            .unwrap();
        calls
            .call(Some("2"), "list_loops", json!({}))
            .await
            .saved
            .unwrap();
        calls
            .call(Some("3"), "nope", json!({}))
            .await
            .saved
            .unwrap();
        let ids: Vec<Option<String>> = std::fs::read_to_string(&log_path)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<crate::receipts::Receipt>(l)
                    .unwrap()
                    .call_id
            })
            .collect();
        assert_eq!(ids, [Some("1".into()), Some("2".into()), Some("3".into())]);

        // /dev/full answers every write with "no space left on device".
        let Ok(full) = ReceiptLog::open(std::path::Path::new("/dev/full")) else {
            eprintln!("SKIPPED: no /dev/full here");
            return;
        };
        let calls = path(dir.path(), Arc::default(), Some(Arc::new(full)));
        let called = calls.call(None, "read_file", json!({})).await;
        assert_eq!(called.outcome.content, "ran read_file", "the call ran");
        let err = called.saved.unwrap_err();
        assert_eq!(err.path, std::path::Path::new("/dev/full"));
        assert!(err.to_string().starts_with("/dev/full: "), "{err}");
    }
}
