//! `run_command`: runs a shell command in the worktree (network allowed). What it shares
//! with the other command tools is in `commands::launch`.

use async_trait::async_trait;
use serde_json::Value;

use crate::commands::launch::{command_schema, execute_command};
use td_toolkit::context::ToolContext;
use td_toolkit::error::ToolResult;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "run_command";

/// The `run_command` tool.
pub struct RunCommand;

#[async_trait]
impl Tool for RunCommand {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Run a shell command (`sh -c`) in the worktree, with network access. Use it for git, \
         compilers, package managers and anything else without a dedicated tool. stdin is \
         empty (nothing interactive works); the command and everything it starts are killed \
         when it ends or times out, so don't leave servers running in the background. The \
         result starts with the exit code, then stdout and stderr; long output keeps its \
         beginning and end. Use run_command_isolated when the command needs no network."
    }

    fn input_schema(&self) -> Value {
        command_schema(NAME)
    }

    fn enforces_own_timeout(&self) -> bool {
        true
    }

    async fn execute(&self, input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        execute_command(NAME, input, ctx, false).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::Path;

    use serde_json::json;

    use crate::test_support::with_limits;
    use td_toolkit::catalog::ToolSpecOverride;
    use td_toolkit::receipts::SideEffect;

    fn ctx(dir: &Path) -> ToolContext {
        ToolContext::new(dir, "test").unwrap()
    }

    /// A context whose run_command limits are `timeout_ms` and `max_output_bytes`.
    fn ctx_with_limits(dir: &Path, timeout_ms: u64, max_output_bytes: usize) -> ToolContext {
        let limits = ToolSpecOverride {
            timeout_ms: Some(timeout_ms),
            max_output_bytes: Some(max_output_bytes),
            lane: None,
        };
        with_limits(dir, NAME, limits)
    }

    async fn run(input: Value, ctx: &ToolContext) -> ToolResult<ToolOutput> {
        RunCommand.execute(input, ctx).await
    }

    #[tokio::test]
    async fn success_shows_exit_code_and_stdout_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(json!({"command": "echo hello"}), &ctx(dir.path()))
            .await
            .unwrap();
        assert_eq!(out.content, "exit code: 0\n--- stdout ---\nhello\n");
        assert!(!out.is_error);
        assert_eq!(
            out.effects,
            vec![SideEffect::CommandRun {
                command: "echo hello".into(),
                exit_code: Some(0),
                timed_out: false
            }]
        );
    }

    #[tokio::test]
    async fn nonzero_exit_is_an_error_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(
            json!({"command": "printf oops >&2; exit 7"}),
            &ctx(dir.path()),
        )
        .await
        .unwrap();
        assert_eq!(out.content, "exit code: 7\n--- stderr ---\noops\n");
        assert!(out.is_error);
    }

    #[tokio::test]
    async fn no_output_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(json!({"command": "true"}), &ctx(dir.path()))
            .await
            .unwrap();
        assert_eq!(out.content, "exit code: 0\n(no output)\n");
    }

    #[tokio::test]
    async fn signal_death_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(json!({"command": "kill -TERM $$"}), &ctx(dir.path()))
            .await
            .unwrap();
        assert_eq!(out.content, "killed by signal 15\n(no output)\n");
        assert!(out.is_error);
    }

    #[tokio::test]
    async fn cwd_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        let c = ctx(dir.path());
        let out = run(
            json!({"command": "pwd; echo $TASKDAEMON_WORKTREE $TASKDAEMON_EXEC_ID", "cwd": "a/b"}),
            &c,
        )
        .await
        .unwrap();
        let root = c.root().display().to_string();
        assert_eq!(
            out.content,
            format!("exit code: 0\n--- stdout ---\n{root}/a/b\n{root} test\n")
        );
    }

    #[tokio::test]
    async fn timeout_kills_and_is_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let out = run(
            json!({"command": "echo start; sleep 30", "timeout_ms": 300}),
            &c,
        )
        .await
        .unwrap();
        assert!(out.is_error);
        assert_eq!(
            out.content,
            "timed out after 300 ms, process group killed. Pass a larger timeout_ms (at most 120000) or run less at once.\n--- stdout ---\nstart\n"
        );
        assert_eq!(
            out.effects,
            vec![SideEffect::CommandRun {
                command: "echo start; sleep 30".into(),
                exit_code: None,
                timed_out: true
            }]
        );
    }

    #[tokio::test]
    async fn timeout_above_the_catalog_limit_is_refused_with_the_max() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx_with_limits(dir.path(), 5_000, 100_000);
        let err = run(json!({"command": "true", "timeout_ms": 5_001}), &c)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        assert!(err.to_string().contains("maximum of 5000 ms"), "{err}");
        let err = run(json!({"command": "true", "timeout_ms": 0}), &c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
        // u64::MAX passes the schema and must not overflow anything.
        let err = run(json!({"command": "true", "timeout_ms": u64::MAX}), &c)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "invalid_arguments");
        let ok = run(json!({"command": "true", "timeout_ms": 5_000}), &c)
            .await
            .unwrap();
        assert!(!ok.is_error);
    }

    #[tokio::test]
    async fn default_timeout_is_the_catalog_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx_with_limits(dir.path(), 300, 100_000);
        let out = run(json!({"command": "sleep 30"}), &c).await.unwrap();
        assert!(
            out.content.starts_with("timed out after 300 ms"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn cwd_must_exist_be_a_directory_and_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file.txt"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("escape")).unwrap();
        let c = ctx(dir.path());
        let cases = [
            ("missing", "not_found"),
            ("file.txt", "invalid_arguments"),
            ("../", "sandbox_violation"),
            ("escape", "sandbox_violation"),
            ("escape/", "sandbox_violation"),
        ];
        for (cwd, kind) in cases {
            let err = run(json!({"command": "touch ran", "cwd": cwd}), &c)
                .await
                .unwrap_err();
            assert_eq!(err.kind(), kind, "cwd {cwd}: {err}");
        }
        let abs = outside.path().display().to_string();
        let err = run(json!({"command": "touch ran", "cwd": abs}), &c)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), "sandbox_violation");
        assert!(!outside.path().join("ran").exists());
        assert!(!dir.path().join("ran").exists());
    }

    #[tokio::test]
    async fn empty_or_nul_commands_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        for cmd in ["  ", "echo a\0b"] {
            let err = run(json!({"command": cmd}), &c).await.unwrap_err();
            assert_eq!(err.kind(), "invalid_arguments", "{cmd:?}");
            assert!(err.to_string().contains("/command"), "{err}");
        }
    }

    #[tokio::test]
    async fn long_output_keeps_head_and_tail_within_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx_with_limits(dir.path(), 10_000, 2_000);
        let out = run(
            json!({"command": "echo FIRST; seq 1 100000; echo 'error: the real problem' >&2"}),
            &c,
        )
        .await
        .unwrap();
        assert!(out.content.len() <= 2_000, "{}", out.content.len());
        assert!(out.content.starts_with(
            "exit code: 0\n--- stdout (588901 bytes in all; the middle is omitted) ---\nFIRST\n1\n"
        ));
        assert!(out.content.contains("bytes omitted ...]"));
        assert!(
            out.content
                .ends_with("100000\n--- stderr ---\nerror: the real problem\n"),
            "{}",
            out.content
        );
    }

    #[tokio::test]
    async fn the_cut_never_splits_a_character() {
        let dir = tempfile::tempdir().unwrap();
        // 1001 bytes per stream: a 500-byte head and a 501-byte tail, so at least one cut
        // lands inside a 2-, 3- or 4-byte character.
        let c = ctx_with_limits(dir.path(), 10_000, 2_514);
        for ch in ["é", "€", "😀"] {
            let out = run(
                json!({"command": format!("for i in $(seq 1 3000); do printf '{ch}'; done")}),
                &c,
            )
            .await
            .unwrap();
            assert!(!out.content.contains('\u{FFFD}'), "{ch}: {}", out.content);
            assert!(out.content.contains(&ch.repeat(100)));
            assert!(out.content.contains("bytes omitted"));
        }
    }

    #[test]
    fn schema_documents_defaults_and_forbids_extras() {
        let schema = RunCommand.input_schema();
        assert_eq!(schema["additionalProperties"], json!(false));
        for (name, prop) in schema["properties"].as_object().unwrap() {
            let d = prop["description"].as_str().unwrap();
            assert!(d.contains("efault"), "{name}: {d}");
        }
        assert!(
            schema["properties"]["timeout_ms"]["description"]
                .as_str()
                .unwrap()
                .contains("120000")
        );
        assert!(RunCommand.enforces_own_timeout());
        assert!(!RunCommand.read_only());
    }
}
