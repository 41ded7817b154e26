//! Predicting merge conflicts between loops that are still working, without touching them:
//! a [`snapshot`] of a worktree's current state as a dangling commit, and [`predict`], which
//! merges two such commits in memory with `git merge-tree --write-tree` (git 2.38 or newer).
//!
//! Nothing here writes to a worktree, its index, its branch or any ref: the snapshot is built
//! in a temporary index (`GIT_INDEX_FILE` in a temporary directory) started from a copy of the
//! worktree's own index, so git only hashes files that changed since the loop's index last saw
//! them. What is written is objects (blobs, trees, the snapshot commit, merge-tree's result
//! tree) in the repository's object store, where nothing refers to them; `git gc` drops them
//! after its prune delay. Every command is the daemon's own git ([`crate::daemon_git`]: no
//! hooks, no inherited repository variables).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use crate::worktree::{GitOutput, RUN_RECORD_DIR, WorktreeError, as_taskdaemon};

/// The oldest git whose `merge-tree` has `--write-tree` (a real merge, in memory).
pub const MIN_GIT: (u32, u32) = (2, 38);

/// Longest git stderr quoted in an error.
const MAX_STDERR: usize = 2000;

/// The message of every snapshot commit (they are never on a branch).
const SNAPSHOT_MESSAGE: &str = "taskdaemon: conflict-warning snapshot (not on any branch)";

/// Where a worktree's state was taken from, or why it was not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snapshot {
    /// The worktree's files as a commit whose parent is its HEAD (HEAD itself when nothing
    /// changed).
    Taken(Taken),
    /// The worktree is in a state a snapshot would misread (a merge, rebase, cherry-pick or
    /// revert in progress, unmerged paths, no commit yet); nothing was done.
    Skipped {
        /// Why, in words.
        reason: String,
    },
}

/// A worktree's state as a commit, and what it changed from its HEAD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The snapshot commit (the HEAD itself when nothing changed).
    pub commit: String,
    /// The worktree's HEAD when it was taken.
    pub head: String,
    /// The paths that differ from HEAD (files, links, submodules).
    changed: BTreeSet<String>,
    /// Every directory above a changed path.
    dirs: BTreeSet<String>,
    /// Whether a path of HEAD is gone (a deletion, or one side of a rename).
    deletes: bool,
}

impl Taken {
    /// The snapshot of a worktree that changed nothing since its HEAD `head`.
    pub fn unchanged(head: &str) -> Self {
        Taken {
            commit: head.to_string(),
            head: head.to_string(),
            changed: BTreeSet::new(),
            dirs: BTreeSet::new(),
            deletes: false,
        }
    }

    /// Whether merging this snapshot with `other` can conflict at all, decided without git.
    ///
    /// Two snapshots of the same HEAD merge with that HEAD as their base, so a conflict needs
    /// a path both changed (content, add/add, modify/delete), or a file on one side where the
    /// other has a directory. Renames (of files or directories) can carry a change to a path
    /// the other side never touched, and every rename deletes a path: with a deletion on
    /// either side, or different HEADs, only `merge-tree` can tell ([`predict`]).
    pub fn may_conflict_with(&self, other: &Taken) -> bool {
        self.head != other.head
            || self.deletes
            || other.deletes
            || !self.changed.is_disjoint(&other.changed)
            || !self.changed.is_disjoint(&other.dirs)
            || !other.changed.is_disjoint(&self.dirs)
    }
}

/// What merging two snapshots would give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prediction {
    /// They merge without conflict.
    Clean,
    /// They conflict in these paths (sorted, each shown as [`td_base::shown_path::show`]
    /// writes a path for a model).
    Conflict {
        /// The conflicting paths.
        files: Vec<String>,
    },
}

/// The version of the `git` on PATH, as `(major, minor)`.
pub async fn git_version() -> Result<(u32, u32), WorktreeError> {
    let dir = std::env::temp_dir();
    let out = git(&dir, ["version"], &[]).await?;
    if !out.status.success() {
        return Err(out.into_error("check that `git --version` works"));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    parse_version(&text).ok_or_else(|| WorktreeError::GitUnavailable {
        detail: format!(
            "`git version` printed {:?}, which names no version",
            text.trim()
        ),
    })
}

/// `(major, minor)` of `git version` output such as `git version 2.39.2 (Apple Git-143)`.
pub(crate) fn parse_version(text: &str) -> Option<(u32, u32)> {
    let version = text.trim().strip_prefix("git version ")?;
    let mut parts = version.split(['.', ' ']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether a git of `version` can [`predict`].
pub fn supports_prediction(version: (u32, u32)) -> bool {
    version >= MIN_GIT
}

/// The state of the worktree at `dir` as a commit, without changing the worktree, its index
/// or its branch.
///
/// The files are taken as [`crate::worktree::Worktree::commit_all`] would commit them:
/// `git add -A` (so `.gitignore` and `.git/info/exclude` apply) with the run-record directory
/// `.taskdaemon/` left as HEAD has it. A worktree in the middle of a merge, rebase,
/// cherry-pick or revert, or with unmerged paths, is [`Snapshot::Skipped`]: its files hold
/// conflict markers that are not the loop's work.
pub async fn snapshot(dir: &Path) -> Result<Snapshot, WorktreeError> {
    // One process for HEAD, its tree and the paths that say something is in progress.
    const IN_PROGRESS: [&str; 5] = [
        "MERGE_HEAD",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "rebase-merge",
        "rebase-apply",
    ];
    let mut args: Vec<&str> = vec!["rev-parse", "--git-path", "index"];
    for p in IN_PROGRESS {
        args.extend(["--git-path", p]);
    }
    args.extend(["HEAD", "HEAD^{tree}"]);
    let out = git(dir, &args, &[]).await?;
    if !out.status.success() {
        return Ok(Snapshot::Skipped {
            reason: "its HEAD names no commit yet (or it is not a git worktree)".to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let [index, rest @ ..] = lines.as_slice() else {
        return Err(unexpected(dir, "rev-parse", &text));
    };
    let [markers @ .., head, head_tree] = rest else {
        return Err(unexpected(dir, "rev-parse", &text));
    };
    if markers.len() != IN_PROGRESS.len() {
        return Err(unexpected(dir, "rev-parse", &text));
    }
    // `--git-path` answers relative to the directory git ran in.
    if let Some((what, _)) = IN_PROGRESS
        .iter()
        .zip(markers)
        .find(|(_, path)| dir.join(path).exists())
    {
        return Ok(Snapshot::Skipped {
            reason: format!("a {} is in progress in it", operation(what)),
        });
    }
    let unmerged = git(dir, ["ls-files", "--unmerged", "-z"], &[]).await?;
    if !unmerged.status.success() {
        return Err(unmerged.into_error("check that the worktree is readable"));
    }
    if !unmerged.stdout.is_empty() {
        return Ok(Snapshot::Skipped {
            reason: "it has unmerged paths (a conflict is being resolved)".to_string(),
        });
    }

    let tmp = tempfile::Builder::new()
        .prefix("taskdaemon-snapshot-")
        .tempdir()
        .map_err(|e| WorktreeError::Git {
            command: "create a temporary directory".to_string(),
            dir: std::env::temp_dir(),
            status: "failed".to_string(),
            stderr: e.to_string(),
            hint: "check that the system temp directory (TMPDIR) is writable".to_string(),
        })?;
    let temp_index = tmp.path().join("index");
    // A copy of the loop's index carries the stat data of every file it knows, so `add -A`
    // hashes only what changed. Git replaces an index by renaming a new file over it, so
    // the copy is one whole version. No index yet (nothing staged ever): start empty.
    match std::fs::copy(dir.join(index), &temp_index) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(WorktreeError::Git {
                command: "copy the worktree's index".to_string(),
                dir: dir.to_path_buf(),
                status: "failed".to_string(),
                stderr: e.to_string(),
                hint: "check that the worktree's git directory is readable".to_string(),
            });
        }
    }
    let env = [(
        OsString::from("GIT_INDEX_FILE"),
        temp_index.into_os_string(),
    )];
    let exclude = format!(":(exclude){RUN_RECORD_DIR}");
    let hint = "the loop's worktree is unchanged; the next change is compared again";
    run(dir, ["add", "-A", "--", ".", exclude.as_str()], &env, hint).await?;
    // As `commit_all` does: no run records (a loop's own `git add -f` may have staged them)
    // and no gitlink a loop added (its id is another repository's).
    crate::worktree::take_back_staged(dir, &env, hint).await?;
    let tree = run(dir, ["write-tree"], &env, hint).await?;
    if tree == *head_tree {
        return Ok(Snapshot::Taken(Taken::unchanged(head)));
    }
    let commit = run(
        dir,
        as_taskdaemon(&[
            "commit-tree",
            tree.as_str(),
            "-p",
            head,
            "-m",
            SNAPSHOT_MESSAGE,
        ]),
        &[],
        hint,
    )
    .await?;
    let diff = git(
        dir,
        [
            "diff-tree",
            "-r",
            "--no-renames",
            "--name-status",
            "-z",
            head,
            commit.as_str(),
        ],
        &[],
    )
    .await?;
    if !diff.status.success() {
        return Err(diff.into_error(hint));
    }
    let (changed, deletes) = name_status(&diff.stdout);
    let dirs = changed.iter().flat_map(|p| parents(p)).collect();
    Ok(Snapshot::Taken(Taken {
        commit,
        head: (*head).to_string(),
        changed,
        dirs,
        deletes,
    }))
}

/// The paths of `diff-tree --name-status -z` output (a status, then its path, each
/// NUL-terminated), and whether any was deleted.
fn name_status(stdout: &[u8]) -> (BTreeSet<String>, bool) {
    let mut fields = stdout.split(|b| *b == 0);
    let mut paths = BTreeSet::new();
    let mut deletes = false;
    while let (Some(status), Some(path)) = (fields.next(), fields.next()) {
        if path.is_empty() {
            break;
        }
        deletes |= status.first() == Some(&b'D');
        paths.insert(String::from_utf8_lossy(path).into_owned());
    }
    (paths, deletes)
}

/// The directories above `path` (`a/b/c` → `a`, `a/b`).
fn parents(path: &str) -> impl Iterator<Item = String> + '_ {
    path.match_indices('/').map(|(i, _)| path[..i].to_string())
}

/// What would merging commits `a` and `b` of the repository at `repo` conflict in? Nothing
/// is checked out and no ref moves (`git merge-tree --write-tree`, git 2.38 or newer).
pub async fn predict(repo: &Path, a: &str, b: &str) -> Result<Prediction, WorktreeError> {
    if a == b {
        return Ok(Prediction::Clean);
    }
    let out = git(
        repo,
        [
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--no-messages",
            "-z",
            a,
            b,
        ],
        &[],
    )
    .await?;
    match out.status.code() {
        Some(0) => Ok(Prediction::Clean),
        Some(1) => Ok(Prediction::Conflict {
            files: conflicted_files(&out.stdout),
        }),
        _ => Err(out.into_error(format!(
            "merge-tree needs git {}.{} or newer; check `git --version`",
            MIN_GIT.0, MIN_GIT.1
        ))),
    }
}

/// The paths of `merge-tree --name-only --no-messages -z` output: the result tree's id,
/// then each conflicted path, every field NUL-terminated.
fn conflicted_files(stdout: &[u8]) -> Vec<String> {
    let mut files: Vec<String> = stdout
        .split(|b| *b == 0)
        .skip(1)
        .filter(|p| !p.is_empty())
        .map(|p| td_base::shown_path::show(OsStr::from_bytes(p)).into_owned())
        .collect();
    files.sort();
    files.dedup();
    files
}

/// The operation a marker path of the git directory stands for.
fn operation(marker: &str) -> &'static str {
    match marker {
        "MERGE_HEAD" => "merge",
        "CHERRY_PICK_HEAD" => "cherry-pick",
        "REVERT_HEAD" => "revert",
        _ => "rebase",
    }
}

fn unexpected(dir: &Path, command: &str, out: &str) -> WorktreeError {
    WorktreeError::Git {
        command: format!("git {command}"),
        dir: dir.to_path_buf(),
        status: "unexpected output".to_string(),
        stderr: td_base::text::head_tail(out.trim(), MAX_STDERR),
        hint: "check `git --version`".to_string(),
    }
}

/// The crate's one git launcher, with `env` added.
async fn git<I, S>(
    dir: &Path,
    args: I,
    env: &[(OsString, OsString)],
) -> Result<GitOutput, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    crate::worktree::git_output(dir, args, env).await
}

/// [`git`] that must succeed; its stdout without the final newline.
async fn run<I, S>(
    dir: &Path,
    args: I,
    env: &[(OsString, OsString)],
    hint: &str,
) -> Result<String, WorktreeError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = git(dir, args, env).await?;
    if !out.success() {
        return Err(out.into_error(hint));
    }
    Ok(out.text())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::git_stdout;
    use std::path::PathBuf;
    use std::process::Command;

    /// Runs the test's own git (a fixed identity, no system or user config) in `dir`;
    /// returns its stdout, and panics with its stderr when it fails unless `may_fail`.
    fn sh_git(dir: &Path, args: &[&str], may_fail: bool) -> String {
        git_stdout(
            Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null"),
            may_fail,
        )
    }

    /// A repository on `main` with `files` committed, and a linked worktree `wt` on branch
    /// `loop` made from it.
    fn repo_with_worktree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        for (name, text) in files {
            let path = repo.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        sh_git(&repo, &["init", "-q", "-b", "main"], false);
        sh_git(&repo, &["add", "-A"], false);
        sh_git(&repo, &["commit", "-q", "-m", "init"], false);
        let wt = tmp.path().join("wt");
        let wt_arg = wt.to_str().unwrap();
        sh_git(
            &repo,
            &["worktree", "add", "-q", "-b", "loop", wt_arg],
            false,
        );
        (tmp, repo, wt)
    }

    /// Everything a snapshot must leave as it was: HEAD, the branch, the index file's bytes,
    /// `git status`, and every file's content.
    #[derive(Debug, PartialEq)]
    struct State {
        head: String,
        branch: String,
        index: Vec<u8>,
        status: String,
        files: Vec<(PathBuf, Vec<u8>)>,
    }

    fn state(repo: &Path, wt: &Path) -> State {
        let index = sh_git(wt, &["rev-parse", "--git-path", "index"], false);
        let mut files = Vec::new();
        let mut stack = vec![wt.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.file_name() == Some(OsStr::new(".git")) {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        files.sort();
        State {
            head: sh_git(wt, &["rev-parse", "HEAD"], false),
            branch: sh_git(repo, &["rev-parse", "refs/heads/loop"], false),
            index: std::fs::read(wt.join(index)).unwrap(),
            status: sh_git(
                wt,
                &["--no-optional-locks", "status", "--porcelain", "--ignored"],
                false,
            ),
            files,
        }
    }

    fn taken(s: Snapshot) -> String {
        taken_whole(s).commit
    }

    fn taken_whole(s: Snapshot) -> Taken {
        match s {
            Snapshot::Taken(t) => t,
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    #[test]
    fn versions_parse_and_2_38_is_the_floor() {
        assert_eq!(parse_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(
            parse_version("git version 2.39.2 (Apple Git-143)"),
            Some((2, 39))
        );
        assert_eq!(parse_version("git version 2.45.windows.1"), Some((2, 45)));
        assert_eq!(parse_version("hg 6.1"), None);
        assert!(supports_prediction((2, 38)) && supports_prediction((3, 0)));
        assert!(!supports_prediction((2, 37)) && !supports_prediction((1, 99)));
    }

    #[tokio::test]
    async fn the_git_here_is_read() {
        let v = git_version().await.unwrap();
        assert!(v.0 >= 2, "{v:?}");
    }

    #[tokio::test]
    async fn a_snapshot_holds_the_work_and_leaves_index_branch_and_files_untouched() {
        let (_tmp, repo, wt) = repo_with_worktree(&[
            ("src/a.txt", "a\n"),
            ("gone.txt", "bye\n"),
            (".gitignore", "*.log\n"),
        ]);
        std::fs::write(wt.join("src/a.txt"), "a changed\n").unwrap();
        std::fs::write(wt.join("staged.txt"), "staged\n").unwrap();
        sh_git(&wt, &["add", "staged.txt"], false);
        std::fs::write(wt.join("staged.txt"), "staged, then changed\n").unwrap();
        std::fs::write(wt.join("new.txt"), "new\n").unwrap();
        std::fs::remove_file(wt.join("gone.txt")).unwrap();
        std::fs::write(wt.join("build.log"), "ignored\n").unwrap();
        std::fs::create_dir_all(wt.join(RUN_RECORD_DIR)).unwrap();
        std::fs::write(wt.join(RUN_RECORD_DIR).join("record"), "never\n").unwrap();
        let before = state(&repo, &wt);

        let commit = taken(snapshot(&wt).await.unwrap());

        assert_eq!(
            state(&repo, &wt),
            before,
            "the snapshot changed the worktree"
        );
        let parent = sh_git(&repo, &["rev-parse", &format!("{commit}^")], false);
        assert_eq!(parent, before.head, "its parent is HEAD");
        let listed = sh_git(&repo, &["ls-tree", "-r", "--name-only", &commit], false);
        let listed: Vec<&str> = listed.lines().collect();
        assert_eq!(
            listed,
            [".gitignore", "new.txt", "src/a.txt", "staged.txt"],
            "the files `commit_all` would commit"
        );
        let show = |p: &str| sh_git(&repo, &["show", &format!("{commit}:{p}")], false);
        assert_eq!(show("src/a.txt"), "a changed");
        assert_eq!(show("staged.txt"), "staged, then changed");
        // No ref names it.
        let refs = sh_git(&repo, &["for-each-ref", "--contains", &commit], false);
        assert_eq!(refs, "");
    }

    #[tokio::test]
    async fn a_snapshot_holds_no_gitlink_of_a_nested_git_file() {
        let (tmp, repo, wt) = repo_with_worktree(&[("a.txt", "a\n")]);
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        sh_git(&outside, &["init", "-q"], false);
        sh_git(
            &outside,
            &["commit", "-q", "--allow-empty", "-m", "x"],
            false,
        );
        // Named as a pathspec that would match the loop's other work, were it read as one.
        let gitdir = format!("gitdir: {}\n", outside.join(".git").display());
        for nested in ["sub", "b*", ":(top)"] {
            std::fs::create_dir_all(wt.join(nested)).unwrap();
            std::fs::write(wt.join(nested).join(".git"), &gitdir).unwrap();
        }
        std::fs::write(wt.join("b.txt"), "b\n").unwrap();
        let commit = taken(snapshot(&wt).await.unwrap());
        let tree = sh_git(&repo, &["ls-tree", "-r", &commit], false);
        assert!(!tree.contains("160000"), "{tree}");
        assert!(tree.contains("b.txt"), "{tree}");
    }

    #[tokio::test]
    async fn an_unchanged_worktree_is_its_head() {
        let (_tmp, _repo, wt) = repo_with_worktree(&[("a.txt", "a\n")]);
        let head = sh_git(&wt, &["rev-parse", "HEAD"], false);
        assert_eq!(taken(snapshot(&wt).await.unwrap()), head);
    }

    #[tokio::test]
    async fn a_worktree_mid_merge_or_with_unmerged_paths_is_skipped_untouched() {
        let (_tmp, repo, wt) = repo_with_worktree(&[("a.txt", "base\n")]);
        // The loop's own merge that conflicted and is left as it is.
        sh_git(&repo, &["checkout", "-q", "-b", "other"], false);
        std::fs::write(repo.join("a.txt"), "other\n").unwrap();
        sh_git(&repo, &["commit", "-q", "-am", "other"], false);
        std::fs::write(wt.join("a.txt"), "mine\n").unwrap();
        sh_git(&wt, &["commit", "-q", "-am", "mine"], false);
        sh_git(&wt, &["merge", "-q", "other"], true);
        let before = state(&repo, &wt);
        let skipped = snapshot(&wt).await.unwrap();
        assert!(
            matches!(&skipped, Snapshot::Skipped { reason } if reason.contains("merge is in progress")),
            "{skipped:?}"
        );
        assert_eq!(state(&repo, &wt), before);

        // Unmerged paths with no merge in progress: a stash that did not apply cleanly.
        sh_git(&wt, &["merge", "--abort"], false);
        std::fs::write(wt.join("a.txt"), "stashed\n").unwrap();
        sh_git(&wt, &["stash", "-q"], false);
        std::fs::write(wt.join("a.txt"), "committed\n").unwrap();
        sh_git(&wt, &["commit", "-q", "-am", "again"], false);
        sh_git(&wt, &["stash", "pop", "-q"], true);
        assert!(!sh_git(&wt, &["ls-files", "-u"], false).is_empty());
        let before = state(&repo, &wt);
        let skipped = snapshot(&wt).await.unwrap();
        assert!(
            matches!(&skipped, Snapshot::Skipped { reason } if reason.contains("unmerged")),
            "{skipped:?}"
        );
        assert_eq!(state(&repo, &wt), before);
    }

    /// Two worktrees off one base, changed by `a` and `b`; what merging their snapshots
    /// predicts.
    async fn predict_between(
        base: &[(&str, &str)],
        a: impl FnOnce(&Path),
        b: impl FnOnce(&Path),
    ) -> Prediction {
        let (tmp, repo, wt_a) = repo_with_worktree(base);
        let wt_b = tmp.path().join("wt-b");
        sh_git(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "loop-b",
                wt_b.to_str().unwrap(),
            ],
            false,
        );
        a(&wt_a);
        b(&wt_b);
        let sa = taken_whole(snapshot(&wt_a).await.unwrap());
        let sb = taken_whole(snapshot(&wt_b).await.unwrap());
        let ab = predict(&repo, &sa.commit, &sb.commit).await.unwrap();
        assert_eq!(
            predict(&repo, &sb.commit, &sa.commit).await.unwrap(),
            ab,
            "symmetric"
        );
        // The shortcut never hides a conflict.
        let maybe = sa.may_conflict_with(&sb);
        assert_eq!(maybe, sb.may_conflict_with(&sa), "symmetric");
        assert!(
            maybe || ab == Prediction::Clean,
            "{ab:?} was ruled out: {sa:?} {sb:?}"
        );
        // Nothing was checked out or moved: the user's checkout is as it was.
        assert_eq!(sh_git(&repo, &["status", "--porcelain"], false), "");
        ab
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[tokio::test]
    async fn the_same_line_changed_on_both_sides_conflicts() {
        let p = predict_between(
            &[("shared.txt", "one\ntwo\nthree\n"), ("x.txt", "x\n")],
            |a| write(a, "shared.txt", "one\nTWO from a\nthree\n"),
            |b| {
                write(b, "shared.txt", "one\nTWO from b\nthree\n");
                write(b, "x.txt", "x changed by b only\n");
            },
        )
        .await;
        assert_eq!(
            p,
            Prediction::Conflict {
                files: vec!["shared.txt".into()]
            }
        );
    }

    #[tokio::test]
    async fn different_files_or_lines_merge_clean() {
        let p = predict_between(
            &[("f.txt", "1\n2\n3\n4\n5\n6\n7\n8\n"), ("g.txt", "g\n")],
            |a| write(a, "f.txt", "1 a\n2\n3\n4\n5\n6\n7\n8\n"),
            |b| {
                write(b, "f.txt", "1\n2\n3\n4\n5\n6\n7\n8 b\n");
                write(b, "new-b.txt", "b\n");
            },
        )
        .await;
        assert_eq!(p, Prediction::Clean);
    }

    #[tokio::test]
    async fn a_file_added_on_both_sides_differently_conflicts() {
        let p = predict_between(
            &[("readme", "r\n")],
            |a| write(a, "added.rs", "fn a() {}\n"),
            |b| write(b, "added.rs", "fn b() {}\n"),
        )
        .await;
        assert_eq!(
            p,
            Prediction::Conflict {
                files: vec!["added.rs".into()]
            }
        );
    }

    #[tokio::test]
    async fn a_file_deleted_on_one_side_and_changed_on_the_other_conflicts() {
        let p = predict_between(
            &[("lib.rs", "fn old() {}\n"), ("keep", "k\n")],
            |a| std::fs::remove_file(a.join("lib.rs")).unwrap(),
            |b| write(b, "lib.rs", "fn old() { changed() }\n"),
        )
        .await;
        assert_eq!(
            p,
            Prediction::Conflict {
                files: vec!["lib.rs".into()]
            }
        );
    }

    #[tokio::test]
    async fn a_file_where_the_other_side_made_a_directory_conflicts() {
        let p = predict_between(
            &[("readme", "r\n")],
            |a| write(a, "x", "a file\n"),
            |b| {
                std::fs::create_dir(b.join("x")).unwrap();
                write(b, "x/y", "in a directory\n");
            },
        )
        .await;
        assert!(matches!(p, Prediction::Conflict { .. }), "{p:?}");
    }

    #[tokio::test]
    async fn a_file_added_to_a_directory_the_other_side_renamed_conflicts() {
        let p = predict_between(
            &[("d/one", "1\n"), ("d/two", "2\n")],
            |a| {
                std::fs::rename(a.join("d"), a.join("e")).unwrap();
            },
            |b| write(b, "d/three", "3\n"),
        )
        .await;
        // merge.directoryRenames defaults to `conflict`: where d/three belongs is asked.
        assert!(matches!(p, Prediction::Conflict { .. }), "{p:?}");
    }

    #[tokio::test]
    async fn the_shortcut_rules_out_only_disjoint_changes_of_one_head() {
        let (tmp, repo, wt_a) = repo_with_worktree(&[("src/a.rs", "a\n"), ("src/b.rs", "b\n")]);
        let wt_b = tmp.path().join("wt-b");
        let b_arg = wt_b.to_str().unwrap();
        sh_git(
            &repo,
            &["worktree", "add", "-q", "-b", "loop-b", b_arg],
            false,
        );
        let untouched = taken_whole(snapshot(&wt_b).await.unwrap());
        write(&wt_a, "src/a.rs", "a changed\n");
        write(&wt_a, "src/new.rs", "new\n");
        write(&wt_b, "src/b.rs", "b changed\n");
        let sa = taken_whole(snapshot(&wt_a).await.unwrap());
        let sb = taken_whole(snapshot(&wt_b).await.unwrap());
        assert!(
            !sa.may_conflict_with(&sb),
            "same directory, different files"
        );
        assert!(
            !sa.may_conflict_with(&untouched),
            "nothing changed on one side"
        );
        write(&wt_b, "src/a.rs", "a changed by b\n");
        let sb = taken_whole(snapshot(&wt_b).await.unwrap());
        assert!(sa.may_conflict_with(&sb), "a file both changed");
        std::fs::remove_file(wt_b.join("src/a.rs")).unwrap();
        write(&wt_b, "src/elsewhere.rs", "moved\n");
        let sb = taken_whole(snapshot(&wt_b).await.unwrap());
        assert!(sa.may_conflict_with(&sb), "a deletion (a rename, maybe)");
        // Another HEAD: the merge base is not the HEAD, so only merge-tree can tell.
        sh_git(&wt_b, &["checkout", "-q", "src"], false);
        sh_git(&wt_b, &["clean", "-qfd"], false);
        write(&wt_b, "other.txt", "o\n");
        sh_git(&wt_b, &["add", "-A"], false);
        sh_git(&wt_b, &["commit", "-q", "-m", "b commits"], false);
        let sb = taken_whole(snapshot(&wt_b).await.unwrap());
        assert!(sa.may_conflict_with(&sb), "different HEADs");
    }

    #[tokio::test]
    async fn a_path_with_a_newline_is_shown_escaped() {
        let p = predict_between(
            &[("readme", "r\n")],
            |a| write(a, "evil\nname", "a\n"),
            |b| write(b, "evil\nname", "b\n"),
        )
        .await;
        assert_eq!(
            p,
            Prediction::Conflict {
                files: vec!["\"evil\\nname\"".into()]
            }
        );
    }
}
