//! A run of loops: the orchestrator behind `taskdaemon run` (its git worktrees are `td_git`), its on-disk
//! record, the live progress display, and the commands that read a record back.

pub mod artifacts;
pub mod compiler_cache;
pub mod conflict_watch;
pub mod control;
pub mod handover;
pub mod hosts;
pub mod merge_cmd;
pub mod merge_queue;
pub mod orchestrator;
pub mod owner;
pub mod progress;
pub mod rebuild;
pub mod record;
pub mod resume;
pub mod session_receipts;
pub mod signals;
pub mod status;
pub mod summary_file;
pub mod warm;
