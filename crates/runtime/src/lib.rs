//! The actor runtime (ractor): one actor per file (and `reply_slot`, which a lane pool and
//! its workers share; `routed_query`, a query the coordinator accepted; `remote_loop`,
//! `upstream` and `coordinator_handle`, which connect the coordinator to loops of other
//! processes). See ARCHITECTURE.md for the tree.

pub mod coordinator;
pub mod coordinator_handle;
pub mod daemon;
pub mod lane_queue;
pub mod loop_actor;
pub mod messages;
pub mod remote_loop;
mod reply_slot;
pub mod routed_query;
pub mod tool_lanes;
pub mod tool_worker;
pub mod upstream;
pub mod watcher;
