//! `taskdaemon run` worktree modes and bases: `worktree: shared:<group>` puts loops in one
//! worktree, `worktree: repo` works in the repository's own checkout, `base:` starts a
//! loop's branch from another branch.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{git, init_repo};

#[test]
fn shared_repo_and_base_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().canonicalize().unwrap().join("repo");
    init_repo(&repo, &[("README.md", "main\n")]);
    git(&repo, &["checkout", "-q", "-b", "feature"]);
    std::fs::write(repo.join("feature.txt"), "only on feature\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "feature"]);
    git(&repo, &["checkout", "-q", "main"]);
    std::fs::write(
        repo.join("script.yml"),
        r#"
writer:
  turns:
    - calls:
        - write_file: {path: shared.txt, content: "from writer\n"}
        - complete_task: {summary: "wrote"}
reader:
  turns:
    - calls:
        - read_file: {path: shared.txt}
        - complete_task: {summary: "read"}
inplace:
  turns:
    - calls:
        - write_file: {path: in-place.txt, content: "written in the checkout\n"}
        - complete_task: {summary: "in place"}
featured:
  turns:
    - calls:
        - read_file: {path: feature.txt}
        - complete_task: {summary: "saw the feature"}
"#,
    )
    .unwrap();
    std::fs::write(
        repo.join("taskdaemon.yml"),
        r#"
llm: {provider: scripted, script: script.yml}
loops:
  - {name: writer, type: ralph, task: write, worktree: "shared:pair"}
  - {name: reader, type: ralph, task: read, worktree: "shared:pair", depends-on: [writer],
     validation: "grep -q 'from writer' shared.txt"}
  - {name: inplace, type: ralph, task: write here, worktree: repo}
  - {name: featured, type: ralph, task: read the feature, base: feature,
     validation: "test -f feature.txt"}
"#,
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["run", "-c"])
        .arg(repo.join("taskdaemon.yml"))
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    for name in ["writer", "reader", "inplace", "featured"] {
        assert_eq!(
            summary["loops"][name]["status"], "completed",
            "{name}: {summary}"
        );
    }
    // The two loops of one group shared a worktree and a branch.
    assert_eq!(
        summary["loops"]["writer"]["worktree"],
        summary["loops"]["reader"]["worktree"]
    );
    assert_eq!(
        summary["loops"]["writer"]["branch"],
        summary["loops"]["reader"]["branch"]
    );
    // `repo` mode worked in the checkout itself, on no branch of its own.
    assert_eq!(
        std::fs::read_to_string(repo.join("in-place.txt")).unwrap(),
        "written in the checkout\n"
    );
    assert!(summary["loops"]["inplace"]["branch"].is_null());
    // `base: feature` started from the feature branch.
    let featured = summary["loops"]["featured"]["branch"].as_str().unwrap();
    let files = git(&repo, &["ls-tree", "--name-only", featured]);
    assert!(files.lines().any(|f| f == "feature.txt"), "{files}");
    // main did not gain the feature file, and the user stays on main.
    assert_eq!(
        git(&repo, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "main"
    );
    assert!(!git(&repo, &["ls-tree", "--name-only", "main"]).contains("feature.txt"));
}

#[test]
fn max_loops_and_loop_type_settings_reach_the_loops() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().canonicalize().unwrap().join("repo");
    init_repo(&repo, &[("README.md", "x\n")]);
    std::fs::write(
        repo.join("script.yml"),
        r#"
first:
  turns:
    - calls:
        - build: {}
        - test: {}
        - broadcast_alert: {event_type: noisy, message: "nobody listens to this"}
        - complete_task: {summary: "built and tested"}
second:
  turns:
    - calls:
        - complete_task: {summary: "second"}
"#,
    )
    .unwrap();
    std::fs::write(
        repo.join("taskdaemon.yml"),
        r#"
llm: {provider: scripted, script: script.yml}
concurrency: {max-loops: 1}
loop-types:
  picky:
    extends: code
    success-code: 3
    validation: "test -f built.txt && test -f tested.txt && exit 3"
    build: "echo built > built.txt"
    test: "echo tested > tested.txt"
    subscriptions: [loop_completed]
loops:
  - {name: first, type: picky, task: build and test}
  - {name: second, type: picky, task: nothing much, validation: "exit 3"}
"#,
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_taskdaemon"))
        .args(["run", "-c"])
        .arg(repo.join("taskdaemon.yml"))
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Value> = std::fs::read_to_string(run_dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seq = |event: &str, name: &str| {
        events
            .iter()
            .find(|e| e["event"] == event && e["loop_name"] == name)
            .and_then(|e| e["seq"].as_u64())
            .unwrap_or_else(|| panic!("no {event} for {name}"))
    };
    // max-loops: 1 — the second loop starts only after the first ended.
    let (a_end, b_start) = (
        seq("loop_completed", "first"),
        seq("loop_started", "second"),
    );
    let b_end = seq("loop_completed", "second");
    let a_start = seq("loop_started", "first");
    assert!(
        a_end < b_start || b_end < a_start,
        "loops overlapped: {a_start}..{a_end} and {b_start}..{b_end}"
    );
    // success-code 3 passed validation; the type's build and test commands ran.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(
        summary["loops"]["first"]["validation"]["exit_code"], 3,
        "{summary}"
    );
    assert_eq!(summary["loops"]["first"]["status"], "completed");
    // subscriptions: [loop_completed] — the `noisy` alert reached nobody.
    let noisy = events
        .iter()
        .find(|e| e["event"] == "alert" && e["event_type"] == "noisy")
        .unwrap();
    assert_eq!(noisy["recipients"], serde_json::json!([]), "{noisy}");
}
