//! What a tool is: the `Tool` trait and what a call returns. The built-in tools themselves
//! live in `td_tools`, one per file; tools know nothing about actors or providers.

use async_trait::async_trait;
use serde_json::Value;

use crate::context::ToolContext;
use crate::error::ToolResult;
use crate::receipts::SideEffect;

/// What [`Tool::execute_borrowed`] returns (re-exported so that tools need no other crate).
pub use futures::future::BoxFuture;

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

    /// Runs the call on a borrowed input, which the registry keeps for the call's receipt:
    /// what the registry calls. By default the input is copied for [`Tool::execute`]; a tool
    /// that only reads a few fields (the coordination tools) takes them from the borrowed
    /// input instead, which spares a copy of the whole value on every call.
    fn execute_borrowed<'a>(
        &'a self,
        input: &'a Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, ToolResult<ToolOutput>> {
        self.execute(input.clone(), ctx)
    }
}
