//! `validate`: runs the loop's configured validation command in the worktree root — the
//! same command the loop's own validation step runs, so the model can check before it
//! declares the task complete.

use async_trait::async_trait;
use serde_json::Value;

use crate::commands::launch::{configured_schema, execute_configured};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "validate";

/// The `validate` tool.
pub struct Validate;

#[async_trait]
impl Tool for Validate {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Run this loop's validation command (the check that decides whether the task is done) \
         in the worktree root. Takes no command. The result says \"validation passed\" or \
         \"validation failed (exit code N)\", then the command's stdout and stderr (long output \
         keeps its beginning and end). If no validation command is configured, use run_command."
    }

    fn input_schema(&self) -> Value {
        configured_schema(NAME)
    }

    fn enforces_own_timeout(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        execute_configured(
            NAME,
            "validation",
            ctx.commands().validate.as_deref(),
            input,
            ctx,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::test_support::with_command;

    fn ctx_with(dir: &std::path::Path, command: Option<&str>) -> ToolContext {
        with_command(dir, NAME, command)
    }

    #[tokio::test]
    async fn runs_the_validation_command() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Validate
            .execute(json!({}), &ctx_with(dir.path(), Some("echo all good")))
            .await
            .unwrap();
        assert_eq!(
            ok.content,
            "validation passed\ncommand: echo all good\n--- stdout ---\nall good\n"
        );
        let failed = Validate
            .execute(
                json!({"timeout_ms": 100}),
                &ctx_with(dir.path(), Some("sleep 5")),
            )
            .await
            .unwrap();
        assert!(failed.is_error);
        assert!(
            failed
                .content
                .starts_with("validation timed out after 100 ms"),
            "{}",
            failed.content
        );
    }

    #[tokio::test]
    async fn unconfigured_validation_points_to_run_command() {
        let dir = tempfile::tempdir().unwrap();
        let err = Validate
            .execute(json!({}), &ctx_with(dir.path(), None))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        assert!(
            err.to_string()
                .contains("no validate command is configured")
        );
        assert!(err.to_string().contains("use run_command"));
    }
}
