//! The git that `taskdaemon run` runs itself (checkpoint commits, worktrees, the merge queue's
//! merges and diffs) is unconfined, so a loop must not be able to choose what it runs. A
//! `.gitattributes` names drivers (`filter=`, `diff=`, `merge=`) and git runs the programs the
//! user's config gives them: a loop that commits `* filter=lfs` with a `.lfsconfig` of its
//! own would have the daemon's git-lfs fetch from a URL the loop picked, outside every sandbox.
//!
//! The user's config here defines a filter, a textconv and a merge driver, each a script that
//! appends its name to a flag file outside the repository; a loop commits a `.gitattributes`
//! naming all three for every file, and a second loop changes the same file, so that the merge
//! queue merges it from both sides. Each git on this machine is put first on `PATH` in turn
//! (`/usr/local/bin` and `/usr/bin` hold git 2.47 and 2.39 here: the daemon takes a different
//! path below git 2.42), in a SHA-1 and a SHA-256 repository. The flag file must never appear,
//! and the run must still end with both loops merged.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

mod common;
use common::machine_gits::{case_dirs, gits, run, run_failed, version};

/// Writes an executable script `name` into `dir` that appends `name` to `flag`, then runs
/// `then` (what the driver must do to look like one).
fn plant_driver(dir: &Path, name: &str, flag: &Path, then: &str) -> PathBuf {
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho {name} >> '{}'\n{then}\n", flag.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// The user's global config: a filter (required, as git-lfs sets it), a textconv, an external
/// diff and a merge driver, all named `td-evil`, each leaving its name in `flag`.
fn user_config(root: &Path, flag: &Path) -> String {
    let bin = root.join("drivers");
    std::fs::create_dir_all(&bin).unwrap();
    let clean = plant_driver(&bin, "clean", flag, "exec cat");
    let smudge = plant_driver(&bin, "smudge", flag, "exec cat");
    let textconv = plant_driver(&bin, "textconv", flag, "exec cat \"$1\"");
    let external = plant_driver(&bin, "external-diff", flag, "exit 0");
    let merge = plant_driver(&bin, "merge", flag, "exit 0");
    format!(
        "[filter \"td-evil\"]\n\tclean = {}\n\tsmudge = {}\n\trequired = true\n\
         [diff \"td-evil\"]\n\ttextconv = {}\n\tcommand = {}\n\
         [merge \"td-evil\"]\n\tdriver = {} %O %A %B\n",
        clean.display(),
        smudge.display(),
        textconv.display(),
        external.display(),
        merge.display(),
    )
}

/// Loop `one` commits the attributes and changes the first line of `notes.txt`; loop `two`
/// changes its last line after a second's sleep, so that it is merged second: a three-way merge of
/// that file with the attributes on the target branch.
const SCRIPT: &str = "\
one:
  turns:
    - calls:
        - write_file: {path: .gitattributes, content: \"* filter=td-evil diff=td-evil merge=td-evil\\n\"}
        - write_file: {path: notes.txt, content: \"ONE\\nb\\nc\\nd\\ne\\n\"}
        - complete_task: {summary: done}
two:
  turns:
    - calls:
        - run_command: {command: \"sleep 1\"}
    - calls:
        - write_file: {path: notes.txt, content: \"a\\nb\\nc\\nd\\nTWO\\n\"}
        - complete_task: {summary: done}
";

const CONFIG: &str = "repo: repo\nllm: {provider: scripted, script: script.yml}\nmerge: true\n\
     loops:\n  - {name: one, type: code, task: Change notes., validation: 'test -s notes.txt'}\n  \
     - {name: two, type: code, task: Change notes., validation: 'test -s notes.txt'}\n";

/// A repository of `format` with `notes.txt`, made by the test's own git (no drivers: its
/// `HOME` is not the daemon's).
fn make_repo(repo: &Path, format: &str) {
    std::fs::create_dir_all(repo).unwrap();
    std::fs::write(repo.join("notes.txt"), "a\nb\nc\nd\ne\n").unwrap();
    common::git(
        repo,
        &[
            "init",
            "-q",
            "-b",
            "main",
            &format!("--object-format={format}"),
        ],
    );
    common::git(repo, &["add", "-A"]);
    common::git(repo, &["commit", "-q", "-m", "init"]);
}

#[test]
fn a_loops_gitattributes_choose_no_program_the_daemons_git_runs() {
    // Every git and format is tried before judging, so a failure shows them all.
    let mut problems = Vec::new();
    for git_dir in gits() {
        let which = version(&git_dir);
        for format in ["sha1", "sha256"] {
            let (_tmp, root, home) = case_dirs();
            let flag = root.join("driver-ran.txt");
            std::fs::write(home.join(".gitconfig"), user_config(&root, &flag)).unwrap();
            let repo = root.join("repo");
            make_repo(&repo, format);
            std::fs::write(root.join("script.yml"), SCRIPT).unwrap();
            let config = root.join("taskdaemon.yml");
            std::fs::write(&config, CONFIG).unwrap();
            let out = run(&config, &git_dir, &home);
            let case = format!("{which}, {format}");
            let drivers = std::fs::read_to_string(&flag).unwrap_or_default();
            if !drivers.is_empty() {
                problems.push(format!("{case}: ran {}", drivers.replace('\n', " ")));
            }
            if let Some(failed) = run_failed(&case, &out) {
                problems.push(failed);
                continue;
            }
            // Both loops' work reached main, merged by git's own three-way merge, with the
            // loop's attributes on it.
            let notes = common::git(&repo, &["show", "main:notes.txt"]);
            if notes != "ONE\nb\nc\nd\nTWO\n" {
                problems.push(format!("{case}: main has notes.txt {notes:?}"));
            }
            let attributes = common::git(&repo, &["show", "main:.gitattributes"]);
            assert!(attributes.contains("td-evil"), "{case}");
        }
    }
    assert!(
        problems.is_empty(),
        "the daemon's git ran drivers a loop's .gitattributes named, or merged wrongly:\n{}",
        problems.join("\n")
    );
}

/// The user's committed attributes (the run's base) name an uppercasing clean filter (and a
/// lowercasing smudge) for `*.up` and git's own union merge for `*.log`; loop `one` adds `*.txt` to that filter in the
/// `.gitattributes` it commits, writes `one.up` and `one.txt`, and appends to `shared.log`;
/// loop `two` appends to `shared.log` a second later.
const USERS_SCRIPT: &str = "\
one:
  turns:
    - calls:
        - write_file: {path: .gitattributes, content: \"*.up filter=td-upper\\n*.log merge=union\\n*.txt filter=td-upper\\n\"}
        - write_file: {path: one.up, content: \"one\\n\"}
        - write_file: {path: one.txt, content: \"one\\n\"}
        - write_file: {path: shared.log, content: \"start\\none\\n\"}
        - complete_task: {summary: done}
two:
  turns:
    - calls:
        - run_command: {command: \"sleep 1\"}
    - calls:
        - write_file: {path: shared.log, content: \"start\\ntwo\\n\"}
        - complete_task: {summary: done}
";

#[test]
fn the_users_committed_attributes_still_apply_to_what_loops_write() {
    let mut problems = Vec::new();
    for git_dir in gits() {
        let which = version(&git_dir);
        // `git version 2.47.3` → (2, 47).
        let numbers: Vec<u32> = which
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .split('.')
            .filter_map(|n| n.parse().ok())
            .collect();
        let reads_a_commit = (numbers[0], numbers[1]) >= (2, 42);
        for format in ["sha1", "sha256"] {
            let (_tmp, root, home) = case_dirs();
            std::fs::write(
                home.join(".gitconfig"),
                "[filter \"td-upper\"]\n\tclean = tr a-z A-Z\n\tsmudge = tr A-Z a-z\n",
            )
            .unwrap();
            let repo = root.join("repo");
            make_repo(&repo, format);
            std::fs::write(
                repo.join(".gitattributes"),
                "*.up filter=td-upper\n*.log merge=union\n",
            )
            .unwrap();
            std::fs::write(repo.join("shared.log"), "start\n").unwrap();
            // Committed as the clean filter makes it (the test's git has no such filter).
            std::fs::write(repo.join("base.up"), "X\n").unwrap();
            common::git(&repo, &["add", "-A"]);
            common::git(&repo, &["commit", "-q", "-m", "the user's attributes"]);
            std::fs::write(root.join("script.yml"), USERS_SCRIPT).unwrap();
            let config = root.join("taskdaemon.yml");
            // Loop `one`'s worktree holds `base.up` as the user's smudge filter makes it (the
            // daemon's checkout), or as committed where older git runs no driver.
            let smudged = if reads_a_commit { "x" } else { "X" };
            let config_text = CONFIG.replace("notes.txt", "shared.log").replacen(
                "validation: 'test -s shared.log'",
                &format!("validation: 'grep -qx {smudged} base.up'"),
                1,
            );
            std::fs::write(&config, config_text).unwrap();
            let out = run(&config, &git_dir, &home);
            let case = format!("{which}, {format}");
            if let Some(failed) = run_failed(&case, &out) {
                problems.push(failed);
                continue;
            }
            let show = |path: &str| common::git(&repo, &["show", &format!("main:{path}")]);
            // The user's filter cleaned the loop's new file (older git turns every driver
            // off: it cannot be told to read the user's attributes and not the loop's).
            let up = if reads_a_commit { "ONE\n" } else { "one\n" };
            if show("one.up") != up {
                problems.push(format!(
                    "{case}: one.up is {:?}, not {up:?}",
                    show("one.up")
                ));
            }
            // The loop's own attribute named the same filter for `*.txt`: not applied.
            if show("one.txt") != "one\n" {
                problems.push(format!("{case}: one.txt is {:?}", show("one.txt")));
            }
            // Both loops' lines, by git's union merge: no hand-back, nothing lost.
            if show("shared.log") != "start\none\ntwo\n" {
                problems.push(format!("{case}: shared.log is {:?}", show("shared.log")));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "the user's committed attributes were not applied, or a loop's were:\n{}",
        problems.join("\n")
    );
}
