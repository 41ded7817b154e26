//! Everything a tool needs and the one path every call takes: the path sandbox and the
//! race-free file access beneath a worktree (`sandbox`, `worktree_fs`), a loop's
//! `ToolContext` (`context`) with its read tracking (`read_tracking`, `stamp`,
//! `read_index`), the `Tool` trait, the tool registry (`ToolSet::call`: schema, timeout,
//! panic guard, cap, receipt), the call path of callers that keep receipts (`call_path`:
//! route, run, receipt saved), receipts, the catalog of limits and routes, web access policy
//! and the coordination port. Knows no actor, provider or concrete tool (those are in
//! `td_tools`).

pub mod args;
pub mod artifact_files;
pub mod call_path;
pub mod catalog;
pub mod context;
pub mod coordination;
pub mod error;
pub mod quick_schema;
pub mod read_index;
pub mod read_tracking;
pub mod receipts;
pub mod registry;
pub mod sandbox;
pub mod stamp;
#[cfg(test)]
mod test_support;
pub mod tool;
pub mod web_access;
pub mod worktree_fs;
