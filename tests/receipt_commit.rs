//! The `commit` of a receipt is the worktree's HEAD as the daemon's own git would name it,
//! read from the repository's files (no process per lookup): through the real binary, in a
//! linked worktree with every ref packed, with HEAD detached, with no git on `PATH` at all,
//! and with `GIT_DIR` in the daemon's environment pointing at another repository.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

mod common;

/// Runs `tool exec` on `worktree` with one `read_file` call and `env` set, and returns the
/// `commit` of its receipt.
fn receipt_commit(worktree: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("receipts.jsonl");
    let mut command = Command::new(env!("CARGO_BIN_EXE_taskdaemon"));
    command
        .args(["tool", "exec", "--worktree"])
        .arg(worktree)
        .arg("--receipts")
        .arg(&log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let call = json!({"id": "1", "name": "read_file", "input": {"path": "a.txt"}});
    writeln!(child.stdin.take().unwrap(), "{call}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["is_error"], false, "{answer}");
    let receipts = std::fs::read_to_string(&log).unwrap();
    let receipt: Value = serde_json::from_str(receipts.trim()).unwrap();
    receipt["commit"].clone()
}

fn head(dir: &Path) -> Value {
    Value::from(common::git(dir, &["rev-parse", "HEAD"]).trim())
}

#[test]
fn a_receipt_names_the_worktrees_commit_whatever_git_dir_says() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours");
    let other = dir.path().join("other");
    common::init_repo(&ours, &[("a.txt", "ours\n")]);
    common::init_repo(&other, &[("b.txt", "other\n")]);
    assert_ne!(head(&ours), head(&other));
    // A daemon started from a git hook inherits GIT_DIR; the worktree's receipts must still
    // name the worktree's commit, as the daemon's own git (which drops GIT_DIR) would.
    let git_dir = other.join(".git");
    assert_eq!(
        receipt_commit(&ours, &[("GIT_DIR", git_dir.as_os_str())]),
        head(&ours)
    );
}

#[test]
fn the_commit_is_read_from_the_files_without_running_git() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    common::init_repo(&repo, &[("a.txt", "one\n")]);
    let linked = dir.path().join("linked");
    common::git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "loop",
            linked.to_str().unwrap(),
        ],
    );
    std::fs::write(linked.join("a.txt"), "two\n").unwrap();
    common::git(&linked, &["commit", "-qam", "on the loop branch"]);
    common::git(&repo, &["pack-refs", "--all"]);
    assert!(!repo.join(".git/refs/heads/loop").exists());

    // No git anywhere on PATH: whatever the receipt names was read from the files.
    let empty = dir.path().join("no-programs");
    std::fs::create_dir(&empty).unwrap();
    let no_git = [("PATH", empty.as_os_str())];
    assert_eq!(receipt_commit(&linked, &no_git), head(&linked));
    assert_eq!(receipt_commit(&repo, &no_git), head(&repo));
    assert_ne!(head(&linked), head(&repo));

    common::git(&linked, &["checkout", "-q", "--detach", "HEAD~1"]);
    assert_eq!(receipt_commit(&linked, &no_git), head(&repo));

    // Outside any repository there is no commit, with or without git.
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::write(plain.join("a.txt"), "x\n").unwrap();
    assert_eq!(receipt_commit(&plain, &no_git), Value::Null);
    assert_eq!(receipt_commit(&plain, &[]), Value::Null);
}
