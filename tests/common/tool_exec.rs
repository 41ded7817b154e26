//! A `taskdaemon tool exec` session driven line by line, as the attack tests use it, and
//! what they read about its process in `/proc`.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
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
    /// The `tool exec --worktree DIR` command line, for a caller that adds arguments, sets
    /// the environment or pipes stderr before [`Exec::spawn`].
    pub fn command(worktree: &Path) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
        command.args(["tool", "exec", "--worktree"]).arg(worktree);
        command
    }

    /// Starts `command` with its stdin and stdout piped (stderr as the command says:
    /// inherited unless set).
    pub fn spawn(command: &mut Command) -> Exec {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
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

    /// A session on `worktree`.
    pub fn start(worktree: &Path) -> Exec {
        Exec::spawn(&mut Exec::command(worktree))
    }

    /// A session with more arguments after `--worktree DIR`.
    pub fn start_with<S: AsRef<OsStr>>(worktree: &Path, extra: &[S]) -> Exec {
        Exec::spawn(Exec::command(worktree).args(extra))
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

    /// Sends one call with `id` and waits for its answer, which must carry the same id (the
    /// contract: each line is answered before the next is read); returns the whole answer.
    pub fn answer(&mut self, id: &str, name: &str, input: Value) -> Value {
        let line = json!({"id": id, "name": name, "input": input}).to_string();
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(v["id"], id, "answers come back in order: {v}");
        v
    }

    /// One call, numbered after the previous ones; returns the whole answer.
    pub fn request(&mut self, name: &str, input: Value) -> Value {
        self.next += 1;
        let id = self.next.to_string();
        self.answer(&id, name, input)
    }

    /// One call; returns (is_error, content).
    pub fn call(&mut self, name: &str, input: Value) -> (bool, String) {
        let v = self.request(name, input);
        (
            v["is_error"].as_bool().unwrap(),
            v["content"].as_str().unwrap().to_string(),
        )
    }

    /// The content of the answer to `command` run by the command tool `tool`, whether or
    /// not it is an error.
    pub fn sh(&mut self, tool: &str, command: &str) -> String {
        let v = self.request(tool, json!({"command": command}));
        v["content"].as_str().unwrap().to_string()
    }

    /// Closes stdin and waits for the process to exit.
    pub fn finish(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.child.wait().unwrap()
    }

    /// Closes stdin and checks that the process exits with success.
    pub fn finish_ok(self) {
        let status = self.finish();
        assert!(status.success(), "tool exec exited with {status}");
    }

    /// Closes stdin, waits for the exit and returns it with everything the process wrote
    /// on stderr (which the command must have piped); what is left on stdout is dropped.
    pub fn finish_with_stderr(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let mut pipe = self
            .child
            .stderr
            .take()
            .expect("finish_with_stderr needs a session whose stderr is piped");
        // Read apart from stdout, so that neither pipe can fill up and stall the process.
        let stderr = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes)
                .map(|_| String::from_utf8_lossy(&bytes).into_owned())
        });
        let mut rest = Vec::new();
        self.stdout.read_to_end(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        (status, stderr.join().unwrap().unwrap())
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
