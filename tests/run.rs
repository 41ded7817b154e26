//! `taskdaemon run` end to end: the real binary on real git repositories in temp directories,
//! checked through its exit code, its run record (`summary.json`, `events.jsonl`, transcripts,
//! receipts), git, and the `status` and `logs` commands.
//!
//! Each test builds its own repository (`<tmp>/user`, committed with a fixed identity passed
//! per command) and copies one scenario of `tests/fixtures/run/` beside it (`<tmp>/config`).
//! Every process the tests start gets `HOME`, `XDG_CONFIG_HOME` and `GIT_CONFIG_NOSYSTEM`
//! pointing into the temp dir, so the machine's git config stays out; the test process's own
//! environment is never changed (tests run in parallel). The only network use is the
//! OpenAI-compatible server that two tests start on 127.0.0.1 (one as a model, one as a
//! service web_fetch is or is not allowed to reach).
//!
//! Timeouts below are failure guards only: every run here takes well under a second or two.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use td_engine::transcript::TranscriptEntry;
use td_toolkit::receipts::Receipt;

mod common;
use common::fixture_project::{
    Outcome, Project, RUN_GUARD, branch_list, finish, path_arg, read_jsonl,
};

/// The `seq` of the first event matching `wanted` (every key/value of it).
fn seq_of(events: &[Value], wanted: Value) -> u64 {
    let wanted = wanted.as_object().unwrap();
    events
        .iter()
        .find(|e| wanted.iter().all(|(k, v)| e.get(k) == Some(v)))
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or_else(|| panic!("no event matching {wanted:?} in {events:#?}"))
}

/// Events naming `loop_name` anywhere (as loop, sender, target or recipient).
fn events_about<'a>(events: &'a [Value], loop_name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| {
            ["loop_name", "from", "to"]
                .iter()
                .any(|k| e.get(k).and_then(Value::as_str) == Some(loop_name))
                || e["recipients"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|n| n == loop_name))
        })
        .collect()
}

fn loop_names(summary: &Value) -> BTreeSet<String> {
    summary["loops"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. The quickstart of the repository.

/// `git status --porcelain` and the loop branches of this repository (the project's own
/// checkout). Read-only: `--no-optional-locks` keeps even `status` from refreshing the index.
/// Only `taskdaemon/*` branches are compared: other branches of a shared repository may
/// legitimately come and go while the test runs, and a run would only ever add loop branches.
fn own_repository_state(project: &Project) -> (String, Vec<String>) {
    let own = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = project.git_in(own, &["--no-optional-locks", "status", "--porcelain"]);
    let branches = branch_list(&project.git_in(
        own,
        &[
            "--no-optional-locks",
            "branch",
            "--list",
            "--format=%(refname:short)",
            "taskdaemon/*",
        ],
    ));
    (status, branches)
}

/// The quickstart copies its project and makes the copy a repository with git of the
/// daemon's own: a `GIT_DIR` in the daemon's environment (a user's shell, a git hook that
/// started it) must not turn that `git init`/`add`/`commit` onto another repository.
#[test]
fn a_git_dir_in_the_environment_does_not_steer_the_quickstart_copy() {
    let project = Project::new("deps", &[]);
    let head_before = project.git(&["rev-parse", "HEAD"]);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("taskdaemon.yml");
    let (config, run_dir) = (path_arg(&config), path_arg(&project.run_dir()));
    let mut cmd = project.taskdaemon(&["run", "-c", &config, "--run-dir", &run_dir]);
    cmd.env("GIT_DIR", project.repo().join(".git"));
    let out = finish(cmd.spawn().unwrap(), RUN_GUARD);
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(project.git(&["rev-parse", "HEAD"]), head_before, "{out}");
    assert_eq!(project.git(&["log", "--format=%s"]), "initial");
    assert_eq!(project.status(), "");
}

#[test]
fn the_quickstart_runs_offline_and_leaves_the_repository_alone() {
    let project = Project::empty();
    let before = own_repository_state(&project);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("taskdaemon.yml");
    let out = project.run(&config, &[]);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("run record:"), "{out}");
    assert_eq!(own_repository_state(&project), before);

    let summary = project.summary();
    assert_eq!(summary["status"], "completed");
    assert!(summary["ended_at"].is_string());
    assert_eq!(
        loop_names(&summary),
        ["api", "client", "docs"].map(String::from).into()
    );
    let run_id = summary["run_id"].as_str().unwrap();
    for (name, iterations) in [("api", 2), ("client", 1), ("docs", 1)] {
        let l = &summary["loops"][name];
        assert_eq!(l["status"], "completed", "{name}: {l:#}");
        assert_eq!(l["iterations"], iterations, "{name}: {l:#}");
        assert_eq!(l["validation"], json!({"exit_code": 0, "passed": true}));
        assert_eq!(l["branch"], format!("taskdaemon/{run_id}/{name}"));
        assert!(l["started_at"].is_string() && l["ended_at"].is_string());
    }

    let events = project.events();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let asked = seq_of(
        &events,
        json!({"event": "query_asked", "from": "client", "to": "api"}),
    );
    let answered = seq_of(
        &events,
        json!({"event": "query_answered", "from": "client", "to": "api", "reply": "8080"}),
    );
    assert!(asked < answered);
    seq_of(
        &events,
        json!({"event": "shared", "from": "api", "to": "client", "data_type": "api_info", "error": null}),
    );
    let failed_validation = seq_of(
        &events,
        json!({"event": "iteration_ended", "loop_name": "api", "iteration": 1, "validation_passed": false}),
    );
    let passed_validation = seq_of(
        &events,
        json!({"event": "iteration_ended", "loop_name": "api", "iteration": 2, "validation_passed": true}),
    );
    assert!(failed_validation < passed_validation);
    let docs_started = seq_of(
        &events,
        json!({"event": "loop_started", "loop_name": "docs"}),
    );
    for dep in ["api", "client"] {
        let completed = seq_of(
            &events,
            json!({"event": "loop_completed", "loop_name": dep}),
        );
        assert!(
            completed < docs_started,
            "docs started before {dep} completed"
        );
    }

    for name in ["api", "client", "docs"] {
        let dir = project.run_dir().join("loops").join(name);
        let transcript = std::fs::read_to_string(dir.join("transcript.jsonl")).unwrap();
        let entries: Vec<TranscriptEntry> = transcript
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        assert!(
            entries
                .iter()
                .any(|e| matches!(e, TranscriptEntry::Response { .. })),
            "{name}: no model response in its transcript"
        );
        let receipts = std::fs::read_to_string(dir.join("receipts.jsonl")).unwrap();
        let receipts: Vec<Receipt> = receipts
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {e}: {l}")))
            .collect();
        assert!(!receipts.is_empty(), "{name}: no receipts");
    }

    // The copy the loops worked on holds each loop's work on its branch.
    let copy = project.run_dir().join("repo");
    assert_eq!(
        project.git_in(
            &copy,
            &["show", &format!("taskdaemon/{run_id}/api:server.conf")]
        ),
        "port=8080"
    );
    // ... and the run's merged result on its integration branch, where the README's
    // quickstart says to look; docs started from it once api and client had landed.
    let integration = format!("taskdaemon/{run_id}/integration");
    assert_eq!(
        project.git_in(&copy, &["show", &format!("{integration}:server.conf")]),
        "port=8080"
    );
    for name in ["api", "client", "docs"] {
        assert_eq!(
            summary["loops"][name]["merge"]["into"],
            integration.as_str()
        );
    }
    // The run's last words say where that is and how to look at it.
    let copy_real = copy.canonicalize().unwrap();
    assert!(
        out.stdout.contains(&format!(
            "merged result: branch {integration}; look at it with: git -C {} log --graph {integration}",
            copy_real.display()
        )),
        "{out}"
    );
    for dep in ["api", "client"] {
        let landed = seq_of(&events, json!({"event": "loop_merged", "loop_name": dep}));
        assert!(landed < docs_started, "docs started before {dep} landed");
    }

    let dir = path_arg(&project.run_dir());
    let status = finish(
        project
            .taskdaemon(&["status", "--dir", &dir])
            .spawn()
            .unwrap(),
        RUN_GUARD,
    );
    assert_eq!(status.code, Some(0), "{status}");
    assert!(status.stdout.contains(run_id), "{status}");
    for name in ["api", "client", "docs"] {
        let row = status
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {status}"));
        assert!(row.contains("completed"), "{row}");
    }
    let logs = finish(
        project
            .taskdaemon(&["logs", "latest", "api", "--dir", &dir])
            .spawn()
            .unwrap(),
        RUN_GUARD,
    );
    assert_eq!(logs.code, Some(0), "{logs}");
    for needle in [
        "=== iteration 1 ===",
        "=== iteration 2 ===",
        "=== answering a query from `client` ===",
        "→ edit_file",
        "validation: failed (exit 1)",
        "validation: passed (exit 0)",
    ] {
        assert!(logs.stdout.contains(needle), "{needle:?} missing:\n{logs}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Dependencies.

#[test]
fn a_failed_loop_blocks_its_dependents_which_never_start() {
    let project = Project::new("deps", &[]);
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(1), "{out}");

    let summary = project.summary();
    assert_eq!(summary["status"], "failed");
    let base = &summary["loops"]["base"];
    assert_eq!(base["status"], "failed", "{base:#}");
    assert_eq!(base["iterations"], 2);
    assert_eq!(base["validation"], json!({"exit_code": 3, "passed": false}));
    let reason = base["reason"].as_str().unwrap();
    assert!(reason.contains("maximum of 2 iterations"), "{reason}");
    // Its work in progress is kept on its branch.
    let branch = base["branch"].as_str().unwrap();
    assert_eq!(
        project.git(&["show", &format!("{branch}:attempt.txt")]),
        "attempt"
    );

    let after = &summary["loops"]["after"];
    assert_eq!(after["status"], "blocked", "{after:#}");
    assert_eq!(after["reason"], "its dependency `base` did not complete");
    assert_eq!(after["iterations"], 0);
    for never in ["started_at", "branch", "worktree"] {
        assert!(after[never].is_null(), "{never}: {after:#}");
    }
    assert!(!project.transcript("after").exists());
    assert!(
        events_about(&project.events(), "after")
            .iter()
            .all(|e| e["event"] == "alert" || e["event"] == "loop_blocked"),
        "after appears in events other than alerts to it and its being blocked"
    );
    let run_id = project.summary()["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        project.loop_branches(),
        vec![
            branch.to_string(),
            format!("taskdaemon/{run_id}/integration")
        ],
        "only base got a loop branch (besides the run's integration branch)"
    );

    let dir = path_arg(&project.run_dir());
    let status = finish(
        project
            .taskdaemon(&["status", "--dir", &dir])
            .spawn()
            .unwrap(),
        RUN_GUARD,
    );
    assert_eq!(status.code, Some(0), "{status}");
    let row = status
        .stdout
        .lines()
        .find(|l| l.starts_with("after "))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(row.contains("blocked"), "{row}");
    assert!(
        status
            .stdout
            .contains("blocked after: its dependency `base` did not complete"),
        "{status}"
    );
    // The run's own output ends with the same table.
    assert!(out.stdout.contains("blocked after:"), "{out}");
    // And the events say it too.
    let events = project.events();
    assert!(
        events.iter().any(|e| e["event"] == "loop_blocked"
            && e["loop_name"] == "after"
            && e["reason"].as_str().is_some_and(|r| r.contains("`base`"))),
        "no loop_blocked event"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Merging.

#[test]
fn completed_loops_merge_and_a_conflicting_merge_blocks_without_leaving_a_mess() {
    let project = Project::new("merge", &[]);
    let initial = project.git(&["rev-parse", "main"]);
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(1), "{out}");
    let summary = project.summary();

    let one = &summary["loops"]["one"];
    assert_eq!(one["status"], "completed", "{one:#}");
    assert_eq!(one["merge"]["merged"], true, "{one:#}");
    assert_eq!(one["merge"]["into"], "main");
    assert_eq!(one["merge"]["commit"], project.git(&["rev-parse", "main"]));
    assert_eq!(
        project.git(&["show", "main:one.txt"]),
        "one was here",
        "one's file is in the base branch"
    );
    assert_eq!(
        std::fs::read_to_string(project.repo().join("shared.txt")).unwrap(),
        "from one\n"
    );
    assert_eq!(
        project.git(&["log", "-1", "--format=%an <%ae>|%P", "main"]),
        format!(
            "TaskDaemon <taskdaemon@localhost>|{initial} {}",
            project.git(&["rev-parse", one["branch"].as_str().unwrap()])
        )
    );

    let two = &summary["loops"]["two"];
    assert_eq!(two["status"], "blocked", "{two:#}");
    assert_eq!(two["merge"]["merged"], false);
    let detail = two["merge"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("conflict") && detail.contains("shared.txt"),
        "{detail}"
    );
    assert_eq!(two["reason"].as_str(), Some(detail));
    // Its work is still on its branch.
    let two_branch = two["branch"].as_str().unwrap();
    assert_eq!(
        project.git(&["show", &format!("{two_branch}:shared.txt")]),
        "from two"
    );

    // `merge: false` on the loop wins over the run's `merge: true`: its work lands in the
    // run's integration branch instead.
    let three = &summary["loops"]["three"];
    assert_eq!(three["status"], "completed", "{three:#}");
    let run_id = summary["run_id"].as_str().unwrap();
    assert_eq!(
        three["merge"]["into"],
        format!("taskdaemon/{run_id}/integration"),
        "{three:#}"
    );
    assert!(!project.git_ok(&["cat-file", "-e", "main:three.txt"]));

    assert!(!project.git_ok(&["rev-parse", "-q", "--verify", "MERGE_HEAD"]));
    assert_eq!(project.status(), "");
    assert_eq!(project.git(&["branch", "--show-current"]), "main");

    // The events record the merge and the block.
    let events = project.events();
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "loop_merged" && e["loop_name"] == "one" && e["into"] == "main")
    );
    assert!(events.iter().any(|e| {
        e["event"] == "loop_blocked"
            && e["loop_name"] == "two"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("shared.txt"))
    }));
}

// ---------------------------------------------------------------------------------------
// 4. Worktrees.

/// Runs the `worktrees` scenario with `keep_line` in its config; returns the project, the
/// worktree directory of `solo` and its branch.
fn run_solo(keep_line: &str) -> (Project, PathBuf, String) {
    let project = Project::new("worktrees", &[("KEEP_WORKTREES", keep_line.to_string())]);
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    let solo = project.summary()["loops"]["solo"].clone();
    let dir = PathBuf::from(solo["worktree"].as_str().unwrap());
    let branch = solo["branch"].as_str().unwrap().to_string();
    let run_id = project.summary()["run_id"].as_str().unwrap().to_string();
    let integration = format!("taskdaemon/{run_id}/integration");
    assert_eq!(
        project.loop_branches(),
        vec![integration.clone(), branch.clone()]
    );
    assert_eq!(
        project.git(&["show", &format!("{branch}:solo.txt")]),
        "solo"
    );
    // Its work landed in the run's integration branch, not in the user's.
    assert_eq!(
        project.git(&["show", &format!("{integration}:solo.txt")]),
        "solo"
    );
    assert_eq!(solo["merge"]["into"], integration.as_str());
    assert_eq!(project.status(), "");
    (project, dir, branch)
}

fn registered_worktrees(project: &Project) -> Vec<PathBuf> {
    project
        .git(&["worktree", "list", "--porcelain"])
        .lines()
        .filter_map(|l| l.strip_prefix("worktree "))
        .map(|p| PathBuf::from(p).canonicalize().unwrap_or(PathBuf::from(p)))
        .collect()
}

#[test]
fn keep_worktrees_keeps_the_directories_and_branches() {
    let (project, dir, branch) = run_solo("keep-worktrees: true");
    assert!(dir.join("solo.txt").is_file(), "{}", dir.display());
    assert!(registered_worktrees(&project).contains(&dir.canonicalize().unwrap()));
    assert_eq!(
        project.git_in(&dir, &["branch", "--show-current"]),
        branch,
        "the kept worktree is on the loop's branch"
    );
}

#[test]
fn by_default_worktrees_are_removed_and_branches_stay() {
    let (project, dir, _branch) = run_solo("");
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert!(!project.run_dir().join("worktrees").exists());
    assert_eq!(
        registered_worktrees(&project),
        vec![project.repo().canonicalize().unwrap()]
    );
}

// ---------------------------------------------------------------------------------------
// 5. Selecting loops.

/// The new messages of `name`'s first model request, as JSON text.
fn first_prompt(project: &Project, name: &str) -> String {
    read_jsonl(&project.transcript(name))
        .into_iter()
        .find(|e| e["entry"] == "request" && e["iteration"] == 1 && e["turn"] == 1)
        .map(|e| e["new_messages"].to_string())
        .unwrap_or_else(|| panic!("{name} made no first request"))
}

#[test]
fn peers_lifecycle_alerts_reach_only_the_loops_that_subscribe_to_them() {
    let project = Project::new("alerts", &[]);
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    // `a` and `b` subscribe to nothing: no system alert about a peer opens their prompt.
    for name in ["a", "b"] {
        let prompt = first_prompt(&project, name);
        assert!(prompt.contains(&format!("Do {name}.")), "{name}: {prompt}");
        assert!(!prompt.contains("`taskdaemon`"), "{name}: {prompt}");
        assert!(!prompt.contains("started:"), "{name}: {prompt}");
    }
    // `listener` subscribes to `loop_started`: it hears both peers start.
    let prompt = first_prompt(&project, "listener");
    for peer in ["a", "b"] {
        assert!(
            prompt.contains(&format!("loop `{peer}` started: Do {peer}.")),
            "{prompt}"
        );
    }
}

#[test]
fn loop_selection_runs_the_loop_and_its_dependencies_only() {
    let project = Project::new("select", &[]);
    let out = project.run(&project.config(), &["--loop", "b", "--json"]);
    assert_eq!(out.code, Some(0), "{out}");
    // --json: the events, one JSON object per line, and nothing else.
    let printed: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(printed, project.events());

    let summary = project.summary();
    assert_eq!(summary["status"], "completed");
    assert_eq!(loop_names(&summary), ["a", "b"].map(String::from).into());
    for name in ["a", "b"] {
        assert_eq!(summary["loops"][name]["status"], "completed");
    }
    let events = project.events();
    assert!(events_about(&events, "c").is_empty(), "{events:#?}");
    assert!(!project.run_dir().join("loops/c").exists());
    let run_id = summary["run_id"].as_str().unwrap();
    assert_eq!(
        project.loop_branches(),
        vec![
            format!("taskdaemon/{run_id}/a"),
            format!("taskdaemon/{run_id}/b"),
            format!("taskdaemon/{run_id}/integration")
        ]
    );

    let again = Project::new("select", &[]);
    let out = again.run(&again.config(), &["--loop", "d"]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains("--loop d: no such loop") && out.stderr.contains("a, b, c"),
        "{out}"
    );
    assert!(!again.run_dir().exists());
}

// ---------------------------------------------------------------------------------------
// 6. Ctrl-C and SIGTERM.

fn wait_for_file(path: &Path, child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "taskdaemon exited ({status}) before {} appeared",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {limit:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `taskdaemon run` on the `interrupt` fixture, whose first command writes its shell's
/// pid to `started` and then waits until `flag` exists; returns once `started` exists.
fn start_interrupt_fixture(started: &Path, flag: &Path) -> (Project, Child) {
    let project = Project::new(
        "interrupt",
        &[
            ("STARTED", path_arg(started)),
            ("FLAG", path_arg(flag)),
            ("SYNC", path_arg(started.parent().unwrap())),
        ],
    );
    let (config, run_dir) = (path_arg(&project.config()), path_arg(&project.run_dir()));
    let mut child = project
        .taskdaemon(&["run", "-c", &config, "--run-dir", &run_dir])
        .spawn()
        .unwrap();
    wait_for_file(started, &mut child, RUN_GUARD);
    (project, child)
}

/// Sends `signal` to `child`.
fn send_signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) with a valid signal on our own child's pid has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

#[test]
fn ctrl_c_stops_after_the_call_in_flight_and_records_the_stop() {
    one_signal_stops_after_the_call_in_flight(libc::SIGINT, 130);
}

#[test]
fn sigterm_stops_after_the_call_in_flight_and_records_the_stop() {
    one_signal_stops_after_the_call_in_flight(libc::SIGTERM, 143);
}

/// `signal` while a loop's command runs: the run waits for the command, stops the loops,
/// completes its record and exits with `code`.
fn one_signal_stops_after_the_call_in_flight(signal: libc::c_int, code: i32) {
    let root = tempfile::tempdir().unwrap();
    let (started, flag) = (root.path().join("started"), root.path().join("flag"));
    let (project, mut child) = start_interrupt_fixture(&started, &flag);

    send_signal(&child, signal);
    // The command in flight keeps the run going: a stop takes effect after the call.
    thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "taskdaemon exited while the command was still running"
    );
    std::fs::write(&flag, "").unwrap();
    let flagged = Instant::now();
    let out = finish(child, RUN_GUARD);
    let took = flagged.elapsed();
    assert_eq!(out.code, Some(code), "{out}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} after the flag"
    );

    let summary = project.summary();
    assert_eq!(summary["status"], "stopped", "{summary:#}");
    assert!(summary["ended_at"].is_string());
    let waiter = &summary["loops"]["waiter"];
    assert_eq!(waiter["status"], "stopped", "{waiter:#}");
    assert!(waiter["ended_at"].is_string(), "{waiter:#}");
    assert_eq!(waiter["iterations"], 1);
    let later = &summary["loops"]["later"];
    assert_eq!(later["status"], "stopped", "{later:#}");
    assert_eq!(later["reason"], "never started: the run was interrupted");
    assert!(!project.transcript("later").exists());

    // The command ran to its end and its result was recorded; the next turn never came.
    let receipts = read_jsonl(&project.run_dir().join("loops/waiter/receipts.jsonl"));
    let tools: Vec<&str> = receipts
        .iter()
        .map(|r| r["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["write_file", "run_command"]);
    // Work in progress is committed on the loop's branch.
    let branch = waiter["branch"].as_str().unwrap();
    assert_eq!(
        project.git(&["show", &format!("{branch}:notes.txt")]),
        "work in progress"
    );
    assert_eq!(
        project.git(&["log", "-1", "--format=%s", branch]),
        "taskdaemon: waiter stopped (work in progress)"
    );

    let events = project.events();
    let lifecycle: Vec<&str> = events
        .iter()
        .filter(|e| e["loop_name"] == "waiter")
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        lifecycle,
        [
            "loop_started",
            "iteration_started",
            "iteration_ended",
            "loop_stopped",
            "loop_unregistered"
        ]
    );
    seq_of(
        &events,
        json!({"event": "iteration_ended", "loop_name": "waiter", "ended_by": "stopped", "validation_passed": null}),
    );
    let stopped = seq_of(
        &events,
        json!({"event": "loop_stopped", "loop_name": "waiter"}),
    );
    assert!(
        events.iter().all(|e| e["seq"].as_u64().unwrap() <= stopped
            || e["event"] == "alert"
            || e["event"] == "loop_unregistered"),
        "events after the stop: {events:#?}"
    );
}

#[test]
fn a_second_ctrl_c_stops_at_once_and_kills_the_command_in_flight() {
    second_signal_stops_at_once(libc::SIGINT, libc::SIGINT, 130);
}

#[test]
fn a_second_sigterm_stops_at_once_and_kills_the_command_in_flight() {
    second_signal_stops_at_once(libc::SIGTERM, libc::SIGTERM, 143);
}

#[test]
fn ctrl_c_after_sigterm_and_sigterm_after_ctrl_c_stop_at_once() {
    // The exit code names the signal that stopped the run first.
    second_signal_stops_at_once(libc::SIGTERM, libc::SIGINT, 143);
    second_signal_stops_at_once(libc::SIGINT, libc::SIGTERM, 130);
}

/// `first` while a loop's command runs, then `second`: the second stops the loops at once
/// (killing the command's process group), the record is still completed, and the run exits
/// with `code`.
fn second_signal_stops_at_once(first: libc::c_int, second: libc::c_int, code: i32) {
    let root = tempfile::tempdir().unwrap();
    let (started, flag) = (root.path().join("started"), root.path().join("flag"));
    let (project, mut child) = start_interrupt_fixture(&started, &flag);
    // The command's shell names the flag file in its command line.
    let marker = flag.display().to_string();
    assert!(
        !common::pids_with(&marker).is_empty(),
        "the command is not running"
    );

    send_signal(&child, first);
    thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal must wait for the call in flight"
    );
    send_signal(&child, second);
    let out = finish(child, Duration::from_secs(20));
    assert_eq!(out.code, Some(code), "{out}");
    let running = common::pids_with(&marker);
    assert!(
        running.is_empty(),
        "the command's processes outlived the run: {running:?}"
    );
    assert!(!flag.exists());

    let summary = project.summary();
    assert_eq!(summary["status"], "stopped", "{summary:#}");
    let waiter = &summary["loops"]["waiter"];
    assert_eq!(waiter["status"], "stopped", "{waiter:#}");
    assert!(waiter["ended_at"].is_string(), "{waiter:#}");
    let later = &summary["loops"]["later"];
    assert_eq!(later["reason"], "never started: the run was interrupted");
    // The event log is complete (every line parses) and ends the loop.
    let events = project.events();
    seq_of(
        &events,
        json!({"event": "loop_stopped", "loop_name": "waiter"}),
    );
    // Work in progress is still committed on the loop's branch.
    let branch = waiter["branch"].as_str().unwrap();
    assert_eq!(
        project.git(&["show", &format!("{branch}:notes.txt")]),
        "work in progress"
    );
}

#[test]
fn ctrl_c_during_setup_stops_the_run_cleanly() {
    signal_during_setup_stops_the_run_cleanly(libc::SIGINT, 130);
}

#[test]
fn sigterm_during_setup_stops_the_run_cleanly() {
    signal_during_setup_stops_the_run_cleanly(libc::SIGTERM, 143);
}

/// `signal` while the first loop's worktree is being made: no loop runs, the record says
/// every loop stopped, and the run exits with `code`.
fn signal_during_setup_stops_the_run_cleanly(signal: libc::c_int, code: i32) {
    let root = tempfile::tempdir().unwrap();
    let started = root.path().join("started");
    let flag = root.path().join("flag");
    let project = Project::new("interrupt-setup", &[]);
    // Holds `git worktree add` (run for `first`, before any loop runs) until the flag exists:
    // a `git` first on PATH that waits, then runs the real one (the daemon's git runs no
    // hooks, so a hook cannot hold it).
    let real_git = Command::new("sh")
        .args(["-c", "command -v git"])
        .output()
        .unwrap();
    let real_git = String::from_utf8(real_git.stdout).unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wrapper = bin.join("git");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" worktree add \"*)\n  touch '{}'\n  until [ -e '{}' ]; do sleep 0.05; done;;\nesac\nexec '{}' \"$@\"\n",
            started.display(),
            flag.display(),
            real_git.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin];
    dirs.extend(std::env::split_paths(&path));

    let (config, run_dir) = (path_arg(&project.config()), path_arg(&project.run_dir()));
    let mut child = project
        .taskdaemon(&["run", "-c", &config, "--run-dir", &run_dir])
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .spawn()
        .unwrap();
    wait_for_file(&started, &mut child, RUN_GUARD);
    send_signal(&child, signal);
    thread::sleep(Duration::from_millis(200));
    std::fs::write(&flag, "").unwrap();
    let out = finish(child, RUN_GUARD);
    assert_eq!(out.code, Some(code), "{out}");

    let summary = project.summary();
    assert_eq!(summary["status"], "stopped", "{summary:#}");
    assert!(summary["ended_at"].is_string());
    let first = &summary["loops"]["first"];
    assert_eq!(first["status"], "stopped", "{first:#}");
    assert!(first["ended_at"].is_string(), "{first:#}");
    let second = &summary["loops"]["second"];
    assert_eq!(second["status"], "stopped", "{second:#}");
    assert_eq!(second["reason"], "never started: the run was interrupted");
    assert!(second["branch"].is_null(), "{second:#}");
    assert!(!project.transcript("second").exists());
    assert!(
        !project.run_dir().join("worktrees").exists(),
        "the worktree of first was not removed"
    );
}

// ---------------------------------------------------------------------------------------
// 7. Config errors.

/// `taskdaemon run -c <fixture errors/NAME>`, which must fail at startup.
fn startup_error(name: &str) -> (Project, PathBuf, Outcome) {
    let project = Project::new("errors", &[]);
    let config = project.config_dir().join(name);
    let out = project.run(&config, &[]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stdout.is_empty(), "{out}");
    // Nothing was recorded and nothing happened in git.
    assert!(
        !project.run_dir().exists(),
        "a run directory was left behind"
    );
    assert!(project.loop_branches().is_empty());
    assert_eq!(project.status(), "");
    (project, config, out)
}

#[test]
fn an_unknown_key_is_refused_with_its_place_and_a_suggestion() {
    let (_project, config, out) = startup_error("unknown-key.yml");
    // `depends_on` is at line 7, column 5.
    let place = format!("{}:7:5", config.display());
    assert!(out.stderr.contains(&place), "{place} missing: {out}");
    assert!(
        out.stderr.contains("unknown field `depends_on`")
            && out.stderr.contains("did you mean `depends-on`?"),
        "{out}"
    );
}

#[test]
fn an_unknown_tool_choice_is_refused_with_the_values_and_a_suggestion() {
    let (_project, config, out) = startup_error("unknown-tool-choice.yml");
    let place = format!("{}:6:16", config.display());
    assert!(out.stderr.contains(&place), "{place} missing: {out}");
    assert!(
        out.stderr.contains(
            "unknown variant `requird`, expected one of `auto`, `required`, `none`, `omit`"
        ) && out.stderr.contains("did you mean `required`?"),
        "{out}"
    );
}

#[test]
fn a_dependency_cycle_is_refused_naming_the_cycle() {
    let (_project, _config, out) = startup_error("cycle.yml");
    assert!(
        out.stderr
            .contains("depends-on forms a cycle: a -> c -> b -> a"),
        "{out}"
    );
}

#[test]
fn a_missing_script_is_refused_naming_the_file() {
    let (project, _config, out) = startup_error("missing-script.yml");
    let script = project.config_dir().join("no-such-script.yml");
    assert!(
        out.stderr.contains(&script.display().to_string()) && out.stderr.contains("No such file"),
        "{out}"
    );
}

#[test]
fn a_missing_repository_is_refused_before_anything_is_written() {
    let (project, _config, out) = startup_error("missing-repo.yml");
    let repo = project.config_dir().join("../no-such-repo");
    assert!(
        out.stderr.contains(&format!(
            "{} is not inside a git working tree",
            repo.display()
        )),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------
// 8. A real provider end to end.

/// One request the test server received.
#[derive(Debug, Clone)]
struct SeenRequest {
    /// `POST /v1/chat/completions HTTP/1.1`.
    line: String,
    /// Header names, lowercased.
    headers: Vec<String>,
    /// The JSON body (`null` if it did not parse).
    body: Value,
}

/// A one-thread HTTP/1.1 server on 127.0.0.1 answering every request with the replies given,
/// in order (then plain "done" texts), one request per connection. Keeps every request it
/// received; the test checks them.
struct ChatServer(common::LocalServer<SeenRequest>);

impl ChatServer {
    fn start(replies: Vec<Value>) -> ChatServer {
        let mut replies = replies.into_iter();
        ChatServer(common::LocalServer::start(move |stream| {
            let reply = replies.next().unwrap_or_else(|| text_reply("done"));
            serve_one(stream, &reply)
        }))
    }

    fn base_url(&self) -> String {
        self.0.base_url()
    }

    fn requests(&self) -> Vec<SeenRequest> {
        self.0.seen()
    }
}

/// Reads one request from `stream`, answers `reply`, and returns the request.
fn serve_one(stream: TcpStream, reply: &Value) -> Option<SeenRequest> {
    let request = common::http_once::answer_once(stream, |_| (200, reply.to_string()))?;
    Some(SeenRequest {
        line: request.line,
        headers: request.headers.into_iter().map(|(name, _)| name).collect(),
        body: serde_json::from_slice(&request.body).unwrap_or(Value::Null),
    })
}

fn tool_call_reply(id: &str, name: &str, arguments: Value) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "test",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()}
                }]
            },
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    })
}

fn text_reply(text: &str) -> Value {
    json!({
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    })
}

/// Runs the `web` scenario with `web_line` in its config against `server`; returns the
/// error flag and content of the loop's two web_fetch results (by address, by name).
fn run_web(web_line: &str, server: &ChatServer) -> Vec<(bool, String)> {
    let project = Project::new(
        "web",
        &[
            ("WEB", web_line.to_string()),
            ("PORT", server.0.port.to_string()),
        ],
    );
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");
    read_jsonl(&project.transcript("fetcher"))
        .into_iter()
        .filter(|e| e["entry"] == "tool_result" && e["name"] == "web_fetch")
        .map(|e| {
            let content = e["content"].as_str().unwrap().to_string();
            (e["is_error"].as_bool().unwrap(), content)
        })
        .collect()
}

#[test]
fn the_web_section_decides_what_web_fetch_reaches_in_a_loop() {
    let server = ChatServer::start(vec![]);
    // By default a loop reaches neither the address nor a name resolving to it.
    let results = run_web("", &server);
    assert_eq!(results.len(), 2, "{results:?}");
    for (is_error, content) in &results {
        assert!(is_error, "{content}");
        assert!(
            content.starts_with("web_fetch refuses private and loopback addresses: "),
            "{content}"
        );
    }
    assert!(server.requests().is_empty());

    // A host list lets exactly its hosts through.
    let results = run_web("web: {allow-private: [localhost]}", &server);
    assert!(results[0].0, "{}", results[0].1);
    assert!(
        results[0].1.contains("127.0.0.1 (loopback)"),
        "{}",
        results[0].1
    );
    assert!(!results[1].0, "{}", results[1].1);
    assert!(results[1].1.contains("Status: 200 OK"), "{}", results[1].1);
    let lines: Vec<String> = server.requests().into_iter().map(|r| r.line).collect();
    assert_eq!(lines, vec!["GET /by-name HTTP/1.1"]);
}

#[test]
fn an_openai_compatible_server_drives_a_loop_to_completion() {
    let server = ChatServer::start(vec![
        tool_call_reply(
            "call_write",
            "write_file",
            json!({"path": "hello.txt", "content": "hi\n"}),
        ),
        tool_call_reply(
            "call_done",
            "complete_task",
            json!({"summary": "hello.txt says hi"}),
        ),
    ]);
    let project = Project::new("openai", &[("BASE_URL", server.base_url())]);
    let out = project.run(&project.config(), &[]);
    assert_eq!(out.code, Some(0), "{out}");

    let solo = &project.summary()["loops"]["solo"];
    assert_eq!(solo["status"], "completed", "{solo:#}");
    assert_eq!(solo["iterations"], 1);
    assert_eq!(solo["summary"], "hello.txt says hi");
    assert_eq!(
        solo["usage"],
        json!({"input_tokens": 200, "output_tokens": 20})
    );
    let branch = solo["branch"].as_str().unwrap();
    assert_eq!(project.git(&["show", &format!("{branch}:hello.txt")]), "hi");

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for r in &requests {
        assert_eq!(r.line, "POST /v1/chat/completions HTTP/1.1");
        // No key configured (and OPENAI_API_KEY unset): no Authorization header.
        assert!(!r.headers.iter().any(|h| h == "authorization"), "{r:?}");
    }
    let first = &requests[0].body;
    assert_eq!(first["model"], "test");
    let tools: BTreeSet<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains("write_file") && tools.contains("complete_task"));
    assert_eq!(first["messages"][0]["role"], "system");
    assert!(
        first["messages"].to_string().contains("Write hello.txt"),
        "the task is in the first request"
    );

    let second = requests[1].body["messages"].as_array().unwrap();
    let call = second
        .iter()
        .find(|m| m["role"] == "assistant" && m["tool_calls"].is_array())
        .unwrap_or_else(|| panic!("no assistant tool call: {second:#?}"));
    assert_eq!(call["tool_calls"][0]["id"], "call_write");
    let result = second
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool result: {second:#?}"));
    assert_eq!(result["tool_call_id"], "call_write");
    let content = result["content"].as_str().unwrap();
    assert!(
        content.contains("hello.txt") && !content.starts_with("ERROR"),
        "{content}"
    );
}
