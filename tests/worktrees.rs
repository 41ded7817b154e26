//! Loop worktrees, checkpoint commits (`td_git::worktree`) and the merge queue's way of
//! integrating a loop's branch (`td_git::integrate`: scratch merge, then a guarded advance)
//! against real git in temporary repositories.
//!
//! Every git command, the fixture's and the library's, runs with `HOME` and `XDG_CONFIG_HOME`
//! in the fixture's temp dir and `GIT_CONFIG_NOSYSTEM=1`, passed per command: the machine's
//! git config stays out and the process environment is never changed (tests run in parallel).

use std::path::{Path, PathBuf};
use std::process::Command;

use td_git::integrate::{Advance, ScratchMerge};
use td_git::worktree::{Repo, Worktree, WorktreeError, loop_branch};
use tempfile::TempDir;

struct Fixture {
    tmp: TempDir,
    /// The user's checkout (top level of the repository).
    repo: PathBuf,
}

impl Fixture {
    /// A repository on `main` with one commit holding `README.md` ("hello\n").
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("home/.config")).unwrap();
        let repo = tmp.path().join("user");
        std::fs::create_dir(&repo).unwrap();
        let fx = Fixture { tmp, repo };
        fx.git(&fx.repo, &["init", "--quiet", "-b", "main"]);
        fx.git(&fx.repo, &["config", "user.name", "Test User"]);
        fx.git(&fx.repo, &["config", "user.email", "user@example.com"]);
        fx.write("README.md", "hello\n");
        fx.git(&fx.repo, &["add", "-A"]);
        fx.git(&fx.repo, &["commit", "--quiet", "-m", "initial"]);
        fx
    }

    fn env(&self) -> Vec<(String, PathBuf)> {
        let home = self.tmp.path().join("home");
        vec![
            ("HOME".to_string(), home.clone()),
            ("XDG_CONFIG_HOME".to_string(), home.join(".config")),
            ("GIT_CONFIG_NOSYSTEM".to_string(), PathBuf::from("1")),
        ]
    }

    fn command(&self, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("git");
        cmd.args(args).current_dir(dir);
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs git and returns its trimmed stdout; panics when it fails.
    fn git(&self, dir: &Path, args: &[&str]) -> String {
        let out = self.command(dir, args).output().unwrap();
        assert!(
            out.status.success(),
            "git {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Whether git exits 0.
    fn git_ok(&self, dir: &Path, args: &[&str]) -> bool {
        self.command(dir, args).output().unwrap().status.success()
    }

    fn write(&self, rel: &str, text: &str) {
        write_in(&self.repo, rel, text);
    }

    fn commit_user(&self, message: &str) -> String {
        self.git(&self.repo, &["add", "-A"]);
        self.git(&self.repo, &["commit", "--quiet", "-m", message]);
        self.git(&self.repo, &["rev-parse", "HEAD"])
    }

    fn wt_dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join("worktrees").join(name)
    }

    async fn open(&self) -> Repo {
        Repo::open_with_env(&self.repo, self.env()).await.unwrap()
    }

    fn head(&self) -> String {
        self.git(&self.repo, &["rev-parse", "HEAD"])
    }

    fn rev(&self, rev: &str) -> String {
        self.git(&self.repo, &["rev-parse", rev])
    }

    /// `git status --porcelain` of the user's checkout, untracked files included.
    fn status(&self) -> String {
        self.git(&self.repo, &["status", "--porcelain"])
    }

    fn mid_merge(&self) -> bool {
        self.git_ok(
            &self.repo,
            &["rev-parse", "--verify", "--quiet", "MERGE_HEAD"],
        )
    }

    fn registered_worktrees(&self) -> Vec<String> {
        self.git(&self.repo, &["worktree", "list", "--porcelain"])
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .map(str::to_string)
            .collect()
    }
}

fn write_in(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// How integrating a loop's branch ended (what the merge queue does with it).
#[derive(Debug, PartialEq, Eq)]
enum Integrated {
    /// The target is at `commit`, the merge.
    Merged { commit: String },
    /// The branches conflict in `files`; nothing moved.
    Conflict { files: Vec<String> },
    /// The target could not be advanced; nothing moved.
    Blocked { reason: String },
}

/// Integrates `branch` into `target` as the merge queue does: a merge in a scratch
/// worktree at the target's head, then the target advanced (made again when it moved).
async fn integrate(fx: &Fixture, repo: &Repo, branch: &str, target: &str) -> Integrated {
    loop {
        let old = repo
            .branch_head(target)
            .await
            .unwrap()
            .expect("the target exists");
        let scratch_dir = fx
            .tmp
            .path()
            .join(format!("scratch-{}", branch.replace('/', "-")));
        let scratch = repo.scratch(&scratch_dir, &old).await.unwrap();
        let merged = scratch
            .merge(branch, &format!("Merge branch '{branch}' into {target}"))
            .await
            .unwrap();
        scratch.remove().await.unwrap();
        let commit = match merged {
            ScratchMerge::Merged { commit } => commit,
            ScratchMerge::Conflict { files } => {
                return Integrated::Conflict {
                    files: files.into_iter().map(|f| f.path).collect(),
                };
            }
            ScratchMerge::Refused { reason } => return Integrated::Blocked { reason },
        };
        match repo.advance_branch(target, &commit, &old).await.unwrap() {
            Advance::Advanced => return Integrated::Merged { commit },
            Advance::Moved => continue,
            Advance::Blocked { reason } => return Integrated::Blocked { reason },
        }
    }
}

/// A loop worktree with one committed change to `file`.
async fn loop_with_commit(
    fx: &Fixture,
    repo: &Repo,
    loop_name: &str,
    file: &str,
    text: &str,
) -> Worktree {
    let wt = repo
        .add_worktree("r1", loop_name, None, &fx.wt_dir(loop_name))
        .await
        .unwrap();
    write_in(wt.path(), file, text);
    wt.commit_all(&format!("{loop_name}: {file}"))
        .await
        .unwrap()
        .expect("a change to commit");
    wt
}

#[tokio::test]
async fn add_worktree_creates_the_loop_branch_from_head() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    assert_eq!(repo.head_branch().await.unwrap().as_deref(), Some("main"));
    let dir = fx.wt_dir("nested/api");
    let wt = repo.add_worktree("r1", "api", None, &dir).await.unwrap();

    assert_eq!(wt.branch(), "taskdaemon/r1/api");
    assert_eq!(wt.branch(), loop_branch("r1", "api"));
    assert_eq!(wt.path(), std::fs::canonicalize(&dir).unwrap());
    assert_eq!(
        std::fs::read_to_string(dir.join("README.md")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        fx.git(&dir, &["branch", "--show-current"]),
        "taskdaemon/r1/api"
    );
    assert_eq!(wt.head_commit().await.unwrap(), fx.head());
    // The user's checkout stays on its branch.
    assert_eq!(fx.git(&fx.repo, &["branch", "--show-current"]), "main");
}

#[tokio::test]
async fn add_worktree_starts_from_an_explicit_base() {
    let fx = Fixture::new();
    fx.git(&fx.repo, &["checkout", "--quiet", "-b", "dev"]);
    fx.write("dev.txt", "dev\n");
    let dev_tip = fx.commit_user("dev work");
    fx.git(&fx.repo, &["checkout", "--quiet", "main"]);
    let repo = fx.open().await;

    let wt = repo
        .add_worktree("r1", "api", Some("dev"), &fx.wt_dir("api"))
        .await
        .unwrap();
    assert_eq!(wt.head_commit().await.unwrap(), dev_tip);
    assert!(wt.path().join("dev.txt").exists());
    // Created from the commit, so the loop branch tracks nothing.
    assert!(!fx.git_ok(
        &fx.repo,
        &["config", "--get", "branch.taskdaemon/r1/api.merge"]
    ));

    let err = repo
        .add_worktree("r1", "web", Some("no-such-branch"), &fx.wt_dir("web"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, WorktreeError::UnknownRevision { rev, .. } if rev == "no-such-branch"),
        "{err}"
    );
    assert!(!fx.wt_dir("web").exists());
    let err = repo
        .add_worktree("r1", "web", Some("--force"), &fx.wt_dir("web"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, WorktreeError::Invalid { what: "base", .. }),
        "{err}"
    );
}

#[tokio::test]
async fn detached_head_needs_an_explicit_base() {
    let fx = Fixture::new();
    fx.git(&fx.repo, &["checkout", "--quiet", "--detach"]);
    let repo = fx.open().await;
    assert_eq!(repo.head_branch().await.unwrap(), None);

    let err = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap_err();
    assert!(matches!(err, WorktreeError::DetachedHead { .. }), "{err}");
    assert!(err.to_string().contains("explicit base branch"), "{err}");

    let wt = repo
        .add_worktree("r1", "api", Some("main"), &fx.wt_dir("api"))
        .await
        .unwrap();
    assert_eq!(wt.head_commit().await.unwrap(), fx.rev("main"));
}

#[tokio::test]
async fn commit_all_commits_changes_as_taskdaemon() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap();
    let before = wt.head_commit().await.unwrap();

    write_in(wt.path(), "src/new.rs", "fn main() {}\n");
    write_in(wt.path(), ".gitignore", "target/\n");
    write_in(wt.path(), "target/junk.o", "binary");
    std::fs::remove_file(wt.path().join("README.md")).unwrap();
    let commit = wt
        .commit_all("api: first step")
        .await
        .unwrap()
        .expect("changes were made");

    assert_eq!(commit, wt.head_commit().await.unwrap());
    assert_ne!(commit, before);
    let dir = wt.path();
    assert_eq!(
        fx.git(dir, &["log", "-1", "--format=%an <%ae>|%cn <%ce>|%s|%G?"]),
        "TaskDaemon <taskdaemon@localhost>|TaskDaemon <taskdaemon@localhost>|api: first step|N"
    );
    assert_eq!(
        fx.git(dir, &["show", "--name-status", "--format=", "HEAD"]),
        "A\t.gitignore\nD\tREADME.md\nA\tsrc/new.rs"
    );
    assert_eq!(fx.git(dir, &["status", "--porcelain"]), "");

    // Nothing changed: no commit.
    assert_eq!(wt.commit_all("again").await.unwrap(), None);
    assert_eq!(wt.head_commit().await.unwrap(), commit);
}

#[tokio::test]
async fn commit_all_never_commits_run_records() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap();
    // No ignore file names .taskdaemon/.
    write_in(
        wt.path(),
        ".taskdaemon/runs/r1/summary.json",
        "{\"run\": \"r1-unique\"}\n",
    );
    assert_eq!(wt.commit_all("only run records").await.unwrap(), None);
    // Never even added: no object was written for it (run logs can be large).
    let blob = fx.git(
        wt.path(),
        &["hash-object", ".taskdaemon/runs/r1/summary.json"],
    );
    assert!(!fx.git_ok(wt.path(), &["cat-file", "-e", &blob]));

    // Even when something staged them.
    fx.git(wt.path(), &["add", "-f", ".taskdaemon"]);
    write_in(wt.path(), "notes.txt", "notes\n");
    wt.commit_all("notes").await.unwrap().unwrap();
    assert_eq!(
        fx.git(wt.path(), &["show", "--name-only", "--format=", "HEAD"]),
        "notes.txt"
    );
    assert_eq!(
        fx.git(wt.path(), &["ls-files", ".taskdaemon"]),
        "",
        "run records must stay untracked"
    );
    assert!(wt.path().join(".taskdaemon/runs/r1/summary.json").exists());
}

#[tokio::test]
async fn commit_all_refuses_bad_messages_and_foreign_branches() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap();
    write_in(wt.path(), "a.txt", "a\n");
    let err = wt.commit_all("  \n").await.unwrap_err();
    assert!(
        matches!(
            err,
            WorktreeError::Invalid {
                what: "commit message",
                ..
            }
        ),
        "{err}"
    );

    fx.git(wt.path(), &["checkout", "--quiet", "-b", "elsewhere"]);
    let err = wt.commit_all("step").await.unwrap_err();
    assert!(
        matches!(&err, WorktreeError::NotOnBranch { actual, .. } if actual == "branch `elsewhere`"),
        "{err}"
    );
    assert!(
        err.to_string().contains("git checkout taskdaemon/r1/api"),
        "{err}"
    );
    // Nothing was committed on the wrong branch.
    assert_eq!(fx.git(wt.path(), &["rev-parse", "HEAD"]), fx.rev("main"));
}

#[tokio::test]
async fn merge_into_the_users_checkout() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "api.txt", "api\n").await;
    let loop_tip = wt.head_commit().await.unwrap();
    let main_before = fx.head();
    // An untracked file of the user's neither blocks the merge nor is touched by it.
    fx.write("scratch.txt", "mine\n");

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    let Integrated::Merged { commit } = outcome else {
        panic!("expected a merge, got {outcome:?}");
    };
    assert_eq!(commit, fx.head());
    assert_eq!(
        fx.git(&fx.repo, &["log", "-1", "--format=%P|%an|%s"]),
        format!("{main_before} {loop_tip}|TaskDaemon|Merge branch 'taskdaemon/r1/api' into main")
    );
    assert_eq!(
        std::fs::read_to_string(fx.repo.join("api.txt")).unwrap(),
        "api\n"
    );
    assert_eq!(fx.status(), "?? scratch.txt");
    assert_eq!(
        std::fs::read_to_string(fx.repo.join("scratch.txt")).unwrap(),
        "mine\n"
    );

    // Merging again finds nothing new: the tip stays.
    let again = integrate(&fx, &repo, wt.branch(), "main").await;
    assert_eq!(again, Integrated::Merged { commit });
}

#[tokio::test]
async fn merge_conflict_is_aborted_and_listed() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap();
    write_in(wt.path(), "README.md", "loop\n");
    write_in(wt.path(), "z.txt", "loop z\n");
    write_in(wt.path(), "clean.txt", "no conflict\n");
    wt.commit_all("loop edits").await.unwrap().unwrap();
    fx.write("README.md", "user\n");
    fx.write("z.txt", "user z\n");
    let main_before = fx.commit_user("user edits");

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    assert_eq!(
        outcome,
        Integrated::Conflict {
            files: vec!["README.md".to_string(), "z.txt".to_string()]
        }
    );
    assert_eq!(fx.status(), "");
    assert!(!fx.mid_merge());
    assert_eq!(fx.head(), main_before);
    assert_eq!(
        std::fs::read_to_string(fx.repo.join("README.md")).unwrap(),
        "user\n"
    );
    assert!(!fx.repo.join("clean.txt").exists());
}

#[tokio::test]
async fn dirty_base_checkout_blocks_the_merge() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "api.txt", "api\n").await;
    let main_before = fx.head();
    fx.write("README.md", "work in progress\n");

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    let Integrated::Blocked { reason } = outcome else {
        panic!("expected Blocked, got {outcome:?}");
    };
    assert!(
        reason.contains("has uncommitted changes (README.md)"),
        "{reason}"
    );
    assert!(reason.contains("it was not touched"), "{reason}");
    assert_eq!(fx.head(), main_before);
    assert_eq!(fx.status(), "M README.md");
    assert_eq!(
        std::fs::read_to_string(fx.repo.join("README.md")).unwrap(),
        "work in progress\n"
    );
    assert!(!fx.repo.join("api.txt").exists());
    assert!(!fx.mid_merge());
}

#[tokio::test]
async fn users_own_merge_in_progress_is_left_alone() {
    let fx = Fixture::new();
    fx.git(&fx.repo, &["checkout", "--quiet", "-b", "side"]);
    fx.write("side.txt", "side\n");
    fx.commit_user("side");
    fx.git(&fx.repo, &["checkout", "--quiet", "main"]);
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "api.txt", "api\n").await;
    // The user is in the middle of a merge of their own.
    fx.git(
        &fx.repo,
        &["merge", "--quiet", "--no-ff", "--no-commit", "side"],
    );
    assert!(fx.mid_merge());

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    let Integrated::Blocked { reason } = outcome else {
        panic!("expected Blocked, got {outcome:?}");
    };
    assert!(reason.contains("a merge is in progress"), "{reason}");
    assert!(fx.mid_merge(), "the user's merge must not be aborted");
    assert_eq!(fx.status(), "A  side.txt");
    assert!(!fx.repo.join("api.txt").exists());
}

#[tokio::test]
async fn untracked_file_in_the_way_blocks_the_merge() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "api.txt", "from the loop\n").await;
    let main_before = fx.head();
    fx.write("api.txt", "the user's own, untracked\n");

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    let Integrated::Blocked { reason } = outcome else {
        panic!("expected Blocked, got {outcome:?}");
    };
    assert!(reason.contains("api.txt"), "{reason}");
    assert_eq!(fx.head(), main_before);
    assert_eq!(
        std::fs::read_to_string(fx.repo.join("api.txt")).unwrap(),
        "the user's own, untracked\n"
    );
    assert!(!fx.mid_merge());
}

#[tokio::test]
async fn merge_hooks_do_not_run() {
    // The daemon's git runs unconfined: no hook of the repository runs, neither one that
    // would refuse the merge nor one that would run something after it.
    let fx = Fixture::new();
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "api.txt", "api\n").await;
    let flag = fx.repo.with_file_name("post-merge-ran");
    let hooks = fx.repo.join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (name, body) in [
        (
            "pre-merge-commit",
            "echo 'merges need review' >&2\nexit 1".to_string(),
        ),
        ("post-merge", format!("touch '{}'", flag.display())),
    ] {
        let hook = hooks.join(name);
        std::fs::write(&hook, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    let outcome = integrate(&fx, &repo, wt.branch(), "main").await;
    let Integrated::Merged { commit } = outcome else {
        panic!("expected a merge, got {outcome:?}");
    };
    assert_eq!(commit, fx.head());
    assert!(!flag.exists(), "post-merge ran");
    assert!(!fx.mid_merge());
    assert_eq!(fx.status(), "");
}

#[tokio::test]
async fn base_not_checked_out_merges_in_a_temporary_worktree() {
    let fx = Fixture::new();
    fx.git(&fx.repo, &["branch", "release"]);
    let repo = fx.open().await;
    let wt = repo
        .add_worktree("r1", "api", Some("release"), &fx.wt_dir("api"))
        .await
        .unwrap();
    write_in(wt.path(), "api.txt", "api\n");
    let loop_tip = wt.commit_all("api").await.unwrap().unwrap();
    // The user keeps working on main, with uncommitted changes: none of it matters.
    fx.write("main.txt", "main\n");
    let user_head = fx.commit_user("main moves on");
    fx.write("README.md", "editing\n");
    let release_before = fx.rev("release");
    let worktrees_before = fx.registered_worktrees();

    let outcome = integrate(&fx, &repo, wt.branch(), "release").await;
    let Integrated::Merged { commit } = outcome else {
        panic!("expected a merge, got {outcome:?}");
    };
    assert_eq!(commit, fx.rev("release"));
    assert_eq!(
        fx.git(&fx.repo, &["log", "-1", "--format=%P", "release"]),
        format!("{release_before} {loop_tip}")
    );
    assert_eq!(fx.git(&fx.repo, &["show", "release:api.txt"]), "api");
    // The user's checkout: same branch, same HEAD, same uncommitted edit.
    assert_eq!(fx.head(), user_head);
    assert_eq!(fx.git(&fx.repo, &["branch", "--show-current"]), "main");
    assert_eq!(fx.status(), "M README.md");
    assert!(!fx.repo.join("api.txt").exists());
    // The temporary worktree is gone, registration included.
    assert_eq!(fx.registered_worktrees(), worktrees_before);
}

#[tokio::test]
async fn conflict_in_a_temporary_worktree_leaves_the_base_unchanged() {
    let fx = Fixture::new();
    fx.git(&fx.repo, &["checkout", "--quiet", "-b", "release"]);
    fx.write("README.md", "release\n");
    let release_before = fx.commit_user("release edit");
    fx.git(&fx.repo, &["checkout", "--quiet", "main"]);
    let repo = fx.open().await;
    let wt = loop_with_commit(&fx, &repo, "api", "README.md", "loop\n").await;
    let worktrees_before = fx.registered_worktrees();

    let outcome = integrate(&fx, &repo, wt.branch(), "release").await;
    assert_eq!(
        outcome,
        Integrated::Conflict {
            files: vec!["README.md".to_string()]
        }
    );
    assert_eq!(fx.rev("release"), release_before);
    assert_eq!(fx.registered_worktrees(), worktrees_before);
    assert_eq!(fx.status(), "");
}

#[tokio::test]
async fn concurrent_merges_into_one_checkout_are_serialized() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let a = loop_with_commit(&fx, &repo, "a", "a.txt", "a\n").await;
    let b = loop_with_commit(&fx, &repo, "b", "b.txt", "b\n").await;

    let (ra, rb) = tokio::join!(
        integrate(&fx, &repo, a.branch(), "main"),
        integrate(&fx, &repo, b.branch(), "main")
    );
    assert!(matches!(ra, Integrated::Merged { .. }), "{ra:?}");
    assert!(matches!(rb, Integrated::Merged { .. }), "{rb:?}");
    assert!(fx.repo.join("a.txt").exists() && fx.repo.join("b.txt").exists());
    assert_eq!(fx.status(), "");
}

#[tokio::test]
async fn integration_needs_a_real_branch_and_a_valid_target() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let head = fx.head();
    let scratch = repo
        .scratch(&fx.tmp.path().join("scratch"), &head)
        .await
        .unwrap();
    let outcome = scratch.merge("taskdaemon/r1/ghost", "m").await.unwrap();
    let ScratchMerge::Refused { reason } = outcome else {
        panic!("expected Refused, got {outcome:?}");
    };
    assert!(reason.contains("taskdaemon/r1/ghost"), "{reason}");
    scratch.remove().await.unwrap();
    let err = repo.advance_branch("-x", &head, &head).await.unwrap_err();
    assert!(
        matches!(
            err,
            WorktreeError::Invalid {
                what: "integration target",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(fx.head(), head);
    assert_eq!(fx.status(), "");
}

#[tokio::test]
async fn remove_worktree_keeps_or_deletes_the_branch() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let api = loop_with_commit(&fx, &repo, "api", "api.txt", "api\n").await;
    let tip = api.head_commit().await.unwrap();
    // Uncommitted work does not stop the removal.
    write_in(api.path(), "scratch.txt", "x\n");

    repo.remove_worktree(&api, true).await.unwrap();
    assert!(!api.path().exists());
    assert_eq!(fx.rev("taskdaemon/r1/api"), tip);
    assert_eq!(fx.registered_worktrees().len(), 1);

    let web = loop_with_commit(&fx, &repo, "web", "web.txt", "web\n").await;
    repo.remove_worktree(&web, false).await.unwrap();
    assert!(!web.path().exists());
    assert!(!fx.git_ok(
        &fx.repo,
        &[
            "show-ref",
            "--verify",
            "--quiet",
            "refs/heads/taskdaemon/r1/web"
        ]
    ));

    // A directory already deleted by hand: removal still succeeds and forgets it.
    let cli = loop_with_commit(&fx, &repo, "cli", "cli.txt", "cli\n").await;
    std::fs::remove_dir_all(cli.path()).unwrap();
    repo.remove_worktree(&cli, true).await.unwrap();
    assert_eq!(fx.registered_worktrees().len(), 1);
    // And twice is fine.
    repo.remove_worktree(&cli, true).await.unwrap();
}

#[tokio::test]
async fn resume_reuses_the_branch_and_worktree() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    let dir = fx.wt_dir("api");
    let first = loop_with_commit(&fx, &repo, "api", "api.txt", "step 1\n").await;
    let tip = first.head_commit().await.unwrap();
    write_in(first.path(), "wip.txt", "uncommitted\n");

    // Same run, same loop, same directory: the very same worktree, work kept.
    let again = repo.add_worktree("r1", "api", None, &dir).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(again.head_commit().await.unwrap(), tip);
    assert!(again.path().join("wip.txt").exists());

    // After the worktree was removed (branch kept): checked out again from the branch,
    // whatever base is given now.
    repo.remove_worktree(&first, true).await.unwrap();
    let resumed = repo
        .add_worktree("r1", "api", Some("main"), &dir)
        .await
        .unwrap();
    assert_eq!(resumed.head_commit().await.unwrap(), tip);
    assert_eq!(
        std::fs::read_to_string(dir.join("api.txt")).unwrap(),
        "step 1\n"
    );

    // After the directory was deleted by hand: the stale registration is pruned.
    std::fs::remove_dir_all(&dir).unwrap();
    let rebuilt = repo.add_worktree("r1", "api", None, &dir).await.unwrap();
    assert_eq!(rebuilt.head_commit().await.unwrap(), tip);
    assert_eq!(fx.registered_worktrees().len(), 2);
}

#[tokio::test]
async fn branch_or_directory_in_use_is_refused() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    repo.add_worktree("r1", "api", None, &fx.wt_dir("api"))
        .await
        .unwrap();

    let err = repo
        .add_worktree("r1", "api", None, &fx.wt_dir("other"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, WorktreeError::BranchCheckedOutElsewhere { .. }),
        "{err}"
    );
    assert!(!fx.wt_dir("other").exists());

    let occupied = fx.wt_dir("occupied");
    write_in(&occupied, "keep.txt", "keep\n");
    let err = repo
        .add_worktree("r1", "web", None, &occupied)
        .await
        .unwrap_err();
    assert!(matches!(err, WorktreeError::DirectoryInUse { .. }), "{err}");
    assert!(occupied.join("keep.txt").exists());
    // Nothing half-made: the branch was not created either.
    assert!(!fx.git_ok(
        &fx.repo,
        &[
            "show-ref",
            "--verify",
            "--quiet",
            "refs/heads/taskdaemon/r1/web"
        ]
    ));

    // An empty directory is fine.
    let empty = fx.wt_dir("empty");
    std::fs::create_dir_all(&empty).unwrap();
    repo.add_worktree("r1", "web", None, &empty).await.unwrap();
}

#[tokio::test]
async fn invalid_names_are_refused_before_anything_is_created() {
    let fx = Fixture::new();
    let repo = fx.open().await;
    for (run, name, what) in [
        ("r1", "bad name", "loop name"),
        ("r1", "a..b", "loop name"),
        ("r1", "x.lock", "loop name"),
        ("r1", "a/b", "loop name"),
        ("r1", "", "loop name"),
        ("r1", "q?", "loop name"),
        ("r1", "at@{x", "loop name"),
        ("r1", "end.", "loop name"),
        ("run:1", "api", "run id"),
        ("", "api", "run id"),
    ] {
        let err = repo
            .add_worktree(run, name, None, &fx.wt_dir("x"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, WorktreeError::Invalid { what: w, .. } if *w == what),
            "{run:?}/{name:?}: {err}"
        );
    }
    assert!(!fx.wt_dir("x").exists());
    assert_eq!(fx.git(&fx.repo, &["branch", "--list", "taskdaemon/*"]), "");
    // Accepted names include dots, dashes and underscores.
    repo.add_worktree("2024-01-01_a", "api.v2-x_y", None, &fx.wt_dir("ok"))
        .await
        .unwrap();
}

#[tokio::test]
async fn open_finds_the_top_level_or_says_what_to_do() {
    let fx = Fixture::new();
    fx.write("src/deep/file.rs", "");
    let from_file = Repo::open_with_env(&fx.repo.join("src/deep/file.rs"), fx.env())
        .await
        .unwrap();
    assert_eq!(from_file.root(), std::fs::canonicalize(&fx.repo).unwrap());
    // Without extra environment too.
    let plain = Repo::open(&fx.repo.join("src")).await.unwrap();
    assert_eq!(plain.root(), from_file.root());

    let outside = fx.tmp.path().join("not-a-repo");
    std::fs::create_dir(&outside).unwrap();
    let err = Repo::open_with_env(&outside, fx.env()).await.unwrap_err();
    assert!(matches!(err, WorktreeError::NotARepository { .. }), "{err}");
    assert!(err.to_string().contains("git init"), "{err}");

    let err = Repo::open(&fx.tmp.path().join("missing"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, WorktreeError::NotARepository { detail, .. } if detail.contains("does not exist")),
        "{err}"
    );

    // No git on PATH.
    let empty_bin = fx.tmp.path().join("empty-bin");
    std::fs::create_dir(&empty_bin).unwrap();
    let mut env = fx.env();
    env.push(("PATH".to_string(), empty_bin));
    let err = Repo::open_with_env(&fx.repo, env).await.unwrap_err();
    assert!(matches!(err, WorktreeError::GitUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("install git"), "{err}");
}
