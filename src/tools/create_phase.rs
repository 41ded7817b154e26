//! PLACEHOLDER: `create_phase` — to be implemented (must not land as is).

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::context::ToolContext;
use crate::error::{ToolError, ToolResult};
use crate::tools::{Tool, ToolOutput};

/// The `create_phase` tool.
pub struct CreatePhase;

#[async_trait]
impl Tool for CreatePhase {
    fn name(&self) -> &'static str {
        "create_phase"
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
