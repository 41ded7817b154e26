//! Helpers shared by the integration tests: git repositories, waiting for a condition,
//! whether commands are fully confined here, and finding the processes a confined command
//! left.

// Each test crate uses part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod attack;
pub mod browser;
pub mod debian_packages;
pub mod fixture_project;
pub mod flagged_run;
pub mod http_once;
pub mod interop;
pub mod machine_gits;
pub mod netns;
pub mod pip_env;
pub mod python_sdk;
pub mod run_story;
pub mod sccache;
pub mod tool_exec;

/// The lines of the file at `path`; none while it cannot be read (not written yet).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Polls `done` every 20 ms until it holds; panics, naming `what`, once `limit` has passed.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this machine confines commands fully (the probe the launcher uses); when not,
/// the attack tests have nothing to attack (the gap is reported by `status` and the run's
/// warning instead), and they say which branch they took.
pub fn fully_confined() -> bool {
    let missing = td_confine::protections().missing();
    if !missing.is_empty() {
        eprintln!("branch: this machine lacks protections: {missing:?}");
    }
    missing.is_empty()
}

/// Starts `command` with its stdin, stdout and stderr piped.
pub fn spawn_piped(command: &mut Command) -> Child {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"))
}

/// Writes a project for the scripted model into `root`: a git repository `root/repo` with
/// `script.yml` (`script`) and `taskdaemon.yml` running `loops` (YAML list items). `{f}` in
/// the script stands for `root/flags`, a directory the loops' commands may write
/// (`sandbox.writable`), through which they signal the test. Returns the config's path and
/// the flags directory.
pub fn flagged_project(root: &Path, script: &str, loops: &str) -> (PathBuf, PathBuf) {
    let flags = root.join("flags");
    let repo = root.join("repo");
    std::fs::create_dir_all(&flags).unwrap();
    init_repo(&repo, &[("README.md", "sample\n")]);
    let f = flags.display().to_string();
    std::fs::write(repo.join("script.yml"), script.replace("{f}", &f)).unwrap();
    let config = repo.join("taskdaemon.yml");
    std::fs::write(
        &config,
        format!(
            "llm: {{provider: scripted, script: script.yml}}\nsandbox: {{writable: ['{f}']}}\nloops:\n{loops}"
        ),
    )
    .unwrap();
    (config, flags)
}

/// Runs git in `dir` with a fixed identity and no system config; panics with git's stderr
/// when it fails; returns its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git repository at `dir` with `files` committed on `main`.
pub fn init_repo(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, content) in files {
        std::fs::write(dir.join(name), content).unwrap();
    }
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "init"]);
}

/// Host pids of live (not zombie) processes whose command line contains `marker`. A confined
/// command lives in its own PID namespace, so the pids it could report (`$$`, `$!`) are not
/// the host's: tests give its processes a unique argument and look for that.
pub fn pids_with(marker: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if String::from_utf8_lossy(&cmdline).contains(marker) && !state.starts_with(['Z', 'X']) {
            pids.push(pid);
        }
    }
    pids
}

/// A one-thread server on 127.0.0.1 that hands every connection to `serve` and keeps what
/// `serve` returns (a request seen, a token sent), until it is dropped. A panic in the
/// server thread would only stall the client, so tests check what was kept instead.
pub struct LocalServer<T: Send + 'static> {
    /// The port it listens on.
    pub port: u16,
    seen: std::sync::Arc<std::sync::Mutex<Vec<T>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> LocalServer<T> {
    /// Starts serving.
    pub fn start(
        mut serve: impl FnMut(std::net::TcpStream) -> Option<T> + Send + 'static,
    ) -> LocalServer<T> {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kept, stopping) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Some(item) = serve(stream) {
                            kept.lock().unwrap().push(item);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        LocalServer {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// An OpenAI-style API root on this server.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What `serve` kept so far.
    pub fn seen(&self) -> Vec<T>
    where
        T: Clone,
    {
        self.seen.lock().unwrap().clone()
    }
}

impl<T: Send + 'static> Drop for LocalServer<T> {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `taskdaemon ARGS` run in `dir` with a home of its own under `dir`, no system git config,
/// no provider key variables, stdin closed and stdout/stderr piped.
pub fn isolated_taskdaemon(dir: &Path, args: &[&str]) -> Command {
    let home = dir.join("home");
    std::fs::create_dir_all(home.join(".config")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
    cmd.args(args)
        .current_dir(dir)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for `child` to end, polling every `poll`; kills it after `limit`. `Err` says why it
/// did not succeed (for a provisioning step's message of what to do by hand).
pub fn wait_successful(child: &mut Child, limit: Duration, poll: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("failed ({status})")),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("took more than {limit:?} and was killed"));
            }
            Ok(None) => std::thread::sleep(poll),
            Err(e) => return Err(format!("could not be waited for ({e})")),
        }
    }
}

/// `taskdaemon run -c CONFIG --run-dir RUN_DIR` to its end, without `CARGO_TARGET_DIR` (a
/// loop's cargo builds in its worktree, not into the target directory of the cargo running
/// the tests, which commands may not write); panics with both streams unless it succeeded.
/// Returns its stdout and stderr.
pub fn run_to_success(config: &Path, run_dir: &Path) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .env_remove("CARGO_TARGET_DIR")
        .args(["run", "-c"])
        .arg(config)
        .arg("--run-dir")
        .arg(run_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}
