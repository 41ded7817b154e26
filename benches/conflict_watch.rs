//! `cargo bench --bench conflict_watch`: what early conflict warnings (issue 15) cost with 50
//! loops.
//!
//! Setup: a repository of 400 files (20 directories × 20 files of 60 lines), 50 worktrees on
//! their own branches; each loop changes 3 files of its own, and loops 2k and 2k+1 change the
//! same line of one more file (25 conflicting pairs). Ours is the watch's own comparison,
//! `Comparer::changed` (snapshot the worktree in a temporary index, then
//! `git merge-tree --write-tree` against each other worktree's latest snapshot):
//!
//! - one change: a loop changed one more file; its snapshot compared with the 49 others
//!   (p50, p95), alternating sample by sample with the baseline;
//! - a full round: every loop changed, each compared in turn (the first round finds the 25
//!   conflicts, which is checked);
//! - for scale: one change compared without the watch's shortcut (pairs of one HEAD that
//!   changed different files are clean without git), a merge-tree for each of the 49.
//!
//! Baseline, same run: one `git status --porcelain` in one worktree (the daemon's git
//! environment), what a loop's own `git status` costs. Reported, no target: the watch runs in
//! a task of its own and no loop waits for it; the figures say how much CPU it takes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::Report;
use common::actors::{Dist, print_machine};
use taskdaemon::run::conflict_watch::Comparer;
use td_git::merge_tree::{self, Prediction, Snapshot};

const LOOPS: usize = 50;
const DIRS: usize = 20;
const FILES_PER_DIR: usize = 20;
const LINES: usize = 60;
const OWN_FILES: usize = 3;
const WARMUP: usize = 3;

fn file_path(index: usize) -> String {
    format!(
        "src/mod{:02}/file{:02}.rs",
        index / FILES_PER_DIR,
        index % FILES_PER_DIR
    )
}

/// The bench's own git (setup only): fixed identity, no system or user config.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::null())
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn original(index: usize) -> String {
    (0..LINES)
        .map(|l| format!("// line {l} of file {index}\n"))
        .collect()
}

/// Replaces line `line` of file `index` in `dir` with `text`.
fn change_line(dir: &Path, index: usize, line: usize, text: &str) {
    let path = dir.join(file_path(index));
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .expect("read")
        .lines()
        .map(str::to_string)
        .collect();
    lines[line] = text.to_string();
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
}

/// The repository and its 50 worktrees, each with its loop's changes.
fn setup(root: &Path) -> (PathBuf, Vec<PathBuf>) {
    let repo = root.join("repo");
    for i in 0..DIRS * FILES_PER_DIR {
        let path = repo.join(file_path(i));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, original(i)).expect("write");
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    let mut worktrees = Vec::new();
    for i in 0..LOOPS {
        let wt = root.join(format!("wt-{i:02}"));
        let branch = format!("loop-{i:02}");
        git(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &branch,
                wt.to_str().expect("utf-8"),
            ],
        );
        for f in 0..OWN_FILES {
            change_line(
                &wt,
                100 + OWN_FILES * i + f,
                5,
                &format!("// changed by loop {i}"),
            );
        }
        // Loops 2k and 2k+1 both change line 10 of file k.
        change_line(&wt, i / 2, 10, &format!("// loop {i} says so"));
        worktrees.push(wt);
    }
    (repo, worktrees)
}

fn status(dir: &Path) -> Duration {
    let t = Instant::now();
    let out = td_git::daemon_git::command(dir)
        .args(["status", "--porcelain"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .expect("git status");
    let d = t.elapsed();
    assert!(out.status.success());
    d
}

#[tokio::main]
async fn main() {
    print_machine("conflict_watch");
    let mut report = Report::new("conflict_watch");
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = Instant::now();
    let (repo, worktrees) = setup(tmp.path());
    println!(
        "# {LOOPS} worktrees of a {}-file repository made in {:.1} s",
        DIRS * FILES_PER_DIR,
        t.elapsed().as_secs_f64()
    );
    let stop = AtomicBool::new(false);
    let mut comparer = Comparer::new(&repo);
    for (i, wt) in worktrees.iter().enumerate() {
        comparer.watch(&format!("l{i:02}"), wt);
    }

    // A full round: the first one also checks what is found.
    let rounds = common::rounds(3);
    let mut round_times = Vec::new();
    let mut base_round = Vec::new();
    for round in 0..rounds {
        if round > 0 {
            for (i, wt) in worktrees.iter().enumerate() {
                change_line(
                    wt,
                    100 + OWN_FILES * i,
                    20 + round,
                    &format!("// round {round}"),
                );
            }
        }
        base_round.push(status(&worktrees[0]));
        let t = Instant::now();
        let mut found = Vec::new();
        for wt in &worktrees {
            found.extend(comparer.changed(wt, &stop).await);
        }
        round_times.push(t.elapsed());
        if round == 0 {
            let mut pairs: Vec<(String, String, Vec<String>)> = found
                .into_iter()
                .map(|f| {
                    let [a, b] = f.loops;
                    (a, b, f.files)
                })
                .collect();
            pairs.sort();
            let expected: Vec<(String, String, Vec<String>)> = (0..LOOPS / 2)
                .map(|k| {
                    (
                        format!("l{:02}", 2 * k),
                        format!("l{:02}", 2 * k + 1),
                        vec![file_path(k)],
                    )
                })
                .collect();
            assert_eq!(pairs, expected, "the 25 overlapping pairs, and only them");
        } else {
            assert!(found.is_empty(), "the same conflicts again: {found:?}");
        }
    }

    // Every worktree's latest snapshot, for the comparison without the shortcut.
    let mut latest = Vec::new();
    for wt in &worktrees {
        match merge_tree::snapshot(wt).await.expect("snapshot") {
            Snapshot::Taken(t) => latest.push(t.commit),
            Snapshot::Skipped { reason } => panic!("{reason}"),
        }
    }

    // One loop's change against the 49 others, alternating with one `git status`, and the
    // same without the shortcut (a merge-tree for every pair).
    let samples = common::rounds(30);
    let (mut ours, mut base, mut every) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..WARMUP + samples {
        let i = s % LOOPS;
        let wt = &worktrees[i];
        change_line(
            wt,
            100 + OWN_FILES * i + 1,
            30 + s % 20,
            &format!("// sample {s}"),
        );
        let t = Instant::now();
        let found = comparer.changed(wt, &stop).await;
        let d = t.elapsed();
        assert!(found.is_empty(), "{found:?}");
        let b = status(wt);
        let t = Instant::now();
        let Snapshot::Taken(mine) = merge_tree::snapshot(wt).await.expect("snapshot") else {
            panic!("skipped");
        };
        let mut conflicts = 0;
        for (j, theirs) in latest.iter().enumerate() {
            if j != i
                && merge_tree::predict(&repo, &mine.commit, theirs)
                    .await
                    .expect("merge-tree")
                    != Prediction::Clean
            {
                conflicts += 1;
            }
        }
        let e = t.elapsed();
        assert_eq!(conflicts, 1, "its partner, only");
        latest[i] = mine.commit;
        if s >= WARMUP {
            ours.push(d);
            base.push(b);
            every.push(e);
        }
    }
    let (ours, base, every) = (Dist::new(&ours), Dist::new(&base), Dist::new(&every));
    let ms = |us: f64| us / 1000.0;
    println!("# one change: {} samples each, alternating", ours.len());
    report.row(
        "one_change_vs_49_p50",
        "ms",
        ms(ours.p50()),
        Some(ms(base.p50())),
        "(reported; baseline: one git status)",
        None,
    );
    report.row(
        "one_change_vs_49_p95",
        "ms",
        ms(ours.q_us(0.95)),
        Some(ms(base.q_us(0.95))),
        "(reported; baseline: one git status)",
        None,
    );
    report.row(
        "one_change_vs_49_every_pair_merge_tree_p50",
        "ms",
        ms(every.p50()),
        Some(ms(base.p50())),
        "(reported; without the shortcut)",
        None,
    );
    let round = Dist::new(&round_times);
    let base_round = Dist::new(&base_round);
    println!(
        "# full rounds: {} ({} comparisons in the first, the next ones all {} again)",
        round.len(),
        LOOPS * (LOOPS - 1) / 2,
        LOOPS * (LOOPS - 1)
    );
    report.row(
        "full_round_50_loops_median",
        "ms",
        ms(round.p50()),
        Some(ms(base_round.p50())),
        "(reported; baseline: one git status)",
        None,
    );
    report.finish();
}
