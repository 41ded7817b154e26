//! A run of loops: its on-disk record and the commands that read it back.

pub mod orchestrator;
pub mod progress;
pub mod record;
pub mod status;
pub mod worktree;
