//! `run_command`: runs a shell command in the worktree (network allowed).
//!
//! This file also holds the plumbing every command tool shares (`run_command_isolated`,
//! `build`, `test`, `validate`): timeout checks against the catalog, the working directory
//! through the sandbox, the environment, and rendering of the result. The process handling
//! itself lives in `td_confine::process`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use td_confine::process::{CommandOptions, RunError, RunOutput, StreamCapture};
use td_confine::{CommandPolicy, ConfineError};
use td_toolkit::args;
use td_toolkit::context::ToolContext;
use td_toolkit::error::{ToolError, ToolResult};
use td_toolkit::receipts::SideEffect;
use td_toolkit::tool::{Tool, ToolOutput};

/// The tool's name.
pub const NAME: &str = "run_command";

/// Bytes of the output cap kept back for the headline and section headers, so the rendered
/// result fits the catalog cap and the registry never has to cut it a second time.
const HEADER_ROOM: usize = 512;

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

/// Input of `run_command` and `run_command_isolated`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    timeout_ms: Option<u64>,
    cwd: Option<String>,
}

/// The input schema of `run_command` and `run_command_isolated`.
pub(crate) fn command_schema(tool: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "description": "Shell command line, run by `sh -c` (pipes, `&&` and redirections work). Required; no default."
            },
            "timeout_ms": timeout_property(tool),
            "cwd": {
                "type": "string",
                "description": "Directory to run in, relative to the worktree root; it must exist inside the worktree. Default: \".\" (the worktree root)."
            }
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

/// The `timeout_ms` property shared by every command tool. Its maximum is the catalog
/// timeout, which a config may change, so it is checked at call time rather than here.
pub(crate) fn timeout_property(tool: &str) -> Value {
    let default = td_toolkit::catalog::Catalog::default()
        .spec(tool)
        .timeout_ms;
    json!({
        "type": "integer",
        "minimum": 1,
        "description": format!(
            "Kill the command and everything it started after this many milliseconds. Default and maximum: the catalog timeout of {tool} ({default} unless the configuration changes it)."
        )
    })
}

/// Runs `run_command` / `run_command_isolated`.
pub(crate) async fn execute_command(
    tool: &'static str,
    input: Value,
    ctx: &ToolContext,
    isolate_network: bool,
) -> ToolResult<ToolOutput> {
    let args: CommandArgs = args::parse(tool, input)?;
    if args.command.trim().is_empty() {
        return Err(ToolError::invalid(
            tool,
            "/command",
            "the command is empty; pass the shell command line to run",
        ));
    }
    let timeout_ms = checked_timeout(tool, ctx, args.timeout_ms)?;
    let cwd = working_directory(tool, ctx, args.cwd.as_deref().unwrap_or("."))?;
    let out = run_in_worktree(tool, ctx, &args.command, &cwd, timeout_ms, isolate_network).await?;
    let headline = match (out.timed_out, out.exit_code, out.signal) {
        (true, _, _) => format!(
            "timed out after {timeout_ms} ms, process group killed. Pass a larger timeout_ms (at most {}) or run less at once.",
            ctx.spec(tool).timeout_ms
        ),
        (false, Some(code), _) => format!("exit code: {code}"),
        (false, None, Some(signal)) => format!("killed by signal {signal}"),
        (false, None, None) => "exit status unknown (the command could not be reaped)".to_string(),
    };
    Ok(command_output(headline, &args.command, out))
}

/// Input of `build`, `test` and `validate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfiguredArgs {
    timeout_ms: Option<u64>,
}

/// The input schema of `build`, `test` and `validate`.
pub(crate) fn configured_schema(tool: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"timeout_ms": timeout_property(tool)},
        "additionalProperties": false
    })
}

/// Runs the loop's configured command for `build`, `test` or `validate` in the worktree
/// root. `noun` names what ran in the headline ("build passed", "tests failed ...").
pub(crate) async fn execute_configured(
    tool: &'static str,
    noun: &str,
    command: Option<&str>,
    input: Value,
    ctx: &ToolContext,
) -> ToolResult<ToolOutput> {
    let args: ConfiguredArgs = args::parse(tool, input)?;
    let Some(command) = command.filter(|c| !c.trim().is_empty()) else {
        return Err(ToolError::Unavailable {
            message: format!(
                "no {tool} command is configured for this loop, so {tool} cannot run; use run_command with the project's {tool} command instead"
            ),
        });
    };
    let timeout_ms = checked_timeout(tool, ctx, args.timeout_ms)?;
    let out = run_in_worktree(tool, ctx, command, ctx.root(), timeout_ms, false).await?;
    let status = match (out.timed_out, out.exit_code, out.signal) {
        (true, _, _) => format!(
            "{noun} timed out after {timeout_ms} ms, process group killed. Pass a larger timeout_ms (at most {}) if it needs longer.",
            ctx.spec(tool).timeout_ms
        ),
        (false, Some(0), _) => format!("{noun} passed"),
        (false, Some(code), _) => format!("{noun} failed (exit code {code})"),
        (false, None, Some(signal)) => format!("{noun} failed (killed by signal {signal})"),
        (false, None, None) => {
            format!("{noun} failed (exit status unknown: the command could not be reaped)")
        }
    };
    Ok(command_output(
        format!("{status}\ncommand: {command}"),
        command,
        out,
    ))
}

/// The timeout to use: `requested` when given and within the catalog limit of `tool`,
/// else the catalog timeout.
pub(crate) fn checked_timeout(
    tool: &str,
    ctx: &ToolContext,
    requested: Option<u64>,
) -> ToolResult<u64> {
    let max = ctx.spec(tool).timeout_ms;
    match requested {
        None => Ok(max),
        Some(0) => Err(ToolError::invalid(
            tool,
            "/timeout_ms",
            format!("timeout_ms must be at least 1; omit it for the default of {max} ms"),
        )),
        Some(t) if t > max => Err(ToolError::invalid(
            tool,
            "/timeout_ms",
            format!(
                "timeout_ms {t} is above the maximum of {max} ms for {tool}; pass at most {max}, or omit it for that default"
            ),
        )),
        Some(t) => Ok(t),
    }
}

/// Resolves `cwd` through the sandbox and checks that it is a directory.
fn working_directory(tool: &str, ctx: &ToolContext, cwd: &str) -> ToolResult<PathBuf> {
    let path = ctx.resolve(cwd)?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(ToolError::invalid(
            tool,
            "/cwd",
            format!(
                "'{}' is a file, not a directory; pass a directory of the worktree (default \".\")",
                ctx.display(&path)
            ),
        )),
        Err(e) => Err(ToolError::from_io(
            "using as working directory",
            &ctx.display(&path),
            &e,
        )),
    }
}

/// Runs `command` in `cwd` with the loop's environment and the output cap of `tool`.
pub(crate) async fn run_in_worktree(
    tool: &str,
    ctx: &ToolContext,
    command: &str,
    cwd: &Path,
    timeout_ms: u64,
    isolate_network: bool,
) -> ToolResult<RunOutput> {
    let temp_dir = ctx.command_temp_dir().map_err(|e| {
        ToolError::failed(
            "making the loop's temp dir",
            e,
            "The system temp directory must be writable by taskdaemon; free space or fix its permissions, then try again.",
        )
    })?;
    let launcher_env = vec![
        ("TASKDAEMON_WORKTREE".into(), ctx.root().into()),
        ("TASKDAEMON_EXEC_ID".into(), ctx.exec_id().into()),
        // No terminal is attached: a credential prompt would only wait for the timeout.
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("TMPDIR".into(), temp_dir.clone().into()),
    ];
    let prepared = td_confine::prepare(&CommandPolicy {
        settings: ctx.sandbox_settings(),
        worktree: ctx.root(),
        cwd,
        temp_dir: &temp_dir,
        no_network: isolate_network,
        launcher_env,
    })
    .map_err(|e| match e {
        ConfineError::NoNetworkIsolation => ToolError::Unavailable {
            message: format!(
                "{e}; {tool} cannot run here. Use run_command if network access is acceptable."
            ),
        },
        other => ToolError::Unavailable {
            message: other.to_string(),
        },
    })?;
    let options = CommandOptions::new(command, cwd)
        .timeout(Duration::from_millis(timeout_ms))
        .max_bytes_per_stream(stream_cap(ctx.spec(tool).max_output_bytes))
        .confined(prepared);
    td_confine::process::run(options).await.map_err(|e| match e {
        RunError::InvalidCommand => ToolError::invalid(
            tool,
            "/command",
            "the command contains a NUL byte; remove it",
        ),
        RunError::Confinement(detail) => ToolError::Unavailable {
            message: format!(
                "the command could not be confined, so it was not run: {detail}. The sandbox settings (sandbox: in taskdaemon.yml) or the machine must change; tell the user."
            ),
        },
        RunError::Io { action, source } => ToolError::failed(
            action,
            source,
            "The shell could not be started; check that /bin/sh exists and that the working directory is accessible, then try again.",
        ),
    })
}

/// Per-stream cap for a tool whose whole result may be `max_output_bytes`: both streams and
/// the headers must fit, so each stream gets half of what the headers leave.
pub(crate) fn stream_cap(max_output_bytes: usize) -> usize {
    (max_output_bytes.saturating_sub(HEADER_ROOM) / 2).max(1)
}

/// The result the model sees: `headline`, then the non-empty streams, plus the receipt's
/// side effect. `is_error` unless the command exited 0 within its timeout.
pub(crate) fn command_output(headline: String, command: &str, out: RunOutput) -> ToolOutput {
    let mut content = headline;
    content.push('\n');
    push_stream(&mut content, "stdout", &out.stdout);
    push_stream(&mut content, "stderr", &out.stderr);
    if out.stdout.total_bytes == 0 && out.stderr.total_bytes == 0 {
        content.push_str("(no output)\n");
    }
    ToolOutput {
        content,
        is_error: !out.success(),
        effects: vec![SideEffect::CommandRun {
            command: command.to_string(),
            exit_code: out.exit_code,
            timed_out: out.timed_out,
        }],
    }
}

fn push_stream(content: &mut String, name: &str, stream: &StreamCapture) {
    if stream.total_bytes == 0 {
        return;
    }
    if stream.truncated {
        content.push_str(&format!(
            "--- {name} ({} bytes in all; the middle is omitted) ---\n",
            stream.total_bytes
        ));
    } else {
        content.push_str(&format!("--- {name} ---\n"));
    }
    content.push_str(&stream.text);
    if !stream.text.ends_with('\n') {
        content.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::with_limits;
    use td_toolkit::catalog::ToolSpecOverride;

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

    #[test]
    fn stream_cap_leaves_room_for_headers() {
        assert_eq!(stream_cap(100_000), 49_744);
        assert_eq!(stream_cap(10), 1);
    }
}
