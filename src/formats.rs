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
        // The providers' shapes are td-llm's: what is printed is what a request sends.
        DefinitionFormat::Anthropic => td_llm::anthropic::tool_json(d),
        DefinitionFormat::Openai => td_llm::openai::tool_json(d),
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

    /// What `tools list` prints for a provider is what that provider's requests send.
    #[test]
    fn provider_formats_are_what_requests_send() {
        use std::sync::Arc;
        use td_llm::endpoint::EndpointSettings;
        use td_llm::http::{ApiKey, HttpSettings};
        use td_llm::{LlmRequest, Purpose, anthropic, openai};

        let defs = vec![
            def(),
            ToolDefinition {
                name: "other".into(),
                description: "e".into(),
                input_schema: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            },
        ];
        let request = LlmRequest {
            loop_name: "l".into(),
            purpose: Purpose::Iteration,
            system: String::new(),
            messages: Vec::new(),
            tools: defs.clone().into(),
        };
        let key = ApiKey::new("sk-formats-test", "test").unwrap();
        let permits = || Arc::new(tokio::sync::Semaphore::new(1));
        let sent = anthropic::AnthropicClient::new(
            anthropic::AnthropicSettings {
                endpoint: EndpointSettings::new("http://127.0.0.1:9", "m"),
                max_tokens: 1,
                api_key: key.clone(),
            },
            HttpSettings::default(),
            permits(),
        )
        .unwrap()
        // The prompt-cache breakpoint on the last tool marks the request, not the
        // definition: compared without it.
        .with_prompt_cache(false)
        .request_body(&request);
        let c = Catalog::default();
        assert_eq!(
            sent["tools"],
            render(&defs, DefinitionFormat::Anthropic, &c)
        );
        let sent = openai::OpenAiClient::new(
            openai::OpenAiSettings {
                endpoint: EndpointSettings::new("http://127.0.0.1:9", "m"),
                max_tokens: None,
                api_key: Some(key),
            },
            HttpSettings::default(),
            permits(),
        )
        .unwrap()
        .request_body(&request);
        assert_eq!(sent["tools"], render(&defs, DefinitionFormat::Openai, &c));
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
