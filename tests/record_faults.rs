//! Run records under faults, through the real binary: a disk that fills up under a run, a
//! `tool exec` or an `mcp` session (a small tmpfs holds their records), and what reaches the
//! disk before a write is relied on (the system calls, seen with strace).
//!
//! A full disk must stop the work whose record cannot be written (fail closed), say why and
//! what to do, and leave a record that `run --resume` finishes without running a completed
//! loop again. Tests that need a tmpfs mount or strace say so and return where the machine
//! cannot give them.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::tool_exec::Exec;
use common::{flagged_project, init_repo, lines, wait_until};

/// How long the tests wait for a run to reach the state they need.
const WAIT: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_taskdaemon")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
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

const CALLS_AFTER_FULL: usize = 20;

/// A loop's script: a command that waits until the disk is full, then `CALLS_AFTER_FULL`
/// commands that each append their number to `{f}/<name>-calls`, then `complete_task`.
fn filling_script(name: &str) -> String {
    let mut s = format!(
        "{name}:\n  turns:\n    - calls:\n        - run_command: {{command: \"echo 0 >> {{f}}/{name}-calls; until [ -e {{f}}/full ]; do sleep 0.05; done\"}}\n"
    );
    for i in 1..=CALLS_AFTER_FULL {
        s.push_str(&format!(
            "    - calls:\n        - run_command: {{command: \"echo {i} >> {{f}}/{name}-calls\"}}\n"
        ));
    }
    s.push_str(&format!(
        "    - calls:\n        - complete_task: {{summary: \"{name} done\"}}\n"
    ));
    s
}

#[test]
fn a_full_disk_stops_the_loops_before_their_next_call_and_resume_finishes_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let Some(disk) = Tmpfs::mount(&root.join("disk"), "16m") else {
        return;
    };
    let loops = ["a", "b"];
    let script: String = loops.iter().map(|n| filling_script(n)).collect();
    let (config, flags) = flagged_project(
        &root,
        &script,
        "  - {name: a, type: ralph, task: \"Count.\"}\n  - {name: b, type: ralph, task: \"Count.\"}\n",
    );
    let run_dir = disk.dir.join("run");
    let run = |extra: &[&str]| {
        let mut c = Command::new(bin());
        c.args(["run", "-c"])
            .arg(&config)
            .arg("--run-dir")
            .arg(&run_dir)
            .args(extra);
        c
    };
    let calls = |name: &str| lines(&flags.join(format!("{name}-calls")));

    // 1. Both loops wait in their first call; then the disk fills up.
    let child = run(&[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("both loops to wait", WAIT, || {
        loops.iter().all(|n| calls(n).len() == 1)
    });
    let run_id = serde_json::from_str::<Value>(
        &std::fs::read_to_string(run_dir.join("summary.json")).unwrap(),
    )
    .unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let fill = disk.fill();
    std::fs::write(flags.join("full"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);

    // 2. No loop made a call whose receipt could not be written and then went on: every call
    //    that ran has its receipt, but for the one whose receipt failed.
    for name in loops {
        let ran = calls(name).len();
        let recorded = receipts_of(
            &run_dir.join(format!("loops/{name}/receipts.jsonl")),
            "run_command",
        )
        .len();
        assert!(
            ran <= recorded + 1,
            "loop {name} ran {ran} commands but the record holds {recorded} receipts; stderr: {stderr}"
        );
        assert!(ran < CALLS_AFTER_FULL + 1, "loop {name} went on to its end");
    }
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("could not be written") && stderr.contains("--resume"),
        "the run says why it stopped and what to do: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // 3. Space comes back; the run is resumed and finishes, every call made, no loop run
    //    again after its completion.
    std::fs::remove_file(&fill).unwrap();
    let out = run(&["--resume", &run_id]).output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["status"], "completed", "{summary:#}");
    let events = jsonl(&run_dir.join("events.jsonl"));
    for name in loops {
        assert_eq!(summary["loops"][name]["status"], "completed", "{summary:#}");
        let completed = events
            .iter()
            .filter(|e| e["event"] == "loop_completed" && e["loop_name"] == name)
            .count();
        assert_eq!(completed, 1, "loop {name} completed once");
        let ran = calls(name);
        for i in 0..=CALLS_AFTER_FULL {
            assert!(ran.contains(&i.to_string()), "call {i} of {name}: {ran:?}");
        }
        let recorded = receipts_of(
            &run_dir.join(format!("loops/{name}/receipts.jsonl")),
            "run_command",
        )
        .len();
        assert!(
            recorded >= ran.len() - 1,
            "{name}: {recorded} receipts, {ran:?}"
        );
    }
}

/// A worktree, and its receipts log on a 1 MiB tmpfs that the test fills up.
struct FullDisk {
    // Fields drop in order: the tmpfs is unmounted before its directory is removed.
    disk: Tmpfs,
    worktree: PathBuf,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl FullDisk {
    /// `None` (with the reason printed) where this machine cannot mount a tmpfs.
    fn new() -> Option<FullDisk> {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let disk = Tmpfs::mount(&root.join("disk"), "1m")?;
        let worktree = root.join("wt");
        std::fs::create_dir_all(&worktree).unwrap();
        let log = disk.dir.join("receipts.jsonl");
        Some(FullDisk {
            disk,
            worktree,
            log,
            _tmp: tmp,
        })
    }

    /// After the session closed: it exited with 1, saying on stderr that a receipt of the
    /// log could not be written.
    fn check_exit(&self, status: ExitStatus, stderr: &str) {
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("receipt") && stderr.contains(&self.log.display().to_string()),
            "{stderr}"
        );
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
    let Some(full) = FullDisk::new() else {
        return;
    };
    let mut exec = Exec::spawn(
        Exec::command(&full.worktree)
            .arg("--receipts")
            .arg(&full.log)
            .stderr(Stdio::piped()),
    );
    let first = exec.answer("0", "list_directory", json!({}));
    assert_eq!(first["is_error"], false, "{first}");
    full.disk.fill();
    let failed = write_until_refused(|i| {
        let a = exec.answer(
            &i.to_string(),
            "write_file",
            json!({"path": format!("n{i}.txt"), "content": "x\n"}),
        );
        (
            a["is_error"] == true,
            a["content"].as_str().unwrap_or_default().to_string(),
        )
    });
    check_refusals(&full.worktree, &full.log, failed);
    let (status, stderr) = exec.finish_with_stderr();
    full.check_exit(status, &stderr);
}

#[test]
fn mcp_answers_an_error_and_runs_nothing_more_once_a_receipt_cannot_be_written() {
    let Some(full) = FullDisk::new() else {
        return;
    };
    let mut child = common::spawn_piped(
        Command::new(bin())
            .args(["mcp", "--worktree"])
            .arg(&full.worktree)
            .arg("--receipts")
            .arg(&full.log)
            .env("TASKDAEMON_LOG", "error"),
    );
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
    full.disk.fill();
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
    check_refusals(&full.worktree, &full.log, failed);
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    full.check_exit(out.status, &text(&out.stderr));
}

/// What `strace -y` saw a process do to its files: one line per call.
fn traced(log: &Path) -> Vec<String> {
    lines(log)
}

#[test]
fn record_writes_reach_the_disk_before_they_are_relied_on() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = root.join("repo");
    init_repo(&repo, &[("README.md", "sample\n")]);
    std::fs::write(
        repo.join("script.yml"),
        "solo:\n  turns:\n    - calls:\n        - complete_task: {summary: too early}\n    - calls:\n        - write_file: {path: a.txt, content: \"a\\n\"}\n    - calls:\n        - complete_task: {summary: done}\n",
    )
    .unwrap();
    // Iteration 1 fails its validation (a progress note), iteration 2 passes.
    std::fs::write(
        repo.join("taskdaemon.yml"),
        "llm: {provider: scripted, script: script.yml}\nloops:\n  - {name: solo, type: ralph, task: \"Write a.txt.\", validation: \"test -e a.txt\"}\n",
    )
    .unwrap();
    let run_dir = root.join("run");
    let trace = root.join("trace.txt");
    let out = Command::new("strace")
        .args(["-f", "-y", "-qq", "-s", "200", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=write,fsync,fdatasync,rename,renameat,renameat2",
        ])
        .arg(bin())
        .args(["run", "-c"])
        .arg(repo.join("taskdaemon.yml"))
        .arg("--run-dir")
        .arg(&run_dir)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run strace: {e}");
            return;
        }
    };
    let calls = traced(&trace);
    if !out.status.success() && calls.len() < 10 {
        eprintln!(
            "SKIPPED: strace cannot trace here: {}",
            text(&out.stderr).trim()
        );
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run = run_dir.display().to_string();
    let summary = format!("{run}/summary.json");
    let tmp_summary = format!("{run}/summary.json.tmp");
    let is_sync = |l: &str, path: &str| {
        (l.contains(" fsync(") || l.contains(" fdatasync(")) && l.contains(&format!("<{path}>"))
    };
    let is_write = |l: &str, path: &str| l.contains(" write(") && l.contains(&format!("<{path}>"));

    // summary.json: written to a temporary file that is synced, renamed over it, and the
    // directory synced, every time.
    let renames: Vec<usize> = calls
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("rename") && l.contains(&tmp_summary) && l.contains("= 0"))
        .map(|(i, _)| i)
        .collect();
    assert!(renames.len() >= 3, "{renames:?}");
    for &at in &renames {
        let last_write = calls[..at]
            .iter()
            .rposition(|l| is_write(l, &tmp_summary))
            .unwrap();
        assert!(
            calls[last_write..at]
                .iter()
                .any(|l| is_sync(l, &tmp_summary)),
            "summary.json.tmp is synced before it is renamed: {:#?}",
            &calls[last_write..=at]
        );
        let next_write = calls[at + 1..]
            .iter()
            .position(|l| is_write(l, &tmp_summary))
            .map_or(calls.len(), |p| at + 1 + p);
        assert!(
            calls[at..next_write].iter().any(|l| is_sync(l, &run)),
            "the run directory is synced after the rename: {:#?}",
            &calls[at..next_write.min(at + 20)]
        );
    }
    assert!(
        !calls.iter().any(|l| is_write(l, &summary)),
        "never written in place"
    );

    // The lines a resume goes on from are synced before the run goes on: the run's start,
    // a failed iteration's progress note, the loop's end; and every receipt.
    let events = format!("{run}/events.jsonl");
    let receipts = format!("{run}/loops/solo/receipts.jsonl");
    for marker in ["run_started", "progress_noted", "loop_completed"] {
        let at = calls
            .iter()
            .position(|l| is_write(l, &events) && l.contains(marker))
            .unwrap_or_else(|| panic!("no write of {marker} to events.jsonl"));
        let next = calls[at + 1..]
            .iter()
            .position(|l| is_write(l, &events))
            .map_or(calls.len(), |p| at + 1 + p);
        assert!(
            calls[at..next].iter().any(|l| is_sync(l, &events)),
            "{marker} is synced before anything else is written to events.jsonl"
        );
    }
    let receipt_writes: Vec<usize> = calls
        .iter()
        .enumerate()
        .filter(|(_, l)| is_write(l, &receipts))
        .map(|(i, _)| i)
        .collect();
    assert!(receipt_writes.len() >= 2, "{receipt_writes:?}");
    for (k, &at) in receipt_writes.iter().enumerate() {
        let next = receipt_writes.get(k + 1).copied().unwrap_or(calls.len());
        assert!(
            calls[at..next].iter().any(|l| is_sync(l, &receipts)),
            "receipt {k} is synced"
        );
    }
}
