//! Tool definitions rendered for each consumer: Anthropic Messages, OpenAI Chat Completions,
//! MCP `tools/list`, and our own JSON (with catalog limits).

use serde_json::{Value, json};

use td_protocol::tool_definition::ToolDefinition;
use td_toolkit::catalog::Catalog;

/// The formats `taskdaemon tools list` can print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefinitionFormat {
    /// `{name, description, input_schema}` for the Anthropic Messages API.
    Anthropic,
    /// `{type: "function", function: {name, description, parameters}}` for OpenAI-compatible APIs.
    Openai,
    /// `{name, description, inputSchema}` as in MCP `tools/list`.
    Mcp,
    /// Ours: definition plus lane, timeout and output cap.
    Json,
}

/// Renders `defs` in `format` as a JSON array.
pub fn render(defs: &[ToolDefinition], format: DefinitionFormat, catalog: &Catalog) -> Value {
    Value::Array(
        defs.iter()
            .map(|d| render_one(d, format, catalog))
            .collect(),
    )
}

fn render_one(d: &ToolDefinition, format: DefinitionFormat, catalog: &Catalog) -> Value {
    match format {
        DefinitionFormat::Anthropic => json!({
            "name": d.name,
            "description": d.description,
            "input_schema": d.input_schema,
        }),
        DefinitionFormat::Openai => json!({
            "type": "function",
            "function": {
                "name": d.name,
                "description": d.description,
                "parameters": d.input_schema,
            }
        }),
        DefinitionFormat::Mcp => json!({
            "name": d.name,
            "description": d.description,
            "inputSchema": d.input_schema,
        }),
        DefinitionFormat::Json => {
            let spec = catalog.spec(&d.name);
            json!({
                "name": d.name,
                "description": d.description,
                "input_schema": d.input_schema,
                "lane": spec.lane.as_str(),
                "timeout_ms": spec.timeout_ms,
                "max_output_bytes": spec.max_output_bytes,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> ToolDefinition {
        ToolDefinition {
            name: "grep".into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    #[test]
    fn each_format_has_its_shape() {
        let c = Catalog::default();
        let a = render(&[def()], DefinitionFormat::Anthropic, &c);
        assert_eq!(a[0]["input_schema"]["type"], "object");
        let o = render(&[def()], DefinitionFormat::Openai, &c);
        assert_eq!(o[0]["function"]["parameters"]["type"], "object");
        assert_eq!(o[0]["type"], "function");
        let m = render(&[def()], DefinitionFormat::Mcp, &c);
        assert_eq!(m[0]["inputSchema"]["type"], "object");
        let j = render(&[def()], DefinitionFormat::Json, &c);
        assert_eq!(j[0]["lane"], "no-net");
        assert_eq!(j[0]["timeout_ms"], 60_000);
    }
}
