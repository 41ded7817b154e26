//! `complete_task`: the model's signal that its task is done. It records the summary for
//! the loop engine, which ends the loop only if the loop's validation then passes.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::tool::{Tool, ToolOutput};

const TOOL: &str = "complete_task";

/// The `complete_task` tool.
pub struct CompleteTask;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    summary: String,
}

#[async_trait]
impl Tool for CompleteTask {
    fn name(&self) -> &'static str {
        TOOL
    }

    fn description(&self) -> &'static str {
        "Signal that your task is complete, with a short summary of what you did. The loop then \
         runs its validation; it completes only if validation passes, otherwise you get the \
         failures and continue. Call it only once the work is done and checked."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "summary": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What was accomplished, in a few sentences. Required, no default."
                }
            },
            "required": ["summary"],
            "additionalProperties": false
        })
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        let args: Args = args::parse(TOOL, input)?;
        let summary = args.summary.trim();
        if summary.is_empty() {
            return Err(ToolError::invalid(
                TOOL,
                "/summary",
                "the summary is blank; say in a few words what you accomplished",
            ));
        }
        ctx.mark_completed(summary);
        Ok(ToolOutput::text(
            "Completion recorded. The loop now runs its validation: it completes only if \
             validation passes; otherwise you will get the failures and continue working.",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use td_toolkit::registry::ToolSet;

    #[tokio::test]
    async fn records_the_trimmed_summary() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let out = CompleteTask
            .execute(json!({"summary": "  added the parser\n"}), &ctx)
            .await
            .unwrap();
        assert!(!out.is_error);
        assert!(out.content.contains("Completion recorded"));
        assert!(out.content.contains("only if validation passes"));
        assert!(out.effects.is_empty());
        assert_eq!(ctx.take_completion().as_deref(), Some("added the parser"));
    }

    #[tokio::test]
    async fn blank_summary_is_refused_and_nothing_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let err = CompleteTask
            .execute(json!({"summary": " \n\t"}), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("at /summary"));
        assert_eq!(ctx.take_completion(), None);
    }

    #[tokio::test]
    async fn schema_requires_a_summary() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let set = ToolSet::from_tools(vec![Arc::new(CompleteTask)]).unwrap();
        for bad in [
            json!({}),
            json!({"summary": ""}),
            json!({"summary": "x", "y": 1}),
        ] {
            let out = set.call(&ctx, None, TOOL, bad).await;
            assert!(out.is_error);
        }
        assert_eq!(ctx.take_completion(), None);
        let out = set.call(&ctx, None, TOOL, json!({"summary": "ok"})).await;
        assert!(!out.is_error);
        assert_eq!(ctx.take_completion().as_deref(), Some("ok"));
    }
}
