//! What models are shown of a tool.

use serde::Serialize;
use serde_json::Value;

/// Name, description and input schema of a tool, as shown to models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDefinition {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: Value,
}
