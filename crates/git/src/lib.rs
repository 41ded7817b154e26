//! Git as the daemon runs it for itself (never for a loop's model): worktrees, commits, integration,
//! merges, HEAD lookup, and commits moved to and from worker hosts as bundles (`transfer`), every
//! command without hooks (`daemon_git`).

pub mod attributes;
pub mod daemon_git;
pub mod fresh_copy;
pub mod head;
pub mod integrate;
pub mod merge_tree;
pub mod seed;
#[cfg(test)]
mod test_support;
pub mod transfer;
pub mod worktree;
