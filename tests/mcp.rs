//! End-to-end tests of `taskdaemon mcp`: the built binary is spawned and driven over stdio by
//! real MCP clients — rmcp's own client, raw JSON-RPC lines, and the official Python SDK
//! (tests/mcp_client.py).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ErrorCode};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ServiceError, ServiceExt};
use serde_json::{Value, json};
use td_toolkit::context::ToolContext;
use td_toolkit::receipts::read_log;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_taskdaemon");

fn call(name: &'static str, args: Value) -> CallToolRequestParams {
    let Value::Object(map) = args else {
        panic!("arguments must be an object");
    };
    CallToolRequestParams::new(name).with_arguments(map)
}

/// What the library's call path answers for `name(input)` in a fresh worktree.
async fn direct(name: &str, input: Value) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::new(dir.path(), "direct").unwrap();
    let out = td_tools::all_tools().call(&ctx, None, name, input).await;
    (out.content, out.is_error)
}

/// The MCP front must be a transparent view of `ToolSet`: the same definitions and the same
/// answers as a direct library call. Comparing against the library keeps this test valid
/// whatever the individual tools do.
#[tokio::test]
async fn rmcp_client_sees_the_tool_set_through_the_binary() {
    let worktree = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let receipts = logs.path().join("receipts.jsonl");
    let command = tokio::process::Command::new(BIN).configure(|c| {
        // The unknown-tool call below makes rmcp log a warning; keep test output clean.
        c.env("TASKDAEMON_LOG", "error")
            .arg("mcp")
            .arg("--worktree")
            .arg(worktree.path())
            .arg("--receipts")
            .arg(&receipts);
    });
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();

    let info = client.peer_info().unwrap();
    let server = info.server_info.as_ref().unwrap();
    assert_eq!(server.name, "taskdaemon");
    assert!(info.capabilities.tools.is_some());

    let listed = client.list_all_tools().await.unwrap();
    let expected = td_tools::all_tools().definitions();
    assert_eq!(listed.len(), expected.len());
    for (tool, def) in listed.iter().zip(&expected) {
        assert_eq!(tool.name, def.name);
        assert_eq!(tool.description.as_deref(), Some(def.description.as_str()));
        assert_eq!(
            Value::Object((*tool.input_schema).clone()),
            def.input_schema
        );
    }

    // `{}` lacks read_file's path and `{"path": 7}` has the wrong type: both must be error
    // results (from schema validation, or from the tool), worded exactly as the library says.
    for args in [json!({}), json!({"path": 7})] {
        let result = client
            .call_tool(call("read_file", args.clone()))
            .await
            .unwrap();
        let (content, is_error) = direct("read_file", args.clone()).await;
        assert_eq!(result.is_error, Some(true), "{args}: {result:?}");
        assert!(is_error);
        assert_eq!(result.content.len(), 1);
        assert_eq!(result.content[0].as_text().unwrap().text, content, "{args}");
    }

    let err = client
        .call_tool(call("read_fiel", json!({"path": "a"})))
        .await
        .unwrap_err();
    let ServiceError::McpError(data) = err else {
        panic!("expected a JSON-RPC error, got {err:?}");
    };
    assert_eq!(data.code, ErrorCode::INVALID_PARAMS);
    assert!(data.message.contains("unknown tool 'read_fiel'"));
    assert!(data.message.contains("read_file, write_file, edit_file"));

    client.cancel().await.unwrap();
    let log = read_log(&receipts).unwrap();
    let tools: Vec<&str> = log.items.iter().map(|r| r.tool.as_ref()).collect();
    assert_eq!(tools, ["read_file", "read_file", "read_fiel"]);
    assert!(
        log.items
            .iter()
            .all(|r| &*r.exec_id == "exec" && r.is_error)
    );
    assert_eq!(*log.items[1].input, json!({"path": 7}));
}

/// Waits for `child` to exit, killing it after `limit`.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("the server did not exit within {limit:?} of stdin closing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the server on `input`, closes its stdin, and returns (exit status, stdout, stderr).
fn run_raw(
    worktree: &Path,
    extra_args: &[&str],
    input: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut child = common::spawn_piped(
        Command::new(BIN)
            .args(["mcp", "--worktree"])
            .arg(worktree)
            .args(extra_args)
            // Debug logging makes rmcp log every message, so stdout staying pure is a real check.
            .env("TASKDAEMON_LOG", "debug"),
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, out, err)
}

#[test]
fn server_answers_then_exits_cleanly_when_stdin_closes() {
    let worktree = tempfile::tempdir().unwrap();
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "nope", "arguments": {}}}),
    ];
    let input: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let (status, out, err) = run_raw(worktree.path(), &[], &input);
    assert!(status.success(), "{status}; stderr: {err}");
    assert!(!err.is_empty(), "debug logs should reach stderr");

    // Every stdout line is a JSON-RPC message: logs never leak into the protocol stream.
    let mut answers: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(answers.iter().all(|a| a["jsonrpc"] == "2.0"), "{out}");
    answers.sort_by_key(|a| a["id"].as_i64());
    let ids: Vec<i64> = answers.iter().filter_map(|a| a["id"].as_i64()).collect();
    assert_eq!(ids, [1, 2, 3], "{out}");
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "taskdaemon");
    assert!(answers[0]["result"]["capabilities"]["tools"].is_object());
    let tools = answers[1]["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), td_tools::all_tools().names().len());
    assert!(tools.iter().all(|t| t["inputSchema"]["type"] == "object"));
    assert_eq!(answers[2]["error"]["code"], -32602);
}

#[test]
fn server_exits_cleanly_when_stdin_closes_before_the_handshake() {
    let worktree = tempfile::tempdir().unwrap();
    let (status, out, err) = run_raw(worktree.path(), &[], "");
    assert!(status.success(), "{status}; stderr: {err}");
    assert_eq!(out, "");
}

fn handshake_and_list() -> String {
    [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ]
    .iter()
    .map(|l| format!("{l}\n"))
    .collect()
}

#[test]
fn tools_flag_limits_what_is_served() {
    let worktree = tempfile::tempdir().unwrap();
    let (status, out, err) = run_raw(
        worktree.path(),
        &["--tools", "grep,read_file"],
        &handshake_and_list(),
    );
    assert!(status.success(), "{status}; stderr: {err}");
    let list = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|a| a["id"] == 2)
        .unwrap();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["grep", "read_file"]);
}

#[test]
fn a_bad_tools_flag_fails_before_serving() {
    let worktree = tempfile::tempdir().unwrap();
    let (status, out, err) = run_raw(worktree.path(), &["--tools", "grpe"], &handshake_and_list());
    assert_eq!(status.code(), Some(2));
    assert_eq!(out, "", "nothing may reach the protocol stream");
    assert!(err.contains("did you mean 'grep'"), "{err}");
}

/// Drives the server with the official Python SDK: the one installed for `python3`, or else
/// one this test installs into its own virtual environment under the target directory
/// (common/python_sdk.rs), so that `cargo test` needs no setup beyond network access.
#[test]
fn python_sdk_reads_then_edits_a_file() {
    let python = common::python_sdk::python_with_sdk();

    let worktree = tempfile::tempdir().unwrap();
    let notes = worktree.path().join("notes.txt");
    let other = worktree.path().join("other.txt");
    std::fs::write(&notes, "hello world\n").unwrap();
    std::fs::write(&other, "untouched\n").unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(BIN)
        .arg(worktree.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let summary: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("no JSON summary ({e}); stdout: {out}; stderr: {err}"));
    assert!(status.success(), "{summary:#}\nstderr: {err}");

    assert_eq!(summary["server_name"], "taskdaemon");
    assert_eq!(summary["tools_capability"], true);
    for name in ["read_file", "edit_file", "grep"] {
        let schema = &summary["schemas"][name];
        assert_eq!(schema["type"], "object", "{name}: {schema}");
        assert!(schema["properties"].is_object(), "{name}: {schema}");
    }

    let read = &summary["read"];
    assert_eq!(read["is_error"], false, "read_file: {read}");
    assert!(
        read["text"].as_str().unwrap().contains("hello world"),
        "{read}"
    );
    let edit = &summary["edit"];
    assert_eq!(edit["is_error"], false, "edit_file: {edit}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "hello mcp\n");

    let unread = &summary["edit_unread"];
    assert_eq!(unread["is_error"], true, "{unread}");
    assert!(
        unread["text"].as_str().unwrap().contains("read_file"),
        "{unread}"
    );
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "untouched\n");

    let invalid = &summary["invalid"];
    assert_eq!(invalid["is_error"], true, "{invalid}");
    assert!(
        invalid["text"].as_str().unwrap().contains("/path"),
        "{invalid}"
    );

    let unknown = &summary["unknown"];
    assert_eq!(unknown["protocol_error"], true, "{unknown}");
    assert_eq!(unknown["code"], -32602, "{unknown}");
}
