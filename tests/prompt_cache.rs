//! Anthropic prompt caching through the real binary: a `code` loop runs two iterations
//! against a server on 127.0.0.1 that speaks the Messages API, and the requests it received
//! must carry the cache breakpoints and a prefix that is byte-stable across turns and
//! iterations; the cache counts the server reports must reach `summary.json`, and a summary
//! rebuilt from the record must have them too.

use std::net::TcpStream;
use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

mod common;
use common::http_once::answer_once;
use common::init_repo;

const KEY: &str = "sk-ant-prompt-cache-test";
const TASK: &str = "Read README.md and say what the project is.";

/// One request the server received: the raw body and its JSON.
#[derive(Debug, Clone)]
struct Seen {
    raw: String,
    body: Value,
}

/// Reads one request from `stream`, answers `reply` (200, JSON) and returns the request.
fn serve_one(stream: TcpStream, reply: &Value) -> Option<Seen> {
    let request = answer_once(stream, |_| (200, reply.to_string()))?;
    let raw = String::from_utf8(request.body).ok()?;
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    Some(Seen { raw, body })
}

/// A Messages API reply with the cache counts of call `n`.
fn reply(content: Value, stop: &str, n: u64) -> Value {
    json!({
        "id": format!("msg_{n}"),
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop,
        "usage": {
            "input_tokens": 10 + n,
            "output_tokens": 5,
            "cache_read_input_tokens": 1000 * n,
            "cache_creation_input_tokens": 100 + n,
        }
    })
}

/// Each iteration: one `read_file` call, then a turn that ends without calling a tool.
fn replies() -> Vec<Value> {
    let mut out = Vec::new();
    for iteration in 0..2u64 {
        let n = iteration * 2;
        out.push(reply(
            json!([
                {"type": "text", "text": "Reading the README."},
                {"type": "tool_use", "id": format!("toolu_{n}"), "name": "read_file",
                 "input": {"path": "README.md"}}
            ]),
            "tool_use",
            n,
        ));
        out.push(reply(
            json!([{"type": "text", "text": "It is a small project."}]),
            "end_turn",
            n + 1,
        ));
    }
    out
}

fn taskdaemon(dir: &Path, args: &[&str]) -> Output {
    common::isolated_taskdaemon(dir, args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Writes the project's config (`extra_type` goes into the loop type) and runs it.
fn run(dir: &Path, base_url: &str, extra_type: &str) -> Output {
    let config_dir = dir.join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("llm.key"), format!("{KEY}\n")).unwrap();
    let config = config_dir.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            r#"
repo: ../repo
llm:
  provider: anthropic
  base-url: "{base_url}"
  model: claude-sonnet-4-5
  api-key-file: llm.key
  max-retries: 0
  timeout-ms: 20000
loop-types:
  two:
    extends: code
    max-iterations: 2
{extra_type}
loops:
  - name: solo
    type: two
    task: {TASK}
"#
        ),
    )
    .unwrap();
    let run_dir = dir.join("run");
    taskdaemon(
        dir,
        &[
            "run",
            "-c",
            config.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
    )
}

/// `value` without its `cache_control` keys: the content the cache is keyed on.
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "cache_control")
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

#[test]
fn a_loop_sends_breakpoints_and_a_prefix_that_is_the_same_across_turns_and_iterations() {
    let tmp = tempfile::tempdir().unwrap();
    init_repo(
        &tmp.path().join("repo"),
        &[("README.md", "A tiny project that prints hello.\n")],
    );
    let mut replies = replies().into_iter();
    let server = common::LocalServer::start(move |stream| {
        let reply = replies
            .next()
            .unwrap_or_else(|| reply(json!([{"type": "text", "text": "done"}]), "end_turn", 9));
        serve_one(stream, &reply)
    });
    let out = run(tmp.path(), &format!("http://127.0.0.1:{}", server.port), "");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // No validation and no complete_task: both iterations end unfinished and the loop fails.
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let seen = server.seen();
    assert_eq!(seen.len(), 4, "{stdout}\n{stderr}");

    // Breakpoints: tools, system and the conversation's end; from the second turn on also
    // where the previous request ended.
    let marks: Vec<usize> = seen
        .iter()
        .map(|s| s.raw.matches("\"cache_control\"").count())
        .collect();
    assert_eq!(marks, [3, 4, 3, 4]);
    for s in &seen {
        let tools = s.body["tools"].as_array().unwrap();
        assert!(tools.len() > 5, "a code loop's tools: {}", tools.len());
        let (last, rest) = tools.split_last().unwrap();
        assert_eq!(last["cache_control"], json!({"type": "ephemeral"}));
        assert!(rest.iter().all(|t| t.get("cache_control").is_none()));
        assert_eq!(
            s.body["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        let messages = s.body["messages"].as_array().unwrap();
        let end = messages.last().unwrap()["content"]
            .as_array()
            .unwrap()
            .last()
            .unwrap();
        assert_eq!(end["cache_control"], json!({"type": "ephemeral"}));
    }

    // The tool definitions and the system prompt are the same bytes in every request, of
    // either iteration, and they are what was sent.
    let tools = serde_json::to_string(&seen[0].body["tools"]).unwrap();
    let system = serde_json::to_string(&seen[0].body["system"]).unwrap();
    assert!(tools.len() > 10_000, "{}", tools.len());
    for s in &seen {
        assert_eq!(serde_json::to_string(&s.body["tools"]).unwrap(), tools);
        assert_eq!(serde_json::to_string(&s.body["system"]).unwrap(), system);
        assert!(s.raw.contains(&tools) && s.raw.contains(&system));
    }
    assert!(!system.contains("iteration 1") && !system.contains("Progress"));

    // Within an iteration the second request starts with the whole first one.
    for (first, second) in [(&seen[0], &seen[1]), (&seen[2], &seen[3])] {
        let a = strip(&first.body["messages"]);
        let b = strip(&second.body["messages"]);
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(b.len(), a.len() + 2);
        assert_eq!(&b[..a.len()], &a[..]);
    }

    // The first message starts with the task; what changes between iterations (the
    // progress notes, the iteration's number) comes after it.
    let first_text = |s: &Seen| {
        s.body["messages"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (one, two) = (first_text(&seen[0]), first_text(&seen[2]));
    let stable = format!("# Task\n{TASK}\n");
    assert!(
        one.starts_with(&stable) && two.starts_with(&stable),
        "{one}\n---\n{two}"
    );
    assert!(!one.contains("Iteration 1 ended") && two.contains("Iteration 1 ended"));
    assert!(one.contains("iteration 1 of") && two.contains("iteration 2 of"));

    // The cache counts reach the summary, and a summary rebuilt from the record.
    let run_dir = tmp.path().join("run");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    let expected = json!({
        "input_tokens": 10 + 11 + 12 + 13,
        "output_tokens": 20,
        "cache_read_tokens": 1000 + 2000 + 3000,
        "cache_write_tokens": 100 + 101 + 102 + 103,
    });
    assert_eq!(summary["loops"]["solo"]["usage"], expected, "{summary:#}");
    std::fs::remove_file(run_dir.join("summary.json")).unwrap();
    let status = taskdaemon(
        tmp.path(),
        &["status", "--dir", run_dir.to_str().unwrap(), "--json"],
    );
    assert!(status.status.success(), "{}", text(&status.stderr));
    let rebuilt: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(rebuilt["loops"]["solo"]["usage"], expected, "{rebuilt:#}");
}

#[test]
fn prompt_cache_off_sends_no_breakpoint() {
    let tmp = tempfile::tempdir().unwrap();
    init_repo(&tmp.path().join("repo"), &[("README.md", "hello\n")]);
    let server = common::LocalServer::start(move |stream| {
        serve_one(
            stream,
            &reply(json!([{"type": "text", "text": "done"}]), "end_turn", 0),
        )
    });
    let base = format!("http://127.0.0.1:{}", server.port);
    let config_dir = tmp.path().join("config");
    let out = {
        // The same project with `prompt-cache: off` under `llm:`.
        let out = run(tmp.path(), &base, "");
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let config = config_dir.join("taskdaemon.yml");
        let yaml = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            yaml.replace(
                "  max-retries: 0\n",
                "  max-retries: 0\n  prompt-cache: off\n",
            ),
        )
        .unwrap();
        std::fs::remove_dir_all(tmp.path().join("run")).unwrap();
        taskdaemon(
            tmp.path(),
            &[
                "run",
                "-c",
                config.to_str().unwrap(),
                "--run-dir",
                tmp.path().join("run").to_str().unwrap(),
            ],
        )
    };
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let seen = server.seen();
    assert_eq!(seen.len(), 4, "two iterations of one turn, twice");
    let marks: Vec<usize> = seen
        .iter()
        .map(|s| s.raw.matches("cache_control").count())
        .collect();
    assert_eq!(marks, [3, 3, 0, 0], "on (the default), then off");
    assert!(seen[2].body["system"].is_string());
}

#[test]
fn a_system_prompt_that_would_change_between_iterations_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    init_repo(&tmp.path().join("repo"), &[("README.md", "hello\n")]);
    let out = run(
        tmp.path(),
        "http://127.0.0.1:9",
        "    system-prompt: \"You are {{ loop_name }}, iteration {{ iteration }}.\"",
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("system-prompt: it uses a variable that changes between iterations")
            && stderr.contains("move that part to iteration-prompt"),
        "{stderr}"
    );
    assert!(!tmp.path().join("run").join("summary.json").exists());
}
