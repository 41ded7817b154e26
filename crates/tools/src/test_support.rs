//! Test doubles and fixtures shared by the tools' unit tests: a scripted coordination port
//! that records every call (for `query_loop`, `share_data`, `broadcast_alert`,
//! `list_loops`), worktree contexts, catalog overrides, and the search tools' trees with
//! links that point outside.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use td_toolkit::catalog::{Catalog, ToolSpecOverride};
use td_toolkit::context::ToolContext;
use td_toolkit::coordination::{Coordination, Delivery, LoopInfo};
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::Tool;

/// One call the coordination port received.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Call {
    Query {
        from: String,
        target: String,
        question: String,
        timeout: Duration,
    },
    Share {
        from: String,
        targets: Vec<String>,
        data_type: String,
        data: Value,
    },
    Alert {
        from: String,
        event_type: String,
        message: String,
        data: Option<Value>,
    },
    List {
        from: String,
    },
}

/// A coordination port with scripted answers that records every call.
#[derive(Default)]
pub(crate) struct FakeCoordination {
    /// Every call received, in order (read with `calls()`).
    pub calls: Mutex<Vec<Call>>,
    /// The reply to every query.
    pub reply: String,
    /// Share targets whose delivery fails, with the reason.
    pub undeliverable: Vec<(&'static str, &'static str)>,
    /// Share targets the port gives no delivery report for.
    pub unreported: Vec<&'static str>,
    /// How many loops an alert reaches.
    pub reach: usize,
    /// What `list_loops` answers.
    pub loops: Vec<LoopInfo>,
    /// When set, every call (after being recorded) fails with the error this builds.
    pub fail: Option<fn() -> ToolError>,
}

impl FakeCoordination {
    /// The calls received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: Call) -> Result<(), ToolError> {
        self.calls.lock().unwrap().push(call);
        self.fail.map_or(Ok(()), |f| Err(f()))
    }
}

#[async_trait]
impl Coordination for FakeCoordination {
    async fn query(
        &self,
        from: &Arc<str>,
        target: &str,
        question: &str,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        self.record(Call::Query {
            from: from.to_string(),
            target: target.into(),
            question: question.into(),
            timeout,
        })?;
        Ok(self.reply.clone())
    }

    async fn share(
        &self,
        from: &str,
        targets: &[String],
        data_type: &str,
        data: Value,
    ) -> Result<Vec<Delivery>, ToolError> {
        self.record(Call::Share {
            from: from.into(),
            targets: targets.to_vec(),
            data_type: data_type.into(),
            data,
        })?;
        Ok(targets
            .iter()
            .filter(|t| !self.unreported.contains(&t.as_str()))
            .map(|t| Delivery {
                target: t.clone(),
                error: self
                    .undeliverable
                    .iter()
                    .find(|(name, _)| name == t)
                    .map(|(_, why)| why.to_string()),
            })
            .collect())
    }

    async fn alert(
        &self,
        from: &str,
        event_type: &str,
        message: &str,
        data: Option<Value>,
    ) -> Result<usize, ToolError> {
        self.record(Call::Alert {
            from: from.into(),
            event_type: event_type.into(),
            message: message.into(),
            data,
        })?;
        Ok(self.reach)
    }

    async fn list_loops(&self, from: &str) -> Result<Vec<LoopInfo>, ToolError> {
        self.record(Call::List { from: from.into() })?;
        Ok(self.loops.clone())
    }
}

/// A fresh worktree and a context for loop `exec_id` connected to `fake`.
pub(crate) fn coordinated(
    exec_id: &str,
    fake: FakeCoordination,
) -> (tempfile::TempDir, Arc<FakeCoordination>, ToolContext) {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(fake);
    let ctx = ToolContext::new(dir.path(), exec_id)
        .unwrap()
        .with_coordination(fake.clone());
    (dir, fake, ctx)
}

/// Asserts that `tool`, called outside a run (no coordination port), says it only works
/// inside `taskdaemon run`.
pub(crate) async fn assert_unavailable_outside_a_run(tool: &dyn Tool, input: Value) {
    let (_dir, ctx) = worktree();
    let err = tool.execute(input, &ctx).await.unwrap_err();
    assert_eq!(err.kind(), "unavailable");
    assert!(err.to_string().contains("taskdaemon run"), "{err}");
}

/// The bounds of `tool`'s schema in the built-in set: asserts that each of `refused` is
/// refused as invalid arguments and that `passes`, an input just inside the bounds, gets
/// through the schema; returns what calling it gave.
pub(crate) async fn schema_bounds(
    ctx: &ToolContext,
    tool: &str,
    refused: &[Value],
    passes: Value,
) -> td_toolkit::registry::CallOutcome {
    let set = crate::all_tools();
    assert_set_refuses(&set, ctx, tool, refused).await;
    let out = set.call(ctx, None, tool, passes).await;
    assert_eq!(out.receipt.schema_valid, Some(true), "{}", out.content);
    out
}

/// A fresh empty worktree and a context for it (sandbox on, default catalog).
pub(crate) fn worktree() -> (tempfile::TempDir, ToolContext) {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::new(dir.path(), "test").unwrap();
    (dir, ctx)
}

/// Writes `bytes` at `rel` in the context's worktree, creating parent directories; returns
/// the real path.
pub(crate) fn put(ctx: &ToolContext, rel: &str, bytes: &[u8]) -> PathBuf {
    write(ctx.root(), rel, bytes)
}

/// A context for `dir` whose catalog entry for `tool` is changed by `limits`.
pub(crate) fn with_limits(dir: &Path, tool: &str, limits: ToolSpecOverride) -> ToolContext {
    let mut catalog = Catalog::default();
    let overrides = [(tool.to_string(), limits)].into_iter().collect();
    catalog.apply_overrides(&overrides).unwrap();
    ToolContext::new(dir, "test")
        .unwrap()
        .with_catalog(Arc::new(catalog))
}

/// Peak resident memory of this process so far (`VmHWM`), in KiB; `None` off Linux.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs the test `name` (its full path in the crate, e.g. `web::x::tests::y`) alone in a fresh process
/// of this test binary, for measurements such as peak memory that tests running in
/// parallel in the same process would disturb. Returns `true` inside that process, where
/// the test does its work; in the calling test it waits for the child, fails if the child
/// failed (or did not run the test), and returns `false`.
pub(crate) fn run_isolated(name: &str) -> bool {
    const VAR: &str = "TASKDAEMON_ISOLATED_TEST";
    if std::env::var(VAR).as_deref() == Ok(name) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(VAR, name)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "isolated run of {name} failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stderr}");
    false
}

/// A context for `dir` whose loop configures `command` for the tool `tool` (`build`, `test`
/// or `validate`) and `echo WRONG-TOOL` for the other two, so a tool running a command not
/// its own shows in the output.
pub(crate) fn with_command(dir: &Path, tool: &str, command: Option<&str>) -> ToolContext {
    let pick = |name: &str| {
        if name == tool {
            command.map(str::to_string)
        } else {
            Some("echo WRONG-TOOL".to_string())
        }
    };
    assert!(["build", "test", "validate"].contains(&tool), "{tool}");
    ToolContext::new(dir, "t")
        .unwrap()
        .with_commands(td_toolkit::context::LoopCommands {
            build: pick("build"),
            test: pick("test"),
            validate: pick("validate"),
        })
}

// Search tools (`glob`, `grep`, `symbols`): a worktree with a secret beside it.

/// A temp dir holding a worktree `wt` (with `files` written into it) and, beside it, a
/// directory `outside` with a secret file. Returns the guard and the worktree path.
pub(crate) fn tree<P: AsRef<str>, C: AsRef<str>>(files: &[(P, C)]) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let wt = d.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(
        outside.join("secret.rs"),
        "// SECRET_OUTSIDE\nfn secret_outside() {}\n",
    )
    .unwrap();
    for (path, content) in files {
        write(&wt, path.as_ref(), content.as_ref());
    }
    (d, wt)
}

/// Writes `content` at `rel` under `root`, creating parent directories; returns the path.
pub(crate) fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, content).unwrap();
    p
}

/// Adds the symlinks of the sandbox tests: `out_dir` -> `../outside`,
/// `out_file.rs` -> `../outside/secret.rs`.
pub(crate) fn link_outside(wt: &Path) {
    let outside = wt.parent().unwrap().join("outside");
    std::os::unix::fs::symlink(&outside, wt.join("out_dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.rs"), wt.join("out_file.rs")).unwrap();
}

/// Runs `tool` directly on a fresh context for `wt`.
pub(crate) async fn run(tool: &dyn Tool, wt: &Path, input: Value) -> ToolResult<String> {
    let ctx = ToolContext::new(wt, "test").unwrap();
    tool.execute(input, &ctx).await.map(|o| {
        assert!(!o.is_error);
        o.content
    })
}

/// Runs `tool` through the registry (schema validation included); returns
/// `(is_error, content)`.
pub(crate) async fn call(tool: Arc<dyn Tool>, wt: &Path, input: Value) -> (bool, String) {
    let ctx = ToolContext::new(wt, "test").unwrap();
    let set = td_toolkit::registry::ToolSet::from_tools(vec![tool]).unwrap();
    let name = set.names()[0].clone();
    let out = set.call(&ctx, None, &name, input).await;
    (out.is_error, out.content)
}

/// Asserts that the registry refuses each of `inputs` to `tool` as invalid arguments.
pub(crate) async fn assert_schema_refuses(tool: Arc<dyn Tool>, wt: &Path, inputs: &[Value]) {
    let ctx = ToolContext::new(wt, "test").unwrap();
    let set = td_toolkit::registry::ToolSet::from_tools(vec![tool]).unwrap();
    let name = set.names()[0].clone();
    assert_set_refuses(&set, &ctx, &name, inputs).await;
}

/// Asserts that `set` refuses each of `inputs` to `tool` as invalid arguments (its schema,
/// before the tool runs): an error that says so, with that error kind in the receipt.
pub(crate) async fn assert_set_refuses(
    set: &td_toolkit::registry::ToolSet,
    ctx: &ToolContext,
    tool: &str,
    inputs: &[Value],
) {
    for input in inputs {
        let out = set.call(ctx, None, tool, input.clone()).await;
        assert!(
            out.is_error && out.content.contains("invalid arguments"),
            "{input}: {}",
            out.content
        );
        assert_eq!(
            out.receipt.error_kind.as_deref(),
            Some("invalid_arguments"),
            "{input}"
        );
    }
}

/// Asserts that the three kinds of escape are refused for `tool` given `path`.
pub(crate) async fn assert_escapes_refused(tool: &dyn Tool, wt: &Path, extra: Value) {
    link_outside(wt);
    for path in [
        "../",
        "../outside",
        "/etc",
        "out_dir",
        "out_dir/secret.rs",
        "out_file.rs",
    ] {
        let mut input = extra.clone();
        input["path"] = Value::from(path);
        let err = run(tool, wt, input).await.unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation", "{path}: {err}");
    }
}
