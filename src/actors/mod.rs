//! The actor runtime (ractor): one actor per file. See ARCHITECTURE.md for the tree.

pub mod messages;
pub mod tool_lanes;
pub mod tool_worker;
