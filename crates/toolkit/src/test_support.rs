//! Helpers of td-toolkit's unit tests.

use std::future::Future;

use async_trait::async_trait;
use serde_json::Value;

use crate::context::ToolContext;
use crate::error::ToolResult;
use crate::tool::{Tool, ToolOutput};

/// A test tool made of its parts: a catalog name (which decides its limits and route), a
/// schema, whether it is read-only, and what a call does with its input. Tests name only
/// what their tool does, not the whole `Tool` impl.
pub(crate) struct FnTool<F> {
    pub name: &'static str,
    pub schema: Value,
    pub read_only: bool,
    pub run: F,
}

impl<F, Fut> FnTool<F>
where
    F: Fn(Value) -> Fut + Send + Sync,
    Fut: Future<Output = ToolResult<ToolOutput>> + Send,
{
    /// A tool named `name` with `schema` that runs `run`; not read-only.
    pub fn new(name: &'static str, schema: Value, run: F) -> Self {
        FnTool {
            name,
            schema,
            read_only: false,
            run,
        }
    }
}

#[async_trait]
impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(Value) -> Fut + Send + Sync,
    Fut: Future<Output = ToolResult<ToolOutput>> + Send,
{
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        "test tool"
    }
    fn input_schema(&self) -> Value {
        self.schema.clone()
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    async fn execute(&self, input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
        (self.run)(input).await
    }
}
