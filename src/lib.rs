//! TaskDaemon runs many LLM coding loops ("Ralph loops") in parallel git worktrees.
//!
//! Layers, from the bottom: `sandbox`/`text`/`process` (pure helpers), `tools` (one tool per
//! file, knowing nothing of actors or providers), `registry` (the single call path with
//! validation, limits and receipts), and the fronts in `fronts` (`tool exec`, MCP, replay).
//! See ARCHITECTURE.md for the boundaries and invariants.

pub mod actors;
pub mod catalog;
pub mod config;
pub mod confine;
pub mod context;
pub mod coordination;
pub mod daemon_git;
pub mod engine;
pub mod error;
pub mod events;
pub mod formats;
pub mod fronts;
pub mod lang;
pub mod llm;
pub mod process;
pub mod receipts;
pub mod record_io;
pub mod registry;
pub mod run;
pub mod sandbox;
pub mod secrets;
pub mod shown_path;
pub mod suggest;
pub mod text;
pub mod tools;
pub mod web_access;
pub mod worktree_fs;
