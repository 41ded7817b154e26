//! Crash recovery: a real `taskdaemon run` is killed with SIGKILL in the middle of a loop's
//! iteration, the events log gets a torn last line, and `run --resume` finishes the run:
//! the completed loop is not run again, the other goes on at its next iteration with its
//! progress notes, and what was delivered to it but never shown is shown exactly once.
//!
//! And what a record can look like after a crash or a full disk: a missing or cut-off
//! `summary.json` (rebuilt by `status` and `--resume`), a summary that lags behind the events
//! (a completed loop still runs no second time), a model reply whose command was running at
//! the kill (asked for again, its command run), and numbers no run can go on from (refused
//! with file, line and field, never a panic or a wrap).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::flagged_run::{FlaggedRun, summary};
use common::{init_repo, lines, wait_until};

/// How long the tests wait for a run to reach the state they need.
const WAIT: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
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
    wait_until("first to complete", WAIT, || {
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

/// A two-loop project whose run the tests kill: `first` completes at once; `second` runs a
/// command that waits on a flag file, so the run can be killed while it is in the middle of
/// its first iteration.
type Project = FlaggedRun;

impl Project {
    /// The usual pair: `first` completes, `second` waits on `{flags}/release` in iteration 1.
    fn pair() -> Project {
        Project::new(
            r#"
first:
  turns:
    - calls:
        - write_file: {path: first.txt, content: "first\n"}
    - calls:
        - complete_task: {summary: "first done"}
second:
  turns:
    - calls:
        - run_command: {command: "touch {f}/second-waiting; until [ -e {f}/release ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "second done"}
"#,
            "  - {name: first, type: ralph, task: \"Write first.txt.\"}\n  - {name: second, type: ralph, task: \"Wait.\"}\n",
        )
    }

    fn start(&self) -> std::process::Child {
        self.command(&[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn resume(&self, run_id: &str) -> std::process::Output {
        self.command(&["--resume", run_id]).output().unwrap()
    }

    /// Starts the pair and kills it (SIGKILL) once `first` completed and `second` waits;
    /// returns the run id.
    fn killed_pair_run(&self) -> String {
        let mut child = self.start();
        wait_until("first to complete and second to wait", WAIT, || {
            summary(&self.run_dir)["loops"]["first"]["status"] == "completed"
                && self.flag("second-waiting").exists()
        });
        child.kill().unwrap();
        child.wait().unwrap();
        // The killed run's command would wait forever; let it go.
        std::fs::write(self.flag("release"), "").unwrap();
        summary(&self.run_dir)["run_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn status(&self, dir: &Path) -> std::process::Output {
        Command::new(bin())
            .args(["status", "--dir"])
            .arg(dir)
            .output()
            .unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_missing_or_damaged_summary_is_rebuilt_by_status_and_resume() {
    let p = Project::pair();
    let run_id = p.killed_pair_run();
    let summary_path = p.run_dir.join("summary.json");
    let original = summary(&p.run_dir);

    // Missing: `status` (of the run directory, and of the directory holding runs) rebuilds it
    // from events.jsonl and says so.
    std::fs::remove_file(&summary_path).unwrap();
    for dir in [p.run_dir.clone(), p.run_dir.parent().unwrap().to_path_buf()] {
        let out = p.status(&dir);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        assert!(stderr.contains("rebuilt from events.jsonl"), "{stderr}");
        assert!(stdout.contains(&format!("run {run_id}")), "{stdout}");
        let first = stdout.lines().find(|l| l.starts_with("first ")).unwrap();
        assert!(first.contains("completed"), "{stdout}");
        let second = stdout.lines().find(|l| l.starts_with("second ")).unwrap();
        // Recorded running, but its process was killed: nothing runs it.
        assert!(second.contains("interrupted"), "{stdout}");
    }
    // `status --json` gives the rebuilt summary with what the events and transcripts hold.
    let out = Command::new(bin())
        .args(["status", "--json", "--dir"])
        .arg(&p.run_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rebuilt: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rebuilt["run_id"], original["run_id"]);
    assert_eq!(rebuilt["config"], original["config"]);
    assert_eq!(rebuilt["started_at"], original["started_at"]);
    for key in [
        "status",
        "iterations",
        "summary",
        "usage",
        "validation",
        "started_at",
        "tools",
    ] {
        assert_eq!(
            rebuilt["loops"]["first"][key], original["loops"]["first"][key],
            "first.{key}"
        );
    }
    assert!(
        rebuilt["loops"]["first"]["tools"]
            .as_object()
            .is_some_and(|t| !t.is_empty()),
        "the per-tool counts come back from the receipts: {rebuilt}"
    );
    assert_eq!(rebuilt["loops"]["second"]["status"], "running");
    assert!(!summary_path.exists(), "status only reads the record");

    // Cut off in the middle, as a full disk or a power loss leaves it: `run --resume`
    // rebuilds it too, says so, writes it back whole, and finishes the run.
    let mut cut = serde_json::to_string_pretty(&original).unwrap();
    cut.truncate(cut.len() / 2);
    std::fs::write(&summary_path, &cut).unwrap();
    let out = p.status(&p.run_dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("rebuilt from events.jsonl"));
    let first_transcript = lines(&p.run_dir.join("loops/first/transcript.jsonl"));
    let out = p.resume(&run_id);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("rebuilt from events.jsonl"), "{stderr}");
    let s = summary(&p.run_dir);
    assert_eq!(s["run_id"], run_id.as_str());
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["loops"]["first"]["status"], "completed");
    assert_eq!(s["loops"]["second"]["status"], "completed");
    assert_eq!(
        lines(&p.run_dir.join("loops/first/transcript.jsonl")),
        first_transcript,
        "the completed loop did not run again"
    );
    assert_eq!(p.count("loop_completed", "first"), 1);
    assert_eq!(p.count("loop_completed", "second"), 1);
}

#[test]
fn a_loop_the_events_record_as_completed_is_not_run_again_whatever_the_summary_says() {
    // After a full disk, `loop_completed` made it into events.jsonl but the summary could not
    // be rewritten: it still says `running`.
    let p = Project::pair();
    let run_id = p.killed_pair_run();
    let mut stale = summary(&p.run_dir);
    stale["loops"]["first"]["status"] = json!("running");
    stale["loops"]["first"]["ended_at"] = Value::Null;
    std::fs::write(
        p.run_dir.join("summary.json"),
        serde_json::to_string_pretty(&stale).unwrap(),
    )
    .unwrap();
    // And the crash came between the iteration's end (validation passed) and the
    // `loop_completed` line: only the former is there.
    let events_path = p.run_dir.join("events.jsonl");
    let kept: Vec<String> = lines(&events_path)
        .into_iter()
        .filter(|l| !(l.contains("\"loop_completed\"") && l.contains("\"first\"")))
        .collect();
    std::fs::write(&events_path, kept.join("\n") + "\n").unwrap();
    assert_eq!(p.count("loop_completed", "first"), 0);

    let first_transcript = lines(&p.run_dir.join("loops/first/transcript.jsonl"));
    let out = p.resume(&run_id);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        lines(&p.run_dir.join("loops/first/transcript.jsonl")),
        first_transcript,
        "the completed loop did not run again"
    );
    assert_eq!(p.count("loop_started", "first"), 1);
    assert_eq!(p.count("loop_completed", "first"), 0);
    let s = summary(&p.run_dir);
    assert_eq!(s["loops"]["first"]["status"], "completed", "{s}");
    assert_eq!(s["loops"]["second"]["status"], "completed", "{s}");
    assert_eq!(s["status"], "completed", "{s}");
}

#[test]
fn a_reply_in_flight_at_sigkill_is_requested_again_on_resume() {
    // The reply's command is running when the process is killed: its result never reached
    // the model, so on resume the iteration runs again from its start and asks for the same
    // reply, whose command then runs to its end.
    let p = Project::new(
        r#"
solo:
  turns:
    - calls:
        - run_command: {command: "echo started >> {f}/starts; until [ -e {f}/go ]; do sleep 0.05; done; echo made > result.txt"}
    - calls:
        - complete_task: {summary: "result made"}
"#,
        "  - name: solo\n    type: ralph\n    task: \"Make result.txt.\"\n    validation: \"test -e result.txt || { echo 'result.txt is missing'; exit 1; }\"\n",
    );
    let starts = || lines(&p.flag("starts")).len();
    let mut child = p.start();
    wait_until("the reply's command to start", WAIT, || starts() == 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let run_id = summary(&p.run_dir)["run_id"].as_str().unwrap().to_string();

    let mut resumed = p
        .command(&["--resume", &run_id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let exited = loop {
        if starts() >= 2 {
            break None;
        }
        if let Some(status) = resumed.try_wait().unwrap() {
            break Some(status);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "timed out");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever happened, let every copy of the command finish.
    std::fs::write(p.flag("go"), "").unwrap();
    let out = resumed.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(
        exited.is_none(),
        "the resumed run ended ({exited:?}) without running the reply's command again; \
         stderr: {stderr}\nsummary: {}",
        summary(&p.run_dir)
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let s = summary(&p.run_dir);
    assert_eq!(s["loops"]["solo"]["status"], "completed", "{s}");
    assert_eq!(s["loops"]["solo"]["iterations"], 1, "{s}");
    assert_eq!(
        s["loops"]["solo"]["validation"],
        json!({"exit_code": 0, "passed": true})
    );
    assert_eq!(p.count("loop_completed", "solo"), 1);
    // The same reply was given twice (before the kill, and again on resume), and the calls of
    // the second were all run.
    let transcript: Vec<Value> = lines(&p.run_dir.join("loops/solo/transcript.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let replies: Vec<&Value> = transcript
        .iter()
        .filter(|e| e["entry"] == "response")
        .collect();
    let first_call = |e: &Value| e["response"]["tool_calls"][0]["id"].clone();
    assert_eq!(first_call(replies[0]), json!("solo-1-1"));
    assert_eq!(first_call(replies[1]), json!("solo-1-1"), "{replies:#?}");
    let ran: Vec<&Value> = transcript
        .iter()
        .filter(|e| e["entry"] == "tool_result" && e["name"] == "run_command")
        .collect();
    assert_eq!(ran.len(), 1, "{ran:#?}");
    assert_eq!(ran[0]["is_error"], false, "{:#?}", ran[0]);
}

/// Appends `line` to the run's events.jsonl and returns its line number.
fn append_event(run_dir: &Path, line: &str) -> usize {
    use std::io::Write;
    let path = run_dir.join("events.jsonl");
    let number = lines(&path).len() + 1;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
    number
}

#[test]
fn numbers_a_record_cannot_go_on_from_are_refused_with_file_line_and_field() {
    let p = Project::pair();
    let run_id = p.killed_pair_run();
    let events_path = p.run_dir.join("events.jsonl");
    let clean = std::fs::read(&events_path).unwrap();
    let time = "2026-01-01T00:00:00.000Z";
    // An event number past any a run may reach refuses the whole record (a loop's number
    // fails that loop alone: `a_loops_numbers_that_cannot_go_on_fail_that_loop_alone`).
    let cases = [(
        format!(
            r#"{{"seq":{},"time":"{time}","event":"loop_stopped","loop_name":"second"}}"#,
            u64::MAX
        ),
        "seq",
    )];
    for (line, field) in &cases {
        std::fs::write(&events_path, &clean).unwrap();
        let number = append_event(&p.run_dir, line);
        let before = std::fs::read(&events_path).unwrap();
        let out = p.resume(&run_id);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains(&format!("events.jsonl line {number}"))
                && stderr.contains(&format!("`{field}`")),
            "the message names the file, the line and the field: {stderr}"
        );
        assert_eq!(
            std::fs::read(&events_path).unwrap(),
            before,
            "a refused record is left as it was"
        );
        // `status` shows such a record without panicking, also when it must rebuild it.
        let out = p.status(&p.run_dir);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let kept = std::fs::read(p.run_dir.join("summary.json")).unwrap();
        std::fs::remove_file(p.run_dir.join("summary.json")).unwrap();
        let out = p.status(&p.run_dir);
        assert!(
            !text(&out.stderr).contains("panicked"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        std::fs::write(p.run_dir.join("summary.json"), kept).unwrap();
    }
    // With the record as it was, the run goes on.
    std::fs::write(&events_path, &clean).unwrap();
    let out = p.resume(&run_id);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A loop's number a run could not go on from (an iteration with no next one, inbox counts
/// past any count: a damaged line, or what a hostile host sent) fails that loop alone, with
/// the file, line and field; the run resumes, and its other loops are as they were.
#[test]
fn a_loops_numbers_that_cannot_go_on_fail_that_loop_alone() {
    let time = "2026-01-01T00:00:00.000Z";
    let cases = [
        (
            format!(
                r#"{{"seq":90,"time":"{time}","event":"progress_noted","loop_name":"second","iteration":{},"note":"validation failed"}}"#,
                u32::MAX
            ),
            "iteration",
        ),
        (
            format!(
                r#"{{"seq":91,"time":"{time}","event":"inbox_shown","loop_name":"second","items":{}}}"#,
                u64::MAX
            ),
            "items",
        ),
    ];
    for (line, field) in &cases {
        let p = Project::pair();
        let run_id = p.killed_pair_run();
        let mut number = append_event(&p.run_dir, line);
        if *field == "items" {
            // One such count is possible; two do not add up.
            number = append_event(&p.run_dir, &line.replace("\"seq\":91", "\"seq\":92"));
        }
        let out = p.resume(&run_id);
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_ne!(
            out.status.code(),
            Some(2),
            "{field}: refused whole: {stderr}"
        );
        assert!(
            stderr.contains(&format!("events.jsonl line {number}"))
                && stderr.contains(&format!("`{field}`")),
            "the message names the file, the line and the field: {stderr}"
        );
        let s = summary(&p.run_dir);
        assert_eq!(s["loops"]["second"]["status"], "failed", "{field}: {s}");
        let reason = s["loops"]["second"]["reason"].as_str().unwrap_or("");
        assert!(reason.contains(&format!("`{field}`")), "{field}: {s}");
        assert_eq!(s["loops"]["first"]["status"], "completed", "{field}: {s}");
    }
}

#[test]
fn a_share_shown_in_an_iteration_cut_by_sigkill_is_shown_once_more_and_then_never_again() {
    share_cut_by_sigkill(false);
}

/// The same from a record written before delivery numbers (its `shared` and `inbox_shown`
/// events without them): it goes by count, as it did.
#[test]
fn a_record_without_delivery_numbers_resumes_by_count() {
    share_cut_by_sigkill(true);
}

/// `strip`: the killed run's events lose their delivery numbers before the resume.
fn share_cut_by_sigkill(strip: bool) {
    // `taker` is shown the share at its second model turn; the process is killed while that
    // turn's command runs, before the iteration ends. Resumed, the iteration runs again from
    // its start: the model of that iteration never got to act on the share, so it is shown
    // again (at least once), and acknowledged then (exactly once): the next iteration does
    // not see it.
    let p = Project::new(
        r#"
giver:
  turns:
    - calls:
        - share_data: {target_exec_ids: [taker], data_type: note, data: "MARK-OF-THE-SHARE"}
    - calls:
        - run_command: {command: "touch {f}/shared"}
    - calls:
        - complete_task: {summary: "shared"}
taker:
  turns:
    - calls:
        - run_command: {command: "until [ -e {f}/shared ]; do sleep 0.05; done"}
    - calls:
        - run_command: {command: "echo shown >> {f}/showings; until [ -e {f}/go ]; do sleep 0.05; done"}
    - calls:
        - complete_task: {summary: "not yet"}
    - calls:
        - write_file: {path: done.txt, content: "ok\n"}
    - calls:
        - complete_task: {summary: "done"}
"#,
        "  - {name: giver, type: ralph, task: \"Share a note.\"}\n  - name: taker\n    type: ralph\n    task: \"Write done.txt.\"\n    validation: \"test -e done.txt || { echo 'done.txt is missing'; exit 1; }\"\n",
    );
    let mut child = p.start();
    wait_until("taker to be shown the share", WAIT, || {
        lines(&p.flag("showings")).len() == 1 && p.count("inbox_shown", "taker") == 1
    });
    child.kill().unwrap(); // SIGKILL, in the middle of taker's iteration 1
    child.wait().unwrap();
    std::fs::write(p.flag("go"), "").unwrap();
    let run_id = p.run_id();
    let events = p.run_dir.join("events.jsonl");
    if strip {
        let mut numbered = 0;
        let old: Vec<String> = lines(&events)
            .iter()
            .map(|l| match serde_json::from_str::<Value>(l) {
                Ok(Value::Object(mut e)) => {
                    for field in ["delivery", "deliveries"] {
                        numbered += usize::from(e.remove(field).is_some());
                    }
                    Value::Object(e).to_string()
                }
                _ => l.clone(),
            })
            .collect();
        assert_eq!(numbered, 2, "the share and its showing had numbers");
        std::fs::write(&events, old.join("\n") + "\n").unwrap();
    }

    let out = p.resume(&run_id);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = summary(&p.run_dir);
    assert_eq!(s["loops"]["taker"]["status"], "completed", "{s}");
    assert_eq!(s["loops"]["taker"]["iterations"], 2, "{s}");

    // Shown twice in all: in the killed attempt and in its re-run; never in iteration 2.
    assert_eq!(p.count("inbox_shown", "taker"), 2);
    let transcript: Vec<Value> = lines(&p.run_dir.join("loops/taker/transcript.jsonl"))
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    // Which attempt of which iteration each request with the share belongs to.
    let mut attempt: Vec<u64> = Vec::new();
    let mut showing: Vec<(usize, u64)> = Vec::new();
    for entry in &transcript {
        if entry["entry"] == "iteration_started" {
            attempt.push(entry["iteration"].as_u64().unwrap());
        } else if entry["entry"] == "request" && entry.to_string().contains("MARK-OF-THE-SHARE") {
            showing.push((attempt.len(), *attempt.last().unwrap()));
        }
    }
    assert_eq!(
        attempt,
        vec![1, 1, 2],
        "killed attempt, re-run, next iteration"
    );
    assert!(
        showing.iter().any(|(a, i)| *a == 1 && *i == 1),
        "shown in the killed attempt: {showing:?}"
    );
    assert!(
        showing.iter().any(|(a, i)| *a == 2 && *i == 1),
        "shown again when iteration 1 ran again: {showing:?}"
    );
    assert!(
        showing.iter().all(|(_, i)| *i == 1),
        "never shown in iteration 2: {showing:?}"
    );
}
