//! A `taskdaemon tool exec` session driven line by line, as the attack tests use it, and
//! what they read about its process in `/proc`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A `tool exec` session; the process is killed when the session is dropped unfinished (a
/// failed test must not leave a process hanging on a FIFO).
pub struct Exec {
    /// The `taskdaemon` process.
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Exec {
    /// A session on `worktree`.
    pub fn start(worktree: &Path) -> Exec {
        Exec::start_with(worktree, &[])
    }

    /// A session with more arguments after `--worktree DIR`.
    pub fn start_with(worktree: &Path, extra: &[&std::ffi::OsStr]) -> Exec {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
            .args(["tool", "exec", "--worktree"])
            .arg(worktree)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Exec {
            child,
            stdin,
            stdout,
            next: 0,
        }
    }

    /// A session whose config (written as `taskdaemon.yml` in `config_dir`, outside the
    /// worktree) hides `hidden` from loops (`sandbox.hide`).
    pub fn hiding(worktree: &Path, config_dir: &Path, hidden: &[&Path]) -> Exec {
        let config = config_dir.join("taskdaemon.yml");
        let list: Vec<String> = hidden.iter().map(|p| p.display().to_string()).collect();
        let yaml = format!("sandbox: {{hide: [{}]}}\n", list.join(", "));
        std::fs::write(&config, yaml).unwrap();
        Exec::start_with(worktree, &["-c".as_ref(), config.as_os_str()])
    }

    /// One call; returns (is_error, content).
    pub fn call(&mut self, name: &str, input: Value) -> (bool, String) {
        self.next += 1;
        let id = self.next.to_string();
        let line = json!({"id": id, "name": name, "input": input}).to_string();
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(v["id"], id.as_str(), "{v}");
        (
            v["is_error"].as_bool().unwrap(),
            v["content"].as_str().unwrap().to_string(),
        )
    }

    /// Closes stdin and waits at most `limit` for the process to exit.
    pub fn finish_within(mut self, limit: Duration) -> bool {
        drop(self.stdin.take());
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A number from `/proc/PID/status` (`VmHWM` in KiB, `Threads`...).
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Peak resident memory (`VmHWM`, KiB) of process `pid`.
pub fn peak_kib(pid: u32) -> u64 {
    proc_status(pid, "VmHWM")
}
