//! The merge queue end to end: the real binary, the scripted model, real git. Completed
//! loops are integrated one at a time (scratch worktree, merged validation, advance);
//! dependencies hand their work over; conflicts and failing merged validations go back to
//! the loop as a new iteration, up to `merge-attempts`; a shared-worktree group lands
//! whole or not at all; `taskdaemon merge` integrates by hand.
//!
//! Each test runs one scenario of `tests/fixtures/run/` in a `common::fixture_project`
//! (the user's repository, the config, the run record, isolated processes). Timeouts are
//! failure guards only.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;
use common::fixture_project::{Outcome, Project, RUN_GUARD, finish};
use common::run_story::{Story, snap};

/// A project of the scenario `fixture` (`tests/fixtures/run/<fixture>`), with `vars` for
/// its placeholders.
fn project(fixture: &str, vars: &[(&str, &str)]) -> Project {
    let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
    Project::new(fixture, &vars)
}

/// What these tests ask of a project beyond the common one.
trait QueueProject {
    /// `taskdaemon run` of the scenario's config to its end.
    fn run_scenario(&self) -> Outcome;
    /// `taskdaemon ARGS` to its end.
    fn taskdaemon_to_end(&self, args: &[&str]) -> Outcome;
    /// A loop's transcript, as text (empty when it has none).
    fn transcript_text(&self, name: &str) -> String;
    /// The run's integration branch.
    fn integration(&self) -> String;
    /// The run told for a snapshot, with the history and files of `branches` (`{run}`: the
    /// run id) and the first prompts of the loops `first_prompts`.
    fn story(&self, branches: &[&str], first_prompts: &[&str]) -> String;
    /// The user's checkout is clean and not mid-merge.
    fn assert_checkout_clean(&self);
}

impl QueueProject for Project {
    fn run_scenario(&self) -> Outcome {
        self.run(&self.config(), &[])
    }

    fn taskdaemon_to_end(&self, args: &[&str]) -> Outcome {
        finish(self.taskdaemon(args).spawn().unwrap(), RUN_GUARD)
    }

    fn transcript_text(&self, name: &str) -> String {
        std::fs::read_to_string(self.transcript(name)).unwrap_or_default()
    }

    fn integration(&self) -> String {
        format!(
            "taskdaemon/{}/integration",
            self.summary()["run_id"].as_str().unwrap()
        )
    }

    fn story(&self, branches: &[&str], first_prompts: &[&str]) -> String {
        Story {
            run_dir: &self.run_dir(),
            repo: &self.repo(),
            branches,
            paths: &[(self.root(), "<tmp>")],
            first_prompts,
        }
        .text()
    }

    fn assert_checkout_clean(&self) {
        assert_eq!(self.git(&["status", "--porcelain"]), "");
        assert!(!self.git_ok(&["rev-parse", "-q", "--verify", "MERGE_HEAD"]));
        assert_eq!(self.git(&["branch", "--show-current"]), "main");
    }
}

#[test]
fn a_dependent_starts_from_its_dependencys_landed_work() {
    let project = project("handover", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    for name in ["impl", "impl2", "user", "control"] {
        assert_eq!(summary["loops"][name]["status"], "completed", "{summary:#}");
    }
    // impl2 landed in the user's branch; user started with it merged in too.
    assert_eq!(summary["loops"]["impl2"]["merge"]["into"], "main");
    assert!(
        project.transcript_text("user").contains("MODULE2-c41e"),
        "{}",
        project.transcript_text("user")
    );
    // `user`'s first tool call read the module its dependency wrote (the token is in no
    // prompt: only in the file); `handover: base` started `control` from the base branch.
    assert!(
        project.transcript_text("user").contains("MODULE-7f3a"),
        "user's read_file did not see impl's module: {}",
        project.transcript_text("user")
    );
    assert!(!project.transcript_text("control").contains("MODULE-7f3a"));
    // All three landed in the run's integration branch; the user's branch is untouched.
    let integration = project.integration();
    for file in ["module.txt", "used.txt"] {
        assert!(
            project.git_ok(&["cat-file", "-e", &format!("{integration}:{file}")]),
            "{file} is not in {integration}"
        );
        assert!(!project.git_ok(&["cat-file", "-e", &format!("main:{file}")]));
    }
    assert_eq!(
        summary["loops"]["user"]["merge"]["into"],
        integration.as_str()
    );
    project.assert_checkout_clean();
    snap(
        "scenario_12_handover",
        &project.story(&["taskdaemon/{run}/integration", "main"], &[]),
    );
}

#[test]
fn a_conflict_goes_back_to_the_loop_which_resolves_it_and_lands() {
    let project = project("handback-conflict", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    let two = &summary["loops"]["two"];
    assert_eq!(two["status"], "completed", "{two:#}");
    assert_eq!(two["merge"]["merged"], true, "{two:#}");
    assert_eq!(two["merge"]["attempts"], 1, "{two:#}");
    assert_eq!(two["iterations"], 2, "{two:#}");
    // Both changes are in the user's branch, without markers; the checkout shows them.
    assert_eq!(
        project.git(&["show", "main:shared.txt"]),
        "from one\nfrom two"
    );
    assert_eq!(
        std::fs::read_to_string(project.repo().join("shared.txt")).unwrap(),
        "from one\nfrom two\n"
    );
    project.assert_checkout_clean();
    // The hand back is an event naming the file, and the loop's second iteration was told
    // which file conflicts and what each side changed.
    let events = project.events();
    let handed = events
        .iter()
        .find(|e| e["event"] == "merge_handed_back")
        .unwrap_or_else(|| panic!("no hand back in {events:#?}"));
    assert_eq!(handed["loop_name"], "two");
    assert_eq!(handed["attempt"], 1);
    assert_eq!(handed["files"], serde_json::json!(["shared.txt"]));
    let transcript = project.transcript_text("two");
    assert!(transcript.contains("conflict markers"), "{transcript}");
    assert!(transcript.contains("+from one"), "{transcript}");
    assert!(transcript.contains("+from two"), "{transcript}");
    // No second `loop_started` for the loop run again.
    let started = events
        .iter()
        .filter(|e| e["event"] == "loop_started" && e["loop_name"] == "two")
        .count();
    assert_eq!(started, 1);
    snap(
        "scenario_13_conflict_handed_back",
        &project.story(&["main"], &[]),
    );
}

#[test]
fn a_merged_validation_that_fails_goes_back_and_the_fix_lands() {
    let project = project("merged-validation", &[("ATTEMPTS", "3"), ("PORT", "8081")]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    let b = &summary["loops"]["b"];
    assert_eq!(b["status"], "completed", "{b:#}");
    assert_eq!(b["merge"]["attempts"], 1, "{b:#}");
    assert_eq!(project.git(&["show", "main:a.cfg"]), "port=8080");
    assert_eq!(project.git(&["show", "main:b.cfg"]), "port=8081");
    let handed = project
        .events()
        .into_iter()
        .find(|e| e["event"] == "merge_handed_back")
        .expect("a hand back");
    assert!(
        handed["reason"]
            .as_str()
            .unwrap()
            .contains("validation of `b` fails"),
        "{handed:#}"
    );
    // b's second iteration saw the merged validation's command (with its exit code).
    let transcript = project.transcript_text("b");
    assert!(transcript.contains("uniq -d"), "{transcript}");
    project.assert_checkout_clean();
    snap(
        "scenario_14_merged_validation_fails",
        &project.story(&["main"], &[]),
    );
}

#[test]
fn hand_backs_past_merge_attempts_block_the_loop_and_markers_never_land() {
    // two's next iteration completes with the conflict markers still in shared.txt: the
    // queue refuses them and, its one hand back used, blocks it.
    let project = project("handback-exhausted", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(1), "{out:?}");
    let summary = project.summary();
    let two = &summary["loops"]["two"];
    assert_eq!(two["status"], "blocked", "{two:#}");
    assert_eq!(two["merge"]["attempts"], 1, "{two:#}");
    assert_eq!(two["merge"]["merged"], false, "{two:#}");
    let reason = two["reason"].as_str().unwrap();
    assert!(
        reason.contains("conflict markers are still in: shared.txt")
            && reason.contains("merge-attempts"),
        "{reason}"
    );
    // The markers are on two's branch, never in the user's.
    let branch = two["branch"].as_str().unwrap();
    assert!(
        project
            .git(&["show", &format!("{branch}:shared.txt")])
            .contains("<<<<<<<")
    );
    assert_eq!(project.git(&["show", "main:shared.txt"]), "from one");
    project.assert_checkout_clean();
    let blocked = project
        .events()
        .into_iter()
        .filter(|e| e["event"] == "loop_blocked" && e["loop_name"] == "two")
        .count();
    assert_eq!(blocked, 1);
}

#[test]
fn a_group_with_a_failed_member_lands_nothing() {
    let project = project("group-fails", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(1), "{out:?}");
    let summary = project.summary();
    assert_eq!(summary["loops"]["m2"]["status"], "failed", "{summary:#}");
    let m1 = &summary["loops"]["m1"];
    assert_eq!(m1["status"], "blocked", "{m1:#}");
    let reason = m1["reason"].as_str().unwrap();
    assert!(
        reason.contains("member `m2` did not complete") && reason.contains("shared-g"),
        "{reason}"
    );
    let integration = project.integration();
    for file in ["m1.txt", "half.txt"] {
        assert!(
            !project.git_ok(&["cat-file", "-e", &format!("{integration}:{file}")]),
            "{file} landed"
        );
    }
    // The group's work stays on its branch; `solo` landed as usual.
    let branch = m1["branch"].as_str().unwrap();
    assert!(project.git_ok(&["cat-file", "-e", &format!("{branch}:half.txt")]));
    assert!(project.git_ok(&["cat-file", "-e", &format!("{integration}:solo.txt")]));
    project.assert_checkout_clean();
    snap(
        "scenario_15_group_member_fails",
        &project.story(&["taskdaemon/{run}/integration"], &[]),
    );
}

#[test]
fn a_dirty_checkout_is_left_alone_and_taskdaemon_merge_lands_the_work_once_clean() {
    let project = project("merge-dirty", &[]);
    std::fs::write(project.repo().join("README.md"), "the user's edit\n").unwrap();
    let main_before = project.git(&["rev-parse", "main"]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(1), "{out:?}");
    let summary = project.summary();
    let run_id = summary["run_id"].as_str().unwrap().to_string();
    let solo = &summary["loops"]["solo"];
    assert_eq!(solo["status"], "blocked", "{solo:#}");
    let reason = solo["reason"].as_str().unwrap();
    assert!(
        reason.contains("uncommitted changes (README.md)")
            && reason.contains(&format!("taskdaemon merge {run_id} solo")),
        "{reason}"
    );
    // Never touched: the user's edit is there, main did not move, nothing is mid-merge.
    assert_eq!(
        std::fs::read_to_string(project.repo().join("README.md")).unwrap(),
        "the user's edit\n"
    );
    assert_eq!(project.git(&["rev-parse", "main"]), main_before);
    assert!(!project.repo().join("solo.txt").exists());
    assert!(!project.git_ok(&["rev-parse", "-q", "--verify", "MERGE_HEAD"]));

    // The user cleans up, then merges by hand; not while a live process owns the run.
    project.git(&["checkout", "--", "README.md"]);
    let run_dir = project.run_dir();
    let held = taskdaemon::run::owner::take(&run_dir).unwrap();
    let refused =
        project.taskdaemon_to_end(&["merge", &run_id, "--dir", run_dir.to_str().unwrap()]);
    assert_eq!(refused.code, Some(75), "{refused:?}");
    assert!(!project.repo().join("solo.txt").exists());
    drop(held);
    let merged =
        project.taskdaemon_to_end(&["merge", &run_id, "solo", "--dir", run_dir.to_str().unwrap()]);
    assert_eq!(merged.code, Some(0), "{merged:?}");
    assert!(
        merged.stdout.contains("solo: merged into main as "),
        "{merged:?}"
    );
    assert_eq!(project.git(&["show", "main:solo.txt"]), "solo");
    assert_eq!(
        std::fs::read_to_string(project.repo().join("solo.txt")).unwrap(),
        "solo\n"
    );
    project.assert_checkout_clean();
    let summary = project.summary();
    let solo = &summary["loops"]["solo"];
    assert_eq!(solo["status"], "completed", "{solo:#}");
    assert_eq!(solo["merge"]["merged"], true, "{solo:#}");
    assert_eq!(solo["merge"]["commit"], project.git(&["rev-parse", "main"]));
    assert_eq!(summary["status"], "completed", "{summary:#}");
    let last = project.events().pop().unwrap();
    assert_eq!(last["event"], "loop_merged", "{last:#}");
    // Again: nothing left to do.
    let again = project.taskdaemon_to_end(&["merge", &run_id, "--dir", run_dir.to_str().unwrap()]);
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(
        again.stdout.contains("solo: already merged into main"),
        "{again:?}"
    );
}

#[test]
fn a_completed_loop_killed_in_the_queue_is_queued_again_on_resume() {
    let flags = tempfile::tempdir().unwrap();
    let f = flags.path().canonicalize().unwrap();
    let project = project("queue-resume", &[("FLAGS", f.to_str().unwrap())]);
    let config = project.root().join("config/taskdaemon.yml");
    let run_dir = project.run_dir();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
    cmd.args([
        "run",
        "-c",
        config.to_str().unwrap(),
        "--run-dir",
        run_dir.to_str().unwrap(),
    ])
    .current_dir(project.root())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    project.isolate(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    while !f.join("in-queue").exists() {
        assert!(
            start.elapsed() < RUN_GUARD,
            "the merged validation never ran"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before its queue ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // summary.json is written behind the run: killed once it says what the events say.
    let summary_path = run_dir.join("summary.json");
    common::wait_until("the summary to say solo completed", RUN_GUARD, || {
        std::fs::read_to_string(&summary_path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| v["loops"]["solo"]["status"] == "completed")
    });
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::write(f.join("release"), "").unwrap();
    let summary = project.summary();
    assert_eq!(
        summary["loops"]["solo"]["status"], "completed",
        "{summary:#}"
    );
    assert!(summary["loops"]["solo"]["merge"].is_null(), "{summary:#}");

    let out = project.taskdaemon_to_end(&[
        "run",
        "-c",
        config.to_str().unwrap(),
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--resume",
        "again",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    let solo = &summary["loops"]["solo"];
    let integration = project.integration();
    assert_eq!(solo["merge"]["merged"], true, "{solo:#}");
    assert_eq!(solo["merge"]["into"], integration.as_str());
    assert_eq!(
        project.git(&["show", &format!("{integration}:solo.txt")]),
        "solo"
    );
    // Its model was not called again, and the killed run's scratch worktree is gone.
    assert_eq!(solo["iterations"], 1, "{solo:#}");
    assert!(!run_dir.join("scratch").exists());
    assert!(!project.git(&["worktree", "list"]).contains("scratch"));
    project.assert_checkout_clean();
}

#[test]
fn a_groups_failing_validation_goes_back_to_its_member_and_the_group_lands_whole() {
    let project = project("group-handback", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    let (g1, g2) = (&summary["loops"]["g1"], &summary["loops"]["g2"]);
    assert_eq!(g2["merge"]["attempts"], 1, "{g2:#}");
    assert_eq!(g2["iterations"], 2, "{g2:#}");
    // g1's validation passed on the merged tree: it was not run again.
    assert_eq!(g1["iterations"], 1, "{g1:#}");
    assert!(g1["merge"]["attempts"].is_null(), "{g1:#}");
    for l in [g1, g2] {
        assert_eq!(l["status"], "completed", "{l:#}");
        assert_eq!(l["merge"]["merged"], true, "{l:#}");
    }
    assert_eq!(project.git(&["show", "main:g1.txt"]), "g1");
    assert_eq!(project.git(&["show", "main:b.cfg"]), "port=8081");
    assert_eq!(project.git(&["show", "main:a.cfg"]), "port=8080");
    let handed: Vec<Value> = project
        .events()
        .into_iter()
        .filter(|e| e["event"] == "merge_handed_back")
        .collect();
    assert_eq!(handed.len(), 1, "{handed:#?}");
    assert_eq!(handed[0]["loop_name"], "g2");
    project.assert_checkout_clean();
}

#[test]
fn the_pipeline_plan_spec_code_runs_from_one_file_each_stage_from_the_artifacts_before() {
    let project = project("pipeline", &[]);
    let out = project.run_scenario();
    assert_eq!(out.code, Some(0), "{out:?}");
    let summary = project.summary();
    for name in ["planner", "speccer", "coder"] {
        assert_eq!(summary["loops"][name]["status"], "completed", "{summary:#}");
    }
    // Each stage's first prompt named the artifacts of the stage before, and its first
    // tool call read them from its worktree (a missing file would be an error result).
    let speccer = project.transcript_text("speccer");
    assert!(
        speccer.contains("taskdaemon-artifacts/plan-greeting.md"),
        "{speccer}"
    );
    assert!(speccer.contains("Say hello in greeting.txt."), "{speccer}");
    let coder = project.transcript_text("coder");
    assert!(
        coder.contains("taskdaemon-artifacts/spec-words.md"),
        "{coder}"
    );
    assert!(
        coder.contains("greeting.txt holds one line: hello."),
        "{coder}"
    );
    // The artifacts and the code landed together in the run's integration branch, and
    // each stage's artifacts were kept in the run record.
    let integration = project.integration();
    for file in [
        "taskdaemon-artifacts/plan-greeting.md",
        "taskdaemon-artifacts/spec-words.json",
        "greeting.txt",
    ] {
        assert!(
            project.git_ok(&["cat-file", "-e", &format!("{integration}:{file}")]),
            "{file} is not in {integration}"
        );
    }
    assert!(
        project
            .run_dir()
            .join("loops/speccer/artifacts/spec-words.md")
            .is_file()
    );
    project.assert_checkout_clean();
    snap(
        "scenario_16_pipeline",
        &project.story(&["taskdaemon/{run}/integration"], &["speccer", "coder"]),
    );
}
