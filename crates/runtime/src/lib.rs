//! The actor runtime (ractor): one actor per file (and `reply_slot`, which a lane pool and
//! its workers share). See ARCHITECTURE.md for the tree.

pub mod coordinator;
pub mod daemon;
pub mod lane_queue;
pub mod loop_actor;
pub mod messages;
mod reply_slot;
pub mod tool_lanes;
pub mod tool_worker;
pub mod watcher;
