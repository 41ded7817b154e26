//! Git as the daemon runs it for itself (never for a loop's model): worktrees, commits, integration,
//! merges and HEAD lookup, every command without hooks (`daemon_git`).

pub mod daemon_git;
pub mod fresh_copy;
pub mod head;
pub mod integrate;
pub mod merge_tree;
pub mod seed;
#[cfg(test)]
mod test_support;
pub mod worktree;
