//! The `taskdaemon tool exec` contract, driven through the real binary: one ToolContext for
//! the whole stream, one flushed answer per line before the next line is read, read tracking
//! active across calls, receipts that `replay verify` can re-run.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

struct Exec {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Exec {
    fn start(worktree: &Path, extra: &[&str]) -> Exec {
        let mut child = Command::new(bin())
            .args(["tool", "exec", "--worktree"])
            .arg(worktree)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Exec {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one call and waits for its answer (the contract: answered before the next read).
    fn call(&mut self, id: &str, name: &str, input: Value) -> Value {
        let line = json!({"id": id, "name": name, "input": input}).to_string();
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["id"], id, "answers come back in order: {v}");
        v
    }

    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin);
        self.child.wait().unwrap()
    }
}

#[test]
fn one_context_for_the_stream_and_changes_between_calls_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\n").unwrap();
    let mut exec = Exec::start(dir.path(), &[]);

    let edit = json!({"path": "a.txt", "old_string": "beta", "new_string": "gamma"});
    let r = exec.call("1", "edit_file", edit.clone());
    assert_eq!(
        r["is_error"], true,
        "edit without read must be refused: {r}"
    );
    assert!(r["content"].as_str().unwrap().contains("read_file"));

    let r = exec.call("2", "read_file", json!({"path": "a.txt"}));
    assert_eq!(r["is_error"], false, "{r}");
    assert!(r["content"].as_str().unwrap().contains("beta"));

    // The caller changes the file between two calls: the stamp from call 2 is now stale.
    std::fs::write(dir.path().join("a.txt"), "alpha\nbeta\nchanged\n").unwrap();
    let r = exec.call("3", "edit_file", edit.clone());
    assert_eq!(r["is_error"], true, "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("changed on disk"),
        "{r}"
    );

    let r = exec.call("4", "read_file", json!({"path": "a.txt"}));
    assert_eq!(r["is_error"], false);
    let r = exec.call("5", "edit_file", edit);
    assert_eq!(r["is_error"], false, "{r}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\ngamma\nchanged\n"
    );

    // The loop's own write refreshes the stamp: an edit right after it works.
    let r = exec.call(
        "6",
        "write_file",
        json!({"path": "b.txt", "content": "one\n"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    let r = exec.call(
        "7",
        "edit_file",
        json!({"path": "b.txt", "old_string": "one", "new_string": "two"}),
    );
    assert_eq!(r["is_error"], false, "{r}");
    assert!(exec.finish().success());
}

#[test]
fn tools_flag_restricts_the_set_and_refuses_unknown_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut exec = Exec::start(dir.path(), &["--tools", "read_file,glob"]);
    let r = exec.call("1", "write_file", json!({"path": "x", "content": "y"}));
    assert_eq!(r["is_error"], true);
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("unknown tool 'write_file'")
    );
    assert!(!dir.path().join("x").exists());
    assert!(exec.finish().success());

    let out = Command::new(bin())
        .args([
            "tool",
            "exec",
            "--tools",
            "read_file,raed_file",
            "--worktree",
        ])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown tool 'raed_file'"), "{err}");
}

#[test]
fn missing_worktree_is_a_clear_startup_error() {
    let out = Command::new(bin())
        .args(["tool", "exec", "--worktree", "/no/such/dir"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/dir"));
}

#[test]
fn config_overrides_reach_the_calls() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("td.yml");
    std::fs::write(&cfg, "catalog:\n  read_file:\n    max-output-bytes: 200\n").unwrap();
    let wt = dir.path().join("wt");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::write(wt.join("big.txt"), "line of text\n".repeat(1000)).unwrap();
    let mut exec = Exec::start(&wt, &["-c", cfg.to_str().unwrap()]);
    let r = exec.call("1", "read_file", json!({"path": "big.txt"}));
    assert!(r["content"].as_str().unwrap().len() < 400, "{r}");
    assert!(exec.finish().success());

    std::fs::write(&cfg, "catalog:\n  read_file:\n    max-output-byte: 200\n").unwrap();
    let out = Command::new(bin())
        .args(["tool", "exec", "-c", cfg.to_str().unwrap(), "--worktree"])
        .arg(&wt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:") && err.contains("did you mean `max-output-bytes`"),
        "{err}"
    );
}

#[test]
fn receipts_replay_identically_and_divergence_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pristine = dir.path().join("pristine");
    let wt = dir.path().join("wt");
    for d in [&pristine, &wt] {
        std::fs::create_dir_all(d.join("src")).unwrap();
        std::fs::write(d.join("src/lib.rs"), "pub fn a() -> u32 { 1 }\n").unwrap();
    }
    let log = dir.path().join("receipts.jsonl");
    let mut exec = Exec::start(&wt, &["--receipts", log.to_str().unwrap()]);
    exec.call("1", "read_file", json!({"path": "src/lib.rs"}));
    exec.call(
        "2",
        "edit_file",
        json!({"path": "src/lib.rs", "old_string": "1 }", "new_string": "2 }"}),
    );
    exec.call(
        "3",
        "write_file",
        json!({"path": "notes.md", "content": "# n\n"}),
    );
    exec.call("4", "grep", json!({"pattern": "fn a"}));
    exec.call(
        "5",
        "run_command",
        json!({"command": "cat notes.md src/lib.rs"}),
    );
    exec.call("6", "read_file", json!({"path": "missing.txt"}));
    assert!(exec.finish().success());

    let lines = std::fs::read_to_string(&log).unwrap();
    let receipts: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(receipts.len(), 6);
    let write = &receipts[2];
    assert_eq!(write["tool"], "write_file");
    assert_eq!(write["side_effects"][0]["kind"], "file_written");
    assert_eq!(write["side_effects"][0]["path"], "notes.md");
    assert_eq!(receipts[4]["side_effects"][0]["kind"], "command_run");
    assert_eq!(receipts[4]["side_effects"][0]["exit_code"], 0);
    for r in &receipts {
        assert!(r["input_hash"].as_str().unwrap().starts_with("sha256:"));
        assert!(r["output_hash"].as_str().unwrap().starts_with("sha256:"));
        assert_eq!(r["exec_id"], "exec");
    }

    let verify = |worktree: &Path| {
        Command::new(bin())
            .args(["replay", "verify"])
            .arg(&log)
            .arg("--worktree")
            .arg(worktree)
            .output()
            .unwrap()
    };
    let out = verify(&pristine);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("6 identical, 0 differ"), "{text}");
    // Replay worked on a copy: the pristine tree is unchanged.
    assert_eq!(
        std::fs::read_to_string(pristine.join("src/lib.rs")).unwrap(),
        "pub fn a() -> u32 { 1 }\n"
    );
    assert!(!pristine.join("notes.md").exists());

    // A different starting tree makes the outputs differ, and each difference is named.
    std::fs::write(
        pristine.join("src/lib.rs"),
        "pub fn a() -> u32 { 1 } // x\n",
    )
    .unwrap();
    let out = verify(&pristine);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("DIFFERS #1 read_file"), "{text}");
}
