//! PLACEHOLDER: `web_fetch` — to be implemented (must not land as is).

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::context::ToolContext;
use crate::error::{ToolError, ToolResult};
use crate::tools::{Tool, ToolOutput};

/// The `web_fetch` tool.
pub struct WebFetch;

#[async_trait]
impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        "web_fetch"
    }

    fn description(&self) -> &'static str {
        "PLACEHOLDER"
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }

    async fn execute(&self, _input: Value, _ctx: &ToolContext) -> ToolResult<ToolOutput> {
        Err(ToolError::Unavailable {
            message: "PLACEHOLDER not implemented".into(),
        })
    }
}
