//! A model call that fails and is retried, through the real binary against an
//! OpenAI-compatible server on 127.0.0.1: the retry is an event of the run record (what
//! failed, the attempt, the wait), the progress says the loop is retrying, the summary
//! rebuilt from the events and `status` still read the record, and stderr, a pipe here,
//! carries no terminal escape codes.

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

mod common;
use common::http_once::answer_once;
use common::{LocalServer, init_repo};

/// What the server says first: an overload that passes.
const OVERLOADED: &str =
    r#"{"error":{"message":"the model is overloaded, try again","type":"server_error"}}"#;

/// Reads one request and answers it with the next of `replies` (status, body).
fn answer(stream: TcpStream, replies: &[(u16, String)], next: &AtomicUsize) -> Option<()> {
    answer_once(stream, |_| {
        replies
            .get(next.fetch_add(1, Ordering::SeqCst))
            .cloned()
            .unwrap_or((418, r#"{"error":{"message":"no reply scripted"}}"#.into()))
    })
    .map(drop)
}

/// `taskdaemon ARGS` isolated, with `NO_COLOR` unset: colours are up to the terminal test.
fn taskdaemon(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = common::isolated_taskdaemon(dir, args);
    cmd.env_remove("NO_COLOR");
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_retried_model_call_is_recorded_shown_and_logged_without_escape_codes() {
    let done = json!({
        "choices": [{"message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2}
    });
    let replies = Arc::new(vec![(503, OVERLOADED.to_string()), (200, done.to_string())]);
    let next = Arc::new(AtomicUsize::new(0));
    let server = {
        let (replies, next) = (replies.clone(), next.clone());
        LocalServer::start(move |stream| answer(stream, &replies, &next))
    };
    let tmp = tempfile::tempdir().unwrap();
    init_repo(&tmp.path().join("repo"), &[("README.md", "a project\n")]);
    let config = tmp.path().join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            r#"
repo: repo
llm:
  provider: openai
  base-url: "{}"
  model: x
  max-retries: 2
  retry-base-ms: 1
  timeout-ms: 20000
loops:
  - name: solo
    type: code
    task: Say hello.
    validation: "true"
"#,
            server.base_url()
        ),
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let out = taskdaemon(
        tmp.path(),
        &[
            "run",
            "-c",
            config.to_str().unwrap(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
    )
    // The retry's log line is at info level: shown here, so that its colours would be too.
    .env("TASKDAEMON_LOG", "info")
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(next.load(Ordering::SeqCst), 2, "one failure, one retry");

    // The record: one `model_retried` event saying what failed and how long it waited.
    let events: Vec<Value> = std::fs::read_to_string(run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let retried: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "model_retried")
        .collect();
    assert_eq!(retried.len(), 1, "{events:#?}");
    let r = retried[0];
    assert_eq!(r["loop_name"], "solo", "{r}");
    assert_eq!(r["attempt"], 1, "{r}");
    assert_eq!(r["status"], 503, "{r}");
    assert!(r["wait_ms"].as_u64().is_some_and(|ms| ms <= 1), "{r}");
    assert_eq!(
        r["cause"], "server_error: the model is overloaded, try again",
        "{r}"
    );

    // The progress (plain lines: stdout is a pipe) says the loop is retrying, and why.
    assert!(
        stdout.contains(
            "solo: retrying the model call (attempt 1 failed: HTTP 503: server_error: the model is overloaded"
        ),
        "{stdout}"
    );

    // stderr is a pipe: the log line is there, without a single escape code.
    assert!(stderr.contains("model call failed; retrying"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    assert!(!stdout.contains('\u{1b}'), "{stdout:?}");

    // The summary rebuilt from the events (summary.json lost) and `status` read the event.
    std::fs::remove_file(run_dir.join("summary.json")).unwrap();
    let out = taskdaemon(
        tmp.path(),
        &["status", "--json", "--dir", run_dir.to_str().unwrap()],
    )
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("rebuilt from events.jsonl"), "{stderr}");
    assert!(!stderr.contains("skipped"), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        summary["loops"]["solo"]["status"], "completed",
        "{summary:#}"
    );
}
