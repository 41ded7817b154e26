//! `test`: runs the loop's configured test command in the worktree root.

use async_trait::async_trait;
use serde_json::Value;

use crate::commands::launch::{configured_schema, execute_configured};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "test";

/// The `test` tool.
pub struct Test;

#[async_trait]
impl Tool for Test {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Run the project's tests with this loop's configured test command, in the worktree \
         root. Takes no command. The result says \"tests passed\" or \"tests failed (exit code \
         N)\", then the command's stdout and stderr (long output keeps its beginning and end, \
         where the failures are usually summarised). If no test command is configured, use \
         run_command."
    }

    fn input_schema(&self) -> Value {
        configured_schema(NAME)
    }

    fn enforces_own_timeout(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        execute_configured(NAME, "tests", ctx.commands().test.as_deref(), input, ctx).await
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
    async fn runs_the_test_command() {
        let dir = tempfile::tempdir().unwrap();
        let ok = Test
            .execute(json!({}), &ctx_with(dir.path(), Some("echo 3 passed")))
            .await
            .unwrap();
        assert_eq!(
            ok.content,
            "tests passed\ncommand: echo 3 passed\n--- stdout ---\n3 passed\n"
        );
        let failed = Test
            .execute(
                json!({"timeout_ms": 10_000}),
                &ctx_with(dir.path(), Some("echo '1 failed'; exit 1")),
            )
            .await
            .unwrap();
        assert!(failed.is_error);
        assert!(failed.content.starts_with("tests failed (exit code 1)\n"));
    }

    #[tokio::test]
    async fn unconfigured_or_too_long_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = Test
            .execute(json!({}), &ctx_with(dir.path(), None))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "unavailable");
        assert!(err.to_string().contains("no test command is configured"));
        let err = Test
            .execute(
                json!({"timeout_ms": 600_001}),
                &ctx_with(dir.path(), Some("true")),
            )
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("maximum of 600000 ms for test"),
            "{err}"
        );
    }
}
