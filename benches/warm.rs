//! `cargo bench --bench warm`: warm worktrees (issue 16).
//!
//! Once per run the bench makes a small Rust project in a temporary git repository: a binary
//! depending on `globset`, `regex`, `serde` (derive) and `serde_json`, resolved offline from
//! the cargo registry cache with this workspace's `Cargo.lock`, built and its tests built
//! once in the base checkout (its `target/` is what a user's checkout holds). Then:
//!
//! - `seed target/ x8`: 8 new `git worktree`s seeded with that `target/` by `td_git::seed`
//!   (what a run does for `warm: [cargo]`), against `cp -a target/` into the same 8
//!   worktrees, alternating, median of `BENCH_ROUNDS` (default 5). Target ratio <= 1.2.
//! - `8 loops build+test warm vs cold`: each of 8 worktrees runs `cargo build` then
//!   `cargo test`, two at a time (the heavy lane's default), cold (bare worktrees) against
//!   warm (seeded worktrees), once each. Target ratio <= 0.3 (the issue's).
//! - `8 warm loops vs one cold build`: the warm figure against one cold `cargo build` +
//!   `cargo test` alone. Target ratio <= 2.
//!
//! `BENCH_ONLY=seed` runs only the first (the others take minutes on 2 cores).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

const LOOPS: usize = 8;
const LANE: usize = 2;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@localhost"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cargo ARGS --offline -q` in `dir`, with the project's own `target/` (not the bench's).
fn cargo(dir: &Path, args: &[&str]) {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .args(["--offline", "-q"])
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sample project, committed, with its build output in `target/`.
fn project(root: &Path) -> PathBuf {
    let repo = root.join("base");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::create_dir_all(repo.join("tests")).unwrap();
    std::fs::write(
        repo.join("Cargo.toml"),
        "[package]\nname = \"warm-sample\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nglobset = \"0.4\"\nregex = \"1\"\nserde = { version = \"1\", features = [\"derive\"] }\nserde_json = \"1\"\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("src/main.rs"),
        "#[derive(serde::Serialize, serde::Deserialize)]\nstruct Hit { path: String, line: usize }\n\nfn main() {\n    let glob = globset::Glob::new(\"*.rs\").unwrap().compile_matcher();\n    let re = regex::Regex::new(r\"fn \\w+\").unwrap();\n    let hit = Hit { path: \"main.rs\".into(), line: usize::from(glob.is_match(\"main.rs\") && re.is_match(\"fn main\")) };\n    println!(\"{}\", serde_json::to_string(&hit).unwrap());\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn round_trip() {\n        let h = super::Hit { path: \"a\".into(), line: 1 };\n        let s = serde_json::to_string(&h).unwrap();\n        let back: super::Hit = serde_json::from_str(&s).unwrap();\n        assert_eq!(back.line, h.line);\n        assert_eq!(back.path, h.path);\n    }\n}\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("tests/glob.rs"),
        "#[test]\nfn globs_match() {\n    assert!(globset::Glob::new(\"**/*.rs\").unwrap().compile_matcher().is_match(\"a/b.rs\"));\n}\n",
    )
    .unwrap();
    std::fs::write(repo.join(".gitignore"), "target/\n").unwrap();
    // Pinned, offline: the versions this workspace already has in the registry cache.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"),
        repo.join("Cargo.lock"),
    )
    .unwrap();
    cargo(&repo, &["generate-lockfile"]);
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "sample"]);
    repo
}

/// 8 new worktrees of `repo` under `dir` (made fresh).
fn worktrees(repo: &Path, dir: &Path) -> Vec<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    git(repo, &["worktree", "prune"]);
    (0..LOOPS)
        .map(|i| {
            let wt = dir.join(format!("wt{i}"));
            let branch = format!("{}-{i}", dir.file_name().unwrap().to_string_lossy());
            git(
                repo,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-B",
                    &branch,
                    &wt.display().to_string(),
                ],
            );
            wt
        })
        .collect()
}

fn clear_targets(wts: &[PathBuf]) {
    for wt in wts {
        let _ = std::fs::remove_dir_all(wt.join("target"));
    }
}

/// Runs `job` for each worktree, `LANE` at a time; the wall time of all.
fn lane(wts: &[PathBuf], job: fn(&Path)) -> Duration {
    let queue = Arc::new(Mutex::new(wts.to_vec()));
    let start = Instant::now();
    let workers: Vec<_> = (0..LANE)
        .map(|_| {
            let queue = queue.clone();
            std::thread::spawn(move || {
                loop {
                    let next = queue.lock().unwrap().pop();
                    match next {
                        Some(wt) => job(&wt),
                        None => break,
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    start.elapsed()
}

fn build_and_test(dir: &Path) {
    cargo(dir, &["build"]);
    cargo(dir, &["test"]);
}

fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let repo = project(&root);
    let cold_one = common::time(&mut || build_and_test(&repo));
    {
        let probe = root.join("probe");
        std::fs::create_dir_all(&probe).unwrap();
        let r = td_git::seed::seed(&repo, &probe, &[PathBuf::from("target")]).unwrap();
        std::fs::remove_dir_all(&probe).unwrap();
        println!(
            "# sample target/: {} files, {} bytes, method {}; one cold build+test {:.0} ms",
            r.files,
            r.bytes,
            r.method(),
            common::ms(cold_one)
        );
    }
    let mut report = common::Report::new("warm");
    let seed_wts = worktrees(&repo, &root.join("seed"));
    let rounds = common::rounds(5);
    if common::selected("seed") {
        let ours = || {
            clear_targets(&seed_wts);
            let start = Instant::now();
            for wt in &seed_wts {
                let r = td_git::seed::seed(&repo, wt, &[PathBuf::from("target")]).unwrap();
                assert_eq!(r.seeded, vec!["target"]);
            }
            start.elapsed()
        };
        let cp = || {
            clear_targets(&seed_wts);
            let start = Instant::now();
            for wt in &seed_wts {
                let ok = Command::new("cp")
                    .args(["-a", "--"])
                    .arg(repo.join("target"))
                    .arg(wt.join("target"))
                    .status()
                    .unwrap()
                    .success();
                assert!(ok, "cp -a");
            }
            start.elapsed()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        ours();
        cp();
        for round in 0..rounds {
            if round % 2 == 0 {
                a.push(ours());
                b.push(cp());
            } else {
                b.push(cp());
                a.push(ours());
            }
        }
        report.add(
            "seed target/ x8 (vs cp -a)",
            common::ms(common::median(&a)),
            Some(common::ms(common::median(&b))),
            1.2,
        );
    }
    if common::selected("loops") {
        let cold = worktrees(&repo, &root.join("cold"));
        let cold_time = lane(&cold, build_and_test);
        let warm = worktrees(&repo, &root.join("warm"));
        let warm_time = lane(&warm, |wt| {
            let base = wt.parent().unwrap().parent().unwrap().join("base");
            td_git::seed::seed(&base, wt, &[PathBuf::from("target")]).unwrap();
            build_and_test(wt);
        });
        report.add(
            "8 loops build+test warm (vs cold)",
            common::ms(warm_time),
            Some(common::ms(cold_time)),
            0.3,
        );
        report.add(
            "8 warm loops (vs one cold build+test)",
            common::ms(warm_time),
            Some(common::ms(cold_one)),
            2.0,
        );
    }
    report.finish();
}
