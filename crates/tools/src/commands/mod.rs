//! Command tools: `run_command`, `run_command_isolated`, and the configured `build`, `test` and `validate` commands.

pub mod build;
pub mod run_command;
pub mod run_command_isolated;
pub mod test;
pub mod validate;
