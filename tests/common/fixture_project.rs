//! A test project for runs through the real binary: `<tmp>/user` (a repository on `main`
//! with README.md and shared.txt), one scenario of `tests/fixtures/run/` copied to
//! `<tmp>/config` with its `{{KEY}}` placeholders filled, the run record in `<tmp>/run`,
//! and every child process isolated from the machine's git config and home
//! (`HOME`, `XDG_CONFIG_HOME` in the temp dir, `GIT_CONFIG_NOSYSTEM`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// Longest a run may take before the test gives up on it (a guard, not an expectation).
pub const RUN_GUARD: Duration = Duration::from_secs(90);

/// The identity of the user's own commits.
pub const USER_NAME: &str = "Test User";
/// The e-mail of the user's own commits.
pub const USER_EMAIL: &str = "user@example.com";

/// What a finished process left.
pub struct Outcome {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A temp directory holding a user repository, a scenario's config files and a run directory.
pub struct Project {
    tmp: TempDir,
}

impl Project {
    /// A repository `<tmp>/user` on `main` with one commit (README.md, shared.txt), and the
    /// fixture directory `fixture` copied to `<tmp>/config` with `{{KEY}}` replaced by each
    /// value of `vars` (`{{REPO}}` is always the user repository's path).
    pub fn new(fixture: &str, vars: &[(&str, String)]) -> Project {
        let project = Project::empty();
        std::fs::create_dir_all(project.repo()).unwrap();
        std::fs::write(project.repo().join("README.md"), "a test project\n").unwrap();
        std::fs::write(project.repo().join("shared.txt"), "original\n").unwrap();
        project.git(&["init", "--quiet", "-b", "main"]);
        project.git(&["add", "-A"]);
        project.commit("initial");

        let mut vars: Vec<(&str, String)> = vars.to_vec();
        vars.push(("REPO", project.repo().display().to_string()));
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/run")
            .join(fixture);
        std::fs::create_dir_all(project.config_dir()).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            let mut text = std::fs::read_to_string(entry.path()).unwrap();
            for (key, value) in &vars {
                text = text.replace(&format!("{{{{{key}}}}}"), value);
            }
            assert!(
                !text.contains("{{"),
                "{}: a placeholder was not given a value",
                entry.path().display()
            );
            std::fs::write(project.config_dir().join(entry.file_name()), text).unwrap();
        }
        project
    }

    /// Only the temp directory and its isolated home (no repository, no config).
    pub fn empty() -> Project {
        let project = Project {
            tmp: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(project.home().join(".config")).unwrap();
        project
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    pub fn home(&self) -> PathBuf {
        self.root().join("home")
    }

    /// The user's checkout.
    pub fn repo(&self) -> PathBuf {
        self.root().join("user")
    }

    pub fn config_dir(&self) -> PathBuf {
        self.root().join("config")
    }

    pub fn config(&self) -> PathBuf {
        self.config_dir().join("taskdaemon.yml")
    }

    pub fn run_dir(&self) -> PathBuf {
        self.root().join("run")
    }

    /// The isolating environment every child process gets.
    pub fn isolate(&self, cmd: &mut Command) {
        cmd.env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.home().join(".config"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // The OpenAI client sends this key when set; no test server needs one.
            .env_remove("OPENAI_API_KEY");
    }

    pub fn git_command(&self, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("git");
        cmd.args(["-c", &format!("user.name={USER_NAME}")])
            .args(["-c", &format!("user.email={USER_EMAIL}")])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null());
        self.isolate(&mut cmd);
        cmd
    }

    /// Runs git in the user's checkout; returns its trimmed stdout, panics when it fails.
    pub fn git(&self, args: &[&str]) -> String {
        self.git_in(&self.repo(), args)
    }

    pub fn git_in(&self, dir: &Path, args: &[&str]) -> String {
        let out = self.git_command(dir, args).output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?} failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Whether git exits 0 in the user's checkout.
    pub fn git_ok(&self, args: &[&str]) -> bool {
        self.git_command(&self.repo(), args)
            .output()
            .unwrap()
            .status
            .success()
    }

    pub fn commit(&self, message: &str) {
        self.git(&["commit", "--quiet", "-m", message]);
    }

    /// The user's `git status --porcelain` (untracked files included).
    pub fn status(&self) -> String {
        self.git(&["status", "--porcelain"])
    }

    /// Loop branches (`taskdaemon/...`), sorted.
    pub fn loop_branches(&self) -> Vec<String> {
        branch_list(&self.git(&[
            "branch",
            "--list",
            "--format=%(refname:short)",
            "taskdaemon/*",
        ]))
    }

    /// `taskdaemon ARGS` started in `<tmp>` (not in the user's checkout: a default run
    /// directory would land beside the config, never there).
    pub fn taskdaemon(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
        cmd.args(args)
            .current_dir(self.root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.isolate(&mut cmd);
        cmd
    }

    /// `taskdaemon run -c <config> --run-dir <run> EXTRA` to its end.
    pub fn run(&self, config: &Path, extra: &[&str]) -> Outcome {
        let (config, run_dir) = (path_arg(config), path_arg(&self.run_dir()));
        let mut args = vec!["run", "-c", &config, "--run-dir", &run_dir];
        args.extend_from_slice(extra);
        finish(self.taskdaemon(&args).spawn().unwrap(), RUN_GUARD)
    }

    pub fn summary(&self) -> Value {
        read_json(&self.run_dir().join("summary.json"))
    }

    pub fn events(&self) -> Vec<Value> {
        read_jsonl(&self.run_dir().join("events.jsonl"))
    }

    pub fn transcript(&self, name: &str) -> PathBuf {
        self.run_dir()
            .join("loops")
            .join(name)
            .join("transcript.jsonl")
    }
}

pub fn path_arg(path: &Path) -> String {
    path.to_str().expect("temp paths are UTF-8").to_string()
}

pub fn branch_list(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .lines()
        .map(|l| l.trim_start_matches(['*', '+', ' ']).trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    names
}

/// Reads a pipe to its end on a thread (so that a chatty child never blocks on a full pipe).
pub fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut text);
        }
        text
    })
}

/// Waits for `child` to exit, killing it (and failing the test) after `guard`.
pub fn finish(mut child: Child, guard: Duration) -> Outcome {
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_until_exit(&mut child, guard) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the process was still running after {guard:?}; stdout so far:\n{}\nstderr:\n{}",
            stdout.join().unwrap_or_default(),
            stderr.join().unwrap_or_default()
        )
    };
    Outcome {
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// The child's exit status, or `None` if it is still running after `limit`.
pub fn wait_until_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", path.display()))
}

/// Every line of a JSONL file, each of which must parse.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}
