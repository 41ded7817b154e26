pub mod worktree;
