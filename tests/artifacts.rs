//! Artifacts are work (issue 15): what `create_plan` writes is committed on the loop's
//! branch in `taskdaemon-artifacts/`, copied into the run record (never through a link, a
//! FIFO or anything but the folder's own regular files), listed by `status`, and named in
//! the first prompt of the next stage's loop. Through the real binary, the scripted
//! provider and real git.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use td_engine::transcript::TranscriptEntry;

mod common;

use common::flagged_run::{FlaggedRun, summary};

/// A plan loop's turn that writes the plan `x` and completes.
const PLAN_X: &str = r#"
    - calls:
        - create_plan:
            name: x
            title: "Plan X"
            overview: "Do X in one spec."
            specs: [{name: a, title: "Spec A", description: "Do A."}]
        - complete_task: {summary: "planned"}
"#;

/// Runs `taskdaemon ARGS` and returns its output.
fn taskdaemon(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// `taskdaemon status --dir RUN_DIR EXTRA`: its stdout, after checking it succeeded.
fn status(run: &FlaggedRun, extra: &[&str]) -> String {
    let dir = run.run_dir.display().to_string();
    let mut args = vec!["status", "--dir", dir.as_str()];
    args.extend_from_slice(extra);
    let out = taskdaemon(&args);
    assert!(
        out.status.success(),
        "status {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the project to its end; panics with its output unless it exits with `code`.
fn run_to_end(run: &FlaggedRun, code: i32) {
    let out = run.command(&[]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The project's repository (where the config lies).
fn repo(run: &FlaggedRun) -> &Path {
    run.config.parent().unwrap()
}

/// The text of the first user message of `loop_name`'s first iteration.
fn first_prompt(run: &FlaggedRun, loop_name: &str) -> String {
    let path = run
        .run_dir
        .join("loops")
        .join(loop_name)
        .join("transcript.jsonl");
    for line in common::lines(&path) {
        let Ok(TranscriptEntry::Request {
            iteration: 1,
            turn: 1,
            new_messages,
            ..
        }) = serde_json::from_str::<TranscriptEntry>(&line)
        else {
            continue;
        };
        let text: Vec<String> = new_messages
            .iter()
            .flat_map(|m| &m.content)
            .filter_map(|b| match b {
                td_llm::Block::Text { text } => Some(text.clone()),
                _ => None,
            })
            .collect();
        return text.join("\n");
    }
    panic!("no first request in {}", path.display());
}

#[test]
fn a_plan_is_committed_kept_in_the_record_and_listed_and_a_stage_without_one_warned() {
    let script = format!(
        "planner:\n  turns:{PLAN_X}idle:\n  turns:\n    - calls:\n        - complete_task: {{summary: \"nothing written\"}}\n"
    );
    let run = FlaggedRun::new(
        &script,
        "  - {name: planner, type: plan, task: Plan X.}\n  - {name: idle, type: spec, task: Write a spec.}\n",
    );
    run_to_end(&run, 0);
    let sum = summary(&run.run_dir);
    let planner = &sum["loops"]["planner"];
    assert_eq!(planner["status"], "completed", "{sum:#}");

    // On the loop's branch: the end commit holds the plan.
    let branch = planner["branch"].as_str().unwrap();
    let on_branch = common::git(
        repo(&run),
        &["show", &format!("{branch}:taskdaemon-artifacts/plan-x.md")],
    );
    assert!(on_branch.starts_with("# Plan: Plan X\n"), "{on_branch}");
    let json = common::git(
        repo(&run),
        &[
            "show",
            &format!("{branch}:taskdaemon-artifacts/plan-x.json"),
        ],
    );
    assert!(json.contains("\"kind\": \"plan\""), "{json}");

    // In the record, the same bytes, listed in summary.json.
    let kept = run.run_dir.join("loops/planner/artifacts/plan-x.md");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), on_branch);
    let listed = planner["artifacts"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{planner:#}");
    assert_eq!(listed[1]["kind"], "plan");
    assert_eq!(listed[1]["name"], "x");
    assert_eq!(listed[1]["path"], "loops/planner/artifacts/plan-x.md");
    assert_eq!(listed[1]["bytes"], on_branch.len());
    assert_eq!(listed[0]["path"], "loops/planner/artifacts/plan-x.json");
    assert!(planner.get("artifacts_skipped").is_none(), "{planner:#}");
    assert!(planner["reason"].is_null(), "{planner:#}");

    // status --json is the summary; the table counts the artifact once.
    let as_json: Value = serde_json::from_str(&status(&run, &["--json"])).unwrap();
    assert_eq!(
        as_json["loops"]["planner"]["artifacts"],
        planner["artifacts"]
    );
    let table = status(&run, &[]);
    // The column is right-aligned under its heading (the rows are ASCII here).
    let header = table.lines().find(|l| l.starts_with("LOOP")).unwrap();
    let start = header.find("ARTIFACTS").unwrap();
    let end = start + "ARTIFACTS".len();
    let cell = |name: &str| {
        let row = table.lines().find(|l| l.starts_with(name)).unwrap();
        row[start..end].trim().to_string()
    };
    assert_eq!(cell("planner"), "1", "{table}");
    assert_eq!(cell("idle"), "-", "{table}");

    // status --artifacts lists kind, name and path; --json too.
    let listing = status(&run, &["--artifacts"]);
    assert!(
        listing.contains("planner  plan  x     ")
            && listing.contains("loops/planner/artifacts/plan-x.md"),
        "{listing}"
    );
    let list: Value = serde_json::from_str(&status(&run, &["--artifacts", "--json"])).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "{list:#}");
    assert_eq!(list[1]["loop"], "planner");

    // A spec loop that completed without writing a spec is warned about, in the record and
    // in the status notes.
    let idle = &sum["loops"]["idle"];
    assert_eq!(idle["status"], "completed");
    let reason = idle["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("warning: it completed without writing any artifact (create_spec"),
        "{idle:#}"
    );
    assert!(
        table.contains("completed idle: warning: it completed without writing any artifact"),
        "{table}"
    );

    // A summary rebuilt from the events lists the kept artifacts again.
    std::fs::remove_file(run.run_dir.join("summary.json")).unwrap();
    let rebuilt: Value = serde_json::from_str(&status(&run, &["--json"])).unwrap();
    assert_eq!(
        rebuilt["loops"]["planner"]["artifacts"],
        planner["artifacts"]
    );
}

#[test]
fn links_and_fifos_planted_in_the_folder_are_not_followed_into_the_record() {
    // The loop's validation (a command, like any the loop runs) plants a link to a file
    // outside, a link to a directory outside, a FIFO and a file that is too large, next to
    // the plan the loop wrote. (It runs again on the merged tree, where the links are
    // committed: each step must be able to run twice.)
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "not for the record\n").unwrap();
    let validation = format!(
        "cd taskdaemon-artifacts && ln -sfn {secret} plan-leak.md && ln -sfn {dir} phase-dir.md \
         && {{ [ -p spec-pipe.json ] || mkfifo spec-pipe.json; }} \
         && head -c 1048577 /dev/zero > spec-big.md",
        secret = secret.display(),
        dir = outside.path().display()
    );
    let run = FlaggedRun::new(
        &format!("planner:\n  turns:{PLAN_X}"),
        &format!(
            "  - name: planner\n    type: plan\n    task: Plan X.\n    validation: '{validation}'\n"
        ),
    );
    run_to_end(&run, 0);
    let sum = summary(&run.run_dir);
    let planner = &sum["loops"]["planner"];
    assert_eq!(planner["status"], "completed", "{sum:#}");
    let kept: Vec<String> = std::fs::read_dir(run.run_dir.join("loops/planner/artifacts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(kept, ["plan-x.json", "plan-x.md"]);
    let skipped: Vec<&str> = planner["artifacts_skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(
        skipped,
        [
            "phase-dir.md: a symlink (not followed)",
            "plan-leak.md: a symlink (not followed)",
            "spec-big.md: larger than 1048576 bytes, the most one artifact file may have",
            "spec-pipe.json: not a regular file (a FIFO, socket or device: never opened)",
        ],
        "{planner:#}"
    );
    let said = std::fs::read_to_string(run.run_dir.join("loops/planner/artifacts-skipped.txt"));
    assert_eq!(said.unwrap(), skipped.join("\n") + "\n");
    let listing = status(&run, &["--artifacts"]);
    assert!(
        listing.contains("not kept planner: plan-leak.md: a symlink (not followed)"),
        "{listing}"
    );
    // Nothing of the secret reached the record.
    for file in regular_files(&run.run_dir) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("not for the record"),
            "{}",
            file.display()
        );
    }
}

#[test]
fn a_stage_starts_from_the_artifacts_in_its_worktree() {
    // The base branch of the spec loop already holds a plan (as a dependency's handover
    // would bring it); a code loop on `main` has none.
    let run = FlaggedRun::new(
        "specs:\n  turns:\n    - calls:\n        - complete_task: {summary: \"read it\"}\ncoder:\n  turns:\n    - calls:\n        - complete_task: {summary: \"done\"}\n",
        "  - {name: specs, type: spec, task: Write the specs of the plan., base: with-plan}\n  - {name: coder, type: code, task: Code it., base: main}\n",
    );
    let repo = repo(&run);
    common::git(repo, &["checkout", "-q", "-b", "with-plan"]);
    std::fs::create_dir(repo.join("taskdaemon-artifacts")).unwrap();
    std::fs::write(
        repo.join("taskdaemon-artifacts/plan-x.json"),
        "{\"kind\": \"plan\"}\n",
    )
    .unwrap();
    std::fs::write(repo.join("taskdaemon-artifacts/plan-x.md"), "# Plan: X\n").unwrap();
    common::git(repo, &["add", "taskdaemon-artifacts"]);
    common::git(repo, &["commit", "-q", "-m", "the plan"]);
    common::git(repo, &["checkout", "-q", "main"]);
    run_to_end(&run, 0);

    let prompt = first_prompt(&run, "specs");
    assert!(
        prompt.contains(
            "# Plans/specs from earlier stages\nThese artifact files are in your worktree"
        ) && prompt.contains(
            "before you start:\n- plan `x`: taskdaemon-artifacts/plan-x.json\n- plan `x`: taskdaemon-artifacts/plan-x.md\n"
        ),
        "{prompt}"
    );
    let plain = first_prompt(&run, "coder");
    assert!(plain.starts_with("# Task\nCode it.\n"), "{plain}");
    assert!(!plain.contains("earlier stages"), "{plain}");
}

/// Every regular file under `dir` (no link followed, no FIFO opened).
fn regular_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                Ok(t) if t.is_file() => out.push(entry.path()),
                _ => {}
            }
        }
    }
    out
}
