//! `taskdaemon run` against OpenAI-compatible servers that others wrote, each started by the
//! test on a free 127.0.0.1 port: llama-cpp-python's server running the SmolLM2-135M model
//! (a real model: its quality does not matter, that the loop round-trips through real tool
//! calls does) and mock-myna (scripted replies through its seeding endpoint; it records the
//! requests it received).
//!
//! The servers live in Python environments under the cargo target directory, made by
//! `scripts/interop-servers.sh` (CI runs it before `cargo test`; a test runs it itself when
//! an environment is missing, see tests/common/interop.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;

mod common;

use common::interop::{self, Server};

/// Longest a run may take before the test gives up on it (a guard, not an expectation).
const RUN_GUARD: Duration = Duration::from_secs(300);

/// A git repository to run loops on and a config beside it, in a temp directory with its
/// own HOME.
struct Project {
    tmp: TempDir,
}

impl Project {
    /// `<tmp>/user`, a repository with one commit, and `<tmp>/taskdaemon.yml` = `config`
    /// (`repo: user` is prepended).
    fn new(config: &str) -> Project {
        let project = Project {
            tmp: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(project.root().join("home/.config")).unwrap();
        common::init_repo(&project.repo(), &[("README.md", "an interop test\n")]);
        std::fs::write(project.config(), format!("repo: user\n{config}")).unwrap();
        project
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    fn repo(&self) -> PathBuf {
        self.root().join("user")
    }

    fn config(&self) -> PathBuf {
        self.root().join("taskdaemon.yml")
    }

    fn run_dir(&self) -> PathBuf {
        self.root().join("run")
    }

    /// `taskdaemon run` to its end: exit code and output (stdout, then stderr).
    fn run(&self) -> (Option<i32>, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
            .arg("run")
            .arg("-c")
            .arg(self.config())
            .arg("--run-dir")
            .arg(self.run_dir())
            .current_dir(self.root())
            .env("HOME", self.root().join("home"))
            .env("XDG_CONFIG_HOME", self.root().join("home/.config"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // No server here needs a key; one set for the user's own runs stays out.
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > RUN_GUARD {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    fn summary(&self) -> Value {
        let path = self.run_dir().join("summary.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    fn jsonl(&self, path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn events(&self) -> Vec<Value> {
        self.jsonl(&self.run_dir().join("events.jsonl"))
    }

    fn transcript(&self, name: &str) -> Vec<Value> {
        self.jsonl(
            &self
                .run_dir()
                .join("loops")
                .join(name)
                .join("transcript.jsonl"),
        )
    }

    /// A file as the loop's branch has it.
    fn on_branch(&self, branch: &str, file: &str) -> String {
        common::git(&self.repo(), &["show", &format!("{branch}:{file}")])
    }
}

/// Transcript entries of kind `entry` at `turn`.
fn entries<'a>(transcript: &'a [Value], entry: &str, turn: u64) -> Vec<&'a Value> {
    transcript
        .iter()
        .filter(|e| e["entry"] == entry && e["turn"] == turn)
        .collect()
}

/// The ids of the tool results in a request entry's new messages.
fn results_sent(request: &Value) -> Vec<String> {
    request["new_messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().into_iter().flatten())
        .filter(|b| b["type"] == "tool_result")
        .filter_map(|b| b["tool_use_id"].as_str().map(str::to_string))
        .collect()
}

/// Checks the loop `name` of a finished run: it completed in one iteration, and its
/// transcript shows a response with tool calls at turn 1, a result for each of them, those
/// results sent in the request of turn 2, and that request answered (no model error).
/// Returns the turn-1 tool calls (`{id, name, input}`).
fn assert_round_trip(project: &Project, name: &str, context: &str) -> Vec<Value> {
    let transcript = project.transcript(name);
    let errors: Vec<&Value> = transcript
        .iter()
        .filter(|e| e["entry"] == "model_error")
        .collect();
    assert!(errors.is_empty(), "model errors: {errors:#?}\n{context}");

    let first = entries(&transcript, "response", 1);
    assert_eq!(first.len(), 1, "{transcript:#?}\n{context}");
    let calls = first[0]["response"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !calls.is_empty(),
        "the model made no tool call at turn 1: {:#}\n{context}",
        first[0]
    );
    let ids: Vec<String> = calls
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect();
    let results: Vec<String> = entries(&transcript, "tool_result", 1)
        .iter()
        .map(|r| r["call_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(results, ids, "every call ran once: {transcript:#?}");

    let second = entries(&transcript, "request", 2);
    assert_eq!(
        second.len(),
        1,
        "no second model call: {transcript:#?}\n{context}"
    );
    assert_eq!(
        results_sent(second[0]),
        ids,
        "the results went back with the next request"
    );
    assert_eq!(
        entries(&transcript, "response", 2).len(),
        1,
        "the request carrying the results was answered: {transcript:#?}\n{context}"
    );

    let summary = project.summary();
    let solo = &summary["loops"][name];
    assert_eq!(solo["status"], "completed", "{summary:#}\n{context}");
    assert_eq!(solo["iterations"], 1, "{summary:#}");
    let events = project.events();
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "loop_completed" && e["loop_name"] == name),
        "{events:#?}"
    );
    calls
}

/// The config of a one-loop run against `base_url`: a loop type with two short tools and
/// short prompts (each token costs the small model time), one iteration of at most
/// `max_turns` turns, and a validation that always passes, so that the loop completes once
/// its turns are over, whatever the model did with them.
fn config(base_url: &str, model: &str, max_turns: u32, task: &str) -> String {
    format!(
        "llm:
  provider: openai
  base-url: {base_url}
  model: {model}
  max-tokens: 96
  temperature: 0
  max-retries: 0
  timeout-ms: 120000
loop-types:
  writer:
    extends: code
    tools: [write_file, complete_task]
    system-prompt: \"You are {{{{ loop_name }}}}. Use the tools.\"
    iteration-prompt: \"{{{{ task }}}}\"
    max-iterations: 1
    max-turns: {max_turns}
loops:
  - name: solo
    type: writer
    task: {task}
    validation: \"true\"
"
    )
}

#[test]
fn a_loop_round_trips_real_tool_calls_through_llama_cpp_python_server() {
    let llama = interop::llama();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("llama-server.log");
    // chatml-function-calling is the chat format of this server that turns `tools` with
    // `tool_choice: "auto"` into a grammar the model's reply must follow (a message or
    // function calls); the GGUF's own template ignores tools unless one function is named.
    // --n_batch/--n_ubatch 1: larger batches crash this build on 2-core AMD machines.
    let server = Server::start(&log, "/v1/models", |port| {
        let mut c = Command::new(&llama.python);
        c.args(["-m", "llama_cpp.server", "--model"])
            .arg(&llama.gguf)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--n_batch", "1", "--n_ubatch", "1", "--n_ctx", "2048"])
            .args(["--chat_format", "chatml-function-calling"])
            .current_dir(tmp.path());
        c
    });
    let project = Project::new(&config(
        &server.base_url(),
        "smollm2",
        2,
        "Call write_file to write hi to a.txt.",
    ));
    let started = Instant::now();
    let (code, out) = project.run();
    eprintln!("taskdaemon run took {:?}", started.elapsed());
    let context = format!(
        "{out}\n--- llama-cpp-python server log (end) ---\n{}",
        server.log_tail()
    );
    assert_eq!(code, Some(0), "{context}");
    let calls = assert_round_trip(&project, "solo", &context);
    eprintln!("the model's calls at turn 1: {calls:?}");
    assert!(
        calls.iter().all(|c| c["name"] == "write_file"),
        "{calls:#?}"
    );
    // The server's side: three requests answered 200, none refused. With `stream: auto`
    // (the default) the first request asks for a stream; this server, given tools, closes
    // that stream before its first event ("Automatic streaming tool choice is not
    // supported"), so the client sends it again for a whole reply and asks for whole replies
    // from then on: one streamed attempt, then the two turns.
    let log = server.log_text();
    let ok = log
        .matches("\"POST /v1/chat/completions HTTP/1.1\" 200")
        .count();
    assert_eq!(ok, 3, "{}", server.log_tail());
    assert!(
        !log.contains("\"POST /v1/chat/completions HTTP/1.1\" 5"),
        "{}",
        server.log_tail()
    );
}

/// A Chat Completions reply of mock-myna's seeding endpoint, `message` as its only choice.
fn seeded(message: Value, finish_reason: &str) -> Value {
    json!({
        "path": "/v1/chat/completions",
        "json_body": {
            "id": "chatcmpl-seeded",
            "object": "chat.completion",
            "created": 0,
            "model": "mock-chat-v1",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
        }
    })
}

fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
}

#[test]
fn a_loop_round_trips_several_tool_calls_through_mock_myna() {
    let python = interop::myna();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("myna.log");
    let server = Server::start(&log, "/healthz", |port| {
        let mut c = Command::new(&python);
        c.args(["-m", "uvicorn", "myna.main:app", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            // Its settings also come from a `.env` in the working directory: none here.
            .current_dir(tmp.path());
        c
    });
    // Two calls in one response, then a reply without calls (the iteration's end).
    for reply in [
        seeded(
            json!({"role": "assistant", "content": null, "tool_calls": [
                call("call_a", "write_file", json!({"path": "a.txt", "content": "alpha\n"})),
                call("call_b", "write_file", json!({"path": "b.txt", "content": "beta\n"})),
            ]}),
            "tool_calls",
        ),
        seeded(
            json!({"role": "assistant", "content": "Both files are written."}),
            "stop",
        ),
    ] {
        let (status, body) = server
            .request("POST", "/__myna/responses/next", Some(&reply))
            .unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let project = Project::new(&config(
        &server.base_url(),
        "mock-chat-v1",
        4,
        "Write a.txt and b.txt.",
    ));
    let (code, out) = project.run();
    let context = format!("{out}\n--- mock-myna log (end) ---\n{}", server.log_tail());
    assert_eq!(code, Some(0), "{context}");
    let calls = assert_round_trip(&project, "solo", &context);
    assert_eq!(calls.len(), 2, "{calls:#?}");
    let branch = project.summary()["loops"]["solo"]["branch"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(project.on_branch(&branch, "a.txt"), "alpha\n");
    assert_eq!(project.on_branch(&branch, "b.txt"), "beta\n");

    // What mock-myna received: two chat requests, the second carrying the calls (with text
    // content, never null) and a `tool` message answering each.
    let (status, body) = server.request("GET", "/__myna/requests", None).unwrap();
    assert_eq!(status, 200, "{body}");
    let recorded: Value = serde_json::from_str(&body).unwrap();
    let chats: Vec<&Value> = recorded["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .map(|r| &r["json"])
        .collect();
    assert_eq!(chats.len(), 2, "{recorded:#}");
    for chat in &chats {
        assert_eq!(chat["tool_choice"], "auto", "{chat:#}");
    }
    let messages = chats[1]["messages"].as_array().unwrap();
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("{messages:#?}"));
    assert!(assistant["content"].is_string(), "{assistant:#}");
    let answered: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    assert_eq!(answered, ["call_a", "call_b"], "{messages:#?}");
}
