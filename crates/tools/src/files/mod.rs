//! File tools: reading, writing, editing and listing files beneath the worktree.

pub mod edit_file;
pub mod list_directory;
pub mod read_file;
pub mod write_file;
