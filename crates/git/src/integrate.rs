//! The git side of integrating finished loops (the run's merge queue): a loop's branch is
//! merged onto its integration target's head in a detached scratch worktree (never in a
//! checkout of the user's), and only once that merged tree passed the loop's validation is
//! the target advanced to the merge commit: a fast-forward in the checkout where the target
//! is checked out (only when that checkout is clean and not mid-merge), or a
//! compare-and-swap of the ref when it is checked out nowhere. When a loop's work does not
//! merge, the target's head is merged into the loop's own worktree instead, so that the
//! loop resolves the conflict itself in its next iteration.
//!
//! Every command goes through [`crate::daemon_git::command`] (no hooks, no inherited git
//! environment) and commits under TaskDaemon's identity, as in [`crate::worktree`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::worktree::{
    GitOutput, MAX_STDERR, Repo, Result, Worktree, WorktreeError, as_taskdaemon, list_some,
    merge_lock, nul_separated, porcelain_paths,
};

/// Longest diff of one side of one conflicting file that is kept (head and tail).
pub const MAX_SIDE_DIFF: usize = 3_000;

/// How many conflicting files get their sides' diffs (the rest are only named).
pub const MAX_DIFFED_FILES: usize = 8;

/// A file both sides changed in ways git could not merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConflictFile {
    /// Its path, relative to the repository root.
    pub path: String,
    /// What the integration target changed in it since the merge base (a capped diff;
    /// empty past [`MAX_DIFFED_FILES`]).
    pub target_side: String,
    /// What the loop changed in it since the merge base (capped, as `target_side`).
    pub loop_side: String,
}

/// How merging a loop's branch in a scratch worktree went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScratchMerge {
    /// The merge commit (or the unchanged head when the branch had nothing new).
    Merged {
        /// The scratch worktree's HEAD after the merge.
        commit: String,
    },
    /// The branches conflict; the scratch merge was aborted.
    Conflict {
        /// The conflicting files, sorted, with both sides' changes.
        files: Vec<ConflictFile>,
    },
    /// Git refused to merge (unrelated histories, ...): what it said.
    Refused {
        /// Why, in git's words.
        reason: String,
    },
}

/// How advancing an integration target went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advance {
    /// The target now points at the new commit (and its checkout, if any, shows it).
    Advanced,
    /// The target moved since the merge was made (someone committed on it): merge again
    /// from its new head.
    Moved,
    /// The target is checked out in a checkout that must not be touched now (uncommitted
    /// changes, a merge in progress, a file in the way). Nothing changed.
    Blocked {
        /// Why, and what to do.
        reason: String,
    },
}

/// How merging the target's head into a loop's own worktree went (a hand back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandBackMerge {
    /// Merged cleanly and committed as a merge commit.
    Committed {
        /// The loop branch's new head.
        commit: String,
    },
    /// The loop's branch already contained the target's head.
    UpToDate,
    /// The merge stopped with conflicts: the worktree is mid-merge, with conflict markers in
    /// these files, for the loop to resolve (its next commit concludes the merge).
    Conflicted {
        /// The conflicting files, sorted.
        files: Vec<String>,
    },
    /// Git refused to start the merge; nothing changed.
    Refused {
        /// Why, in git's words.
        reason: String,
    },
}

/// A detached worktree of the repository, used for one integration and then removed.
#[derive(Debug)]
pub struct Scratch {
    repo: Repo,
    path: PathBuf,
}

/// Refuses a revision argument git would take for an option.
fn check_rev(what: &'static str, rev: &str) -> Result<()> {
    if rev.is_empty() || rev.starts_with('-') || rev.contains('\0') {
        return Err(WorktreeError::Invalid {
            what,
            value: rev.to_string(),
            reason: "it is not a revision; give a branch or commit id".to_string(),
        });
    }
    Ok(())
}

impl Repo {
    /// The commit branch `branch` points at, or `None` when there is no such branch.
    pub async fn branch_head(&self, branch: &str) -> Result<Option<String>> {
        check_rev("branch", branch)?;
        self.git
            .resolve_commit(&self.root, &format!("refs/heads/{branch}"))
            .await
    }

    /// Creates branch `branch` at `start` unless it exists; returns its head either way.
    pub async fn ensure_branch(&self, branch: &str, start: &str) -> Result<String> {
        self.check_branch_name("branch", branch, branch).await?;
        check_rev("start point", start)?;
        if let Some(head) = self.branch_head(branch).await? {
            return Ok(head);
        }
        let commit = self
            .git
            .resolve_commit(&self.root, start)
            .await?
            .ok_or_else(|| WorktreeError::UnknownRevision {
                rev: start.to_string(),
                repo: self.root.clone(),
                hint: "the run's integration branch starts from the base branch: check that it exists and has a commit".to_string(),
            })?;
        self.git
            .run(
                &self.root,
                ["branch", "--no-track", branch, commit.as_str()],
                "check that the repository is writable",
            )
            .await?;
        Ok(commit)
    }

    /// A detached worktree at `dir` checked out at `commit`, for a merge that must not
    /// happen in any checkout of the user's. A leftover at `dir` (a run killed during an
    /// integration) is removed first.
    pub async fn scratch(&self, dir: &Path, commit: &str) -> Result<Scratch> {
        check_rev("commit", commit)?;
        // One worktree registration change of this repository at a time: the `prune` below
        // would otherwise forget a worktree another task is adding (the merge queue and a
        // dependent's handover make scratch worktrees at the same time).
        let lock = merge_lock(&self.common_dir);
        let _serialized = lock.lock().await;
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        if dir.exists() {
            let _ = self.remove_worktree_dir(&dir).await;
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| WorktreeError::DirectoryInUse {
                    dir: dir.clone(),
                    branch: "(scratch)".to_string(),
                    detail: format!("a leftover scratch worktree cannot be removed: {e}"),
                })?;
            }
        }
        self.prune().await?;
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| WorktreeError::DirectoryInUse {
                dir: dir.clone(),
                branch: "(scratch)".to_string(),
                detail: format!("its parent cannot be created: {e}"),
            })?;
        }
        self.git_worktree_add(
            &[OsStr::new("--detach"), dir.as_os_str(), OsStr::new(commit)],
            "check that the run directory is writable",
        )
        .await?;
        Ok(Scratch {
            repo: self.clone(),
            path: std::fs::canonicalize(&dir).unwrap_or(dir),
        })
    }

    /// `git worktree remove --force DIR`: what it did, failure included (a caller that
    /// only tidies up ignores it).
    async fn remove_worktree_dir(&self, dir: &Path) -> Result<GitOutput> {
        self.git
            .output(
                &self.root,
                [
                    OsStr::new("worktree"),
                    OsStr::new("remove"),
                    OsStr::new("--force"),
                    dir.as_os_str(),
                ],
            )
            .await
    }

    /// Removes every scratch worktree left under `root` (a run killed during an
    /// integration) and `root` itself, and forgets their registrations.
    pub async fn clear_scratch(&self, root: &Path) -> Result<()> {
        let lock = merge_lock(&self.common_dir);
        let _serialized = lock.lock().await;
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                let path = entry.path();
                let _ = self.remove_worktree_dir(&path).await;
            }
        }
        if root.exists() {
            std::fs::remove_dir_all(root).map_err(|e| WorktreeError::DirectoryInUse {
                dir: root.to_path_buf(),
                branch: "(scratch)".to_string(),
                detail: format!("leftover scratch worktrees cannot be removed: {e}"),
            })?;
        }
        self.prune().await
    }

    /// Moves branch `target` from `old` to `new` (a descendant of `old`).
    ///
    /// Where `target` is checked out, that checkout is fast-forwarded (`merge --ff-only`),
    /// and only when its tracked files are clean and no merge is in progress there
    /// ([`Advance::Blocked`] otherwise: nothing is touched). Checked out nowhere, the ref is
    /// moved with a compare-and-swap (`update-ref new old`). Either way, when `target` no
    /// longer points at `old`, nothing changes and [`Advance::Moved`] says to merge again.
    /// Serialized with the other merges into this repository.
    pub async fn advance_branch(&self, target: &str, new: &str, old: &str) -> Result<Advance> {
        self.check_branch_name("integration target", target, target)
            .await?;
        check_rev("commit", new)?;
        check_rev("commit", old)?;
        let lock = merge_lock(&self.common_dir);
        let _serialized = lock.lock().await;
        if self.branch_head(target).await?.as_deref() != Some(old) {
            return Ok(Advance::Moved);
        }
        let full = format!("refs/heads/{target}");
        let Some(at) = self.checked_out_at(target).await? else {
            let out = self
                .git
                .output(&self.root, ["update-ref", full.as_str(), new, old])
                .await?;
            if out.success() {
                return Ok(Advance::Advanced);
            }
            if self.branch_head(target).await?.as_deref() != Some(old) {
                return Ok(Advance::Moved);
            }
            return Err(out.into_error("check that the repository is writable"));
        };
        if !at.exists() {
            return Ok(Advance::Blocked {
                reason: format!(
                    "`{target}` is checked out in {}, which no longer exists; run `git worktree prune` in {}",
                    at.display(),
                    self.root.display()
                ),
            });
        }
        let git = &self.git;
        if git.merge_in_progress(&at).await? {
            return Ok(Advance::Blocked {
                reason: format!(
                    "a merge is in progress in {}, where `{target}` is checked out; finish it (`git commit`) or abort it (`git merge --abort`)",
                    at.display()
                ),
            });
        }
        let status = git
            .output(
                &at,
                ["status", "--porcelain=v1", "-z", "--untracked-files=no"],
            )
            .await?;
        if !status.success() {
            return Err(status.into_error("check that the checkout is readable"));
        }
        let dirty = porcelain_paths(&status.stdout);
        if !dirty.is_empty() {
            return Ok(Advance::Blocked {
                reason: format!(
                    "{}, where `{target}` is checked out, has uncommitted changes ({}); it was not touched",
                    at.display(),
                    list_some(&dirty)
                ),
            });
        }
        let ff = git
            .output(&at, ["merge", "--ff-only", "--quiet", "--no-edit", new])
            .await?;
        if ff.success() {
            return Ok(Advance::Advanced);
        }
        if git.merge_in_progress(&at).await? {
            // `--ff-only` never starts a merge; should one be there now, it is not ours.
            return Err(ff.into_error(format!(
                "check `git status` in {} before going on",
                at.display()
            )));
        }
        Ok(Advance::Blocked {
            reason: format!(
                "git refused to fast-forward `{target}` in {}: {}; nothing changed",
                at.display(),
                td_base::text::head_tail(ff.stderr.trim(), MAX_STDERR)
            ),
        })
    }

    /// The files changed between `since` and `commit` that still hold a conflict marker
    /// line (`<<<<<<< ` or `>>>>>>> ` at a line start) in `commit`, sorted: work that would
    /// land a half-resolved conflict.
    pub async fn conflict_markers(&self, since: &str, commit: &str) -> Result<Vec<String>> {
        check_rev("commit", since)?;
        check_rev("commit", commit)?;
        let changed = self
            .git
            .output(
                &self.root,
                ["diff", "--name-only", "--no-renames", "-z", since, commit],
            )
            .await?;
        if !changed.success() {
            return Err(changed.into_error("check that both commits exist"));
        }
        let files = nul_separated(&changed.stdout);
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let mut args: Vec<String> = [
            "grep",
            "-l",
            "-z",
            "-I",
            "-E",
            "-e",
            "^(<<<<<<<|>>>>>>>)( |$)",
            commit,
            "--",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(files.into_iter().map(|f| format!(":(literal){f}")));
        let out = self.git.output(&self.root, &args).await?;
        match out.status.code() {
            Some(0) => {}
            Some(1) => return Ok(Vec::new()),
            _ => return Err(out.into_error("check that the commit exists")),
        }
        let prefix = format!("{commit}:");
        let mut found: Vec<String> = nul_separated(&out.stdout)
            .into_iter()
            .map(|p| p.strip_prefix(&prefix).map(str::to_string).unwrap_or(p))
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }
}

impl Scratch {
    /// The scratch worktree's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Merges `rev` into the scratch worktree's HEAD with a merge commit (`--no-ff`) carrying
    /// `message`. A conflict is described (both sides' changes per file) and aborted.
    pub async fn merge(&self, rev: &str, message: &str) -> Result<ScratchMerge> {
        check_rev("branch to merge", rev)?;
        let git = &self.repo.git;
        let args = as_taskdaemon(&["merge", "--no-ff", "--no-edit", "-m", message, rev]);
        let merge = git.output(&self.path, &args).await?;
        if merge.success() {
            let commit = git
                .run(
                    &self.path,
                    ["rev-parse", "--verify", "HEAD"],
                    "the merge succeeded; check the scratch worktree",
                )
                .await?;
            return Ok(ScratchMerge::Merged { commit });
        }
        if !git.merge_in_progress(&self.path).await? {
            return Ok(ScratchMerge::Refused {
                reason: td_base::text::head_tail(merge.stderr.trim(), MAX_STDERR),
            });
        }
        let unmerged = git
            .output(&self.path, ["diff", "--name-only", "--diff-filter=U", "-z"])
            .await?;
        let mut names = nul_separated(&unmerged.stdout);
        names.sort();
        names.dedup();
        let base = git
            .output(&self.path, ["merge-base", "HEAD", "MERGE_HEAD"])
            .await?;
        let base = base.success().then(|| base.text());
        let mut files = Vec::new();
        for (i, path) in names.iter().enumerate() {
            let (target_side, loop_side) = match (&base, i < MAX_DIFFED_FILES) {
                (Some(base), true) => (
                    self.side(base, "HEAD", path).await,
                    self.side(base, "MERGE_HEAD", path).await,
                ),
                _ => (String::new(), String::new()),
            };
            files.push(ConflictFile {
                path: path.clone(),
                target_side,
                loop_side,
            });
        }
        let abort = git.output(&self.path, ["merge", "--abort"]).await?;
        if !abort.success() {
            // The scratch worktree is removed anyway; nothing of the user's is mid-merge.
            tracing::warn!(
                "could not abort the scratch merge in {}",
                self.path.display()
            );
        }
        if files.is_empty() {
            return Ok(ScratchMerge::Refused {
                reason: format!(
                    "the merge stopped before committing: {}",
                    td_base::text::head_tail(merge.stderr.trim(), MAX_STDERR)
                ),
            });
        }
        Ok(ScratchMerge::Conflict { files })
    }

    /// `git diff base side -- path`, capped (empty when git cannot say).
    async fn side(&self, base: &str, side: &str, path: &str) -> String {
        let spec = format!(":(literal){path}");
        match self
            .repo
            .git
            .output(
                &self.path,
                [
                    "diff",
                    "--no-color",
                    "--no-ext-diff",
                    base,
                    side,
                    "--",
                    &spec,
                ],
            )
            .await
        {
            Ok(out) if out.success() => {
                td_base::text::head_tail(&String::from_utf8_lossy(&out.stdout), MAX_SIDE_DIFF)
            }
            _ => String::new(),
        }
    }

    /// Removes the scratch worktree (its directory and its registration).
    pub async fn remove(self) -> Result<()> {
        let out = self.repo.remove_worktree_dir(&self.path).await?;
        if !out.success() {
            let _ = std::fs::remove_dir_all(&self.path);
            self.repo.prune().await?;
        }
        Ok(())
    }
}

impl Worktree {
    /// Merges `rev` (the integration target's head) into the loop's own worktree, for the
    /// loop to finish: a clean merge is committed as a merge commit carrying `message`; a
    /// conflict is left in place (markers in the files, the worktree mid-merge) for the
    /// loop's next iteration, whose commit concludes it ([`Worktree::commit_all`]).
    pub async fn merge_from(&self, rev: &str, message: &str) -> Result<HandBackMerge> {
        check_rev("revision to merge", rev)?;
        let git = &self.git;
        if git.merge_in_progress(&self.path).await? {
            // The same hand back, made before the process died (a resumed run queues the
            // loop again): what it left is what it would make.
            let wanted = git.resolve_commit(&self.path, rev).await?;
            let pending = git.resolve_commit(&self.path, "MERGE_HEAD").await?;
            if wanted.is_some() && wanted == pending {
                return Ok(HandBackMerge::Conflicted {
                    files: self.unmerged().await?,
                });
            }
            return Ok(HandBackMerge::Refused {
                reason: format!(
                    "a merge is already in progress in {}; it must be concluded first",
                    self.path.display()
                ),
            });
        }
        let args = as_taskdaemon(&["merge", "--no-ff", "--no-commit", rev]);
        let merge = git.output(&self.path, &args).await?;
        let in_progress = git.merge_in_progress(&self.path).await?;
        if merge.success() {
            if !in_progress {
                return Ok(HandBackMerge::UpToDate);
            }
            let args = as_taskdaemon(&["commit", "--quiet", "--no-verify", "-m", message]);
            git.run(
                &self.path,
                &args,
                "check that no other git command runs in the loop's worktree",
            )
            .await?;
            return Ok(HandBackMerge::Committed {
                commit: self.head_commit().await?,
            });
        }
        if !in_progress {
            return Ok(HandBackMerge::Refused {
                reason: td_base::text::head_tail(merge.stderr.trim(), MAX_STDERR),
            });
        }
        Ok(HandBackMerge::Conflicted {
            files: self.unmerged().await?,
        })
    }

    /// The paths with unmerged entries in the index, sorted.
    async fn unmerged(&self) -> Result<Vec<String>> {
        let out = self
            .git
            .output(&self.path, ["diff", "--name-only", "--diff-filter=U", "-z"])
            .await?;
        let mut files = nul_separated(&out.stdout);
        files.sort();
        files.dedup();
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::git_stdout;
    use std::process::Command;

    /// A repository on `main` with one commit, its git config kept out of the machine's.
    struct Fx {
        tmp: tempfile::TempDir,
        repo: PathBuf,
    }

    impl Fx {
        fn new() -> Fx {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(tmp.path().join("home")).unwrap();
            let repo = tmp.path().join("user");
            std::fs::create_dir(&repo).unwrap();
            let fx = Fx { tmp, repo };
            fx.git(&fx.repo, &["init", "--quiet", "-b", "main"]);
            fx.git(&fx.repo, &["config", "user.name", "U"]);
            fx.git(&fx.repo, &["config", "user.email", "u@example.com"]);
            fx.commit_file(&fx.repo, "a.txt", "one\n", "initial");
            fx
        }

        fn env(&self) -> Vec<(String, PathBuf)> {
            vec![
                ("HOME".into(), self.tmp.path().join("home")),
                ("GIT_CONFIG_NOSYSTEM".into(), PathBuf::from("1")),
            ]
        }

        fn git(&self, dir: &Path, args: &[&str]) -> String {
            git_stdout(
                Command::new("git")
                    .args(args)
                    .current_dir(dir)
                    .envs(self.env()),
                false,
            )
        }

        fn commit_file(&self, dir: &Path, file: &str, text: &str, message: &str) -> String {
            std::fs::write(dir.join(file), text).unwrap();
            self.git(dir, &["add", "-A"]);
            self.git(dir, &["commit", "--quiet", "-m", message]);
            self.git(dir, &["rev-parse", "HEAD"])
        }

        async fn open(&self) -> Repo {
            Repo::open_with_env(&self.repo, self.env()).await.unwrap()
        }

        /// A loop worktree `name` from main with `file` set to `text`, committed.
        async fn loop_commit(&self, repo: &Repo, name: &str, file: &str, text: &str) -> Worktree {
            let dir = self.tmp.path().join("wt").join(name);
            let wt = repo
                .add_worktree("r1", name, Some("main"), &dir)
                .await
                .unwrap();
            std::fs::write(wt.path().join(file), text).unwrap();
            wt.commit_all(&format!("{name} work"))
                .await
                .unwrap()
                .unwrap();
            wt
        }

        fn scratch_dir(&self) -> PathBuf {
            self.tmp.path().join("run/scratch/x")
        }
    }

    /// `main`'s head and the merge of `wt`'s branch onto it, made in a scratch worktree
    /// (removed again).
    async fn merged_in_scratch(fx: &Fx, repo: &Repo, wt: &Worktree) -> (String, String) {
        let old = repo.branch_head("main").await.unwrap().unwrap();
        let scratch = repo.scratch(&fx.scratch_dir(), &old).await.unwrap();
        let ScratchMerge::Merged { commit } = scratch.merge(wt.branch(), "m").await.unwrap() else {
            panic!("expected a merge");
        };
        scratch.remove().await.unwrap();
        (old, commit)
    }

    #[tokio::test]
    async fn a_clean_scratch_merge_leaves_every_checkout_alone() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let wt = fx.loop_commit(&repo, "a", "b.txt", "bee\n").await;
        let main = repo.branch_head("main").await.unwrap().unwrap();
        let scratch = repo.scratch(&fx.scratch_dir(), &main).await.unwrap();
        let ScratchMerge::Merged { commit } = scratch.merge(wt.branch(), "merge a").await.unwrap()
        else {
            panic!("expected a merge");
        };
        assert!(scratch.path().join("b.txt").is_file());
        // main did not move, and the user's checkout has no b.txt.
        assert_eq!(repo.branch_head("main").await.unwrap().unwrap(), main);
        assert!(!fx.repo.join("b.txt").exists());
        let parents = fx.git(&fx.repo, &["rev-list", "--parents", "-n1", &commit]);
        assert_eq!(parents.split(' ').count(), 3, "a merge commit: {parents}");
        let path = scratch.path().to_path_buf();
        scratch.remove().await.unwrap();
        assert!(!path.exists());
        assert!(!fx.git(&fx.repo, &["worktree", "list"]).contains("scratch"));
        // Leftovers of a killed run are cleared with their registrations.
        let left = repo.scratch(&fx.scratch_dir(), &main).await.unwrap();
        let root = left.path().parent().unwrap().to_path_buf();
        drop(left); // dropped without `remove`, as a killed run leaves it
        assert!(fx.git(&fx.repo, &["worktree", "list"]).contains("scratch"));
        repo.clear_scratch(&root).await.unwrap();
        assert!(!root.exists());
        assert!(!fx.git(&fx.repo, &["worktree", "list"]).contains("scratch"));
    }

    #[tokio::test]
    async fn a_scratch_conflict_names_both_sides_and_is_aborted() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let wt = fx.loop_commit(&repo, "a", "a.txt", "from the loop\n").await;
        let main = fx.commit_file(&fx.repo, "a.txt", "from main\n", "user edit");
        let scratch = repo.scratch(&fx.scratch_dir(), &main).await.unwrap();
        let ScratchMerge::Conflict { files } = scratch.merge(wt.branch(), "merge a").await.unwrap()
        else {
            panic!("expected a conflict");
        };
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "a.txt");
        assert!(files[0].target_side.contains("+from main"), "{files:?}");
        assert!(files[0].loop_side.contains("+from the loop"), "{files:?}");
        // Nothing is mid-merge, anywhere.
        let out = Command::new("git")
            .args(["rev-parse", "--verify", "--quiet", "MERGE_HEAD"])
            .current_dir(scratch.path())
            .output()
            .unwrap();
        assert!(!out.status.success());
        scratch.remove().await.unwrap();
    }

    #[tokio::test]
    async fn advancing_fast_forwards_a_clean_checkout() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let wt = fx.loop_commit(&repo, "a", "b.txt", "bee\n").await;
        let (old, commit) = merged_in_scratch(&fx, &repo, &wt).await;
        let adv = repo.advance_branch("main", &commit, &old).await.unwrap();
        assert_eq!(adv, Advance::Advanced);
        assert_eq!(fx.git(&fx.repo, &["rev-parse", "HEAD"]), commit);
        assert_eq!(
            std::fs::read_to_string(fx.repo.join("b.txt")).unwrap(),
            "bee\n"
        );
        assert_eq!(fx.git(&fx.repo, &["status", "--porcelain"]), "");
    }

    #[tokio::test]
    async fn a_dirty_checkout_is_never_touched() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let wt = fx.loop_commit(&repo, "a", "b.txt", "bee\n").await;
        let (old, commit) = merged_in_scratch(&fx, &repo, &wt).await;
        std::fs::write(fx.repo.join("a.txt"), "the user's edit\n").unwrap();
        let adv = repo.advance_branch("main", &commit, &old).await.unwrap();
        let Advance::Blocked { reason } = adv else {
            panic!("expected blocked, got {adv:?}");
        };
        assert!(reason.contains("uncommitted changes (a.txt)"), "{reason}");
        assert_eq!(fx.git(&fx.repo, &["rev-parse", "HEAD"]), old);
        assert_eq!(
            std::fs::read_to_string(fx.repo.join("a.txt")).unwrap(),
            "the user's edit\n"
        );
        assert!(!fx.repo.join("b.txt").exists());
    }

    #[tokio::test]
    async fn update_ref_is_a_compare_and_swap() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let main = repo.branch_head("main").await.unwrap().unwrap();
        let start = repo
            .ensure_branch("taskdaemon/r1/integration", "main")
            .await
            .unwrap();
        assert_eq!(start, main);
        // Idempotent: the existing branch is kept.
        assert_eq!(
            repo.ensure_branch("taskdaemon/r1/integration", "main")
                .await
                .unwrap(),
            main
        );
        let wt = fx.loop_commit(&repo, "a", "b.txt", "bee\n").await;
        let scratch = repo.scratch(&fx.scratch_dir(), &start).await.unwrap();
        let ScratchMerge::Merged { commit } = scratch.merge(wt.branch(), "m").await.unwrap() else {
            panic!("expected a merge");
        };
        scratch.remove().await.unwrap();
        // Someone moved the target meanwhile: nothing changes, and the caller redoes.
        let other = fx.commit_file(&fx.repo, "c.txt", "see\n", "elsewhere");
        fx.git(
            &fx.repo,
            &["update-ref", "refs/heads/taskdaemon/r1/integration", &other],
        );
        let adv = repo
            .advance_branch("taskdaemon/r1/integration", &commit, &start)
            .await
            .unwrap();
        assert_eq!(adv, Advance::Moved);
        assert_eq!(
            repo.branch_head("taskdaemon/r1/integration")
                .await
                .unwrap()
                .unwrap(),
            other
        );
        // Redone from the new head, it lands.
        let scratch = repo.scratch(&fx.scratch_dir(), &other).await.unwrap();
        let ScratchMerge::Merged { commit } = scratch.merge(wt.branch(), "m").await.unwrap() else {
            panic!("expected a merge");
        };
        scratch.remove().await.unwrap();
        let adv = repo
            .advance_branch("taskdaemon/r1/integration", &commit, &other)
            .await
            .unwrap();
        assert_eq!(adv, Advance::Advanced);
        assert_eq!(
            repo.branch_head("taskdaemon/r1/integration")
                .await
                .unwrap()
                .unwrap(),
            commit
        );
    }

    #[tokio::test]
    async fn a_hand_back_leaves_markers_and_the_loops_commit_concludes_it() {
        let fx = Fx::new();
        let repo = fx.open().await;
        let wt = fx.loop_commit(&repo, "a", "a.txt", "from the loop\n").await;
        let wt2 = fx.loop_commit(&repo, "b", "a.txt", "from b\n").await;
        let wt3 = fx.loop_commit(&repo, "c", "c.txt", "c\n").await;
        let main = fx.commit_file(&fx.repo, "a.txt", "from main\n", "user edit");
        let HandBackMerge::Conflicted { files } = wt.merge_from(&main, "m").await.unwrap() else {
            panic!("expected a conflict");
        };
        assert_eq!(files, vec!["a.txt".to_string()]);
        // The same hand back again (a resumed run) finds it made; another one is refused.
        assert_eq!(
            wt.merge_from(&main, "m").await.unwrap(),
            HandBackMerge::Conflicted {
                files: vec!["a.txt".to_string()]
            }
        );
        let initial = fx.git(&fx.repo, &["rev-parse", "main~1"]);
        assert!(matches!(
            wt.merge_from(&initial, "m").await.unwrap(),
            HandBackMerge::Refused { .. }
        ));
        let text = std::fs::read_to_string(wt.path().join("a.txt")).unwrap();
        assert!(text.contains("<<<<<<< "), "{text}");
        // Committed with markers, the work is caught before it lands.
        let marked = wt.commit_all("unresolved").await.unwrap().unwrap();
        assert_eq!(
            repo.conflict_markers(&main, &marked).await.unwrap(),
            vec!["a.txt".to_string()]
        );
        // Resolved to the loop's own version (the tree HEAD had): still a merge commit.
        let HandBackMerge::Conflicted { .. } = wt2.merge_from(&main, "m").await.unwrap() else {
            panic!("expected a conflict");
        };
        std::fs::write(wt2.path().join("a.txt"), "from b\n").unwrap();
        let resolved = wt2.commit_all("resolved").await.unwrap().unwrap();
        let parents = fx.git(&fx.repo, &["rev-list", "--parents", "-n1", &resolved]);
        assert_eq!(parents.split(' ').count(), 3, "{parents}");
        assert!(
            repo.conflict_markers(&main, &resolved)
                .await
                .unwrap()
                .is_empty()
        );
        // A clean hand back is committed at once.
        let HandBackMerge::Committed { .. } = wt3.merge_from(&main, "m").await.unwrap() else {
            panic!("expected a commit");
        };
        assert_eq!(
            wt3.merge_from(&main, "m").await.unwrap(),
            HandBackMerge::UpToDate
        );
    }
}
