//! Multi-loop scenarios on real actors with the scripted provider, in temp worktrees. Each
//! snapshots the normalised transcripts and events of its loops (insta, `snapshots/`).
//!
//! Determinism: loops are registered before any of them iterates (the runtime's start gate);
//! where a scenario needs one loop to act after another, it waits on a flag file that the
//! other loop (or the test, after seeing an event) creates — never on a bare sleep.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use td_confine::SandboxSettings;
use td_engine::transcript::{MemoryTranscripts, TranscriptEntry};
use td_engine::{EngineConfig, LoopEnd, prompt};
use td_llm::scripted::ScriptedLlm;
use td_protocol::events::{EventKind, EventLog};
use td_runtime::coordinator::CoordinatorLimits;
use td_runtime::daemon::{Runtime, RuntimeConfig};
use td_runtime::loop_actor::LoopSpec;
use td_toolkit::catalog::{Lane, default_tool_set};
use td_toolkit::context::{LoopCommands, ToolContext};
use td_toolkit::error::ToolResult;
use td_toolkit::registry::ToolSet;
use td_toolkit::tool::{Tool, ToolOutput};
use td_tools::builtin_tools;

mod common;

const WAIT: Duration = Duration::from_secs(60);

/// A tool that panics, to exercise worker supervision.
struct Explode;

#[async_trait]
impl Tool for Explode {
    fn name(&self) -> &'static str {
        "explode"
    }
    fn description(&self) -> &'static str {
        "Panics (test tool)."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "additionalProperties": false})
    }
    async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
        panic!("explode was called");
    }
}

struct LoopOpts {
    worktree: &'static str,
    validate: Option<&'static str>,
    max_iterations: u32,
    max_turns: u32,
    iteration_timeout: Option<Duration>,
    subscriptions: Option<Vec<String>>,
    extra_tools: Vec<Arc<dyn Tool>>,
}

impl Default for LoopOpts {
    fn default() -> Self {
        Self {
            worktree: "",
            validate: None,
            max_iterations: 3,
            max_turns: 10,
            iteration_timeout: None,
            // Scenarios hear no alerts unless they say so: alerts from loops that end at
            // different moments would land at different turns.
            subscriptions: Some(Vec::new()),
            extra_tools: Vec::new(),
        }
    }
}

struct Run {
    _dir: tempfile::TempDir,
    root: PathBuf,
    rt: Runtime,
    llm: Arc<ScriptedLlm>,
    events: Arc<EventLog>,
    transcripts: Arc<MemoryTranscripts>,
    names: Vec<String>,
}

impl Run {
    async fn new(script: &str) -> Run {
        Self::with_config(script, RuntimeConfig::default()).await
    }

    async fn with_config(script: &str, config: RuntimeConfig) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let events = Arc::new(EventLog::in_memory());
        let rt = Runtime::start(config, events.clone()).await.unwrap();
        Run {
            _dir: dir,
            root,
            rt,
            llm: Arc::new(ScriptedLlm::from_yaml(script, "script.yml").unwrap()),
            events,
            transcripts: Arc::new(MemoryTranscripts::new()),
            names: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    async fn spawn(&mut self, name: &str, opts: LoopOpts) {
        let wt_name = if opts.worktree.is_empty() {
            name
        } else {
            opts.worktree
        };
        let wt = self.root.join(wt_name);
        std::fs::create_dir_all(&wt).unwrap();
        let ctx = self
            .rt
            .context(&wt, name)
            .unwrap()
            // The scenarios' loops signal each other through flag files beside their
            // worktrees (`../b-waiting.flag`), so their commands may write in the run root.
            .with_sandbox_settings(Arc::new(SandboxSettings {
                writable: vec![self.root.clone()],
                ..SandboxSettings::default()
            }))
            .with_commands(LoopCommands {
                validate: opts.validate.map(str::to_string),
                ..LoopCommands::default()
            });
        let set = default_tool_set("ralph").unwrap();
        let mut tools: Vec<Arc<dyn Tool>> = builtin_tools()
            .into_iter()
            .filter(|t| set.contains(&t.name()))
            .collect();
        tools.extend(opts.extra_tools);
        let spec = LoopSpec {
            config: EngineConfig {
                name: name.to_string(),
                loop_type: "ralph".to_string(),
                task: format!("Scenario task of {name}"),
                max_iterations: opts.max_iterations,
                max_turns: opts.max_turns,
                iteration_timeout: opts.iteration_timeout,
                success_code: 0,
                system_template: prompt::DEFAULT_SYSTEM.to_string(),
                iteration_template: prompt::DEFAULT_ITERATION.to_string(),
                peers: Vec::new(),
                first_iteration: 1,
            },
            ctx: Arc::new(ctx),
            tools: Arc::new(ToolSet::from_tools(tools).unwrap()),
            validation_tools: Arc::new(td_tools::tool_set(&["validate"]).unwrap()),
            llm: self.llm.clone(),
            runner: Arc::new(self.rt.lanes.clone()),
            coordinator: self.rt.coordinator.clone(),
            events: self.events.clone(),
            transcript: self.transcripts.clone(),
            receipts: None,
            subscriptions: opts.subscriptions,
            ended: None,
            gate: None,
            initial_inbox: Vec::new(),
            initial_progress: Vec::new(),
            announced: false,
            budgets: td_engine::budget::Budgets::unlimited(),
        };
        self.rt.spawn_loop(spec).await.unwrap();
        self.names.push(name.to_string());
    }

    /// Spawns a loop that hears the alert event types `events` (system ones included).
    async fn spawn_hearing(&mut self, name: &str, events: &[&str]) {
        let opts = LoopOpts {
            subscriptions: Some(events.iter().map(|e| e.to_string()).collect()),
            ..LoopOpts::default()
        };
        self.spawn(name, opts).await;
    }

    async fn wait(&mut self) -> BTreeMap<String, LoopEnd> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let ends = self.rt.wait_for(&names, WAIT).await;
        assert_eq!(ends.len(), names.len(), "not every loop ended: {ends:?}");
        // The loops' last system alerts are on their way to the coordinator.
        self.rt.flush().await;
        ends
    }

    /// Waits until an event matching `pred` has been recorded.
    async fn until_event(&self, what: &str, pred: impl Fn(&EventKind) -> bool) {
        let started = Instant::now();
        while !self.events.events().iter().any(|e| pred(&e.kind)) {
            assert!(started.elapsed() < WAIT, "no event: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `name`'s transcript has a tool result of `tool`.
    async fn until_tool_result(&self, name: &str, tool: &str) {
        let started = Instant::now();
        loop {
            let done = self
                .transcripts
                .of(name)
                .iter()
                .any(|e| matches!(e, TranscriptEntry::ToolResult { name: n, .. } if n == tool));
            if done {
                return;
            }
            assert!(started.elapsed() < WAIT, "{name} never got a {tool} result");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Once `name` has a read_file result, changes `rel` to `content` as the user would,
    /// waits until the loop dropped its stamp, then lets it go on (its script waits for
    /// `changed.flag`).
    async fn change_after_read(&self, name: &str, rel: &str, content: &str) {
        self.until_tool_result(name, "read_file").await;
        std::fs::write(self.path(rel), content).unwrap();
        self.until_event(
            "the stamp dropped",
            |k| matches!(k, EventKind::FileChanged { loop_name, .. } if loop_name == name),
        )
        .await;
        self.touch("changed.flag");
    }

    /// Waits until a flag file exists (a loop's command created it).
    async fn until_file(&self, flag: &str) {
        let started = Instant::now();
        while !self.path(flag).exists() {
            assert!(started.elapsed() < WAIT, "{flag} never appeared");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn touch(&self, flag: &str) {
        std::fs::write(self.path(flag), "").unwrap();
    }

    /// Transcripts and events of every loop, with times, sequence numbers, query ids and
    /// temp paths taken out, as YAML.
    fn snapshot(&self, ends: &BTreeMap<String, LoopEnd>) -> String {
        let events = self.events.events();
        let mut out = serde_json::Map::new();
        for name in &self.names {
            let mut mine: Vec<Value> = Vec::new();
            for e in &events {
                let v = serde_json::to_value(&e.kind).unwrap();
                let involved = ["loop_name", "from"]
                    .iter()
                    .any(|k| v.get(*k).and_then(Value::as_str) == Some(name));
                let about_me = v.get("from").and_then(Value::as_str) == Some("taskdaemon")
                    && v.get("message")
                        .and_then(Value::as_str)
                        .is_some_and(|m| m.contains(&format!("`{name}`")));
                // When the heavy lane queued a call, and for how long, is timing: its events
                // have tests of their own (tool_lanes, tests/heavy_lane.rs).
                let timing = matches!(
                    e.kind,
                    EventKind::HeavyQueued { .. }
                        | EventKind::HeavyStarted { .. }
                        | EventKind::HeavyEnded { .. }
                );
                if (involved || about_me) && !timing {
                    mine.push(v);
                }
            }
            // Answers to other loops' questions run concurrently with the loop's own turns,
            // so they are listed apart (each list keeps its own order).
            let (answers, transcript): (Vec<Value>, Vec<Value>) = self
                .transcripts
                .of(name)
                .iter()
                .map(|t| serde_json::to_value(t).unwrap())
                .partition(|v| v["iteration"] == 0);
            out.insert(
                name.clone(),
                json!({
                    "end": ends.get(name),
                    "transcript": transcript,
                    "answers": answers,
                    "events": mine,
                }),
            );
        }
        let mut value = Value::Object(out);
        normalise(&mut value, &self.root);
        serde_yaml_ng::to_string(&value).unwrap()
    }
}

fn normalise(v: &mut Value, root: &Path) {
    let root = root.display().to_string();
    match v {
        Value::String(s) if s.contains(&root) => *s = s.replace(&root, "[RUN]"),
        Value::Array(a) => a.iter_mut().for_each(|x| normalise(x, Path::new(&root))),
        Value::Object(m) => {
            m.remove("id");
            // How long an iteration took differs from run to run.
            m.remove("wall_ms");
            for x in m.values_mut() {
                normalise(x, Path::new(&root));
            }
        }
        _ => {}
    }
}

fn snap(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}

/// Checks that `name` completed and that its first edit was refused because the file changed
/// on disk; returns its edit results.
fn first_edit_refused_as_stale(
    run: &Run,
    ends: &BTreeMap<String, LoopEnd>,
    name: &str,
) -> Vec<(bool, String)> {
    assert!(completed(ends, name), "{ends:?}");
    let edits = tool_results(run, name, "edit_file");
    assert!(
        edits[0].0 && edits[0].1.contains("changed on disk"),
        "{edits:?}"
    );
    edits
}

fn assert_all_completed(ends: &BTreeMap<String, LoopEnd>) {
    assert!(
        ends.values()
            .all(|e| matches!(e, LoopEnd::Completed { .. })),
        "{ends:?}"
    );
}

fn completed(ends: &BTreeMap<String, LoopEnd>, name: &str) -> bool {
    matches!(ends.get(name), Some(LoopEnd::Completed { .. }))
}

fn requests_containing(run: &Run, name: &str, needle: &str) -> Vec<u32> {
    run.transcripts
        .of(name)
        .iter()
        .filter_map(|e| match e {
            TranscriptEntry::Request {
                turn, new_messages, ..
            } if serde_json::to_string(new_messages)
                .unwrap()
                .contains(needle) =>
            {
                Some(*turn)
            }
            _ => None,
        })
        .collect()
}

fn tool_results(run: &Run, name: &str, tool: &str) -> Vec<(bool, String)> {
    run.transcripts
        .of(name)
        .iter()
        .filter_map(|e| match e {
            TranscriptEntry::ToolResult {
                name: n,
                content,
                is_error,
                ..
            } if n == tool => Some((*is_error, content.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s01_query_and_use_the_reply() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - say: "Asking b for the port"
      calls:
        - query_loop: {target_exec_id: b, question: "Which port does the api listen on?"}
    - calls:
        - write_file: {path: client.txt, content: "port 8080\n"}
        - complete_task: {summary: "client wired to port 8080"}
b:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../a/client.txt ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "api on 8080"}
  answers:
    - when: "port"
      reply: "8080"
"#,
    )
    .await;
    run.spawn(
        "a",
        LoopOpts {
            validate: Some("grep -q 8080 client.txt"),
            ..LoopOpts::default()
        },
    )
    .await;
    run.spawn("b", LoopOpts::default()).await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    let replies = tool_results(&run, "a", "query_loop");
    assert_eq!(replies.len(), 1);
    assert!(
        !replies[0].0 && replies[0].1.contains("8080"),
        "{replies:?}"
    );
    snap("scenario_01_query", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s02_mutual_queries_at_the_same_moment() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - query_loop: {target_exec_id: b, question: "Who are you?", timeout_ms: 10000}
    - calls:
        - complete_task: {summary: "a knows b"}
  answers:
    - reply: "I am a"
b:
  turns:
    - calls:
        - query_loop: {target_exec_id: a, question: "Who are you?", timeout_ms: 10000}
    - calls:
        - complete_task: {summary: "b knows a"}
  answers:
    - reply: "I am b"
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    for (me, other) in [("a", "b"), ("b", "a")] {
        let r = tool_results(&run, me, "query_loop");
        assert!(!r[0].0, "{me}: {r:?}");
        assert!(r[0].1.contains(&format!("I am {other}")), "{me}: {r:?}");
    }
    snap("scenario_02_mutual_queries", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s03_share_shows_up_at_the_next_turn_exactly_once() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../b-waiting.flag ]; do sleep 0.02; done"}
    - calls:
        - share_data: {target_exec_ids: [b], data_type: api_schema, data: {port: 8080, path: "/v1"}}
        - run_command: {command: "touch ../shared.flag"}
    - calls:
        - complete_task: {summary: "schema shared"}
b:
  turns:
    - calls:
        - run_command: {command: "touch ../b-waiting.flag; until [ -e ../shared.flag ]; do sleep 0.02; done"}
    - calls:
        - write_file: {path: schema.txt, content: "port 8080 path /v1\n"}
    - calls:
        - complete_task: {summary: "schema used"}
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    assert_eq!(requests_containing(&run, "b", "share from `a`"), vec![2]);
    snap("scenario_03_share", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s04_outside_change_refuses_the_edit_until_a_fresh_read() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - read_file: {path: notes.txt}
    - calls:
        - run_command: {command: "until [ -e ../changed.flag ]; do sleep 0.02; done"}
    - calls:
        - edit_file: {path: notes.txt, old_string: "beta", new_string: "BETA"}
    - calls:
        - read_file: {path: notes.txt}
    - calls:
        - edit_file: {path: notes.txt, old_string: "beta", new_string: "BETA"}
    - calls:
        - complete_task: {summary: "edited"}
"#,
    )
    .await;
    std::fs::create_dir_all(run.path("a")).unwrap();
    std::fs::write(run.path("a/notes.txt"), "alpha\nbeta\n").unwrap();
    run.spawn("a", LoopOpts::default()).await;
    run.rt.release().await;
    run.change_after_read(
        "a",
        "a/notes.txt",
        "alpha\nbeta\ngamma (added by the user)\n",
    )
    .await;
    let ends = run.wait().await;
    let edits = first_edit_refused_as_stale(&run, &ends, "a");
    assert!(!edits[1].0, "{edits:?}");
    assert_eq!(
        requests_containing(&run, "a", "files changed on disk"),
        vec![3]
    );
    assert_eq!(
        std::fs::read_to_string(run.path("a/notes.txt")).unwrap(),
        "alpha\nBETA\ngamma (added by the user)\n"
    );
    snap("scenario_04_outside_change", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outside_change_to_a_large_file_is_noticed_too() {
    // Large files are compared off the async threads; the outcome must be the same.
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - read_file: {path: big.log, offset: 1, limit: 5}
    - calls:
        - run_command: {command: "until [ -e ../changed.flag ]; do sleep 0.02; done"}
    - calls:
        - edit_file: {path: big.log, old_string: "line 3\n", new_string: "line three\n"}
    - calls:
        - complete_task: {summary: "done"}
"#,
    )
    .await;
    std::fs::create_dir_all(run.path("a")).unwrap();
    let big: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
    assert!(big.len() > 512 * 1024);
    std::fs::write(run.path("a/big.log"), &big).unwrap();
    run.spawn("a", LoopOpts::default()).await;
    run.rt.release().await;
    run.change_after_read("a", "a/big.log", &format!("{big}appended\n"))
        .await;
    let ends = run.wait().await;
    first_edit_refused_as_stale(&run, &ends, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s05_two_loops_one_worktree_a_write_makes_b_stale() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../go-a.flag ]; do sleep 0.02; done"}
    - calls:
        - write_file: {path: shared.txt, content: "written by a\n"}
    - calls:
        - complete_task: {summary: "a wrote"}
b:
  turns:
    - calls:
        - read_file: {path: shared.txt}
    - calls:
        - run_command: {command: "touch ../b-heard.flag; until [ -e ../go-b.flag ]; do sleep 0.02; done"}
    - calls:
        - edit_file: {path: shared.txt, old_string: "original", new_string: "edited by b"}
    - calls:
        - read_file: {path: shared.txt}
    - calls:
        - edit_file: {path: shared.txt, old_string: "written by a", new_string: "written by a, edited by b"}
    - calls:
        - complete_task: {summary: "b edited"}
"#,
    )
    .await;
    std::fs::create_dir_all(run.path("shared")).unwrap();
    std::fs::write(run.path("shared/shared.txt"), "original\n").unwrap();
    run.spawn(
        "a",
        LoopOpts {
            worktree: "shared",
            ..LoopOpts::default()
        },
    )
    .await;
    run.spawn(
        "b",
        LoopOpts {
            worktree: "shared",
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    run.until_tool_result("b", "read_file").await;
    run.touch("go-a.flag");
    run.until_event(
        "b's stamp dropped",
        |k| matches!(k, EventKind::FileChanged { loop_name, .. } if loop_name == "b"),
    )
    .await;
    run.until_event(
        "a completed",
        |k| matches!(k, EventKind::LoopCompleted { loop_name, .. } if loop_name == "a"),
    )
    .await;
    run.touch("go-b.flag");
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    let edits = tool_results(&run, "b", "edit_file");
    assert!(
        edits[0].0 && edits[0].1.contains("changed on disk"),
        "{edits:?}"
    );
    assert!(!edits[1].0, "{edits:?}");
    // a's own write is not a change underneath a (and once a has ended, b's edits are no
    // news to it).
    assert!(
        !run.events.events().iter().any(
            |e| matches!(&e.kind, EventKind::FileChanged { loop_name, .. } if loop_name == "a")
        )
    );
    snap("scenario_05_shared_worktree", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s06_a_panicking_worker_is_restarted_and_the_loop_finishes() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - explode: {}
    - calls:
        - write_file: {path: after.txt, content: "the lane still works\n"}
        - read_file: {path: after.txt}
    - calls:
        - complete_task: {summary: "survived a crash"}
"#,
    )
    .await;
    run.spawn(
        "a",
        LoopOpts {
            extra_tools: vec![Arc::new(Explode)],
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a"), "{ends:?}");
    let boom = tool_results(&run, "a", "explode");
    assert!(boom[0].0 && boom[0].1.contains("crash"), "{boom:?}");
    assert_eq!(run.rt.lanes.restarts(Lane::NoNet), 1);
    assert!(!tool_results(&run, "a", "read_file")[0].0);
    snap("scenario_06_worker_panic", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s07_unknown_self_and_stopped_targets_fail_at_once() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - query_loop: {target_exec_id: ghost, question: "Anyone?", timeout_ms: 60000}
        - query_loop: {target_exec_id: a, question: "Me?", timeout_ms: 60000}
    - calls:
        - run_command: {command: "until [ -e ../c-gone.flag ]; do sleep 0.02; done"}
    - calls:
        - query_loop: {target_exec_id: c, question: "Still there?", timeout_ms: 60000}
    - calls:
        - complete_task: {summary: "a tried"}
c:
  turns:
    - calls:
        - run_command: {command: "touch ../c-running.flag; until [ -e ../stop-c.flag ]; do sleep 0.02; done"}
  answers:
    - reply: "yes"
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("c", LoopOpts::default()).await;
    let started = Instant::now();
    run.rt.release().await;
    run.until_file("c-running.flag").await;
    run.rt.stop_loop("c").unwrap();
    run.touch("stop-c.flag");
    run.until_event(
        "c unregistered",
        |k| matches!(k, EventKind::LoopUnregistered { loop_name } if loop_name == "c"),
    )
    .await;
    run.touch("c-gone.flag");
    let ends = run.wait().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "queries waited for their timeout"
    );
    assert!(completed(&ends, "a"), "{ends:?}");
    assert!(matches!(ends["c"], LoopEnd::Stopped { .. }), "{ends:?}");
    let r = tool_results(&run, "a", "query_loop");
    assert!(r.iter().all(|(is_error, _)| *is_error), "{r:?}");
    assert!(r[0].1.contains("unknown loop 'ghost'"), "{r:?}");
    assert!(r[1].1.contains("is this loop itself"), "{r:?}");
    assert!(r[2].1.contains("loop 'c' has stopped"), "{r:?}");
    snap("scenario_07_unreachable_targets", &run.snapshot(&ends));
}

/// A stop "now" (the dashboard's) does not wait for the command in flight: the command is
/// killed, its call answered as cancelled, and the loop ends stopped with its iteration
/// counted; the plain stop (a first Ctrl-C) would wait the command's 600 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_now_cancels_the_command_in_flight() {
    let marker = format!("stop-now-{}", std::process::id());
    let mut run = Run::new(&format!(
        r#"
c:
  turns:
    - calls:
        - run_command: {{command: "touch ../c-running.flag; sleep 600; echo {marker}"}}
    - calls:
        - complete_task: {{summary: "must not run"}}
"#
    ))
    .await;
    run.spawn("c", LoopOpts::default()).await;
    run.rt.release().await;
    run.until_file("c-running.flag").await;
    assert!(
        !common::pids_with(&marker).is_empty(),
        "the command is not running"
    );
    let asked = Instant::now();
    run.rt.stop_loop_now("c").unwrap();
    let ends = run.wait().await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the stop waited {:?}",
        asked.elapsed()
    );
    assert!(
        matches!(ends["c"], LoopEnd::Stopped { iterations: 1, .. }),
        "{ends:?}"
    );
    let r = tool_results(&run, "c", "run_command");
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].0 && r[0].1.contains("cancelled"), "{r:?}");
    assert!(tool_results(&run, "c", "complete_task").is_empty());
    common::wait_until(
        "the command's processes to go",
        Duration::from_secs(5),
        || common::pids_with(&marker).is_empty(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s08_broadcasts_and_subscribed_system_alerts_reach_the_other_loops() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../b-waiting.flag ] && [ -e ../c-waiting.flag ]; do sleep 0.02; done"}
    - calls:
        - broadcast_alert: {event_type: api_ready, message: "api is up on 8080"}
        - run_command: {command: "touch ../alerted.flag; until [ -e ../b-heard.flag ] && [ -e ../c-heard.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "api ready"}
b:
  turns:
    - calls:
        - run_command: {command: "touch ../b-waiting.flag; until [ -e ../alerted.flag ]; do sleep 0.02; done"}
    - calls:
        - run_command: {command: "touch ../b-heard.flag; until [ -e ../go-b.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "b heard"}
c:
  turns:
    - calls:
        - run_command: {command: "touch ../c-waiting.flag; until [ -e ../alerted.flag ]; do sleep 0.02; done"}
    - calls:
        - run_command: {command: "touch ../c-heard.flag; until [ -e ../go-c.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "c heard"}
"#,
    )
    .await;
    // Subscribed to peers' ends, not their starts: no `loop_started` line in any prompt.
    for name in ["a", "b", "c"] {
        run.spawn_hearing(name, &["api_ready", "loop_completed"])
            .await;
    }
    run.rt.release().await;
    let system_alert_about = |who: &'static str| {
        move |k: &EventKind| {
            matches!(k, EventKind::Alert { from, event_type, message, .. }
                if from == "taskdaemon" && event_type == "loop_completed"
                    && message.contains(&format!("`{who}`")))
        }
    };
    run.until_event("a's completion alert", system_alert_about("a"))
        .await;
    run.touch("go-b.flag");
    run.until_event("b's completion alert", system_alert_about("b"))
        .await;
    run.touch("go-c.flag");
    let ends = run.wait().await;
    assert_all_completed(&ends);
    for name in ["b", "c"] {
        assert_eq!(
            requests_containing(&run, name, "api is up on 8080"),
            vec![2],
            "{name}"
        );
        assert_eq!(
            requests_containing(&run, name, "loop `a` completed"),
            vec![3],
            "{name}"
        );
    }
    assert_eq!(
        requests_containing(&run, "c", "loop `b` completed"),
        vec![3]
    );
    snap("scenario_08_alerts", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_loops_starting_at_once_are_one_line_of_each_first_prompt() {
    let names: Vec<String> = (0..8).map(|i| format!("l{i}")).collect();
    let script: String = names
        .iter()
        .map(|n| {
            format!("{n}:\n  turns:\n    - calls:\n        - complete_task: {{summary: done}}\n")
        })
        .collect();
    let mut run = Run::new(&script).await;
    for name in &names {
        run.spawn_hearing(name, &["loop_started"]).await;
    }
    run.rt.release().await;
    let ends = run.wait().await;
    assert_all_completed(&ends);
    // A loop hears of the loops that registered after it: l0 of 7, l1 of 6 (both above
    // the limit of 5: one line), l2 of 5 and so on (a line each).
    for (i, name) in names.iter().enumerate() {
        let later: Vec<String> = names[i + 1..].iter().map(|n| format!("`{n}`")).collect();
        let folded = format!(
            "alert from `taskdaemon` (loop_started) for {} loops: {}.",
            later.len(),
            later.join(", ")
        );
        let one_each = requests_containing(&run, name, "started: Scenario task");
        if later.len() > 5 {
            assert_eq!(requests_containing(&run, name, &folded), vec![1], "{name}");
            assert!(one_each.is_empty(), "{name} also got a line each");
        } else if !later.is_empty() {
            assert!(requests_containing(&run, name, "for 5 loops").is_empty());
            for other in &names[i + 1..] {
                let line = format!("loop `{other}` started: Scenario task of {other}");
                assert_eq!(requests_containing(&run, name, &line), vec![1], "{name}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s09_rate_limit_answers_the_sender() {
    let config = RuntimeConfig {
        limits: CoordinatorLimits {
            burst: 2,
            per_second: 0.001,
            ..CoordinatorLimits::default()
        },
        ..RuntimeConfig::default()
    };
    let mut run = Run::with_config(
        r#"
a:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../b-waiting.flag ]; do sleep 0.02; done"}
    - calls:
        - share_data: {target_exec_ids: [b], data_type: note, data: "one"}
        - share_data: {target_exec_ids: [b], data_type: note, data: "two"}
        - share_data: {target_exec_ids: [b], data_type: note, data: "three"}
        - run_command: {command: "touch ../shared.flag"}
    - calls:
        - complete_task: {summary: "sent what the limit allowed"}
b:
  turns:
    - calls:
        - run_command: {command: "touch ../b-waiting.flag; until [ -e ../shared.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "read my inbox"}
"#,
        config,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    let shares = tool_results(&run, "a", "share_data");
    assert!(!shares[0].0 && !shares[1].0, "{shares:?}");
    assert!(
        shares[2].0 && shares[2].1.contains("NOT sent"),
        "{shares:?}"
    );
    assert_eq!(requests_containing(&run, "b", "\\\"two\\\""), vec![2]);
    assert!(requests_containing(&run, "b", "three").is_empty());
    snap("scenario_09_rate_limit", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s10_validation_fails_then_passes() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - write_file: {path: done.txt, content: "not yet\n"}
        - complete_task: {summary: "done, I think"}
    - calls:
        - write_file: {path: done.txt, content: "ok\n"}
        - complete_task: {summary: "really done"}
"#,
    )
    .await;
    run.spawn(
        "a",
        LoopOpts {
            validate: Some("grep -q '^ok$' done.txt || { echo 'done.txt must say ok'; exit 3; }"),
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert_eq!(
        ends["a"],
        LoopEnd::Completed {
            iterations: 2,
            summary: Some("really done".into())
        }
    );
    let it2 = run
        .transcripts
        .of("a")
        .iter()
        .find_map(|e| match e {
            TranscriptEntry::Request {
                iteration: 2,
                turn: 1,
                new_messages,
                ..
            } => Some(serde_json::to_string(new_messages).unwrap()),
            _ => None,
        })
        .unwrap();
    assert!(it2.contains("validation did not pass"), "{it2}");
    assert!(it2.contains("done.txt must say ok"), "{it2}");
    snap("scenario_10_validation", &run.snapshot(&ends));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s11_stop_during_an_iteration_fails_queries_waiting_on_it() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - query_loop: {target_exec_id: b, question: "Slow question", timeout_ms: 60000}
    - calls:
        - complete_task: {summary: "a went on without the answer"}
b:
  turns:
    - calls:
        - run_command: {command: "touch ../b-running.flag; until [ -e ../stop-b.flag ]; do sleep 0.02; done"}
    - calls:
        - write_file: {path: never.txt, content: "b was stopped before this turn\n"}
  answers:
    - reply: "too late"
      delay_ms: 60000
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    let started = Instant::now();
    run.rt.release().await;
    run.until_event(
        "a's query reached b",
        |k| matches!(k, EventKind::QueryAsked { from, .. } if &**from == "a"),
    )
    .await;
    run.until_file("b-running.flag").await;
    run.rt.stop_loop("b").unwrap();
    run.touch("stop-b.flag");
    let ends = run.wait().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the query waited for its timeout"
    );
    assert!(completed(&ends, "a"), "{ends:?}");
    assert_eq!(
        ends["b"],
        LoopEnd::Stopped {
            iterations: 1,
            reason: None
        }
    );
    let r = tool_results(&run, "a", "query_loop");
    assert!(r[0].0 && r[0].1.contains("stopped"), "{r:?}");
    assert!(!run.path("b/never.txt").exists());
    snap("scenario_11_stop", &run.snapshot(&ends));
}

/// A tool that sleeps and records how many of its calls overlapped.
struct Slow {
    name: &'static str,
    read_only: bool,
    running: Arc<std::sync::atomic::AtomicUsize>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Tool for Slow {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        "Sleeps 150 ms (test tool)."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object", "additionalProperties": false})
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(150)).await;
        self.running.fetch_sub(1, SeqCst);
        Ok(ToolOutput::text(self.name))
    }
}

fn slow(name: &'static str, read_only: bool) -> (Arc<Slow>, Arc<std::sync::atomic::AtomicUsize>) {
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (
        Arc::new(Slow {
            name,
            read_only,
            running: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            peak: peak.clone(),
        }),
        peak,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_only_calls_of_one_response_overlap_and_writes_do_not() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - look: {}
        - look: {}
        - look: {}
        - poke: {}
        - poke: {}
    - calls:
        - complete_task: {summary: "done"}
"#,
    )
    .await;
    let (look, look_peak) = slow("look", true);
    let (poke, poke_peak) = slow("poke", false);
    run.spawn(
        "a",
        LoopOpts {
            extra_tools: vec![look, poke],
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a"), "{ends:?}");
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(look_peak.load(SeqCst), 3, "read-only calls ran one by one");
    assert_eq!(poke_peak.load(SeqCst), 1, "writing calls overlapped");
    // Results come back in call order whatever finished first.
    let names: Vec<String> = run
        .transcripts
        .of("a")
        .iter()
        .filter_map(|e| match e {
            TranscriptEntry::ToolResult { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        names,
        ["look", "look", "look", "poke", "poke", "complete_task"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_iterations_fail_the_loop_with_the_reason() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - complete_task: {summary: "first try"}
    - calls:
        - complete_task: {summary: "second try"}
"#,
    )
    .await;
    run.spawn(
        "a",
        LoopOpts {
            validate: Some("echo 'tests: 3 failed'; exit 1"),
            max_iterations: 2,
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    let ends = run.wait().await;
    let LoopEnd::Failed { iterations, reason } = &ends["a"] else {
        panic!("{ends:?}");
    };
    assert_eq!(*iterations, 2);
    assert!(reason.contains("maximum of 2 iterations"), "{reason}");
    assert!(reason.contains("tests: 3 failed"), "{reason}");
    assert!(run.events.events().iter().any(|e| matches!(&e.kind,
        EventKind::LoopFailed { loop_name, .. } if loop_name == "a")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_turns_and_iteration_timeout_end_an_iteration() {
    // A sleep argument unique to this test run: the command's pid is its namespace's, so
    // the test finds the command by its command line.
    let sleeper = format!("5.{:03}1", std::process::id() % 1000);
    let mut run = Run::new(&format!(
        r#"
a:
  turns:
    - calls: [{{list_directory: {{}}}}]
    - calls: [{{list_directory: {{}}}}]
    - calls: [{{complete_task: {{summary: "second iteration"}}}}]
b:
  turns:
    - calls:
        - run_command: {{command: "exec sleep {sleeper}"}}
    - calls:
        - complete_task: {{summary: "after the timeout"}}
"#
    ))
    .await;
    run.spawn(
        "a",
        LoopOpts {
            max_turns: 2,
            ..LoopOpts::default()
        },
    )
    .await;
    run.spawn(
        "b",
        LoopOpts {
            iteration_timeout: Some(Duration::from_millis(300)),
            ..LoopOpts::default()
        },
    )
    .await;
    let started = Instant::now();
    run.rt.release().await;
    let ends = run.wait().await;
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the timeout did not cut the command"
    );
    // The abandoned command does not run on in its lane worker.
    let alive = || !common::pids_with(&sleeper).is_empty();
    let waited = Instant::now();
    while alive() && waited.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(), "the timed-out command is still running");
    let ended_by = |name: &str| -> Vec<String> {
        run.events
            .events()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::IterationEnded {
                    loop_name,
                    ended_by,
                    ..
                } if loop_name == name => Some(ended_by.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(ended_by("a"), ["max_turns", "complete_task"]);
    assert_eq!(ended_by("b"), ["iteration_timeout", "complete_task"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payload_limit_subscriptions_and_listing() {
    let config = RuntimeConfig {
        limits: CoordinatorLimits {
            max_payload_bytes: 64,
            ..CoordinatorLimits::default()
        },
        ..RuntimeConfig::default()
    };
    let mut run = Run::with_config(
        r#"
a:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../b-waiting.flag ] && [ -e ../c-waiting.flag ]; do sleep 0.02; done"}
    - calls:
        - list_loops: {}
        - share_data: {target_exec_ids: [b], data_type: big, data: "0123456789012345678901234567890123456789012345678901234567890123456789"}
        - broadcast_alert: {event_type: build_broken, message: "main is red"}
        - broadcast_alert: {event_type: docs_updated, message: "see README"}
        - broadcast_alert: {event_type: build_broken, message: "ABCDEFGHIJ0123456789012345678901234567890123456789012345678901234567890123456789"}
        - query_loop: {target_exec_id: b, question: "KLMNOPQRST0123456789012345678901234567890123456789012345678901234567890123456789"}
        - run_command: {command: "touch ../sent.flag"}
    - calls:
        - complete_task: {summary: "done"}
b:
  turns:
    - calls:
        - run_command: {command: "touch ../b-waiting.flag; until [ -e ../sent.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "b"}
c:
  turns:
    - calls:
        - run_command: {command: "touch ../c-waiting.flag; until [ -e ../sent.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "c"}
"#,
        config,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn(
        "b",
        LoopOpts {
            subscriptions: Some(vec!["build_broken".into()]),
            ..LoopOpts::default()
        },
    )
    .await;
    run.spawn(
        "c",
        LoopOpts {
            subscriptions: None,
            ..LoopOpts::default()
        },
    )
    .await;
    run.rt.release().await;
    let ends = run.wait().await;
    assert_all_completed(&ends);
    let listing = &tool_results(&run, "a", "list_loops")[0].1;
    assert!(
        listing.contains("b") && listing.contains("c") && listing.contains("ralph"),
        "{listing}"
    );
    let share = &tool_results(&run, "a", "share_data")[0];
    assert!(
        share.0 && share.1.contains("over the limit of 64 bytes"),
        "{share:?}"
    );
    // b listens to build_broken only; c subscribes to nothing: it hears every loop's
    // broadcast but no system alert (not a's start).
    assert_eq!(requests_containing(&run, "b", "main is red"), vec![2]);
    assert!(requests_containing(&run, "b", "see README").is_empty());
    assert_eq!(requests_containing(&run, "c", "main is red"), vec![2]);
    assert_eq!(requests_containing(&run, "c", "see README"), vec![2]);
    assert!(requests_containing(&run, "c", "loop `a` started").is_empty());
    assert!(requests_containing(&run, "b", "0123456789").is_empty());
    // The payload limit holds for a message's and a question's own text too (a worker host
    // or a model could otherwise send megabytes that every recipient's inbox and the event
    // log keep).
    let alerts = tool_results(&run, "a", "broadcast_alert");
    assert!(
        alerts[2].0
            && alerts[2]
                .1
                .contains("message of 80 bytes is over the limit of 64 bytes"),
        "{alerts:?}"
    );
    let query = &tool_results(&run, "a", "query_loop")[0];
    assert!(
        query.0
            && query
                .1
                .contains("question of 80 bytes is over the limit of 64 bytes"),
        "{query:?}"
    );
    assert!(requests_containing(&run, "b", "ABCDEFGHIJ").is_empty());
    assert!(requests_containing(&run, "b", "KLMNOPQRST").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_times_out_at_the_askers_deadline_and_is_recorded_once() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - query_loop: {target_exec_id: b, question: "Slow question", timeout_ms: 200}
    - calls:
        - complete_task: {summary: "a went on without the answer"}
b:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../a-done.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "b done"}
  answers:
    - reply: "too late"
      delay_ms: 60000
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    let started = Instant::now();
    run.rt.release().await;
    run.until_tool_result("a", "query_loop").await;
    run.touch("a-done.flag");
    let ends = run.wait().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the answer's delay was waited out"
    );
    assert!(completed(&ends, "a") && completed(&ends, "b"), "{ends:?}");
    let r = tool_results(&run, "a", "query_loop");
    assert!(
        r[0].0 && r[0].1.contains("no reply from loop 'b' within 200 ms"),
        "{r:?}"
    );
    let outcomes: Vec<EventKind> = run
        .events
        .events()
        .into_iter()
        .map(|e| e.kind)
        .filter(|k| {
            matches!(
                k,
                EventKind::QueryAnswered { .. } | EventKind::QueryFailed { .. }
            )
        })
        .collect();
    assert!(
        matches!(&outcomes[..], [EventKind::QueryFailed { from, to, error, .. }]
            if &**from == "a" && &**to == "b" && error.contains("within 200 ms")),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_loop_releases_its_worktree_watch_while_others_run() {
    let mut run = Run::new(
        r#"
a:
  turns:
    - calls:
        - complete_task: {summary: "a done at once"}
b:
  turns:
    - calls:
        - run_command: {command: "until [ -e ../b-may-finish.flag ]; do sleep 0.02; done"}
    - calls:
        - complete_task: {summary: "b done"}
"#,
    )
    .await;
    run.spawn("a", LoopOpts::default()).await;
    run.spawn("b", LoopOpts::default()).await;
    let mut both = vec![run.path("a"), run.path("b")];
    both.sort();
    assert_eq!(run.rt.watched_roots().await, both);
    run.rt.release().await;
    let (first, end) = run.rt.next_end(WAIT).await.expect("a ends");
    assert_eq!(first, "a", "{end:?}");
    assert_eq!(run.rt.watched_roots().await, vec![run.path("b")]);
    run.touch("b-may-finish.flag");
    let (second, end) = run.rt.next_end(WAIT).await.expect("b ends");
    assert_eq!(second, "b");
    assert!(matches!(end, LoopEnd::Completed { .. }), "{end:?}");
    assert!(run.rt.watched_roots().await.is_empty());
}
