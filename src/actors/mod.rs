//! The actor runtime (ractor): one actor per file. See ARCHITECTURE.md for the tree.

pub mod coordinator;
pub mod loop_actor;
pub mod messages;
pub mod watcher;
