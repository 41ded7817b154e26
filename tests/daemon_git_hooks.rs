//! The git that `taskdaemon run` runs itself (checkpoint commits, `worktree add`/`remove`,
//! merges, the fresh copy of `copy-repo: true`) is unconfined, so it must run no hook at all:
//! hooks commonly run scripts from the worktree (husky, pre-commit), which a loop controls.
//! `--no-verify` skips only `pre-commit` and `commit-msg`.
//!
//! Each scenario runs through the real binary with every git on this machine (`/usr/local/bin`
//! and `/usr/bin` hold different versions here), each put first on `PATH` in turn. Every hook
//! appends its name to a flag file outside the repository; the flag file must never appear.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod common;
use common::machine_gits::{case_dirs, gits, run, version};

/// Every hook git may run for the daemon's commands (and a few more, should a git version
/// start running them).
const HOOKS: &[&str] = &[
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-merge",
    "post-checkout",
    "post-rewrite",
    "post-index-change",
    "reference-transaction",
    "pre-auto-gc",
    "pre-rebase",
    "pre-push",
];

/// Writes an executable hook for every name of [`HOOKS`] into `dir`; each appends its name
/// to `flag`.
fn plant_hooks(dir: &Path, flag: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for name in HOOKS {
        let hook = dir.join(name);
        std::fs::write(
            &hook,
            format!("#!/bin/sh\necho {name} >> '{}'\n", flag.display()),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// The flag file's content, or nothing when no hook ran.
fn hooks_that_ran(flag: &Path) -> String {
    std::fs::read_to_string(flag).unwrap_or_default()
}

const SCRIPT: &str = "one:\n  turns:\n    - calls:\n        - write_file: {path: one.txt, content: \"one was here\\n\"}\n        - complete_task: {summary: done}\n";

#[test]
fn checkpoints_worktrees_and_merges_run_no_hook_of_the_repository() {
    // Every git and scenario is tried before judging, so a failure shows them all.
    let mut ran_hooks = Vec::new();
    for git_dir in gits() {
        let (_tmp, root, home) = case_dirs();
        let flag = root.join("hook-ran.txt");
        // Hooks in the user's global config, in `.git/hooks`, and (husky style) in the
        // worktree itself, where a loop could rewrite them: the repository's own config
        // points there.
        plant_hooks(&root.join("global-hooks"), &flag);
        std::fs::write(
            home.join(".gitconfig"),
            format!(
                "[core]\n\thooksPath = {}\n",
                root.join("global-hooks").display()
            ),
        )
        .unwrap();
        let repo = root.join("repo");
        common::init_repo(&repo, &[("README.md", "test\n")]);
        plant_hooks(&repo.join(".husky"), &flag);
        common::git(&repo, &["add", ".husky"]);
        common::git(
            &repo,
            &["-c", "core.hooksPath=/dev/null", "commit", "-qm", "husky"],
        );
        plant_hooks(&repo.join(".git/hooks"), &flag);
        common::git(&repo, &["config", "core.hooksPath", ".husky"]);
        assert_eq!(hooks_that_ran(&flag), "", "the test's own git ran hooks");
        std::fs::write(root.join("script.yml"), SCRIPT).unwrap();
        let config = root.join("taskdaemon.yml");
        std::fs::write(
            &config,
            "repo: repo\nllm: {provider: scripted, script: script.yml}\nmerge: true\n\
             loops:\n  - {name: one, type: code, task: Write one.txt., validation: 'test -s one.txt'}\n",
        )
        .unwrap();
        let out = run(&config, &git_dir, &home);
        let which = version(&git_dir);
        assert!(
            out.status.success(),
            "{which}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The loop's work was committed, its worktree made and removed, and merged into
        // main: every path that used to run hooks ran.
        let files = common::git(&repo, &["ls-tree", "-r", "--name-only", "main"]);
        assert!(
            files.lines().any(|f| f == "one.txt"),
            "{which}: not merged: {files}"
        );
        let ran = hooks_that_ran(&flag);
        if !ran.is_empty() {
            ran_hooks.push(format!("{which}: {}", ran.replace('\n', " ")));
            std::fs::remove_file(&flag).unwrap();
        }

        // `copy-repo: true`: the fresh copy's `git init`/`commit` and the run on it; only
        // the global config can name hooks there.
        std::fs::write(
            &config,
            "repo: repo\ncopy-repo: true\nllm: {provider: scripted, script: script.yml}\nmerge: true\n\
             loops:\n  - {name: one, type: code, task: Write one.txt., validation: 'test -s one.txt'}\n",
        )
        .unwrap();
        let out = run(&config, &git_dir, &home);
        assert!(
            out.status.success(),
            "{which} (copy-repo): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ran = hooks_that_ran(&flag);
        if !ran.is_empty() {
            ran_hooks.push(format!("{which} (copy-repo): {}", ran.replace('\n', " ")));
        }
    }
    assert!(
        ran_hooks.is_empty(),
        "the daemon's git ran hooks:\n{}",
        ran_hooks.join("\n")
    );
}
