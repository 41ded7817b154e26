//! What every git command the daemon runs for itself gets (checkpoint commits, worktrees,
//! merges, the fresh copy of `copy-repo: true`, reading HEAD). That git is the daemon's own
//! work and runs unconfined, so nothing a loop can write may steer it into running code.

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
