//! Crash recovery: a real `taskdaemon run` is killed with SIGKILL in the middle of a loop's
//! iteration, the events log gets a torn last line, and `run --resume` finishes the run:
//! the completed loop is not run again, the other goes on at its next iteration with its
//! progress notes, and what was delivered to it but never shown is shown exactly once.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::init_repo;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn summary(run_dir: &Path) -> Value {
    std::fs::read_to_string(run_dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn sigkill_then_resume_finishes_the_run_without_redoing_or_losing_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let flags = root.join("flags");
    let repo = root.join("repo");
    std::fs::create_dir_all(&flags).unwrap();
    init_repo(&repo, &[("README.md", "sample\n")]);
    let f = flags.display();
    std::fs::write(
        repo.join("script.yml"),
        format!(
            r#"
first:
  turns:
    - calls:
        - run_command: {{command: "until [ -e {f}/second-blocked ]; do sleep 0.05; done"}}
    - calls:
        - share_data: {{target_exec_ids: [second], data_type: note, data: "from first, sent before the crash"}}
    - calls:
        - complete_task: {{summary: "first done"}}
second:
  turns:
    - calls:
        - write_file: {{path: progress.txt, content: "iteration 1\n"}}
    - calls:
        - complete_task: {{summary: "not yet"}}
    - calls:
        - run_command: {{command: "touch {f}/second-blocked; until [ -e {f}/release ]; do sleep 0.05; done"}}
    - calls:
        - write_file: {{path: done.txt, content: "ok\n"}}
    - calls:
        - complete_task: {{summary: "second done"}}
"#
        ),
    )
    .unwrap();
    std::fs::write(
        repo.join("taskdaemon.yml"),
        format!(
            r#"
llm: {{provider: scripted, script: script.yml}}
# The loops' commands wait on flag files the test makes.
sandbox: {{writable: ['{f}']}}
loops:
  - {{name: first, type: ralph, task: "Share a note, then finish."}}
  - name: second
    type: ralph
    task: "Write done.txt."
    validation: "test -e done.txt || {{ echo 'done.txt is missing'; exit 1; }}"
"#,
            f = flags.display()
        ),
    )
    .unwrap();
    let run_dir = root.join("run");
    let config = repo.join("taskdaemon.yml");

    // 1. Start the run and kill it while `second` is in the middle of iteration 2 and the
    //    note from `first` waits, unseen, in its inbox.
    let mut child = Command::new(bin())
        .args(["run", "-c"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("first to complete", || {
        summary(&run_dir)["loops"]["first"]["status"] == "completed"
    });
    let events_before = lines(&run_dir.join("events.jsonl"));
    assert!(
        events_before
            .iter()
            .any(|l| l.contains("\"event\":\"shared\"")),
        "the share happened before the crash"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The killed run's command would wait forever; let it go.
    std::fs::write(flags.join("release"), "").unwrap();
    let first_transcript = lines(&run_dir.join("loops/first/transcript.jsonl"));
    let run_id = summary(&run_dir)["run_id"].as_str().unwrap().to_string();

    // 2. A torn last line, as a crash in the middle of a write leaves it.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(run_dir.join("events.jsonl"))
            .unwrap();
        f.write_all(b"{\"seq\": 9999, \"event\": \"loop_sta")
            .unwrap();
    }

    // 3. Resume.
    let out = Command::new(bin())
        .args(["run", "-c"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(["--resume", &run_id])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains("events.jsonl line"),
        "the torn line is reported: {stderr}"
    );

    let s = summary(&run_dir);
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["loops"]["first"]["status"], "completed");
    assert_eq!(s["loops"]["second"]["status"], "completed");
    assert_eq!(s["loops"]["second"]["iterations"], 2);

    // The completed loop was not run again.
    assert_eq!(
        lines(&run_dir.join("loops/first/transcript.jsonl")),
        first_transcript
    );

    // The other loop went on at iteration 2 with its progress note, and saw the note that
    // was delivered before the crash exactly once.
    let second = lines(&run_dir.join("loops/second/transcript.jsonl"));
    let shown = second
        .iter()
        .filter(|l| {
            l.contains("\"entry\":\"request\"") && l.contains("from first, sent before the crash")
        })
        .count();
    assert_eq!(shown, 1, "the unseen share is shown exactly once");
    let resumed_start = second
        .iter()
        .rposition(|l| l.contains("\"entry\":\"iteration_started\""))
        .unwrap();
    assert!(
        second[resumed_start].contains("\"iteration\":2"),
        "{}",
        second[resumed_start]
    );
    let first_request = &second[resumed_start + 1];
    assert!(
        first_request.contains("done.txt is missing"),
        "progress note restored: {first_request}"
    );
    assert!(first_request.contains("from first, sent before the crash"));

    // Event numbers go on after the crash instead of starting again.
    let events = lines(&run_dir.join("events.jsonl"));
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["seq"].as_u64())
        .collect();
    let mut sorted = seqs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), seqs.len(), "no event number is used twice");
}
