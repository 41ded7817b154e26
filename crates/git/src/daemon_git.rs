//! What every git command the daemon runs for itself gets (checkpoint commits, worktrees,
//! merges, the fresh copy of `copy-repo: true`, reading HEAD). That git is the daemon's own
//! work and runs unconfined, so nothing a loop can write (hooks, attributes, a nested
//! repository's config) may steer it into running code.

use std::path::Path;
use std::process::Stdio;

/// Arguments that turn off every hook for one git command. Hooks commonly run scripts from
/// the worktree (husky, pre-commit), which a loop controls; `--no-verify` skips only
/// `pre-commit` and `commit-msg`, while `prepare-commit-msg`, `post-commit`,
/// `reference-transaction`, `post-checkout`, `post-merge`, `pre-merge-commit` and others
/// still run. `-c` wins over every config file (the repository's and the user's
/// `core.hooksPath` included) and reaches the git processes git starts itself
/// (`GIT_CONFIG_PARAMETERS`).
///
/// Why `/dev/null`: it is not a directory, so `/dev/null/<hook>` never exists (git looks
/// for the hook with `access(X_OK)` and gets `ENOTDIR`), and nobody without `CAP_MKNOD` (no
/// confined command) can make it one; no directory has to be made, kept empty and removed.
/// Checked with git 2.39 and 2.47 (`tests/daemon_git_hooks.rs` runs every git on the
/// machine).
pub const NO_HOOKS: [&str; 2] = ["-c", "core.hooksPath=/dev/null"];

/// Arguments that keep git-lfs from fetching anything for the daemon's git, while its smudge
/// still fills a checkout from the objects the repository has (its LFS storage: the
/// user's own, and what the clean filter stored for loops' commits). Unpinned, a smudge of
/// an object the repository lacks fetches it from the URL in the checkout's `.lfsconfig`,
/// which a loop can write, with the user's credentials and outside every sandbox. `lfs.url`
/// given with `-c` wins over `.lfsconfig` and over every remote's URL, and reaches git-lfs
/// through `GIT_CONFIG_PARAMETERS`; a `file://` URL is served by git-lfs's own standalone
/// transfer, which reads a local repository: no network, no credential helper, no program
/// of a config. Why `/dev/null/…`: as for [`NO_HOOKS`], no one can make that path exist.
/// Checked with git-lfs 3.3 under git 2.39 and 2.47 (`tests/daemon_git_lfs.rs`).
pub const NO_LFS_FETCH: [&str; 2] = [
    "-c",
    "lfs.url=file:///dev/null/taskdaemon-fetches-no-lfs-object",
];

/// Environment variables removed from every git command the daemon runs for a repository it
/// names: each would make git act on another repository, index or identity (a daemon
/// started from a git hook inherits them).
pub const SCRUBBED_ENV: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
];

/// A `git` command run in `dir` with everything the daemon's own git gets; the caller adds
/// the subcommand and its arguments, and how stdout and stderr are taken.
///
/// - no hooks ([`NO_HOOKS`]); no fsmonitor, and nested repositories (gitlinks) are not
///   entered by status or diff: a loop's commands may create a nested repository in its
///   worktree, and its config must not run anything when the daemon's unconfined git looks
///   into it (`-c` reaches git's child processes too, through `GIT_CONFIG_PARAMETERS`);
/// - no `.gitattributes` read but the user's, or below git 2.42 no driver run but git-lfs's
///   ([`crate::attributes`]): a loop writes them, and they choose programs git runs;
/// - git-lfs fetches nothing ([`NO_LFS_FETCH`]): its smudge fills checkouts from the
///   repository's own LFS objects, and leaves a pointer where the object is missing;
/// - stdin closed, no terminal prompt, a no-op editor;
/// - its own process group: a Ctrl-C at the terminal goes to the foreground group, and must
///   reach the daemon (which stops cleanly), never a git halfway through;
/// - none of [`SCRUBBED_ENV`].
///
/// Blocking: the first time for each directory, its object format is read from the
/// repository's files or asked of git (git 2.42 and newer); older git's config is asked for
/// its drivers at most once a second per directory; off the async workers.
pub fn command(dir: &Path) -> std::process::Command {
    let mut cmd = unguarded(dir);
    crate::attributes::guard(&mut cmd, dir);
    cmd
}

/// [`command`] without the attributes guard: for the questions the guard itself asks of git
/// (which read no attributes).
pub(crate) fn unguarded(dir: &Path) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("git");
    cmd.args([
        "-c",
        "core.fsmonitor=false",
        "-c",
        "diff.ignoreSubmodules=all",
    ])
    .args(NO_HOOKS)
    .current_dir(dir)
    .stdin(Stdio::null())
    .env("GIT_TERMINAL_PROMPT", "0")
    .env("GIT_EDITOR", "true")
    .args(NO_LFS_FETCH)
    // A missing LFS object (the pinned URL above fails at once) leaves its pointer in the
    // checkout instead of failing the whole checkout.
    .env("GIT_LFS_SKIP_DOWNLOAD_ERRORS", "1")
    .process_group(0);
    for key in SCRUBBED_ENV {
        cmd.env_remove(key);
    }
    cmd
}
