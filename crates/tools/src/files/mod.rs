//! File tools: reading, writing, editing and listing files beneath the worktree; one tool
//! per file, and what they share in `access` (opening files, their errors), `lines` and `size`.

pub(crate) mod access;
pub mod edit_file;
pub(crate) mod lines;
pub mod list_directory;
pub mod read_file;
pub(crate) mod size;
pub mod write_file;

use serde_json::{Value, json};

/// How the file tools describe a `path` that names one file.
const FILE_PATH: &str = "Path of the file, relative to the worktree root (required).";

/// Schema of a file tool's `path` property (a worktree-relative path), described by
/// `description`.
fn path_schema(description: &str) -> Value {
    json!({"type": "string", "description": description})
}
