//! `run_command_isolated`: `run_command` without network — the command runs in a fresh
//! network namespace whose only interface is a loopback that is down.

use async_trait::async_trait;
use serde_json::Value;

use crate::commands::launch::{command_schema, execute_command};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "run_command_isolated";

/// The `run_command_isolated` tool.
pub struct RunCommandIsolated;

#[async_trait]
impl Tool for RunCommandIsolated {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Run a shell command (`sh -c`) in the worktree with NO network access (not even \
         localhost): for builds, tests and scripts that must not download or call anything. \
         Otherwise like run_command: empty stdin, everything the command starts is killed \
         when it ends or times out, and the result starts with the exit code, then stdout and \
         stderr (long output keeps its beginning and end). Fails with a clear error where the \
         machine cannot isolate the network; use run_command then if network is acceptable."
    }

    fn input_schema(&self) -> Value {
        command_schema(NAME)
    }

    fn enforces_own_timeout(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        execute_command(NAME, input, ctx, true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // That the command gets a network namespace of its own with only a loopback (or a
    // clear refusal where the machine cannot make one) is checked through the tool set in
    // tests/commands.rs (`isolated_command_has_no_network`), beside `run_command` sharing ours.

    #[tokio::test]
    async fn shares_run_command_arguments_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(dir.path(), "t").unwrap();
        let err = RunCommandIsolated
            .execute(json!({"command": "true", "cwd": "/"}), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation");
        let err = RunCommandIsolated
            .execute(json!({"command": "true", "timeout_ms": 120_001}), &ctx)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("maximum of 120000 ms"), "{err}");
        assert_eq!(
            RunCommandIsolated.input_schema()["properties"]["timeout_ms"]["description"],
            crate::commands::launch::timeout_property(NAME)["description"]
        );
        assert!(RunCommandIsolated.enforces_own_timeout());
        assert_eq!(
            ctx.spec(NAME).lane,
            td_toolkit::catalog::Route::Lane(td_toolkit::catalog::Lane::NoNet)
        );
    }
}
