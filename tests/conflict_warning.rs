//! Early conflict warnings (issue 15), through the real binary on real git: two scripted
//! loops change the same line of `shared.txt` in their own worktrees in their first
//! iterations; both are told, in a later prompt, the other loop's name and the file, exactly
//! once each (also after they touch the file again); a `conflict_predicted` event is in
//! `events.jsonl`. A third loop that changes another file hears nothing. With
//! `conflict-warnings: off` nobody hears anything.
//!
//! The loops wait for the warning with a command that polls `events.jsonl` (readable by
//! commands, never writable): the event is recorded once both warnings are in the inboxes,
//! so the request after that command carries them. The wait has a limit, which the run with
//! warnings off sits out.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

/// Longest a run may take before the test gives up on it (a guard, not an expectation).
const RUN_GUARD: Duration = Duration::from_secs(90);

/// Each loop: change its file and end its first iteration; wait until a warning is
/// predicted (or `{{POLLS}}` × 50 ms); change the file again and end the second iteration;
/// give the watch a moment to compare again; complete. The conflict the warning predicted
/// then happens: of `one` and `two`, the one integrated second gets it back and resolves it.
const SCRIPT: &str = r#"
one:
  turns:
    - calls:
        - write_file: {path: shared.txt, content: "from one\n"}
    - say: "first pass done"
    - calls:
        - run_command: {command: "{{WAIT}}"}
    - calls:
        - write_file: {path: shared.txt, content: "from one, again\n"}
    - say: "second pass done"
    - calls:
        - run_command: {command: "sleep 1"}
    - calls:
        - complete_task: {summary: "one done"}
    # Used only by the loop integrated second: the merge queue hands the conflict back,
    # and it keeps both sides.
    - calls:
        - write_file: {path: shared.txt, content: "from one, again\nfrom two, again\n"}
        - complete_task: {summary: "one merged with the other"}
two:
  turns:
    - calls:
        - write_file: {path: shared.txt, content: "from two\n"}
    - say: "first pass done"
    - calls:
        - run_command: {command: "{{WAIT}}"}
    - calls:
        - write_file: {path: shared.txt, content: "from two, again\n"}
    - say: "second pass done"
    - calls:
        - run_command: {command: "sleep 1"}
    - calls:
        - complete_task: {summary: "two done"}
    # Used only by the loop integrated second: the merge queue hands the conflict back,
    # and it keeps both sides.
    - calls:
        - write_file: {path: shared.txt, content: "from one, again\nfrom two, again\n"}
        - complete_task: {summary: "two merged with the other"}
three:
  turns:
    - calls:
        - write_file: {path: three.txt, content: "three\n"}
    - say: "first pass done"
    - calls:
        - run_command: {command: "{{WAIT}}"}
    - calls:
        - write_file: {path: three.txt, content: "three, again\n"}
    - say: "second pass done"
    - calls:
        - run_command: {command: "sleep 1"}
    - calls:
        - complete_task: {summary: "three done"}
"#;

/// A temp directory with a repository (`user`), a config beside it and a run directory.
struct Project {
    tmp: tempfile::TempDir,
}

impl Project {
    /// `extra` goes at the top of `taskdaemon.yml`; `polls` bounds the wait for a warning.
    fn new(extra: &str, polls: u32) -> Project {
        let tmp = tempfile::tempdir().unwrap();
        let project = Project { tmp };
        common::init_repo(
            &project.repo(),
            &[("README.md", "a project\n"), ("shared.txt", "original\n")],
        );
        let config_dir = project.root().join("config");
        std::fs::create_dir_all(&config_dir).unwrap();
        let events = project.run_dir().join("events.jsonl");
        let wait = format!(
            "i=0; until grep -q '\"event\":\"conflict_predicted\"' '{}'; do i=$((i+1)); [ $i -gt {polls} ] && break; sleep 0.05; done; echo waited $i",
            events.display()
        );
        std::fs::write(
            config_dir.join("script.yml"),
            SCRIPT.replace("{{WAIT}}", &wait.replace('"', "\\\"")),
        )
        .unwrap();
        let loops: String = ["one", "two", "three"]
            .iter()
            .map(|n| format!("  - {{name: {n}, type: code, task: Change the file of {n}.}}\n"))
            .collect();
        std::fs::write(
            project.config(),
            format!(
                "{extra}repo: ../user\nllm: {{provider: scripted, script: script.yml}}\nconcurrency: {{max-loops: 3}}\nloops:\n{loops}"
            ),
        )
        .unwrap();
        project
    }

    fn root(&self) -> &Path {
        self.tmp.path()
    }

    fn repo(&self) -> PathBuf {
        self.root().join("user")
    }

    fn config(&self) -> PathBuf {
        self.root().join("config").join("taskdaemon.yml")
    }

    fn run_dir(&self) -> PathBuf {
        self.root().join("run")
    }

    /// `taskdaemon run` to its end; panics with its output unless it exits 0.
    fn run(&self) {
        let home = self.root().join("home");
        std::fs::create_dir_all(home.join(".config")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
            .args(["run", "-c"])
            .arg(self.config())
            .arg("--run-dir")
            .arg(self.run_dir())
            .current_dir(self.root())
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > RUN_GUARD {
                let _ = child.kill();
                panic!("the run was still going after {RUN_GUARD:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn events(&self) -> Vec<Value> {
        jsonl(&self.run_dir().join("events.jsonl"))
    }

    /// The text of every model request of loop `name` (the messages new in it), with its
    /// iteration.
    fn requests(&self, name: &str) -> Vec<(u64, String)> {
        let path = self
            .run_dir()
            .join("loops")
            .join(name)
            .join("transcript.jsonl");
        jsonl(&path)
            .into_iter()
            .filter(|e| e["entry"] == "request")
            .map(|e| {
                let iteration = e["iteration"].as_u64().unwrap_or(0);
                (iteration, e["new_messages"].to_string())
            })
            .collect()
    }
}

fn jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// The requests of `name` that carry a conflict warning.
fn warned(project: &Project, name: &str) -> Vec<(u64, String)> {
    project
        .requests(name)
        .into_iter()
        // The alert's inbox line, "- alert from `taskdaemon` (conflict_predicted): ...", not
        // the waiting command that names the event.
        .filter(|(_, text)| text.contains("(conflict_predicted)"))
        .collect()
}

#[test]
fn loops_changing_the_same_lines_are_both_warned_once_naming_the_other_and_the_file() {
    let project = Project::new("", 400);
    project.run();

    let predicted: Vec<Value> = project
        .events()
        .into_iter()
        .filter(|e| e["event"] == "conflict_predicted")
        .collect();
    assert_eq!(predicted.len(), 1, "{predicted:#?}");
    assert_eq!(predicted[0]["loops"], serde_json::json!(["one", "two"]));
    assert_eq!(predicted[0]["files"], serde_json::json!(["shared.txt"]));

    for (me, other) in [("one", "two"), ("two", "one")] {
        let seen = warned(&project, me);
        assert_eq!(
            seen.len(),
            1,
            "{me} saw the warning {} times: {seen:#?}",
            seen.len()
        );
        let (iteration, text) = &seen[0];
        assert!(
            *iteration >= 2,
            "{me}: the warning came in iteration {iteration}"
        );
        assert!(
            text.contains(&format!("`{other}`")) && text.contains("shared.txt"),
            "{me}: the warning names neither `{other}` nor the file: {text}"
        );
    }
    assert_eq!(
        warned(&project, "three"),
        Vec::new(),
        "three changed no shared file"
    );
    // Nothing of it went to three by any road.
    assert!(
        !project.events().iter().any(|e| e["event"] == "alert"
            && e["recipients"]
                .as_array()
                .is_some_and(|r| r.iter().any(|n| n == "three"))),
        "an alert reached three"
    );
}

#[test]
fn with_conflict_warnings_off_nobody_is_warned() {
    let project = Project::new("conflict-warnings: off\n", 60);
    project.run();
    assert!(
        !project
            .events()
            .iter()
            .any(|e| e["event"] == "conflict_predicted" || e["event_type"] == "conflict_predicted"),
        "a warning was recorded with conflict-warnings: off"
    );
    for name in ["one", "two", "three"] {
        assert_eq!(warned(&project, name), Vec::new(), "{name} was warned");
    }
}
