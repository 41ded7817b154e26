//! The git side of a run: one git worktree per loop on its own branch
//! `taskdaemon/<run-id>/<loop>`, checkpoint commits made under TaskDaemon's own identity, and
//! merging a finished loop's branch back into its base without ever leaving the user's
//! checkout mid-merge.
//!
//! Everything goes through the `git` command line (no git library). Each command runs with
//! stdin closed, `GIT_TERMINAL_PROMPT=0`, a no-op editor, no hooks at all
//! ([`crate::daemon_git::NO_HOOKS`]: the repository's hooks would run unconfined, and often
//! run scripts from the worktree a loop writes), and without the variables that would
//! point git at another repository or identity (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`,
//! `GIT_AUTHOR_NAME`, ...), which a daemon started from a git hook would otherwise inherit.
//!
//! Invariants:
//! - The user's checkout is never left mid-merge. A merge runs only in a worktree whose
//!   tracked files are clean and which has no merge of its own in progress; a merge that stops
//!   (a conflict, or anything else once it began) is aborted before returning, and only a merge this module
//!   started is ever aborted. The whole merge runs in its own task, so dropping the caller's
//!   future (a deadline, a stop) cannot cut it between "merge" and "abort". Merges into the
//!   same repository are serialized within the process.
//! - Git processes are never killed midway: a killed git can leave `index.lock` behind and
//!   block the user's next command. A caller that wants a deadline times out the future; git
//!   then finishes on its own.
//! - TaskDaemon's commits (checkpoints and merges) carry the identity
//!   `TaskDaemon <taskdaemon@localhost>` whatever the machine's git config says, and are not
//!   signed (the identity is not the key owner's).
//! - Run records under `.taskdaemon/` are never committed, see [`Worktree::commit_all`].
//!
//! Needs git 2.23 or newer (`%(worktreepath)`). Paths containing a newline are not supported.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

/// First component of every loop branch: `taskdaemon/<run-id>/<loop>`.
pub const BRANCH_PREFIX: &str = "taskdaemon";

/// Directory (relative to a worktree's root) that holds run records; never committed.
pub const RUN_RECORD_DIR: &str = ".taskdaemon";

/// Name TaskDaemon commits under.
pub const COMMIT_NAME: &str = "TaskDaemon";

/// Email TaskDaemon commits under.
pub const COMMIT_EMAIL: &str = "taskdaemon@localhost";

/// The git arguments `args` preceded by TaskDaemon's commit identity (and no signing), so
/// that every commit made here is made alike whatever the user's git config says.
pub(crate) fn as_taskdaemon(args: &[&str]) -> Vec<String> {
    [
        "-c",
        &format!("user.name={COMMIT_NAME}"),
        "-c",
        &format!("user.email={COMMIT_EMAIL}"),
        "-c",
        "commit.gpgSign=false",
    ]
    .iter()
    .chain(args)
    .map(|s| s.to_string())
    .collect()
}

/// How many dirty files a "blocked" reason names before saying "and N more".
const LISTED_FILES: usize = 10;

/// Longest git stderr quoted in an error (head and tail are kept).
pub(crate) const MAX_STDERR: usize = 2000;

/// Result of this module's operations.
pub type Result<T, E = WorktreeError> = std::result::Result<T, E>;

/// Everything that can go wrong; each message ends with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorktreeError {
    /// The `git` program could not be started.
    #[error(
        "cannot run git ({detail}); install git and make sure `git --version` works in the environment TaskDaemon runs in"
    )]
    GitUnavailable {
        /// Why starting it failed.
        detail: String,
    },
    /// The path is not inside a git working tree (or does not exist).
    #[error(
        "{} is not inside a git working tree ({detail}); run `git init` there and make a first commit, or start TaskDaemon inside an existing repository",
        path.display()
    )]
    NotARepository {
        /// The path that was given.
        path: PathBuf,
        /// What git (or the file system) said.
        detail: String,
    },
    /// A run id, loop name, branch name, base or message that cannot be used.
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        /// Which input ("loop name", "run id", ...).
        what: &'static str,
        /// The value given.
        value: String,
        /// Why it was refused and what to use instead.
        reason: String,
    },
    /// No base was given and HEAD is detached, so there is no branch to start from.
    #[error(
        "HEAD of {} is detached, so there is no branch to start `{branch}` from; check out a branch there or give the loop an explicit base branch",
        repo.display()
    )]
    DetachedHead {
        /// The repository's top level.
        repo: PathBuf,
        /// The loop branch that was to be created.
        branch: String,
    },
    /// A revision that must name a commit does not.
    #[error("`{rev}` does not name a commit in {}; {hint}", repo.display())]
    UnknownRevision {
        /// The revision given (branch, tag or commit id).
        rev: String,
        /// The repository's top level.
        repo: PathBuf,
        /// What to do.
        hint: String,
    },
    /// The loop branch is checked out in another directory than the one asked for.
    #[error(
        "branch `{branch}` is already checked out in {}, not in {}; remove that worktree (`git worktree remove {}`) or use a new run id",
        at.display(), wanted.display(), at.display()
    )]
    BranchCheckedOutElsewhere {
        /// The loop branch.
        branch: String,
        /// Where it is checked out.
        at: PathBuf,
        /// Where it was asked for.
        wanted: PathBuf,
    },
    /// The worktree directory exists and is not (reusable as) the worktree of the branch.
    #[error(
        "{} cannot become the worktree of `{branch}`: {detail}; remove it or choose another directory for the loop",
        dir.display()
    )]
    DirectoryInUse {
        /// The directory asked for.
        dir: PathBuf,
        /// The loop branch.
        branch: String,
        /// What is in the way.
        detail: String,
    },
    /// A loop's worktree is not on its loop branch (someone ran `git checkout` in it).
    #[error(
        "the worktree {} is on {actual}, not on its loop branch `{expected}`; run `git checkout {expected}` in it, then commit again",
        path.display()
    )]
    NotOnBranch {
        /// The worktree.
        path: PathBuf,
        /// The loop branch.
        expected: String,
        /// What HEAD is instead (`branch \`x\`` or `a detached HEAD`).
        actual: String,
    },
    /// A git command failed.
    #[error("`{command}` failed in {} ({status}): {stderr}; {hint}", dir.display())]
    Git {
        /// The command line (arguments joined by spaces).
        command: String,
        /// Where it ran.
        dir: PathBuf,
        /// Exit status in words.
        status: String,
        /// What git printed on stderr (head and tail when long).
        stderr: String,
        /// What to do.
        hint: String,
    },
}

/// The branch a loop works on: `taskdaemon/<run_id>/<loop_name>`.
pub fn loop_branch(run_id: &str, loop_name: &str) -> String {
    format!("{BRANCH_PREFIX}/{run_id}/{loop_name}")
}

/// Runs git with the environment of one [`Repo`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Git {
    pub(crate) extra_env: Arc<[(OsString, OsString)]>,
}

/// What a finished git command left behind.
pub(crate) struct GitOutput {
    pub(crate) command: String,
    pub(crate) dir: PathBuf,
    pub(crate) status: std::process::ExitStatus,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: String,
}

impl GitOutput {
    pub(crate) fn success(&self) -> bool {
        self.status.success()
    }

    /// Stdout as text without the trailing newline git ends every answer with.
    pub(crate) fn text(&self) -> String {
        let s = String::from_utf8_lossy(&self.stdout);
        s.strip_suffix('\n').unwrap_or(&s).to_string()
    }

    pub(crate) fn into_error(self, hint: impl Into<String>) -> WorktreeError {
        let status = match self.status.code() {
            Some(code) => format!("exit code {code}"),
            None => "killed by a signal".to_string(),
        };
        let stderr = self.stderr.trim();
        let stderr = if stderr.is_empty() {
            "no error output".to_string()
        } else {
            td_base::text::head_tail(stderr, MAX_STDERR)
        };
        WorktreeError::Git {
            command: self.command,
            dir: self.dir,
            status,
            stderr,
            hint: hint.into(),
        }
    }
}

/// Runs the daemon's git in `dir` with `env` added, to its end (never killed midway: a
/// killed git can leave a lock file behind), and returns whatever it did, failure
/// included. The one launcher of the crate's git commands: the daemon's git environment
/// (no hooks, no fsmonitor, nothing inherited that points at another repository, its own
/// process group: see `crate::daemon_git::command`).
pub(crate) async fn git_output<I, S>(
    dir: &Path,
    args: I,
    env: &[(OsString, OsString)],
) -> Result<GitOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    git_output_with(dir, args, env, GitInput::None).await
}

/// What a git command reads on stdin.
pub(crate) enum GitInput {
    /// Nothing (stdin closed), as for most commands.
    None,
    /// These bytes (e.g. revisions for `--stdin`), written while git runs so that a long
    /// answer cannot deadlock against a long question.
    Bytes(Vec<u8>),
    /// This open file, from its current offset (e.g. the pack of a bundle, for
    /// `index-pack --stdin`): git reads it directly, nothing passes through memory.
    File(std::fs::File),
    /// A pack another machine sent, from its current offset, for `index-pack --stdin`, with
    /// git's memory bounded by [`MAX_INDEX_MEMORY`]: index-pack inflates every object but
    /// the largest blobs, and every delta's result, whole in memory, so a pack of a few KiB
    /// can ask for gigabytes before any check reads what it holds.
    Pack(std::fs::File),
}

/// The most memory (`RLIMIT_DATA`: the heap and private mappings, thread stacks included)
/// git may use to index a pack another machine sent ([`GitInput::Pack`]). Blobs larger than
/// git's `core.bigFileThreshold` (512 MiB) are streamed, not held; what a loop's branch
/// legitimately holds in memory at once is one object below that, and the delta cache.
pub const MAX_INDEX_MEMORY: u64 = 1024 * 1024 * 1024;

/// [`git_output`] with `input` on stdin.
pub(crate) async fn git_output_with<I, S>(
    dir: &Path,
    args: I,
    env: &[(OsString, OsString)],
    input: GitInput,
) -> Result<GitOutput>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut cmd = tokio::process::Command::from(crate::daemon_git::command(dir));
    cmd.args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut bytes = None;
    match input {
        GitInput::None => {}
        GitInput::Bytes(b) => {
            cmd.stdin(Stdio::piped());
            bytes = Some(b);
        }
        GitInput::File(f) => {
            cmd.stdin(Stdio::from(f));
        }
        GitInput::Pack(f) => {
            cmd.stdin(Stdio::from(f));
            // SAFETY: between fork and exec only a system call (prlimit64) on values held on
            // the stack; no allocation, no lock.
            unsafe {
                cmd.pre_exec(|| {
                    let limit = rustix::process::Rlimit {
                        current: Some(MAX_INDEX_MEMORY),
                        maximum: Some(MAX_INDEX_MEMORY),
                    };
                    rustix::process::setrlimit(rustix::process::Resource::Data, limit)
                        .map_err(std::io::Error::from)
                });
            }
        }
    }
    for (key, value) in env {
        cmd.env(key, value);
    }
    let command = std::iter::once("git".to_string())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = match cmd.spawn() {
        Ok(mut child) => {
            if let (Some(bytes), Some(mut stdin)) = (bytes, child.stdin.take()) {
                // A git that exits early closes its end; the write then fails, and what git
                // said is in its status and stderr.
                tokio::spawn(async move {
                    use tokio::io::AsyncWriteExt;
                    let _ = stdin.write_all(&bytes).await;
                });
            }
            child.wait_with_output().await
        }
        Err(e) => Err(e),
    };
    let out = out.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            WorktreeError::GitUnavailable {
                detail: e.to_string(),
            }
        }
        _ => WorktreeError::Git {
            command: command.clone(),
            dir: dir.to_path_buf(),
            status: "could not start".to_string(),
            stderr: e.to_string(),
            hint: "check that the directory exists and the arguments hold no NUL byte".to_string(),
        },
    })?;
    Ok(GitOutput {
        command,
        dir: dir.to_path_buf(),
        status: out.status,
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

impl Git {
    /// Runs `git ARGS` in `dir` and returns whatever it did, failure included.
    pub(crate) async fn output<I, S>(&self, dir: &Path, args: I) -> Result<GitOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        git_output(dir, args, &self.extra_env).await
    }

    /// Runs `git ARGS` in `dir` with `input` on stdin, and returns whatever it did.
    pub(crate) async fn output_with<I, S>(
        &self,
        dir: &Path,
        args: I,
        input: GitInput,
    ) -> Result<GitOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        git_output_with(dir, args, &self.extra_env, input).await
    }

    /// Runs `git ARGS` in `dir`; a failure becomes an error carrying `hint`.
    pub(crate) async fn run<I, S>(&self, dir: &Path, args: I, hint: &str) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.output(dir, args).await?;
        if out.success() {
            Ok(out.text())
        } else {
            Err(out.into_error(hint))
        }
    }

    /// The commit `rev` names, or `None` when it names none.
    pub(crate) async fn resolve_commit(&self, dir: &Path, rev: &str) -> Result<Option<String>> {
        let spec = format!("{rev}^{{commit}}");
        let out = self
            .output(dir, ["rev-parse", "--verify", "--quiet", spec.as_str()])
            .await?;
        Ok(out.success().then(|| out.text()).filter(|s| !s.is_empty()))
    }

    /// Whether the worktree at `dir` has a merge in progress.
    pub(crate) async fn merge_in_progress(&self, dir: &Path) -> Result<bool> {
        let out = self
            .output(dir, ["rev-parse", "--verify", "--quiet", "MERGE_HEAD"])
            .await?;
        Ok(out.success())
    }

    /// The full ref HEAD points at in `dir` (`refs/heads/x`), or `None` when detached.
    async fn symbolic_head(&self, dir: &Path) -> Result<Option<String>> {
        let out = self
            .output(dir, ["symbolic-ref", "--quiet", "HEAD"])
            .await?;
        match out.status.code() {
            Some(0) => Ok(Some(out.text())),
            // `--quiet` makes a detached HEAD exit 1 without output.
            Some(1) => Ok(None),
            _ => Err(out.into_error("check that the directory is a git worktree")),
        }
    }
}

/// Paths of NUL-separated `git` output (`-z`).
pub(crate) fn nul_separated(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// Paths named by `git status --porcelain=v1 -z`: "XY path", renames and copies followed by
/// their origin path as an extra entry.
pub(crate) fn porcelain_paths(bytes: &[u8]) -> Vec<String> {
    let mut paths = Vec::new();
    let mut entries = bytes.split(|b| *b == 0).filter(|e| !e.is_empty());
    while let Some(entry) = entries.next() {
        if entry.len() < 4 {
            continue;
        }
        paths.push(String::from_utf8_lossy(&entry[3..]).into_owned());
        if matches!(entry[0], b'R' | b'C') || matches!(entry[1], b'R' | b'C') {
            entries.next();
        }
    }
    paths.sort();
    paths.dedup();
    paths
}

/// "a, b, c and 4 more".
pub(crate) fn list_some(files: &[String]) -> String {
    let shown = files
        .iter()
        .take(LISTED_FILES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    match files.len().saturating_sub(LISTED_FILES) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// The same directory, comparing real paths when both exist.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Real path when it exists, the path as given otherwise.
fn real_or_given(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One lock per repository (keyed by its common git dir): this process's changes to the
/// repository's worktree registrations (a loop's worktree added, a scratch worktree made or
/// cleared, with the `prune`s they do) and the advances of an integration target happen
/// one at a time.
pub(crate) fn merge_lock(common_dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    type Locks = Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>;
    static LOCKS: OnceLock<Locks> = OnceLock::new();
    let locks = LOCKS.get_or_init(Locks::default);
    let mut map = td_base::sync::lock(locks);
    map.entry(common_dir.to_path_buf()).or_default().clone()
}

/// Refuses a run id or loop name that would not make one plain branch component.
fn check_component(what: &'static str, value: &str) -> Result<()> {
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value.contains('/') {
        Some("it contains '/', which would nest one loop's branch inside another's")
    } else if value.chars().any(char::is_control) {
        Some("it contains control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(WorktreeError::Invalid {
            what,
            value: value.to_string(),
            reason: format!("{reason}; use letters, digits, '-', '_' and '.'"),
        }),
        None => Ok(()),
    }
}

/// A git repository the loops of a run branch off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    pub(crate) root: PathBuf,
    pub(crate) common_dir: PathBuf,
    pub(crate) git: Git,
    /// Its object format, once a transfer read it.
    pub(crate) format: crate::transfer::KnownFormat,
    /// Where its git-lfs objects are, once a transfer read it.
    pub(crate) lfs: crate::transfer::lfs::KnownLfsObjects,
}

/// One loop's checkout: a git worktree on the loop's branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worktree {
    pub(crate) path: PathBuf,
    pub(crate) branch: String,
    pub(crate) git: Git,
}

impl Repo {
    /// Finds the repository whose working tree holds `path` (a file or directory anywhere in
    /// it; a linked worktree counts as its own top level).
    pub async fn open(path: &Path) -> Result<Repo> {
        Self::open_with_env(path, std::iter::empty::<(OsString, OsString)>()).await
    }

    /// Like [`Repo::open`], with extra environment variables for every git command this
    /// repository and its worktrees run (e.g. `GIT_CONFIG_GLOBAL`, or `HOME` and
    /// `GIT_CONFIG_NOSYSTEM=1` to keep the machine's git config out, as the tests do).
    pub async fn open_with_env<I, K, V>(path: &Path, env: I) -> Result<Repo>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let git = Git {
            extra_env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        };
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let dir = if abs.is_dir() {
            abs
        } else if abs.exists() {
            abs.parent().map_or_else(|| abs.clone(), Path::to_path_buf)
        } else {
            return Err(WorktreeError::NotARepository {
                path: path.to_path_buf(),
                detail: "the path does not exist".to_string(),
            });
        };
        let out = git.output(&dir, ["rev-parse", "--show-toplevel"]).await?;
        let top = out.text();
        if !out.success() || top.is_empty() {
            let detail = out.stderr.trim();
            return Err(WorktreeError::NotARepository {
                path: path.to_path_buf(),
                detail: if detail.is_empty() {
                    "git found no working tree".to_string()
                } else {
                    td_base::text::head_tail(detail, MAX_STDERR)
                },
            });
        }
        let root = real_or_given(Path::new(&top));
        let common = git
            .run(
                &root,
                ["rev-parse", "--git-common-dir"],
                "check that the repository is readable",
            )
            .await?;
        // Relative to the directory git ran in (the top level) when not absolute.
        let common_dir = real_or_given(&root.join(common));
        Ok(Repo {
            root,
            common_dir,
            git,
            format: Default::default(),
            lfs: Default::default(),
        })
    }

    /// The repository's top level (real path).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The branch checked out at the top level, or `None` when HEAD is detached. An unborn
    /// branch (no commit yet) is still returned.
    pub async fn head_branch(&self) -> Result<Option<String>> {
        let head = self.git.symbolic_head(&self.root).await?;
        Ok(head.map(|r| r.strip_prefix("refs/heads/").unwrap_or(&r).to_string()))
    }

    /// Creates (or, on resume, reuses) the worktree of loop `loop_name` of run `run_id` at
    /// `dir`, on branch `taskdaemon/<run_id>/<loop_name>`.
    ///
    /// A new branch starts at `base` (a branch, tag or commit; default: the branch checked out
    /// at the top level). When the branch already exists, `base` is ignored: the branch is
    /// reused as it is, in its existing worktree when that is `dir`, or checked out afresh at
    /// `dir` when its worktree was removed (or deleted by hand). A relative `dir` is taken
    /// from the process's current directory; missing parent directories are created.
    pub async fn add_worktree(
        &self,
        run_id: &str,
        loop_name: &str,
        base: Option<&str>,
        dir: &Path,
    ) -> Result<Worktree> {
        check_component("run id", run_id)?;
        check_component("loop name", loop_name)?;
        // Serialized with the merge queue's scratch worktrees, whose `prune` would otherwise
        // forget this worktree halfway through its `worktree add`.
        let lock = merge_lock(&self.common_dir);
        let _serialized = lock.lock().await;
        // The run id first (with a placeholder loop), so that the error names the input at fault.
        self.check_branch_name("run id", run_id, &loop_branch(run_id, "loop"))
            .await?;
        self.check_branch_name("loop name", loop_name, &loop_branch(run_id, loop_name))
            .await?;
        let branch = loop_branch(run_id, loop_name);
        let dir = std::path::absolute(dir).map_err(|e| WorktreeError::Invalid {
            what: "worktree directory",
            value: dir.display().to_string(),
            reason: format!("{e}; give an absolute path"),
        })?;

        if self.branch_exists(&branch).await? {
            match self.checked_out_at(&branch).await? {
                Some(at) if at.exists() => {
                    return if same_dir(&at, &dir) {
                        Ok(self.worktree(&dir, branch))
                    } else {
                        Err(WorktreeError::BranchCheckedOutElsewhere {
                            branch,
                            at,
                            wanted: dir,
                        })
                    };
                }
                // Registered in a directory that is gone: forget it, then check out again.
                Some(_) => self.prune().await?,
                None => {}
            }
            self.check_dir_free(&dir, &branch)?;
            self.git_worktree_add(
                &[dir.as_os_str(), OsStr::new(&branch)],
                "check that the directory is writable",
            )
            .await?;
            return Ok(self.worktree(&dir, branch));
        }

        let base = match base {
            Some(b) => b.to_string(),
            None => self
                .head_branch()
                .await?
                .ok_or_else(|| WorktreeError::DetachedHead {
                    repo: self.root.clone(),
                    branch: branch.clone(),
                })?,
        };
        if base.starts_with('-') || base.contains('\0') || base.is_empty() {
            return Err(WorktreeError::Invalid {
                what: "base",
                value: base,
                reason: "it is not a revision; give a branch, tag or commit id".to_string(),
            });
        }
        // The commit id, not the name: a branch made from a remote-tracking name would
        // otherwise get that remote branch as its upstream.
        let base_commit = self
            .git
            .resolve_commit(&self.root, &base)
            .await?
            .ok_or_else(|| WorktreeError::UnknownRevision {
                rev: base.clone(),
                repo: self.root.clone(),
                hint: "give an existing branch, tag or commit as the base (a new repository needs a first commit)".to_string(),
            })?;
        self.check_dir_free(&dir, &branch)?;
        self.git_worktree_add(
            &[
                OsStr::new("-b"),
                OsStr::new(&branch),
                dir.as_os_str(),
                OsStr::new(&base_commit),
            ],
            "check that the directory is writable",
        )
        .await?;
        Ok(self.worktree(&dir, branch))
    }

    /// Removes a loop's worktree (uncommitted changes in it are discarded). The branch stays
    /// when `keep_branch`, and is deleted otherwise. A directory already deleted by hand is
    /// fine: its registration is pruned.
    pub async fn remove_worktree(&self, worktree: &Worktree, keep_branch: bool) -> Result<()> {
        if worktree.path.exists() {
            self.git
                .run(
                    &self.root,
                    [
                        OsStr::new("worktree"),
                        OsStr::new("remove"),
                        OsStr::new("--force"),
                        worktree.path.as_os_str(),
                    ],
                    "if the worktree is locked, unlock it with `git worktree unlock`; otherwise check that the directory is a worktree of this repository",
                )
                .await?;
        } else {
            self.prune().await?;
        }
        if !keep_branch && self.branch_exists(&worktree.branch).await? {
            self.git
                .run(
                    &self.root,
                    ["branch", "-D", worktree.branch.as_str()],
                    "check that the branch is not checked out anywhere (`git worktree list`)",
                )
                .await?;
        }
        Ok(())
    }

    fn worktree(&self, dir: &Path, branch: String) -> Worktree {
        Worktree {
            path: real_or_given(dir),
            branch,
            git: self.git.clone(),
        }
    }

    /// `git worktree add --quiet ARGS`, failing with `hint`: how every worktree of the
    /// repository is made (loop worktrees and integration scratch alike).
    pub(crate) async fn git_worktree_add(&self, args: &[&OsStr], hint: &str) -> Result<String> {
        let add = [
            OsStr::new("worktree"),
            OsStr::new("add"),
            OsStr::new("--quiet"),
        ];
        self.git.run(&self.root, add.iter().chain(args), hint).await
    }

    pub(crate) async fn prune(&self) -> Result<()> {
        self.git
            .run(
                &self.root,
                ["worktree", "prune"],
                "check that the repository is writable",
            )
            .await
            .map(drop)
    }

    /// Refuses `full` unless git accepts it as a branch name; the error names `what`/`value`.
    pub(crate) async fn check_branch_name(
        &self,
        what: &'static str,
        value: &str,
        full: &str,
    ) -> Result<()> {
        let invalid = |reason: String| WorktreeError::Invalid {
            what,
            value: value.to_string(),
            reason,
        };
        if full.contains('\0') {
            return Err(invalid("it contains a NUL byte".to_string()));
        }
        let out = self
            .git
            .output(&self.root, ["check-ref-format", "--branch", full])
            .await?;
        // `--branch` expands `@{-1}` style names; only the literal name is acceptable.
        if out.success() && out.text() == full {
            return Ok(());
        }
        Err(invalid(format!(
            "git does not accept `{full}` as a branch name; use letters, digits, '-', '_' and '.' (no spaces, '..', '@{{', any of ~^:?*[\\, and no ending in '.' or '.lock')"
        )))
    }

    pub(crate) async fn branch_exists(&self, branch: &str) -> Result<bool> {
        let full = format!("refs/heads/{branch}");
        let out = self
            .git
            .output(
                &self.root,
                ["show-ref", "--verify", "--quiet", full.as_str()],
            )
            .await?;
        Ok(out.success())
    }

    /// The worktree `branch` is checked out in, if any (the path may no longer exist).
    pub(crate) async fn checked_out_at(&self, branch: &str) -> Result<Option<PathBuf>> {
        let full = format!("refs/heads/{branch}");
        let listing = self
            .git
            .run(
                &self.root,
                [
                    "for-each-ref",
                    "--format=%(refname)%00%(worktreepath)",
                    full.as_str(),
                ],
                "TaskDaemon needs git 2.23 or newer; check `git --version`",
            )
            .await?;
        // The pattern also matches refs below it, so pick the exact ref.
        Ok(listing.lines().find_map(|line| {
            let (name, path) = line.split_once('\0')?;
            (name == full && !path.is_empty()).then(|| PathBuf::from(path))
        }))
    }

    /// Refuses a directory `git worktree add` could not use, with a clearer word than git's.
    fn check_dir_free(&self, dir: &Path, branch: &str) -> Result<()> {
        let in_use = |detail: String| WorktreeError::DirectoryInUse {
            dir: dir.to_path_buf(),
            branch: branch.to_string(),
            detail,
        };
        match std::fs::read_dir(dir) {
            Ok(mut entries) => match entries.next() {
                None => Ok(()),
                Some(_) => Err(in_use(
                    "it exists and is not empty (and is not that branch's worktree)".to_string(),
                )),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) if dir.exists() && !dir.is_dir() => {
                Err(in_use(format!("it exists and is not a directory ({e})")))
            }
            Err(e) => Err(in_use(format!("it cannot be read ({e})"))),
        }
    }
}

impl Worktree {
    /// The worktree's directory (real path).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The loop branch checked out in it (`taskdaemon/<run>/<loop>`).
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// Whether git ignores `rel` (relative to the worktree) here: `.gitignore` and
    /// `.git/info/exclude` (`git check-ignore`). Build state seeded into the worktree must be
    /// (see `seed`), or the loop's checkpoint commit would carry it.
    pub async fn is_ignored(&self, rel: &Path) -> Result<bool> {
        let out = self
            .git
            .output(
                &self.path,
                [
                    OsStr::new("check-ignore"),
                    OsStr::new("-q"),
                    OsStr::new("--"),
                    rel.as_os_str(),
                ],
            )
            .await?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(out.into_error("check that the worktree still exists (`git worktree list`)")),
        }
    }

    /// The commit HEAD is at.
    pub async fn head_commit(&self) -> Result<String> {
        self.git
            .run(
                &self.path,
                ["rev-parse", "--verify", "HEAD"],
                "check that the worktree still exists (`git worktree list`)",
            )
            .await
    }

    /// Commits everything that changed in the worktree (`git add -A`: new, modified and
    /// deleted files) as `TaskDaemon <taskdaemon@localhost>`, and returns the new commit id,
    /// or `None` when there was nothing to commit.
    ///
    /// Files matched by `.gitignore` (and `.git/info/exclude`) stay out, as with any
    /// `git add -A`. The run-record directory `.taskdaemon/` at the worktree's root stays out
    /// even when no ignore file names it: it is excluded from `git add` and unstaged if
    /// something staged it, so only the user decides whether run records are versioned.
    /// Checkpoint commits run no hook (no git command of the daemon does:
    /// [`crate::daemon_git::NO_HOOKS`]): they record work in progress, which the loop's
    /// validation command judges, not the user's commit policy.
    /// Fails when the worktree is not on its loop branch.
    pub async fn commit_all(&self, message: &str) -> Result<Option<String>> {
        if message.trim().is_empty() || message.contains('\0') {
            return Err(WorktreeError::Invalid {
                what: "commit message",
                value: message.to_string(),
                reason: "it must hold text and no NUL byte".to_string(),
            });
        }
        let expected = format!("refs/heads/{}", self.branch);
        let head = self.git.symbolic_head(&self.path).await?;
        if head.as_deref() != Some(expected.as_str()) {
            return Err(WorktreeError::NotOnBranch {
                path: self.path.clone(),
                expected: self.branch.clone(),
                actual: match head {
                    Some(r) => format!("branch `{}`", r.strip_prefix("refs/heads/").unwrap_or(&r)),
                    None => "a detached HEAD".to_string(),
                },
            });
        }
        let exclude = format!(":(exclude){RUN_RECORD_DIR}");
        let hint = "check that no other git command is running in this worktree (a stale `index.lock` in its git dir can be deleted when none is)";
        self.git
            .run(&self.path, ["add", "-A", "--", ".", exclude.as_str()], hint)
            .await?;
        let staged = self.take_back_staged(hint).await?;
        // A merge in progress (the merge queue handed the loop its target's work) is
        // concluded by this commit even when the resolution kept HEAD's tree: otherwise the
        // loop's branch would never contain the target, and the next integration would
        // conflict again.
        if !staged && !self.git.merge_in_progress(&self.path).await? {
            return Ok(None);
        }
        self.git
            .run(
                &self.path,
                as_taskdaemon(&[
                    "commit",
                    "--quiet",
                    "--no-verify",
                    "--cleanup=whitespace",
                    "-m",
                    message,
                ]),
                hint,
            )
            .await?;
        self.head_commit().await.map(Some)
    }

    /// [`take_back_staged`] in this worktree: whether anything else is staged.
    async fn take_back_staged(&self, hint: &str) -> Result<bool> {
        take_back_staged(&self.path, &self.git.extra_env, hint).await
    }
}

/// Takes back what `git add -A` staged in `dir` (with `env`: a temporary index) that the
/// daemon never commits, and says whether anything else is staged (one `diff` answers all of
/// it, and a `reset` runs only when there is something to take back):
///
/// - the run records ([`RUN_RECORD_DIR`]): `add -A` leaves them out, but something (a loop's
///   own `git add -f`) may have staged them; only the user decides whether they are versioned;
/// - every gitlink HEAD does not hold as it is (a directory with a `.git` of its own, added or
///   pointing elsewhere). To stage one, git resolved the HEAD of whatever repository that
///   `.git` names, and a loop's command can write one naming any repository on the machine:
///   committed, the id would tell the loop, on its own branch, which commit a repository
///   outside its sandbox is on. A loop makes no submodule commit worth recording either: its
///   commands cannot write the repository's git metadata (where a submodule's repository
///   lives), and a repository it makes inside its worktree keeps its commits there, where
///   nothing else can fetch them (git never adds the files inside one). A gitlink the loop
///   removed stays removed.
pub(crate) async fn take_back_staged(
    dir: &Path,
    env: &[(OsString, OsString)],
    hint: &str,
) -> Result<bool> {
    // `--ignore-submodules=none`: the daemon's git ignores them otherwise
    // (`diff.ignoreSubmodules=all`, see `crate::daemon_git::command`).
    let out = git_output(
        dir,
        [
            "diff",
            "--cached",
            "--raw",
            "-z",
            "--no-renames",
            "--ignore-submodules=none",
            "HEAD",
        ],
        env,
    )
    .await?;
    if !out.success() {
        return Err(out.into_error(hint));
    }
    let staged = Staged::read(&out.stdout);
    if !staged.gitlinks.is_empty() {
        tracing::warn!(
            dir = %dir.display(),
            paths = ?staged.gitlinks,
            "a nested repository is left out of the loop's commit"
        );
    }
    if staged.gitlinks.is_empty() && staged.records.is_empty() {
        return Ok(staged.others > 0);
    }
    // Literal: a loop names these paths, and `*` or `:(top)` would take back everything.
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("--literal-pathspecs"),
        OsStr::new("reset"),
        OsStr::new("--quiet"),
        OsStr::new("--"),
    ];
    args.extend(staged.gitlinks.iter().map(|p| p.as_os_str()));
    args.extend(staged.records.iter().map(|p| p.as_os_str()));
    let out = git_output(dir, args, env).await?;
    if !out.success() {
        return Err(out.into_error(hint));
    }
    Ok(staged.others > 0)
}

/// What `git diff --cached --raw -z` says is staged, sorted by what the daemon does with it.
#[derive(Debug, Default, PartialEq)]
struct Staged {
    /// Paths whose new mode is a gitlink (`160000`).
    gitlinks: Vec<OsString>,
    /// Paths in the run records' directory.
    records: Vec<OsString>,
    /// How many other paths.
    others: usize,
}

impl Staged {
    /// Reads `git diff --raw -z` output: each record is `:<old mode> <new mode> <old id> <new
    /// id> <status>` then the path, both NUL-ended.
    fn read(raw: &[u8]) -> Staged {
        let mut staged = Staged::default();
        let mut fields = raw.split(|b| *b == 0);
        let records_dir = RUN_RECORD_DIR.as_bytes();
        while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
            if path.is_empty() {
                break;
            }
            let owned = OsStr::from_bytes(path).to_os_string();
            let in_records = path
                .strip_prefix(records_dir)
                .is_some_and(|rest| rest.is_empty() || rest.first() == Some(&b'/'));
            if in_records {
                staged.records.push(owned);
            } else if meta.split(|b| *b == b' ').nth(1) == Some(b"160000".as_slice()) {
                staged.gitlinks.push(owned);
            } else {
                staged.others += 1;
            }
        }
        staged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_paths_are_sorted_into_gitlinks_run_records_and_the_rest() {
        let zero = "0".repeat(40);
        let id = "a".repeat(40);
        let raw = format!(
            ":000000 160000 {zero} {id} A\0sub\0:100644 100644 {id} {id} M\0a b.txt\0\
             :160000 160000 {id} {zero} M\0deep/er\0:160000 000000 {id} {zero} D\0gone\0\
             :000000 100644 {zero} {id} A\0.taskdaemon/runs/x\0:000000 100644 {zero} {id} A\0.taskdaemonic\0"
        );
        assert_eq!(
            Staged::read(raw.as_bytes()),
            Staged {
                gitlinks: vec![OsString::from("sub"), OsString::from("deep/er")],
                records: vec![OsString::from(".taskdaemon/runs/x")],
                others: 3,
            }
        );
        assert_eq!(Staged::read(b""), Staged::default());
    }

    #[test]
    fn porcelain_paths_skip_rename_origins() {
        let out = b" M src/a.rs\0R  new.rs\0old.rs\0A  b c.txt\0";
        assert_eq!(porcelain_paths(out), vec!["b c.txt", "new.rs", "src/a.rs"]);
    }

    #[test]
    fn list_some_counts_the_rest() {
        let files: Vec<String> = (0..12).map(|i| format!("f{i:02}")).collect();
        let text = list_some(&files);
        assert!(text.starts_with("f00, f01"), "{text}");
        assert!(text.ends_with("f09 and 2 more"), "{text}");
        assert_eq!(list_some(&files[..2]), "f00, f01");
    }

    #[test]
    fn components_with_slashes_or_controls_are_refused() {
        assert!(check_component("loop name", "api").is_ok());
        for bad in ["", "a/b", "a\nb", "tab\t"] {
            let err = check_component("loop name", bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    WorktreeError::Invalid {
                        what: "loop name",
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn loop_branch_has_the_documented_shape() {
        assert_eq!(loop_branch("r1", "api"), "taskdaemon/r1/api");
    }
}
