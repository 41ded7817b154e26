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
