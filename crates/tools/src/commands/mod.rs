//! Command tools: `run_command`, `run_command_isolated`, and the configured `build`, `test` and
//! `validate` commands; one tool per file, and what they share in `launch`.

pub mod build;
pub(crate) mod launch;
pub mod run_command;
pub mod run_command_isolated;
pub mod test;
pub mod validate;
