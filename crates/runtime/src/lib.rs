//! The actor runtime (ractor): one actor per file. See ARCHITECTURE.md for the tree.

pub mod coordinator;
pub mod daemon;
pub mod loop_actor;
pub mod messages;
pub mod tool_lanes;
pub mod tool_worker;
pub mod watcher;
