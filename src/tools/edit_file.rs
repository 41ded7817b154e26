//! PLACEHOLDER: `edit_file` — to be implemented (must not land as is).

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::context::ToolContext;
use crate::error::{ToolError, ToolResult};
use crate::tools::{Tool, ToolOutput};

/// The `edit_file` tool.
pub struct EditFile;

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &'static str {
        "edit_file"
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
