//! Who owns a run record, through the real binary: one process at a time (a second
//! `run --resume` of a live run refuses with exit code 75 and names the holder), `status`
//! tells a run whose process is gone (`interrupted`) from a live one (`running`), the newest
//! run is the one that started last whatever its directory is called, and a resume does not
//! carry the interrupted run's "never started" reason into a loop that then completed.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::flagged_run::{FlaggedRun, summary};
use common::wait_until;

/// How long the tests wait for a run to reach the state they need.
const WAIT: Duration = Duration::from_secs(60);

/// The exit code of a `run` that refuses a run record another process holds.
const HELD_EXIT: i32 = 75;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

/// `taskdaemon status --dir DIR` (plus `extra`): its stdout; panics when it fails.
fn status(dir: &Path, extra: &[&str]) -> String {
    let out = Command::new(bin())
        .args(["status", "--dir"])
        .arg(dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for `child` up to `limit`; kills it and returns `None` when it is still running.
fn wait_for(child: &mut Child, limit: Duration) -> Option<Output> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            let mut stdout = String::new();
            let mut stderr = String::new();
            use std::io::Read;
            if let Some(mut s) = child.stdout.take() {
                s.read_to_string(&mut stdout).unwrap();
            }
            if let Some(mut s) = child.stderr.take() {
                s.read_to_string(&mut stderr).unwrap();
            }
            return Some(Output {
                status: child.wait().unwrap(),
                stdout: stdout.into_bytes(),
                stderr: stderr.into_bytes(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A project whose loop `w` waits on `{flags}/release` in its first iteration (saying so
/// with `{flags}/waiting`), then completes.
type Project = FlaggedRun;

impl Project {
    fn waiting() -> Project {
        Project::new(
            r#"
w:
  turns:
    - calls:
        - run_command: {command: "touch {f}/waiting; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "w done"}
"#,
            "  - {name: w, type: ralph, task: \"Wait.\"}\n",
        )
    }

    fn spawn(&self, extra: &[&str]) -> Child {
        self.command(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Starts the run, waits until `w` waits, and kills the process (SIGKILL); returns the
    /// run id. The flag is removed so that the next wait can be seen.
    fn killed_run(&self) -> String {
        let mut child = self.spawn(&[]);
        wait_until("w to wait", WAIT, || self.flag("waiting").exists());
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_file(self.flag("waiting")).unwrap();
        self.run_id()
    }
}

#[test]
fn a_second_resume_of_a_live_run_refuses_and_names_the_holder() {
    let p = Project::waiting();
    let run_id = p.killed_run();

    let mut first = p.spawn(&["--resume", &run_id]);
    wait_until("the first resume to wait", WAIT, || {
        p.flag("waiting").exists()
    });
    let mut second = p.spawn(&["--resume", &run_id]);
    let refused = wait_for(&mut second, Duration::from_secs(20));
    // Whatever happened, the first one may finish now.
    std::fs::write(p.flag("release"), "").unwrap();
    let first_out = wait_for(&mut first, WAIT).expect("the first resume ends once released");
    let refused = refused.expect("the second resume refuses at once instead of running");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(HELD_EXIT), "stderr: {stderr}");
    assert!(
        stderr.contains(&format!("process {}", first.id())),
        "names the holder's pid: {stderr}"
    );
    assert!(stderr.contains("since 20"), "says since when: {stderr}");
    assert!(stderr.contains("owner.lock"), "names the lock: {stderr}");
    assert_eq!(
        first_out.status.code(),
        Some(0),
        "the holder finishes the run: {}",
        String::from_utf8_lossy(&first_out.stderr)
    );
    assert_eq!(summary(&p.run_dir)["status"], "completed");
    // The refused process wrote nothing: every event number is used once.
    let seqs: Vec<u64> = common::lines(&p.run_dir.join("events.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["seq"].as_u64())
        .collect();
    let mut unique = seqs.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), seqs.len(), "no event number is used twice");
}

#[test]
fn a_killed_run_is_shown_interrupted_and_a_live_one_running() {
    let p = Project::waiting();
    let mut child = p.spawn(&[]);
    wait_until("w to wait", WAIT, || p.flag("waiting").exists());
    let live = status(&p.run_dir, &[]);
    let head = live.lines().next().unwrap_or_default().to_string();
    assert!(head.contains(" running "), "a live run: {live}");

    child.kill().unwrap(); // SIGKILL: nothing of the run gets to write its end
    child.wait().unwrap();
    std::fs::write(p.flag("release"), "").unwrap();
    assert_eq!(
        summary(&p.run_dir)["status"],
        "running",
        "the record says so"
    );
    let dead = status(&p.run_dir, &[]);
    let head = dead.lines().next().unwrap_or_default().to_string();
    assert!(head.contains(" interrupted "), "{dead}");
    assert!(
        !dead.contains("running"),
        "no loop is shown running: {dead}"
    );
    let json: Value = serde_json::from_str(&status(&p.run_dir, &["--json"])).unwrap();
    assert_eq!(json["status"], "interrupted", "{json}");
}

#[test]
fn latest_is_the_run_that_started_last_not_the_last_name() {
    let p = Project::new(
        "q:\n  turns:\n    - calls:\n        - complete_task: {summary: done}\n",
        "  - {name: q, type: ralph, task: \"Finish.\"}\n",
    );
    let runs = p.run_dir.parent().unwrap().join("runs");
    let mut ids = Vec::new();
    // Started first, named last; started last, named first.
    for name in ["zz-started-first", "aa-started-last"] {
        let dir = runs.join(name);
        let out = Command::new(bin())
            .args(["run", "-c"])
            .arg(&p.config)
            .arg("--run-dir")
            .arg(&dir)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ids.push(summary(&dir)["run_id"].as_str().unwrap().to_string());
        // Start times are recorded to the millisecond.
        std::thread::sleep(Duration::from_millis(20));
    }
    let shown = status(&runs, &[]);
    let head = shown.lines().next().unwrap_or_default();
    assert!(
        head.starts_with(&format!("run {} ", ids[1])),
        "the newest by start time ({}): {shown}",
        ids[1]
    );
}

#[test]
fn a_loop_that_completes_after_resume_does_not_keep_the_interrupted_reason() {
    // One loop at a time: `later` never starts before the Ctrl-C.
    let p = Project::new(
        r#"
w:
  turns:
    - calls:
        - run_command: {command: "touch {f}/waiting; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "w done"}
later:
  turns:
    - calls:
        - complete_task: {summary: "later done"}
"#,
        "  - {name: w, type: ralph, task: \"Wait.\"}\n  - {name: later, type: ralph, task: \"Finish.\"}\n",
    );
    let config = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(
        &p.config,
        format!("concurrency: {{max-loops: 1}}\n{config}"),
    )
    .unwrap();
    let mut child = p.spawn(&[]);
    wait_until("w to wait", WAIT, || p.flag("waiting").exists());
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    std::fs::write(p.flag("release"), "").unwrap();
    let out = wait_for(&mut child, WAIT).expect("the run stops after Ctrl-C");
    assert_eq!(out.status.code(), Some(130));
    let s = summary(&p.run_dir);
    assert_eq!(s["loops"]["later"]["status"], "stopped", "{s}");
    assert_eq!(
        s["loops"]["later"]["reason"],
        "never started: the run was interrupted"
    );

    let run_id = p.run_id();
    let mut resumed = p.spawn(&["--resume", &run_id]);
    let out = wait_for(&mut resumed, WAIT).expect("the resumed run ends");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&p.run_dir);
    for name in ["w", "later"] {
        let l = &s["loops"][name];
        assert_eq!(l["status"], "completed", "{s}");
        assert!(
            l["reason"].is_null(),
            "{name} completed: no reason of the interrupted run is kept: {l}"
        );
    }
    let table = status(&p.run_dir, &[]);
    assert!(!table.contains("never started"), "{table}");
    // `w` started before the Ctrl-C: the resumed run goes on with it without announcing it
    // again (no second `loop_started` event, no second alert to the others).
    let events = std::fs::read_to_string(p.run_dir.join("events.jsonl")).unwrap();
    for name in ["w", "later"] {
        let started = events
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "loop_started" && e["loop_name"] == name)
            .count();
        assert_eq!(started, 1, "loop_started of {name}:\n{events}");
    }
}
