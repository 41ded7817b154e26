//! A loop's command may write a `.git` file anywhere in its worktree, naming any repository
//! (`gitdir: /elsewhere/.git`). The daemon's checkpoint commit (`git add -A`, unconfined) then
//! resolved that repository's HEAD and recorded it as a gitlink: the loop read back, from its
//! own branch, whether a path outside its sandbox is a repository and which commit it is on.
//! A loop never makes a submodule commit the user could fetch (a submodule's repository lives
//! under `.git`, which its commands cannot write), so the daemon records no gitlink a loop
//! added or changed.
//!
//! Each git on this machine is put first on `PATH` in turn.

use std::path::Path;

mod common;
use common::machine_gits::{case_dirs, gits, run, version};

const CONFIG: &str = "repo: repo\nllm: {provider: scripted, script: script.yml}\nmerge: true\n\
     loops:\n  - {name: one, type: code, task: Work., validation: 'test -s one.txt'}\n";

/// The loop points `sub/.git`, `deep/er/.git` and `o*/.git` at `secret` (`o*` would match
/// its `one.txt` if the daemon took it back as a pathspec), with work beside them.
fn script(secret: &Path) -> String {
    let gitdir = secret.join(".git").display().to_string();
    format!(
        "one:\n  turns:\n    - calls:\n        - run_command: {{command: \"mkdir -p sub deep/er 'o*' && for d in sub deep/er 'o*'; do echo 'gitdir: {gitdir}' > \\\"$d/.git\\\"; done && echo x > sub/file.txt\"}}\n        - write_file: {{path: one.txt, content: \"one\\n\"}}\n        - complete_task: {{summary: done}}\n"
    )
}

#[test]
fn a_nested_git_file_puts_no_outside_commit_in_a_loops_branch() {
    if !common::fully_confined() {
        // Unconfined, a loop's command reads the repository itself: nothing to defend here.
        return;
    }
    let mut problems = Vec::new();
    for git_dir in gits() {
        let which = version(&git_dir);
        let (_tmp, root, home) = case_dirs();
        let secret = root.join("secret-repo");
        common::init_repo(&secret, &[("private.txt", "private\n")]);
        let secret_head = common::git(&secret, &["rev-parse", "HEAD"])
            .trim()
            .to_string();
        let repo = root.join("repo");
        common::init_repo(&repo, &[("README.md", "test\n")]);
        std::fs::write(root.join("script.yml"), script(&secret)).unwrap();
        let config = root.join("taskdaemon.yml");
        std::fs::write(&config, CONFIG).unwrap();
        let out = run(&config, &git_dir, &home);
        assert!(
            out.status.success(),
            "{which}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = std::fs::read_to_string(
            std::fs::read_dir(root.join(".taskdaemon/runs"))
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path()
                .join("summary.json"),
        )
        .unwrap();
        let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
        let branch = summary["loops"]["one"]["branch"]
            .as_str()
            .unwrap()
            .to_string();
        for rev in [branch.as_str(), "main"] {
            let tree = common::git(&repo, &["ls-tree", "-r", rev]);
            if tree.contains("160000") || tree.contains(&secret_head) {
                problems.push(format!("{which}: {rev} holds a gitlink:\n{tree}"));
            }
            if !tree.contains("one.txt") {
                problems.push(format!("{which}: {rev} lacks the loop's work:\n{tree}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
