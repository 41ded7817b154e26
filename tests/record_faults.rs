//! Records under faults, through the real binary: a disk that fills up under a `tool exec`
//! or an `mcp` session (a small tmpfs holds their receipts).
//!
//! A full disk must stop the work whose record cannot be written (fail closed) and say why
//! and what to do. Tests that need a tmpfs mount say so and return where the machine cannot
//! give them.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn jsonl(path: &Path) -> Vec<Value> {
    lines(path)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A small tmpfs, unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`) on `dir`; `None` (with the reason
    /// printed) where this machine does not allow it.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                dir: dir.to_path_buf(),
            }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs on {}: {}",
                    dir.display(),
                    text(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }

    /// Fills the file system: a file of zeros grows until the kernel says there is no room.
    /// Files that end in a partly used page still take a little more.
    fn fill(&self) -> PathBuf {
        let path = self.dir.join("fill");
        let mut f = std::fs::File::create(&path).unwrap();
        for size in [1 << 20, 4096, 1] {
            let chunk = vec![0u8; size];
            while f.write_all(&chunk).is_ok() {}
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a process of a failed test may still hold a file there.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Receipts of `tool` in a receipt log (the lines that parse).
fn receipts_of(log: &Path, tool: &str) -> Vec<Value> {
    jsonl(log)
        .into_iter()
        .filter(|r| r["tool"] == tool)
        .collect()
}

/// A `tool exec` session driven a line at a time.
struct Exec {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Exec {
    fn start(worktree: &Path, receipts: &Path) -> Exec {
        let mut child = Command::new(bin())
            .args(["tool", "exec", "--worktree"])
            .arg(worktree)
            .arg("--receipts")
            .arg(receipts)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
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

    fn call(&mut self, id: &str, name: &str, input: Value) -> Value {
        writeln!(
            self.stdin,
            "{}",
            json!({"id": id, "name": name, "input": input})
        )
        .unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    }
}

/// Calls `write_file` of `n{i}.txt` until the answers say receipts cannot be written, then
/// twice more; returns the number of the first such call.
fn write_until_refused(mut call: impl FnMut(usize) -> (bool, String)) -> usize {
    let mut failed = None;
    for i in 1..=40 {
        let (is_error, content) = call(i);
        match failed {
            None if is_error => {
                assert!(
                    content.contains("receipt") && content.contains("could not be"),
                    "call {i}: {content}"
                );
                failed = Some(i);
            }
            None => {}
            Some(first) => {
                assert!(
                    is_error,
                    "call {i} after the failed receipt of call {first}"
                );
                assert!(
                    content.contains("not run") && content.contains("receipt"),
                    "call {i}: {content}"
                );
                if i >= first + 2 {
                    return first;
                }
            }
        }
    }
    panic!("40 receipts fitted on a full disk");
}

/// After the failed receipt of call `first`: the calls before it left their receipts and
/// files, and none after it ran.
fn check_refusals(worktree: &Path, log: &Path, first: usize) {
    let torn: Vec<String> = lines(log)
        .into_iter()
        .filter(|l| serde_json::from_str::<Value>(l).is_err())
        .collect();
    assert!(
        torn.is_empty(),
        "the failed receipt left no torn line: {torn:?}"
    );
    let recorded = receipts_of(log, "write_file").len();
    assert_eq!(
        recorded,
        first - 1,
        "every call before the failure has its receipt"
    );
    for i in 1..first + 3 {
        assert_eq!(
            worktree.join(format!("n{i}.txt")).exists(),
            i <= first,
            "n{i}.txt (the receipt of call {first} failed)"
        );
    }
}

#[test]
fn tool_exec_answers_an_error_and_runs_nothing_more_once_a_receipt_cannot_be_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let Some(disk) = Tmpfs::mount(&root.join("disk"), "1m") else {
        return;
    };
    let worktree = root.join("wt");
    std::fs::create_dir_all(&worktree).unwrap();
    let log = disk.dir.join("receipts.jsonl");
    let mut exec = Exec::start(&worktree, &log);
    let first = exec.call("0", "list_directory", json!({}));
    assert_eq!(first["is_error"], false, "{first}");
    disk.fill();
    let failed = write_until_refused(|i| {
        let a = exec.call(
            &i.to_string(),
            "write_file",
            json!({"path": format!("n{i}.txt"), "content": "x\n"}),
        );
        assert_eq!(a["id"], i.to_string());
        (
            a["is_error"] == true,
            a["content"].as_str().unwrap_or_default().to_string(),
        )
    });
    check_refusals(&worktree, &log, failed);
    drop(exec.stdin);
    let out = exec.child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("receipt") && stderr.contains(&log.display().to_string()),
        "{stderr}"
    );
}

#[test]
fn mcp_answers_an_error_and_runs_nothing_more_once_a_receipt_cannot_be_written() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let Some(disk) = Tmpfs::mount(&root.join("disk"), "1m") else {
        return;
    };
    let worktree = root.join("wt");
    std::fs::create_dir_all(&worktree).unwrap();
    let log = disk.dir.join("receipts.jsonl");
    let mut child = Command::new(bin())
        .args(["mcp", "--worktree"])
        .arg(&worktree)
        .arg("--receipts")
        .arg(&log)
        .env("TASKDAEMON_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    let mut answer = |id: usize| loop {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the server hung up"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}),
    );
    answer(0);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    disk.fill();
    let failed = write_until_refused(|i| {
        send(
            json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "write_file",
            "arguments": {"path": format!("n{i}.txt"), "content": "x\n"}}}),
        );
        let a = answer(i);
        let result = &a["result"];
        (
            result["isError"] == true,
            result["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    });
    check_refusals(&worktree, &log, failed);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("receipt") && stderr.contains(&log.display().to_string()),
        "{stderr}"
    );
}
