//! TaskDaemon runs many LLM coding loops ("Ralph loops") in parallel git worktrees.
//!
//! This crate is the top of the workspace: the `taskdaemon.yml` configuration (`config`),
//! running a whole run and its record (`run`), the outside fronts (`fronts`: `tool exec`,
//! MCP, `replay verify`) and tool definitions as the CLI prints them (`formats`). The layers
//! below live in `crates/` (see ARCHITECTURE.md for the graph and what each boundary keeps).

pub mod config;
pub mod formats;
pub mod fronts;
pub mod run;
