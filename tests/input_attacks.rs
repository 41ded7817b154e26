//! Hostile input on the two stdin fronts, through the real binary: a line that is not UTF-8,
//! a line of 100 MB, and JSON nested far deeper than any parser's recursion limit. Each must
//! get an answer (with its id where one can be read), later lines must still be served by
//! the same session (read tracking included), and memory must stay bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_taskdaemon");

/// How long a test waits for one answer before calling it lost.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// The size of the over-long lines sent below.
const HUGE_LINE: usize = 100_000_000;

/// Peak memory a front may reach while reading a [`HUGE_LINE`]: the line itself would not
/// fit, a capped line buffer and the process's usual footprint (~35 MB in a debug build) do.
const PEAK_RSS_LIMIT_KB: u64 = 100 * 1024;

/// A front (`tool exec` or `mcp`) running as a child, with its output lines read by a thread
/// so that a lost answer is a timeout, not a hang.
struct Front {
    child: Child,
    /// `None` once closed by [`Front::finish`].
    stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Front {
    fn start(args: &[&str], worktree: &Path) -> Front {
        let mut child = common::spawn_piped(
            Command::new(BIN)
                .args(args)
                .arg("--worktree")
                .arg(worktree)
                .env("TASKDAEMON_LOG", "warn"),
        );
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, answers) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = Vec::new();
            while stdout.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8(std::mem::take(&mut line))
                    .expect("every output line is UTF-8");
                if sender.send(text).is_err() {
                    return;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Front {
            child,
            stdin: Some(stdin),
            answers,
            stderr: Some(stderr),
        }
    }

    fn stdin(&mut self) -> &mut ChildStdin {
        self.stdin.as_mut().unwrap()
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stdin().write_all(bytes).unwrap();
        self.stdin().flush().unwrap();
    }

    fn send_json(&mut self, value: &Value) {
        self.send(format!("{value}\n").as_bytes());
    }

    /// Sends one line of `len` bytes: `prefix`, then `a`s, then `suffix`, in 1 MiB writes.
    fn send_huge(&mut self, prefix: &str, len: usize, suffix: &str) {
        self.send(prefix.as_bytes());
        let chunk = vec![b'a'; 1 << 20];
        let mut left = len - prefix.len() - suffix.len();
        while left > 0 {
            let n = left.min(chunk.len());
            self.stdin().write_all(&chunk[..n]).unwrap();
            left -= n;
        }
        self.send(format!("{suffix}\n").as_bytes());
    }

    /// The next output line, parsed; panics if none comes within [`ANSWER_WAIT`].
    fn answer(&self) -> Value {
        let line = self
            .answers
            .recv_timeout(ANSWER_WAIT)
            .unwrap_or_else(|e| panic!("no answer within {ANSWER_WAIT:?} ({e})"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// The peak resident memory of the front so far (VmHWM), in kB.
    fn peak_rss_kb(&self) -> u64 {
        common::tool_exec::peak_kib(self.child.id())
    }

    /// Closes stdin and waits for the exit; returns the status and everything on stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (status, stderr)
    }
}

impl Drop for Front {
    /// A test that failed part-way leaves no front running.
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `tool exec` with one call sent and its answer checked to carry `id`.
fn exec_call(front: &mut Front, id: &str, name: &str, input: Value) -> Value {
    front.send_json(&json!({"id": id, "name": name, "input": input}));
    let answer = front.answer();
    assert_eq!(answer["id"], id, "answers come back in order: {answer}");
    answer
}

fn content(answer: &Value) -> &str {
    answer["content"].as_str().unwrap()
}

#[test]
fn exec_answers_a_line_that_is_not_utf8_and_keeps_its_read_tracking() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.txt");
    std::fs::write(&file, "alpha\nbeta\n").unwrap();
    let mut exec = Front::start(&["tool", "exec"], dir.path());
    let r = exec_call(&mut exec, "1", "read_file", json!({"path": "a.txt"}));
    assert_eq!(r["is_error"], false, "{r}");

    // Latin-1 in a string value: the request cannot be read as meant, so nothing runs.
    exec.send(
        b"{\"id\": \"bad\", \"name\": \"edit_file\", \"input\": {\"path\": \"a.txt\", \
          \"old_string\": \"beta\", \"new_string\": \"caf\xe9\"}}\n",
    );
    let r = exec.answer();
    assert_eq!(r["id"], "bad", "{r}");
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        content(&r).contains("request line 2 is not valid UTF-8"),
        "{r}"
    );
    assert!(content(&r).contains("0xe9 at byte offset 102"), "{r}");
    // Bad bytes where no id can be read: answered with a null id.
    exec.send(b"\xff\xfe\x00garbage\n");
    let r = exec.answer();
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_eq!(r["is_error"], true, "{r}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "alpha\nbeta\n");

    // The same context goes on: the read before the bad lines still allows this edit.
    let edit = json!({"path": "a.txt", "old_string": "beta", "new_string": "gamma"});
    let r = exec_call(&mut exec, "3", "edit_file", edit);
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "alpha\ngamma\n");
    let (status, stderr) = exec.finish();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn exec_answers_an_over_long_line_with_bounded_memory_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut exec = Front::start(&["tool", "exec"], dir.path());

    // The id comes first: it is read from the head of the line.
    exec.send_huge(
        r#"{"id": "big", "name": "write_file", "input": {"path": "big.txt", "content": ""#,
        HUGE_LINE,
        r#""}}"#,
    );
    let r = exec.answer();
    assert_eq!(r["id"], "big", "{r}");
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        content(&r).contains(&format!("request line 1 is {HUGE_LINE} bytes")),
        "{r}"
    );
    assert!(content(&r).contains("16777216 bytes (16 MiB)"), "{r}");
    assert!(!dir.path().join("big.txt").exists());

    // The id comes after the bulk: it cannot be read, the answer says null.
    exec.send_huge(
        r#"{"name": "write_file", "input": {"path": "big.txt", "content": ""#,
        20 << 20,
        r#""}, "id": "late"}"#,
    );
    let r = exec.answer();
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_eq!(r["is_error"], true, "{r}");

    let r = exec_call(
        &mut exec,
        "after",
        "write_file",
        json!({"path": "small.txt", "content": "x\n"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    let peak = exec.peak_rss_kb();
    assert!(
        peak < PEAK_RSS_LIMIT_KB,
        "tool exec peaked at {peak} kB reading a {HUGE_LINE}-byte line"
    );
    let (status, stderr) = exec.finish();
    assert!(status.success(), "{status}: {stderr}");
}

/// `[[[...]]]` `depth` levels deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn exec_answers_a_deeply_nested_line_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut exec = Front::start(&["tool", "exec"], dir.path());
    let line = format!(
        r#"{{"id": "deep", "name": "glob", "input": {{"pattern": {}}}}}"#,
        nested(1_000_000)
    );
    exec.send(format!("{line}\n").as_bytes());
    let r = exec.answer();
    assert_eq!(r["id"], "deep", "{r}");
    assert_eq!(r["is_error"], true, "{r}");
    assert!(content(&r).contains("recursion limit exceeded"), "{r}");

    let r = exec_call(&mut exec, "next", "glob", json!({"pattern": "*"}));
    assert_eq!(r["is_error"], false, "{r}");
    let (status, stderr) = exec.finish();
    assert!(status.success(), "{status}: {stderr}");
}

/// `taskdaemon mcp` after the initialize handshake.
fn mcp(worktree: &Path) -> Front {
    let mut front = Front::start(&["mcp"], worktree);
    front.send_json(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    let r = front.answer();
    assert_eq!(r["id"], 1, "{r}");
    front.send_json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    front
}

/// A `tools/call` request line.
fn tool_call(id: i64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

/// The next answer, checked to be a JSON-RPC error for `id` with `code`; returns its message.
fn mcp_error(front: &Front, id: Value, code: i64) -> String {
    let r = front.answer();
    assert_eq!(r["jsonrpc"], "2.0", "{r}");
    assert_eq!(r["id"], id, "{r}");
    assert_eq!(r["error"]["code"], code, "{r}");
    r["error"]["message"].as_str().unwrap().to_string()
}

/// The next answer, checked to be a tool result for `id`; returns (isError, text).
fn mcp_result(front: &Front, id: i64) -> (bool, String) {
    let r = front.answer();
    assert_eq!(r["id"], id, "{r}");
    let result = &r["result"];
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    (result["isError"] == true, text.to_string())
}

#[test]
fn mcp_answers_a_request_that_is_not_utf8_and_keeps_its_read_tracking() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "hello world\n").unwrap();
    let mut mcp = mcp(dir.path());
    mcp.send_json(&tool_call(2, "read_file", json!({"path": "notes.txt"})));
    let (is_error, text) = mcp_result(&mcp, 2);
    assert!(!is_error, "{text}");

    mcp.send(
        b"{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": \"tools/call\", \"params\": {\"name\": \
          \"edit_file\", \"arguments\": {\"path\": \"notes.txt\", \"old_string\": \"world\", \
          \"new_string\": \"caf\xe9\"}}}\n",
    );
    let message = mcp_error(&mcp, json!(3), -32700);
    assert!(message.contains("not valid UTF-8"), "{message}");
    assert!(message.contains("0xe9 at byte offset"), "{message}");
    mcp.send(b"\xff\xfe\n");
    mcp_error(&mcp, Value::Null, -32700);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "hello world\n");

    let edit = json!({"path": "notes.txt", "old_string": "world", "new_string": "mcp"});
    mcp.send_json(&tool_call(4, "edit_file", edit));
    let (is_error, text) = mcp_result(&mcp, 4);
    assert!(!is_error, "{text}");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "hello mcp\n");
    let (status, stderr) = mcp.finish();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn mcp_answers_an_over_long_request_with_bounded_memory_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut mcp = mcp(dir.path());
    mcp.send_huge(
        r#"{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "write_file", "arguments": {"path": "big.txt", "content": ""#,
        HUGE_LINE,
        r#""}}}"#,
    );
    let message = mcp_error(&mcp, json!(5), -32600);
    assert!(message.contains(&format!("{HUGE_LINE} bytes")), "{message}");
    assert!(message.contains("16 MiB"), "{message}");
    assert!(!dir.path().join("big.txt").exists());

    mcp.send_json(&json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}));
    let r = mcp.answer();
    assert_eq!(r["id"], 6, "{r}");
    assert!(r["result"]["tools"].is_array(), "{r}");
    let peak = mcp.peak_rss_kb();
    assert!(
        peak < PEAK_RSS_LIMIT_KB,
        "mcp peaked at {peak} kB reading a {HUGE_LINE}-byte line"
    );
    let (status, stderr) = mcp.finish();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn mcp_answers_a_deeply_nested_request_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut mcp = mcp(dir.path());
    let line = format!(
        r#"{{"jsonrpc": "2.0", "id": "deep", "method": "tools/call", "params": {{"name": "glob", "arguments": {{"pattern": {}}}}}}}"#,
        nested(1_000_000)
    );
    mcp.send(format!("{line}\n").as_bytes());
    let message = mcp_error(&mcp, json!("deep"), -32700);
    assert!(message.contains("recursion limit exceeded"), "{message}");

    mcp.send_json(&tool_call(8, "glob", json!({"pattern": "*"})));
    let (is_error, text) = mcp_result(&mcp, 8);
    assert!(!is_error, "{text}");
    let (status, stderr) = mcp.finish();
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn mcp_answers_a_misshapen_request_with_its_id_and_drops_a_misshapen_notification() {
    let dir = tempfile::tempdir().unwrap();
    let mut mcp = mcp(dir.path());
    mcp.send(b"{\"jsonrpc\": \"2.0\", \"id\": 9, \"method\": \"tools/call\", \"params\": 5}\n");
    mcp_error(&mcp, json!(9), -32602);

    // Nobody waits for a notification: no answer, a line on stderr, and the session goes on
    // (the next answer is the next request's).
    mcp.send(b"{\"jsonrpc\": \"2.0\", \"method\": \"notifications/cancelled\", \"params\": 5}\n");
    mcp.send_json(&json!({"jsonrpc": "2.0", "id": 10, "method": "tools/list"}));
    let r = mcp.answer();
    assert_eq!(r["id"], 10, "{r}");
    assert!(r["result"]["tools"].is_array(), "{r}");
    let (status, stderr) = mcp.finish();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("dropped a notification (method \"notifications/cancelled\")"),
        "{stderr}"
    );
}
