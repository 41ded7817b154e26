//! File tools: reading, writing, editing and listing files beneath the worktree; one tool
//! per file, and what they share in `access` (opening files, their errors), `lines` and `size`.

pub(crate) mod access;
pub mod edit_file;
pub(crate) mod lines;
pub mod list_directory;
pub mod read_file;
pub(crate) mod size;
pub mod write_file;
