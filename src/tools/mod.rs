//! The tools a loop's model can call: the `Tool` trait, what a call returns, and the list of
//! built-in tools. One tool per file; tools know nothing about actors or providers.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::context::ToolContext;
use crate::error::ToolResult;
use crate::receipts::SideEffect;

pub mod args;
pub mod artifacts;

pub mod broadcast_alert;
pub mod build;
pub mod complete_task;
pub mod create_phase;
pub mod create_plan;
pub mod create_spec;
pub mod edit_file;
pub mod glob;
pub mod grep;
pub mod list_directory;
pub mod list_loops;
pub mod query_loop;
pub mod read_file;
pub mod run_command;
pub mod run_command_isolated;
pub mod share_data;
pub mod symbols;
pub mod test;
#[cfg(test)]
pub(crate) mod test_support;
pub mod validate;
pub mod walk;
pub mod walk_ignores;
pub mod web_fetch;
pub mod web_search;
pub mod write_file;

/// What a successful call returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    /// Text for the model (the registry caps it; receipts hash it in full).
    pub content: String,
    /// True when the call ran but failed in a way the model must see as an error
    /// (e.g. a command that exited non-zero).
    pub is_error: bool,
    /// Files written and commands run, for the receipt.
    pub effects: Vec<SideEffect>,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            ..Self::default()
        }
    }

    /// Adds a side effect.
    pub fn with_effect(mut self, effect: SideEffect) -> Self {
        self.effects.push(effect);
        self
    }
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &'static str;

    /// What it does, for the model.
    fn description(&self) -> &'static str;

    /// JSON Schema of its input object.
    fn input_schema(&self) -> Value;

    /// True when the tool never changes the worktree or the outside world, so calls may run
    /// concurrently with other read-only calls.
    fn read_only(&self) -> bool {
        false
    }

    /// True when the tool enforces its catalog timeout itself (commands must kill their
    /// process group rather than be dropped); the registry then only keeps a late watchdog.
    fn enforces_own_timeout(&self) -> bool {
        false
    }

    /// Runs the call. `input` has already been validated against `input_schema`.
    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput>;
}

/// Every built-in tool, in a stable order.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(read_file::ReadFile),
        Arc::new(write_file::WriteFile),
        Arc::new(edit_file::EditFile),
        Arc::new(list_directory::ListDirectory),
        Arc::new(glob::Glob),
        Arc::new(grep::Grep),
        Arc::new(symbols::Symbols),
        Arc::new(run_command::RunCommand),
        Arc::new(run_command_isolated::RunCommandIsolated),
        Arc::new(build::Build),
        Arc::new(test::Test),
        Arc::new(validate::Validate),
        Arc::new(web_fetch::WebFetch),
        Arc::new(web_search::WebSearch),
        Arc::new(complete_task::CompleteTask),
        Arc::new(create_plan::CreatePlan),
        Arc::new(create_spec::CreateSpec),
        Arc::new(create_phase::CreatePhase),
        Arc::new(query_loop::QueryLoop),
        Arc::new(share_data::ShareData),
        Arc::new(broadcast_alert::BroadcastAlert),
        Arc::new(list_loops::ListLoops),
    ]
}
