//! Warm worktrees (issue 16): a loop's new worktree is seeded with the build state its
//! `warm:` names (`config::warm`), copied from the base checkout (the repository root the
//! run works on) by `td_git::seed` before the loop starts, so that its first build reuses
//! the base's instead of starting cold. What was copied, how and how long it took goes into
//! a `worktree_seeded` event (and from there into the loop's `warm` in `summary.json` and
//! its progress line).

use std::path::{Path, PathBuf};

use td_git::worktree::Worktree;
use td_protocol::events::WarmSeed;

/// Seeds `worktree` with each of `paths` that the base checkout `base` has and that git
/// ignores in the worktree; `None` when there is nothing to seed. Never fails the loop: what
/// could not be copied is named in the result, and the worktree then starts as it would
/// without `warm:`.
pub async fn seed_worktree(
    base: &Path,
    worktree: &Worktree,
    paths: &[PathBuf],
) -> Option<WarmSeed> {
    if paths.is_empty() {
        return None;
    }
    // A path git does not ignore would be committed with the loop's work (and merged): build
    // output is never work. Its absence from the base is reported by the copy itself.
    let mut refused = Vec::new();
    let mut wanted = Vec::new();
    for p in paths {
        // `target/` in a .gitignore names only a directory, which the worktree does not have
        // yet: ask about the form the base has (the copy checks the base again, safely).
        let asked = match std::fs::symlink_metadata(base.join(p)) {
            Ok(m) if m.is_dir() => PathBuf::from(format!("{}/", p.display())),
            Ok(_) => p.clone(),
            Err(_) => {
                wanted.push(p.clone());
                continue;
            }
        };
        match worktree.is_ignored(&asked).await {
            Ok(true) => wanted.push(p.clone()),
            Ok(false) => refused.push(format!(
                "{}: not ignored by git, so the loop's commit would carry its copy; add it to .gitignore to seed it",
                p.display()
            )),
            Err(e) => refused.push(format!("{}: not seeded: {e}", p.display())),
        }
    }
    let (b, w) = (base.to_path_buf(), worktree.path().to_path_buf());
    let done = tokio::task::spawn_blocking(move || td_git::seed::seed(&b, &w, &wanted)).await;
    Some(match done {
        Ok(Ok(mut report)) => WarmSeed {
            method: report.method().to_string(),
            paths: report.seeded,
            skipped: {
                refused.append(&mut report.skipped);
                refused
            },
            skipped_entries: report.skipped_entries,
            files: report.files,
            bytes: report.bytes,
            symlinks: report.symlinks,
            ms: u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
        },
        Ok(Err(e)) => not_seeded(paths, &e.to_string()),
        Err(e) => not_seeded(paths, &e.to_string()),
    })
}

/// What a loop on a worker host started without `--warm-from` gets of its `warm:` `paths`:
/// nothing, said (the build state `warm:` copies is a checkout's, and the host was given
/// none), or `None` when they name nothing.
pub fn not_on_host(paths: &[PathBuf]) -> Option<WarmSeed> {
    (!paths.is_empty()).then(|| {
        not_seeded(
            paths,
            "the loop runs on a host started without --warm-from DIR (a checkout of the repository on that machine whose build state it copies)",
        )
    })
}

fn not_seeded(paths: &[PathBuf], why: &str) -> WarmSeed {
    WarmSeed {
        method: "none".to_string(),
        skipped: paths
            .iter()
            .map(|p| format!("{}: not seeded: {why}", p.display()))
            .collect(),
        ..WarmSeed::default()
    }
}

/// One line for the progress display: what was seeded, how, and what was skipped.
pub fn describe(seed: &WarmSeed) -> String {
    let mut text = if seed.paths.is_empty() {
        "warm: nothing seeded".to_string()
    } else {
        format!(
            "warm: {} seeded, {} files, {} ({}, {:.1} s)",
            seed.paths.join(", "),
            seed.files,
            human_bytes(seed.bytes),
            seed.method,
            seed.ms as f64 / 1000.0
        )
    };
    if !seed.skipped.is_empty() {
        text.push_str("; skipped: ");
        text.push_str(&seed.skipped.join("; "));
    }
    text
}

fn human_bytes(n: u64) -> String {
    const MB: u64 = 1 << 20;
    if n >= MB {
        format!("{:.1} MB", n as f64 / MB as f64)
    } else {
        format!("{:.1} kB", n as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    #[tokio::test]
    async fn ignored_paths_are_seeded_others_named_and_a_seed_is_described() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base");
        std::fs::create_dir_all(base.join("target")).unwrap();
        std::fs::create_dir_all(base.join("dist")).unwrap();
        std::fs::write(base.join(".gitignore"), "target/\nnode_modules/\n").unwrap();
        git(&base, &["init", "-q", "-b", "main"]);
        git(&base, &["add", "-A"]);
        git(&base, &["commit", "-q", "-m", "init"]);
        std::fs::write(base.join("target/a"), vec![0u8; 3 << 20]).unwrap();
        std::fs::write(base.join("dist/b"), "b").unwrap();
        let repo = td_git::worktree::Repo::open(&base).await.unwrap();
        let wt = repo
            .add_worktree("r1", "l", None, &d.path().join("wt"))
            .await
            .unwrap();
        assert_eq!(seed_worktree(&base, &wt, &[]).await, None);
        let seed = seed_worktree(
            &base,
            &wt,
            &[
                PathBuf::from("target"),
                PathBuf::from("node_modules"),
                PathBuf::from("dist"),
            ],
        )
        .await
        .unwrap();
        assert_eq!(seed.paths, vec!["target"]);
        assert_eq!((seed.files, seed.bytes), (1, 3 << 20));
        assert!(
            !d.path().join("wt/dist").exists(),
            "not ignored: not seeded"
        );
        let line = describe(&seed);
        assert!(
            line.starts_with("warm: target seeded, 1 files, 3.0 MB ("),
            "{line}"
        );
        assert!(
            line.ends_with("; skipped: dist: not ignored by git, so the loop's commit would carry its copy; add it to .gitignore to seed it; node_modules: not in the base checkout"),
            "{line}"
        );
    }
}
