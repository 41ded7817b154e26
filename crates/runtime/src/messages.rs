//! Messages that cross actor boundaries and are shared by several actors (the data they
//! carry, such as inbox items, lives in `td_protocol`).

use std::path::PathBuf;

/// Messages a loop actor handles.
pub enum LoopMsg {
    /// A file under the loop's worktree changed on disk (from the watcher).
    FileChanged(PathBuf),
    /// Stop after the tool call in flight.
    Stop,
    /// Stop now: the tool calls (or the validation) in flight are cancelled, a running
    /// command's process group killed; the loop ends as stopped with its iterations counted
    /// and its actor kept (it still answers queries), unlike a forced stop of the actor.
    StopNow,
    /// Internal: the iteration task finished.
    EngineDone(td_engine::LoopEnd),
    /// Internal: the iteration task panicked (the panic's message). The actor fails with it,
    /// so that the daemon restarts the loop as for a panic in the actor itself.
    EnginePanicked(String),
}

// Local only: never sent to another node (ractor's `cluster` feature needs the impl said).
impl ractor::Message for LoopMsg {}
