//! `build`: runs the loop's configured build command in the worktree root.

use async_trait::async_trait;
use serde_json::Value;

use crate::commands::launch::{configured_schema, execute_configured};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "build";

/// The `build` tool.
pub struct Build;

#[async_trait]
impl Tool for Build {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Build the project with this loop's configured build command, in the worktree root. \
         Takes no command. The result says \"build passed\" or \"build failed (exit code N)\", \
         then the command's stdout and stderr (long output keeps its beginning and end, where \
         the errors usually are). If no build command is configured, use run_command."
    }

    fn input_schema(&self) -> Value {
        configured_schema(NAME)
    }

    fn enforces_own_timeout(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        execute_configured(NAME, "build", ctx.commands().build.as_deref(), input, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::test_support::with_command;
    use td_toolkit::receipts::SideEffect;

    fn ctx_with(dir: &std::path::Path, command: Option<&str>) -> ToolContext {
        with_command(dir, NAME, command)
    }

    #[tokio::test]
    async fn passes_in_the_worktree_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Makefile.txt"), "x").unwrap();
        let ctx = ctx_with(dir.path(), Some("ls; echo warn >&2"));
        let out = Build.execute(json!({}), &ctx).await.unwrap();
        assert_eq!(
            out.content,
            "build passed\ncommand: ls; echo warn >&2\n--- stdout ---\nMakefile.txt\n--- stderr ---\nwarn\n"
        );
        assert!(!out.is_error);
        assert_eq!(
            out.effects,
            vec![SideEffect::CommandRun {
                command: "ls; echo warn >&2".into(),
                exit_code: Some(0),
                timed_out: false
            }]
        );
    }

    #[tokio::test]
    async fn failure_reports_the_exit_code_and_the_error_text() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_with(
            dir.path(),
            Some("echo 'error[E0308]: mismatched types' >&2; exit 101"),
        );
        let out = Build.execute(json!({}), &ctx).await.unwrap();
        assert!(out.is_error);
        assert!(
            out.content.starts_with("build failed (exit code 101)\n"),
            "{}",
            out.content
        );
        assert!(
            out.content
                .ends_with("--- stderr ---\nerror[E0308]: mismatched types\n")
        );
    }

    #[tokio::test]
    async fn timeout_kills_and_says_how_to_give_more_time() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_with(dir.path(), Some("sleep 30"));
        let out = Build
            .execute(json!({"timeout_ms": 200}), &ctx)
            .await
            .unwrap();
        assert!(out.is_error);
        assert_eq!(
            out.content,
            "build timed out after 200 ms, process group killed. Pass a larger timeout_ms (at most 600000) if it needs longer.\ncommand: sleep 30\n(no output)\n"
        );
    }

    #[tokio::test]
    async fn timeout_above_the_catalog_max_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_with(dir.path(), Some("true"));
        let err = Build
            .execute(json!({"timeout_ms": 600_001}), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("maximum of 600000 ms"), "{err}");
    }

    #[tokio::test]
    async fn unconfigured_build_points_to_run_command() {
        let dir = tempfile::tempdir().unwrap();
        for cmd in [None, Some("  ")] {
            let err = Build
                .execute(json!({}), &ctx_with(dir.path(), cmd))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), "unavailable");
            let text = err.to_string();
            assert!(
                text.contains("no build command is configured for this loop"),
                "{text}"
            );
            assert!(text.contains("use run_command"), "{text}");
        }
    }

    #[test]
    fn schema_and_catalog_limits() {
        let schema = Build.input_schema();
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["properties"]["timeout_ms"]["minimum"], json!(1));
        assert!(
            schema["properties"]["timeout_ms"]["description"]
                .as_str()
                .unwrap()
                .contains("600000")
        );
        let dir = tempfile::tempdir().unwrap();
        let ctx = ctx_with(dir.path(), None);
        assert_eq!(
            ctx.spec(NAME).lane,
            td_toolkit::catalog::Route::Lane(td_toolkit::catalog::Lane::Heavy)
        );
        assert!(Build.enforces_own_timeout());
    }
}
